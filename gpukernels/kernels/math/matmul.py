"""MatMul and Gemm.

Half and smaller float types are multiplied in float32 and rounded once.  Integer
products wrap around on overflow.  Gemm with integer types applies alpha and beta in
float64 and casts back (truncating toward zero) only when they are not 1.
"""

from __future__ import annotations

import functools

import numpy as np

from ...host import host_empty, tuning
from ..base import KernelBase, register
from ..specialize import specialize
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
        return self.from_compute(matmul_op(self, am, bm)(am, bm), a.data_type)

    def array_function(self, inputs, attrs):
        """matmul_op for these shapes (natively computed types)."""
        if not native_compute(inputs):
            return None
        return matmul_op(self, inputs[0].array, inputs[1].array)


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
        y = gemm(self, self.to_compute(a), self.to_compute(b),
                 None if c.is_absent else self.to_compute(c), alpha, beta, transA, transB)
        return self.from_compute(y, a.data_type)

    def array_function(self, inputs, attrs):
        """Float types computed natively, C given or not: gemm with the node's attributes
        and the product matmul_op chooses for these shapes (chosen once)."""
        if len(inputs) not in (2, 3) or not native_compute(inputs) or inputs[0].array.dtype.kind != "f":
            return None
        kernel = self
        alpha, beta = attrs.get("alpha", 1.0), attrs.get("beta", 1.0)
        trans_a, trans_b = attrs.get("transA", 0), attrs.get("transB", 0)
        a, b = inputs[0].array, inputs[1].array
        product = matmul_op(self, a.T if trans_a else a, b.T if trans_b else b)

        def gemm_arrays(a, b, c=None):
            return gemm(kernel, a, b, c, alpha, beta, trans_a, trans_b, product)

        return gemm_arrays


def matmul_op(kernel, a, b):
    """The product for operands shaped as a and b: a registered specialisation of
    "MatMul.product" where one applies; ndarray.dot for two 2-D operands (the same
    product as matmul with less call overhead); a stack of matrices times one matrix as
    one 2-D product (_folded_matmul); else xp.matmul."""
    fast = kernel.specialized("MatMul.product", a, b)
    if fast is not None:
        return fast
    xp = kernel.xp
    if b.ndim == 2:
        if a.ndim == 2:
            return a.__class__.dot
        if a.ndim > 2:
            return functools.partial(_folded_matmul, xp)
    return xp.matmul


def _folded_matmul(xp, a, b):
    """a (..., M, K) @ b (K, N) with the batch axes folded into the rows: one (batch * M,
    K) @ (K, N) product when a is C-contiguous (a free reshape), instead of one small
    product per matrix of the stack (one BLAS call, which also splits better over its
    threads); any other a goes to xp.matmul.  Each output row is the same dot products
    of the same row and columns either way; the BLAS may block the sums differently."""
    if not a.flags.c_contiguous:
        return xp.matmul(a, b)
    lead = a.shape[:-1]
    rows = 1
    for d in lead:
        rows *= d
    return a.reshape(rows, a.shape[-1]).dot(b).reshape(lead + (b.shape[1],))


def gemm(kernel, a, b, c, alpha, beta, trans_a, trans_b, product=None):
    """alpha * a' @ b' + beta * c on compute arrays whose shapes were checked (c None:
    no C), the product as matmul_op chooses (or product: its choice for these shapes).
    Floats are scaled in their own type; integers in float64, then converted back toward
    zero, and only when the factor is not 1."""
    xp = kernel.xp
    a = a.T if trans_a else a
    b = b.T if trans_b else b
    y = (product or matmul_op(kernel, a, b))(a, b)
    integer = y.dtype.kind in "iu"
    if alpha != 1.0:
        y = _scale_int(xp, y, alpha) if integer else (y * alpha).astype(y.dtype)
    if c is None:
        return y
    if beta != 1.0:
        c = _scale_int(xp, c, beta) if integer else (c * beta).astype(c.dtype)
    if c.dtype == y.dtype:  # y is a new array of the result's shape: add into it
        return xp.add(y, c, out=y)
    return y + c


def _scale_int(xp, y, factor):
    return (y.astype(xp.float64) * factor).astype(y.dtype)


def _few_rows(a, b) -> bool:
    """One row, or a few rows times a B too large for the GEMM's packing to pay (a
    smaller B is packed once by the GEMM and read once, where each gemv reads all of it:
    see the tuning entries matmul.host_vector_rows and matmul.host_vector_min_bytes)."""
    rows = a.size // a.shape[-1] if a.ndim >= 2 and a.shape[-1] else 0
    return (b.ndim == 2 and a.ndim >= 2 and a.dtype == b.dtype and a.dtype.kind == "f"
            and 0 < rows <= tuning.value("matmul.host_vector_rows")
            and (rows == 1 or b.nbytes >= tuning.value("matmul.host_vector_min_bytes")))


@specialize("MatMul.product", device="cpu", ops=("MatMul", "Gemm"), when=_few_rows,
            agreement="rtol 1e-5, atol 1e-5 (float32): one vector-matrix product (BLAS gemv) per row, "
                      "summed in another order than the matrix product")
def _vector_rows_host(a, b):
    """A product with a few rows (a decoding step: batch x 1 tokens) times a 2-D b as one
    vector-matrix product per row, into a reusable buffer: OpenBLAS packs all of b on
    every GEMM call and may split it over its threads; gemv reads b once per row.  One
    gemv over the whole of b: splitting b into slabs (to keep OpenBLAS from handing a
    large gemv to its thread pool) changed the rounding of the official inception_v1 and
    zfnet512 cases' logits, which are equal there and feed a Softmax that must come out
    uniform."""
    k, n = b.shape
    lead = a.shape[:-1]
    a2 = a.reshape(-1, k)
    out = host_empty((a2.shape[0], n), a.dtype)
    for i in range(a2.shape[0]):
        np.dot(a2[i], b, out=out[i])
    return out.reshape(lead + (n,))
