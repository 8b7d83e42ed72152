"""MatMulInteger: (A - a_zero_point) @ (B - b_zero_point) with int32 output.

A and B are int8/uint8 with NumPy matmul semantics (1-D promotion, broadcasting batch
dimensions).  a_zero_point is a scalar, a per-row vector of size M (2-D A) or of shape
[..., M, 1]; b_zero_point a scalar, a per-column vector of size N or of shape [..., 1, N].
The products are exact; the sums are computed exactly (in float32 when they cannot
exceed 2**24, else float64) and wrap around to int32 only if they overflow 32 bits.
"""

from __future__ import annotations

import numpy as np

from ...dtypes import DataType
from ..base import KernelBase, register


@register()
class MatMulInteger(KernelBase):
    def __call__(self, A, B, a_zero_point=None, b_zero_point=None):
        a = self.tensor(A, "A")
        b = self.tensor(B, "B")
        az = self.tensor(a_zero_point, "a_zero_point", optional=True)
        bz = self.tensor(b_zero_point, "b_zero_point", optional=True)
        self.check_inputs(a, b, az, bz)
        if not az.is_absent and az.data_type != a.data_type:
            raise self.type_error("a_zero_point must have A's element type", A=a, a_zero_point=az)
        if not bz.is_absent and bz.data_type != b.data_type:
            raise self.type_error("b_zero_point must have B's element type", B=b, b_zero_point=bz)
        if a.ndim == 0 or b.ndim == 0:
            raise self.error("operands must have at least one dimension", A=a, B=b)
        ka = a.shape[-1]
        kb = b.shape[-2] if b.ndim > 1 else b.shape[0]
        if ka != kb:
            raise self.error(f"inner dimensions differ ({ka} vs {kb})", A=a, B=b)
        try:
            np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        except ValueError:
            raise self.error("batch dimensions do not broadcast", A=a, B=b) from None
        xp = self.xp
        am = a.array.astype(np.int32)
        bm = b.array.astype(np.int32)
        if not az.is_absent:
            z = az.array.astype(np.int32)
            if z.size == 1:
                z = z.reshape(())
            elif z.ndim == 1 and a.ndim >= 2 and z.shape[0] == a.shape[-2]:
                z = z.reshape(-1, 1)
            elif z.ndim == a.ndim and z.shape[-1] == 1 and z.shape[-2] == a.shape[-2]:
                pass
            else:
                raise self.error("a_zero_point must be a scalar, of size M, or of shape [..., M, 1]",
                                 A=a, a_zero_point=az)
            am = am - z
        if not bz.is_absent:
            z = bz.array.astype(np.int32)
            if z.size == 1:
                z = z.reshape(())
            elif z.ndim == 1 and b.shape[-1] == z.shape[0]:
                pass
            elif z.ndim == b.ndim and z.ndim >= 2 and z.shape[-2] == 1 and z.shape[-1] == b.shape[-1]:
                pass
            else:
                raise self.error("b_zero_point must be a scalar, of size N, or of shape [..., 1, N]",
                                 B=b, b_zero_point=bz)
            bm = bm - z
        try:
            xp.broadcast_shapes(am.shape[:-2], bm.shape[:-2]) if hasattr(xp, "broadcast_shapes") else None
        except ValueError:
            raise self.error("zero points do not broadcast with the operands", A=a, B=b) from None
        # |A - za| <= 255 and |B - zb| <= 255: every product is exact; a float32 sum of K of
        # them is exact while K * 255 * 255 < 2**24.
        ftype = np.float32 if ka * 65025 < (1 << 24) else np.float64
        y = xp.matmul(am.astype(ftype), bm.astype(ftype))
        if ftype == np.float64 and ka * 65025 >= (1 << 31):
            y = y.astype(np.int64).astype(np.int32)
        else:
            y = y.astype(np.int32)
        return self.result(y, DataType.INT32)
