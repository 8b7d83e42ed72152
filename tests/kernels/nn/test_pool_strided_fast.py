"""The host strided pooling path (_pool_host.pool_strided: taps applied at the output positions
through strided views, edge windows recomputed from their valid taps) for MaxPool and
AveragePool, against an independent float64 loop reference."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from gpukernels.kernels.base import KernelContext
from gpukernels.kernels.nn.pool import AveragePool, MaxPool


def _out_len(size, k, s, d, pb, pe, ceil_mode):
    span = size + pb + pe - ((k - 1) * d + 1)
    o = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (o - 1) * s >= size + pb:
        o -= 1
    return o


def _reference(x, kind, K, strides, pads, dilations, ceil_mode=0, include_pad=0):
    """Window by window in float64; max gives NaN when any window value is NaN and -inf
    (the dtype minimum for integers, applied by the caller) for a window with no value."""
    x = np.asarray(x, np.float64)
    N, C = x.shape[:2]
    S = x.shape[2:]
    n = len(S)
    out = [_out_len(S[i], K[i], strides[i], dilations[i], pads[i], pads[i + n], ceil_mode) for i in range(n)]
    y = np.empty((N, C, *out))
    for b, c in itertools.product(range(N), range(C)):
        for o in itertools.product(*[range(v) for v in out]):
            vals, count = [], 0
            for k in itertools.product(*[range(v) for v in K]):
                pos = [o[i] * strides[i] - pads[i] + k[i] * dilations[i] for i in range(n)]
                if all(0 <= pos[i] < S[i] for i in range(n)):
                    vals.append(x[(b, c) + tuple(pos)])
                    count += 1
                elif include_pad and all(-pads[i] <= pos[i] < S[i] + pads[i + n] for i in range(n)):
                    count += 1
            if kind == "max":
                if any(np.isnan(v) for v in vals):
                    y[(b, c) + o] = np.nan
                else:
                    y[(b, c) + o] = max(vals) if vals else -np.inf
            else:
                y[(b, c) + o] = sum(vals) / count if count else np.nan
    return y


# (shape, kernel, strides, pads, dilations, ceil_mode)
CASES = [
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
]


def _attrs(K, strides, pads, dilations, ceil_mode):
    return dict(kernel_shape=K, strides=strides, pads=pads, dilations=dilations, ceil_mode=ceil_mode)


def _random(rng, shape, dtype=np.float32):
    x = rng.uniform(0.5, 2.0, shape) * rng.choice([-1.0, 1.0], shape)  # never zero
    return x.astype(dtype)


@pytest.mark.parametrize("case", CASES)
def test_max_pool_strided(device, rng, case):
    shape, K, s, p, d, cm = case
    x = _random(rng, shape)
    y = MaxPool(KernelContext(device))(x, **_attrs(K, s, p, d, cm)).Y.numpy()
    np.testing.assert_array_equal(y, _reference(x, "max", K, s, p, d, cm).astype(np.float32))


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("include_pad", [0, 1])
def test_average_pool_strided(device, rng, case, include_pad):
    shape, K, s, p, d, cm = case
    x = _random(rng, shape)
    y = AveragePool(KernelContext(device))(x, count_include_pad=include_pad, **_attrs(K, s, p, d, cm)).numpy()
    np.testing.assert_allclose(y, _reference(x, "avg", K, s, p, d, cm, include_pad), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", [CASES[1], CASES[6], CASES[12], CASES[16]])
def test_max_pool_strided_nan(device, rng, case):
    """A NaN anywhere in a window gives NaN (as np.maximum does), not only a leading one."""
    shape, K, s, p, d, cm = case
    x = _random(rng, shape)
    x.reshape(-1)[rng.choice(x.size, max(1, x.size // 15), replace=False)] = np.nan
    y = MaxPool(KernelContext(device))(x, **_attrs(K, s, p, d, cm)).Y.numpy()
    np.testing.assert_array_equal(y, _reference(x, "max", K, s, p, d, cm).astype(np.float32))


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("case", [CASES[0], CASES[1], CASES[7], CASES[9], CASES[15]])
def test_max_pool_strided_int8(device, rng, dtype, case):
    shape, K, s, p, d, cm = case
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max + 1, shape).astype(dtype)
    x[x == 0] = 1
    y = MaxPool(KernelContext(device))(x, **_attrs(K, s, p, d, cm)).Y.numpy()
    assert y.dtype == dtype
    np.testing.assert_array_equal(y, _reference(x, "max", K, s, p, d, cm).astype(dtype))


def test_max_pool_strided_window_in_padding(device, rng):
    """Pads larger than the kernel: a window with no input value gives the fill value
    (-inf, or the dtype minimum) for MaxPool and 0 / 0 = NaN for AveragePool without padding
    counted."""
    x = _random(rng, (1, 2, 6, 7))
    attrs = dict(kernel_shape=[2, 2], strides=[2, 2], pads=[3, 0, 0, 3])
    y = MaxPool(KernelContext(device))(x, **attrs).Y.numpy()
    np.testing.assert_array_equal(y, _reference(x, "max", [2, 2], [2, 2], [3, 0, 0, 3], [1, 1]).astype(np.float32))
    assert np.isneginf(y[:, :, 0]).all()
    xi = rng.integers(1, 100, (1, 2, 6, 7)).astype(np.int8)
    yi = MaxPool(KernelContext(device))(xi, **attrs).Y.numpy()
    assert (yi[:, :, 0] == np.iinfo(np.int8).min).all()
    with np.errstate(invalid="ignore"):
        ya = AveragePool(KernelContext(device))(x, **attrs).numpy()
    np.testing.assert_allclose(ya[:, :, 1:], _reference(x, "avg", [2, 2], [2, 2], [3, 0, 0, 3], [1, 1])[:, :, 1:],
                               rtol=1e-5, atol=1e-6)
    assert np.isnan(ya[:, :, 0]).all()


def test_max_pool_strided_non_contiguous_input(device, rng):
    base = _random(rng, (2, 6, 13, 16))
    x = base[:, ::2, :, 1:15]  # strided channels, rows not contiguous
    attrs = _attrs([3, 3], [2, 2], [1, 1, 1, 1], [1, 1], 0)
    y = MaxPool(KernelContext(device))(x, **attrs).Y.numpy()
    np.testing.assert_array_equal(y, _reference(x, "max", [3, 3], [2, 2], [1, 1, 1, 1], [1, 1]).astype(np.float32))


@pytest.mark.parametrize("case", [CASES[0], CASES[1], CASES[9]])
def test_max_pool_strided_matches_indices_path(device, rng, case):
    """Y alone (strided path) equals Y of with_indices (window path), which is unchanged."""
    shape, K, s, p, d, cm = case
    x = _random(rng, shape)
    k = MaxPool(KernelContext(device))
    y = k(x, **_attrs(K, s, p, d, cm)).Y.numpy()
    r = k.with_indices(x, **_attrs(K, s, p, d, cm))
    np.testing.assert_array_equal(y, r.Y.numpy())
    assert r.Indices.numpy().dtype == np.int64
