"""MatMul and Gemm.

Half and smaller float types are multiplied in float32 and rounded once.  Integer
products wrap around on overflow.  Gemm with integer types applies alpha and beta in
float64 and casts back (truncating toward zero) only when they are not 1.
"""

from __future__ import annotations

from ...dtypes import DataType
from ..base import KernelBase, register
from .arith import native_compute


@register()
class MatMul(KernelBase):
    """NumPy matmul semantics: 1-D operands are promoted and the added axis removed;
    leading (batch) dimensions broadcast."""

    def __call__(self, A, B):
        a = self.tensor(A, "A")
        b = self.tensor(B, "B")
        self.check_inputs(a, b)
        sa, sb = a.array.shape, b.array.shape
        if len(sa) == 0 or len(sb) == 0:
            raise self.error("operands must have at least one dimension", A=a, B=b)
        if sa[-1] != (sb[-2] if len(sb) > 1 else sb[0]):
            raise self.error(f"inner dimensions differ ({sa[-1]} vs {sb[-2] if len(sb) > 1 else sb[0]})",
                             A=a, B=b)
        if len(sa) > 2 and len(sb) > 2:
            for da, db in zip(reversed(sa[:-2]), reversed(sb[:-2])):
                if da != db and 1 not in (da, db):
                    raise self.error("batch dimensions do not broadcast", A=a, B=b)
        am, bm = self.to_compute(a), self.to_compute(b)
        # 2-D operands: ndarray.dot is the same product with less call overhead
        y = am.dot(bm) if len(sa) == 2 and len(sb) == 2 else self.xp.matmul(am, bm)
        return self.from_compute(y, a.data_type)

    def array_function(self, inputs, attrs):
        if not native_compute(inputs):
            return None
        a, b = inputs[0].array, inputs[1].array
        return a.__class__.dot if a.ndim == 2 and b.ndim == 2 else self.xp.matmul


@register()
class Gemm(KernelBase):
    """Y = alpha * A' @ B' + beta * C, A' = A.T when transA, B' = B.T when transB; C
    broadcasts to (M, N) and is optional from opset 11.  Opset 1-5 'broadcast' is honoured
    by always broadcasting C where NumPy rules allow."""

    def __call__(self, A, B, C=None, alpha=1.0, beta=1.0, transA=0, transB=0, broadcast=0):
        a = self.tensor(A, "A")
        b = self.tensor(B, "B")
        c = self.tensor(C, "C", optional=True)
        self.check_inputs(a, b, c)
        if a.ndim != 2 or b.ndim != 2:
            raise self.error("A and B must be 2-D", A=a, B=b)
        xp = self.xp
        am = self.to_compute(a)
        bm = self.to_compute(b)
        if transA:
            am = am.T
        if transB:
            bm = bm.T
        if am.shape[1] != bm.shape[0]:
            raise self.error(f"inner dimensions differ ({am.shape[1]} vs {bm.shape[0]}) "
                             f"with transA={transA}, transB={transB}", A=a, B=b)
        m, n = am.shape[0], bm.shape[1]
        integer = am.dtype.kind in "iu"
        y = xp.matmul(am, bm)
        if alpha != 1.0:
            y = (y * alpha).astype(y.dtype) if not integer else _scale_int(xp, y, alpha)
        if not c.is_absent:
            cm = self.to_compute(c)
            try:
                xp.broadcast_shapes(cm.shape, (m, n)) if hasattr(xp, "broadcast_shapes") else None
                if len(cm.shape) > 2 or any(d not in (1, t) for d, t in zip(reversed(cm.shape), (n, m))):
                    raise ValueError
            except ValueError:
                raise self.error(f"C does not broadcast to ({m}, {n})", A=a, B=b, C=c) from None
            if beta != 1.0:
                cm = (cm * beta).astype(cm.dtype) if not integer else _scale_int(xp, cm, beta)
            y = y + cm
        return self.from_compute(y, a.data_type)

    def array_function(self, inputs, attrs):
        """Float types computed natively, with C given: the same steps on arrays."""
        if len(inputs) != 3 or not native_compute(inputs) or inputs[0].array.dtype.kind != "f":
            return None
        xp = self.xp
        alpha, beta = attrs.get("alpha", 1.0), attrs.get("beta", 1.0)
        trans_a, trans_b = attrs.get("transA", 0), attrs.get("transB", 0)

        def gemm(a, b, c):
            y = xp.matmul(a.T if trans_a else a, b.T if trans_b else b)
            if alpha != 1.0:
                y = (y * alpha).astype(y.dtype)
            if beta != 1.0:
                c = (c * beta).astype(c.dtype)
            return y + c

        return gemm


def _scale_int(xp, y, factor):
    return (y.astype(xp.float64) * factor).astype(y.dtype)
