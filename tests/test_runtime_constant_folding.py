"""Constant folding when a graph is prepared (runtime.graph.PreparedGraph._fold_constants):
nodes computing tensors from constants run once and leave the per-run node list; results
must equal the unfolded runs to the bit, and what must not fold (random draws, graph
outputs, nodes that fail or warn, folding turned off) must keep running every time."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper as oh

from gpukernels.errors import GpuKernelsError
from gpukernels.kernels.math.unary import Log
from gpukernels.runtime import Session

from tests.graphs import init, model_of, vi


def weights_model():
    """Weights built by ConstantOfShape + Mul of an initializer (as the light ONNX models
    do), then y = x @ w + c, with a Constant node and a Cast of it."""
    nodes = [
        oh.make_node("ConstantOfShape", ["wshape"], ["ones"],
                     value=oh.make_tensor("v", TP.FLOAT, [1], [0.5])),
        oh.make_node("Mul", ["ones", "scale"], ["w"]),
        oh.make_node("Constant", [], ["c64"], value=oh.make_tensor("c", TP.DOUBLE, [3], [1.0, -2.0, 3.5])),
        oh.make_node("Cast", ["c64"], ["c"], to=TP.FLOAT),
        oh.make_node("MatMul", ["x", "w"], ["xw"]),
        oh.make_node("Add", ["xw", "c"], ["y"]),
    ]
    inits = [init("wshape", np.array([4, 3], np.int64)),
             init("scale", np.arange(12, dtype=np.float32).reshape(4, 3) - 5)]
    return model_of(nodes, [vi("x", TP.FLOAT, [2, 4])], [vi("y", TP.FLOAT, [2, 3])], inits)


def test_constant_chains_fold_and_results_match(rng):
    m = weights_model()
    folded = Session(m)
    plain = Session(m, options={"fold_constants": False})
    assert [p.op_type for p in folded.graph.folded] == ["ConstantOfShape", "Mul", "Constant", "Cast"]
    assert [p.op_type for p in folded.graph.nodes] == ["MatMul", "Add"]
    assert len(plain.graph.nodes) == 6 and not plain.graph.folded
    for _ in range(3):  # first (general) run and compiled runs
        x = rng.standard_normal((2, 4)).astype(np.float32)
        a, b = folded.run(None, {"x": x})[0], plain.run(None, {"x": x})[0]
        np.testing.assert_array_equal(a, b)
        w = 0.5 * (np.arange(12, dtype=np.float32).reshape(4, 3) - 5)
        np.testing.assert_allclose(a, x.astype(np.float64) @ w + [1.0, -2.0, 3.5], rtol=1e-6, atol=1e-6)


def test_random_operators_and_dropout_stay_per_run():
    nodes = [oh.make_node("RandomNormal", [], ["r"], shape=[64], dtype=TP.FLOAT),
             oh.make_node("Add", ["r", "x"], ["y"])]
    m = model_of(nodes, [vi("x", TP.FLOAT, [64])], [vi("y", TP.FLOAT, [64])])
    s = Session(m)
    assert not s.graph.folded
    x = np.zeros(64, np.float32)
    assert not np.array_equal(s.run(None, {"x": x})[0], s.run(None, {"x": x})[0])

    nodes = [oh.make_node("Dropout", ["c", "ratio", "train"], ["d"]), oh.make_node("Add", ["d", "x"], ["y"])]
    inits = [init("c", np.ones(64, np.float32)), init("ratio", np.array(0.5, np.float32)),
             init("train", np.array(True))]
    s = Session(model_of(nodes, [vi("x", TP.FLOAT, [64])], [vi("y", TP.FLOAT, [64])], inits, opset=13))
    assert not s.graph.folded
    assert not np.array_equal(s.run(None, {"x": x})[0], s.run(None, {"x": x})[0])


def test_graph_outputs_are_not_folded_and_stay_fresh():
    nodes = [oh.make_node("ConstantOfShape", ["shape"], ["z"], value=oh.make_tensor("v", TP.FLOAT, [1], [2.0])),
             oh.make_node("Identity", ["x"], ["y"])]
    m = model_of(nodes, [vi("x", TP.FLOAT, [2])], [vi("z", TP.FLOAT, [3]), vi("y", TP.FLOAT, [2])],
                 [init("shape", np.array([3], np.int64))])
    s = Session(m)
    assert not s.graph.folded
    z = s.run(None, {"x": np.ones(2, np.float32)})[0]
    z[:] = -1  # the caller owns what a run returns
    np.testing.assert_array_equal(s.run(None, {"x": np.ones(2, np.float32)})[0], [2.0, 2.0, 2.0])


def test_failing_constant_node_fails_at_run_time_with_its_context():
    nodes = [oh.make_node("Reshape", ["c", "bad_shape"], ["r"], name="bad_reshape"),
             oh.make_node("Add", ["r", "x"], ["y"])]
    inits = [init("c", np.arange(6, dtype=np.float32)), init("bad_shape", np.array([4, 2], np.int64))]
    s = Session(model_of(nodes, [vi("x", TP.FLOAT, [4, 2])], [vi("y", TP.FLOAT, [4, 2])], inits))
    assert not s.graph.folded
    with pytest.raises(GpuKernelsError, match="bad_reshape"):
        s.run(None, {"x": np.ones((4, 2), np.float32)})


class WarningLog(Log):
    """Log that warns about negative inputs (none of the shipped kernels warns)."""

    def __call__(self, input):
        if (np.asarray(input) < 0).any():
            warnings.warn("negative input to Log", RuntimeWarning)
        return super().__call__(input)


def test_warning_constant_node_warns_at_run_time():
    nodes = [oh.make_node("Log", ["c"], ["l"]), oh.make_node("Add", ["l", "x"], ["y"])]
    m = model_of(nodes, [vi("x", TP.FLOAT, [2])], [vi("y", TP.FLOAT, [2])],
                 [init("c", np.array([-1.0, 1.0], np.float32))])
    s = Session(m, options={"kernel_overrides": {"Log": WarningLog}})
    assert not s.graph.folded
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = s.run(None, {"x": np.zeros(2, np.float32)})[0]
    assert [str(w.message) for w in caught] == ["negative input to Log"]
    assert np.isnan(y[0]) and y[1] == 0
    assert [p.op_type for p in Session(m).graph.folded] == ["Log"]  # the shipped Log is quiet


def test_loop_body_constants_fold(rng):
    body = oh.make_graph(
        [oh.make_node("Constant", [], ["step"], value=oh.make_tensor("s", TP.FLOAT, [2], [1.0, 2.0])),
         oh.make_node("Mul", ["step", "two"], ["step2"]),
         oh.make_node("Add", ["acc_in", "step2"], ["acc_out"]),
         oh.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [vi("i", TP.INT64, []), vi("cond_in", TP.BOOL, []), vi("acc_in", TP.FLOAT, [2])],
        [vi("cond_out", TP.BOOL, []), vi("acc_out", TP.FLOAT, [2])],
        initializer=[init("two", np.array([2.0, 2.0], np.float32))])
    nodes = [oh.make_node("Loop", ["n", "", "x"], ["y"], body=body)]
    m = model_of(nodes, [vi("x", TP.FLOAT, [2])], [vi("y", TP.FLOAT, [2])], [init("n", np.array(5, np.int64))])
    for options in ({}, {"fold_constants": False}):
        x = rng.standard_normal(2).astype(np.float32)
        y = Session(m, options=options).run(None, {"x": x})[0]
        np.testing.assert_allclose(y, x + 5 * np.array([2.0, 4.0], np.float32), rtol=1e-6)


def test_parity_all_nodes_sees_folded_nodes():
    from gpukernels import parity

    report = parity.compare(weights_model(), devices=["cpu"], against="reference", all_nodes=True)
    names = {v.name for side in report.sides for v in side.values}
    assert {"ones", "w", "c64", "c", "xw", "y"} <= names and report.passed


def test_profile_counts_folded_nodes():
    from gpukernels.profiling import format_profile, profile

    report = profile(weights_model(), repeat=2)
    assert report.folded == 4 and set(report.operators) == {"MatMul", "Add"}
    assert "4 constant node(s) folded" in format_profile(report)
