"""QuantizeLinear, DequantizeLinear and DynamicQuantizeLinear.

Granularity follows the scale's shape: a scalar (or a one-element 1-D tensor) is per
tensor, a 1-D tensor is per axis (opset 13+), and a tensor of the input's rank with
``block_size`` > 0 is blocked (opset 21+).  The zero point must have the scale's shape.

QuantizeLinear computes ``x / scale`` in float32 (float64 when x, the scale or
``precision`` is int32), rounds the quotient to float16/bfloat16 first when that is the
division precision (``precision``, else the scale's type), then rounds half to even,
adds the zero point and saturates to the target range.  NaN saturates to the lowest
integer of the range (the spec leaves it undefined).  Float8 targets honour
``saturate``; float4/float6 targets always saturate (they cannot encode inf/NaN).

DequantizeLinear computes ``(x - zero_point) * scale`` in float32 (float64 for int32 x)
and rounds once into the output type.  A float8e8m0 scale without ``output_dtype`` gives
float32 output (the spec's default, "the scale's type", is not an allowed output type).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ... import dtypes
from ...dtypes import DataType
from ...tensor import Tensor
from ..base import KernelBase, register
from ._common import check_output_type, expand, granularity, quantize_values, round_through

D = DataType
_HALF = (D.FLOAT16, D.BFLOAT16)


def _attr(attrs: dict, name: str, default):
    value = attrs.get(name)
    return default if value is None else value


class _Plan(NamedTuple):
    """What validation decided for one call of QuantizeLinear/DequantizeLinear."""
    kind: str            # granularity: 'tensor', 'axis' or 'block'
    axis: int | None
    block_size: int
    work: type           # the compute type (float32, or float64)
    precision: int       # QuantizeLinear: the division precision's data type
    out_type: DataType
    saturate: bool


@register()
class QuantizeLinear(KernelBase):
    def __call__(self, x, y_scale, y_zero_point=None, axis=1, saturate=1, block_size=0,
                 output_dtype=0, precision=0):
        xt = self.tensor(x, "x")
        st = self.tensor(y_scale, "y_scale")
        # the zero point stays where it is: a constant one is on the host (small integers
        # are), where checking it for zeros costs no device-to-host copy
        zt = self.host_tensor(y_zero_point, "y_zero_point", optional=True)
        plan = self._plan(xt, st, zt, axis, saturate, block_size, output_dtype, precision)
        return self._quantize(plan, xt, st, zt)

    def _plan(self, xt, st, zt, axis, saturate, block_size, output_dtype, precision) -> _Plan:
        self.check_inputs(xt, st, zt)
        named = dict(x=xt, y_scale=st, y_zero_point=zt)
        if zt.is_absent:
            out_type = check_output_type(self, output_dtype or D.UINT8, "output_dtype")
        else:
            out_type = zt.data_type
            if output_dtype and int(output_dtype) != int(out_type):
                raise self.type_error(
                    f"output_dtype {dtypes.describe(int(output_dtype)) if int(output_dtype) in dtypes.ALL_TYPES else output_dtype} "
                    f"differs from the zero point's type {dtypes.describe(out_type)}", **named)
        kind, ax = granularity(self, xt.shape, st.shape, None if zt.is_absent else zt.shape,
                               axis, block_size, **named)
        if precision:
            try:
                prec = dtypes.info(int(precision)).data_type
            except TypeError:
                raise self.error(f"precision {precision} is not an ONNX data type", **named) from None
            if prec not in (D.FLOAT, D.FLOAT16, D.BFLOAT16, D.DOUBLE, D.INT32):
                raise self.error(f"precision must be float, float16, bfloat16, double or int32, got "
                                 f"{dtypes.describe(prec)}", **named)
        else:
            prec = st.data_type
        wide = D.INT32 in (xt.data_type, st.data_type, prec) or prec == D.DOUBLE
        return _Plan(kind, ax, block_size, np.float64 if wide else np.float32, prec, out_type, bool(saturate))

    def _quantize(self, plan: _Plan, xt, st, zt) -> Tensor:
        """The checked call's step: x / scale in the division precision, rounded half to
        even, the zero point added, saturated into the output type."""
        xp = self.xp
        work = plan.work
        xs = self.to_compute(xt, work)
        ss = expand(xp, self.to_compute(st, work), xt.shape, plan.kind, plan.axis, plan.block_size)
        q = xp.divide(xs, ss, dtype=work) if xs.size else xs.astype(work, copy=True)
        if plan.precision in _HALF:
            q = round_through(self, q.astype(np.float32, copy=False), plan.precision)
        zp = None
        if not zt.is_absent and bool((zt.array != 0).any()):
            zt = self.tensor(zt, "y_zero_point")
            zp = expand(xp, self.to_compute(zt, q.dtype), xt.shape, plan.kind, plan.axis, plan.block_size)
        return quantize_values(self, q, plan.out_type, zp, plan.saturate)

    def array_function(self, inputs, attrs):
        """Compiled graphs: _quantize on the arrays, validated once for these types and
        shapes (QDQ models run one QuantizeLinear per activation)."""
        if not 2 <= len(inputs) <= 3 or any(t.__class__ is not Tensor for t in inputs):
            return None
        xt, st = inputs[0], inputs[1]
        zt = inputs[2] if len(inputs) == 3 else Tensor()
        plan = self._plan(xt, st, zt, _attr(attrs, "axis", 1), _attr(attrs, "saturate", 1),
                          _attr(attrs, "block_size", 0), _attr(attrs, "output_dtype", 0), _attr(attrs, "precision", 0))
        types = [t.data_type for t in inputs]

        def run(*arrays):
            tensors = [Tensor.wrap(a, dt) for a, dt in zip(arrays, types)]
            return self._quantize(plan, tensors[0], tensors[1], tensors[2] if len(tensors) == 3 else Tensor()).array

        return run


@register()
class DequantizeLinear(KernelBase):
    def __call__(self, x, x_scale, x_zero_point=None, axis=1, block_size=0, output_dtype=0):
        xt = self.tensor(x, "x")
        st = self.tensor(x_scale, "x_scale")
        zt = self.tensor(x_zero_point, "x_zero_point", optional=True)
        return self._dequantize(self._plan(xt, st, zt, axis, block_size, output_dtype), xt, st, zt)

    def _plan(self, xt, st, zt, axis, block_size, output_dtype) -> _Plan:
        self.check_inputs(xt, st, zt)
        named = dict(x=xt, x_scale=st, x_zero_point=zt)
        if not zt.is_absent and zt.data_type != xt.data_type:
            raise self.type_error("x_zero_point must have x's element type", **named)
        if output_dtype:
            out_type = check_output_type(self, output_dtype, "output_dtype")
        elif st.data_type == D.FLOAT8E8M0:
            out_type = D.FLOAT
        else:
            out_type = st.data_type
        kind, ax = granularity(self, xt.shape, st.shape, None if zt.is_absent else zt.shape,
                               axis, block_size, **named)
        work = np.float64 if xt.data_type == D.INT32 else np.float32
        return _Plan(kind, ax, block_size, work, 0, out_type, True)

    def _dequantize(self, plan: _Plan, xt, st, zt) -> Tensor:
        """The checked call's step: (x - zero point) * scale in the compute type, rounded
        once into the output type."""
        xp = self.xp
        work = plan.work
        y = self.to_compute(xt, work)
        if y is xt.array:
            y = y.copy()  # never modify an input in place
        if not zt.is_absent:
            y -= expand(xp, self.to_compute(zt, work), xt.shape, plan.kind, plan.axis, plan.block_size)
        y *= expand(xp, self.to_compute(st, work), xt.shape, plan.kind, plan.axis, plan.block_size)
        if plan.out_type != D.DOUBLE and work == np.float64:
            y = y.astype(np.float32)
        return self.from_compute(y, plan.out_type)

    def array_function(self, inputs, attrs):
        """Compiled graphs: _dequantize on the arrays, validated once for these types and
        shapes."""
        if not 2 <= len(inputs) <= 3 or any(t.__class__ is not Tensor for t in inputs):
            return None
        xt, st = inputs[0], inputs[1]
        zt = inputs[2] if len(inputs) == 3 else Tensor()
        plan = self._plan(xt, st, zt, _attr(attrs, "axis", 1), _attr(attrs, "block_size", 0),
                          _attr(attrs, "output_dtype", 0))
        types = [t.data_type for t in inputs]

        def run(*arrays):
            tensors = [Tensor.wrap(a, dt) for a, dt in zip(arrays, types)]
            return self._dequantize(plan, tensors[0], tensors[1], tensors[2] if len(tensors) == 3 else Tensor()).array

        return run


@register()
class DynamicQuantizeLinear(KernelBase):
    """uint8 quantization with scale and zero point from the data range (which is widened
    to include 0), each step of the spec's formulas in float32.  An all-zero or empty input
    gives scale 0, zero point 0 and y = 0 (onnxruntime returns scale 1 there); data with NaN
    or inf gives a NaN or inf scale, zero point 0 and y = 0."""

    class Result(NamedTuple):
        y: Tensor
        y_scale: Tensor
        y_zero_point: Tensor

    def __call__(self, x):
        xt = self.tensor(x, "x")
        self.check_inputs(xt)
        xp = self.xp
        xs = self.to_compute(xt, np.float32)
        if xs.size:
            lo = xp.minimum(xp.min(xs), np.float32(0))
            hi = xp.maximum(xp.max(xs), np.float32(0))
        else:
            lo = hi = xp.zeros((), np.float32)
        scale = ((hi - lo) / np.float32(255)).astype(np.float32)
        zero = scale == 0
        safe = xp.where(zero, np.float32(1), scale)
        zp = xp.rint(np.float32(0) - lo / safe)
        # saturate with fmax/fmin: a NaN zero point (data with NaN or inf) becomes 0 on every
        # device instead of depending on how a NaN float -> uint8 cast behaves there
        zp = xp.fmin(xp.fmax(zp, np.float32(0)), np.float32(255))
        zp = xp.where(zero, np.float32(0), zp).astype(np.float32)
        q = xp.divide(xs, safe, dtype=np.float32)
        if not xs.size:
            q = q.copy()
        y = quantize_values(self, q, D.UINT8, zp, True)
        return self.Result(y, self.result(scale.reshape(()).astype(np.float32), D.FLOAT),
                           self.result(zp.reshape(()).astype(np.uint8), D.UINT8))


__all__ = ["QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"]
