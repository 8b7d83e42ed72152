"""RotaryEmbedding (opset 23): rotary positional embedding (RoPE).

X is (batch, num_heads, seq, head_size) or (batch, seq, num_heads * head_size) with the
num_heads attribute.  The first rotary_embedding_dim features of each head (all when 0)
are rotated in pairs -- (x[i], x[i + d/2]) or, interleaved, (x[2i], x[2i + 1]) -- by the
angle whose cos/sin the caches hold; the rest pass through.  cos_cache/sin_cache are
(max_position, d/2) indexed by position_ids (batch, seq), or (batch, seq, d/2) when
position_ids is absent.

Choices: position_ids must lie in [0, max_position) (an error otherwise, never a
wrap-around; on a GPU the range test runs on the device and is read once per graph run,
or once per call outside a run: see gpukernels.gpu.device_checks; without position_ids a
call makes no device-to-host transfer); num_heads given with a 4-D X must equal X's head count; half types
compute in float32 and round once.
"""

from __future__ import annotations

import numpy as np

from ...gpu import device_checks
from ...host import tuning
from ...host import host_empty
from ..base import KernelBase, register
from ..specialize import specialize


@register()
class RotaryEmbedding(KernelBase):
    def __call__(self, X, cos_cache, sin_cache, position_ids=None, interleaved=0, num_heads=None,
                 rotary_embedding_dim=0):
        x = self.tensor(X, "X")
        cos = self.tensor(cos_cache, "cos_cache")
        sin = self.tensor(sin_cache, "sin_cache")
        pid = self.tensor(position_ids, "position_ids", optional=True)
        self.check_inputs(x, cos, sin, pid)
        shapes = dict(X=x, cos_cache=cos, sin_cache=sin, position_ids=pid)

        if x.ndim == 4:
            B, H, S, hd = x.shape
            if num_heads is not None and int(num_heads) not in (0, H):
                raise self.error(f"num_heads={num_heads} disagrees with the 4-D input's {H} heads", **shapes)
        elif x.ndim == 3:
            B, S, hidden = x.shape
            if not num_heads:
                raise self.error("a 3-D input needs the num_heads attribute", **shapes)
            H = int(num_heads)
            if H < 0 or hidden % H:
                raise self.error(f"hidden size {hidden} is not divisible by num_heads={H}", **shapes)
            hd = hidden // H
        else:
            raise self.error(f"X must be 3-D or 4-D, got rank {x.ndim}", **shapes)
        rd = int(rotary_embedding_dim or 0)
        if rd == 0:
            rd = hd
        if rd < 0 or rd > hd or rd % 2:
            raise self.error(f"rotary_embedding_dim ({rd}) must be even and at most the head size {hd}",
                             **shapes)
        half = rd // 2
        if cos.shape != sin.shape:
            raise self.error("cos_cache and sin_cache must have the same shape", **shapes)
        if pid.is_absent:
            if cos.shape != (B, S, half):
                raise self.error(f"without position_ids the caches must have shape (batch, seq, "
                                 f"rotary_dim/2) = ({B}, {S}, {half})", **shapes)
        else:
            if cos.ndim != 2 or cos.shape[1] != half:
                raise self.error(f"with position_ids the caches must have shape (max_position, "
                                 f"rotary_dim/2 = {half})", **shapes)
            if pid.shape != (B, S):
                raise self.error(f"position_ids must have shape (batch, seq) = ({B}, {S})", **shapes)
            if pid.size:
                self._check_positions(pid, cos.shape[0], shapes)
        interleaved = int(interleaved)

        fast = self.cuda_path(X=x, cos_cache=cos, sin_cache=sin, position_ids=pid, interleaved=interleaved,
                              num_heads=H, rotary_embedding_dim=rd)
        if fast is not None:
            return fast

        xp = self.xp
        xc = self.to_compute(x)
        c = self.to_compute(cos)
        s = self.to_compute(sin)
        if not pid.is_absent:
            idx = pid.array.astype(np.int64)
            c = xp.take(c, idx, axis=0)  # (B, S, half): gathered once per position, not per head
            s = xp.take(s, idx, axis=0)
        if x.ndim == 4:
            c = c[:, None, :, :]  # (B, 1, S, half)
            s = s[:, None, :, :]
            x4 = xc
        else:
            c = c[:, :, None, :]  # (B, S, 1, half)
            s = s[:, :, None, :]
            x4 = xc.reshape(B, S, H, hd)
        fast = self.specialized("RotaryEmbedding.rotate", x4)
        if fast is not None:
            y = fast(x4, c, s, rd, interleaved)
        else:
            y = xp.empty_like(x4)
            self._rotate(xp, x4, y, c, s, rd, interleaved)
            if rd < hd:
                y[..., rd:] = x4[..., rd:]
        return self.from_compute(y.reshape(x.shape), x.data_type)

    def _check_positions(self, pid, limit: int, shapes: dict) -> None:
        """position_ids inside [0, limit).  On a GPU the test runs on the device and is read
        through gpu.device_checks: once per graph run, or once per call outside one (the one
        synchronisation of this kernel); the CUDA kernel and CuPy's take stay memory-safe
        for bad ids meanwhile (NaN rows / wrapped ids, replaced by the error)."""
        xp = self.xp
        ids = pid.array

        def error():
            lo, hi = int(xp.min(ids)), int(xp.max(ids))  # read back on the error path only
            return self.error(f"position_ids must lie in [0, {limit}), got values in [{lo}, {hi}]", **shapes)

        # the same test on both devices (device_checks reads a host result at once);
        # int64 seen as uint64: negative ids become >= 2**63, so one max covers both ends
        bad = ids.astype(np.int64, copy=False).view(np.uint64).max() >= np.uint64(limit)
        device_checks.require(bad, error)

    @staticmethod
    def _rotate(xp, x4, y, c, s, rd, interleaved):
        half = rd // 2
        if interleaved:
            a, b = x4[..., 0:rd:2], x4[..., 1:rd:2]
            ya, yb = y[..., 0:rd:2], y[..., 1:rd:2]
        else:
            a, b = x4[..., :half], x4[..., half:rd]
            ya, yb = y[..., :half], y[..., half:rd]
        tmp = xp.multiply(s, b)
        xp.multiply(c, a, out=ya)
        ya -= tmp  # cos * a - sin * b
        xp.multiply(c, b, out=tmp)
        xp.multiply(s, a, out=yb)
        yb += tmp  # sin * a + cos * b


@specialize("RotaryEmbedding.rotate", device="cpu", ops=("RotaryEmbedding",),
            agreement="rtol 1e-6 (float32): interleaved pairs as one complex multiply")
def _rotate_host(x4, c, s, rd, interleaved):
    """NumPy path: X rotated (a new C-contiguous array), over cache-sized blocks of axis 1 (heads for 4-D X,
    positions for 3-D).  c/s broadcast against X's first three axes with rd/2 features.

    Interleaved pairs (x[2i], x[2i+1]) are complex numbers rotated by one complex
    multiply by cos + i sin (one pass).  Split halves (x[i], x[i+rd/2]) take four
    full-width passes with long inner loops: t = halves-swapped X, t *= [-sin, sin],
    y = X * [cos, cos], y += t.
    """
    x4 = np.ascontiguousarray(x4)  # complex views need a contiguous last axis
    y = host_empty(x4.shape, x4.dtype)  # a reusable buffer: no page faults on repeated calls
    n1 = x4.shape[1]
    hd = x4.shape[-1]
    per = max(1, x4.size // max(n1, 1))
    # blocks of rotary.host_block_elems (host/tuning.py): the passes over a block run in cache
    step = max(1, min(n1, tuning.value("rotary.host_block_elems") // per))
    half = rd // 2
    if interleaved:
        # complex64 for float32 X, complex128 for float64 X (a view of X's pairs)
        e = np.empty(np.broadcast_shapes(c.shape, s.shape), dtype=np.result_type(x4.dtype, np.complex64))
        e.real = c
        e.imag = s
        c2 = s2 = None
    else:
        c2 = np.concatenate([c, c], axis=-1)
        s2 = np.concatenate([-s, s], axis=-1)

    def block_factors(f, i0, i1):
        # 4-D: factors broadcast over heads; 3-D: they follow the positions of axis 1
        return f if f.shape[1] == 1 else f[:, i0:i1]

    def work(lo, hi):  # blocks of axis 1 in [lo, hi)
        tmp = None
        for i0 in range(lo, hi, step):
            i1 = min(hi, i0 + step)
            xb, yb = x4[:, i0:i1], y[:, i0:i1]
            xr, yr = xb[..., :rd], yb[..., :rd]
            if interleaved:
                np.multiply(xr.view(e.dtype), block_factors(e, i0, i1), out=yr.view(e.dtype))
            else:
                if tmp is None:
                    tmp = np.empty(xb.shape[:-1] + (rd,), dtype=y.dtype)
                t = tmp[:, :i1 - i0]
                split = xr.shape[:-1] + (2, half)
                np.copyto(t.reshape(split), xr.reshape(split)[..., ::-1, :])
                np.multiply(t, block_factors(s2, i0, i1), out=t)
                np.multiply(xr, block_factors(c2, i0, i1), out=yr)
                yr += t
            if rd < hd:
                yb[..., rd:] = xb[..., rd:]

    if y.size:
        # one thread: the passes are cheap next to streaming X in and Y out, and on the
        # 2-core host a second thread measured no faster (memory-bound), often slower
        work(0, n1)
    return y
