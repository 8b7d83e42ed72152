"""Softmax, LogSoftmax and the normalizations (Layer, Batch, Group) in float64."""

from __future__ import annotations

import numpy as np


def softmax(x, axis=-1):
    """exp(x - max) / sum along axis (NaN rows stay NaN, all -inf rows give NaN)."""
    xd = np.asarray(x).astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.exp(xd - xd.max(axis, keepdims=True))
        return e / e.sum(axis, keepdims=True)


def log_softmax(x, axis=-1):
    xd = np.asarray(x).astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        s = xd - xd.max(axis, keepdims=True)
        return s - np.log(np.exp(s).sum(axis, keepdims=True))


def layer_norm(x, axis=-1, eps=1e-5, scale=None, bias=None):
    """(y, mean, inv_std) normalising over the axes from axis on; y scaled and shifted
    when scale/bias are given (broadcast against those axes)."""
    xd = np.asarray(x).astype(np.float64)
    axes = tuple(range(axis % xd.ndim, xd.ndim))
    mean = xd.mean(axes, keepdims=True)
    inv = 1 / np.sqrt(xd.var(axes, keepdims=True) + eps)
    y = (xd - mean) * inv
    if scale is not None:
        y = y * np.asarray(scale).astype(np.float64)
    if bias is not None:
        y = y + np.asarray(bias).astype(np.float64)
    return y, mean, inv


def _per_channel(a, ndim):
    """A per-channel vector as float64, shaped to broadcast over axis 1 of an ndim array."""
    return np.asarray(a).astype(np.float64).reshape((1, -1) + (1,) * (ndim - 2))


def batch_norm(x, scale, bias, mean, var, eps):
    """Inference BatchNormalization over axis 1: (x - mean) / sqrt(var + eps) * scale + bias."""
    xd = np.asarray(x).astype(np.float64)
    n = xd.ndim
    return ((xd - _per_channel(mean, n)) / np.sqrt(_per_channel(var, n) + eps) * _per_channel(scale, n)
            + _per_channel(bias, n))


def batch_norm_training(x, scale, bias, mean, var, eps, momentum, axes):
    """Training BatchNormalization: (y, running mean, running var, batch mean, batch var),
    y normalised with the batch statistics over axes (population variance)."""
    xd = np.asarray(x).astype(np.float64)
    bm, bv = xd.mean(axes), xd.var(axes)
    y = batch_norm(xd, scale, bias, bm, bv, eps)
    m, v = np.asarray(mean).astype(np.float64), np.asarray(var).astype(np.float64)
    return y, m * momentum + bm * (1 - momentum), v * momentum + bv * (1 - momentum), bm, bv


def group_norm(x, groups, eps):
    """GroupNormalization without scale and bias: each (batch, group) of the channels
    normalised over its channels and spatial positions."""
    xd = np.asarray(x).astype(np.float64)
    g = xd.reshape(xd.shape[0], groups, -1)
    return ((g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + eps)).reshape(xd.shape)
