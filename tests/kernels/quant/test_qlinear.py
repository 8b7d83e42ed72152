"""QLinearMatMul and QLinearConv against exact integer references (int64 loops) and the
documented float32 requantization."""

from __future__ import annotations


import ml_dtypes
import numpy as np
import pytest

from gpukernels.dtypes import DataType as D
from gpukernels.errors import KernelInputError, KernelTypeError
from gpukernels.kernels.base import KernelContext
from gpukernels.kernels.quant.qlinear import QLinearConv, QLinearMatMul
from gpukernels.tensor import Tensor
from tests.reference import conv

RANGES = {np.uint8: (0, 255), np.int8: (-128, 127)}


def requant(acc, mult, yzp, ydt):
    lo, hi = RANGES[ydt]
    out = np.empty(acc.shape, np.int64)
    mult = np.broadcast_to(np.asarray(mult, np.float32), acc.shape)
    yzp = np.broadcast_to(np.asarray(yzp, np.int64), acc.shape)
    for idx in np.ndindex(acc.shape):
        v = float(np.float32(np.float32(acc[idx]) * mult[idx]))
        out[idx] = min(max(round(v) + int(yzp[idx]), lo), hi)
    return out.astype(ydt)


def qints(rng, shape, dt):
    lo, hi = RANGES[dt]
    return rng.integers(lo, hi + 1, shape).astype(dt)


@pytest.mark.parametrize("adt,bdt,ydt", [(np.uint8, np.uint8, np.uint8), (np.int8, np.int8, np.int8),
                                         (np.uint8, np.int8, np.int8), (np.int8, np.uint8, np.uint8)])
@pytest.mark.parametrize("shapes", [((4, 6), (6, 3)), ((2, 4, 6), (6, 3)), ((2, 1, 3, 5), (4, 5, 2)),
                                    ((5,), (5, 3)), ((3, 5), (5,))])
def test_qlinear_matmul_per_tensor(device, rng, adt, bdt, ydt, shapes):
    sa, sb = shapes
    a, b = qints(rng, sa, adt), qints(rng, sb, bdt)
    az, bz, yz = qints(rng, (), adt), qints(rng, (), bdt), qints(rng, (), ydt)
    asc, bsc, ysc = np.float32(0.02), np.float32(0.03), np.float32(0.05)
    y = QLinearMatMul(KernelContext(device))(a, asc, az, b, bsc, bz, ysc, yz).numpy()
    acc = np.matmul(a.astype(np.int64) - int(az), b.astype(np.int64) - int(bz))
    mult = np.float32(np.float32(asc * bsc) / ysc)
    exp = requant(acc, mult, int(yz), ydt)
    assert y.dtype == ydt and y.shape == exp.shape
    np.testing.assert_array_equal(y, exp)


def test_qlinear_matmul_per_row_col(device, rng):
    a, b = qints(rng, (2, 4, 6), np.uint8), qints(rng, (6, 3), np.int8)
    asc = rng.uniform(0.01, 0.05, (2, 4, 1)).astype(np.float32)
    az = qints(rng, (2, 4, 1), np.uint8)
    bsc = rng.uniform(0.01, 0.05, 3).astype(np.float32)
    bz = qints(rng, (3,), np.int8)
    y = QLinearMatMul(KernelContext(device))(a, asc, az, b, bsc, bz, np.float32(0.1), np.uint8(100)).numpy()
    acc = np.matmul(a.astype(np.int64) - az.astype(np.int64), b.astype(np.int64) - bz.astype(np.int64))
    mult = ((asc * bsc.reshape(1, 3)).astype(np.float32) / np.float32(0.1)).astype(np.float32)
    np.testing.assert_array_equal(y, requant(acc, mult, 100, np.uint8))


@pytest.mark.parametrize("ts", [np.float16, ml_dtypes.bfloat16])
def test_qlinear_matmul_half_scales(rng, ts):
    a, b = qints(rng, (3, 4), np.int8), qints(rng, (4, 2), np.int8)
    k = QLinearMatMul(KernelContext("cpu", 21))
    s = lambda v: np.array(v, np.float32).astype(ts)  # noqa: E731
    y = k(a, s(0.25), np.int8(1), b, s(0.5), np.int8(-2), s(2.0), np.int8(3)).numpy()
    acc = np.matmul(a.astype(np.int64) - 1, b.astype(np.int64) + 2)
    np.testing.assert_array_equal(y, requant(acc, np.float32(0.0625), 3, np.int8))
    with pytest.raises(KernelTypeError, match="QLinearMatMul"):
        QLinearMatMul(KernelContext("cpu", 10))(a, s(0.25), np.int8(1), b, s(0.5), np.int8(-2), s(2.0), np.int8(3))


@pytest.mark.parametrize("f8", [D.FLOAT8E4M3FN, D.FLOAT8E5M2])
def test_qlinear_matmul_float8(device, rng, f8):
    npdt = {D.FLOAT8E4M3FN: ml_dtypes.float8_e4m3fn, D.FLOAT8E5M2: ml_dtypes.float8_e5m2}[f8]
    a = rng.standard_normal((3, 5)).astype(np.float32).astype(npdt)
    b = rng.standard_normal((5, 4)).astype(np.float32).astype(npdt)
    z = Tensor(np.zeros((), npdt), f8)
    y = QLinearMatMul(KernelContext(device))(Tensor(a, f8), np.float32(2), z, Tensor(b, f8), np.float32(0.5), z,
                                             np.float32(0.25), z)
    assert y.data_type == f8
    exact = (a.astype(np.float64) * 2) @ (b.astype(np.float64) * 0.5) / 0.25
    m = float(ml_dtypes.finfo(npdt).max)
    exp = np.clip(exact, -m, m).astype(np.float32).astype(npdt)
    got = y.numpy().astype(np.float64)
    # float32 accumulation vs float64: equal after rounding to float8 except at exact ties
    assert np.mean(got == exp.astype(np.float64)) > 0.9
    np.testing.assert_allclose(got, exp.astype(np.float64), rtol=0.13)


def test_qlinear_matmul_errors(device, rng):
    k = QLinearMatMul(KernelContext(device))
    a, b = qints(rng, (3, 4), np.uint8), qints(rng, (5, 2), np.uint8)
    one = np.float32(1)
    with pytest.raises(KernelInputError, match="QLinearMatMul.*inner"):
        k(a, one, np.uint8(0), b, one, np.uint8(0), one, np.uint8(0))
    b = qints(rng, (4, 2), np.uint8)
    with pytest.raises(KernelInputError, match="per-row"):
        k(a, np.ones(4, np.float32), np.zeros(4, np.uint8), b, one, np.uint8(0), one, np.uint8(0))
    with pytest.raises(KernelTypeError, match="a_zero_point|share"):
        k(a, one, np.int8(0), b, one, np.uint8(0), one, np.uint8(0))
    with pytest.raises(KernelInputError, match="zero point"):
        k(a, np.ones(3, np.float32), np.zeros(2, np.uint8), b, one, np.uint8(0), one, np.uint8(0))


def ref_conv(x, xz, w, wz, bias, group, strides, pads, dil):
    """Exact int64 convolution of the zero-point-shifted operands (tests/reference/conv.py)."""
    m = w.shape[0]
    wz = np.broadcast_to(np.asarray(wz, np.int64).reshape(-1), (m,))
    xs = x.astype(np.int64) - int(xz)
    ws = w.astype(np.int64) - wz.reshape((m,) + (1,) * (w.ndim - 1))
    return conv(xs, ws, None if bias is None else np.asarray(bias, np.int64), strides, pads, dil, group)


@pytest.mark.parametrize("case", [
    dict(x=(1, 2, 5, 5), w=(3, 2, 3, 3), group=1, strides=[1, 1], pads=[1, 1, 1, 1], dil=[1, 1]),
    dict(x=(2, 4, 6, 5), w=(4, 2, 2, 3), group=2, strides=[2, 1], pads=[0, 1, 1, 0], dil=[1, 2]),
    dict(x=(1, 3, 7), w=(2, 3, 3), group=1, strides=[2], pads=[2, 1], dil=[2]),
    dict(x=(1, 2, 3, 4, 3), w=(2, 1, 2, 2, 2), group=2, strides=[1, 1, 1], pads=[0] * 6, dil=[1, 1, 1]),
])
@pytest.mark.parametrize("dts", [(np.uint8, np.uint8, np.uint8), (np.int8, np.int8, np.int8), (np.uint8, np.int8, np.uint8)])
@pytest.mark.parametrize("per_channel", [False, True])
def test_qlinear_conv(device, rng, case, dts, per_channel):
    xdt, wdt, ydt = dts
    x, w = qints(rng, case["x"], xdt), qints(rng, case["w"], wdt)
    m = case["w"][0]
    xz, yz = qints(rng, (), xdt), qints(rng, (), ydt)
    if per_channel:
        wz = qints(rng, (m,), wdt)
        ws = rng.uniform(0.005, 0.02, m).astype(np.float32)
    else:
        wz, ws = qints(rng, (), wdt), np.float32(0.01)
    bias = rng.integers(-500, 500, m).astype(np.int32)
    xs, ys = np.float32(0.05), np.float32(0.2)
    y = QLinearConv(KernelContext(device))(x, xs, xz, w, ws, wz, ys, yz, bias, group=case["group"],
                                           strides=case["strides"], pads=case["pads"], dilations=case["dil"]).numpy()
    acc = ref_conv(x, xz, w, wz, bias, case["group"], case["strides"], case["pads"], case["dil"])
    mult = ((xs * np.asarray(ws, np.float32)).astype(np.float32) / ys).astype(np.float32)
    mult = np.asarray(mult).reshape((-1,) + (1,) * (x.ndim - 2)) if per_channel else mult
    exp = requant(acc, np.broadcast_to(mult, acc.shape[1:]), int(yz), ydt)
    assert y.dtype == ydt
    np.testing.assert_array_equal(y, exp)


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
def test_qlinear_conv_auto_pad(device, rng, auto_pad):
    x, w = qints(rng, (1, 1, 5, 6), np.uint8), qints(rng, (1, 1, 2, 3), np.uint8)
    y = QLinearConv(KernelContext(device))(x, np.float32(0.1), np.uint8(3), w, np.float32(0.1), np.uint8(2),
                                           np.float32(1.0), np.uint8(0), auto_pad=auto_pad, strides=[2, 2]).numpy()
    if auto_pad == "VALID":
        pads = [0, 0, 0, 0]
    else:
        # out = ceil(in/2) = (3, 3); total pad = (3-1)*2 + k - in = (1, 1)
        pads = [0, 0, 1, 1] if auto_pad == "SAME_UPPER" else [1, 1, 0, 0]
    acc = ref_conv(x, 3, w, 2, None, 1, [2, 2], pads, [1, 1])
    np.testing.assert_array_equal(y, requant(acc, np.float32(np.float32(0.1 * np.float32(0.1)) / 1), 0, np.uint8))


def test_qlinear_conv_errors(device, rng):
    k = QLinearConv(KernelContext(device))
    x, w = qints(rng, (1, 4, 5, 5), np.uint8), qints(rng, (2, 3, 3, 3), np.uint8)
    args = lambda xx, ww: (xx, np.float32(1), np.uint8(0), ww, np.float32(1), np.uint8(0), np.float32(1), np.uint8(0))  # noqa: E731
    with pytest.raises(KernelInputError, match="QLinearConv.*group"):
        k(*args(x, w))
    with pytest.raises(KernelInputError, match="rank"):
        k(*args(x, qints(rng, (2, 4, 3), np.uint8)))
    with pytest.raises(KernelInputError, match="does not fit"):
        k(*args(x, qints(rng, (2, 4, 7, 7), np.uint8)))
    with pytest.raises(KernelInputError, match="w_scale"):
        w4 = qints(rng, (2, 4, 3, 3), np.uint8)
        k(x, np.float32(1), np.uint8(0), w4, np.ones(3, np.float32), np.zeros(3, np.uint8), np.float32(1), np.uint8(0))
    with pytest.raises(KernelTypeError, match="QLinearConv"):
        k(x, np.float32(1), np.uint8(0), qints(rng, (2, 4, 3, 3), np.uint8), np.float32(1), np.uint8(0),
          np.float32(1), np.uint8(0), np.zeros(2, np.int64))


def test_qlinear_conv_empty_batch(device, rng):
    y = QLinearConv(KernelContext(device))(np.zeros((0, 2, 4, 4), np.uint8), np.float32(1), np.uint8(0),
                                           qints(rng, (3, 2, 3, 3), np.uint8), np.float32(1), np.uint8(0),
                                           np.float32(1), np.uint8(0))
    assert y.shape == (0, 3, 2, 2)
