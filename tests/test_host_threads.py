"""parallel_ranges: host work split over threads gives the same result as one thread,
keeps the caller's NumPy error state, and re-raises a worker's exception."""

import numpy as np
import pytest

from gpukernels import xp


def test_ranges_cover_everything_once(monkeypatch):
    monkeypatch.setenv("GPUKERNELS_CPU_THREADS", "4")
    seen = np.zeros(1000, np.int64)

    def fn(lo, hi):
        seen[lo:hi] += 1

    xp.parallel_ranges(1000, 10, fn)
    assert (seen == 1).all()


def test_small_work_stays_in_the_calling_thread(monkeypatch):
    import threading

    monkeypatch.setenv("GPUKERNELS_CPU_THREADS", "4")
    threads = set()
    xp.parallel_ranges(10, 10, lambda lo, hi: threads.add(threading.get_ident()))
    assert threads == {threading.get_ident()}


def test_errstate_and_exceptions_reach_the_workers(monkeypatch):
    monkeypatch.setenv("GPUKERNELS_CPU_THREADS", "3")

    def overflow(lo, hi):
        np.exp(np.full(hi - lo, 1000.0))

    with np.errstate(over="raise"):
        with pytest.raises(FloatingPointError):
            xp.parallel_ranges(300, 10, overflow)
    with np.errstate(over="ignore"):
        xp.parallel_ranges(300, 10, overflow)  # silent, in every thread


def test_threaded_kernels_match_single_thread(monkeypatch, rng):
    from gpukernels.kernels import KernelContext, kernel_class

    x = rng.standard_normal((64, 256, 64)).astype(np.float32)
    results = {}
    for threads in ("1", "4"):
        monkeypatch.setenv("GPUKERNELS_CPU_THREADS", threads)
        results[threads] = [kernel_class(op)(KernelContext("cpu"))(x).numpy() for op in ("Softmax", "Gelu", "Sigmoid")]
    for a, b in zip(results["1"], results["4"]):
        np.testing.assert_array_equal(a, b)
