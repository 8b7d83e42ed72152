"""And, Or, Xor, Not, IsNaN, IsInf, GreaterOrEqual, LessOrEqual.

And/Or/Xor opset 1 use the legacy broadcasting (attribute broadcast=1 lets B be a
contiguous run of A's dimensions at ``axis``); opset 7+ broadcast multidirectionally.
Comparisons with NaN are false (GreaterOrEqual(NaN, NaN) is false).  IsNaN and IsInf
decode the float8 types exactly; types without infinities never report one.
"""

from __future__ import annotations

import functools

import numpy as np

from ...dtypes import DataType
from ..base import KernelBase, register
from ..math._elementwise import BinaryKernel
from ..math._mathcommon import legacy_broadcast
from ..math.arith import compute_array_function, native_compute


class _Logical(KernelBase):
    def __call__(self, A, B, broadcast=0, axis=None):
        a = self.tensor(A, "A")
        b = self.tensor(B, "B")
        self.check_inputs(a, b)
        if self.since_version < 7:
            barr = legacy_broadcast(self, a, b, broadcast, axis)
        else:
            try:
                np.broadcast_shapes(a.shape, b.shape)
            except ValueError:
                raise self.error("shapes do not broadcast", A=a, B=b) from None
            barr = b.array
        return self.result(self.function(self.xp, a.array, barr), DataType.BOOL)

    def array_function(self, inputs, attrs):
        """Opset 7+ (NumPy broadcasting): function bound to xp."""
        return functools.partial(self.function, self.xp) if self.since_version >= 7 else None


@register()
class And(_Logical):
    @staticmethod
    def function(xp, a, b):
        return xp.logical_and(a, b)


@register()
class Or(_Logical):
    @staticmethod
    def function(xp, a, b):
        return xp.logical_or(a, b)


@register()
class Xor(_Logical):
    @staticmethod
    def function(xp, a, b):
        return xp.logical_xor(a, b)


@register()
class Not(KernelBase):
    def __call__(self, X):
        x = self.tensor(X, "X")
        self.check_inputs(x)
        return self.result(self.xp.logical_not(x.array), DataType.BOOL)

    def array_function(self, inputs, attrs):
        return self.xp.logical_not


@register()
class IsNaN(KernelBase):
    def __call__(self, X):
        x = self.tensor(X, "X")
        self.check_inputs(x)
        return self.result(self.xp.isnan(self.to_compute(x)), DataType.BOOL)

    def array_function(self, inputs, attrs):
        """An input computed in its own type: xp.isnan itself."""
        return self.xp.isnan if len(inputs) == 1 and native_compute(inputs) else None


@register()
class IsInf(KernelBase):
    def __call__(self, X, detect_negative=1, detect_positive=1):
        x = self.tensor(X, "X")
        self.check_inputs(x)
        xp = self.xp
        xc = self.to_compute(x)
        if detect_negative and detect_positive:
            y = xp.isinf(xc)
        elif detect_positive:
            y = xc == xc.dtype.type(np.inf)
        elif detect_negative:
            y = xc == xc.dtype.type(-np.inf)
        else:
            y = xp.zeros(xc.shape, dtype=bool)
        return self.result(y, DataType.BOOL)


@register()
class GreaterOrEqual(BinaryKernel):
    output_type = DataType.BOOL
    array_function = compute_array_function

    def compute(self, xp, a, b):
        return xp.greater_equal(a, b)


@register()
class LessOrEqual(BinaryKernel):
    output_type = DataType.BOOL
    array_function = compute_array_function

    def compute(self, xp, a, b):
        return xp.less_equal(a, b)
