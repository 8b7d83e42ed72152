"""NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss against loop references."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from gpukernels.errors import KernelInputError, KernelTypeError
from gpukernels.kernels.base import KernelContext
from gpukernels.kernels.loss import NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss


def ref_nll(logp, target, weight=None, ignore_index=None, reduction="mean"):
    logp = logp.astype(np.float64)
    n, c = logp.shape[:2]
    loss = np.zeros(target.shape)
    wsum = 0.0
    for idx in np.ndindex(target.shape):
        t = int(target[idx])
        if ignore_index is not None and t == ignore_index:
            continue
        w = 1.0 if weight is None else float(weight[t])
        loss[idx] = -logp[(idx[0], t) + idx[1:]] * w
        wsum += w
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / wsum if wsum else float("nan")


def ref_log_softmax(x):
    x = x.astype(np.float64)
    out = np.empty_like(x)
    for idx in np.ndindex((x.shape[0],) + x.shape[2:]):
        sl = (idx[0], slice(None)) + idx[1:]
        v = x[sl]
        out[sl] = v - max(v) - math.log(sum(math.exp(a - max(v)) for a in v))
    return out


SHAPES = [(5, 4), (3, 4, 2), (2, 3, 2, 3), (2, 3, 1, 2, 2)]
DTYPES = [(np.float32, 1e-6), (np.float64, 1e-12), (np.float16, 2e-3), (ml_dtypes.bfloat16, 1.6e-2)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ignore", [None, 1, -5])
def test_nll(device, rng, shape, reduction, weighted, ignore):
    x = rng.standard_normal(shape).astype(np.float32)
    t = rng.integers(0, shape[1], (shape[0],) + shape[2:]).astype(np.int64)
    if ignore == -5:
        t.ravel()[::3] = -5
    w = rng.uniform(0.2, 2, shape[1]).astype(np.float32) if weighted else None
    y = NegativeLogLikelihoodLoss(KernelContext(device))(x, t, w, ignore_index=ignore, reduction=reduction)
    exp = ref_nll(x, t, w, ignore, reduction)
    assert y.shape == np.shape(exp)
    np.testing.assert_allclose(y.numpy(), exp, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("dt,tol", DTYPES)
@pytest.mark.parametrize("tdt", [np.int32, np.int64])
def test_nll_dtypes(device, rng, dt, tol, tdt):
    x = rng.standard_normal((4, 5, 3)).astype(dt)
    t = rng.integers(0, 5, (4, 3)).astype(tdt)
    y = NegativeLogLikelihoodLoss(KernelContext(device))(x, t, reduction="sum")
    assert y.dtype == np.dtype(dt)
    np.testing.assert_allclose(float(y.numpy()), ref_nll(x.astype(np.float64), t, reduction="sum"), rtol=tol * 4)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ignore", [None, 0])
def test_sce(device, rng, shape, reduction, weighted, ignore):
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    t = rng.integers(0, shape[1], (shape[0],) + shape[2:]).astype(np.int32)
    w = rng.uniform(0.2, 2, shape[1]).astype(np.float32) if weighted else None
    out, logp = SoftmaxCrossEntropyLoss(KernelContext(device))(x, t, w, ignore_index=ignore, reduction=reduction)
    ref_lp = ref_log_softmax(x)
    np.testing.assert_allclose(logp.numpy(), ref_lp, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.numpy(), ref_nll(ref_lp, t, w, ignore, reduction), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dt,tol", DTYPES)
def test_sce_dtypes(device, rng, dt, tol):
    x = rng.standard_normal((4, 6)).astype(dt)
    t = rng.integers(0, 6, 4).astype(np.int64)
    out, logp = SoftmaxCrossEntropyLoss(KernelContext(device))(x, t)
    assert out.dtype == np.dtype(dt) and logp.dtype == np.dtype(dt)
    ref_lp = ref_log_softmax(x.astype(np.float64))
    np.testing.assert_allclose(float(out.numpy()), ref_nll(ref_lp, t), rtol=tol * 4)


def test_sce_opset12_no_bfloat16(rng):
    x = rng.standard_normal((4, 6)).astype(ml_dtypes.bfloat16)
    with pytest.raises(KernelTypeError, match="SoftmaxCrossEntropyLoss"):
        SoftmaxCrossEntropyLoss(KernelContext("cpu", 12))(x, np.zeros(4, np.int64))
    out, _ = SoftmaxCrossEntropyLoss(KernelContext("cpu", 12))(x.astype(np.float32), np.zeros(4, np.int64))
    assert out.shape == ()


def test_loss_all_ignored_and_empty(device):
    x = np.log(np.full((2, 3), 1 / 3, np.float32))
    t = np.array([4, 4], np.int64)
    y = NegativeLogLikelihoodLoss(KernelContext(device))(x, t, ignore_index=4)
    assert np.isnan(y.numpy())
    y = NegativeLogLikelihoodLoss(KernelContext(device))(x, t, ignore_index=4, reduction="sum")
    assert y.numpy() == 0
    y = NegativeLogLikelihoodLoss(KernelContext(device))(np.zeros((0, 3), np.float32), np.zeros(0, np.int64),
                                                         reduction="none")
    assert y.shape == (0,)


def test_loss_errors(device, rng):
    k = NegativeLogLikelihoodLoss(KernelContext(device))
    x = rng.standard_normal((3, 4)).astype(np.float32)
    with pytest.raises(KernelInputError, match="NegativeLogLikelihoodLoss.*outside"):
        k(x, np.array([0, 4, 1]))
    with pytest.raises(KernelInputError, match="target must have shape"):
        k(x, np.array([0, 1]))
    with pytest.raises(KernelInputError, match="weight"):
        k(x, np.array([0, 1, 2]), np.ones(3, np.float32))
    with pytest.raises(KernelInputError, match="reduction"):
        k(x, np.array([0, 1, 2]), reduction="avg")
    with pytest.raises(KernelTypeError):
        k(x, np.array([0, 1, 2], np.float32))
    with pytest.raises(KernelInputError, match="SoftmaxCrossEntropyLoss.*labels"):
        SoftmaxCrossEntropyLoss(KernelContext(device))(x, np.array([0, -1, 2]))
