"""Values fed to a Session are checked against the graph's declared inputs (issue 13.4)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper

from gpukernels.errors import InputError
from gpukernels.runtime import Session

F = TensorProto.FLOAT


def _model(elem_type, dims, op="Identity"):
    graph = helper.make_graph([helper.make_node(op, ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", elem_type, dims)],
                              [helper.make_tensor_value_info("y", elem_type, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


@pytest.mark.parametrize("elem_type, dims, given, words", [
    (F, [2, 3], np.zeros((2, 3), np.int64), ["'x'", "float32[2, 3]", "int64[2, 3]"]),
    (F, [2, 3], np.zeros((2, 3), np.float64), ["'x'", "float32[2, 3]", "float64"]),
    (TensorProto.BFLOAT16, [4], np.zeros(4, np.float32), ["'x'", "bfloat16[4]", "float32[4]"]),
    (F, [2, 3], np.zeros(6, np.float32), ["'x'", "rank 2", "rank 1"]),
    (F, [2, 3], np.zeros((2, 4), np.float32), ["'x'", "float32[2, 3]", "dimension 1 must be 3"]),
    (F, ["batch", 3], np.zeros((5, 2), np.float32), ["'x'", "float32[batch, 3]", "dimension 1 must be 3"]),
    (TensorProto.INT64, [2], [1.5, 2.0], ["'x'", "int64[2]", "do not convert exactly"]),
])
def test_mismatched_inputs_are_refused_with_names(elem_type, dims, given, words):
    session = Session(_model(elem_type, dims))
    with pytest.raises(InputError) as info:
        session.run(None, {"x": given})
    for w in words:
        assert w in str(info.value)


def test_symbolic_and_unknown_dimensions_accept_any_size():
    session = Session(_model(F, ["batch", None, 3]))
    for shape in [(1, 1, 3), (7, 0, 3), (2, 9, 3)]:
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        np.testing.assert_array_equal(session.run(None, {"x": x})[0], x)


def test_exact_types_and_plain_python_values_are_accepted():
    session = Session(_model(TensorProto.INT64, [3]))
    np.testing.assert_array_equal(session.run(None, {"x": [1, 2, 3]})[0], np.array([1, 2, 3]))
    bf = Session(_model(TensorProto.BFLOAT16, [2]))
    x = np.array([1.5, -2.0], ml_dtypes.bfloat16)
    assert bf.run(None, {"x": x})[0].dtype == ml_dtypes.bfloat16
    strings = Session(_model(TensorProto.STRING, [2]))
    assert list(strings.run(None, {"x": np.array(["a", "b"], dtype=object)})[0]) == ["a", "b"]


def test_missing_and_unknown_input_names():
    session = Session(_model(F, [1]))
    with pytest.raises(InputError, match="missing input"):
        session.run(None, {})
    with pytest.raises(InputError, match="unknown input"):
        session.run(None, {"x": np.zeros(1, np.float32), "z": np.zeros(1)})


def test_cli_inputs_are_checked_too(tmp_path, capsys):
    from gpukernels.cli import main

    model = tmp_path / "m.onnx"
    model.write_bytes(_model(F, [2, 3]).SerializeToString())
    np.savez(tmp_path / "in.npz", x=np.zeros((2, 3), np.int64))
    code = main(["run", str(model), "--inputs", str(tmp_path / "in.npz")])
    err = capsys.readouterr().err
    assert code != 0 and "float32[2, 3]" in err and "int64" in err and "Traceback" not in err
