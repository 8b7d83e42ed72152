"""ScatterND."""

from __future__ import annotations

import numpy as np


def scatter_nd(data, indices, updates):
    """ScatterND without reduction, update by update (the last of repeated indices wins)."""
    out = np.array(data, copy=True)
    k = indices.shape[-1]
    idx = indices.reshape(-1, k)
    upd = updates.reshape((idx.shape[0],) + data.shape[k:])
    for j in range(idx.shape[0]):  # in order: the last of repeated tuples wins
        out[tuple(idx[j])] = upd[j]
    return out
