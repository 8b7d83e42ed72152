"""RotaryEmbedding vs a float64 reference with explicit loops over pairs."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from gpukernels.errors import KernelInputError, KernelTypeError
from gpukernels.kernels import KernelContext
from gpukernels.kernels.nn.rotary import RotaryEmbedding


def naive(x, cos, sin, pos=None, interleaved=0, num_heads=None, rd=0):
    x = np.asarray(x, np.float64)
    cos, sin = np.asarray(cos, np.float64), np.asarray(sin, np.float64)
    if x.ndim == 3:
        B, S, hid = x.shape
        x4 = x.reshape(B, S, num_heads, hid // num_heads).transpose(0, 2, 1, 3)
    else:
        x4 = x
    B, H, S, hd = x4.shape
    rd = rd or hd
    y = x4.copy()
    for b in range(B):
        for s in range(S):
            c = cos[pos[b, s]] if pos is not None else cos[b, s]
            sn = sin[pos[b, s]] if pos is not None else sin[b, s]
            for h in range(H):
                for i in range(rd // 2):
                    a_i, b_i = (2 * i, 2 * i + 1) if interleaved else (i, i + rd // 2)
                    xa, xb = x4[b, h, s, a_i], x4[b, h, s, b_i]
                    y[b, h, s, a_i] = c[i] * xa - sn[i] * xb
                    y[b, h, s, b_i] = sn[i] * xa + c[i] * xb
    if x.ndim == 3:
        y = y.transpose(0, 2, 1, 3).reshape(x.shape)
    return y


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
