"""Scattering operators: Scatter, ScatterElements, ScatterND, TensorScatter.

The output is a copy of ``data`` with updates written at the addressed positions; the
input is never modified.  Indices may be int32 or int64 and negative; every index is
checked before any update is applied.

Repeated indices: with reduction 'none' the spec leaves the result open; here the update
that comes last in index order (C order of the indices) wins, identically on CPU and GPU.
With add/mul/max/min every update is applied.  Reductions run in the compute type (float32
for float16/bfloat16/float8, rounded once at the end; integers in their own type with
two's-complement wrap, bool as logical or (add, max) / and (mul, min)).
"""

from __future__ import annotations

import numpy as np

from ... import dtypes
from ...dtypes import DataType
from ...host import tuning
from ...tensor import Tensor
from ...xp import assign_rows_last_wins, scatter_assign_last_wins, scatter_reduce
from ...host import copy_array, parallel_ranges
from ..base import KernelBase, register
from ..specialize import specialize
from ._common import host_ints, norm_axis, on, product, xp_for
from .indexing import checked_indices, constant_memo, nd_linear_index

REDUCTIONS = ("none", "add", "mul", "max", "min")


def _distinct_large(target, rows, values) -> bool:
    """Whether the updates are large and their rows distinct (checked on a sorted copy of
    the row indices, cheap next to moving the rows): scatter.parallel_assign update
    elements per thread or more (host/tuning.py)."""
    m, s = values.shape
    if not (m > 1 and s >= 64 and m * s >= 2 * tuning.value("scatter.parallel_assign")):
        return False
    srt = np.sort(rows)
    return not (srt[1:] == srt[:-1]).any()


@specialize("ScatterND.assign_rows", device="cpu", ops=("ScatterND",), when=_distinct_large)
def _assign_rows_host(target, rows, values) -> None:
    """_row_assigner's choice for distinct rows: the order does not matter, so contiguous
    slices of the updates are assigned by the host threads."""
    m, s = values.shape

    def run(lo, hi):
        target[rows[lo:hi]] = values[lo:hi]

    parallel_ranges(m, max(1, tuning.value("scatter.parallel_assign") // s), run)


def _row_assigner(kernel, xp, target, rows, values):
    """f(target, rows, values) doing target[rows] = values (2-D target, whole rows), the
    last of repeated rows winning: the specialisation for these arrays, or the general
    assignment.  The choice reads rows' values (distinct or not)."""
    fast = kernel.specialized("ScatterND.assign_rows", target, rows, values)
    return fast if fast is not None else (lambda t, r, v: assign_rows_last_wins(xp, t, r, v))


def _flat_elements(xp, rows, s: int):
    """The flat element offsets (M * s,) of whole rows of s elements."""
    return (rows[:, None] * s + xp.arange(s, dtype=xp.int64)[None, :]).reshape(-1)


def _reduction(kernel, reduction, **inputs) -> str:
    r = reduction.decode() if isinstance(reduction, bytes) else str(reduction)
    allowed = REDUCTIONS if kernel.since_version >= 18 else \
        REDUCTIONS[:3] if kernel.since_version >= 16 else REDUCTIONS[:1]
    if r not in allowed:
        raise kernel.error(f"reduction {r!r} is not one of {list(allowed)} (opset {kernel.since_version})",
                           **inputs)
    return r


def _apply(kernel, x: Tensor, u: Tensor, flat_index, reduction: str) -> Tensor:
    """Copy of x with the updates u (flattened in index order) applied at flat_index."""
    xp = xp_for(kernel, x)
    vals = u.array.reshape(-1)
    if reduction == "none":
        out = copy_array(x.array)
        scatter_assign_last_wins(xp, out, flat_index, vals)
        return Tensor.wrap(out, x.data_type)
    return _reduce(kernel, xp, x, u, flat_index, reduction)


def _reduce(kernel, xp, x: Tensor, u: Tensor, flat_index, reduction: str) -> Tensor:
    info = dtypes.info(x.data_type)
    if x.data_type == DataType.STRING:
        raise kernel.type_error(f"reduction {reduction!r} is not defined for strings", data=x)
    if info.kind == "bool":
        reduction = {"add": "max", "mul": "min"}.get(reduction, reduction)
        out = x.array.astype(xp.uint8)
        vals = u.array.reshape(-1).astype(xp.uint8)
        scatter_reduce(xp, out.reshape(-1), flat_index, vals, reduction)
        return Tensor.wrap(out.astype(bool), x.data_type)
    if info.kind == "float":
        out = kernel.to_compute(x).copy()
        vals = kernel.to_compute(u).reshape(-1)
        scatter_reduce(xp, out.reshape(-1), flat_index, vals, reduction)
        return kernel.from_compute(out, x.data_type)
    # integers (scatter_reduce widens what CuPy's atomics lack; wrap-around is kept)
    work = info.storage
    out = x.array.astype(work)
    vals = u.array.reshape(-1).astype(work)
    scatter_reduce(xp, out.reshape(-1), flat_index, vals, reduction)
    res = out
    if info.is_exotic and not kernel.on_gpu:
        res = res.view(info.numpy)
    return Tensor.wrap(res, x.data_type)


class _ScatterElementsBase(KernelBase):
    def scatter(self, data, indices, updates, axis, reduction):
        x = self.tensor(data, "data")
        i = self.tensor(indices, "indices")
        u = self.tensor(updates, "updates")
        self.check_inputs(x, i, u)
        named = {"data": x, "indices": i, "updates": u}
        red = _reduction(self, reduction, **named)
        if x.ndim == 0 or i.ndim != x.ndim:
            raise self.error("data and indices must have the same rank >= 1", **named)
        if u.shape != i.shape:
            raise self.error("updates must have the shape of indices", **named)
        if u.data_type != x.data_type:
            raise self.type_error("updates must have data's element type", **named)
        ax = norm_axis(self, axis, x.ndim, **named)
        for d in range(x.ndim):
            if d != ax and i.shape[d] > x.shape[d]:
                raise self.error(f"indices dimension {d} ({i.shape[d]}) exceeds data's ({x.shape[d]})", **named)
        return self.scattered(x, i.array, u, ax, red, **named)

    def scattered(self, x: Tensor, idx, u: Tensor, ax: int, red: str, offsets=None, **named) -> Tensor:
        """The result for validated inputs (idx: the indices' array; offsets: what
        element_offsets gives for these shapes, when known; named: for errors)."""
        xp = xp_for(self, x)
        return self.scattered_at(x, checked_indices(self, xp, on(xp, idx), x.shape[ax], **named), u, ax, red,
                                 offsets)

    def scattered_at(self, x: Tensor, idx, u: Tensor, ax: int, red: str, offsets=None) -> Tensor:
        """scattered() for indices already checked and wrapped (checked_indices)."""
        xp = xp_for(self, x)
        if idx.size == 0:
            return Tensor.wrap(x.array.copy(), x.data_type)
        base, stride = offsets if offsets is not None else element_offsets(xp, x.shape, idx.shape, ax)
        lin = idx * stride if base is None else idx * stride + base
        return _apply(self, x, u, lin.reshape(-1), red)

    def scatter_function(self, inputs, axis, reduction):
        """Compiled graphs: (data, indices, updates) arrays -> scattered()'s array, with
        the axis and reduction of a validated call resolved; constant indices are
        checked once (see constant_memo), others on every call."""
        if len(inputs) != 3 or any(t.__class__ is not Tensor for t in inputs):
            return None
        x = inputs[0]
        ax, red = norm_axis(self, axis, x.ndim), _reduction(self, reduction)
        xp, size = xp_for(self, x), x.shape[ax]
        offsets = element_offsets(xp, x.shape, inputs[1].shape, ax)
        index = constant_memo(lambda idx: checked_indices(self, xp, on(xp, idx), size))
        dt, wrap, scattered = x.data_type, Tensor.wrap, self.scattered_at
        return lambda data, indices, updates: scattered(wrap(data, dt), index(indices), wrap(updates, dt),
                                                        ax, red, offsets).array


def element_offsets(xp, shape: tuple, idx_shape: tuple, ax: int):
    """(base, stride) such that idx * stride + base (base None: 0) are the flat offsets,
    into a C-ordered array of shape, of the elements ScatterElements' indices of shape
    idx_shape address along axis ax: base sums the other axes' coordinate * stride,
    broadcast to idx_shape.  It depends on the shapes only."""
    strides = np.cumprod((tuple(shape[1:]) + (1,))[::-1])[::-1]
    base = None
    for d in range(len(shape)):
        if d == ax:
            continue
        view = [1] * len(shape)
        view[d] = idx_shape[d]
        term = xp.arange(idx_shape[d], dtype=xp.int64).reshape(view) * int(strides[d])
        base = term if base is None else base + term
    if base is not None:
        base = xp.ascontiguousarray(xp.broadcast_to(base, idx_shape))
    return base, int(strides[ax])


@register()
class ScatterElements(_ScatterElementsBase):
    """data[indices[i][j]][j] = updates[i][j] (axis 0) with reduction none/add/mul/max/min.
    Repeated indices with 'none': the last in index order wins (see the module doc)."""

    def __call__(self, data, indices, updates, axis=0, reduction="none"):
        return self.scatter(data, indices, updates, axis, reduction)

    def array_function(self, inputs, attrs):
        return self.scatter_function(inputs, attrs.get("axis", 0), attrs.get("reduction", "none"))


@register()
class Scatter(_ScatterElementsBase):
    """The deprecated name of ScatterElements (no reduction)."""

    def __call__(self, data, indices, updates, axis=0):
        return self.scatter(data, indices, updates, axis, "none")

    def array_function(self, inputs, attrs):
        return self.scatter_function(inputs, attrs.get("axis", 0), "none")


@register()
class ScatterND(KernelBase):
    """data[indices[m]] (a k-tuple addressing an element or a slice) = updates[m], with
    reduction none/add/mul/max/min.  Repeated tuples with 'none': the last wins."""

    def __call__(self, data, indices, updates, reduction="none"):
        x = self.tensor(data, "data")
        i = self.tensor(indices, "indices")
        u = self.tensor(updates, "updates")
        self.check_inputs(x, i, u)
        named = {"data": x, "indices": i, "updates": u}
        red = _reduction(self, reduction, **named)
        if x.ndim < 1 or i.ndim < 1:
            raise self.error("data and indices must have rank >= 1", **named)
        k = i.shape[-1]
        if not 1 <= k <= x.ndim:
            raise self.error(f"indices.shape[-1] = {k} must be in [1, {x.ndim}]", **named)
        want = i.shape[:-1] + x.shape[k:]
        if u.shape != want:
            raise self.error(f"updates must have shape {list(want)}", **named)
        if u.data_type != x.data_type:
            raise self.type_error("updates must have data's element type", **named)
        return self.scattered(x, i.array, u, red, **named)

    def scattered(self, x: Tensor, idx, u: Tensor, red: str, **named) -> Tensor:
        """The result for validated inputs (idx: the indices' array; named: for errors)."""
        xp = xp_for(self, x)
        k = idx.shape[-1]
        m = product(idx.shape[:-1])
        s = product(x.shape[k:])
        if m == 0 or s == 0:
            return Tensor.wrap(x.array.copy(), x.data_type)
        rows = nd_linear_index(self, xp, on(xp, idx).reshape(m, k), x.shape[:k], **named)
        if red == "none":
            out = copy_array(x.array)  # host: a threaded copy
            target, values = out.reshape(-1, s), u.array.reshape(m, s)
            _row_assigner(self, xp, target, rows, values)(target, rows, values)
            return Tensor.wrap(out, x.data_type)
        return _reduce(self, xp, x, u, _flat_elements(xp, rows, s), red)

    def array_function(self, inputs, attrs):
        """Compiled graphs: (data, indices, updates) arrays -> scattered()'s array, for
        the recorded shapes: constant indices are checked and linearised once, with the
        row assignment chosen for them (see constant_memo); others on every call."""
        if len(inputs) != 3 or any(t.__class__ is not Tensor for t in inputs):
            return None
        red = _reduction(self, attrs.get("reduction", "none"))
        x, i = inputs[0], inputs[1]
        dt, wrap, scattered = x.data_type, Tensor.wrap, self.scattered
        k, m = i.shape[-1], product(i.shape[:-1])
        s = product(x.shape[k:])
        if m == 0 or s == 0:
            return lambda data, indices, updates: scattered(wrap(data, dt), indices, wrap(updates, dt), red).array
        xp, dims = xp_for(self, x), x.shape[:k]

        def rows_of(idx):
            return nd_linear_index(self, xp, on(xp, idx).reshape(m, k), dims)

        if red != "none":
            flat_of = constant_memo(lambda idx: _flat_elements(xp, rows_of(idx), s))
            return lambda data, indices, updates: _reduce(self, xp, wrap(data, dt), wrap(updates, dt),
                                                          flat_of(indices), red).array

        def plan(idx, target, values):
            rows = rows_of(idx)
            return rows, _row_assigner(self, xp, target, rows, values)

        planned = constant_memo(plan)

        def scatter_rows(data, indices, updates):
            out = copy_array(data)
            target, values = out.reshape(-1, s), updates.reshape(m, s)
            rows, assign = planned(indices, target, values)
            assign(target, rows, values)
            return out

        return scatter_rows


@register()
class TensorScatter(KernelBase):
    """KV-cache update: present = past_cache with update written along ``axis`` at
    write_indices[b] (0 when absent) for every batch entry b.  mode 'linear' requires
    write_indices[b] + sequence_length <= max_sequence_length; 'circular' wraps around."""

    def __call__(self, past_cache, update, write_indices=None, mode="linear", axis=-2):
        p = self.tensor(past_cache, "past_cache")
        u = self.tensor(update, "update")
        w = self.tensor(write_indices, "write_indices", optional=True)
        self.check_inputs(p, u, w)
        named = {"past_cache": p, "update": u}
        mode = mode.decode() if isinstance(mode, bytes) else str(mode)
        if mode not in ("linear", "circular"):
            raise self.error(f"mode must be 'linear' or 'circular', got {mode!r}", **named)
        if p.ndim < 2 or u.ndim != p.ndim:
            raise self.error("past_cache and update must have the same rank >= 2", **named)
        ax = norm_axis(self, axis, p.ndim, **named)
        if ax == 0:
            raise self.error("axis must not be the batch axis 0", **named)
        if any(a != b for d, (a, b) in enumerate(zip(p.shape, u.shape)) if d != ax):
            raise self.error(f"update must match past_cache outside axis {ax}", **named)
        if u.data_type != p.data_type:
            raise self.type_error("update must have past_cache's element type", **named)
        B, max_len, L = p.shape[0], p.shape[ax], u.shape[ax]
        if L > max_len:
            raise self.error(f"sequence_length {L} exceeds max_sequence_length {max_len}", **named)
        starts = [0] * B if w.is_absent else host_ints(self, w, "write_indices")
        if len(starts) != B:
            raise self.error(f"write_indices must have {B} entries", write_indices=w, **named)
        if any(s < 0 for s in starts):
            raise self.error(f"write_indices must be non-negative, got {starts}", write_indices=w, **named)
        if mode == "linear" and any(s + L > max_len for s in starts):
            raise self.error(f"write_indices {starts} + sequence_length {L} run past "
                             f"max_sequence_length {max_len}", write_indices=w, **named)
        xp = xp_for(self, p)
        out = copy_array(p.array)
        if L == 0 or B == 0:
            return Tensor.wrap(out, p.data_type)
        pos = np.asarray(starts, dtype=np.int64)[:, None] + np.arange(L)[None, :]
        if mode == "circular":
            pos = pos % max_len
        view = xp.moveaxis(out, ax, 1)
        view[xp.arange(B)[:, None], xp.asarray(pos)] = xp.moveaxis(u.array, ax, 1)
        return Tensor.wrap(out, p.data_type)
