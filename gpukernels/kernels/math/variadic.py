"""Max, Min, Sum, Mean: elementwise over one or more inputs.

Opset 1 and 6 require equal shapes; opset 8+ broadcast multidirectionally.  Max and Min
propagate NaN like numpy.maximum/minimum (a NaN in any input gives NaN).  Sum and Mean
of half types accumulate in float32 and round once.  Integer Max/Min are exact.
"""

from __future__ import annotations

import numpy as np

from ..base import KernelBase, register
from ._mathcommon import broadcast_shape
from .arith import native_compute


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
        arrays = [self.to_compute(t) for t in ts]
        with np.errstate(all="ignore"):
            y = self.values(self.xp, arrays, shape)
        return self.from_compute(y, ts[0].data_type)

    def values(self, xp, arrays, shape):
        """The result in the compute type: combine() broadcast to shape, a new array."""
        y = self.combine(xp, arrays)
        if y.shape != shape:
            y = xp.broadcast_to(y, shape)
        if len(arrays) == 1 or not y.flags.owndata:
            y = xp.array(y, copy=True)
        return y

    def array_function(self, inputs, attrs):
        """Opset 8+, every input computed in its own type: values() for the
        recorded (broadcast) shape; for two inputs (the common case) pair(xp, result
        dtype): combine() of two arrays as one function, whose result is a new array."""
        if self.since_version < 8 or not inputs or not native_compute(inputs):
            return None
        shape = np.broadcast_shapes(*[t.shape for t in inputs])
        xp, values = self.xp, self.values
        if len(inputs) == 2:
            return self.pair(xp, np.result_type(*[t.array.dtype for t in inputs]))
        return lambda *arrays: values(xp, arrays, shape)


def _fold(ufunc, arrays):
    acc = arrays[0]
    for a in arrays[1:]:
        acc = ufunc(acc, a)
    return acc


class _Fold(_Variadic):
    """combine() folds the inputs with ufunc(xp); two inputs: the ufunc itself."""

    def combine(self, xp, arrays):
        return _fold(self.ufunc(xp), arrays)

    def pair(self, xp, dtype):
        return self.ufunc(xp)


@register()
class Max(_Fold):
    @staticmethod
    def ufunc(xp):
        return xp.maximum


@register()
class Min(_Fold):
    @staticmethod
    def ufunc(xp):
        return xp.minimum


@register()
class Sum(_Fold):
    @staticmethod
    def ufunc(xp):
        return xp.add


@register()
class Mean(_Variadic):
    def combine(self, xp, arrays):
        s = _fold(xp.add, arrays)
        return s / s.dtype.type(len(arrays))

    def pair(self, xp, dtype):
        add, divide, two = xp.add, xp.divide, dtype.type(2)
        return lambda a, b: divide(add(a, b), two)
