"""Sqrt, Exp, Log, Relu.  NaN propagates; Sqrt and Log of negatives give NaN and Log(0)
gives -inf, as IEEE arithmetic does (no warnings are raised).

The math of each is its ``array_op``, which both the kernel and its array function call
(see arith.py)."""

from __future__ import annotations

from ..base import register
from ._mathcommon import XUnary
from .arith import ArrayOpUnary, array_op_function, compute_by_array_op


class _QuietUnary(XUnary):
    """The xp function named by ``ufunc``, IEEE warnings silenced (MathUnary)."""

    ufunc = ""
    compute = compute_by_array_op
    array_function = array_op_function

    def array_op(self, xp, dtype):
        return getattr(xp, self.ufunc)


@register()
class Sqrt(_QuietUnary):
    ufunc = "sqrt"


@register()
class Exp(_QuietUnary):
    ufunc = "exp"


@register()
class Log(_QuietUnary):
    ufunc = "log"


@register()
class Relu(ArrayOpUnary):
    def array_op(self, xp, dtype):
        zero = dtype.type(0)
        return lambda x: xp.maximum(x, zero)
