"""Pow with small exponents computed as products (both devices), and the logistic family
(Sigmoid, HardSigmoid, Swish, HardSwish, Mish) in one blocked pass: accuracy against
float64 references, special values, large blocked inputs, half types."""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest

from gpukernels.host import tuning
from gpukernels.kernels import KernelContext, load_all
from gpukernels.kernels.base import lookup
from gpukernels.kernels.math import activations, clip_pow
from gpukernels.tensor import Tensor

# these tests check the host specialisations themselves (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("default_paths")

load_all()

U32 = 2.0 ** -24  # float32 unit roundoff
U64 = 2.0 ** -53


def kernel(op, device, version=None):
    cls, v = lookup(op, "", version)
    return cls(KernelContext(device), version=v)


# ------------------------------------------------------------------------ Pow


def _rel_err(got, ref):
    ref = np.asarray(ref)  # float64 or long double: wider than got
    g = got.astype(ref.dtype)
    with np.errstate(all="ignore"):
        err = np.abs(g - ref) / np.abs(ref)
    return np.where(ref == 0, np.abs(g), err)


# exponent -> bound on the relative error in units of the compute type's roundoff
# (one rounding of the exact value counts as 1)
BOUNDS = {2.0: 1, 3.0: 2.01, 4.0: 3.01, -1.0: 1, 0.5: 1, 1.0: 0, 0.0: 0}


@pytest.mark.parametrize("e", sorted(BOUNDS))
@pytest.mark.parametrize("dtype,u", [(np.float32, U32), (np.float64, U64)], ids=["float32", "float64"])
def test_pow_small_exponent_accuracy(device, rng, e, dtype, u):
    x = (rng.standard_normal(200_000) * np.exp(rng.uniform(-6, 6, 200_000))).astype(dtype)
    if e == 0.5:
        x = np.abs(x)
    got = kernel("Pow", device)(x, np.array(e, dtype)).numpy()
    assert got.dtype == dtype and got.shape == x.shape
    x64 = x.astype(np.longdouble) if dtype == np.float64 else x.astype(np.float64)
    ref = np.power(x64, e)
    assert _rel_err(got, ref).max() <= BOUNDS[e] * u * (1 + 1e-9)  # the product forms' bounds, both devices


@pytest.mark.parametrize("e", sorted(BOUNDS))
def test_pow_small_exponent_special_values(device, e):
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 2.0, -3.0, 1e30, 1e-30, -2.5], np.float32)
    got = kernel("Pow", device)(x, np.array([e], np.float32)).numpy()
    with np.errstate(all="ignore"):
        ref = np.power(x, np.float32(e))
    if e == 0.5:
        ref[1], ref[3] = 0.0, np.inf  # C99 pow(-0, 0.5) = +0, pow(-inf, 0.5) = +inf, as
        # onnxruntime gives (NumPy: -0 and NaN)
    same = (got == ref) | (np.isnan(got) & np.isnan(ref))
    assert same.all(), (e, got, ref)
    assert (np.signbit(got) == np.signbit(ref))[~np.isnan(ref)].all(), (e, got, ref)


def test_pow_small_exponent_broadcast_types_and_fallbacks(device, rng):
    x = rng.uniform(-3, 3, (3, 4)).astype(np.float32)
    # exponent of rank higher than X: the result takes the broadcast shape
    got = kernel("Pow", device)(x, np.full((1, 1, 1), 3.0, np.float32)).numpy()
    assert got.shape == (1, 3, 4)
    np.testing.assert_allclose(got[0], x.astype(np.float64) ** 3, rtol=3 * U32)
    # a float64 exponent: computed in float64, rounded once to float32
    got = kernel("Pow", device)(x, np.array(3.0)).numpy()
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, (x.astype(np.float64) ** 3).astype(np.float32))
    # an integer exponent with a float base
    got = kernel("Pow", device)(x, np.array(2, np.int64)).numpy()
    np.testing.assert_array_equal(got, x * x)
    # float16 / bfloat16 bases, computed in float32 and rounded once
    for t in (np.float16, ml_dtypes.bfloat16):
        xh = x.astype(t)
        got = kernel("Pow", device)(Tensor(xh), np.array(3.0, np.float32)).numpy()
        assert got.dtype == np.dtype(t)
        np.testing.assert_allclose(got.astype(np.float64), (xh.astype(np.float64) ** 3).astype(t).astype(np.float64),
                                   rtol=1e-2)
    # other exponents still go through pow
    got = kernel("Pow", device)(np.abs(x), np.array(1.5, np.float32)).numpy()
    np.testing.assert_allclose(got, np.abs(x).astype(np.float64) ** 1.5, rtol=4 * U32)
    # integer ** integer stays exact (wrap-around included)
    xi = np.array([3, -7, 1 << 20], np.int64)
    np.testing.assert_array_equal(kernel("Pow", device)(xi, np.array(3, np.int64)).numpy(), xi ** 3)


def test_pow_product_exponents_are_recognised():
    x = np.ones(4, np.float32)
    assert clip_pow._product_exponent(x, np.array(3, np.int64)) == 3.0
    assert clip_pow._product_exponent(x, np.array([0.5], np.float32)) == 0.5
    assert clip_pow._product_exponent(x, np.array(2.5, np.float32)) is None
    assert clip_pow._product_exponent(x, np.array(-2.0, np.float32)) is None
    assert clip_pow._product_exponent(x, np.array([2.0, 2.0], np.float32)) is None  # not one value
    assert clip_pow._product_exponent(x.astype(np.int32), np.array(2, np.int64)) is None  # integer base


@pytest.mark.parametrize("e", sorted(BOUNDS))
def test_pow_product_forms_are_the_reference_on_both_paths(device, rng, e):
    """The product forms are the reference itself (no host specialisation): paths 'auto'
    and 'reference' give the same bits, and so do the devices (the same IEEE-rounded
    steps on NumPy and CuPy)."""
    x = (rng.standard_normal((3, 700)) * 4).astype(np.float32)
    y = np.array(e, np.float32)
    cls, v = lookup("Pow", "", None)
    auto = cls(KernelContext(device, options={"paths": "auto"}), version=v)(x, y).numpy()
    ref = cls(KernelContext(device, options={"paths": "reference"}), version=v)(x, y).numpy()
    cpu = cls(KernelContext("cpu"), version=v)(x, y).numpy()
    for got in (ref, cpu):
        np.testing.assert_array_equal(auto.view(np.uint32), got.view(np.uint32))


# ------------------------------------------------------------- logistic family


def _sig64(x):
    with np.errstate(over="ignore", invalid="ignore"):
        return np.where(x >= 0, 1 / (1 + np.exp(-x)), np.exp(x) / (1 + np.exp(x)))


def _softplus64(x):
    return np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))


LOGISTIC = {
    "Sigmoid": ({}, _sig64),
    "Swish": ({"alpha": 1.3}, lambda x: x * _sig64(1.3 * x)),
    "HardSigmoid": ({"alpha": 0.3, "beta": 0.4}, lambda x: np.clip(0.3 * x + 0.4, 0, 1)),
    "HardSwish": ({}, lambda x: x * np.clip(x / 6 + 0.5, 0, 1)),
    "Mish": ({}, lambda x: x * np.tanh(_softplus64(x))),
}


def _has_version(op):
    try:
        lookup(op, "")
        return True
    except Exception:
        return False


@pytest.mark.parametrize("op", sorted(LOGISTIC))
@pytest.mark.parametrize("n", [7, 1 << 16, 3 * (1 << 16) + 5, 1 << 20], ids=lambda n: f"n{n}")
def test_logistic_family_float32_blocked(device, rng, op, n):
    if not _has_version(op):
        pytest.skip(f"{op} not in this onnx")
    attrs, fn = LOGISTIC[op]
    x = (rng.standard_normal(n) * 8).astype(np.float32)
    x[: min(n, 4)] = [-100.0, 100.0, -30.0, 30.0][: min(n, 4)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow / invalid warnings
        with np.errstate(all="warn"):
            got = kernel(op, device)(x, **attrs).numpy()
    x64 = x.astype(np.float64)
    ref = fn(x64)
    # within a few float32 ulp (relative) plus what rounding the argument costs: alpha*x
    # rounded in float32 moves exp(-alpha x) by |alpha x| ulp (Swish), and alpha*x + beta
    # cancels near the kinks (HardSigmoid / HardSwish: absolute error of beta's ulp)
    alpha = attrs.get("alpha", 1.0)
    rtol = 8 * U32 * (1 + (np.abs(alpha * x64) if op == "Swish" else 0))
    atol = 1.2e-38 + (2 * U32 * np.maximum(1, np.abs(x64)) if op.startswith("Hard") else 0)
    assert (np.abs(got - ref) <= atol + rtol * np.abs(ref)).all()


@pytest.mark.parametrize("op", sorted(LOGISTIC))
def test_logistic_family_float64_and_extremes(device, op):
    if not _has_version(op):
        pytest.skip(f"{op} not in this onnx")
    attrs, fn = LOGISTIC[op]
    x = np.concatenate([np.linspace(-750, 750, 3001), [-1e300, 1e300, 0.0, -0.0]])
    got = kernel(op, device)(x, **attrs).numpy()
    ref = fn(x)
    rtol = 8 * U64 * (1 + (np.abs(1.3 * x) if op == "Swish" else 0))
    atol = 1e-300 + (2 * U64 * np.maximum(1, np.abs(x)) if op.startswith("Hard") else 0)
    with np.errstate(over="ignore"):  # rtol * |ref| at |x| = 1e300
        assert (np.abs(got - ref) <= atol + rtol * np.abs(ref)).all()
    special = np.array([np.nan, np.inf, -np.inf], np.float32)
    s = kernel(op, device)(special, **attrs).numpy()
    assert np.isnan(s[0])
    if op in ("Sigmoid", "HardSigmoid"):
        np.testing.assert_array_equal(s[1:], [1.0, 0.0])
    else:
        assert s[1] == np.inf


@pytest.mark.parametrize("op", sorted(LOGISTIC))
@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["float16", "bfloat16"])
def test_logistic_family_half_types(device, rng, op, dtype):
    if not _has_version(op):
        pytest.skip(f"{op} not in this onnx")
    attrs, fn = LOGISTIC[op]
    x = (rng.standard_normal((2, 3, 70_000)) * 6).astype(dtype)
    try:
        got = kernel(op, device)(Tensor(x), **attrs)
    except Exception as exc:  # a type the operator's schema does not allow
        if "does not allow" in str(exc):
            pytest.skip(str(exc))
        raise
    assert got.numpy().dtype == np.dtype(dtype)
    ref = fn(x.astype(np.float64)).astype(np.float32).astype(dtype)  # rounded once from float32
    np.testing.assert_allclose(got.numpy().astype(np.float64), ref.astype(np.float64),
                               rtol=1e-2 if dtype == ml_dtypes.bfloat16 else 1e-3, atol=1e-3)


def test_logistic_pass_shapes(rng):
    for shape in [(), (0,), (3, 0, 2), (2, 3)]:
        x = rng.standard_normal(shape).astype(np.float32)
        y = activations.logistic_pass(np, x, "Sigmoid")
        assert y.shape == x.shape
        np.testing.assert_allclose(y, _sig64(x.astype(np.float64)), rtol=1e-6)
    # a non-contiguous input
    x = rng.standard_normal((300, 500)).astype(np.float32).T
    np.testing.assert_allclose(activations.logistic_pass(np, x, "Mish"),
                               LOGISTIC["Mish"][1](x.astype(np.float64)), rtol=1e-6, atol=1e-30)


# ----------------------------------------------------- array functions (compiled graphs)

_AF_ATTRS = {"Sigmoid": {}, "HardSwish": {}, "Mish": {}, "Swish": {"alpha": 1.7},
             "HardSigmoid": {"alpha": 0.3, "beta": 0.45}, "Gelu": {"approximate": "none"}}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [37, 3 * tuning.value("logistic.block_elems") + 5])
@pytest.mark.parametrize("op", sorted(_AF_ATTRS) + ["Gelu-tanh"])
def test_activation_array_functions_equal_kernels(op, n, dtype, rng):
    """What a compiled graph calls gives the kernel's array, also for inputs that
    overflow exp, under the strict error state the runtime calls it in."""
    name, attrs = (op, dict(_AF_ATTRS[op])) if op != "Gelu-tanh" else ("Gelu", {"approximate": "tanh"})
    x = (rng.standard_normal(n) * 30).astype(dtype)
    x[:4] = [1e4, -1e4, np.inf, -np.inf]
    x[4] = np.nan
    k = kernel(name, "cpu")
    want = k(Tensor(x), **attrs).numpy()
    fn = k.array_function([Tensor(x)], attrs)
    assert fn is not None
    with np.errstate(all="raise"):
        got = fn(x)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_activation_array_functions_decline_half_types_and_use_defaults(rng):
    x = rng.standard_normal(10).astype(np.float16)
    for op in _AF_ATTRS:
        assert kernel(op, "cpu").array_function([Tensor(x)], {}) is None
    x = rng.standard_normal(100).astype(np.float32)
    for op in ("Swish", "HardSigmoid"):  # attributes missing from the dict: the kernel's defaults
        k = kernel(op, "cpu")
        np.testing.assert_array_equal(k.array_function([Tensor(x)], {})(x), k(Tensor(x)).numpy())
