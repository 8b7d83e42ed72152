"""MatMulInteger: (A - a_zero_point) @ (B - b_zero_point) with int32 output.

A and B are int8/uint8 with NumPy matmul semantics (1-D promotion, broadcasting batch
dimensions).  a_zero_point is a scalar, a per-row vector of size M (2-D A) or of shape
[..., M, 1]; b_zero_point a scalar, a per-column vector of size N or of shape [..., 1, N].
The products are exact; the sums are computed exactly (in float32 when they cannot
exceed 2**24, else float64) and wrap around to int32 only if they overflow 32 bits.
A constant B (a frozen array, with a constant or absent b_zero_point) is converted to
that float type once per node and kept (dynamically quantized models pass their int8
weights on every run); the product is the one MatMul chooses for those shapes (few-row
decode steps take its vector-row path).
"""

from __future__ import annotations

import numpy as np

from ...dtypes import DataType
from ..base import KernelBase, register
from ..tensor.indexing import is_frozen
from .matmul import matmul_op


@register()
class MatMulInteger(KernelBase):
    # (B's array, b_zero_point's array or None, float type, converted B): one tuple,
    # replaced in one assignment (threads sharing the node never mix two Bs)
    _kept_b = (None, None, None, None)

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
        az_arr = None if az.is_absent else az.array
        bz_arr = None if bz.is_absent else bz.array
        if az_arr is not None:
            az_arr = self._a_zero_point(az_arr, a, az)
        if bz_arr is not None:
            self._check_b_zero_point(bz_arr, b, bz)
        # |A - za| <= 255 and |B - zb| <= 255: every product is exact; a float32 sum of K of
        # them is exact while K * 255 * 255 < 2**24.
        ftype = np.dtype(np.float32 if ka * 65025 < (1 << 24) else np.float64)
        am = _shifted(self.xp, a.array, az_arr, ftype)
        bm = self._b_operand(b.array, bz_arr, ftype)
        try:
            np.broadcast_shapes(am.shape[:-2], bm.shape[:-2])
        except ValueError:
            raise self.error("zero points do not broadcast with the operands", A=a, B=b) from None
        y = matmul_op(self, am, bm)(am, bm)
        if ftype == np.float64 and ka * 65025 >= (1 << 31):
            y = y.astype(np.int64).astype(np.int32)
        else:
            y = y.astype(np.int32)
        return self.result(y, DataType.INT32)

    def _a_zero_point(self, z, a, az):
        """a_zero_point shaped to broadcast against A's rows; raises for other shapes."""
        if z.size == 1:
            return z.reshape(())
        if z.ndim == 1 and a.ndim >= 2 and z.shape[0] == a.shape[-2]:
            return z.reshape(-1, 1)
        if z.ndim == a.ndim and z.shape[-1] == 1 and z.shape[-2] == a.shape[-2]:
            return z
        raise self.error("a_zero_point must be a scalar, of size M, or of shape [..., M, 1]",
                         A=a, a_zero_point=az)

    def _check_b_zero_point(self, z, b, bz):
        if z.size == 1 or (z.ndim == 1 and b.shape[-1] == z.shape[0]) or \
                (z.ndim == b.ndim and z.ndim >= 2 and z.shape[-2] == 1 and z.shape[-1] == b.shape[-1]):
            return
        raise self.error("b_zero_point must be a scalar, of size N, or of shape [..., 1, N]",
                         B=b, b_zero_point=bz)

    def _b_operand(self, b, z, ftype):
        """B - b_zero_point in ftype; kept while B and the zero point are the same
        frozen arrays (constants)."""
        kept_b, kept_z, kept_type, value = self._kept_b
        if kept_b is b and kept_z is z and kept_type == ftype:
            return value
        value = _shifted(self.xp, b, None if z is None else (z.reshape(()) if z.size == 1 else z), ftype)
        if b.__class__ is np.ndarray and is_frozen(b) and (z is None or is_frozen(z)):
            self._kept_b = (b, z, ftype, value)
        return value


def _shifted(xp, x, z, ftype):
    """x - z in ftype, one pass (int8/uint8 values and zero points: exact in float32)."""
    if z is None:
        return x.astype(ftype)
    return xp.subtract(x, z, dtype=ftype)
