"""evaluate(): run a model over a dataset on Dask, write the outputs, compare with another
runtime.  See gpukernels.evaluation for the whole picture."""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..archive import safe_name
from ..host import tuning
from .spec import EvalArgumentError, EvalError, load_spec

AGAINST = ("onnxruntime", "reference", "cpu", "cuda")


@dataclass
class EvalResult:
    """What a run did.  samples_per_second counts the samples run by this call over
    run_seconds (from the first task submitted to the last batch written, so each worker's
    Session preparation included; the cluster's start, shipping the model and loading
    gpukernels' code on the workers are in seconds only)."""

    model: str
    data: str
    data_format: str
    output: "str | None"
    output_format: "str | None"
    device: str
    samples: int
    batch: int
    batches: int
    batches_run: int
    batches_skipped: int            # already written (--resume)
    scheduler: str
    seconds: float
    run_seconds: float
    samples_per_second: float
    workers: list = field(default_factory=list)   # [{"address", "host", "nthreads", "threads", "batches"}]
    written: list = field(default_factory=list)   # batch indices written by this call, in order
    parity: object = None           # stats.ParitySummary with --against
    notes: list = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.parity is None or self.parity.passed

    def to_dict(self) -> dict:
        d = asdict(self)
        d["parity"] = self.parity.to_dict() if self.parity is not None else None
        d["passed"] = self.passed
        d.pop("written")
        return d


def _resolve_device(device: str, local: bool) -> str:
    from ..errors import DeviceError
    from ..xp import Device, cuda_status, require

    if device in (None, "auto"):
        return "cuda:0" if cuda_status().available else "cpu"
    try:
        dev = Device.parse(device)
    except DeviceError as exc:
        raise EvalArgumentError(str(exc)) from None
    if local:
        require(dev)
    return str(dev)


def default_batch(source, run_size, n: int) -> int:
    """About evaluation.batch_bytes of input per batch (host/tuning.py: 4 MiB), at most
    evaluation.max_batch samples (256), and at least 16 batches when there are that many
    samples; a multiple of the model's fixed batch dimension."""
    per_sample = sum(int(np.prod(s, dtype=np.int64)) * np.dtype(source.dtypes[k]).itemsize
                     for k, s in source.shapes.items())
    by_bytes = tuning.value("evaluation.batch_bytes") // max(1, per_sample)
    b = max(1, min(tuning.value("evaluation.max_batch"), by_bytes, math.ceil(n / 16)))
    if run_size:
        b = max(run_size, run_size * round(b / run_size))
    return b


def _peek_batch(output) -> "int | None":
    """The batch of an existing eval output (so --resume needs no --batch)."""
    import json

    p = Path(output)
    try:
        if (p / "index.json").is_file():
            return int(json.loads((p / "index.json").read_text("utf-8"))["batch"])
        if (p / "zarr.json").is_file():
            meta = json.loads((p / "zarr.json").read_text("utf-8"))
            return int(meta["attributes"]["gpukernels_eval"]["batch"])
        if (p / ".zattrs").is_file():
            return int(json.loads((p / ".zattrs").read_text("utf-8"))["gpukernels_eval"]["batch"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return None


def _check_args(batch, workers, threads, against, resume, output, rtol, atol) -> None:
    for flag, v in (("batch", batch), ("workers", workers), ("threads", threads)):
        if v is not None and (not isinstance(v, int) or v < 1):
            raise EvalArgumentError(f"--{flag} must be a whole number of at least 1, got {v!r}")
    if against is not None and against not in AGAINST:
        raise EvalArgumentError(f"--against must be one of {', '.join(AGAINST)}, got {against!r}")
    if resume and not output:
        raise EvalArgumentError("--resume continues a run written to --output; give the output")
    for flag, v in (("rtol", rtol), ("atol", atol)):
        if not (v >= 0 and math.isfinite(v)):
            raise EvalArgumentError(f"--{flag} must be a finite number >= 0, got {v!r}")


def _progress(progress, total: int):
    """(callback(done, result), closer) for the progress argument."""
    if progress is False:
        return (lambda done, r: None), (lambda: None)
    if callable(progress):
        return (lambda done, r: progress(done, total, r)), (lambda: None)
    from ..progress import Progress

    bar = Progress(total, "eval")
    return (lambda done, r: bar.advance(f"batch {r.index}")), (lambda: bar.__exit__(None, None, None))


def evaluate(model, data, output=None, *, device: str = "auto", batch: "int | None" = None,
             workers: "int | None" = None, scheduler=None, against: "str | None" = None, resume: bool = False,
             rtol: float = 1e-4, atol: float = 1e-5, report=None, options: "dict | None" = None,
             threads: "int | None" = None, progress=None) -> EvalResult:
    """Run model over the dataset at data on a Dask cluster; returns an EvalResult.

    model: an .onnx file.  data: a folder of .npz files, a folder of .npy files (one per
    input) or a Zarr group (see gpukernels.evaluation.data).  output: a folder of .npz
    files, or a Zarr group when the path ends in .zarr (see gpukernels.evaluation.store);
    None writes nothing.  device: 'auto' (cuda when usable here), 'cpu', 'cuda' or
    'cuda:N'.  batch: samples per task and per written batch (default: see
    default_batch; with resume, the output's).  workers: local worker processes
    (default: one per core, or one per GPU).  scheduler: the address of an existing
    Dask scheduler (tcp://host:8786) or a distributed.Client; None starts a local
    cluster and closes it afterwards.  against: 'onnxruntime', 'reference', 'cpu' or
    'cuda' compares every sample (rtol, atol) and fills result.parity; report: the
    Markdown report's path (default with an output: OUTPUT-parity.md beside it; the PNG
    histogram goes beside the report).  resume: skip the batches the output already
    holds.  options: Session options.  threads: host threads per task (default: the
    cores of each machine divided by the task threads of its workers).  progress: None
    (a bar on a terminal), False, or callable(done, total, batch_result).

    Errors: DataError for bad data (naming the file and sample) or an output that
    exists without resume; the model's own errors as Session raises them;
    MissingExtraError when the 'dist' extra is missing; EvalArgumentError for
    arguments that cannot be used.  A failure mid-run keeps every batch written.
    """
    t_start = time.perf_counter()
    from .extras import require

    require("distributed", "gpukernels eval")
    _check_args(batch, workers, threads, against, resume, output, rtol, atol)
    if against and (report is not None or output):
        require("matplotlib", "the parity report's histogram")
    from .data import open_source
    from .store import open_store

    spec, model_bytes = load_spec(model)
    local = scheduler is None
    device = _resolve_device(device, local)
    if against in ("cpu", "cuda"):
        _resolve_device(against, local)
    source = open_source(data, spec)
    n = source.n
    if batch is None and resume:
        batch = _peek_batch(output)
    batch = batch or default_batch(source, spec.run_size, n)
    if spec.run_size and batch % spec.run_size:
        raise EvalArgumentError(f"model {safe_name(spec.path)} runs {spec.run_size} samples at a time (its fixed "
                                f"first dimension); --batch must be a multiple of it, got {batch}")
    manifest = {"format": "gpukernels-eval/1", "model_digest": spec.digest, "samples": n, "batch": batch,
                "outputs": list(spec.outputs), "against": against, "rtol": rtol, "atol": atol,
                "device": device, "model": str(model), "data": str(data), "data_format": source.kind}
    store = open_store(output, manifest, resume) if output else None
    batches = [(i, i * batch, min(n, (i + 1) * batch)) for i in range(math.ceil(n / batch))]
    done = store.done(batches) if (store is not None and resume) else set()
    pending = [b for b in batches if b[0] not in done]

    per_sample = None
    if against:
        per_sample = {o: [np.zeros(n), np.zeros(n), np.zeros(n, bool)] for o in spec.outputs}
        for i in sorted(done):
            lo, hi = batches[i][1], batches[i][2]
            for o, vals in store.read_errors(i).items():
                for j in range(3):
                    per_sample[o][j][lo:hi] = vals[j]

    result = EvalResult(str(model), str(data), source.kind, str(output) if output else None,
                        store.kind if store else None, device, n, batch, len(batches), 0, len(done),
                        "none (nothing to run)", 0.0, 0.0, 0.0)
    if pending:
        _run(result, spec, model_bytes, source, store, pending, scheduler, workers, device, against, rtol,
             atol, options, threads, per_sample, progress)
    if against:
        from .stats import ParitySummary, summarize

        summary = ParitySummary(against, device, rtol, atol, n,
                                [summarize(o, *per_sample[o]) for o in spec.outputs])
        if report is None and output:
            report = Path(output).with_name(Path(output).name + "-parity.md")
        if report is not None:
            from .report import write_report

            summary.report, summary.histogram = write_report(
                report, summary, per_sample, safe_name(spec.path), safe_name(data))
        result.parity = summary
    result.seconds = time.perf_counter() - t_start
    return result


def _run(result, spec, model_bytes, source, store, pending, scheduler, workers, device, against, rtol, atol,
         options, threads, per_sample, progress) -> None:
    from distributed import as_completed
    from distributed.scheduler import KilledWorker

    from .cluster import connect, host_nthreads, worker_table
    from .worker import Job, ModelPlugin, run_batch, with_message

    cluster = connect(scheduler, workers, device, threads)
    result.scheduler = cluster.description
    result.notes += cluster.notes
    client = cluster.client
    payload, base_dir = model_bytes, None
    if spec.external_data:   # the workers read the weights beside the model file (a shared file system)
        payload, base_dir = str(Path(spec.path).resolve()), str(Path(spec.path).resolve().parent)
    plugin = ModelPlugin(spec.digest, payload, base_dir)
    futures = []
    try:
        client.register_plugin(plugin)
        table = worker_table(client)
        job = Job(spec.digest, safe_name(spec.path), device, tuple(sorted((options or {}).items())), against,
                  rtol, atol, spec.run_size, tuple(spec.outputs), host_nthreads(table), threads)
        token = uuid.uuid4().hex[:8]
        t0 = time.perf_counter()
        index_of = {}
        for i, lo, hi in pending:
            fut = client.submit(run_batch, job, i, source.part(lo, hi), key=f"gpukernels-eval-{token}-{i}",
                                pure=False, priority=-i)
            index_of[fut.key] = (i, lo, hi)
            futures.append(fut)
        advance, close_bar = _progress(progress, len(pending))
        written = set()
        stats = {}

        def write(r) -> None:
            if r.index in written:     # a batch is written once, whatever the cluster did
                return
            if store is not None:
                store.write(r.index, r.start, r.stop, r.outputs, r.errors)
            if r.errors is not None:
                for o, vals in r.errors.items():
                    for j in range(3):
                        per_sample[o][j][r.start:r.stop] = vals[j]
            written.add(r.index)
            for note in r.notes:
                if note not in result.notes:
                    result.notes.append(note)
            result.written.append(r.index)
            s = stats.setdefault(r.worker, {"address": r.worker, "host": r.host, "threads": r.threads, "batches": 0})
            s["batches"] += 1

        try:
            done = as_completed(futures, loop=client.loop)
            for fut in done:
                if fut.status in ("lost", "pending"):   # finished, but its result left with a worker
                    done.add(fut)                        # that died: it runs again, wait for it
                    continue
                if fut.status != "finished":
                    _fail(fut, futures, index_of, write, source, store, result, KilledWorker, with_message)
                r = fut.result()
                write(r)
                fut.release()
                advance(len(written), r)
        finally:
            close_bar()
        result.run_seconds = time.perf_counter() - t0
        result.batches_run = len(written)
        run_samples = sum(hi - lo for i, lo, hi in pending)
        result.samples_per_second = run_samples / result.run_seconds if result.run_seconds > 0 else 0.0
        after = worker_table(client)
        for address, s in stats.items():
            w = table.get(address) or after.get(address) or {}
            s["nthreads"] = w.get("nthreads")
        result.workers = sorted(stats.values(), key=lambda s: s["address"])
        lost = sorted(set(table) - set(after))
        if lost:
            result.notes.append(f"{len(lost)} worker(s) left during the run ({', '.join(lost)}); "
                                "their batches ran on other workers")
    finally:
        if futures:
            try:
                client.cancel([f for f in futures if not f.done()])
            except Exception:  # noqa: BLE001 - best effort on a cluster that may be gone
                pass
        if cluster.local is None:
            try:
                client.unregister_worker_plugin(plugin.name)
            except Exception:  # noqa: BLE001
                pass
        cluster.close()


def _fail(fut, futures, index_of, write, source, store, result, KilledWorker, with_message):
    """Write every batch that finished, then raise fut's error with where it happened."""
    for other in futures:
        if other is not fut and other.status == "finished":
            try:
                write(other.result())
            except Exception:  # noqa: BLE001 - the first error is the one to report
                break
    i, lo, hi = index_of[fut.key]
    exc = fut.exception() if fut.status == "error" else None
    kept = (f"; the {len(result.written)} batch(es) written by this run are kept in {safe_name(store.path)}: "
            "fix the cause and rerun with --resume to continue" if store is not None else "")
    where = source.describe(lo, hi)
    if exc is None:
        raise EvalError(f"batch {i} ({where}) was cancelled: the cluster went away?{kept}")
    if isinstance(exc, KilledWorker):
        raise EvalError(f"batch {i} ({where}) was running on workers that died {exc.allowed_failures + 1} "
                        f"times (out of memory, or a crash in a native library?){kept}") from None
    raise with_message(exc, f"{exc}{kept}") from None
