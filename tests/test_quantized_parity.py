"""Quantization operators give the same bits on every device (issue 14, parity bullet).

Each test runs on ``device`` (cpu, and cuda: real CuPy, or its CPU simulation under
``GPUKERNELS_SIMULATE_CUDA=1``).  A cuda run also computes the case on cpu and requires the
two results to be bit-identical; every run compares with an independent float64 reference
written here (vectorised NumPy in float64 with explicit roundings, not the kernels' code).

The algorithm the kernels implement (one array-namespace code path, the same on both
devices: gpukernels/kernels/quant/_common.py and linear.py), and the reference below:

* QuantizeLinear: ``q = x / y_scale`` computed as ONE IEEE division in the division
  precision -- float32 for float32 operands (the spec: "the type of y_scale determines the
  precision of the division"), float16/bfloat16 when that is the scale's type or the
  ``precision`` attribute, float64 when x or the scale is int32 -- i.e. the exact quotient
  rounded once to that format; then round half to even, add the zero point, saturate.
  Division, never multiplication by a reciprocal (1/scale is itself rounded, so x * (1/s)
  differs from x / s in the last place and flips ties).  onnxruntime's CPU kernel divides
  too and agrees bit for bit on float32 inputs (checked below through the models).
* DynamicQuantizeLinear: each step of the spec's formulas in float32:
  ``scale = fl32(fl32(max(0, max x) - min(0, min x)) / 255)``,
  ``zero_point = saturate(round(0 - fl32(min / scale)))``, then QuantizeLinear.

What the spec leaves open, and the documented choice the reference encodes:
* NaN to an integer type: the lowest value of the range (NaN to float4/float6, which cannot
  encode it, is only required to agree across devices).
* All-zero input to DynamicQuantizeLinear: scale 0, zero point 0, y 0 (the spec's formula
  gives scale 0; onnxruntime returns scale 1 and onnx.reference 1/255 -- y and the zero
  point are 0 everywhere, so dequantized values agree).
* ``precision`` (or a half-precision scale) with a float32 x: the float32 quotient is rounded
  to the half type (onnx.reference instead casts x to the half type before dividing).
* int32 x: the division is done in float64.
* DequantizeLinear: ``(x - zero_point) * scale`` in float32 (float64 for int32 x), rounded
  once more into a half-precision output type.

Sub-byte integers (int4, uint4, int2, uint2) hold one value per byte; their comparison is
by value, because the unused high bits of that byte are not part of the value (a GPU
tensor's host copy keeps them sign-extended, ml_dtypes clears them).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from gpukernels.dtypes import DataType as D
from gpukernels.kernels.base import KernelContext
from gpukernels.kernels.math.matmul_integer import MatMulInteger
from gpukernels.kernels.nn.conv_variants import ConvInteger
from gpukernels.kernels.quant.linear import DequantizeLinear, DynamicQuantizeLinear, QuantizeLinear
from gpukernels.kernels.quant.qlinear import QLinearConv, QLinearMatMul
from gpukernels.tensor import Tensor

# ----------------------------------------------------------------------------- reference

INT_RANGES = {
    D.UINT8: (np.uint8, 0, 255), D.INT8: (np.int8, -128, 127),
    D.UINT16: (np.uint16, 0, 65535), D.INT16: (np.int16, -32768, 32767),
    D.UINT4: (ml_dtypes.uint4, 0, 15), D.INT4: (ml_dtypes.int4, -8, 7),
    D.UINT2: (ml_dtypes.uint2, 0, 3), D.INT2: (ml_dtypes.int2, -2, 1),
}
SUB_BYTE = (D.UINT4, D.INT4, D.UINT2, D.INT2)

# binary floating-point formats: (explicit mantissa bits, exponent of the smallest normal,
# largest finite value, what a non-saturating overflow gives), from the ONNX spec's tables
FORMATS = {
    D.FLOAT: (23, -126, float(np.finfo(np.float32).max), np.inf),
    D.FLOAT16: (10, -14, 65504.0, np.inf),
    D.BFLOAT16: (7, -126, (2 - 2 ** -7) * 2.0 ** 127, np.inf),
    D.FLOAT8E4M3FN: (3, -6, 448.0, np.nan),
    D.FLOAT8E4M3FNUZ: (3, -7, 240.0, np.nan),
    D.FLOAT8E5M2: (2, -14, 57344.0, np.inf),
    D.FLOAT8E5M2FNUZ: (2, -15, 57344.0, np.nan),
    D.FLOAT4E2M1: (1, 0, 6.0, None),   # no inf/NaN encoding: always saturates
    D.FLOAT6E2M3: (3, 0, 7.5, None),
    D.FLOAT6E3M2: (2, -2, 28.0, None),
}
FLOAT_TARGETS = {
    D.FLOAT8E4M3FN: ml_dtypes.float8_e4m3fn, D.FLOAT8E4M3FNUZ: ml_dtypes.float8_e4m3fnuz,
    D.FLOAT8E5M2: ml_dtypes.float8_e5m2, D.FLOAT8E5M2FNUZ: ml_dtypes.float8_e5m2fnuz,
    D.FLOAT4E2M1: ml_dtypes.float4_e2m1fn, D.FLOAT6E2M3: ml_dtypes.float6_e2m3fn,
    D.FLOAT6E3M2: ml_dtypes.float6_e3m2fn,
}
HALF = {D.FLOAT16: np.float16, D.BFLOAT16: ml_dtypes.bfloat16}


def round_to(v, fmt, saturate=False):
    """float64 values rounded to nearest-even in binary format fmt (FORMATS), as float64;
    overflow gives inf/NaN as the format does, or its largest value when saturate.
    Exact: the scaling by a power of two and np.rint on float64 introduce no other error."""
    mbits, emin, vmax, overflow = FORMATS[fmt]
    v = np.asarray(v, np.float64)
    a = np.abs(v)
    with np.errstate(invalid="ignore", over="ignore"):
        _, e = np.frexp(a)                               # a = m * 2**e, 0.5 <= m < 1
        e = np.maximum(e.astype(np.int64) - 1, emin)      # exponent of the leading bit
        quantum = np.ldexp(1.0, e - mbits)                # spacing of the format there
        r = np.rint(a / quantum) * quantum
        r = np.where(np.isinf(a), np.inf, r)
        if saturate or overflow is None:
            r = np.where(r > vmax, vmax, r)
        else:
            r = np.where(r > vmax, overflow, r)
    return np.copysign(r, v)


def division_format(x_type, s_type, precision=None):
    if precision is not None:
        return precision
    if D.INT32 in (x_type, s_type):
        return None  # float64: the quotient is not rounded further
    return s_type


def ref_quantize(x, x_type, s, s_type, zp, out, kind="tensor", axis=1, block=0, saturate=True,
                 precision=None):
    """saturate(round_half_even(x / scale) + zero_point), the quotient rounded once into the
    division precision; float targets: round(x / scale + zp) into the target."""
    sb = broadcast_param(np.asarray(s).astype(np.float64), x.shape, kind, axis, block)
    q = np.asarray(x).astype(np.float64) / sb  # x and scale are exact in float64
    fmt = division_format(x_type, s_type, precision)
    if fmt is not None:
        q = round_to(q, fmt)
    zb = 0.0 if zp is None else broadcast_param(np.asarray(zp).astype(np.float64), x.shape, kind,
                                                axis, block)
    if out in INT_RANGES:
        _, lo, hi = INT_RANGES[out]
        with np.errstate(invalid="ignore"):
            r = np.clip(np.rint(q) + zb, lo, hi)
        return np.where(np.isnan(r), lo, r)
    return round_to(q + zb, out, saturate)


def broadcast_param(p, x_shape, kind, axis, block):
    if kind == "tensor":
        return p.reshape(())
    if kind == "axis":
        shape = [1] * len(x_shape)
        shape[axis] = x_shape[axis]
        return p.reshape(shape)
    return np.repeat(p, block, axis=axis).take(np.arange(x_shape[axis]), axis=axis)


def ref_dynamic(x):
    """DynamicQuantizeLinear's formulas, every float32 operation rounded to float32."""
    x64 = x.astype(np.float64)
    lo = min(0.0, float(x64.min())) if x.size else 0.0
    hi = max(0.0, float(x64.max())) if x.size else 0.0
    scale = float(round_to(round_to(hi - lo, D.FLOAT) / 255.0, D.FLOAT))
    if scale == 0:
        return np.zeros(x.shape), 0.0, 0
    zp = int(np.clip(np.rint(0.0 - float(round_to(lo / scale, D.FLOAT))), 0, 255))
    y = np.clip(np.rint(round_to(x64 / scale, D.FLOAT)) + zp, 0, 255)
    return y, scale, zp


# ---------------------------------------------------------------------------- helpers


def run(cls, device, *args, **kwargs):
    """Host arrays of every output of cls(*args) on device."""
    out = cls(KernelContext(device))(*args, **kwargs)
    outs = list(out) if isinstance(out, tuple) else [out]
    return [(t.numpy(), t.data_type) for t in outs]


def storage_bits(a, data_type):
    """What must be identical across devices: the bytes, or the value for sub-byte ints."""
    a = np.ascontiguousarray(a)
    if data_type in SUB_BYTE:
        return a.astype(np.int8)
    return a.view(np.dtype(f"u{a.dtype.itemsize}") if a.dtype.itemsize > 1 else np.uint8)


def on_device_and_cpu(device, cls, *args, **kwargs):
    """Outputs on device; on cuda also requires them bit-identical to the cpu outputs."""
    got = run(cls, device, *args, **kwargs)
    if device != "cpu":
        want = run(cls, "cpu", *args, **kwargs)
        for (g, gt), (w, wt) in zip(got, want):
            assert gt == wt and g.dtype == w.dtype and g.shape == w.shape
            gb, wb = storage_bits(g, gt), storage_bits(w, wt)
            bad = np.flatnonzero((gb != wb).ravel())
            assert bad.size == 0, (f"{cls.__name__}: {bad.size} of {g.size} elements differ between "
                                   f"{device} and cpu; first at {bad[:5]}: {g.ravel()[bad[:5]]} vs "
                                   f"{w.ravel()[bad[:5]]}")
    return got


def assert_values(got, want, what=""):
    g = np.asarray(got).astype(np.float64)
    bad = np.flatnonzero(~((g == want) | (np.isnan(g) & np.isnan(want))).ravel())
    assert bad.size == 0, (f"{what}: {bad.size} of {g.size} elements differ from the reference; "
                           f"first at {bad[:5]}: {g.ravel()[bad[:5]]} vs {np.ravel(want)[bad[:5]]}")


def quant_inputs(rng, shape, sb, lo, hi, ties: bool):
    """float32 x for scales sb (broadcast to shape): quotients spread over [lo - 40, hi + 40]
    (both saturation ends), a sixth exact ties x = (k + 0.5) * s (exact when s is dyadic with
    a short mantissa), a sixth the float32 neighbours of such ties, and specials."""
    sb = np.broadcast_to(sb.astype(np.float64), shape)
    k = rng.integers(lo - 40, hi + 41, shape).astype(np.float64)
    x = ((k + rng.random(shape)) * sb).astype(np.float32)
    flat = x.reshape(-1)
    n = flat.size
    tie = ((k + 0.5) * sb).astype(np.float32).reshape(-1)
    if ties:
        sel = rng.random(n) < 1 / 6
        flat[sel] = tie[sel]
        up = (rng.random(n) < 1 / 12) & ~sel
        flat[up] = np.nextafter(tie[up], np.float32(np.inf))
        down = (rng.random(n) < 1 / 12) & ~sel & ~up
        flat[down] = np.nextafter(tie[down], np.float32(-np.inf))
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e30, -1e30, 1e-40, -1e-40], np.float32)
    flat[:specials.size] = specials[:n]
    return x


def dyadic_scales(rng, n):
    """Scales m * 2**-j with m < 64: (k + 0.5) * s is exact in float32 for |k| < 2**17."""
    m = rng.integers(1, 64, n)
    j = rng.integers(3, 12, n)
    return (m * np.exp2(-j.astype(np.float64))).astype(np.float32)


def random_scales(rng, n):
    return rng.uniform(1e-3, 2.0, n).astype(np.float32)


def scale_and_zp(rng, kind, x_shape, axis, block, scales, zp_gen):
    if kind == "tensor":
        s = scales(rng, 1).reshape(())
    elif kind == "axis":
        s = scales(rng, x_shape[axis])
    else:
        pshape = list(x_shape)
        pshape[axis] = -(-x_shape[axis] // block)
        s = scales(rng, int(np.prod(pshape))).reshape(pshape)
    return s, (None if zp_gen is None else zp_gen(s.shape))


GRANULARITY = [("tensor", 1, 0), ("axis", 1, 0), ("axis", -1, 0), ("block", 1, 4), ("block", 2, 3)]


# ------------------------------------------------------------------ QuantizeLinear: ints


def _name(v):
    return v.name if isinstance(v, D) else str(v)


@pytest.mark.parametrize("out", list(INT_RANGES), ids=_name)
@pytest.mark.parametrize("kind,axis,block", GRANULARITY, ids=lambda v: str(v))
@pytest.mark.parametrize("scales", [dyadic_scales, random_scales], ids=["dyadic", "random"])
@pytest.mark.parametrize("with_zp", [True, False], ids=["zp", "nozp"])
def test_quantize_integer_targets(device, rng, out, kind, axis, block, scales, with_zp):
    npdt, lo, hi = INT_RANGES[out]
    shape = (2, 12, 10, 7)
    ax = axis % len(shape)
    zp_gen = (lambda sh: rng.integers(lo, hi + 1, sh).astype(np.int64).astype(npdt)) if with_zp else None
    s, zp = scale_and_zp(rng, kind, shape, ax, block, scales, zp_gen)
    sb = broadcast_param(s.astype(np.float64), shape, kind, ax, block)
    x = quant_inputs(rng, shape, sb, lo, hi, ties=True)
    if scales is dyadic_scales:  # the case holds what it claims: exact ties, both parities
        with np.errstate(invalid="ignore"):
            tie_k = (x.astype(np.float64) / sb - 0.5)[(x.astype(np.float64) / sb) % 1 == 0.5]
        assert tie_k.size > x.size // 10 and np.unique(tie_k % 2).size == 2
    kw = dict(axis=axis, block_size=block)
    if zp is None:
        kw["output_dtype"] = int(out)
        args = (x, s)
    else:
        args = (x, s, Tensor(zp, out))
    (y, yt), = on_device_and_cpu(device, QuantizeLinear, *args, **kw)
    assert yt == out and y.dtype == np.dtype(npdt) and y.shape == shape
    assert_values(y, ref_quantize(x, D.FLOAT, s, D.FLOAT, zp, out, kind, ax, block), f"{out.name}")


@pytest.mark.parametrize("out,shape", [(D.UINT8, (1, 3, 224, 224)), (D.INT8, (4, 128, 768)),
                                       (D.INT16, (4, 128, 768))], ids=_name)
def test_quantize_large_tensors(device, rng, out, shape):
    npdt, lo, hi = INT_RANGES[out]
    s = dyadic_scales(rng, 1).reshape(())
    zp = np.array(rng.integers(lo, hi + 1)).astype(npdt)
    x = quant_inputs(rng, shape, s, lo, hi, ties=True)
    (y, _), = on_device_and_cpu(device, QuantizeLinear, x, s, zp)
    assert_values(y, ref_quantize(x, D.FLOAT, s, D.FLOAT, zp, out), out.name)
    # the same with a scale whose reciprocal is inexact (x * (1/s) would differ here)
    s = np.float32(0.0186584)
    x = quant_inputs(rng, shape, s, lo, hi, ties=True)
    (y, _), = on_device_and_cpu(device, QuantizeLinear, x, s, zp)
    assert_values(y, ref_quantize(x, D.FLOAT, s, D.FLOAT, zp, out), out.name)


def test_quantize_division_not_reciprocal(device):
    """Quotients that a multiplication by the rounded reciprocal puts on the other side of
    a tie: the result must follow the division."""
    s = np.float32(0.1)
    k = np.arange(-100, 100, dtype=np.float64)
    x = ((k + 0.5) * np.float64(s)).astype(np.float32)
    x = np.concatenate([x, np.nextafter(x, np.float32(np.inf)), np.nextafter(x, np.float32(-np.inf))])
    by_division = np.rint(x / s)
    by_reciprocal = np.rint(x * (np.float32(1) / s))
    assert (by_division != by_reciprocal).any()  # the case is meaningful
    (y, _), = on_device_and_cpu(device, QuantizeLinear, x, s, np.int16(0))
    assert_values(y, ref_quantize(x, D.FLOAT, s, D.FLOAT, np.int16(0), D.INT16), "int16")
    np.testing.assert_array_equal(y, np.clip(by_division, -32768, 32767))


# ---------------------------------------------------------------- QuantizeLinear: floats


@pytest.mark.parametrize("out", list(FLOAT_TARGETS), ids=_name)
@pytest.mark.parametrize("saturate", [1, 0], ids=["saturate", "nosaturate"])
@pytest.mark.parametrize("kind,axis,block", [("tensor", 1, 0), ("axis", 0, 0), ("block", 1, 2)],
                         ids=lambda v: str(v))
def test_quantize_float_targets(device, rng, out, saturate, kind, axis, block):
    mbits, emin, vmax, _ = FORMATS[out]
    shape = (3, 16, 50)
    s, _ = scale_and_zp(rng, kind, shape, axis, block, dyadic_scales, None)
    sb = broadcast_param(s.astype(np.float64), shape, kind, axis, block)
    # quotients over the whole range, beyond the largest value, and exact midpoints between
    # neighbouring values of the target (ties to even), times the scale
    mag = np.exp2(rng.uniform(emin - mbits - 2, np.log2(vmax) + 1.5, shape))
    q = np.copysign(mag, rng.standard_normal(shape))
    e = np.maximum(np.floor(np.log2(np.abs(q))), emin)
    quantum = np.exp2(e - mbits)
    mid = (np.floor(np.abs(q) / quantum) + 0.5) * quantum * np.sign(q)
    q = np.where(rng.random(shape) < 0.3, mid, q)
    x = (q * sb).astype(np.float32)
    x.reshape(-1)[:7] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e30, -1e30]
    zp = np.zeros(s.shape, np.float32).astype(FLOAT_TARGETS[out])
    (y, yt), = on_device_and_cpu(device, QuantizeLinear, x, s, Tensor(zp, out), axis=axis,
                                 block_size=block, saturate=saturate)
    assert yt == out
    want = ref_quantize(x, D.FLOAT, s, D.FLOAT, None, out, kind, axis, block, bool(saturate))
    defined = ~np.isnan(x) if FORMATS[out][3] is None else np.ones(x.shape, bool)  # no NaN code
    assert_values(y.astype(np.float64)[defined], want[defined], out.name)


# ------------------------------------------------- QuantizeLinear: division precisions


@pytest.mark.parametrize("xt,st,precision", [
    (D.FLOAT16, D.FLOAT16, None), (D.BFLOAT16, D.BFLOAT16, None),
    (D.FLOAT, D.FLOAT, D.FLOAT16), (D.FLOAT, D.FLOAT, D.BFLOAT16),
    (D.FLOAT16, D.FLOAT16, D.FLOAT), (D.FLOAT, D.FLOAT16, None),
    (D.INT32, D.FLOAT, None), (D.FLOAT, D.FLOAT, D.DOUBLE),
], ids=lambda v: v.name if v is not None else "default")
def test_quantize_division_precision(device, rng, xt, st, precision):
    npx = {D.FLOAT: np.float32, D.INT32: np.int32, **HALF}[xt]
    nps = {D.FLOAT: np.float32, **HALF}[st]
    shape = (8, 300)
    s = dyadic_scales(rng, shape[1]).astype(nps)
    if xt == D.INT32:
        x = rng.integers(-2 ** 31, 2 ** 31 - 1, shape, dtype=np.int64).astype(np.int32)
        x[0, :3] = [2 ** 31 - 1, -2 ** 31, 0]
    else:
        with np.errstate(over="ignore"):  # the +-1e30 specials become +-inf in half precision
            x = quant_inputs(rng, shape, s.astype(np.float64), -128, 127, ties=True).astype(npx)
    kw = dict(axis=1) if precision is None else dict(axis=1, precision=int(precision))
    zp = np.zeros(shape[1], np.int16)
    (y, _), = on_device_and_cpu(device, QuantizeLinear, x, s, zp, **kw)
    # the division precision: the attribute, else the scale's type; float64 (the quotient
    # not rounded further) for double or an int32 operand
    fmt = precision or st
    if fmt == D.DOUBLE or xt == D.INT32:
        fmt = None
    q = x.astype(np.float64) / broadcast_param(s.astype(np.float64), shape, "axis", 1, 0)
    if fmt is not None:
        # the float32 quotient rounded into fmt.  For half-precision operands this is the
        # correctly rounded half quotient (float32 has more than 2p + 2 bits: no double-
        # rounding error); for a float32 x it is the documented choice (the spec leaves open
        # whether x is rounded to the half type before dividing, as onnx.reference does)
        q = round_to(round_to(q, D.FLOAT), fmt)
    want = np.where(np.isnan(q), -32768, np.clip(np.rint(q), -32768, 32767))
    assert_values(y, want, f"{xt.name}/{st.name}/{precision}")


# ------------------------------------------------------------------- DequantizeLinear


# int32 and 16-bit values times a scale overflow float16 (to inf, which the case checks)
@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
@pytest.mark.parametrize("xt", list(INT_RANGES) + list(FLOAT_TARGETS) + [D.INT32], ids=_name)
@pytest.mark.parametrize("out", [D.FLOAT, D.FLOAT16, D.BFLOAT16], ids=_name)
def test_dequantize(device, rng, xt, out):
    shape = (6, 40, 9)
    n = shape[1]
    if xt == D.INT32:
        x = rng.integers(-2 ** 31, 2 ** 31 - 1, shape, dtype=np.int64).astype(np.int32)
        zp = rng.integers(-1000, 1000, n).astype(np.int32)
    elif xt in INT_RANGES:
        npdt, lo, hi = INT_RANGES[xt]
        x = rng.integers(lo, hi + 1, shape).astype(np.int64).astype(npdt)
        zp = rng.integers(lo, hi + 1, n).astype(np.int64).astype(npdt)
    else:
        npdt = FLOAT_TARGETS[xt]
        x = (rng.standard_normal(shape) * 4).astype(np.float32).astype(npdt)
        zp = np.zeros(n, np.float32).astype(npdt)
    s = random_scales(rng, n).astype({D.FLOAT: np.float32, **HALF}[out])
    (y, yt), = on_device_and_cpu(device, DequantizeLinear, Tensor(x, xt), s, Tensor(zp, xt), axis=1)
    assert yt == out
    sb = broadcast_param(s.astype(np.float64), shape, "axis", 1, 0)
    zb = broadcast_param(zp.astype(np.float64), shape, "axis", 1, 0)
    prod = (x.astype(np.float64) - zb) * sb  # exact below 2**53 (8/16-bit x), else one rounding
    want = round_to(prod, D.FLOAT)            # the float32 result
    if out != D.FLOAT:
        want = round_to(want, out)            # rounded once more into the output type
    assert_values(y.astype(np.float64), want, f"{xt.name}->{out.name}")


# ------------------------------------------------------------ DynamicQuantizeLinear


def _dyn_exact_ties(rng, shape):
    """Data whose range gives the dyadic scale s exactly, with quotients exactly k + 0.5."""
    s = float(dyadic_scales(rng, 1)[0])
    zp0 = int(rng.integers(1, 255))
    k = rng.integers(-zp0, 255 - zp0, shape).astype(np.float64)
    x = ((k + 0.5) * s).astype(np.float32)
    flat = x.reshape(-1)
    flat[0], flat[1] = -zp0 * s, (255 - zp0) * s  # min and max: hi - lo = 255 * s
    return x, s


@pytest.mark.parametrize("case", ["normal", "positive", "negative", "ties", "wide", "tiny",
                                  "zeros", "constant", "empty", "one"])
@pytest.mark.parametrize("shape", [(4, 128, 768), (1, 3, 224, 224)], ids=["4x128x768", "1x3x224x224"])
def test_dynamic_quantize(device, rng, case, shape):
    if case == "normal":
        x = rng.standard_normal(shape).astype(np.float32)
    elif case == "positive":
        x = (np.abs(rng.standard_normal(shape)) * 7 + 0.5).astype(np.float32)
    elif case == "negative":
        x = (-np.abs(rng.standard_normal(shape)) * 3 - 1).astype(np.float32)
    elif case == "ties":
        x, tie_scale = _dyn_exact_ties(rng, shape)
    elif case == "wide":
        x = (rng.standard_normal(shape) * 1e30).astype(np.float32)
    elif case == "tiny":
        x = (rng.standard_normal(shape) * 1e-30).astype(np.float32)
    elif case == "zeros":
        x = np.zeros(shape, np.float32)
    elif case == "constant":
        x = np.full(shape, -2.75, np.float32)
    elif case == "empty":
        x = np.zeros((0,) + shape[1:], np.float32)
    else:
        x = np.array([3.3], np.float32)
    (y, yt), (s, st), (z, zt) = on_device_and_cpu(device, DynamicQuantizeLinear, x)
    assert (yt, st, zt) == (D.UINT8, D.FLOAT, D.UINT8) and s.shape == () and z.shape == ()
    ry, rs, rz = ref_dynamic(x)
    assert_values(s, np.float64(rs), "y_scale")
    assert int(z) == rz
    assert_values(y, ry, "y")
    if case == "ties":  # the case is what it claims: scale s exactly, quotients k + 0.5
        assert float(s) == tie_scale
        assert (np.abs(x.astype(np.float64) / tie_scale % 1 - 0.5) == 0).mean() > 0.99


# NaN/inf data make the scale NaN/inf, and its divisions say so
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("special", [np.nan, np.inf, -np.inf])
def test_dynamic_quantize_nonfinite(device, rng, special):
    """The spec leaves this undefined; documented: scale NaN/inf, zero point 0, y 0."""
    x = rng.standard_normal((3, 50)).astype(np.float32)
    x[1, 7] = special
    (y, _), (s, _), (z, _) = on_device_and_cpu(device, DynamicQuantizeLinear, x)
    assert np.isnan(s) if np.isnan(special) else np.isposinf(s)
    assert int(z) == 0 and not y.any()


# ---------------------------------------- integer matmul/conv and QLinear requantization


def _ints(rng, shape, dt):
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max + 1, shape).astype(dt)


@pytest.mark.parametrize("k", [7, 300], ids=["k7-float32-sums", "k300-float64-sums"])
@pytest.mark.parametrize("adt,bdt", [(np.uint8, np.int8), (np.int8, np.uint8), (np.uint8, np.uint8)])
def test_matmul_integer(device, rng, k, adt, bdt):
    a = _ints(rng, (3, 17, k), adt)
    b = _ints(rng, (k, 33), bdt)
    az = _ints(rng, (17,), adt)
    bz = _ints(rng, (33,), bdt)
    (y, yt), = on_device_and_cpu(device, MatMulInteger, a, b, az, bz)
    want = (a.astype(np.int64) - az.astype(np.int64)[:, None]) @ (b.astype(np.int64) - bz.astype(np.int64))
    assert yt == D.INT32
    np.testing.assert_array_equal(y, want)


def test_conv_integer(device, rng):
    x = _ints(rng, (2, 6, 13, 11), np.uint8)
    w = _ints(rng, (8, 3, 3, 3), np.int8)
    wz = _ints(rng, (8,), np.int8)
    (y, _), = on_device_and_cpu(device, ConvInteger, x, w, np.uint8(131), wz, pads=[1, 2, 1, 0],
                                strides=[2, 1], group=2)
    xs = np.pad(x.astype(np.int64) - 131, ((0, 0), (0, 0), (1, 1), (2, 0)))
    ws = w.astype(np.int64) - wz.astype(np.int64)[:, None, None, None]
    oh, ow = (xs.shape[2] - 3) // 2 + 1, xs.shape[3] - 3 + 1
    want = np.zeros((2, 8, oh, ow), np.int64)
    for m in range(8):
        g = m // 4
        for i in range(3):
            for j in range(3):
                patch = xs[:, 3 * g:3 * g + 3, i:i + 2 * oh:2, j:j + ow]
                want[:, m] += np.einsum("nchw,c->nhw", patch, ws[m, :, i, j])
    np.testing.assert_array_equal(y, want)


def _requant(acc, a_s, b_s, y_s, yz, ydt):
    """onnxruntime's requantization: fl32(acc) * fl32(fl32(a_s * b_s) / y_s), round half to
    even, + zero point, saturate."""
    mult = round_to(round_to(np.float64(a_s) * b_s.astype(np.float64), D.FLOAT) / np.float64(y_s), D.FLOAT)
    v = round_to(round_to(acc.astype(np.float64), D.FLOAT) * mult, D.FLOAT)
    info = np.iinfo(ydt)
    return np.clip(np.rint(v) + int(yz), info.min, info.max)


def test_qlinear_matmul(device, rng):
    a = _ints(rng, (2, 9, 40), np.uint8)
    b = _ints(rng, (40, 12), np.int8)
    a_s, y_s = np.float32(0.0173), np.float32(0.2119)
    b_s = random_scales(rng, 12) / 50
    (y, _), = on_device_and_cpu(device, QLinearMatMul, a, a_s, np.uint8(121), b, b_s,
                                np.zeros(12, np.int8), y_s, np.int8(-3))
    acc = (a.astype(np.int64) - 121) @ b.astype(np.int64)
    np.testing.assert_array_equal(y, _requant(acc, a_s, b_s, y_s, -3, np.int8))


def test_qlinear_conv(device, rng):
    x = _ints(rng, (1, 4, 12, 12), np.uint8)
    w = _ints(rng, (6, 4, 3, 3), np.int8)
    bias = rng.integers(-2000, 2000, 6).astype(np.int32)
    x_s, y_s = np.float32(0.02), np.float32(0.137)
    w_s = random_scales(rng, 6) / 100
    (y, _), = on_device_and_cpu(device, QLinearConv, x, x_s, np.uint8(128), w, w_s, np.zeros(6, np.int8),
                                y_s, np.uint8(100), bias, pads=[1, 1, 1, 1])
    xs = np.pad(x.astype(np.int64) - 128, ((0, 0), (0, 0), (1, 1), (1, 1)))
    acc = np.zeros((1, 6, 12, 12), np.int64)
    for i in range(3):
        for j in range(3):
            acc += np.einsum("nchw,mc->nmhw", xs[:, :, i:i + 12, j:j + 12], w[:, :, i, j].astype(np.int64))
    acc += bias.astype(np.int64)[None, :, None, None]
    want = _requant(acc, x_s, w_s[None, :, None, None], y_s, 100, np.uint8)
    np.testing.assert_array_equal(y, want)


# ---------------------------------------------- models quantized by onnxruntime's tools

QUANT_OPS = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger",
             "ConvInteger", "QLinearConv", "QLinearMatMul"}


def _conv_net(rng):
    init = [numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32), "W"),
            numpy_helper.from_array((rng.standard_normal(8) * 0.1).astype(np.float32), "B"),
            numpy_helper.from_array((rng.standard_normal((8 * 8 * 8, 10)) * 0.1).astype(np.float32), "G"),
            numpy_helper.from_array((rng.standard_normal(10) * 0.1).astype(np.float32), "GB"),
            numpy_helper.from_array(np.array([1, -1], np.int64), "shape")]
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Reshape", ["r", "shape"], ["f"]),
             helper.make_node("Gemm", ["f", "G", "GB"], ["y"])]
    graph = helper.make_graph(nodes, "conv_relu_gemm",
                              [helper.make_tensor_value_info("x", TP.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TP.FLOAT, [1, 10])], init)
    return graph, (1, 3, 16, 16)


def _matmul_net(rng):
    init = [numpy_helper.from_array((rng.standard_normal((64, 32)) * 0.2).astype(np.float32), "W"),
            numpy_helper.from_array((rng.standard_normal(32) * 0.1).astype(np.float32), "B")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"]),
             helper.make_node("Add", ["m", "B"], ["a"]),
             helper.make_node("Softmax", ["a"], ["y"], axis=-1)]
    graph = helper.make_graph(nodes, "matmul_add_softmax",
                              [helper.make_tensor_value_info("x", TP.FLOAT, [2, 5, 64])],
                              [helper.make_tensor_value_info("y", TP.FLOAT, [2, 5, 32])], init)
    return graph, (2, 5, 64)


# name: (float net, how it is quantized, onnxruntime tolerance on the float output as
# (atol, rtol)).  onnxruntime fuses QDQ groups into integer kernels (QLinearConv ...) whose
# rounding points differ from the QDQ float graph: an output may move by a quantization step.
MODELS = {
    "qdq_conv_u8": (_conv_net, dict(static="QDQ", per_channel=True)),
    "qdq_conv_s8": (_conv_net, dict(static="QDQ", activation_type="QInt8")),
    "qdq_matmul": (_matmul_net, dict(static="QDQ", per_channel=True)),
    "qop_conv": (_conv_net, dict(static="QOperator", op_types_to_quantize=["Conv"])),
    "qop_matmul": (_matmul_net, dict(static="QOperator", op_types_to_quantize=["MatMul"])),
    "dynamic_matmul": (_matmul_net, dict(dynamic=True)),
    "dynamic_conv": (_conv_net, dict(dynamic=True)),
}


@pytest.fixture(scope="module")
def quantized_models(tmp_path_factory):
    ort_quant = pytest.importorskip("onnxruntime.quantization")
    d = tmp_path_factory.mktemp("quantized")
    rng = np.random.default_rng(2024)
    paths = {}
    for name, (build, how) in MODELS.items():
        graph, in_shape = build(rng)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        src = d / f"{name}_float.onnx"
        onnx.save(model, str(src))
        dst = d / f"{name}.onnx"
        how = dict(how)
        if how.pop("dynamic", False):
            ort_quant.quantize_dynamic(str(src), str(dst))
        else:
            fmt = getattr(ort_quant.QuantFormat, how.pop("static"))
            act = how.pop("activation_type", "QUInt8")
            calib = [{"x": rng.standard_normal(in_shape).astype(np.float32)} for _ in range(4)]

            class Reader(ort_quant.CalibrationDataReader):
                def __init__(self):
                    self.it = iter(calib)

                def get_next(self):
                    return next(self.it, None)

            ort_quant.quantize_static(str(src), str(dst), Reader(), quant_format=fmt,
                                      activation_type=getattr(ort_quant.QuantType, act),
                                      weight_type=ort_quant.QuantType.QInt8, reduce_range=True,
                                      **how)
        feeds = {"x": (rng.standard_normal(in_shape) * 1.5).astype(np.float32)}
        paths[name] = (str(dst), feeds)
    return paths


def _ops(path):
    return {n.op_type for n in onnx.load(path).graph.node}


@pytest.mark.parametrize("name", list(MODELS))
def test_quantized_model_parity(device, quantized_models, name):
    """Every value of the model (all nodes) agrees between cpu and device, and every output of
    a quantization operator is identical (max difference 0)."""
    from gpukernels.parity import compare

    path, feeds = quantized_models[name]
    assert _ops(path) & (QUANT_OPS - {"DequantizeLinear"}), _ops(path)
    report = compare(path, devices=["cpu", device], inputs=feeds, all_nodes=True)
    side = report.sides[0] if report.sides else None
    if device == "cpu":
        assert report.passed
        return
    failed = [(v.name, v.op_type, v.max_abs) for v in side.values if not v.passed]
    assert report.passed, f"{name}: first divergence {side.first_divergence}; failing {failed}"
    quant_values = [v for v in side.values if v.op_type in QUANT_OPS]
    assert quant_values
    inexact = [(v.name, v.op_type, v.max_abs) for v in quant_values
               if v.max_abs != 0 and np.dtype(v.dtype).kind in "iu"]
    assert not inexact, f"{name}: integer outputs differ: {inexact}"


def _capture_node_inputs(path, feeds):
    """{node index: [host arrays of its inputs]} for the quantization nodes, from a cpu run."""
    from gpukernels.runtime import Session
    from gpukernels.tensor import to_host_value

    model = onnx.load(path)
    sess = Session(model, device="cpu", options={"fold_constants": False})
    values = {k: v for k, v in feeds.items()}
    values.update({i.name: numpy_helper.to_array(i) for i in model.graph.initializer})

    def observer(node, inputs, outputs, seconds):
        for name, v in zip(node.outputs, outputs):
            if name and isinstance(v, Tensor):
                values[name] = to_host_value(v)

    sess.run_values(feeds, observer=observer)
    return model, values


@pytest.mark.parametrize("name", list(MODELS))
def test_quantized_model_nodes_replayed(device, quantized_models, name):
    """Each quantization node of the model, run alone on cpu, on device and in onnxruntime
    with the cpu run's inputs, gives the same bytes: whatever values the model passes them,
    the devices (and onnxruntime) round alike."""
    from gpukernels.runtime import Session

    try:
        import onnxruntime as ort
    except ImportError:
        ort = None
    path, feeds = quantized_models[name]
    model, values = _capture_node_inputs(path, feeds)
    replayed = 0
    for node in model.graph.node:
        if node.op_type not in QUANT_OPS:
            continue
        ins = [i for i in node.input if i]
        graph = helper.make_graph(
            [node], "one", [helper.make_tensor_value_info(i, helper.np_dtype_to_tensor_dtype(values[i].dtype),
                                                          values[i].shape) for i in ins],
            [helper.make_tensor_value_info(o, helper.np_dtype_to_tensor_dtype(values[o].dtype), None)
             for o in node.output if o])
        one = helper.make_model(graph, opset_imports=list(model.opset_import))
        one.ir_version = model.ir_version
        feed = {i: values[i] for i in ins}
        outs = {}
        for dev in ("cpu", device):
            outs[dev] = Session(one, device=dev, options={"fold_constants": False}).run(None, feed)
        if ort is not None:
            outs["onnxruntime"] = ort.InferenceSession(
                one.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)
        for i, o in enumerate(o for o in node.output if o):
            a = outs["cpu"][i]
            np.testing.assert_array_equal(a, values[o])  # the model run computed the same
            for side in outs:
                b = np.asarray(outs[side][i])
                assert a.dtype == b.dtype and a.shape == b.shape, (side, a.dtype, b.dtype)
                n_bad = int((np.ravel(a).view(np.uint8) != np.ravel(b).view(np.uint8)).sum())
                assert n_bad == 0, f"{name}: {node.op_type} output {o}: {n_bad} bytes differ on {side}"
        replayed += 1
    assert replayed >= 1


def _ort_tolerance(path):
    """atol for the model's float output against onnxruntime (rtol 0).  onnxruntime fuses a
    QDQ group (DequantizeLinear -> op -> QuantizeLinear) into one integer kernel that
    requantizes its accumulator directly, where the graph evaluated node by node rounds the
    float result of the op: an output may then move by one quantization step.  So: one
    step of the last quantizer (the scale of the final DequantizeLinear) for QDQ models, and
    float32 rounding (1e-5 on these outputs of magnitude <= 10) for the others, whose
    last operators are float ones after the integer kernels."""
    model = onnx.load(path)
    last = model.graph.node[-1]
    if last.op_type == "DequantizeLinear":
        inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
        return float(inits[last.input[1]].max()) + 1e-6
    return 1e-5


@pytest.mark.parametrize("name", list(MODELS))
def test_quantized_model_vs_onnxruntime(device, quantized_models, name):
    pytest.importorskip("onnxruntime")
    from gpukernels.parity import compare

    path, feeds = quantized_models[name]
    atol = _ort_tolerance(path)
    report = compare(path, devices=[device], against="onnxruntime", inputs=feeds, rtol=0.0, atol=atol)
    side = report.sides[0]
    assert report.passed, f"{name}: atol {atol}: {[(v.name, v.max_abs) for v in side.values]}"
