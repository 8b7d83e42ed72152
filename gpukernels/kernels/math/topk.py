"""TopK: the k largest (largest=1) or smallest values along an axis, with their int64
indices.  Equal values are ordered by lower index first; NaN counts as larger than every
number (so it comes first with largest=1 and last with largest=0).  sorted=0 leaves the
order unspecified by the spec; we return the sorted order anyway.  k is an attribute in
opset 1 and a one-element int64 input from opset 10; k = 0 gives empty outputs and k
greater than the axis length raises.

For k much smaller than the axis a partial selection (partition at the k-th value, then
ties resolved by index) precedes a sort of the k candidates; otherwise a stable full sort.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ...dtypes import DataType
from ...tensor import Tensor
from ..base import KernelBase, register
from ._mathcommon import normalize_axis


class _Result(NamedTuple):
    Values: Tensor
    Indices: Tensor


def _order_desc(xp, v):
    """Stable descending order along the last axis, ties by lower index, NaN first."""
    n = v.shape[-1]
    rev = v[..., ::-1]
    order = xp.argsort(rev, axis=-1, kind="stable") if xp is np else xp.argsort(rev, axis=-1)
    return (n - 1) - order[..., ::-1]


def _order_asc(xp, v):
    return xp.argsort(v, axis=-1, kind="stable") if xp is np else xp.argsort(v, axis=-1)


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


def topk_rows(xp, v, k, largest):
    """Indices [rows, k] of the top k of each row of the 2-D array v, in output order."""
    rows, n = v.shape
    if k == 0:
        return xp.zeros((rows, 0), dtype=np.int64)
    if k * 8 < n and n > 64 and not (v.dtype.kind == "f" and bool(xp.isnan(v).any())):
        # candidates by a partial selection; rows where the k-th value is tied with values
        # left out are redone with an explicit lowest-index-first rule
        kth = n - k if largest else k - 1
        part = xp.argpartition(v, kth, axis=-1)
        cols = part[:, n - k:] if largest else part[:, :k]
        cand = xp.take_along_axis(v, cols, axis=-1)
        thr = (cand.min(axis=-1) if largest else cand.max(axis=-1))[:, None]
        ambiguous = (v == thr).sum(axis=-1) != (cand == thr).sum(axis=-1)
        cols = xp.sort(cols, axis=-1)
        if bool(ambiguous.any()):
            redo = xp.nonzero(ambiguous)[0]
            cols[redo] = _tie_aware_select(xp, v[redo], k, largest)
        cand = xp.take_along_axis(v, cols, axis=-1)
        order = _order_desc(xp, cand) if largest else _order_asc(xp, cand)
        return xp.take_along_axis(cols, order, axis=-1).astype(np.int64, copy=False)
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
        xp = self.xp
        xc = self.to_compute(x)
        moved = xp.moveaxis(xc, ax, -1)
        lead = moved.shape[:-1]
        rows = int(np.prod(lead, dtype=np.int64))
        v2 = moved.reshape(rows, n)
        if rows == 0:
            idx = xp.zeros((0, kk), dtype=np.int64)
        else:
            idx = topk_rows(xp, v2, kk, bool(largest))
        vals = xp.take_along_axis(v2, idx, axis=-1)
        idx = xp.ascontiguousarray(xp.moveaxis(idx.reshape(lead + (kk,)), -1, ax))
        vals = xp.ascontiguousarray(xp.moveaxis(vals.reshape(lead + (kk,)), -1, ax))
        # values come from the input itself: exact in the input type
        values = Tensor.wrap(vals, x.data_type) if xc.dtype == x.array.dtype else \
            self.from_compute(vals, x.data_type)
        return _Result(values, self.result(idx, DataType.INT64))
