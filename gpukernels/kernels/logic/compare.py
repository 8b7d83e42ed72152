"""Less, Greater, Equal (and their broadcasting); BOOL output.  Comparisons with NaN are
false (Equal(NaN, NaN) is false), as IEEE specifies."""

from __future__ import annotations

from ...dtypes import DataType
from ..base import register
from ..math._elementwise import BinaryKernel
from ..math.arith import compute_array_function


class _Compare(BinaryKernel):
    output_type = DataType.BOOL


@register()
class Less(_Compare):
    array_function = compute_array_function

    def compute(self, xp, a, b):
        return xp.less(a, b)


@register()
class Greater(_Compare):
    array_function = compute_array_function

    def compute(self, xp, a, b):
        return xp.greater(a, b)


@register()
class Equal(_Compare):
    array_function = compute_array_function

    def compute(self, xp, a, b):
        return xp.equal(a, b)
