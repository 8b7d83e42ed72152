"""Add, Sub, Mul, Div, Neg, Abs.

Integers wrap around on overflow (two's complement), as NumPy and CuPy do.  Integer Div
truncates toward zero (C semantics, as onnxruntime) and raises a KernelInputError on a
zero divisor rather than returning an arbitrary value.
"""

from __future__ import annotations

from ..base import register
from ._elementwise import BinaryKernel, UnaryKernel


@register()
class Add(BinaryKernel):
    def compute(self, xp, a, b):
        return xp.add(a, b)


@register()
class Sub(BinaryKernel):
    def compute(self, xp, a, b):
        return xp.subtract(a, b)


@register()
class Mul(BinaryKernel):
    def compute(self, xp, a, b):
        if a.dtype == xp.bool_:
            return xp.logical_and(a, b)
        return xp.multiply(a, b)


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


@register()
class Neg(UnaryKernel):
    def compute(self, xp, x):
        return xp.negative(x)


@register()
class Abs(UnaryKernel):
    def compute(self, xp, x):
        return xp.abs(x)
