"""Trigonometric and hyperbolic functions: Acos, Acosh, Asin, Asinh, Atan, Atanh, Cos,
Cosh, Sin, Sinh, Tan, Tanh.

Half types are computed in float32 and rounded once.  Arguments outside the domain
give NaN (Acos(2), Atanh(2)), poles give infinities (Atanh(1) = inf), overflow gives
inf (Cosh(1000)); no warnings are raised.
"""

from __future__ import annotations

from ..base import register
from ._mathcommon import InputUnary


@register()
class Acos(InputUnary):
    def compute(self, xp, x):
        return xp.arccos(x)


@register()
class Acosh(InputUnary):
    def compute(self, xp, x):
        return xp.arccosh(x)


@register()
class Asin(InputUnary):
    def compute(self, xp, x):
        return xp.arcsin(x)


@register()
class Asinh(InputUnary):
    def compute(self, xp, x):
        return xp.arcsinh(x)


@register()
class Atan(InputUnary):
    def compute(self, xp, x):
        return xp.arctan(x)


@register()
class Atanh(InputUnary):
    def compute(self, xp, x):
        return xp.arctanh(x)


@register()
class Cos(InputUnary):
    def compute(self, xp, x):
        return xp.cos(x)


@register()
class Cosh(InputUnary):
    def compute(self, xp, x):
        return xp.cosh(x)


@register()
class Sin(InputUnary):
    def compute(self, xp, x):
        return xp.sin(x)


@register()
class Sinh(InputUnary):
    def compute(self, xp, x):
        return xp.sinh(x)


@register()
class Tan(InputUnary):
    def compute(self, xp, x):
        return xp.tan(x)


@register()
class Tanh(InputUnary):
    def compute(self, xp, x):
        return xp.tanh(x)
