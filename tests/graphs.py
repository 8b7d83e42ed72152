"""Small helpers that build ONNX models for the runtime tests."""

from __future__ import annotations

import numpy as np
from onnx import helper as oh
from onnx import numpy_helper


def vi(name, et, shape=None):
    return oh.make_tensor_value_info(name, et, shape)


def _name_nodes(graph):
    """Stable node names (unnamed nodes are named by object id, which differs between
    sessions, and error messages are compared)."""
    for k, node in enumerate(graph.node):
        if not node.name:
            node.name = f"{graph.name}_{node.op_type}_{k}"
        for attr in node.attribute:
            if attr.type == attr.GRAPH:
                _name_nodes(attr.g)


def model_of(nodes, inputs, outputs, initializers=(), opset=17):
    graph = oh.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    _name_nodes(graph)
    m = oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def init(name, value):
    return numpy_helper.from_array(np.asarray(value), name)


def host_array(array):
    """A NumPy view or copy of a host or device array."""
    return array.get() if hasattr(array, "get") else np.asarray(array)


def assert_same_bits(got, want, where=""):
    """got and want have the same dtype, shape and bytes."""
    g, w = host_array(got), host_array(want)
    assert g.dtype == w.dtype and g.shape == w.shape, f"{where}: {g.dtype}{g.shape} != {w.dtype}{w.shape}"
    assert g.tobytes() == w.tobytes(), f"{where}: values differ\n{g}\n{w}"
