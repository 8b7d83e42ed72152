"""Bit-pattern codecs for the float types CuPy lacks (bfloat16, float8, float6, float4, e8m0).

On the host these types are ml_dtypes arrays and NumPy converts them.  On a GPU they are
held as their bit pattern (see dtypes.DTypeInfo.storage); these functions turn bit
patterns into float32 and back with array operations only, so the same code runs on
NumPy and CuPy.  tests/test_codec.py checks them against ml_dtypes on every bit pattern
and on many float32 values.

Encoding (``encode``) of a float32/float64 array rounds each value once, to nearest with
ties to even, directly from the source type (no double rounding through float32 for
float64 input).  Out-of-range values follow the ONNX Cast tables:

* float8 e4m3fn / e4m3fnuz / e5m2 / e5m2fnuz, ``saturate=True``: +-inf and values whose
  rounded magnitude exceeds the largest finite value give +-max; NaN gives NaN.
  ``saturate=False``: they give +-inf for e5m2 and NaN for the others (keeping the sign
  for e4m3fn, which has a negative NaN; the fnuz types have one NaN, 0x80, and no -0).
* float6 e2m3 / e3m2 and float4 e2m1 have neither inf nor NaN: they always saturate, and
  NaN encodes as a zero whose sign bit is the inverse of the NaN's sign (what ml_dtypes
  and the ONNX reference outputs do; the spec leaves it open).
* bfloat16 and float16 behave as IEEE types: overflow gives +-inf; ``saturate`` does not
  apply (the spec limits it to float8).  NaN stays NaN (quiet, sign kept).
* float8e8m0 (powers of two 2^-127..2^127, code 255 = NaN, no sign, no zero): see
  ``encode_e8m0``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from .dtypes import DataType, info
from .host import pooled_empty, tuning
from .xp import device_of, to_device


@dataclass(frozen=True)
class SmallFloat:
    """Layout of a small binary float format (sign, exponent, mantissa)."""

    bits: int        # total width (sign included)
    mbits: int       # mantissa bits
    bias: int        # exponent bias
    max_code: int    # code of the largest finite positive value
    nan: int | None  # code of (positive) NaN, None when there is none
    inf: int | None  # code of +inf, None when there is none
    signed_zero: bool  # False for the fnuz types: 0x80 is NaN, not -0

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal value."""
        return 1 - self.bias

    @property
    def sign_bit(self) -> int:
        return 1 << (self.bits - 1)


FORMATS: dict[DataType, SmallFloat] = {
    DataType.FLOAT8E4M3FN: SmallFloat(8, 3, 7, 0x7E, 0x7F, None, True),
    DataType.FLOAT8E4M3FNUZ: SmallFloat(8, 3, 8, 0x7F, 0x80, None, False),
    DataType.FLOAT8E5M2: SmallFloat(8, 2, 15, 0x7B, 0x7E, 0x7C, True),
    DataType.FLOAT8E5M2FNUZ: SmallFloat(8, 2, 16, 0x7F, 0x80, None, False),
    DataType.FLOAT6E2M3: SmallFloat(6, 3, 1, 0x1F, None, None, True),
    DataType.FLOAT6E3M2: SmallFloat(6, 2, 3, 0x1F, None, None, True),
    DataType.FLOAT4E2M1: SmallFloat(4, 1, 1, 0x7, None, None, True),
    DataType.BFLOAT16: SmallFloat(16, 7, 127, 0x7F7F, 0x7FC0, 0x7F80, True),
}

E8M0_ROUND_MODES = ("up", "down", "nearest")


# ------------------------------------------------------------------------ decode


@functools.lru_cache(maxsize=None)
def _decode_table(data_type: int) -> np.ndarray:
    """float32 value of every bit pattern of a <=8-bit float type (exact)."""
    i = info(data_type)
    codes = np.arange(2 ** i.bits, dtype=np.uint8)
    return codes.view(i.numpy).astype(np.float32)


@functools.lru_cache(maxsize=None)
def _table_on(device, data_type: int, saturate: bool | None):
    """A code table on device (copied there once): the decode table of data_type when
    saturate is None, else its float32_code_table."""
    table = _decode_table(data_type) if saturate is None else float32_code_table(data_type, saturate)
    return to_device(table, device)


def decode(xp, bits, data_type: int):
    """float32 array of the values held as bit patterns in ``bits`` (storage dtype)."""
    dt = DataType(int(data_type))
    if dt == DataType.BFLOAT16:
        return (bits.view(xp.uint16).astype(xp.uint32) << 16).view(xp.float32)
    if dt == DataType.FLOAT16:
        return bits.view(xp.float16).astype(xp.float32)
    i = info(dt)
    if i.kind != "float" or i.bits > 8:
        raise TypeError(f"decode: {dt.name} is not a small float type")
    table = _table_on(device_of(bits), int(dt), None)
    codes = bits.view(xp.uint8)
    if i.bits < 8:
        codes = codes & np.uint8(table.size - 1)
    return table[codes]


def _as_bit_pattern(dtype, data_type) -> bool:
    """Whether an array of dtype holds a float data_type as its bit pattern (its storage
    dtype, where the array library lacks the type: CuPy) rather than as itself."""
    i = info(data_type)
    return i.kind == "float" and np.dtype(dtype) != i.numpy and np.dtype(dtype) == i.storage


def to_float32(xp, array, data_type: int):
    """float32 values of an array holding a float data_type either as itself (NumPy,
    ml_dtypes for the types NumPy lacks) or as its bit pattern (CuPy): its dtype says."""
    if _as_bit_pattern(array.dtype, data_type):
        return decode(xp, array, data_type)
    return array if array.dtype == np.float32 else array.astype(np.float32)


def from_float32(xp, values, data_type: int, dtype):
    """float32 values rounded once into a float data_type, held in dtype: the type itself
    (astype) or its bit pattern (encode, saturating as from_compute does)."""
    if _as_bit_pattern(dtype, data_type):
        return encode(xp, values, data_type, True)
    return values.astype(dtype)


# ------------------------------------------------------------------------ encode


def encode(xp, values, data_type: int, saturate: bool = True, round_mode: str = "up"):
    """Bit patterns (storage dtype) of ``values`` rounded into ``data_type``.

    values: a float16/float32/float64 array (other dtypes are converted to float64
    first).  round_mode only applies to float8e8m0.
    """
    dt = DataType(int(data_type))
    x = values
    if x.dtype not in (np.float32, np.float64):
        x = x.astype(xp.float32 if x.dtype == np.float16 else xp.float64)
    if dt == DataType.FLOAT16:
        return x.astype(xp.float16).view(xp.uint16)
    if dt == DataType.FLOAT8E8M0:
        return encode_e8m0(xp, x, saturate, round_mode)
    fmt = FORMATS.get(dt)
    if fmt is None:
        raise TypeError(f"encode: {dt.name} is not a small float type")
    if dt == DataType.BFLOAT16:
        saturate = False  # IEEE-like: overflow gives inf
    if x.dtype == np.float32:
        return _encode_float32(xp, x, dt, saturate)
    return _encode_binary(xp, x, fmt, saturate, info(dt).storage)


# ------------------------------------------------------------------ float32 encode

@functools.lru_cache(maxsize=None)
def float32_code_table(data_type: int, saturate: bool) -> np.ndarray:
    """Codes of a <=8-bit float format for every float32 by its top 16 bits and whether
    any lower bit is set: entry (u >> 16) * 2 + (u & 0xFFFF != 0).

    These formats keep at most 6 mantissa bits, so rounding happens at bit 17 of the
    float32 or above and the low 16 bits only act as a sticky bit: the representative
    (hi << 16) | 0x8000 of the nonzero-low-bits class rounds like every member (NaN for
    an inf exponent, as the members are).  Built once (on the host) by _encode_binary."""
    i = np.arange(1 << 17, dtype=np.uint32)
    reps = ((i >> 1) << 16 | (i & 1) << 15).view(np.float32)
    dt = DataType(int(data_type))
    return _encode_binary(np, reps, FORMATS[dt], saturate, info(dt).storage)


def _encode_float32(xp, x, dt: DataType, saturate: bool):
    """Encode of float32 values, chunk by chunk (codec.encode_chunk_cpu / _cuda elements
    of host/tuning.py, by the data's device): bfloat16 by integer rounding of the bit
    pattern, the <=8-bit formats by one lookup in float32_code_table.  Equal to
    _encode_binary (the tests check it) with a few integer passes instead of about 25
    array operations."""
    flat = xp.ascontiguousarray(x).reshape(-1)
    u_all = flat.view(xp.uint32)
    n = flat.size
    out = pooled_empty(xp, (n,), info(dt).storage)
    device = device_of(flat)
    step = tuning.value("codec.encode_chunk_cuda" if device.is_cuda else "codec.encode_chunk_cpu")
    t = xp.empty(min(n, step), dtype=xp.uint32)
    if dt == DataType.BFLOAT16:
        quiet = xp.empty_like(t)
        for a in range(0, n, step):
            u = u_all[a:a + step]
            r = t[:u.size]
            # round half to even at bit 16: add 0x7FFF plus the kept lsb, keep the top half
            xp.right_shift(u, 16, out=r)
            r &= 1
            r += 0x7FFF
            r += u
            r >>= 16
            q = quiet[:u.size]  # NaN: quiet, sign kept (a masked copy: no device sync)
            xp.right_shift(u, 16, out=q)
            q &= 0x8000
            q |= 0x7FC0
            xp.copyto(r, q, where=xp.isnan(flat[a:a + step]))
            out[a:a + step] = r
    else:
        table = _table_on(device, int(dt), bool(saturate))
        k = xp.empty(t.size, dtype=np.intp)
        for a in range(0, n, step):
            u = u_all[a:a + step]
            r = t[:u.size]
            # (u >> 15) with bit 0 replaced by "any of bits 15..0 set"
            xp.bitwise_and(u, 0x7FFF, out=r)
            r += 0x7FFF
            r |= u
            r >>= 15
            kk = k[:u.size]
            kk[...] = r
            xp.take(table, kk, out=out[a:a + step])  # indices < 2**17
    return out.reshape(x.shape)


def _encode_binary(xp, x, fmt: SmallFloat, saturate: bool, storage):
    """Round |x| to the nearest code (ties to even) on the source's own bit pattern,
    then apply overflow, NaN and sign rules."""
    if x.dtype == np.float32:
        uint, src_m, src_bias = xp.uint32, 23, 127
    else:
        uint, src_m, src_bias = xp.uint64, 52, 1023
    a = xp.abs(x)
    u = a.view(uint)
    shift = src_m - fmt.mbits
    # Normal results: round the source mantissa to mbits bits (a carry moves into the
    # exponent, which is what rounding up to the next binade means), then re-bias.
    half_minus_one = uint((1 << (shift - 1)) - 1)
    rounded = (u + half_minus_one + ((u >> uint(shift)) & uint(1))) >> uint(shift)
    normal = rounded - uint((src_bias - fmt.bias) << fmt.mbits)
    # Subnormal results (|x| below the smallest normal): the code is the value in units
    # of the smallest subnormal, rounded half to even; exact power-of-two scaling.
    tiny = a < float(2.0 ** fmt.emin)  # False for NaN
    sub = xp.rint(xp.ldexp(xp.where(tiny, a, 0), fmt.mbits - fmt.emin)).astype(uint)
    code = xp.where(tiny, sub, normal)  # garbage for inf/NaN, fixed below
    too_big = ~tiny & (code > uint(fmt.max_code))  # finite overflow and +-inf (and NaN)
    if saturate or fmt.nan is None:
        code = xp.where(too_big, uint(fmt.max_code), code)
    else:
        over = fmt.inf if fmt.inf is not None else fmt.nan
        code = xp.where(too_big, uint(over), code)
    neg = xp.signbit(x)
    nan = xp.isnan(x)
    if fmt.signed_zero:
        if fmt.nan is not None:
            code = xp.where(nan, uint(fmt.nan), code)
        else:  # no NaN: a zero with the inverted sign (see the module doc)
            code = xp.where(nan, uint(0), code)
            neg = neg ^ nan
        code = code | xp.where(neg, uint(fmt.sign_bit), uint(0))
    else:
        code = code | xp.where(neg & (code != 0), uint(fmt.sign_bit), uint(0))
        code = xp.where(nan, uint(fmt.nan), code)
    return code.astype(storage)


def encode_e8m0(xp, x, saturate: bool = True, round_mode: str = "up"):
    """float8e8m0 codes of x: value 2^(code-127) for codes 0..254, 255 is NaN.

    The sign is ignored (negative input is unspecified by ONNX; we encode |x|).  For
    finite nonzero |x| = 2^k * (1 + f), 0 <= f < 1: 'up' gives k+1 when f > 0 (the power of
    two at or above |x|), 'down' gives k, 'nearest' gives k+1 when f >= 1/2 (ties up).
    Out of range (the rounded exponent above 127 or below -127, inf, and 0): saturate
    gives the largest / smallest code (254 / 0), otherwise NaN.  NaN gives NaN.
    """
    if round_mode not in E8M0_ROUND_MODES:
        raise ValueError(f"round_mode must be one of {E8M0_ROUND_MODES}, got {round_mode!r}")
    a = xp.abs(x)
    finite = xp.isfinite(a)
    safe = xp.where(finite & (a > 0), a, 1.0).astype(a.dtype)
    mant, exp = xp.frexp(safe)  # safe = mant * 2^exp, 0.5 <= mant < 1
    k = exp.astype(xp.int32) - 1
    frac = mant * 2 - 1
    if round_mode == "up":
        k = k + (frac > 0)
    elif round_mode == "nearest":
        k = k + (frac >= 0.5)
    code = k + 127
    low = (code < 0) | (a == 0)
    high = (code > 254) | (finite == False)  # noqa: E712  (inf; NaN handled below)
    if saturate:
        code = xp.where(low, 0, xp.where(high, 254, code))
    else:
        code = xp.where(low | high, 255, code)
    code = xp.where(xp.isnan(a), 255, code)
    return code.astype(xp.uint8)


def e8m0_reference_value(code: int) -> float:
    """float value of an e8m0 code (NaN for 255); for tests and docs."""
    return float("nan") if code == 255 else 2.0 ** (code - 127)
