"""Softmax.

Opset 1-12: the input is coerced to 2-D at ``axis`` (default 1): dimensions before it
form rows, the rest one row each, and softmax runs over each whole row.  Opset 13+:
softmax runs along the single axis (default -1).  Computed in float32 for half types,
with the row maximum subtracted; a row of all -inf gives NaN, as exp/sum does.
"""

from __future__ import annotations

import numpy as np

from ...xp import parallel_ranges
from ..base import KernelBase, register


# On the host, whole slices along the axis are processed in blocks of about this many
# elements, so that the four passes (max, subtract, exp, sum and divide) run in cache and
# the input and output cross memory once.
_HOST_BLOCK = 1 << 16


def _softmax_into(xp, x, out, axis):
    m = xp.max(x, axis=axis, keepdims=True)
    xp.subtract(x, m, out=out)
    xp.exp(out, out=out)
    out /= xp.sum(out, axis=axis, keepdims=True)


def softmax_along(xp, x, axis: int):
    """Softmax of x along axis in x's dtype (no temporary the size of x)."""
    with np.errstate(invalid="ignore", over="ignore"):
        n = x.shape[axis]
        inner = int(np.prod(x.shape[axis + 1:], dtype=np.int64))
        outer = int(np.prod(x.shape[:axis], dtype=np.int64))
        step = max(1, _HOST_BLOCK // max(1, n * inner))
        if xp is not np or outer <= step:
            out = xp.empty(x.shape, dtype=x.dtype)
            _softmax_into(xp, x, out, axis)
            return out
        # (outer, n, inner) blocks of whole slices: the same reductions, in the same order
        x3 = xp.ascontiguousarray(x).reshape(outer, n, inner)
        out = xp.empty_like(x3)

        def rows(lo, hi):
            for a in range(lo, hi, step):
                b = min(hi, a + step)
                _softmax_into(xp, x3[a:b], out[a:b], 1)

        parallel_ranges(outer, 8 * step, rows)  # independent rows: split over host threads
        return out.reshape(x.shape)


def normalize_axis(kernel, axis: int, ndim: int, **inputs) -> int:
    if not -max(ndim, 1) <= axis < max(ndim, 1):
        raise kernel.error(f"axis {axis} is out of range for rank {ndim}", **inputs)
    return axis % max(ndim, 1)


class RowwiseKernel(KernelBase):
    """Softmax-family operators: ``along(xp, x, axis)`` applied per row, with the
    opset-1..12 coerce-to-2-D semantics or the opset-13+ single-axis semantics."""

    def __call__(self, input, axis=None):
        x = self.tensor(input, "input")
        self.check_inputs(x)
        legacy = self.since_version < 13
        if axis is None:
            axis = 1 if legacy else -1
        if x.ndim == 0:
            raise self.error("input must have at least one dimension", input=x)
        axis = normalize_axis(self, axis, x.ndim, input=x)
        xc = self.to_compute(x)
        if x.size == 0:
            return self.from_compute(xc.copy(), x.data_type)
        if legacy:
            rows = int(np.prod(x.shape[:axis], dtype=np.int64))
            y = self.along(self.xp, xc.reshape(rows, -1), 1).reshape(x.shape)
        else:
            y = self.along(self.xp, xc, axis)
        return self.from_compute(y, x.data_type)


@register()
class Softmax(RowwiseKernel):
    along = staticmethod(softmax_along)
