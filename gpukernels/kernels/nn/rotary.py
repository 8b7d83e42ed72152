"""RotaryEmbedding (opset 23): rotary positional embedding (RoPE).

X is (batch, num_heads, seq, head_size) or (batch, seq, num_heads * head_size) with the
num_heads attribute.  The first rotary_embedding_dim features of each head (all when 0)
are rotated in pairs -- (x[i], x[i + d/2]) or, interleaved, (x[2i], x[2i + 1]) -- by the
angle whose cos/sin the caches hold; the rest pass through.  cos_cache/sin_cache are
(max_position, d/2) indexed by position_ids (batch, seq), or (batch, seq, d/2) when
position_ids is absent.

Choices: position_ids must lie in [0, max_position) (an error otherwise, never a
wrap-around); num_heads given with a 4-D X must equal X's head count; half types
compute in float32 and round once.
"""

from __future__ import annotations

import numpy as np

from ...xp import parallel_ranges
from ..base import KernelBase, register


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
                lo, hi = int(self.xp.min(pid.array)), int(self.xp.max(pid.array))
                if lo < 0 or hi >= cos.shape[0]:
                    raise self.error(f"position_ids must lie in [0, {cos.shape[0]}), got values in "
                                     f"[{lo}, {hi}]", **shapes)
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
            c = xp.take(c, idx, axis=0)  # (B, S, half)
            s = xp.take(s, idx, axis=0)
        if x.ndim == 4:
            c = c[:, None, :, :]  # (B, 1, S, half)
            s = s[:, None, :, :]
            x4 = xc
        else:
            c = c[:, :, None, :]  # (B, S, 1, half)
            s = s[:, :, None, :]
            x4 = xc.reshape(B, S, H, hd)
        y = xp.empty_like(x4)
        # On the host, work through cache-sized blocks of axis 1 (heads for 4-D, positions
        # for 3-D): the six passes below then stay in cache.  On a GPU: one block.
        n1 = x4.shape[1]
        per = max(1, x4.size // max(n1, 1))
        step = n1 if xp is not np else max(1, min(n1, (1 << 17) // per))

        if xp is np and not interleaved:
            # full-width factors: y = x * [c, c] + swap_halves(x) * [-s, s] -- long inner
            # loops, and bit-identical to _rotate (c*a + (-s)*b == c*a - s*b exactly)
            c = np.concatenate([c, c], axis=-1)
            s = np.concatenate([-s, s], axis=-1)

        def blocks(lo, hi):
            for i0 in range(lo, hi, step):
                i1 = min(hi, i0 + step)
                cb, sb = (c, s) if x.ndim == 4 else (c[:, i0:i1], s[:, i0:i1])
                if xp is np and not interleaved:
                    self._rotate_halves_host(x4[:, i0:i1], y[:, i0:i1], cb, sb, rd)
                else:
                    self._rotate(xp, x4[:, i0:i1], y[:, i0:i1], cb, sb, rd, interleaved)
                if rd < hd:
                    y[:, i0:i1, ..., rd:] = x4[:, i0:i1, ..., rd:]

        if xp is np:
            parallel_ranges(n1, 2 * step, blocks)  # independent blocks over host threads
        else:
            blocks(0, n1)
        return self.from_compute(y.reshape(x.shape), x.data_type)

    @staticmethod
    def _rotate_halves_host(x4, y, c2, s2, rd):
        """Host, non-interleaved: c2 = [c, c], s2 = [-s, s] over the rotary width."""
        half = rd // 2
        xr, yr = x4[..., :rd], y[..., :rd]
        np.multiply(xr, c2, out=yr)
        split = xr.shape[:-1] + (2, half)
        t = np.multiply(xr.reshape(split)[..., ::-1, :], s2.reshape(s2.shape[:-1] + (2, half)))
        yr += t.reshape(yr.shape)

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
