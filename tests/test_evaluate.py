"""gpukernels eval (gpukernels.evaluation) on a local Dask cluster of 2 worker processes
with one thread each: outputs equal to a sequential run for npz, npy and Zarr data, a
worker killed mid-run, --resume, the parity report's numbers, bad data, the extras."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import distributed
import numpy as np
import onnx
import pytest
import zarr
from onnx import TensorProto, helper, numpy_helper

from gpukernels.archive import DataError
from gpukernels.cli import main
from gpukernels.evaluation import EvalArgumentError, MissingExtraError, evaluate, read_outputs
from gpukernels.evaluation.stats import sample_errors, summarize
from gpukernels.host import set_cpu_threads
from gpukernels.xp import cuda_status
from gpukernels.runtime import Session

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def client():
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       dashboard_address=":0", silence_logs=logging.ERROR)
    c = distributed.Client(cluster, set_as_default=False)
    yield c
    c.close()
    cluster.close()


# ------------------------------------------------------------------------ models and data


def small_model(path, first=None, width=8, seed=0):
    """x [N, width], s [N, 1] -> probs = softmax((x @ W + b) * s), logits = x @ W + b."""
    rng = np.random.default_rng(seed)
    n = first if first is not None else "N"
    init = [numpy_helper.from_array(rng.standard_normal((width, 4)).astype(np.float32), "W"),
            numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "b"], ["logits"]),
             helper.make_node("Mul", ["logits", "s"], ["z"]), helper.make_node("Softmax", ["z"], ["probs"], axis=-1)]
    graph = helper.make_graph(nodes, "small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, width]),
                                               helper.make_tensor_value_info("s", TensorProto.FLOAT, [n, 1])],
                              [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [n, 4]),
                               helper.make_tensor_value_info("logits", TensorProto.FLOAT, [n, 4])], init)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return str(path)


def gather_model(path):
    """i [N, 1] int64 -> y = table[i]: an index past 9 makes the model fail on that sample."""
    table = numpy_helper.from_array(np.arange(10, dtype=np.float32) * 1.5, "table")
    graph = helper.make_graph([helper.make_node("Gather", ["table", "i"], ["y"], axis=0)], "gather",
                              [helper.make_tensor_value_info("i", TensorProto.INT64, ["N", 1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1])], [table])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return str(path)


def make_data(n, seed=1, width=8):
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((n, width)).astype(np.float32),
            "s": rng.uniform(0.5, 2.0, (n, 1)).astype(np.float32)}


def write_npz_folder(folder, data, sizes, compressed=False):
    """Files a1, a2, a10... (natural order) holding sizes[k] samples each; a size of 0
    writes one sample without the batch axis; a 'label' array rides along (ignored)."""
    folder.mkdir(parents=True, exist_ok=True)
    save = np.savez_compressed if compressed else np.savez
    start = 0
    for k, size in enumerate(sizes):
        if size == 0:
            arrays = {name: v[start] for name, v in data.items()}
            size = 1
        else:
            arrays = {name: v[start:start + size] for name, v in data.items()}
        save(folder / f"a{k + 1 if k < 2 else 10 * k}.npz", label=np.arange(size), **arrays)
        start += size
    assert start == len(next(iter(data.values())))
    return folder


def write_npy_folder(folder, data):
    folder.mkdir(parents=True, exist_ok=True)
    for name, v in data.items():
        np.save(folder / f"{name}.npy", v)
    return folder


def write_zarr_group(path, data):
    group = zarr.open_group(str(path), mode="w")
    for name, v in data.items():
        if hasattr(group, "create_array"):
            arr = group.create_array(name=name, shape=v.shape, chunks=(4,) + v.shape[1:], dtype=v.dtype)
        else:
            arr = group.create_dataset(name, shape=v.shape, chunks=(4,) + v.shape[1:], dtype=v.dtype)
        arr[:] = v
    return path


def sequential(model, data, batch, run_size=None, device=None):
    """The reference: one Session, a plain loop over the same batches, on device (None:
    the one eval picks by default, a GPU when one is usable: its sums may differ from
    the CPU's)."""
    if device is None:
        device = "cuda:0" if cuda_status().available else "cpu"
    sess = Session(model, device=device)
    n = len(next(iter(data.values())))
    parts = []
    step = run_size or batch
    for lo in range(0, n, step):
        feeds = {k: v[lo:lo + step] for k, v in data.items()}
        got = len(feeds["x"])
        if run_size and got < run_size:
            feeds = {k: np.concatenate([v, np.repeat(v[-1:], run_size - got, axis=0)]) for k, v in feeds.items()}
        parts.append([o[:got] for o in sess.run(None, feeds)])
    return {name: np.concatenate([p[j] for p in parts]) for j, name in enumerate(sess.output_names)}


def assert_same(got: dict, want: dict):
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name].shape == want[name].shape, name
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-7, err_msg=name)


# ------------------------------------------------------------------ outputs = sequential run


@pytest.mark.parametrize("fmt,out_name", [("npz", "out"), ("npy", "out.zarr"), ("zarr", "out")])
def test_outputs_equal_a_sequential_run(tmp_path, client, fmt, out_name):
    model = small_model(tmp_path / "m.onnx")
    data = make_data(23)
    if fmt == "npz":
        src = write_npz_folder(tmp_path / "data", data, [0, 5, 7, 10])   # one sample, then batches
    elif fmt == "npy":
        src = write_npy_folder(tmp_path / "data", data)
    else:
        src = write_zarr_group(tmp_path / "data.zarr", data)
    out = tmp_path / out_name
    result = evaluate(model, str(src), str(out), batch=4, scheduler=client, device="cpu")
    assert (result.data_format, result.samples, result.batches, result.batches_run) == (fmt, 23, 6, 6)
    assert sorted(result.written) == list(range(6))
    assert result.output_format == ("zarr" if out_name.endswith(".zarr") else "npz")
    assert_same(read_outputs(out), sequential(model, data, 4, device="cpu"))


def test_cli_with_an_existing_scheduler_and_a_fixed_batch_model(tmp_path, client, capsys):
    """--scheduler ADDRESS; a model exported at batch 2 runs 2 samples at a time, the last
    run padded and cut."""
    model = small_model(tmp_path / "m.onnx", first=2)
    data = make_data(11)
    src = write_npy_folder(tmp_path / "data", data)
    out = tmp_path / "out"
    code = main(["eval", model, "--data", str(src), "--output", str(out), "--batch", "4",
                 "--scheduler", client.scheduler.address, "--device", "cpu"])
    text = capsys.readouterr().out
    assert code == 0, text
    assert "11 samples" in text and "3 run, 0 already written" in text and "samples/s" in text
    assert_same(read_outputs(out), sequential(model, data, 4, run_size=2, device="cpu"))
    assert main(["eval", model, "--data", str(src), "--batch", "3", "--scheduler", client.scheduler.address]) == 2
    assert "multiple of it" in capsys.readouterr().err


def test_a_model_that_takes_one_sample_at_a_time_says_so(tmp_path, client):
    """The bundled model declares a symbolic batch axis but its graph reshapes to batch 1:
    its batches fail whole, every sample runs alone, so eval runs it one sample at a time
    and says so."""
    from gpukernels.inputs import bundled_model_path

    model = str(bundled_model_path())
    image = np.random.default_rng(3).standard_normal((6, 3, 32, 32)).astype(np.float32)
    src = write_npy_folder(tmp_path / "data", {"image": image})
    result = evaluate(model, str(src), str(tmp_path / "out"), batch=3, scheduler=client)
    assert any("could not run 3 samples at once" in n and "one at a time" in n for n in result.notes), result.notes
    # BLAS sums in an order that depends on its thread count: the reference loop runs with
    # the workers' count (on the reference paths the Conv is a BLAS product)
    (threads,) = {w["threads"] for w in result.workers}
    set_cpu_threads(threads)
    try:
        sess = Session(model)
        want = [sess.run(None, {"image": image[i:i + 1]}) for i in range(6)]
    finally:
        set_cpu_threads(None)
    assert_same(read_outputs(tmp_path / "out"),
                {name: np.concatenate([w[j] for w in want]) for j, name in enumerate(sess.output_names)})


def test_each_worker_loads_the_model_once(tmp_path, client):
    from gpukernels.evaluation.worker import worker_stats

    model = small_model(tmp_path / "m.onnx", seed=7)
    data = make_data(40)
    before = client.run(worker_stats)
    result = evaluate(model, str(write_npy_folder(tmp_path / "data", data)), batch=2, scheduler=client)
    after = client.run(worker_stats)
    assert result.batches_run == 20
    tasks = {a: after[a]["tasks"] - before[a]["tasks"] for a in after if a in before}
    sessions = {a: after[a]["sessions"] - before[a]["sessions"] for a in after if a in before}
    assert sum(tasks.values()) == 20
    assert all(sessions[a] == (1 if tasks[a] else 0) for a in tasks), (tasks, sessions)
    assert all(not s["models"] for s in after.values())   # the plugin is removed after the run
    # two workers x one thread each on this machine: never more host threads than cores
    cores = len(os.sched_getaffinity(0))
    assert all(w["threads"] * w["nthreads"] * 2 <= max(cores, 2) for w in result.workers), result.workers


def test_default_local_cluster_from_the_cli(tmp_path, capsys):
    """No --scheduler: a local cluster with one worker process per core; workers x threads
    never exceed the cores."""
    model = small_model(tmp_path / "m.onnx")
    data = make_data(20)
    src = write_npz_folder(tmp_path / "data", data, [10, 10])
    out = tmp_path / "out.zarr"
    code = main(["eval", model, "--data", str(src), "--output", str(out), "--batch", "5", "--device", "cpu",
                 "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert report["scheduler"].startswith("local cluster") and report["batches_run"] == 4
    cores = len(os.sched_getaffinity(0))
    assert sum(w["threads"] for w in report["workers"]) <= cores
    assert_same(read_outputs(out), sequential(model, data, 5, device="cpu"))


def _kernels_loaded() -> bool:
    from gpukernels.kernels import _loader

    return _loader._loaded


def _profiler_enabled() -> bool:
    import dask

    return dask.config.get("distributed.worker.profile.enabled")


def test_local_workers_load_the_code_at_setup_and_run_without_the_profiler():
    """The model plugin's setup loads gpukernels' code (not the first task); a local
    cluster's workers run without Dask's statistical profiler (it takes the GIL from the
    model's run every 10 ms)."""
    from gpukernels.evaluation.cluster import connect
    from gpukernels.evaluation.worker import ModelPlugin

    cluster = connect(None, 1, "cpu", None)
    try:
        c = cluster.client
        assert list(c.run(_profiler_enabled).values()) == [False]
        c.register_plugin(ModelPlugin("0" * 16, b"", None))
        assert list(c.run(_kernels_loaded).values()) == [True]
    finally:
        cluster.close()


def test_a_failure_to_load_the_code_is_raised_by_every_session_build(monkeypatch):
    from gpukernels.evaluation import worker

    monkeypatch.setattr(worker, "_WARMED", [ImportError("no module named gpukernels.kernels.x")])
    for _ in range(2):
        with pytest.raises(ImportError, match="kernels.x"):
            worker.warm_up()


# -------------------------------------------------------------------------------- resume


def test_resume_npz_skips_written_batches(tmp_path, client):
    model = small_model(tmp_path / "m.onnx")
    data = make_data(30)
    src = str(write_npy_folder(tmp_path / "data", data))
    out = tmp_path / "out"
    stop_after = 2

    def interrupt(done, total, r):
        if done == stop_after:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        evaluate(model, src, str(out), batch=3, scheduler=client, progress=interrupt)
    written = sorted(out.glob("batch-*.npz"))
    assert len(written) >= stop_after
    with pytest.raises(DataError, match="not written"):
        read_outputs(out)
    with pytest.raises(DataError, match="--resume"):
        evaluate(model, src, str(out), batch=3, scheduler=client)
    with pytest.raises(DataError, match="batch 3 .now 5"):
        evaluate(model, src, str(out), batch=5, resume=True, scheduler=client)
    # a batch file cut short (as by a full disk) and a stale temporary file; the first
    # batch written, whichever it is (two workers finish batches in any order)
    cut = written[0]
    cut.write_bytes(cut.read_bytes()[:100])
    (out / ".batch-000009.npz.1.abcd.tmp").write_bytes(b"junk")
    done_before = {int(p.stem.split("-")[1]) for p in out.glob("batch-*.npz")} - {int(cut.stem.split("-")[1])}
    result = evaluate(model, src, str(out), resume=True, scheduler=client)   # --batch from the output
    assert result.batch == 3 and result.batches_skipped == len(done_before)
    assert sorted(result.written) == sorted(set(range(10)) - done_before)
    assert not list(out.glob(".*.tmp"))
    assert_same(read_outputs(out), sequential(model, data, 3))


def test_resume_zarr_reruns_only_unfinished_batches(tmp_path, client):
    model = small_model(tmp_path / "m.onnx")
    data = make_data(17)
    src = str(write_zarr_group(tmp_path / "data.zarr", data))
    out = tmp_path / "out.zarr"
    evaluate(model, src, str(out), batch=4, scheduler=client)
    group = zarr.open_group(str(out), mode="r+")
    for i in (1, 4):   # as if the run had stopped before these were finished
        group["_gpukernels_done"][i] = 0
        group["probs"][i * 4:(i + 1) * 4] = np.nan
    result = evaluate(model, src, str(out), batch=4, resume=True, scheduler=client)
    assert sorted(result.written) == [1, 4] and result.batches_skipped == 3
    assert_same(read_outputs(out), sequential(model, data, 4))


# ------------------------------------------------------------------------- parity report


def test_parity_report_numbers_match_a_hand_computation(tmp_path, client, capsys):
    import onnxruntime as ort

    model = small_model(tmp_path / "m.onnx", width=64)
    data = make_data(24, width=64)
    src = write_npy_folder(tmp_path / "data", data)
    out = tmp_path / "out"
    rtol, atol = 0.0, 1e-8   # tight: the softmax of the two runtimes differs in the last bits on some samples
    code = main(["eval", model, "--data", str(src), "--output", str(out), "--batch", "6", "--against",
                 "onnxruntime", "--rtol", str(rtol), "--atol", str(atol), "--scheduler",
                 client.scheduler.address, "--json"])
    report = json.loads(capsys.readouterr().out)
    # by hand: the outputs eval wrote against onnxruntime over the same batches
    y = read_outputs(out)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    r = {"probs": [], "logits": []}
    for lo in range(0, 24, 6):
        p, l_ = sess.run(None, {k: v[lo:lo + 6] for k, v in data.items()})
        r["probs"].append(p)
        r["logits"].append(l_)
    for o in report["parity"]["outputs"]:
        ref = np.concatenate(r[o["name"]]).astype(np.float64)
        err = np.abs(y[o["name"]].astype(np.float64) - ref)
        per_abs = err.max(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            per_rel = np.max(np.where(err == 0, 0, err / np.abs(ref)), axis=1)
        outside = (err > atol + rtol * np.abs(ref)).any(axis=1)
        assert o["max_abs"] == pytest.approx(per_abs.max(), rel=1e-12)
        assert o["p99_abs"] == pytest.approx(np.percentile(per_abs, 99), rel=1e-12)
        assert o["max_rel"] == pytest.approx(per_rel.max(), rel=1e-12)
        assert o["p99_rel"] == pytest.approx(np.percentile(per_rel, 99), rel=1e-12)
        assert o["outside"] == outside.sum() and o["outside_share"] == pytest.approx(outside.mean())
        order = sorted((i for i in range(24) if per_abs[i] > 0), key=lambda i: (-per_abs[i], i))
        assert [w["sample"] for w in o["worst"]] == order[:10]
    probs = report["parity"]["outputs"][0]
    assert probs["name"] == "probs" and 0 < probs["outside"] < 24   # not a vacuous comparison
    assert code == 1 and not report["passed"]
    md = (tmp_path / "out-parity.md").read_text()
    assert (f"| probs | {probs['max_abs']:.3g} | {probs['p99_abs']:.3g} | {probs['max_rel']:.3g} | "
            f"{probs['p99_rel']:.3g} | {probs['outside']} / 24 |") in md
    assert "**FAILED**" in md
    assert "![per-sample errors](out-parity.png)" in md
    assert (tmp_path / "out-parity.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sample_errors_and_summary_by_hand():
    y = np.array([[1.0, 2.0], [0.0, np.nan], [np.inf, 5.0], [1.0, 1.0]])
    r = np.array([[1.0, 2.5], [1e-3, np.nan], [np.inf, 4.0], [0.0, 1.0]])
    max_abs, max_rel, outside = sample_errors(y, r, rtol=0.1, atol=0.0)
    np.testing.assert_array_equal(max_abs, [0.5, 1e-3, 1.0, 1.0])
    np.testing.assert_allclose(max_rel, [0.2, 1.0, 0.25, np.inf])
    np.testing.assert_array_equal(outside, [True, True, True, True])
    s = summarize("y", max_abs, max_rel, outside, worst=3)
    assert s.max_abs == 1.0 and s.p99_abs == pytest.approx(np.percentile(max_abs, 99))
    assert s.p99_rel == np.inf and s.outside == 4 and s.outside_share == 1.0
    assert [w["sample"] for w in s.worst] == [2, 3, 0]
    assert sample_errors(y[:, :1], r, 0, 0)[0].tolist() == [np.inf] * 4   # shapes differ


# ------------------------------------------------------------------------------- bad data


def _bad_npz(tmp, how):
    data = make_data(6)
    folder = write_npz_folder(tmp / "data", data, [0, 5])
    bad = folder / "a2.npz"
    arrays = {k: v[1:] for k, v in data.items()}
    if how == "missing":
        np.savez(bad, x=arrays["x"])
    elif how == "dtype":
        np.savez(bad, x=arrays["x"].astype(np.float64), s=arrays["s"])
    elif how == "shape":
        np.savez(bad, x=np.zeros((5, 9), np.float32), s=arrays["s"])
    elif how == "corrupt":
        bad.write_bytes(b"PK\x03\x04 this is not really a zip archive")
    return folder


@pytest.mark.parametrize("how,pattern", [
    ("missing", r"a2\.npz.*no array for input\(s\) 's'"),
    ("dtype", r"a2\.npz \(samples 1\.\.5 of the dataset\): input 'x' holds float64; the model takes FLOAT"),
    ("shape", r"a2\.npz \(samples 1\.\.5 of the dataset\): input 'x': one sample has shape \[9\]"),
    ("corrupt", r"a2\.npz: not a readable \.npz archive"),
])
def test_bad_npz_data_names_the_file_and_samples(tmp_path, how, pattern):
    model = small_model(tmp_path / "m.onnx")
    folder = _bad_npz(tmp_path, how)
    with pytest.raises(DataError, match=pattern):
        evaluate(model, str(folder), str(tmp_path / "out"), scheduler="tcp://127.0.0.1:1")  # never reached
    assert not (tmp_path / "out").exists()


def test_bad_npy_and_zarr_data(tmp_path, capsys):
    model = small_model(tmp_path / "m.onnx")
    data = make_data(6)
    folder = write_npy_folder(tmp_path / "npy", data)
    (folder / "s.npy").unlink()
    with pytest.raises(DataError, match=r"no s\.npy for the model's input 's'"):
        evaluate(model, str(folder), scheduler="tcp://127.0.0.1:1")
    np.save(folder / "s.npy", data["s"][:4])
    with pytest.raises(DataError, match=r"different numbers of samples \(x\.npy: 6, s\.npy: 4\)"):
        evaluate(model, str(folder), scheduler="tcp://127.0.0.1:1")
    np.save(folder / "s.npy", data["s"])
    (folder / "x.npy").write_bytes((folder / "x.npy").read_bytes()[:150])
    with pytest.raises(DataError, match=r"x\.npy is not a readable \.npy array"):
        evaluate(model, str(folder), scheduler="tcp://127.0.0.1:1")
    group = tmp_path / "z.zarr"
    write_zarr_group(group, {"x": data["x"].astype(np.float16), "s": data["s"]})
    with pytest.raises(DataError, match=r"z\.zarr/x: input 'x' holds float16"):
        evaluate(model, str(group), scheduler="tcp://127.0.0.1:1")
    v2 = zarr.open_group(str(tmp_path / "v2.zarr"), mode="w", zarr_format=2)
    for name, v in data.items():
        v2.create_array(name=name, shape=v.shape, chunks=v.shape, dtype=v.dtype)[:] = v
    meta = tmp_path / "v2.zarr" / "x" / ".zarray"   # a compressor that would unpickle the data: refused unread
    meta.write_text(json.dumps(dict(json.loads(meta.read_text()), compressor={"id": "pickle", "protocol": 5})))
    with pytest.raises(DataError, match=r"v2\.zarr/x: its codecs include pickle"):
        evaluate(model, str(tmp_path / "v2.zarr"), scheduler="tcp://127.0.0.1:1")
    write_zarr_group(group, {"x": data["x"]})
    assert main(["eval", model, "--data", str(group)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "z.zarr: no array for the model's input 's' (the group holds x)" in err


def test_corrupt_data_mid_run_keeps_what_was_written(tmp_path, client):
    """A file whose header reads but whose data does not: the error names the file and its
    samples, the batches written stay, and --resume finishes once the file is fixed."""
    model = small_model(tmp_path / "m.onnx", width=2000)
    data = make_data(40, width=2000)
    folder = write_npz_folder(tmp_path / "data", data, [5] * 8, compressed=True)
    victim = folder / "a30.npz"    # the fourth file: samples 15..19
    good = victim.read_bytes()
    broken = bytearray(good)
    mid = len(broken) // 2
    broken[mid:mid + 64] = bytes(64)
    victim.write_bytes(bytes(broken))
    out = tmp_path / "out"
    with pytest.raises(DataError, match=r"a30\.npz \(samples 15\.\.19 of the dataset\).*--resume"):
        evaluate(model, str(folder), str(out), batch=5, scheduler=client)
    kept = sorted(out.glob("batch-*.npz"))
    assert "batch-000003.npz" not in [p.name for p in kept]
    want = sequential(model, data, 5)
    from gpukernels.archive import read_npz

    for p in kept:   # what was written is whole and right
        i = int(p.stem.split("-")[1])
        got = read_npz(p)
        np.testing.assert_allclose(got["probs"], want["probs"][i * 5:(i + 1) * 5], rtol=1e-6, atol=1e-7)
    victim.write_bytes(good)
    result = evaluate(model, str(folder), str(out), batch=5, resume=True, scheduler=client)
    assert result.batches_skipped == len(kept)
    assert_same(read_outputs(out), want)


def test_a_model_error_names_the_sample(tmp_path, client):
    model = gather_model(tmp_path / "g.onnx")
    idx = np.arange(12, dtype=np.int64).reshape(12, 1) % 10
    idx[7] = 99
    folder = write_npz_folder(tmp_path / "data", {"i": idx}, [4, 8])
    with pytest.raises(ValueError, match=r"failed on sample 7 of the dataset \(.*a2\.npz, sample 3 in the file\)"):
        evaluate(model, str(folder), batch=6, scheduler=client)


# --------------------------------------------------------------------- extras and threads


def test_missing_extra_names_it(tmp_path, monkeypatch, capsys):
    model = small_model(tmp_path / "m.onnx")
    monkeypatch.setitem(sys.modules, "distributed", None)
    with pytest.raises(MissingExtraError, match=r"pip install 'gpukernels\[dist\]'"):
        evaluate(model, str(tmp_path))
    assert main(["eval", model, "--data", str(tmp_path)]) == 2
    assert "install the 'dist' extra" in capsys.readouterr().err


def test_the_rest_of_gpukernels_never_imports_the_extras():
    code = ("import sys, gpukernels, gpukernels.cli, gpukernels.runtime, gpukernels.parity, gpukernels.evaluation\n"
            "gpukernels.cli.build_parser()\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('dask', 'distributed', 'zarr', 'matplotlib', 'dask_cuda')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"


def test_bad_arguments(tmp_path, capsys):
    model = small_model(tmp_path / "m.onnx")
    folder = write_npy_folder(tmp_path / "data", make_data(4))
    with pytest.raises(EvalArgumentError, match="--batch"):
        evaluate(model, str(folder), batch=0)

    if not cuda_status().available:   # a local cluster on a GPU this machine lacks: exit 3
        assert main(["eval", model, "--data", str(folder), "--device", "cuda"]) == 3
        assert "device cuda:0 is not usable" in capsys.readouterr().err
    assert main(["eval", model, "--data", str(folder), "--resume"]) == 2
    assert "--resume continues a run written to --output" in capsys.readouterr().err


def test_set_cpu_threads_sets_host_and_blas_threads(monkeypatch):
    from threadpoolctl import threadpool_info

    from gpukernels.host import host_threads, set_cpu_threads

    monkeypatch.delenv("GPUKERNELS_CPU_THREADS", raising=False)
    try:
        assert set_cpu_threads(1) == 1
        assert host_threads() == 1
        assert all(p["num_threads"] == 1 for p in threadpool_info() if p["user_api"] == "blas")
    finally:
        set_cpu_threads(None)
    assert "GPUKERNELS_CPU_THREADS" not in os.environ
    with pytest.raises(ValueError):
        set_cpu_threads(0)


def test_parity_without_devices_uses_the_usable_ones(tmp_path, capsys):

    model = small_model(tmp_path / "m.onnx")
    assert main(["parity", model, "--against", "reference"]) == 0
    err = capsys.readouterr().err
    assert ("devices: cpu and cuda:0" if cuda_status().available else "devices: cpu only") in err


# --------------------------------------------------------------- a worker dies (runs last)


@pytest.mark.parametrize("pause", [0.0, 0.3], ids=["running", "results-held"])
def test_a_worker_killed_mid_run_loses_and_repeats_no_sample(tmp_path, client, pause):
    """pause: the driver waits before the kill, so that the victim holds finished batches
    not yet fetched (they are lost with it and must run again, not fail the run)."""
    client.wait_for_workers(2, timeout=60)       # the nanny restarts the worker killed before
    model = small_model(tmp_path / "m.onnx", width=256)
    data = make_data(120, width=256)
    src = str(write_npy_folder(tmp_path / "data", data))
    out = tmp_path / "out"
    killed = {}

    def kill_one(done, total, r):
        if not killed:
            time.sleep(pause)
            pids = client.run(os.getpid)
            victim = next(a for a in pids if a != r.worker)
            os.kill(pids[victim], signal.SIGKILL)
            killed.update(address=victim, done=done, total=total)

    result = evaluate(model, src, str(out), batch=2, scheduler=client, progress=kill_one)
    assert killed["done"] < killed["total"]
    assert sorted(result.written) == list(range(60))                 # every batch written once
    assert any("left during the run" in n and killed["address"] in n for n in result.notes), result.notes
    assert_same(read_outputs(out), sequential(model, data, 2))
    # the nanny restarts the killed worker; no later test needs it (this one runs last)
