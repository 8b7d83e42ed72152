"""The host depthwise 2-D path (_depthwise_host.depthwise_2d: per-thread zero-bordered scratch
reused across channel blocks, the tap windows as a matrix per channel, one batched
product; wide rows for a unit column stride, exact strided columns otherwise) against a
float64 loop reference on random inputs: kernel sizes 1-5, row and column strides 1-3,
dilations, asymmetric and oversized pads, channel multipliers, batches, float64,
non-contiguous inputs, one and two threads, and blocks of one channel (so a thread's
scratch is reused by later blocks)."""

from __future__ import annotations

import numpy as np
import pytest

from gpukernels.kernels.base import KernelContext
from gpukernels.kernels.nn import _depthwise_host as depthwise_host
from gpukernels.kernels.nn import conv as conv_mod
from gpukernels.kernels.nn.conv import Conv
from tests.reference import conv

# these tests check the host specialisations themselves (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("default_paths")


def ref_depthwise(x, w, b, strides, pads, dilations):
    """float64 depthwise convolution (group = C): the shared reference (tests/reference/conv.py)."""
    return conv(x, w, b, strides, pads, dilations, group=np.shape(x)[1])


CASES = [
    # x shape, multiplier, kernel, strides, pads (top, left, bottom, right), dilations
    ((1, 6, 9, 8), 1, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    ((2, 5, 7, 10), 2, (3, 3), (2, 1), (0, 2, 1, 0), (1, 2)),
    ((1, 4, 11, 6), 1, (5, 5), (3, 1), (2, 2, 2, 2), (1, 1)),
    ((1, 3, 6, 5), 3, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1)),
    ((1, 7, 8, 9), 1, (2, 4), (1, 1), (0, 3, 1, 0), (2, 1)),
    ((1, 2, 3, 3), 1, (3, 3), (1, 1), (4, 5, 3, 2), (1, 1)),  # pads larger than the input
    ((2, 3, 1, 7), 1, (1, 3), (1, 1), (0, 1, 0, 1), (1, 1)),  # one row
    ((1, 3, 9, 1), 2, (3, 1), (2, 1), (1, 0, 1, 0), (1, 1)),  # one column
    ((1, 5, 12, 11), 1, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),  # column stride 2
    ((2, 4, 10, 13), 2, (3, 2), (1, 3), (0, 1, 2, 2), (1, 2)),
    ((1, 3, 7, 7), 1, (5, 5), (3, 2), (2, 2, 2, 2), (1, 1)),
    ((1, 12, 15, 14), 1, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    ((2, 6, 13, 11), 2, (3, 3), (2, 1), (0, 2, 1, 0), (1, 2)),
    ((1, 5, 9, 9), 1, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),
]


@pytest.mark.parametrize("threads", ["1", "2"])
@pytest.mark.parametrize("case", CASES)
def test_depthwise_wide_matches_reference(case, threads, rng, monkeypatch, tuning):
    xs, mult, ks, strides, pads, dil = case
    monkeypatch.setenv("GPUKERNELS_CPU_THREADS", threads)
    tuning({"depthwise.thread_items": 1, "depthwise.taps_block_bytes": 1})  # one channel per block
    C = xs[1]
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal((C * mult, 1) + ks).astype(np.float32)
    b = rng.standard_normal(C * mult).astype(np.float32)
    k = Conv(KernelContext("cpu"))
    for bias in (b, None):
        y = k(x, w, bias, group=C, kernel_shape=list(ks), strides=list(strides), pads=list(pads),
              dilations=list(dil)).numpy()
        np.testing.assert_allclose(y, ref_depthwise(x, w, bias, strides, pads, dil), rtol=1e-5, atol=1e-5)


def test_depthwise_wide_double_noncontiguous_and_generic_path_agree(rng):
    x = rng.standard_normal((2, 8, 12, 20))[:, ::2, :, ::2]  # non-contiguous float64
    w = rng.standard_normal((8, 1, 3, 3))
    b = rng.standard_normal(8)
    args = ([1, 1], [1, 2, 0, 1], [1, 1])
    y = conv_mod.conv_forward(np, x, w, b, *args, group=4)
    assert y.dtype == np.float64
    np.testing.assert_allclose(y, ref_depthwise(x, w, b, *args), rtol=1e-12, atol=1e-12)
    generic = conv_mod._depthwise(np, x, w, b, *args, [11, 11])
    np.testing.assert_allclose(y, generic, rtol=1e-12, atol=1e-12)


def test_depthwise_wide_leaves_input_alone(rng):
    x = rng.standard_normal((1, 4, 6, 6)).astype(np.float32)
    keep = x.copy()
    w = rng.standard_normal((4, 1, 3, 3)).astype(np.float32)
    Conv(KernelContext("cpu"))(x, w, group=4, pads=[1, 1, 1, 1])
    np.testing.assert_array_equal(x, keep)


# ------------------------------------------- channels-last taps (tiny planes, multiplier 1)

NHWC_CASES = [
    # x shape, kernel, strides, pads (top, left, bottom, right), dilations
    ((2, 160, 3, 3), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    ((1, 96, 6, 6), (5, 5), (2, 2), (2, 2, 2, 2), (1, 1)),
    ((3, 7, 5, 4), (3, 2), (2, 1), (0, 1, 2, 0), (1, 2)),  # odd sizes, asymmetric pads, batch 3
    ((1, 5, 3, 3), (3, 3), (1, 1), (4, 5, 3, 2), (1, 1)),  # pads larger than the input
    ((2, 9, 1, 6), (1, 3), (1, 3), (0, 1, 0, 1), (1, 1)),  # one row, column stride 3
    ((1, 4, 7, 7), (3, 3), (1, 1), (2, 2, 2, 2), (2, 3)),  # dilations
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", NHWC_CASES)
def test_depthwise_channels_last_matches_reference(case, dtype, rng, monkeypatch):
    """depthwise_taps_nhwc (forced for every case) against the float64 loop reference."""
    xs, ks, strides, pads, dil = case
    monkeypatch.setattr(depthwise_host, "use_channels_last_taps", lambda *a: True)
    C = xs[1]
    x = rng.standard_normal(xs).astype(dtype)
    w = rng.standard_normal((C, 1) + ks).astype(dtype)
    b = rng.standard_normal(C).astype(dtype)
    k = Conv(KernelContext("cpu"))
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for bias in (b, None):
        y = k(x, w, bias, group=C, strides=list(strides), pads=list(pads), dilations=list(dil)).numpy()
        assert y.dtype == dtype
        np.testing.assert_allclose(y, ref_depthwise(x, w, bias, strides, pads, dil), rtol=tol, atol=tol)


def test_depthwise_channels_last_chosen_for_tiny_planes(rng, monkeypatch):
    """The rule picks the channels-last taps for mobile networks' last stages only (and
    never with a channel multiplier); float16 computes in float32 through it."""
    assert depthwise_host.use_channels_last_taps(2, 480, 1, 9, 3, 3)       # 2x480x3x3, 3x3 taps
    assert depthwise_host.use_channels_last_taps(2, 576, 1, 25, 3, 3)      # 2x576x3x3, 5x5 taps
    assert depthwise_host.use_channels_last_taps(2, 672, 1, 25, 6, 6)      # 2x672x6x6, 5x5 taps
    assert not depthwise_host.use_channels_last_taps(2, 128, 1, 49, 4, 4)  # 7x7 taps on 4x4
    assert not depthwise_host.use_channels_last_taps(2, 72, 1, 9, 24, 24)  # 24x24 planes
    assert not depthwise_host.use_channels_last_taps(2, 480, 2, 9, 3, 3)   # multiplier 2
    calls = []
    real = depthwise_host.depthwise_taps_nhwc
    monkeypatch.setattr(depthwise_host, "depthwise_taps_nhwc", lambda *a: calls.append(1) or real(*a))
    x = rng.standard_normal((2, 192, 6, 6)).astype(np.float16)
    w = (rng.standard_normal((192, 1, 3, 3)) * 0.3).astype(np.float16)
    y = Conv(KernelContext("cpu"))(x, w, group=192, pads=[1, 1, 1, 1]).numpy()
    assert calls and y.dtype == np.float16
    want = ref_depthwise(x, w, None, (1, 1), (1, 1, 1, 1), (1, 1))
    np.testing.assert_allclose(y.astype(np.float64), want, rtol=2e-3, atol=2e-3)


# ------------------------------- per-channel (outputs x inputs) matrices (planes <= kernel)

PLANE_CASES = [
    # x shape, multiplier, kernel, strides, pads (top, left, bottom, right), dilations
    ((2, 16, 2, 2), 1, (7, 7), (1, 1), (3, 3, 3, 3), (1, 1)),   # convnext's last stage
    ((2, 9, 3, 3), 1, (5, 5), (1, 1), (2, 2, 2, 2), (1, 1)),    # efficientnet's
    ((2, 5, 3, 3), 2, (3, 3), (2, 1), (0, 2, 1, 0), (1, 2)),    # multiplier, strides, asymmetric
    ((3, 4, 2, 3), 3, (5, 4), (1, 2), (2, 1, 3, 2), (1, 1)),
    ((1, 3, 2, 2), 1, (3, 3), (1, 1), (4, 5, 3, 2), (1, 1)),    # pads larger than the input
    ((1, 6, 3, 3), 1, (3, 3), (1, 1), (2, 2, 2, 2), (2, 2)),    # dilations
    ((2, 4, 1, 5), 1, (1, 5), (1, 3), (0, 2, 0, 2), (1, 1)),    # one row
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", PLANE_CASES)
def test_depthwise_plane_products_match_reference(case, dtype, rng, monkeypatch):
    xs, mult, ks, strides, pads, dil = case
    Ho, Wo = ((xs[2 + i] + pads[i] + pads[i + 2] - (ks[i] - 1) * dil[i] - 1) // strides[i] + 1 for i in range(2))
    assert depthwise_host.use_plane_products(xs[2], xs[3], *ks, Ho, Wo)
    calls = []
    real = depthwise_host.depthwise_plane_products
    monkeypatch.setattr(depthwise_host, "depthwise_plane_products", lambda *a: calls.append(1) or real(*a))
    C = xs[1]
    x = rng.standard_normal(xs).astype(dtype)[:, :, ::-1]  # non-contiguous too
    w = rng.standard_normal((C * mult, 1) + ks).astype(dtype)
    b = rng.standard_normal(C * mult).astype(dtype)
    k = Conv(KernelContext("cpu"))
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for bias in (b, None):
        y = k(x, w, bias, group=C, strides=list(strides), pads=list(pads), dilations=list(dil)).numpy()
        assert y.dtype == dtype
        np.testing.assert_allclose(y, ref_depthwise(x, w, bias, strides, pads, dil), rtol=tol, atol=tol)
    assert len(calls) == 2


@pytest.mark.parametrize("where", ["x_inf", "x_nan", "w_inf"])
def test_depthwise_plane_products_not_for_non_finite_values(where, rng):
    """A structural zero of the per-channel matrix times an infinite input would give NaN
    where the reference never reads that pixel: such calls take the tap paths."""
    x = rng.standard_normal((2, 8, 2, 2)).astype(np.float32)
    w = rng.standard_normal((8, 1, 7, 7)).astype(np.float32)
    if where == "x_inf":
        x[0, 1, 0, 0] = np.inf
    elif where == "x_nan":
        x[1, 2, 1, 1] = np.nan
    else:
        w[3, 0, 0, 0] = np.inf  # reads padding only: the reference gives inf * 0 = NaN there
    with np.errstate(invalid="ignore"):  # inf * 0 on both sides
        y = Conv(KernelContext("cpu"))(x, w, group=8, pads=[3, 3, 3, 3]).numpy()
        want = ref_depthwise(x, w, None, (1, 1), (3, 3, 3, 3), (1, 1))
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    assert np.array_equal(np.isnan(y), np.isnan(want))


def test_depthwise_plane_products_chosen_for_planes_no_larger_than_the_kernel():
    assert depthwise_host.use_plane_products(2, 2, 7, 7, 2, 2)
    assert depthwise_host.use_plane_products(3, 3, 5, 5, 3, 3)
    assert depthwise_host.use_plane_products(3, 3, 3, 3, 3, 3)
    assert not depthwise_host.use_plane_products(6, 6, 5, 5, 6, 6)
    assert not depthwise_host.use_plane_products(12, 12, 3, 3, 12, 12)
    assert not depthwise_host.use_plane_products(2, 2, 3, 3, 200, 200)  # huge pads: many outputs
