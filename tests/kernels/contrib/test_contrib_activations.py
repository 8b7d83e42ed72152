"""Gelu, FastGelu, BiasGelu, QuickGelu (against onnxruntime) and BiasAdd (onnxruntime has
no CPU kernel for it: against NumPy), with their input checks."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from gpukernels.errors import KernelInputError, KernelTypeError
from gpukernels.kernels import KernelContext, load_all
from gpukernels.kernels.contrib.activations import BiasAdd, BiasGelu, FastGelu, Gelu, QuickGelu
from gpukernels.tensor import Tensor

from tests.ort_reference import compare, run_gk, single_node_model

load_all()

TYPES = [np.float32, np.float16]


def f32(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def tol(dtype):
    return dict(rtol=2e-3, atol=2e-3) if dtype == np.float16 else dict(rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("dtype", TYPES, ids=["float32", "float16"])
def test_gelu_vs_ort(device, rng, dtype):
    x = f32(rng, 3, 7, 33, scale=3.0).astype(dtype)
    compare("Gelu", [("x", x)], device=device, **tol(dtype))


@pytest.mark.parametrize("dtype", TYPES, ids=["float32", "float16"])
@pytest.mark.parametrize("bias", [True, False])
def test_fast_gelu_vs_ort(device, rng, dtype, bias):
    x = f32(rng, 2, 5, 64, scale=3.0).astype(dtype)
    b = f32(rng, 64).astype(dtype) if bias else None
    compare("FastGelu", [("x", x), ("bias", b)], device=device, **tol(dtype))


@pytest.mark.parametrize("dtype", TYPES, ids=["float32", "float16"])
def test_bias_gelu_vs_ort(device, rng, dtype):
    a, b = f32(rng, 4, 3, 40, scale=2.0).astype(dtype), f32(rng, 40).astype(dtype)
    compare("BiasGelu", [("a", a), ("b", b)], device=device, **tol(dtype))


@pytest.mark.parametrize("dtype", TYPES, ids=["float32", "float16"])
@pytest.mark.parametrize("alpha", [None, 1.3])
def test_quick_gelu_vs_ort(device, rng, dtype, alpha):
    x = f32(rng, 2, 300, 300, scale=4.0).astype(dtype)  # large enough for the blocked host pass
    compare("QuickGelu", [("x", x)], {} if alpha is None else {"alpha": alpha}, device=device, **tol(dtype))


def test_double_and_bfloat16_against_numpy(device, rng):
    x = rng.standard_normal((5, 16)) * 3
    erf = np.vectorize(math.erf)
    np.testing.assert_allclose(Gelu(KernelContext(device))(x).numpy(), 0.5 * x * (1 + erf(x / math.sqrt(2))),
                               rtol=1e-12, atol=1e-14)
    b = rng.standard_normal(16)
    want = 0.5 * (x + b) * (1 + np.tanh(math.sqrt(2 / math.pi) * ((x + b) + 0.044715 * (x + b) ** 3)))
    np.testing.assert_allclose(FastGelu(KernelContext(device))(x, b).numpy(), want, rtol=1e-12, atol=1e-14)
    xb = x.astype(ml_dtypes.bfloat16)
    y = QuickGelu(KernelContext(device))(Tensor(xb)).numpy()
    assert y.dtype == ml_dtypes.bfloat16
    x64 = xb.astype(np.float64)
    np.testing.assert_allclose(y.astype(np.float64), x64 / (1 + np.exp(-1.702 * x64)), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("dtype", TYPES, ids=["float32", "float16"])
def test_bias_add(device, rng, dtype):
    x, s = f32(rng, 2, 9, 32).astype(dtype), f32(rng, 2, 9, 32).astype(dtype)
    b = f32(rng, 32).astype(dtype)
    model = single_node_model("BiasAdd", [("x", x), ("b", b), ("s", s)])
    got = run_gk(model, {"x": x, "b": b, "s": s}, device)[0]
    assert got.dtype == dtype
    want = (x.astype(np.float32) + b.astype(np.float32) + s.astype(np.float32)).astype(dtype)
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), **tol(dtype))


def test_errors(device, rng):
    ctx = KernelContext(device)
    x = f32(rng, 2, 3, 8)
    with pytest.raises(KernelInputError, match="BiasGelu: 'bias' must be 1-D of size 8"):
        BiasGelu(ctx)(x, f32(rng, 3, 8))
    with pytest.raises(KernelInputError, match="FastGelu: 'bias' must be 1-D of size 8"):
        FastGelu(ctx)(x, f32(rng, 4))
    with pytest.raises(KernelInputError, match="BiasGelu: required input 'bias'"):
        BiasGelu(ctx)(x, None)
    with pytest.raises(KernelTypeError, match="Gelu: input 'X' has element type int32"):
        Gelu(ctx)(np.ones(3, np.int32))
    with pytest.raises(KernelTypeError, match="one element type"):
        BiasGelu(ctx)(x, f32(rng, 8).astype(np.float16))
    with pytest.raises(KernelInputError, match="BiasAdd: skip must have X's shape"):
        BiasAdd(ctx)(x, f32(rng, 8), f32(rng, 1, 3, 8))
    with pytest.raises(KernelInputError, match="BiasAdd: X must be 3-D"):
        BiasAdd(ctx)(x[0], f32(rng, 8), x[0])
    with pytest.raises(KernelTypeError, match="BiasAdd"):
        BiasAdd(ctx)(x.astype(np.float64), f32(rng, 8).astype(np.float64), x.astype(np.float64))
    with pytest.raises(KernelInputError, match="QuickGelu: unknown attribute"):
        QuickGelu(ctx)(x, beta=1.0)
