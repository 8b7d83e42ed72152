"""The CPU emulator itself (tools/cuda_emu): warp shuffles/votes, block barriers, dynamic
shared memory, atomics, the mma layer, error reporting.  The same kernels
(cuda/selftest.cu) run on a GPU in scripts/gpu_check.sh."""

from __future__ import annotations

import numpy as np
import pytest

import emulator
from gpukernels.errors import CudaKernelError
from gpukernels.gpu import selftest


def _warp_reference(x, block):
    n = x.size
    out = np.zeros((n, 8), np.float32)
    xp = np.zeros(-(-n // block) * block, np.float32)
    xp[:n] = x
    for i in range(n):
        w0 = i // 32 * 32
        lane = i % 32
        w = xp[w0:w0 + 32]
        out[i, 0] = w.astype(np.float64).sum()
        out[i, 1] = w[(lane * 7) % 32]
        out[i, 2] = w[lane - 3] if lane >= 3 else w[lane]
        out[i, 3] = w[lane + 5] if lane + 5 < 32 else w[lane]
        seg = lane // 16 * 16
        out[i, 4] = w[lane ^ 6] if seg <= (lane ^ 6) < seg + 16 else w[lane]
        bal = sum(1 << l for l in range(32) if w[l] > 0)
        out[i, 5] = np.array([bal], np.uint32).view(np.float32)[0]
        out[i, 6] = float(any(w > 2))
        out[i, 7] = float(all(w > -3))
    return out


def test_warp_primitives(emu, rng):
    x = rng.standard_normal(96).astype(np.float32) * 2
    got = selftest.run_warp(emu, x)
    want = _warp_reference(x, 64)
    np.testing.assert_allclose(got[:, 0], want[:, 0], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[:, 1:5], want[:, 1:5])
    np.testing.assert_array_equal(got[:, 5].view(np.uint32), want[:, 5].view(np.uint32))
    np.testing.assert_array_equal(got[:, 6:], want[:, 6:])


def test_block_barrier_shared_atomics(emu, rng):
    x = rng.standard_normal(1000).astype(np.float32)
    sums, total, counts = selftest.run_block(emu, x, block=128)
    xp = np.zeros(1024, np.float32)
    xp[:1000] = x
    blocks = xp.reshape(8, 128)
    np.testing.assert_allclose(sums, blocks.sum(1), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(total[0], x.sum(), rtol=1e-4, atol=1e-3)
    np.testing.assert_array_equal(counts, (blocks > 0).sum(1))


@pytest.mark.parametrize("kind", ["f16", "bf16", "tf32"])
def test_mma_layer(emu, rng, kind):
    A, B, C, want = selftest.mma_case(rng, kind)
    D = selftest.run_mma(emu, kind, A, B, C)
    np.testing.assert_allclose(D, want, rtol=1e-5, atol=1e-4)


def test_out_of_bounds_access_is_an_error(emu):
    # gk_selftest_warp reads x[i] for i < n: claiming n larger than the buffer must fault
    # (guard page) and come back as a CudaKernelError naming the buffer, not crash.
    x = emu.upload(np.ones(2048, np.float32), label="x")
    out = emu.empty((4096 * 2, 8), np.float32, label="out")
    fn = emu.function("selftest.cu", "gk_selftest_warp")
    with pytest.raises(CudaKernelError, match="buffer 'x'|memory fault"):
        emu.launch(fn, (128,), (64,), (x, out, np.int32(8192)), 0, what="oob test")


def test_argument_types_are_checked(emu):
    x = emu.upload(np.ones(64, np.float32))
    out = emu.empty((64, 8), np.float32)
    fn = emu.function("selftest.cu", "gk_selftest_warp")
    with pytest.raises(CudaKernelError, match="int64"):
        emu.launch(fn, (1,), (64,), (x, out, np.int64(64)), 0)
    with pytest.raises(CudaKernelError, match="NumPy scalars"):
        emu.launch(fn, (1,), (64,), (x, out, 64), 0)
    with pytest.raises(CudaKernelError, match="block"):
        emu.launch(fn, (1,), (2048,), (x, out, np.int32(64)), 0)


def test_host_arrays_are_refused_where_cupy_refuses_them(emu):
    # device_array is cupy.ascontiguousarray: a host array is a TypeError there (the
    # selftests used to pass host arrays; real CuPy refused them, the emulator did not)
    host = np.ones(64, np.float32)
    with pytest.raises(TypeError, match="host"):
        emu.device_array(host)
    x = emu.upload(host)
    assert emulator.is_device_array(x) and emu.device_array(x) is x
    out = emu.empty((64, 8), np.float32)
    fn = emu.function("selftest.cu", "gk_selftest_warp")
    with pytest.raises(CudaKernelError, match="host numpy.ndarray"):
        emu.launch(fn, (1,), (64,), (host, out, np.int32(64)), 0)
    with pytest.raises(TypeError, match="Unsupported type"):
        x + host
    with pytest.raises(TypeError, match="Unsupported type"):
        np.concatenate([x, host])
    with pytest.raises(ValueError, match="non-scalar numpy.ndarray"):
        x[...] = host
    assert emulator.is_device_array(x * 2 + 1) and emulator.is_device_array(x[1:].reshape(9, 7))
    x[...] = 3.0  # scalars are fine
    np.testing.assert_array_equal(emu.to_host(x), np.full(64, 3.0, np.float32))
    with pytest.raises(TypeError):
        emu.to_host(host)


def test_upload_keeps_a_views_misalignment_and_strides(emu, rng):
    buf = rng.standard_normal(40).astype(np.float32)
    for view in (buf[1:33], buf[3:35].reshape(4, 8), buf[1:33].reshape(4, 8)[:, ::2], buf[::-3]):
        d = emulator.upload(view)
        assert emu.pointer(d) % 256 == view.ctypes.data % 256
        assert d.strides == view.strides
        np.testing.assert_array_equal(emu.to_host(d), view)
        c = emu.device_array(d)  # cupy.ascontiguousarray: contiguous views are kept as they are
        assert c.flags.c_contiguous
        if view.flags.c_contiguous:
            assert emu.pointer(c) == emu.pointer(d)
        np.testing.assert_array_equal(emu.to_host(c), view)


def test_misaligned_vector_access_is_an_error(emu, rng):
    # the kernels are built with -fsanitize=alignment (trap mode): a 2-float access through a
    # pointer one float off alignment faults, as on a GPU ("misaligned address")
    if not any(f in emulator.CXXFLAGS for f in emulator.ALIGNMENT_FLAGS):
        pytest.skip("GK_EMU_ALIGNMENT=0")
    buf = np.zeros(2 * 8 + 1, np.float32)
    x = emulator.upload(buf[1:].reshape(2, 8))
    assert emu.pointer(x) % 8 == 4
    cos = emu.upload(np.ones((2, 1, 4), np.float32))
    sin = emu.upload(np.zeros((2, 1, 4), np.float32))
    y = emu.empty((2, 8), np.float32)
    fn = emu.function("rotary_embedding.cu", "gk_rotary<float, 2, false, false>")
    args = (x, cos, sin, None, y, np.int64(2), np.int32(8), np.int32(8), np.int32(1), np.int32(1), np.int32(1),
            np.int64(2))
    with pytest.raises(CudaKernelError, match="misaligned address"):
        emu.launch(fn, (1,), (2, 2), args, 0, what="misaligned")
    fn1 = emu.function("rotary_embedding.cu", "gk_rotary<float, 1, false, false>")
    emu.launch(fn1, (1,), (4, 2), args, 0, what="scalar accesses")  # width 1: fine
    np.testing.assert_array_equal(emu.to_host(y), np.zeros((2, 8), np.float32))
