"""Pad: constant, reflect, edge and wrap modes; negative pads crop.

Pads are [x1_begin, x2_begin, ..., x1_end, x2_end] over all axes, or over ``axes``
(opset 18+).  Negative pads remove elements first; the remaining positive pads are then
filled.  Non-constant modes copy each padded axis' border bands from the positions of an
index map computed once per axis (a slice when the positions run by +-1 or repeat one
element, a gather otherwise) (so pads larger than the axis are defined: reflect repeats its mirror period,
wrap goes round the torus, edge repeats the edge).  reflect on an axis of size 1 repeats
that element; non-constant padding of an empty axis raises.
"""

from __future__ import annotations

import functools

import numpy as np

from ...dtypes import DataType
from ...limits import check_allocation
from ...tensor import Tensor
from ..base import KernelBase, register
from ._common import host_ints, norm_axes, xp_for

MODES = ("constant", "reflect", "edge", "wrap")


def pad_index(n: int, before: int, after: int, mode: str) -> np.ndarray:
    """Source index of every output position along one axis (host int64)."""
    i = np.arange(-before, n + after, dtype=np.int64)
    if mode == "edge":
        return np.clip(i, 0, n - 1)
    if mode == "wrap":
        return np.mod(i, n)
    # reflect: mirror about the first and last elements (not repeating them)
    if n == 1:
        return np.zeros_like(i)
    period = 2 * (n - 1)
    j = np.mod(i, period)
    return np.where(j < n, j, period - j)


def _as_slice(idx: np.ndarray):
    """A basic slice reading the positions idx (a run with step 1 or -1, or one position
    repeated: a length-1 slice that broadcasts), else None (gather)."""
    first = int(idx[0])
    if idx.size == 1 or np.all(idx == first):
        return slice(first, first + 1)
    step = int(idx[1]) - first
    if step in (1, -1) and np.all(np.diff(idx) == step):
        stop = int(idx[-1]) + step
        return slice(first, stop if stop >= 0 else None, step)
    return None


@functools.lru_cache(maxsize=256)
def _bands(n: int, before: int, after: int, mode: str):
    """(band of out, its source positions in out: a slice or an index array) along one
    axis padded by before/after around n elements."""
    src = pad_index(n, before, after, mode) + before  # positions in out
    bands = []
    for dst, idx in ((slice(0, before), src[:before]), (slice(before + n, before + n + after), src[before + n:])):
        if idx.size:
            sl = _as_slice(idx)
            if sl is None:
                idx.flags.writeable = False
            bands.append((dst, idx if sl is None else sl))
    return tuple(bands)


@register()
class Pad(KernelBase):
    def __call__(self, data, pads=None, constant_value=None, axes=None, mode="constant",
                 value=0.0, paddings=None):
        x = self.tensor(data, "data")
        mode = mode.decode() if isinstance(mode, bytes) else str(mode)
        allowed = MODES if self.since_version >= 19 else MODES[:3]
        if mode not in allowed:
            raise self.error(f"unknown mode {mode!r}; opset {self.since_version} allows {list(allowed)}", data=x)
        if self.since_version < 11:
            self.check_inputs(x)
            p = paddings if self.since_version < 2 and paddings is not None else pads
            if p is None:
                raise self.error("attribute 'pads' is required", data=x)
            p = [int(v) for v in p]
            fill = float(value if value is not None else 0.0)
            ax = list(range(x.ndim))
            named = {}
        else:
            tp = self.host_tensor(pads, "pads")
            tc = self.tensor(constant_value, "constant_value", optional=True)
            ta = self.host_tensor(axes, "axes", optional=True) if self.since_version >= 18 else Tensor()
            self.check_inputs(x, tp, tc, ta)
            named = {"pads": tp}
            p = host_ints(self, tp, "pads")
            ax = list(range(x.ndim)) if ta.is_absent else norm_axes(self, host_ints(self, ta, "axes"), x.ndim,
                                                                    data=x)
            if not tc.is_absent and tc.size != 1:
                raise self.error("constant_value must hold one value", data=x, constant_value=tc)
            fill = tc
        before, after = self._sides(x, p, ax, **named)
        return Tensor.wrap(self.pad_array(x, before, after, mode, fill), x.data_type)

    def _sides(self, x: Tensor, p: list, ax: list, **named) -> tuple:
        """(before, after) pads per axis of x from pads p over the axes ax."""
        if len(p) != 2 * len(ax):
            raise self.error(f"pads has {len(p)} values; expected {2 * len(ax)} (begin and end for "
                             f"{len(ax)} axes)", data=x, **named)
        before = [0] * x.ndim
        after = [0] * x.ndim
        for k, a in enumerate(ax):
            before[a], after[a] = p[k], p[k + len(ax)]
        return before, after

    def array_function(self, inputs, attrs):
        """Opset 11+, non-string data, every input present: pad_array for the recorded
        pads and axes values (other values raise: the runtime then redoes the node
        through the kernel); constant_value is read on every call."""
        if (self.since_version < 11 or not 2 <= len(inputs) <= 4
                or any(t.__class__ is not Tensor or t.is_absent for t in inputs)
                or inputs[0].data_type == DataType.STRING):
            return None
        x = inputs[0]
        pads = host_ints(self, inputs[1], "pads")
        axes = host_ints(self, inputs[3], "axes") if len(inputs) == 4 else None
        ax = list(range(x.ndim)) if axes is None else norm_axes(self, axes, x.ndim, data=x)
        before, after = self._sides(x, pads, ax)
        mode = attrs.get("mode", "constant")
        mode = mode.decode() if isinstance(mode, bytes) else str(mode)
        dt, wrap, pad_array = x.data_type, Tensor.wrap, self.pad_array
        fill_type = inputs[2].data_type if len(inputs) > 2 else None

        def pad(data, given_pads, *rest):
            if given_pads.tolist() != pads or (axes is not None and rest[-1].tolist() != axes):
                raise ValueError(f"Pad: pads {given_pads.tolist()} or axes are not the compiled {pads}, {axes}")
            fill = wrap(rest[0], fill_type) if fill_type is not None else Tensor()
            return pad_array(wrap(data, dt), before, after, mode, fill)

        return pad

    def pad_array(self, x: Tensor, before, after, mode, fill):
        xp = xp_for(self, x)
        arr = x.array
        # 1. crop negative pads
        crop = tuple(slice(max(-b, 0), arr.shape[i] - max(-a, 0)) for i, (b, a) in enumerate(zip(before, after)))
        for i, (b, a) in enumerate(zip(before, after)):
            if max(-b, 0) + max(-a, 0) > arr.shape[i]:
                raise self.error(f"negative pads remove more than the {arr.shape[i]} elements of axis {i}",
                                 data=x)
        arr = arr[crop]
        before = [max(b, 0) for b in before]
        after = [max(a, 0) for a in after]
        if not any(before) and not any(after):
            return arr.copy()
        out_shape = tuple(n + b + a for n, b, a in zip(arr.shape, before, after))
        check_allocation(self, out_shape, arr.dtype)
        if mode == "constant":
            out = xp.empty(out_shape, dtype=arr.dtype)
            out[...] = self._fill_value(x, fill, xp)
            out[tuple(slice(b, b + n) for b, n in zip(before, arr.shape))] = arr
            return out
        for i, (b, a) in enumerate(zip(before, after)):
            if (b or a) and arr.shape[i] == 0:
                raise self.error(f"mode {mode!r} cannot pad the empty axis {i}", data=x)
        # copy the centre once, then fill each padded axis' two border bands from the
        # positions its index map names (axes done earlier are already complete there)
        out = xp.empty(out_shape, dtype=arr.dtype)
        out[tuple(slice(b, b + n) for b, n in zip(before, arr.shape))] = arr
        for i, (b, a) in enumerate(zip(before, after)):
            if not (b or a):
                continue
            lead = (slice(None),) * i
            for dst, src in _bands(arr.shape[i], b, a, mode):
                # a band's sources never overlap the band itself
                out[lead + (dst,)] = out[lead + (src,)] if isinstance(src, slice) else \
                    xp.take(out, xp.asarray(src), axis=i)
        return out

    def _fill_value(self, x: Tensor, fill, xp):
        if x.data_type == DataType.STRING:
            if isinstance(fill, Tensor) and not fill.is_absent:
                return fill.array.reshape(())
            return ""
        if isinstance(fill, Tensor):
            if fill.is_absent:
                return 0
            return fill.array.reshape(())  # already the storage dtype on this device
        # opset < 11: a float attribute, converted to the data's type
        from .cast import cast_tensor

        t = cast_tensor(self, self.tensor(np.array(fill, dtype=np.float64), "value"), x.data_type)
        return t.array.reshape(())
