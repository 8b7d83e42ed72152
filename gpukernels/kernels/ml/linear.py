"""ai.onnx.ml LinearClassifier and LinearRegressor.

Scores are computed in float64 (X @ W.T + b) and rounded once to float32.  The input is
[N, F] or [F] (one row).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ...dtypes import DataType
from ...tensor import Tensor
from ..base import KernelBase, register
from ._common import apply_post_transform, given, label_output, parse_post_transform, str_list


def batch_rows(kernel, x: Tensor):
    """X as a float64 [N, F] array: 1-D is one row, 2-D as is."""
    if x.ndim not in (1, 2):
        raise kernel.error("X must be 1-D or 2-D", X=x)
    a = x.array.astype(np.float64)
    return a.reshape(1, -1) if x.ndim == 1 else a


@register(domain="ai.onnx.ml")
class LinearClassifier(KernelBase):
    """scores = X @ W.T + intercepts with W = coefficients as [C, F]; C is the number of
    intercepts (or of class labels when intercepts are absent).  C > 1: the label is the
    class with the highest score (the first on ties).  C == 1 (binary, exactly two
    labels): the label is the second class label when score > 0, else the first, and Z
    has two columns [1 - t, t] with t the transformed score (onnxruntime's layout;
    SOFTMAX / SOFTMAX_ZERO of a single score leave it unchanged)."""

    class Result(NamedTuple):
        Y: Tensor
        Z: Tensor

    def __call__(self, X, coefficients=None, classlabels_ints=None, classlabels_strings=None,
                 intercepts=None, multi_class=0, post_transform="NONE"):
        x = self.tensor(X, "X")
        self.check_inputs(x)
        mode = parse_post_transform(self, post_transform)
        if not given(coefficients):
            raise self.error("attribute 'coefficients' is required", X=x)
        if given(classlabels_ints) == given(classlabels_strings):
            raise self.error("exactly one of classlabels_ints and classlabels_strings must be set", X=x)
        using_strings = given(classlabels_strings)
        labels = str_list(classlabels_strings) if using_strings else [int(v) for v in classlabels_ints]
        coefs = np.asarray(coefficients, dtype=np.float32).astype(np.float64)
        n_classes = len(intercepts) if given(intercepts) else len(labels)
        if n_classes == 0 or coefs.size % n_classes:
            raise self.error(f"{coefs.size} coefficients do not split into {n_classes} classes", X=x)
        rows = batch_rows(self, x)
        n_feat = coefs.size // n_classes
        if rows.shape[1] != n_feat:
            raise self.error(f"X has {rows.shape[1]} features; the coefficients expect {n_feat}", X=x)
        if n_classes > 1 and len(labels) != n_classes:
            raise self.error(f"{len(labels)} class labels for {n_classes} classes", X=x)
        xp = self.xp
        w = xp.asarray(coefs.reshape(n_classes, n_feat))
        scores = rows @ w.T
        if given(intercepts):
            scores = scores + xp.asarray(np.asarray(intercepts, dtype=np.float32).astype(np.float64))
        if n_classes == 1:
            if len(labels) != 2:
                raise self.error(f"binary classification (one set of coefficients) needs exactly 2 class "
                                 f"labels, got {len(labels)}", X=x)
            s = scores[:, 0]
            label = label_output(self, labels, (s > 0).astype(np.int64), using_strings)
            # softmax of a single score is meaningless: the SOFTMAX modes keep it as is
            t = s if mode in ("SOFTMAX", "SOFTMAX_ZERO") else apply_post_transform(xp, s, mode)
            z = xp.stack([1.0 - t, t], axis=-1)
        else:
            index = xp.argmax(scores, axis=1)
            label = label_output(self, labels, index, using_strings)
            z = apply_post_transform(xp, scores, mode)
        return self.Result(label, self.result(z.astype(np.float32), DataType.FLOAT))


@register(domain="ai.onnx.ml")
class LinearRegressor(KernelBase):
    """Y = X @ W.T + intercepts, W = coefficients as [targets, F]; post_transform is
    applied along the targets, also for a single target (onnxruntime skips it there)."""

    def __call__(self, X, coefficients=None, intercepts=None, post_transform="NONE", targets=1):
        x = self.tensor(X, "X")
        self.check_inputs(x)
        mode = parse_post_transform(self, post_transform)
        if targets < 1:
            raise self.error(f"targets must be positive, got {targets}", X=x)
        coefs = np.asarray(coefficients if given(coefficients) else [], dtype=np.float32).astype(np.float64)
        if coefs.size == 0 or coefs.size % targets:
            raise self.error(f"{coefs.size} coefficients do not split into {targets} targets", X=x)
        rows = batch_rows(self, x)
        n_feat = coefs.size // targets
        if rows.shape[1] != n_feat:
            raise self.error(f"X has {rows.shape[1]} features; the coefficients expect {n_feat}", X=x)
        xp = self.xp
        y = rows @ xp.asarray(coefs.reshape(targets, n_feat)).T
        if given(intercepts):
            b = np.asarray(intercepts, dtype=np.float32).astype(np.float64)
            if b.size not in (1, targets):
                raise self.error(f"{b.size} intercepts for {targets} targets", X=x)
            y = y + xp.asarray(b)
        y = apply_post_transform(xp, y, mode)
        return self.result(y.astype(np.float32), DataType.FLOAT)
