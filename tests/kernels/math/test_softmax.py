"""Softmax, LogSoftmax and Hardmax (kernels/math/softmax.py, logsoftmax_hardmax.py)
against float64 references (tests.reference), with their edge cases, on both paths.  The
host fast paths ('Softmax.along', 'LogSoftmax.along': cache-sized row blocks over threads,
the unshifted softmax rows, reusable output buffers) start at softmax.host_block_elems
(host/tuning.py, 65536) elements."""

from __future__ import annotations

import numpy as np
import pytest

from gpukernels.kernels import KernelContext, kernel_class
from tests.reference import log_softmax as log_softmax_ref
from tests.reference import softmax as softmax_ref


def f64(a):
    return np.asarray(a).astype(np.float64)


def kernel(op, path, device="cpu", opset=None):
    return kernel_class(op)(KernelContext(device, opset=opset, options={"paths": path}))


def softmax(x, path, opset=13, **kw):
    return kernel("Softmax", path, opset=opset)(x, **kw).numpy()


TOL = {np.float32: dict(rtol=1e-6, atol=1e-7), np.float64: dict(rtol=1e-12, atol=1e-15)}


# --------------------------------------------------------------------------- Softmax


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(70, 1000), (3, 50, 701), (9, 10000), (65536, 1), (1, 70000), (65, 1009)])
def test_softmax_rows(device, path, rng, sites_taken, dt, shape):
    x = (rng.standard_normal(shape) * 3).astype(dt)
    with sites_taken() as taken:
        y = kernel("Softmax", path, device)(x).numpy()
    assert ("Softmax.along" in taken) == (device == "cpu" and path == "auto")
    assert y.dtype == dt and y.shape == shape
    np.testing.assert_allclose(y, softmax_ref(x), **TOL[dt])


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_softmax_rows_that_need_the_shift(path, rng, dt):
    """Rows whose exp-sum leaves [1, 2^100] (or is NaN) are redone with the maximum
    subtracted; they sit between ordinary rows of the same block."""
    x = (rng.standard_normal((80, 1000)) * 3).astype(dt)
    x[3] += 200  # exp overflows in float32 (and the sum passes 2^100 in float64)
    x[4] -= 300  # every exp underflows (sum < 1)
    x[5] = -1.0 - np.abs(x[5])  # all negative: sum of exp below 1
    x[6, ::2] = -np.inf  # masked entries: fine without the shift
    x[7] = -np.inf  # all -inf: NaN, as exp/sum gives
    x[8, 10] = np.inf  # +inf: NaN row (inf - inf)
    x[9, 3] = np.nan
    x[10] = 80.0  # large but equal: exactly uniform
    x[11, :] = 1e-3 * np.arange(1000) - 100  # tiny spread far below zero
    y = softmax(x.copy(), path)
    want = softmax_ref(x)
    np.testing.assert_allclose(y, want, **TOL[dt])
    assert np.isnan(y[7]).all() and np.isnan(y[8]).all() and np.isnan(y[9]).all()
    assert not np.isnan(np.delete(y, [7, 8, 9], axis=0)).any()
    np.testing.assert_array_equal(y[6, ::2], 0)
    np.testing.assert_allclose(y[10], 1e-3, rtol=1e-6)


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_softmax_blocks_switch_between_forms(path, rng, dt):
    """Runs of rows that need the shift make the following blocks start shifted; ordinary
    rows switch them back (about 131 rows of 1000 per block, two host threads)."""
    x = (rng.standard_normal((1500, 1000)) * 3).astype(dt)
    x[:500] -= 30  # every row's exp-sum below 1
    x[900:1000] += 200  # overflow rows in the second thread's range
    x[1200:1300] -= 1e4
    x[1250] = -np.inf
    x[510] = 65.0  # an ordinary block's row whose maximum is outside [0, 60]
    y = softmax(x.copy(), path)
    want = softmax_ref(x)
    np.testing.assert_allclose(y, want, **TOL[dt])
    assert np.isnan(y[1250]).all() and not np.isnan(np.delete(y, 1250, axis=0)).any()
    np.testing.assert_allclose(y.sum(-1)[np.arange(1500) != 1250], 1, rtol=1e-5)


def test_softmax_fast_path_boundaries(path, rng, sites_taken):
    """Just below and at the size where the host row path starts; a row sum just at 1."""
    for rows in (63, 64, 65):
        x = rng.standard_normal((rows, 1024)).astype(np.float32)
        with sites_taken() as taken:
            y = softmax(x, path)
        assert ("Softmax.along" in taken) == (path == "auto" and rows >= 64), rows
        np.testing.assert_allclose(y, softmax_ref(x), **TOL[np.float32])
    x = np.zeros((64, 1024), np.float32)
    x[:, 0] = 0.0
    x[:, 1:] = -200.0  # exp sums to exactly 1 (the boundary of the unshifted form)
    np.testing.assert_allclose(softmax(x, path), softmax_ref(x), **TOL[np.float32])


@pytest.mark.parametrize("axis", [0, 1, -2])
def test_softmax_other_axes_large(path, rng, axis):
    x = (rng.standard_normal((200, 50, 40)) * 2).astype(np.float32)  # 7 blocks of slices for axis 1
    np.testing.assert_allclose(softmax(x, path, axis=axis), softmax_ref(x, axis), **TOL[np.float32])


@pytest.mark.parametrize("axis", [1, 2])
def test_softmax_legacy_coerced_rows_large(path, rng, axis):
    x = rng.standard_normal((8, 30, 300)).astype(np.float32)
    y = softmax(x, path, opset=11, axis=axis)
    flat = x.reshape(int(np.prod(x.shape[:axis])), -1)
    np.testing.assert_allclose(y, softmax_ref(flat).reshape(x.shape), **TOL[np.float32])


def test_softmax_half_and_noncontiguous(path, rng):
    x = rng.standard_normal((300, 400)).astype(np.float32)
    y = softmax(x.T, path)  # a transposed view
    np.testing.assert_allclose(y, softmax_ref(x.T), **TOL[np.float32])
    h = x.astype(np.float16)
    yh = softmax(h, path)
    assert yh.dtype == np.float16
    np.testing.assert_allclose(f64(yh), softmax_ref(h), rtol=2e-3, atol=1e-6)


def test_softmax_leaves_input_and_held_outputs_alone(path, rng):
    x1 = rng.standard_normal((2000, 600)).astype(np.float32)  # 4.8 MB: a pooled output
    x2 = rng.standard_normal((2000, 600)).astype(np.float32)
    keep = x1.copy()
    y1 = softmax(x1, path)
    view = y1[5:]
    y2 = softmax(x2, path)
    np.testing.assert_array_equal(x1, keep)
    np.testing.assert_allclose(y1, softmax_ref(x1), **TOL[np.float32])
    del y1
    y3 = softmax(x2, path)  # may reuse a free buffer, never the one ``view`` still shows
    assert not np.shares_memory(y3, view) and not np.shares_memory(y3, y2)
    np.testing.assert_allclose(view, softmax_ref(x1)[5:], **TOL[np.float32])
    np.testing.assert_array_equal(y2, y3)
    y4 = softmax(y3, path)  # the input itself is a pooled buffer
    np.testing.assert_allclose(y4, softmax_ref(y3), **TOL[np.float32])
    np.testing.assert_array_equal(y3, y2)


# ------------------------------------------------------------------------ LogSoftmax


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("opset", [11, 13])
def test_log_softmax_rows(path, rng, sites_taken, dt, opset):
    x = (rng.standard_normal((90, 1000)) * 3).astype(dt)
    x[1] += 1000
    x[2] = -np.inf
    x[3, ::3] = -np.inf
    with sites_taken() as taken:
        y = kernel("LogSoftmax", path, opset=opset)(x).numpy()
    assert ("LogSoftmax.along" in taken) == (path == "auto")
    assert y.dtype == dt
    np.testing.assert_allclose(y, log_softmax_ref(x), rtol=1e-6 if dt == np.float32 else 1e-12,
                               atol=1e-5 if dt == np.float32 else 1e-12)
    assert np.isnan(y[2]).all()


# ----------------------------------------------------------------------------- Gelu
# TODO(lead): this Gelu test belongs with the activation tests (math/activations.py, being
# edited by another helper); it came here from test_softmax_norm_fastpaths.py.


def test_gelu_held_outputs_survive(rng):
    from math import erf

    gelu = kernel_class("Gelu")(KernelContext("cpu", opset=20))
    x1 = (rng.standard_normal(1_500_000) * 3).astype(np.float32)  # 6 MB
    x2 = -x1
    y1 = gelu(x1).numpy()
    y2 = gelu(x2).numpy()
    assert not np.shares_memory(y1, y2)
    pick = rng.integers(0, x1.size, 2000)
    ref = np.array([0.5 * v * (1 + erf(v / np.sqrt(2))) for v in f64(x1[pick])])
    np.testing.assert_allclose(y1[pick], ref, rtol=3e-6, atol=1e-6)
    np.testing.assert_allclose(y2[pick], np.array([0.5 * v * (1 + erf(v / np.sqrt(2))) for v in -f64(x1[pick])]),
                               rtol=3e-6, atol=1e-6)
