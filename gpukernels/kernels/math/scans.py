"""CumSum and CumProd along one axis (a 0-D or one-element int32/int64 input), with
``exclusive`` (the running value before each element: 0 for sums, 1 for products at the
start) and ``reverse`` (from the end of the axis).  Half types accumulate in float32 and
round once; integers wrap around on overflow.
"""

from __future__ import annotations

import numpy as np

from ..base import KernelBase, register


class _Scan(KernelBase):
    identity = 0

    def __call__(self, x, axis, exclusive=0, reverse=0):
        t = self.tensor(x, "x")
        at = self.tensor(axis, "axis")
        self.check_inputs(t, at)
        if at.size != 1 or at.ndim > 1:
            raise self.error("axis must be a 0-D (or one-element) tensor", x=t, axis=at)
        if t.ndim == 0:
            raise self.error("x must have at least one dimension", x=t, axis=at)
        ax = int(np.asarray(at.numpy()).reshape(-1)[0])
        if not -t.ndim <= ax < t.ndim:
            raise self.error(f"axis {ax} is out of range for rank {t.ndim}", x=t, axis=at)
        ax %= t.ndim
        xp = self.xp
        xc = self.to_compute(t)
        if xc.size == 0:
            return self.from_compute(xc.copy(), t.data_type)
        v = xp.flip(xc, axis=ax) if reverse else xc
        if exclusive:
            n = v.shape[ax]
            head = [slice(None)] * v.ndim
            head[ax] = slice(0, n - 1)
            pad_shape = list(v.shape)
            pad_shape[ax] = 1
            pad = xp.full(pad_shape, self.identity, dtype=v.dtype)
            v = xp.concatenate([pad, v[tuple(head)]], axis=ax)
        acc = v.dtype if v.dtype.kind in "iu" else None
        y = self.scan(xp, v, ax, acc)
        if reverse:
            y = xp.flip(y, axis=ax)
        return self.from_compute(xp.ascontiguousarray(y), t.data_type)


@register()
class CumSum(_Scan):
    identity = 0

    @staticmethod
    def scan(xp, v, axis, dtype):
        return xp.cumsum(v, axis=axis, dtype=dtype)


@register()
class CumProd(_Scan):
    identity = 1

    @staticmethod
    def scan(xp, v, axis, dtype):
        return xp.cumprod(v, axis=axis, dtype=dtype)
