"""Reduce*, ArgMax/ArgMin, CumSum/CumProd, TopK against loop references."""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest

from gpukernels.errors import KernelInputError, KernelTypeError
from gpukernels.kernels import KernelContext, load_all
from gpukernels.kernels.base import lookup
from gpukernels.tensor import Tensor

load_all()


def kernel(op, device, version=None):
    cls, v = lookup(op, "", version)
    return cls(KernelContext(device), version=v)


def ref_reduce(op, x, axes, keepdims):
    """Loop reference: gathers each output cell's values explicitly."""
    x = np.asarray(x, np.float64)
    axes = tuple(sorted(a % x.ndim for a in axes)) if axes else tuple(range(x.ndim))
    keep = [i for i in range(x.ndim) if i not in axes]
    out_shape = [1 if i in axes else d for i, d in enumerate(x.shape)]
    out = np.empty(out_shape)
    for idx in itertools.product(*[range(d) for d in out_shape]):
        sl = tuple(slice(None) if i in axes else idx[i] for i in range(x.ndim))
        v = x[sl].ravel()
        out[idx] = {
            "ReduceSum": lambda: v.sum(), "ReduceMean": lambda: v.mean() if v.size else np.nan,
            "ReduceProd": lambda: np.prod(v), "ReduceMax": lambda: v.max() if v.size else -np.inf,
            "ReduceMin": lambda: v.min() if v.size else np.inf, "ReduceL1": lambda: np.abs(v).sum(),
            "ReduceL2": lambda: np.sqrt((v * v).sum()), "ReduceSumSquare": lambda: (v * v).sum(),
            "ReduceLogSum": lambda: np.log(v.sum()),
            "ReduceLogSumExp": lambda: np.log(np.exp(v).sum()) if v.size else -np.inf,
        }[op]()
    if not keepdims:
        out = out.reshape([d for i, d in enumerate(x.shape) if i in keep])
    return out


REDUCE_OPS = ["ReduceSum", "ReduceMean", "ReduceProd", "ReduceMax", "ReduceMin", "ReduceL1", "ReduceL2",
              "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"]
FLOATS = [np.float32, np.float64, np.float16, ml_dtypes.bfloat16]
TOL = {np.dtype(np.float32): 2e-6, np.dtype(np.float64): 1e-12, np.dtype(np.float16): 3e-3,
       np.dtype(ml_dtypes.bfloat16): 2e-2}


def call_reduce(k, x, axes, keepdims, **kw):
    if k.since_version >= (13 if k.op_type == "ReduceSum" else 18):
        return k(Tensor(x), None if axes is None else np.array(axes, np.int64), keepdims=keepdims, **kw)
    return k(Tensor(x), axes=axes, keepdims=keepdims, **kw)


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("axes,keepdims", [([1], 1), ([-1, 0], 0), (None, 1), (None, 0), ([0, 2], 1)])
def test_reduce_float(op, dtype, axes, keepdims, device, rng):
    x = rng.uniform(0.5, 1.5, (3, 4, 5)).astype(dtype)
    if op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceL1"):
        x = (x * rng.choice([-1, 1], x.shape)).astype(dtype)
    ref = ref_reduce(op, x, axes, keepdims)
    got = call_reduce(kernel(op, device), x, axes, keepdims).numpy()
    assert got.dtype == np.dtype(dtype) and got.shape == ref.shape
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=TOL[np.dtype(dtype)], atol=TOL[np.dtype(dtype)])


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("version", [1, 11, 13, 18])
def test_reduce_versions(op, version, device, rng):
    x = rng.uniform(0.5, 1.5, (2, 3, 4)).astype(np.float32)
    k = kernel(op, device, version)
    ref = ref_reduce(op, x, [-2], 0)
    np.testing.assert_allclose(call_reduce(k, x, [-2], 0).numpy(), ref, rtol=2e-6)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceProd", "ReduceMax", "ReduceMin", "ReduceL1",
                                "ReduceSumSquare", "ReduceMean"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint32, np.uint64, np.int8, np.uint8])
def test_reduce_integers(op, dtype, device, rng):
    if np.dtype(dtype).itemsize == 1 and op not in ("ReduceMax", "ReduceMin"):
        pytest.skip("int8/uint8 only for ReduceMax/ReduceMin")
    lo = 0 if np.dtype(dtype).kind == "u" else -9
    x = rng.integers(lo, 10, (3, 4, 5)).astype(dtype)
    got = call_reduce(kernel(op, device), x, [1], 1).numpy()
    assert got.dtype == np.dtype(dtype)
    ref = ref_reduce(op, x, [1], 1)
    if op == "ReduceMean":
        ref = np.trunc(ref)
    if op == "ReduceProd":
        ref = np.array([int(np.prod(x[i, :, j].astype(object))) for i in range(3) for j in range(5)],
                       dtype=object).reshape(3, 1, 5)
        ref = np.array([v % 2 ** (8 * x.itemsize) for v in ref.ravel()], dtype=np.uint64).astype(dtype).reshape(3, 1, 5)
    np.testing.assert_array_equal(got, np.asarray(ref).astype(dtype))


def test_reduce_int_wraps(device):
    x = np.array([2 ** 31 - 1, 1], np.int32)
    assert call_reduce(kernel("ReduceSum", device), x, None, 0).numpy() == np.int32(-2 ** 31)


def test_reduce_bool_max_min(device):
    x = np.array([[True, False], [False, False]])
    np.testing.assert_array_equal(call_reduce(kernel("ReduceMax", device), x, [1], 0).numpy(), [True, False])
    np.testing.assert_array_equal(call_reduce(kernel("ReduceMin", device), x, [0], 0).numpy(), [False, False])
    with pytest.raises(KernelTypeError):
        call_reduce(kernel("ReduceMax", device, 18), x, [1], 0)


EMPTY = {"ReduceSum": 0, "ReduceProd": 1, "ReduceMax": -np.inf, "ReduceMin": np.inf, "ReduceL1": 0,
         "ReduceL2": 0, "ReduceSumSquare": 0, "ReduceLogSum": -np.inf, "ReduceLogSumExp": -np.inf,
         "ReduceMean": np.nan}


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_empty_set(op, device):
    x = np.zeros((2, 0, 4), np.float32)
    got = call_reduce(kernel(op, device), x, [1], 1).numpy()
    assert got.shape == (2, 1, 4)
    np.testing.assert_array_equal(got, np.full((2, 1, 4), EMPTY[op], np.float32))
    got0 = call_reduce(kernel(op, device), x, [0], 1).numpy()
    assert got0.shape == (1, 0, 4)


def test_reduce_empty_int_limits(device):
    x = np.zeros((0, 3), np.int32)
    np.testing.assert_array_equal(call_reduce(kernel("ReduceMax", device), x, [0], 0).numpy(),
                                  np.full(3, np.iinfo(np.int32).min))
    np.testing.assert_array_equal(call_reduce(kernel("ReduceMin", device), x, [0], 0).numpy(),
                                  np.full(3, np.iinfo(np.int32).max))


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_noop_with_empty_axes(op, device, rng):
    x = rng.uniform(0.5, 2, (2, 3)).astype(np.float32)
    got = call_reduce(kernel(op, device), x, None, 1, noop_with_empty_axes=1).numpy()
    expect = {"ReduceL1": np.abs(x), "ReduceL2": np.abs(x), "ReduceSumSquare": x * x,
              "ReduceLogSum": np.log(x), "ReduceLogSumExp": np.log(np.exp(x))}.get(op, x)
    np.testing.assert_allclose(got, expect, rtol=1e-6)
    got2 = call_reduce(kernel(op, device), x, [], 0, noop_with_empty_axes=0).numpy()
    assert got2.shape == ()


def test_reduce_nan_and_errors(device):
    x = np.array([[1.0, np.nan], [2.0, 3.0]], np.float32)
    for op in ("ReduceMax", "ReduceMin", "ReduceSum"):
        got = call_reduce(kernel(op, device), x, [1], 0).numpy()
        assert np.isnan(got[0]) and not np.isnan(got[1])
    with pytest.raises(KernelInputError, match="ReduceSum"):
        call_reduce(kernel("ReduceSum", device), x, [2], 0)
    with pytest.raises(KernelInputError, match="repeat"):
        call_reduce(kernel("ReduceMax", device), x, [1, -1], 0)
    with pytest.raises(KernelTypeError, match="ReduceMean"):
        call_reduce(kernel("ReduceMean", device), np.array([True]), [0], 0)


def test_reduce_logsumexp_stable(device):
    x = np.array([[1000.0, 1000.0], [-np.inf, -np.inf], [np.inf, 1.0]], np.float32)
    got = call_reduce(kernel("ReduceLogSumExp", device), x, [1], 0).numpy()
    np.testing.assert_allclose(got[0], 1000 + np.log(2), rtol=1e-6)
    assert got[1] == -np.inf and got[2] == np.inf


def test_reduce_scalar_input(device):
    got = call_reduce(kernel("ReduceSumSquare", device), np.float32(3), None, 1).numpy()
    assert got.shape == () and got == 9


# --------------------------------------------------------------------------- ArgMax/Min


def ref_arg(x, axis, keepdims, last, mx):
    xm = np.moveaxis(x, axis, -1)
    out = np.empty(xm.shape[:-1], np.int64)
    for idx in np.ndindex(*xm.shape[:-1]):
        row = list(xm[idx])
        best = None
        for i, v in enumerate(row):
            if best is None or (v > row[best] if mx else v < row[best]) or (last and v == row[best]):
                best = i
        out[idx] = best
    return np.expand_dims(out, axis) if keepdims else out


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, ml_dtypes.bfloat16, np.int8, np.uint8,
                                   np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64])
@pytest.mark.parametrize("axis,keepdims,last", [(0, 1, 0), (-1, 0, 1), (1, 1, 1), (-2, 0, 0)])
def test_arg(op, dtype, axis, keepdims, last, device, rng):
    x = rng.integers(0, 4, (3, 5, 4)).astype(dtype)  # many ties
    got = kernel(op, device)(Tensor(x), axis=axis, keepdims=keepdims, select_last_index=last).numpy()
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, ref_arg(x.astype(np.float64), axis % 3, keepdims, last, op == "ArgMax"))


def test_arg_nan_and_errors(device):
    x = np.array([1.0, np.nan, 5.0, np.nan], np.float32)
    assert kernel("ArgMax", device)(x, keepdims=0).numpy() == 1
    assert kernel("ArgMax", device)(x, keepdims=0, select_last_index=1).numpy() == 3
    assert kernel("ArgMin", device)(x, keepdims=0).numpy() == 1
    with pytest.raises(KernelInputError, match="ArgMax"):
        kernel("ArgMax", device)(np.zeros((2, 0), np.float32), axis=1)
    with pytest.raises(KernelInputError, match="ArgMin"):
        kernel("ArgMin", device)(np.zeros((2, 3), np.float32), axis=2)
    e = kernel("ArgMax", device)(np.zeros((0, 3), np.float32), axis=1)
    assert e.shape == (0, 1)


# ---------------------------------------------------------------------------- scans


def ref_scan(x, axis, exclusive, reverse, prod):
    xm = np.moveaxis(x.astype(np.float64), axis, -1)
    out = np.empty_like(xm)
    n = xm.shape[-1]
    for idx in np.ndindex(*xm.shape[:-1]):
        for j in range(n):
            rng_ = range(j + 1, n) if reverse and exclusive else range(j, n) if reverse else \
                range(0, j) if exclusive else range(0, j + 1)
            vals = [xm[idx][i] for i in rng_]
            out[idx + (j,)] = np.prod(vals) if prod else np.sum(vals)
    return np.moveaxis(out, -1, axis)


@pytest.mark.parametrize("op", ["CumSum", "CumProd"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, ml_dtypes.bfloat16, np.int32, np.int64,
                                   np.uint32, np.uint64])
@pytest.mark.parametrize("axis,exclusive,reverse", [(0, 0, 0), (1, 1, 0), (-1, 0, 1), (-2, 1, 1)])
def test_scans(op, dtype, axis, exclusive, reverse, device, rng):
    x = rng.integers(1, 4, (3, 4, 2)).astype(dtype) if np.dtype(dtype).kind in "iu" else \
        rng.uniform(0.5, 1.5, (3, 4, 2)).astype(dtype)
    at = np.array(axis, np.int32 if axis >= 0 else np.int64)
    got = kernel(op, device)(Tensor(x), at, exclusive=exclusive, reverse=reverse).numpy()
    assert got.dtype == np.dtype(dtype)
    ref = ref_scan(x, axis % 3, exclusive, reverse, op == "CumProd")
    tol = {np.dtype(np.float16): 3e-3, np.dtype(ml_dtypes.bfloat16): 2e-2}.get(np.dtype(dtype), 1e-6)
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=tol)


def test_scan_errors(device):
    x = np.ones((2, 3), np.float32)
    with pytest.raises(KernelInputError, match="CumSum"):
        kernel("CumSum", device)(x, np.array(2))
    with pytest.raises(KernelInputError, match="CumSum"):
        kernel("CumSum", device)(x, np.array([0, 1]))
    assert kernel("CumProd", device)(np.ones((0, 3), np.float32), np.array(0)).shape == (0, 3)


# ----------------------------------------------------------------------------- TopK


def ref_topk(x, k, axis, largest):
    xm = np.moveaxis(x.astype(np.float64), axis, -1)
    vals = np.empty(xm.shape[:-1] + (k,))
    idxs = np.empty(xm.shape[:-1] + (k,), np.int64)
    for idx in np.ndindex(*xm.shape[:-1]):
        row = xm[idx]
        keyed = sorted(range(row.size), key=lambda i: ((-row[i] if largest else row[i]), i))
        idxs[idx] = keyed[:k]
        vals[idx] = row[keyed[:k]]
    return np.moveaxis(vals, -1, axis), np.moveaxis(idxs, -1, axis)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, ml_dtypes.bfloat16, np.int8, np.uint8,
                                   np.int32, np.int64, np.uint64])
@pytest.mark.parametrize("largest", [1, 0])
@pytest.mark.parametrize("n,k,axis", [(7, 3, -1), (300, 5, 1), (300, 300, -1), (300, 0, 1), (200, 4, 0)])
def test_topk(dtype, largest, n, k, axis, device, rng):
    shape = (n, 3) if axis == 0 else (2, n)
    x = rng.integers(0, 20, shape).astype(dtype)  # plenty of ties
    v, i = kernel("TopK", device)(Tensor(x), np.array([k], np.int64), axis=axis, largest=largest)
    rv, ri = ref_topk(x, k, axis % 2, largest)
    np.testing.assert_array_equal(i.numpy(), ri)
    np.testing.assert_array_equal(v.numpy().astype(np.float64), rv)
    assert v.numpy().dtype == np.dtype(dtype)


def test_topk_nan_versions_errors(device):
    x = np.array([[3.0, np.nan, 1.0, 3.0, -np.inf]], np.float32)
    v, i = kernel("TopK", device)(x, np.array([3]))
    np.testing.assert_array_equal(i.numpy(), [[1, 0, 3]])
    v, i = kernel("TopK", device)(x, np.array([2]), largest=0)
    np.testing.assert_array_equal(i.numpy(), [[4, 2]])
    v, i = kernel("TopK", device, 1)(x, k=2)
    np.testing.assert_array_equal(i.numpy(), [[1, 0]])
    with pytest.raises(KernelInputError, match="TopK"):
        kernel("TopK", device)(x, np.array([6]))
    with pytest.raises(KernelInputError, match="TopK"):
        kernel("TopK", device)(x, np.array([-1]))
    with pytest.raises(KernelInputError, match="TopK"):
        kernel("TopK", device, 1)(x)


def test_topk_large_partition_path(device, rng):
    x = rng.standard_normal((4, 5000)).astype(np.float32)
    x[:, ::7] = 0.5  # ties at the boundary
    v, i = kernel("TopK", device)(x, np.array([50]))
    rv, ri = ref_topk(x, 50, 1, 1)
    np.testing.assert_array_equal(i.numpy(), ri)
    np.testing.assert_array_equal(v.numpy(), rv.astype(np.float32))
