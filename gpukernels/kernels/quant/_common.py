"""Helpers shared by the quantization kernels: parameter granularity (per tensor, per
axis, blocked), output-type resolution, rounding into integer or small-float targets.

The quantization kernels have one code path, written with ``xp``, for both devices, and
the same IEEE operations in the same precision on each (x / scale as one division, never a
multiplication by the reciprocal; round half to even; the zero point added; saturation
that maps NaN to the range's low end), so CPU and GPU results are bit-identical for identical
inputs (tests/test_quantized_parity.py).  Keep it so: no host-only variant here."""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
import onnx

from ... import dtypes
from ...dtypes import DataType

D = DataType

INTEGER_RANGES = {
    D.UINT8: (0, 255),
    D.INT8: (-128, 127),
    D.UINT16: (0, 65535),
    D.INT16: (-32768, 32767),
    D.UINT4: (0, 15),
    D.INT4: (-8, 7),
    D.UINT2: (0, 3),
    D.INT2: (-2, 1),
    D.INT32: (-2 ** 31, 2 ** 31 - 1),
}

# float targets that have an infinity or NaN encoding, for which 'saturate' matters
FLOAT8_TYPES = (D.FLOAT8E4M3FN, D.FLOAT8E4M3FNUZ, D.FLOAT8E5M2, D.FLOAT8E5M2FNUZ)
# small floats without inf/NaN: always saturate
SATURATING_FLOATS = (D.FLOAT4E2M1, D.FLOAT6E2M3, D.FLOAT6E3M2)


@functools.lru_cache(maxsize=None)
def float_max(data_type) -> float:
    return float(ml_dtypes.finfo(dtypes.info(data_type).numpy).max)


@functools.lru_cache(maxsize=None)
def output_types(op_type: str, version: int, index: int = 0, domain: str = "") -> frozenset:
    """Element types the schema allows for output ``index``."""
    schema = onnx.defs.get_schema(op_type, version, domain)
    ts = schema.outputs[index].type_str
    allowed = ts
    for c in schema.type_constraints:
        if c.type_param_str == ts:
            allowed = c.allowed_type_strs
            break
    if isinstance(allowed, str):
        allowed = [allowed]
    out = set()
    for s in allowed:
        try:
            out.add(dtypes.info(s).data_type)
        except TypeError:
            pass
    return frozenset(out)


def check_output_type(kernel, data_type, what: str = "output") -> DataType:
    allowed = output_types(kernel.op_type, kernel.since_version, 0, kernel.domain)
    try:
        dt = DataType(int(data_type))
    except ValueError:
        raise kernel.error(f"{what} data type {data_type} is not an ONNX data type") from None
    if dt not in allowed:
        names = ", ".join(sorted(dtypes.describe(a) for a in allowed))
        raise kernel.type_error(f"{what} element type {dtypes.describe(dt)} is not allowed by "
                                f"opset-{kernel.since_version} {kernel.op_type} (allowed: {names})")
    return dt


def is_per_tensor(shape) -> bool:
    return len(shape) == 0 or (len(shape) == 1 and shape[0] == 1)


def granularity(kernel, x_shape, scale_shape, zp_shape, axis: int, block_size: int, **named):
    """Validate the scale/zero-point shapes against x.  Returns ('tensor', None),
    ('axis', axis) or ('block', axis)."""
    rank = len(x_shape)
    if block_size < 0:
        raise kernel.error(f"block_size must be >= 0, got {block_size}", **named)
    if zp_shape is not None and tuple(zp_shape) != tuple(scale_shape) and not (
            is_per_tensor(zp_shape) and is_per_tensor(scale_shape)):
        raise kernel.error(f"the zero point's shape {list(zp_shape)} differs from the scale's shape "
                           f"{list(scale_shape)}", **named)
    if block_size == 0:
        if is_per_tensor(scale_shape):
            return "tensor", None
        if len(scale_shape) != 1:
            raise kernel.error(f"the scale must be a scalar or 1-D (per axis) "
                               f"{'unless block_size is set' if kernel.since_version >= 21 else ''}; "
                               f"got shape {list(scale_shape)}", **named)
        if kernel.since_version < 13:
            raise kernel.error("opset-10 quantization supports only a scalar (per-tensor) scale", **named)
        ax = _axis(kernel, axis, rank, **named)
        if scale_shape[0] != x_shape[ax]:
            raise kernel.error(f"per-axis scale has {scale_shape[0]} elements but axis {axis} of the "
                               f"input has size {x_shape[ax]}", **named)
        return "axis", ax
    if kernel.since_version < 21:
        raise kernel.error("block_size needs opset 21 or newer", **named)
    if len(scale_shape) != rank:
        raise kernel.error(f"blocked quantization needs a scale of the input's rank {rank}, got shape "
                           f"{list(scale_shape)}", **named)
    ax = _axis(kernel, axis, rank, **named)
    for i in range(rank):
        if i != ax and scale_shape[i] != x_shape[i]:
            raise kernel.error(f"blocked scale shape {list(scale_shape)} must equal the input shape "
                               f"{list(x_shape)} except along axis {ax}", **named)
    want = -(-x_shape[ax] // block_size)
    if scale_shape[ax] != want:
        raise kernel.error(f"blocked scale has {scale_shape[ax]} blocks along axis {ax}, but "
                           f"ceil({x_shape[ax]} / block_size {block_size}) = {want}", **named)
    return "block", ax


def _axis(kernel, axis, rank, **named) -> int:
    if rank == 0 or not -rank <= axis < rank:
        raise kernel.error(f"axis {axis} is out of range for an input of rank {rank}", **named)
    return axis % rank


def expand(xp, p, x_shape, kind, ax, block_size):
    """p reshaped/repeated so that it broadcasts against x_shape."""
    if kind == "tensor":
        return p.reshape(())
    if kind == "axis":
        shape = [1] * len(x_shape)
        shape[ax] = x_shape[ax]
        return p.reshape(shape)
    idx = xp.arange(x_shape[ax]) // block_size
    return xp.take(p, idx, axis=ax)


def quantize_values(kernel, q, out_type: DataType, zp=None, saturate: bool = True):
    """Round q (a float array, already x / scale; q may be modified in place) into
    out_type, adding the zero point zp (float array or None)."""
    xp = kernel.xp
    if not isinstance(q, xp.ndarray):  # NumPy gives scalars for 0-d arithmetic
        q = xp.array(q)
    if out_type in INTEGER_RANGES:
        lo, hi = INTEGER_RANGES[out_type]
        xp.rint(q, out=q)
        if zp is not None:
            q += zp
        saturate_nan_low(xp, q, lo, hi)
        info = dtypes.info(out_type)
        if info.is_exotic:  # int4/uint4/int2/uint2: via the 8-bit storage type
            return kernel.from_compute(q.astype(info.storage), out_type)
        return kernel.result(q.astype(info.numpy), out_type)
    if zp is not None:
        q += zp
    if out_type in SATURATING_FLOATS or (saturate and out_type in FLOAT8_TYPES):
        m = float_max(out_type)
        xp.clip(q, -m, m, out=q)
    return kernel.from_compute(q, out_type, saturate=bool(saturate))


def saturate_nan_low(xp, q, lo, hi):
    """q (float, in place) clipped to [lo, hi] with NaN mapped to lo: the values of
    fmin(fmax(q, lo), hi) (the spec leaves NaN undefined), up to the sign of a zero, which
    no integer conversion sees.  clip and a masked copy instead of fmax/fmin: NumPy 2.4
    runs fmax/fmin with a scalar element by element (1x96x112x112 float32 on this host:
    1.72 ms for the pair, 0.38 ms this way)."""
    xp.clip(q, lo, hi, out=q)
    xp.copyto(q, q.dtype.type(lo), where=xp.isnan(q))


def round_through(kernel, array, data_type):
    """array (float32) rounded to data_type and back (emulates arithmetic in that type).
    Values beyond the type's range become +-inf, as the arithmetic would give (no warning)."""
    with np.errstate(over="ignore"):
        t = kernel.from_compute(array, data_type)
    return kernel.to_compute(t, np.float32)
