"""Activations fused into convolutions (pass ``conv_activation``; epilogues in
gpukernels/kernels/nn/epilogues.py).

Every comparison is bitwise (the float bits, -0 and NaN payloads included): the fused node
runs each activation kernel's own steps, so it must give the separate kernels' bits on
the same device, on cpu and on cuda (the CuPy simulation under GPUKERNELS_SIMULATE_CUDA=1),
through the general path and the compiled one.  Inputs hold NaN, infinities and -0.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as oh

from gpukernels.kernels import KernelContext
from gpukernels.kernels.base import lookup
from gpukernels.kernels.nn.epilogues import build_epilogue
from gpukernels.runtime import Session
from gpukernels.runtime.optimize import DEFAULT_PASSES
from gpukernels.tensor import Tensor
from tests.test_optimize import (
    REAL_EXPORTS,
    _feeds_from_spec,
    init,
    model_of,
    observe,
    ops,
    vi,
)

# NaN and infinities in the inputs make the convolutions' products warn (fused or not)
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning",
                                        "ignore:overflow encountered:RuntimeWarning")

FUSED = ["conv_activation"]

# (operator, opset, attributes, Clip bounds (min, max) as initializers: None = absent)
ACTIVATIONS = {
    "relu": ("Relu", 17, {}, None),
    "clip_relu6": ("Clip", 17, {}, (0.0, 6.0)),
    "clip_min_only": ("Clip", 17, {}, (-0.5, None)),
    "clip_max_only": ("Clip", 17, {}, (None, 0.25)),
    "clip_unbounded": ("Clip", 17, {}, (None, None)),
    "clip_min_above_max": ("Clip", 17, {}, (1.0, -1.0)),
    "clip_opset6": ("Clip", 6, {"min": -1.5}, None),
    "clip_opset6_both": ("Clip", 6, {"min": 0.0, "max": 6.0}, None),
    "leaky_relu": ("LeakyRelu", 17, {"alpha": 0.1}, None),
    "leaky_relu_default": ("LeakyRelu", 17, {}, None),
    "hard_sigmoid": ("HardSigmoid", 17, {"alpha": 0.25, "beta": 0.4}, None),
    "hard_swish": ("HardSwish", 17, {}, None),
    "sigmoid": ("Sigmoid", 17, {}, None),
    "swish": ("Swish", 24, {"alpha": 1.5}, None),
    "mish": ("Mish", 18, {}, None),
    "tanh": ("Tanh", 17, {}, None),
}

# (x shape, W shape, Conv attributes)
CONVS = {
    "2d": ((2, 3, 9, 10), (5, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
    "2d_stride2": ((1, 4, 11, 12), (6, 4, 3, 3), {"pads": [1, 0, 1, 1], "strides": [2, 2]}),
    "pointwise": ((2, 6, 7, 7), (8, 6, 1, 1), {}),
    "depthwise": ((1, 6, 10, 9), (6, 1, 3, 3), {"group": 6, "pads": [1, 1, 1, 1]}),
    "depthwise_stride2": ((2, 4, 9, 9), (8, 1, 3, 3), {"group": 4, "strides": [2, 2]}),
    "1d": ((2, 3, 17), (4, 3, 5), {"pads": [2, 2]}),
    "3d": ((1, 2, 5, 6, 7), (3, 2, 3, 3, 3), {"pads": [1, 1, 1, 1, 1, 1]}),
    # more elements than one host block (logistic.block_elems): the blocked epilogues
    "2d_large": ((1, 8, 96, 96), (16, 8, 3, 3), {"pads": [1, 1, 1, 1]}),
    # depthwise channel blocks of two images, over the host threads
    "depthwise_large": ((2, 32, 48, 48), (32, 1, 3, 3), {"group": 32, "pads": [1, 1, 1, 1]}),
}


def _specials(x):
    """x with NaN (both signs), infinities, zeros of both signs and huge values among its
    values (-0 reaching an activation is checked by test_epilogue_matches_its_kernel)."""
    flat = x.reshape(-1)
    flat[:6] = [np.nan, np.inf, -np.inf, -0.0, 0.0, -np.nan]
    flat[-3:] = [1e30, -1e30, 3.0]
    return x


def _conv_act_model(act_case, conv_case, bias=True, dtype=TP.FLOAT, rng=None, outputs_extra=(), bounds_as_inputs=False):
    op, opset, attrs, bounds = ACTIVATIONS[act_case]
    xshape, wshape, cattrs = CONVS[conv_case]
    np_dtype = np.float16 if dtype == TP.FLOAT16 else np.float32
    inits = [init("W", (rng.standard_normal(wshape) * 0.5).astype(np_dtype))]
    conv_in = ["x", "W"]
    if bias:
        inits.append(init("B", rng.standard_normal(wshape[0]).astype(np_dtype)))
        conv_in.append("B")
    act_in = ["c"]
    inputs = [vi("x", dtype, list(xshape))]
    if bounds is not None:
        for name, v in zip(("lo", "hi"), bounds):
            if v is None:
                act_in.append("")
            elif bounds_as_inputs:
                inputs.append(vi(name, dtype, []))
                act_in.append(name)
            else:
                inits.append(init(name, np.array(v, np_dtype)))
                act_in.append(name)
        while act_in and act_in[-1] == "":
            act_in.pop()
    nodes = [oh.make_node("Conv", conv_in, ["c"], **cattrs), oh.make_node(op, act_in, ["y"], **attrs)]
    outputs = [vi("y", dtype, None)] + [vi(n, dtype, None) for n in outputs_extra]
    return model_of(nodes, inputs, outputs, inits, opset=opset)


def _bits(a):
    a = np.ascontiguousarray(a)
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def _assert_bits(got, want, name=""):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (name, got.shape, want.shape, got.dtype, want.dtype)
    bad = _bits(got) != _bits(want)
    assert not bad.any(), f"{name}: {int(bad.sum())} elements differ, first at {np.argwhere(bad)[0]}: " \
                          f"{got[tuple(np.argwhere(bad)[0])]!r} vs {want[tuple(np.argwhere(bad)[0])]!r}"


def compare_bits(m, feeds, optimize, reference=(), device="cpu", runs=3, base_dir=None):
    """Session with optimize vs with reference (pass lists): outputs of `runs` runs
    (general, then compiled) and every value both observers see, bitwise.  Returns the
    optimised session."""
    opt = Session(m, device=device, options={"optimize": list(optimize)}, base_dir=base_dir)
    ref = Session(m, device=device, options={"optimize": list(reference)}, base_dir=base_dir)
    want = ref.run(None, feeds)
    for _ in range(runs):
        for g, w in zip(opt.run(None, feeds), want):
            _assert_bits(g, w, "output")
    outs, seen = observe(opt, feeds)
    _, seen_ref = observe(ref, feeds)
    assert set(seen) <= set(seen_ref), sorted(set(seen) - set(seen_ref))
    for name, v in seen.items():
        _assert_bits(v, seen_ref[name], name)
    for g, w in zip(outs, want):
        _assert_bits(g, w, "observed output")
    return opt


# ------------------------------------------------------------------ fused == separate


@pytest.fixture
def fused_calls(monkeypatch):
    """How many times the compiled convolutions with an epilogue ran."""
    from gpukernels.kernels.nn.conv import Conv

    calls = []
    made = Conv.array_function

    def counting(self, inputs, attrs, epilogue=None):
        fn = made(self, inputs, attrs, epilogue=epilogue)
        if fn is None or epilogue is None:
            return fn

        def counted(*arrays):
            calls.append(1)
            return fn(*arrays)

        return counted

    monkeypatch.setattr(Conv, "array_function", counting)
    return calls


_NO_BIAS = ("pointwise", "3d")


@pytest.mark.parametrize("act", list(ACTIVATIONS))
@pytest.mark.parametrize("conv, values", [(c, v) for c in CONVS for v in ("finite", "special_bias", "special_input")
                                          if not (v == "special_bias" and c in _NO_BIAS)])
def test_activation_after_conv_is_bit_identical(rng, device, act, conv, values, fused_calls):
    """finite: compiled runs call the convolution with its epilogue; special_bias: NaN,
    infinities and -0 reach the activation through the bias; special_input: through the
    input (IEEE events of the products send compiled runs back to the kernels, which
    apply the epilogue themselves)."""
    bias = conv not in _NO_BIAS
    m = _conv_act_model(act, conv, bias=bias, rng=rng)
    x = (rng.standard_normal(CONVS[conv][0]) * 3).astype(np.float32)
    if values == "special_input":
        x = _specials(x)
    elif values == "special_bias":
        b = onnx.numpy_helper.to_array(m.graph.initializer[1]).copy()
        b[:4] = [np.nan, np.inf, -np.inf, -0.0]
        m.graph.initializer[1].CopyFrom(init("B", b))
    sess = compare_bits(m, {"x": x}, FUSED, device=device)
    assert ops(sess) == ["InPlaceChain"] and sess.graph.optimized == {"conv_activation": 1}
    if device == "cpu" and values == "finite":
        assert len(fused_calls) >= 3  # compiled runs: the convolution with its epilogue


@pytest.mark.parametrize("act", ["relu", "clip_relu6", "sigmoid", "hard_swish"])
def test_float64_and_no_bias(rng, device, act):
    op, opset, attrs, bounds = ACTIVATIONS[act]
    inits = [init("W", rng.standard_normal((4, 3, 3, 3)))]
    act_in = ["c"]
    if bounds:
        inits += [init("lo", np.array(bounds[0])), init("hi", np.array(bounds[1]))]
        act_in += ["lo", "hi"]
    nodes = [oh.make_node("Conv", ["x", "W"], ["c"], strides=[2, 2]), oh.make_node(op, act_in, ["y"], **attrs)]
    m = model_of(nodes, [vi("x", TP.DOUBLE, [2, 3, 200, 90])], [vi("y", TP.DOUBLE, None)], inits, opset=opset)
    x = _specials(rng.standard_normal((2, 3, 200, 90)) * 3)
    sess = compare_bits(m, {"x": x}, FUSED, device=device)
    assert ops(sess) == ["InPlaceChain"]


def test_swish_from_the_silu_pass(rng, device):
    """Conv -> x * Sigmoid(x) (as exporters spell SiLU): the silu pass makes a Swish,
    which becomes the convolution's epilogue."""
    inits = [init("W", rng.standard_normal((6, 3, 3, 3)).astype(np.float32)),
             init("B", rng.standard_normal(6).astype(np.float32))]
    nodes = [oh.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1]),
             oh.make_node("Sigmoid", ["c"], ["s"]), oh.make_node("Mul", ["c", "s"], ["y"])]
    m = model_of(nodes, [vi("x", TP.FLOAT, [1, 3, 120, 110])], [vi("y", TP.FLOAT, None)], inits)
    x = _specials(rng.standard_normal((1, 3, 120, 110)).astype(np.float32))
    sess = compare_bits(m, {"x": x}, ["silu", "conv_activation"], ["silu"], device=device)
    assert ops(sess) == ["InPlaceChain"] and sess.graph.optimized == {"silu": 1, "conv_activation": 1}


def test_with_inplace_steps_before_the_activation(rng, device):
    """With 'inplace' too: bias steps, then the activation, on every producer."""
    inits = [init("W", rng.standard_normal((5, 3, 3, 3)).astype(np.float32)),
             init("b", rng.standard_normal((5, 1, 1)).astype(np.float32)),
             init("M", rng.standard_normal((8, 6)).astype(np.float32)),
             init("s", np.float32(0.5)), init("lo", np.float32(-1)), init("hi", np.float32(2))]
    nodes = [oh.make_node("Conv", ["img", "W"], ["c"]), oh.make_node("Add", ["c", "b"], ["cb"]),
             oh.make_node("HardSwish", ["cb"], ["z"]),
             oh.make_node("MatMul", ["x", "M"], ["h"]), oh.make_node("Mul", ["h", "s"], ["hs"]),
             oh.make_node("Clip", ["hs", "lo", "hi"], ["y"])]
    m = model_of(nodes, [vi("img", TP.FLOAT, [1, 3, 8, 8]), vi("x", TP.FLOAT, [4, 8])],
                 [vi("z", TP.FLOAT, None), vi("y", TP.FLOAT, None)], inits)
    feeds = {"img": _specials(rng.standard_normal((1, 3, 8, 8)).astype(np.float32)),
             "x": _specials(rng.standard_normal((4, 8)).astype(np.float32) * 4)}
    sess = compare_bits(m, feeds, ["inplace", "conv_activation"], device=device)
    assert ops(sess) == ["InPlaceChain"] * 2 and sess.graph.optimized == {"inplace": 2}
    # without 'inplace' a MatMul keeps its activation, a Conv with a step between too
    sess = compare_bits(m, feeds, FUSED, device=device)
    assert "InPlaceChain" not in ops(sess)


# ------------------------------------------------------------------ conditions


@pytest.mark.parametrize("case", ["conv_output_read_twice", "conv_output_is_output", "bounds_are_inputs",
                                  "float16", "gelu", "overridden_activation"])
def test_conditions(rng, case):
    act, opts, outputs_extra, dtype, bounds_in = "clip_relu6", {}, (), TP.FLOAT, False
    if case == "conv_output_is_output":
        outputs_extra = ("c",)
    elif case == "bounds_are_inputs":
        bounds_in = True
    elif case == "float16":  # half types are rounded per node: not fused, the kernels' bits
        dtype, act = TP.FLOAT16, "sigmoid"
    elif case == "overridden_activation":
        from gpukernels.kernels.math.clip_pow import Clip

        class MyClip(Clip):
            pass

        opts = {"kernel_overrides": {"Clip": MyClip}}
    m = _conv_act_model(act, "2d", dtype=dtype, rng=rng, outputs_extra=outputs_extra, bounds_as_inputs=bounds_in)
    if case == "conv_output_read_twice":
        m.graph.node.append(oh.make_node("Neg", ["c"], ["n"], name="neg"))
        m.graph.output.append(vi("n", TP.FLOAT, None))
    if case == "gelu":
        m.graph.node[1].CopyFrom(oh.make_node("Gelu", ["c"], ["y"], name="gelu"))
        m.opset_import[0].version = 20
    np_dtype = np.float16 if dtype == TP.FLOAT16 else np.float32
    feeds = {"x": _specials(rng.standard_normal(CONVS["2d"][0]).astype(np_dtype))}
    if bounds_in:
        feeds.update(lo=np.array(0, np_dtype), hi=np.array(6, np_dtype))
    opt = Session(m, options={"optimize": FUSED, **opts})
    assert "InPlaceChain" not in ops(opt)
    ref = Session(m, options={"optimize": False, **opts})
    for _ in range(2):
        for g, w in zip(opt.run(None, feeds), ref.run(None, feeds)):
            _assert_bits(g, w)


def test_result_of_another_type_goes_through_the_kernels(rng):
    """A Conv returning another type than the one checked when preparing (here an
    override computing in float64) runs the activation through its kernel."""
    from gpukernels.kernels.nn.conv import Conv

    class Float64Conv(Conv):
        def __call__(self, X, W, B=None, **attrs):
            t = super().__call__(X, W, B, **attrs)
            return Tensor(t.numpy().astype(np.float64))

        def array_function(self, inputs, attrs):
            return None

    m = _conv_act_model("hard_swish", "2d", rng=rng)
    x = _specials(rng.standard_normal(CONVS["2d"][0]).astype(np.float32) * 4)
    opts = {"kernel_overrides": {"Conv": Float64Conv}}
    opt = Session(m, options={"optimize": FUSED, **opts})
    ref = Session(m, options={"optimize": False, **opts})
    assert ops(opt) == ["InPlaceChain"]
    for _ in range(3):
        got, want = opt.run(None, {"x": x})[0], ref.run(None, {"x": x})[0]
        assert got.dtype == np.float64
        _assert_bits(got, want)


def test_inputs_are_never_written(rng):
    m = _conv_act_model("swish", "pointwise", bias=False, rng=rng)
    x = rng.standard_normal(CONVS["pointwise"][0]).astype(np.float32)
    kept = x.copy()
    sess = Session(m, options={"optimize": FUSED})
    for _ in range(3):
        sess.run(None, {"x": x})
    _assert_bits(x, kept)


# ------------------------------------------------------------------ the epilogues themselves


@pytest.mark.parametrize("act", list(ACTIVATIONS))
@pytest.mark.parametrize("layout", ["into_itself", "into_another", "strided", "small", "on_a_host_thread",
                                    "cropped_transposed_source", "into_a_channel_block"])
def test_epilogue_matches_its_kernel(rng, act, layout):
    """build_epilogue's callable against the activation kernel's own call, on host arrays
    of every layout the Conv paths may hand it."""
    from gpukernels.host import parallel_ranges

    op, opset, attrs, bounds = ACTIVATIONS[act]
    cls, version = lookup(op, "", opset)
    kernel = cls(KernelContext(), version)
    extra = ()
    if bounds is not None:
        extra = tuple(None if v is None else Tensor(np.array(v, np.float32)) for v in bounds)
    ep = build_epilogue(kernel, attrs, np.float32, extra if bounds is not None else None)
    assert ep is not None
    shape = (3, 5, 7) if layout == "small" else (2, 9, 101, 97)
    x = _specials((rng.standard_normal(shape) * 4).astype(np.float32))
    want = kernel(Tensor(x), *extra, **attrs).numpy()
    if layout == "strided":  # every other column of a wider array
        wide = np.zeros(shape[:-1] + (2 * shape[-1],), np.float32)
        wide[..., ::2] = x
        src = wide[..., ::2]
        ep(src, src)
        _assert_bits(src, want)
        assert not wide[..., 1::2].any()
        return
    if layout in ("cropped_transposed_source", "into_a_channel_block"):
        # as the host Conv paths hand over their products: (M, N, H, W + 3) cropped and
        # transposed, into Y or into a block of Y's channels
        buf = np.full((shape[1], shape[0], shape[2], shape[3] + 3), np.nan, np.float32)
        src = buf[..., :shape[3]].transpose(1, 0, 2, 3)
        src[...] = x
        kept = buf.copy()
        big = np.full((shape[0], shape[1] + 4) + shape[2:], 7.0, np.float32)
        out = big[:, 2:-2] if layout == "into_a_channel_block" else np.empty(shape, np.float32)
        ep(src, out)
        _assert_bits(out, want)
        _assert_bits(buf, kept)
        assert (big[:, :2] == 7).all() and (big[:, -2:] == 7).all()
        return
    y = x.copy()
    if layout == "into_another":
        out = np.full_like(x, np.nan)
        ep(y, out)
        _assert_bits(y, x)
        _assert_bits(out, want)
        return
    if layout == "on_a_host_thread":  # the host threads never wait on each other
        parallel_ranges(2, 1, lambda lo, hi: ep(y[lo:hi], y[lo:hi]))
    else:
        ep(y, y)
    _assert_bits(y, want)


# ------------------------------------------------------------------ GPU: no transfers


@pytest.mark.parametrize("compile_graph", [True, False])
def test_fused_model_on_the_gpu_makes_no_transfer(compile_graph, count_transfers, rng):
    m = _conv_act_model("clip_relu6", "2d", rng=rng)
    x = rng.standard_normal(CONVS["2d"][0]).astype(np.float32)
    want = Session(m, device="cuda", options={"optimize": False}).run(None, {"x": x})[0]
    sess = Session(m, device="cuda", options={"optimize": FUSED, "compile_graph": compile_graph})
    assert ops(sess) == ["InPlaceChain"]
    sess.run_values({"x": x})
    with count_transfers() as log:
        (y,) = sess.run_values({"x": x})
    assert log.count == 0, log.report()
    _assert_bits(y.numpy(), want)


# ------------------------------------------------------------------ real exports


@pytest.mark.parametrize("name", ["cnn_bn_ts17", "unet_dy20_dynamic"])
def test_real_exports_node_by_node(name, rng):
    """The default passes with and without conv_activation, bitwise: outputs and every
    value both runs keep; a dynamic export also at its other sizes."""
    path = REAL_EXPORTS / f"{name}.onnx"
    m = onnx.load(str(path))
    spec = json.loads(path.with_suffix(".json").read_text())
    without = [p for p in DEFAULT_PASSES if p != "conv_activation"]
    fired = 0
    for dynamic in (False, True):
        if dynamic and not any(i.get("dynamic_sizes") for i in spec["inputs"]):
            continue
        feeds = _feeds_from_spec(spec, rng, dynamic=dynamic)
        sess = compare_bits(m, feeds, without + ["conv_activation"], without, runs=2, base_dir=str(path.parent))
        fired += sess.graph.optimized.get("conv_activation", 0)
    assert fired
