"""Trig, rounding, Erf and activation kernels against float64 references."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from gpukernels.dtypes import DataType
from gpukernels.errors import KernelInputError, KernelTypeError
from gpukernels.kernels import KernelContext, load_all
from gpukernels.kernels.base import lookup
from gpukernels.tensor import Tensor

load_all()

FLOATS = [np.float32, np.float64, np.float16, ml_dtypes.bfloat16]
TOL = {np.dtype(np.float32): (2e-6, 1e-6), np.dtype(np.float64): (1e-12, 1e-14),
       np.dtype(np.float16): (2e-3, 1e-3), np.dtype(ml_dtypes.bfloat16): (1.6e-2, 1e-2)}


def kernel(op, device, version=None):
    cls, v = lookup(op, "", version)
    return cls(KernelContext(device), version=v)


def check(got: Tensor, ref, dtype):
    dtype = np.dtype(dtype)
    out = got.numpy()
    assert out.dtype == dtype
    assert out.shape == np.shape(ref)
    rtol, atol = TOL[dtype]
    np.testing.assert_allclose(out.astype(np.float64), np.asarray(ref, np.float64), rtol=rtol, atol=atol,
                               equal_nan=True)


def sample(rng, shape, dtype, lo=-3.0, hi=3.0):
    x = rng.uniform(lo, hi, shape)
    x[np.abs(x) < 1e-3] = 0.5
    return x.astype(dtype)


UNARY_REFS = {
    "Acos": (np.arccos, -0.99, 0.99), "Acosh": (np.arccosh, 1.01, 5), "Asin": (np.arcsin, -0.99, 0.99),
    "Asinh": (np.arcsinh, -5, 5), "Atan": (np.arctan, -5, 5), "Atanh": (np.arctanh, -0.99, 0.99),
    "Cos": (np.cos, -5, 5), "Cosh": (np.cosh, -5, 5), "Sin": (np.sin, -5, 5), "Sinh": (np.sinh, -5, 5),
    "Tan": (np.tan, -1.4, 1.4), "Tanh": (np.tanh, -5, 5), "Ceil": (np.ceil, -5, 5),
    "Floor": (np.floor, -5, 5), "Reciprocal": (lambda x: 1 / x, 0.5, 5),
    "Sign": (np.sign, -5, 5), "Erf": (np.vectorize(math.erf), -5, 5),
}


@pytest.mark.parametrize("op", sorted(UNARY_REFS))
@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
def test_unary_reference(op, dtype, device, rng):
    fn, lo, hi = UNARY_REFS[op]
    x = sample(rng, (3, 4, 5), dtype, lo, hi)
    if op in ("Acos", "Acosh", "Asin", "Atanh", "Asinh", "Atan", "Cos", "Cosh", "Sin", "Sinh", "Tan",
              "Round") and np.dtype(dtype) == np.dtype(ml_dtypes.bfloat16):
        cls, v = lookup(op, "")
        assert v >= 22 or op in ("Tanh",)
    ref = fn(x.astype(np.float64))
    check(kernel(op, device)(x), ref, dtype)


@pytest.mark.parametrize("op", ["Sin", "Tanh", "Erf", "Ceil", "Sigmoid", "Gelu", "Mish", "Softplus"])
def test_unary_empty_and_5d(op, device, rng):
    k = kernel(op, device)
    e = k(np.zeros((0, 3), np.float32))
    assert e.shape == (0, 3) and e.numpy().dtype == np.float32
    x = sample(rng, (2, 1, 3, 1, 2), np.float32)
    assert k(x).shape == (2, 1, 3, 1, 2)


def test_round_half_to_even(device):
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 2.3, 2.7, -0.0, np.inf, np.nan], np.float32)
    y = kernel("Round", device)(x).numpy()
    np.testing.assert_array_equal(y, np.array([0, 2, 2, -0.0, -2, -2, 2, 3, -0.0, np.inf, np.nan], np.float32))


def test_erf_accuracy_float64_and_float32(device):
    xs = np.concatenate([np.linspace(-7, 7, 20001), 10.0 ** np.linspace(-300, 1, 400),
                         -(10.0 ** np.linspace(-300, 1, 400))])
    ref = np.array([math.erf(v) for v in xs])
    got = kernel("Erf", device)(xs).numpy()
    assert np.max(np.abs(got - ref) / np.spacing(np.abs(ref))) <= 8
    x32 = xs.astype(np.float32)
    ref32 = np.array([math.erf(float(v)) for v in x32])
    got32 = kernel("Erf", device)(x32).numpy().astype(np.float64)
    assert np.max(np.abs(got32 - ref32) / np.maximum(np.abs(ref32), 1e-30)) < 1e-6
    special = kernel("Erf", device)(np.array([np.inf, -np.inf, np.nan, 0.0, -0.0])).numpy()
    np.testing.assert_array_equal(special, [1.0, -1.0, np.nan, 0.0, -0.0])
    assert np.signbit(special[4])


def test_erf_large_array_blockwise(device, rng):
    x = rng.standard_normal(300_000).astype(np.float32)
    got = kernel("Erf", device)(x).numpy()
    ref = np.array([math.erf(float(v)) for v in x[:2000]])
    np.testing.assert_allclose(got[:2000], ref, rtol=1e-6, atol=1e-7)


def test_erf_opset9_integer(device):
    y = kernel("Erf", device, 9)(np.array([0, 1, -3, 7, -9], np.int32))
    assert y.numpy().dtype == np.int32
    np.testing.assert_array_equal(y.numpy(), [0, 0, 0, 1, -1])


@pytest.mark.parametrize("dtype", [np.int8, np.int64, np.uint16, np.float32, np.float16])
def test_sign_types(dtype, device):
    vals = [0, 3, 5] if np.dtype(dtype).kind == "u" else [-4, 0, 3]
    x = np.array(vals, dtype)
    np.testing.assert_array_equal(kernel("Sign", device)(x).numpy(), np.sign(x))


def test_sign_nan(device):
    y = kernel("Sign", device)(np.array([np.nan, -0.0, 2.0], np.float32)).numpy()
    assert np.isnan(y[0]) and y[1] == 0 and y[2] == 1


def test_reject_integer_for_float_only(device):
    with pytest.raises(KernelTypeError, match="Sin"):
        kernel("Sin", device)(np.array([1, 2], np.int32))
    with pytest.raises(KernelTypeError, match="Acos"):
        kernel("Acos", device, 7)(Tensor(np.array([1.0], ml_dtypes.bfloat16)))


# ----------------------------------------------------------------------- activations


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _softplus(x):
    return np.log1p(np.exp(-np.abs(x))) + np.maximum(x, 0)


ACTS = {
    "Sigmoid": ({}, _sigmoid),
    "Softplus": ({}, _softplus),
    "Softsign": ({}, lambda x: x / (1 + np.abs(x))),
    "Mish": ({}, lambda x: x * np.tanh(_softplus(x))),
    "HardSwish": ({}, lambda x: x * np.clip(x / 6 + 0.5, 0, 1)),
    "HardSigmoid": ({"alpha": 0.3, "beta": 0.4}, lambda x: np.clip(0.3 * x + 0.4, 0, 1)),
    "Elu": ({"alpha": 0.7}, lambda x: np.where(x > 0, x, 0.7 * (np.exp(x) - 1))),
    "Celu": ({"alpha": 1.3}, lambda x: np.maximum(0, x) + np.minimum(0, 1.3 * (np.exp(x / 1.3) - 1))),
    "Gelu": ({}, lambda x: 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))),
    "Swish": ({"alpha": 1.7}, lambda x: x * _sigmoid(1.7 * x)),
    "ThresholdedRelu": ({"alpha": 0.6}, lambda x: np.where(x > 0.6, x, 0)),
    "LeakyRelu": ({"alpha": 0.1}, lambda x: np.where(x < 0, 0.1 * x, x)),
    "Selu": ({"alpha": 1.5, "gamma": 1.1}, lambda x: np.where(x > 0, 1.1 * x, 1.1 * 1.5 * (np.exp(x) - 1))),
    "Shrink": ({"lambd": 0.8, "bias": 0.3}, lambda x: np.where(x < -0.8, x + 0.3, np.where(x > 0.8, x - 0.3, 0))),
}


@pytest.mark.parametrize("op", sorted(ACTS))
@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
def test_activation_reference(op, dtype, device, rng):
    attrs, fn = ACTS[op]
    cls, v = lookup(op, "")
    allowed = {s.replace("tensor(", "").replace(")", "") for s in
               __import__("onnx").defs.get_schema(op, v).type_constraints[0].allowed_type_strs}
    name = {"float32": "float", "float64": "double"}.get(np.dtype(dtype).name, np.dtype(dtype).name)
    if name not in allowed:
        pytest.skip(f"{op} does not allow {name}")
    x = sample(rng, (4, 33), dtype, -6, 6)
    ref = fn(x.astype(np.float64))
    check(kernel(op, device)(Tensor(x), **attrs), ref, dtype)


def test_gelu_tanh_and_large_blocked(device, rng):
    x = rng.standard_normal(200_000).astype(np.float32) * 4
    x64 = x.astype(np.float64)
    ref = 0.5 * x64 * (1 + np.tanh(math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64 ** 3)))
    got = kernel("Gelu", device)(x, approximate="tanh").numpy()
    np.testing.assert_allclose(got, ref, rtol=3e-6, atol=1e-6)
    ref = 0.5 * x64 * (1 + np.vectorize(math.erf)(x64 / math.sqrt(2)))
    got = kernel("Gelu", device)(x).numpy()
    np.testing.assert_allclose(got, ref, rtol=3e-6, atol=1e-6)
    with pytest.raises(KernelInputError, match="Gelu"):
        kernel("Gelu", device)(x, approximate="fast")


def test_saturation_and_nan(device):
    x = np.array([-1000, -80, 80, 1000, np.nan, np.inf, -np.inf], np.float32)
    s = kernel("Sigmoid", device)(x).numpy()
    np.testing.assert_allclose(s[:4], [0, _sigmoid(-80.0), 1, 1], rtol=1e-6)
    assert np.isnan(s[4]) and s[5] == 1 and s[6] == 0
    sp = kernel("Softplus", device)(x).numpy()
    np.testing.assert_allclose(sp[:4], [0, _softplus(-80.0), 80, 1000], rtol=1e-6)
    m = kernel("Mish", device)(x[:4]).numpy()
    np.testing.assert_allclose(m, [0, -80 * np.tanh(_softplus(-80.0)), 80, 1000], rtol=1e-6, atol=1e-30)


def test_selu_version_defaults(device):
    x = np.array([-1.0, 2.0])
    y1 = kernel("Selu", device, 1)(x).numpy()
    y6 = kernel("Selu", device, 6)(x).numpy()
    np.testing.assert_allclose(y1, [1.0506999492645264 * 1.673200011253357 * (np.exp(-1) - 1), 2 * 1.0506999492645264])
    np.testing.assert_allclose(y6, [1.0507010221481323 * 1.6732631921768188 * (np.exp(-1) - 1), 2 * 1.0507010221481323])


def test_shrink_integers(device):
    x = np.array([-5, -1, 0, 1, 5], np.int32)
    y = kernel("Shrink", device)(x, lambd=1.5, bias=1.0).numpy()
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, [-4, 0, 0, 0, 4])


def test_celu_zero_alpha(device):
    with pytest.raises(KernelInputError, match="Celu"):
        kernel("Celu", device)(np.ones(3, np.float32), alpha=0.0)


# -------------------------------------------------------------------- PRelu, SwiGLU


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32, np.int64, np.uint32])
def test_prelu_unidirectional(dtype, device, rng):
    x = (rng.uniform(-5, 5, (2, 3, 4, 5)) * (1 if np.dtype(dtype).kind == "f" else 3)).astype(dtype)
    for sshape in [(5,), (4, 5), (3, 1, 1), (1,), (2, 3, 4, 5)]:
        slope = rng.uniform(0.1, 2, sshape).astype(dtype) if np.dtype(dtype).kind == "f" else \
            rng.integers(1, 4, sshape).astype(dtype)
        ref = np.where(x.astype(np.float64) < 0, x.astype(np.float64) * slope.astype(np.float64), x)
        got = kernel("PRelu", device)(x, slope).numpy()
        rtol = 2e-3 if np.dtype(dtype) == np.float16 else 1e-6
        np.testing.assert_allclose(got.astype(np.float64), ref, rtol=rtol)
    with pytest.raises(KernelInputError, match="PRelu"):
        kernel("PRelu", device)(x, np.ones((2, 1, 1, 1, 1), dtype))
    with pytest.raises(KernelInputError, match="PRelu"):
        kernel("PRelu", device)(x[:, :, :1, :1], np.ones((4, 5), dtype))


def test_prelu_legacy_per_channel(device, rng):
    x = rng.uniform(-1, 1, (2, 3, 4)).astype(np.float32)
    slope = np.array([0.1, 0.2, 0.3], np.float32)
    got = kernel("PRelu", device, 6)(x, slope).numpy()
    ref = np.where(x < 0, x * slope.reshape(3, 1), x)
    np.testing.assert_allclose(got, ref, rtol=1e-6)


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
def test_swiglu(dtype, device, rng):
    a = sample(rng, (3, 7), dtype)
    b = sample(rng, (3, 7), dtype)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    ref = a64 * _sigmoid(0.5 * a64) * b64
    check(kernel("SwiGLU", device)(Tensor(a), Tensor(b), alpha=0.5), ref, dtype)
    with pytest.raises(KernelInputError, match="SwiGLU"):
        kernel("SwiGLU", device)(Tensor(a), Tensor(b[:, :1]))


def test_bfloat16_dtype_is_kept(device):
    x = Tensor(np.array([0.5, -2.0], ml_dtypes.bfloat16))
    y = kernel("Tanh", device)(x)
    assert y.data_type == DataType.BFLOAT16
