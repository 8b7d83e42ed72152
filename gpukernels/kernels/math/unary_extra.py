"""Ceil, Floor, Round, Sign, Reciprocal, Erf.

Round rounds halves to even.  Reciprocal(0) is inf with the sign of the zero.  Sign
of NaN is NaN.  Erf of float32 (and half types, computed in float32) arrays of 2048
elements or more is a rational approximation on both devices (4.2e-7 relative:
_mathcommon.erf); smaller arrays and float64 use scipy.special.erf /
cupyx.scipy.special.erf (a few ulp).  Opset-9 Erf also accepts
integer tensors: the result is computed in float64 and converted like ONNX Cast (toward
zero), so it is 0 except where erf rounds to +-1 (|x| >= 6).
"""

from __future__ import annotations

import numpy as np

from ..base import register
from ._mathcommon import InputUnary, XUnary, erf


@register()
class Ceil(XUnary):
    def compute(self, xp, x):
        return xp.ceil(x)


@register()
class Floor(XUnary):
    def compute(self, xp, x):
        return xp.floor(x)


@register()
class Round(XUnary):
    def compute(self, xp, x):
        return xp.rint(x)


@register()
class Sign(InputUnary):
    def compute(self, xp, x):
        if x.dtype.kind == "u":
            return (x != 0).astype(x.dtype)
        return xp.sign(x)


@register()
class Reciprocal(XUnary):
    def compute(self, xp, x):
        return xp.reciprocal(x)


@register()
class Erf(InputUnary):
    def compute(self, xp, x):
        if x.dtype.kind in "iu":
            y = erf(xp, x.astype(np.float64), kernel=self)
            return y.astype(x.dtype)
        return erf(xp, x, kernel=self)
