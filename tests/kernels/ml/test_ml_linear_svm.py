"""LinearClassifier, LinearRegressor, SVMClassifier, SVMRegressor and the post
transforms."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest

from gpukernels.errors import KernelInputError, KernelTypeError
from gpukernels.kernels import KernelContext
from gpukernels.kernels.ml._common import probit
from gpukernels.kernels.ml.linear import LinearClassifier, LinearRegressor
from gpukernels.kernels.ml.svm import SVMClassifier, SVMRegressor

from tests.ort_reference import run_ml_node
from tests.reference import post_transform

TRANSFORMS = ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO", "PROBIT"]


def K(cls, device):
    return cls(KernelContext(device))


def test_probit_accuracy():
    p = np.concatenate([np.linspace(1e-12, 1 - 1e-12, 2001), [1e-300, 0.02425, 0.97575, 0.5]])
    want = np.array([NormalDist().inv_cdf(v) for v in p])
    np.testing.assert_allclose(probit(np, p), want, rtol=2e-9, atol=1e-12)
    edge = probit(np, np.array([0.0, 1.0, -0.5, 1.5, np.nan]))
    assert edge[0] == -np.inf and edge[1] == np.inf and np.isnan(edge[2:]).all()


@pytest.mark.parametrize("mode", TRANSFORMS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.int32])
def test_linear_classifier_multiclass(device, rng, mode, dtype):
    x = (rng.standard_normal((7, 4)) * 2).astype(dtype)
    w = rng.standard_normal((3, 4))
    b = rng.standard_normal(3)
    if mode == "PROBIT":  # scores inside (0, 1) so probit is defined
        w, b = np.abs(w) * 0.01, np.full(3, 0.5)
    attrs = dict(coefficients=w.reshape(-1).tolist(), intercepts=b.tolist(), classlabels_ints=[3, 5, 8],
                 post_transform=mode)
    r = K(LinearClassifier, device)(x, **attrs)
    scores = x.astype(np.float64) @ np.float32(w).T.astype(np.float64) + np.float32(b)
    np.testing.assert_array_equal(r.Y.numpy(), np.array([3, 5, 8])[scores.argmax(1)])
    np.testing.assert_allclose(r.Z.numpy(), post_transform(scores, mode), rtol=2e-5, atol=1e-6)
    assert r.Z.numpy().dtype == np.float32
    if mode != "PROBIT":  # onnxruntime's probit is a coarse erfinv approximation
        ort_y, ort_z = run_ml_node("LinearClassifier", [x], attrs, n_outputs=2)
        np.testing.assert_array_equal(r.Y.numpy(), ort_y)
        np.testing.assert_allclose(r.Z.numpy(), ort_z, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO"])
def test_linear_classifier_binary(device, rng, mode):
    x = rng.standard_normal((9, 3)).astype(np.float32)
    w = rng.standard_normal(3)
    attrs = dict(coefficients=w.tolist(), intercepts=[0.2], classlabels_strings=["neg", "pos"], post_transform=mode)
    r = K(LinearClassifier, device)(x, **attrs)
    s = x.astype(np.float64) @ np.float32(w).astype(np.float64) + np.float32(0.2)
    assert r.Y.numpy().tolist() == ["pos" if v > 0 else "neg" for v in s]
    t = 1 / (1 + np.exp(-s)) if mode == "LOGISTIC" else s
    np.testing.assert_allclose(r.Z.numpy(), np.stack([1 - t, t], 1), rtol=1e-5, atol=1e-6)
    ort_y, ort_z = run_ml_node("LinearClassifier", [x], attrs, n_outputs=2)
    np.testing.assert_array_equal(r.Y.numpy(), ort_y)
    np.testing.assert_allclose(r.Z.numpy(), ort_z, rtol=1e-5, atol=1e-6)


def test_linear_classifier_errors(device):
    x = np.ones((2, 3), np.float32)
    with pytest.raises(KernelInputError, match="LinearClassifier.*features"):
        K(LinearClassifier, device)(x, coefficients=[1.0] * 8, intercepts=[0, 0], classlabels_ints=[1, 2])
    with pytest.raises(KernelInputError, match="LinearClassifier.*coefficients"):
        K(LinearClassifier, device)(x, classlabels_ints=[1, 2])
    with pytest.raises(KernelInputError, match="LinearClassifier.*exactly 2"):
        K(LinearClassifier, device)(x, coefficients=[1.0] * 3, intercepts=[0.0], classlabels_ints=[1, 2, 3])
    with pytest.raises(KernelInputError, match="LinearClassifier.*post_transform"):
        K(LinearClassifier, device)(x, coefficients=[1.0] * 3, intercepts=[0.0], classlabels_ints=[1, 2],
                                    post_transform="TANH")
    with pytest.raises(KernelTypeError, match="LinearClassifier"):
        K(LinearClassifier, device)(x.astype(np.float16), coefficients=[1.0] * 3, intercepts=[0.0],
                                    classlabels_ints=[1, 2])


@pytest.mark.parametrize("mode", TRANSFORMS)
@pytest.mark.parametrize("targets", [1, 3])
def test_linear_regressor(device, rng, mode, targets):
    x = rng.standard_normal((6, 5)).astype(np.float32)
    w = rng.standard_normal((targets, 5)) * (0.01 if mode == "PROBIT" else 1)
    b = np.full(targets, 0.5) if mode == "PROBIT" else rng.standard_normal(targets)
    attrs = dict(coefficients=w.reshape(-1).tolist(), intercepts=b.tolist(), targets=targets, post_transform=mode)
    y = K(LinearRegressor, device)(x, **attrs).numpy()
    raw = x.astype(np.float64) @ np.float32(w).T.astype(np.float64) + np.float32(b)
    np.testing.assert_allclose(y, post_transform(raw, mode), rtol=2e-5, atol=1e-6)
    # onnxruntime skips post_transform for a single target (the spec applies it)
    if mode == "NONE" or (targets > 1 and mode in ("LOGISTIC", "SOFTMAX")):
        np.testing.assert_allclose(y, run_ml_node("LinearRegressor", [x], attrs)[0], rtol=1e-5, atol=1e-6)
    assert K(LinearRegressor, device)(x[:0], **attrs).numpy().shape == (0, targets)
    with pytest.raises(KernelInputError, match="LinearRegressor.*targets"):
        K(LinearRegressor, device)(x, coefficients=[1.0] * 5, targets=2)


def _kernel(a, b, kind, gamma=0.3, coef0=0.5, degree=2.0):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if kind == "LINEAR":
        return a @ b
    if kind == "POLY":
        return (gamma * (a @ b) + coef0) ** degree
    if kind == "SIGMOID":
        return math.tanh(gamma * (a @ b) + coef0)
    return math.exp(-gamma * ((a - b) ** 2).sum())


def _svc_ref(x, attrs):
    """libsvm one-vs-one prediction, sample by sample (decision values, votes)."""
    vpc = attrs["vectors_per_class"]
    k = len(vpc)
    sv = np.float32(attrs["support_vectors"]).astype(np.float64).reshape(sum(vpc), -1)
    coef = np.float32(attrs["coefficients"]).astype(np.float64).reshape(k - 1, -1)
    rho = np.float32(attrs["rho"]).astype(np.float64)
    start = np.concatenate([[0], np.cumsum(vpc)])
    decs, votes = [], []
    for row in x.astype(np.float64):
        kv = np.array([_kernel(row, s, attrs["kernel_type"]) for s in sv])
        d, v, p = [], np.zeros(k), 0
        for i in range(k):
            for j in range(i + 1, k):
                s = (coef[j - 1, start[i]:start[i + 1]] @ kv[start[i]:start[i + 1]]
                     + coef[i, start[j]:start[j + 1]] @ kv[start[j]:start[j + 1]] + rho[p])
                d.append(s)
                v[i if s > 0 else j] += 1
                p += 1
        decs.append(d)
        votes.append(v)
    return np.array(decs), np.array(votes)


def _svc_attrs(rng, k, kernel, proba, strings=False):
    vpc = rng.integers(1, 4, size=k).tolist()
    nv, npairs = sum(vpc), k * (k - 1) // 2
    attrs = dict(coefficients=rng.standard_normal((k - 1) * nv).tolist(), kernel_params=[0.3, 0.5, 2.0],
                 kernel_type=kernel, rho=rng.standard_normal(npairs).tolist(),
                 support_vectors=rng.standard_normal(nv * 3).tolist(), vectors_per_class=vpc)
    if strings:
        attrs["classlabels_strings"] = [f"c{i}" for i in range(k)]
    else:
        attrs["classlabels_ints"] = list(range(10, 10 + k))
    if proba:
        attrs.update(prob_a=(-np.abs(rng.standard_normal(npairs))).tolist(),
                     prob_b=rng.standard_normal(npairs).tolist())
    return attrs


@pytest.mark.parametrize("kernel", ["LINEAR", "POLY", "RBF", "SIGMOID"])
@pytest.mark.parametrize("k", [2, 3, 4])
@pytest.mark.parametrize("proba", [False, True])
def test_svm_classifier_svc(device, rng, kernel, k, proba):
    x = rng.standard_normal((8, 3)).astype(np.float32)
    attrs = _svc_attrs(rng, k, kernel, proba, strings=(k == 3))
    r = K(SVMClassifier, device)(x, **attrs)
    dec, votes = _svc_ref(x, attrs)
    labels = attrs.get("classlabels_ints") or attrs["classlabels_strings"]
    assert r.Y.numpy().tolist() == [labels[i] for i in votes.argmax(1)]
    z = r.Z.numpy()
    if proba:
        assert z.shape == (8, k)
        np.testing.assert_allclose(z.sum(1), 1, rtol=1e-5)
    else:
        want = np.concatenate([-dec, dec], 1) if k == 2 else dec
        np.testing.assert_allclose(z, want, rtol=1e-5, atol=1e-5)
    ort_y, ort_z = run_ml_node("SVMClassifier", [x], attrs, n_outputs=2)
    np.testing.assert_array_equal(r.Y.numpy(), ort_y)
    np.testing.assert_allclose(z, ort_z, rtol=1e-4, atol=1e-5)


def test_svm_pairwise_coupling_two_classes(device):
    # with two classes the coupled probabilities are the Platt probabilities themselves
    from gpukernels.kernels.ml.svm import multiclass_probability
    p = np.array([0.2, 0.7, 0.9])
    r = np.zeros((3, 2, 2))
    r[:, 0, 1], r[:, 1, 0] = p, 1 - p
    np.testing.assert_allclose(multiclass_probability(np, r), np.stack([p, 1 - p], 1), atol=1e-3)


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("mode", ["NONE", "LOGISTIC", "SOFTMAX"])
def test_svm_classifier_linear_mode(device, rng, k, mode):
    x = rng.standard_normal((10, 3)).astype(np.float32)
    w = rng.standard_normal((k, 3))
    attrs = dict(classlabels_strings=[f"c{i}" for i in range(k)], coefficients=w.reshape(-1).tolist(), rho=[0.3],
                 kernel_params=[0.3, 0.5, 2.0], post_transform=mode)
    r = K(SVMClassifier, device)(x, **attrs)
    s = x.astype(np.float64) @ np.float32(w).T.astype(np.float64) + np.float32(0.3)
    np.testing.assert_allclose(r.Z.numpy(), post_transform(s, mode), rtol=1e-5, atol=1e-6)
    ort_y, ort_z = run_ml_node("SVMClassifier", [x], attrs, n_outputs=2)
    np.testing.assert_array_equal(r.Y.numpy(), ort_y)
    np.testing.assert_allclose(r.Z.numpy(), ort_z, rtol=1e-5, atol=1e-6)


def test_svm_classifier_errors(device, rng):
    x = rng.standard_normal((2, 3)).astype(np.float32)
    attrs = _svc_attrs(rng, 3, "RBF", False)
    bad = dict(attrs, rho=[0.0])
    with pytest.raises(KernelInputError, match="SVMClassifier.*rho"):
        K(SVMClassifier, device)(x, **bad)
    with pytest.raises(KernelInputError, match="SVMClassifier.*support vector"):
        K(SVMClassifier, device)(x[:, :2], **attrs)
    with pytest.raises(KernelInputError, match="SVMClassifier.*kernel_type"):
        K(SVMClassifier, device)(x, **dict(attrs, kernel_type="CUBIC"))


@pytest.mark.parametrize("kernel", ["LINEAR", "POLY", "RBF", "SIGMOID"])
@pytest.mark.parametrize("one_class", [0, 1])
def test_svm_regressor(device, rng, kernel, one_class):
    x = rng.standard_normal((7, 3)).astype(np.float32)
    ns = 4
    attrs = dict(coefficients=rng.standard_normal(ns).tolist(), kernel_params=[0.3, 0.5, 2.0], kernel_type=kernel,
                 n_supports=ns, one_class=one_class, rho=[0.2], support_vectors=rng.standard_normal(ns * 3).tolist())
    y = K(SVMRegressor, device)(x, **attrs).numpy()
    sv = np.float32(attrs["support_vectors"]).reshape(ns, 3)
    c = np.float32(attrs["coefficients"]).astype(np.float64)
    want = np.array([[sum(c[j] * _kernel(row, sv[j], kernel) for j in range(ns)) + np.float32(0.2)]
                     for row in x.astype(np.float64)])
    if one_class:
        want = np.where(want > 0, 1.0, -1.0)
    assert y.shape == (7, 1)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y, run_ml_node("SVMRegressor", [x], attrs)[0], rtol=1e-4, atol=1e-5)


def test_svm_regressor_linear_and_transform(device, rng):
    x = rng.standard_normal((5, 3)).astype(np.float32)
    w = rng.standard_normal(3)
    attrs = dict(coefficients=w.tolist(), rho=[0.2], kernel_params=[0.3, 0.5, 2.0])
    y = K(SVMRegressor, device)(x, **attrs).numpy()
    raw = x.astype(np.float64) @ np.float32(w).astype(np.float64) + np.float32(0.2)
    np.testing.assert_allclose(y[:, 0], raw, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(y, run_ml_node("SVMRegressor", [x], attrs)[0], rtol=1e-5, atol=1e-6)
    # post_transform is applied (onnxruntime ignores it)
    yl = K(SVMRegressor, device)(x, post_transform="LOGISTIC", **attrs).numpy()
    np.testing.assert_allclose(yl[:, 0], 1 / (1 + np.exp(-raw)), rtol=1e-5)
    with pytest.raises(KernelInputError, match="SVMRegressor.*coefficients"):
        K(SVMRegressor, device)(x, coefficients=[1.0], rho=[0.0])
