"""Attention vs a float64 reference written with loops over batch, head and query."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from gpukernels.errors import KernelInputError, KernelTypeError
from gpukernels.kernels import KernelContext
from gpukernels.kernels.nn.attention import Attention
from gpukernels.tensor import Tensor


def to4d(x, heads):
    b, s, hd = x.shape
    return x.reshape(b, s, heads, hd // heads).transpose(0, 2, 1, 3)


def naive(Q, K, V, mask=None, past_k=None, past_v=None, nonpad=None, *, scale=None, causal=0, softcap=0.0,
          hq=None, hkv=None, left=-1, right=-1):
    """Returns Y, present_k, present_v and the qk values of modes 0-3 (float64)."""
    rank = Q.ndim
    Q, K, V = (np.asarray(a, np.float64) for a in (Q, K, V))
    if rank == 3:
        Q, K, V = to4d(Q, hq), to4d(K, hkv), to4d(V, hkv)
    P = 0
    if past_k is not None:
        P = past_k.shape[2]
        K = np.concatenate([np.asarray(past_k, np.float64), K], 2)
        V = np.concatenate([np.asarray(past_v, np.float64), V], 2)
    B, Hq, Sq, D = Q.shape
    Hkv, T, Dv = K.shape[1], K.shape[2], V.shape[3]
    grp = Hq // Hkv
    sc = 1 / np.sqrt(D) if scale is None else scale
    m4 = None
    if mask is not None:
        m = np.asarray(mask)
        if m.ndim and m.shape[-1] < T:
            padv = False if m.dtype == bool else -np.inf
            m = np.concatenate([m.astype(np.float64) if m.dtype != bool else m,
                                np.full(m.shape[:-1] + (T - m.shape[-1],), padv)], -1)
        m4 = np.broadcast_to(m, (B, Hq, Sq, T))
    Y = np.zeros((B, Hq, Sq, Dv))
    modes = [np.zeros((B, Hq, Sq, T)) for _ in range(4)]
    for b in range(B):
        off = P if past_k is not None else (int(nonpad[b]) - Sq if nonpad is not None else 0)
        for h in range(Hq):
            kh = h // grp
            for i in range(Sq):
                raw = np.array([Q[b, h, i] @ K[b, kh, j] * sc for j in range(T)])
                capped = softcap * np.tanh(raw / softcap) if softcap > 0 else raw
                bias = np.zeros(T)
                for j in range(T):
                    if m4 is not None:
                        mv = m4[b, h, i, j]
                        bias[j] += (0.0 if mv else -np.inf) if m4.dtype == bool else float(mv)
                    pos = i + off
                    if causal and j > pos:
                        bias[j] = -np.inf
                    if left >= 0 and j < pos - left:
                        bias[j] = -np.inf
                    if right >= 0 and j > pos + right:
                        bias[j] = -np.inf
                    if nonpad is not None and j >= nonpad[b]:
                        bias[j] = -np.inf
                s = capped + bias
                if T == 0 or np.all(np.isneginf(bias)):
                    prob = np.zeros(T)
                else:
                    e = np.exp(s - s.max())
                    prob = e / e.sum()
                Y[b, h, i] = prob @ V[b, kh]
                modes[0][b, h, i], modes[1][b, h, i], modes[2][b, h, i], modes[3][b, h, i] = raw, capped, s, prob
    if rank == 3:
        Y = Y.transpose(0, 2, 1, 3).reshape(B, Sq, Hq * Dv)
    return Y, K, V, modes


def kernel(device, opset=25, **options):
    return Attention(KernelContext(device, opset, options=options))


def rand(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def check(res, ref, tol=1e-5, mode=None):
    Y, pk, pv, modes = ref
    np.testing.assert_allclose(res.Y.numpy().astype(np.float64), Y, rtol=tol, atol=tol)
    if mode is not None:
        got = res.qk_matmul_output.numpy().astype(np.float64)
        np.testing.assert_allclose(got, modes[mode], rtol=tol, atol=tol)


# ---------------------------------------------------------------------------- basics


@pytest.mark.parametrize("hq,hkv", [(4, 4), (4, 2), (6, 1)])
@pytest.mark.parametrize("causal", [0, 1])
def test_4d_heads_and_causal(device, rng, hq, hkv, causal):
    Q, K, V = rand(rng, 2, hq, 5, 8), rand(rng, 2, hkv, 7, 8), rand(rng, 2, hkv, 7, 3)
    res = kernel(device)(Q, K, V, is_causal=causal)
    check(res, naive(Q, K, V, causal=causal))
    assert isinstance(res, Attention.Result)
    np.testing.assert_array_equal(res.present_key.numpy(), K)


@pytest.mark.parametrize("hq,hkv", [(4, 4), (4, 2), (3, 1)])
def test_3d_layout(device, rng, hq, hkv):
    Q, K, V = rand(rng, 2, 5, hq * 8), rand(rng, 2, 6, hkv * 8), rand(rng, 2, 6, hkv * 4)
    res = kernel(device)(Q, K, V, q_num_heads=hq, kv_num_heads=hkv, is_causal=1)
    assert res.Y.shape == (2, 5, hq * 4)
    check(res, naive(Q, K, V, hq=hq, hkv=hkv, causal=1))
    assert res.present_key.shape == (2, hkv, 6, 8)


def test_scale_and_softcap(device, rng):
    Q, K, V = rand(rng, 1, 2, 4, 8) * 3, rand(rng, 1, 2, 6, 8) * 3, rand(rng, 1, 2, 6, 8)
    res = kernel(device)(Q, K, V, scale=0.7, softcap=2.5)
    check(res, naive(Q, K, V, scale=0.7, softcap=2.5))


# ---------------------------------------------------------------------------- masks


@pytest.mark.parametrize("shape", [(6,), (4, 6), (2, 4, 6), (1, 2, 4, 6), (3, 1, 1, 6), (3, 2, 4, 6), (4, 1),
                                   (3,), (2, 4, 2), (1, 1, 4, 4)])
@pytest.mark.parametrize("kind", ["bool", "float", "int"])
@pytest.mark.parametrize("causal", [0, 1])
def test_masks(device, rng, shape, kind, causal):
    Q, K, V = rand(rng, 3, 2, 4, 8), rand(rng, 3, 2, 6, 8), rand(rng, 3, 2, 6, 5)
    if kind == "bool":
        mask = rng.random(shape) > 0.3
    elif kind == "float":
        mask = rand(rng, *shape)
        mask[rng.random(shape) < 0.2] = -np.inf
    else:
        mask = rng.integers(-3, 3, shape).astype(np.int32)
    res = kernel(device)(Q, K, V, mask, is_causal=causal, qk_matmul_output_mode=2)
    ref = naive(Q, K, V, mask, causal=causal)
    check(res, ref)
    got = res.qk_matmul_output.numpy()
    np.testing.assert_allclose(got, ref[3][2], rtol=1e-5, atol=1e-5)


def test_half_mask_and_float64_mask(device, rng):
    Q, K, V = rand(rng, 1, 2, 4, 8), rand(rng, 1, 2, 6, 8), rand(rng, 1, 2, 6, 8)
    for dt in (np.float16, np.float64, ml_dtypes.bfloat16):
        mask = rand(rng, 4, 6).astype(dt)
        check(kernel(device)(Q, K, V, mask), naive(Q, K, V, mask.astype(np.float64)))


def test_fully_masked_rows_are_zero(device, rng):
    Q, K, V = rand(rng, 1, 2, 3, 8), rand(rng, 1, 2, 5, 8), rand(rng, 1, 2, 5, 8)
    mask = np.ones((3, 5), bool)
    mask[1] = False
    fmask = np.zeros((3, 5), np.float32)
    fmask[2] = -np.inf
    for m in (mask, fmask):
        res = kernel(device)(Q, K, V, m, qk_matmul_output_mode=3)
        Y = res.Y.numpy()
        assert np.all(np.isfinite(Y))
        row = 1 if m.dtype == bool else 2
        assert np.all(Y[:, :, row] == 0)
        assert np.all(res.qk_matmul_output.numpy()[:, :, row] == 0)
        check(res, naive(Q, K, V, m), mode=3)


# ---------------------------------------------------------------------------- caches


@pytest.mark.parametrize("past", [0, 1, 5])
@pytest.mark.parametrize("rank", [3, 4])
def test_past_and_present_with_causal(device, rng, past, rank):
    hq, hkv = 4, 2
    pk, pv = rand(rng, 2, hkv, past, 8), rand(rng, 2, hkv, past, 6)
    if rank == 4:
        Q, K, V = rand(rng, 2, hq, 3, 8), rand(rng, 2, hkv, 3, 8), rand(rng, 2, hkv, 3, 6)
        attrs = {}
    else:
        Q, K, V = rand(rng, 2, 3, hq * 8), rand(rng, 2, 3, hkv * 8), rand(rng, 2, 3, hkv * 6)
        attrs = dict(q_num_heads=hq, kv_num_heads=hkv)
    mask = rng.random((3, past + 2)) > 0.2  # shorter than total: padded with False
    res = kernel(device)(Q, K, V, mask, pk, pv, is_causal=1, **attrs)
    ref = naive(Q, K, V, mask, pk, pv, causal=1, hq=hq, hkv=hkv)
    check(res, ref)
    np.testing.assert_array_equal(res.present_key.numpy(), ref[1].astype(np.float32))
    np.testing.assert_array_equal(res.present_value.numpy(), ref[2].astype(np.float32))


@pytest.mark.parametrize("sq", [1, 3, 6])
@pytest.mark.parametrize("causal", [0, 1])
def test_nonpad_kv_seqlen(device, rng, sq, causal):
    Q, K, V = rand(rng, 3, 4, sq, 8), rand(rng, 3, 2, 6, 8), rand(rng, 3, 2, 6, 8)
    nonpad = np.array([6, 4, 2], np.int64)
    res = kernel(device, 24)(Q, K, V, None, None, None, nonpad, is_causal=causal)
    check(res, naive(Q, K, V, nonpad=nonpad, causal=causal))


@pytest.mark.parametrize("left,right", [(2, 0), (2, 1), (-1, 1), (0, -1), (1, 3)])
@pytest.mark.parametrize("causal", [0, 1])
def test_windows(device, rng, left, right, causal):
    Q, K, V = rand(rng, 2, 2, 4, 8), rand(rng, 2, 2, 7, 8), rand(rng, 2, 2, 7, 8)
    pk, pv = rand(rng, 2, 2, 2, 8), rand(rng, 2, 2, 2, 8)
    res = kernel(device, 25)(Q, K, V, None, pk, pv, is_causal=causal, left_window_size=left,
                             right_window_size=right)
    check(res, naive(Q, K, V, None, pk, pv, causal=causal, left=left, right=right))
    nonpad = np.array([7, 3])
    mask = rng.random((4, 7)) > 0.1
    res = kernel(device, 25)(Q, K, V, mask, None, None, nonpad, is_causal=causal, left_window_size=left,
                             right_window_size=right)
    check(res, naive(Q, K, V, mask, nonpad=nonpad, causal=causal, left=left, right=right))


# ---------------------------------------------------------------------------- qk output, precision


@pytest.mark.parametrize("mode", [0, 1, 2, 3])
def test_qk_modes(device, rng, mode):
    Q, K, V = rand(rng, 2, 4, 3, 8), rand(rng, 2, 2, 4, 8), rand(rng, 2, 2, 4, 8)
    pk, pv = rand(rng, 2, 2, 2, 8), rand(rng, 2, 2, 2, 8)
    mask = rand(rng, 2, 1, 3, 6)
    res = kernel(device)(Q, K, V, mask, pk, pv, qk_matmul_output_mode=mode, softcap=1.5, is_causal=1)
    check(res, naive(Q, K, V, mask, pk, pv, softcap=1.5, causal=1), mode=mode)
    assert res.qk_matmul_output.shape == (2, 4, 3, 6)


@pytest.mark.parametrize("sp", [1, 10, 11, 16])
def test_softmax_precision(device, rng, sp):
    Q, K, V = rand(rng, 1, 2, 4, 8), rand(rng, 1, 2, 5, 8), rand(rng, 1, 2, 5, 8)
    res = kernel(device)(Q, K, V, softmax_precision=sp, qk_matmul_output_mode=3)
    ref = naive(Q, K, V)
    tol = {1: 1e-5, 11: 1e-5, 10: 2e-3, 16: 1.5e-2}[sp]
    check(res, ref, tol=tol, mode=3)
    assert res.qk_matmul_output.numpy().dtype == np.float32
    if sp in (10, 16):  # the probabilities are values of the half type
        half = np.float16 if sp == 10 else ml_dtypes.bfloat16
        p = res.qk_matmul_output.numpy()
        np.testing.assert_array_equal(p, p.astype(half).astype(np.float32))


@pytest.mark.parametrize("dtype,tol", [(np.float16, 3e-3), (ml_dtypes.bfloat16, 2e-2), (np.float64, 1e-12)])
def test_dtypes(device, rng, dtype, tol):
    Q, K, V = (rand(rng, 2, 4, 5, 8).astype(dtype), rand(rng, 2, 2, 6, 8).astype(dtype),
               rand(rng, 2, 2, 6, 8).astype(dtype))
    mask = rng.random((5, 6)) > 0.2
    res = kernel(device)(Q, K, V, mask, is_causal=1, qk_matmul_output_mode=3)
    assert res.Y.numpy().dtype == np.dtype(dtype)
    assert res.qk_matmul_output.numpy().dtype == np.dtype(dtype)
    assert res.present_key.numpy().dtype == np.dtype(dtype)
    check(res, naive(Q.astype(np.float64), K.astype(np.float64), V.astype(np.float64), mask, causal=1), tol=tol,
          mode=3)


def test_mixed_value_type(device, rng):
    Q, K = rand(rng, 1, 2, 3, 8), rand(rng, 1, 2, 4, 8)
    V = rand(rng, 1, 2, 4, 8, dtype=np.float64)
    res = kernel(device)(Q, K, V)
    assert res.Y.numpy().dtype == np.float32
    assert res.present_value.numpy().dtype == np.float64
    check(res, naive(Q, K, V))


# ---------------------------------------------------------------------------- chunking, API


def test_query_blocks_give_same_result(device, rng):
    Q, K, V = rand(rng, 2, 4, 37, 16), rand(rng, 2, 2, 50, 16), rand(rng, 2, 2, 50, 8)
    pk, pv = rand(rng, 2, 2, 3, 16), rand(rng, 2, 2, 3, 8)
    mask = rand(rng, 2, 1, 37, 40)
    args = dict(is_causal=1, qk_matmul_output_mode=3, softcap=3.0)
    a = kernel(device)(Q, K, V, mask, pk, pv, **args)
    b = kernel(device, attention_block_bytes=1)(Q, K, V, mask, pk, pv, **args)  # one query row per block
    np.testing.assert_allclose(b.Y.numpy(), a.Y.numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(b.qk_matmul_output.numpy(), a.qk_matmul_output.numpy(), rtol=1e-6, atol=1e-6)
    check(b, naive(Q, K, V, mask, pk, pv, causal=1, softcap=3.0), mode=3)


def test_run_with_attributes(device, rng):
    Q, K, V = rand(rng, 1, 4, 3, 8), rand(rng, 1, 2, 4, 8), rand(rng, 1, 2, 4, 8)
    pk, pv = rand(rng, 1, 2, 2, 8), rand(rng, 1, 2, 2, 8)
    attrs = Attention.Attributes(is_causal=1, scale=0.5, softcap=0.0, qk_matmul_output_mode=1)
    res = kernel(device).run(attrs, Q, K, V, past_key=pk, past_value=pv)
    check(res, naive(Q, K, V, None, pk, pv, causal=1, scale=0.5), mode=1)
    res2 = kernel(device)(Tensor(Q), Tensor(K), Tensor(V))
    check(res2, naive(Q, K, V))


def test_wanted_outputs_only(device, rng):
    Q, K, V = rand(rng, 1, 2, 3, 8), rand(rng, 1, 2, 4, 8), rand(rng, 1, 2, 4, 8)
    k = kernel(device)
    k.requested_outputs = (True, False, False, False)
    res = k(Q, K, V)
    assert res.present_key is None and res.qk_matmul_output is None
    check(res, naive(Q, K, V))


def test_empty(device, rng):
    Q, K, V = rand(rng, 1, 2, 0, 8), rand(rng, 1, 2, 4, 8), rand(rng, 1, 2, 4, 8)
    assert kernel(device)(Q, K, V).Y.shape == (1, 2, 0, 8)
    Q = rand(rng, 1, 2, 3, 8)
    K0, V0 = rand(rng, 1, 2, 0, 8), rand(rng, 1, 2, 0, 8)
    res = kernel(device)(Q, K0, V0)
    np.testing.assert_array_equal(res.Y.numpy(), np.zeros((1, 2, 3, 8), np.float32))


def test_inputs_not_modified(device, rng):
    arrays = [rand(rng, 1, 2, 3, 8), rand(rng, 1, 2, 4, 8), rand(rng, 1, 2, 4, 8), rand(rng, 3, 6),
              rand(rng, 1, 2, 2, 8), rand(rng, 1, 2, 2, 8)]
    copies = [a.copy() for a in arrays]
    kernel(device)(*arrays, is_causal=1, softcap=1.0, qk_matmul_output_mode=2)
    for a, c in zip(arrays, copies):
        np.testing.assert_array_equal(a, c)


def test_opset_23_and_24_differences(device, rng):
    Q, K, V = rand(rng, 1, 2, 3, 8), rand(rng, 1, 2, 4, 8), rand(rng, 1, 2, 4, 8)
    with pytest.raises(KernelInputError, match="opset 24"):
        kernel(device, 23)(Q, K, V, None, None, None, np.array([4]))
    with pytest.raises(KernelInputError, match="opset 25"):
        kernel(device, 24)(Q, K, V, left_window_size=1)
    check(kernel(device, 23)(Q, K, V, is_causal=1), naive(Q, K, V, causal=1))


def test_bad_inputs(device, rng):
    K_ = kernel(device)
    Q, K, V = rand(rng, 1, 4, 3, 8), rand(rng, 1, 3, 4, 8), rand(rng, 1, 3, 4, 8)
    with pytest.raises(KernelInputError, match="Attention.*multiple.*float32"):
        K_(Q, K, V)
    Q3, K3, V3 = rand(rng, 1, 3, 32), rand(rng, 1, 4, 16), rand(rng, 1, 4, 16)
    with pytest.raises(KernelInputError, match="q_num_heads"):
        K_(Q3, K3, V3)
    with pytest.raises(KernelInputError, match="divisible"):
        K_(Q3, K3, V3, q_num_heads=3, kv_num_heads=2)
    with pytest.raises(KernelInputError, match="3-D or all be 4-D"):
        K_(Q3, rand(rng, 1, 2, 4, 8), V3)
    Q, K, V = rand(rng, 1, 2, 3, 8), rand(rng, 1, 2, 4, 8), rand(rng, 1, 2, 4, 8)
    with pytest.raises(KernelInputError, match="does not broadcast"):
        K_(Q, K, V, rand(rng, 3, 3, 4))
    with pytest.raises(KernelInputError, match="exceeds"):
        K_(Q, K, V, rand(rng, 3, 5))
    with pytest.raises(KernelInputError, match="together"):
        K_(Q, K, V, None, rand(rng, 1, 2, 2, 8))
    with pytest.raises(KernelInputError, match="past_key/past_value must have shapes"):
        K_(Q, K, V, None, rand(rng, 1, 2, 2, 8), rand(rng, 1, 2, 3, 8))
    with pytest.raises(KernelInputError, match="head sizes"):
        K_(Q, rand(rng, 1, 2, 4, 7), V)
    with pytest.raises(KernelInputError, match="nonpad_kv_seqlen values"):
        K_(Q, K, V, None, None, None, np.array([9]))
    with pytest.raises(KernelInputError, match="cannot be combined"):
        K_(Q, K, V, None, rand(rng, 1, 2, 2, 8), rand(rng, 1, 2, 2, 8), np.array([2]))
    with pytest.raises(KernelInputError, match="qk_matmul_output_mode"):
        K_(Q, K, V, qk_matmul_output_mode=4)
    with pytest.raises(KernelInputError, match="softmax_precision"):
        K_(Q, K, V, softmax_precision=7)
    with pytest.raises(KernelInputError, match="disagree"):
        K_(Q, K, V, q_num_heads=4, kv_num_heads=2)
    with pytest.raises(KernelTypeError, match="Attention"):
        K_(Q.astype(np.int32), K, V)
    with pytest.raises(KernelTypeError, match="Attention"):
        K_(Q, K.astype(np.float64), V)


@pytest.mark.parametrize("past", [0, 37])
@pytest.mark.parametrize("sq, t_new", [(300, 300), (200, 150)])
def test_long_causal_uses_key_prefixes(device, rng, past, sq, t_new):
    """Long causal runs work in query blocks over the key prefix each block can see; with
    float and bool masks, GQA and a past cache the result matches the reference."""
    hq, hkv = 4, 2
    Q, K, V = rand(rng, 1, hq, sq, 16), rand(rng, 1, hkv, t_new, 16), rand(rng, 1, hkv, t_new, 8)
    pk, pv = (rand(rng, 1, hkv, past, 16), rand(rng, 1, hkv, past, 8)) if past else (None, None)
    T = past + t_new
    for mask in (rand(rng, sq, T), rng.random((1, 1, sq, T)) > 0.3):
        res = kernel(device)(Q, K, V, mask, pk, pv, is_causal=1)
        check(res, naive(Q, K, V, mask, pk, pv, causal=1), tol=2e-5)
    res = kernel(device)(Q, K, V, None, pk, pv, is_causal=1)
    check(res, naive(Q, K, V, None, pk, pv, causal=1), tol=2e-5)
