"""Bit-pattern codecs for the float types CuPy lacks (bfloat16, float8, float6, float4).

On the host these types are ml_dtypes arrays and NumPy converts them exactly.  On a GPU
they are held as their bit pattern (see dtypes.DTypeInfo.storage); these functions turn
bit patterns into float32 and back with array operations only, so the same code runs on
NumPy and CuPy.  Tests check them against ml_dtypes on every bit pattern.

encode() rounds to nearest, ties to even, and applies the ONNX Cast rules for values
out of range: saturate=True clamps finite and infinite values to the largest finite
value; saturate=False gives inf where the format has one, NaN otherwise.
"""

from __future__ import annotations

import functools

import numpy as np

from .dtypes import DataType, info


@functools.lru_cache(maxsize=None)
def _decode_table(data_type: int) -> np.ndarray:
    """float32 value of every bit pattern of a <=8-bit float type."""
    i = info(data_type)
    codes = np.arange(2 ** i.bits, dtype=np.uint8)
    return codes.view(i.numpy).astype(np.float32)


@functools.lru_cache(maxsize=None)
def _encode_table(data_type: int):
    """Sorted non-negative finite values, their codes, and the overflow threshold data."""
    table = _decode_table(data_type)
    codes = np.arange(table.size)
    finite = np.isfinite(table) & (table >= 0) & ~np.signbit(table)
    values, order = np.unique(table[finite], return_index=True)
    value_codes = codes[finite][order]
    return values.astype(np.float32), value_codes.astype(np.uint8)


def _device_table(xp, table: np.ndarray):
    return table if xp is np else xp.asarray(table)


def decode(xp, bits, data_type: int):
    """float32 array of the values held as bit patterns in bits."""
    dt = DataType(int(data_type))
    if dt == DataType.BFLOAT16:
        return (bits.astype(xp.uint32) << 16).view(xp.float32)
    if dt == DataType.FLOAT16:
        return bits.view(xp.float16).astype(xp.float32)
    table = _device_table(xp, _decode_table(dt))
    return table[bits.astype(xp.intp) & (table.size - 1)]


def encode(xp, values, data_type: int, saturate: bool = True):
    """Bit patterns (storage dtype) of float values rounded to data_type."""
    dt = DataType(int(data_type))
    x = values.astype(xp.float32)
    if dt == DataType.BFLOAT16:
        return _encode_bfloat16(xp, x)
    if dt == DataType.FLOAT16:
        return x.astype(xp.float16).view(xp.uint16)
    return _encode_small_float(xp, x, dt, saturate)


def _encode_bfloat16(xp, x):
    u = x.view(xp.uint32)
    rounding = ((u >> 16) & 1) + 0x7FFF
    rounded = ((u + rounding) >> 16).astype(xp.uint16)
    nan = xp.isnan(x)
    quiet = ((u >> 16) | 0x40).astype(xp.uint16)
    return xp.where(nan, quiet, rounded)


def _encode_small_float(xp, x, dt: DataType, saturate: bool):
    i = info(dt)
    decode_table = _decode_table(dt)
    values_np, codes_np = _encode_table(dt)
    values = _device_table(xp, values_np)
    codes = _device_table(xp, codes_np)
    mag = xp.abs(x)
    n = values_np.size
    top = float(values_np[-1])
    step = float(values_np[-1] - values_np[-2])
    hi = xp.clip(xp.searchsorted(values, mag), 1, n - 1)
    lo = hi - 1
    lo_v = values[lo]
    hi_v = values[hi]
    d_lo = mag - lo_v
    d_hi = hi_v - mag
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & ((codes[lo] & 1) == 1))
    code = xp.where(pick_hi, codes[hi], codes[lo])
    # Above the largest finite value: RNE against a virtual next value top + step.
    beyond = mag > top
    overflow = beyond & ((mag - top > step / 2) | ((mag - top == step / 2) & (int(codes_np[-1]) & 1 == 0) is False))
    overflow = beyond & ((mag - top) > step / 2) if int(codes_np[-1]) & 1 == 1 else beyond & ((mag - top) >= step / 2)
    code = xp.where(beyond, codes_np[-1], code).astype(xp.uint8)
    has_sign = bool(np.signbit(decode_table).any())
    neg = xp.signbit(x) if has_sign else xp.zeros(x.shape, bool)
    sign_bit = np.uint8(1 << (i.bits - 1))
    nan_code = _special_code(decode_table, "nan")
    inf_code = _special_code(decode_table, "inf")
    if saturate:
        special_over = code  # clamp to +-max (infinities too)
    elif inf_code is not None:
        special_over = xp.full(x.shape, inf_code, xp.uint8)
    else:
        special_over = xp.full(x.shape, nan_code, xp.uint8)
    infinite = xp.isinf(x)
    if not saturate:
        code = xp.where(overflow | infinite, special_over, code)
    else:
        code = xp.where(infinite, code, code)
    out = xp.where(neg & (code != 0) | (neg & has_sign), code | sign_bit, code).astype(xp.uint8)
    if not has_sign:
        out = code
    if nan_code is not None:
        out = xp.where(xp.isnan(x), np.uint8(nan_code), out)
    # -0 in formats without a negative zero (fnuz) is +0.
    return out.astype(xp.uint8)


def _special_code(table: np.ndarray, which: str):
    hits = np.flatnonzero(np.isnan(table) if which == "nan" else np.isposinf(table))
    return int(hits[0]) if hits.size else None
