"""Small operators of detection heads (issue 15, session 8): TopK's partial selection
and output path, ReduceMax/ReduceMin's column path for short trailing rows, and Pow's
array function, against independent references (exact where the result is exact) and
the array functions against their kernels, to the bit."""

from __future__ import annotations

import numpy as np
import pytest

from gpukernels.kernels import KernelContext
from gpukernels.kernels.base import lookup
from gpukernels.kernels.math import reductions


def _kernel(op, opset, device="cpu"):
    return lookup(op, "", opset)[0](KernelContext(device, opset), opset)


def _topk_reference(x, k, axis, largest):
    """Indices and values by Python's stable sort on float64 keys: larger (smaller)
    first, ties by lower index, NaN as larger than every number."""
    moved = np.moveaxis(np.asarray(x, np.float64), axis, -1)
    rows = moved.reshape(-1, moved.shape[-1])
    idx = np.empty((rows.shape[0], k), np.int64)
    for r, row in enumerate(rows):
        def key(j, row=row):
            v = row[j]
            rank = np.inf if np.isnan(v) else v  # NaN first when largest
            if largest:
                return (0 if np.isnan(v) else 1, -rank, j)
            return (1 if np.isnan(v) else 0, rank, j)
        idx[r] = sorted(range(row.size), key=key)[:k]
    idx = idx.reshape(moved.shape[:-1] + (k,))
    vals = np.take_along_axis(np.moveaxis(np.asarray(x), axis, -1), idx, axis=-1)
    return np.moveaxis(vals, -1, axis), np.moveaxis(idx, -1, axis)


def _topk_inputs(rng):
    base = rng.standard_normal((2, 1008)).astype(np.float32)
    ties = np.round(base * 2) / 2  # many equal values, the k-th among them
    zeros = np.where(rng.random((2, 1008)) < 0.5, -0.0, 0.0).astype(np.float32)
    nans = base.copy()
    nans[0, [3, 700]] = np.nan
    ints = rng.integers(-20, 20, (2, 1008)).astype(np.int32)
    return {"random": base, "ties": ties, "zeros": zeros, "nan": nans, "int32": ints,
            "int64_3d": rng.integers(-5, 5, (3, 200, 2)).astype(np.int64)}


@pytest.mark.parametrize("name", ["random", "ties", "zeros", "nan", "int32", "int64_3d"])
@pytest.mark.parametrize("largest", [1, 0])
@pytest.mark.parametrize("k", [0, 1, 50, 150])
def test_topk_against_reference(name, largest, k):
    x = _topk_inputs(np.random.default_rng(8))[name]
    for axis in ((1, -2) if x.ndim == 3 else (1, -1)):
        for sorted_ in (1, 0):
            vals, idx = _kernel("TopK", 11)(x, np.array([k], np.int64), axis=axis, largest=largest,
                                            sorted=sorted_)
            want_v, want_i = _topk_reference(x, k, axis, largest)
            np.testing.assert_array_equal(idx.numpy(), want_i, err_msg=f"{name} axis {axis}")
            assert vals.numpy().tobytes() == np.ascontiguousarray(want_v).tobytes()
            assert idx.numpy().flags.c_contiguous and vals.numpy().flags.c_contiguous


def _rows_with_specials(rng, shape, dtype, kind):
    x = rng.standard_normal(shape).astype(dtype)
    if kind == "zeros":
        x[: shape[0] // 2] = np.where(rng.random((shape[0] // 2,) + shape[1:]) < 0.5, -0.0, 0.0)
    elif kind == "nan":
        flat = x.reshape(-1)
        flat[rng.choice(flat.size, 40, replace=False)] = np.nan
        flat[:3] = -np.nan  # the sign bit set (x86's default NaN)
        flat[5] = np.inf
        flat[9] = -np.inf
    return x


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kind", ["random", "zeros", "nan"])
@pytest.mark.parametrize("n", [2, 3, 8, 15, 16])
@pytest.mark.parametrize("strided", [False, True])
def test_reduce_extremes_short_rows(op, dtype, kind, n, strided):
    """The column path (2x1008 rows of n) gives numpy.max/min's bits, contiguous or a
    slice's view; the values equal a float64 reference (max and min are exact)."""
    rng = np.random.default_rng(n)
    wide = _rows_with_specials(rng, (2, 1008, n + 4), dtype, kind)
    x = wide[..., 2:n + 2] if strided else np.ascontiguousarray(wide[..., :n])
    ufunc = np.maximum if op == "ReduceMax" else np.minimum
    want = ufunc.reduce(x, axis=-1)
    ref = (np.max if op == "ReduceMax" else np.min)(x.astype(np.float64), axis=-1)
    kernel = _kernel(op, 18)
    axes = np.array([-1], np.int64)
    got = kernel(x, axes, keepdims=0).numpy()
    assert got.tobytes() == want.tobytes()
    np.testing.assert_array_equal(got.astype(np.float64), ref)
    fn = kernel.array_function([kernel.tensor(x), kernel.tensor(axes)], {"keepdims": 1})
    assert fn(x, axes).tobytes() == want.tobytes() and fn(x, axes).shape == (2, 1008, 1)


def test_reduce_extremes_other_axes_unchanged():
    x = _rows_with_specials(np.random.default_rng(1), (4, 300, 5), np.float32, "zeros")
    for axes in ([1], [0, 2], [-2, -1]):
        got = _kernel("ReduceMax", 13)(x, axes=axes, keepdims=1).numpy()
        assert got.tobytes() == np.max(x, axis=tuple(axes), keepdims=True).tobytes()


def test_extremes_agree_checked():
    for n in range(2, reductions._SHORT_ROW):
        for dt in (np.dtype(np.float32), np.dtype(np.float64)):
            assert reductions._extremes_agree(n, dt, np.maximum) in (True, False)


@pytest.mark.parametrize("e", [2.0, 3.0, 4.0, 0.5, -1.0, 0.0, 1.0, 1.7, -2.5])
@pytest.mark.parametrize("strided", [False, True])
def test_pow_array_function(e, strided):
    """Pow's array function equals the kernel to the bit (YOLO's x^2 on a slice's view)
    and stays within the tolerances of a float64 reference; the exponent is read at
    every call (a changed value is honoured)."""
    rng = np.random.default_rng(3)
    wide = (rng.random((2, 3, 16, 16, 4)) * 4 + 0.1).astype(np.float32)
    x = wide[..., 1:3] if strided else np.ascontiguousarray(wide[..., :2])
    y = np.array(e, np.float32)
    kernel = _kernel("Pow", 15)
    fn = kernel.array_function([kernel.tensor(x), kernel.tensor(y)], {})
    want = kernel(x, y).numpy()
    with np.errstate(all="raise"):
        got = fn(x, y)
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
        ref = np.power(x.astype(np.float64), np.float64(e))
        np.testing.assert_allclose(got, ref, rtol=4 * 2.0 ** -24 if e != 1.7 and e != -2.5 else 1e-6)
        other = np.array(2.0 if e != 2.0 else 3.0, np.float32)
        assert fn(x, other).tobytes() == kernel(x, other).numpy().tobytes()


def test_large_extremes_keep_threaded_split():
    """A large Max over long trailing rows keeps _reduce_rows_host's threaded split (not
    one single-threaded reduction); short rows take the column step at any size."""
    from gpukernels.host import tuning

    kernel = _kernel("ReduceMax", 18)
    big = 2 * tuning.value("reduce.thread_items")
    long_rows = np.empty((big // 64 + 1, 64), np.float32)
    assert reductions._trailing_rows_step(kernel, long_rows, (1,)) is None
    short_rows = np.empty((big // 8 + 1, 8), np.float32)
    assert reductions._trailing_rows_step(kernel, short_rows, (1,)) is reductions._max_rows
    x = np.random.default_rng(2).standard_normal((big // 64 + 1, 64)).astype(np.float32)
    assert kernel(x, np.array([1], np.int64), keepdims=0).numpy().tobytes() == np.max(x, axis=1).tobytes()
