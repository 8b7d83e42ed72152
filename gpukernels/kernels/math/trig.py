"""Trigonometric and hyperbolic functions: Acos, Acosh, Asin, Asinh, Atan, Atanh, Cos,
Cosh, Sin, Sinh, Tan, Tanh.

Half types are computed in float32 and rounded once.  Arguments outside the domain
give NaN (Acos(2), Atanh(2)), poles give infinities (Atanh(1) = inf), overflow gives
inf (Cosh(1000)); no warnings are raised.
"""

from __future__ import annotations

from ..base import register
from ._mathcommon import InputUnary
from .arith import array_op_function, compute_by_array_op


class _Trig(InputUnary):
    """The xp function named by ``ufunc``: the kernel's math and its array function
    (see arith.py)."""

    ufunc = ""
    compute = compute_by_array_op
    array_function = array_op_function

    def array_op(self, xp, dtype):
        return getattr(xp, self.ufunc)


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
