"""The ai.onnx.ml post transforms in float64."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np


def post_transform(scores, mode):
    """scores [N, classes] after post_transform mode: NONE, LOGISTIC, PROBIT (the normal
    quantile; +-inf at 0 and 1, NaN outside), SOFTMAX, or SOFTMAX_ZERO (zero scores left
    out of the row's softmax and given 0; an all-zero row stays 0)."""
    s = np.asarray(scores, np.float64)
    if mode == "NONE":
        return s
    if mode == "LOGISTIC":
        return 1 / (1 + np.exp(-s))
    if mode == "PROBIT":
        return np.vectorize(lambda p: NormalDist().inv_cdf(p) if 0 < p < 1 else
                            (-math.inf if p == 0 else math.inf if p == 1 else math.nan))(s)
    out = np.zeros_like(s)
    for i, row in enumerate(s):
        keep = row != 0 if mode == "SOFTMAX_ZERO" else np.ones(row.shape, bool)
        e = np.where(keep, np.exp(row - row[keep].max()) if keep.any() else 0, 0)
        out[i] = e / e.sum() if e.sum() else e
    return out
