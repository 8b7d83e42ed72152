"""The CLI ends every failure with one escaped line and a distinct exit status, writes
archives with safe entry names, and reads crafted archives and --load folders safely."""

import json
import subprocess
import sys
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from gpukernels import cli
from gpukernels.archive import DataError, entry_names, read_npz, safe_name, write_npz
from gpukernels.cli import main
from gpukernels.errors import ModelError, ResourceLimitError
from gpukernels.inputs import plan_random_inputs, random_inputs
from gpukernels.kernels.base import KernelContext
from gpukernels.parity import model_digest

F = TensorProto.FLOAT
ROOT = Path(cli.__file__).resolve().parents[1]   # run subprocesses on this very checkout
ESC = "\x1b[2J\x1b[31mevil\u202e"
ODD_NAMES = ["file", "allow_pickle", "../../x", "/etc/passwd", "a\\b", ESC, "", "CON", "A", "a", "__names__.json"]


def _identity_model(names, path=None, shape=(2,), elem=F, node_names=None):
    """A model with one input 'x' and one Identity output per name."""
    node_names = node_names or [f"id{i}" for i in range(len(names))]
    nodes = [helper.make_node("Identity", ["x"], [n], name=k) for n, k in zip(names, node_names)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", elem, list(shape))],
                          [helper.make_tensor_value_info(n, elem, list(shape)) for n in names])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 9
    if path is not None:
        onnx.save(m, str(path))
    return m


def _one_error_line(err: str, command: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"gpukernels {command}: error: "), err
    assert "Traceback" not in err and "\x1b" not in err
    return lines[0]


def _npy_header_zip(path, shape, descr="<f4", payload=b"\0" * 16, entry="x.npy"):
    """An npz whose one entry's header declares shape (and holds only payload)."""
    import io

    buf = io.BytesIO()
    np.lib.format.write_array_header_2_0(buf, {"descr": descr, "fortran_order": False, "shape": tuple(shape)})
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(entry, buf.getvalue() + payload)


# ------------------------------------------------------------------ names and archives


def test_safe_name_escapes_only_unprintables():
    assert safe_name("héllo wörld_1") == "héllo wörld_1"
    assert safe_name("a\x1b[31mb\nc\u202ed") == "a\\x1b[31mb\\x0ac\\u202ed"
    assert safe_name("x" * 50, 10) == "xxxxxxx..."


def test_archive_round_trips_any_name_without_unsafe_entries(tmp_path):
    arrays = {n: np.full(3, i, np.float32) for i, n in enumerate(ODD_NAMES)}
    arrays["s"] = np.array(["a", "bc"], dtype=object)   # strings: stored as unicode, no pickle
    path = tmp_path / "out.npz"
    entries = write_npz(path, arrays)
    members = zipfile.ZipFile(path).namelist()
    assert len(members) == len(arrays) + 1 and "__names__.json" in members
    for m in members:
        assert "/" not in m and "\\" not in m and not m.startswith((".", "-")) and m.isprintable()
    lowered = [m.lower() for m in members]
    assert len(set(lowered)) == len(lowered)   # no clash on case-insensitive file systems
    assert entries["file"] == "file" and entries["../../x"].startswith("v002_")
    back = read_npz(path)
    assert set(back) == set(arrays)
    for n in ODD_NAMES:
        np.testing.assert_array_equal(back[n], arrays[n])
    assert back["s"].tolist() == ["a", "bc"]
    with np.load(path) as z:   # plain names stay readable with plain numpy
        np.testing.assert_array_equal(z["file"], arrays["file"])
    assert list(tmp_path.iterdir()) == [path]


def test_entry_names_are_unique_and_plain():
    e = entry_names(["v000_x", "../x", "x", "X"])
    assert e == {"v000_x": "v000_x", "../x": "v001_x", "x": "x", "X": "v003_X"}


def test_write_refuses_a_folder_and_leaves_nothing_on_failure(tmp_path):
    (tmp_path / "dir").mkdir()
    with pytest.raises(DataError, match="is a folder"):
        write_npz(tmp_path / "dir", {"a": np.zeros(1)})
    assert not (tmp_path / "dir.npz").exists()
    with pytest.raises(DataError, match="Python objects"):
        write_npz(tmp_path / "o.npz", {"a": np.zeros(1), "b": np.array([object()], dtype=object)})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir"]
    with pytest.raises(DataError, match="does not exist"):
        write_npz(tmp_path / "missing" / "o.npz", {"a": np.zeros(1)})


def test_read_refuses_pickles(tmp_path):
    np.savez(tmp_path / "p.npz", x=np.array([{"a": 1}], dtype=object))
    with pytest.raises(DataError, match="pickle"):
        read_npz(tmp_path / "p.npz")


def test_read_refuses_huge_header_before_allocating(tmp_path):
    path = tmp_path / "huge.npz"
    _npy_header_zip(path, (1 << 40,))                      # 4 TiB of float32 declared
    tracemalloc.start()
    try:
        with pytest.raises(ResourceLimitError, match="4 TiB") as info:
            read_npz(path)
        with pytest.raises(DataError, match="truncated"):  # no limit: still not allocated
            read_npz(path, max_bytes=None)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    assert info.value.nbytes == 4 << 40 and "GPUKERNELS_MAX_TENSOR_BYTES" in str(info.value)


def test_read_refuses_overlapping_entries(tmp_path):
    # one deflated 1 MiB entry whose central-directory record is repeated 3000 times:
    # every copy points at the same bytes, 3000 MiB claimed in a file of a few KiB
    import struct

    path = tmp_path / "bomb.npz"
    buf = __import__("io").BytesIO()
    np.lib.format.write_array(buf, np.zeros(1 << 18, np.float32))
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("x.npy", buf.getvalue())
    data = path.read_bytes()
    eocd = data[-22:]
    cd_size, cd_offset = struct.unpack("<II", eocd[12:20])
    record = data[cd_offset:cd_offset + cd_size]
    n = 3000
    path.write_bytes(data[:cd_offset] + record * n + eocd[:8] + struct.pack("<HHII", n, n, cd_size * n, cd_offset)
                     + eocd[20:])
    assert len(zipfile.ZipFile(path).infolist()) == n
    with pytest.raises(DataError, match="overlapping entries"):
        read_npz(path)


def test_read_rejects_non_archives_and_bad_name_maps(tmp_path):
    (tmp_path / "t.npz").write_text("hello")
    with pytest.raises(DataError, match="not an npz archive$"):
        read_npz(tmp_path / "t.npz")
    np.save(tmp_path / "a.npy", np.zeros(2))
    with pytest.raises(DataError, match="single .npy array"):
        read_npz(tmp_path / "a.npy")
    with pytest.raises(DataError, match="no such file"):
        read_npz(tmp_path / "nope.npz")
    with zipfile.ZipFile(tmp_path / "deep.npz", "w") as zf:
        zf.writestr("__names__.json", "[" * 100000 + "]" * 100000)
    with pytest.raises(DataError, match="nested too deeply"):
        read_npz(tmp_path / "deep.npz")
    _npy_header_zip(tmp_path / "neg.npz", (-5, 2))
    with pytest.raises(DataError, match="negative"):
        read_npz(tmp_path / "neg.npz")


# ------------------------------------------------------------------ random inputs


class _FakeSession:
    def __init__(self, model, limit=None):
        self.inputs = list(model.graph.input)
        self.ctx = KernelContext("cpu", options={} if limit is None else {"max_tensor_bytes": limit})


def _input_model(shape, elem=F, name="x"):
    g = helper.make_graph([helper.make_node("Identity", [name], ["y"])], "g",
                          [helper.make_tensor_value_info(name, elem, shape)],
                          [helper.make_tensor_value_info("y", elem, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


def test_random_inputs_validate_before_drawing():
    tracemalloc.start()
    try:
        with pytest.raises(ResourceLimitError, match=r"random input 'big' \(FLOAT\[1099511627776, 4\]\)"):
            random_inputs(_FakeSession(_input_model([1 << 40, 4], name="big")), 0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    with pytest.raises(ModelError, match=r"input 'x' \(FLOAT\[-5, 2\]\) has a negative dimension -5"):
        plan_random_inputs(_FakeSession(_input_model([-5, 2])))
    with pytest.raises(ModelError, match=r"input 'x' declares element type 0 \(UNDEFINED\) with dims \[n, 2\]"):
        plan_random_inputs(_FakeSession(_input_model(["n", 2], elem=0)))
    with pytest.raises(ModelError, match=r"\\x1b"):
        plan_random_inputs(_FakeSession(_input_model([-1], name="\x1b[2J")))
    # the session's max_tensor_bytes option is the limit: 64 bytes hold 16 floats, not 17
    assert random_inputs(_FakeSession(_input_model([16]), limit=64), 0)["x"].shape == (16,)
    with pytest.raises(ResourceLimitError, match="68 bytes"):
        random_inputs(_FakeSession(_input_model([17]), limit=64), 0)


def test_run_random_inputs_limits_give_distinct_exits(tmp_path, capsys, monkeypatch):
    path = tmp_path / "m.onnx"
    onnx.save(_input_model(["n", 4]), str(path))
    assert main(["run", str(path), "--device", "cpu", "--dim", f"n={1 << 40}"]) == 6
    line = _one_error_line(capsys.readouterr().err, "run")
    assert "random input 'x'" in line and "max_tensor_bytes" in line
    monkeypatch.setenv("GPUKERNELS_MAX_TENSOR_BYTES", "32")
    assert main(["run", str(path), "--device", "cpu", "--dim", "n=3"]) == 6
    assert "48 bytes" in _one_error_line(capsys.readouterr().err, "run")
    assert main(["run", str(path), "--device", "cpu", "--dim", "n=2"]) == 0
    capsys.readouterr()
    assert main(["run", str(path), "--device", "cpu", "--dim", "n=-5"]) == 2
    assert "--dim expects" in _one_error_line(capsys.readouterr().err, "run")


@pytest.mark.parametrize("shape, elem", [([-5, 2], F), ([2], 0)])
def test_run_model_with_bad_declared_input_exits_4(tmp_path, capsys, shape, elem):
    path = tmp_path / "m.onnx"
    onnx.save(_input_model(shape, elem, name="in\x1b[0m"), str(path))
    assert main(["run", str(path), "--device", "cpu"]) == 4
    line = _one_error_line(capsys.readouterr().err, "run")
    assert "m.onnx" in line


# ------------------------------------------------------------------ run --inputs/--output


def test_run_inputs_file_errors_are_one_line(tmp_path, capsys):
    path = tmp_path / "m.onnx"
    _identity_model(["y"], path)
    assert main(["run", str(path), "--device", "cpu", "--inputs", str(tmp_path / "missing.npz")]) == 2
    assert "no such file" in _one_error_line(capsys.readouterr().err, "run")
    np.savez(tmp_path / "pickled.npz", x=np.array([None, 1], dtype=object))
    assert main(["run", str(path), "--device", "cpu", "--inputs", str(tmp_path / "pickled.npz")]) == 2
    assert "pickle" in _one_error_line(capsys.readouterr().err, "run")
    (tmp_path / "text.npz").write_text("not a zip")
    assert main(["run", str(path), "--device", "cpu", "--inputs", str(tmp_path / "text.npz")]) == 2
    assert "not an npz archive" in _one_error_line(capsys.readouterr().err, "run")
    np.savez(tmp_path / "wrong.npz", z=np.zeros(2, np.float32))
    assert main(["run", str(path), "--device", "cpu", "--inputs", str(tmp_path / "wrong.npz")]) == 2
    _one_error_line(capsys.readouterr().err, "run")
    assert main(["run", str(tmp_path / "nope.onnx"), "--device", "cpu"]) == 2
    assert "does not exist" in _one_error_line(capsys.readouterr().err, "run")


def test_run_output_names_round_trip(tmp_path, capsys, monkeypatch):
    names = [n for n in ODD_NAMES if n]
    path = tmp_path / "m.onnx"
    _identity_model(names, path)
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    np.savez(work / "in.npz", x=np.array([1.5, -2.0], np.float32))
    assert main(["run", str(path), "--device", "cpu", "--inputs", "in.npz", "--output", "out"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\u202e" not in out and "\\x1b[2J" in out
    assert f"outputs written to out ({len(names)} arrays)" in out
    assert (work / "out").is_file() and not (work / "out.npz").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "m.onnx"]   # nothing escaped the folder
    back = read_npz(work / "out")
    assert set(back) == set(names)
    for n in names:
        np.testing.assert_array_equal(back[n], [1.5, -2.0])


def test_run_output_to_a_folder_is_refused_before_running(tmp_path, capsys):
    path = tmp_path / "m.onnx"
    _identity_model(["y"], path)
    (tmp_path / "outdir").mkdir()
    assert main(["run", str(path), "--device", "cpu", "--output", str(tmp_path / "outdir")]) == 2
    captured = capsys.readouterr()
    assert "is a folder" in _one_error_line(captured.err, "run")
    assert "written" not in captured.out and captured.out == ""
    assert not (tmp_path / "outdir.npz").exists() and not any((tmp_path / "outdir").iterdir())
    assert main(["run", str(path), "--device", "cpu", "--output", str(tmp_path / "no" / "o.npz")]) == 2
    assert "does not exist" in _one_error_line(capsys.readouterr().err, "run")


def test_dump_with_odd_names(tmp_path, capsys):
    path = tmp_path / "m.onnx"
    _identity_model(["file", "../../x", ESC], path)
    assert main(["run", str(path), "--device", "cpu", "--dump", str(tmp_path / "d")]) == 0
    index = json.loads((tmp_path / "d" / "index.json").read_text())
    back = read_npz(tmp_path / "d" / "intermediates.npz")
    assert sorted(back) == sorted(e["key"] for e in index["values"])
    assert {e["value"] for e in index["values"]} == {"file", "../../x", ESC}


# ------------------------------------------------------------------ parity --save/--load


def _saved_folder(tmp_path, model_path, capsys):
    saved = tmp_path / "saved"
    assert main(["parity", str(model_path), "--devices", "cpu", "--save", str(saved)]) == 0
    capsys.readouterr()
    return saved


def test_parity_save_load_with_odd_input_and_output_names(tmp_path, capsys):
    g = helper.make_graph([helper.make_node("Relu", ["file"], ["../../x"], name=ESC),
                           helper.make_node("Neg", ["../../x"], ["allow_pickle"], name="neg")], "g",
                          [helper.make_tensor_value_info("file", F, [3])],
                          [helper.make_tensor_value_info("allow_pickle", F, [3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    saved = tmp_path / "saved"
    assert main(["parity", str(path), "--devices", "cpu", "--all-nodes", "--save", str(saved)]) == 0
    capsys.readouterr()
    assert set(read_npz(saved / "inputs.npz")) == {"file"}
    assert main(["parity", str(path), "--devices", "cpu", "--all-nodes", "--load", str(saved)]) == 0
    out = capsys.readouterr().out
    assert "PASSED" in out and "allow_pickle" in out and "\x1b" not in out


def test_parity_reads_folders_saved_by_the_old_format(tmp_path, capsys):
    path = tmp_path / "m.onnx"
    m = _identity_model(["y"], path)
    saved = tmp_path / "old"
    saved.mkdir()
    x = np.array([0.5, 1.0], np.float32)
    np.savez(saved / "values.npz", v0=x)
    np.savez(saved / "inputs.npz", x=x)
    (saved / "index.json").write_text(json.dumps({"label": "cpu", "model_digest": model_digest(m),
                                                  "values": {"y": "v0"}}))
    assert main(["parity", str(path), "--devices", "cpu", "--load", str(saved), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["passed"]


@pytest.mark.parametrize("damage, code, words", [
    ("no-folder", 2, "no such folder"),
    ("no-index", 2, "no index.json"),
    ("missing-key", 2, "'model_digest' is missing"),
    ("deep-json", 2, "nested too deeply"),
    ("bad-json", 2, "not valid JSON"),
    ("wrong-values", 2, "'values' must be"),
    ("huge-npy", 6, "max_tensor_bytes"),
    ("pickled-inputs", 2, "pickle"),
    ("missing-value", 2, "lacks value"),
])
def test_parity_load_crafted_folders(tmp_path, capsys, damage, code, words):
    path = tmp_path / "m.onnx"
    _identity_model(["y"], path)
    saved = _saved_folder(tmp_path, path, capsys)
    index = json.loads((saved / "index.json").read_text())
    if damage == "no-folder":
        saved = tmp_path / "elsewhere"
    elif damage == "no-index":
        (saved / "index.json").unlink()
    elif damage == "missing-key":
        del index["model_digest"]
        (saved / "index.json").write_text(json.dumps(index))
    elif damage == "deep-json":
        (saved / "index.json").write_text("[" * 10000 + "]" * 10000)
    elif damage == "bad-json":
        (saved / "index.json").write_text("{")
    elif damage == "wrong-values":
        index["values"] = 5
        (saved / "index.json").write_text(json.dumps(index))
    elif damage == "huge-npy":
        _npy_header_zip(saved / "values.npz", (1 << 40,), entry="y.npy")
    elif damage == "pickled-inputs":
        np.savez(saved / "inputs.npz", x=np.array([None], dtype=object))
    elif damage == "missing-value":
        index["values"] = ["y", "not-there"]
        (saved / "index.json").write_text(json.dumps(index))
    assert main(["parity", str(path), "--devices", "cpu", "--load", str(saved)]) == code
    line = _one_error_line(capsys.readouterr().err, "parity")
    assert words in line


# ------------------------------------------------------------------ every command, every error


def test_escaped_names_in_parity_and_profile_reports(tmp_path, capsys):
    path = tmp_path / "m.onnx"
    _identity_model([ESC], path, node_names=[ESC + "node"])
    assert main(["parity", str(path), "--devices", "cpu,cpu", "--all-nodes"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\\x1b[2J" in out
    assert main(["profile", str(path), "--device", "cpu", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\u202e" not in out and "\\x1b[2J" in out


@pytest.mark.parametrize("exc, code, words", [
    (TypeError("boom"), 5, "internal error: TypeError: boom"),
    (MemoryError(), 6, "out of memory"),
    (RecursionError("maximum recursion depth exceeded"), 6, "nesting too deep"),
    (KeyboardInterrupt(), 130, "interrupted"),
    (OSError(28, "No space left on device"), 2, "No space left"),
    (ModelError("bad\nnode \x1b[31m"), 4, "bad; node \\x1b[31m"),
])
def test_every_exception_ends_in_one_line(monkeypatch, capsys, exc, code, words):
    def fail(args):
        raise exc

    monkeypatch.setattr(cli, "cmd_info", fail)
    assert main(["info"]) == code
    assert words in _one_error_line(capsys.readouterr().err, "info")
    with pytest.raises(type(exc)):
        main(["--debug", "info"])
    with pytest.raises(type(exc)):
        main(["info", "--debug"])


def test_device_errors_keep_their_codes(capsys):
    assert main(["run", "--device", "tpu"]) == 2
    assert "unknown device" in _one_error_line(capsys.readouterr().err, "run")
    assert main(["conformance", "--device", "tpu"]) == 2
    assert "unknown device" in _one_error_line(capsys.readouterr().err, "conformance")
    assert main(["profile", "--device", "cpu", "--repeat", "0"]) == 2
    _one_error_line(capsys.readouterr().err, "profile")


def test_help_lists_the_exit_codes(capsys):
    for argv in (["--help"], ["run", "--help"], ["parity", "--help"]):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 0
        out = capsys.readouterr().out
        assert "exit status:" in out and "internal error" in out and "max_tensor_bytes" in out


def test_library_modules_do_not_import_the_cli():
    for src in (ROOT / "gpukernels").rglob("*.py"):
        if src.name != "cli.py":
            text = src.read_text()
            assert "from .cli " not in text and "gpukernels.cli" not in text and "from . import cli" not in text, src
    code = ("import sys, gpukernels.parity, gpukernels.profiling, gpukernels.inspect_tools, gpukernels.inputs; "
            "assert 'gpukernels.cli' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_console_script_prints_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "gpukernels.cli", "run", "--device", "cpu",
                           "--inputs", str(tmp_path / "nope.npz")], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 2
    assert done.stderr.startswith("gpukernels run: error: ") and done.stderr.count("\n") == 1
