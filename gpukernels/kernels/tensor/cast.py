"""Cast, CastLike and BitCast.

Conversion rules (where the ONNX spec leaves a choice, the choice is ours and is the same
on CPU and GPU):

* float -> float: round to nearest even, once, directly from the source type.  float8
  targets follow the spec's saturate tables; float4/float6 always saturate (they have no
  inf/NaN); bfloat16/float16 overflow to +-inf; float8e8m0 follows ``round_mode`` and
  ``saturate`` (see gpukernels.codec).
* float -> integer (the spec says "undefined if out of range"): NaN and +-inf give 0;
  other values are truncated toward zero and then wrapped modulo 2^bits into the target
  (two's complement for signed types), the same "discard the higher bits" rule the spec
  gives for integer -> integer.  E.g. 300.7 -> int8 44, -1.5 -> uint8 255, -9 -> int4 7.
  The wrap is computed exactly with float64 fmod, never by an undefined C cast.
* integer -> integer: wrap (discard higher bits), sub-byte types included.
* bool targets: nonzero (and NaN) is True.
* -> STRING: NumPy's shortest round-trip text of the value ('0.1', '1e-07', 'nan',
  'inf', '-inf'; integers in decimal; bools 'True'/'False'); small float types print
  their exact float32 value.
* STRING ->: decimal or scientific text, 'inf'/'+INF'/'-INF'/'NaN' in any case, leading and
  trailing blanks ignored.  Integer targets parse integers exactly; text with a fraction
  ('100.5') is parsed as a float and converted by the float -> integer rule.  Text that is
  not a number raises a KernelInputError naming it.

The types NumPy/CuPy lack are encoded with gpukernels.codec on both devices (checked
against ml_dtypes in the tests; on the host float32/float16 sources take its chunked
lookup-table path, several times faster than ml_dtypes' astype; float64 sources round
once, where ml_dtypes would round twice through float32).
"""

from __future__ import annotations

import numpy as np

from ... import codec, dtypes
from ...dtypes import DataType
from ...tensor import Tensor
from ...xp import to_device
from ..base import KernelBase, register
from ._common import deliver, schema_type_param

_NATIVE_FLOATS = (DataType.FLOAT16, DataType.FLOAT, DataType.DOUBLE)


def _values(xp, t: Tensor, on_gpu: bool):
    """t's values in a dtype xp computes with: float32 for small floats, int8/uint8 for
    sub-byte integers, the element type otherwise."""
    to_values = _values_function(xp, t.data_type, on_gpu)[0]
    return t.array if to_values is None else to_values(t.array)


def _values_function(xp, src: DataType, on_gpu: bool):
    """(f, dtype): _values as f(array) for arrays of element type src (None where it is
    the array itself) and the dtype of its result."""
    i = dtypes.info(src)
    if not i.is_exotic:
        return None, np.dtype(i.numpy)
    if i.kind == "float":
        f = (lambda arr: codec.decode(xp, arr, src)) if on_gpu else (lambda arr: arr.astype(np.float32))
        return f, np.dtype(np.float32)
    storage = i.storage
    return (lambda arr: arr.astype(storage)), np.dtype(storage)


def float_to_int(xp, x, target: np.dtype, bits: int | None = None):
    """Float array -> integer array of dtype target by the documented rule: NaN/inf -> 0,
    truncate toward zero, wrap modulo 2^bits.  bits defaults to target's width (given
    for the sub-byte types held in int8/uint8)."""
    target = np.dtype(target)
    bits = bits or target.itemsize * 8
    signed = target.kind == "i"
    lo = -(2 ** (bits - 1)) if signed else 0
    hi = 2 ** (bits - 1) - 1 if signed else 2 ** bits - 1
    if x.dtype == np.float16:
        x = x.astype(xp.float32)  # exact; the range limits below do not fit in float16
    if x.size and bool(xp.all((x > float(lo) - 1.0) & (x < float(hi) + 1.0))):
        return xp.trunc(x).astype(target)  # every value in range: a defined conversion
    xd = x.astype(xp.float64)
    t = xp.trunc(xd)
    t = xp.where(xp.isfinite(t), t, 0.0)
    two64, two63 = float(2 ** 64), float(2 ** 63)
    m = xp.fmod(t, two64)  # exact; |m| < 2^64
    m = xp.where(m >= two63, m - two64, xp.where(m < -two63, m + two64, m))  # exact
    v = m.astype(xp.int64)  # m in [-2^63, 2^63): defined
    return wrap_int(xp, v, target, bits)


def wrap_int(xp, v, target: np.dtype, bits: int | None = None):
    """Integer array -> target integer dtype keeping the low ``bits`` bits (two's complement
    for signed targets).  Integer astype already wraps for full-width types."""
    target = np.dtype(target)
    bits = bits or target.itemsize * 8
    if bits == target.itemsize * 8:
        return v.astype(target)
    w = v.astype(xp.int64) & ((1 << bits) - 1)
    if target.kind == "i":
        half = 1 << (bits - 1)
        w = ((w + half) & ((1 << bits) - 1)) - half
    return w.astype(target)


def _parse_strings(kernel, arr, to: DataType) -> np.ndarray:
    """Host object array of strings -> float64 (or int64/uint64 for integer targets)."""
    flat = arr.reshape(-1)
    texts = np.array([v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in flat],
                     dtype=str).reshape(arr.shape)
    texts = np.char.strip(texts)
    info = dtypes.info(to)
    if info.is_integer or to == DataType.BOOL:
        wide = np.uint64 if to == DataType.UINT64 else np.int64
        try:
            return texts.astype(wide)
        except (ValueError, OverflowError):
            pass
    try:
        return texts.astype(np.float64)
    except ValueError:
        bad = [s for s in texts.reshape(-1)[:1000] if not _is_number(s)]
        raise kernel.error(f"cannot parse {bad[:3]!r} as numbers") from None


def _is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def _to_strings(t: Tensor) -> np.ndarray:
    host = t.numpy()
    info = dtypes.info(t.data_type)
    if info.is_exotic:
        host = host.astype(np.float32) if info.kind == "float" else host.astype(np.int64)
    return host.astype(str).astype(object)


def cast_tensor(kernel: KernelBase, t: Tensor, to: DataType, saturate: bool = True,
                round_mode: str = "up") -> Tensor:
    """t converted to element type ``to`` by the rules in this module's doc."""
    to = DataType(int(to))
    src = t.data_type
    on_gpu = kernel.on_gpu
    xp = kernel.xp
    if to == DataType.STRING:
        return Tensor.wrap(_to_strings(t), DataType.STRING)
    if src == DataType.STRING:
        parsed = _parse_strings(kernel, np.asarray(t.array, dtype=object), to)
        if on_gpu:
            parsed = to_device(parsed, kernel.device)
        return _convert(kernel, xp, parsed, DataType.DOUBLE if parsed.dtype.kind == "f" else
                        dtypes.from_numpy(parsed.dtype).data_type, to, saturate, round_mode, on_gpu)
    if src == to:
        return Tensor.wrap(t.array.copy(), to)
    return _convert(kernel, xp, _values(xp, t, on_gpu), src, to, saturate, round_mode, on_gpu)


def _convert(kernel, xp, v, src: DataType, to: DataType, saturate, round_mode, on_gpu) -> Tensor:
    return Tensor.wrap(_converter(kernel, xp, v.dtype, src, to, saturate, round_mode, on_gpu)(v), to)


def _converter(kernel, xp, vtype: np.dtype, src: DataType, to: DataType, saturate, round_mode, on_gpu):
    """f(v) -> the storage array of ``to`` for values v of dtype vtype (src's values as
    _values gives them): every choice made from the types, once."""
    out = dtypes.info(to)
    if to == DataType.BOOL:
        return lambda v: v != 0
    if vtype == np.bool_:
        widened = np.uint8 if out.is_integer else np.float32
        convert = _converter(kernel, xp, np.dtype(widened), src, to, saturate, round_mode, on_gpu)
        return lambda v: convert(v.astype(widened))
    src_float = vtype.kind == "f"
    if out.kind == "float":
        if to in _NATIVE_FLOATS:
            return _native_float_cast(vtype, out.numpy)
        encode, saturate = codec.encode, bool(saturate)
        view = None if on_gpu else out.numpy

        def encoded(v):
            if not src_float:
                v = v.astype(xp.float64)  # integers: round once from their exact double
            bits = encode(xp, v, to, saturate, round_mode)
            return bits if view is None else bits.view(view)

        return encoded
    if out.is_integer:
        narrow, storage, nbits = (float_to_int if src_float else wrap_int), out.storage, out.bits
        if on_gpu or not out.is_exotic:
            return lambda v: narrow(xp, v, storage, nbits)
        view = out.numpy
        return lambda v: narrow(xp, v, storage, nbits).view(view)
    if out.kind == "complex":
        target = out.numpy
        return lambda v: v.astype(target)
    raise kernel.type_error(f"cannot cast {dtypes.describe(src)} to {dtypes.describe(to)}")


def _native_float_cast(vtype: np.dtype, target: np.dtype):
    """v -> v.astype(target), overflow to +-inf allowed (NumPy's float-error state is not
    entered where no value of vtype can overflow target)."""
    target = np.dtype(target)
    if target.itemsize == 8 or np.can_cast(vtype, target, "safe") or (
            target == np.float32 and vtype.kind in "iu"):
        return lambda v: v.astype(target)

    def cast(v):
        with np.errstate(over="ignore"):
            return v.astype(target)

    return cast


def _target_type(kernel, to) -> DataType:
    if to is None:
        raise kernel.error("attribute 'to' is required")
    try:
        dt = dtypes.info(to).data_type  # int enum, or a name ('FLOAT') in opset 1
    except TypeError:
        raise kernel.error(f"attribute 'to'={to!r} is not an ONNX data type") from None
    allowed = schema_type_param(kernel.op_type, kernel.since_version, "T2")
    if allowed and dt not in allowed:
        raise kernel.type_error(f"opset-{kernel.since_version} {kernel.op_type} cannot cast to "
                                f"{dtypes.describe(dt)}")
    return dt


def _check_round_mode(kernel, round_mode):
    if round_mode not in codec.E8M0_ROUND_MODES:
        raise kernel.error(f"round_mode must be one of {list(codec.E8M0_ROUND_MODES)}, got {round_mode!r}")


@register()
class Cast(KernelBase):
    """Cast(input, to=, saturate=1, round_mode='up'); ``out=`` writes into a caller's
    buffer.  See the module doc for the rules where the spec leaves a choice."""

    def __call__(self, input, to=None, saturate=1, round_mode="up", out=None):
        x = self.tensor(input, "input")
        self.check_inputs(x)
        dt = _target_type(self, to)
        _check_round_mode(self, round_mode)
        return deliver(self, cast_tensor(self, x, dt, bool(saturate), round_mode), out)

    def array_function(self, inputs, attrs):
        """Non-string source and target: cast_tensor's conversion, chosen once."""
        if len(inputs) != 1 or inputs[0].__class__ is not Tensor:
            return None
        dt = _target_type(self, attrs.get("to"))
        return _cast_function(self, inputs[0], dt, attrs)


@register()
class CastLike(KernelBase):
    """CastLike(input, target_type, saturate=1, round_mode='up'): Cast to target_type's
    element type (its values are not read)."""

    def __call__(self, input, target_type, saturate=1, round_mode="up", out=None):
        x = self.tensor(input, "input")
        like = target_type if isinstance(target_type, Tensor) else self.tensor(target_type, "target_type")
        self.check_inputs(x, like)
        _check_round_mode(self, round_mode)
        return deliver(self, cast_tensor(self, x, like.data_type, bool(saturate), round_mode), out)

    def array_function(self, inputs, attrs):
        """As Cast's; the target type's array is passed and not read."""
        if len(inputs) != 2 or any(t.__class__ is not Tensor for t in inputs):
            return None
        fn = _cast_function(self, inputs[0], inputs[1].data_type, attrs)
        return None if fn is None else (lambda x, target_type: fn(x))


def _cast_function(kernel, t: Tensor, to: DataType, attrs: dict):
    """Compiled graphs: array -> cast_tensor(...)'s array for tensors of t's element type
    (t: the recorded input), the attributes resolved and the conversion chosen once;
    None for STRING on either side (host object arrays)."""
    src, to = t.data_type, DataType(int(to))
    if DataType.STRING in (src, to):
        return None
    saturate, round_mode = bool(attrs.get("saturate", 1)), attrs.get("round_mode", "up")
    _check_round_mode(kernel, round_mode)
    if src == to:
        return lambda x: x.copy()
    xp, on_gpu = kernel.xp, kernel.on_gpu
    to_values, vtype = _values_function(xp, src, on_gpu)
    convert = _converter(kernel, xp, vtype, src, to, saturate, round_mode, on_gpu)
    return convert if to_values is None else (lambda x: convert(to_values(x)))


@register()
class BitCast(KernelBase):
    """Reinterpret the bits (little-endian) as another type of the same width.

    Sub-byte types reinterpret their 4 or 2 bits.  A byte reinterpreted as BOOL is True
    when nonzero (BOOL has no other values).  Different widths raise."""

    def __call__(self, input, to=None):
        x = self.tensor(input, "input")
        self.check_inputs(x)
        dt = _target_type(self, to)
        src, dst = dtypes.info(x.data_type), dtypes.info(dt)
        if src.bits != dst.bits:
            raise self.error(f"cannot reinterpret {src.bits}-bit {dtypes.describe(src.data_type)} as "
                             f"{dst.bits}-bit {dtypes.describe(dt)}: widths differ", input=x)
        xp = self.xp
        arr = x.array
        if src.is_exotic:
            arr = arr.view(src.storage)
        if src.bits < 8:
            # unsigned bit pattern in a byte, then into the target's storage
            mask = (1 << src.bits) - 1
            pattern = arr.view(np.uint8) & np.uint8(mask) if arr.dtype.itemsize == 1 else arr
            if dst.kind == "int":
                half = 1 << (dst.bits - 1)
                val = ((pattern.astype(xp.int16) + half) & mask) - half
                res = val.astype(np.int8)
            else:
                res = pattern.astype(np.uint8)
        elif dt == DataType.BOOL:
            res = arr.view(np.uint8) != 0
        else:
            if not arr.flags.c_contiguous:
                arr = xp.ascontiguousarray(arr)
            res = arr.view(dst.storage).copy()
        if not self.on_gpu and dst.is_exotic:
            res = res.view(dst.numpy)
        return Tensor.wrap(res, dt)
