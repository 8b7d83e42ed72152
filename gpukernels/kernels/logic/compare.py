"""Less, Greater, Equal (and their broadcasting); BOOL output.  Comparisons with NaN are
false (Equal(NaN, NaN) is false), as IEEE specifies."""

from __future__ import annotations

from ...dtypes import DataType
from ..base import register
from ..math._elementwise import BinaryKernel


class _Compare(BinaryKernel):
    output_type = DataType.BOOL


@register()
class Less(_Compare):
    def compute(self, xp, a, b):
        return xp.less(a, b)


@register()
class Greater(_Compare):
    def compute(self, xp, a, b):
        return xp.greater(a, b)


@register()
class Equal(_Compare):
    def compute(self, xp, a, b):
        return xp.equal(a, b)
