import json
import subprocess
import sys
import zipfile

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import gpukernels.backend as backend
from gpukernels.cli import main as cli_main


def _add_model():
    g = helper.make_graph([helper.make_node("Add", ["a", "b"], ["c"])], "g",
                          [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2]),
                           helper.make_tensor_value_info("b", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("c", TensorProto.FLOAT, [2])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])


def test_backend_interface():
    assert backend.supports_device("CPU")
    rep = backend.prepare(_add_model(), "CPU")
    out = rep.run([np.array([1, 2], np.float32), np.array([3, 4], np.float32)])
    assert out[0].dtype == np.float32 and list(out[0]) == [4, 6]
    out = backend.run_node(helper.make_node("Neg", ["x"], ["y"]), [np.array([1.0, -2.0], np.float64)])
    assert list(out[0]) == [-1.0, 2.0] and out[0].dtype == np.float64


def test_backend_cuda_only_when_usable():
    from gpukernels.xp import cuda_status

    assert backend.supports_device("CUDA") == cuda_status().available


def test_cuda_sources_ship_in_the_wheel(tmp_path):
    root = __import__("pathlib").Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path), str(root)], check=True, capture_output=True)
    wheel, = tmp_path.glob("gpukernels-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    sources = sorted(p.rsplit("/", 1)[-1] for p in names if p.startswith("gpukernels/cuda_sources/"))
    expected = sorted(p.name for p in (root / "cuda").rglob("*") if p.suffix in (".cu", ".cuh", ".h"))
    assert "README.md" in sources
    assert set(expected) <= set(sources), f"missing from the wheel: {set(expected) - set(sources)}"
    assert "gpukernels/models/hybrid_block.onnx" in names


def test_cli_info_json(capsys):
    assert cli_main(["info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["onnx_opset"] >= 23 and "cuda_available" in info


def test_cli_run_bundled_model(capsys, tmp_path):
    from gpukernels.conformance import missing_operators
    from gpukernels.inputs import bundled_model_path

    model = onnx.load(str(bundled_model_path()))
    assert {"Conv", "Attention", "LinearAttention", "RotaryEmbedding"} <= {n.op_type for n in model.graph.node}
    missing = missing_operators(model)
    if missing:
        pytest.skip(f"bundled model needs kernels not written yet: {missing}")
    out_file = tmp_path / "out.npz"
    assert cli_main(["run", "--device", "cpu", "--output", str(out_file)]) == 0
    text = capsys.readouterr().out
    assert "device: cpu" in text and "probabilities" in text
    probs = np.load(out_file)["probabilities"]
    np.testing.assert_allclose(probs.sum(), 1.0, rtol=1e-5)
    # the same model through onnxruntime agrees
    ort = pytest.importorskip("onnxruntime")
    from gpukernels.inputs import random_inputs
    from gpukernels.runtime import Session

    feeds = random_inputs(Session(str(bundled_model_path())), 0, {})
    ref = ort.InferenceSession(str(bundled_model_path())).run(["probabilities"], feeds)[0]
    np.testing.assert_allclose(probs, ref, rtol=1e-4, atol=1e-6)


def _embedding_model():
    """BERT's pattern: token ids into a 50-row table, token type ids (through a Cast and
    an Unsqueeze) into a 2-row one, positions into a 5-row one on axis 1 of a transposed
    table; a mask that indexes nothing."""
    rows = {"words": (50, 4), "types": (2, 4), "positions_t": (4, 5)}
    inits = [onnx.numpy_helper.from_array(np.arange(a * b, dtype=np.float32).reshape(a, b), n)
             for n, (a, b) in rows.items()]
    nodes = [helper.make_node("Gather", ["words", "ids"], ["e1"]),
             helper.make_node("Cast", ["types_in"], ["t32"], to=TensorProto.INT32),
             helper.make_node("Unsqueeze", ["t32", "ax"], ["t2"]),
             helper.make_node("Gather", ["types", "t2"], ["e2"]),
             helper.make_node("Gather", ["positions_t", "pos"], ["e3"], axis=1),
             helper.make_node("Cast", ["mask"], ["m"], to=TensorProto.FLOAT),
             # a quantized table (QDQ) and a Constant one
             helper.make_node("DequantizeLinear", ["q_table", "q_scale"], ["dq_table"]),
             helper.make_node("Gather", ["dq_table", "q_ids"], ["e4"]),
             helper.make_node("Constant", [], ["c_table"],
                              value=onnx.numpy_helper.from_array(np.ones((6, 2), np.float32))),
             helper.make_node("Gather", ["c_table", "c_ids"], ["e5"])]
    inits += [onnx.numpy_helper.from_array(np.array([0], np.int64), "ax"),
              onnx.numpy_helper.from_array(np.arange(12, dtype=np.int8).reshape(3, 4), "q_table"),
              onnx.numpy_helper.from_array(np.float32(0.5), "q_scale")]
    ints = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", 8])
            for n in ("ids", "types_in", "pos", "mask", "q_ids", "c_ids")]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("e1", "e2", "e3", "m", "e4", "e5")]
    return helper.make_model(helper.make_graph(nodes, "g", ints, outs, inits),
                             opset_imports=[helper.make_opsetid("", 17)])


def test_random_inputs_stay_inside_the_tables_they_index(tmp_path, capsys):
    """`gpukernels run` without --inputs on an embedding model: integer inputs that index
    a table are drawn below its size (a 2-row token type table), others from [0, 10)."""
    from gpukernels.inputs import index_bounds, random_inputs
    from gpukernels.runtime import Session

    path = tmp_path / "emb.onnx"
    onnx.save(_embedding_model(), str(path))
    session = Session(str(path))
    assert index_bounds(session.model) == {"ids": 50, "types_in": 2, "pos": 5, "q_ids": 3, "c_ids": 6}
    feeds = random_inputs(session, 3, {"batch": 30})
    assert feeds["types_in"].max() == 1 and feeds["pos"].max() == 4 and feeds["mask"].max() == 9
    assert feeds["q_ids"].max() == 2 and feeds["c_ids"].max() == 5
    assert cli_main(["run", str(path), "--device", "cpu"]) == 0
    assert "e2" in capsys.readouterr().out


def test_cli_run_names_the_symbolic_dims_random_inputs_set_to_1(tmp_path, capsys):
    """A model that cannot run on the random inputs' 1s says which symbolic dimensions
    were 1 and how to set them."""
    g = helper.make_graph([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, "h", "w"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    path = tmp_path / "pool.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    assert cli_main(["run", str(path), "--device", "cpu"]) == 4  # EXIT_MODEL
    err = capsys.readouterr().err
    assert "MaxPool" in err and "symbolic dimension(s) 'n', 'h', 'w' to 1" in err and "--dim NAME=VALUE" in err
    assert cli_main(["run", str(path), "--device", "cpu", "--dim", "h=4", "--dim", "w=4"]) == 0
    assert "inputs: random (seed 0; symbolic dimensions h=4, w=4, n=1)" in capsys.readouterr().out


def test_cli_run_reports_unusable_cuda(capsys):
    from gpukernels.xp import cuda_status

    if cuda_status().available:
        pytest.skip("a GPU is usable here")
    assert cli_main(["run", "--device", "cuda"]) == 3
    assert "not usable" in capsys.readouterr().err
