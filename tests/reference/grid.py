"""GridSample in float64."""

from __future__ import annotations

import numpy as np


def _cubic(d, a=-0.75):
    d = np.abs(d)
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


def grid_sample(x, grid, mode, padding, align):
    """Linear or cubic sampling of x (N, C, *S) at grid (N, *O, r), zeros or border
    padding, float64: every output point sums its taps' weight * value over the axes'
    tap offsets."""
    x = np.asarray(x, np.float64)
    N, C = x.shape[:2]
    S = x.shape[2:]
    r = len(S)
    O = grid.shape[1:-1]
    g = np.asarray(grid, np.float64).reshape(N, -1, r)
    out = np.zeros((N, C, g.shape[1]))
    offs = [0, 1] if mode == "linear" else [-1, 0, 1, 2]
    for n in range(N):
        coords = []
        for k in range(r):
            L = S[k]
            v = g[n, :, r - 1 - k]
            c = (v + 1) / 2 * (L - 1) if align else ((v + 1) * L - 1) / 2
            if padding == "border":
                c = np.clip(c, 0, L - 1)
            coords.append(c)
        for taps in np.ndindex(*([len(offs)] * r)):
            w = np.ones(g.shape[1])
            inside = np.ones(g.shape[1], bool)
            pos = []
            for k in range(r):
                f = np.floor(coords[k])
                p = f + offs[taps[k]]
                t = coords[k] - p
                w = w * ((1 - np.abs(t)) if mode == "linear" else _cubic(t))
                inside &= (p >= 0) & (p <= S[k] - 1)
                pos.append(np.clip(p, 0, S[k] - 1).astype(int))
            vals = x[n][(slice(None),) + tuple(pos)]  # (C, M)
            if padding == "zeros":
                vals = np.where(inside, vals, 0.0)
            out[n] += w * vals
    return out.reshape((N, C) + O)
