"""The host (NumPy) fast paths of Attention and RotaryEmbedding against float64 references.

Attention's _HostAttention covers calls without mask, padding, window, softcap or qk
output: blocks of KV heads and query rows, 2**s without the max shift when the row
sums allow it (else the block is redone with the shift), the causal frontier applied on
the trailing square of each row block, K @ q^T for few rows.  The block sizes are
patched small here so that every boundary case occurs on small inputs.

RotaryEmbedding's _rotate_host covers NumPy: complex multiplies for interleaved pairs,
four full-width passes for split halves, blocks of heads (4-D) or positions (3-D) over
the host threads, partial rotation.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from gpukernels.kernels import KernelContext
from gpukernels.kernels.nn import attention as attention_mod
from gpukernels.kernels.nn import rotary as rotary_mod
from gpukernels.kernels.nn.attention import Attention
from gpukernels.kernels.nn.rotary import RotaryEmbedding
from test_attention import naive
from test_rotary import caches

# these tests check the host specialisations themselves
pytestmark = pytest.mark.usefixtures("default_paths")


# ---------------------------------------------------------------------------- references


def attention_ref(Q, K, V, past_k=None, past_v=None, *, causal=0, scale=None, hq=None, hkv=None):
    """float64 Y of the loop reference in test_attention.py."""
    return naive(Q, K, V, past_k=past_k, past_v=past_v, causal=causal, scale=scale, hq=hq, hkv=hkv)[0]


def rotary_ref(x, cos, sin, pos, interleaved, num_heads, rd):
    x = np.asarray(x, np.float64)
    x4 = x.reshape(x.shape[0], x.shape[1], num_heads, -1).transpose(0, 2, 1, 3) if x.ndim == 3 else x
    B, H, S, hd = x4.shape
    rd = rd or hd
    y = x4.copy()
    for b in range(B):
        for s in range(S):
            c = np.asarray(cos, np.float64)[pos[b, s]] if pos is not None else np.asarray(cos, np.float64)[b, s]
            sn = np.asarray(sin, np.float64)[pos[b, s]] if pos is not None else np.asarray(sin, np.float64)[b, s]
            for i in range(rd // 2):
                ia, ib = (2 * i, 2 * i + 1) if interleaved else (i, i + rd // 2)
                xa, xb = x4[b, :, s, ia], x4[b, :, s, ib]
                y[b, :, s, ia] = c[i] * xa - sn[i] * xb
                y[b, :, s, ib] = sn[i] * xa + c[i] * xb
    return y.transpose(0, 2, 1, 3).reshape(x.shape) if x.ndim == 3 else y


# ---------------------------------------------------------------------------- Attention


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of a few KiB and 5 causal rows: many head and row blocks on small inputs."""
    monkeypatch.setattr(attention_mod, "_HOST_BLOCK_BYTES", 4096)
    monkeypatch.setattr(attention_mod, "_HOST_CAUSAL_ROWS", 5)


@pytest.fixture
def count_fast(monkeypatch):
    """Counts _HostAttention.run calls (so each test knows the fast path ran)."""
    calls = []
    orig = attention_mod._HostAttention.run

    def run(self, *args):
        calls.append(1)
        return orig(self, *args)

    monkeypatch.setattr(attention_mod._HostAttention, "run", run)
    return calls


def att(opset=23, requested=(True,)):
    """A kernel whose caller wants only Y (as the runtime says for a one-output node)."""
    k = Attention(KernelContext("cpu", opset))
    k.requested_outputs = requested
    return k


def rand(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("blocks", ["default", "small"])
@pytest.mark.parametrize("hq,hkv", [(4, 4), (6, 2), (3, 1)])
@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("sq,skv,past", [(13, 13, 0), (1, 1, 9), (3, 5, 4), (17, 11, 0), (7, 23, 0), (12, 4, 6)])
def test_attention_fast_path_4d(rng, request, count_fast, blocks, hq, hkv, causal, sq, skv, past):
    if blocks == "small":
        request.getfixturevalue("small_blocks")
    Q, K, V = rand(rng, 2, hq, sq, 12), rand(rng, 2, hkv, skv, 12), rand(rng, 2, hkv, skv, 7)
    pk = pv = None
    if past:
        pk, pv = rand(rng, 2, hkv, past, 12), rand(rng, 2, hkv, past, 7)
    res = att(requested=(True, True, True, False))(Q, K, V, None, pk, pv, is_causal=causal)
    assert count_fast
    np.testing.assert_allclose(res.Y.numpy(), attention_ref(Q, K, V, pk, pv, causal=causal),
                               rtol=1e-5, atol=1e-5)
    assert res.qk_matmul_output is None
    if past:
        np.testing.assert_array_equal(res.present_key.numpy(), np.concatenate([pk, K], 2))


@pytest.mark.parametrize("causal", [0, 1])
def test_attention_fast_path_3d_strided_q(rng, small_blocks, count_fast, causal):
    """3-D inputs: the 4-D views of Q are strided (heads interleaved with positions)."""
    hq, hkv = 4, 2
    Q, K, V = rand(rng, 2, 9, hq * 8), rand(rng, 2, 9, hkv * 8), rand(rng, 2, 9, hkv * 5)
    res = att()(Q, K, V, q_num_heads=hq, kv_num_heads=hkv, is_causal=causal, scale=0.3)
    assert count_fast
    np.testing.assert_allclose(res.Y.numpy(), attention_ref(Q, K, V, causal=causal, scale=0.3, hq=hq, hkv=hkv),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("magnitude", ["huge", "very_negative", "mixed"])
@pytest.mark.parametrize("causal", [0, 1])
def test_attention_fast_path_shift_fallback(rng, small_blocks, count_fast, magnitude, causal):
    """Scores whose unshifted 2**s overflows or underflows take the shifted softmax."""
    Q, K, V = rand(rng, 1, 2, 11, 8), rand(rng, 1, 2, 11, 8), rand(rng, 1, 2, 11, 4)
    if magnitude == "huge":
        Q = Q * 60  # scores of several hundred: 2**s overflows float32
    elif magnitude == "very_negative":
        K = -np.abs(K)
        Q = np.abs(Q) * 60  # every score far below zero: 2**s underflows to 0
    else:
        Q[:, :, ::2] *= 80  # some rows overflow, some do not
    res = att()(Q, K, V, is_causal=causal)
    assert count_fast
    got = res.Y.numpy()
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, attention_ref(Q, K, V, causal=causal), rtol=1e-4, atol=1e-4)


def test_attention_fast_path_block_option(rng, count_fast):
    """The attention_block_bytes option bounds the fast path's blocks too."""
    Q, K, V = rand(rng, 2, 4, 21, 8), rand(rng, 2, 2, 21, 8), rand(rng, 2, 2, 21, 5)
    k = Attention(KernelContext("cpu", 23, options={"attention_block_bytes": 512}))
    k.requested_outputs = (True,)
    got = k(Q, K, V, is_causal=1).Y.numpy()
    assert count_fast
    np.testing.assert_allclose(got, attention_ref(Q, K, V, causal=1), rtol=1e-5, atol=1e-5)


def test_attention_fast_path_large_v(rng, count_fast):
    """E @ V of unnormalised 2**s would overflow for huge V: redone with the shift."""
    Q, K = rand(rng, 1, 1, 6, 4) * 8, rand(rng, 1, 1, 6, 4) * 8
    V = rand(rng, 1, 1, 6, 3) * np.float32(1e30)
    got = att()(Q, K, V).Y.numpy()
    assert count_fast
    np.testing.assert_allclose(got, attention_ref(Q, K, V), rtol=1e-4)


def softmax_attention64(Q, K, V, causal=0):
    """float64 Y for 4-D inputs (grouped heads, no past), vectorised with the max shift."""
    Q, K, V = (np.asarray(a, np.float64) for a in (Q, K, V))
    G = Q.shape[1] // K.shape[1]
    K, V = np.repeat(K, G, axis=1), np.repeat(V, G, axis=1)
    s = Q @ K.transpose(0, 1, 3, 2) / np.sqrt(Q.shape[-1])
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)) @ V


@pytest.mark.parametrize("causal", [0, 1])
def test_attention_fast_path_default_blocks(rng, count_fast, causal):
    """Default block sizes with several head and row blocks sharing the score workspace,
    one block (of a middle head, second row block) redone with the shift."""
    Hkv, G, Sq, T = 3, 2, 300, 600
    Q, K, V = rand(rng, 1, Hkv * G, Sq, 16), rand(rng, 1, Hkv, T, 16), rand(rng, 1, Hkv, T, 8)
    Q[0, 2, 250:] *= 60  # KV head 1, rows 250+: 2**s overflows float32
    p = dict(B=1, q_heads=Hkv * G, kv_heads=Hkv, Sq=Sq, T=T, D=16, Dv=8, is_causal=causal, P=0, scale=0.25)
    n, hb = attention_mod._HostAttention(p, np.dtype(np.float32), attention_mod._HOST_BLOCK_BYTES)._blocks()
    assert n < Sq and hb < Hkv  # the case covers several blocks of each kind
    got = att()(Q, K, V, is_causal=causal).Y.numpy()
    assert count_fast
    np.testing.assert_allclose(got, softmax_attention64(Q, K, V, causal), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float16, 2e-3), (ml_dtypes.bfloat16, 2e-2)])
def test_attention_fast_path_dtypes(rng, small_blocks, count_fast, dtype, tol):
    Q, K, V = (rand(rng, 1, 4, 9, 8).astype(dtype) for _ in range(3))
    res = att()(Q, K, V, is_causal=1)
    assert count_fast
    assert res.Y.numpy().dtype == np.dtype(dtype)
    ref = attention_ref(Q.astype(np.float64), K.astype(np.float64), V.astype(np.float64), causal=1)
    np.testing.assert_allclose(res.Y.numpy().astype(np.float64), ref, rtol=tol, atol=tol)


def test_attention_fast_path_nan_rows(rng, count_fast):
    """A NaN in one query row gives NaN in that row only, as the stable softmax does."""
    Q, K, V = rand(rng, 1, 2, 5, 4), rand(rng, 1, 2, 5, 4), rand(rng, 1, 2, 5, 3)
    Q[0, 1, 2, 0] = np.nan
    got = att()(Q, K, V).Y.numpy()
    assert count_fast
    assert np.all(np.isnan(got[0, 1, 2])) and not np.any(np.isnan(np.delete(got[0, 1], 2, axis=0)))
    assert not np.any(np.isnan(got[0, 0]))


def test_attention_fast_path_matches_general_path(rng):
    """The fast path (one output wanted) and the general path (qk output wanted) agree."""
    Q, K, V = rand(rng, 2, 4, 37, 16), rand(rng, 2, 2, 37, 16), rand(rng, 2, 2, 37, 16)
    fast = att()(Q, K, V, is_causal=1).Y.numpy()
    general = Attention(KernelContext("cpu", 23))(Q, K, V, is_causal=1)
    assert general.qk_matmul_output is not None
    np.testing.assert_allclose(fast, general.Y.numpy(), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("kwargs", [dict(softcap=2.0), dict(softmax_precision=int(10)),
                                    dict(softmax_precision=int(11))])
def test_attention_not_fast_path(rng, count_fast, kwargs):
    """softcap and a softmax in another precision stay on the general path."""
    Q, K, V = rand(rng, 1, 2, 4, 8), rand(rng, 1, 2, 4, 8), rand(rng, 1, 2, 4, 8)
    att()(Q, K, V, **kwargs)
    assert not count_fast


def test_attention_mask_not_fast_path(rng, count_fast):
    Q, K, V = rand(rng, 1, 2, 4, 8), rand(rng, 1, 2, 4, 8), rand(rng, 1, 2, 4, 8)
    att()(Q, K, V, np.ones((4, 4), bool))
    assert not count_fast


def test_attention_empty(rng, count_fast):
    Q, K, V = rand(rng, 1, 2, 0, 8), rand(rng, 1, 2, 3, 8), rand(rng, 1, 2, 3, 5)
    assert att()(Q, K, V).Y.shape == (1, 2, 0, 5)
    Q, K, V = rand(rng, 1, 2, 3, 8), rand(rng, 1, 2, 0, 8), rand(rng, 1, 2, 0, 5)
    y = att()(Q, K, V).Y.numpy()
    assert y.shape == (1, 2, 3, 5) and np.all(y == 0)


# ---------------------------------------------------------------------------- RotaryEmbedding


@pytest.mark.parametrize("rank", [3, 4])
@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("rd", [0, 6, 10])
@pytest.mark.parametrize("block", [1 << 16, 7, 1])
def test_rotary_host_blocks(rng, monkeypatch, rank, interleaved, rd, block):
    """Blocks of one or several heads/positions, odd counts, partial rotation."""
    monkeypatch.setattr(rotary_mod, "_HOST_BLOCK_ELEMS", block)
    B, H, S, hd = 2, 5, 7, 14
    x = rng.standard_normal((B, H, S, hd) if rank == 4 else (B, S, H * hd)).astype(np.float32)
    half = (rd or hd) // 2
    cos, sin = caches(rng, 13, half)
    pos = rng.integers(0, 13, (B, S))
    y = RotaryEmbedding(KernelContext("cpu"))(x, cos, sin, pos, interleaved=interleaved,
                                               num_heads=H if rank == 3 else None, rotary_embedding_dim=rd)
    ref = rotary_ref(x, cos, sin, pos, interleaved, H, rd)
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("dtype,tol", [(np.float16, 2e-3), (ml_dtypes.bfloat16, 2e-2)])
def test_rotary_host_dtypes_no_pos(rng, interleaved, dtype, tol):
    B, H, S, hd = 2, 3, 6, 8
    x = rng.standard_normal((B, H, S, hd)).astype(dtype)
    c, s = caches(rng, B * S, hd // 2)
    cos, sin = c.reshape(B, S, -1).astype(dtype), s.reshape(B, S, -1).astype(dtype)
    y = RotaryEmbedding(KernelContext("cpu"))(x, cos, sin, interleaved=interleaved)
    assert y.numpy().dtype == np.dtype(dtype)
    ref = rotary_ref(x.astype(np.float64), cos.astype(np.float64), sin.astype(np.float64), None, interleaved, H, 0)
    np.testing.assert_allclose(y.numpy().astype(np.float64), ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("interleaved", [0, 1])
def test_rotary_host_non_contiguous_input(rng, interleaved):
    """X given as a transposed view: the host path works on a contiguous copy."""
    B, H, S, hd = 1, 4, 5, 8
    base = rng.standard_normal((B, S, H, hd)).astype(np.float32)
    x = base.transpose(0, 2, 1, 3)  # (B, H, S, hd), not contiguous
    cos, sin = caches(rng, 9, hd // 2)
    pos = rng.integers(0, 9, (B, S))
    y = RotaryEmbedding(KernelContext("cpu"))(x, cos, sin, pos, interleaved=interleaved)
    np.testing.assert_allclose(y.numpy(), rotary_ref(x, cos, sin, pos, interleaved, H, 0), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(x, base.transpose(0, 2, 1, 3))  # input untouched


def test_rotary_host_empty(rng):
    cos, sin = caches(rng, 4, 4)
    x = np.zeros((1, 3, 0, 8), np.float32)
    y = RotaryEmbedding(KernelContext("cpu"))(x, cos, sin, np.zeros((1, 0), np.int64))
    assert y.shape == (1, 3, 0, 8)
