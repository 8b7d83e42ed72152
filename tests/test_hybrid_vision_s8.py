"""LayerNormalization and Transpose as the hybrid conv/transformer vision exports run them
(SegFormer, MobileViT, ConvNeXt: many short rows, channels-last tokens, small 3-D/4-D
transposes), through a Session's compiled path (the kernels' array functions) and
directly, on each device: against float64 references, and to the bit against the
uncompiled kernel and the reference path."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from gpukernels.kernels import specialize
from gpukernels.kernels.base import KernelContext
from gpukernels.kernels.nn.norm import LayerNormalization, RMSNormalization
from gpukernels.runtime import Session
from tests.reference.norm import layer_norm

# (shape of X, normalised from axis): the exports' LayerNormalization inputs at 96x96
_LN_SHAPES = [((2, 256, 16), -1), ((2, 16, 16, 32), -1), ((2, 64, 32), -1), ((8, 4, 80), -1), ((8, 1, 96), -1),
              ((2, 256), -1), ((2, 4, 4, 128), -1), ((3, 5, 7), 1), ((1, 1), -1), ((300, 2), -1)]


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint32)


def _f32(rng, *shape, scale=1.0, shift=0.0):
    return (rng.standard_normal(shape) * scale + shift).astype(np.float32)


def _norm_model(op, shape, axis, params, inputs=("X",), outputs=("Y",), opset=23):
    """One normalisation node; params {name: array} become initializers unless named in
    inputs (then graph inputs)."""
    names = ["X"] + list(params)
    node = helper.make_node(op, names, list(outputs), axis=axis, epsilon=1e-5)
    graph_inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(shape if n == "X" else params[n].shape))
                    for n in inputs]
    stat = [d if i < axis % len(shape) else 1 for i, d in enumerate(shape)]
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, list(shape) if o == "Y" else stat) for o in outputs]
    inits = [numpy_helper.from_array(a, n) for n, a in params.items() if n not in inputs]
    graph = helper.make_graph([node], "g", graph_inputs, outs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]).SerializeToString()


def _run_compiled(model, feeds, device, runs=3, **options):
    """The outputs of several runs of one Session (the first records, the later ones run
    the compiled program)."""
    sess = Session(model, device=device, options=options or None)
    return [[np.asarray(o) for o in sess.run(None, feeds)] for _ in range(runs)]


@pytest.mark.parametrize("shape,axis", _LN_SHAPES, ids=[f"{'x'.join(map(str, s))}-ax{a}" for s, a in _LN_SHAPES])
@pytest.mark.parametrize("with_bias", [True, False])
def test_layer_norm_compiled_matches_float64_and_kernel(device, rng, shape, axis, with_bias):
    """The compiled path (array function, parameter tiles for short rows) gives the
    kernel's own bits on every run and stays within the kernel tests' tolerance of the
    float64 result; the reference path gives the same bits too."""
    x = _f32(rng, *shape, scale=2.0, shift=3.0)
    norm_shape = shape[axis % len(shape):]
    s = _f32(rng, *norm_shape)
    params = {"S": s}
    if with_bias:
        params["B"] = _f32(rng, *norm_shape)
    model = _norm_model("LayerNormalization", shape, axis, params)
    runs = _run_compiled(model, {"X": x}, device)
    direct = LayerNormalization(KernelContext(device, opset=23))(x, *params.values(), axis=axis).Y.numpy()
    reference = LayerNormalization(KernelContext(device, opset=23, options={"paths": "reference"}))(
        x, *params.values(), axis=axis).Y.numpy()
    want, _, _ = layer_norm(x, axis, 1e-5, s, params.get("B"))
    for (y,) in runs:
        assert y.shape == shape and y.dtype == np.float32
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)
        assert np.array_equal(_bits(y), _bits(direct))
    assert np.array_equal(_bits(direct), _bits(reference))


@pytest.mark.parametrize("shape", [(2, 256, 16), (8, 4, 80), (5, 3)])
def test_rms_norm_compiled_matches_float64(device, rng, shape):
    x = _f32(rng, *shape, scale=2.0)
    s = _f32(rng, shape[-1])
    runs = _run_compiled(_norm_model("RMSNormalization", shape, -1, {"S": s}), {"X": x}, device)
    direct = RMSNormalization(KernelContext(device, opset=23))(x, s).numpy()
    xd = x.astype(np.float64)
    want = xd / np.sqrt(np.mean(xd * xd, axis=-1, keepdims=True) + 1e-5) * s
    for (y,) in runs:
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)
        assert np.array_equal(_bits(y), _bits(direct))


def test_layer_norm_parameters_fed_each_run_are_read_each_run(device, rng):
    """Scale and bias fed as graph inputs (writable, possibly the same array object with
    new values) are never taken from an earlier run."""
    shape = (2, 64, 32)
    x = _f32(rng, *shape)
    s, b = _f32(rng, 32), _f32(rng, 32)
    model = _norm_model("LayerNormalization", shape, -1, {"S": s, "B": b}, inputs=("X", "S", "B"))
    sess = Session(model, device=device)
    s_view, b_view = s[:], b[:]  # read-only views of writable arrays: not constants
    s_view.flags.writeable = b_view.flags.writeable = False
    for k in range(6):
        s[...] = _f32(rng, 32)  # the same arrays, new values
        b[...] = _f32(rng, 32)
        (y,) = sess.run(None, {"X": x, "S": s_view if k % 2 else s, "B": b_view if k % 2 else b})
        want, _, _ = layer_norm(x, -1, 1e-5, s, b)
        np.testing.assert_allclose(np.asarray(y), want, rtol=1e-4, atol=1e-5, err_msg=f"run {k}")


def test_layer_norm_rows_change_between_signatures(device, rng):
    """One Session, inputs with a dynamic row count: each row count gets its own
    parameters' row tiles (never another's)."""
    s, b = _f32(rng, 16), _f32(rng, 16)
    node = helper.make_node("LayerNormalization", ["X", "S", "B"], ["Y"], axis=-1)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["n", 16])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["n", 16])],
                              [numpy_helper.from_array(s, "S"), numpy_helper.from_array(b, "B")])
    sess = Session(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString(),
                   device=device)
    for rows in (512, 3, 512, 40, 3, 40):
        x = _f32(rng, rows, 16, scale=3.0)
        (y,) = sess.run(None, {"X": x})
        want, _, _ = layer_norm(x, -1, 1e-5, s, b)
        np.testing.assert_allclose(np.asarray(y), want, rtol=1e-4, atol=1e-5, err_msg=f"{rows} rows")


@pytest.mark.parametrize("small_blocks", [False, True])
def test_layer_norm_statistics_outputs(device, rng, tuning, small_blocks):
    """Mean and InvStdDev when the node asks for them, from one block or several (the
    host gathers each block's statistics)."""
    if small_blocks:
        tuning({"norm.host_row_block_bytes": 1024})
    shape = (2, 300, 24)
    x = _f32(rng, *shape, scale=2.0, shift=-1.0)
    s, b = _f32(rng, 24), _f32(rng, 24)
    model = _norm_model("LayerNormalization", shape, -1, {"S": s, "B": b}, outputs=("Y", "Mean", "InvStdDev"))
    y_want, mean_want, inv_want = layer_norm(x, -1, 1e-5, s, b)
    for y, mean, inv in _run_compiled(model, {"X": x}, device):
        np.testing.assert_allclose(y, y_want, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(mean, mean_want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(inv, inv_want, rtol=1e-5, atol=1e-6)


def test_layer_norm_host_blocks_take_row_tiles(rng, tuning):
    """The host row path over several blocks with scale and bias tiled over the rows
    (as the array function passes them) gives the bits of the flat ones."""
    from gpukernels.kernels.nn import norm

    tuning({"norm.host_row_block_bytes": 2048})
    x = _f32(rng, 200, 16, scale=2.0, shift=1.0)
    s, b = _f32(rng, 16), _f32(rng, 16)
    flat = norm._normalize_rows_host(x, 1e-5, s, b, True)
    tiled = norm._normalize_rows_host(x, 1e-5, np.tile(s, (200, 1)), np.tile(b, (200, 1)), True)
    for f, t in zip(flat, tiled):
        assert np.array_equal(_bits(f), _bits(t))


# ------------------------------------------------------------------------- Transpose

_TRANSPOSES = [((2, 32, 16, 16), (0, 2, 3, 1)), ((2, 16, 16, 32), (0, 3, 1, 2)), ((2, 64, 256), (0, 2, 1)),
               ((2, 4, 256, 16), (0, 2, 1, 3)), ((2, 1, 256, 16), (0, 2, 1, 3)), ((3, 5), (1, 0)),
               ((2, 1024, 1024), (0, 2, 1))]  # the last takes the tiled host copy


@pytest.mark.parametrize("shape,perm", _TRANSPOSES, ids=[f"{'x'.join(map(str, s))}-{''.join(map(str, p))}"
                                                         for s, p in _TRANSPOSES])
def test_transpose_compiled(device, rng, shape, perm):
    """The compiled Transpose gives numpy's transpose, a fresh C-contiguous array where
    the permutation moves data, on every run; the tiled host copy is still chosen for a
    large strided transpose."""
    x = _f32(rng, *shape)
    out_shape = [shape[p] for p in perm]
    node = helper.make_node("Transpose", ["X"], ["Y"], perm=list(perm))
    graph = helper.make_graph([node, helper.make_node("Identity", ["X"], ["Z"])], "g",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, out_shape),
                               helper.make_tensor_value_info("Z", TensorProto.FLOAT, list(shape))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    sess = Session(model, device=device)
    want = np.transpose(x, perm)
    for _ in range(3):
        with specialize.recording() as chosen:
            y, _ = sess.run(None, {"X": x})
        y = np.asarray(y)
        assert y.shape == want.shape and y.flags.c_contiguous and np.array_equal(y, want)
        tiled = any(c.site == "Transpose.copy" for c in chosen)
        assert tiled == (device == "cpu" and x.size >= 1 << 20)
