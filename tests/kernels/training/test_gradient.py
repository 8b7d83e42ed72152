"""ai.onnx.preview.training Gradient: reverse-mode results against central finite
differences of a float64 NumPy forward pass."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from gpukernels.errors import KernelInputError
from gpukernels.kernels import KernelContext
from gpukernels.kernels.training.gradient import Gradient, differentiate, forward_slice
from gpukernels.runtime import run_subgraph
from gpukernels.runtime.graph import Scope
from gpukernels.tensor import Tensor

NUMPY_OPS = {
    "Add": lambda n, a, b: a + b, "Sub": lambda n, a, b: a - b, "Mul": lambda n, a, b: a * b,
    "Div": lambda n, a, b: a / b, "MatMul": lambda n, a, b: a @ b, "Neg": lambda n, a: -a,
    "Relu": lambda n, a: np.maximum(a, 0), "Sigmoid": lambda n, a: 1 / (1 + np.exp(-a)),
    "Tanh": lambda n, a: np.tanh(a), "Exp": lambda n, a: np.exp(a), "Log": lambda n, a: np.log(a),
    "Sqrt": lambda n, a: np.sqrt(a), "Abs": lambda n, a: np.abs(a), "Identity": lambda n, a: a,
    "Gemm": lambda n, a, b, c=None: _gemm(n, a, b, c),
}


def _gemm(node, a, b, c):
    at = {x.name: helper.get_attribute_value(x) for x in node.attribute}
    a = a.T if at.get("transA", 0) else a
    b = b.T if at.get("transB", 0) else b
    y = at.get("alpha", 1.0) * (a @ b)
    return y if c is None else y + at.get("beta", 1.0) * c


def numpy_forward(graph, values):
    env = dict(values)
    for init in graph.initializer:
        env.setdefault(init.name, onnx.numpy_helper.to_array(init).astype(np.float64))
    for node in graph.node:
        env[node.output[0]] = NUMPY_OPS[node.op_type](node, *[env[i] for i in node.input])
    return env


def finite_difference(graph, values, x, y, eps=1e-6):
    base = {k: v.astype(np.float64) for k, v in values.items()}
    grad = np.zeros_like(base[x])
    for idx in np.ndindex(*base[x].shape):
        plus, minus = dict(base), dict(base)
        plus[x] = base[x].copy()
        minus[x] = base[x].copy()
        plus[x][idx] += eps
        minus[x][idx] -= eps
        grad[idx] = (numpy_forward(graph, plus)[y].sum() - numpy_forward(graph, minus)[y].sum()) / (2 * eps)
    return grad


def vi(name, shape=None):
    return helper.make_tensor_value_info(name, TensorProto.DOUBLE, shape)


def _run_forward(ctx):
    return lambda g, inputs: run_subgraph(g, inputs, None, ctx)


CASES = {
    "add_mul": ([helper.make_node("Add", ["a", "b"], ["c"]), helper.make_node("Mul", ["c", "a"], ["d"])],
                {"a": (3, 4), "b": (4,)}, "d"),
    "sub_div_neg": ([helper.make_node("Sub", ["a", "b"], ["c"]), helper.make_node("Div", ["c", "b"], ["d"]),
                     helper.make_node("Neg", ["d"], ["e"])], {"a": (2, 3), "b": (2, 1)}, "e"),
    "mlp": ([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "bias"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["o"]),
             helper.make_node("Sigmoid", ["o"], ["s"]), helper.make_node("Tanh", ["s"], ["t"])],
            {"x": (5, 3), "w": (3, 4), "bias": (4,), "w2": (4, 2)}, "t"),
    "batched_matmul_vec": ([helper.make_node("MatMul", ["a", "v"], ["m"]), helper.make_node("Exp", ["m"], ["e"])],
                           {"a": (2, 3, 4), "v": (4,)}, "e"),
    "gemm": ([helper.make_node("Gemm", ["a", "b", "c"], ["g"], transA=1, alpha=0.5, beta=2.0),
              helper.make_node("Abs", ["g"], ["y"])], {"a": (3, 2), "b": (3, 4), "c": (4,)}, "y"),
    "log_sqrt": ([helper.make_node("Sqrt", ["a"], ["s"]), helper.make_node("Log", ["s"], ["l"]),
                  helper.make_node("Identity", ["l"], ["y"])], {"a": (4,)}, "y"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_differentiate_matches_finite_differences(device, rng, case):
    nodes, shapes, y = CASES[case]
    graph = helper.make_graph(nodes, case, [vi(n) for n in shapes], [vi(y)])
    values = {n: rng.uniform(0.5, 1.5, s) * rng.choice([-1, 1], s) if case not in ("log_sqrt",) else
              rng.uniform(0.5, 1.5, s) for n, s in shapes.items()}
    xs = list(shapes)
    ctx = KernelContext(device, {"": 17})
    grads = differentiate(ctx.xp, graph, xs, [], y, {k: Tensor(v).to(device) for k, v in values.items()},
                          _run_forward(ctx), lambda n: (_ for _ in ()).throw(KeyError(n)))
    for x, g in zip(xs, grads):
        g = g.get() if hasattr(g, "get") else g
        np.testing.assert_allclose(g, finite_difference(graph, values, x, y), rtol=1e-5, atol=1e-6)


def test_zs_intermediates_and_outer_values(device, rng):
    # y = (w * h) + k where h = exp(z) is given through zs... and k is read from the scope
    nodes = [helper.make_node("Exp", ["z"], ["h"]), helper.make_node("Mul", ["w", "h"], ["m"]),
             helper.make_node("Add", ["m", "k"], ["y"])]
    graph = helper.make_graph(nodes, "g", [vi("w"), vi("z")], [vi("y")], [helper.make_tensor("k", TensorProto.DOUBLE,
                                                                                             [3], [1.0, 2.0, 3.0])])
    ctx = KernelContext(device, {"": 17})
    w, z = rng.standard_normal(3), rng.standard_normal(3)
    k_val = Tensor(np.array([1.0, 2.0, 3.0]))
    ws = {"w": Tensor(w).to(device), "z": Tensor(z).to(device)}
    gw, = differentiate(ctx.xp, graph, ["w"], ["z"], "y", ws, _run_forward(ctx), lambda n: k_val.to(device))
    np.testing.assert_allclose(np.asarray(gw.get() if hasattr(gw, "get") else gw), np.exp(z))
    nodes_, external = forward_slice(graph, ["w"], ["z"], "y")
    assert [n.op_type for n in nodes_] == ["Exp", "Mul", "Add"] and external == ["k"]
    # differentiate with respect to an intermediate: the slice stops at h
    h = np.exp(z)
    gh, = differentiate(ctx.xp, graph, ["h"], ["w"], "y", {"h": Tensor(h).to(device), "w": Tensor(w).to(device)},
                        _run_forward(ctx), lambda n: k_val.to(device))
    np.testing.assert_allclose(np.asarray(gh.get() if hasattr(gh, "get") else gh), w)


def _kernel_in_scope(device, graph, values):
    class Prepared:  # what gpukernels.runtime.graph_of returns: an object with .graph
        pass

    prepared = Prepared()
    prepared.graph = graph
    k = Gradient(KernelContext(device, {"": 12, "ai.onnx.preview.training": 1}))
    scope = Scope(dict(values), None, prepared)

    def call(*args, **attrs):
        with k.in_scope(scope):
            return k(*args, **attrs)

    call.kernel = k
    return call


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_gradient_kernel_official_add_and_mul(device, dtype):
    nodes = [helper.make_node("Add", ["a", "b"], ["c"]), helper.make_node("Mul", ["c", "a"], ["d"])]
    graph = helper.make_graph(nodes, "g", [vi("a", []), vi("b", [])], [vi("d", [])])
    a, b = Tensor(np.array(1.0, dtype)), Tensor(np.array(2.0, dtype))
    k = _kernel_in_scope(device, graph, {"a": a, "b": b})
    da, db = k(a, b, xs=["a", "b"], y="d")
    assert da.numpy().dtype == dtype and da.numpy().shape == ()
    assert float(da.numpy()) == 4.0 and float(db.numpy()) == 1.0
    # at other values than the graph's own (the spec allows feeding any point)
    da, db = k(Tensor(np.array(3.0, dtype)), Tensor(np.array(-1.0, dtype)), xs=["a", "b"], y="d")
    assert float(da.numpy()) == 5.0 and float(db.numpy()) == 3.0
    dc, = k(a, b, xs=["a"], zs=["b"], y="c")
    assert float(dc.numpy()) == 1.0


def test_gradient_kernel_errors(device):
    nodes = [helper.make_node("Add", ["a", "b"], ["c"]), helper.make_node("Cos", ["c"], ["d"])]
    graph = helper.make_graph(nodes, "g", [vi("a", []), vi("b", [])], [vi("d", [])])
    a = Tensor(np.array(1.0))
    k = _kernel_in_scope(device, graph, {"a": a, "b": a})
    with pytest.raises(KernelInputError, match="Gradient.*no gradient rule.*Cos"):
        k(a, a, xs=["a", "b"], y="d")
    with pytest.raises(KernelInputError, match="Gradient.*expected 2 inputs"):
        k(a, xs=["a", "b"], y="c")
    with pytest.raises(KernelInputError, match="Gradient.*not available"):
        _kernel_in_scope(device, graph, {"a": a})(a, xs=["a"], y="c")  # b: not in xs/zs nor in the scope
    with pytest.raises(KernelInputError, match="Gradient needs the enclosing graph"):
        k.kernel(a, a, xs=["a", "b"], y="c")  # a direct call outside any scope
    # an x y does not depend on gets zeros
    k = _kernel_in_scope(device, graph, {"a": a, "b": a})
    da, db = k(a, a, xs=["a", "b"], y="c")
    assert float(db.numpy()) == 1.0


def test_gradient_through_the_backend():
    import gpukernels.backend as backend

    nodes = [helper.make_node("Add", ["a", "b"], ["c"]), helper.make_node("Mul", ["c", "a"], ["d"]),
             helper.make_node("Gradient", ["a", "b"], ["dd_da", "dd_db"], domain="ai.onnx.preview.training",
                              xs=["a", "b"], y="d")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, 1, []) for n in "ab"],
                              [helper.make_tensor_value_info(n, 1, []) for n in ("d", "dd_da", "dd_db")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12),
                                                    helper.make_opsetid("ai.onnx.preview.training", 1)])
    out = backend.run_model(model, [np.array(1.0, np.float32), np.array(2.0, np.float32)])
    assert float(out[1]) == 4.0 and float(out[2]) == 1.0


def test_gradient_reads_graph_inputs_and_initializers_through_the_backend(rng):
    import gpukernels.backend as backend

    # y = a * exp(k) * w: k is a graph input and w an initializer, both used before Gradient runs
    nodes = [helper.make_node("Exp", ["k"], ["ek"]), helper.make_node("Mul", ["a", "ek"], ["m"]),
             helper.make_node("Mul", ["m", "w"], ["y"]),
             helper.make_node("Gradient", ["a"], ["dy_da"], domain="ai.onnx.preview.training", xs=["a"], y="y")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, 1, [3]) for n in "ak"],
                              [helper.make_tensor_value_info(n, 1, [3]) for n in ("y", "dy_da")],
                              [helper.make_tensor("w", 1, [3], [1.0, -2.0, 0.5])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("ai.onnx.preview.training", 1)])
    a, k = rng.standard_normal(3).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    out = backend.run_model(model, [a, k])
    np.testing.assert_allclose(out[1], np.exp(k) * np.array([1.0, -2.0, 0.5]), rtol=1e-6)


def test_scope_reads_lists_the_slice_inputs():
    nodes = [helper.make_node("Exp", ["k"], ["ek"]), helper.make_node("Mul", ["a", "ek"], ["m"]),
             helper.make_node("Mul", ["m", "w"], ["y"])]
    grad = helper.make_node("Gradient", ["a"], ["g"], domain="ai.onnx.preview.training", xs=["a"], y="y")
    graph = helper.make_graph(nodes + [grad], "g", [vi("a"), vi("k")], [vi("y")])
    assert Gradient.scope_reads(grad, graph) == ["k", "w"]
