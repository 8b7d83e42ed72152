"""Clip, Mod, Pow, Max, Min, Sum, Mean."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from gpukernels.errors import KernelInputError, KernelTypeError
from gpukernels.kernels import KernelContext, load_all
from gpukernels.kernels.base import lookup
from gpukernels.tensor import Tensor

load_all()

INTS = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
FLOATS = [np.float32, np.float64, np.float16]


def kernel(op, device, version=None):
    cls, v = lookup(op, "", version)
    return cls(KernelContext(device), version=v)


def values(rng, shape, dtype):
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        x = rng.uniform(-10, 10, shape)
        x[np.abs(x) < 0.1] = 1.5
        return x.astype(dtype)
    lo = 0 if dtype.kind == "u" else -50
    x = rng.integers(lo, 50, shape)
    x[x == 0] = 7
    return x.astype(dtype)


# ------------------------------------------------------------------------------ Clip


@pytest.mark.parametrize("dtype", INTS + FLOATS + [ml_dtypes.bfloat16], ids=lambda d: np.dtype(d).name)
def test_clip_inputs(dtype, device, rng):
    x = values(rng, (3, 4, 5), dtype)
    lo, hi = (np.array(2, dtype), np.array(30, dtype))
    k = kernel("Clip", device)
    ref = np.minimum(np.maximum(x.astype(np.float64), float(lo)), float(hi))
    got = k(Tensor(x), Tensor(lo), Tensor(hi)).numpy()
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got.astype(np.float64), ref)
    np.testing.assert_array_equal(k(Tensor(x), None, Tensor(hi)).numpy().astype(np.float64),
                                  np.minimum(x.astype(np.float64), float(hi)))
    np.testing.assert_array_equal(k(Tensor(x)).numpy(), x)
    # min > max: everything becomes max
    np.testing.assert_array_equal(k(Tensor(x), Tensor(hi), Tensor(lo)).numpy().astype(np.float64),
                                  np.full(x.shape, float(lo)))


def test_clip_versions(device):
    x = np.array([-5.0, 0.5, 5.0, np.nan], np.float32)
    np.testing.assert_array_equal(kernel("Clip", device, 1)(x, min=-1.0).numpy(), [-1, 0.5, 5, np.nan])
    np.testing.assert_array_equal(kernel("Clip", device, 6)(x, max=1.0).numpy(), [-5, 0.5, 1, np.nan])
    np.testing.assert_array_equal(kernel("Clip", device, 11)(x, np.float32(0), np.float32(1)).numpy(),
                                  [0, 0.5, 1, np.nan])
    with pytest.raises(KernelInputError, match="Clip"):
        kernel("Clip", device)(x, np.zeros(2, np.float32))
    with pytest.raises(KernelTypeError, match="Clip"):
        kernel("Clip", device, 11)(np.array([1, 2], np.int32))
    assert kernel("Clip", device)(np.zeros((0, 2), np.float32), np.float32(0)).shape == (0, 2)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.uint8, np.int64])
def test_clip_array_function_equals_kernel(dtype, rng):
    """What a compiled graph calls (bounds read at each call) gives the kernel's array:
    both bounds, one, none, min > max, NaN and signed zeros."""
    x = values(rng, (6, 50), dtype)
    if np.dtype(dtype).kind == "f":
        x[0, :3] = [np.nan, -0.0, 0.0]
    k = kernel("Clip", "cpu")
    lo, hi = np.array(3, dtype), np.array(40, dtype)
    for args in ([x, lo, hi], [x, lo], [x], [x, hi, lo]):
        fn = k.array_function([Tensor(a) for a in args], {})
        assert fn is not None
        want = k(*[Tensor(a) for a in args]).numpy()
        with np.errstate(all="raise"):
            got = fn(*args)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
        assert not np.shares_memory(got, x)
    fn = k.array_function([Tensor(x), Tensor(lo), Tensor(hi)], {})
    lo2, hi2 = np.array(1, dtype), np.array(20, dtype)  # other bounds: read at the call
    np.testing.assert_array_equal(fn(x, lo2, hi2), np.minimum(np.maximum(x, lo2), hi2))


def test_clip_array_function_attribute_versions_and_half():
    x = np.array([-5.0, 0.5, 5.0, np.nan], np.float32)
    np.testing.assert_array_equal(kernel("Clip", "cpu", 6).array_function([Tensor(x)], {"max": 1.0})(x),
                                  [-5, 0.5, 1, np.nan])
    np.testing.assert_array_equal(kernel("Clip", "cpu", 1).array_function([Tensor(x)], {"min": -1.0})(x),
                                  [-1, 0.5, 5, np.nan])
    h = x.astype(np.float16)
    assert kernel("Clip", "cpu").array_function([Tensor(h)], {}) is None


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int16, np.uint32])
def test_clip_host_against_float64_reference(dtype, rng):
    """The host clip (NumPy's clip, the type's extremes for an absent bound) against
    min(max(x, lo), hi) in float64, on a large array."""
    x = values(rng, (300, 700), dtype)
    k = kernel("Clip", "cpu")
    lo, hi = np.array(2, dtype), np.array(30, dtype)
    x64 = x.astype(np.float64)
    np.testing.assert_array_equal(k(x, lo, hi).numpy().astype(np.float64), np.clip(x64, 2, 30))
    np.testing.assert_array_equal(k(x, None, hi).numpy().astype(np.float64), np.minimum(x64, 30))
    np.testing.assert_array_equal(k(x, lo).numpy().astype(np.float64), np.maximum(x64, 2))


# ------------------------------------------------------------------------------- Mod


def _ref_mod(a, b, fmod):
    out = []
    for x, y in zip(a.ravel().tolist(), b.ravel().tolist()):
        if fmod:
            r = abs(x) % abs(y)
            out.append(r if x >= 0 else -r)
        else:
            out.append(x - (x // y) * y)
    return np.array(out).reshape(a.shape)


@pytest.mark.parametrize("dtype", INTS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("fmod", [0, 1])
def test_mod_integers(dtype, fmod, device, rng):
    a = values(rng, (4, 6), dtype)
    b = values(rng, (6,), dtype)
    ref = _ref_mod(*np.broadcast_arrays(a.astype(object), b.astype(object)), fmod)
    got = kernel("Mod", device)(a, b, fmod=fmod).numpy()
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, ref.astype(dtype))
    with pytest.raises(KernelInputError, match="modulo by zero"):
        kernel("Mod", device)(a, np.zeros_like(b), fmod=fmod)


def test_mod_sign_follows_divisor(device):
    a = np.array([-4, 7, 5, 4, -7, 8], np.int64)
    b = np.array([2, -3, 8, -2, 3, 5], np.int64)
    np.testing.assert_array_equal(kernel("Mod", device)(a, b).numpy(), [0, -2, 5, 0, 2, 3])
    np.testing.assert_array_equal(kernel("Mod", device)(a, b, fmod=1).numpy(), [0, 1, 5, 0, -1, 3])


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
def test_mod_floats(dtype, device, rng):
    a = values(rng, (5, 7), dtype)
    b = values(rng, (5, 7), dtype)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    tol = 3e-3 if np.dtype(dtype) == np.float16 else 1e-6
    np.testing.assert_allclose(kernel("Mod", device)(a, b, fmod=1).numpy(), np.fmod(a64, b64),
                               rtol=tol, atol=tol * 10)
    np.testing.assert_allclose(kernel("Mod", device, 28)(a, b, fmod=0).numpy(),
                               a64 - np.floor(a64 / b64) * b64, rtol=tol, atol=tol * 10)
    with pytest.raises(KernelInputError, match="fmod must be 1"):
        kernel("Mod", device, 13)(a, b, fmod=0)


def test_mod_float_special_cases(device):
    a = np.array([0.0, -0.0, np.inf, 3.0, 1.0, -1.0, np.nan], np.float64)
    b = np.array([-2.0, 3.0, 2.0, 0.0, -np.inf, np.inf, 1.0], np.float64)
    y = kernel("Mod", device, 28)(a, b).numpy()
    assert y[0] == 0 and np.signbit(y[0]) and y[1] == 0 and not np.signbit(y[1])
    assert np.isnan(y[2]) and np.isnan(y[3]) and y[4] == -np.inf and y[5] == np.inf and np.isnan(y[6])
    y1 = kernel("Mod", device)(a, b, fmod=1).numpy()
    assert np.isnan(y1[2]) and np.isnan(y1[3]) and y1[4] == 1 and y1[5] == -1


# ------------------------------------------------------------------------------- Pow


@pytest.mark.parametrize("xt", [np.float32, np.float64, np.float16, np.int32, np.int64])
@pytest.mark.parametrize("yt", [np.float32, np.float64, np.float16, np.int8, np.int32, np.int64, np.uint8])
def test_pow_mixed(xt, yt, device, rng):
    if np.dtype(xt).kind == "f":
        x = rng.uniform(0.5, 3, (3, 4)).astype(xt)
    else:
        x = rng.integers(-4, 5, (3, 4)).astype(xt)
    y = rng.integers(0, 4, (4,)).astype(yt)
    if np.dtype(yt).kind == "f":
        y = (y + rng.uniform(0, 1, 4).round(1)).astype(yt) if np.dtype(xt).kind == "f" else y
    ref = np.power(x.astype(np.float64), y.astype(np.float64))
    got = kernel("Pow", device)(x, y).numpy()
    assert got.dtype == np.dtype(xt)
    if np.dtype(xt).kind == "f":
        np.testing.assert_allclose(got, ref, rtol=3e-3 if np.float16 in (xt, yt) else 1e-6)
    else:
        np.testing.assert_array_equal(got, np.trunc(ref).astype(xt))


def test_pow_integer_negative_exponent_and_wrap(device):
    x = np.array([1, -1, -1, 2, 3], np.int32)
    y = np.array([-3, -3, -2, -1, 2], np.int32)
    np.testing.assert_array_equal(kernel("Pow", device)(x, y).numpy(), [1, -1, 1, 0, 9])
    with pytest.raises(KernelInputError, match="negative integer power"):
        kernel("Pow", device)(np.array([0], np.int32), np.array([-1], np.int32))
    big = kernel("Pow", device)(np.array([3], np.int32), np.array([40], np.int64)).numpy()
    assert big[0] == np.int32(np.uint32(pow(3, 40, 2 ** 32)).astype(np.int32))
    np.testing.assert_array_equal(kernel("Pow", device)(np.array([2, 3], np.int64),
                                                        np.array([0.5, 2.0], np.float32)).numpy(), [1, 9])


def test_pow_legacy_broadcast(device, rng):
    x = rng.uniform(1, 2, (2, 3, 4)).astype(np.float32)
    y = np.array([1.0, 2.0, 3.0], np.float32)
    got = kernel("Pow", device, 1)(x, y, broadcast=1, axis=1).numpy()
    np.testing.assert_allclose(got, x ** y.reshape(3, 1), rtol=1e-6)
    with pytest.raises(KernelInputError, match="Pow"):
        kernel("Pow", device, 1)(x, y)
    with pytest.raises(KernelInputError, match="Pow"):
        kernel("Pow", device)(x, np.ones((5,), np.float32))


def test_pow_nan_inf(device):
    x = np.array([np.nan, 1.0, np.inf, 0.0, -8.0], np.float64)
    y = np.array([0.0, np.nan, -1.0, -1.0, 1 / 3], np.float64)
    got = kernel("Pow", device)(x, y).numpy()
    np.testing.assert_array_equal(got[:4], [1.0, 1.0, 0.0, np.inf])
    assert np.isnan(got[4])


# ------------------------------------------------------------------- Max/Min/Sum/Mean


@pytest.mark.parametrize("op,fn", [("Max", np.maximum), ("Min", np.minimum), ("Sum", np.add)])
@pytest.mark.parametrize("dtype", INTS + FLOATS + [ml_dtypes.bfloat16], ids=lambda d: np.dtype(d).name)
def test_variadic(op, fn, dtype, device, rng):
    if op == "Sum" and np.dtype(dtype).kind in "iu":
        pytest.skip("Sum is float only")
    a = values(rng, (2, 1, 4), dtype)
    b = values(rng, (3, 1), dtype)
    c = values(rng, (4,), dtype)
    ref = fn(fn(a.astype(np.float64), b.astype(np.float64)), c.astype(np.float64))
    got = kernel(op, device)(Tensor(a), Tensor(b), Tensor(c)).numpy()
    assert got.dtype == np.dtype(dtype) and got.shape == (2, 3, 4)
    tol = {np.dtype(np.float16): 2e-3, np.dtype(ml_dtypes.bfloat16): 1e-2,
           np.dtype(np.float32): 1e-6}.get(np.dtype(dtype), 1e-12)
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=tol)
    one = kernel(op, device)(Tensor(a)).numpy()
    np.testing.assert_array_equal(one, a)


@pytest.mark.parametrize("dtype", FLOATS + [ml_dtypes.bfloat16], ids=lambda d: np.dtype(d).name)
def test_mean(dtype, device, rng):
    xs = [values(rng, (3, 5), dtype) for _ in range(4)]
    ref = sum(x.astype(np.float64) for x in xs) / 4
    got = kernel("Mean", device)(*[Tensor(x) for x in xs]).numpy()
    tol = {np.dtype(np.float16): 2e-3, np.dtype(ml_dtypes.bfloat16): 1e-2}.get(np.dtype(dtype), 1e-6)
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=tol, atol=tol)


def test_variadic_nan_and_errors(device):
    a = np.array([1.0, np.nan, 3.0], np.float32)
    b = np.array([np.nan, 2.0, 1.0], np.float32)
    mx = kernel("Max", device)(a, b).numpy()
    mn = kernel("Min", device)(a, b).numpy()
    assert np.isnan(mx[:2]).all() and mx[2] == 3 and np.isnan(mn[:2]).all() and mn[2] == 1
    with pytest.raises(KernelInputError, match="Max"):
        kernel("Max", device)(np.ones((2, 3), np.float32), np.ones((4,), np.float32))
    with pytest.raises(KernelInputError, match="broadcasting came with opset 8"):
        kernel("Sum", device, 6)(np.ones((2, 3), np.float32), np.ones((3,), np.float32))
    with pytest.raises(KernelInputError, match="Min"):
        kernel("Min", device)()
    with pytest.raises(KernelTypeError, match="Max"):
        kernel("Max", device)(np.ones(2, np.float32), np.ones(2, np.float64))
    e = kernel("Max", device)(np.ones((0, 3), np.float32), np.ones((1, 3), np.float32))
    assert e.shape == (0, 3)
