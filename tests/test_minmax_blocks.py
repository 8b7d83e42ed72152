"""host_bound (kernels/math/unary.py): maximum/minimum of a host array and a constant,
read against a kept block of the constant, bit for bit the scalar ufunc's (-0, +0, NaN
payloads and signs, infinities, subnormals); and the kernels that use it (Relu, the Relu
epilogue, Gelu's cap, Mish's cap) bit for bit their previous formulas."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpukernels.kernels import KernelContext, load_all
from gpukernels.kernels.base import lookup
from gpukernels.kernels.math import activations, unary
from gpukernels.kernels.math.unary import host_bound
from gpukernels.kernels.nn import epilogues
from gpukernels.tensor import Tensor

pytestmark = pytest.mark.usefixtures("default_paths")

load_all()

_UINT = {np.float16: np.uint16, np.float32: np.uint32, np.float64: np.uint64}
BLOCK = 1 << 16  # elementwise.block_elems: sizes past it take several blocks


def _specials(dt):
    """-0, +0, infinities, subnormals, extremes and NaNs with payloads (quiet and
    signalling, both signs) of float type dt."""
    ut = _UINT[dt]
    nbits = np.dtype(dt).itemsize * 8
    sign = ut(1) << ut(nbits - 1)
    qnan = np.array(np.nan, dt).view(ut)[()]
    inf = np.array(np.inf, dt).view(ut)[()]
    nans = np.array([qnan, qnan | ut(5), qnan | ut(5) | sign, inf | ut(3), inf | ut(3) | sign], ut).view(dt)
    fi = np.finfo(dt)
    vals = [-0.0, 0.0, np.inf, -np.inf, fi.smallest_subnormal, -fi.smallest_subnormal, fi.tiny / 3,
            -fi.tiny / 3, fi.max, -fi.max, 1.0, -1.0, 20.0, 1e4, -1e4, 6.0]
    return np.concatenate([np.array(vals, dt), nans])


def _values(dt, n, seed=0):
    """n values: the specials repeated among random normals scaled over many binades."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-20, 20, n))).astype(dt)
    sp = _specials(dt)
    idx = rng.integers(0, n, min(n, 4 * sp.size)) if n else np.zeros(0, int)
    x[idx] = np.resize(sp, idx.size)
    if n >= sp.size:
        x[:sp.size] = sp
        x[-sp.size:] = sp  # in the last (partial) block too
    return x


def _bits_equal(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    ut = _UINT[a.dtype.type]
    np.testing.assert_array_equal(a.view(ut), b.view(ut))


CONSTANTS = [0.0, -0.0, 1.0, 20.0, 1e4, -6.0, np.inf, -np.inf, np.nan]


@pytest.fixture(params=[0, None], ids=["block-always", "default-threshold"])
def threshold(request, monkeypatch):
    """host_bound's block path from 0 elements on (small sizes exercise it) or as shipped."""
    if request.param is not None:
        monkeypatch.setattr(unary, "_BOUND_MIN_ELEMS", request.param)
    return unary._BOUND_MIN_ELEMS


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("ufunc", [np.maximum, np.minimum])
@pytest.mark.parametrize("c", CONSTANTS)
@pytest.mark.parametrize("n", [0, 1, 7, 37, 4095, 4096, 4097, BLOCK, 2 * BLOCK + 3])
def test_host_bound_bits_flat(threshold, dt, ufunc, c, n):
    x = _values(dt, n, seed=n)
    cv = dt(c)
    ref = ufunc(x, cv)
    _bits_equal(host_bound(ufunc, x, cv), ref)
    out = np.full_like(x, 7)
    assert host_bound(ufunc, x, cv, out) is out
    _bits_equal(out, ref)
    y = x.copy()  # in place
    host_bound(ufunc, y, cv, y)
    _bits_equal(y, ref)
    if 0 < n and threshold <= n and c == c:  # the block path was taken
        assert (np.dtype(dt).char, float(cv), math.copysign(1.0, cv)) in unary._BLOCKS


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("ufunc", [np.maximum, np.minimum])
def test_host_bound_layouts(threshold, dt, ufunc):
    """0-d, n-d contiguous, strided, transposed, Fortran-ordered inputs and outputs."""
    c = dt(0)
    base = _values(dt, 6 * 70 * 71, seed=3).reshape(6, 70, 71)
    cases = [base, base[:, ::2], base.transpose(2, 0, 1), np.asfortranarray(base), base[1:, 3:, 5:],
             base.reshape(-1)[::3], np.array(base.reshape(-1)[5])]
    for x in cases:
        ref = ufunc(x, c)
        got = host_bound(ufunc, x, c)
        assert type(got) is type(ref)
        _bits_equal(got, ref)
        for out in (np.empty(x.shape, dt), np.empty(x.shape, dt, order="F"),
                    np.empty(x.shape + (2,), dt)[..., 0]):
            host_bound(ufunc, x, c, out)
            _bits_equal(out, ref)
    x = base.reshape(-1)[::2]
    host_bound(ufunc, x, c, x)  # in place, strided
    _bits_equal(x, ufunc(base.reshape(-1)[::2].copy(), c))


def test_host_bound_other_types_and_scalars(threshold):
    """Anything but a float32/float64 array with a scalar of its type: the scalar call."""
    x = np.arange(-5000, 5000, dtype=np.int32)
    np.testing.assert_array_equal(host_bound(np.maximum, x, np.int32(0)), np.maximum(x, 0))
    with np.errstate(over="ignore"):
        h = _values(np.float32, 5000).astype(np.float16)
    _bits_equal(host_bound(np.minimum, h, np.float16(1)), np.minimum(h, np.float16(1)))
    f = _values(np.float32, 5000)
    with np.errstate(invalid="ignore"):  # signalling NaNs widened to float64
        _bits_equal(host_bound(np.maximum, f, np.float64(0.5)), np.maximum(f, np.float64(0.5)))
    _bits_equal(host_bound(np.maximum, f, 0.5), np.maximum(f, 0.5))


def test_host_bound_many_constants(monkeypatch):
    """Past the kept blocks' limit the scalar call (the same bits)."""
    monkeypatch.setattr(unary, "_BLOCKS", {})
    x = _values(np.float32, 9000)
    for k in range(unary._MAX_BLOCKS + 5):
        c = np.float32(k / 7)
        _bits_equal(host_bound(np.minimum, x, c), np.minimum(x, c))
    assert len(unary._BLOCKS) == unary._MAX_BLOCKS


# ------------------------------------------------------------------ the kernels


def kernel(op, device="cpu"):
    cls, v = lookup(op, "", None)
    return cls(KernelContext(device), version=v)


def _scalar_bound(ufunc, x, c, out=None):
    return ufunc(x, c, out=out)


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(2, 16, 24, 24), (3, 5, 7), (1, 3, 300, 301), ()])
def test_relu_kernel_bits(dt, shape):
    n = int(np.prod(shape))
    x = _values(dt, n, seed=n).reshape(shape)
    got = kernel("Relu")(Tensor(x)).numpy()
    _bits_equal(got, np.maximum(x, dt(0)))  # the previous formula
    fn = kernel("Relu").array_op(np, np.dtype(dt))
    _bits_equal(fn(x), np.maximum(x, dt(0)))
    if x.ndim == 3:
        xt = x.transpose(2, 0, 1)
        _bits_equal(fn(xt), np.maximum(xt, dt(0)))


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(2, 16, 24, 24), (1, 64, 56, 57), (2, 3, 5)])
def test_relu_epilogue_bits(dt, shape):
    n = int(np.prod(shape))
    x = _values(dt, n, seed=n + 1).reshape(shape)
    ref = np.maximum(x, dt(0))
    epi = epilogues.build_epilogue(kernel("Relu"), {}, dt)
    out = np.empty_like(x)
    epi(x, out)
    _bits_equal(out, ref)
    y = x.copy()
    epi(y, y)
    _bits_equal(y, ref)
    xt = np.ascontiguousarray(x.transpose(0, 2, 3, 1) if x.ndim == 4 else x.T)
    src = xt.transpose(0, 3, 1, 2) if x.ndim == 4 else xt.T  # x's values, another layout
    out = np.empty_like(x)
    epi(src, out)
    _bits_equal(out, ref)


@pytest.mark.parametrize("shape", [(2, 16, 24, 24), (1, 3, 300, 301), (5,)])
def test_gelu_bits_unchanged(monkeypatch, shape):
    """float32 Gelu (its cap min(x^2, 1e4)) equals the scalar-minimum formula."""
    n = int(np.prod(shape))
    x = _values(np.float32, n, seed=n).reshape(shape)
    g = kernel("Gelu")
    with np.errstate(all="ignore"):
        new = g.compute(np, x, "none")
        monkeypatch.setattr(activations, "host_bound", _scalar_bound)
        old = g.compute(np, x, "none")
    _bits_equal(new, old)


def _old_mish_chain(xp, x, out, scratch):
    f = x.dtype.type
    xp.clip(x, f(-np.inf), f(20), out=out)
    xp.exp(out, out=out)
    xp.add(out, f(2), out=scratch)
    out *= scratch
    xp.add(out, f(2), out=scratch)
    out /= scratch
    out *= x


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(2, 16, 24, 24), (1, 3, 300, 301), (5,)])
def test_mish_bits_unchanged(monkeypatch, dt, shape):
    """Mish's cap min(x, 20) equals its previous clip(x, -inf, 20), bit for bit."""
    n = int(np.prod(shape))
    x = _values(dt, n, seed=n).reshape(shape)
    m = kernel("Mish")
    with np.errstate(all="ignore"):
        new = m.compute(np, x)
        monkeypatch.setitem(activations._LOGISTIC_CHAINS, "Mish", (_old_mish_chain, True))
        old = m.compute(np, x)
    _bits_equal(new, old)


def test_clip_keeps_numpy_clip_bits():
    """Clip stays NumPy's one-pass clip on the host: it keeps -0 where maximum then
    minimum gives +0 (why Clip does not use host_bound)."""
    x = np.array([-0.0, 0.0, -1.0, 7.0, np.nan], np.float32)
    got = kernel("Clip")(Tensor(x), Tensor(np.array(0, np.float32)),
                         Tensor(np.array(6, np.float32))).numpy()
    _bits_equal(got, np.clip(x, np.float32(0), np.float32(6)))
    assert np.signbit(got[0]) and not np.signbit(np.minimum(np.maximum(x, np.float32(0)), np.float32(6))[0])
