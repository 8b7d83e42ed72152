"""The Dask cluster eval runs on: an existing one (an address or a Client), or a local
one started for the run and closed after it.

Local, CPU: one worker process per core, one task thread each (measured on 2 cores: two
processes with one thread each run a ResNet-class model 1.36x faster than one process
with two threads, and two processes with two threads each 2.3x slower).  Local, CUDA:
dask-cuda's LocalCUDACluster (one worker per GPU) when it is installed, else one worker.
On every cluster each task limits its host threads (gpukernels' and the BLAS library's)
to the cores of its machine divided by the task threads of all workers on that machine.

Local workers start without the environment Dask's nanny gives workers by default
(``distributed.nanny.pre-spawn-environ``): ``MALLOC_TRIM_THRESHOLD_=65536`` makes glibc
map every array over 64 KiB afresh and page-fault it in on every run (a ResNet-18 Session
ran 12.7 samples/s in such a worker against 20.0 without it, and 19.7 in the main
process), and the one-thread BLAS variables are set here from the thread plan instead.
Local workers also run without Dask's statistical profiler
(``distributed.worker.profile.enabled``): it samples the task thread's stack every 10 ms
on the worker's event loop, taking the GIL from the model's run each time (the worker's
event loop used 4.7% of a core during a ResNet-18 run with it, 2.2% without).
Workers of an existing cluster keep the environment and configuration they were started
with (Dask's default includes the trim threshold and the profiler): leave them out in
their Dask configuration (``distributed.nanny.pre-spawn-environ``,
``distributed.worker.profile.enabled: false``) for the same speed.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field

from ..archive import safe_name
from .spec import EvalArgumentError
from .worker import cores, probe


@dataclass
class Cluster:
    client: object
    description: str
    local: object = None          # the LocalCluster we started (closed by close())
    owns_client: bool = False
    notes: list = field(default_factory=list)

    def close(self) -> None:
        if self.owns_client:
            try:
                self.client.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass
        if self.local is not None:
            try:
                self.local.close()
            except Exception:  # noqa: BLE001
                pass


def _thread_env(n: int) -> dict:
    v = str(n)
    return {"OMP_NUM_THREADS": v, "OPENBLAS_NUM_THREADS": v, "MKL_NUM_THREADS": v, "GPUKERNELS_CPU_THREADS": v}


# what Dask's nanny would put into a local worker's environment, left out (see above)
_NANNY_ENVIRON = {"MALLOC_TRIM_THRESHOLD_": None, "OMP_NUM_THREADS": None, "MKL_NUM_THREADS": None,
                  "OPENBLAS_NUM_THREADS": None}


def _plain_worker_environment():
    """A context in which local clusters start workers without the nanny's environment
    and without the profiler (see the module docstring)."""
    try:
        import dask
    except ImportError:  # pragma: no cover -- distributed depends on dask
        return contextlib.nullcontext()
    return dask.config.set({"distributed.nanny.pre-spawn-environ": dict(_NANNY_ENVIRON),
                            "distributed.worker.profile.enabled": False})


def connect(scheduler, workers: "int | None", device: str, threads: "int | None") -> Cluster:
    """The cluster for a run (see the module docstring)."""
    import distributed

    if isinstance(scheduler, distributed.Client):
        return Cluster(scheduler, f"client of {safe_name(scheduler.scheduler.address)}")
    if scheduler:
        try:
            client = distributed.Client(scheduler, timeout="15s", set_as_default=False)
        except (OSError, TimeoutError, ValueError) as exc:
            raise EvalArgumentError(f"--scheduler {safe_name(scheduler)}: cannot connect ({safe_name(exc)})") from None
        try:
            client.wait_for_workers(1, timeout=30)
        except (TimeoutError, OSError):
            client.close()
            raise EvalArgumentError(f"--scheduler {safe_name(scheduler)}: the scheduler has no workers") from None
        return Cluster(client, f"scheduler {safe_name(scheduler)}", owns_client=True)
    with _plain_worker_environment():
        local, what, notes = _start_local(workers, device, threads)
    client = distributed.Client(local, set_as_default=False)
    return Cluster(client, what, local=local, owns_client=True, notes=notes)


def _start_local(workers, device: str, threads):
    """(local cluster, description, notes) for a run without --scheduler."""
    import distributed

    notes = []
    quiet = dict(dashboard_address=":0", silence_logs=logging.ERROR)   # ":0": no fixed port to clash on
    if device.startswith("cuda"):
        try:
            from dask_cuda import LocalCUDACluster
        except ImportError:
            LocalCUDACluster = None
        if LocalCUDACluster is not None:
            local = LocalCUDACluster(n_workers=workers, threads_per_worker=1, **quiet)
            what = "local CUDA cluster (dask-cuda, one worker per GPU)"
        else:
            n = workers or 1
            local = distributed.LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                                             env=_thread_env(max(1, cores() // n)), **quiet)
            what = f"local cluster, {n} worker(s) on {device}"
            notes.append("dask-cuda is not installed: one local worker on the GPU; install the 'dist-cuda' "
                         "extra (pip install 'gpukernels[dist-cuda]') for one worker per GPU")
    else:
        n = workers or cores()
        per = threads or max(1, cores() // n)
        local = distributed.LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                                         env=_thread_env(per), **quiet)
        what = f"local cluster, {n} worker process(es)"
    return local, what, notes


def worker_table(client) -> dict:
    """{address: {"host", "nthreads", "cores"}} for every worker now connected."""
    try:
        info = client.scheduler_info(n_workers=-1)
    except TypeError:  # older distributed lists every worker without the argument
        info = client.scheduler_info()
    found = client.run(probe, on_error="ignore")
    table = {}
    for address, w in info.get("workers", {}).items():
        if address not in found:
            continue
        host, ncores = found[address]
        table[address] = {"host": host, "nthreads": int(w.get("nthreads", 1)), "cores": int(ncores)}
    return table


def host_nthreads(table: dict) -> dict:
    """{hostname: task threads of all workers on it}."""
    out: dict = {}
    for w in table.values():
        out[w["host"]] = out.get(w["host"], 0) + w["nthreads"]
    return out
