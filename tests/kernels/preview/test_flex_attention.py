"""ai.onnx.preview FlexAttention against a float64 loop reference."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper

from gpukernels.errors import GpuKernelsError, KernelInputError, KernelTypeError
from gpukernels.kernels import KernelContext
from gpukernels.kernels.preview.flex_attention import FlexAttention


def K(device):
    return FlexAttention(KernelContext(device))


def reference(q, k, v, scale=None, score_mod=None, prob_mod=None):
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    b, hq, l_, e = q.shape
    hkv, s = k.shape[1], k.shape[2]
    scale = 1 / math.sqrt(e) if scale is None else scale
    out = np.zeros((b, hq, l_, v.shape[3]))
    for bi in range(b):
        for h in range(hq):
            kh = h // (hq // hkv)
            sc = q[bi, h] @ k[bi, kh].T * scale
            if score_mod is not None:
                sc = score_mod(sc)
            p = np.exp(sc - sc.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            if prob_mod is not None:
                p = prob_mod(p)
            out[bi, h] = p @ v[bi, kh]
    return out


def _bias_graph(value, dtype=TensorProto.FLOAT):
    return helper.make_graph(
        [helper.make_node("Add", ["s", "bias"], ["o"])], "score_mod",
        [helper.make_tensor_value_info("s", dtype, None)], [helper.make_tensor_value_info("o", dtype, None)],
        [helper.make_tensor("bias", dtype, [], [value])])


def _causal_graph():
    # Where(col > row, -inf, s) with row/col from Shape + Range
    nodes = [
        helper.make_node("Shape", ["s"], ["shp"]),
        helper.make_node("Gather", ["shp", "i2"], ["L"]),
        helper.make_node("Gather", ["shp", "i3"], ["S"]),
        helper.make_node("Range", ["zero", "L", "one"], ["rows"]),
        helper.make_node("Range", ["zero", "S", "one"], ["cols"]),
        helper.make_node("Unsqueeze", ["rows", "ax1"], ["rows2"]),
        helper.make_node("Greater", ["cols", "rows2"], ["future"]),
        helper.make_node("Where", ["future", "ninf", "s"], ["o"]),
    ]
    inits = [helper.make_tensor("i2", TensorProto.INT64, [], [2]),
             helper.make_tensor("i3", TensorProto.INT64, [], [3]),
             helper.make_tensor("zero", TensorProto.INT64, [], [0]),
             helper.make_tensor("one", TensorProto.INT64, [], [1]),
             helper.make_tensor("ax1", TensorProto.INT64, [1], [1]),
             helper.make_tensor("ninf", TensorProto.FLOAT, [], [-np.inf])]
    return helper.make_graph(nodes, "causal", [helper.make_tensor_value_info("s", TensorProto.FLOAT, None)],
                             [helper.make_tensor_value_info("o", TensorProto.FLOAT, None)], inits)


@pytest.mark.parametrize("shape", [(2, 4, 5, 8, 4, 6, 3), (1, 6, 3, 4, 2, 7, 5), (2, 3, 1, 2, 3, 1, 2),
                                   (1, 2, 4, 16, 1, 5, 16)])
def test_flex_attention_random(device, rng, shape):
    b, hq, l_, e, hkv, s, ev = shape
    q = rng.standard_normal((b, hq, l_, e)).astype(np.float32)
    k = rng.standard_normal((b, hkv, s, e)).astype(np.float32)
    v = rng.standard_normal((b, hkv, s, ev)).astype(np.float32)
    y = K(device)(q, k, v).numpy()
    assert y.dtype == np.float32 and y.shape == (b, hq, l_, ev)
    np.testing.assert_allclose(y, reference(q, k, v), rtol=1e-5, atol=1e-6)
    y = K(device)(q, k, v, scale=0.37).numpy()
    np.testing.assert_allclose(y, reference(q, k, v, scale=0.37), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float16, 2e-3), (ml_dtypes.bfloat16, 1e-2)])
def test_flex_attention_dtypes(device, rng, dtype, tol):
    q, k, v = (rng.standard_normal((1, 2, 3, 4)).astype(dtype) for _ in range(3))
    y = K(device)(q, k, v).numpy()
    assert y.dtype == np.dtype(dtype)
    np.testing.assert_allclose(y.astype(np.float64), reference(q, k, v), rtol=tol, atol=tol)


def test_flex_attention_score_and_prob_mod(device, rng):
    q, k, v = (rng.standard_normal((2, 2, 4, 3)).astype(np.float32) for _ in range(3))
    y = K(device)(q, k, v, score_mod=_bias_graph(0.5)).numpy()
    np.testing.assert_allclose(y, reference(q, k, v), rtol=1e-5, atol=1e-6)  # a constant bias cancels
    y = K(device)(q, k, v, score_mod=_causal_graph()).numpy()
    causal = lambda sc: np.where(np.arange(sc.shape[1])[None, :] > np.arange(sc.shape[0])[:, None], -np.inf, sc)
    np.testing.assert_allclose(y, reference(q, k, v, score_mod=causal), rtol=1e-5, atol=1e-6)
    scale_graph = helper.make_graph(
        [helper.make_node("Mul", ["p", "c"], ["o"])], "prob_mod", [helper.make_tensor_value_info("p", 1, None)],
        [helper.make_tensor_value_info("o", 1, None)], [helper.make_tensor("c", 1, [], [0.5])])
    y = K(device)(q, k, v, prob_mod=scale_graph).numpy()
    np.testing.assert_allclose(y, reference(q, k, v, prob_mod=lambda p: p * 0.5), rtol=1e-5, atol=1e-6)


def test_flex_attention_double_precision_softmax(device, rng):
    q, k, v = (rng.standard_normal((1, 1, 3, 4)).astype(np.float32) for _ in range(3))
    y = K(device)(q, k, v, softmax_precision=TensorProto.DOUBLE, score_mod=_bias_graph(1.0, TensorProto.DOUBLE))
    np.testing.assert_allclose(y.numpy(), reference(q, k, v), rtol=1e-6, atol=1e-7)
    with pytest.raises(GpuKernelsError, match="score_mod"):
        K(device)(q, k, v, score_mod=_bias_graph(1.0, TensorProto.DOUBLE))  # float scores, double bias
    shrink = helper.make_graph(
        [helper.make_node("ReduceMax", ["s"], ["o"], keepdims=1)], "score_mod",
        [helper.make_tensor_value_info("s", 1, None)], [helper.make_tensor_value_info("o", 1, None)])
    with pytest.raises(KernelInputError, match="FlexAttention: score_mod changed the shape"):
        K(device)(q, k, v, score_mod=shrink)


def test_flex_attention_empty_and_errors(device, rng):
    q = rng.standard_normal((1, 2, 0, 4)).astype(np.float32)
    k = rng.standard_normal((1, 2, 3, 4)).astype(np.float32)
    assert K(device)(q, k, k).numpy().shape == (1, 2, 0, 4)
    with pytest.raises(KernelInputError, match="FlexAttention.*rank-4"):
        K(device)(q[0], k, k)
    with pytest.raises(KernelInputError, match="FlexAttention.*multiple"):
        K(device)(rng.standard_normal((1, 3, 2, 4)).astype(np.float32), k, k)
    with pytest.raises(KernelInputError, match="FlexAttention.*head size"):
        K(device)(rng.standard_normal((1, 2, 2, 5)).astype(np.float32), k, k)
    with pytest.raises(KernelTypeError, match="FlexAttention"):
        K(device)(q.astype(np.int32), k.astype(np.int32), k.astype(np.int32))
    with pytest.raises(KernelInputError, match="FlexAttention.*softmax_precision"):
        K(device)(q, k, k, softmax_precision=7)
