"""ai.onnx.ml SVMClassifier and SVMRegressor (libsvm / liblinear models).

Computed in float64 and rounded once to float32.  Kernels: LINEAR x.s, POLY
(gamma x.s + coef0)^degree, RBF exp(-gamma |x - s|^2), SIGMOID tanh(gamma x.s + coef0)
with kernel_params = [gamma, coef0, degree].  With support vectors the classifier is
libsvm's one-vs-one SVC: one decision value per class pair (i < j), votes for i when
positive, and (with prob_a / prob_b) Platt probabilities coupled by libsvm's
multiclass_probability iteration.  Without support vectors it is liblinear:
scores = X @ coefficients.T + rho[0].  Labels and score layouts follow onnxruntime.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ...dtypes import DataType
from ...tensor import Tensor
from ..base import KernelBase, register
from ._common import apply_post_transform, given, label_output, logistic, parse_post_transform, str_list, to_str
from .linear import batch_rows

_KERNELS = ("LINEAR", "POLY", "RBF", "SIGMOID")


def _kernel_setup(kernel, kernel_type, kernel_params, x):
    kt = to_str(kernel_type).upper()
    if kt not in _KERNELS:
        raise kernel.error(f"kernel_type must be one of {', '.join(_KERNELS)}, got {kt!r}", X=x)
    params = [float(v) for v in (kernel_params or [])]
    if params and len(params) != 3:
        raise kernel.error(f"kernel_params must hold 3 values (gamma, coef0, degree), got {len(params)}", X=x)
    gamma, coef0, degree = params if params else (0.0, 0.0, 0.0)
    return kt, np.float32(gamma).item(), np.float32(coef0).item(), np.float32(degree).item()


def kernel_matrix(xp, rows, vectors, kt, gamma, coef0, degree):
    """K[n, v] = k(rows[n], vectors[v]) in float64."""
    if kt == "RBF":
        sq = (xp.sum(rows * rows, axis=1)[:, None] + xp.sum(vectors * vectors, axis=1)[None, :]
              - 2.0 * (rows @ vectors.T))
        return xp.exp(-gamma * xp.maximum(sq, 0.0))
    dot = rows @ vectors.T
    if kt == "POLY":
        return xp.power(gamma * dot + coef0, degree)
    if kt == "SIGMOID":
        return xp.tanh(gamma * dot + coef0)
    return dot


def _floats(values):
    return np.asarray(list(values) if given(values) else [], dtype=np.float32).astype(np.float64)


def multiclass_probability(xp, r, max_iter=None):
    """libsvm's pairwise coupling (Wu, Lin, Weng 2004, method 2) for every row at once.

    r: [N, k, k] pairwise probabilities (r[:, i, j] = P(i | i or j)).  Returns [N, k].
    Rows iterate until max |Qp - pQp| < 0.005 / k, at most max(100, k) times."""
    n, k, _ = r.shape
    max_iter = max(100, k) if max_iter is None else max_iter
    rt2 = r.transpose(0, 2, 1) ** 2  # rt2[:, i, j] = r[:, j, i]^2
    eye = xp.eye(k, dtype=bool)
    diag = xp.sum(xp.where(eye, 0.0, rt2), axis=2)  # Q[i, i] = sum_{j != i} r[j, i]^2
    q = -r.transpose(0, 2, 1) * r  # Q[i, j] = -r[j, i] r[i, j]
    q = xp.where(eye, diag[:, :, None] * eye, q)
    p = xp.full((n, k), 1.0 / k)
    eps = 0.005 / k
    active = xp.ones(n, dtype=bool)
    for _ in range(max_iter):
        qp = xp.einsum("nij,nj->ni", q, p)
        pqp = xp.sum(p * qp, axis=1)
        err = xp.max(xp.abs(qp - pqp[:, None]), axis=1)
        active = active & ~(err < eps)
        if not bool(active.any()):
            break
        for t in range(k):
            qtt = q[:, t, t]
            diff = xp.where(active, (-qp[:, t] + pqp) / qtt, 0.0)
            p = p.copy()
            p[:, t] = p[:, t] + diff
            pqp = (pqp + diff * (diff * qtt + 2.0 * qp[:, t])) / (1.0 + diff) / (1.0 + diff)
            qp = (qp + diff[:, None] * q[:, t, :]) / (1.0 + diff)[:, None]
            p = p / (1.0 + diff)[:, None]
    return p


@register(domain="ai.onnx.ml")
class SVMClassifier(KernelBase):
    """Y: labels [N]; Z: scores.  SVC without probabilities: Z holds the k(k-1)/2 pair
    decision values (two columns [-d, d] for two classes).  SVC with prob_a/prob_b: Z
    holds the k class probabilities.  In both SVC cases the label is the class with most
    one-vs-one votes (the first on ties), as libsvm and onnxruntime.  Linear mode: Z holds the k
    scores (X @ W.T + rho[0]) and the label the best one.  post_transform applies to Z."""

    class Result(NamedTuple):
        Y: Tensor
        Z: Tensor

    def __call__(self, X, classlabels_ints=None, classlabels_strings=None, coefficients=None,
                 kernel_params=None, kernel_type="LINEAR", post_transform="NONE", prob_a=None,
                 prob_b=None, rho=None, support_vectors=None, vectors_per_class=None):
        x = self.tensor(X, "X")
        self.check_inputs(x)
        mode = parse_post_transform(self, post_transform)
        kt, gamma, coef0, degree = _kernel_setup(self, kernel_type, kernel_params, x)
        if given(classlabels_ints) == given(classlabels_strings):
            raise self.error("exactly one of classlabels_ints and classlabels_strings must be set", X=x)
        using_strings = given(classlabels_strings)
        labels = str_list(classlabels_strings) if using_strings else [int(v) for v in classlabels_ints]
        k = len(labels)
        coefs = _floats(coefficients)
        rho_v = _floats(rho)
        pa, pb = _floats(prob_a), _floats(prob_b)
        if coefs.size == 0:
            raise self.error("attribute 'coefficients' is required", X=x)
        if pa.size != pb.size:
            raise self.error(f"prob_a ({pa.size}) and prob_b ({pb.size}) differ in length", X=x)
        vpc = [int(v) for v in (vectors_per_class or [])]
        n_vec = int(sum(vpc))
        rows = batch_rows(self, x)
        xp = self.xp
        n = rows.shape[0]
        if n_vec == 0:
            return self._linear(x, rows, coefs, rho_v, labels, using_strings, mode)
        if len(vpc) != k or any(v < 0 for v in vpc):
            raise self.error(f"vectors_per_class must have one non-negative entry per class ({k}), got {vpc}", X=x)
        sv = _floats(support_vectors)
        if sv.size % n_vec or sv.size // n_vec != rows.shape[1]:
            raise self.error(f"{sv.size} support vector values do not form {n_vec} vectors of "
                             f"{rows.shape[1]} features", X=x)
        if coefs.size != (k - 1) * n_vec:
            raise self.error(f"coefficients must hold (classes - 1) * vectors = {(k - 1) * n_vec} values, "
                             f"got {coefs.size}", X=x)
        n_pairs = k * (k - 1) // 2
        if rho_v.size != n_pairs:
            raise self.error(f"rho must hold one value per class pair ({n_pairs}), got {rho_v.size}", X=x)
        if pa.size and pa.size != n_pairs:
            raise self.error(f"prob_a must hold one value per class pair ({n_pairs}), got {pa.size}", X=x)
        kmat = kernel_matrix(xp, rows, xp.asarray(sv.reshape(n_vec, -1)), kt, gamma, coef0, degree)
        # decision values of every pair (i, j) as one product kmat @ wpair
        coef_m = coefs.reshape(k - 1, n_vec)
        start = np.concatenate([[0], np.cumsum(vpc)]).astype(np.int64)
        wpair = np.zeros((n_vec, n_pairs))
        pair_i, pair_j = np.triu_indices(k, 1)
        for p, (i, j) in enumerate(zip(pair_i.tolist(), pair_j.tolist())):
            wpair[start[i]:start[i + 1], p] = coef_m[j - 1, start[i]:start[i + 1]]
            wpair[start[j]:start[j + 1], p] = coef_m[i, start[j]:start[j + 1]]
        dec = kmat @ xp.asarray(wpair) + xp.asarray(rho_v)
        # one-vs-one votes pick the label, with or without probabilities (as libsvm's
        # svm_predict and onnxruntime)
        onehot_i = np.zeros((n_pairs, k))
        onehot_i[np.arange(n_pairs), pair_i] = 1
        onehot_j = np.zeros((n_pairs, k))
        onehot_j[np.arange(n_pairs), pair_j] = 1
        pos = (dec > 0).astype(np.float64)
        votes = pos @ xp.asarray(onehot_i) + (1.0 - pos) @ xp.asarray(onehot_j)
        best = xp.argmax(votes, axis=1)
        if pa.size:
            prob = 1.0 - logistic(xp, dec * xp.asarray(pa) + xp.asarray(pb))  # = 1 / (1 + exp(dec A + B))
            prob = xp.clip(prob, 1e-7, 1 - 1e-7)
            r = xp.zeros((n, k, k))
            pi, pj = xp.asarray(pair_i), xp.asarray(pair_j)
            r[:, pi, pj] = prob
            r[:, pj, pi] = 1.0 - prob
            z = apply_post_transform(xp, multiclass_probability(xp, r), mode)
        elif k == 2:
            # onnxruntime writes the single decision value d as [-d, d]
            z = apply_post_transform(xp, xp.concatenate([-dec, dec], axis=1), mode)
        else:
            z = apply_post_transform(xp, dec, mode)
        label = label_output(self, labels, best, using_strings)
        return self.Result(label, self.result(z.astype(np.float32), DataType.FLOAT))

    def _linear(self, x, rows, coefs, rho_v, labels, using_strings, mode):
        xp = self.xp
        k = len(labels)
        if k == 0 or coefs.size % k or coefs.size // k != rows.shape[1]:
            raise self.error(f"{coefs.size} coefficients do not form {k} classes of {rows.shape[1]} "
                             "features (linear mode: no support vectors)", X=x)
        if rho_v.size == 0:
            raise self.error("attribute 'rho' is required", X=x)
        scores = rows @ xp.asarray(coefs.reshape(k, -1)).T + rho_v[0]
        best = xp.argmax(scores, axis=1)
        if k == 2 and rho_v.size == 1:
            # onnxruntime's binary rule: the second label when the best raw score is
            # >= 0.5 (all coefficients non-negative) or > 0 (mixed signs), else the best
            top = xp.max(scores, axis=1)
            positive = (top >= 0.5) if bool((coefs >= 0).all()) else (top > 0)
            best = xp.where(positive, 1, best)
        z = apply_post_transform(xp, scores, mode)
        label = label_output(self, labels, best, using_strings)
        return self.Result(label, self.result(z.astype(np.float32), DataType.FLOAT))


@register(domain="ai.onnx.ml")
class SVMRegressor(KernelBase):
    """Y [N, 1] = sum_v coefficients[v] k(x, sv_v) + rho[0] (n_supports > 0), or
    x . coefficients + rho[0] (linear).  one_class=1 maps Y to +1 / -1 by its sign
    (> 0 gives 1).  post_transform applies to Y otherwise (onnxruntime ignores it)."""

    def __call__(self, X, coefficients=None, kernel_params=None, kernel_type="LINEAR", n_supports=0,
                 one_class=0, post_transform="NONE", rho=None, support_vectors=None):
        x = self.tensor(X, "X")
        self.check_inputs(x)
        mode = parse_post_transform(self, post_transform)
        kt, gamma, coef0, degree = _kernel_setup(self, kernel_type, kernel_params, x)
        coefs = _floats(coefficients)
        rho_v = _floats(rho)
        if rho_v.size == 0:
            raise self.error("attribute 'rho' is required", X=x)
        rows = batch_rows(self, x)
        xp = self.xp
        if n_supports < 0:
            raise self.error(f"n_supports must be non-negative, got {n_supports}", X=x)
        if n_supports > 0:
            sv = _floats(support_vectors)
            if sv.size != n_supports * rows.shape[1]:
                raise self.error(f"{sv.size} support vector values do not form {n_supports} vectors of "
                                 f"{rows.shape[1]} features", X=x)
            if coefs.size != n_supports:
                raise self.error(f"{coefs.size} coefficients for {n_supports} support vectors", X=x)
            kmat = kernel_matrix(xp, rows, xp.asarray(sv.reshape(n_supports, -1)), kt, gamma, coef0, degree)
            y = kmat @ xp.asarray(coefs) + rho_v[0]
        else:
            if coefs.size != rows.shape[1]:
                raise self.error(f"{coefs.size} coefficients for {rows.shape[1]} features (linear mode)", X=x)
            y = rows @ xp.asarray(coefs) + rho_v[0]
        y = y[:, None]
        if one_class:
            y = xp.where(y > 0, 1.0, -1.0)
        else:
            y = apply_post_transform(xp, y, mode)
        return self.result(y.astype(np.float32), DataType.FLOAT)
