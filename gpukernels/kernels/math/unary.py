"""Sqrt, Exp, Log, Relu.  NaN propagates; Sqrt and Log of negatives give NaN and Log(0)
gives -inf, as IEEE arithmetic does (no warnings are raised)."""

from __future__ import annotations

import numpy as np

from ..base import register
from ._elementwise import UnaryKernel
from .arith import native_compute


class _QuietUnary(UnaryKernel):
    ufunc = ""  # the xp function computing it

    def compute(self, xp, x):
        with np.errstate(all="ignore"):
            return self.function(xp, x)

    def array_function(self, inputs, attrs):
        return getattr(self.xp, self.ufunc) if native_compute(inputs) else None


@register()
class Sqrt(_QuietUnary):
    ufunc = "sqrt"

    @staticmethod
    def function(xp, x):
        return xp.sqrt(x)


@register()
class Exp(_QuietUnary):
    ufunc = "exp"

    @staticmethod
    def function(xp, x):
        return xp.exp(x)


@register()
class Log(_QuietUnary):
    ufunc = "log"

    @staticmethod
    def function(xp, x):
        return xp.log(x)


@register()
class Relu(UnaryKernel):
    def compute(self, xp, x):
        return xp.maximum(x, x.dtype.type(0))

    def array_function(self, inputs, attrs):
        if not native_compute(inputs):
            return None
        xp, zero = self.xp, inputs[0].array.dtype.type(0)
        return lambda x: xp.maximum(x, zero)
