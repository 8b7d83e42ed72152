"""RotaryEmbedding vs the float64 reference of tests/reference (explicit loops over pairs),
on both paths: the host path (_rotate_host) rotates interleaved pairs by complex
multiplies and split halves in four full-width passes, in blocks of heads (4-D) or
positions (3-D) over the host threads."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from gpukernels.errors import KernelInputError, KernelTypeError
from gpukernels.kernels import KernelContext
from gpukernels.kernels.nn.rotary import RotaryEmbedding
from tests.reference import rotary as naive


def caches(rng, n, half):
    ang = rng.uniform(0, 6.3, (n, half))
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


@pytest.mark.parametrize("rank", [3, 4])
@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("rd", [0, 4, 8])
@pytest.mark.parametrize("with_pos", [True, False])
def test_vs_naive(device, rng, rank, interleaved, rd, with_pos):
    B, H, S, hd = 2, 3, 5, 8
    x = rng.standard_normal((B, H, S, hd) if rank == 4 else (B, S, H * hd)).astype(np.float32)
    half = (rd or hd) // 2
    if with_pos:
        cos, sin = caches(rng, 11, half)
        pos = rng.integers(0, 11, (B, S))
    else:
        c, s = caches(rng, B * S, half)
        cos, sin, pos = c.reshape(B, S, half), s.reshape(B, S, half), None
    K = RotaryEmbedding(KernelContext(device))
    y = K(x, cos, sin, pos, interleaved=interleaved, num_heads=H if rank == 3 else None, rotary_embedding_dim=rd)
    ref = naive(x, cos, sin, pos, interleaved, H, rd)
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype,tol", [(np.float16, 2e-3), (ml_dtypes.bfloat16, 1.6e-2)])
def test_half_types(device, rng, dtype, tol):
    x = rng.standard_normal((1, 2, 4, 8)).astype(dtype)
    cos, sin = caches(rng, 6, 4)
    cos, sin = cos.astype(dtype), sin.astype(dtype)
    pos = np.array([[0, 5, 2, 3]])
    y = RotaryEmbedding(KernelContext(device))(x, cos, sin, pos)
    assert y.numpy().dtype == np.dtype(dtype)
    ref = naive(x.astype(np.float64), cos.astype(np.float64), sin.astype(np.float64), pos)
    np.testing.assert_allclose(y.numpy().astype(np.float64), ref, rtol=tol, atol=tol)


def test_inputs_not_modified_and_empty(device, rng):
    x = rng.standard_normal((1, 2, 4, 8)).astype(np.float32)
    cos, sin = caches(rng, 4, 4)
    pos = np.array([[0, 1, 2, 3]])
    copies = [a.copy() for a in (x, cos, sin, pos)]
    RotaryEmbedding(KernelContext(device))(x, cos, sin, pos, interleaved=1)
    for a, c in zip((x, cos, sin, pos), copies):
        np.testing.assert_array_equal(a, c)
    e = np.zeros((1, 2, 0, 8), np.float32)
    y = RotaryEmbedding(KernelContext(device))(e, cos, sin, np.zeros((1, 0), np.int64))
    assert y.shape == (1, 2, 0, 8)


def test_bad_inputs(device, rng):
    K = RotaryEmbedding(KernelContext(device))
    x = rng.standard_normal((1, 2, 4, 8)).astype(np.float32)
    cos, sin = caches(rng, 4, 4)
    pos = np.array([[0, 1, 2, 3]])
    with pytest.raises(KernelInputError, match="RotaryEmbedding.*position_ids must lie"):
        K(x, cos, sin, pos + 1)
    with pytest.raises(KernelInputError, match="num_heads"):
        K(x.reshape(1, 4, 16), cos, sin, pos)
    with pytest.raises(KernelInputError, match="divisible"):
        K(x.reshape(1, 4, 16), cos, sin, pos, num_heads=3)
    with pytest.raises(KernelInputError, match="rotary_embedding_dim"):
        K(x, cos, sin, pos, rotary_embedding_dim=5)
    with pytest.raises(KernelInputError, match="caches must have shape"):
        K(x, cos[:, :3], sin[:, :3], pos)
    with pytest.raises(KernelInputError, match="without position_ids"):
        K(x, cos, sin)
    with pytest.raises(KernelInputError, match="rank"):
        K(x[0, 0], cos, sin, pos)
    with pytest.raises(KernelInputError, match="same shape"):
        K(x, cos, sin[:3], pos)
    with pytest.raises(KernelTypeError, match="RotaryEmbedding"):
        K(x.astype(np.float64), cos, sin, pos)


def vectorized(x, cos, sin, pos, num_heads=None):
    """float64 full rotation, non-interleaved, written with whole-array numpy (big inputs)."""
    x = np.asarray(x, np.float64)
    c, s = np.asarray(cos, np.float64)[pos], np.asarray(sin, np.float64)[pos]  # (B, S, half)
    x4 = x.reshape(x.shape[0], x.shape[1], num_heads, -1) if x.ndim == 3 else x.transpose(0, 2, 1, 3)
    c, s = c[:, :, None], s[:, :, None]
    half = x4.shape[-1] // 2
    a, b = x4[..., :half], x4[..., half:]
    y = np.concatenate([c * a - s * b, s * a + c * b], -1)
    return y.reshape(x.shape) if x.ndim == 3 else y.transpose(0, 2, 1, 3)


@pytest.mark.parametrize("shape", [(2, 4, 2048, 64), (1, 4096, 2 * 64)])
def test_large_inputs_in_blocks(device, rng, shape):
    x = rng.standard_normal(shape).astype(np.float32)
    S = shape[2] if len(shape) == 4 else shape[1]
    cos, sin = caches(rng, S + 3, 32)
    pos = rng.integers(0, S + 3, (shape[0], S))
    y = RotaryEmbedding(KernelContext(device))(x, cos, sin, pos, num_heads=2 if len(shape) == 3 else None)
    np.testing.assert_allclose(y.numpy(), vectorized(x, cos, sin, pos, 2), rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------- host path


def rotary_kernel(device, path):
    return RotaryEmbedding(KernelContext(device, options={"paths": path}))


@pytest.mark.parametrize("rank", [3, 4])
@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("rd", [0, 6, 10])
@pytest.mark.parametrize("block", [1 << 16, 7, 1])
def test_host_blocks(device, path, rng, tuning, sites_taken, rank, interleaved, rd, block):
    """Blocks of one or several heads/positions, odd counts, partial rotation."""
    tuning({"rotary.host_block_elems": block})
    B, H, S, hd = 2, 5, 7, 14
    x = rng.standard_normal((B, H, S, hd) if rank == 4 else (B, S, H * hd)).astype(np.float32)
    half = (rd or hd) // 2
    cos, sin = caches(rng, 13, half)
    pos = rng.integers(0, 13, (B, S))
    with sites_taken() as taken:
        y = rotary_kernel(device, path)(x, cos, sin, pos, interleaved=interleaved,
                                        num_heads=H if rank == 3 else None, rotary_embedding_dim=rd)
    assert ("RotaryEmbedding.rotate" in taken) == (device == "cpu" and path == "auto")
    np.testing.assert_allclose(y.numpy(), naive(x, cos, sin, pos, interleaved, H, rd), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("dtype,tol", [(np.float16, 2e-3), (ml_dtypes.bfloat16, 2e-2)])
def test_host_dtypes_no_pos(device, path, rng, interleaved, dtype, tol):
    B, H, S, hd = 2, 3, 6, 8
    x = rng.standard_normal((B, H, S, hd)).astype(dtype)
    c, s = caches(rng, B * S, hd // 2)
    cos, sin = c.reshape(B, S, -1).astype(dtype), s.reshape(B, S, -1).astype(dtype)
    y = rotary_kernel(device, path)(x, cos, sin, interleaved=interleaved)
    assert y.numpy().dtype == np.dtype(dtype)
    ref = naive(x.astype(np.float64), cos.astype(np.float64), sin.astype(np.float64), None, interleaved, H, 0)
    np.testing.assert_allclose(y.numpy().astype(np.float64), ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("interleaved", [0, 1])
def test_host_non_contiguous_input(device, path, rng, interleaved):
    """X given as a transposed view: the host path works on a contiguous copy."""
    B, H, S, hd = 1, 4, 5, 8
    base = rng.standard_normal((B, S, H, hd)).astype(np.float32)
    x = base.transpose(0, 2, 1, 3)  # (B, H, S, hd), not contiguous
    cos, sin = caches(rng, 9, hd // 2)
    pos = rng.integers(0, 9, (B, S))
    y = rotary_kernel(device, path)(x, cos, sin, pos, interleaved=interleaved)
    np.testing.assert_allclose(y.numpy(), naive(x, cos, sin, pos, interleaved, H, 0), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(x, base.transpose(0, 2, 1, 3))  # input untouched


def test_host_empty(device, path, rng):
    cos, sin = caches(rng, 4, 4)
    x = np.zeros((1, 3, 0, 8), np.float32)
    y = rotary_kernel(device, path)(x, cos, sin, np.zeros((1, 0), np.int64))
    assert y.shape == (1, 3, 0, 8)
