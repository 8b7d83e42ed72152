"""TopK: the k largest (largest=1) or smallest values along an axis, with their int64
indices.  Equal values are ordered by lower index first; NaN counts as larger than every
number (so it comes first with largest=1 and last with largest=0).  sorted=0 leaves the
order unspecified by the spec; we return the sorted order anyway.  k is an attribute in
opset 1 and a one-element int64 input from opset 10; k = 0 gives empty outputs and k
greater than the axis length raises.

For k much smaller than the axis a partial selection (partition at the k-th value, then
ties resolved by index) precedes a sort of the k candidates; otherwise a stable full sort.
For long rows a prefilter (a bound from per-group maxima) first keeps the few candidates.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ...dtypes import DataType
from ...tensor import Tensor
from ...xp import stable_argsort
from ..base import KernelBase, register
from ..tensor.shape_ops import values_guarded
from ._mathcommon import normalize_axis
from .arith import native_compute


class _Result(NamedTuple):
    Values: Tensor
    Indices: Tensor


def _order_desc(xp, v):
    """Stable descending order along the last axis, ties by lower index, NaN first."""
    n = v.shape[-1]
    rev = v[..., ::-1]
    order = stable_argsort(xp, rev)
    return (n - 1) - order[..., ::-1]


def _order_asc(xp, v):
    return stable_argsort(xp, v)


def _tie_aware_select(xp, v, k, largest):
    """Columns [rows, k] of the k best of each row, ties at the k-th value resolved toward
    lower indices; returned in ascending column order."""
    rows, n = v.shape
    if largest:
        thr = xp.partition(v, n - k, axis=-1)[:, n - k:n - k + 1]
        better = v > thr
    else:
        thr = xp.partition(v, k - 1, axis=-1)[:, k - 1:k]
        better = v < thr
    equal = v == thr
    need = k - better.sum(axis=-1, keepdims=True)
    take = better | (equal & (xp.cumsum(equal, axis=-1) <= need))
    return xp.nonzero(take)[1].reshape(rows, k)


def _prefilter(xp, v, k, largest):
    """For k much smaller than the row length: (candidate values, their columns), both
    [rows, c] with c << n, holding every element of each row at least as good as its k-th
    best (ties included), columns ascending, padded after the real ones with the worst
    value; or None when a row holds NaN.

    Each row is cut into m strided groups (column j belongs to group j % m); the k-th best
    of the group maxima is a bound no better than the row's k-th best value (k distinct
    elements reach it).  Only the groups reaching the bound are gathered and filtered,
    so the full row is read twice (group maxima, nothing else); adversarial rows (many
    ties at the bound) make c grow toward n."""
    rows, n = v.shape
    m = 32 * k
    g = n // m  # full strides; columns g*m.. (< m of them) extend the first groups
    tail = n - g * m
    gm = (xp.max if largest else xp.min)(v[:, :g * m].reshape(rows, g, m), axis=1)
    if tail:
        (xp.maximum if largest else xp.minimum)(gm[:, :tail], v[:, g * m:], out=gm[:, :tail])
    if v.dtype.kind == "f" and bool(xp.isnan(gm).any()):
        return None
    if largest:
        bound = xp.partition(gm, m - k, axis=1)[:, m - k:m - k + 1]
        hit = gm >= bound
    else:
        bound = xp.partition(gm, k - 1, axis=1)[:, k - 1:k]
        hit = gm <= bound
    gr, gj = xp.nonzero(hit)  # candidate groups
    cols = gj[:, None] + m * xp.arange(g + 1)[None, :]  # (groups, g + 1) columns
    inside = cols < n
    xp.minimum(cols, n - 1, out=cols)
    gv = xp.take(v.reshape(-1), cols + (gr * n)[:, None])
    keep = inside & ((gv >= bound[gr]) if largest else (gv <= bound[gr]))
    ci, cp = xp.nonzero(keep)
    r = gr[ci]
    c = cols[ci, cp]
    counts = xp.bincount(r, minlength=rows)
    width = int(counts.max())
    start = xp.cumsum(counts) - counts
    pos = xp.arange(r.shape[0]) - start[r]  # r is non-decreasing (groups come row by row)
    if v.dtype.kind == "f":
        pad = -np.inf if largest else np.inf
    else:
        pad = np.iinfo(v.dtype).min if largest else np.iinfo(v.dtype).max
    big = np.iinfo(np.int64).max
    out_c = xp.full((rows, width), big, dtype=np.int64)
    out_c[r, pos] = c
    out_c = xp.sort(out_c, axis=1)  # columns ascending; padding (big) last
    real = out_c != big
    vals = xp.where(real, v[xp.arange(rows)[:, None], xp.where(real, out_c, 0)], pad)
    return vals.astype(v.dtype, copy=False), xp.where(real, out_c, 0)


def _gather(xp, v, cols):
    """v[r, cols[r, j]] for every row r of the 2-D arrays v and cols (take_along_axis on
    the last axis, without its per-call index building: some 8 us less a call)."""
    return v[xp.arange(v.shape[0])[:, None], cols]


def topk_rows(xp, v, k, largest):
    """Indices [rows, k] of the top k of each row of the 2-D array v, in output order."""
    rows, n = v.shape
    if k == 0:
        return xp.zeros((rows, 0), dtype=np.int64)
    if k * 64 <= n and n >= 4096 and v.dtype.kind in "fiu" and v.flags.c_contiguous:
        pre = _prefilter(xp, v, k, largest)
        if pre is not None and pre[0].shape[1] * 2 <= n:
            vals, cols = pre
            sel = topk_rows(xp, vals, k, largest)  # padding sorts after every real candidate
            return _gather(xp, cols, sel)
    if k * 8 < n and n > 64 and not (v.dtype.kind == "f" and bool(xp.isnan(v).any())):
        # candidates by a partial selection: every value left out is no better than the
        # k-th (the worst candidate), so a row is ambiguous when one of them equals it;
        # those rows are redone with an explicit lowest-index-first rule
        kth = n - k if largest else k - 1
        part = xp.argpartition(v, kth, axis=-1)
        cols = part[:, n - k:] if largest else part[:, :k]
        thr = (xp.min if largest else xp.max)(_gather(xp, v, cols), axis=-1, keepdims=True)
        ambiguous = ((v >= thr) if largest else (v <= thr)).sum(axis=-1) != k
        cols = xp.sort(cols, axis=-1)
        if bool(ambiguous.any()):
            redo = xp.nonzero(ambiguous)[0]
            cols[redo] = _tie_aware_select(xp, v[redo], k, largest)
        cand = _gather(xp, v, cols)
        order = _order_desc(xp, cand) if largest else _order_asc(xp, cand)
        return _gather(xp, cols, order).astype(np.int64, copy=False)
    order = _order_desc(xp, v) if largest else _order_asc(xp, v)
    return order[:, :k].astype(np.int64, copy=False)


@register()
class TopK(KernelBase):
    Result = _Result

    def __call__(self, X, K=None, axis=-1, largest=1, sorted=1, k=None):
        x = self.tensor(X, "X")
        if self.since_version < 10:
            self.check_inputs(x)
            if k is None:
                raise self.error("attribute 'k' is required", X=x)
            kk = int(k)
        else:
            kt = self.tensor(K, "K")
            self.check_inputs(x, kt)
            if kt.size != 1 or kt.ndim > 1:
                raise self.error("K must be a 1-D tensor holding one value", X=x, K=kt)
            kk = int(np.asarray(kt.numpy()).reshape(-1)[0])
        if x.ndim == 0:
            raise self.error("X must have at least one dimension", X=x)
        ax = normalize_axis(self, axis, x.ndim, X=x)
        n = x.shape[ax]
        if kk < 0 or kk > n:
            raise self.error(f"k={kk} is out of range for axis {ax} of length {n}", X=x)
        xc = self.to_compute(x)
        vals, idx = self._topk(xc, ax, kk, bool(largest))
        # values come from the input itself: exact in the input type
        values = Tensor.wrap(vals, x.data_type) if xc.dtype == x.array.dtype else \
            self.from_compute(vals, x.data_type)
        return _Result(values, self.result(idx, DataType.INT64))

    def array_function(self, inputs, attrs):
        """Opset 10+, X computed in its own type: (values, indices) of _topk for the
        recorded K (guarded: another K raises, and the runtime redoes the node through
        the kernel)."""
        if (self.since_version < 10 or len(inputs) != 2 or not native_compute(inputs[:1])
                or inputs[1].__class__ is not Tensor or inputs[0].ndim == 0 or inputs[1].size != 1):
            return None
        x, kt = inputs
        kk = int(np.asarray(kt.numpy()).reshape(-1)[0])
        ax = normalize_axis(self, attrs.get("axis", -1), x.ndim, X=x)
        if not 0 <= kk <= x.shape[ax]:
            return None
        largest, topk = bool(attrs.get("largest", 1)), self._topk
        return values_guarded("TopK", {"K": [kk] if kt.ndim else kk}, lambda data: topk(data, ax, kk, largest))

    def _topk(self, xc, ax, kk, largest):
        """(values, int64 indices) of the top kk along the axis ax of the compute array xc."""
        xp = self.xp
        n = xc.shape[ax]
        last = ax == xc.ndim - 1  # the usual case: no axis moved, no copies
        moved = xc if last else xp.moveaxis(xc, ax, -1)
        lead = moved.shape[:-1]
        rows = math.prod(lead)
        v2 = moved.reshape(rows, n)
        if rows == 0:
            idx = xp.zeros((0, kk), dtype=np.int64)
        else:
            idx = topk_rows(xp, v2, kk, largest)
        vals = _gather(xp, v2, idx).reshape(lead + (kk,))
        idx = xp.ascontiguousarray(idx.reshape(lead + (kk,)))  # the full sort's is a slice
        if not last:
            idx = xp.ascontiguousarray(xp.moveaxis(idx, -1, ax))
            vals = xp.ascontiguousarray(xp.moveaxis(vals, -1, ax))
        return vals, idx
