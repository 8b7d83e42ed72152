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
from .softmax import RowwiseKernel, host_row_blocks, row_ones, row_sums


def _log_softmax_rows_host(x2):
    """LogSoftmax along the rows of a 2-D host float array: row blocks that stay in cache
    (the same steps as the general form), over the host threads, into a reusable buffer."""
    R, n = x2.shape
    out = host_empty((R, n), x2.dtype)
    ones = row_ones(n, x2.dtype)

    def block(a, b):
        xb, ob = x2[a:b], out[a:b]
        np.subtract(xb, np.maximum.reduce(xb, axis=1, keepdims=True), out=ob)
        lse = row_sums(np.exp(ob), ones)
        np.log(lse, out=lse)
        np.subtract(ob, lse[:, None], out=ob)

    host_row_blocks(R, n, block)
    return out


@specialize("LogSoftmax.along", device="cpu", ops=("LogSoftmax",),
            when=lambda x, axis: (x.dtype.kind == "f" and x.ndim == axis + 1
                                  and x.size >= tuning.value("softmax.host_block_elems")),
            agreement="rtol 1e-6 (float32): row sums as dot products with ones")
def _log_softmax_last_axis_host(x, axis):
    n = x.shape[axis]
    return _log_softmax_rows_host(np.ascontiguousarray(x).reshape(-1, n)).reshape(x.shape)


def log_softmax_along(kernel, x, axis: int):
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        fast = kernel.specialized("LogSoftmax.along", x, axis)
        if fast is not None:
            return fast(x, axis)
        xp = kernel.xp
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
