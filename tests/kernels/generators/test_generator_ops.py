"""EyeLike, Range and the random operators."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from gpukernels import dtypes
from gpukernels.dtypes import DataType
from gpukernels.errors import KernelInputError, KernelTypeError
from gpukernels.kernels import KernelContext, load_all
from gpukernels.kernels.base import lookup
from gpukernels.tensor import Tensor

load_all()


def kernel(op, device, version=None, **options):
    cls, v = lookup(op, "", version)
    return cls(KernelContext(device, options=options), version=v)


@pytest.mark.parametrize("shape,k", [((3, 3), 0), ((3, 5), 2), ((5, 3), -1), ((4, 4), 9), ((0, 3), 0)])
@pytest.mark.parametrize("dtype", [None, DataType.FLOAT16, DataType.INT32, DataType.BOOL, DataType.BFLOAT16,
                                   DataType.UINT64])
def test_eyelike(shape, k, dtype, device):
    x = np.zeros(shape, np.float64)
    got = kernel("EyeLike", device)(x, dtype=None if dtype is None else int(dtype), k=k)
    ref = np.array([[1 if j - i == k else 0 for j in range(shape[1])] for i in range(shape[0])]).reshape(shape)
    assert got.data_type == (dtype or DataType.DOUBLE)
    np.testing.assert_array_equal(got.numpy().astype(np.float64), ref)


def test_eyelike_errors(device):
    with pytest.raises(KernelInputError, match="EyeLike"):
        kernel("EyeLike", device)(np.zeros((2, 2, 2), np.float32))
    with pytest.raises(KernelTypeError, match="EyeLike"):
        kernel("EyeLike", device, 9)(np.zeros((2, 2), np.float32), dtype=int(DataType.BFLOAT16))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int16, np.int32, np.int64, np.float16,
                                   ml_dtypes.bfloat16])
@pytest.mark.parametrize("start,limit,delta", [(3, 9, 3), (10, 4, -2), (1, 1, 1), (5, 2, 1), (-3, 7, 4), (0, 10, 1)])
def test_range(dtype, start, limit, delta, device):
    got = kernel("Range", device)(Tensor(np.array(start, dtype)), Tensor(np.array(limit, dtype)),
                                  Tensor(np.array(delta, dtype))).numpy()
    n = max(math.ceil((limit - start) / delta), 0)
    ref = [start + i * delta for i in range(n)]
    assert got.dtype == np.dtype(dtype) and got.shape == (n,)
    np.testing.assert_array_equal(got.astype(np.float64), ref)


def test_range_float_steps_and_errors(device):
    got = kernel("Range", device)(np.float32(0.0), np.float32(1.0), np.float32(0.3)).numpy()
    np.testing.assert_allclose(got, [0.0, 0.3, 0.6, 0.9], rtol=1e-6)
    with pytest.raises(KernelInputError, match="delta"):
        kernel("Range", device)(np.int32(0), np.int32(3), np.int32(0))
    with pytest.raises(KernelInputError, match="Range"):
        kernel("Range", device)(np.zeros(2, np.int32), np.int32(3), np.int32(1))
    with pytest.raises(KernelTypeError, match="Range"):
        kernel("Range", device, 11)(np.float16(0), np.float16(3), np.float16(1))
    with pytest.raises(KernelTypeError, match="Range"):
        kernel("Range", device)(np.int32(0), np.int64(3), np.int32(1))
    # stash_type=0 on float16: arithmetic in float16 itself
    got = kernel("Range", device)(np.float16(2048), np.float16(2052), np.float16(1), stash_type=0).numpy()
    assert got.dtype == np.float16 and got.shape == (4,)


# --------------------------------------------------------------------------- random


@pytest.mark.parametrize("op", ["RandomUniform", "RandomNormal"])
@pytest.mark.parametrize("dtype", [DataType.FLOAT, DataType.DOUBLE, DataType.FLOAT16, DataType.BFLOAT16])
def test_random_seeded_reproducible(op, dtype, device):
    a = kernel(op, device)(shape=[4, 5], dtype=int(dtype), seed=3.0).numpy()
    b = kernel(op, device)(shape=[4, 5], dtype=int(dtype), seed=3.0).numpy()
    c = kernel(op, device)(shape=[4, 5], dtype=int(dtype), seed=4.0).numpy()
    assert a.shape == (4, 5) and a.dtype == dtypes.info(dtype).numpy
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    k = kernel(op, device)
    first, second = k(shape=[3], seed=1.0).numpy(), k(shape=[3], seed=1.0).numpy()
    assert not np.array_equal(first, second)  # the instance's generator advances


def test_random_distributions(device):
    u = kernel("RandomUniform", device)(shape=[200000], low=-2.0, high=3.0, seed=0.0).numpy()
    assert u.min() >= -2 and u.max() < 3 and abs(u.mean() - 0.5) < 0.02
    n = kernel("RandomNormal", device)(shape=[200000], mean=1.5, scale=2.0, seed=0.0).numpy()
    assert abs(n.mean() - 1.5) < 0.02 and abs(n.std() - 2.0) < 0.02
    assert n.dtype == np.float32


def test_random_like_and_context_seed(device):
    x = np.zeros((2, 3), np.float64)
    y = kernel("RandomUniformLike", device)(x)
    assert y.data_type == DataType.DOUBLE and y.shape == (2, 3)
    y = kernel("RandomNormalLike", device)(np.zeros((2, 3), np.int32), dtype=int(DataType.FLOAT16))
    assert y.data_type == DataType.FLOAT16
    with pytest.raises(KernelTypeError, match="RandomUniformLike"):
        kernel("RandomUniformLike", device)(np.zeros((2, 3), np.int32))
    ctx1 = KernelContext(device, options={"seed": 7})
    ctx2 = KernelContext(device, options={"seed": 7})
    cls, _ = lookup("RandomNormal", "")
    s1 = [cls(ctx1)(shape=[3]).numpy() for _ in range(2)]
    s2 = [cls(ctx2)(shape=[3]).numpy() for _ in range(2)]
    np.testing.assert_array_equal(s1[0], s2[0])
    np.testing.assert_array_equal(s1[1], s2[1])
    assert not np.array_equal(s1[0], s1[1])
    with pytest.raises(KernelInputError, match="shape"):
        kernel("RandomNormal", device)()
    with pytest.raises(KernelTypeError, match="RandomNormal"):
        kernel("RandomNormal", device)(shape=[2], dtype=int(DataType.INT32))


@pytest.mark.parametrize("out", [None, DataType.INT32, DataType.BOOL, DataType.FLOAT16, DataType.BFLOAT16])
def test_bernoulli(out, device):
    p = np.array([0.0, 1.0, 0.25] * 20000, np.float32)
    y = kernel("Bernoulli", device)(p, dtype=None if out is None else int(out), seed=5.0)
    assert y.data_type == (out or DataType.FLOAT)
    v = y.numpy().astype(np.float64)
    assert (v[0::3] == 0).all() and (v[1::3] == 1).all()
    assert abs(v[2::3].mean() - 0.25) < 0.02
    y2 = kernel("Bernoulli", device)(p, dtype=None if out is None else int(out), seed=5.0).numpy()
    np.testing.assert_array_equal(y.numpy(), y2)


@pytest.mark.parametrize("dtype", [DataType.INT32, DataType.INT64])
def test_multinomial(dtype, device):
    probs = np.array([[0.1, 0.0, 0.6, 0.3], [0.25, 0.25, 0.25, 0.25]])
    logits = np.log(np.where(probs > 0, probs, 1e-300)).astype(np.float32)
    logits[0, 1] = -np.inf
    y = kernel("Multinomial", device)(logits, sample_size=40000, dtype=int(dtype), seed=2.0)
    assert y.data_type == dtype and y.shape == (2, 40000)
    v = y.numpy()
    for r in range(2):
        freq = np.bincount(v[r], minlength=4) / v.shape[1]
        np.testing.assert_allclose(freq, probs[r], atol=0.015)
    assert (v[0] != 1).all()
    with pytest.raises(KernelInputError, match="Multinomial"):
        kernel("Multinomial", device)(np.zeros(3, np.float32))
    with pytest.raises(KernelTypeError, match="Multinomial"):
        kernel("Multinomial", device)(np.zeros((1, 3), np.float32), dtype=int(DataType.FLOAT))
    with pytest.raises(KernelInputError, match="Multinomial"):
        kernel("Multinomial", device)(np.full((1, 3), -np.inf, np.float32))
