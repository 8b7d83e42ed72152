"""float64 convolution of any spatial rank, grouped, strided, dilated, padded: one
einsum per kernel tap and group (the output is the sum over taps of a strided window of
the padded input times that tap's weights).  Integer inputs (ConvInteger, QLinearConv
after subtracting their zero points) are computed exactly in int64."""

from __future__ import annotations

import itertools

import numpy as np


def conv(x, w, b=None, strides=None, pads=None, dilations=None, group=1):
    """y[n, m, o...] = sum over c in m's group and taps k of xpad[n, c, o*s + k*d] * w[m, c, k]
    (+ b[m]); pads as ONNX lists them (all begins, then all ends)."""
    x = np.asarray(x)
    w = np.asarray(w)
    exact = x.dtype.kind in "iub" and w.dtype.kind in "iub"
    work = np.int64 if exact else np.float64
    x, w = x.astype(work), w.astype(work)
    N, C = x.shape[:2]
    M, Cg = w.shape[:2]
    K = w.shape[2:]
    n = len(K)
    strides = list(strides or [1] * n)
    dilations = list(dilations or [1] * n)
    pads = list(pads or [0] * (2 * n))
    xp = np.pad(x, [(0, 0), (0, 0)] + [(pads[i], pads[i + n]) for i in range(n)])
    out = [(xp.shape[2 + i] - (K[i] - 1) * dilations[i] - 1) // strides[i] + 1 for i in range(n)]
    y = np.zeros((N, M, *[max(o, 0) for o in out]), work)
    if min(out, default=1) > 0 and C:
        Mg = M // group
        for g in range(group):
            xs = xp[:, g * Cg:(g + 1) * Cg]
            ws = w[g * Mg:(g + 1) * Mg]
            for k in itertools.product(*[range(v) for v in K]):
                window = tuple(slice(k[i] * dilations[i], k[i] * dilations[i] + strides[i] * (out[i] - 1) + 1,
                                     strides[i]) for i in range(n))
                patch = xs[(slice(None), slice(None)) + window]
                y[:, g * Mg:(g + 1) * Mg] += np.einsum("nc...,mc->nm...", patch, ws[(slice(None), slice(None)) + k])
    if b is not None:
        y += np.asarray(b).astype(work).reshape((1, M) + (1,) * n)
    return y
