"""Softmax.

Opset 1-12: the input is coerced to 2-D at ``axis`` (default 1): dimensions before it
form rows, the rest one row each, and softmax runs over each whole row.  Opset 13+:
softmax runs along the single axis (default -1).  Computed in float32 for half types,
with the row maximum subtracted (slices along the last axis skip the shift where that is
exact and safe: see softmax_rows); a row of all -inf gives NaN, as exp/sum does.

Host specialisations compute the same operations in the same order as the reference, so
that on the host they are bitwise equal to it (and to the CuPy simulation, which runs the
reference on NumPy): they differ only in blocking over rows, threads and buffer reuse.

This module also holds the row helpers of the row-wise kernels (Softmax, LogSoftmax,
LayerNormalization), used by the reference and the host blocks alike: ``host_row_blocks``,
``row_sums``, ``row_dots``, ``row_ones``.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ...host import tuning
from ...host import host_blocks, host_empty
from ..base import KernelBase, register
from ..specialize import specialize
from .arith import native_compute

# ----------------------------------------------------------------------------- softmax

# Tuning (host/tuning.py): on the host, whole slices along the axis are processed in
# blocks of about softmax.host_block_elems elements, so that every pass runs in cache and
# the input and output cross memory once; the row path takes blocks of about
# softmax.row_block_elems elements (4 MiB of float32: each block costs a few NumPy calls
# of fixed overhead).
# Row sums and row dot products (row-wise kernels: Softmax, LogSoftmax,
# LayerNormalization) are BLAS dot products (2-3x faster than np.add.reduce in cache) up
# to this row length, where their float32 accumulation stays within ~2 ulp and the BLAS
# never splits one row over its own threads; pairwise sums beyond.
# The reference and the host blocks call the same helpers, so they agree bit for bit.
_DOT_SUM_MAX = 1 << 13


def _softmax_into(xp, x, out, axis):
    m = xp.max(x, axis=axis, keepdims=True)
    xp.subtract(x, m, out=out)
    xp.exp(out, out=out)
    out /= xp.sum(out, axis=axis, keepdims=True)


def _dots(xp, a, b):
    """Per-row BLAS dot products of a (R, n) with b (R, n), or with one row b (n,).

    NumPy: np.vecdot (the fastest call).  A namespace without vecdot (CuPy 14) runs
    matmul of (R, 1, n) by (n, 1) or (R, n, 1): on NumPy that reaches the same dot, once
    per row (tests/test_paths.py checks it bit for bit); on CuPy a batched GEMM."""
    vecdot = getattr(xp, "vecdot", None)
    if vecdot is not None:
        return vecdot(a, b)
    return xp.matmul(a[:, None, :], b[:, None] if b.ndim == 1 else b[:, :, None]).reshape(-1)


def row_sums(xp, a, ones):
    """Sums of the rows of a 2-D array; ones is ``row_ones(xp, a.shape[1], a.dtype)``."""
    return xp.sum(a, axis=1) if ones is None else _dots(xp, a, ones)


def row_ones(xp, n: int, dtype):
    """A vector of n ones for ``row_sums`` (None where pairwise summation is used); on the
    host one read-only vector per length and type, kept."""
    if not 0 < n <= _DOT_SUM_MAX:
        return None
    return _host_ones(n, np.dtype(dtype)) if xp is np else xp.ones(n, dtype)


@functools.lru_cache(maxsize=64)
def _host_ones(n: int, dtype):
    ones = np.ones(n, dtype)
    ones.flags.writeable = False
    return ones


def row_dots(xp, a, b):
    """Per-row dot products of two 2-D arrays of one shape: BLAS dots up to _DOT_SUM_MAX
    columns, pairwise sums of the products beyond (not einsum: on NumPy its sums of one
    row differ from those of several rows, so row blocks would change the bits)."""
    return _dots(xp, a, b) if 0 < a.shape[1] <= _DOT_SUM_MAX else xp.sum(a * b, axis=1)


def softmax_rows(xp, xb, ob, ones, wait: bool = False) -> None:
    """Softmax of each row of xb (R, n) into ob: the reference for slices along the last
    axis, on both devices (the host runs it on blocks of rows).  ones is
    ``row_ones(xp, n, dtype)``.

    Where the spec leaves the order open we chose: exp(x) / sum(exp(x)) without the max
    shift wherever that is safe, i.e. when the row's sum s lies in [1, 2^100]: no exp
    overflowed, every output that is a normal float came from a normal (full precision)
    exp(x), and 1/s is normal too.  It is at least as exact (x - max is itself rounded).
    Other rows (large or all-negative values, inf, NaN) take the shifted form exp(x -
    max): a second pass exp(x - c) with c the row's max there and 0 elsewhere (x - 0 is x,
    so the safe rows keep their values).  Then one reciprocal per row and a multiply.
    Each row's value depends on that row alone, so blocks of rows give the same values.
    wait (the host) reads the rows that need the shifted form back and redoes only those
    (the same operations on the same values); a GPU never waits, it runs the second pass
    over every row."""
    xp.exp(xb, out=ob)
    s = row_sums(xp, ob, ones)
    if not wait:
        redo = ~((s >= 1) & (s <= 2.0 ** 100))  # NaN is redone too
        shift = xp.where(redo, xp.max(xb, axis=1), 0)
        xp.subtract(xb, shift[:, None], out=ob)
        xp.exp(ob, out=ob)
        s = row_sums(xp, ob, ones)
    elif not (xp.minimum.reduce(s) >= 1 and xp.maximum.reduce(s) <= 2.0 ** 100):  # NaN fails too
        rows = xp.flatnonzero(~((s >= 1) & (s <= 2.0 ** 100)))
        xr = xb[rows]
        er = xp.exp(xr - xp.max(xr, axis=1, keepdims=True))
        s[rows] = row_sums(xp, er, ones)
        ob[rows] = er
    xp.divide(1, s, out=s)
    xp.multiply(ob, s[:, None], out=ob)


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
                                  and x.size >= tuning.value("softmax.host_block_elems")))
def _softmax_last_axis_host(x, axis):
    """Softmax of rows along the last (non-trivial) axis: softmax_rows on row blocks in
    cache over the host threads, into a reusable output buffer (the same values)."""
    n = x.shape[axis]
    x2 = np.ascontiguousarray(x).reshape(-1, n)
    out = host_empty(x2.shape, x2.dtype)
    ones = row_ones(np, n, x2.dtype)
    host_row_blocks(x2.shape[0], n, lambda a, b: softmax_rows(np, x2[a:b], out[a:b], ones, wait=True))
    return out.reshape(x.shape)


@specialize("Softmax.along", device="cpu", ops=("Softmax",),
            when=lambda x, axis: _inner(x, axis) > 1 and math.prod(x.shape[:axis]) > _slice_step(x, axis))
def _softmax_slices_host(x, axis):
    """The reference's steps on (outer, n, inner) blocks of whole slices, over the host
    threads, into a reusable buffer: the same reductions, in the same order."""
    n = x.shape[axis]
    outer = math.prod(x.shape[:axis])
    x3 = np.ascontiguousarray(x).reshape(outer, n, _inner(x, axis))
    out = host_empty(x3.shape, x3.dtype)
    host_blocks(outer, _slice_step(x, axis), lambda a, b: _softmax_into(np, x3[a:b], out[a:b], 1))
    return out.reshape(x.shape)


def softmax_along(kernel, x, axis: int):
    """Softmax of x along axis in x's dtype (no temporary the size of x)."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        fast = kernel.specialized("Softmax.along", x, axis)
        if fast is not None:
            return fast(x, axis)
        xp = kernel.xp
        out = xp.empty(x.shape, dtype=x.dtype)
        n = x.shape[axis]
        if _inner(x, axis) == 1 and x.size:  # slices along the last axis: rows
            softmax_rows(xp, xp.ascontiguousarray(x).reshape(-1, n), out.reshape(-1, n), row_ones(xp, n, x.dtype),
                         wait=not kernel.on_gpu)
        else:
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
