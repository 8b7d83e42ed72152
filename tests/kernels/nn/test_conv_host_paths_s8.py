"""The per-node state and the gather of the group-1 2-D host Conv paths (_conv_host):
ConstantMemo (what pointwise, conv2d_windows and trim_taps derive from constant weights
and bias, kept per node; derived again for any other arrays), pointwise's bias paths
(the ones row in a kept scratch, the bias block, strides), conv2d_windows' gathered
columns of narrow images, and the same through compiled graphs (Session: constants
frozen, an activation fused as the epilogue).  Every result is checked against the
float64 reference on random inputs; fused epilogues bit for bit against the activation
applied to the path's own result."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from gpukernels.kernels.nn import _conv_host as conv_host
from gpukernels.runtime import Session

from tests.reference import conv as ref_conv

pytestmark = pytest.mark.usefixtures("default_paths")


def _relu(src, out):
    np.maximum(src, src.dtype.type(0), out=out)


def _frozen(a):
    a = np.array(a)
    a.flags.writeable = False
    return a


def _tol(dtype):
    return {"rtol": 1e-5, "atol": 1e-4} if dtype == np.float32 else {"rtol": 1e-12, "atol": 1e-12}


# ----------------------------------------------------------------------- ConstantMemo


def test_memo_keeps_values_of_constants_only():
    memo = conv_host.ConstantMemo()
    calls = []

    def make(w, b):
        calls.append(1)
        return w.sum() + (0 if b is None else b.sum())

    w, b = _frozen(np.ones(3)), _frozen(np.arange(3.0))
    assert memo.get("k", w, b, make) == 6 and memo.get("k", w, b, make) == 6
    assert len(calls) == 1  # kept
    b2 = _frozen(np.zeros(3))  # the same weights with another bias: derived anew
    assert memo.get("k", w, b2, make) == 3 and len(calls) == 2
    writable = np.ones(3)
    assert memo.get("k", writable, None, make) == 3 and memo.get("k", writable, None, make) == 3
    assert len(calls) == 4  # a writable array may change between calls: never kept
    writable[:] = 2
    assert memo.get("k", writable, None, make) == 6


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("xs, M, strides", [
    ((2, 5, 7, 9), 12, (1, 1)),    # fewer input than output channels: the ones row
    ((2, 12, 7, 9), 5, (1, 1)),    # more: the bias block
    ((3, 6, 9, 11), 4, (2, 3)),    # strides: the ones row under the subsampling copy
    ((1, 4, 50, 60), 3, (1, 1)),   # long rows: the bias column
    ((2, 3, 5, 5), 7, (2, 2)),
])
def test_pointwise_against_reference(xs, M, strides, dtype, rng):
    """Every bias path, with and without a memo (the second call reads the kept
    weights), with a Relu epilogue bit for bit the activation of the plain result."""
    x = rng.standard_normal(xs).astype(dtype)
    w = _frozen(rng.standard_normal((M, xs[1], 1, 1)).astype(dtype))
    b = _frozen(rng.standard_normal(M).astype(dtype))
    O = tuple(-(-xs[2 + i] // strides[i]) for i in range(2))
    for bias in (b, None):
        want = ref_conv(x, w, bias, strides, (0, 0, 0, 0), (1, 1))
        memo = conv_host.ConstantMemo()
        for _ in range(2):
            plain = conv_host.pointwise(x, w, bias, strides, O, None, memo).copy()
            assert plain.shape == want.shape and plain.dtype == dtype
            np.testing.assert_allclose(plain, want, **_tol(dtype))
            fused = conv_host.pointwise(x, w, bias, strides, O, _relu, memo)
            expected = plain.copy()
            _relu(expected, expected)
            np.testing.assert_array_equal(fused, expected)


def test_pointwise_follows_changed_weights_and_bias(rng):
    """Writable weights and bias are read again on every call (nothing kept for them)."""
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    w = rng.standard_normal((8, 3, 1, 1)).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    memo = conv_host.ConstantMemo()
    for _ in range(3):
        got = conv_host.pointwise(x, w, b, (1, 1), (4, 5), None, memo)
        np.testing.assert_allclose(got, ref_conv(x, w, b, (1, 1), (0, 0, 0, 0), (1, 1)), rtol=1e-5, atol=1e-5)
        w += 1.5
        b -= 0.25


def test_pointwise_other_images_reuse_the_scratch(rng):
    """The kept ones-row scratch of one geometry: new inputs each call, the ones row kept."""
    w = _frozen(rng.standard_normal((9, 2, 1, 1)).astype(np.float32))
    b = _frozen(rng.standard_normal(9).astype(np.float32))
    memo = conv_host.ConstantMemo()
    for _ in range(3):
        x = rng.standard_normal((2, 2, 6, 6)).astype(np.float32)
        np.testing.assert_allclose(conv_host.pointwise(x, w, b, (1, 1), (6, 6), None, memo),
                                   ref_conv(x, w, b, (1, 1), (0, 0, 0, 0), (1, 1)), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------ conv2d_windows' gather

GATHER_CASES = [
    # x shape, w shape, strides, pads (top, left, bottom, right), dilations
    ((2, 8, 3, 3), (16, 8, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),      # 3x3 planes
    ((2, 6, 6, 6), (5, 6, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),       # K >= pixels: no ones row
    ((2, 2, 6, 6), (5, 2, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),       # the ones row in the gather
    ((3, 4, 12, 11), (6, 4, 3, 3), (2, 2), (1, 0, 2, 1), (1, 1)),     # strided, asymmetric pads
    ((2, 3, 9, 7), (4, 3, 3, 2), (1, 2), (2, 1, 0, 2), (2, 1)),       # dilated
    ((1, 3, 4, 5), (2, 3, 3, 3), (1, 2), (5, 4, 3, 6), (1, 1)),       # pads larger than the kernel
    ((2, 4, 1, 5), (3, 4, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),       # one-row images
]


def _out_shape(xs, ws, strides, pads, dil):
    return tuple((xs[2 + i] + pads[i] + pads[i + 2] - (ws[2 + i] - 1) * dil[i] - 1) // strides[i] + 1
                 for i in range(2))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("gather", [True, False, None])
@pytest.mark.parametrize("case", GATHER_CASES)
def test_windows_gather_against_reference(case, gather, dtype, rng):
    """The gathered columns (forced, off, and the automatic choice), with and without a
    bias and a memo; a Relu epilogue bit for bit the activation of the plain result."""
    xs, ws, strides, pads, dil = case
    O = _out_shape(xs, ws, strides, pads, dil)
    w = _frozen(rng.standard_normal(ws).astype(dtype))
    b = _frozen(rng.standard_normal(ws[0]).astype(dtype))
    for bias in (b, None):
        memo = conv_host.ConstantMemo()
        for _ in range(2):  # new images each call, the same kept source and indices
            x = rng.standard_normal(xs).astype(dtype)
            want = ref_conv(x, w, bias, strides, pads, dil)
            plain = conv_host.conv2d_windows(x, w, bias, strides, pads, dil, O, None, memo=memo,
                                             gather=gather).copy()
            np.testing.assert_allclose(plain, want, **_tol(dtype))
            fused = conv_host.conv2d_windows(x, w, bias, strides, pads, dil, O, _relu, memo=memo, gather=gather)
            expected = plain.copy()
            _relu(expected, expected)
            np.testing.assert_array_equal(fused, expected)


def test_gather_index_reads_padding_and_ones():
    """Padding taps read the zero after x's elements, the ones row the one after it."""
    xs, ws = (1, 1, 2, 2), (1, 1, 3, 3)
    idx = conv_host._gather_index(xs, ws, (1, 1), (1, 1), (1, 1), (2, 2), True).reshape(10, 4)
    assert (idx[9] == 5).all()  # the ones row
    # output (0, 0): its window's top-left 2x2 taps read padding, the centre x[0, 0]
    assert idx[0, 0] == 4 and idx[4, 0] == 0 and idx[8, 0] == 3


def test_gather_is_chosen_for_narrow_images_only():
    plan = conv_host._windows_plan
    args = (np.dtype(np.float32), True, (1, 1), (1, 1), (1, 1))
    tune = (8 << 20, 512, 0, 2304)
    narrow = plan((2, 64, 6, 6), (64, 64, 3, 3), *args, (6, 6), None, None, None, *tune)
    wide = plan((2, 64, 12, 12), (64, 64, 3, 3), *args, (12, 12), None, None, None, *tune)
    forced = plan((2, 64, 6, 6), (64, 64, 3, 3), *args, (6, 6), True, None, None, *tune)
    assert narrow.gather is not None and wide.gather is None and forced.gather is None


def test_trim_taps_keeps_frozen_trimmed_weights(rng):
    """The trimmed weights of constant weights are derived once (the same array on the
    next call, read-only); weights holding a NaN are not trimmed."""
    x = rng.standard_normal((2, 4, 5, 5)).astype(np.float32)
    w = _frozen(rng.standard_normal((3, 4, 3, 3)).astype(np.float32))
    memo = conv_host.ConstantMemo()
    args = ((1, 1), (12, 12, 12, 12), (12, 12), (5, 5))  # dilation 12: only the centre tap reads data
    first = conv_host.trim_taps(x, w, *args, memo)
    second = conv_host.trim_taps(x, w, *args, memo)
    assert first[1] is second[1] and not first[1].flags.writeable and first[1].shape == (3, 4, 1, 1)
    bad = np.array(w)
    bad[0, 0, 0, 0] = np.nan
    assert conv_host.trim_taps(x, _frozen(bad), *args, conv_host.ConstantMemo()) is None
    b = _frozen(rng.standard_normal(3).astype(np.float32))
    got = conv_host.dense_2d(x, w, b, args[0], list(args[1]), args[2], args[3], None, memo)
    np.testing.assert_allclose(got, ref_conv(x, w, b, args[0], args[1], args[2]), rtol=1e-5, atol=1e-5)


# -------------------------------------------------------------------- compiled graphs


def _conv_relu_model(xs, w, b, strides, pads):
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], strides=list(strides), pads=list(pads)),
             helper.make_node("Relu", ["c"], ["y"])]
    ys = [xs[0], w.shape[0], *_out_shape(xs, w.shape, strides, pads, (1, 1))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(xs))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ys)],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("xs, ws, strides, pads", [
    ((2, 16, 3, 3), (32, 16, 3, 3), (1, 1), (1, 1, 1, 1)),     # gathered columns
    ((2, 8, 12, 12), (8, 8, 3, 3), (1, 1), (1, 1, 1, 1)),      # scratch and copies
    ((2, 8, 6, 6), (24, 8, 1, 1), (1, 1), (0, 0, 0, 0)),       # pointwise, the ones row
    ((2, 24, 6, 6), (8, 24, 1, 1), (2, 2), (0, 0, 0, 0)),      # pointwise, strided
    ((2, 24, 6, 6), (8, 24, 1, 1), (1, 1), (0, 0, 0, 0)),      # pointwise, the bias block
])
def test_session_conv_relu_runs_agree(xs, ws, strides, pads, rng):
    """Conv + Relu (the Relu fused as the epilogue, the constants kept per node) in a
    compiled graph: new inputs on every run, each against the float64 reference."""
    w = rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32)
    model = _conv_relu_model(xs, w, b, strides, pads)
    onnx.checker.check_model(model)
    sess = Session(model.SerializeToString())
    for _ in range(3):
        x = rng.standard_normal(xs).astype(np.float32)
        (got,) = sess.run(None, {"x": x})
        want = np.maximum(ref_conv(x, w, b, strides, pads, (1, 1)), 0)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("paths", ["auto", "reference"])
@pytest.mark.parametrize("xs, strides", [
    ((1, 2, 2, 3), (2, 1)),   # one output row read from two input rows
    ((2, 3, 3, 5), (4, 2)),
    ((2, 3, 1, 5), (1, 7)),   # one output column
])
def test_pointwise_stride_past_the_input(xs, strides, paths, rng):
    """A 1x1 Conv whose stride exceeds the input along an axis: one output there (the
    first row or column), the stride moot (conv_function makes it 1), the other rows
    not read -- on the host path and the reference path."""
    from gpukernels.kernels.base import KernelContext
    from gpukernels.kernels.nn.conv import Conv

    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal((4, xs[1], 1, 1)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    got = np.asarray(Conv(KernelContext(options={"paths": paths}))(x, w, b, strides=list(strides)).array)
    np.testing.assert_allclose(got, ref_conv(x, w, b, strides, (0, 0, 0, 0), (1, 1)), rtol=1e-5, atol=1e-5)
