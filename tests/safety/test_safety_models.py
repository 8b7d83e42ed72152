"""Invalid models are refused with an error that names the problem (issue 13.5), and
options are validated (an unknown key suggests the closest name)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from gpukernels import KernelContext
from gpukernels.errors import ModelError, OptionError
from gpukernels.runtime import Session

F = TensorProto.FLOAT


def _vi(name, dims=(2,)):
    return helper.make_tensor_value_info(name, F, list(dims))


def _model(nodes, inputs=("x",), outputs=("y",), inits=(), opset=18):
    graph = helper.make_graph(nodes, "g", [_vi(i) for i in inputs], [_vi(o) for o in outputs], list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)] if opset else [])


def _raises(model, *words):
    with pytest.raises(ModelError) as info:
        Session(model if isinstance(model, bytes) else model.SerializeToString())
    for w in words:
        assert w in str(info.value), str(info.value)


def test_two_nodes_writing_one_name():
    _raises(_model([helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["y"])]),
            "'y'", "assigned once")


def test_a_node_writing_a_graph_input():
    _raises(_model([helper.make_node("Relu", ["x"], ["x"]), helper.make_node("Neg", ["x"], ["y"])]),
            "'x'", "graph input")


def test_duplicate_input_names():
    _raises(_model([helper.make_node("Add", ["x", "x"], ["y"])], inputs=("x", "x")), "'x'", "twice")


def test_duplicate_initializers():
    t = helper.make_tensor("w", F, [2], [1.0, 2.0])
    _raises(_model([helper.make_node("Add", ["x", "w"], ["y"])], inits=(t, t)), "'w'", "twice")


def test_unknown_opset_and_no_opset_import():
    _raises(_model([helper.make_node("Relu", ["x"], ["y"])], opset=9999), "9999", "installed onnx")
    _raises(_model([helper.make_node("Relu", ["x"], ["y"])], opset=None), "no opset_import")


def _with_opsets(opsets):
    return helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [_vi("x")], [_vi("y")]),
                             opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])


@pytest.mark.parametrize("opsets", [[("", 17), ("", 17)], [("", 17), ("ai.onnx", 17)],
                                    [("", 17), ("ai.onnx.ml", 3), ("", 17), ("ai.onnx.ml", 3)]])
def test_an_exact_duplicate_opset_import_is_accepted(opsets):
    """skl2onnx 1.20 lists the default domain twice at one version; onnx.checker and
    onnxruntime accept it, and so do we (the repeat says nothing new)."""
    model = _with_opsets(opsets)
    onnx.checker.check_model(model)
    x = np.array([-1.5, 2.0], np.float32)
    np.testing.assert_array_equal(Session(model.SerializeToString()).run(None, {"x": x})[0], np.maximum(x, 0))


@pytest.mark.parametrize("opsets", [[("", 17), ("", 18)], [("ai.onnx", 18), ("", 17)],
                                    [("ai.onnx.ml", 3), ("", 17), ("ai.onnx.ml", 2)]])
def test_conflicting_opset_versions_are_refused(opsets):
    """Two versions for one domain: which schema the nodes follow is ambiguous."""
    domain = "ai.onnx.ml" if opsets[0][0] == "ai.onnx.ml" else "ai.onnx"
    _raises(_with_opsets(opsets), f"'{domain}' twice", "versions", "ambiguous")


def test_empty_and_garbage_files(tmp_path):
    _raises(b"", "not an ONNX model")
    _raises(b"\xff\xfe garbage \x00\x01", "not an ONNX model")
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    with pytest.raises(ModelError, match="not an ONNX model"):
        Session(str(empty))


def test_wrong_input_counts_name_the_node_and_the_schema():
    _raises(_model([helper.make_node("Add", ["x"], ["y"], name="adder")]), "adder", "1 input", "takes 2")
    _raises(_model([helper.make_node("Relu", ["x", "x"], ["y"])]), "2 input", "takes 1")
    _raises(_model([helper.make_node("Gemm", ["x", ""], ["y"])]), "required input 1", "empty")


def test_non_utf8_op_type():
    data = _model([helper.make_node("Relu", ["x"], ["y"])]).SerializeToString().replace(b"Relu", b"R\xffl\xfe")
    _raises(data, "not valid UTF-8")


@pytest.mark.parametrize("part", [b"fun.domain", b"callee"])
def test_non_utf8_function_domain_or_name(part):
    """A model-local function whose domain or name is not UTF-8 (protobuf hands it back
    as bytes) is refused as such, not met by a TypeError when the calls are ordered."""
    body = helper.make_node("Relu", ["a"], ["b"])
    fns = [helper.make_function("fun.domain", name, ["a"], ["b"], [body], [helper.make_opsetid("", 17)])
           for name in ("callee", "other")]
    model = helper.make_model(helper.make_graph([helper.make_node("callee", ["x"], ["y"], domain="fun.domain")],
                                                "g", [_vi("x")], [_vi("y")]),
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("fun.domain", 1)],
                              functions=fns)
    data = model.SerializeToString()
    at = data.rfind(part)  # the last one: inside the functions (the graph's node comes first)
    _raises(data[:at + 2] + b"\xff" + data[at + 3:], "function's", "not valid UTF-8")


def test_deeply_nested_ifs_are_refused_without_recursion_error():
    """1,000 Ifs each inside the then_branch of the one before (built in place: protobuf
    itself refuses to parse such depth from bytes, a ModelProto can still hold it)."""
    model = helper.make_model(helper.make_graph([], "g", [helper.make_tensor_value_info(
        "c", TensorProto.BOOL, []), _vi("x")], [_vi("o0")]), opset_imports=[helper.make_opsetid("", 18)])
    graph = model.graph
    for depth in range(1000):
        node = graph.node.add(op_type="If", input=["c"], output=[f"o{depth}"])
        else_attr = node.attribute.add(name="else_branch", type=onnx.AttributeProto.GRAPH)
        else_attr.g.CopyFrom(helper.make_graph([helper.make_node("Identity", ["x"], [f"e{depth}"])],
                                               "leaf", [], [_vi(f"e{depth}")]))
        then_attr = node.attribute.add(name="then_branch", type=onnx.AttributeProto.GRAPH)
        graph = then_attr.g
        graph.name = f"b{depth}"
        graph.output.append(_vi(f"o{depth + 1}"))
    graph.node.append(helper.make_node("Identity", ["x"], ["o1000"]))
    with pytest.raises(ModelError, match="nested more than"):
        Session(model)
    with pytest.raises(ModelError, match="not an ONNX model|nested"):
        Session(model.SerializeToString())


def test_bad_initializer_data_names_the_tensor():
    bad_type = helper.make_tensor("w", F, [2], [1.0, 2.0])
    bad_type.data_type = 77
    _raises(_model([helper.make_node("Add", ["x", "w"], ["y"])], inits=(bad_type,)), "'w'", "77")
    short = TensorProto(name="v", data_type=F, dims=[3], float_data=[1.0, 2.0])
    _raises(_model([helper.make_node("Add", ["x", "v"], ["y"])], inits=(short,)), "'v'", "[3]")


def test_valid_models_still_run():
    s = Session(_model([helper.make_node("Relu", ["x"], ["y"])]).SerializeToString())
    np.testing.assert_array_equal(s.run(None, {"x": np.array([-1, 2], np.float32)})[0], [0, 2])


def test_unknown_option_suggests_the_closest():
    with pytest.raises(OptionError, match="'fold_constant'.*did you mean 'fold_constants'"):
        KernelContext("cpu", options={"fold_constant": False})
    with pytest.raises(OptionError, match="max_tensor_byte"):
        Session(_model([helper.make_node("Relu", ["x"], ["y"])]), options={"max_tensor_byte": 10})
