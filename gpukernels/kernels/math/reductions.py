"""ArgMax, ArgMin and the Reduce* operators.

Axes: an attribute before ReduceSum-13 / the others' opset 18, an optional int64 input
from then on.  No axes (or an empty list) reduces over every axis, unless
noop_with_empty_axes=1 (input-axes versions), when no axis is reduced but the
non-reducing steps still apply (ReduceL1 -> |x|, ReduceL2 -> sqrt(x^2) = |x|,
ReduceSumSquare -> x^2, ReduceLogSum -> log x, ReduceLogSumExp -> log(exp x)).

Empty reductions: Sum, L1, L2, SumSquare give 0; Prod gives 1; Max gives -inf (floats),
the type's minimum (integers) or False; Min gives +inf / the maximum / True; LogSum and
LogSumExp give -inf; Mean gives NaN for floats and 0 for integers (the spec leaves it
undefined).

NaN propagates through every reduction (ReduceMax/ReduceMin like numpy.max).  Half types
accumulate in float32 and round once.  Integer Sum/Prod/SumSquare/L1 wrap around on
overflow; integer Mean truncates toward zero; integer L2/LogSum/LogSumExp are computed in
float64 and converted toward zero.

ArgMax/ArgMin: int64 indices; NaN counts as the extreme value (the first NaN wins, the
last with select_last_index=1), as numpy.argmax/argmin do.  An empty reduced axis raises.
"""

from __future__ import annotations

import numpy as np

from ...dtypes import DataType
from ...host import tuning
from ...host import parallel_ranges
from ...tensor import Tensor
from ..base import KernelBase, register
from ..specialize import specialize
from ..tensor.shape_ops import values_guarded
from ._mathcommon import contiguous, highest, lowest, normalize_axes, normalize_axis

# first version whose axes come as an input
_AXES_INPUT_SINCE = {"ReduceSum": 13}


class _Reduce(KernelBase):
    #: value of a reduction over no elements (None: computed per dtype)
    empty_value = 0

    def __call__(self, data, axes=None, keepdims=1, noop_with_empty_axes=0):
        x = self.tensor(data, "data")
        axes_list = self._axes_list(x, axes, noop_with_empty_axes)
        return self._step(x, self._reduced(x, axes_list, noop_with_empty_axes), keepdims)

    def array_function(self, inputs, attrs):
        """_step on the stored array, with the axes of the recorded call resolved; axes
        given as an input are checked against the recorded values (they decide the
        output's shape), so that other values redo the node through the kernel."""
        if not inputs or any(t.__class__ is not Tensor for t in inputs):
            return None
        x, noop = inputs[0], attrs.get("noop_with_empty_axes", 0)
        axes = inputs[1] if len(inputs) > 1 else attrs.get("axes")
        axes_list = self._axes_list(x, axes, noop)
        red, keepdims, dt = self._reduced(x, axes_list, noop), attrs.get("keepdims", 1), x.data_type

        def apply(data):
            return self._step(Tensor.wrap(data, dt), red, keepdims).array

        if len(inputs) > 1:
            return values_guarded(self.op_type, {"axes": axes_list}, apply)
        return apply

    def _axes_list(self, x: Tensor, axes, noop_with_empty_axes) -> list:
        """The axes (a list of ints, unnormalised) from the input or the attribute, by
        opset version; validates the inputs."""
        input_axes = self.since_version >= _AXES_INPUT_SINCE.get(self.op_type, 18)
        if input_axes:
            at = self.tensor(axes, "axes", optional=True)
            self.check_inputs(x, at)
            if at.is_absent:
                return []
            if at.ndim > 1:
                raise self.error("axes must be a 1-D tensor", data=x, axes=at)
            return [int(v) for v in np.asarray(at.numpy()).reshape(-1)]
        self.check_inputs(x)
        if noop_with_empty_axes:
            raise self.error(f"opset-{self.since_version} {self.op_type} has no attribute "
                             "noop_with_empty_axes", data=x)
        if isinstance(axes, (list, tuple)) or axes is None:
            return list(axes or [])
        return [int(v) for v in np.asarray(self.tensor(axes, "axes").numpy()).reshape(-1)]

    def _reduced(self, x: Tensor, axes_list: list, noop_with_empty_axes):
        """The normalised reduced axes (a tuple), or None: no axis is reduced and only
        the non-reducing steps apply (noop_with_empty_axes=1)."""
        if not axes_list:
            if noop_with_empty_axes:
                return None
            red = tuple(range(x.ndim))
        else:
            red = normalize_axes(self, axes_list, x.ndim, data=x)
        return () if x.ndim == 0 else red

    def _step(self, x: Tensor, red, keepdims) -> Tensor:
        """The compute step after validation: reduce x over the axes red (None: the
        non-reducing steps only)."""
        xc = self.to_compute(x)
        xp = self.xp
        if red is None:
            with np.errstate(all="ignore"):
                y = self.elementwise(xp, xc)
            return self.finish(y, x)
        out_shape = tuple(1 if i in red else d for i, d in enumerate(x.shape)) if keepdims else \
            tuple(d for i, d in enumerate(x.shape) if i not in red)
        count = int(np.prod([x.shape[i] for i in red], dtype=np.int64))
        with np.errstate(all="ignore"):
            if count == 0 and red:
                y = xp.full(out_shape, self.empty(xc.dtype), dtype=self.out_dtype(xc.dtype))
            elif not red:
                y = self.elementwise(xp, xc)
            else:
                y = self._reduce_rows(xp, xc, red, count)
                if y.shape != out_shape:
                    y = y.reshape(out_shape)
        return self.finish(y, x)

    def _reduce_rows(self, xp, x, red, count):
        """self.reduce over the axes red (a specialisation may split it over threads)."""
        fast = self.specialized("Reduce.rows", self, x, red, count)
        if fast is not None:
            return fast(self, x, red, count)
        return self.reduce(xp, x, red, count)

    def finish(self, y, x):
        if y.dtype.kind == "f" and self.to_compute(x).dtype.kind in "iub":
            y = _float_to_int(self.xp, y, self.to_compute(x).dtype)
        return self.from_compute(contiguous(self.xp, y), x.data_type)

    def out_dtype(self, dtype):
        return dtype

    def empty(self, dtype):
        return self.empty_value

    def elementwise(self, xp, x):
        """The non-reducing steps applied to each element (noop_with_empty_axes=1)."""
        return x.copy()

    def reduce(self, xp, x, axes, count):  # pragma: no cover - abstract
        raise NotImplementedError


def _float_to_int(xp, y, dtype):
    y = xp.trunc(y)
    if dtype == np.bool_:
        return y != 0
    if dtype == np.uint64:
        return y.astype(np.uint64)
    return y.astype(np.int64).astype(dtype)


def _int_acc(x):
    """Keep integer accumulation in the input type (wrap-around)."""
    return x.dtype if x.dtype.kind in "iu" else None


@register()
class ReduceSum(_Reduce):
    def reduce(self, xp, x, axes, count):
        return xp.sum(x, axis=axes, keepdims=True, dtype=_int_acc(x))


@register()
class ReduceMean(_Reduce):
    def empty(self, dtype):
        return np.nan if dtype.kind == "f" else 0

    def reduce(self, xp, x, axes, count):
        if x.dtype.kind in "iu":
            acc = np.uint64 if x.dtype.kind == "u" else np.int64
            s = xp.sum(x, axis=axes, keepdims=True, dtype=acc)
            if x.dtype.kind == "u":
                return (s // acc(count)).astype(x.dtype)
            q = xp.abs(s) // count
            return xp.where(s < 0, -q, q).astype(x.dtype)
        return xp.mean(x, axis=axes, keepdims=True)


@register()
class ReduceProd(_Reduce):
    empty_value = 1

    def reduce(self, xp, x, axes, count):
        return xp.prod(x, axis=axes, keepdims=True, dtype=_int_acc(x))


@register()
class ReduceMax(_Reduce):
    def empty(self, dtype):
        return lowest(dtype)

    def reduce(self, xp, x, axes, count):
        return xp.max(x, axis=axes, keepdims=True)


@register()
class ReduceMin(_Reduce):
    def empty(self, dtype):
        return highest(dtype)

    def reduce(self, xp, x, axes, count):
        return xp.min(x, axis=axes, keepdims=True)


@register()
class ReduceL1(_Reduce):
    def elementwise(self, xp, x):
        return xp.abs(x)

    def reduce(self, xp, x, axes, count):
        return xp.sum(xp.abs(x), axis=axes, keepdims=True, dtype=_int_acc(x))


@register()
class ReduceL2(_Reduce):
    def elementwise(self, xp, x):
        return xp.abs(x)

    def reduce(self, xp, x, axes, count):
        if x.dtype.kind in "iu":
            x = x.astype(np.float64)
        return xp.sqrt(xp.sum(x * x, axis=axes, keepdims=True))


@register()
class ReduceSumSquare(_Reduce):
    def elementwise(self, xp, x):
        return x * x

    def reduce(self, xp, x, axes, count):
        return xp.sum(x * x, axis=axes, keepdims=True, dtype=_int_acc(x))


@register()
class ReduceLogSum(_Reduce):
    empty_value = -np.inf

    def out_dtype(self, dtype):
        return dtype if dtype.kind == "f" else np.float64

    def elementwise(self, xp, x):
        return xp.log(x.astype(np.float64) if x.dtype.kind in "iu" else x)

    def reduce(self, xp, x, axes, count):
        if x.dtype.kind in "iu":
            x = x.astype(np.float64)
        return xp.log(xp.sum(x, axis=axes, keepdims=True))


@register()
class ReduceLogSumExp(_Reduce):
    empty_value = -np.inf

    def out_dtype(self, dtype):
        return dtype if dtype.kind == "f" else np.float64

    def elementwise(self, xp, x):
        x = x.astype(np.float64) if x.dtype.kind in "iu" else x
        return xp.log(xp.exp(x))

    def reduce(self, xp, x, axes, count):
        if x.dtype.kind in "iu":
            x = x.astype(np.float64)
        m = xp.max(x, axis=axes, keepdims=True)
        shift = xp.where(xp.isfinite(m), m, x.dtype.type(0))
        s = xp.sum(xp.exp(x - shift), axis=axes, keepdims=True)
        return xp.log(s) + shift


_REDUCE_OPS = ("ReduceSum", "ReduceMean", "ReduceProd", "ReduceMax", "ReduceMin", "ReduceL1", "ReduceL2",
               "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp")


@specialize("Reduce.rows", device="cpu", ops=_REDUCE_OPS,
            when=lambda kernel, x, red, count: (min(red) > 0 and x.flags.c_contiguous
                                                and x.size >= 2 * tuning.value("reduce.thread_items")))
def _reduce_rows_host(kernel, x, red, count):
    """kernel.reduce, split over the leading non-reduced axes on host threads.  Every
    output element is reduced by the same NumPy loop over the same elements as in one
    call, so the result does not depend on the thread count."""
    lead = min(red)
    outer = int(np.prod(x.shape[:lead], dtype=np.int64))
    rows = x.reshape((outer,) + x.shape[lead:])
    axes = tuple(a - lead + 1 for a in red)
    parts = {}

    def run(lo, hi):
        parts[lo] = kernel.reduce(np, rows[lo:hi], axes, count)

    parallel_ranges(outer, max(1, tuning.value("reduce.thread_items") // max(1, x.size // outer)), run)
    if len(parts) == 1:
        y = parts[0]
    else:
        y = np.concatenate([parts[k] for k in sorted(parts)], axis=0)
    return y.reshape(x.shape[:lead] + y.shape[1:])


@specialize("ArgMax.pick", device="cpu", ops=("ArgMax", "ArgMin"),
            when=lambda pick, x, axis: x.ndim >= 2 and x.size >= 2 * tuning.value("arg_reduce.thread_items"))
def _host_pick(pick, x, axis):
    """pick(np, x, axis), with the slices of another axis split over host threads (each
    thread gets arg_reduce.thread_items elements or more: host/tuning.py)."""
    split = 0 if axis != 0 else 1
    out_shape = x.shape[:axis] + x.shape[axis + 1:]
    out = np.empty(out_shape, np.intp)
    n = x.shape[split]
    out_axis = split if split < axis else split - 1

    def part(lo, hi):
        src = [slice(None)] * x.ndim
        src[split] = slice(lo, hi)
        dst = [slice(None)] * len(out_shape)
        dst[out_axis] = slice(lo, hi)
        out[tuple(dst)] = pick(np, x[tuple(src)], axis)

    parallel_ranges(n, max(1, -(-tuning.value("arg_reduce.thread_items") // max(1, x.size // n))), part)
    return out


class _Arg(KernelBase):
    def __call__(self, data, axis=0, keepdims=1, select_last_index=0):
        x = self.tensor(data, "data")
        self.check_inputs(x)
        axis = normalize_axis(self, axis, x.ndim, data=x)
        xp = self.xp
        xc = self.to_compute(x)
        if x.ndim == 0:
            xc = xc.reshape(1)
        n = xc.shape[axis]
        if n == 0:
            raise self.error(f"cannot take {self.op_type} over the empty axis {axis}", data=x)
        if select_last_index:
            idx = self.pick(xp, xp.flip(xc, axis=axis), axis)
            idx = (n - 1) - idx
        else:
            fast = self.specialized("ArgMax.pick", self.pick, xc, axis)
            idx = fast(self.pick, xc, axis) if fast is not None else self.pick(xp, xc, axis)
        idx = xp.asarray(idx).astype(np.int64, copy=False)
        if keepdims:
            idx = xp.expand_dims(idx, axis)
        if x.ndim == 0:
            idx = idx.reshape(())
        return self.result(contiguous(xp, idx), DataType.INT64)


@register()
class ArgMax(_Arg):
    @staticmethod
    def pick(xp, x, axis):
        return xp.argmax(x, axis=axis)


@register()
class ArgMin(_Arg):
    @staticmethod
    def pick(xp, x, axis):
        return xp.argmin(x, axis=axis)
