"""Host threads: large host kernels split their work over a few threads.

NumPy releases the GIL inside its loops, so big elementwise work on the host can be
split over threads.  Kernels hand over independent ranges (``parallel_ranges``) or
blocks (``host_blocks``) of a loop; the threads are one process-wide pool.  Each range
runs in a copy of the caller's context (``contextvars``) and NumPy error state, so a
worker sees what the calling thread sees: the current run's buffer arena
(``host.arena``) and a kernel's active scopes.
"""

from __future__ import annotations

import contextvars
import itertools
import os
import threading

import numpy as np

from ..xp import is_cupy_array
from . import tuning
from .arena import host_empty

_POOL = None


_CORES = max(1, min(os.cpu_count() or 1, 8))  # os.cpu_count() costs ~3 us a call


def host_threads() -> int:
    """Worker threads for large host kernels: GPUKERNELS_CPU_THREADS, else the number of
    cores (at most 8)."""
    value = os.environ.get("GPUKERNELS_CPU_THREADS")
    if value and value.isdigit():
        return max(1, int(value))
    return _CORES


_BLAS_LIMITS = None  # the threadpoolctl limiter set_cpu_threads installed (restores on None)


def set_cpu_threads(n: "int | None") -> "int | None":
    """Use at most n threads on the host for everything gpukernels runs in this process:
    its own host threads (host_threads(), through GPUKERNELS_CPU_THREADS) and the
    BLAS/OpenMP thread pools of the loaded libraries (through threadpoolctl, when it is
    installed).  None goes back to the defaults.  Returns n.

    One process with several threads or several processes with one thread each: the
    product must not exceed the cores, or every run slows down (``gpukernels eval`` sets
    this in each worker so that workers x threads fit the machine)."""
    global _BLAS_LIMITS
    if n is not None:
        n = int(n)
        if n < 1:
            raise ValueError(f"set_cpu_threads: n must be at least 1, got {n}")
    if _BLAS_LIMITS is not None:
        _BLAS_LIMITS.restore_original_limits()
        _BLAS_LIMITS = None
    if n is None:
        os.environ.pop("GPUKERNELS_CPU_THREADS", None)
        return None
    os.environ["GPUKERNELS_CPU_THREADS"] = str(n)
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # optional: without it only gpukernels' own threads are limited
        return n
    _BLAS_LIMITS = threadpool_limits(limits=n)
    return n


_POOL_THREAD = threading.local()  # .active: set in the pool's threads


def on_host_thread() -> bool:
    """Whether the caller is one of the host threads (a range of parallel_ranges)."""
    return getattr(_POOL_THREAD, "active", False)


def parallel_ranges(n: int, min_items: int, fn) -> None:
    """Run fn(start, stop) over [0, n), split into one contiguous range per thread when
    every range gets at least min_items items (otherwise in the calling thread).  The
    caller's NumPy error state and context variables apply in every thread; the first
    exception is re-raised.  Called from one of the host threads (a kernel inside a
    range), it runs in that thread: a range waiting for the pool it occupies could wait
    for ever."""
    global _POOL
    workers = min(host_threads(), n // max(1, min_items))
    if workers <= 1 or on_host_thread():
        fn(0, n)
        return
    if _POOL is None or _POOL._max_workers < workers - 1:
        from concurrent.futures import ThreadPoolExecutor

        _POOL = ThreadPoolExecutor(max_workers=max(workers - 1, 1), thread_name_prefix="gpukernels")
    errstate = np.geterr()

    def run(lo, hi):
        _POOL_THREAD.active = True  # the pool's threads run nothing else
        with np.errstate(**errstate):
            fn(lo, hi)

    bounds = [n * i // workers for i in range(workers + 1)]
    # a context can be entered by one thread at a time: one copy per range
    futures = [_POOL.submit(contextvars.copy_context().run, run, bounds[i], bounds[i + 1])
               for i in range(1, workers)]
    try:
        fn(bounds[0], bounds[1])
    finally:
        errors = [f.exception() for f in futures]
    for e in errors:
        if e is not None:
            raise e


def host_blocks(n: int, step: int, fn, threads: int | None = None, min_per_thread: int | None = None) -> None:
    """fn(a, b) for every block [a, b) of [0, n) of at most ``step`` items, on the host threads.

    Blocks are handed out one at a time (a shared counter), not as one fixed range per
    thread: a thread that shares its core with other work (another process, or the
    spinning workers of a runtime that just ran) takes fewer blocks instead of holding
    back the whole call.  At most ``threads`` threads (default: one per two blocks).

    min_per_thread (elementwise chains): as many threads as get that many items each, the
    blocks resized (never past step) so that every thread gets the same number.  A chain
    of many short ufunc calls hands the GIL between the threads at every call, so small
    blocks on two threads run slower than one thread, while a few large blocks per thread
    run 1.2-2x faster (elementwise.thread_min_elems)."""
    if min_per_thread is not None:
        workers = min(host_threads(), n // max(1, min_per_thread), threads or n)
        if workers <= 1:
            threads = 1
        else:
            per_thread = -(-n // (workers * max(1, step)))  # blocks per thread
            step = -(-n // (workers * per_thread))
            threads = workers
    nblocks = -(-n // max(1, step))
    counter = itertools.count()

    def worker(_lo, _hi):
        for i in counter:  # next() of a count is atomic under the GIL
            if i >= nblocks:
                return
            fn(i * step, min(n, (i + 1) * step))

    parallel_ranges(max(1, nblocks // 2 if threads is None else min(threads, nblocks)), 1, worker)


def copy_array(array):
    """A C-contiguous copy of array; large host arrays are copied by several threads."""
    if is_cupy_array(array) or not array.flags.c_contiguous or array.nbytes < tuning.value("copy.thread_min_bytes"):
        return array.copy()
    out = host_empty(array.shape, array.dtype)
    src, dst = array.reshape(-1), out.reshape(-1)
    parallel_ranges(src.size, tuning.value("copy.thread_bytes") // max(1, array.itemsize),
                    lambda lo, hi: np.copyto(dst[lo:hi], src[lo:hi]))
    return out
