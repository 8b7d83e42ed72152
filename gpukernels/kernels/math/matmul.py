"""MatMul and Gemm.

Half and smaller float types are multiplied in float32 and rounded once.  Integer
products wrap around on overflow.  Gemm with integer types applies alpha and beta in
float64 and casts back (truncating toward zero) only when they are not 1.
"""

from __future__ import annotations

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
        return self.from_compute(matmul_op(self.xp, am, bm)(am, bm), a.data_type)

    def array_function(self, inputs, attrs):
        """matmul_op for these shapes (natively computed types)."""
        if not native_compute(inputs):
            return None
        return matmul_op(self.xp, inputs[0].array, inputs[1].array)


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
        m, ka = (a.shape[1], a.shape[0]) if transA else a.shape
        kb, n = (b.shape[1], b.shape[0]) if transB else b.shape
        if ka != kb:
            raise self.error(f"inner dimensions differ ({ka} vs {kb}) "
                             f"with transA={transA}, transB={transB}", A=a, B=b)
        if not c.is_absent and (c.ndim > 2 or any(d not in (1, t) for d, t in zip(reversed(c.shape), (n, m)))):
            raise self.error(f"C does not broadcast to ({m}, {n})", A=a, B=b, C=c)
        y = gemm(self.xp, self.to_compute(a), self.to_compute(b),
                 None if c.is_absent else self.to_compute(c), alpha, beta, transA, transB)
        return self.from_compute(y, a.data_type)

    def array_function(self, inputs, attrs):
        """Float types computed natively, C given or not: gemm with the node's attributes."""
        if len(inputs) not in (2, 3) or not native_compute(inputs) or inputs[0].array.dtype.kind != "f":
            return None
        xp = self.xp
        alpha, beta = attrs.get("alpha", 1.0), attrs.get("beta", 1.0)
        trans_a, trans_b = attrs.get("transA", 0), attrs.get("transB", 0)

        def gemm_arrays(a, b, c=None):
            return gemm(xp, a, b, c, alpha, beta, trans_a, trans_b)

        return gemm_arrays


def matmul_op(xp, a, b):
    """The product for operands shaped as a and b: ndarray.dot for two 2-D operands (the
    same product as matmul with less call overhead), else xp.matmul."""
    return a.__class__.dot if a.ndim == 2 and b.ndim == 2 else xp.matmul


def gemm(xp, a, b, c, alpha, beta, trans_a, trans_b):
    """alpha * a' @ b' + beta * c on compute arrays whose shapes were checked (c None:
    no C).  Floats are scaled in their own type; integers in float64, then converted back
    toward zero, and only when the factor is not 1."""
    y = xp.matmul(a.T if trans_a else a, b.T if trans_b else b)
    integer = y.dtype.kind in "iu"
    if alpha != 1.0:
        y = _scale_int(xp, y, alpha) if integer else (y * alpha).astype(y.dtype)
    if c is None:
        return y
    if beta != 1.0:
        c = _scale_int(xp, c, beta) if integer else (c * beta).astype(c.dtype)
    return y + c


def _scale_int(xp, y, factor):
    return (y.astype(xp.float64) * factor).astype(y.dtype)
