"""MaxPool, AveragePool and LpPool in float64."""

from __future__ import annotations

import itertools

import numpy as np


def pool_out_size(size, k, s, d, pb, pe, ceil_mode):
    ek = (k - 1) * d + 1
    span = size + pb + pe - ek
    o = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (o - 1) * s >= size + pb:
        o -= 1
    return o


def same_pads(sizes, K, strides, dilations, mode):
    n = len(sizes)
    pads = [0] * (2 * n)
    for i in range(n):
        out = -(-sizes[i] // strides[i])
        total = max(0, (out - 1) * strides[i] + (K[i] - 1) * dilations[i] + 1 - sizes[i])
        small = total // 2
        pads[i], pads[i + n] = (small, total - small) if mode == "SAME_UPPER" else (total - small, small)
    return pads


def pool(x, kind, K, strides=None, pads=None, dilations=None, ceil_mode=0, include_pad=0, p=2,
         out=None, storage_order=0):
    """(y, flat argmax indices for 'max') window by window in float64; kind 'max', 'avg'
    or 'lp'.  A max over a window with a NaN is NaN; a window with no value gives -inf
    (max) or NaN (avg)."""
    x = np.asarray(x, np.float64)
    N, C = x.shape[:2]
    S = x.shape[2:]
    n = len(S)
    strides = strides or [1] * n
    dilations = dilations or [1] * n
    pads = pads or [0] * (2 * n)
    if out is None:
        out = [pool_out_size(S[i], K[i], strides[i], dilations[i], pads[i], pads[i + n], ceil_mode) for i in range(n)]
    y = np.zeros((N, C, *out))
    idx = np.zeros((N, C, *out), np.int64)
    for nn, c in itertools.product(range(N), range(C)):
        for o in itertools.product(*[range(v) for v in out]):
            vals, where, count = [], [], 0
            for k in itertools.product(*[range(v) for v in K]):
                pos = [o[i] * strides[i] - pads[i] + k[i] * dilations[i] for i in range(n)]
                inside = all(0 <= pos[i] < S[i] for i in range(n))
                in_padded = all(-pads[i] <= pos[i] < S[i] + pads[i + n] for i in range(n))
                if inside:
                    vals.append(x[(nn, c) + tuple(pos)])
                    where.append(pos)
                if (include_pad and in_padded) or inside:
                    count += 1
            if kind == "max" and not vals:
                y[(nn, c) + o] = -np.inf
            elif kind == "max":
                j = int(np.argmax(vals))  # the first NaN when there is one
                y[(nn, c) + o] = vals[j]
                pos = where[j]
                if storage_order:
                    flat = sum(pos[i] * int(np.prod(S[:i])) for i in range(n))
                else:
                    flat = sum(pos[i] * int(np.prod(S[i + 1:])) for i in range(n))
                idx[(nn, c) + o] = (nn * C + c) * int(np.prod(S)) + flat
            elif kind == "avg":
                y[(nn, c) + o] = sum(vals) / count if count else np.nan
            else:
                y[(nn, c) + o] = sum(abs(v) ** p for v in vals) ** (1.0 / p)
    return y, idx
