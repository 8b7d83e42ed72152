"""The ``dequantized`` pass (gpukernels/runtime/optimize/dequantized.py): products of
DequantizeLinear outputs computed with exact integer sums.

Every case builds a QDQ-style graph, runs it with the pass (the default) and without
(``optimize=False``), and checks:
* the pass fused what it should (``plan.optimized``) and nothing else;
* the fused value against an exact reference: the integer sums in int64, then the
  scaling in float64 (``acc * (sx * sw) + b``): within the epilogue's float32 roundings,
  never worse than the unfused float32 evaluation allows;
* on cuda (real or simulated), the bits equal the cpu's, and so do the integers of a
  QuantizeLinear after the product.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper as oh
from onnx import numpy_helper as nh

from gpukernels.runtime import Session
from tests.reference.conv import conv as conv_reference

EPS32 = 2.0 ** -24


def _model(nodes, inputs, outputs, inits, opset=19):
    g = oh.make_graph(nodes, "qdq", inputs, outputs, [nh.from_array(v, k) for k, v in inits.items()])
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", opset)])


def _weights(rng, shape, axis, wtype=np.int8):
    """Per-axis symmetric int8 weights: (wq, scale, zero point)."""
    info = np.iinfo(wtype)
    wq = rng.integers(info.min + 1, info.max + 1, size=shape).astype(wtype)
    sw = (rng.random(shape[axis]) * 0.02 + 0.002).astype(np.float32)
    return wq, sw, np.zeros(shape[axis], wtype)


def _activation(rng, shape, xtype=np.uint8, zero=117, scale=0.031):
    info = np.iinfo(xtype)
    xq = rng.integers(info.min, int(info.max) + 1, size=shape).astype(xtype)
    return xq, np.array(scale, np.float32), np.array(zero, xtype)


def _run(model, feeds, device="cpu", **options):
    sess = Session(model, device=device, options=options or None)
    return sess, sess.run(None, feeds)


def _check_exact(y, acc, s, b=None):
    """y against acc * s (+ b) in float64: the epilogue rounds acc * s once to float32 via
    a float32 scale (1.5 ulp) and adds b in float32 (1 ulp of the sum's parts)."""
    prod = acc.astype(np.float64) * s
    ref = prod + (0 if b is None else b)
    bound = 3 * EPS32 * (np.abs(prod) + (0 if b is None else np.abs(b))) + 1e-30
    err = np.abs(y.astype(np.float64) - ref)
    assert np.all(err <= bound), f"max error {err.max():g} over bound {(err / bound).max():g}x"


def _conv_case(rng, group=1, xtype=np.uint8, zero=117, bias=True, shape=(2, 4, 9, 9), m=8, k=3):
    n, c = shape[:2]
    xq, sx, zx = _activation(rng, shape, xtype, zero)
    wq, sw, zw = _weights(rng, (m, c // group, k, k), 0)
    inits = dict(sx=sx, zx=zx, wq=wq, sw=sw, zw=zw)
    nodes = [oh.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["x"]),
             oh.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["w"], axis=0)]
    conv_inputs = ["x", "w"]
    bq = sb = None
    if bias:
        bq = rng.integers(-5000, 5000, size=m).astype(np.int32)
        sb = (np.float32(sx) * sw).astype(np.float32)
        inits.update(bq=bq, sb=sb, zb=np.zeros(m, np.int32))
        nodes.append(oh.make_node("DequantizeLinear", ["bq", "sb", "zb"], ["b"], axis=0))
        conv_inputs.append("b")
    nodes.append(oh.make_node("Conv", conv_inputs, ["y"], pads=[1, 1, 1, 1], group=group))
    model = _model(nodes, [oh.make_tensor_value_info("xq", TP.UINT8 if xtype == np.uint8 else
                                                     oh.np_dtype_to_tensor_dtype(np.dtype(xtype)), shape)],
                   [oh.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    xi = xq.astype(np.int64) - int(zx)
    wi = wq.astype(np.int64)
    acc = conv_reference(xi, wi, pads=[1, 1, 1, 1], group=group)
    s = (np.float64(sx) * sw.astype(np.float64))[None, :, None, None]
    b = None if not bias else (bq.astype(np.float64) * sb.astype(np.float64)).astype(np.float32) \
        .astype(np.float64)[None, :, None, None]
    return model, {"xq": xq}, acc, s, b


@pytest.mark.parametrize("group", [1, 2, 4])
@pytest.mark.parametrize("bias", [True, False])
def test_conv_fused_and_exact(device, rng, group, bias):
    model, feeds, acc, s, b = _conv_case(rng, group=group, bias=bias)
    sess, (y,) = _run(model, feeds, device)
    assert sess.graph.optimized.get("dequantized") == 1
    assert [p.op_type for p in sess.graph.nodes] == ["DequantizedConv"]
    _check_exact(y, acc, s, b)
    _, (y0,) = _run(model, feeds, device, optimize=False)
    np.testing.assert_allclose(y, y0, rtol=1e-5, atol=1e-5 * np.abs(y0).max())
    if device != "cpu":
        _, (yc,) = _run(model, feeds, "cpu")
        assert np.array_equal(y.view(np.uint32), yc.view(np.uint32))


def test_wide_sums_run_in_float64(device, rng):
    """int16 activations over 64 channels: partial sums can pass 2**24, so float32 sums
    would round; the pass sums in float64 (exact) and the value is still the exact one."""
    model, feeds, acc, s, b = _conv_case(rng, xtype=np.int16, zero=0, shape=(1, 64, 6, 6), m=4)
    sess, (y,) = _run(model, feeds, device)
    (p,) = sess.graph.nodes
    assert p.kernel.acc == np.float64
    _check_exact(y, acc, s, b)


def test_quantize_after_is_bit_identical_across_devices(device, rng):
    model, feeds, acc, s, b = _conv_case(rng)
    g = model.graph
    g.node.append(oh.make_node("QuantizeLinear", ["y", "sy", "zy"], ["yq"]))
    g.initializer.extend([nh.from_array(np.array(0.05, np.float32), "sy"), nh.from_array(np.array(3, np.uint8), "zy")])
    del g.output[:]
    g.output.append(oh.make_tensor_value_info("yq", TP.UINT8, None))
    _, (yq,) = _run(model, feeds, device)
    ref = np.clip(np.rint((acc * s + b) / np.float64(np.float32(0.05))) + 3, 0, 255)
    # the float32 value may sit on the other side of a rounding boundary than the exact one
    assert np.abs(yq.astype(np.int64) - ref).max() <= 1
    _, (yc,) = _run(model, feeds, "cpu")
    assert np.array_equal(yq, yc)


def _gemm_case(rng, trans_b, alpha=1.0, beta=1.0, c_shape=(5,)):
    m, k, n = 3, 40, 5
    xq, sx, zx = _activation(rng, (m, k))
    wq, sw, zw = _weights(rng, (n, k) if trans_b else (k, n), 0 if trans_b else 1)
    c = rng.standard_normal(c_shape).astype(np.float32)
    inits = dict(sx=sx, zx=zx, wq=wq, sw=sw, zw=zw, c=c)
    nodes = [oh.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["x"]),
             oh.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["w"], axis=0 if trans_b else 1),
             oh.make_node("Gemm", ["x", "w", "c"], ["y"], transB=trans_b, alpha=alpha, beta=beta)]
    model = _model(nodes, [oh.make_tensor_value_info("xq", TP.UINT8, (m, k))],
                   [oh.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    wi = wq.astype(np.int64)
    acc = (xq.astype(np.int64) - int(zx)) @ (wi.T if trans_b else wi)
    s = alpha * np.float64(sx) * sw.astype(np.float64)
    return model, {"xq": xq}, acc, s, beta * c.astype(np.float64)


@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("alpha,beta,c_shape", [(1.0, 1.0, (5,)), (0.5, 2.0, (3, 5)), (1.5, 0.25, (1, 1))])
def test_gemm_fused_and_exact(device, rng, trans_b, alpha, beta, c_shape):
    model, feeds, acc, s, b = _gemm_case(rng, trans_b, alpha, beta, c_shape)
    sess, (y,) = _run(model, feeds, device)
    assert [p.op_type for p in sess.graph.nodes] == ["DequantizedGemm"]
    _check_exact(y, acc, s, b)
    _, (yc,) = _run(model, feeds, "cpu")
    assert np.array_equal(y.view(np.uint32), yc.view(np.uint32))


def test_matmul_with_constant_weights(device, rng):
    xq, sx, zx = _activation(rng, (2, 7, 24))
    wq, sw, zw = _weights(rng, (24, 6), 1)
    aq, sa, za = _activation(rng, (2, 6, 5), np.int8, zero=-3, scale=0.07)
    inits = dict(sx=sx, zx=zx, wq=wq, sw=sw, zw=zw, sa=sa, za=za)
    nodes = [oh.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["x"]),
             oh.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["w"], axis=1),
             oh.make_node("MatMul", ["x", "w"], ["h"]),
             oh.make_node("DequantizeLinear", ["aq", "sa", "za"], ["a"]),
             oh.make_node("MatMul", ["h", "a"], ["unfused"])]   # h is not dequantized: left alone
    model = _model(nodes, [oh.make_tensor_value_info("xq", TP.UINT8, (2, 7, 24)),
                           oh.make_tensor_value_info("aq", TP.INT8, (2, 6, 5))],
                   [oh.make_tensor_value_info(n, TP.FLOAT, None) for n in ("h", "unfused")], inits)
    feeds = {"xq": xq, "aq": aq}
    sess, (h, unfused) = _run(model, feeds, device)
    assert sorted(p.op_type for p in sess.graph.nodes) == ["DequantizeLinear", "DequantizedMatMul", "MatMul"]
    xi = xq.astype(np.int64) - int(zx)
    _check_exact(h, xi @ wq.astype(np.int64), np.float64(sx) * sw.astype(np.float64))
    _, outs = _run(model, feeds, "cpu")
    for got, want in zip((h, unfused), outs):
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_matmul_of_two_dequantized_values(device, rng):
    xq, sx, zx = _activation(rng, (2, 7, 24))
    aq, sa, za = _activation(rng, (2, 24, 5), np.int8, zero=-3, scale=0.07)
    nodes = [oh.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["x"]),
             oh.make_node("DequantizeLinear", ["aq", "sa", "za"], ["a"]),
             oh.make_node("MatMul", ["x", "a"], ["y"])]
    model = _model(nodes, [oh.make_tensor_value_info("xq", TP.UINT8, (2, 7, 24)),
                           oh.make_tensor_value_info("aq", TP.INT8, (2, 24, 5))],
                   [oh.make_tensor_value_info("y", TP.FLOAT, None)], dict(sx=sx, zx=zx, sa=sa, za=za))
    feeds = {"xq": xq, "aq": aq}
    sess, (y,) = _run(model, feeds, device)
    assert [p.op_type for p in sess.graph.nodes] == ["DequantizedMatMul"]
    acc = (xq.astype(np.int64) - int(zx)) @ (aq.astype(np.int64) - int(za))
    prod = acc * (np.float64(sx) * np.float64(sa))
    # one rounding of the float32 product by the float32 scale sx * sa: 1.5 ulp
    assert np.all(np.abs(y - prod) <= 3 * EPS32 * np.abs(prod) + 1e-30)
    _, (yc,) = _run(model, feeds, "cpu")
    assert np.array_equal(y.view(np.uint32), yc.view(np.uint32))


def _conv_transpose_reference(x, w, group):
    """ConvTranspose, stride 1, no padding, exact int64: y[n, g*Mg + j, i + a, k + b] +=
    x[n, c, i, k] * w[c, j, a, b] for c in group g."""
    n, c, h, wd = x.shape
    mg, kh, kw = w.shape[1:]
    cg = c // group
    y = np.zeros((n, mg * group, h + kh - 1, wd + kw - 1), np.int64)
    for g in range(group):
        for a in range(kh):
            for b in range(kw):
                y[:, g * mg:(g + 1) * mg, a:a + h, b:b + wd] += np.einsum(
                    "nchw,cj->njhw", x[:, g * cg:(g + 1) * cg], w[g * cg:(g + 1) * cg, :, a, b])
    return y


@pytest.mark.parametrize("group", [1, 2])
def test_conv_transpose_fused_and_exact(device, rng, group):
    xq, sx, zx = _activation(rng, (2, 4, 5, 5))
    wq, sw, zw = _weights(rng, (4, 3, 2, 2), 1)
    bias = rng.standard_normal(3 * group).astype(np.float32)
    nodes = [oh.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["x"]),
             oh.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["w"], axis=1),
             oh.make_node("ConvTranspose", ["x", "w", "b"], ["y"], group=group)]
    model = _model(nodes, [oh.make_tensor_value_info("xq", TP.UINT8, (2, 4, 5, 5))],
                   [oh.make_tensor_value_info("y", TP.FLOAT, None)], dict(sx=sx, zx=zx, wq=wq, sw=sw, zw=zw, b=bias))
    sess, (y,) = _run(model, {"xq": xq}, device)
    assert [p.op_type for p in sess.graph.nodes] == ["DequantizedConvTranspose"]
    acc = _conv_transpose_reference(xq.astype(np.int64) - int(zx), wq.astype(np.int64), group)
    s = (np.float64(sx) * np.tile(sw.astype(np.float64), group))[None, :, None, None]
    _check_exact(y, acc, s, bias.astype(np.float64)[None, :, None, None])


def test_left_alone(rng):
    """Not fused: per-axis activation scales, weights that no DequantizeLinear computed,
    float16 scales, blocked weights."""
    xq, sx, zx = _activation(rng, (1, 4, 5, 5))
    wq, sw, zw = _weights(rng, (6, 4, 3, 3), 0)
    wf = rng.standard_normal((6, 4, 3, 3)).astype(np.float32)
    inits = dict(sxa=np.full(4, 0.03, np.float32), zxa=np.full(4, 100, np.uint8), sx=sx, zx=zx, wq=wq, sw=sw, zw=zw,
                 wf=wf, sx16=sx.astype(np.float16), sw16=sw.astype(np.float16))
    nodes = [oh.make_node("DequantizeLinear", ["xq", "sxa", "zxa"], ["xa"], axis=1),
             oh.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["w"], axis=0),
             oh.make_node("Conv", ["xa", "w"], ["y1"]),               # per-axis activations
             oh.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["x"]),
             oh.make_node("Conv", ["x", "wf"], ["y2"]),               # float weights
             oh.make_node("DequantizeLinear", ["xq", "sx16", "zx"], ["x16"]),
             oh.make_node("DequantizeLinear", ["wq", "sw16", "zw"], ["w16"], axis=0),
             oh.make_node("Conv", ["x16", "w16"], ["y3"])]            # float16
    model = _model(nodes, [oh.make_tensor_value_info("xq", TP.UINT8, (1, 4, 5, 5))],
                   [oh.make_tensor_value_info(n, TP.UNDEFINED, None) for n in ("y1", "y2", "y3")], inits)
    sess, outs = _run(model, {"xq": xq})
    assert "dequantized" not in sess.graph.optimized
    _, outs0 = _run(model, {"xq": xq}, optimize=False)
    for a, b in zip(outs, outs0):
        assert np.array_equal(a, b)


def test_unexpected_input_type_runs_the_original_kernels(rng):
    """A fused node given another integer type than the one checked (a subgraph's value,
    which nobody checks) runs the original kernels: their result, their error."""
    model, feeds, acc, s, b = _conv_case(rng)
    sess, _ = _run(model, feeds)
    (p,) = sess.graph.nodes
    from gpukernels.tensor import Tensor

    weight = sess.graph.constants[p.inputs[1]]
    with pytest.raises(Exception, match="^DequantizeLinear") as fused_error:
        p.kernel(Tensor(feeds["xq"].astype(np.int8)), weight)
    assert "int8 and uint8" in str(fused_error.value)  # the original DequantizeLinear's check


@pytest.mark.parametrize("case", ["conv", "depthwise", "wide", "gemm"])
def test_compiled_runs_equal_the_kernel(device, rng, monkeypatch, case):
    """Compiled graphs run DequantizedProduct.array_function (the product's own array
    function, planned once): a later run on new inputs gives the bits of a fresh
    session's first run (the kernel's path), and on the host no longer calls it."""
    from gpukernels.runtime.optimize.dequantized import DequantizedProduct

    if case == "gemm":
        model, feeds, *_ = _gemm_case(rng, 1, 0.5, 2.0, (3, 5))
    elif case == "wide":
        model, feeds, *_ = _conv_case(rng, xtype=np.int16, zero=5, shape=(1, 64, 6, 6), m=4)
    else:
        model, feeds, *_ = _conv_case(rng, group=4 if case == "depthwise" else 1, shape=(2, 4, 9, 9),
                                      m=4 if case == "depthwise" else 8)
    x = feeds["xq"]
    info = np.iinfo(x.dtype)
    again = {"xq": rng.integers(info.min, int(info.max) + 1, size=x.shape).astype(x.dtype)}
    sess, _ = _run(model, feeds, device)
    sess.run(None, feeds)
    calls = []
    exact = DequantizedProduct._exact
    monkeypatch.setattr(DequantizedProduct, "_exact", lambda self, *a: calls.append(1) or exact(self, *a))
    (y,) = sess.run(None, again)
    monkeypatch.undo()
    _, (want,) = _run(model, again, device)
    assert y.dtype == want.dtype == np.float32 and y.shape == want.shape
    assert np.array_equal(y.view(np.uint32), want.view(np.uint32))
    if device == "cpu":
        assert not calls, "the compiled graph ran the kernel instead of its array function"
