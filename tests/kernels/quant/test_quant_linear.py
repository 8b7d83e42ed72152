"""QuantizeLinear / DequantizeLinear / DynamicQuantizeLinear against element-by-element
references (Python's round() is half to even)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from gpukernels.dtypes import DataType as D
from gpukernels.errors import KernelInputError, KernelTypeError
from gpukernels.kernels.base import KernelContext
from gpukernels.kernels.quant.linear import DequantizeLinear, DynamicQuantizeLinear, QuantizeLinear
from gpukernels.tensor import Tensor

INT_TARGETS = {
    D.UINT8: (np.uint8, 0, 255), D.INT8: (np.int8, -128, 127),
    D.UINT16: (np.uint16, 0, 65535), D.INT16: (np.int16, -32768, 32767),
    D.UINT4: (ml_dtypes.uint4, 0, 15), D.INT4: (ml_dtypes.int4, -8, 7),
    D.UINT2: (ml_dtypes.uint2, 0, 3), D.INT2: (ml_dtypes.int2, -2, 1),
}
FLOAT_TARGETS = {
    D.FLOAT8E4M3FN: ml_dtypes.float8_e4m3fn, D.FLOAT8E4M3FNUZ: ml_dtypes.float8_e4m3fnuz,
    D.FLOAT8E5M2: ml_dtypes.float8_e5m2, D.FLOAT8E5M2FNUZ: ml_dtypes.float8_e5m2fnuz,
    D.FLOAT4E2M1: ml_dtypes.float4_e2m1fn, D.FLOAT6E2M3: ml_dtypes.float6_e2m3fn,
    D.FLOAT6E3M2: ml_dtypes.float6_e3m2fn,
}
ALWAYS_SATURATE = (D.FLOAT4E2M1, D.FLOAT6E2M3, D.FLOAT6E3M2)


def scale_index(idx, kind, axis, block):
    if kind == "tensor":
        return ()
    if kind == "axis":
        return (idx[axis],)
    j = list(idx)
    j[axis] //= block
    return tuple(j)


def ref_quantize(x, scale, zp, out, kind="tensor", axis=1, block=0, saturate=True):
    y = np.empty(x.shape, np.float64)
    for idx in np.ndindex(x.shape):
        si = scale_index(idx, kind, axis, block)
        q = float(np.float32(x[idx]) / np.float32(scale[si] if scale.ndim else scale))
        z = 0.0 if zp is None else float(np.asarray(zp, np.float64)[si] if np.ndim(zp) else float(zp))
        if out in INT_TARGETS:
            _, lo, hi = INT_TARGETS[out]
            y[idx] = min(max(round(q) + z, lo), hi)
        else:
            v = q + z
            m = float(ml_dtypes.finfo(FLOAT_TARGETS[out]).max)
            if saturate or out in ALWAYS_SATURATE:
                v = min(max(v, -m), m)
            y[idx] = v
    if out in INT_TARGETS:
        return y.astype(np.int64).astype(INT_TARGETS[out][0])
    return y.astype(np.float32).astype(FLOAT_TARGETS[out])


def ref_dequantize(x, scale, zp, kind="tensor", axis=1, block=0):
    y = np.empty(x.shape, np.float64)
    xf = x.astype(np.float64)
    for idx in np.ndindex(x.shape):
        si = scale_index(idx, kind, axis, block)
        z = 0.0 if zp is None else float(np.asarray(zp).astype(np.float64)[si] if np.ndim(zp) else np.float64(zp))
        s = float(np.asarray(scale).astype(np.float64)[si] if np.ndim(scale) else np.float64(scale))
        y[idx] = (xf[idx] - z) * s
    return y


def zp_for(out, rng, shape):
    if out in INT_TARGETS:
        dt, lo, hi = INT_TARGETS[out]
        return rng.integers(lo, hi + 1, size=shape).astype(np.int64).astype(dt)
    return np.zeros(shape, np.float32).astype(FLOAT_TARGETS[out])


@pytest.mark.parametrize("out", list(INT_TARGETS) + list(FLOAT_TARGETS))
def test_quantize_per_tensor_every_target(device, rng, out):
    x = (rng.standard_normal((3, 5, 4)) * 40).astype(np.float32)
    x[0, 0, :3] = [2.5, -2.5, 3.5]  # ties
    scale = np.float32(rng.uniform(0.5, 2))
    x[0, 0, :3] *= scale
    zp = zp_for(out, rng, ())
    y = QuantizeLinear(KernelContext(device))(x, scale, Tensor(zp, out)).numpy()
    exp = ref_quantize(x, scale, zp, out)
    assert y.dtype == exp.dtype
    np.testing.assert_array_equal(y.astype(np.float64), exp.astype(np.float64))


@pytest.mark.parametrize("out", [D.UINT8, D.INT8, D.INT16, D.INT4, D.UINT2, D.FLOAT8E4M3FN])
@pytest.mark.parametrize("axis", [0, 1, -1, -3])
def test_quantize_per_axis(device, rng, out, axis):
    x = (rng.standard_normal((3, 4, 5)) * 20).astype(np.float32)
    n = x.shape[axis]
    scale = rng.uniform(0.2, 3, n).astype(np.float32)
    zp = zp_for(out, rng, (n,))
    y = QuantizeLinear(KernelContext(device))(x, scale, Tensor(zp, out), axis=axis).numpy()
    exp = ref_quantize(x, scale, zp, out, "axis", axis % 3)
    np.testing.assert_array_equal(y.astype(np.float64), exp.astype(np.float64))


@pytest.mark.parametrize("block", [1, 2, 3, 5])
@pytest.mark.parametrize("out", [D.UINT8, D.INT4, D.FLOAT8E5M2])
def test_quantize_blocked(device, rng, block, out):
    x = (rng.standard_normal((2, 7, 3)) * 10).astype(np.float32)
    nb = -(-7 // block)
    scale = rng.uniform(0.2, 3, (2, nb, 3)).astype(np.float32)
    zp = zp_for(out, rng, (2, nb, 3))
    y = QuantizeLinear(KernelContext(device))(x, scale, Tensor(zp, out), axis=1, block_size=block).numpy()
    exp = ref_quantize(x, scale, zp, out, "block", 1, block)
    np.testing.assert_array_equal(y.astype(np.float64), exp.astype(np.float64))


@pytest.mark.parametrize("out", list(FLOAT_TARGETS))
def test_quantize_float8_saturate_off(device, out):
    x = np.array([0, 1e6, -1e6, np.inf, -np.inf, 3.0], np.float32)
    k = QuantizeLinear(KernelContext(device))
    zp = Tensor(np.zeros((), np.float32).astype(FLOAT_TARGETS[out]), out)
    y_sat = k(x, np.float32(1), zp, saturate=1).numpy().astype(np.float32)
    m = float(ml_dtypes.finfo(FLOAT_TARGETS[out]).max)
    np.testing.assert_array_equal(y_sat, [0, m, -m, m, -m, 3.0])
    y = k(x, np.float32(1), zp, saturate=0).numpy().astype(np.float32)
    exp = x.astype(FLOAT_TARGETS[out]).astype(np.float32) if out not in ALWAYS_SATURATE else y_sat
    np.testing.assert_array_equal(y, exp)


@pytest.mark.parametrize("xdt", [np.float32, np.float16, ml_dtypes.bfloat16, np.int32])
def test_quantize_input_types_default_uint8(device, rng, xdt):
    x = (rng.standard_normal((4, 6)) * 50).astype(xdt)
    scale = np.float32(1.7) if xdt in (np.float32, np.int32) else np.array(1.7, xdt)
    y = QuantizeLinear(KernelContext(device))(x, scale)
    assert y.data_type == D.UINT8
    xf = x.astype(np.float64 if xdt == np.int32 else np.float32)
    sf = np.asarray(scale).astype(np.float32)
    q = (xf / sf)
    if xdt in (np.float16, ml_dtypes.bfloat16):
        q = q.astype(np.float32).astype(xdt).astype(np.float64)
    exp = np.clip([round(float(v)) for v in q.ravel()], 0, 255).reshape(x.shape)
    np.testing.assert_array_equal(y.numpy(), exp)


def test_quantize_output_dtype_and_precision(device, rng):
    x = (rng.standard_normal((5,)) * 100).astype(np.float32)
    k = QuantizeLinear(KernelContext(device))
    y = k(x, np.float32(0.7), output_dtype=int(D.INT16))
    assert y.data_type == D.INT16
    np.testing.assert_array_equal(y.numpy(), ref_quantize(x, np.float32(0.7), None, D.INT16))
    y16 = k(x, np.float32(0.7), output_dtype=int(D.INT8), precision=int(D.FLOAT16)).numpy()
    q = (x / np.float32(0.7)).astype(np.float16).astype(np.float64)
    np.testing.assert_array_equal(y16, np.clip([round(v) for v in q], -128, 127))
    with pytest.raises(KernelTypeError, match="QuantizeLinear"):
        k(x, np.float32(1), np.uint8(3), output_dtype=int(D.INT8))
    with pytest.raises(KernelTypeError, match="QuantizeLinear"):
        k(x, np.float32(1), output_dtype=int(D.FLOAT))


def test_quantize_opset_versions(rng):
    x = (rng.standard_normal((2, 3)) * 10).astype(np.float32)
    for v in QuantizeLinear.versions:
        k = QuantizeLinear(KernelContext("cpu", v))
        assert k.since_version == v
        y = k(x, np.float32(0.5), np.int8(2)).numpy()
        np.testing.assert_array_equal(y, ref_quantize(x, np.float32(0.5), np.int8(2), D.INT8))
    with pytest.raises(KernelInputError, match="per-tensor"):
        QuantizeLinear(KernelContext("cpu", 10))(x, np.ones(3, np.float32), np.zeros(3, np.uint8))
    with pytest.raises(KernelTypeError):
        QuantizeLinear(KernelContext("cpu", 13))(x.astype(np.float16), np.float32(1))
    with pytest.raises(KernelTypeError):
        QuantizeLinear(KernelContext("cpu", 19))(x, np.float32(1), np.int16(0))


def test_quantize_errors(device, rng):
    k = QuantizeLinear(KernelContext(device))
    x = rng.standard_normal((3, 4)).astype(np.float32)
    with pytest.raises(KernelInputError, match="QuantizeLinear.*axis 2"):
        k(x, np.ones(3, np.float32), axis=2)
    with pytest.raises(KernelInputError, match="4 of the input|axis 1"):
        k(x, np.ones(3, np.float32), axis=1)
    with pytest.raises(KernelInputError, match="zero point"):
        k(x, np.ones(4, np.float32), np.zeros(3, np.uint8))
    with pytest.raises(KernelInputError, match="blocks"):
        k(x, np.ones((3, 3), np.float32), axis=1, block_size=1)
    with pytest.raises(KernelInputError, match="block_size"):
        k(x, np.ones((3, 2), np.float32), axis=1)
    with pytest.raises(KernelTypeError, match="QuantizeLinear.*x"):
        k(x.astype(np.float64), np.float32(1))


def test_quantize_empty_and_scalar(device):
    k = QuantizeLinear(KernelContext(device))
    y = k(np.zeros((0, 3), np.float32), np.ones(3, np.float32), np.zeros(3, np.int8), axis=1)
    assert y.shape == (0, 3) and y.data_type == D.INT8
    y = k(np.float32(7.5), np.float32(1))
    assert y.shape == () and int(y.numpy()) == 8


@pytest.mark.parametrize("xt", list(INT_TARGETS) + list(FLOAT_TARGETS) + [D.INT32])
@pytest.mark.parametrize("out", [D.FLOAT, D.FLOAT16, D.BFLOAT16])
def test_dequantize_every_type(device, rng, xt, out):
    if xt == D.INT32:
        big = 100000 if out == D.FLOAT16 else 2 ** 31 - 1
        x = rng.integers(-big, big, (3, 4), dtype=np.int64).astype(np.int32)
        zp = np.int32(0)
    elif xt in INT_TARGETS:
        dt, lo, hi = INT_TARGETS[xt]
        x = rng.integers(lo, hi + 1, (3, 4)).astype(np.int64).astype(dt)
        zp = np.array(rng.integers(lo, hi + 1)).astype(np.int64).astype(dt)
    else:
        x = (rng.standard_normal((3, 4)) * 3).astype(np.float32).astype(FLOAT_TARGETS[xt])
        zp = np.zeros((), FLOAT_TARGETS[xt])
    scale = np.float32(0.37)
    sdt = {D.FLOAT: np.float32, D.FLOAT16: np.float16, D.BFLOAT16: ml_dtypes.bfloat16}[out]
    scale_t = np.array(scale).astype(sdt)
    y = DequantizeLinear(KernelContext(device))(Tensor(x, xt), scale_t, Tensor(zp, xt))
    assert y.data_type == out
    exp = ref_dequantize(x, scale_t.astype(np.float32), zp)
    np.testing.assert_array_equal(y.numpy(), exp.astype(np.float32).astype(sdt))


@pytest.mark.parametrize("axis", [0, -1, 1])
def test_dequantize_per_axis_and_blocked(device, rng, axis):
    x = rng.integers(-128, 128, (4, 6, 5)).astype(np.int8)
    n = x.shape[axis]
    s = rng.uniform(0.1, 2, n).astype(np.float32)
    z = rng.integers(-10, 10, n).astype(np.int8)
    y = DequantizeLinear(KernelContext(device))(x, s, z, axis=axis).numpy()
    np.testing.assert_allclose(y, ref_dequantize(x, s, z, "axis", axis % 3), rtol=1e-6)
    sb = rng.uniform(0.1, 2, (4, 2, 5)).astype(np.float32)
    zb = rng.integers(-10, 10, (4, 2, 5)).astype(np.int8)
    y = DequantizeLinear(KernelContext(device))(x, sb, zb, axis=1, block_size=4).numpy()
    np.testing.assert_allclose(y, ref_dequantize(x, sb, zb, "block", 1, 4), rtol=1e-6)


def test_dequantize_output_dtype_and_e8m0(device, rng):
    x = rng.integers(0, 256, (2, 8)).astype(np.uint8)
    s = np.array([0.25, 2.0], np.float32).astype(ml_dtypes.float8_e8m0fnu)
    k = DequantizeLinear(KernelContext(device))
    y = k(x, Tensor(s, D.FLOAT8E8M0), axis=0)
    assert y.data_type == D.FLOAT
    np.testing.assert_array_equal(y.numpy(), x * np.array([[0.25], [2.0]], np.float32))
    y = k(x, np.float32(0.5), output_dtype=int(D.FLOAT16))
    assert y.data_type == D.FLOAT16
    with pytest.raises(KernelTypeError, match="DequantizeLinear"):
        k(x, np.float32(0.5), output_dtype=int(D.DOUBLE))
    with pytest.raises(KernelTypeError, match="DequantizeLinear"):
        k(x, np.float32(0.5), np.int8(0))
    with pytest.raises(KernelInputError, match="DequantizeLinear.*axis 3"):
        k(x, np.ones(2, np.float32), axis=3)


def test_dequantize_versions(rng):
    x = rng.integers(0, 256, (2, 3)).astype(np.uint8)
    for v in DequantizeLinear.versions:
        y = DequantizeLinear(KernelContext("cpu", v))(x, np.float32(0.5), np.uint8(7)).numpy()
        np.testing.assert_array_equal(y, (x.astype(np.float32) - 7) * 0.5)
    with pytest.raises(KernelTypeError):
        DequantizeLinear(KernelContext("cpu", 19))(x.astype(np.int16), np.float32(1))


def ref_dynamic(x):
    lo = min(0.0, float(x.min())) if x.size else 0.0
    hi = max(0.0, float(x.max())) if x.size else 0.0
    scale = np.float32((np.float32(hi) - np.float32(lo)) / np.float32(255))
    if scale == 0:
        return np.zeros(x.shape, np.uint8), scale, np.uint8(0)
    zp = min(max(round(float(np.float32(0) - np.float32(lo) / scale)), 0), 255)
    q = [min(max(round(float(np.float32(v) / scale)) + zp, 0), 255) for v in x.ravel()]
    return np.array(q, np.uint8).reshape(x.shape), scale, np.uint8(zp)


@pytest.mark.parametrize("shift", [0.0, 5.0, -5.0])
def test_dynamic_quantize(device, rng, shift):
    x = (rng.standard_normal((3, 7)) + shift).astype(np.float32)
    y, s, z = DynamicQuantizeLinear(KernelContext(device))(x)
    ey, es, ez = ref_dynamic(x)
    np.testing.assert_array_equal(y.numpy(), ey)
    assert s.numpy() == es and z.numpy() == ez and s.shape == () and z.data_type == D.UINT8


def test_dynamic_quantize_edge(device):
    k = DynamicQuantizeLinear(KernelContext(device))
    y, s, z = k(np.zeros((2, 2), np.float32))
    assert (y.numpy() == 0).all() and s.numpy() == 0 and z.numpy() == 0
    y, s, z = k(np.zeros((0,), np.float32))
    assert y.shape == (0,)
    with pytest.raises(KernelTypeError, match="DynamicQuantizeLinear"):
        k(np.zeros(3, np.float64))
