"""Gathering operators: Gather, GatherElements, GatherND, Compress, NonZero, OneHot,
Unique, ReverseSequence.

Indices may be int32 or int64 and negative (counting from the end).  Every index is
range-checked (a min/max reduction) before the gather itself runs; an index out of range
raises a KernelInputError naming the operator, the bad value and the axis size.

Compiled graphs (array_function) plan per input signature: constant indices (frozen
arrays, see is_frozen) are checked and normalised once, at their first call, and kept;
other indices are checked on every call.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ... import dtypes
from ...dtypes import DataType
from ...host import tuning
from ...limits import check_allocation
from ...tensor import Tensor
from ...host import host_empty, parallel_ranges
from ..base import KernelBase, register
from ..specialize import specialize
from ._common import deliver, host_ints, norm_axis, on, product, xp_for


def checked_indices(kernel, xp, idx, size: int, what: str = "indices", **inputs):
    """idx (int32/int64 array) with negatives wrapped, after checking -size <= i < size."""
    lo = hi = 0
    if idx.size == 1:  # one index (a time step, a row): no reductions
        lo = hi = int(idx.reshape(-1)[0])
    elif idx.size:
        lo, hi = int(idx.min()), int(idx.max())
    if idx.size and (lo < -size or hi >= size):
        bad = lo if lo < -size else hi
        raise kernel.error(f"{what} value {bad} is out of range for an axis of size {size}", **inputs)
    idx = idx.astype(xp.int64) if idx.dtype != np.int64 else idx
    if lo < 0:
        idx = xp.where(idx < 0, idx + size, idx)
    return idx


def is_frozen(array) -> bool:
    """Whether array is a host array nobody can write: read-only, as every array it views,
    down to immutable memory (bytes) or its own.  The runtime freezes the constants it
    keeps across runs (runtime.graph.freeze), so a frozen array passed again is the same
    constant with the same values."""
    while array.__class__ is np.ndarray:
        if array.flags.writeable:
            return False
        array = array.base
    return array is None or array.__class__ is bytes


def constant_memo(plan):
    """f(idx, *more) -> plan(idx, *more), computed once for a frozen idx (a constant, the
    same array object on every call; see is_frozen) and kept; on every call otherwise.
    plan may raise (an index out of range): nothing is kept then.  The pair is kept as
    one tuple, replaced in one assignment: threads sharing the function never see an
    array with another array's result."""
    state = (None, None)

    def memo(idx, *more):
        nonlocal state
        kept_for, kept = state
        if idx is kept_for:
            return kept
        value = plan(idx, *more)
        if is_frozen(idx):
            state = (idx, value)
        return value

    return memo


def _taker(xp):
    """xp.take(array, idx, axis=ax) as f(array, idx, ax) (NumPy: the method itself)."""
    if xp is np:
        return np.ndarray.take
    return lambda array, idx, ax: xp.take(array, idx, axis=ax)


@register()
class Gather(KernelBase):
    """out[..., i, ...] = data[..., indices[i], ...] along axis; ``out=`` writes into a
    caller's buffer."""

    def __call__(self, data, indices, axis=0, out=None):
        x = self.tensor(data, "data")
        i = self.tensor(indices, "indices")
        self.check_inputs(x, i)
        if x.ndim == 0:
            raise self.error("data must have rank >= 1", data=x, indices=i)
        ax = norm_axis(self, axis, x.ndim, data=x, indices=i)
        res = self.take(xp_for(self, x), x.array, i.array, ax, data=x, indices=i)
        return deliver(self, Tensor.wrap(res, x.data_type), out)

    def take(self, xp, array, idx, ax: int, **inputs):
        """array's entries at the checked indices idx along axis ax (inputs: for errors)."""
        idx = checked_indices(self, xp, on(xp, idx), array.shape[ax], **inputs)
        fast = self.specialized("Gather.take", array, idx, ax)
        return fast(array, idx, ax) if fast is not None else xp.take(array, idx, axis=ax)

    def array_function(self, inputs, attrs):
        """Non-string data: take()'s work along the resolved axis, its specialisation
        chosen once (it depends on shapes only); constant indices checked once (see
        constant_memo), others on every call (an index out of range raises, and the
        runtime redoes the node through the kernel)."""
        if (len(inputs) != 2 or any(t.__class__ is not Tensor for t in inputs)
                or inputs[0].data_type == DataType.STRING or inputs[0].ndim == 0):
            return None
        data, indices = inputs[0].array, inputs[1].array
        ax = norm_axis(self, attrs.get("axis", 0), data.ndim)
        xp, size = xp_for(self, inputs[0]), data.shape[ax]
        index = constant_memo(lambda idx: checked_indices(self, xp, on(xp, idx), size))
        take = self.specialized("Gather.take", data, indices, ax) or _taker(xp)
        return lambda data, indices: take(data, index(indices), ax)


def _take_bytes(data, idx, ax) -> int:
    """The output's size in bytes (an axis of size 0 takes no index)."""
    n = data.shape[ax]
    return idx.size * (data.size // n) * data.itemsize if n else 0


@specialize("Gather.take", device="cpu", ops=("Gather",),
            when=lambda data, idx, ax: (data.dtype != object
                                        and _take_bytes(data, idx, ax) >= 2 * tuning.value("gather.thread_bytes")))
def _host_take(data, idx, ax):
    """numpy.take(data, idx, axis=ax) with the output rows split over host threads (the
    indices are checked and non-negative already); gather.thread_bytes of output per
    thread (host/tuning.py)."""
    shape = data.shape[:ax] + idx.shape + data.shape[ax + 1:]
    out = host_empty(shape, data.dtype)
    if ax == 0:
        flat = idx.reshape(-1)
        rows = out.reshape((flat.size,) + data.shape[1:])
        n = flat.size

        def part(lo, hi):
            np.take(data, flat[lo:hi], axis=0, out=rows[lo:hi], mode="clip")
    else:
        n = data.shape[0]

        def part(lo, hi):
            np.take(data[lo:hi], idx, axis=ax, out=out[lo:hi], mode="clip")
    parallel_ranges(n, max(1, tuning.value("gather.thread_bytes") // max(1, out.nbytes // max(1, n))), part)
    return out


@register()
class GatherElements(KernelBase):
    """out[i][j][k] = data[indices[i][j][k]][j][k] (axis 0), output shaped like indices;
    indices' other dimensions may be smaller than data's."""

    def __call__(self, data, indices, axis=0):
        x = self.tensor(data, "data")
        i = self.tensor(indices, "indices")
        self.check_inputs(x, i)
        if x.ndim == 0 or i.ndim != x.ndim:
            raise self.error("data and indices must have the same rank >= 1", data=x, indices=i)
        ax = norm_axis(self, axis, x.ndim, data=x, indices=i)
        for d in range(x.ndim):
            if d != ax and i.shape[d] > x.shape[d]:
                raise self.error(f"indices dimension {d} ({i.shape[d]}) exceeds data's ({x.shape[d]})",
                                 data=x, indices=i)
        xp = xp_for(self, x)
        idx = checked_indices(self, xp, on(xp, i.array), x.shape[ax], data=x, indices=i)
        src = x.array[_elements_window(x.ndim, i.shape, ax)]
        if idx.size == 0:
            return Tensor.wrap(xp.empty(i.shape, dtype=x.array.dtype), x.data_type)
        return Tensor.wrap(xp.take_along_axis(src, idx, axis=ax), x.data_type)

    def array_function(self, inputs, attrs):
        """Non-string data and non-empty indices: take_along_axis over the recorded
        window of data; constant indices checked once (see constant_memo), others on
        every call (an index out of range raises, and the runtime redoes the node
        through the kernel)."""
        if (len(inputs) != 2 or any(t.__class__ is not Tensor for t in inputs)
                or inputs[0].data_type == DataType.STRING or inputs[1].size == 0):
            return None
        x, i = inputs
        ax = norm_axis(self, attrs.get("axis", 0), x.ndim)
        xp, size = xp_for(self, x), x.shape[ax]
        window = _elements_window(x.ndim, i.shape, ax)
        index = constant_memo(lambda idx: checked_indices(self, xp, on(xp, idx), size))
        return lambda data, indices: xp.take_along_axis(data[window], index(indices), axis=ax)


def _elements_window(ndim, idx_shape, ax) -> tuple:
    """GatherElements' part of data: all of axis ax, the indices' extent on the others."""
    return tuple(slice(None) if d == ax else slice(0, idx_shape[d]) for d in range(ndim))


def nd_linear_index(kernel, xp, idx, dims, **inputs):
    """(..., k) index tuples into dims (k values) -> (...) linear indices, checked."""
    k = idx.shape[-1]
    lin = None
    for j in range(k):
        col = checked_indices(kernel, xp, idx[..., j], dims[j], f"indices[..., {j}]", **inputs)
        lin = col if lin is None else lin * dims[j] + col
    return lin


@register()
class GatherND(KernelBase):
    """Gathers slices addressed by the index tuples in the last axis of indices, after
    batch_dims leading batch axes (opset 12+)."""

    def __call__(self, data, indices, batch_dims=0):
        x = self.tensor(data, "data")
        i = self.tensor(indices, "indices")
        self.check_inputs(x, i)
        b = int(batch_dims)
        named = {"data": x, "indices": i}
        r, q = x.ndim, i.ndim
        if r < 1 or q < 1:
            raise self.error("data and indices must have rank >= 1", **named)
        if not 0 <= b < min(q, r):
            raise self.error(f"batch_dims {b} must be in [0, min(rank(data), rank(indices)))", **named)
        if x.shape[:b] != i.shape[:b]:
            raise self.error("the batch dimensions of data and indices differ", **named)
        k = i.shape[-1]
        if not 1 <= k <= r - b:
            raise self.error(f"indices.shape[-1] = {k} must be in [1, {r - b}]", **named)
        return Tensor.wrap(self.gathered(xp_for(self, x), x.array, i.array, b, **named), x.data_type)

    def gathered(self, xp, array, idx, b: int, **named):
        """The result for validated inputs (data and indices arrays; named: for errors)."""
        batch, k, inner, src_shape, out_shape = _nd_layout(array.shape, idx.shape, b)
        idx = on(xp, idx).reshape(batch, -1, k)
        if idx.shape[1] == 0 or batch == 0:
            return xp.empty(out_shape, dtype=array.dtype)
        lin = nd_linear_index(self, xp, idx, inner, **named)  # (batch, M)
        return array.reshape(src_shape)[xp.arange(batch)[:, None], lin].reshape(out_shape)

    def array_function(self, inputs, attrs):
        """Non-string data: gathered()'s work for the recorded shapes and batch_dims,
        constant indices linearised once (see constant_memo), others checked on every
        call (an index out of range raises, and the runtime redoes the node through the
        kernel)."""
        if (len(inputs) != 2 or any(t.__class__ is not Tensor for t in inputs)
                or inputs[0].data_type == DataType.STRING):
            return None
        b, xp = int(attrs.get("batch_dims", 0)), xp_for(self, inputs[0])
        batch, k, inner, src_shape, out_shape = _nd_layout(inputs[0].shape, inputs[1].shape, b)
        if batch == 0 or product(inputs[1].shape[:-1]) == 0:
            gathered = self.gathered
            return lambda data, indices: gathered(xp, data, indices, b)
        lin = constant_memo(lambda idx: nd_linear_index(self, xp, on(xp, idx).reshape(batch, -1, k), inner))
        first = xp.arange(batch)[:, None]
        return lambda data, indices: data.reshape(src_shape)[first, lin(indices)].reshape(out_shape)


def _nd_layout(shape: tuple, idx_shape: tuple, b: int):
    """GatherND's (batch, k, inner, source shape, output shape) for data of shape and
    indices of idx_shape with b batch axes: data is read as (batch, prod(inner), rest...)
    rows addressed by the k-tuples' linear indices into inner."""
    k = idx_shape[-1]
    inner, rest = tuple(shape[b:b + k]), tuple(shape[b + k:])
    batch = product(shape[:b])
    return batch, k, inner, (batch, product(inner)) + rest, tuple(idx_shape[:-1]) + rest


@register()
class Compress(KernelBase):
    """Keep the slices along axis (of the flattened input when axis is None) where
    condition is True.  A condition shorter than the axis counts as False beyond its end;
    a longer one raises."""

    def __call__(self, input, condition, axis=None):
        x = self.tensor(input, "input")
        c = self.tensor(condition, "condition")
        self.check_inputs(x, c)
        if c.ndim != 1:
            raise self.error("condition must be 1-D", input=x, condition=c)
        xp = xp_for(self, x)
        arr = x.array
        if axis is None:
            arr = arr.reshape(-1)
            ax = 0
        else:
            ax = norm_axis(self, axis, x.ndim, input=x, condition=c)
        n = arr.shape[ax]
        if c.size > n:
            raise self.error(f"condition has {c.size} entries for an axis of size {n}", input=x, condition=c)
        cond = on(xp, c.array)
        keep = xp.nonzero(cond.astype(bool))[0]
        return Tensor.wrap(xp.take(arr, keep, axis=ax), x.data_type)


@register()
class NonZero(KernelBase):
    """int64 [rank, count] indices of the nonzero elements in row-major order (a scalar
    gives shape [0, count])."""

    def __call__(self, X):
        x = self.tensor(X, "X")
        self.check_inputs(x)
        xp = xp_for(self, x)
        arr = x.array
        if x.data_type == DataType.STRING:
            mask = np.vectorize(lambda s: len(s) > 0, otypes=[bool])(arr) if arr.size else np.zeros(arr.shape, bool)
        elif dtypes.info(x.data_type).is_exotic and self.on_gpu and dtypes.info(x.data_type).kind == "float":
            mask = self.to_compute(x) != 0
        else:
            mask = arr != 0
        if x.ndim == 0:
            return Tensor.wrap(xp.zeros((0, int(bool(mask))), dtype=xp.int64), DataType.INT64)
        nz = xp.nonzero(mask)
        if not nz:
            return Tensor.wrap(xp.zeros((0, 0), dtype=xp.int64), DataType.INT64)
        return Tensor.wrap(xp.stack(nz).astype(xp.int64), DataType.INT64)


@register()
class OneHot(KernelBase):
    """values = [off, on]; indices (any numeric type, truncated to integers) in
    [-depth, depth) mark the on position (negatives count from the end); others give an
    all-off row.  depth may be any numeric type (truncated) and must be positive."""

    def __call__(self, indices, depth, values, axis=-1):
        i = self.tensor(indices, "indices")
        d = self.tensor(depth, "depth")
        v = self.tensor(values, "values")
        self.check_inputs(i, d, v)
        named = {"indices": i, "depth": d, "values": v}
        if d.size != 1:
            raise self.error("depth must hold one value", **named)
        if v.ndim != 1 or v.size != 2:
            raise self.error("values must be [off_value, on_value]", **named)
        depth_v = float(np.asarray(d.numpy(), dtype=np.float64).reshape(()))
        if not np.isfinite(depth_v) or int(depth_v) < 1:
            raise self.error(f"depth must be a positive number, got {depth_v}", **named)
        n = int(depth_v)
        r = i.ndim + 1
        ax = norm_axis(self, axis, r, **named)
        out_shape = list(i.shape)
        out_shape.insert(ax, n)
        check_allocation(self, out_shape, v.array.dtype)
        xp = xp_for(self, v)
        idx = on(xp, self.to_compute(i) if dtypes.info(i.data_type).is_exotic else i.array)
        if idx.dtype.kind == "f":
            idx = xp.trunc(xp.where(xp.isfinite(idx), idx, -2.0 * n - 1))
        idx = idx.astype(xp.int64)
        idx = xp.where(idx < 0, idx + n, idx)
        hot = xp.expand_dims(idx, ax) == xp.arange(n).reshape((n,) + (1,) * (r - 1 - ax))
        vals = v.array
        res = xp.where(hot, vals[1], vals[0])
        return Tensor.wrap(res.astype(vals.dtype), v.data_type)


@register()
class Unique(KernelBase):
    """Unique values (or slices along axis), sorted ascending (sorted=1) or in order of
    first occurrence (sorted=0), with the first-occurrence indices, the inverse indices
    and the counts.  NaNs never compare equal, so each NaN is its own unique value."""

    class Result(NamedTuple):
        Y: Tensor
        indices: Tensor
        inverse_indices: Tensor
        counts: Tensor

    def __call__(self, X, axis=None, sorted=1):
        x = self.tensor(X, "X")
        self.check_inputs(x)
        xp = xp_for(self, x)
        arr = x.array
        if self.on_gpu and dtypes.info(x.data_type).is_exotic and dtypes.info(x.data_type).kind == "float":
            keys = self.to_compute(x)
        elif dtypes.info(x.data_type).is_exotic:
            keys = arr.astype(np.float32 if dtypes.info(x.data_type).kind == "float" else np.int64)
        else:
            keys = arr
        if axis is None:
            rows = keys.reshape(-1, 1)
            src = arr.reshape(-1)
            ax = 0
        else:
            if x.ndim == 0:
                raise self.error("axis given for a scalar", X=x)
            ax = norm_axis(self, axis, x.ndim, X=x)
            rows = xp.moveaxis(keys, ax, 0).reshape(x.shape[ax], -1)
            src = arr
        n = rows.shape[0]
        if n == 0:
            empty = xp.zeros(0, dtype=xp.int64)
            return self.Result(Tensor.wrap(src[:0] if axis is None else src, x.data_type),
                               Tensor.wrap(empty, DataType.INT64), Tensor.wrap(empty, DataType.INT64),
                               Tensor.wrap(empty, DataType.INT64))
        if rows.shape[1] == 1:
            order = xp.argsort(rows[:, 0], kind="stable")
        elif rows.shape[1] == 0:
            order = xp.arange(n)
        else:
            order = xp.lexsort(rows.T[::-1])
        srt = rows[order]
        new = xp.ones(n, dtype=bool)
        if n > 1:
            new[1:] = xp.any(srt[1:] != srt[:-1], axis=1)
        group = xp.cumsum(new) - 1
        starts = xp.nonzero(new)[0]
        first = order[starts]
        counts = xp.diff(xp.concatenate([starts, xp.asarray([n])]))
        inverse = xp.empty(n, dtype=xp.int64)
        inverse[order] = group
        if not sorted:
            perm = xp.argsort(first, kind="stable")
            rank = xp.empty_like(perm)
            rank[perm] = xp.arange(perm.size)
            first, counts, inverse = first[perm], counts[perm], rank[inverse]
        y = xp.take(src, first, axis=ax)
        i64 = lambda a: Tensor.wrap(a.astype(xp.int64), DataType.INT64)  # noqa: E731
        return self.Result(Tensor.wrap(y, x.data_type), i64(first), i64(inverse), i64(counts))


@register()
class ReverseSequence(KernelBase):
    """Reverse the first sequence_lens[b] steps along time_axis of each batch entry;
    lengths must lie in [0, time steps]."""

    def __call__(self, input, sequence_lens, batch_axis=1, time_axis=0):
        x = self.tensor(input, "input")
        s = self.tensor(sequence_lens, "sequence_lens")
        self.check_inputs(x, s)
        named = {"input": x, "sequence_lens": s}
        if x.ndim < 2:
            raise self.error("input must have rank >= 2", **named)
        ba, ta = int(batch_axis), int(time_axis)
        if {ba, ta} != {0, 1}:
            raise self.error(f"batch_axis ({ba}) and time_axis ({ta}) must be 0 and 1", **named)
        B, T = x.shape[ba], x.shape[ta]
        lens = host_ints(self, s, "sequence_lens")
        if len(lens) != B or s.ndim != 1:
            raise self.error(f"sequence_lens must be 1-D with {B} entries", **named)
        if any(v < 0 or v > T for v in lens):
            raise self.error(f"sequence_lens values must lie in [0, {T}], got {lens}", **named)
        xp = xp_for(self, x)
        t = np.arange(T)[None, :]
        ln = np.asarray(lens, dtype=np.int64)[:, None]
        src = np.where(t < ln, ln - 1 - t, t)  # (B, T) source time index
        if ta == 0:
            src = src.T  # (T, B)
        src = xp.asarray(src.reshape(src.shape + (1,) * (x.ndim - 2)))
        return Tensor.wrap(xp.take_along_axis(x.array, src, axis=ta) if x.ndim == 2 else
                           xp.take_along_axis(x.array, xp.broadcast_to(src, src.shape[:2] + x.shape[2:]), axis=ta),
                           x.data_type)
