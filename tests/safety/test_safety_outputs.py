"""Returned arrays never share memory with the session's constants (issue 13.2):
writing into every output a run returns leaves the next run unchanged."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from gpukernels.runtime import Session

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _float_data_tensor(name, values):
    """An initializer stored in float_data (decoded into a writable array), not raw_data."""
    values = np.asarray(values, np.float32)
    return helper.make_tensor(name, F, values.shape, values.ravel().tolist(), raw=False)


def _model(nodes, outputs, inits, inputs=()):
    graph = helper.make_graph(nodes, "aliasing", list(inputs),
                              [helper.make_tensor_value_info(o, F, None) for o in outputs], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


W = np.arange(12, dtype=np.float32).reshape(3, 4) + 1.0


@pytest.mark.parametrize("compile_graph", [True, False])
@pytest.mark.parametrize("fold", [True, False])
def test_writing_into_outputs_leaves_later_runs_unchanged(compile_graph, fold):
    shape = numpy_helper.from_array(np.array([4, 3], np.int64), "shape")
    starts = numpy_helper.from_array(np.array([1], np.int64), "starts")
    ends = numpy_helper.from_array(np.array([3], np.int64), "ends")
    nodes = [
        helper.make_node("Identity", ["w"], ["y_identity"]),
        helper.make_node("Reshape", ["w", "shape"], ["y_reshape"]),
        helper.make_node("Slice", ["w", "starts", "ends"], ["y_slice"]),
        helper.make_node("Flatten", ["w"], ["y_flatten"]),
        helper.make_node("Squeeze", ["w"], ["y_squeeze"]),
        helper.make_node("Constant", [], ["y_constant"], value=_float_data_tensor("c", W)),
        helper.make_node("Add", ["x", "w"], ["y_add"]),
    ]
    outputs = ["w", "y_identity", "y_reshape", "y_slice", "y_flatten", "y_squeeze", "y_constant", "y_add"]
    model = _model(nodes, outputs, [_float_data_tensor("w", W), shape, starts, ends],
                   [helper.make_tensor_value_info("x", F, [3, 4])])
    session = Session(model, options={"compile_graph": compile_graph, "fold_constants": fold})
    x = np.ones((3, 4), np.float32)
    for _ in range(3):  # the third run goes through the compiled plan when it is on
        first = session.run(None, {"x": x})
        for out in first:
            assert out.flags.writeable
            out /= 255.0
            out[...] = -7.0
    again = session.run(None, {"x": x})
    np.testing.assert_array_equal(again[0], W)
    np.testing.assert_array_equal(again[1], W)
    np.testing.assert_array_equal(again[2], W.reshape(4, 3))
    np.testing.assert_array_equal(again[3], W[1:3])
    np.testing.assert_array_equal(again[4], W.reshape(3, 4))
    np.testing.assert_array_equal(again[6], W)
    np.testing.assert_array_equal(again[7], W + 1.0)


def test_constants_are_read_only_inside_the_session():
    model = _model([helper.make_node("Identity", ["w"], ["y"])], ["y"], [_float_data_tensor("w", W)])
    session = Session(model)
    w = session.graph.constants["w"].array
    assert not w.flags.writeable
    with pytest.raises(ValueError):
        w[0, 0] = 5.0


def test_if_branch_returning_its_initializer_is_copied():
    branch = helper.make_graph([helper.make_node("Identity", ["k"], ["out"])], "branch", [],
                               [helper.make_tensor_value_info("out", F, [3, 4])], [_float_data_tensor("k", W)])
    node = helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch)
    model = _model([node], ["y"], [], [helper.make_tensor_value_info("c", TensorProto.BOOL, [])])
    session = Session(model)
    y = session.run(None, {"c": np.array(True)})[0]
    y[...] = 0.0
    np.testing.assert_array_equal(session.run(None, {"c": np.array(True)})[0], W)


def test_run_values_never_hand_out_constant_memory(device):
    model = _model([helper.make_node("Identity", ["w"], ["y"]),
                    helper.make_node("Flatten", ["w"], ["z"])], ["y", "z"], [_float_data_tensor("w", W)])
    session = Session(model, device=device, options={"compile_graph": False})
    for out in session.run_values({}):
        out.array[...] = -1.0  # the caller's own memory: allowed, and changes nothing else
    again = session.run_values({})
    np.testing.assert_array_equal(again[0].numpy(), W)
    np.testing.assert_array_equal(again[1].numpy(), W)
