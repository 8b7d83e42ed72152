"""Kernels run subgraphs through the SubgraphRunner the runtime installs
(gpukernels.kernels.subgraphs), never by importing the runtime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as oh

import gpukernels
from gpukernels.kernels import KernelContext, load_all, subgraphs
from gpukernels.runtime import RUNNER, Runner, Scope
from gpukernels.tensor import Tensor

load_all()
from gpukernels.kernels.controlflow import If, Loop  # noqa: E402
from gpukernels.kernels.training.gradient import Gradient  # noqa: E402


class CountingRunner(Runner):
    """The runtime's runner, counting what kernels ask of it."""

    def __init__(self):
        self.calls = []

    def prepare(self, graph, ctx):
        self.calls.append(("prepare", graph.name))
        return super().prepare(graph, ctx)

    def run(self, graph, inputs, parent, ctx):
        self.calls.append(("run", graph.name))
        return super().run(graph, inputs, parent, ctx)

    def record(self, plan, inputs, parent):
        self.calls.append(("record", plan.graph.name))
        return super().record(plan, inputs, parent)

    def compile(self, plan, parent, inputs, outputs, records):
        self.calls.append(("compile", plan.graph.name))
        return super().compile(plan, parent, inputs, outputs, records)

    def graph_of(self, scope):
        self.calls.append(("graph_of", None))
        return super().graph_of(scope)


@pytest.fixture
def counting():
    runner = CountingRunner()
    previous = subgraphs.install(runner)
    try:
        yield runner
    finally:
        subgraphs.install(previous)


def _vi(name, et, shape=None):
    return oh.make_tensor_value_info(name, et, shape)


def test_importing_gpukernels_installs_the_runtime_runner():
    assert gpukernels.runtime.RUNNER is RUNNER
    assert subgraphs.runner() is RUNNER
    assert isinstance(RUNNER, subgraphs.SubgraphRunner)


def test_install_takes_only_a_runner():
    with pytest.raises(TypeError, match="SubgraphRunner"):
        subgraphs.install(object())
    assert subgraphs.runner() is RUNNER


def test_signature():
    t = Tensor(np.zeros((2, 3), np.float32))
    assert subgraphs.signature(t) == (t.data_type, (2, 3), np.ndarray)
    assert subgraphs.signature(Tensor()) is None
    assert subgraphs.signature(np.zeros(2)) is None


def test_direct_if_call_runs_its_branch_through_the_runner(counting):
    one = onnx.numpy_helper.from_array(np.array([1.0], np.float32), "v")
    then_g = oh.make_graph([oh.make_node("Constant", [], ["y"], value=one)], "then_g", [],
                           [_vi("y", TP.FLOAT, [1])])
    else_g = oh.make_graph([oh.make_node("Constant", [], ["y"], value=one)], "else_g", [],
                           [_vi("y", TP.FLOAT, [1])])
    y = If(KernelContext("cpu"))(np.array(True), then_branch=then_g, else_branch=else_g)
    np.testing.assert_array_equal(y.numpy(), [1.0])
    assert ("prepare", "then_g") in counting.calls and ("prepare", "else_g") not in counting.calls


def test_direct_loop_call_records_and_compiles_through_the_runner(counting):
    body = oh.make_graph(
        [oh.make_node("Identity", ["c"], ["c_out"]), oh.make_node("Add", ["x", "x"], ["x_out"])], "body",
        [_vi("i", TP.INT64, []), _vi("c", TP.BOOL, []), _vi("x", TP.FLOAT, [2])],
        [_vi("c_out", TP.BOOL, []), _vi("x_out", TP.FLOAT, [2])])
    x = Loop(KernelContext("cpu"))(np.array(5, np.int64), None, np.ones(2, np.float32), body=body)
    np.testing.assert_array_equal(x.numpy(), [32.0, 32.0])
    assert [c for c in counting.calls if c[0] in ("record", "compile")] == [("record", "body"), ("compile", "body")]


def test_gradient_asks_the_runner_for_the_enclosing_graph(counting):
    graph = oh.make_graph([oh.make_node("Mul", ["a", "a"], ["y"])], "g", [_vi("a", TP.FLOAT, [])],
                          [_vi("y", TP.FLOAT, [])])

    class Prepared:
        pass

    prepared = Prepared()
    prepared.graph = graph
    k = Gradient(KernelContext("cpu", {"": 12, "ai.onnx.preview.training": 1}))
    a = Tensor(np.float32(3.0))
    with k.in_scope(Scope({"a": a}, None, prepared)):
        da, = k(a, xs=["a"], y="y")
    assert float(da.numpy()) == 6.0
    assert ("graph_of", None) in counting.calls
