"""What runs on the Dask workers: the model, a Session per worker, and one batch per task.

The model reaches each worker once, through a worker plugin (``ModelPlugin``) that the
scheduler also hands to workers that join later (a worker restarted after a crash).
Tasks carry the model's digest, never its bytes.  The plugin's setup loads gpukernels'
code on the worker (imports and kernel registration, the bulk of a first Session's
preparation); the first task on a worker builds the Session (and the --against side)
and every later task reuses it.  Each task also applies the thread setting: cores of the
worker's machine divided by the task threads of every worker on that machine (so that
workers x threads never exceed the cores).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import os
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from distributed import get_worker
from distributed.diagnostics.plugin import WorkerPlugin

from ..archive import safe_name, storable
from ..errors import GpuKernelsError, ModelError
from .spec import EvalError

_LOCK = threading.Lock()
_MODELS: dict = {}     # digest -> (payload: bytes | path, base_dir)
_RUNNERS: dict = {}    # (digest, side, device, options, threads) -> runner
_COUNTS: Counter = Counter()
_SINGLE: dict = {}     # (digest, side) -> True: the model runs one sample at a time here
_THREADS = None


class ModelPlugin(WorkerPlugin):
    """Hands the model to a worker once (bytes, or the path for models with external data)."""

    def __init__(self, digest: str, payload, base_dir=None):
        self.name = f"gpukernels-model-{digest}"
        self.digest = digest
        self.payload = payload
        self.base_dir = base_dir

    async def setup(self, worker=None):
        with _LOCK:
            _MODELS[self.digest] = (self.payload, self.base_dir)
        # load gpukernels' code now, off the worker's event loop, not in the first task
        # (a failure is raised again by the first task, which names the batch)
        with contextlib.suppress(Exception):
            await asyncio.get_running_loop().run_in_executor(None, warm_up)

    def teardown(self, worker=None):
        with _LOCK:
            _MODELS.pop(self.digest, None)
            for key in [k for k in _RUNNERS if k[0] == self.digest]:
                del _RUNNERS[key]
            for key in [k for k in _SINGLE if k[0] == self.digest]:
                del _SINGLE[key]


_WARM_LOCK = threading.Lock()
_WARMED: list = []     # [None] once the code is loaded, [exception] when loading it failed


def warm_up() -> None:
    """Import the runtime and every kernel module in this process, once (what the first
    Session of a process spends most of its preparation on: about 0.5 s where Python
    compiles the sources afresh).  The plugin's setup calls it in a thread and every
    Session build before it: a task that arrives while the setup still loads waits for
    it (the registry is complete only then); a failure is raised again to every caller."""
    with _WARM_LOCK:
        if not _WARMED:
            try:
                from ..kernels import load_all
                from ..runtime import Session  # noqa: F401

                load_all()
                _WARMED.append(None)
            except Exception as exc:  # noqa: BLE001 - kept for the tasks to raise
                _WARMED.append(exc)
        failed = _WARMED[0]
    if failed is not None:
        raise failed


@dataclass(frozen=True)
class Job:
    """What every task of a run shares (small: no model, no data)."""

    digest: str
    model_label: str
    device: str
    options: tuple = ()              # Session options as sorted (key, value) pairs
    against: "str | None" = None
    rtol: float = 1e-4
    atol: float = 1e-5
    run_size: "int | None" = None
    outputs: tuple = ()
    host_nthreads: dict = field(default_factory=dict)   # hostname -> task threads of all its workers
    threads: "int | None" = None     # explicit threads per task (None: from the cores)


@dataclass
class BatchResult:
    index: int
    start: int
    stop: int
    outputs: dict                    # output name -> array, samples first
    errors: "dict | None"            # output name -> (max_abs, max_rel, outside) per sample
    worker: str = ""
    host: str = ""
    threads: int = 0
    seconds: float = 0.0
    notes: list = field(default_factory=list)


def worker_stats() -> dict:
    """This process's counters (for tests and diagnostics)."""
    with _LOCK:
        return {"sessions": _COUNTS["sessions"], "tasks": _COUNTS["tasks"], "threads": _THREADS,
                "models": sorted(_MODELS), "pid": os.getpid()}


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def hostname() -> str:
    return socket.gethostname()


def probe() -> tuple:
    """(hostname, cores) of the worker this runs on."""
    return hostname(), cores()


def _apply_threads(job: Job) -> int:
    global _THREADS
    n = job.threads
    if not n:
        total = job.host_nthreads.get(hostname())
        if not total:
            try:
                total = get_worker().state.nthreads
            except (ValueError, AttributeError):
                total = 1
        n = max(1, cores() // max(1, total))
    if n != _THREADS:
        from ..host import set_cpu_threads

        with _LOCK:
            set_cpu_threads(n)
            _THREADS = n
    return n


# ----------------------------------------------------------------------- runners


def _gpukernels_runner(payload, base_dir, device, options):
    from ..runtime import Session

    sess = Session(payload, device=device, options=dict(options), base_dir=base_dir)
    return lambda feeds: sess.run(None, feeds)


def _onnxruntime_runner(payload, base_dir, threads):
    try:
        import onnxruntime as ort
    except ImportError as exc:
        raise ModelError("--against onnxruntime: onnxruntime is not installed on this worker "
                         "(pip install onnxruntime)") from exc
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    try:
        sess = ort.InferenceSession(payload, so, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001
        raise ModelError(f"onnxruntime could not load the model: {exc}") from None

    def run(feeds):
        try:
            return sess.run(None, feeds)
        except Exception as exc:  # noqa: BLE001
            raise ModelError(f"onnxruntime could not run the model: {exc}") from None
    return run


def _reference_runner(payload, base_dir):
    import onnx
    from onnx.reference import ReferenceEvaluator

    proto = onnx.load_from_string(payload) if isinstance(payload, bytes) else onnx.load(payload)
    ref = ReferenceEvaluator(proto)

    def run(feeds):
        try:
            return ref.run(None, feeds)
        except (MemoryError, RecursionError):
            raise
        except Exception as exc:  # noqa: BLE001
            raise ModelError(f"onnx.reference could not run the model: {type(exc).__name__}: {exc}") from None
    return run


def _runner(job: Job, side: str, threads: int):
    """The cached runner of side ('main', 'onnxruntime', 'reference', 'cpu', 'cuda')."""
    device = job.device if side == "main" else side
    key = (job.digest, side, device, job.options, threads if side == "onnxruntime" else 0)
    with _LOCK:
        runner = _RUNNERS.get(key)
        if runner is not None:
            return runner
        if job.digest not in _MODELS:
            raise EvalError(f"model {job.model_label} did not reach this worker (plugin missing)")
        payload, base_dir = _MODELS[job.digest]
        if side == "onnxruntime":
            runner = _onnxruntime_runner(payload, base_dir, threads)
        elif side == "reference":
            runner = _reference_runner(payload, base_dir)
        else:
            warm_up()
            runner = _gpukernels_runner(payload, base_dir, device, job.options)
            _COUNTS["sessions"] += 1
        _RUNNERS[key] = runner
        return runner


def run_model(runner, feeds: dict, count: int, run_size, outputs) -> dict:
    """{output: array of count samples} from runner over feeds of count samples, in runs of
    run_size samples (the last padded by repeating its last sample, then cut)."""
    if run_size is None or run_size == count:
        return _check_outputs(runner(feeds), outputs, count)
    pieces = []
    for lo in range(0, count, run_size):
        hi = min(lo + run_size, count)
        sub = {k: v[lo:hi] for k, v in feeds.items()}
        if hi - lo < run_size:
            pad = run_size - (hi - lo)
            sub = {k: np.concatenate([v, np.repeat(v[-1:], pad, axis=0)]) for k, v in sub.items()}
        got = _check_outputs(runner(sub), outputs, run_size)
        pieces.append({k: v[:hi - lo] for k, v in got.items()})
    return {k: np.concatenate([p[k] for p in pieces]) for k in outputs}


def _check_outputs(values, names, count: int) -> dict:
    out = {}
    for name, v in zip(names, values):
        if not isinstance(v, np.ndarray):
            raise ModelError(f"output {safe_name(name)!r} is a {type(v).__name__}; eval writes tensor outputs "
                             "with the samples on the first axis")
        if v.ndim == 0 or v.shape[0] != count:
            raise ModelError(f"output {safe_name(name)!r} has shape {list(v.shape)} for a run of {count} "
                             "sample(s); eval needs the samples on the first axis of every output")
        out[name] = storable(name, v)
    return out


def with_message(exc: BaseException, message: str) -> BaseException:
    """An exception of exc's type with message (so exit codes and except clauses still match)."""
    try:
        new = copy.copy(exc)
        new.args = (message,)
        if str(new) == message:
            return new
    except Exception:  # noqa: BLE001 - any type whose copy does not work
        pass
    return EvalError(message)


_ERRORS = (GpuKernelsError, ValueError, TypeError, IndexError)


def run_checked(job: Job, side: str, runner, feeds: dict, reader, label: str) -> "tuple[dict, str | None]":
    """(outputs, note) of one batch on one side.  When the batch fails, its samples run one
    at a time: the first that fails is named in the error (with its file); when none
    fails, the model cannot take several samples at once although its batch dimension
    is symbolic (a Reshape to a fixed shape, say), so this worker runs it one sample at a
    time from then on and the note says so."""
    count = reader.stop - reader.start
    key = (job.digest, side)
    size = job.run_size or (1 if key in _SINGLE else None)
    try:
        return run_model(runner, feeds, count, size, job.outputs), None
    except _ERRORS as exc:
        first = exc
    parts = []
    for i in range(count):
        try:
            parts.append(run_model(runner, {k: v[i:i + 1] for k, v in feeds.items()}, 1, job.run_size, job.outputs))
        except _ERRORS as one:
            raise with_message(one, f"{label} failed on {reader.locate(reader.start + i)}: {one}") from None
    if count == 1:   # not reached: the same run failed above
        raise with_message(first, f"{label} failed on {reader.where()}: {first}")
    with _LOCK:
        _SINGLE[key] = True
    note = (f"{label} could not run {count} samples at once ({safe_name(first, 240)}) but runs each alone: "
            "its samples ran one at a time")
    return {k: np.concatenate([p[k] for p in parts]) for k in job.outputs}, note


def run_batch(job: Job, index: int, reader) -> BatchResult:
    """Read the samples of one batch, run them, compare with job.against; runs on a worker."""
    t0 = time.perf_counter()
    threads = _apply_threads(job)
    with _LOCK:
        _COUNTS["tasks"] += 1
    runner = _runner(job, "main", threads)
    feeds = reader.read()
    outputs, note = run_checked(job, "main", runner, feeds, reader, f"model {job.model_label}")
    notes = [note] if note else []
    errors = None
    if job.against:
        from .stats import sample_errors

        other = _runner(job, job.against, threads)
        ref, note = run_checked(job, job.against, other, feeds, reader, f"--against {job.against}")
        notes += [note] if note else []
        errors = {name: sample_errors(outputs[name], ref[name], job.rtol, job.atol) for name in job.outputs}
    try:
        address = get_worker().address
    except ValueError:
        address = ""
    return BatchResult(index, reader.start, reader.stop, outputs, errors, address, hostname(), threads,
                       time.perf_counter() - t0, notes)
