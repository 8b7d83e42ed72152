"""Graph optimisations when a graph is prepared (gpukernels.runtime.optimize, option
``optimize``).

Every test runs a model twice -- optimised and with optimize=False -- and compares the
graph outputs and, node by node, every intermediate value that survives the rewrite
(an observer sees each node's outputs; fused nodes write the names of the values they
replace).  Tolerances, stated per test: exact for shape folding (the same kernels
compute the same values), a few float32 ulps for the fused kernels (they round once
where the spelled-out forms round after every node), the type's rounding for half types.

The patterns are built as torch's two exporters spell them (TorchScript:
torch.onnx.export(dynamo=False); dynamo: torch.onnx.export(dynamo=True) through
onnxscript's torchlib), with onnx.helper.  Real exports in tests/data/real_exports are
compared too when present.
"""

from __future__ import annotations

import json
import math
import pathlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as oh
from onnx import numpy_helper

from gpukernels.errors import OptionError
from gpukernels.runtime import PreparedGraph, Session, run_graph
from gpukernels.runtime.optimize import PASSES, Specializer
from gpukernels.kernels import KernelContext
from gpukernels.tensor import Tensor

REAL_EXPORTS = pathlib.Path(__file__).resolve().parent / "data" / "real_exports"


# ------------------------------------------------------------------ helpers


def vi(name, et, shape=None):
    return oh.make_tensor_value_info(name, et, shape)


def const(name, value, dtype=np.float32):
    """A Constant node as TorchScript writes scalars (0-d tensors)."""
    return oh.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value, dtype), name + "_v"))


def init(name, value):
    return numpy_helper.from_array(np.asarray(value), name)


def model_of(nodes, inputs, outputs, inits=(), opset=17):
    graph = oh.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    for k, n in enumerate(graph.node):
        if not n.name:
            n.name = f"{n.op_type}_{k}"
    m = oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def observe(sess, feeds):
    """(outputs, {value name: host array} of every node output) of one observed run."""
    seen = {}

    def observer(p, args, outs, seconds):
        for name, v in zip(p.outputs, outs):
            if name and isinstance(v, Tensor) and v.array is not None:
                seen[name] = v.numpy().copy()

    outs = sess.run_values(feeds, observer=observer)
    return [o.numpy() for o in outs], seen


def compare(m, feeds, optimize=True, rtol=0.0, atol=0.0, device="cpu", runs=3, base_dir=None, scaled=False):
    """Optimised vs unoptimised Session on feeds: outputs of `runs` plain runs (general
    then compiled path) and, node by node, every surviving intermediate.  scaled: atol
    is relative to each tensor's largest magnitude (deep models accumulate rounding
    differences in absolute terms).  Returns the optimised session."""
    opt = Session(m, device=device, options={"optimize": optimize}, base_dir=base_dir)
    ref = Session(m, device=device, options={"optimize": False}, base_dir=base_dir)
    want = ref.run(None, feeds)
    for _ in range(runs):
        got = opt.run(None, feeds)
        for g, w in zip(got, want):
            _close(g, w, rtol, atol, scaled=scaled)
    outs, seen = observe(opt, feeds)
    _, seen_ref = observe(ref, feeds)
    missing = set(seen) - set(seen_ref)
    assert not missing, f"optimised values without an original: {sorted(missing)}"
    for name, v in seen.items():
        _close(v, seen_ref[name], rtol, atol, name, scaled)
    for g, w in zip(outs, want):
        _close(g, w, rtol, atol, scaled=scaled)
    return opt


def _close(got, want, rtol, atol, name="", scaled=False):
    got, want = np.asarray(got), np.asarray(want)
    if scaled and want.size and want.dtype.kind == "f":
        finite = np.abs(want[np.isfinite(want)])
        atol = atol * max(1.0, float(finite.max()) if finite.size else 1.0)
    assert got.shape == want.shape and got.dtype == want.dtype, (name, got.shape, want.shape, got.dtype, want.dtype)
    if rtol == 0 and atol == 0:
        np.testing.assert_array_equal(got, want, err_msg=name)
    else:
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol,
                                   err_msg=name)


def ops(sess):
    return [p.op_type for p in sess.graph.nodes]


# ------------------------------------------------------------------ options


def test_option_values_and_defaults():
    m = model_of([oh.make_node("Shape", ["x"], ["s"]), oh.make_node("Reshape", ["x", "s"], ["y"])],
                 [vi("x", TP.FLOAT, [2, 3])], [vi("y", TP.FLOAT, [2, 3])])
    assert ops(Session(m)) == ["Reshape"]
    assert Session(m).graph.optimized == {"shapes": 1}
    assert ops(Session(m, options={"optimize": False})) == ["Shape", "Reshape"]
    assert ops(Session(m, options={"optimize": ["conv_bn"]})) == ["Shape", "Reshape"]
    assert ops(Session(m, options={"optimize": "shapes,gelu"})) == ["Reshape"]
    # tools that observe every original node turn folding off, and optimisations with it
    assert ops(Session(m, options={"fold_constants": False})) == ["Shape", "Reshape"]
    # 'inplace' only when asked for
    chain = model_of([oh.make_node("MatMul", ["x", "W"], ["h"]), oh.make_node("Relu", ["h"], ["y"])],
                     [vi("x", TP.FLOAT, [2, 3])], [vi("y", TP.FLOAT, None)], [init("W", np.ones((3, 3), np.float32))])
    assert ops(Session(chain)) == ops(Session(chain, options={"optimize": True})) == ["MatMul", "Relu"]
    assert ops(Session(chain, options={"optimize": "all"})) == ["InPlaceChain"]
    # 'conv_activation' by default: an activation after a Conv becomes its epilogue
    conv = model_of([oh.make_node("Conv", ["x", "W"], ["h"]), oh.make_node("Relu", ["h"], ["y"])],
                    [vi("x", TP.FLOAT, [1, 3, 4, 4])], [vi("y", TP.FLOAT, None)],
                    [init("W", np.ones((2, 3, 1, 1), np.float32))])
    assert ops(Session(conv)) == ["InPlaceChain"] and Session(conv).graph.optimized == {"conv_activation": 1}
    assert ops(Session(conv, options={"optimize": "shapes,conv_bn"})) == ["Conv", "Relu"]
    with pytest.raises(OptionError, match="unknown pass"):
        Session(m, options={"optimize": ["shapes", "fuse_everything"]})
    with pytest.raises(OptionError, match="optimize"):
        Session(m, options={"optimize": 3})
    assert set(PASSES) == {"shapes", "specialize", "conv_bn", "dequantized", "layernorm", "rmsnorm", "gelu", "silu",
                           "attention", "conv_activation", "inplace"}


def test_parity_all_nodes_sees_every_node(rng):
    from gpukernels import parity

    nodes, x = gelu_torchscript_erf()
    m = model_of(nodes, [vi("x", TP.FLOAT, [3, 5])], [vi("y", TP.FLOAT, [3, 5])])
    seen = parity._run_gpukernels(m, {"x": rng.standard_normal((3, 5)).astype(np.float32)},
                                  parity.Side("gpukernels", "cpu"), all_nodes=True)
    produced = {o for n in m.graph.node for o in n.output}
    assert produced - {"sqrt2", "one", "half"} <= set(seen)


# ------------------------------------------------------------------ shapes


def shape_arithmetic_nodes():
    """x [B, 3, 4] -> [B, 12] as TorchScript writes x.view(x.size(0), -1) and
    x.flatten(1), plus Size, Range over a dimension, and Equal/Where on shapes."""
    return [
        oh.make_node("Shape", ["x"], ["s"]),
        const("zero", 0, np.int64),
        oh.make_node("Gather", ["s", "zero"], ["b"], axis=0),
        const("ax0", [0], np.int64),
        oh.make_node("Unsqueeze", ["b", "ax0"], ["b1"]),
        const("m1", [-1], np.int64),
        oh.make_node("Concat", ["b1", "m1"], ["target"], axis=0),
        oh.make_node("Reshape", ["x", "target"], ["flat"]),
        oh.make_node("Shape", ["flat"], ["fs"], start=-1),
        oh.make_node("Squeeze", ["fs", "ax0"], ["n"]),
        const("one", 1, np.int64),
        oh.make_node("Range", ["zero", "n", "one"], ["idx"]),
        oh.make_node("Cast", ["idx"], ["idxf"], to=TP.FLOAT),
        oh.make_node("Size", ["x"], ["size"]),
        oh.make_node("Cast", ["size"], ["sizef"], to=TP.FLOAT),
        oh.make_node("Div", ["idxf", "sizef"], ["ramp"]),
        oh.make_node("Add", ["flat", "ramp"], ["y0"]),
        oh.make_node("Equal", ["s", "s"], ["same"]),
        oh.make_node("Where", ["same", "s", "s"], ["s2"]),
        oh.make_node("Reshape", ["y0", "s2"], ["y"]),
    ]


def test_shape_arithmetic_folds_with_static_shapes(rng):
    m = model_of(shape_arithmetic_nodes(), [vi("x", TP.FLOAT, [2, 3, 4])], [vi("y", TP.FLOAT, [2, 3, 4])])
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    sess = compare(m, {"x": x})
    assert ops(sess) == ["Reshape", "Add", "Reshape"]
    assert sess.graph.optimized == {"shapes": 3}
    # static shapes: nothing left to specialise
    assert sess._specializer is None


def test_symbolic_dims_fold_once_per_signature(rng):
    m = model_of(shape_arithmetic_nodes(), [vi("x", TP.FLOAT, ["B", 3, 4])], [vi("y", TP.FLOAT, ["B", 3, 4])])
    ref = Session(m, options={"optimize": False})
    sess = Session(m)
    generic = len(sess.graph.nodes)
    assert "Shape" in ops(sess) and sess._specializer is not None
    for b in (2, 5, 2, 1, 5):
        x = rng.standard_normal((b, 3, 4)).astype(np.float32)
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], ref.run(None, {"x": x})[0])
    plans = sess._specializer.plans()
    assert len(plans) == 3 and all(len(p.nodes) < generic for p in plans)
    assert all([p.op_type for p in plan.nodes] == ["Reshape", "Add", "Reshape"] for plan in plans)
    x = rng.standard_normal((4, 3, 4)).astype(np.float32)
    compare(m, {"x": x})  # node by node, through the specialised graph


def test_specialisations_are_bounded(rng, monkeypatch):
    monkeypatch.setattr(Specializer, "MAX_SIGNATURES", 2)
    m = model_of(shape_arithmetic_nodes(), [vi("x", TP.FLOAT, ["B", 3, 4])], [vi("y", TP.FLOAT, ["B", 3, 4])])
    sess, ref = Session(m), Session(m, options={"optimize": False})
    for b in (1, 2, 3, 4):
        x = rng.standard_normal((b, 3, 4)).astype(np.float32)
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], ref.run(None, {"x": x})[0])
    assert len(sess._specializer.entries) == 2
    off = Session(m, options={"optimize": ["shapes"]})
    assert off._specializer is None


def test_declared_value_info_and_output_shapes_are_not_trusted(rng):
    nodes = [oh.make_node("Relu", ["x"], ["r"]), oh.make_node("Shape", ["r"], ["s"]),
             oh.make_node("Reshape", ["x", "s"], ["y"])]
    m = model_of(nodes, [vi("x", TP.FLOAT, ["N", 3])], [vi("y", TP.FLOAT, [7, 3])])
    m.graph.value_info.append(vi("r", TP.FLOAT, [7, 3]))  # a lie
    x = rng.standard_normal((2, 3)).astype(np.float32)
    sess = compare(m, {"x": x})
    assert "Shape" in ops(sess)  # the generic graph cannot know N
    assert sess.run(None, {"x": x})[0].shape == (2, 3)


def test_unchecked_graph_inputs_are_not_trusted(rng):
    """run_graph runs graphs whose inputs nobody checks: declared dims are not used."""
    nodes = [oh.make_node("Shape", ["x"], ["s"]), oh.make_node("Reshape", ["x", "s"], ["y"])]
    g = oh.make_graph(nodes, "g", [vi("x", TP.FLOAT, [2, 3])], [vi("y", TP.FLOAT, [2, 3])])
    x = rng.standard_normal((4, 3)).astype(np.float32)
    (y,) = run_graph(g, {"x": Tensor(x)})
    assert y.shape == (4, 3)
    plan = PreparedGraph(g, KernelContext("cpu", 17))
    assert [p.op_type for p in plan.nodes] == ["Shape", "Reshape"]


def test_shapes_fold_in_rounds(rng, monkeypatch):
    """Shape inference cannot see through ReduceProd, constant folding can: the Reshape's
    target becomes a constant in round one, Shape of its result folds in round two."""
    import gpukernels.runtime.optimize as optimize

    nodes = [oh.make_node("Shape", ["x"], ["s"]), oh.make_node("ReduceProd", ["s"], ["n"], keepdims=1),
             oh.make_node("Reshape", ["x", "n"], ["flat"]), oh.make_node("Shape", ["flat"], ["fs"]),
             oh.make_node("Cast", ["fs"], ["fsf"], to=TP.FLOAT), oh.make_node("Add", ["flat", "fsf"], ["y"])]
    m = model_of(nodes, [vi("x", TP.FLOAT, [2, 3])], [vi("y", TP.FLOAT, None)])
    sess = compare(m, {"x": rng.standard_normal((2, 3)).astype(np.float32)})
    assert ops(sess) == ["Reshape", "Add"] and sess.graph.optimized == {"shapes": 2}
    monkeypatch.setattr(optimize, "_SHAPE_ROUNDS", 1)
    assert ops(Session(m)) == ["Reshape", "Shape", "Cast", "Add"]


def test_inference_never_sees_unvetted_nodes(tmp_path):
    """onnx's C++ inference of some operators dereferences input types it was not given
    (RegexFullMatch reading a value defined later: a segmentation fault, found by the
    fuzzer).  Such nodes stay opaque; the model loads (in a child process, so a crash
    fails the test instead of ending the run) and runs as without optimisations."""
    import subprocess
    import sys

    S = TP.STRING
    nodes = [oh.make_node("RegexFullMatch", ["cat"], ["match"], pattern="[a-z]+ x"),
             oh.make_node("StringConcat", ["s", "suffix"], ["cat"])]  # out of order
    m = model_of(nodes, [vi("s", S, [-1, 1])], [vi("match", TP.BOOL, None)],
                 [numpy_helper.from_array(np.array([" x"], dtype=object), "suffix")], opset=20)
    path = tmp_path / "m.onnx"
    path.write_bytes(m.SerializeToString())
    code = ("import sys; from gpukernels.runtime import Session\n"
            "try:\n    Session(sys.argv[1])\nexcept Exception as e:\n    print(type(e).__name__)\n")
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_shape_of_graph_output_stays_per_run(rng):
    nodes = [oh.make_node("Shape", ["x"], ["s"])]
    m = model_of(nodes, [vi("x", TP.FLOAT, [2, 3])], [vi("s", TP.INT64, [2])])
    sess = compare(m, {"x": rng.standard_normal((2, 3)).astype(np.float32)})
    assert ops(sess) == ["Shape"]


def test_inferred_shapes_agree_with_the_kernels(rng):
    """Every static shape inference gives equals the shape the unoptimised run makes."""
    from gpukernels.runtime.optimize.shapes import infer_types

    models = [(model_of(shape_arithmetic_nodes(), [vi("x", TP.FLOAT, [2, 3, 4])], [vi("y", TP.FLOAT, None)]),
               {"x": rng.standard_normal((2, 3, 4)).astype(np.float32)})]
    m, feeds = sdpa_model("torchscript", causal=True)
    models.append((m, feeds))
    for m, feeds in models:
        sess = Session(m, options={"optimize": False})
        info = infer_types(sess.graph)
        _, seen = observe(sess, feeds)
        checked = 0
        for name, v in seen.items():
            shape = info.static_shape(name)
            if shape is not None:
                assert shape == v.shape, name
                checked += 1
        assert checked >= len(seen) // 2


# ------------------------------------------------------------------ Conv + BatchNormalization


def conv_bn_model(rng, opset=15, bias=True, group=1, dims=2, training_mode=None, extra_use=False,
                  bn_const=True):
    cin, cout = 4, 6
    k = (3,) * dims
    w = rng.standard_normal((cout, cin // group) + k).astype(np.float32)
    inits = [init("W", w), init("scale", rng.uniform(0.5, 2, cout).astype(np.float32)),
             init("bias", rng.standard_normal(cout).astype(np.float32)),
             init("mean", rng.standard_normal(cout).astype(np.float32)),
             init("var", rng.uniform(0.1, 3, cout).astype(np.float32))]
    conv_in = ["x", "W"]
    if bias:
        inits.append(init("B", rng.standard_normal(cout).astype(np.float32)))
        conv_in.append("B")
    attrs = {} if training_mode is None else {"training_mode": training_mode}
    nodes = [oh.make_node("Conv", conv_in, ["c"], pads=[1] * (2 * dims), group=group),
             oh.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["bn"], epsilon=1e-3,
                          **attrs),
             oh.make_node("Relu", ["bn"], ["y"])]
    outputs = [vi("y", TP.FLOAT, None)]
    if extra_use:
        nodes.append(oh.make_node("Neg", ["c"], ["z"]))
        outputs.append(vi("z", TP.FLOAT, None))
    inputs = [vi("x", TP.FLOAT, [2, cin] + [7] * dims)]
    if not bn_const:
        inits = [i for i in inits if i.name != "var"]
        inputs.append(vi("var", TP.FLOAT, [cout]))
    m = model_of(nodes, inputs, outputs, inits, opset=opset)
    feeds = {"x": rng.standard_normal([2, cin] + [7] * dims).astype(np.float32)}
    if not bn_const:
        feeds["var"] = rng.uniform(0.1, 3, cout).astype(np.float32)
    return m, feeds


@pytest.mark.parametrize("opset,bias,group,dims", [(15, True, 1, 2), (15, False, 2, 2), (9, True, 1, 1),
                                                   (14, True, 2, 3)])
def test_conv_bn_folds(rng, device, opset, bias, group, dims):
    m, feeds = conv_bn_model(rng, opset, bias, group, dims)
    sess = compare(m, feeds, rtol=2e-5, atol=2e-5, device=device, optimize=["conv_bn"])
    assert ops(sess) == ["Conv", "Relu"] and sess.graph.optimized == {"conv_bn": 1}
    # the original weights are no longer held
    assert "W" not in sess.graph.constants and "var" not in sess.graph.constants


@pytest.mark.parametrize("case", ["training", "conv_output_used", "bn_param_input"])
def test_conv_bn_conditions(rng, case):
    kw = {"training": dict(training_mode=1), "conv_output_used": dict(extra_use=True),
          "bn_param_input": dict(bn_const=False)}[case]
    m, feeds = conv_bn_model(rng, **kw)
    sess = compare(m, feeds)
    assert "BatchNormalization" in ops(sess) and not sess.graph.optimized


@pytest.mark.parametrize("chain", ["bn_mul_add", "conv_bn_mul_add", "conv_mul", "conv_add_4d"])
def test_per_channel_affine_folds(rng, chain):
    """Mul/Add by per-channel constants after a BatchNormalization (densenet's Caffe2
    export writes BN, Mul [C,1,1], Add [C,1,1]) or a Conv fold into it."""
    c = 6
    inits = [init("W", rng.standard_normal((c, 4, 3, 3)).astype(np.float32)),
             init("scale", rng.uniform(0.5, 2, c).astype(np.float32)),
             init("bias", rng.standard_normal(c).astype(np.float32)),
             init("mean", rng.standard_normal(c).astype(np.float32)),
             init("var", rng.uniform(0.1, 3, c).astype(np.float32)),
             init("s", rng.standard_normal((c, 1, 1)).astype(np.float32)),
             init("t", rng.standard_normal((1, c, 1, 1)).astype(np.float32))]
    bn = oh.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["bn"])
    if chain == "bn_mul_add":
        nodes = [oh.make_node("Relu", ["x"], ["c"]), bn, oh.make_node("Mul", ["bn", "s"], ["m"]),
                 oh.make_node("Add", ["t", "m"], ["y"])]
        want = ["Relu", "BatchNormalization"]
    elif chain == "conv_bn_mul_add":
        nodes = [oh.make_node("Conv", ["x", "W"], ["c"]), bn, oh.make_node("Mul", ["s", "bn"], ["m"]),
                 oh.make_node("Add", ["m", "t"], ["y"])]
        want = ["Conv"]
    elif chain == "conv_mul":
        nodes = [oh.make_node("Conv", ["x", "W"], ["c"]), oh.make_node("Mul", ["c", "s"], ["y"])]
        want = ["Conv"]
    else:
        nodes = [oh.make_node("Conv", ["x", "W"], ["c"]), oh.make_node("Add", ["c", "t"], ["y"])]
        want = ["Conv"]
    shape = [2, 4, 6, 6] if chain != "bn_mul_add" else [2, c, 5, 5]
    m = model_of(nodes, [vi("x", TP.FLOAT, shape)], [vi("y", TP.FLOAT, None)], inits, opset=15)
    sess = compare(m, {"x": rng.standard_normal(shape).astype(np.float32)}, rtol=2e-5, atol=2e-5)
    assert ops(sess) == want


def test_affine_that_grows_the_value_is_kept(rng):
    """A [C, 1] constant against a rank-2 [N, C] BN output broadcasts to [C, C]."""
    c = 3
    inits = [init(n, rng.uniform(0.5, 2, c).astype(np.float32)) for n in ("scale", "bias", "mean", "var")]
    inits.append(init("s", rng.standard_normal((c, 1)).astype(np.float32)))
    nodes = [oh.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"], ["bn"]),
             oh.make_node("Mul", ["bn", "s"], ["y"])]
    m = model_of(nodes, [vi("x", TP.FLOAT, [c, c])], [vi("y", TP.FLOAT, None)], inits, opset=15)
    sess = compare(m, {"x": rng.standard_normal((c, c)).astype(np.float32)})
    assert ops(sess) == ["BatchNormalization", "Mul"]


# ------------------------------------------------------------------ in place


def test_inplace_chains_are_bit_identical(rng, device):
    inits = [init("W", rng.standard_normal((8, 6)).astype(np.float32)),
             init("b", rng.standard_normal(6).astype(np.float32)),
             init("s", np.float32(0.5)),
             init("Wc", rng.standard_normal((5, 3, 3, 3)).astype(np.float32)),
             init("bc", rng.standard_normal((5, 1, 1)).astype(np.float32))]
    nodes = [oh.make_node("MatMul", ["x", "W"], ["h"]), oh.make_node("Add", ["b", "h"], ["hb"]),
             oh.make_node("Relu", ["hb"], ["hr"]), oh.make_node("Sub", ["s", "hr"], ["y"]),
             oh.make_node("Conv", ["img", "Wc"], ["c"]), oh.make_node("Add", ["c", "bc"], ["cb"]),
             oh.make_node("Relu", ["cb"], ["z"]),
             oh.make_node("Gemm", ["x2", "W"], ["g"], transB=0), oh.make_node("Mul", ["g", "s"], ["gm"]),
             oh.make_node("Neg", ["gm"], ["w"])]
    m = model_of(nodes, [vi("x", TP.FLOAT, [2, 4, 8]), vi("img", TP.FLOAT, [1, 3, 6, 6]), vi("x2", TP.FLOAT, [3, 8])],
                 [vi("y", TP.FLOAT, None), vi("z", TP.FLOAT, None), vi("w", TP.FLOAT, None)], inits)
    feeds = {"x": rng.standard_normal((2, 4, 8)).astype(np.float32),
             "img": rng.standard_normal((1, 3, 6, 6)).astype(np.float32),
             "x2": rng.standard_normal((3, 8)).astype(np.float32)}
    kept = {k: v.copy() for k, v in feeds.items()}
    sess = compare(m, feeds, device=device, optimize=["inplace"])  # exact
    assert ops(sess) == ["InPlaceChain"] * 3 and sess.graph.optimized == {"inplace": 3}
    for k in feeds:
        np.testing.assert_array_equal(feeds[k], kept[k])


def test_inplace_never_writes_into_memory_it_does_not_own(rng):
    from gpukernels.kernels.math.matmul import MatMul

    class ReturnsA(MatMul):
        def __call__(self, A, B):
            return self.tensor(A, "A")

        def array_function(self, inputs, attrs):
            return lambda a, b: a

    nodes = [oh.make_node("MatMul", ["x", "W"], ["h"]), oh.make_node("Relu", ["h"], ["y"])]
    m = model_of(nodes, [vi("x", TP.FLOAT, [4, 4])], [vi("y", TP.FLOAT, None)],
                 [init("W", np.eye(4, dtype=np.float32))])
    x = rng.standard_normal((4, 4)).astype(np.float32)
    kept = x.copy()
    sess = Session(m, options={"kernel_overrides": {"MatMul": ReturnsA}, "optimize": ["inplace"]})
    assert ops(sess) == ["InPlaceChain"]
    for _ in range(3):
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], np.maximum(kept, 0))
        np.testing.assert_array_equal(x, kept)


def test_inplace_result_of_another_shape_goes_through_the_kernels(rng):
    """A producer result unlike the one checked when preparing (here a MatMul that
    returns one row) runs the steps through their kernels: [1, 6] + [3, 1] is [3, 6]."""
    from gpukernels.kernels.math.matmul import MatMul

    class OneRow(MatMul):
        def __call__(self, A, B):
            t = super().__call__(A, B)
            return Tensor.wrap(t.array[:1].copy(), t.data_type)

        def array_function(self, inputs, attrs):
            product = super().array_function(inputs, attrs)  # the kernel's own product
            return lambda a, b: product(a, b)[:1].copy()

    nodes = [oh.make_node("MatMul", ["x", "W"], ["h"]), oh.make_node("Add", ["h", "b"], ["hb"]),
             oh.make_node("Relu", ["hb"], ["y"])]
    m = model_of(nodes, [vi("x", TP.FLOAT, [3, 8])], [vi("y", TP.FLOAT, None)],
                 [init("W", rng.standard_normal((8, 6)).astype(np.float32)),
                  init("b", rng.standard_normal((3, 1)).astype(np.float32))])
    x = rng.standard_normal((3, 8)).astype(np.float32)
    opts = {"kernel_overrides": {"MatMul": OneRow}}
    sess = Session(m, options={**opts, "optimize": "all"})
    ref = Session(m, options={**opts, "optimize": False})
    assert ops(sess) == ["InPlaceChain"]
    for _ in range(3):
        got, want = sess.run(None, {"x": x})[0], ref.run(None, {"x": x})[0]
        assert got.shape == (3, 6)
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("case", ["bias_input", "grows", "used_twice", "float16"])
def test_inplace_conditions(rng, case):
    b = rng.standard_normal(6).astype(np.float32)
    inputs = [vi("x", TP.FLOAT, [3, 8])]
    inits = [init("W", rng.standard_normal((8, 6)).astype(np.float32))]
    outputs = [vi("y", TP.FLOAT, None)]
    nodes = [oh.make_node("MatMul", ["x", "W"], ["h"]), oh.make_node("Add", ["h", "b"], ["y"])]
    feeds = {"x": rng.standard_normal((3, 8)).astype(np.float32)}
    if case == "bias_input":
        inputs.append(vi("b", TP.FLOAT, [6]))
        feeds["b"] = b
    elif case == "grows":  # [3, 6] + [2, 1, 6] is [2, 3, 6]
        inits.append(init("b", np.stack([b, b])[:, None, :]))
    else:
        inits.append(init("b", b))
    if case == "used_twice":
        outputs.append(vi("h", TP.FLOAT, None))
    if case == "float16":  # computed in float32 and rounded per node: not a native ufunc
        inputs[0] = vi("x", TP.FLOAT16, [3, 8])
        inits = [init("W", rng.standard_normal((8, 6)).astype(np.float16)), init("b", b.astype(np.float16))]
        feeds["x"] = feeds["x"].astype(np.float16)
    m = model_of(nodes, inputs, outputs, inits)
    sess = compare(m, feeds, optimize="all")
    assert "InPlaceChain" not in ops(sess)


@pytest.mark.slow
def test_conv_bn_on_light_model(rng):
    """onnx's light shufflenet export: 49 Conv+BatchNormalization pairs, every one folded."""
    path = pathlib.Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / "light_shufflenet.onnx"
    if not path.exists():
        pytest.skip("onnx's light models are not installed")
    m = onnx.load(str(path))
    sess = Session(m)
    x = rng.standard_normal([d.dim_value for d in sess.inputs[0].type.tensor_type.shape.dim]).astype(np.float32)
    opt = compare(m, {sess.input_names[0]: x}, rtol=1e-4, atol=1e-6, runs=1)
    assert opt.graph.optimized.get("conv_bn") == 49
    assert "BatchNormalization" not in ops(opt)


# ------------------------------------------------------------------ GELU / SiLU


def gelu_torchscript_erf():
    """torch.onnx.export(dynamo=False), F.gelu(x) below opset 20 (symbolic_opset9.gelu)."""
    return [const("sqrt2", 1.4142135623730951), oh.make_node("Div", ["x", "sqrt2"], ["d"]),
            oh.make_node("Erf", ["d"], ["e"]), const("one", 1.0), oh.make_node("Add", ["e", "one"], ["a"]),
            oh.make_node("Mul", ["x", "a"], ["m"]), const("half", 0.5), oh.make_node("Mul", ["m", "half"], ["y"])], "x"


def gelu_dynamo_erf():
    """torch.onnx.export(dynamo=True), torchlib _aten_gelu_approximate_none."""
    return [const("sqrt2", 1.4142135623730951), const("one", 1.0), const("half", 0.5),
            oh.make_node("Div", ["x", "sqrt2"], ["d"]), oh.make_node("Erf", ["d"], ["e"]),
            oh.make_node("Add", ["e", "one"], ["a"]), oh.make_node("Mul", ["half", "a"], ["m"]),
            oh.make_node("Mul", ["x", "m"], ["y"])], "x"


def gelu_torchscript_tanh():
    """symbolic_opset9.gelu(approximate='tanh'): x^3 as x * (x * x)."""
    return [const("beta", math.sqrt(2 / math.pi)), const("kappa", 0.044715), const("one", 1.0),
            const("half", 0.5),
            oh.make_node("Mul", ["x", "x"], ["xx"]), oh.make_node("Mul", ["x", "xx"], ["cube"]),
            oh.make_node("Mul", ["kappa", "cube"], ["kc"]), oh.make_node("Add", ["x", "kc"], ["s"]),
            oh.make_node("Mul", ["beta", "s"], ["inner"]), oh.make_node("Tanh", ["inner"], ["t"]),
            oh.make_node("Add", ["one", "t"], ["a"]), oh.make_node("Mul", ["x", "a"], ["m"]),
            oh.make_node("Mul", ["half", "m"], ["y"])], "x"


def gelu_dynamo_tanh():
    """torchlib _aten_gelu_approximate_tanh: Pow(x, 3), constants on the left."""
    return [const("three", 3.0), const("kappa", 0.044715), const("beta", math.sqrt(2 / math.pi)),
            const("one", 1.0), const("half", 0.5),
            oh.make_node("Pow", ["x", "three"], ["cube"]), oh.make_node("Mul", ["kappa", "cube"], ["kc"]),
            oh.make_node("Add", ["x", "kc"], ["s"]), oh.make_node("Mul", ["beta", "s"], ["inner"]),
            oh.make_node("Tanh", ["inner"], ["t"]), oh.make_node("Add", ["t", "one"], ["a"]),
            oh.make_node("Mul", ["half", "a"], ["m"]), oh.make_node("Mul", ["x", "m"], ["y"])], "x"


GELUS = {"torchscript_erf": (gelu_torchscript_erf, "none"), "dynamo_erf": (gelu_dynamo_erf, "none"),
         "torchscript_tanh": (gelu_torchscript_tanh, "tanh"), "dynamo_tanh": (gelu_dynamo_tanh, "tanh")}


@pytest.mark.parametrize("form", sorted(GELUS))
@pytest.mark.parametrize("opset", [17, 18])
def test_gelu_forms(rng, device, form, opset):
    build, approximate = GELUS[form]
    nodes, _ = build()
    m = model_of(nodes, [vi("x", TP.FLOAT, [4, 33])], [vi("y", TP.FLOAT, [4, 33])], opset=opset)
    x = (rng.standard_normal((4, 33)) * 3).astype(np.float32)
    sess = compare(m, {"x": x}, rtol=1e-5, atol=2e-6, device=device)
    assert ops(sess) == ["Gelu"] and sess.graph.optimized == {"gelu": 1}
    assert sess.graph.nodes[0].attrs["approximate"] == approximate


def test_gelu_float16(rng):
    nodes, _ = gelu_torchscript_erf()
    for n in nodes:
        if n.op_type == "Constant":
            n.attribute[0].t.CopyFrom(numpy_helper.from_array(
                numpy_helper.to_array(n.attribute[0].t).astype(np.float16), n.output[0] + "_v"))
    m = model_of(nodes, [vi("x", TP.FLOAT16, [64])], [vi("y", TP.FLOAT16, [64])])
    x = (rng.standard_normal(64) * 3).astype(np.float16)
    sess = compare(m, {"x": x}, rtol=2e-3, atol=2e-3)
    assert ops(sess) == ["Gelu"]


@pytest.mark.parametrize("change", ["kappa", "half", "shared", "rank"])
def test_gelu_conditions(rng, change):
    nodes, _ = gelu_dynamo_tanh()
    outputs = [vi("y", TP.FLOAT, None)]
    shape = [4, 5]
    if change == "kappa":
        nodes[1] = const("kappa", 0.0447)
    elif change == "half":
        nodes[4] = const("half", 0.25)
    elif change == "shared":  # an intermediate is also a graph output
        outputs.append(vi("t", TP.FLOAT, None))
    elif change == "rank":  # a [1, 1, 1] constant broadcasts x [4, 5] to rank 3
        nodes[4] = oh.make_node("Constant", [], ["half"], value=numpy_helper.from_array(
            np.full((1, 1, 1), 0.5, np.float32), "h"))
    m = model_of(nodes, [vi("x", TP.FLOAT, shape)], outputs)
    sess = compare(m, {"x": rng.standard_normal(shape).astype(np.float32)})
    assert "Gelu" not in ops(sess)


@pytest.mark.parametrize("form", ["silu", "silu_swapped", "quick_gelu"])
def test_silu_forms(rng, device, form):
    """TorchScript and dynamo both write F.silu as Mul(x, Sigmoid(x)); x * sigmoid(1.702 x)
    is QuickGELU."""
    if form == "quick_gelu":
        nodes = [const("a", 1.702), oh.make_node("Mul", ["x", "a"], ["ax"]),
                 oh.make_node("Sigmoid", ["ax"], ["s"]), oh.make_node("Mul", ["x", "s"], ["y"])]
    else:
        nodes = [oh.make_node("Sigmoid", ["x"], ["s"]),
                 oh.make_node("Mul", ["x", "s"] if form == "silu" else ["s", "x"], ["y"])]
    m = model_of(nodes, [vi("x", TP.FLOAT, [3, 40])], [vi("y", TP.FLOAT, [3, 40])])
    x = (rng.standard_normal((3, 40)) * 4).astype(np.float32)
    sess = compare(m, {"x": x}, rtol=4e-7, atol=1e-7, device=device)
    assert ops(sess) == ["Swish"]
    assert sess.graph.nodes[0].attrs["alpha"] == pytest.approx(1.702 if form == "quick_gelu" else 1.0)


def test_silu_sigmoid_used_elsewhere_is_kept(rng):
    nodes = [oh.make_node("Sigmoid", ["x"], ["s"]), oh.make_node("Mul", ["x", "s"], ["y"]),
             oh.make_node("Neg", ["s"], ["z"])]
    m = model_of(nodes, [vi("x", TP.FLOAT, [5])], [vi("y", TP.FLOAT, [5]), vi("z", TP.FLOAT, [5])])
    sess = compare(m, {"x": rng.standard_normal(5).astype(np.float32)})
    assert "Swish" not in ops(sess)


# ------------------------------------------------------------------ LayerNorm / RMSNorm


def layernorm_nodes(opset, square="Pow", affine=True, axes=(-1,), divide=True):
    """symbolic_opset9.native_layer_norm (TorchScript below opset 17); at opset 18 the
    axes are an input, as dynamo's torchlib writes a spelled-out LayerNorm module."""
    def mean(src, dst):
        if opset >= 18:
            return oh.make_node("ReduceMean", [src, "axes"], [dst])
        return oh.make_node("ReduceMean", [src], [dst], axes=list(axes))

    nodes = [mean("x", "m"), oh.make_node("Sub", ["x", "m"], ["d"])]
    if opset >= 18:
        nodes.append(const("axes", list(axes), np.int64))
    if square == "Pow":
        nodes += [const("two", 2.0), oh.make_node("Pow", ["d", "two"], ["sq"])]
    else:
        nodes.append(oh.make_node("Mul", ["d", "d"], ["sq"]))
    nodes += [mean("sq", "v"), const("eps", 1e-5), oh.make_node("Add", ["v", "eps"], ["ve"]),
              oh.make_node("Sqrt", ["ve"], ["sd"])]
    if divide:
        nodes.append(oh.make_node("Div", ["d", "sd"], ["n"]))
    else:
        nodes += [oh.make_node("Reciprocal", ["sd"], ["r"]), oh.make_node("Mul", ["d", "r"], ["n"])]
    if affine:
        nodes += [oh.make_node("Mul", ["n", "gamma"], ["g"]), oh.make_node("Add", ["g", "beta"], ["y"])]
    else:
        nodes.append(oh.make_node("Identity", ["n"], ["y"]))
    return nodes


@pytest.mark.parametrize("opset,square,affine,divide", [(14, "Pow", True, True), (18, "Pow", True, True),
                                                        (16, "Mul", False, True), (13, "Pow", True, False)])
def test_layernorm_forms(rng, device, opset, square, affine, divide):
    shape = [2, 5, 24]
    inits = [init("gamma", rng.standard_normal(24).astype(np.float32)),
             init("beta", rng.standard_normal(24).astype(np.float32))] if affine else []
    m = model_of(layernorm_nodes(opset, square, affine, divide=divide), [vi("x", TP.FLOAT, shape)],
                 [vi("y", TP.FLOAT, shape)], inits, opset=opset)
    x = (rng.standard_normal(shape) * 2 + 1).astype(np.float32)
    sess = compare(m, {"x": x}, rtol=1e-5, atol=1e-5, device=device)
    assert ops(sess) == ["LayerNormalization"] + ([] if affine else ["Identity"])
    assert sess.graph.optimized == {"layernorm": 1}
    assert "gamma" not in sess.graph.constants or affine


def test_layernorm_two_axes_and_conditions(rng):
    shape = [3, 4, 6]
    inits = [init("gamma", rng.standard_normal((4, 6)).astype(np.float32)),
             init("beta", rng.standard_normal((4, 6)).astype(np.float32))]
    x = rng.standard_normal(shape).astype(np.float32)
    m = model_of(layernorm_nodes(14, axes=(-2, -1)), [vi("x", TP.FLOAT, shape)], [vi("y", TP.FLOAT, shape)], inits,
                 opset=14)
    assert ops(compare(m, {"x": x}, rtol=1e-5, atol=1e-5)) == ["LayerNormalization"]
    # not the trailing axes: kept (x normalised over axis 1 only)
    m = model_of(layernorm_nodes(14, axes=(1,)), [vi("x", TP.FLOAT, shape)], [vi("y", TP.FLOAT, None)],
                 [init("gamma", np.ones((4, 1), np.float32)), init("beta", np.zeros((4, 1), np.float32))],
                 opset=14)
    assert "LayerNormalization" not in ops(compare(m, {"x": x}, rtol=1e-5, atol=1e-5))
    # a gamma with more axes than the normalised ones stays a separate Mul
    m = model_of(layernorm_nodes(14), [vi("x", TP.FLOAT, shape)], [vi("y", TP.FLOAT, None)],
                 [init("gamma", rng.standard_normal((4, 6)).astype(np.float32)),
                  init("beta", np.zeros(6, np.float32))], opset=14)
    assert ops(compare(m, {"x": x}, rtol=1e-5, atol=1e-5)) == ["LayerNormalization", "Mul", "Add"]
    # x's normalised axis has size 1: Mul by gamma [6] grows the value, which
    # LayerNormalization's Scale may not: gamma stays a separate Mul
    m = model_of(layernorm_nodes(14), [vi("x", TP.FLOAT, [3, 4, 1])], [vi("y", TP.FLOAT, None)],
                 [init("gamma", rng.standard_normal(6).astype(np.float32)),
                  init("beta", np.zeros(6, np.float32))], opset=14)
    x1 = x[..., :1].copy()
    sess = compare(m, {"x": x1}, rtol=1e-5, atol=1e-5)
    assert ops(sess) == ["LayerNormalization", "Mul", "Add"]
    assert sess.run(None, {"x": x1})[0].shape == (3, 4, 6)


def rmsnorm_nodes(form):
    """LLaMA/T5 RMSNorm: TorchScript writes torch.rsqrt as Div(1, Sqrt) and keeps the
    .to(float32) Casts; dynamo writes Reciprocal(Sqrt)."""
    nodes = []
    x = "x"
    if form == "torchscript":
        nodes.append(oh.make_node("Cast", ["x"], ["xf"], to=TP.FLOAT))
        x = "xf"
    nodes += [const("two", 2.0), oh.make_node("Pow", [x, "two"], ["sq"]),
              oh.make_node("ReduceMean", ["sq"], ["v"], axes=[-1]) if form == "torchscript" else
              oh.make_node("ReduceMean", ["sq", "axes"], ["v"]),
              const("axes", [-1], np.int64), const("eps", 1e-6), oh.make_node("Add", ["v", "eps"], ["ve"]),
              oh.make_node("Sqrt", ["ve"], ["sd"])]
    if form == "torchscript":
        nodes += [const("one", 1.0), oh.make_node("Div", ["one", "sd"], ["r"]),
                  oh.make_node("Mul", [x, "r"], ["n"]), oh.make_node("Cast", ["n"], ["nc"], to=TP.FLOAT),
                  oh.make_node("Mul", ["w", "nc"], ["y"])]
    elif form == "dynamo":
        nodes += [oh.make_node("Reciprocal", ["sd"], ["r"]), oh.make_node("Mul", [x, "r"], ["n"]),
                  oh.make_node("Mul", ["w", "n"], ["y"])]
    else:  # no weight, Div
        nodes += [oh.make_node("Div", [x, "sd"], ["y"])]
    return nodes


@pytest.mark.parametrize("form", ["torchscript", "dynamo", "plain"])
def test_rmsnorm_forms(rng, device, form):
    shape = [2, 3, 32]
    opset = 14 if form == "torchscript" else 18
    m = model_of(rmsnorm_nodes(form), [vi("x", TP.FLOAT, shape)], [vi("y", TP.FLOAT, shape)],
                 [init("w", rng.standard_normal(32).astype(np.float32))], opset=opset)
    x = rng.standard_normal(shape).astype(np.float32)
    sess = compare(m, {"x": x}, rtol=1e-5, atol=1e-6, device=device)
    want = (["Cast"] if form == "torchscript" else []) + ["RMSNormalization"]
    assert ops(sess) == want and sess.graph.optimized == {"rmsnorm": 1}


# ------------------------------------------------------------------ attention


def sdpa_nodes(form, causal=False, mask=False):
    """F.scaled_dot_product_attention(q, k, v[, attn_mask][, is_causal]) with q, k, v of
    shape [B, H, L/S, E]: TorchScript (symbolic_opset14) and dynamo (torchlib) compute
    scale = 1/sqrt(E) from Shape(q), scale both q and K^T by sqrt(scale); the causal mask
    is built from Shape(q)/Shape(k) with Trilu and Where.  'eager' is the HF eager form:
    MatMul(q, K^T) * scaling + mask."""
    nodes = []
    if form in ("torchscript", "dynamo"):
        nodes += [oh.make_node("Shape", ["q"], ["qs"]), const("m1", [-1], np.int64),
                  const("big", [np.iinfo(np.int64).max], np.int64),
                  oh.make_node("Slice", ["qs", "m1", "big"], ["e"]),
                  oh.make_node("Cast", ["e"], ["ef"], to=TP.FLOAT), oh.make_node("Sqrt", ["ef"], ["se"]),
                  const("one", [1.0]), oh.make_node("Div", ["one", "se"], ["scale"]),
                  oh.make_node("Sqrt", ["scale"], ["ss"]),
                  oh.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
                  oh.make_node("Mul", ["q", "ss"], ["qsc"]), oh.make_node("Mul", ["kt", "ss"], ["ktsc"]),
                  oh.make_node("MatMul", ["qsc", "ktsc"], ["qk"])]
        scores = "qk"
    else:
        nodes += [oh.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
                  oh.make_node("MatMul", ["q", "kt"], ["qk0"]), const("scaling", 0.25),
                  oh.make_node("Mul", ["qk0", "scaling"], ["qk"])]
        scores = "qk"
    if causal:
        nodes += [oh.make_node("Shape", ["q"], ["qs2"]), oh.make_node("Shape", ["k"], ["ks2"]),
                  const("m2", [-2], np.int64), const("m1b", [-1], np.int64),
                  oh.make_node("Slice", ["qs2", "m2", "m1b"], ["tl"]),
                  oh.make_node("Slice", ["ks2", "m2", "m1b"], ["sl"]),
                  oh.make_node("Concat", ["tl", "sl"], ["size"], axis=0), const("c1", 1.0),
                  oh.make_node("Expand", ["c1", "size"], ["ones"]), oh.make_node("Trilu", ["ones"], ["tri"], upper=0),
                  const("c0", 0.0), const("ninf", -np.inf), oh.make_node("Equal", ["tri", "c0"], ["is0"]),
                  oh.make_node("Where", ["is0", "ninf", "c0"], ["cmask"]),
                  oh.make_node("Add", [scores, "cmask"], ["qkm"])]
        scores = "qkm"
    if mask:
        nodes.append(oh.make_node("Add", [scores, "mask"], ["qkm2"]))
        scores = "qkm2"
    nodes += [oh.make_node("Softmax", [scores], ["p"], axis=-1), oh.make_node("MatMul", ["p", "v"], ["y"])]
    return nodes


def sdpa_model(form, causal=False, mask=None, dims=(2, 3, 5, 16), symbolic=False, opset=17):
    B, H, L, E = dims
    S = L + 2 if not causal else L
    rng = np.random.default_rng(7)
    inits = [init("mask", mask)] if mask is not None else []
    qshape = ["B", H, "L", E] if symbolic else [B, H, L, E]
    kshape = ["B", H, "S", E] if symbolic else [B, H, S, E]
    m = model_of(sdpa_nodes(form, causal, mask is not None),
                 [vi("q", TP.FLOAT, qshape), vi("k", TP.FLOAT, kshape), vi("v", TP.FLOAT, kshape)],
                 [vi("y", TP.FLOAT, None)], inits, opset=opset)
    feeds = {"q": rng.standard_normal((B, H, L, E)).astype(np.float32),
             "k": rng.standard_normal((B, H, S, E)).astype(np.float32),
             "v": rng.standard_normal((B, H, S, E)).astype(np.float32)}
    return m, feeds


@pytest.mark.parametrize("form", ["torchscript", "dynamo", "eager"])
@pytest.mark.parametrize("masking", ["none", "causal", "mask"])
def test_attention_forms(device, form, masking):
    mask = None
    if masking == "mask":
        mask = np.random.default_rng(3).standard_normal((5, 7)).astype(np.float32)
        mask[1, 2:] = -np.inf  # partly masked rows are fine
    m, feeds = sdpa_model(form, causal=masking == "causal", mask=mask)
    sess = compare(m, feeds, rtol=1e-5, atol=1e-6, device=device)
    assert ops(sess) == ["Attention"], ops(sess)
    scale = sess.graph.nodes[0].attrs["scale"]
    assert scale == pytest.approx(0.25, rel=1e-7)


def test_attention_symbolic_shapes_fuse_per_signature():
    m, feeds = sdpa_model("torchscript", causal=True, symbolic=True)
    sess = Session(m)
    assert "Attention" not in ops(sess) and sess._specializer is not None
    compare(m, feeds, rtol=1e-5, atol=1e-6)
    sess.run(None, feeds)
    (plan,) = sess._specializer.plans()
    assert [p.op_type for p in plan.nodes] == ["Attention"]


@pytest.mark.parametrize("case", ["fully_masked_row", "mask_input", "broadcast_heads"])
def test_attention_conditions(case):
    if case == "fully_masked_row":
        mask = np.zeros((5, 7), np.float32)
        mask[3] = -np.inf  # Softmax gives NaN there, Attention 0: not the same
        m, feeds = sdpa_model("eager", mask=mask)
    elif case == "mask_input":
        m, feeds = sdpa_model("eager", mask=np.zeros((5, 7), np.float32))
        mask = m.graph.initializer.pop()
        m.graph.input.append(vi("mask", TP.FLOAT, [5, 7]))
        feeds["mask"] = numpy_helper.to_array(mask)
    else:  # k and v with one head broadcast by MatMul, not by Attention
        m, feeds = sdpa_model("eager")
        for name in ("k", "v"):
            feeds[name] = feeds[name][:, :1]
            dims = m.graph.input[1 if name == "k" else 2].type.tensor_type.shape.dim
            dims[1].dim_value = 1
    sess = compare(m, feeds, rtol=1e-6, atol=1e-6)
    assert "Attention" not in ops(sess)


# ------------------------------------------------------------------ whole models


def transformer_block(form="torchscript", symbolic=False, size=(2, 5, 16, 2)):
    """A small pre-norm transformer block as the exporters write one: LayerNorm, q/k/v
    projections with head reshapes computed from shapes, SDPA, output projection, residual,
    LayerNorm, MLP with GELU (tanh) and SiLU gate, residual."""
    rng = np.random.default_rng(11)
    B, L, D, H = size
    E = D // H
    inits = []

    def w(name, *shape):
        inits.append(init(name, (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)))
        return name

    nodes = []
    ln = layernorm_nodes(14)
    ren = {n: f"ln1_{n}" for n in ("m", "d", "sq", "v", "ve", "sd", "n", "g", "two", "eps", "gamma", "beta")}
    for node in ln:
        node.input[:] = [ren.get(i, i) for i in node.input]
        node.output[:] = ["h" if o == "y" else ren.get(o, o) for o in node.output]
    nodes += ln
    inits += [init("ln1_gamma", rng.uniform(0.5, 1.5, D).astype(np.float32)),
              init("ln1_beta", rng.standard_normal(D).astype(np.float32) * 0.1)]
    # heads: [B, L, D] -> [B, L, H, E] -> [B, H, L, E], shapes from Shape(h)
    nodes += [oh.make_node("Shape", ["h"], ["hs"]), const("i0", 0, np.int64), const("i1", 1, np.int64),
              oh.make_node("Gather", ["hs", "i0"], ["bd"]), oh.make_node("Gather", ["hs", "i1"], ["ld"]),
              const("z0", [0], np.int64),
              oh.make_node("Unsqueeze", ["bd", "z0"], ["bd1"]), oh.make_node("Unsqueeze", ["ld", "z0"], ["ld1"]),
              const("he", [H, E], np.int64), oh.make_node("Concat", ["bd1", "ld1", "he"], ["hshape"], axis=0)]
    for t in ("q", "k", "v"):
        nodes += [oh.make_node("MatMul", ["h", w(f"w{t}", D, D)], [f"{t}p"]),
                  oh.make_node("Reshape", [f"{t}p", "hshape"], [f"{t}r"]),
                  oh.make_node("Transpose", [f"{t}r"], [t], perm=[0, 2, 1, 3])]
    nodes += sdpa_nodes("torchscript", causal=True)
    for node in nodes[-2:]:
        if node.output[0] == "y":
            node.output[0] = "att"
    nodes += [oh.make_node("Transpose", ["att"], ["att_t"], perm=[0, 2, 1, 3]),
              oh.make_node("Concat", ["bd1", "ld1", "dd"], ["oshape"], axis=0), const("dd", [D], np.int64),
              oh.make_node("Reshape", ["att_t", "oshape"], ["att_r"]),
              oh.make_node("MatMul", ["att_r", w("wo", D, D)], ["o"]),
              oh.make_node("Add", ["x", "o"], ["r1"])]
    # MLP: GELU(tanh) branch times SiLU gate
    nodes += [oh.make_node("MatMul", ["r1", w("w1", D, 2 * D)], ["u"]),
              oh.make_node("MatMul", ["r1", w("w2", D, 2 * D)], ["gate"])]
    gel, _ = gelu_dynamo_tanh()
    for node in gel:
        node.input[:] = ["u" if i == "x" else f"ge_{i}" for i in node.input]
        node.output[:] = ["gu" if o == "y" else f"ge_{o}" for o in node.output]
    nodes += gel
    nodes += [oh.make_node("Sigmoid", ["gate"], ["sg"]), oh.make_node("Mul", ["gate", "sg"], ["silu"]),
              oh.make_node("Mul", ["gu", "silu"], ["mlp"]), oh.make_node("MatMul", ["mlp", w("w3", 2 * D, D)], ["m3"]),
              oh.make_node("Add", ["r1", "m3"], ["y"])]
    # constants first, as exporters place them (graph order must stay topological)
    consts = [n for n in nodes if n.op_type == "Constant"]
    nodes = consts + [n for n in nodes if n.op_type != "Constant"]
    shape = ["B", "L", D] if symbolic else [B, L, D]
    m = model_of(nodes, [vi("x", TP.FLOAT, shape)], [vi("y", TP.FLOAT, shape)], inits, opset=14)
    onnx.checker.check_model(m)
    return m, {"x": rng.standard_normal((B, L, D)).astype(np.float32)}


@pytest.mark.parametrize("symbolic", [False, True])
def test_transformer_block(symbolic):
    m, feeds = transformer_block(symbolic=symbolic)
    sess = compare(m, feeds, rtol=2e-5, atol=2e-5)
    plan = sess.graph
    if symbolic:
        sess.run(None, feeds)
        (plan,) = sess._specializer.plans()
    fused = [p.op_type for p in plan.nodes]
    for op in ("LayerNormalization", "Attention", "Gelu", "Swish"):
        assert op in fused, fused
    assert "Shape" not in fused and len(fused) < len(m.graph.node) // 3


# ------------------------------------------------------------------ real exports


def _real_exports():
    if not REAL_EXPORTS.is_dir():
        return []
    return sorted(REAL_EXPORTS.glob("*.onnx"))


def _feeds_from_spec(spec: dict, rng, dynamic: bool = False) -> dict:
    """Feeds as tests/data/real_exports/README.md describes the JSON: the exported shape,
    or with dynamic=True the other sizes given for the dynamic axes."""
    feeds = {}
    for i in spec["inputs"]:
        shape = list(i["shape"])
        if dynamic:
            for axis, size in (i.get("dynamic_sizes") or {}).items():
                shape[int(axis)] = int(size)
        dtype = np.dtype(i["dtype"])
        if dtype.kind in "iu":
            feeds[i["name"]] = rng.integers(int(i.get("low", 0)), int(i.get("high", 2)), shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[i["name"]] = rng.integers(0, 2, shape).astype(bool)
        else:
            feeds[i["name"]] = rng.standard_normal(shape).astype(dtype)
    return feeds


@pytest.mark.parametrize("path", _real_exports(), ids=lambda p: p.stem)
def test_real_exports(path, rng):
    """Each real export, optimised vs not, outputs and every surviving intermediate; a
    dynamic export also at its other sizes, through a graph specialised per signature.
    Tolerance: rtol 1e-4 and atol 1e-5 times each tensor's largest magnitude (the fused
    kernels round once where the exported forms round per node; deep models carry the
    differences along in absolute terms)."""
    m = onnx.load(str(path))
    spec = json.loads(path.with_suffix(".json").read_text())
    feeds = _feeds_from_spec(spec, rng)
    sess = compare(m, feeds, rtol=1e-4, atol=1e-5, runs=2, base_dir=str(path.parent), scaled=True)
    fired = set(sess.graph.optimized)
    if sess._specializer is not None:
        fired |= {k for p in sess._specializer.plans() for k in p.optimized}
    assert REAL_EXPORT_PASSES.get(path.stem, set()) <= fired, fired
    if any(i.get("dynamic_sizes") for i in spec["inputs"]):
        feeds = _feeds_from_spec(spec, rng, dynamic=True)
        sess = compare(m, feeds, rtol=1e-4, atol=1e-5, runs=2, base_dir=str(path.parent), scaled=True)
        if sess._specializer is not None:  # shape arithmetic left: folded for these sizes too
            sess.run(None, feeds)
            assert sess._specializer.plans()
            assert all(len(p.nodes) < len(sess.graph.nodes) for p in sess._specializer.plans())


# what must fire on the committed real exports (tests/data/real_exports/README.md); the
# others (pre-activation BatchNormalization after Relu, exports already using Attention,
# a UNet without shape arithmetic) are compared only
REAL_EXPORT_PASSES = {"bert_ts17_dynamic": {"shapes", "gelu"}, "gpt2_kv_dy20": {"gelu"}, "llama_dy23": {"silu"}}
