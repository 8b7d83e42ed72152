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
from ..specialize import specialize
from ...host import host_empty
from ...host import tuning
from .softmax import RowwiseKernel, _inner, host_row_blocks, row_ones, row_sums


def log_softmax_rows(xp, xb, ob, ones) -> None:
    """LogSoftmax of each row of xb (R, n) into ob: x - max - log(sum(exp(x - max))), the
    row sums through ``row_sums`` (BLAS dots with ones).  The reference for slices along
    the last axis on both devices; the host runs it on blocks of rows (the same values)."""
    xp.subtract(xb, xp.max(xb, axis=1, keepdims=True), out=ob)
    lse = row_sums(xp, xp.exp(ob), ones)
    xp.log(lse, out=lse)
    xp.subtract(ob, lse[:, None], out=ob)


@specialize("LogSoftmax.along", device="cpu", ops=("LogSoftmax",),
            when=lambda x, axis: (x.dtype.kind == "f" and _inner(x, axis) == 1
                                  and x.size >= tuning.value("softmax.host_block_elems")))
def _log_softmax_last_axis_host(x, axis):
    """log_softmax_rows on row blocks that stay in cache, over the host threads, into a
    reusable buffer."""
    n = x.shape[axis]
    x2 = np.ascontiguousarray(x).reshape(-1, n)
    out = host_empty(x2.shape, x2.dtype)
    ones = row_ones(np, n, x2.dtype)
    host_row_blocks(x2.shape[0], n, lambda a, b: log_softmax_rows(np, x2[a:b], out[a:b], ones))
    return out.reshape(x.shape)


def log_softmax_along(kernel, x, axis: int):
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        fast = kernel.specialized("LogSoftmax.along", x, axis)
        if fast is not None:
            return fast(x, axis)
        xp = kernel.xp
        if _inner(x, axis) == 1 and x.size:  # slices along the last axis: rows
            n = x.shape[axis]
            out = xp.empty(x.shape, dtype=x.dtype)
            log_softmax_rows(xp, xp.ascontiguousarray(x).reshape(-1, n), out.reshape(-1, n), row_ones(xp, n, x.dtype))
            return out
        m = xp.max(x, axis=axis, keepdims=True)
        s = x - m
        lse = xp.log(xp.sum(xp.exp(s), axis=axis, keepdims=True))
        s -= lse
        return s


def hardmax_along(kernel, x, axis: int):
    xp = kernel.xp
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
