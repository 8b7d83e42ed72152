import tracemalloc

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from gpukernels import Tensor
from gpukernels.errors import InputError, ModelError, NodeError, UnsupportedOperatorError
from gpukernels.kernels import KernelContext, kernel_class, lookup
from gpukernels.runtime import RuntimeContext, Session, run_graph, run_node

F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, inits=(), opset=18, functions=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("local", 1)],
                          functions=list(functions))
    m.ir_version = 10
    return m


def test_registry_picks_newest_version_not_newer_than_opset():
    cls, v = lookup("Softmax", "", 12)
    assert v == 11
    cls, v = lookup("Softmax", "", 13)
    assert v == 13
    with pytest.raises(UnsupportedOperatorError, match="NoSuchOp"):
        lookup("NoSuchOp")


def test_unsupported_operator_names_op_domain_opset():
    node = helper.make_node("Frobnicate", ["x"], ["y"], domain="com.example")
    m = _model([node], [helper.make_tensor_value_info("x", F, [1])], [helper.make_tensor_value_info("y", F, [1])])
    m.opset_import.append(helper.make_opsetid("com.example", 3))
    with pytest.raises(UnsupportedOperatorError, match="com.example::Frobnicate"):
        Session(m)


def test_kernel_context_opset_selects_semantics(rng):
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    old = kernel_class("Softmax")(KernelContext("cpu", opset=11))(x, axis=1).numpy()
    new = kernel_class("Softmax")(KernelContext("cpu", opset=13))(x, axis=1).numpy()
    np.testing.assert_allclose(old.reshape(2, -1).sum(1), 1, rtol=1e-6)  # whole row of 12
    np.testing.assert_allclose(new.sum(1), 1, rtol=1e-6)                 # along axis 1 only


def test_attribute_defaults_and_checks(rng):
    a = rng.standard_normal((3, 4)).astype(np.float32)
    b = rng.standard_normal((4, 5)).astype(np.float32)
    ins = [helper.make_tensor_value_info("a", F, [3, 4]), helper.make_tensor_value_info("b", F, [4, 5])]
    outs = [helper.make_tensor_value_info("y", F, None)]
    y, = Session(_model([helper.make_node("Gemm", ["a", "b"], ["y"])], ins, outs)).run(None, {"a": a, "b": b})
    np.testing.assert_allclose(y, a @ b, rtol=1e-5)
    with pytest.raises(ModelError, match="unknown attribute 'bogus'"):
        Session(_model([helper.make_node("Gemm", ["a", "b"], ["y"], bogus=1)], ins, outs))
    with pytest.raises(ModelError, match="alpha"):
        Session(_model([helper.make_node("Gemm", ["a", "b"], ["y"], alpha="x")], ins, outs))


def test_kernel_failure_names_node_shapes_dtypes(rng):
    ins = [helper.make_tensor_value_info("a", F, [3, 4]), helper.make_tensor_value_info("b", F, [5, 6])]
    m = _model([helper.make_node("MatMul", ["a", "b"], ["y"], name="proj")], ins,
               [helper.make_tensor_value_info("y", F, None)])
    with pytest.raises(NodeError) as err:
        Session(m).run(None, {"a": np.ones((3, 4), np.float32), "b": np.ones((5, 6), np.float32)})
    text = str(err.value)
    assert "proj" in text and "MatMul" in text and "float32[3, 4]" in text and "float32[5, 6]" in text
    assert isinstance(err.value, ValueError)


def test_outer_scope_names_resolve_and_are_not_modified():
    ctx = RuntimeContext("cpu", 18)
    ctx.values["outer"] = Tensor(np.array([10.0], np.float32))
    g = helper.make_graph([helper.make_node("Add", ["x", "outer"], ["y"])], "body",
                          [helper.make_tensor_value_info("x", F, [1])], [helper.make_tensor_value_info("y", F, [1])])
    y, = run_graph(g, [Tensor(np.array([1.0], np.float32))], ctx)
    assert y.numpy()[0] == 11.0
    assert set(ctx.values) == {"outer"}


def test_run_node_directly():
    node = helper.make_node("Sub", ["a", "b"], ["c"])
    c, = run_node(node, [np.array([3.0], np.float32), np.array([1.0], np.float32)])
    assert c.numpy()[0] == 2.0


def test_model_local_function_with_attribute_reference(rng):
    fn = helper.make_function(
        "local", "ScaleAdd", ["x", "y"], ["z"],
        [helper.make_node("Constant", [], ["s"], value_float=0.0),  # replaced below
         helper.make_node("Mul", ["x", "s"], ["xs"]), helper.make_node("Add", ["xs", "y"], ["z"])],
        [helper.make_opsetid("", 18)], attributes=["scale"])
    ref = onnx.AttributeProto()
    ref.name, ref.ref_attr_name, ref.type = "value_float", "scale", onnx.AttributeProto.FLOAT
    del fn.node[0].attribute[:]
    fn.node[0].attribute.append(ref)
    node = helper.make_node("ScaleAdd", ["a", "b"], ["c"], domain="local", scale=3.0)
    ins = [helper.make_tensor_value_info(n, F, [4]) for n in ("a", "b")]
    m = _model([node], ins, [helper.make_tensor_value_info("c", F, [4])], functions=[fn])
    a, b = rng.standard_normal(4).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    c, = Session(m).run(None, {"a": a, "b": b})
    np.testing.assert_allclose(c, 3 * a + b, rtol=1e-6)


def test_schema_function_body_is_expanded_for_operator_without_kernel(monkeypatch, rng):
    # Pretend Softmax had no kernel at opset 13: its schema function body must run instead.
    from gpukernels.kernels import base

    table = base._REGISTRY[("", "Softmax")]
    monkeypatch.setitem(base._REGISTRY, ("", "Softmax"), {v: c for v, c in table.items() if v < 13})
    if not base.has_kernel("ReduceMax") or not base.has_kernel("ReduceSum"):
        pytest.skip("Softmax's function body needs ReduceMax and ReduceSum kernels")
    x = rng.standard_normal((2, 5)).astype(np.float32)
    m = _model([helper.make_node("Softmax", ["x"], ["y"])], [helper.make_tensor_value_info("x", F, [2, 5])],
               [helper.make_tensor_value_info("y", F, None)], opset=13)
    y, = Session(m).run(None, {"x": x})
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(1, keepdims=True), rtol=1e-5)


def test_intermediates_are_released_after_last_use():
    n = 40
    size = 1 << 20  # 4 MiB of float32 per intermediate
    nodes = [helper.make_node("Add", ["x" if i == 0 else f"t{i}", "one"], [f"t{i + 1}"]) for i in range(n)]
    m = _model(nodes, [helper.make_tensor_value_info("x", F, [size])],
               [helper.make_tensor_value_info(f"t{n}", F, [size])],
               inits=[numpy_helper.from_array(np.ones(1, np.float32), "one")])
    sess = Session(m)
    x = np.zeros(size, np.float32)
    tracemalloc.start()
    try:
        out, = sess.run(None, {"x": x})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert out[0] == n
    # one node's input and output plus the result: a handful of buffers, not one per node
    assert peak < 5 * size * 4, f"peak {peak / 2**20:.0f} MiB for {n} nodes of 4 MiB"


def test_external_data_is_loaded_from_model_folder(tmp_path, rng):
    w = rng.standard_normal((64, 64)).astype(np.float32)
    m = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [helper.make_tensor_value_info("x", F, [1, 64])],
               [helper.make_tensor_value_info("y", F, None)], inits=[numpy_helper.from_array(w, "w")])
    path = tmp_path / "sub" / "m.onnx"
    path.parent.mkdir()
    onnx.save(m, str(path), save_as_external_data=True, location="weights.bin", size_threshold=0)
    x = rng.standard_normal((1, 64)).astype(np.float32)
    y, = Session(str(path)).run(None, {"x": x})
    np.testing.assert_allclose(y, x @ w, rtol=1e-5)


def test_missing_and_unknown_inputs_are_reported():
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [helper.make_tensor_value_info("x", F, [1])],
               [helper.make_tensor_value_info("y", F, None)])
    s = Session(m)
    with pytest.raises(InputError, match="missing input"):
        s.run(None, {})
    with pytest.raises(InputError, match="unknown input"):
        s.run(None, {"x": np.ones(1, np.float32), "z": 1})
