"""ArrayFeatureExtractor, Binarizer, FeatureVectorizer, Imputer, Normalizer, Scaler."""

from __future__ import annotations

import numpy as np
import pytest

from gpukernels.errors import KernelInputError, KernelTypeError
from gpukernels.kernels import KernelContext
from gpukernels.kernels.ml.preprocess import (ArrayFeatureExtractor, Binarizer, FeatureVectorizer, Imputer,
                                              Normalizer, Scaler)
from gpukernels.tensor import Tensor

from tests.ort_reference import run_ml_node


def K(cls, device):
    return cls(KernelContext(device))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.int32])
@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 4), (0, 4)])
def test_array_feature_extractor(device, rng, dtype, shape):
    x = (rng.standard_normal(shape) * 10).astype(dtype)
    idx = rng.integers(0, shape[-1], size=3)
    z = K(ArrayFeatureExtractor, device)(x, idx).numpy()
    want = x[..., idx]
    if x.ndim == 1:
        want = want.reshape(1, -1)
    assert z.dtype == x.dtype and z.shape == want.shape
    np.testing.assert_array_equal(z, want)


def test_array_feature_extractor_strings_and_errors(device):
    x = np.array([["a", "b", "c"], ["d", "e", "f"]], dtype=object)
    z = K(ArrayFeatureExtractor, device)(x, np.array([2, 0]))
    assert z.numpy().tolist() == [["c", "a"], ["f", "d"]]
    with pytest.raises(KernelInputError, match="ArrayFeatureExtractor.*indices"):
        K(ArrayFeatureExtractor, device)(np.zeros((2, 3), np.float32), np.array([3]))
    with pytest.raises(KernelInputError, match="ArrayFeatureExtractor"):
        K(ArrayFeatureExtractor, device)(np.zeros((2, 3), np.float32), np.array([-1]))
    with pytest.raises(KernelTypeError, match="ArrayFeatureExtractor"):
        K(ArrayFeatureExtractor, device)(np.zeros((2, 3), np.float16), np.array([0]))


def test_array_feature_extractor_matches_onnxruntime(rng):
    x = rng.standard_normal((4, 6)).astype(np.float32)
    y = np.array([5, 0, 2])
    np.testing.assert_array_equal(K(ArrayFeatureExtractor, "cpu")(x, y).numpy(),
                                  run_ml_node("ArrayFeatureExtractor", [x, y], {})[0])


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.int32])
def test_binarizer(device, rng, dtype):
    x = (rng.standard_normal((3, 4, 5)) * 3).astype(dtype)
    y = K(Binarizer, device)(x, threshold=0.5).numpy()
    want = np.where(x.astype(np.float64) > 0.5, 1, 0).astype(dtype)
    assert y.dtype == x.dtype
    np.testing.assert_array_equal(y, want)
    if dtype == np.float32:
        np.testing.assert_array_equal(y, run_ml_node("Binarizer", [x], {"threshold": 0.5})[0])


def test_binarizer_nan_and_empty(device):
    y = K(Binarizer, device)(np.array([np.nan, 2.0, -1.0], np.float32)).numpy()
    np.testing.assert_array_equal(y, [0, 1, 0])
    assert K(Binarizer, device)(np.zeros((0, 3), np.float32)).numpy().shape == (0, 3)
    with pytest.raises(KernelTypeError, match="Binarizer"):
        K(Binarizer, device)(np.zeros(3, np.uint8))


def test_feature_vectorizer(device, rng):
    a = rng.standard_normal((4, 3)).astype(np.float32)
    b = rng.standard_normal((4, 2)).astype(np.float32)
    y = K(FeatureVectorizer, device)(a, b, inputdimensions=[2, 4]).numpy()
    want = np.zeros((4, 6), np.float32)
    want[:, :2] = a[:, :2]
    want[:, 2:4] = b
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, want)
    np.testing.assert_array_equal(y, run_ml_node("FeatureVectorizer", [a, b], {"inputdimensions": [2, 4]})[0])
    # int input -> float output; 1-D is one row
    yi = K(FeatureVectorizer, device)(np.array([1, 2, 3], np.int64), inputdimensions=[3]).numpy()
    np.testing.assert_array_equal(yi, [[1, 2, 3]])
    with pytest.raises(KernelInputError, match="FeatureVectorizer.*batch"):
        K(FeatureVectorizer, device)(a, b[:2], inputdimensions=[3, 2])
    with pytest.raises(KernelInputError, match="FeatureVectorizer.*inputdimensions"):
        K(FeatureVectorizer, device)(a, b, inputdimensions=[3])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_imputer_float(device, rng, dtype):
    x = rng.standard_normal((5, 3)).astype(dtype)
    x[rng.random(x.shape) < 0.3] = np.nan
    y = K(Imputer, device)(x, imputed_value_floats=[1.5, -2.0, 7.0], replaced_value_float=np.nan).numpy()
    want = np.where(np.isnan(x), np.array([1.5, -2.0, 7.0], dtype), x)
    np.testing.assert_array_equal(y, want)
    x[0, 0] = 3.0
    y = K(Imputer, device)(x, imputed_value_floats=[9.0], replaced_value_float=3.0).numpy()
    assert y[0, 0] == 9.0 and y.dtype == dtype


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_imputer_int(device, rng, dtype):
    x = rng.integers(-2, 3, size=(4, 6)).astype(dtype)
    y = K(Imputer, device)(x, imputed_value_int64s=[42], replaced_value_int64=0).numpy()
    np.testing.assert_array_equal(y, np.where(x == 0, 42, x))
    assert y.dtype == dtype
    with pytest.raises(KernelInputError, match="Imputer.*1 or 6"):
        K(Imputer, device)(x, imputed_value_int64s=[1, 2], replaced_value_int64=0)
    with pytest.raises(KernelInputError, match="Imputer.*imputed_value_int64s"):
        K(Imputer, device)(x, imputed_value_floats=[1.0])


def _norm_ref(x, norm):
    x = x.astype(np.float64).reshape(-1, x.shape[-1])
    if norm == "MAX":
        d = x.max(axis=1, keepdims=True)
    elif norm == "L1":
        d = np.abs(x).sum(axis=1, keepdims=True)
    else:
        d = np.sqrt((x * x).sum(axis=1, keepdims=True))
    return np.where(d == 0, x, x / np.where(d == 0, 1, d))


@pytest.mark.parametrize("norm", ["MAX", "L1", "L2"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.int32])
def test_normalizer(device, rng, norm, dtype):
    x = (rng.standard_normal((5, 4)) * 4).astype(dtype)
    x[2] = 0
    y = K(Normalizer, device)(x, norm=norm).numpy()
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, _norm_ref(x, norm), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(y, run_ml_node("Normalizer", [x], {"norm": norm})[0], rtol=1e-5, atol=1e-6)
    y1 = K(Normalizer, device)(x[0], norm=norm).numpy()
    np.testing.assert_allclose(y1, _norm_ref(x[:1], norm)[0], rtol=1e-6)


def test_normalizer_errors(device):
    with pytest.raises(KernelInputError, match="Normalizer.*norm"):
        K(Normalizer, device)(np.ones((2, 2), np.float32), norm="L3")
    with pytest.raises(KernelInputError, match="Normalizer.*2-D"):
        K(Normalizer, device)(np.ones((2, 2, 2), np.float32))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.int32])
def test_scaler(device, rng, dtype):
    x = (rng.standard_normal((6, 3)) * 5).astype(dtype)
    off, sc = [0.5, -1.0, 2.0], [2.0, 0.25, -1.5]
    y = K(Scaler, device)(x, offset=off, scale=sc).numpy()
    want = (x.astype(np.float64) - np.float32(off)) * np.float32(sc)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, want, rtol=1e-6)
    np.testing.assert_allclose(y, run_ml_node("Scaler", [x], {"offset": off, "scale": sc})[0], rtol=1e-5, atol=1e-5)
    y1 = K(Scaler, device)(x, offset=[1.0], scale=[3.0]).numpy()
    np.testing.assert_allclose(y1, (x.astype(np.float64) - 1) * 3, rtol=1e-6)
    with pytest.raises(KernelInputError, match="Scaler.*offset"):
        K(Scaler, device)(x, offset=[1.0, 2.0], scale=[1.0])


def test_tensor_inputs_accepted(device):
    y = K(Binarizer, device)(Tensor(np.array([1.0, -1.0], np.float32)))
    assert y.numpy().tolist() == [1.0, 0.0]
