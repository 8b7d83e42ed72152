"""RotaryEmbedding, MultiHeadAttention, Attention and GroupQueryAttention (com.microsoft)
against onnxruntime on random inputs, plus what onnxruntime's CPU kernels lack (packed
QKV/KV for MultiHeadAttention) against NumPy, and the input checks."""

from __future__ import annotations

import numpy as np
import pytest

from gpukernels.errors import KernelInputError, KernelTypeError
from gpukernels.kernels import KernelContext, load_all
from gpukernels.kernels.contrib.attention import (Attention, GroupQueryAttention, MultiHeadAttention,
                                                  RotaryEmbedding)

from tests.ort_reference import compare, feeds_of, run_gk, run_ort, single_node_model

load_all()


def f32(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def tol(dtype):
    return dict(rtol=3e-3, atol=3e-3) if dtype == np.float16 else dict(rtol=1e-4, atol=1e-5)


def np_attention(q, k, v, H, add=None, causal=False, past=0, scale=None):
    """float64 reference: q (B, S, H*d), k/v (B, T, H*d)."""
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    B, S, D = q.shape
    T = k.shape[1]
    d = D // H
    q4 = q.reshape(B, S, H, d).transpose(0, 2, 1, 3)
    k4 = k.reshape(B, T, H, -1).transpose(0, 2, 1, 3)
    v4 = v.reshape(B, T, H, -1).transpose(0, 2, 1, 3)
    s = q4 @ k4.transpose(0, 1, 3, 2) * (1 / np.sqrt(d) if scale is None else scale)
    if add is not None:
        s = s + add
    if causal:
        s = np.where(np.arange(T)[None] <= np.arange(S)[:, None] + past, s, -np.inf)
    s = np.exp(s - s.max(-1, keepdims=True))
    s /= s.sum(-1, keepdims=True)
    return (s @ v4).transpose(0, 2, 1, 3).reshape(B, S, -1)


# -------------------------------------------------------------------- RotaryEmbedding


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["float32", "float16"])
@pytest.mark.parametrize("layout", ["3d", "4d"])
@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("pos", ["base", "full"])
def test_rotary_vs_ort(device, rng, dtype, layout, interleaved, pos):
    B, S, N, h, M = 2, 5, 3, 16, 12
    x = (f32(rng, B, S, N * h) if layout == "3d" else f32(rng, B, N, S, h)).astype(dtype)
    cos, sin = f32(rng, M, h // 2).astype(dtype), f32(rng, M, h // 2).astype(dtype)
    p = np.array([3], np.int64) if pos == "base" else rng.integers(0, M, (B, S)).astype(np.int64)
    compare("RotaryEmbedding", [("x", x), ("p", p), ("c", cos), ("s", sin)], {"interleaved": interleaved},
            device=device, **tol(dtype))


def test_rotary_partial_dim_vs_ort(device, rng):
    B, S, N, h, M = 2, 4, 2, 16, 8
    x = f32(rng, B, S, N * h)
    cos, sin = f32(rng, M, 4), f32(rng, M, 4)
    p = rng.integers(0, M, (B, S)).astype(np.int64)
    compare("RotaryEmbedding", [("x", x), ("p", p), ("c", cos), ("s", sin)],
            {"rotary_embedding_dim": 8, "num_heads": N}, device=device)


def test_rotary_errors(device, rng):
    k = RotaryEmbedding(KernelContext(device))
    x, cos, sin = f32(rng, 2, 3, 16), f32(rng, 6, 4), f32(rng, 6, 4)
    with pytest.raises(KernelInputError, match="base value 4 with sequence length 3 exceeds"):
        k(x, np.array([4], np.int64), cos, sin)
    with pytest.raises(KernelInputError, match="position_ids must have shape"):
        k(x, np.zeros((2, 2), np.int64), cos, sin)
    with pytest.raises(KernelInputError, match="needs num_heads"):
        k(x, np.array([0], np.int64), cos, sin, rotary_embedding_dim=8)
    with pytest.raises(KernelInputError, match="is_packed_batching"):
        k(x, np.array([0], np.int64), cos, sin, is_packed_batching=1)
    with pytest.raises(KernelTypeError, match="position_ids"):
        k(x, np.array([0], np.int32), cos, sin)
    with pytest.raises(KernelInputError, match="not a multiple of the head size"):
        k(f32(rng, 2, 3, 12), np.array([0], np.int64), cos, sin)


# ----------------------------------------------------------------- MultiHeadAttention


def _mha_inputs(rng, B=2, S=3, L=5, N=2, h=8, dtype=np.float32):
    q, k, v = f32(rng, B, S, N * h), f32(rng, B, L, N * h), f32(rng, B, L, N * h)
    return q.astype(dtype), k.astype(dtype), v.astype(dtype), f32(rng, 3 * N * h).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["float32", "float16"])
@pytest.mark.parametrize("mask", ["none", "lengths", "2d", "3d"])
def test_mha_masks_vs_ort(device, rng, dtype, mask):
    B, S, L, N = 2, 3, 5, 2
    q, k, v, b = _mha_inputs(rng, B, S, L, N, dtype=dtype)
    m = {"none": None, "lengths": np.array([2, 5], np.int32),
         "2d": (rng.random((B, L)) > 0.4).astype(np.int32),
         "3d": (rng.random((B, S, L)) > 0.4).astype(np.int32)}[mask]
    compare("MultiHeadAttention", [("q", q), ("k", k), ("v", v), ("b", b), ("m", m)], {"num_heads": N},
            n_outputs=3, device=device, **tol(dtype))


@pytest.mark.parametrize("unidirectional", [0, 1])
def test_mha_past_attention_bias_vs_ort(device, rng, unidirectional):
    B, S, P, N, h = 2, 3, 4, 2, 8
    q, k, v, b = _mha_inputs(rng, B, S, S, N, h)
    pk, pv = f32(rng, B, N, P, h), f32(rng, B, N, P, h)
    ab = f32(rng, 1, N, S, P + S)
    m = np.array([[0, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 0]], np.int32)
    compare("MultiHeadAttention", [("q", q), ("k", k), ("v", v), ("b", b), ("m", m), ("ab", ab), ("pk", pk),
                                   ("pv", pv)],
            {"num_heads": N, "unidirectional": unidirectional, "mask_filter_value": -3.0, "scale": 0.2},
            n_outputs=3, device=device)


def test_mha_bnsh_cache_vs_ort(device, rng):
    B, S, L, N, h = 2, 3, 6, 2, 8
    q = f32(rng, B, S, N * h)
    k4, v4 = f32(rng, B, N, L, h), f32(rng, B, N, L, h)
    compare("MultiHeadAttention", [("q", q), ("k", k4), ("v", v4)], {"num_heads": N}, device=device)


def test_mha_packed_layouts(device, rng):
    B, S, N, h = 2, 4, 2, 8
    qkv = f32(rng, B, S, N, 3, h)
    q, k, v = (qkv[:, :, :, i].reshape(B, S, -1) for i in range(3))
    ctx = KernelContext(device)
    got = MultiHeadAttention(ctx)(qkv, num_heads=N).output.numpy()
    np.testing.assert_allclose(got, np_attention(q, k, v, N), rtol=1e-5, atol=1e-6)
    kv = np.stack([k.reshape(B, S, N, h), v.reshape(B, S, N, h)], axis=3)
    got = MultiHeadAttention(ctx)(q, kv, num_heads=N, unidirectional=1).output.numpy()
    np.testing.assert_allclose(got, np_attention(q, k, v, N, causal=True), rtol=1e-5, atol=1e-6)


def test_mha_errors(device, rng):
    k = MultiHeadAttention(KernelContext(device))
    q, kk, v, b = _mha_inputs(rng)
    with pytest.raises(KernelInputError, match="num_heads attribute"):
        k(q, kk, v)
    with pytest.raises(KernelInputError, match="not divisible by num_heads 3"):
        k(q, kk, v, num_heads=3)
    with pytest.raises(KernelInputError, match="'bias' must be 1-D of size 48"):
        k(q, kk, v, b[:10], num_heads=2)
    with pytest.raises(KernelInputError, match=r"the mask must have shape \(2,\), \(2, 5\) or \(2, 3, 5\)"):
        k(q, kk, v, None, np.ones((2, 4), np.int32), num_heads=2)
    with pytest.raises(KernelTypeError, match="mask"):
        k(q, kk, v, None, np.ones((2, 5), np.int64), num_heads=2)
    with pytest.raises(KernelInputError, match="attention_bias must have shape"):
        k(q, kk, v, None, None, f32(rng, 1, 2, 3, 4), num_heads=2)
    with pytest.raises(KernelInputError, match="key is required"):
        k(q, num_heads=2)
    with pytest.raises(KernelInputError, match="cache_indirection"):
        k(q, kk, v, None, None, None, None, None, None, np.zeros((2, 1, 5), np.int32), num_heads=2)


# ------------------------------------------------------------------ Attention (BERT)


def _attn_inputs(rng, B=2, S=4, N=2, h=8, Din=12, dtype=np.float32, sizes=None):
    total = 3 * N * h if sizes is None else sum(sizes)
    return (f32(rng, B, S, Din).astype(dtype), f32(rng, Din, total, scale=0.4).astype(dtype),
            f32(rng, total).astype(dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["float32", "float16"])
@pytest.mark.parametrize("mask", ["none", "lengths", "end_start", "2d", "3d"])
@pytest.mark.parametrize("unidirectional", [0, 1])
def test_attention_masks_vs_ort(device, rng, dtype, mask, unidirectional):
    B, S, N = 2, 4, 2
    x, w, b = _attn_inputs(rng, B, S, N, dtype=dtype)
    m = {"none": None, "lengths": np.array([3, 4], np.int32), "end_start": np.array([4, 3, 1, 0], np.int32),
         "2d": np.array([[1, 1, 0, 1], [1, 1, 1, 1]], np.int32),
         "3d": (rng.random((B, S, S)) > 0.3).astype(np.int32)}[mask]
    compare("Attention", [("x", x), ("w", w), ("b", b), ("m", m)],
            {"num_heads": N, "unidirectional": unidirectional}, n_outputs=2, device=device, **tol(dtype))


def test_attention_past_bias_sizes_vs_ort(device, rng):
    B, S, N, h, P = 2, 3, 2, 8, 5
    x, w, b = _attn_inputs(rng, B, S, N, h)
    past = f32(rng, 2, B, N, P, h)
    ab = f32(rng, B, N, S, P + S)
    m = (rng.random((B, P + S)) > 0.3).astype(np.int32)
    compare("Attention", [("x", x), ("w", w), ("b", b), ("m", m), ("past", past)],
            {"num_heads": N, "unidirectional": 1, "mask_filter_value": -5.0}, n_outputs=2, device=device)
    # onnxruntime refuses past together with attention_bias
    compare("Attention", [("x", x), ("w", w), ("b", b), ("m", m[:, :S]), ("past", None), ("ab", ab[..., :S])],
            {"num_heads": N, "mask_filter_value": -5.0}, n_outputs=2, device=device)
    sizes = [N * h, N * h, N * 4]
    x, w, b = _attn_inputs(rng, B, S, N, h, sizes=sizes)
    compare("Attention", [("x", x), ("w", w), ("b", b)], {"num_heads": N, "qkv_hidden_sizes": sizes},
            device=device)
    compare("Attention", [("x", x), ("w", w)], {"num_heads": N, "qkv_hidden_sizes": sizes, "scale": 0.3},
            device=device)


def test_attention_errors(device, rng):
    k = Attention(KernelContext(device))
    x, w, b = _attn_inputs(rng)
    with pytest.raises(KernelInputError, match="Attention: input must be"):
        k(x, w[:5], b, num_heads=2)
    with pytest.raises(KernelInputError, match="qkv_hidden_sizes"):
        k(x, w, b, num_heads=2, qkv_hidden_sizes=[16, 8, 24])
    with pytest.raises(KernelInputError, match="do_rotary"):
        k(x, w, b, num_heads=2, do_rotary=1)
    with pytest.raises(KernelInputError, match=r"\(3\*batch\+2\)"):
        k(x, w, b, np.zeros(8, np.int32), num_heads=2)
    with pytest.raises(KernelInputError, match="past must be"):
        k(x, w, b, None, f32(rng, 2, 2, 2, 3, 4), num_heads=2)
    with pytest.raises(KernelInputError, match="past_present_share_buffer"):
        k(x, w, b, num_heads=2, past_present_share_buffer=1)


# --------------------------------------------------------------- GroupQueryAttention


def _gqa_model(inputs, attrs, n_outputs=3):
    return single_node_model("GroupQueryAttention", inputs, attrs, n_outputs)


def _gqa_compare(device, inputs, attrs, valid_rows, total_rows, dtype=np.float32):
    """Outputs agree on the valid query rows of each entry and the valid cache rows."""
    model = _gqa_model(inputs, attrs)
    feeds = feeds_of(model, inputs)
    want = run_ort(model, feeds)
    got = run_gk(model, feeds, device)
    assert [g.shape for g in got] == [w.shape for w in want]
    assert [g.dtype for g in got] == [w.dtype for w in want]
    for b, (nq, nt) in enumerate(zip(valid_rows, total_rows)):
        np.testing.assert_allclose(got[0][b, :nq].astype(np.float64), want[0][b, :nq].astype(np.float64),
                                   **tol(dtype))
        for i in (1, 2):
            np.testing.assert_allclose(got[i][b, :, :nt].astype(np.float64), want[i][b, :, :nt].astype(np.float64),
                                       **tol(dtype))
    return got, want


def _gqa_new(rng, B, S, N, Nkv, h, dtype=np.float32):
    return (f32(rng, B, S, N * h).astype(dtype), f32(rng, B, S, Nkv * h).astype(dtype),
            f32(rng, B, S, Nkv * h).astype(dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["float32", "float16"])
def test_gqa_prompt_and_decode_vs_ort(device, rng, dtype):
    B, S, N, Nkv, h, P = 2, 4, 4, 2, 8, 5
    q, k, v = _gqa_new(rng, B, S, N, Nkv, h, dtype)
    attrs = {"num_heads": N, "kv_num_heads": Nkv}
    sl, tot = np.full(B, S - 1, np.int32), np.array(S, np.int32)
    _gqa_compare(device, [("q", q), ("k", k), ("v", v), ("pk", None), ("pv", None), ("sl", sl), ("t", tot)], attrs,
                 [S] * B, [S] * B, dtype)
    pk, pv = f32(rng, B, Nkv, P, h).astype(dtype), f32(rng, B, Nkv, P, h).astype(dtype)
    q1, k1, v1 = q[:, :1], k[:, :1], v[:, :1]
    sl, tot = np.full(B, P, np.int32), np.array(P + 1, np.int32)
    _gqa_compare(device, [("q", q1), ("k", k1), ("v", v1), ("pk", pk), ("pv", pv), ("sl", sl), ("t", tot)], attrs,
                 [1] * B, [P + 1] * B, dtype)


def test_gqa_ragged_buffer_window_softcap_vs_ort(device, rng):
    B, S, N, Nkv, h, C = 3, 1, 4, 1, 8, 10
    q, k, v = _gqa_new(rng, B, S, N, Nkv, h)
    pk, pv = f32(rng, B, Nkv, C, h), f32(rng, B, Nkv, C, h)
    sl, tot = np.array([6, 3, 8], np.int32), np.array(9, np.int32)
    inputs = [("q", q), ("k", k), ("v", v), ("pk", pk), ("pv", pv), ("sl", sl), ("t", tot)]
    for attrs in ({}, {"local_window_size": 3}, {"softcap": 1.5}, {"scale": 0.3}):
        _gqa_compare(device, inputs, {"num_heads": N, "kv_num_heads": Nkv, **attrs}, [1] * B, (sl + 1).tolist())
    # a right-padded prompt without past, and non-causal attention
    S = 5
    q, k, v = _gqa_new(rng, 2, S, N, Nkv, h)
    sl = np.array([4, 2], np.int32)
    inputs = [("q", q), ("k", k), ("v", v), ("pk", None), ("pv", None), ("sl", sl), ("t", np.array(S, np.int32))]
    _gqa_compare(device, inputs, {"num_heads": N, "kv_num_heads": Nkv}, [5, 3], [5, 3])
    sl = np.full(2, S - 1, np.int32)
    inputs[5] = ("sl", sl)
    _gqa_compare(device, inputs, {"num_heads": N, "kv_num_heads": Nkv, "causal": 0}, [5, 5], [5, 5])


def test_gqa_packed_rotary_bias_vs_ort(device, rng):
    B, S, N, Nkv, h, M = 2, 4, 2, 1, 16, 12
    q, k, v = _gqa_new(rng, B, S, N, Nkv, h)
    sl, tot = np.full(B, S - 1, np.int32), np.array(S, np.int32)
    attrs = {"num_heads": N, "kv_num_heads": Nkv}
    qkv = np.concatenate([q, k, v], axis=-1)
    _gqa_compare(device, [("q", qkv), ("k", None), ("v", None), ("pk", None), ("pv", None), ("sl", sl), ("t", tot)],
                 attrs, [S] * B, [S] * B)
    cos, sin = f32(rng, M, h // 2), f32(rng, M, h // 2)
    for interleaved in (0, 1):
        _gqa_compare(device, [("q", q), ("k", k), ("v", v), ("pk", None), ("pv", None), ("sl", sl), ("t", tot),
                              ("c", cos), ("s", sin)],
                     {**attrs, "do_rotary": 1, "rotary_interleaved": interleaved}, [S] * B, [S] * B)
    # decode with rotary: positions continue after the past
    P = 3
    pk, pv = f32(rng, B, Nkv, P, h), f32(rng, B, Nkv, P, h)
    _gqa_compare(device, [("q", q[:, :1]), ("k", k[:, :1]), ("v", v[:, :1]), ("pk", pk), ("pv", pv),
                          ("sl", np.full(B, P, np.int32)), ("t", np.array(P + 1, np.int32)), ("c", cos), ("s", sin)],
                 {**attrs, "do_rotary": 1}, [1] * B, [P + 1] * B)
    ab = f32(rng, B, N, S, S)
    _gqa_compare(device, [("q", q), ("k", k), ("v", v), ("pk", None), ("pv", None), ("sl", sl), ("t", tot),
                          ("c", None), ("s", None), ("pid", None), ("ab", ab)], attrs, [S] * B, [S] * B)


def test_gqa_errors(device, rng):
    k = GroupQueryAttention(KernelContext(device))
    q, kk, v = _gqa_new(rng, 2, 3, 4, 2, 8)
    sl, tot = np.full(2, 2, np.int32), np.array(3, np.int32)
    with pytest.raises(KernelInputError, match="num_heads and kv_num_heads"):
        k(q, kk, v, None, None, sl, tot)
    with pytest.raises(KernelInputError, match="multiple of kv_num_heads 3"):
        k(q, kk, v, None, None, sl, tot, num_heads=4, kv_num_heads=3)
    with pytest.raises(KernelInputError, match="past lengths"):
        k(q, kk, v, None, None, np.full(2, 5, np.int32), tot, num_heads=4, kv_num_heads=2)
    with pytest.raises(KernelInputError, match="key and value must be"):
        k(q, kk[:, :2], v[:, :2], None, None, sl, tot, num_heads=4, kv_num_heads=2)
    with pytest.raises(KernelInputError, match="head_sink"):
        k(q, kk, v, None, None, sl, tot, None, None, None, None, f32(rng, 4), num_heads=4, kv_num_heads=2)
    with pytest.raises(KernelInputError, match="quantized KV cache"):
        k(q, kk, v, None, None, sl, tot, num_heads=4, kv_num_heads=2, k_quant_type="PER_TENSOR")
    with pytest.raises(KernelInputError, match="local_window_size"):
        k(q, kk, v, None, None, sl, tot, num_heads=4, kv_num_heads=2, causal=0, local_window_size=2)
    with pytest.raises(KernelTypeError, match="seqlens_k"):
        k(q, kk, v, None, None, sl.astype(np.int64), tot, num_heads=4, kv_num_heads=2)
    with pytest.raises(KernelInputError, match="do_rotary needs"):
        k(q, kk, v, None, None, sl, tot, num_heads=4, kv_num_heads=2, do_rotary=1)
