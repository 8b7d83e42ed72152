"""Pooling kernels against naive float64 loops (tests.reference.pool), and the host
strided path (specialisation 'Pool.windows': taps applied at the output positions through
strided views, edge windows recomputed from their valid taps) on both paths."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from gpukernels.errors import KernelInputError, KernelTypeError
from gpukernels.kernels.base import KernelContext
from gpukernels.kernels.nn.pool import (
    AveragePool,
    GlobalAveragePool,
    GlobalLpPool,
    GlobalMaxPool,
    LpPool,
    MaxPool,
    MaxRoiPool,
    MaxUnpool,
)
from tests.reference import pool, same_pads

POOL_CASES = [
    ((2, 3, 9), dict(kernel_shape=[3], strides=[2])),
    ((1, 2, 7, 8), dict(kernel_shape=[3, 2], strides=[2, 2], pads=[1, 0, 1, 1])),
    ((1, 2, 7, 8), dict(kernel_shape=[3, 3], strides=[2, 3], pads=[1, 1, 1, 1], ceil_mode=1)),
    ((1, 2, 8, 8), dict(kernel_shape=[2, 3], dilations=[2, 2], strides=[1, 2], pads=[0, 1, 1, 0])),
    ((1, 2, 6, 7), dict(kernel_shape=[3, 3], dilations=[2, 1], strides=[2, 2], ceil_mode=1)),
    ((1, 2, 4, 5, 6), dict(kernel_shape=[2, 3, 2], strides=[1, 2, 2], pads=[1, 0, 1, 0, 1, 1])),
    ((1, 1, 4, 4, 3, 3), dict(kernel_shape=[2, 2, 2, 2], strides=[2, 1, 1, 2])),
]


def _ref_attrs(attrs):
    return dict(K=attrs["kernel_shape"], strides=attrs.get("strides"), pads=attrs.get("pads"),
                dilations=attrs.get("dilations"), ceil_mode=attrs.get("ceil_mode", 0))


@pytest.mark.parametrize("shape,attrs", POOL_CASES)
@pytest.mark.parametrize("include_pad", [0, 1])
def test_average_pool(device, rng, shape, attrs, include_pad):
    x = rng.standard_normal(shape).astype(np.float32)
    x0 = x.copy()
    y = AveragePool(KernelContext(device))(x, count_include_pad=include_pad, **attrs).numpy()
    want, _ = pool(x, "avg", include_pad=include_pad, **_ref_attrs(attrs))
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(x, x0)


@pytest.mark.parametrize("shape,attrs", POOL_CASES)
@pytest.mark.parametrize("storage_order", [0, 1])
def test_max_pool_with_indices(device, rng, shape, attrs, storage_order):
    x = rng.standard_normal(shape).astype(np.float32)
    k = MaxPool(KernelContext(device))
    k.requested_outputs = (True, True)  # as the runtime does for a node declaring Indices
    res = k(x, storage_order=storage_order, **attrs)
    want, want_idx = pool(x, "max", storage_order=storage_order, **_ref_attrs(attrs))
    np.testing.assert_array_equal(res.Y.numpy(), want.astype(np.float32))
    np.testing.assert_array_equal(res.Indices.numpy(), want_idx)
    both = k.with_indices(x, storage_order=storage_order, **attrs)
    np.testing.assert_array_equal(both.Indices.numpy(), want_idx)


def test_max_pool_indices_only_when_requested(rng):
    k = MaxPool()
    x = rng.standard_normal((1, 1, 4, 4)).astype(np.float32)
    res = k(x, kernel_shape=[2, 2])  # a direct call: Y only
    assert res.Indices is None and res.Y.shape == (1, 1, 3, 3)
    k.requested_outputs = (True, False)
    assert k(x, kernel_shape=[2, 2]).Indices is None
    assert k.with_indices(np.ones((1, 1, 2, 2), np.float32), kernel_shape=[2, 2]).Indices is not None


def test_max_pool_opset1_returns_y(rng):
    y = MaxPool(KernelContext("cpu", opset=1))(rng.standard_normal((1, 1, 4, 4)).astype(np.float32),
                                                kernel_shape=[2, 2])
    assert y.shape == (1, 1, 3, 3)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_max_pool_int8(device, rng, dtype):
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max + 1, size=(2, 2, 5, 5)).astype(dtype)
    x[0, 0] = info.min  # a window of minimum values next to padding: padding must not win
    res = MaxPool(KernelContext(device)).with_indices(x, kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2])
    want, want_idx = pool(x, "max", [3, 3], [2, 2], [1, 1, 1, 1])
    assert res.Y.numpy().dtype == dtype
    np.testing.assert_array_equal(res.Y.numpy(), want.astype(dtype))
    np.testing.assert_array_equal(res.Indices.numpy(), want_idx)
    with pytest.raises(KernelTypeError):
        MaxPool(KernelContext(device, opset=11))(x, kernel_shape=[3, 3])


@pytest.mark.parametrize("shape,attrs", POOL_CASES[:4])
@pytest.mark.parametrize("p", [1, 2, 3])
def test_lp_pool(device, rng, shape, attrs, p):
    x = rng.standard_normal(shape).astype(np.float32)
    y = LpPool(KernelContext(device))(x, p=p, **attrs).numpy()
    want, _ = pool(x, "lp", p=p, **_ref_attrs(attrs))
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["SAME_UPPER", "SAME_LOWER", "VALID"])
@pytest.mark.parametrize("ceil_mode", [0, 1])
def test_pool_auto_pad(device, rng, mode, ceil_mode):
    x = rng.standard_normal((1, 2, 7, 6)).astype(np.float32)
    K, strides = [3, 2], [2, 3]
    attrs = dict(kernel_shape=K, strides=strides, auto_pad=mode, ceil_mode=ceil_mode)
    if mode == "VALID":
        pads = [0, 0, 0, 0]
        out = [(7 - 3) // 2 + 1, (6 - 2) // 3 + 1]
    else:
        pads = same_pads([7, 6], K, strides, [1, 1], mode)
        out = [4, 2]
    avg = AveragePool(KernelContext(device))(x, **attrs).numpy()
    np.testing.assert_allclose(avg, pool(x, "avg", K, strides, pads, out=out)[0], rtol=1e-5, atol=1e-6)
    res = MaxPool(KernelContext(device)).with_indices(x, **attrs)
    want, idx = pool(x, "max", K, strides, pads, out=out)
    np.testing.assert_array_equal(res.Y.numpy(), want.astype(np.float32))
    np.testing.assert_array_equal(res.Indices.numpy(), idx)
    lp = LpPool(KernelContext(device))(x, **attrs).numpy()
    np.testing.assert_allclose(lp, pool(x, "lp", K, strides, pads, out=out)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype,tol", [(np.float16, 2e-3), (ml_dtypes.bfloat16, 1e-2), (np.float64, 1e-12)])
def test_pool_dtypes(device, rng, dtype, tol):
    x = rng.standard_normal((1, 3, 6, 6)).astype(dtype)
    xd = x.astype(np.float64)
    attrs = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    for cls, kind in ((AveragePool, "avg"), (LpPool, "lp")):
        y = cls(KernelContext(device))(x, **attrs).numpy()
        assert y.dtype == np.dtype(dtype)
        want, _ = pool(xd, kind, [3, 3], [2, 2], [1, 1, 1, 1])
        np.testing.assert_allclose(y.astype(np.float64), want, rtol=tol, atol=tol)
    y = MaxPool(KernelContext(device))(x, **attrs).Y.numpy()
    np.testing.assert_array_equal(y.astype(np.float64), pool(xd, "max", [3, 3], [2, 2], [1, 1, 1, 1])[0])


def test_pool_errors(rng):
    x = rng.standard_normal((1, 2, 4, 4)).astype(np.float32)
    with pytest.raises(KernelInputError, match="kernel_shape"):
        AveragePool()(x)
    with pytest.raises(KernelInputError, match="larger than the padded input"):
        MaxPool()(x, kernel_shape=[5, 5])
    with pytest.raises(KernelInputError, match="pads"):
        MaxPool()(x, kernel_shape=[2, 2], pads=[1, 1, 1])
    with pytest.raises(KernelInputError, match="auto_pad") as info:
        LpPool()(x, kernel_shape=[2, 2], auto_pad="same")
    assert "LpPool" in str(info.value) and "float32[1, 2, 4, 4]" in str(info.value)
    with pytest.raises(KernelInputError, match="rank"):
        AveragePool()(x[0, 0], kernel_shape=[2])


# ---------------------------------------------------------------- host strided path

STRIDED_CASES = [
    # the benchmark geometry, small: k3 s2 pad1, even rows (row length a multiple of the stride)
    ((1, 3, 12, 12), [3, 3], [2, 2], [1, 1, 1, 1], [1, 1], 0),
    ((2, 2, 11, 13), [3, 3], [2, 2], [1, 1, 1, 1], [1, 1], 0),  # odd sizes
    ((1, 2, 9, 10), [3, 3], [2, 2], [0, 0, 0, 0], [1, 1], 0),  # O < W / s: unused columns
    ((1, 2, 8, 10), [2, 2], [2, 2], [1, 1, 1, 1], [1, 1], 0),  # O > W / s: no flat pass
    ((2, 3, 10), [1], [1], [0, 0], [1], 0),
    ((2, 3, 10), [4], [1], [1, 2], [1], 0),
    ((2, 3, 17), [3], [3], [2, 1], [1], 0),
    ((2, 3, 18), [4], [3], [0, 3], [1], 1),
    ((1, 2, 15), [2], [2], [1, 0], [3], 0),  # dilation
    ((1, 2, 7, 9), [3, 2], [3, 2], [2, 0, 1, 1], [1, 2], 0),  # asymmetric pads, dilation
    ((1, 2, 7, 8), [3, 3], [2, 3], [1, 1, 1, 1], [1, 1], 1),  # ceil_mode
    ((1, 2, 6, 7), [3, 3], [2, 2], [0, 0, 0, 0], [2, 1], 1),
    ((1, 2, 5, 1), [3, 1], [2, 1], [1, 0, 1, 0], [1, 1], 0),  # rows of length 1
    ((1, 2, 5, 1), [2, 3], [1, 2], [0, 1, 1, 1], [1, 1], 0),
    ((1, 2, 1, 6), [1, 3], [1, 2], [0, 1, 0, 1], [1, 1], 0),
    ((2, 2, 4, 5, 6), [2, 3, 2], [1, 2, 2], [1, 0, 1, 0, 1, 1], [1, 1, 1], 0),  # 3-D
    ((1, 2, 7, 6, 9), [3, 2, 3], [2, 3, 2], [1, 0, 1, 1, 1, 1], [1, 2, 1], 0),
    ((1, 1, 5, 6, 7), [2, 2, 4], [3, 1, 3], [0, 0, 2, 1, 1, 1], [1, 1, 1], 1),
    ((1, 1, 3, 10), [20, 3], [1, 2], [17, 1, 17, 1], [1, 1], 0),  # many edge outputs: window path
    ((70, 3, 20, 22), [3, 3], [2, 2], [1, 1, 1, 1], [1, 1], 0),  # several channel blocks
    # every window inside the input (_pool_host._inside_2d): UNet's 2x2 stride 2, a kernel
    # row or column of one tap, strides unlike the kernel, dilations, several blocks
    ((2, 4, 16, 16), [2, 2], [2, 2], [0, 0, 0, 0], [1, 1], 0),
    ((1, 3, 11, 14), [3, 2], [2, 3], [0, 0, 0, 0], [2, 1], 0),
    ((1, 2, 9, 9), [1, 3], [1, 2], [0, 0, 0, 0], [1, 1], 0),
    ((1, 2, 9, 9), [3, 1], [2, 1], [0, 0, 0, 0], [1, 1], 0),
    ((1, 2, 7, 7), [1, 1], [2, 3], [0, 0, 0, 0], [1, 1], 1),
    ((40, 3, 20, 22), [2, 2], [2, 2], [0, 0, 0, 0], [1, 1], 0),
]
WINDOW_ONLY = STRIDED_CASES[18]  # 'Pool.windows' declines it: too many edge outputs
INSIDE = STRIDED_CASES[20:]  # every window inside the input: _pool_host._inside_2d


def _strided_attrs(K, strides, pads, dilations, ceil_mode):
    return dict(kernel_shape=K, strides=strides, pads=pads, dilations=dilations, ceil_mode=ceil_mode)


def _nonzero(rng, shape, dtype=np.float32):
    x = rng.uniform(0.5, 2.0, shape) * rng.choice([-1.0, 1.0], shape)  # never zero
    return x.astype(dtype)


def _pool_kernel(cls, device, path):
    return cls(KernelContext(device, options={"paths": path}))


def _check_site(taken, device, path, case):
    """'Pool.windows' runs exactly on the host with specialisations allowed, where it covers."""
    assert ("Pool.windows" in taken) == (device == "cpu" and path == "auto" and case is not WINDOW_ONLY), taken


@pytest.mark.parametrize("case", STRIDED_CASES)
def test_max_pool_strided(device, path, rng, sites_taken, case):
    shape, K, s, p, d, cm = case
    x = _nonzero(rng, shape)
    with sites_taken() as taken:
        y = _pool_kernel(MaxPool, device, path)(x, **_strided_attrs(K, s, p, d, cm)).Y.numpy()
    _check_site(taken, device, path, case)
    np.testing.assert_array_equal(y, pool(x, "max", K, s, p, d, cm)[0].astype(np.float32))


@pytest.mark.parametrize("case", STRIDED_CASES)
@pytest.mark.parametrize("include_pad", [0, 1])
def test_average_pool_strided(device, path, rng, sites_taken, case, include_pad):
    shape, K, s, p, d, cm = case
    x = _nonzero(rng, shape)
    with sites_taken() as taken:
        y = _pool_kernel(AveragePool, device, path)(x, count_include_pad=include_pad,
                                                    **_strided_attrs(K, s, p, d, cm)).numpy()
    _check_site(taken, device, path, case)
    np.testing.assert_allclose(y, pool(x, "avg", K, s, p, d, cm, include_pad)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", [STRIDED_CASES[i] for i in (1, 6, 12, 16, 20, 21)])
def test_max_pool_strided_nan(device, path, rng, case):
    """A NaN anywhere in a window gives NaN (as np.maximum does), not only a leading one."""
    shape, K, s, p, d, cm = case
    x = _nonzero(rng, shape)
    x.reshape(-1)[rng.choice(x.size, max(1, x.size // 15), replace=False)] = np.nan
    y = _pool_kernel(MaxPool, device, path)(x, **_strided_attrs(K, s, p, d, cm)).Y.numpy()
    np.testing.assert_array_equal(y, pool(x, "max", K, s, p, d, cm)[0].astype(np.float32))


@pytest.mark.parametrize("case", STRIDED_CASES)
def test_inside_windows_take_the_two_pass_path(rng, monkeypatch, case):
    """2-D geometries whose every window lies inside the input (no padding, no ceil_mode
    overhang), or for MaxPool reads some of it, take _inside_2d, the others do not."""
    from gpukernels.kernels.nn import _pool_host

    calls = []
    real = _pool_host._inside_2d
    monkeypatch.setattr(_pool_host, "_inside_2d", lambda *a: calls.append(1) or real(*a))
    shape, K, s, p, d, cm = case
    x = _nonzero(rng, shape)
    y = _pool_kernel(MaxPool, "cpu", "auto")(x, **_strided_attrs(K, s, p, d, cm)).Y.numpy()
    np.testing.assert_array_equal(y, pool(x, "max", K, s, p, d, cm)[0].astype(np.float32))
    O = y.shape[2:]

    def reads_input(i, o):  # output o along spatial axis i reads some of the input
        return any(0 <= o * s[i] + t * d[i] - p[i] < shape[2 + i] for t in range(K[i]))

    inside = len(K) == 2 and not any(p) and all(s[i] * (O[i] - 1) + (K[i] - 1) * d[i] < shape[2 + i] for i in range(2))
    # padded MaxPool: the same two passes over a copy in a border of -inf when every window
    # reads some input (a window in the padding alone keeps the edge path)
    bordered = len(K) == 2 and case is not WINDOW_ONLY and all(reads_input(i, o) for i in range(2) for o in range(O[i]))
    assert bool(calls) == (inside or bordered), case
    if case in INSIDE:
        assert inside


def test_bordered_scratch_kept_across_geometries(rng):
    """Padded MaxPools of three geometries (more than the two kept per thread) and new
    values, alternating: the kept -inf border never holds another call's data."""
    cases = [STRIDED_CASES[i] for i in (0, 1, 9)]
    for _ in range(3):
        for shape, K, s, p, d, cm in cases:
            x = _nonzero(rng, shape)
            y = _pool_kernel(MaxPool, "cpu", "auto")(x, **_strided_attrs(K, s, p, d, cm)).Y.numpy()
            np.testing.assert_array_equal(y, pool(x, "max", K, s, p, d, cm)[0].astype(np.float32))


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("case", [STRIDED_CASES[i] for i in (0, 1, 7, 9, 15, 20)])
def test_max_pool_strided_int8(device, path, rng, dtype, case):
    shape, K, s, p, d, cm = case
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max + 1, shape).astype(dtype)
    x[x == 0] = 1
    y = _pool_kernel(MaxPool, device, path)(x, **_strided_attrs(K, s, p, d, cm)).Y.numpy()
    assert y.dtype == dtype
    np.testing.assert_array_equal(y, pool(x, "max", K, s, p, d, cm)[0].astype(dtype))


def test_max_pool_strided_window_in_padding(device, path, rng):
    """Pads larger than the kernel: a window with no input value gives the fill value
    (-inf, or the dtype minimum) for MaxPool and 0 / 0 = NaN for AveragePool without padding
    counted."""
    x = _nonzero(rng, (1, 2, 6, 7))
    K, s, p = [2, 2], [2, 2], [3, 0, 0, 3]
    attrs = dict(kernel_shape=K, strides=s, pads=p)
    y = _pool_kernel(MaxPool, device, path)(x, **attrs).Y.numpy()
    np.testing.assert_array_equal(y, pool(x, "max", K, s, p)[0].astype(np.float32))
    assert np.isneginf(y[:, :, 0]).all()
    xi = rng.integers(1, 100, (1, 2, 6, 7)).astype(np.int8)
    yi = _pool_kernel(MaxPool, device, path)(xi, **attrs).Y.numpy()
    assert (yi[:, :, 0] == np.iinfo(np.int8).min).all()
    with np.errstate(invalid="ignore"):
        ya = _pool_kernel(AveragePool, device, path)(x, **attrs).numpy()
    np.testing.assert_allclose(ya[:, :, 1:], pool(x, "avg", K, s, p)[0][:, :, 1:], rtol=1e-5, atol=1e-6)
    assert np.isnan(ya[:, :, 0]).all()


def test_max_pool_strided_non_contiguous_input(device, path, rng):
    base = _nonzero(rng, (2, 6, 13, 16))
    x = base[:, ::2, :, 1:15]  # strided channels, rows not contiguous
    y = _pool_kernel(MaxPool, device, path)(x, **_strided_attrs([3, 3], [2, 2], [1, 1, 1, 1], [1, 1], 0)).Y.numpy()
    np.testing.assert_array_equal(y, pool(x, "max", [3, 3], [2, 2], [1, 1, 1, 1], [1, 1])[0].astype(np.float32))


@pytest.mark.parametrize("case", [STRIDED_CASES[i] for i in (0, 1, 9)])
def test_max_pool_strided_matches_indices_path(device, path, rng, case):
    """Y alone (the strided path where it runs) equals Y of with_indices (the window path)."""
    shape, K, s, p, d, cm = case
    x = _nonzero(rng, shape)
    k = _pool_kernel(MaxPool, device, path)
    y = k(x, **_strided_attrs(K, s, p, d, cm)).Y.numpy()
    r = k.with_indices(x, **_strided_attrs(K, s, p, d, cm))
    np.testing.assert_array_equal(y, r.Y.numpy())
    assert r.Indices.numpy().dtype == np.int64


# ---------------------------------------------------------------- global pools


@pytest.mark.parametrize("shape", [(2, 3, 5), (1, 2, 4, 5), (2, 2, 3, 2, 4)])
def test_global_pools(device, rng, shape):
    x = rng.standard_normal(shape).astype(np.float32)
    xd = x.astype(np.float64)
    axes = tuple(range(2, len(shape)))
    ctx = KernelContext(device)
    np.testing.assert_allclose(GlobalAveragePool(ctx)(x).numpy(), xd.mean(axes, keepdims=True), rtol=1e-5)
    np.testing.assert_array_equal(GlobalMaxPool(ctx)(x).numpy(), x.max(axes, keepdims=True))
    for p in (1, 2, 3):
        want = (np.abs(xd) ** p).sum(axes, keepdims=True) ** (1 / p)
        np.testing.assert_allclose(GlobalLpPool(ctx)(x, p=p).numpy(), want, rtol=1e-5)
    # opset 1 GlobalLpPool takes a float p
    np.testing.assert_allclose(GlobalLpPool(KernelContext(device, opset=1))(x, p=2.0).numpy(),
                               np.sqrt((xd ** 2).sum(axes, keepdims=True)), rtol=1e-5)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(2, 5, 32, 32), (2, 3, 33, 32), (3, 4, 1, 1), (1, 6, 9)])
def test_global_average_pool_either_sum(device, rng, shape, dtype):
    """Planes of up to 1024 pixels summed by a matrix-vector product, larger ones by
    NumPy's pairwise mean: both against float64 (values around 3, so rtol means it)."""
    x = (rng.standard_normal(shape) + 3).astype(dtype)
    axes = tuple(range(2, len(shape)))
    y = GlobalAveragePool(KernelContext(device))(x).numpy()
    assert y.dtype == dtype and y.shape == shape[:2] + (1,) * (len(shape) - 2)
    tol = 1e-6 if dtype == np.float32 else 1e-13
    np.testing.assert_allclose(y, x.astype(np.float64).mean(axes, keepdims=True), rtol=tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 8, 6, 7), (1, 2, 3, 2, 4), (1, 3, 40, 40)])
def test_global_pool_array_functions_equal_the_kernels(device, rng, shape, dtype):
    """What compiled graphs call: the kernels' arrays exactly, with no array function for
    float16 (computed in float32 and rounded) or an empty GlobalMaxPool (the kernel raises)."""
    x = rng.standard_normal(shape).astype(dtype)
    ctx = KernelContext(device)
    for cls in (GlobalAveragePool, GlobalMaxPool):
        k = cls(ctx)
        t = k.tensor(x)
        want = k(t).numpy()
        fn = k.array_function([t], {})
        got = fn(t.array)
        got = got.get() if hasattr(got, "get") else got
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
        assert k.array_function([k.tensor(x.astype(np.float16))], {}) is None
    empty = GlobalMaxPool(ctx)
    assert empty.array_function([empty.tensor(np.zeros((1, 2, 0, 3), np.float32))], {}) is None


def test_global_pools_half(device, rng):
    x = rng.standard_normal((2, 3, 4, 4)).astype(np.float16)
    y = GlobalLpPool(KernelContext(device))(x).numpy()
    assert y.dtype == np.float16
    want = np.sqrt((x.astype(np.float64) ** 2).sum((2, 3), keepdims=True))
    np.testing.assert_allclose(y.astype(np.float64), want, rtol=2e-3)


# ---------------------------------------------------------------- MaxUnpool


def test_max_unpool_roundtrip(device, rng):
    x = (np.abs(rng.standard_normal((2, 3, 6, 4))) + 0.1).astype(np.float32)  # > 0: zeros never win
    pooled = MaxPool(KernelContext(device)).with_indices(x, kernel_shape=[2, 2], strides=[2, 2])
    k = MaxUnpool(KernelContext(device))
    y = k(pooled.Y, pooled.Indices, kernel_shape=[2, 2], strides=[2, 2]).numpy()
    want = np.zeros(x.size, np.float32)
    want[pooled.Indices.numpy().reshape(-1)] = pooled.Y.numpy().reshape(-1)
    np.testing.assert_array_equal(y.reshape(-1), want)
    # unpooled then pooled again gives back the pooled values
    again = MaxPool(KernelContext(device))(y, kernel_shape=[2, 2], strides=[2, 2]).Y.numpy()
    np.testing.assert_array_equal(again, pooled.Y.numpy())
    # output_shape larger than the unpooled size pads after it (the spec's example)
    big = k(pooled.Y, pooled.Indices, np.array([2, 3, 7, 5]), kernel_shape=[2, 2], strides=[2, 2]).numpy()
    assert big.shape == (2, 3, 7, 5)
    np.testing.assert_array_equal(big[:, :, :6, :4], y)
    assert not big[:, :, 6:, :].any() and not big[:, :, :, 4:].any()
    with pytest.raises(KernelInputError, match="smaller than the unpooled size"):
        k(pooled.Y, pooled.Indices, np.array([2, 3, 5, 4]), kernel_shape=[2, 2], strides=[2, 2])


def test_max_unpool_default_shape_and_errors(device):
    x = np.array([[[[1, 2], [3, 4]]]], np.float32)
    i = np.array([[[[5, 7], [13, 15]]]], np.int64)
    k = MaxUnpool(KernelContext(device))
    y = k(x, i, kernel_shape=[2, 2], strides=[2, 2]).numpy()
    assert y.shape == (1, 1, 4, 4)
    assert y.reshape(-1)[[5, 7, 13, 15]].tolist() == [1, 2, 3, 4] and y.sum() == 10
    with pytest.raises(KernelInputError, match="indices must lie"):
        k(x, i + 10, kernel_shape=[2, 2], strides=[2, 2])
    with pytest.raises(KernelInputError, match="shape of X"):
        k(x, i[..., :1], kernel_shape=[2, 2], strides=[2, 2])


# ---------------------------------------------------------------- MaxRoiPool


def ref_roi_pool(x, rois, pooled, scale):
    N, C, H, W = x.shape
    PH, PW = pooled
    out = np.zeros((len(rois), C, PH, PW))

    def rnd(v):
        return int(np.sign(v) * np.floor(abs(v) + 0.5))

    for r, (b, x1, y1, x2, y2) in enumerate(rois):
        sw, sh, ew, eh = rnd(x1 * scale), rnd(y1 * scale), rnd(x2 * scale), rnd(y2 * scale)
        rh, rw = max(eh - sh + 1, 1), max(ew - sw + 1, 1)
        bh, bw = rh / PH, rw / PW
        for ph in range(PH):
            for pw in range(PW):
                h0 = min(max(int(np.floor(ph * bh)) + sh, 0), H)
                h1 = min(max(int(np.ceil((ph + 1) * bh)) + sh, 0), H)
                w0 = min(max(int(np.floor(pw * bw)) + sw, 0), W)
                w1 = min(max(int(np.ceil((pw + 1) * bw)) + sw, 0), W)
                if h1 <= h0 or w1 <= w0:
                    continue
                out[r, :, ph, pw] = x[int(b), :, h0:h1, w0:w1].max(axis=(1, 2))
    return out


def test_max_roi_pool(device, rng):
    x = rng.standard_normal((2, 3, 10, 12)).astype(np.float32)
    rois = np.array([[0, 1, 1, 8, 6], [1, 0, 0, 11, 9], [1, 5.4, 2.6, 7.5, 3.2], [0, -3, -2, 2, 20],
                     [0, 11, 9, 30, 30]], np.float32)
    for scale, pooled in ((1.0, [2, 3]), (0.5, [3, 3]), (2.0, [1, 4])):
        y = MaxRoiPool(KernelContext(device))(x, rois, pooled_shape=pooled, spatial_scale=scale).numpy()
        np.testing.assert_array_equal(y, ref_roi_pool(x, rois, pooled, scale).astype(np.float32))


def test_max_roi_pool_errors(rng):
    x = rng.standard_normal((1, 2, 4, 4)).astype(np.float32)
    with pytest.raises(KernelInputError, match="pooled_shape"):
        MaxRoiPool()(x, np.zeros((1, 5), np.float32))
    with pytest.raises(KernelInputError, match="batch"):
        MaxRoiPool()(x, np.array([[1, 0, 0, 1, 1]], np.float32), pooled_shape=[1, 1])
    with pytest.raises(KernelInputError, match="rois"):
        MaxRoiPool()(x, np.zeros((1, 4), np.float32), pooled_shape=[1, 1])
