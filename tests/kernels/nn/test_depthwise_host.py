"""The host depthwise 2-D paths (_depthwise_host) against the float64 loop reference on
random inputs: each path called directly (depthwise_tap_products: one product per
channel over a per-thread phase-image scratch; depthwise_taps_nhwc: channels-last tap
passes; depthwise_plane_products: per-channel (outputs x inputs) matrices) and through
the Conv kernel (depthwise_2d's choice).  Kernel sizes 1-7, strides 1-3, dilations,
asymmetric pads and pads larger than the kernel, multipliers 1-3, planes 1x1 to 50x50,
batches 1-3, float32 and float64, with and without bias, non-contiguous inputs, one
and two threads, channel blocks of one channel; fused epilogues bit for bit against
the epilogue applied afterwards; infinities and NaNs where the reference has them."""

from __future__ import annotations

import numpy as np
import pytest

from gpukernels.kernels.base import KernelContext, lookup
from gpukernels.kernels.nn import _depthwise_host as depthwise_host
from gpukernels.kernels.nn import conv as conv_mod
from gpukernels.kernels.nn._conv_host import finish
from gpukernels.kernels.nn.conv import Conv
from gpukernels.kernels.nn.epilogues import build_epilogue
from gpukernels.tensor import Tensor
from tests.reference import conv

# these tests check the host specialisations themselves (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("default_paths")


def ref_depthwise(x, w, b, strides, pads, dilations):
    """float64 depthwise convolution (group = C): the shared reference (tests/reference/conv.py)."""
    return conv(x, w, b, strides, pads, dilations, group=np.shape(x)[1])


def out_shape(xs, ks, strides, pads, dil):
    return tuple((xs[2 + i] + pads[i] + pads[i + 2] - (ks[i] - 1) * dil[i] - 1) // strides[i] + 1 for i in range(2))


def make(rng, xs, mult, ks, dtype, contiguous=True):
    """Random x, w, b (never zeros); x non-contiguous (rows reversed) unless contiguous."""
    C = xs[1]
    x = rng.standard_normal(xs).astype(dtype)
    if not contiguous:
        x = x[:, :, ::-1]
    w = rng.standard_normal((C * mult, 1) + tuple(ks)).astype(dtype)
    b = rng.standard_normal(C * mult).astype(dtype)
    return x, w, b


def tolerance(dtype):
    return 1e-5 if dtype == np.float32 else 1e-12


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
    ((3, 2, 1, 1), 1, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),  # 1x1 planes, batch 3
    ((1, 5, 12, 11), 1, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),  # stride 2 both ways
    ((2, 4, 10, 13), 2, (3, 2), (1, 3), (0, 1, 2, 2), (1, 2)),
    ((1, 3, 7, 7), 1, (5, 5), (3, 2), (2, 2, 2, 2), (1, 1)),
    ((3, 6, 13, 11), 2, (3, 3), (2, 1), (0, 2, 1, 0), (1, 2)),
    ((2, 4, 16, 16), 1, (7, 7), (1, 1), (3, 3, 3, 3), (1, 1)),  # convnext's 7x7
    ((2, 3, 12, 12), 1, (5, 5), (2, 2), (2, 2, 2, 2), (1, 1)),  # efficientnet's 5x5 stride 2
    ((1, 2, 9, 10), 1, (3, 3), (3, 3), (2, 0, 0, 2), (2, 3)),  # stride 3 and dilations
    ((2, 3, 50, 50), 1, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),  # 50x50 planes
    ((1, 2, 49, 50), 2, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),
    ((2, 5, 4, 4), 1, (3, 3), (1, 1), (5, 6, 7, 5), (1, 1)),  # pads larger than the kernel
]


# ------------------------------------------------------- one product per channel (any plane)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", CASES)
def test_tap_products_match_reference(case, dtype, rng):
    xs, mult, ks, strides, pads, dil = case
    O = out_shape(xs, ks, strides, pads, dil)
    for contiguous in (True, False):
        x, w, b = make(rng, xs, mult, ks, dtype, contiguous)
        for bias in (b, None):
            y = depthwise_host.depthwise_tap_products(x, w, bias, strides, pads, dil, O)
            assert y.dtype == dtype and y.shape == (xs[0], xs[1] * mult) + O
            want = ref_depthwise(x, w, bias, strides, pads, dil)
            np.testing.assert_allclose(y, want, rtol=tolerance(dtype), atol=tolerance(dtype))


@pytest.mark.parametrize("threads", ["1", "2"])
@pytest.mark.parametrize("case", CASES[:13])
def test_tap_products_in_blocks_of_one_channel(case, threads, rng, monkeypatch, tuning):
    """Blocks of one channel (each thread's scratch reused by its next blocks), on two
    threads when asked."""
    xs, mult, ks, strides, pads, dil = case
    monkeypatch.setenv("GPUKERNELS_CPU_THREADS", threads)
    tuning({"depthwise.thread_items": 1, "depthwise.taps_block_bytes": 1})
    x, w, b = make(rng, xs, mult, ks, np.float32)
    O = out_shape(xs, ks, strides, pads, dil)
    for bias in (b, None):
        y = depthwise_host.depthwise_tap_products(x, w, bias, strides, pads, dil, O)
        np.testing.assert_allclose(y, ref_depthwise(x, w, bias, strides, pads, dil), rtol=1e-5, atol=1e-5)


def test_tap_products_scratch_kept_across_calls(rng):
    """The per-thread phase-image scratch keeps its zero border from call to call: the
    same geometry with new data, another geometry in between, then the first again."""
    args = ((2, 2), (1, 1, 1, 1), (1, 1))
    for xs in [(2, 4, 12, 12), (2, 4, 12, 12), (2, 4, 9, 9), (2, 4, 12, 12)]:
        x, w, b = make(rng, xs, 1, (3, 3), np.float32)
        O = out_shape(xs, (3, 3), *args[:1], args[1], args[2])
        y = depthwise_host.depthwise_tap_products(x, w, b, *args, O)
        np.testing.assert_allclose(y, ref_depthwise(x, w, b, *args), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", CASES[:6] + CASES[9:10])
def test_depthwise_through_the_kernel(case, rng):
    """The Conv kernel's choice (depthwise_2d) on every case, float32."""
    xs, mult, ks, strides, pads, dil = case
    x, w, b = make(rng, xs, mult, ks, np.float32)
    k = Conv(KernelContext("cpu"))
    for bias in (b, None):
        y = k(x, w, bias, group=xs[1], kernel_shape=list(ks), strides=list(strides), pads=list(pads),
              dilations=list(dil)).numpy()
        np.testing.assert_allclose(y, ref_depthwise(x, w, bias, strides, pads, dil), rtol=1e-5, atol=1e-5)


def test_depthwise_double_noncontiguous_and_generic_path_agree(rng):
    x = rng.standard_normal((2, 8, 12, 20))[:, ::2, :, ::2]  # non-contiguous float64
    w = rng.standard_normal((8, 1, 3, 3))
    b = rng.standard_normal(8)
    args = ([1, 1], [1, 2, 0, 1], [1, 1])
    y = conv_mod.conv_forward(np, x, w, b, *args, group=4)
    assert y.dtype == np.float64
    np.testing.assert_allclose(y, ref_depthwise(x, w, b, *args), rtol=1e-12, atol=1e-12)
    generic = conv_mod._depthwise(np, x, w, b, *args, [11, 11])
    np.testing.assert_allclose(y, generic, rtol=1e-12, atol=1e-12)


def test_depthwise_leaves_input_alone(rng):
    x = rng.standard_normal((1, 4, 6, 6)).astype(np.float32)
    keep = x.copy()
    w = rng.standard_normal((4, 1, 3, 3)).astype(np.float32)
    Conv(KernelContext("cpu"))(x, w, group=4, pads=[1, 1, 1, 1])
    np.testing.assert_array_equal(x, keep)


# ------------------------------------------- channels-last taps (tiny outputs, multiplier 1)

NHWC_CASES = [
    # x shape, kernel, strides, pads (top, left, bottom, right), dilations
    ((2, 160, 3, 3), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    ((1, 96, 6, 6), (5, 5), (2, 2), (2, 2, 2, 2), (1, 1)),
    ((3, 7, 5, 4), (3, 2), (2, 1), (0, 1, 2, 0), (1, 2)),  # odd sizes, asymmetric pads, batch 3
    ((1, 5, 3, 3), (3, 3), (1, 1), (4, 5, 3, 2), (1, 1)),  # pads larger than the input
    ((2, 9, 1, 6), (1, 3), (1, 3), (0, 1, 0, 1), (1, 1)),  # one row, column stride 3
    ((1, 4, 7, 7), (3, 3), (1, 1), (2, 2, 2, 2), (2, 3)),  # dilations
    ((2, 3, 1, 1), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),  # 1x1 planes
    ((1, 6, 11, 10), (3, 3), (3, 2), (1, 0, 2, 1), (1, 1)),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", NHWC_CASES)
def test_channels_last_matches_reference(case, dtype, rng):
    xs, ks, strides, pads, dil = case
    O = out_shape(xs, ks, strides, pads, dil)
    x, w, b = make(rng, xs, 1, ks, dtype, contiguous=False)
    for bias in (b, None):
        y = depthwise_host.depthwise_taps_nhwc(x, w, bias, strides, pads, dil, O)
        assert y.dtype == dtype
        want = ref_depthwise(x, w, bias, strides, pads, dil)
        np.testing.assert_allclose(y, want, rtol=tolerance(dtype), atol=tolerance(dtype))


def test_channels_last_chosen_for_tiny_outputs(rng, monkeypatch):
    """The rule picks the channels-last taps for mobile networks' last stages only (and
    never with a channel multiplier); float16 computes in float32 through it."""
    rule = depthwise_host.use_channels_last_taps
    assert rule(2, 480, 1, 9, 3, 3, 3, 3, 5)          # 2x480x3x3, 3x3 taps
    assert rule(2, 288, 1, 25, 6, 6, 3, 3, 5)         # 2x288x6x6, 5x5 taps, stride 2
    assert rule(2, 192, 1, 9, 6, 6, 6, 6, 8)          # 2x192x6x6, 3x3 taps
    assert not rule(2, 72, 1, 9, 24, 24, 24, 24, 26)  # 24x24 planes
    assert not rule(2, 120, 1, 25, 12, 12, 12, 12, 16)  # 12x12 outputs
    assert not rule(2, 48, 1, 9, 16, 16, 8, 8, 9)     # 2x48x16x16, stride 2
    assert not rule(2, 480, 2, 9, 3, 3, 3, 3, 5)      # multiplier 2
    calls = []
    real = depthwise_host.depthwise_taps_nhwc
    monkeypatch.setattr(depthwise_host, "depthwise_taps_nhwc", lambda *a: calls.append(1) or real(*a))
    # the plane products take this plane first (use_plane_products): set them aside
    monkeypatch.setattr(depthwise_host, "use_plane_products", lambda *a: False)
    x = rng.standard_normal((2, 192, 6, 6)).astype(np.float16)
    w = (rng.standard_normal((192, 1, 3, 3)) * 0.3).astype(np.float16)
    y = Conv(KernelContext("cpu"))(x, w, group=192, pads=[1, 1, 1, 1], strides=[2, 2]).numpy()
    assert calls and y.dtype == np.float16
    want = ref_depthwise(x, w, None, (2, 2), (1, 1, 1, 1), (1, 1))
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
    ((2, 4, 1, 1), 1, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),    # 1x1 planes
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", PLANE_CASES)
def test_plane_products_match_reference(case, dtype, rng, monkeypatch):
    xs, mult, ks, strides, pads, dil = case
    O = out_shape(xs, ks, strides, pads, dil)
    assert depthwise_host.use_plane_products(xs[2], xs[3], *ks, *O)
    calls = []
    real = depthwise_host.depthwise_plane_products
    monkeypatch.setattr(depthwise_host, "depthwise_plane_products", lambda *a: calls.append(1) or real(*a))
    x, w, b = make(rng, xs, mult, ks, dtype, contiguous=False)
    k = Conv(KernelContext("cpu"))
    for bias in (b, None):
        y = k(x, w, bias, group=xs[1], strides=list(strides), pads=list(pads), dilations=list(dil)).numpy()
        assert y.dtype == dtype
        want = ref_depthwise(x, w, bias, strides, pads, dil)
        np.testing.assert_allclose(y, want, rtol=tolerance(dtype), atol=tolerance(dtype))
    assert len(calls) == 2


def test_plane_products_chosen_for_planes_no_larger_than_the_kernel():
    assert depthwise_host.use_plane_products(2, 2, 7, 7, 2, 2)
    assert depthwise_host.use_plane_products(3, 3, 5, 5, 3, 3)
    assert depthwise_host.use_plane_products(3, 3, 3, 3, 3, 3)
    assert not depthwise_host.use_plane_products(14, 14, 5, 5, 14, 14)
    assert not depthwise_host.use_plane_products(12, 12, 3, 3, 12, 12)
    assert not depthwise_host.use_plane_products(2, 2, 3, 3, 200, 200)  # huge pads: many outputs


# ------------------------------------------------------------------ infinities and NaNs

PATHS = {
    "tap_products": depthwise_host.depthwise_tap_products,
    "channels_last": depthwise_host.depthwise_taps_nhwc,
    "choice": depthwise_host.depthwise_2d,
}


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("where", ["x_inf", "x_nan", "w_inf", "x_both_infs"])
def test_non_finite_values_where_the_reference_has_them(path, where, rng):
    """Every path reads what the reference reads (padding included: an infinite weight
    on padding gives inf * 0 = NaN there too); planes no larger than the kernel leave the
    plane products for the tap paths when a value is not finite."""
    xs, ks, pads = (2, 8, 2, 2), (7, 7), (3, 3, 3, 3)
    if path != "choice":
        xs, ks, pads = (2, 8, 5, 6), (3, 3), (1, 1, 1, 1)
    x, w, _ = make(rng, xs, 1, ks, np.float32)
    if where == "x_inf":
        x[0, 1, 0, 0] = np.inf
    elif where == "x_nan":
        x[1, 2, 1, 1] = np.nan
    elif where == "w_inf":
        w[3, 0, 0, 0] = np.inf  # reads padding in the first output row
    else:  # +inf and -inf in one window: NaN where both are read
        x[0, 1, 0, 0], x[0, 1, 1, 1] = np.inf, -np.inf
    O = out_shape(xs, ks, (1, 1), pads, (1, 1))
    with np.errstate(invalid="ignore"):  # inf * 0 and inf - inf on both sides
        y = PATHS[path](x, w, None, (1, 1), pads, (1, 1), O)
        want = ref_depthwise(x, w, None, (1, 1), pads, (1, 1))
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)  # NaN and inf where want has them
    assert np.array_equal(np.isnan(y), np.isnan(want)) and np.array_equal(np.isinf(y), np.isinf(want))
    assert not np.isfinite(want).all()


# ------------------------------------------------------------------ fused epilogues

EPILOGUES = {
    "relu": ("Relu", 14, {}, None),
    "clip_relu6": ("Clip", 13, {}, (0.0, 6.0)),
    "clip_opset6": ("Clip", 6, {"min": -0.5, "max": 0.75}, None),
    "hard_swish": ("HardSwish", 14, {}, None),
}

EPILOGUE_CASES = [
    # x shape, multiplier, kernel, strides, pads; path
    ((2, 6, 13, 12), 1, (3, 3), (1, 1), (1, 1, 1, 1), "tap_products"),
    ((1, 4, 11, 12), 2, (5, 5), (2, 2), (2, 2, 1, 2), "tap_products"),
    ((3, 8, 6, 6), 1, (3, 3), (2, 2), (1, 1, 1, 1), "channels_last"),
    ((2, 8, 2, 2), 1, (7, 7), (1, 1), (3, 3, 3, 3), "choice"),  # plane products
    ((2, 16, 9, 9), 1, (3, 3), (1, 1), (1, 1, 1, 1), "choice"),
    ((2, 16, 16, 16), 1, (7, 7), (1, 1), (3, 3, 3, 3), "choice"),  # row Toeplitz products
]


def epilogue_of(name, dtype):
    op, opset, attrs, bounds = EPILOGUES[name]
    cls, version = lookup(op, "", opset)
    kernel = cls(KernelContext(), version)
    extra = None if bounds is None else tuple(Tensor(np.array(v, dtype)) for v in bounds)
    ep = build_epilogue(kernel, attrs, dtype, extra)
    assert ep is not None
    return ep


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("act", list(EPILOGUES))
@pytest.mark.parametrize("case", EPILOGUE_CASES)
def test_fused_epilogue_bit_for_bit(case, act, dtype, rng, tuning):
    """A path with the epilogue gives the bits of the path without it and the epilogue
    applied afterwards (_conv_host.finish): the bias is in before the activation."""
    xs, mult, ks, strides, pads, path = case
    x, w, b = make(rng, xs, mult, ks, dtype)
    x *= 3  # values on both sides of the clip bounds
    O = out_shape(xs, ks, strides, pads, (1, 1))
    ep = epilogue_of(act, dtype)
    run = PATHS[path]
    for bias in (b, None):
        plain = run(x, w, bias, strides, pads, (1, 1), O)
        fused = run(x, w, bias, strides, pads, (1, 1), O, ep)
        after = finish(plain.copy(), ep)
        assert fused.dtype == after.dtype == dtype
        np.testing.assert_array_equal(fused.view(np.uint8), after.view(np.uint8))
        assert not np.array_equal(fused, plain)  # the activation changed values
    if path == "tap_products":  # blocks of one channel: the epilogue per block
        tuning({"depthwise.taps_block_bytes": 1})
        fused = run(x, w, b, strides, pads, (1, 1), O, ep)
        after = finish(run(x, w, b, strides, pads, (1, 1), O), ep)
        np.testing.assert_array_equal(fused.view(np.uint8), after.view(np.uint8))
