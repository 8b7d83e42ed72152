"""Trigonometric and hyperbolic functions: Acos, Acosh, Asin, Asinh, Atan, Atanh, Cos,
Cosh, Sin, Sinh, Tan, Tanh.

Half types are computed in float32 and rounded once.  Arguments outside the domain
give NaN (Acos(2), Atanh(2)), poles give infinities (Atanh(1) = inf), overflow gives
inf (Cosh(1000)); no warnings are raised.
"""

from __future__ import annotations

from ..base import register
from ._mathcommon import InputUnary
from .arith import native_compute


class _Trig(InputUnary):
    """compute = the xp function named by ``ufunc``; it is also the array function."""

    ufunc = ""

    def compute(self, xp, x):
        return getattr(xp, self.ufunc)(x)

    def array_function(self, inputs, attrs):
        return getattr(self.xp, self.ufunc) if native_compute(inputs) else None


@register()
class Acos(_Trig):
    ufunc = "arccos"


@register()
class Acosh(_Trig):
    ufunc = "arccosh"


@register()
class Asin(_Trig):
    ufunc = "arcsin"


@register()
class Asinh(_Trig):
    ufunc = "arcsinh"


@register()
class Atan(_Trig):
    ufunc = "arctan"


@register()
class Atanh(_Trig):
    ufunc = "arctanh"


@register()
class Cos(_Trig):
    ufunc = "cos"


@register()
class Cosh(_Trig):
    ufunc = "cosh"


@register()
class Sin(_Trig):
    ufunc = "sin"


@register()
class Sinh(_Trig):
    ufunc = "sinh"


@register()
class Tan(_Trig):
    ufunc = "tan"


@register()
class Tanh(_Trig):
    ufunc = "tanh"
