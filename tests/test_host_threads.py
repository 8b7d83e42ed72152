"""parallel_ranges (gpukernels.host): host work split over threads gives the same result
as one thread, keeps the caller's NumPy error state and context variables, and re-raises
a worker's exception."""

import numpy as np
import pytest

from gpukernels import host


def test_ranges_cover_everything_once(monkeypatch):
    monkeypatch.setenv("GPUKERNELS_CPU_THREADS", "4")
    seen = np.zeros(1000, np.int64)

    def fn(lo, hi):
        seen[lo:hi] += 1

    host.parallel_ranges(1000, 10, fn)
    assert (seen == 1).all()


@pytest.mark.parametrize("n,step,least,workers,blocks", [
    (131072, 131072, 65536, 2, 2),     # one block's worth: halved, one per thread
    (262145, 131072, 65536, 2, 4),     # just over two blocks: four equal blocks
    (1210368, 131072, 65536, 2, 10),   # many blocks: an equal number per thread
    (100000, 131072, 65536, 1, 1),     # too little for two threads: one block
    (0, 131072, 65536, 1, 0),
])
def test_blocks_with_a_least_share_per_thread(monkeypatch, n, step, least, workers, blocks):
    """host_blocks(min_per_thread=): every item once, no block longer than step, as many
    threads as get the least share, the same number of blocks for each."""
    import threading

    monkeypatch.setenv("GPUKERNELS_CPU_THREADS", "2")
    seen = np.zeros(n, np.int64)
    sizes, threads = [], set()
    lock = threading.Lock()

    def fn(lo, hi):
        with lock:
            seen[lo:hi] += 1
            sizes.append(hi - lo)
            threads.add(threading.get_ident())

    host.host_blocks(n, step, fn, min_per_thread=least)
    assert (seen == 1).all()
    assert len(sizes) == blocks and all(size <= step for size in sizes)
    assert len(threads) <= workers
    if blocks:
        assert max(sizes) - min(sizes) <= max(sizes) // 2 or blocks == 1


def test_small_work_stays_in_the_calling_thread(monkeypatch):
    import threading

    monkeypatch.setenv("GPUKERNELS_CPU_THREADS", "4")
    threads = set()
    host.parallel_ranges(10, 10, lambda lo, hi: threads.add(threading.get_ident()))
    assert threads == {threading.get_ident()}


def test_errstate_and_exceptions_reach_the_workers(monkeypatch):
    monkeypatch.setenv("GPUKERNELS_CPU_THREADS", "3")

    def overflow(lo, hi):
        np.exp(np.full(hi - lo, 1000.0))

    with np.errstate(over="raise"):
        with pytest.raises(FloatingPointError):
            host.parallel_ranges(300, 10, overflow)
    with np.errstate(over="ignore"):
        host.parallel_ranges(300, 10, overflow)  # silent, in every thread


def test_context_variables_reach_the_workers(monkeypatch):
    import contextvars
    import threading

    monkeypatch.setenv("GPUKERNELS_CPU_THREADS", "3")
    var = contextvars.ContextVar("test_var", default="unset")
    seen = {}
    barrier = threading.Barrier(3)

    def part(lo, hi):
        barrier.wait(timeout=30)  # three ranges, three threads at once
        seen[threading.get_ident()] = var.get()

    token = var.set("caller")
    try:
        host.parallel_ranges(3, 1, part)
    finally:
        var.reset(token)
    assert len(seen) == 3 and set(seen.values()) == {"caller"}


def test_threaded_kernels_match_single_thread(monkeypatch, rng):
    from gpukernels.kernels import KernelContext, kernel_class

    x = rng.standard_normal((64, 256, 64)).astype(np.float32)
    results = {}
    for threads in ("1", "4"):
        monkeypatch.setenv("GPUKERNELS_CPU_THREADS", threads)
        results[threads] = [kernel_class(op)(KernelContext("cpu"))(x).numpy() for op in ("Softmax", "Gelu", "Sigmoid")]
    for a, b in zip(results["1"], results["4"]):
        np.testing.assert_array_equal(a, b)


def _run_both(monkeypatch, fn):
    results = {}
    for threads in ("1", "4"):
        monkeypatch.setenv("GPUKERNELS_CPU_THREADS", threads)
        results[threads] = fn()
    for a, b in zip(results["1"], results["4"]):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceL2", "ReduceLogSumExp",
                                "ReduceSumSquare", "ReduceProd"])
def test_threaded_reductions_match_single_thread(monkeypatch, rng, op):
    from gpukernels.kernels import KernelContext, kernel_class

    x = rng.standard_normal((16, 64, 3, 256)).astype(np.float32)
    xi = rng.integers(-100, 100, (16, 64, 3, 256)).astype(np.int32)

    def run():
        k = kernel_class(op)(KernelContext("cpu"))
        out = []
        for axes in ([-1], [2, 3], [1], [1, 3], [-2]):
            for keepdims in (0, 1):
                out.append(k(x, np.array(axes, np.int64), keepdims=keepdims).numpy())
                if op != "ReduceLogSumExp":  # float types only
                    out.append(k(xi, np.array(axes, np.int64), keepdims=keepdims).numpy())
        return out

    _run_both(monkeypatch, run)


def test_threaded_row_norms_match_single_thread(monkeypatch, rng):
    from gpukernels.kernels import KernelContext, kernel_class

    x = rng.standard_normal((20, 1001, 128)).astype(np.float32)
    s = rng.standard_normal(128).astype(np.float32)
    b = rng.standard_normal(128).astype(np.float32)

    def run():
        ln = kernel_class("LayerNormalization")(KernelContext("cpu"))(x, s, b)
        rms = kernel_class("RMSNormalization")(KernelContext("cpu"))(x, s)
        return [ln.Y.numpy(), ln.Mean.numpy(), ln.InvStdDev.numpy(), rms.numpy()]

    _run_both(monkeypatch, run)


def test_threaded_rotary_matches_single_thread(monkeypatch, rng):
    from gpukernels.kernels import KernelContext, kernel_class

    B, H, S, D = 2, 48, 300, 64
    x4 = rng.standard_normal((B, H, S, D)).astype(np.float32)
    x3 = rng.standard_normal((B, S, H * D)).astype(np.float32)
    pos = rng.integers(0, S + 5, (B, S)).astype(np.int64)
    angles = {rd: rng.uniform(-3, 3, (S + 5, (rd or D) // 2)) for rd in (0, 32)}

    def run():
        k = kernel_class("RotaryEmbedding")(KernelContext("cpu"))
        out = []
        for rd, ang in angles.items():
            c, s = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
            for inter in (0, 1):
                out.append(k(x4, c, s, pos, interleaved=inter, rotary_embedding_dim=rd).numpy())
                out.append(k(x3, c, s, pos, interleaved=inter, rotary_embedding_dim=rd, num_heads=H).numpy())
        return out

    _run_both(monkeypatch, run)


def test_threaded_gather_matches_single_thread(monkeypatch, rng):
    from gpukernels.kernels import KernelContext, kernel_class

    x = rng.standard_normal((3000, 256)).astype(np.float32)
    x3 = rng.integers(-9, 9, (40, 300, 50)).astype(np.int16)
    idx = rng.integers(-3000, 3000, (37, 64)).astype(np.int64)
    idx3 = rng.integers(-300, 300, (700,)).astype(np.int32)

    def run():
        k = kernel_class("Gather")(KernelContext("cpu"))
        return [k(x, idx).numpy(), k(x3, idx3, axis=1).numpy(), k(x3, idx3[:300] % 100 - 50, axis=-1).numpy()]

    _run_both(monkeypatch, run)
    np.testing.assert_array_equal(run()[0], np.take(x, idx, axis=0))
    np.testing.assert_array_equal(run()[1], np.take(x3, idx3, axis=1))


def test_copy_array_is_an_independent_exact_copy(monkeypatch, rng):
    monkeypatch.setenv("GPUKERNELS_CPU_THREADS", "4")
    a = rng.standard_normal((3000, 1000)).astype(np.float32)  # 12 MB: threaded
    b = host.copy_array(a)
    assert b is not a and b.flags.c_contiguous
    np.testing.assert_array_equal(a, b)
    b[0, 0] += 1
    assert a[0, 0] != b[0, 0]
    t = a[:, ::2]  # not contiguous: plain copy
    np.testing.assert_array_equal(host.copy_array(t), t)


def test_scatternd_large_matches_single_thread(monkeypatch, rng):
    from gpukernels.kernels import KernelContext, kernel_class

    data = rng.standard_normal((4096, 1024)).astype(np.float32)
    idx = rng.integers(0, 4096, (512, 1)).astype(np.int64)
    upd = rng.standard_normal((512, 1024)).astype(np.float32)
    out = {}
    for threads in ("1", "4"):
        monkeypatch.setenv("GPUKERNELS_CPU_THREADS", threads)
        out[threads] = kernel_class("ScatterND")(KernelContext("cpu"))(data, idx, upd).numpy()
    np.testing.assert_array_equal(out["1"], out["4"])
    want = data.copy()
    want[idx[:, 0]] = upd
    np.testing.assert_array_equal(out["4"], want)


@pytest.mark.parametrize("shape, perm", [((64, 128, 256), (0, 2, 1)), ((3, 1030, 700), (1, 2, 0)),
                                         ((2048, 1100), (1, 0))])
def test_threaded_transpose_is_exact(monkeypatch, rng, shape, perm):
    """Transpose's tiled host copy split over threads along the output's first axis."""
    from gpukernels.kernels import KernelContext
    from gpukernels.kernels.tensor.shape_ops import Transpose

    x = rng.standard_normal(shape).astype(np.float32)
    expected = np.ascontiguousarray(x.transpose(perm))
    for threads in ("1", "2", "3"):
        monkeypatch.setenv("GPUKERNELS_CPU_THREADS", threads)
        y = Transpose(KernelContext("cpu"))(x, perm=list(perm)).numpy()
        assert y.flags.c_contiguous and np.array_equal(y, expected)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("last", [0, 1])
def test_threaded_arg_reductions_are_exact(monkeypatch, tuning, rng, op, axis, last):
    """ArgMax/ArgMin split over host threads along another axis; ties (many, from
    rounding to a coarse grid) resolved as on one thread; NaN wins as in NumPy."""
    from gpukernels.kernels import KernelContext
    from gpukernels.kernels.math import reductions

    tuning({"arg_reduce.thread_items": 1 << 12})
    x = np.round(rng.standard_normal((37, 300, 5)) * 4).astype(np.float32)
    x[3, 7, 2] = np.nan
    ref_x = np.flip(x, axis) if last else x
    pick = np.argmax if op == "ArgMax" else np.argmin
    expected = pick(ref_x, axis=axis)
    if last:
        expected = x.shape[axis] - 1 - expected
    for threads in ("1", "2", "3"):
        monkeypatch.setenv("GPUKERNELS_CPU_THREADS", threads)
        kernel = getattr(reductions, op)(KernelContext("cpu"))
        y = kernel(x, axis=axis, keepdims=0, select_last_index=last).numpy()
        assert y.dtype == np.int64 and np.array_equal(y, expected)


@pytest.mark.parametrize("onesided, inverse", [(0, 0), (0, 1), (1, 0), (1, 1)])
@pytest.mark.parametrize("channels", [1, 2])
def test_threaded_dft_matches_float64_reference(monkeypatch, tuning, rng, onesided, inverse, channels):
    """DFT with the signals split over host threads, against numpy.fft in float64."""
    from gpukernels.kernels import KernelContext
    from gpukernels.kernels.signal import dft

    tuning({"dft.thread_items": 64})
    x = rng.standard_normal((7, 40, channels)).astype(np.float32)
    sig = x[..., 0] + (1j * x[..., 1] if channels == 2 else 0)
    if onesided and inverse:
        ref = np.fft.irfft(sig, n=78, axis=1)[..., None]
    else:
        full = np.fft.ifft(sig, axis=1) if inverse else np.fft.fft(sig, axis=1)
        if onesided:
            full = full[:, :21]
        ref = np.stack([full.real, full.imag], axis=-1)
    for threads in ("1", "2", "3"):
        monkeypatch.setenv("GPUKERNELS_CPU_THREADS", threads)
        y = dft.DFT(KernelContext("cpu", 20))(x, onesided=onesided, inverse=inverse).numpy()
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
