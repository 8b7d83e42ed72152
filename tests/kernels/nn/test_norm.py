"""Normalization kernels against float64 references (tests.reference), and the host row
path of LayerNormalization ('LayerNormalization.rows': cache-sized row blocks over
threads, reusable output buffers) on both paths."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from gpukernels.errors import KernelInputError, KernelTypeError
from gpukernels.kernels.base import KernelContext
from gpukernels.kernels.nn.norm import (LRN, BatchNormalization, GroupNormalization, InstanceNormalization,
                                        LayerNormalization, LpNormalization, MeanVarianceNormalization,
                                        RMSNormalization)
from tests.reference import batch_norm, batch_norm_training, group_norm, layer_norm


def f64(a):
    return np.asarray(a).astype(np.float64)


def params(rng, c, dtype=np.float32):
    scale = rng.standard_normal(c).astype(dtype)
    bias = rng.standard_normal(c).astype(dtype)
    mean = rng.standard_normal(c).astype(dtype)
    var = (rng.random(c) + 0.5).astype(dtype)
    return scale, bias, mean, var


# ---------------------------------------------------------------- BatchNormalization


@pytest.mark.parametrize("opset", [6, 7, 9, 14, 15])
@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 5), (2, 3, 4, 5), (1, 3, 2, 2, 3)])
def test_batchnorm_inference(device, rng, opset, shape):
    x = rng.standard_normal(shape).astype(np.float32)
    s, b, m, v = params(rng, shape[1])
    extra = dict(is_test=1) if opset < 7 else {}
    res = BatchNormalization(KernelContext(device, opset=opset))(x, s, b, m, v, epsilon=1e-3, **extra)
    np.testing.assert_allclose(res.Y.numpy(), batch_norm(x, s, b, m, v, 1e-3), rtol=1e-5, atol=1e-5)
    assert all(o is None for o in res[1:])


def test_batchnorm_1d_input(device, rng):
    x = rng.standard_normal(7).astype(np.float32)
    s, b, m, v = params(rng, 1)
    y = BatchNormalization(KernelContext(device))(x, s, b, m, v).Y.numpy()
    np.testing.assert_allclose(y, batch_norm(x.reshape(7, 1), s, b, m, v, 1e-5).reshape(7), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("opset", [14, 15])
def test_batchnorm_training_mode(device, rng, opset):
    x = rng.standard_normal((3, 4, 5, 2)).astype(np.float32)
    s, b, m, v = params(rng, 4)
    m0 = m.copy()
    res = BatchNormalization(KernelContext(device, opset=opset))(x, s, b, m, v, epsilon=1e-4, momentum=0.8,
                                                                 training_mode=1)
    y, rm, rv, _, _ = batch_norm_training(x, s, b, m, v, 1e-4, 0.8, (0, 2, 3))
    np.testing.assert_allclose(res.Y.numpy(), y, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(res.running_mean.numpy(), rm, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(res.running_var.numpy(), rv, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(m, m0)
    tf = BatchNormalization(KernelContext(device, opset=opset)).training_forward(x, s, b, m, v, epsilon=1e-4,
                                                                                 momentum=0.8)
    np.testing.assert_allclose(tf.running_var.numpy(), rv, rtol=1e-5, atol=1e-6)


def test_batchnorm_opset15_mixed_types(device, rng):
    x = rng.standard_normal((2, 3, 4)).astype(np.float16)
    s, b, m, v = params(rng, 3)
    res = BatchNormalization(KernelContext(device, opset=15))(x, s, b, m.astype(np.float64), v.astype(np.float64),
                                                              training_mode=1)
    assert res.Y.numpy().dtype == np.float16 and res.running_mean.numpy().dtype == np.float64
    y, rm, _, _, _ = batch_norm_training(x, s, b, m, v, 1e-5, 0.9, (0, 2))
    np.testing.assert_allclose(f64(res.Y.numpy()), y, rtol=5e-3, atol=5e-3)
    np.testing.assert_allclose(res.running_mean.numpy(), rm, rtol=1e-5, atol=1e-6)


def test_batchnorm_opset9_mode_from_declared_outputs(device, rng):
    """Opset 9: training exactly when the node declares outputs besides Y."""
    x = rng.standard_normal((4, 3, 5)).astype(np.float32)
    s, b, m, v = params(rng, 3)
    k = BatchNormalization(KernelContext(device, opset=9))
    # a direct call (or a node with Y only) is inference
    np.testing.assert_allclose(k(x, s, b, m, v).Y.numpy(), batch_norm(x, s, b, m, v, 1e-5), rtol=1e-5, atol=1e-5)
    k.requested_outputs = (True, False, False, False, False)
    np.testing.assert_allclose(k(x, s, b, m, v).Y.numpy(), batch_norm(x, s, b, m, v, 1e-5), rtol=1e-5, atol=1e-5)
    k.requested_outputs = (True, True, True, True, True)
    res = k(x, s, b, m, v, momentum=0.7)
    y, rm, rv, bm, bv = batch_norm_training(x, s, b, m, v, 1e-5, 0.7, (0, 2))
    for got, want in zip(res, (y, rm, rv, bm, bv)):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-5)


def test_batchnorm_opset6_is_test(device, rng):
    x = rng.standard_normal((4, 3, 5)).astype(np.float32)
    s, b, m, v = params(rng, 3)
    k = BatchNormalization(KernelContext(device, opset=6))
    np.testing.assert_allclose(k(x, s, b, m, v, is_test=1).Y.numpy(), batch_norm(x, s, b, m, v, 1e-5),
                               rtol=1e-5, atol=1e-5)
    y = batch_norm_training(x, s, b, m, v, 1e-5, 0.9, (0, 2))[0]
    np.testing.assert_allclose(k(x, s, b, m, v, is_test=0).Y.numpy(), y, rtol=1e-4, atol=1e-5)


def test_batchnorm_opset7_non_spatial(device, rng):
    x = rng.standard_normal((6, 2, 3)).astype(np.float32)
    s, b, m, v = (a.reshape(2, 3) for a in params(rng, 6))
    k = BatchNormalization(KernelContext(device, opset=7))
    y = k(x, s, b, m, v, spatial=0).Y.numpy()
    want = (f64(x) - f64(m)) / np.sqrt(f64(v) + 1e-5) * f64(s) + f64(b)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    res = k.training_forward(x, s, b, m, v, spatial=0)
    bm, bv = f64(x).mean(0), f64(x).var(0)
    np.testing.assert_allclose(res.Y.numpy(), (f64(x) - bm) / np.sqrt(bv + 1e-5) * f64(s) + f64(b),
                               rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(res.saved_var.numpy(), bv, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype,tol", [(np.float16, 5e-3), (ml_dtypes.bfloat16, 3e-2), (np.float64, 1e-12)])
def test_batchnorm_dtypes(device, rng, dtype, tol):
    x = rng.standard_normal((2, 3, 4)).astype(dtype)
    s, b, m, v = params(rng, 3, dtype)
    y = BatchNormalization(KernelContext(device))(x, s, b, m, v).Y.numpy()
    assert y.dtype == np.dtype(dtype)
    np.testing.assert_allclose(f64(y), batch_norm(x, s, b, m, v, 1e-5), rtol=tol, atol=tol)


def test_batchnorm_errors(rng):
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    s, b, m, v = params(rng, 4)
    with pytest.raises(KernelInputError, match="scale must have shape") as info:
        BatchNormalization()(x, s, b, m, v)
    assert "BatchNormalization" in str(info.value) and "float32[2, 3, 4]" in str(info.value)
    with pytest.raises(KernelTypeError):
        BatchNormalization(KernelContext("cpu", opset=9))(x.astype(ml_dtypes.bfloat16), *params(rng, 3))


# ---------------------------------------------------------------- Instance / Layer / Group / RMS


@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 3, 4, 5), (1, 2, 2, 3, 4)])
def test_instance_norm(device, rng, shape):
    x = rng.standard_normal(shape).astype(np.float32)
    s, b, _, _ = params(rng, shape[1])
    y = InstanceNormalization(KernelContext(device))(x, s, b, epsilon=1e-3).numpy()
    sh = (1, -1) + (1,) * (len(shape) - 2)
    want = layer_norm(x, 2, 1e-3)[0] * f64(s).reshape(sh) + f64(b).reshape(sh)  # each (n, c) over its positions
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)


def _instance_ref(x, s, b, eps):
    """float64 InstanceNormalization: each (n, c) over its positions (rank 2: one value)."""
    x64 = f64(x)
    axes = tuple(range(2, x.ndim))
    mean = x64.mean(axis=axes, keepdims=True) if axes else x64
    var = ((x64 - mean) ** 2).mean(axis=axes, keepdims=True) if axes else np.zeros_like(x64)
    sh = (1, -1) + (1,) * (x.ndim - 2)
    return (x64 - mean) / np.sqrt(var + eps) * f64(s).reshape(sh) + f64(b).reshape(sh)


@pytest.mark.parametrize("dtype,tol", [(np.float32, 2e-5), (np.float64, 1e-12), (np.float16, 4e-3),
                                       (ml_dtypes.bfloat16, 3e-2)])
@pytest.mark.parametrize("shape", [(3, 4), (2, 64, 3199), (1, 3, 9000), (2, 5, 1, 1), (3, 7, 6, 5)])
def test_instance_norm_rows(device, rng, dtype, tol, shape):
    """The row path (LayerNormalization's rows, per-row scale folded into the inverse):
    offset and scaled data, many-block and pairwise-sum rows, rank 2, every float type."""
    x = (rng.standard_normal(shape) * 4 + 7).astype(dtype)
    s, b, _, _ = params(rng, shape[1], dtype)
    y = InstanceNormalization(KernelContext(device))(x, s, b, epsilon=1e-4).numpy()
    assert y.dtype == np.dtype(dtype) and y.shape == shape
    np.testing.assert_allclose(f64(y), _instance_ref(x, s, b, 1e-4), rtol=tol, atol=tol)


def test_instance_norm_non_finite_and_empty(device, rng):
    """A row with a NaN or an inf gives NaN there and nowhere else; empty spatial axes and
    an empty batch give empty outputs."""
    x = rng.standard_normal((2, 3, 10)).astype(np.float32)
    x[0, 1, 4] = np.nan
    x[1, 2, 0] = np.inf
    s, b, _, _ = params(rng, 3)
    with np.errstate(invalid="ignore"):  # inf - inf, as NumPy reports it
        y = InstanceNormalization(KernelContext(device))(x, s, b).numpy()
    bad = np.zeros((2, 3), bool)
    bad[0, 1] = bad[1, 2] = True
    assert np.isnan(y[bad]).all() and np.isfinite(y[~bad]).all()
    with np.errstate(invalid="ignore"):
        want = _instance_ref(x, s, b, 1e-5)
    np.testing.assert_allclose(y[~bad], want[~bad], rtol=2e-5, atol=2e-5)
    for shape in ((2, 3, 0), (0, 3, 4)):
        e = InstanceNormalization(KernelContext(device))(np.zeros(shape, np.float32), s, b).numpy()
        assert e.shape == shape


@pytest.mark.parametrize("shape,axis", [((4, 6), -1), ((2, 3, 5), 1), ((2, 3, 4, 5), -2), ((3, 4), 0),
                                        ((2, 2, 2, 2, 3), 2)])
def test_layer_norm(device, rng, shape, axis):
    x = rng.standard_normal(shape).astype(np.float32)
    norm_shape = shape[axis % len(shape):]
    s = rng.standard_normal(norm_shape).astype(np.float32)
    b = rng.standard_normal(norm_shape[-1:]).astype(np.float32)  # broadcasts
    res = LayerNormalization(KernelContext(device))(x, s, b, axis=axis, epsilon=1e-4)
    n, mean, inv = layer_norm(x, axis, 1e-4)
    np.testing.assert_allclose(res.Y.numpy(), n * f64(s) + f64(b), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(res.Mean.numpy(), mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(res.InvStdDev.numpy(), inv, rtol=1e-5, atol=1e-6)
    assert res.Mean.numpy().dtype == np.float32
    y = LayerNormalization(KernelContext(device))(x, s, axis=axis, epsilon=1e-4).Y.numpy()
    np.testing.assert_allclose(y, n * f64(s), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype,tol", [(np.float16, 5e-3), (ml_dtypes.bfloat16, 3e-2), (np.float64, 1e-6)])
def test_layer_norm_dtypes(device, rng, dtype, tol):
    x = rng.standard_normal((3, 8)).astype(dtype)
    s = rng.standard_normal(8).astype(dtype)
    res = LayerNormalization(KernelContext(device))(x, s, s)
    assert res.Y.numpy().dtype == np.dtype(dtype)
    n, _, _ = layer_norm(x, -1, 1e-5)
    np.testing.assert_allclose(f64(res.Y.numpy()), n * f64(s) + f64(s), rtol=tol, atol=tol)
    if dtype == np.float64:  # stash_type=11 keeps stage one in double
        res = LayerNormalization(KernelContext(device))(x, s, s, stash_type=11)
        np.testing.assert_allclose(res.Y.numpy(), n * f64(s) + f64(s), rtol=1e-12, atol=1e-12)
        assert res.Mean.numpy().dtype == np.float64


def test_layer_norm_errors(rng):
    x = rng.standard_normal((3, 8)).astype(np.float32)
    with pytest.raises(KernelInputError, match="axis"):
        LayerNormalization()(x, np.ones(8, np.float32), axis=2)
    with pytest.raises(KernelInputError, match="does not broadcast"):
        LayerNormalization()(x, np.ones(7, np.float32))
    with pytest.raises(KernelInputError, match="stash_type"):
        LayerNormalization()(x, np.ones(8, np.float32), stash_type=7)


def _layer_norm_kernel(device, path):
    return LayerNormalization(KernelContext(device, opset=17, options={"paths": path}))


@pytest.mark.parametrize("shape", [(256, 768), (4, 100, 333), (3, 70000)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_layer_norm_rows_large(device, path, rng, sites_taken, shape, with_bias):
    x = (rng.standard_normal(shape) * 2 + 0.5).astype(np.float32)
    s = rng.standard_normal(shape[-1]).astype(np.float32)
    b = rng.standard_normal(shape[-1]).astype(np.float32) if with_bias else None
    with sites_taken() as taken:
        res = _layer_norm_kernel(device, path)(x, s, b, epsilon=1e-5)
    assert ("LayerNormalization.rows" in taken) == (device == "cpu" and path == "auto")
    y, mean, inv = layer_norm(x, -1, 1e-5, s, b)
    np.testing.assert_allclose(res.Y.numpy(), y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(res.Mean.numpy(), mean, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(res.InvStdDev.numpy(), inv, rtol=1e-5)


def test_layer_norm_held_outputs_survive(path, rng):
    """Two large results held at once (12 MB each, from the host output pool) never share
    memory."""
    ln = _layer_norm_kernel("cpu", path)
    x1 = rng.standard_normal((4000, 768)).astype(np.float32)
    x2 = rng.standard_normal((4000, 768)).astype(np.float32)
    s = rng.standard_normal(768).astype(np.float32)
    y1 = ln(x1, s).Y.numpy()
    y2 = ln(x2, s).Y.numpy()
    assert not np.shares_memory(y1, y2)
    np.testing.assert_allclose(y1, layer_norm(x1, -1, 1e-5, s)[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y2, layer_norm(x2, -1, 1e-5, s)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape,G", [((2, 6, 4), 3), ((2, 4, 3, 3), 2), ((1, 4, 2, 2, 2), 4), ((2, 6), 1)])
def test_group_norm_opset21_per_channel(device, rng, shape, G):
    x = rng.standard_normal(shape).astype(np.float32)
    C = shape[1]
    s, b = rng.standard_normal(C).astype(np.float32), rng.standard_normal(C).astype(np.float32)
    y = GroupNormalization(KernelContext(device, opset=21))(x, s, b, num_groups=G, epsilon=1e-3).numpy()
    sh = (1, C) + (1,) * (len(shape) - 2)
    np.testing.assert_allclose(y, group_norm(x, G, 1e-3) * f64(s).reshape(sh) + f64(b).reshape(sh),
                               rtol=1e-4, atol=1e-5)


def test_group_norm_opset18_per_group(device, rng):
    x = rng.standard_normal((2, 6, 5)).astype(np.float32)
    s, b = rng.standard_normal(3).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    y = GroupNormalization(KernelContext(device, opset=18))(x, s, b, num_groups=3).numpy()
    sc = np.repeat(f64(s), 2).reshape(1, 6, 1)
    bc = np.repeat(f64(b), 2).reshape(1, 6, 1)
    np.testing.assert_allclose(y, group_norm(x, 3, 1e-5) * sc + bc, rtol=1e-4, atol=1e-5)
    with pytest.raises(KernelInputError, match="num_groups"):
        GroupNormalization(KernelContext(device, opset=18))(x, np.ones(6, np.float32), np.ones(6, np.float32),
                                                            num_groups=3)
    with pytest.raises(KernelInputError, match="shape \\[6\\]"):
        GroupNormalization(KernelContext(device, opset=21))(x, s, b, num_groups=3)
    with pytest.raises(KernelInputError, match="divide"):
        GroupNormalization(KernelContext(device, opset=21))(x, s, b, num_groups=4)


@pytest.mark.parametrize("opset", [18, 21])
@pytest.mark.parametrize("shape,G", [((2, 64, 40, 40), 8), ((3, 32, 9000), 32), ((0, 8, 4), 2)])
def test_group_norm_rows_large_and_offset(device, rng, opset, shape, G):
    """The row path (each (n, group) a row): many-block and pairwise-sum rows of data far
    from zero, both opsets' scale layouts, and an empty batch."""
    x = (rng.standard_normal(shape) * 3 + 50).astype(np.float32)
    C = shape[1]
    n = G if opset == 18 else C
    s, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    y = GroupNormalization(KernelContext(device, opset=opset))(x, s, b, num_groups=G).numpy()
    assert y.shape == shape and y.dtype == np.float32
    if not x.size:
        return
    sc, bc = (np.repeat(f64(s), C // G), np.repeat(f64(b), C // G)) if opset == 18 else (f64(s), f64(b))
    sh = (1, C) + (1,) * (len(shape) - 2)
    np.testing.assert_allclose(y, group_norm(x, G, 1e-5) * sc.reshape(sh) + bc.reshape(sh), rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("dtype,tol", [(np.float16, 5e-3), (ml_dtypes.bfloat16, 3e-2), (np.float64, 1e-5)])
def test_group_norm_dtypes(device, rng, dtype, tol):
    x = rng.standard_normal((2, 4, 3)).astype(dtype)
    s = rng.standard_normal(4).astype(dtype)
    y = GroupNormalization(KernelContext(device))(x, s, s, num_groups=2).numpy()
    assert y.dtype == np.dtype(dtype)
    np.testing.assert_allclose(f64(y), group_norm(x, 2, 1e-5) * f64(s).reshape(1, 4, 1) + f64(s).reshape(1, 4, 1),
                               rtol=tol, atol=tol)


@pytest.mark.parametrize("shape,axis", [((4, 6), -1), ((2, 3, 5), 1), ((2, 3, 4, 5), -2)])
def test_rms_norm(device, rng, shape, axis):
    x = rng.standard_normal(shape).astype(np.float32)
    s = rng.standard_normal(shape[-1:]).astype(np.float32)
    y = RMSNormalization(KernelContext(device))(x, s, axis=axis, epsilon=1e-4).numpy()
    axes = tuple(range(axis % len(shape), len(shape)))
    xd = f64(x)
    want = xd / np.sqrt((xd * xd).mean(axes, keepdims=True) + 1e-4) * f64(s)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)
    h = RMSNormalization(KernelContext(device))(x.astype(np.float16), s.astype(np.float16), axis=axis).numpy()
    assert h.dtype == np.float16


# ---------------------------------------------------------------- LpNormalization / LRN / MVN


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_lp_normalization(device, rng, p, axis):
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    x[0, 0, :] = 0
    x[:, 0, 0] = 0
    y = LpNormalization(KernelContext(device))(x, axis=axis, p=p).numpy()
    xd = f64(x)
    norm = (np.abs(xd) ** p).sum(axis, keepdims=True) ** (1 / p)
    want = np.where(norm == 0, 0, xd / np.where(norm == 0, 1, norm))
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
    assert np.isfinite(y).all()
    with pytest.raises(KernelInputError, match="p must be"):
        LpNormalization()(x, p=3)


@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_lrn(device, rng, size):
    x = rng.standard_normal((2, 6, 3, 4)).astype(np.float32)
    y = LRN(KernelContext(device))(x, size=size, alpha=2e-3, beta=0.6, bias=1.5).numpy()
    xd = f64(x)
    C = 6
    want = np.empty_like(xd)
    for c in range(C):
        lo = max(0, c - (size - 1) // 2)
        hi = min(C - 1, c + int(np.ceil((size - 1) / 2)))
        sq = (xd[:, lo:hi + 1] ** 2).sum(1)
        want[:, c] = xd[:, c] / (1.5 + 2e-3 / size * sq) ** 0.6
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
    h = LRN(KernelContext(device))(x.astype(np.float16), size=size).numpy()
    assert h.dtype == np.float16
    with pytest.raises(KernelInputError, match="size"):
        LRN()(x)


@pytest.mark.parametrize("axes", [None, [0, 1], [-1], [1, 2, 3]])
def test_mvn(device, rng, axes):
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    kw = {} if axes is None else dict(axes=axes)
    y = MeanVarianceNormalization(KernelContext(device))(x, **kw).numpy()
    ax = tuple(a % 4 for a in (axes or [0, 2, 3]))
    xd = f64(x)
    want = (xd - xd.mean(ax, keepdims=True)) / (np.sqrt(xd.var(ax, keepdims=True)) + 1e-9)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)
    with pytest.raises(KernelInputError, match="axis"):
        MeanVarianceNormalization()(x, axes=[4])
