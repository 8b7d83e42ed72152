"""Sqrt, Exp, Log, Relu.  NaN propagates; Sqrt and Log of negatives give NaN and Log(0)
gives -inf, as IEEE arithmetic does (no warnings are raised)."""

from __future__ import annotations

import numpy as np

from ..base import register
from ._elementwise import UnaryKernel


class _QuietUnary(UnaryKernel):
    def compute(self, xp, x):
        with np.errstate(all="ignore"):
            return self.function(xp, x)


@register()
class Sqrt(_QuietUnary):
    @staticmethod
    def function(xp, x):
        return xp.sqrt(x)


@register()
class Exp(_QuietUnary):
    @staticmethod
    def function(xp, x):
        return xp.exp(x)


@register()
class Log(_QuietUnary):
    @staticmethod
    def function(xp, x):
        return xp.log(x)


@register()
class Relu(UnaryKernel):
    def compute(self, xp, x):
        return xp.maximum(x, x.dtype.type(0))
