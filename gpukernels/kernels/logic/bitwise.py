"""BitwiseAnd, BitwiseOr, BitwiseXor, BitwiseNot, BitShift.

BitShift: shift amounts >= the bit width (and, for signed types from opset 28, negative
amounts) give what the sign extension alone produces: 0, or -1 for a right shift of a
negative value.  A right shift of a signed value is arithmetic; a left shift discards the
bits moved past the top (wrap-around).
"""

from __future__ import annotations

import numpy as np

from ..base import KernelBase, register
from ..math._elementwise import BinaryKernel, UnaryKernel


@register()
class BitwiseAnd(BinaryKernel):
    def compute(self, xp, a, b):
        return xp.bitwise_and(a, b)


@register()
class BitwiseOr(BinaryKernel):
    def compute(self, xp, a, b):
        return xp.bitwise_or(a, b)


@register()
class BitwiseXor(BinaryKernel):
    def compute(self, xp, a, b):
        return xp.bitwise_xor(a, b)


@register()
class BitwiseNot(UnaryKernel):
    def compute(self, xp, x):
        return xp.invert(x)


@register()
class BitShift(KernelBase):
    def __call__(self, X, Y, direction=None):
        x = self.tensor(X, "X")
        y = self.tensor(Y, "Y")
        self.check_inputs(x, y)
        if isinstance(direction, bytes):
            direction = direction.decode()
        if direction not in ("LEFT", "RIGHT"):
            raise self.error(f"attribute direction must be 'LEFT' or 'RIGHT', got {direction!r}",
                             X=x, Y=y)
        try:
            np.broadcast_shapes(x.shape, y.shape)
        except ValueError:
            raise self.error("shapes do not broadcast", X=x, Y=y) from None
        xp = self.xp
        xa, ya = x.array, y.array
        bits = xa.dtype.itemsize * 8
        valid = (ya < bits) if ya.dtype.kind == "u" else ((ya >= 0) & (ya < bits))
        amount = xp.where(valid, ya, ya.dtype.type(0))
        if direction == "LEFT":
            shifted = xp.left_shift(xa, amount)
            fill = xa.dtype.type(0)
        else:
            shifted = xp.right_shift(xa, amount)
            fill = xp.where(xa < 0, xa.dtype.type(-1), xa.dtype.type(0)) if xa.dtype.kind == "i" \
                else xa.dtype.type(0)
        out = xp.where(valid, shifted, fill).astype(xa.dtype, copy=False)
        return self.result(out, x.data_type)
