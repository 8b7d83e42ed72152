"""Add, Sub, Mul, Div, Neg, Abs.

Integers wrap around on overflow (two's complement), as NumPy and CuPy do.  Integer Div
truncates toward zero (C semantics, as onnxruntime) and raises a KernelInputError on a
zero divisor rather than returning an arbitrary value.
"""

from __future__ import annotations

from ...tensor import Tensor
from ..base import _NATIVE_COMPUTE, register
from ._elementwise import BinaryKernel, UnaryKernel


def native_compute(inputs) -> bool:
    """True when every input is a tensor computed in its own element type (no up-cast
    and final rounding), so an array function can return the compute result as is."""
    return all(t.__class__ is Tensor and t.data_type in _NATIVE_COMPUTE for t in inputs)


def _plain_binary(kernel: BinaryKernel, inputs) -> bool:
    """A binary call the array function may replace: NumPy broadcasting (opset 7+) and
    natively computed types."""
    return (kernel.since_version >= 7 or bool(kernel.domain)) and native_compute(inputs)


@register()
class Add(BinaryKernel):
    def compute(self, xp, a, b):
        return xp.add(a, b)

    def array_function(self, inputs, attrs):
        return self.xp.add if _plain_binary(self, inputs) else None


@register()
class Sub(BinaryKernel):
    def compute(self, xp, a, b):
        return xp.subtract(a, b)

    def array_function(self, inputs, attrs):
        return self.xp.subtract if _plain_binary(self, inputs) else None


@register()
class Mul(BinaryKernel):
    def compute(self, xp, a, b):
        if a.dtype == xp.bool_:
            return xp.logical_and(a, b)
        return xp.multiply(a, b)

    def array_function(self, inputs, attrs):
        if not _plain_binary(self, inputs):
            return None
        return self.xp.logical_and if inputs[0].array.dtype == self.xp.bool_ else self.xp.multiply


@register()
class Div(BinaryKernel):
    def compute(self, xp, a, b):
        if a.dtype.kind in "iu":
            if b.size and bool((b == 0).any()):
                raise self.error("integer division by zero", A=a, B=b)
            q = xp.floor_divide(a, b)
            if a.dtype.kind == "i":
                # floor -> trunc: add one where the exact quotient is negative and inexact
                fix = (xp.remainder(a, b) != 0) & ((a < 0) != (b < 0))
                q = q + fix.astype(q.dtype)
            return q
        return xp.divide(a, b)

    def array_function(self, inputs, attrs):
        if not _plain_binary(self, inputs):
            return None
        if inputs[0].array.dtype.kind in "iu":
            xp, compute = self.xp, self.compute  # zero-divisor check and truncation

            return lambda a, b: compute(xp, a, b)
        return self.xp.divide


@register()
class Neg(UnaryKernel):
    def compute(self, xp, x):
        return xp.negative(x)

    def array_function(self, inputs, attrs):
        return self.xp.negative if native_compute(inputs) else None


@register()
class Abs(UnaryKernel):
    def compute(self, xp, x):
        return xp.abs(x)

    def array_function(self, inputs, attrs):
        return self.xp.abs if native_compute(inputs) else None
