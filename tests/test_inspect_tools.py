"""parity, profile and run --dump, end to end on small models."""

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from gpukernels.cli import main as cli_main
from gpukernels.kernels import kernel_class
from gpukernels.parity import Side, compare, diff_values


def _mlp(path=None):
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.standard_normal((16, 4)).astype(np.float32), "w2"),
             numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b1")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
             helper.make_node("Add", ["h", "b1"], ["hb"], name="bias1"),
             helper.make_node("Relu", ["hb"], ["a"], name="act"),
             helper.make_node("MatMul", ["a", "w2"], ["logits"], name="fc2"),
             helper.make_node("Softmax", ["logits"], ["probs"], name="softmax")]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
                          [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["n", 4])], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 9
    if path:
        onnx.save(m, str(path))
    return m


class _FaultyRelu(kernel_class("Relu")):
    """Relu that leaks a little of the negative part: a plausible kernel bug."""

    def compute(self, xp, x):
        return xp.where(x > 0, x, 0.01 * x)


def test_parity_finds_exactly_the_faulty_node():
    report = compare(_mlp(), sides=[Side("cpu"), Side("cpu-faulty", options={"kernel_overrides": {"Relu": _FaultyRelu}})],
                     all_nodes=True)
    assert not report.passed
    side, = report.sides
    assert side.first_divergence.node == "act" and side.first_divergence.op_type == "Relu"
    by_name = {v.name: v for v in side.values}
    assert by_name["h"].passed and by_name["hb"].passed and not by_name["a"].passed
    assert by_name["a"].min_atol > 0 and 0 < by_name["a"].outside <= 1


def test_parity_outputs_only_says_so_and_random_nodes_are_named():
    """Without --all-nodes the report names the node of the first diverging output and
    says the intermediates were not compared; a model that draws random numbers gets a
    note naming the random nodes (the devices draw their own numbers)."""
    from gpukernels.parity import format_report

    report = compare(_mlp(), sides=[Side("cpu"), Side("cpu-faulty", options={"kernel_overrides": {"Relu": _FaultyRelu}})])
    text = format_report(report)
    assert not report.passed and report.sides[0].first_divergence.outputs_only
    assert "node of the first diverging output: 'softmax'" in text and "input logits: not compared" in text
    assert "--all-nodes" in text and "note:" not in text
    g = helper.make_graph([helper.make_node("RandomUniformLike", ["x"], ["u"], name="noise"),
                           helper.make_node("Add", ["x", "u"], ["y"], name="add")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64])])
    noisy = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    report = compare(noisy, sides=[Side("cpu"), Side("cpu-again")], all_nodes=True)
    text = format_report(report)
    assert not report.passed and report.sides[0].first_divergence.node == "noise"
    assert "first diverging node: 'noise' (RandomUniformLike)" in text
    assert "note: the model draws random numbers (RandomUniformLike 'noise')" in text


def test_parity_atol_relative_follows_each_values_scale():
    """atol_relative: atol is a fraction of the value's largest finite |baseline| (boxes of 400
    and logits of 0.01 under one rule); an all-zero baseline keeps atol as given."""
    boxes, moved = np.array([0.0, 400.0, np.inf], np.float32), np.array([0.01, 400.0, np.inf], np.float32)
    assert not diff_values("b", boxes, moved, rtol=0.0, atol=1e-4)["passed"]
    assert diff_values("b", boxes, moved, rtol=0.0, atol=1e-4, atol_relative=True)["passed"]  # 0.01 <= 0.04
    assert not diff_values("b", boxes, boxes + np.float32(0.05), rtol=0.0, atol=1e-4, atol_relative=True)["passed"]
    zeros = np.zeros(3, np.float32)
    assert diff_values("z", zeros, zeros + np.float32(1e-5), 0.0, 1e-4, atol_relative=True)["passed"]
    assert not diff_values("z", zeros, zeros + np.float32(1e-3), 0.0, 1e-4, atol_relative=True)["passed"]


@pytest.mark.parametrize("dtype", [np.int64, np.uint8, np.bool_])
def test_parity_exact_integers(dtype):
    """exact_integers: an integer (or boolean) value off by one fails whatever the tolerance."""
    a = np.array([200, 0, 1], dtype)
    b = a.copy()
    b[2] = not b[2] if dtype is np.bool_ else b[2] + 1
    assert diff_values("i", a, a.copy(), rtol=0.5, atol=1.0, exact_integers=True)["passed"]
    assert diff_values("i", a, b, rtol=0.5, atol=1.0)["passed"]  # the tolerance alone lets it through
    d = diff_values("i", a, b, rtol=0.5, atol=1.0, exact_integers=True)
    assert not d["passed"] and d["max_abs"] == 1 and d["outside"] == pytest.approx(1 / 3)


def test_parity_against_runtimes_passes(tmp_path):
    path = tmp_path / "mlp.onnx"
    _mlp(path)
    for against in ("onnxruntime", "reference"):
        report = compare(str(path), devices=["cpu"], against=against, all_nodes=True)
        assert report.passed, report


def test_parity_cli_save_then_load(tmp_path, capsys):
    path = tmp_path / "mlp.onnx"
    _mlp(path)
    assert cli_main(["parity", str(path), "--devices", "cpu", "--against", "onnxruntime",
                     "--save", str(tmp_path / "saved")]) == 0
    assert "PASSED" in capsys.readouterr().out
    assert cli_main(["parity", str(path), "--devices", "cpu", "--load", str(tmp_path / "saved"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["passed"] and data["baseline"].startswith("saved:")


def test_parity_without_gpu_exits_distinctly(tmp_path, capsys):
    from gpukernels.xp import cuda_status

    if cuda_status().available:
        pytest.skip("a GPU is usable here")
    path = tmp_path / "mlp.onnx"
    _mlp(path)
    assert cli_main(["parity", str(path), "--devices", "cpu,cuda"]) == 3
    err = capsys.readouterr().err
    assert "not usable" in err and "Traceback" not in err


def test_run_dump_writes_every_intermediate(tmp_path, capsys):
    path = tmp_path / "mlp.onnx"
    _mlp(path)
    assert cli_main(["run", str(path), "--device", "cpu", "--dump", str(tmp_path / "dump"), "--dim", "n=3"]) == 0
    index = json.loads((tmp_path / "dump" / "index.json").read_text())
    assert [e["value"] for e in index["values"]] == ["h", "hb", "a", "logits", "probs"]
    with np.load(tmp_path / "dump" / "intermediates.npz") as z:
        assert z[index["values"][0]["key"]].shape == (3, 16)


def test_profile_lists_every_op_type(tmp_path, capsys):
    path = tmp_path / "mlp.onnx"
    _mlp(path)
    assert cli_main(["profile", str(path), "--device", "cpu", "--repeat", "3", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data["operators"]) == {"MatMul", "Add", "Relu", "Softmax"}
    assert data["model_seconds_free"] > 0 and len(data["nodes"]) == 5
    import gpukernels

    assert gpukernels.profile(str(path), repeat=2).device == "cpu"


def test_errors_name_model_node_and_value(tmp_path, capsys):
    m = _mlp()
    m.graph.initializer[1].CopyFrom(numpy_helper.from_array(np.ones((15, 4), np.float32), "w2"))  # wrong shape
    path = tmp_path / "broken.onnx"
    onnx.save(m, str(path))
    assert cli_main(["run", str(path), "--device", "cpu", "--dim", "n=2"]) == 4  # model failed to run
    err = capsys.readouterr().err
    assert "broken.onnx" in err and "fc2" in err and "MatMul" in err and "float32[15, 4]" in err
