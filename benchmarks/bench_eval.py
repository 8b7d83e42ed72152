"""gpukernels eval throughput: a plain Session.run loop vs eval on Dask (issue 17).

    python benchmarks/bench_eval.py [--resnet-samples N] [--bundled-samples N] [--skip-cli-cluster]
                                    [--models bundled,resnet] [--repeat N]

Two models: the bundled one (gpukernels/models/hybrid_block.onnx, batch axis symbolic)
and a ResNet-18-shaped conv net with random weights built here with onnx.helper (input
fixed at 1x3x224x224, so one sample per run).  For each, samples per second of:

* plain loop: one process, a Session with default settings, ``run`` over the dataset
  in the batches eval uses, or one sample per run where the model takes no more (the
  ResNet export fixes its batch at 1; the bundled model's graph reshapes to batch 1);
* eval, 1 worker: ``gpukernels.evaluate(..., workers=1)`` on a local cluster (that
  worker gets every core's thread);
* eval, defaults: ``gpukernels.evaluate(...)`` (one worker process per core, one thread
  each);
* eval, CLI cluster: ``dask scheduler`` + ``dask worker --nworkers 2 --nthreads 1``
  started from the command line, reached through ``scheduler=ADDRESS``;
* by hand, one process per core: the plain loop in that many processes at once, each
  with one thread (``set_cpu_threads(1)``) over its share of the samples, timed from
  their start to the last one's end -- the ceiling eval's defaults aim at, without Dask.

Every time counts the Session's preparation (the plain loop's, each worker's) and all
reading and writing; eval's rate is over ``run_seconds`` (first task submitted to last
batch written: the cluster's start, which includes shipping the model and loading
gpukernels' code on each worker, is reported apart).  The plain loop's process, likewise,
has gpukernels' code loaded before it is timed.  The data is an .npy folder
(memory-mapped), the output an .npz folder.  Targets: eval with 1 worker within 10% of
the plain loop; eval's defaults at least 1.3x the plain loop on the ResNet export.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def resnet18(path: Path, classes: int = 1000, seed: int = 0) -> str:
    """A ResNet-18-shaped network (conv 7x7/2, max pool, 4 stages of 2 basic blocks with
    64/128/256/512 channels, global average pool, Gemm), random He-scaled weights, batch
    normalisation folded into the convolutions' biases, as an inference export has it."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    count = [0]

    def name(prefix):
        count[0] += 1
        return f"{prefix}{count[0]}"

    def conv(x, cin, cout, k, stride, relu=True):
        w, b, y = name("W"), name("B"), name("conv")
        inits.append(numpy_helper.from_array(
            (rng.standard_normal((cout, cin, k, k)) * np.sqrt(2.0 / (cin * k * k))).astype(np.float32), w))
        inits.append(numpy_helper.from_array((rng.standard_normal(cout) * 0.01).astype(np.float32), b))
        nodes.append(helper.make_node("Conv", [x, w, b], [y], kernel_shape=[k, k], strides=[stride, stride],
                                      pads=[k // 2] * 4))
        if not relu:
            return y
        r = name("relu")
        nodes.append(helper.make_node("Relu", [y], [r]))
        return r

    def block(x, cin, cout, stride):
        h = conv(x, cin, cout, 3, stride)
        h = conv(h, cout, cout, 3, 1, relu=False)
        skip = x if stride == 1 and cin == cout else conv(x, cin, cout, 1, stride, relu=False)
        s, r = name("add"), name("relu")
        nodes.append(helper.make_node("Add", [h, skip], [s]))
        nodes.append(helper.make_node("Relu", [s], [r]))
        return r

    x = conv("input", 3, 64, 7, 2)
    nodes.append(helper.make_node("MaxPool", [x], ["pool"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]))
    x, cin = "pool", 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        x = block(x, cin, cout, stride)
        x = block(x, cout, cout, 1)
        cin = cout
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["gap"]))
    nodes.append(helper.make_node("Flatten", ["gap"], ["flat"], axis=1))
    inits.append(numpy_helper.from_array((rng.standard_normal((classes, 512)) * 0.05).astype(np.float32), "fc_w"))
    inits.append(numpy_helper.from_array(np.zeros(classes, np.float32), "fc_b"))
    nodes.append(helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], transB=1))
    graph = helper.make_graph(nodes, "resnet18", [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                                                                 [1, 3, 224, 224])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, classes])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return str(path)


def make_data(folder: Path, model: str, n: int, seed: int = 1) -> dict:
    from gpukernels.evaluation.spec import load_spec

    spec, _ = load_spec(model)
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for inp in spec.inputs:
        arr = rng.standard_normal((n,) + tuple(d or 1 for d in inp.sample_dims)).astype(inp.dtype)
        np.save(folder / f"{inp.name}.npy", arr)
    return {inp.name: np.load(folder / f"{inp.name}.npy", mmap_mode="r") for inp in spec.inputs}


def plain_loop(model: str, data: dict, batch: int, run_size) -> float:
    from gpukernels.runtime import Session

    n = len(next(iter(data.values())))
    step = run_size or batch
    t0 = time.perf_counter()
    sess = Session(model)
    try:
        sess.run(None, {k: np.array(v[:step]) for k, v in data.items()})
        lo = step
    except ValueError:   # a symbolic batch axis the graph fixes (the bundled model): one sample per run
        step, lo = 1, 0
    for lo in range(lo, n, step):
        sess.run(None, {k: np.array(v[lo:lo + step]) for k, v in data.items()})
    return n / (time.perf_counter() - t0), step


def _hand_process(model: str, data_dir: str, lo: int, hi: int, batch: int) -> None:
    """One process of the 'by hand' run: the plain loop over samples [lo, hi), one thread."""
    from gpukernels.host.threads import set_cpu_threads
    from gpukernels.kernels import load_all

    set_cpu_threads(1)
    load_all()
    data = {p.stem: np.load(p, mmap_mode="r")[lo:hi] for p in Path(data_dir).glob("*.npy")}
    print("ready", flush=True)
    sys.stdin.readline()   # every process loaded: start together
    from gpukernels.evaluation.spec import load_spec

    plain_loop(model, data, batch, load_spec(model)[0].run_size)
    print("done", flush=True)


def by_hand(model: str, data_dir: Path, n: int, batch: int, processes: int) -> float:
    """Samples/s of the plain loop in `processes` one-thread processes at once (see the
    module docstring)."""
    bounds = [(i * n // processes, (i + 1) * n // processes) for i in range(processes)]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs = [subprocess.Popen([sys.executable, __file__, "--hand", model, str(data_dir), str(lo), str(hi),
                               str(batch)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
             for lo, hi in bounds]
    try:
        for proc in procs:
            if proc.stdout.readline().strip() != "ready":
                raise RuntimeError("a 'by hand' process failed to start")
        t0 = time.perf_counter()
        for proc in procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        for proc in procs:
            if proc.stdout.readline().strip() != "done":
                raise RuntimeError("a 'by hand' process failed")
        return n / (time.perf_counter() - t0)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def eval_rate(model, data_dir, out_dir, **kw) -> tuple:
    import gpukernels

    shutil.rmtree(out_dir, ignore_errors=True)
    r = gpukernels.evaluate(model, str(data_dir), str(out_dir), device="cpu", progress=False, **kw)
    workers = ", ".join(f"{w['nthreads']}x{w['threads']}" for w in r.workers)
    return r.samples_per_second, r.seconds - r.run_seconds, r.batch, workers


def cli_cluster(tmp: Path):
    """(address, processes) of `dask scheduler` + `dask worker --nworkers 2 --nthreads 1`."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    dask = str(Path(sys.executable).parent / "dask")
    sched_file = tmp / "scheduler.json"
    log = open(tmp / "cluster.log", "w")
    sched = subprocess.Popen([dask, "scheduler", "--host", "127.0.0.1", "--port", "0", "--dashboard-address", ":0",
                              "--scheduler-file", str(sched_file)], env=env, stdout=log, stderr=log)
    for _ in range(300):
        if sched_file.exists() and sched_file.stat().st_size:
            break
        time.sleep(0.1)
    work = subprocess.Popen([dask, "worker", "--scheduler-file", str(sched_file), "--nworkers", "2", "--nthreads",
                             "1", "--no-dashboard"], env=env, stdout=log, stderr=log)
    import json

    address = json.loads(sched_file.read_text())["address"]
    import distributed

    with distributed.Client(address, set_as_default=False) as c:
        c.wait_for_workers(2, timeout=120)
    return address, [work, sched]


def main() -> None:
    if sys.argv[1:2] == ["--hand"]:
        model, data_dir, lo, hi, batch = sys.argv[2:7]
        return _hand_process(model, data_dir, int(lo), int(hi), int(batch))
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--resnet-samples", type=int, default=96)
    p.add_argument("--bundled-samples", type=int, default=1024)
    p.add_argument("--skip-cli-cluster", action="store_true")
    p.add_argument("--models", default="bundled,resnet", help="comma-separated: bundled, resnet (default both)")
    p.add_argument("--repeat", type=int, default=1, help="run every mode this many times (interleaved) and "
                                                        "report the best rate: for a machine shared with other work")
    args = p.parse_args()
    load_before = os.getloadavg()[0]
    from gpukernels.kernels import load_all

    load_all()   # this process's code is loaded before any timing, as eval's workers' is (the plugin's setup)
    from gpukernels.evaluation import default_batch
    from gpukernels.evaluation.data import open_source
    from gpukernels.evaluation.spec import load_spec
    from gpukernels.inputs import bundled_model_path

    tmp = Path(tempfile.mkdtemp(prefix="bench_eval_"))
    procs = []
    try:
        wanted = set(args.models.split(","))
        if not wanted <= {"bundled", "resnet"}:
            p.error(f"--models: choose among bundled, resnet, got {args.models!r}")
        models = []
        if "bundled" in wanted:
            models.append(("bundled hybrid_block 3x32x32", str(bundled_model_path()), args.bundled_samples))
        if "resnet" in wanted:
            models.append(("ResNet-18-shaped 1x3x224x224", resnet18(tmp / "resnet18.onnx"), args.resnet_samples))
        address = None
        if not args.skip_cli_cluster:
            address, procs = cli_cluster(tmp)
        rows = []
        for label, model, n in models:
            data_dir = tmp / f"data_{len(rows)}"
            data = make_data(data_dir, model, n)
            spec, _ = load_spec(model)
            batch = default_batch(open_source(str(data_dir), spec), spec.run_size, n)
            runs = [("eval, 1 worker", dict(workers=1, batch=batch)), ("eval, defaults", {})]
            if address:
                runs.append(("eval, CLI cluster (2 workers x 1 thread)", dict(scheduler=address, batch=batch)))
            best: dict = {}
            for _ in range(args.repeat):
                rate, step = plain_loop(model, data, batch, spec.run_size)
                plain = f"plain loop (Session.run, defaults, {step} sample(s) per run)"
                if rate > best.get(plain, (0,))[0]:
                    best[plain] = (rate, "", batch, "1 process")
                print(label, plain, rate, flush=True)
                hand_rate = by_hand(model, data_dir, n, batch, os.cpu_count() or 1)
                hand = f"by hand: {os.cpu_count()} processes x 1 thread, plain loops"
                if hand_rate > best.get(hand, (0,))[0]:
                    best[hand] = (hand_rate, "", batch, f"{os.cpu_count()} processes")
                print(label, hand, hand_rate, flush=True)
                for what, kw in runs:
                    got = eval_rate(model, data_dir, tmp / "out", **kw)
                    if got[0] > best.get(what, (0,))[0]:
                        best[what] = (got[0], f"{got[1]:.1f} s", got[2], got[3])
                    print(label, what, got, flush=True)
            base = best[plain][0]
            for what, (rate, start, b, workers) in best.items():
                rows.append((label, what, rate, rate / base, start, b, workers))
        print(f"\n{os.cpu_count()} cores, load average {load_before:.1f} before and {os.getloadavg()[0]:.1f} after; "
              f"samples/s over the whole dataset (Session preparation included), best of {args.repeat}\n")
        print("| model | run | samples/s | vs plain loop | cluster start | batch | workers (task threads x host threads) |")
        print("| --- | --- | ---: | ---: | ---: | ---: | --- |")
        for label, what, rate, ratio, start, b, workers in rows:
            print(f"| {label} | {what} | {rate:.1f} | {ratio:.2f}x | {start} | {b} | {workers} |")
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
