"""Elements of official cases that the spec leaves undefined are not compared; the
others still are (gpukernels/conformance/undefined.py)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from gpukernels.conformance.undefined import defined_elements, mask_undefined


def _cast_model(to):
    node = helper.make_node("Cast", ["x"], ["y"], to=to)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5])],
                              [helper.make_tensor_value_info("y", to, [5])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 25)])


def test_out_of_range_float_to_int4_is_not_compared_in_range_is():
    x = np.array([-9.0, -8.0, 7.5, 8.0, np.nan], np.float32)
    expected = [np.array([0, -8, 7, 0, 0], np.int8)]
    masks = defined_elements(_cast_model(TensorProto.INT4), [x], expected)
    assert masks[0].tolist() == [False, True, True, False, False]
    # wrapped values at undefined positions are accepted
    _, out = mask_undefined(expected, [np.array([7, -8, 7, -8, 0], np.int8)], masks)
    np.testing.assert_array_equal(out[0], expected[0])
    # a wrong value at a defined position still differs
    _, out = mask_undefined(expected, [np.array([7, -7, 7, -8, 0], np.int8)], masks)
    assert out[0][1] == -7


@pytest.mark.parametrize("to", [TensorProto.FLOAT16, TensorProto.BOOL])
def test_other_targets_compare_every_element(to):
    x = np.array([1e9, -3.0, 0.5, 2.0, 7.0], np.float32)
    assert defined_elements(_cast_model(to), [x], [np.zeros(5)]) == [None]
