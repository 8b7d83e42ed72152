"""Softmax.

Opset 1-12: the input is coerced to 2-D at ``axis`` (default 1): dimensions before it
form rows, the rest one row each, and softmax runs over each whole row.  Opset 13+:
softmax runs along the single axis (default -1).  Computed in float32 for half types,
with the row maximum subtracted (on the host, rows of the last axis skip the shift where
that is exact and safe: see _softmax_rows_block); a row of all -inf gives NaN, as exp/sum
does.

This module also holds the row helpers of the row-wise host kernels (Softmax, LogSoftmax,
LayerNormalization): ``host_row_blocks``, ``row_sums``.
"""

from __future__ import annotations

import functools
import math
import threading

import numpy as np

from ...host import tuning
from ...host import host_blocks, host_empty, parallel_ranges
from ..base import KernelBase, register
from ..specialize import specialize
from .arith import native_compute

# ----------------------------------------------------------------------------- softmax

# Tuning (host/tuning.py): on the host, whole slices along the axis are processed in
# blocks of about softmax.host_block_elems elements, so that every pass runs in cache and
# the input and output cross memory once; the row path takes blocks of about
# softmax.row_block_elems elements (4 MiB of float32: each block costs a few NumPy calls
# of fixed overhead).
# Row sums as BLAS dot products with ones (2-3x faster than np.add.reduce in cache) up to
# this row length, where their float32 accumulation stays within ~2 ulp; pairwise beyond.
_DOT_SUM_MAX = 1 << 13


def _softmax_into(xp, x, out, axis):
    m = xp.max(x, axis=axis, keepdims=True)
    xp.subtract(x, m, out=out)
    xp.exp(out, out=out)
    out /= xp.sum(out, axis=axis, keepdims=True)


def row_sums(a, ones):
    """Sums of the rows of a 2-D host block; ones is ``row_ones(a.shape[1], a.dtype)``."""
    return np.add.reduce(a, axis=1) if ones is None else np.vecdot(a, ones)


def row_ones(n: int, dtype):
    """A vector of n ones for ``row_sums`` (None where pairwise summation is used)."""
    return np.ones(n, dtype) if 0 < n <= _DOT_SUM_MAX and hasattr(np, "vecdot") else None


def _softmax_rows_block(xb, ob, ones, shifted: bool) -> bool:
    """Softmax of each row of xb into ob (host, a block that fits in cache); returns
    whether the next block should start in the shifted form.

    Unshifted form: exp(x) / sum(exp(x)) wherever that is safe, i.e. when the row's sum s
    lies in [1, 2^100]: no exp overflowed, every output that is a normal float came from a
    normal (full precision) exp(x), and 1/s is normal too.  It saves two passes and is at least
    as exact (x - max is itself rounded).  Other rows (large or all-negative values, inf, NaN)
    are redone in the shifted form, exp(x - max); blocks where most rows needed that start
    shifted, until a block's maxima are all in [0, 60] again."""
    if shifted:
        m = np.maximum.reduce(xb, axis=1, keepdims=True)
        np.subtract(xb, m, out=ob)
        np.exp(ob, out=ob)
        s = row_sums(ob, ones)
        again = not (np.minimum.reduce(m, axis=None) >= 0 and np.maximum.reduce(m, axis=None) <= 60)
    else:
        np.exp(xb, out=ob)
        s = row_sums(ob, ones)
        again = False
        if not (np.minimum.reduce(s) >= 1 and np.maximum.reduce(s) <= 2.0 ** 100):  # NaN fails too
            redo = np.flatnonzero(~((s >= 1) & (s <= 2.0 ** 100)))
            xr = xb[redo]
            er = np.exp(xr - np.maximum.reduce(xr, axis=1, keepdims=True))
            s[redo] = row_sums(er, ones)
            ob[redo] = er
            again = 2 * redo.size > s.size
    np.divide(1, s, out=s)
    np.multiply(ob, s[:, None], out=ob)
    return again


def host_row_blocks(R: int, n: int, fn) -> None:
    """fn(a, b) over blocks of rows [a, b) of an (R, n) host problem, each block about
    softmax.row_block_elems elements, over the host threads."""
    host_blocks(R, max(1, tuning.value("softmax.row_block_elems") // max(1, n)), fn)


def _inner(x, axis: int) -> int:
    return math.prod(x.shape[axis + 1:])


def _slice_step(x, axis: int) -> int:
    """Whole slices along axis per host block."""
    return max(1, tuning.value("softmax.host_block_elems") // max(1, x.shape[axis] * _inner(x, axis)))


@specialize("Softmax.along", device="cpu", ops=("Softmax",),
            when=lambda x, axis: (_inner(x, axis) == 1 and x.dtype.kind == "f"
                                  and x.size >= tuning.value("softmax.host_block_elems")),
            agreement="rtol 1e-6 (float32): exp(x) / sum without the max shift where that is safe")
def _softmax_last_axis_host(x, axis):
    """Softmax of rows along the last (non-trivial) axis: row blocks in cache over the host
    threads (_softmax_rows_host)."""
    n = x.shape[axis]
    return _softmax_rows_host(np.ascontiguousarray(x).reshape(-1, n)).reshape(x.shape)


@specialize("Softmax.along", device="cpu", ops=("Softmax",),
            when=lambda x, axis: math.prod(x.shape[:axis]) > _slice_step(x, axis))
def _softmax_slices_host(x, axis):
    """The reference's steps on (outer, n, inner) blocks of whole slices, over the host
    threads, into a reusable buffer: the same reductions, in the same order."""
    n = x.shape[axis]
    outer = math.prod(x.shape[:axis])
    x3 = np.ascontiguousarray(x).reshape(outer, n, _inner(x, axis))
    out = host_empty(x3.shape, x3.dtype)
    host_blocks(outer, _slice_step(x, axis), lambda a, b: _softmax_into(np, x3[a:b], out[a:b], 1))
    return out.reshape(x.shape)


def _softmax_rows_host(x2):
    """Softmax along the rows of a 2-D host float array, into a reusable output buffer."""
    R, n = x2.shape
    out = host_empty((R, n), x2.dtype)
    ones = row_ones(n, x2.dtype)
    mode = threading.local()  # per host thread: start the next block shifted?

    def block(a, b):
        mode.shifted = _softmax_rows_block(x2[a:b], out[a:b], ones, getattr(mode, "shifted", False))

    host_row_blocks(R, n, block)
    return out


def softmax_along(kernel, x, axis: int):
    """Softmax of x along axis in x's dtype (no temporary the size of x)."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        fast = kernel.specialized("Softmax.along", x, axis)
        if fast is not None:
            return fast(x, axis)
        xp = kernel.xp
        out = xp.empty(x.shape, dtype=x.dtype)
        _softmax_into(xp, x, out, axis)
        return out


def normalize_axis(kernel, axis: int, ndim: int, **inputs) -> int:
    if not -max(ndim, 1) <= axis < max(ndim, 1):
        raise kernel.error(f"axis {axis} is out of range for rank {ndim}", **inputs)
    return axis % max(ndim, 1)


class RowwiseKernel(KernelBase):
    """Softmax-family operators: ``along(kernel, x, axis)`` applied per row, with the
    opset-1..12 coerce-to-2-D semantics or the opset-13+ single-axis semantics."""

    def __call__(self, input, axis=None):
        x = self.tensor(input, "input")
        self.check_inputs(x)
        axis = self._axis(x, axis)
        xc = self.to_compute(x)
        if x.size == 0:
            return self.from_compute(xc.copy(), x.data_type)
        return self.from_compute(self._rows(xc, axis), x.data_type)

    def _axis(self, x, axis) -> int:
        """The checked, non-negative axis (default 1 before opset 13, else -1)."""
        if axis is None:
            axis = 1 if self.since_version < 13 else -1
        if x.ndim == 0:
            raise self.error("input must have at least one dimension", input=x)
        return normalize_axis(self, axis, x.ndim, input=x)

    def _rows(self, xc, axis: int):
        """The operation on a compute array: along the axis (opset 13+), or over whole
        rows of the 2-D coercion at axis (opset 1-12)."""
        if self.since_version < 13:
            rows = math.prod(xc.shape[:axis])
            return self.along(self, xc.reshape(rows, -1), 1).reshape(xc.shape)
        return self.along(self, xc, axis)

    def array_function(self, inputs, attrs):
        """Types computed natively, non-empty input: the row step with the axis resolved."""
        if len(inputs) != 1 or not native_compute(inputs) or inputs[0].ndim == 0 or inputs[0].size == 0:
            return None
        axis = self._axis(inputs[0], attrs.get("axis"))
        return functools.partial(self._rows, axis=axis)


@register()
class Softmax(RowwiseKernel):
    along = staticmethod(softmax_along)
