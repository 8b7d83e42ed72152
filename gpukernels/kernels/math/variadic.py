"""Max, Min, Sum, Mean: elementwise over one or more inputs.

Opset 1 and 6 require equal shapes; opset 8+ broadcast multidirectionally.  Max and Min
propagate NaN like numpy.maximum/minimum (a NaN in any input gives NaN).  Sum and Mean
of half types accumulate in float32 and round once.  Integer Max/Min are exact.
"""

from __future__ import annotations

import numpy as np

from ..base import KernelBase, register
from ._mathcommon import broadcast_shape


class _Variadic(KernelBase):
    def __call__(self, *data_0, consumed_inputs=None):
        if not data_0:
            raise self.error("needs at least one input")
        ts = [self.tensor(v, f"data_{i}") for i, v in enumerate(data_0)]
        self.check_inputs(*ts)
        named = {f"data_{i}": t for i, t in enumerate(ts)}
        if self.since_version < 8:
            if any(t.shape != ts[0].shape for t in ts):
                raise self.error(f"opset-{self.since_version} {self.op_type} needs inputs of one "
                                 "shape (broadcasting came with opset 8)", **named)
            shape = ts[0].shape
        else:
            shape = broadcast_shape(self, named)
        xp = self.xp
        arrays = [self.to_compute(t) for t in ts]
        with np.errstate(all="ignore"):
            y = self.combine(xp, arrays)
        if y.shape != shape:
            y = xp.broadcast_to(y, shape)
        if len(arrays) == 1 or not y.flags.owndata:
            y = xp.array(y, copy=True)
        return self.from_compute(y, ts[0].data_type)


def _fold(ufunc, arrays):
    acc = arrays[0]
    for a in arrays[1:]:
        acc = ufunc(acc, a)
    return acc


@register()
class Max(_Variadic):
    def combine(self, xp, arrays):
        return _fold(xp.maximum, arrays)


@register()
class Min(_Variadic):
    def combine(self, xp, arrays):
        return _fold(xp.minimum, arrays)


@register()
class Sum(_Variadic):
    def combine(self, xp, arrays):
        return _fold(xp.add, arrays)


@register()
class Mean(_Variadic):
    def combine(self, xp, arrays):
        s = _fold(xp.add, arrays)
        return s / s.dtype.type(len(arrays))
