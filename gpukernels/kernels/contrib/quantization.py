"""MatMulNBits (com.microsoft): Y = A @ dequantize(B)^T + bias, the weight-only
quantized matrix product that onnxruntime's quantizers (MatMulNBitsQuantizer) and
onnxruntime-genai models use.

B is uint8 (N, k_blocks, blob_size): row n of the logical (N, K) weight, quantized in
blocks of block_size values along K, each block packed into blob_size = block_size * bits
/ 8 bytes, the first value in the lowest bits of a byte.  weight[n, k] = (q - zero_point)
* scale with one scale (scales (N, k_blocks), or flat) and one zero point per block:
zero_points packed like B (uint8 (N, ceil(k_blocks * bits / 8))), unpacked in A's type
(N, k_blocks), or by default 2^(bits - 1).  The weight is dequantized into A's compute
type (float32 for half types) and multiplied with the MatMul kernel; accuracy_level
(onnxruntime's permission to quantize A internally) is accepted and does not lower the
precision.  bits 2, 4 and 8 are supported (onnxruntime's CPU kernel has the same three);
g_idx and prepacked weights are not.  A B with a zero dimension is an omitted
projection: Y is zeros (plus bias).
"""

from __future__ import annotations

import numpy as np

from ...dtypes import DataType
from ...tensor import Tensor
from ..base import register
from ..math.matmul import MatMul as _OnnxMatMul
from ._common import DOMAIN, FLOATS, ContribKernel


@register(domain=DOMAIN, versions=(1,))
class MatMulNBits(ContribKernel):
    max_inputs = 6

    def __call__(self, A, B, scales, zero_points=None, g_idx=None, bias=None, *more, K=None, N=None, bits=4,
                 block_size=None, accuracy_level=0, weight_prepacked=0, **unknown):
        self.check_signature(more, unknown)
        a = self.tensor(A, "A")
        b = self.tensor(B, "B")
        sc = self.tensor(scales, "scales")
        zp = self.tensor(zero_points, "zero_points", optional=True)
        gi = self.tensor(g_idx, "g_idx", optional=True)
        bi = self.tensor(bias, "bias", optional=True)
        shapes = dict(A=a, B=b, scales=sc, zero_points=zp, bias=bi)
        self.floats(FLOATS, A=a, scales=sc, bias=bi)
        self.check_type("B", b, {DataType.UINT8})
        if not zp.is_absent:
            self.check_type("zero_points", zp, FLOATS | {DataType.UINT8})
        if K is None or N is None or block_size is None:
            raise self.error("the attributes K, N and block_size are required", **shapes)
        K, N, bits, bs = int(K), int(N), int(bits), int(block_size)
        if K <= 0 or N <= 0:
            raise self.error(f"K and N must be positive, got K={K}, N={N}", **shapes)
        if bits not in (2, 4, 8):
            raise self.error(f"bits must be 2, 4 or 8, got {bits}", **shapes)
        if bs < 16 or bs & (bs - 1):
            raise self.error(f"block_size must be a power of two >= 16, got {bs}", **shapes)
        if int(weight_prepacked):
            raise self.error("prepacked weights (weight_prepacked != 0) are not supported", **shapes)
        if not gi.is_absent:
            raise self.error("g_idx (deprecated) is not supported", **shapes)
        if a.ndim < 1 or a.shape[-1] != K:
            raise self.error(f"A's last dimension must be K = {K}", **shapes)
        kb = -(-K // bs)
        blob = bs * bits // 8
        if not bi.is_absent:
            self.vector(bi, "bias", N, A=a)
        xp = self.xp
        cdt = np.float64 if a.data_type == DataType.DOUBLE else np.float32
        out_shape = tuple(a.shape[:-1]) + (N,)
        if 0 in b.shape:  # an omitted projection
            y = xp.zeros(out_shape, dtype=cdt)
            if not bi.is_absent:
                y += self.to_compute(bi, cdt)
            return self.from_compute(y, a.data_type)
        if b.shape != (N, kb, blob):
            raise self.error(f"B must be (N, k_blocks, blob_size) = ({N}, {kb}, {blob})", **shapes)
        if sc.size != N * kb:
            raise self.error(f"scales must hold N * k_blocks = {N * kb} values ({N}, {kb})", **shapes)
        q = _unpack(xp, b.array, bits).reshape(N, kb, bs).astype(cdt)
        if zp.is_absent:
            q -= cdt(1 << (bits - 1))
        elif zp.data_type == DataType.UINT8:
            zbytes = -(-kb * bits // 8)
            if zp.size != N * zbytes:
                raise self.error(f"packed zero_points must be ({N}, {zbytes})", **shapes)
            z = _unpack(xp, zp.array.reshape(N, zbytes), bits)[:, :kb].astype(cdt)
            q -= z[:, :, None]
        else:
            if zp.size != N * kb:
                raise self.error(f"unpacked zero_points must be ({N}, {kb})", **shapes)
            q -= self.to_compute(zp, cdt).reshape(N, kb, 1)
        q *= self.to_compute(sc, cdt).reshape(N, kb, 1)
        w = q.reshape(N, kb * bs)[:, :K]
        ct = DataType.DOUBLE if cdt == np.float64 else DataType.FLOAT
        y = self.sub(_OnnxMatMul, 13)(self.compute_tensor(a, cdt), Tensor.wrap(xp.ascontiguousarray(w.T), ct)).array
        if not bi.is_absent:
            y = y + self.to_compute(bi, cdt)
        return self.from_compute(y, a.data_type)


def _unpack(xp, packed, bits: int):
    """uint8 (..., n) -> (..., n * 8 / bits) values, the first in the lowest bits."""
    per = 8 // bits
    if per == 1:
        return packed
    shifts = xp.asarray((np.arange(per) * bits).astype(np.uint8))
    vals = (packed[..., None] >> shifts) & np.uint8((1 << bits) - 1)
    return vals.reshape(packed.shape[:-1] + (packed.shape[-1] * per,))


__all__ = ["MatMulNBits"]
