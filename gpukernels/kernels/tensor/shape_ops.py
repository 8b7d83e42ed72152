"""Shape and layout operators: Reshape, Shape, Size, Squeeze, Unsqueeze, Expand, Tile,
Transpose, Concat, Split, Slice, DepthToSpace, SpaceToDepth, Trilu, CenterCropPad.

Every output is a new array or a view of the input; kernels never write into an input,
so views are safe.  STRING tensors are handled on the host.
"""

from __future__ import annotations

import numpy as np

from ...dtypes import DataType
from ...limits import check_allocation
from ...tensor import Tensor
from ..base import KernelBase, register
from ._common import deliver, host_ints, norm_axes, norm_axis, permuted_copier, permuted_copy, product, xp_for
from .indexing import is_frozen

INT64_MAX = 2 ** 63 - 1


_UNSEEN = object()  # values_guarded: no constant found equal yet


def values_guarded(op: str, guards: dict, apply):
    """An array function (data, *given) -> apply(data) for the recorded call's host
    values of the inputs after data ({name: values}, in input order: shape, axes,
    starts...): the output's shape depends on them, not only on the inputs' shapes, so
    other values raise and the runtime redoes the node through the kernel.  Inputs given
    as attributes (older opsets) are not passed.  A constant (frozen, see is_frozen)
    found equal is not read again.  A recorded value None stands for an omitted input
    (None among the arguments; see KernelBase.omitted_inputs_as_none)."""
    names, recorded = tuple(guards), tuple(guards.values())
    # per input: the constant last found equal (None for an omitted one: passes as is)
    seen = [None if r is None else _UNSEEN for r in recorded]

    def check(j, got):
        if got is None or recorded[j] is None or got.tolist() != recorded[j]:
            shown = None if got is None else got.tolist()
            raise ValueError(f"{op}: {names[j]} {shown} is not the compiled {recorded[j]}")
        if is_frozen(got):
            seen[j] = got

    if len(names) == 1:
        def fn(data, given):
            if given is not seen[0]:
                check(0, given)
            return apply(data)
        return fn

    def fn(data, *given):
        for j, got in enumerate(given):
            if got is not seen[j]:
                check(j, got)
        return apply(data)

    return fn


def _all_tensors(inputs) -> bool:
    return all(t.__class__ is Tensor for t in inputs)


def _zero_fill(t: Tensor, xp, shape):
    """An array of shape filled with t's type's zero (storage dtype; '' for STRING)."""
    if t.data_type == DataType.STRING:
        return np.full(shape, "", dtype=object)
    return xp.zeros(shape, dtype=t.array.dtype)


@register()
class Reshape(KernelBase):
    """Reshape(data, shape, allowzero=0); opset 1-4 take the ``shape`` attribute.
    0 copies the input's dimension (a literal 0 with allowzero=1), -1 is inferred."""

    def __call__(self, data, shape=None, allowzero=0, consumed_inputs=None):
        x = self.tensor(data, "data")
        if self.since_version < 5:
            if shape is None:
                raise self.error("attribute 'shape' is required", data=x)
            dims = [int(d) for d in (shape.numpy().reshape(-1) if isinstance(shape, Tensor) else shape)]
            self.check_inputs(x)
            s = None
        else:
            s = self.host_tensor(shape, "shape")
            self.check_inputs(x, s)
            if s.ndim != 1:
                raise self.error("'shape' must be 1-D", data=x, shape=s)
            dims = host_ints(self, s, "shape")
        out = self.output_shape(x, dims, bool(allowzero), shape=s)
        return Tensor.wrap(x.array.reshape(out), x.data_type)

    def array_function(self, inputs, attrs):
        """Opset 5+: data.reshape(out) for the shape values of the recorded call.  The
        output's shape depends on those values, not only on the input's shape: other
        values raise, so that the runtime redoes the node through the kernel."""
        if self.since_version < 5 or len(inputs) != 2 or not all(t.__class__ is Tensor for t in inputs):
            return None
        x, s = inputs
        dims = host_ints(self, s, "shape")
        out = self.output_shape(x, dims, bool(attrs.get("allowzero", 0)), shape=s)
        return values_guarded("Reshape", {"shape": dims}, lambda data: data.reshape(out))

    def output_shape(self, x: Tensor, dims: list[int], allowzero: bool, **inputs) -> tuple:
        if allowzero and 0 in dims and -1 in dims:
            raise self.error(f"shape {dims} has both 0 and -1 with allowzero=1", data=x, **inputs)
        if dims.count(-1) > 1:
            raise self.error(f"shape {dims} has more than one -1", data=x, **inputs)
        out = []
        for i, d in enumerate(dims):
            if d == 0 and not allowzero:
                if i >= x.ndim:
                    raise self.error(f"shape {dims}: 0 at position {i} copies a dimension the "
                                     f"rank-{x.ndim} input does not have", data=x, **inputs)
                d = x.shape[i]
            elif d < -1:
                raise self.error(f"shape {dims} has a negative dimension {d}", data=x, **inputs)
            out.append(d)
        if -1 in out:
            known = product(d for d in out if d != -1)
            if known == 0 or x.size % known:
                raise self.error(f"cannot infer -1 in shape {dims} for {x.size} elements", data=x, **inputs)
            out[out.index(-1)] = x.size // known
        if product(out) != x.size:
            raise self.error(f"cannot reshape {x.size} elements into shape {out} (from {dims})",
                             data=x, **inputs)
        return tuple(out)


@register()
class Shape(KernelBase):
    """int64 1-D shape of data; opset 15+ slice it with start/end (clamped to [0, rank])."""

    def __call__(self, data, start=0, end=None):
        x = self.tensor(data, "data")
        self.check_inputs(x)
        r = x.ndim
        start = int(start or 0)
        start = min(max(start + r if start < 0 else start, 0), r)
        if end is None:
            end = r
        end = int(end)
        end = min(max(end + r if end < 0 else end, 0), r)
        dims = np.array(x.shape[start:end] if start < end else (), dtype=np.int64)
        return Tensor.wrap(self.xp.asarray(dims), DataType.INT64)


@register()
class Size(KernelBase):
    """int64 scalar: the number of elements."""

    def __call__(self, data):
        x = self.tensor(data, "data")
        self.check_inputs(x)
        return Tensor.wrap(self.xp.asarray(np.int64(x.size)), DataType.INT64)


@register()
class Squeeze(KernelBase):
    """Removes the listed axes (each must have size 1), or every size-1 axis when none
    are given.  axes is an attribute before opset 13, an input from 13 on."""

    def __call__(self, data, axes=None):
        x = self.tensor(data, "data")
        if self.since_version >= 13:
            a = self.host_tensor(axes, "axes", optional=True)
            self.check_inputs(x, a)
            ax = None if a.is_absent else host_ints(self, a, "axes")
        else:
            self.check_inputs(x)
            ax = None if axes is None else [int(v) for v in axes]
        return Tensor.wrap(x.array.reshape(self.output_shape(x, ax)), x.data_type)

    def output_shape(self, x: Tensor, ax) -> tuple:
        """x's shape without the axes ax (None: every size-1 axis)."""
        if ax is None:
            ax = [i for i, d in enumerate(x.shape) if d == 1]
        else:
            ax = norm_axes(self, ax, x.ndim, data=x)
            bad = [a for a in ax if x.shape[a] != 1]
            if bad:
                raise self.error(f"cannot squeeze axes {bad}: their size is not 1", data=x)
        return tuple(d for i, d in enumerate(x.shape) if i not in ax)

    def array_function(self, inputs, attrs):
        """data.reshape(out) for the recorded axes (guarded: see values_guarded)."""
        if not inputs or not _all_tensors(inputs) or inputs[0].data_type == DataType.STRING:
            return None
        x, guards = inputs[0], {}
        if self.since_version >= 13:
            if len(inputs) > 1 and inputs[1].is_absent:
                return None  # the runtime passes no array for an absent input
            ax = host_ints(self, inputs[1], "axes") if len(inputs) > 1 else None
            if ax is not None:
                guards["axes"] = ax
        else:
            ax = None if attrs.get("axes") is None else [int(v) for v in attrs["axes"]]
        out = self.output_shape(x, ax)
        return values_guarded("Squeeze", guards, lambda data: data.reshape(out))


@register()
class Unsqueeze(KernelBase):
    """Inserts size-1 axes at the listed output positions (negative counts from the
    output's end).  axes is an attribute before opset 13, an input from 13 on."""

    def __call__(self, data, axes=None):
        x = self.tensor(data, "data")
        if self.since_version >= 13:
            a = self.host_tensor(axes, "axes")
            self.check_inputs(x, a)
            ax = host_ints(self, a, "axes")
        else:
            self.check_inputs(x)
            if axes is None:
                raise self.error("attribute 'axes' is required", data=x)
            ax = [int(v) for v in axes]
        return Tensor.wrap(x.array.reshape(self.output_shape(x, ax)), x.data_type)

    def output_shape(self, x: Tensor, ax: list) -> tuple:
        """x's shape with size-1 axes at the output positions ax."""
        r = x.ndim + len(ax)
        ax = norm_axes(self, ax, r, data=x)
        shape = list(x.shape)
        for a in sorted(ax):
            shape.insert(a, 1)
        return tuple(shape)

    def array_function(self, inputs, attrs):
        """data.reshape(out) for the recorded axes (guarded: see values_guarded)."""
        if not inputs or not _all_tensors(inputs) or inputs[0].data_type == DataType.STRING:
            return None
        if self.since_version >= 13:
            if len(inputs) != 2:
                return None
            ax = host_ints(self, inputs[1], "axes")
            guards = {"axes": ax}
        elif attrs.get("axes") is None:
            return None
        else:
            ax, guards = [int(v) for v in attrs["axes"]], {}
        out = self.output_shape(inputs[0], ax)
        return values_guarded("Unsqueeze", guards, lambda data: data.reshape(out))


def broadcast_shapes(kernel, a, b, **inputs) -> tuple:
    ra, rb = len(a), len(b)
    r = max(ra, rb)
    a = (1,) * (r - ra) + tuple(a)
    b = (1,) * (r - rb) + tuple(b)
    out = []
    for da, db in zip(a, b):
        if da == db or db == 1:
            out.append(da)
        elif da == 1:
            out.append(db)
        else:
            raise kernel.error(f"shapes {list(a)} and {list(b)} do not broadcast", **inputs)
    return tuple(out)


@register()
class Expand(KernelBase):
    """Broadcast input to shape (bidirectionally, as numpy: the result may be larger than
    shape)."""

    def __call__(self, input, shape):
        x = self.tensor(input, "input")
        s = self.host_tensor(shape, "shape")
        self.check_inputs(x, s)
        if s.ndim != 1:
            raise self.error("'shape' must be 1-D", input=x, shape=s)
        dims = host_ints(self, s, "shape")
        out = self.output_shape(x, dims, shape=s)
        return Tensor.wrap(_expanded(xp_for(self, x), x.array, out), x.data_type)

    def output_shape(self, x: Tensor, dims: list, **inputs) -> tuple:
        """The checked broadcast of x's shape and dims (within max_tensor_bytes)."""
        if any(d < 0 for d in dims):
            raise self.error(f"negative dimension in shape {dims}", input=x, **inputs)
        out = broadcast_shapes(self, x.shape, dims, input=x, **inputs)
        check_allocation(self, out, x.array.dtype)
        return out

    def array_function(self, inputs, attrs):
        """The contiguous broadcast to the recorded shape values (guarded: see
        values_guarded)."""
        if len(inputs) != 2 or not _all_tensors(inputs) or inputs[0].data_type == DataType.STRING:
            return None
        x, s = inputs
        dims = host_ints(self, s, "shape")
        out = self.output_shape(x, dims, shape=s)
        xp = xp_for(self, x)
        return values_guarded("Expand", {"shape": dims}, lambda data: _expanded(xp, data, out))


def _expanded(xp, array, shape):
    """A contiguous copy of array broadcast to shape; where shape holds as many elements
    as array (only size-1 axes differ), a read-only view of a C-contiguous host array,
    as ascontiguousarray gives for its broadcast (read-only: a view must never be
    written through)."""
    if product(shape) != array.size:
        out = xp.empty(shape, dtype=array.dtype)
        xp.copyto(out, array)
        return out
    if array.__class__ is np.ndarray and array.flags.c_contiguous:
        view = array.reshape(shape)
        view.flags.writeable = False
        return view
    return xp.ascontiguousarray(xp.broadcast_to(array, shape)).reshape(shape)  # (ascontiguousarray: ndim >= 1)


@register()
class Tile(KernelBase):
    """Tile(input, repeats): repeat along every axis.  Opset 1: Tile(input, tiles, axis)
    repeats ``tiles`` times along one axis."""

    def __call__(self, input, repeats=None, axis=None):
        x = self.tensor(input, "input")
        xp = xp_for(self, x)
        if self.since_version < 6:
            t = self.tensor(repeats, "tiles")
            a = self.tensor(axis, "axis")
            n = host_ints(self, t, "tiles")
            ax = host_ints(self, a, "axis")
            if len(n) != 1 or len(ax) != 1:
                raise self.error("'tiles' and 'axis' must hold one value each", input=x)
            reps = [1] * x.ndim
            reps[norm_axis(self, ax[0], x.ndim, input=x)] = n[0]
        else:
            r = self.host_tensor(repeats, "repeats")
            self.check_inputs(x, r)
            if r.ndim != 1:
                raise self.error("'repeats' must be 1-D", input=x, repeats=r)
            reps = host_ints(self, r, "repeats")
            if len(reps) != x.ndim:
                raise self.error(f"'repeats' has {len(reps)} values for a rank-{x.ndim} input",
                                 input=x, repeats=r)
        if any(v < 0 for v in reps):
            raise self.error(f"negative repeats {reps}", input=x)
        if x.ndim == 0:
            return Tensor.wrap(x.array.copy(), x.data_type)
        check_allocation(self, [d * r for d, r in zip(x.shape, reps)], x.array.dtype)
        return Tensor.wrap(xp.tile(x.array, reps), x.data_type)


@register()
class Transpose(KernelBase):
    """Permute axes (default: reverse them).  The output is a new contiguous array (a
    cache-tiled copy on the host, see _common.permuted_copy), or written into ``out=``."""

    def __call__(self, data, perm=None, out=None):
        x = self.tensor(data, "data")
        self.check_inputs(x)
        p = self._perm(x, perm)
        xp = xp_for(self, x)
        view = x.array.transpose(p)
        if out is not None:
            return deliver(self, Tensor.wrap(view, x.data_type), out)
        return Tensor.wrap(permuted_copy(self, xp, view), x.data_type)

    def _perm(self, x: Tensor, perm) -> list[int]:
        """The checked permutation, negative axes resolved (default: reversed axes)."""
        r = x.ndim
        if perm is None:
            return list(range(r))[::-1]
        p = [int(v) for v in perm]
        q = [v + r if v < 0 else v for v in p]
        if len(p) != r or sorted(q) != list(range(r)):
            raise self.error(f"perm {p} is not a permutation of {r} axes", data=x)
        return q

    def array_function(self, inputs, attrs):
        """Non-string data: the permuted copy with the permutation resolved (the plain
        copy bound once where no specialisation applies: _common.permuted_copier)."""
        if len(inputs) != 1 or inputs[0].__class__ is not Tensor or inputs[0].data_type == DataType.STRING:
            return None
        x = inputs[0]
        return permuted_copier(self, xp_for(self, x), x.shape, x.array.dtype, self._perm(x, attrs.get("perm")))


@register()
class Concat(KernelBase):
    """Concatenate along axis (default 1 in opset 1, required from 4).  Inputs with a
    zero-size concatenation axis take part normally; ``out=`` writes into a buffer."""

    def __call__(self, *inputs, axis=None, out=None):
        if not inputs:
            raise self.error("needs at least one input")
        ts = [self.tensor(v, f"inputs[{i}]") for i, v in enumerate(inputs)]
        self.check_inputs(*ts)
        if axis is None:
            if self.since_version >= 4:
                raise self.error("attribute 'axis' is required")
            axis = 1
        r = ts[0].ndim
        named = {f"inputs[{i}]": t for i, t in enumerate(ts)}
        if r == 0:
            raise self.error("cannot concatenate scalars", **named)
        ax = norm_axis(self, axis, r, **named)
        for t in ts:
            if t.ndim != r or any(a != b for i, (a, b) in enumerate(zip(t.shape, ts[0].shape)) if i != ax):
                raise self.error(f"shapes differ outside axis {ax}", **named)
            if t.data_type != ts[0].data_type:
                raise self.type_error("inputs have different element types", **named)
        xp = xp_for(self, ts[0])
        arrays = [t.array for t in ts]
        if out is not None:
            shape = list(ts[0].shape)
            shape[ax] = sum(t.shape[ax] for t in ts)
            target = out.array if isinstance(out, Tensor) else out
            if tuple(target.shape) != tuple(shape) or target.dtype != arrays[0].dtype:
                raise self.error(f"out= must be {arrays[0].dtype}{shape}, got {target.dtype}{list(target.shape)}",
                                 **named)
            xp.concatenate(arrays, axis=ax, out=target)
            return out if isinstance(out, Tensor) else Tensor.wrap(target, ts[0].data_type)
        return Tensor.wrap(xp.concatenate(arrays, axis=ax), ts[0].data_type)

    def array_function(self, inputs, attrs):
        """Non-string inputs (opset 4+: axis given): xp.concatenate along the resolved axis."""
        if (not inputs or "axis" not in attrs or any(t.__class__ is not Tensor for t in inputs)
                or inputs[0].data_type == DataType.STRING or inputs[0].ndim == 0):
            return None
        ax = norm_axis(self, attrs["axis"], inputs[0].ndim)
        xp = xp_for(self, inputs[0])
        return lambda *arrays: xp.concatenate(arrays, axis=ax)


@register()
class Split(KernelBase):
    """Split along axis into parts of the sizes in ``split`` (an attribute before opset
    13, an input from 13; either in opset 1), or into equal parts.  Equal parts: the
    number of outputs comes from ``num_outputs`` (opset 18; also accepted as a keyword
    in earlier opsets for direct calls) or from the node's output count; before 18 the
    axis must divide evenly, from 18 the last part is smaller (ceil-sized parts).
    Returns a list of Tensors."""

    def __call__(self, input, split=None, axis=0, num_outputs=None):
        x = self.tensor(input, "input")
        sizes = None
        if isinstance(split, (list, tuple)) and self.since_version < 13:
            sizes = [int(v) for v in split]
            self.check_inputs(x)
        elif split is not None:
            s = self.host_tensor(split, "split", optional=True)
            self.check_inputs(x, s) if self.since_version >= 13 else self.check_inputs(x)
            if not s.is_absent:
                sizes = host_ints(self, s, "split")
        else:
            self.check_inputs(x)
        if x.ndim == 0:
            raise self.error("cannot split a scalar", input=x)
        ax = norm_axis(self, axis, x.ndim, input=x)
        sizes = self.part_sizes(x, ax, sizes, num_outputs)
        return [Tensor.wrap(part, x.data_type) for part in _parts(xp_for(self, x), x.array, ax, sizes)]

    def part_sizes(self, x: Tensor, ax: int, sizes, num_outputs) -> list:
        """The checked sizes of the parts: the given sizes, or equal parts (see above)."""
        dim = x.shape[ax]
        n_out = len(self.requested_outputs) if self.requested_outputs else None
        if sizes is not None:
            if num_outputs is not None:
                raise self.error("give either the 'split' input or 'num_outputs', not both", input=x)
            if any(v < 0 for v in sizes) or sum(sizes) != dim:
                raise self.error(f"split sizes {sizes} must be non-negative and sum to {dim}", input=x)
        else:
            n = num_outputs if num_outputs is not None else n_out
            if n is None:
                raise self.error("the number of outputs is unknown: pass 'split' or num_outputs=", input=x)
            n = int(n)
            if n < 1:
                raise self.error(f"num_outputs must be positive, got {n}", input=x)
            if self.since_version >= 18 and num_outputs is not None:
                if n > dim and dim > 0:
                    raise self.error(f"cannot split {dim} elements into {n} non-empty parts", input=x)
                chunk = -(-dim // n)
                sizes = [chunk] * (n - 1) + [dim - chunk * (n - 1)]
                if sizes[-1] < 0:
                    raise self.error(f"cannot split {dim} elements into {n} parts of size {chunk}", input=x)
            else:
                if dim % n:
                    raise self.error(f"axis of size {dim} does not split evenly into {n} parts", input=x)
                sizes = [dim // n] * n
        if n_out is not None and len(sizes) != n_out:
            raise self.error(f"{len(sizes)} parts for a node with {n_out} outputs", input=x)
        return sizes

    def array_function(self, inputs, attrs):
        """Non-string input: the parts for the recorded sizes, a tuple of arrays (one
        per output; a split input guarded: see values_guarded)."""
        if (not inputs or not _all_tensors(inputs) or inputs[0].data_type == DataType.STRING
                or any(t.is_absent for t in inputs[1:])):
            return None
        x, guards = inputs[0], {}
        if len(inputs) > 1:
            given = guards["split"] = host_ints(self, inputs[1], "split")
        else:
            given = None if attrs.get("split") is None else [int(v) for v in attrs["split"]]
        ax = norm_axis(self, attrs.get("axis", 0), x.ndim)
        sizes = self.part_sizes(x, ax, given, attrs.get("num_outputs"))
        xp = xp_for(self, x)
        indices = _part_indices(x.ndim, ax, sizes)  # once: the shapes are fixed
        return values_guarded("Split", guards, lambda data: _take_parts(xp, data, indices))


def _part_indices(ndim: int, ax: int, sizes: list) -> list:
    """The index tuples of the consecutive parts of the given sizes along ax."""
    indices, start = [], 0
    for size in sizes:
        index = [slice(None)] * ndim
        index[ax] = slice(start, start + size)
        indices.append(tuple(index))
        start += size
    return indices


def _take_parts(xp, array, indices) -> tuple:
    """array[index] for each index, C-contiguous (a copy unless the part already is)."""
    return tuple(xp.ascontiguousarray(array[index]) for index in indices)


def _parts(xp, array, ax: int, sizes: list) -> tuple:
    """array's consecutive parts of the given sizes along ax, C-contiguous (_take_parts)."""
    return _take_parts(xp, array, _part_indices(array.ndim, ax, sizes))


def slice_bounds(dim: int, start: int, end: int, step: int) -> slice:
    """The Python slice for ONNX's (start, end, step) on an axis of size dim."""
    if start < 0:
        start += dim
    if end < 0:
        end += dim
    if step > 0:
        start = min(max(start, 0), dim)
        end = min(max(end, 0), dim)
        return slice(start, end, step)
    start = min(max(start, 0), dim - 1)
    end = min(max(end, -1), dim - 1)
    return slice(start, None if end < 0 else end, step)


@register()
class Slice(KernelBase):
    """Slice(data, starts, ends, axes, steps) (attributes starts/ends/axes in opset 1).
    Bounds are clamped as the spec says; a zero step, a repeated axis or lengths that
    differ raise."""

    def __call__(self, data, starts=None, ends=None, axes=None, steps=None):
        x = self.tensor(data, "data")
        if self.since_version < 10:
            self.check_inputs(x)
            if starts is None or ends is None:
                raise self.error("attributes 'starts' and 'ends' are required", data=x)
            st, en = [int(v) for v in starts], [int(v) for v in ends]
            ax = None if axes is None else [int(v) for v in axes]
            sp = None
            named = {}
        else:
            ts = self.host_tensor(starts, "starts")
            te = self.host_tensor(ends, "ends")
            ta = self.host_tensor(axes, "axes", optional=True)
            tp = self.host_tensor(steps, "steps", optional=True)
            self.check_inputs(x, ts, te, ta, tp)
            named = {"starts": ts, "ends": te}
            st, en = host_ints(self, ts, "starts"), host_ints(self, te, "ends")
            ax = None if ta.is_absent else host_ints(self, ta, "axes")
            sp = None if tp.is_absent else host_ints(self, tp, "steps")
        return Tensor.wrap(x.array[self.index(x, st, en, ax, sp, **named)], x.data_type)

    def index(self, x: Tensor, st: list, en: list, ax, sp, **named) -> tuple:
        """The checked index tuple for starts, ends, axes and steps (None: defaults)."""
        if len(st) != len(en):
            raise self.error(f"starts ({len(st)}) and ends ({len(en)}) differ in length", data=x, **named)
        if ax is None:
            ax = list(range(len(st)))
        if sp is None:
            sp = [1] * len(st)
        if len(ax) != len(st) or len(sp) != len(st):
            raise self.error("starts, ends, axes and steps must have one length", data=x, **named)
        ax = norm_axes(self, ax, x.ndim, data=x)
        index = [slice(None)] * x.ndim
        for a, s, e, p in zip(ax, st, en, sp):
            if p == 0:
                raise self.error("steps must not be 0", data=x, **named)
            index[a] = slice_bounds(x.shape[a], s, e, p)
        return tuple(index)

    def array_function(self, inputs, attrs):
        """Opset 10+: data[index] for the recorded starts/ends/axes/steps values (guarded:
        see values_guarded); opset 1-9: for the attributes."""
        if not inputs or not _all_tensors(inputs) or inputs[0].data_type == DataType.STRING:
            return None
        x = inputs[0]
        if self.since_version < 10:
            if attrs.get("starts") is None or attrs.get("ends") is None:
                return None
            guards = {}
            values = [[int(v) for v in attrs[k]] if attrs.get(k) is not None else None
                      for k in ("starts", "ends", "axes")] + [None]
        else:
            if any(t.is_absent for t in inputs[1:]):
                return None  # the runtime passes no array for an absent input
            guards = {name: host_ints(self, t, name)
                      for name, t in zip(("starts", "ends", "axes", "steps"), inputs[1:])}
            values = [guards.get(k) for k in ("starts", "ends", "axes", "steps")]
        index = self.index(x, *values)
        return values_guarded("Slice", guards, lambda data: data[index])


def _blocksize(kernel, blocksize, x):
    if blocksize is None:
        raise kernel.error("attribute 'blocksize' is required", input=x)
    b = int(blocksize)
    if b <= 0:
        raise kernel.error(f"blocksize must be positive, got {b}", input=x)
    if x.ndim != 4:
        raise kernel.error("input must be 4-D [N, C, H, W]", input=x)
    return b


def _mode(kernel, mode, x):
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    if mode not in ("DCR", "CRD"):
        raise kernel.error(f"mode must be 'DCR' or 'CRD', got {mode!r}", input=x)
    return mode


@register()
class DepthToSpace(KernelBase):
    def __call__(self, input, blocksize=None, mode="DCR"):
        x = self.tensor(input, "input")
        self.check_inputs(x)
        b = _blocksize(self, blocksize, x)
        mode = _mode(self, mode, x) if self.since_version >= 11 else "DCR"
        n, c, h, w = x.shape
        if c % (b * b):
            raise self.error(f"channels {c} are not divisible by blocksize^2 = {b * b}", input=x)
        xp = xp_for(self, x)
        if mode == "DCR":
            t = x.array.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
        else:
            t = x.array.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
        return Tensor.wrap(xp.ascontiguousarray(t).reshape(n, c // (b * b), h * b, w * b), x.data_type)


@register()
class SpaceToDepth(KernelBase):
    """The inverse of DepthToSpace; opset 28 adds mode (DCR default, or CRD)."""

    def __call__(self, input, blocksize=None, mode="DCR"):
        x = self.tensor(input, "input")
        self.check_inputs(x)
        b = _blocksize(self, blocksize, x)
        mode = _mode(self, mode, x) if self.since_version >= 28 else "DCR"
        n, c, h, w = x.shape
        if h % b or w % b:
            raise self.error(f"height {h} and width {w} must be divisible by blocksize {b}", input=x)
        xp = xp_for(self, x)
        t = x.array.reshape(n, c, h // b, b, w // b, b)
        t = t.transpose(0, 3, 5, 1, 2, 4) if mode == "DCR" else t.transpose(0, 1, 3, 5, 2, 4)
        return Tensor.wrap(xp.ascontiguousarray(t).reshape(n, c * b * b, h // b, w // b), x.data_type)


@register()
class Trilu(KernelBase):
    """Keep the upper (j - i >= k) or lower (j - i <= k) triangle of the last two axes;
    the rest is zero (False for bool)."""

    def __call__(self, input, k=None, upper=1):
        x = self.tensor(input, "input")
        kt = self.host_tensor(k, "k", optional=True)
        self.check_inputs(x, kt)
        if x.ndim < 2:
            raise self.error("input must have rank >= 2", input=x)
        kk = 0
        if not kt.is_absent:
            vals = host_ints(self, kt, "k")
            if len(vals) != 1:
                raise self.error("'k' must hold one value", input=x, k=kt)
            kk = vals[0]
        xp = xp_for(self, x)
        n, m = x.shape[-2:]
        diff = xp.arange(m)[None, :] - xp.arange(n)[:, None]
        mask = diff >= kk if upper else diff <= kk
        zero = _zero_fill(x, xp, ())
        return Tensor.wrap(xp.where(mask, x.array, zero).astype(x.array.dtype), x.data_type)


@register()
class CenterCropPad(KernelBase):
    """Crop (window start rounded down) or zero-pad (the odd extra element on the right)
    each listed axis to the given size."""

    def __call__(self, input_data, shape, axes=None):
        x = self.tensor(input_data, "input_data")
        s = self.host_tensor(shape, "shape")
        self.check_inputs(x, s)
        dims = host_ints(self, s, "shape")
        ax = list(range(x.ndim)) if axes is None else norm_axes(self, axes, x.ndim, input_data=x)
        if len(dims) != len(ax):
            raise self.error(f"'shape' has {len(dims)} values for {len(ax)} axes", input_data=x, shape=s)
        if any(d < 0 for d in dims):
            raise self.error(f"negative size in shape {dims}", input_data=x, shape=s)
        xp = xp_for(self, x)
        out_shape = list(x.shape)
        src = [slice(None)] * x.ndim
        dst = [slice(None)] * x.ndim
        for a, d in zip(ax, dims):
            cur = x.shape[a]
            out_shape[a] = d
            if d <= cur:
                start = (cur - d) // 2
                src[a] = slice(start, start + d)
            else:
                start = (d - cur) // 2
                dst[a] = slice(start, start + cur)
        check_allocation(self, out_shape, x.array.dtype)
        out = _zero_fill(x, xp, tuple(out_shape))
        out[tuple(dst)] = x.array[tuple(src)]
        return Tensor.wrap(out, x.data_type)
