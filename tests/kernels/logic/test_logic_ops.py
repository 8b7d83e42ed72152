"""And/Or/Xor/Not, IsNaN/IsInf, GreaterOrEqual/LessOrEqual, Where, Bitwise*, BitShift."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from gpukernels.dtypes import DataType
from gpukernels.errors import KernelInputError, KernelTypeError
from gpukernels.kernels import KernelContext, load_all
from gpukernels.kernels.base import lookup
from gpukernels.tensor import Tensor

load_all()

INTS = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]


def wrap(values, dtype):
    """Python ints reduced modulo the type's width, as an array of dtype."""
    dt = np.dtype(dtype)
    bits = dt.itemsize * 8
    out = []
    for v in values:
        v = int(v) % (1 << bits)
        if dt.kind == "i" and v >= 1 << (bits - 1):
            v -= 1 << bits
        out.append(v)
    return np.array(out, dtype=dt)


def kernel(op, device, version=None):
    cls, v = lookup(op, "", version)
    return cls(KernelContext(device), version=v)


@pytest.mark.parametrize("op,fn", [("And", lambda a, b: a and b), ("Or", lambda a, b: a or b),
                                   ("Xor", lambda a, b: a != b)])
def test_logical(op, fn, device, rng):
    a = rng.integers(0, 2, (2, 3, 4)).astype(bool)
    b = rng.integers(0, 2, (3, 1)).astype(bool)
    got = kernel(op, device)(a, b).numpy()
    ab, bb = np.broadcast_arrays(a, b)
    ref = np.array([fn(bool(x), bool(y)) for x, y in zip(ab.ravel(), bb.ravel())]).reshape(ab.shape)
    np.testing.assert_array_equal(got, ref)
    # legacy broadcasting
    c = rng.integers(0, 2, (3,)).astype(bool)
    got = kernel(op, device, 1)(a, c, broadcast=1, axis=1).numpy()
    ref = np.array([fn(bool(x), bool(y)) for x, y in
                    zip(a.ravel(), np.broadcast_to(c.reshape(3, 1), a.shape).ravel())]).reshape(a.shape)
    np.testing.assert_array_equal(got, ref)
    with pytest.raises(KernelInputError, match=op):
        kernel(op, device, 1)(a, c)
    with pytest.raises(KernelInputError, match=op):
        kernel(op, device)(a, np.ones(5, bool))
    with pytest.raises(KernelTypeError, match=op):
        kernel(op, device)(a.astype(np.int32), a.astype(np.int32))


def test_not(device):
    np.testing.assert_array_equal(kernel("Not", device)(np.array([True, False])).numpy(), [False, True])
    assert kernel("Not", device)(np.zeros((0, 2), bool)).shape == (0, 2)


FLOAT8 = [ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fnuz, ml_dtypes.float8_e5m2, ml_dtypes.float8_e5m2fnuz]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, ml_dtypes.bfloat16] + FLOAT8,
                         ids=lambda d: np.dtype(d).name)
def test_isnan_isinf(dtype, device):
    vals = np.array([1.0, np.nan, np.inf, -np.inf, 0.0, -2.0], np.float32)
    x = vals.astype(dtype)
    x64 = x.astype(np.float64)
    np.testing.assert_array_equal(kernel("IsNaN", device)(Tensor(x)).numpy(), np.isnan(x64))
    k = kernel("IsInf", device)
    np.testing.assert_array_equal(k(Tensor(x)).numpy(), np.isinf(x64))
    np.testing.assert_array_equal(k(Tensor(x), detect_negative=0).numpy(), x64 == np.inf)
    np.testing.assert_array_equal(k(Tensor(x), detect_positive=0).numpy(), x64 == -np.inf)
    np.testing.assert_array_equal(k(Tensor(x), detect_positive=0, detect_negative=0).numpy(),
                                  np.zeros(6, bool))


def test_isinf_opset10_types(device):
    with pytest.raises(KernelTypeError, match="IsInf"):
        kernel("IsInf", device, 10)(np.ones(2, np.float16))
    with pytest.raises(KernelTypeError, match="IsNaN"):
        kernel("IsNaN", device)(np.ones(2, np.int32))


@pytest.mark.parametrize("op,fn", [("GreaterOrEqual", np.greater_equal), ("LessOrEqual", np.less_equal)])
@pytest.mark.parametrize("dtype", INTS + [np.float32, np.float64, np.float16, ml_dtypes.bfloat16],
                         ids=lambda d: np.dtype(d).name)
def test_compare(op, fn, dtype, device, rng):
    a = rng.integers(0, 4, (2, 3, 4)).astype(dtype)
    b = rng.integers(0, 4, (3, 1)).astype(dtype)
    got = kernel(op, device)(Tensor(a), Tensor(b))
    assert got.data_type == DataType.BOOL
    np.testing.assert_array_equal(got.numpy(), fn(a.astype(np.float64), b.astype(np.float64)))


def test_compare_nan(device):
    a = np.array([np.nan, 1.0, np.nan], np.float32)
    b = np.array([np.nan, np.nan, 1.0], np.float32)
    assert not kernel("GreaterOrEqual", device)(a, b).numpy().any()
    assert not kernel("LessOrEqual", device)(a, b).numpy().any()


@pytest.mark.parametrize("dtype", INTS + [np.float32, np.float64, np.float16, ml_dtypes.bfloat16, np.bool_,
                                          np.complex64, np.complex128, object], ids=lambda d: np.dtype(d).name)
def test_where(dtype, device, rng):
    c = rng.integers(0, 2, (2, 1, 4)).astype(bool)
    x = rng.integers(0, 9, (3, 1)).astype(dtype) if dtype is not object else \
        np.array([["a"], ["bb"], ["c"]], dtype=object)
    y = rng.integers(0, 9, (4,)).astype(dtype) if dtype is not object else np.array(["x", "y", "z", "w"], object)
    got = kernel("Where", device)(c, Tensor(x), Tensor(y)).numpy()
    cb, xb, yb = np.broadcast_arrays(c, x, y)
    ref = np.array([xv if cv else yv for cv, xv, yv in zip(cb.ravel(), xb.ravel(), yb.ravel())],
                   dtype=x.dtype).reshape(cb.shape)
    assert got.shape == (2, 3, 4)
    np.testing.assert_array_equal(got, ref)


def test_where_errors(device):
    with pytest.raises(KernelInputError, match="Where"):
        kernel("Where", device)(np.ones(3, bool), np.ones(2, np.float32), np.ones(3, np.float32))
    with pytest.raises(KernelTypeError, match="Where"):
        kernel("Where", device)(np.ones(3, bool), np.ones(3, np.float32), np.ones(3, np.float64))
    with pytest.raises(KernelTypeError, match="Where"):
        kernel("Where", device)(np.ones(3, np.int32), np.ones(3, np.float32), np.ones(3, np.float32))


@pytest.mark.parametrize("op,fn", [("BitwiseAnd", lambda a, b: a & b), ("BitwiseOr", lambda a, b: a | b),
                                   ("BitwiseXor", lambda a, b: a ^ b)])
@pytest.mark.parametrize("dtype", INTS, ids=lambda d: np.dtype(d).name)
def test_bitwise(op, fn, dtype, device, rng):
    i = np.iinfo(dtype)
    a = rng.integers(i.min, i.max, (3, 4), dtype=dtype, endpoint=True)
    b = rng.integers(i.min, i.max, (4,), dtype=dtype, endpoint=True)
    got = kernel(op, device)(a, b).numpy()
    ref = wrap([fn(int(x), int(y)) for x, y in zip(*[v.ravel() for v in np.broadcast_arrays(a, b)])], dtype)
    np.testing.assert_array_equal(got, ref.reshape(3, 4))
    got = kernel("BitwiseNot", device)(a).numpy()
    np.testing.assert_array_equal(got, wrap([~int(x) for x in a.ravel()], dtype).reshape(3, 4))


def ref_shift(x, y, left, bits, signed):
    out = []
    for a, s in zip(x, y):
        a, s = int(a), int(s)
        if s < 0 or s >= bits:
            out.append(-1 if (not left and a < 0) else 0)
            continue
        v = (a << s) if left else (a >> s)
        v &= (1 << bits) - 1
        if signed and v >= 1 << (bits - 1):
            v -= 1 << bits
        out.append(v)
    return out


@pytest.mark.parametrize("dtype", INTS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_bitshift(dtype, direction, device, rng):
    bits = np.dtype(dtype).itemsize * 8
    i = np.iinfo(dtype)
    x = rng.integers(i.min, i.max, 40, dtype=dtype, endpoint=True)
    lo = -3 if np.dtype(dtype).kind == "i" else 0
    y = rng.integers(lo, bits + 3, 40).astype(dtype)
    got = kernel("BitShift", device)(x, y, direction=direction).numpy()
    ref = ref_shift(x, y, direction == "LEFT", bits, np.dtype(dtype).kind == "i")
    np.testing.assert_array_equal(got, wrap(ref, dtype))


def test_bitshift_errors(device):
    x = np.array([1, 2], np.uint8)
    with pytest.raises(KernelInputError, match="direction"):
        kernel("BitShift", device)(x, x)
    with pytest.raises(KernelTypeError, match="BitShift"):
        kernel("BitShift", device, 11)(x.astype(np.int8), x.astype(np.int8), direction="LEFT")
