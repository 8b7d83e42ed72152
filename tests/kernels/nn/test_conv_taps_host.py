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
from gpukernels.kernels.nn import conv as conv_mod
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


@pytest.mark.parametrize("C, M, taps", [(128, 32, True), (64, 32, True), (256, 64, True),
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
