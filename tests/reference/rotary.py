"""RotaryEmbedding in float64."""

from __future__ import annotations

import numpy as np


def rotary(x, cos, sin, pos=None, interleaved=0, num_heads=None, rd=0):
    """RotaryEmbedding pair by pair in float64 (x 4-D, or 3-D with num_heads); rd: the
    rotated width (0: all); pos None: cos/sin indexed by (batch, position)."""
    x = np.asarray(x, np.float64)
    cos, sin = np.asarray(cos, np.float64), np.asarray(sin, np.float64)
    if x.ndim == 3:
        B, S, hid = x.shape
        x4 = x.reshape(B, S, num_heads, hid // num_heads).transpose(0, 2, 1, 3)
    else:
        x4 = x
    B, H, S, hd = x4.shape
    rd = rd or hd
    y = x4.copy()
    for b in range(B):
        for s in range(S):
            c = cos[pos[b, s]] if pos is not None else cos[b, s]
            sn = sin[pos[b, s]] if pos is not None else sin[b, s]
            for h in range(H):
                for i in range(rd // 2):
                    a_i, b_i = (2 * i, 2 * i + 1) if interleaved else (i, i + rd // 2)
                    xa, xb = x4[b, h, s, a_i], x4[b, h, s, b_i]
                    y[b, h, s, a_i] = c[i] * xa - sn[i] * xb
                    y[b, h, s, b_i] = sn[i] * xa + c[i] * xb
    if x.ndim == 3:
        y = y.transpose(0, 2, 1, 3).reshape(x.shape)
    return y
