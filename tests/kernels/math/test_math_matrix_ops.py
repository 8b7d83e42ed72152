"""Einsum, Det, MatMulInteger, LogSoftmax, Hardmax."""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest

from gpukernels.errors import KernelInputError, KernelTypeError
from gpukernels.kernels import KernelContext, load_all
from gpukernels.kernels.base import lookup
from gpukernels.tensor import Tensor

load_all()


def kernel(op, device, version=None):
    cls, v = lookup(op, "", version)
    return cls(KernelContext(device), version=v)


def ref_einsum(eq, *ops):
    """Explicit-output einsum by looping over every letter assignment."""
    lhs, out = eq.split("->")
    terms = lhs.split(",")
    sizes = {}
    for t, o in zip(terms, ops):
        for ch, d in zip(t, o.shape):
            sizes[ch] = d
    letters = sorted(sizes)
    res = np.zeros([sizes[ch] for ch in out])
    for assign in itertools.product(*[range(sizes[ch]) for ch in letters]):
        env = dict(zip(letters, assign))
        p = 1.0
        for t, o in zip(terms, ops):
            p *= float(o[tuple(env[ch] for ch in t)])
        res[tuple(env[ch] for ch in out)] += p
    return res


EQS = [
    ("bhqd,bhkd->bhqk", [(1, 2, 3, 4), (1, 2, 5, 4)]),
    ("ij,jk->ik", [(3, 4), (4, 2)]),
    ("ij,jk", [(3, 4), (4, 2)]),
    ("ij->ji", [(3, 4)]),
    ("ii->i", [(3, 3)]),
    ("ii", [(3, 3)]),
    ("i,i", [(4,), (4,)]),
    ("i,j->ij", [(3,), (2,)]),
    ("abc,cd,de->abe", [(2, 3, 2), (2, 3), (3, 2)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 2)]),
    ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 2)]),
    ("Ab,bC->AC", [(2, 3), (3, 4)]),
    ("ijk,jl->il", [(2, 3, 4), (3, 2)]),
    ("b i j , b j k -> b i k", [(2, 2, 3), (2, 3, 2)]),
    ("...ii->...i", [(2, 3, 3)]),
]


def to_explicit(eq, shapes):
    eq = eq.replace(" ", "")
    if "..." in eq:
        return None
    if "->" in eq:
        return eq
    counts = {}
    for ch in eq.replace(",", ""):
        counts[ch] = counts.get(ch, 0) + 1
    return eq + "->" + "".join(sorted(ch for ch, c in counts.items() if c == 1))


@pytest.mark.parametrize("eq,shapes", EQS, ids=[e for e, _ in EQS])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, ml_dtypes.bfloat16, np.int32, np.uint8,
                                   np.int64])
def test_einsum(eq, shapes, dtype, device, rng):
    ops = [rng.integers(1, 4, s).astype(dtype) for s in shapes]
    got = kernel("Einsum", device)(*[Tensor(o) for o in ops], equation=eq).numpy()
    assert got.dtype == np.dtype(dtype)
    explicit = to_explicit(eq, shapes)
    ref = ref_einsum(explicit, *[o.astype(np.float64) for o in ops]) if explicit else \
        np.einsum(eq, *[o.astype(np.float64) for o in ops])
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=1e-2 if np.dtype(dtype).itemsize == 2 else 1e-6)


def test_einsum_implicit_order_upper_first(device, rng):
    a = rng.standard_normal((2, 3)).astype(np.float32)
    b = rng.standard_normal((3, 4)).astype(np.float32)
    got = kernel("Einsum", device)(a, b, equation="bA,Ac").numpy()
    np.testing.assert_allclose(got, a @ b, rtol=1e-6)
    got = kernel("Einsum", device)(a, equation="ba").numpy()
    np.testing.assert_allclose(got, a.T, rtol=1e-6)


def test_einsum_errors(device):
    a = np.ones((2, 3), np.float32)
    with pytest.raises(KernelInputError, match="Einsum"):
        kernel("Einsum", device)(a, a, equation="ij->i")
    with pytest.raises(KernelInputError, match="Einsum"):
        kernel("Einsum", device)(a, equation="ijk->i")
    with pytest.raises(KernelInputError, match="Einsum"):
        kernel("Einsum", device)(a, a, equation="ij,ij->k")
    with pytest.raises(KernelInputError, match="sizes"):
        kernel("Einsum", device)(a, a, equation="ij,ji->ij")
    with pytest.raises(KernelInputError, match="Einsum"):
        kernel("Einsum", device)(a, equation="i1->i")
    with pytest.raises(KernelInputError, match="Einsum"):
        kernel("Einsum", device)(a)
    with pytest.raises(KernelTypeError, match="Einsum"):
        kernel("Einsum", device)(np.ones(2, np.int32), np.ones(2, np.float32), equation="i,i")


def test_einsum_empty(device):
    a = np.ones((0, 3), np.float32)
    b = np.ones((3, 2), np.float32)
    got = kernel("Einsum", device)(a, b, equation="ij,jk->ik")
    assert got.shape == (0, 2)
    got = kernel("Einsum", device)(b.T[:, :0], b[:0], equation="ij,jk->ik").numpy()
    np.testing.assert_array_equal(got, np.zeros((2, 2)))


# ------------------------------------------------------------------------------ Det


def ref_det(m):
    n = m.shape[0]
    if n == 0:
        return 1.0
    if n == 1:
        return m[0, 0]
    return sum((-1) ** j * m[0, j] * ref_det(np.delete(m[1:], j, axis=1)) for j in range(n))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("shape", [(3, 3), (2, 4, 4), (2, 1, 2, 2), (1, 1)])
def test_det(dtype, shape, device, rng):
    x = rng.uniform(-1, 1, shape).astype(dtype)
    got = kernel("Det", device)(Tensor(x)).numpy()
    x64 = x.astype(np.float64).reshape((-1,) + shape[-2:])
    ref = np.array([ref_det(m) for m in x64]).reshape(shape[:-2])
    tol = {np.dtype(np.float16): 5e-3, np.dtype(ml_dtypes.bfloat16): 3e-2}.get(np.dtype(dtype), 1e-5)
    assert got.shape == shape[:-2] and got.dtype == np.dtype(dtype)
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=tol, atol=tol)


def test_det_edges(device):
    assert kernel("Det", device)(np.zeros((0, 2, 2), np.float32)).shape == (0,)
    np.testing.assert_array_equal(kernel("Det", device)(np.zeros((3, 0, 0))).numpy(), [1, 1, 1])
    with pytest.raises(KernelInputError, match="Det"):
        kernel("Det", device)(np.zeros((2, 3), np.float32))


# -------------------------------------------------------------------- MatMulInteger


@pytest.mark.parametrize("ta,tb", [(np.uint8, np.uint8), (np.int8, np.int8), (np.uint8, np.int8),
                                   (np.int8, np.uint8)])
@pytest.mark.parametrize("zp", ["none", "scalar", "vector"])
def test_matmul_integer(ta, tb, zp, device, rng):
    def draw(t, shape):
        i = np.iinfo(t)
        return rng.integers(i.min, i.max + 1, shape).astype(t)
    a = draw(ta, (2, 3, 5))
    b = draw(tb, (5, 4))
    az = bz = None
    if zp == "scalar":
        az, bz = draw(ta, ()), draw(tb, ())
    elif zp == "vector":
        az, bz = draw(ta, (3,)), draw(tb, (4,))
    got = kernel("MatMulInteger", device)(a, b, az, bz).numpy()
    a64 = a.astype(np.int64) - (0 if az is None else (az.astype(np.int64).reshape(-1, 1) if zp == "vector"
                                                      else az.astype(np.int64)))
    b64 = b.astype(np.int64) - (0 if bz is None else bz.astype(np.int64))
    ref = np.einsum("bij,jk->bik", a64, b64)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, ref)


def test_matmul_integer_large_k_and_errors(device, rng):
    a = rng.integers(0, 256, (2, 600)).astype(np.uint8)
    b = rng.integers(-128, 128, (600, 3)).astype(np.int8)
    ref = a.astype(np.int64) @ b.astype(np.int64)
    np.testing.assert_array_equal(kernel("MatMulInteger", device)(a, b).numpy(), ref)
    with pytest.raises(KernelInputError, match="MatMulInteger"):
        kernel("MatMulInteger", device)(a, b[:5])
    with pytest.raises(KernelTypeError, match="MatMulInteger"):
        kernel("MatMulInteger", device)(a.astype(np.int32), b)
    with pytest.raises(KernelInputError, match="MatMulInteger"):
        kernel("MatMulInteger", device)(a, b, np.zeros(3, np.uint8))


# ------------------------------------------------------------------- LogSoftmax/Hardmax


def ref_log_softmax_2d(x):
    out = np.empty_like(x)
    for i, row in enumerate(x):
        m = row.max()
        out[i] = row - m - np.log(np.exp(row - m).sum())
    return out


def ref_hardmax_2d(x):
    out = np.zeros_like(x)
    for i, row in enumerate(x):
        out[i, int(np.argmax(row))] = 1
    return out


@pytest.mark.parametrize("op,ref2d", [("LogSoftmax", ref_log_softmax_2d), ("Hardmax", ref_hardmax_2d)])
@pytest.mark.parametrize("version", [1, 11, 13])
@pytest.mark.parametrize("axis", [0, 1, -1, 2])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, ml_dtypes.bfloat16])
def test_logsoftmax_hardmax(op, ref2d, version, axis, dtype, device, rng):
    if version < 13 and np.dtype(dtype) == np.dtype(ml_dtypes.bfloat16):
        pytest.skip("bfloat16 from opset 13")
    x = rng.integers(-3, 4, (2, 3, 4)).astype(dtype)  # ties for Hardmax
    x64 = x.astype(np.float64)
    a = axis % 3
    if version < 13:
        ref = ref2d(x64.reshape(int(np.prod(x.shape[:a])), -1)).reshape(x.shape)
    else:
        moved = np.moveaxis(x64, a, -1)
        ref = np.moveaxis(ref2d(moved.reshape(-1, x.shape[a])).reshape(moved.shape), -1, a)
    got = kernel(op, device, version)(Tensor(x), axis=axis).numpy()
    tol = {np.dtype(np.float16): 3e-3, np.dtype(ml_dtypes.bfloat16): 2e-2}.get(np.dtype(dtype), 1e-6)
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=tol, atol=tol)


def test_softmax_family_defaults_and_errors(device):
    x = np.array([[1.0, 3.0, 3.0]], np.float32)
    np.testing.assert_array_equal(kernel("Hardmax", device)(x).numpy(), [[0, 1, 0]])
    with pytest.raises(KernelInputError, match="LogSoftmax"):
        kernel("LogSoftmax", device)(x, axis=2)
    with pytest.raises(KernelInputError, match="Hardmax"):
        kernel("Hardmax", device)(np.float32(1.0))
    assert kernel("LogSoftmax", device)(np.zeros((0, 4), np.float32)).shape == (0, 4)
    y = kernel("LogSoftmax", device)(np.array([[1000.0, 0.0]], np.float32)).numpy()
    np.testing.assert_allclose(y, [[0.0, -1000.0]], atol=1e-6)
