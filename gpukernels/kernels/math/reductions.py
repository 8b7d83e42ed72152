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

import functools
import math

import numpy as np

from ...dtypes import DataType
from ...host import parallel_ranges, tuning
from ...tensor import Tensor
from ..base import KernelBase, register
from ..specialize import specialize
from ..tensor.shape_ops import values_guarded
from ._mathcommon import contiguous, highest, lowest, normalize_axes, normalize_axis
from .arith import native_compute

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

        apply = self._host_rows_function(x, red, keepdims, apply)
        if len(inputs) > 1:
            return values_guarded(self.op_type, {"axes": axes_list}, apply)
        return apply

    def _host_rows_function(self, x: Tensor, red, keepdims, apply):
        """Compiled graphs, float Sum/Mean/Max/Min over trailing axes on the host (where
        _step would take _trailing_rows_step's step in _reduce_rows_host): each call
        straight to that step on the data, without _step's per-call Tensor wrapping and
        np.errstate (the runtime runs array functions under its own error guard: a
        floating-point event sends the node back to the kernel); data of another type or
        layout goes through apply."""
        xc = self.to_compute(x)
        if red is None or x.ndim == 0 or xc is not x.array or xc.dtype not in FLOAT_TYPES:
            return apply
        # the step's choice for a C-contiguous array of x's type and rank (the recorded
        # x may be a stand-in of another layout): None on the reference path or a GPU
        probe = np.empty((1,) * x.ndim, xc.dtype)
        step = _trailing_rows_step(self, probe, red, x.shape)  # shapes are fixed here
        if step is None or self.specialized("Reduce.rows", self, probe, red, 1) is not _reduce_rows_host:
            return apply
        lead, dtype, ndim = x.ndim - len(red), xc.dtype, x.ndim
        ones = (1,) * len(red) if keepdims else ()
        any_layout = step in (_max_rows, _min_rows)

        def host_rows(data):
            shape = data.shape
            if data.__class__ is not np.ndarray or data.dtype != dtype or len(shape) != ndim \
                    or not (any_layout or data.flags.c_contiguous):
                return apply(data)
            n = math.prod(shape[lead:])
            if n == 0:
                return apply(data)
            return step(data.reshape(-1, n), n).reshape(shape[:lead] + ones)

        return host_rows

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


def _trailing_sum(kernel, x, red) -> bool:
    """Whether the step is a float Sum/Mean over the trailing axes of a C-contiguous
    host array (one row of memory per output element)."""
    return (kernel.op_type in ("ReduceSum", "ReduceMean") and x.__class__ is np.ndarray
            and x.dtype in FLOAT_TYPES and x.flags.c_contiguous and bool(red)
            and red[0] == x.ndim - len(red))


FLOAT_TYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _trailing_rows_step(kernel, x, red, shape=None):
    """step(rows, count) -> the 1-D results of the rows of a 2-D array, for a float
    Sum/Mean (sum_rows) over the trailing axes of a C-contiguous host array, or a float
    Max/Min (extreme_rows) over the trailing axes of a host array of any layout (a
    slice's view) and shape (default x's) that is small or has rows extreme_rows takes
    column by column (large ones keep the threaded split); None for any other."""
    if kernel.op_type in ("ReduceMax", "ReduceMin"):
        shape = x.shape if shape is None else shape
        if not (x.__class__ is np.ndarray and x.dtype in FLOAT_TYPES
                and bool(red) and red[0] == x.ndim - len(red)):
            return None
        count, size = math.prod(shape[red[0]:]), math.prod(shape)
        if size >= 2 * tuning.value("reduce.thread_items") and not 1 < count < _SHORT_ROW:
            return None
        return _max_rows if kernel.op_type == "ReduceMax" else _min_rows
    if not _trailing_sum(kernel, x, red):
        return None
    return _mean_rows if kernel.op_type == "ReduceMean" else _sum_rows


def _sum_rows(rows, count):
    return sum_rows(rows, count, False)


def _mean_rows(rows, count):
    return sum_rows(rows, count, True)


def extreme_rows(rows, ufunc):
    """ufunc.reduce(rows, axis=1) for ufunc np.maximum or np.minimum (NumPy's max/min)
    of a 2-D float array of any layout.  NumPy reduces short rows one by one (some 40 ns a
    row here); rows of 2 to _SHORT_ROW - 1 elements, at least _COLUMN_ROWS per element,
    go a column at a time (one ufunc call per column, left to right; 2x1008 rows of 8:
    86 -> ~15 us).  Max and min of numbers do not depend on the order; signed zeros do,
    and _extremes_agree checks them once per row length and type.  A NaN result (NumPy
    returns its own quiet NaN, whatever the payload) redoes the rows by NumPy."""
    n = rows.shape[1]
    if not (1 < n < _SHORT_ROW and rows.shape[0] >= _COLUMN_ROWS * n
            and _extremes_agree(n, rows.dtype, ufunc)):
        return ufunc.reduce(rows, axis=1)
    out = _column_extremes(rows, ufunc)
    if np.isnan(out).any():
        return ufunc.reduce(rows, axis=1)
    return out


def _max_rows(rows, count):
    return extreme_rows(rows, np.maximum)


def _min_rows(rows, count):
    return extreme_rows(rows, np.minimum)


def _column_extremes(rows, ufunc):
    c = rows.T
    out = ufunc(c[0], c[1])
    for j in range(2, c.shape[0]):
        ufunc(out, c[j], out=out)
    return out


@functools.cache
def _extremes_agree(n: int, dtype, ufunc) -> bool:
    """Whether _column_extremes gives ufunc.reduce's bits for rows of n elements of
    dtype, on random rows and rows of signed zeros, contiguous and strided (NumPy's
    loops differ); checked once."""
    rng = np.random.default_rng(n)
    wide = rng.standard_normal((512, n + 3)).astype(dtype)
    wide[:64] = np.where(rng.random((64, n + 3)) < 0.5, -0.0, 0.0)
    return all(ufunc.reduce(s, axis=1).tobytes() == _column_extremes(s, ufunc).tobytes()
               for s in (np.ascontiguousarray(wide[:, :n]), wide[:, :n], wide[:, ::-1][:, :n]))


def sum_rows(rows, count: int, mean: bool):
    """The sums (mean: the means) of the rows of a C-contiguous 2-D float array by
    np.add.reduce (then a division by count), the rows split over the host threads when
    large: the loop numpy.sum and numpy.mean run on each row (NumPy's pairwise sum in the
    array's type), so the same bits, whatever the split; short rows by _column_sums."""
    items = tuning.value("reduce.thread_items")
    if rows.size < 2 * items:  # one thread: one call (parallel_ranges costs 6 us here)
        out = _add_rows(rows, None)
        if mean:
            np.divide(out, count, out=out)
        return out
    out = np.empty(rows.shape[0], rows.dtype)

    def run(lo, hi):
        _add_rows(rows[lo:hi], out[lo:hi])
        if mean:
            np.divide(out[lo:hi], count, out=out[lo:hi])

    parallel_ranges(rows.shape[0], max(1, items // count), run)
    return out


# rows shorter than _SHORT_ROW elements, at least _COLUMN_ROWS per element, go by
# _column_sums: NumPy reduces row by row (some 25 ns a row here), a column costs a ufunc
# call (about 1 us); 2x576x3x3 over H, W 41 -> 12 us, 2x2048x3x3 169 -> 21 us (loaded
# host); measured break-even at about 50 rows per element
_SHORT_ROW = 16
_COLUMN_ROWS = 64


def _add_rows(rows, out):
    """np.add.reduce(rows, axis=1, out=out) of a 2-D float array (out None: a new one),
    rows of fewer than _SHORT_ROW elements by _column_sums where it has been found to
    give NumPy's bits (_columns_agree)."""
    n = rows.shape[1]
    if 1 < n < _SHORT_ROW and rows.shape[0] >= _COLUMN_ROWS * n and _columns_agree(n, rows.dtype):
        return _column_sums(rows, out)
    return np.add.reduce(rows, axis=1, out=out)


def _column_sums(rows, out=None):
    """The sums of the rows (2 to 15 elements) in the order of NumPy's float add
    reduction: its identity 0 plus the pairwise sum of the row (loops_utils.h.src),
    which adds fewer than 8 elements one after the other, and 8 to 15 as
    ((a0+a1)+(a2+a3))+((a4+a5)+(a6+a7)) then the rest one after the other -- each step
    one ufunc call over a column of every row.  NumPy does not promise this order:
    _columns_agree checks it once per row length and type."""
    c = rows.T  # c[j]: element j of every row
    n = c.shape[0]
    out = np.add(c[0], c[1], out=out)
    if n < 8:
        first = 2
    else:
        a = np.add(c[2], c[3])
        out += a
        np.add(c[4], c[5], out=a)
        b = np.add(c[6], c[7])
        a += b
        out += a
        first = 8
    for j in range(first, n):
        out += c[j]
    out += rows.dtype.type(0)  # the identity first: a sum of -0.0 is +0.0
    return out


@functools.cache
def _columns_agree(n: int, dtype) -> bool:
    """Whether _column_sums gives np.add.reduce's bits for rows of n elements of dtype,
    on rows of random signs and magnitudes (1e-6 to 1e6) whose sums round differently
    in another order; checked once (else the rows are reduced by NumPy)."""
    rng = np.random.default_rng(n)
    sample = rng.standard_normal((512, n)) * 10.0 ** rng.uniform(-6, 6, (512, 1))
    sample = sample.astype(dtype)
    sample[:8] = np.where(rng.random((8, n)) < 0.5, -0.0, 0.0)  # signed zeros
    sample[8] = -0.0
    with np.errstate(all="ignore"):
        return np.add.reduce(sample, axis=1).tobytes() == _column_sums(sample).tobytes()


@specialize("Reduce.rows", device="cpu", ops=_REDUCE_OPS,
            when=lambda kernel, x, red, count: (min(red) > 0 and x.flags.c_contiguous
                                                and x.size >= 2 * tuning.value("reduce.thread_items"))
            or (count > 0 and _trailing_rows_step(kernel, x, red) is not None))
def _reduce_rows_host(kernel, x, red, count):
    """kernel.reduce, split over the leading non-reduced axes on host threads; a float
    Sum/Mean over trailing axes (any size) as one np.add.reduce over the (rows, count)
    view (sum_rows: NumPy's sum and mean run that loop on each row).  Every output
    element is reduced by the same NumPy loop over the same elements as in one call, so
    the result does not depend on the thread count."""
    step = _trailing_rows_step(kernel, x, red) if count > 0 else None
    if step is not None:
        lead = x.ndim - len(red)
        return step(x.reshape(-1, count), count).reshape(x.shape[:lead] + (1,) * len(red))
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
        if xc.shape[axis] == 0:
            raise self.error(f"cannot take {self.op_type} over the empty axis {axis}", data=x)
        return self.result(self._indices(xp, xc, axis, keepdims, select_last_index, x.ndim == 0), DataType.INT64)

    def _indices(self, xp, xc, axis, keepdims, select_last_index, scalar):
        """The int64 indices of the compute array xc (rank >= 1, a non-empty axis)."""
        n = xc.shape[axis]
        if select_last_index:
            idx = self.pick(xp, xp.flip(xc, axis=axis), axis)
            idx = (n - 1) - idx
        else:
            fast = self.specialized("ArgMax.pick", self.pick, xc, axis)
            idx = fast(self.pick, xc, axis) if fast is not None else self.pick(xp, xc, axis)
        idx = xp.asarray(idx).astype(np.int64, copy=False)
        if keepdims:
            idx = xp.expand_dims(idx, axis)
        if scalar:
            idx = idx.reshape(())
        return contiguous(xp, idx)

    def array_function(self, inputs, attrs):
        """_indices for the recorded axis and flags, on inputs computed in their own type
        (rank 1 or more, a non-empty axis)."""
        if len(inputs) != 1 or not native_compute(inputs) or inputs[0].ndim == 0:
            return None
        x = inputs[0]
        axis = normalize_axis(self, attrs.get("axis", 0), x.ndim, data=x)
        if x.shape[axis] == 0:
            return None
        keep, last = bool(attrs.get("keepdims", 1)), bool(attrs.get("select_last_index", 0))
        xp, indices = self.xp, self._indices
        return lambda a: indices(xp, a, axis, keep, last, False)


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
