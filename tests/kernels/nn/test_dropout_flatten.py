"""Dropout and Flatten."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from gpukernels.dtypes import DataType
from gpukernels.errors import KernelInputError, KernelTypeError
from gpukernels.kernels.base import KernelContext
from gpukernels.kernels.nn.dropout import Dropout
from gpukernels.kernels.nn.flatten import Flatten
from gpukernels.tensor import Tensor


@pytest.mark.parametrize("opset", [7, 10, 12, 13, 22])
def test_dropout_inference_is_copy(device, rng, opset):
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    res = Dropout(KernelContext(device, opset=opset))(x)
    np.testing.assert_array_equal(res.output.numpy(), x)
    mask = res.mask.numpy()
    assert mask.shape == x.shape and mask.all()
    assert mask.dtype == (np.bool_ if opset >= 10 else np.float32)


def test_dropout_opset12_training(device, rng):
    x = rng.standard_normal((50, 40)).astype(np.float32)
    k = Dropout(KernelContext(device, opset=13))
    res = k(x, np.float32(0.3), np.array(True), seed=7)
    mask = res.mask.numpy()
    assert mask.dtype == np.bool_
    np.testing.assert_allclose(res.output.numpy(), np.where(mask, x / 0.7, 0), rtol=1e-6)
    assert 0.2 < 1 - mask.mean() < 0.4
    # reproducible with a seed; documented generator: RandomState(seed).uniform(0, 1)
    again = k(x, np.float32(0.3), np.array(True), seed=7)
    np.testing.assert_array_equal(again.mask.numpy(), mask)
    np.testing.assert_array_equal(mask, np.random.RandomState(7).uniform(0, 1, x.shape) >= 0.3)
    # training_mode false ignores the ratio
    np.testing.assert_array_equal(k(x, np.float32(0.3), np.array(False)).output.numpy(), x)
    # ratio 0 copies
    np.testing.assert_array_equal(k(x, np.float32(0.0), np.array(True)).output.numpy(), x)
    # default ratio 0.5 in training
    res = k(x, None, np.array(True), seed=1)
    np.testing.assert_allclose(res.output.numpy(), np.where(res.mask.numpy(), x * 2, 0), rtol=1e-6)


def test_dropout_seed_from_context(rng):
    x = rng.standard_normal((10, 10)).astype(np.float32)
    k = Dropout(KernelContext("cpu", options={"seed": 3}))
    a = k(x, np.float32(0.5), np.array(True)).mask.numpy()
    b = k(x, np.float32(0.5), np.array(True)).mask.numpy()
    np.testing.assert_array_equal(a, b)


def test_dropout_opset6_is_test(device, rng):
    x = rng.standard_normal((20, 30)).astype(np.float32)
    k = Dropout(KernelContext(device, opset=6))
    np.testing.assert_array_equal(k(x, is_test=1).output.numpy(), x)
    res = k(x, ratio=0.25, seed=4)  # is_test=0: training per the opset-6 text
    mask = res.mask.numpy()
    assert mask.dtype == np.float32
    np.testing.assert_allclose(res.output.numpy(), x * mask / 0.75, rtol=1e-6)
    assert 0 < mask.sum() < mask.size


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float64, ml_dtypes.float8_e4m3fn])
def test_dropout_dtypes(device, rng, dtype):
    x = rng.standard_normal((6, 7)).astype(dtype)
    res = Dropout(KernelContext(device))(x, np.array(0.5, np.float32), np.array(True), seed=0)
    y = res.output.numpy()
    assert y.dtype == np.dtype(dtype)
    want = np.where(res.mask.numpy(), x.astype(np.float32) * 2, 0).astype(dtype)
    np.testing.assert_array_equal(y.astype(np.float32), want.astype(np.float32))


def test_dropout_errors(rng):
    x = rng.standard_normal((3, 3)).astype(np.float32)
    with pytest.raises(KernelInputError, match="ratio"):
        Dropout()(x, np.float32(1.0), np.array(True))
    with pytest.raises(KernelTypeError, match="Dropout"):
        Dropout(KernelContext("cpu", opset=12))(x.astype(ml_dtypes.bfloat16))


def test_dropout_mask_not_requested(rng):
    k = Dropout()
    k.requested_outputs = (True, False)
    assert k(rng.standard_normal((2, 2)).astype(np.float32), np.float32(0.5), np.array(True)).mask is None


@pytest.mark.parametrize("shape,axis,want", [
    ((2, 3, 4), 1, (2, 12)), ((2, 3, 4), 0, (1, 24)), ((2, 3, 4), 3, (24, 1)), ((2, 3, 4), -1, (6, 4)),
    ((2, 3, 4), -3, (1, 24)), ((5,), 1, (5, 1)), ((), 0, (1, 1)), ((2, 0, 3), 2, (0, 3)),
])
def test_flatten(device, rng, shape, axis, want):
    x = rng.standard_normal(shape).astype(np.float32)
    y = Flatten(KernelContext(device))(x, axis=axis).numpy()
    assert y.shape == want
    np.testing.assert_array_equal(y.reshape(-1), x.reshape(-1))


@pytest.mark.parametrize("value,dt", [
    (np.array([[["a", "b"], ["c", "d"]]], dtype=object), DataType.STRING),
    (np.arange(12, dtype=np.int8).reshape(2, 3, 2), DataType.INT8),
    (np.ones((2, 2, 2), bool), DataType.BOOL),
    (np.arange(8, dtype=np.float32).reshape(2, 2, 2).astype(ml_dtypes.int4), DataType.INT4),
    (np.arange(8, dtype=np.float32).reshape(2, 2, 2).astype(ml_dtypes.float8_e5m2), DataType.FLOAT8E5M2),
])
def test_flatten_types(device, value, dt):
    y = Flatten(KernelContext(device))(Tensor(value, dt), axis=2)
    assert y.data_type == dt
    out = y.numpy()
    assert out.shape == (int(np.prod(value.shape[:2])), value.shape[2])
    assert out.reshape(-1).tolist() == value.reshape(-1).tolist()


def test_flatten_errors(rng):
    x = rng.standard_normal((2, 3)).astype(np.float32)
    with pytest.raises(KernelInputError, match="axis"):
        Flatten()(x, axis=3)
    with pytest.raises(KernelInputError, match="axis"):
        Flatten(KernelContext("cpu", opset=9))(x, axis=-1)
    with pytest.raises(KernelTypeError):
        Flatten(KernelContext("cpu", opset=1))(x.astype(np.int32))
