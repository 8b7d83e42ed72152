"""LogSoftmax and Hardmax.

Opset 1-12: the input is coerced to 2-D at ``axis`` (default 1) and the operation runs
over each whole row; opset 13+: along the single axis (default -1).  LogSoftmax is
x - max - log(sum(exp(x - max))) in float32 for half types; a row of all -inf gives NaN.
Hardmax puts 1 at the first maximum of each row (a NaN counts as the maximum, as in
numpy.argmax) and 0 elsewhere.
"""

from __future__ import annotations

import numpy as np

from ..base import register
from .softmax import RowwiseKernel


def log_softmax_along(xp, x, axis: int):
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        m = xp.max(x, axis=axis, keepdims=True)
        s = x - m
        lse = xp.log(xp.sum(xp.exp(s), axis=axis, keepdims=True))
        s -= lse
        return s


def hardmax_along(xp, x, axis: int):
    idx = xp.expand_dims(xp.argmax(x, axis=axis), axis)
    shape = [1] * x.ndim
    shape[axis] = x.shape[axis]
    positions = xp.arange(x.shape[axis]).reshape(shape)
    return (positions == idx).astype(x.dtype)


@register()
class LogSoftmax(RowwiseKernel):
    along = staticmethod(log_softmax_along)


@register()
class Hardmax(RowwiseKernel):
    along = staticmethod(hardmax_along)
