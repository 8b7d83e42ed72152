"""The host tap-product convolution (_conv_host.conv2d_taps: wide-row padded planes read by
BLAS as one (C, Ho*Wp) view per kernel tap, products accumulated) against a float64
reference on random inputs -- kernel shapes, dilations, asymmetric and oversized pads,
batches, float64, non-contiguous inputs, no bias -- and the choice between it and the
column-matrix path (_conv_host.use_tap_products) through the Conv kernel."""

from __future__ import annotations

import numpy as np
import pytest

from gpukernels.kernels.base import KernelContext
from gpukernels.kernels.nn import _conv_host as conv_host
from gpukernels.kernels.nn.conv import Conv

from tests.reference import conv as ref_conv

# these tests check the host specialisations themselves (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("default_paths")

CASES = [
    # x shape, M, kernel, pads (top, left, bottom, right), dilations
    ((1, 16, 9, 10), 4, (3, 3), (1, 1, 1, 1), (1, 1)),
    ((2, 8, 7, 12), 3, (1, 5), (0, 2, 0, 2), (1, 1)),
    ((1, 6, 11, 8), 2, (5, 3), (2, 0, 1, 3), (1, 2)),
    ((1, 5, 6, 6), 2, (3, 3), (0, 0, 0, 0), (2, 2)),
    ((1, 4, 3, 3), 3, (3, 3), (4, 5, 3, 2), (1, 1)),  # pads larger than the input
    ((3, 7, 1, 9), 5, (1, 3), (0, 1, 0, 1), (1, 1)),  # one row
    ((1, 3, 8, 1), 2, (3, 1), (1, 0, 1, 0), (1, 1)),  # one column
]


@pytest.mark.parametrize("case", CASES)
def test_taps_matches_reference(case, rng):
    xs, M, ks, pads, dil = case
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal((M, xs[1]) + ks).astype(np.float32)
    b = rng.standard_normal(M).astype(np.float32)
    Ho = xs[2] + pads[0] + pads[2] - (ks[0] - 1) * dil[0]
    Wo = xs[3] + pads[1] + pads[3] - (ks[1] - 1) * dil[1]
    for bias in (b, None):
        y = conv_host.conv2d_taps(x, w, bias, pads, dil, (Ho, Wo))
        ref = ref_conv(x, w, bias, (1, 1), pads, dil)
        assert y.shape == ref.shape and y.dtype == np.float32
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-4)


def test_taps_double_and_noncontiguous(rng):
    x = rng.standard_normal((2, 12, 10, 18))[:, ::2, :, ::2]  # float64, strided
    w = rng.standard_normal((3, 6, 3, 3))
    b = rng.standard_normal(3)
    y = conv_host.conv2d_taps(x, w, b, (1, 0, 2, 1), (1, 1), (11, 8))
    assert y.dtype == np.float64
    np.testing.assert_allclose(y, ref_conv(x, w, b, (1, 1), (1, 0, 2, 1), (1, 1)), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("C, M, taps", [(128, 32, True), (64, 32, True), (256, 16, True),
                                        (256, 64, False),  # 64 outputs on a small plane: columns
                                        (64, 64, False), (32, 32, False), (256, 256, False)])
def test_conv_chooses_taps_and_agrees_with_columns(C, M, taps, rng, monkeypatch):
    x = rng.standard_normal((1, C, 14, 14)).astype(np.float32)
    w = rng.standard_normal((M, C, 3, 3)).astype(np.float32)
    b = rng.standard_normal(M).astype(np.float32)
    used = []
    real = conv_host.conv2d_taps
    monkeypatch.setattr(conv_host, "conv2d_taps", lambda *a: used.append(1) or real(*a))
    y = Conv(KernelContext("cpu"))(x, w, b, pads=[1, 1, 1, 1]).numpy()
    assert bool(used) == taps
    cols = conv_host.conv2d(x, w, b, (1, 1), (1, 1, 1, 1), (1, 1), (14, 14))
    np.testing.assert_allclose(y, cols, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(y, ref_conv(x, w, b, (1, 1), (1, 1, 1, 1), (1, 1)), rtol=1e-4, atol=1e-3)


def test_tap_products_rule():
    rule = conv_host.use_tap_products
    assert rule(128, 32, (1, 1), (56, 56), (3, 3), (1, 1))      # few outputs, a large plane
    assert rule(128, 32, (1, 1), (12, 12), (3, 3), (1, 1))      # 16-32 outputs: any plane
    assert rule(128, 64, (1, 1), (32, 32), (3, 3), (1, 1))      # 64 outputs: 1088 wide pixels
    assert not rule(128, 64, (1, 1), (16, 16), (3, 3), (1, 1))  # 64 outputs on 288: columns
    assert not rule(512, 256, (1, 1), (8, 8), (3, 3), (1, 1))
    assert not rule(128, 32, (2, 2), (28, 28), (3, 3), (1, 1))  # strided
    assert not rule(64, 64, (1, 1), (56, 56), (3, 3), (1, 1))   # as many outputs as inputs


# ------------------------------------------ taps that read only padding (_conv_host.trim_taps)

TRIM_CASES = [
    # x shape, M, kernel, strides, pads (top, left, bottom, right), dilations, kernel left
    ((2, 16, 12, 12), 8, (3, 3), (1, 1), (12, 12, 12, 12), (12, 12), (1, 1)),  # ASPP: 1x1 left
    ((1, 8, 12, 12), 6, (3, 3), (1, 1), (18, 18, 18, 18), (18, 18), (1, 1)),
    ((2, 6, 3, 3), 5, (7, 7), (1, 1), (3, 3, 3, 3), (1, 1), (5, 5)),           # 7x7 on 3x3
    ((1, 5, 4, 6), 4, (5, 3), (2, 1), (5, 0, 0, 2), (1, 2), (4, 3)),             # asymmetric, strided
    ((1, 4, 5, 5), 3, (3, 3), (2, 2), (7, 1, 0, 6), (3, 1), (2, 3)),
    ((2, 3, 2, 7), 4, (5, 3), (1, 1), (2, 1, 2, 1), (1, 1), (3, 3)),           # rows only
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", TRIM_CASES)
def test_taps_reading_only_padding_are_skipped(case, dtype, rng):
    xs, M, ks, strides, pads, dil, left = case
    x = rng.standard_normal(xs).astype(dtype)
    w = rng.standard_normal((M, xs[1]) + ks).astype(dtype)
    b = rng.standard_normal(M).astype(dtype)
    k = Conv(KernelContext("cpu"))
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for bias in (b, None):
        y = k(x, w, bias, strides=list(strides), pads=list(pads), dilations=list(dil)).numpy()
        assert y.dtype == dtype
        np.testing.assert_allclose(y, ref_conv(x, w, bias, strides, pads, dil), rtol=tol, atol=tol)
    Ho = [(xs[2 + i] + pads[i] + pads[i + 2] - (ks[i] - 1) * dil[i] - 1) // strides[i] + 1 for i in range(2)]
    trimmed = conv_host.trim_taps(x, w, strides, pads, dil, Ho)
    assert trimmed is not None
    assert trimmed[1].shape[2:] == left


def test_trimmed_aspp_branch_is_a_pointwise_product(rng, monkeypatch):
    calls = []
    real = conv_host.pointwise
    monkeypatch.setattr(conv_host, "pointwise", lambda *a: calls.append(a[0].shape) or real(*a))
    x = rng.standard_normal((2, 16, 12, 12)).astype(np.float32)
    w = rng.standard_normal((8, 16, 3, 3)).astype(np.float32)
    Conv(KernelContext("cpu"))(x, w, pads=[12, 12, 12, 12], dilations=[12, 12])
    assert calls == [(2, 16, 12, 12)]


def test_no_trimming_when_every_tap_reads_data_or_weights_are_not_finite(rng):
    x = rng.standard_normal((1, 4, 12, 12)).astype(np.float32)
    w = rng.standard_normal((3, 4, 3, 3)).astype(np.float32)
    assert conv_host.trim_taps(x, w, (1, 1), (6, 6, 6, 6), (6, 6), (12, 12)) is None  # dilation 6: all read
    assert conv_host.trim_taps(x, w, (1, 1), (12, 12, 12, 12), (12, 12), (12, 12)) is not None
    w[0, 1, 0, 2] = np.inf  # a tap reading only padding: the reference gives inf * 0 = NaN
    assert conv_host.trim_taps(x, w, (1, 1), (12, 12, 12, 12), (12, 12), (12, 12)) is None
    with np.errstate(invalid="ignore"):
        y = Conv(KernelContext("cpu"))(x, w, pads=[12, 12, 12, 12], dilations=[12, 12]).numpy()
        want = ref_conv(x, w, None, (1, 1), (12, 12, 12, 12), (12, 12))
    assert np.isnan(y[0, 0]).all() and np.array_equal(np.isnan(y), np.isnan(want))
    np.testing.assert_allclose(y[0, 1:], want[0, 1:], rtol=1e-5, atol=1e-5)
