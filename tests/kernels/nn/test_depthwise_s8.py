"""The host depthwise path over phase images as wide as the output (_depthwise_host
.depthwise_row_taps, row_layout, use_row_taps), the plane products with the channels
last (small planes) and the weights the depthwise paths keep for constant weights (a
node's ConstantMemo), against the float64 loop reference on random inputs: unit strides and stride 2 (3x3, 5x5, 7x7), dilations, asymmetric pads, multipliers,
batches 1-3, float32 and float64, with and without bias, non-contiguous inputs, blocks
of one channel on one and two threads, the scratch kept across geometries; wrapped reads
never standing for data (row_layout refuses those geometries); infinities and NaNs where
the reference has them (also on the wrapped columns); fused epilogues bit for bit; kept
weights only for frozen arrays."""

from __future__ import annotations

import numpy as np
import pytest

from gpukernels.kernels.base import KernelContext
from gpukernels.kernels.nn import _depthwise_host as depthwise_host
from gpukernels.kernels.nn._conv_host import ConstantMemo, finish
from gpukernels.kernels.nn.conv import Conv
from tests.kernels.nn.test_depthwise_host import (
    EPILOGUES,
    epilogue_of,
    make,
    out_shape,
    ref_depthwise,
    tolerance,
)

pytestmark = pytest.mark.usefixtures("default_paths")


def layout_of(xs, ks, strides, pads, dil, dtype=np.float32):
    O = out_shape(xs, ks, strides, pads, dil)
    return depthwise_host.row_layout(xs[0], xs[1], np.dtype(dtype).itemsize, xs[2], xs[3], ks[0], ks[1],
                                     tuple(strides), tuple(pads[:2]), tuple(dil), O)


ROW_CASES = [
    # x shape, multiplier, kernel, strides, pads (top, left, bottom, right), dilations
    ((2, 6, 12, 12), 1, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    ((1, 5, 9, 13), 2, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),   # odd sizes, stride 2, multiplier
    ((2, 4, 12, 12), 1, (5, 5), (2, 2), (2, 2, 2, 2), (1, 1)),  # efficientnet's 5x5 stride 2
    ((3, 3, 10, 11), 1, (5, 5), (1, 1), (2, 2, 2, 2), (1, 1)),
    ((2, 4, 16, 16), 1, (7, 7), (1, 1), (3, 3, 3, 3), (1, 1)),  # convnext's 7x7
    ((1, 4, 11, 10), 3, (3, 3), (1, 1), (2, 2, 2, 2), (2, 2)),  # dilations
    ((2, 3, 9, 8), 1, (3, 5), (1, 2), (0, 2, 2, 2), (1, 1)),    # asymmetric pads and strides
    ((1, 2, 7, 9), 1, (4, 2), (1, 1), (3, 1, 0, 0), (1, 1)),    # even kernels
    ((2, 3, 1, 12), 1, (1, 3), (1, 1), (0, 1, 0, 1), (1, 1)),   # one row
    ((1, 2, 12, 1), 1, (3, 1), (2, 1), (1, 0, 1, 0), (1, 1)),   # one column
    ((2, 3, 5, 5), 1, (3, 3), (1, 1), (4, 6, 3, 6), (1, 1)),    # pads larger than the input
    ((1, 2, 13, 14), 1, (3, 3), (3, 3), (1, 1, 1, 1), (1, 1)),  # stride 3
    ((2, 3, 48, 48), 1, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),  # mobilenet's first stage
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", ROW_CASES)
def test_row_taps_match_reference(case, dtype, rng):
    xs, mult, ks, strides, pads, dil = case
    assert layout_of(xs, ks, strides, pads, dil, dtype) is not None
    O = out_shape(xs, ks, strides, pads, dil)
    for contiguous in (True, False):
        x, w, b = make(rng, xs, mult, ks, dtype, contiguous)
        for bias in (b, None):
            y = depthwise_host.depthwise_row_taps(x, w, bias, strides, pads, dil, O)
            assert y.dtype == dtype and y.shape == (xs[0], xs[1] * mult) + O
            want = ref_depthwise(x, w, bias, strides, pads, dil)
            np.testing.assert_allclose(y, want, rtol=tolerance(dtype), atol=tolerance(dtype))


@pytest.mark.parametrize("threads", ["1", "2"])
@pytest.mark.parametrize("case", ROW_CASES[:7])
def test_row_taps_in_blocks_of_one_channel(case, threads, rng, monkeypatch, tuning):
    xs, mult, ks, strides, pads, dil = case
    monkeypatch.setenv("GPUKERNELS_CPU_THREADS", threads)
    tuning({"depthwise.thread_items": 1, "depthwise.taps_block_bytes": 1})
    x, w, b = make(rng, xs, mult, ks, np.float32)
    O = out_shape(xs, ks, strides, pads, dil)
    for bias in (b, None):
        y = depthwise_host.depthwise_row_taps(x, w, bias, strides, pads, dil, O)
        np.testing.assert_allclose(y, ref_depthwise(x, w, bias, strides, pads, dil), rtol=1e-5, atol=1e-5)


def test_row_taps_scratch_kept_across_calls(rng):
    """The kept scratch's zero rows (and columns past x in a phase image) stay zero: the
    same geometry with new data, others in between, then the first again."""
    for xs, strides in [((2, 4, 12, 12), (1, 1)), ((2, 4, 12, 12), (1, 1)), ((2, 4, 12, 12), (2, 2)),
                        ((2, 4, 9, 9), (2, 2)), ((2, 4, 12, 12), (1, 1)), ((2, 4, 9, 9), (2, 2))]:
        x, w, b = make(rng, xs, 1, (3, 3), np.float32)
        args = (strides, (1, 1, 1, 1), (1, 1))
        y = depthwise_host.depthwise_row_taps(x, w, b, *args, out_shape(xs, (3, 3), *args))
        np.testing.assert_allclose(y, ref_depthwise(x, w, b, *args), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", [
    ((1, 2, 8, 8), (3, 3), (1, 1), (0, 0, 0, 0), (1, 1)),  # no padding: the right wrap is data
    ((1, 2, 9, 9), (3, 3), (2, 2), (1, 0, 1, 0), (1, 1)),
    ((1, 2, 8, 10), (3, 3), (1, 1), (1, 0, 1, 1), (1, 1)),  # left pad only
])
def test_row_layout_refuses_wraps_onto_data(case, rng):
    """Where a wrapped read would stand for data the layout is refused, and the Conv
    kernel's choice is still right."""
    xs, ks, strides, pads, dil = case
    assert layout_of(xs, ks, strides, pads, dil) is None
    x, w, b = make(rng, xs, 1, ks, np.float32)
    y = depthwise_host.depthwise_2d(x, w, b, strides, pads, dil, out_shape(xs, ks, strides, pads, dil))
    np.testing.assert_allclose(y, ref_depthwise(x, w, b, strides, pads, dil), rtol=1e-5, atol=1e-5)


def test_row_taps_chosen_for_narrow_kernels_on_larger_planes(rng, monkeypatch):
    rule = depthwise_host.use_row_taps
    assert rule(layout_of((2, 96, 12, 12), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)), 12, 12)
    assert rule(layout_of((2, 72, 24, 24), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)), 12, 12)
    assert not rule(layout_of((2, 48, 48, 48), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)), 24, 24)  # large output
    assert not rule(layout_of((2, 192, 6, 6), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)), 6, 6)  # small output
    assert not rule(layout_of((2, 120, 12, 12), (5, 5), (1, 1), (2, 2, 2, 2), (1, 1)), 12, 12)  # 5 wide
    calls = []
    real = depthwise_host.depthwise_row_taps
    monkeypatch.setattr(depthwise_host, "depthwise_row_taps", lambda *a: calls.append(1) or real(*a))
    # the row Toeplitz products take this plane first (use_row_toeplitz): set them aside
    monkeypatch.setattr(depthwise_host, "use_row_toeplitz", lambda *a: False)
    x, w, b = make(rng, (2, 96, 12, 12), 1, (3, 3), np.float32)
    y = Conv(KernelContext("cpu"))(x, w, b, group=96, pads=[1, 1, 1, 1]).numpy()
    assert calls
    np.testing.assert_allclose(y, ref_depthwise(x, w, b, (1, 1), (1, 1, 1, 1), (1, 1)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("strides", [(1, 1), (2, 2)])
@pytest.mark.parametrize("where", ["left_edge", "right_edge", "nan_edge", "w_inf"])
def test_row_taps_non_finite_where_the_reference_has_them(where, strides, rng):
    """A wrapped read of an edge column is zeroed in the taps, not multiplied by zero:
    an infinity there gives no NaN in the next row's outputs."""
    xs, ks, pads = (2, 4, 8, 8), (3, 3), (1, 1, 1, 1)
    x, w, _ = make(rng, xs, 1, ks, np.float32)
    if where == "left_edge":
        x[0, 1, 3, 0] = np.inf
    elif where == "right_edge":
        x[1, 2, 4, 7] = -np.inf
    elif where == "nan_edge":
        x[0, 3, 2, 7] = np.nan
    else:
        w[1, 0, 0, 0] = np.inf  # reads padding in the first output row and column
    O = out_shape(xs, ks, strides, pads, (1, 1))
    with np.errstate(invalid="ignore"):
        y = depthwise_host.depthwise_row_taps(x, w, None, strides, pads, (1, 1), O)
        want = ref_depthwise(x, w, None, strides, pads, (1, 1))
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    assert np.array_equal(np.isnan(y), np.isnan(want)) and np.array_equal(np.isinf(y), np.isinf(want))
    assert not np.isfinite(want).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("act", list(EPILOGUES))
@pytest.mark.parametrize("case", [
    ((2, 6, 13, 12), 1, (3, 3), (1, 1), (1, 1, 1, 1)),
    ((1, 4, 12, 12), 2, (5, 5), (2, 2), (2, 2, 2, 2)),
])
def test_row_taps_fused_epilogue_bit_for_bit(case, act, dtype, rng, tuning):
    xs, mult, ks, strides, pads = case
    x, w, b = make(rng, xs, mult, ks, dtype)
    x *= 3  # values on both sides of the clip bounds
    O = out_shape(xs, ks, strides, pads, (1, 1))
    ep = epilogue_of(act, dtype)
    run = depthwise_host.depthwise_row_taps
    for bias in (b, None):
        fused = run(x, w, bias, strides, pads, (1, 1), O, ep)
        after = finish(run(x, w, bias, strides, pads, (1, 1), O).copy(), ep)
        assert fused.dtype == after.dtype == dtype
        np.testing.assert_array_equal(fused.view(np.uint8), after.view(np.uint8))
    tuning({"depthwise.taps_block_bytes": 1})  # blocks of one channel: the epilogue per block
    fused = run(x, w, b, strides, pads, (1, 1), O, ep)
    after = finish(run(x, w, b, strides, pads, (1, 1), O), ep)
    np.testing.assert_array_equal(fused.view(np.uint8), after.view(np.uint8))


# ------------------------------------------------------------ weights kept for constants

PATHS = {
    "rows": (depthwise_host.depthwise_row_taps, (2, 6, 12, 12), "_taps_weights"),
    "taps": (depthwise_host.depthwise_tap_products, (2, 6, 12, 12), "_taps_weights"),
    "channels_last": (depthwise_host.depthwise_taps_nhwc, (2, 6, 6, 6), "_tiled_along_rows"),
    "plane": (depthwise_host.depthwise_plane_products, (2, 6, 3, 3), "_plane_matrices"),
    "choice": (depthwise_host.depthwise_2d, (2, 6, 3, 3), "_plane_matrices"),
}


def frozen(a):
    a = a.copy()
    a.flags.writeable = False
    return a


@pytest.mark.parametrize("path", list(PATHS))
def test_weights_kept_only_for_constants(path, rng, monkeypatch):
    """With the node's ConstantMemo: writeable weights changed in place between calls
    give the new results (derived again on every call); frozen ones are derived once
    and give the reference's results on every call; without a memo, on every call."""
    run, xs, maker = PATHS[path]
    made = []
    real = getattr(depthwise_host, maker)
    monkeypatch.setattr(depthwise_host, maker, lambda *a: made.append(1) or real(*a))
    args = ((1, 1), (1, 1, 1, 1), (1, 1), out_shape(xs, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)))
    x, w, b = make(rng, xs, 1, (3, 3), np.float32)
    memo = ConstantMemo()
    for bias in (b, None):
        for _ in range(2):
            w[...] = rng.standard_normal(w.shape)
            if bias is not None:
                bias[...] = rng.standard_normal(bias.shape)
            y = run(x, w, bias, *args, memo=memo)
            np.testing.assert_allclose(y, ref_depthwise(x, w, bias, *args[:3]), rtol=1e-5, atol=1e-5)
    assert len(made) == 4
    wf, bf = frozen(w), frozen(b)
    for expected, use in ((1, memo), (0, memo), (1, None)):
        made.clear()
        y = run(x, wf, bf, *args, memo=use)
        np.testing.assert_allclose(y, ref_depthwise(x, wf, bf, *args[:3]), rtol=1e-5, atol=1e-5)
        assert len(made) == expected


# ------------------------------------------- plane products with the channels last (small planes)

PLANE_CASES = [
    # x shape, multiplier, kernel, strides, pads (top, left, bottom, right), dilations
    ((2, 12, 6, 6), 1, (5, 5), (2, 2), (2, 2, 2, 2), (1, 1)),   # mobilenet_v3's 5x5 stride 2
    ((2, 8, 4, 4), 1, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),    # mobilevit's last 3x3 stride 2
    ((3, 5, 4, 4), 2, (7, 7), (1, 1), (3, 3, 3, 3), (1, 1)),    # multiplier, batch 3
    ((1, 6, 3, 3), 1, (5, 5), (1, 1), (2, 2, 2, 2), (1, 1)),
    ((2, 4, 5, 4), 3, (5, 3), (2, 1), (1, 2, 2, 0), (1, 1)),    # asymmetric
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", PLANE_CASES)
def test_plane_products_match_reference(case, dtype, rng, tuning):
    """Through the Conv kernel's choice, whole batches and chunks of one image."""
    xs, mult, ks, strides, pads, dil = case
    O = out_shape(xs, ks, strides, pads, dil)
    assert depthwise_host.use_plane_products(xs[2], xs[3], *ks, *O)
    x, w, b = make(rng, xs, mult, ks, dtype, contiguous=False)
    for chunk in (None, 1):
        if chunk:
            tuning({"conv.host_cols_bytes": 1})
        for bias in (b, None):
            y = depthwise_host.depthwise_2d(x, w, bias, strides, pads, dil, O)
            assert y.dtype == dtype and y.shape == (xs[0], xs[1] * mult) + O
            want = ref_depthwise(x, w, bias, strides, pads, dil)
            np.testing.assert_allclose(y, want, rtol=tolerance(dtype), atol=tolerance(dtype))


def test_plane_products_chosen_for_small_planes():
    rule = depthwise_host.use_plane_products
    assert rule(6, 6, 5, 5, 3, 3, (2, 2))     # 5x5 stride 2 on 6x6
    assert rule(4, 4, 3, 3, 2, 2, (2, 2))     # 3x3 stride 2 on 4x4
    assert rule(4, 4, 7, 7, 4, 4)             # planes no larger than the kernel
    assert rule(6, 6, 5, 5, 6, 6)             # inputs at most twice the taps
    assert rule(8, 8, 7, 7, 8, 8)
    assert rule(12, 12, 5, 5, 6, 6, (2, 2))   # 144 inputs <= 2 * 25 * 4
    assert not rule(6, 6, 3, 3, 6, 6)         # 36 > 2 * 9: the tap paths
    assert not rule(12, 12, 5, 5, 12, 12)
    assert not rule(14, 14, 3, 3, 7, 7, (2, 2))
    assert not rule(8, 8, 7, 7, 8, 8, (1, 1), 1 << 20)  # too many bytes for the matrices


def test_plane_matrices_bytes_follow_the_tuning_entry(tuning):
    rule = depthwise_host.use_plane_products
    assert rule(6, 6, 5, 5, 6, 6, (1, 1), 240 * 4)  # 240 float32 channels: 1.2 MiB
    tuning({"conv.depthwise_plane_bytes": 1 << 20})
    assert not rule(6, 6, 5, 5, 6, 6, (1, 1), 240 * 4)
    assert rule(6, 6, 5, 5, 6, 6, (1, 1), 200 * 4)


@pytest.mark.parametrize("where", ["x_inf", "x_nan", "w_inf"])
@pytest.mark.parametrize("geometry", [((2, 6, 6, 6), (5, 5), (2, 2), (2, 2, 2, 2)),         # plane products
                                      ((2, 32, 12, 12), (5, 5), (1, 1), (2, 2, 2, 2))])  # row Toeplitz
def test_dense_products_left_for_non_finite_values(where, geometry, rng):
    """The plane and row Toeplitz products multiply structural zeros: a non-finite input
    or weight sends depthwise_2d to the tap paths, which put NaN and inf where the
    reference has them."""
    xs, ks, strides, pads = geometry
    x, w, _ = make(rng, xs, 1, ks, np.float32)
    if where == "x_inf":
        x[0, 1, 0, xs[3] - 1] = np.inf
    elif where == "x_nan":
        x[1, 2, xs[2] - 1, 0] = np.nan
    else:
        w[3, 0, 0, 0] = np.inf  # reads padding in the first output row
    O = out_shape(xs, ks, strides, pads, (1, 1))
    with np.errstate(invalid="ignore"):
        y = depthwise_host.depthwise_2d(x, w, None, strides, pads, (1, 1), O)
        want = ref_depthwise(x, w, None, strides, pads, (1, 1))
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    assert np.array_equal(np.isnan(y), np.isnan(want)) and np.array_equal(np.isinf(y), np.isinf(want))
    assert not np.isfinite(want).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("act", list(EPILOGUES))
def test_plane_products_fused_epilogue_bit_for_bit(act, dtype, rng):
    xs, ks, strides, pads = (2, 6, 6, 6), (5, 5), (2, 2), (2, 2, 2, 2)
    x, w, b = make(rng, xs, 1, ks, dtype)
    x *= 3
    O = out_shape(xs, ks, strides, pads, (1, 1))
    ep = epilogue_of(act, dtype)
    run = depthwise_host.depthwise_plane_products
    for bias in (b, None):
        fused = run(x, w, bias, strides, pads, (1, 1), O, ep)
        after = finish(run(x, w, bias, strides, pads, (1, 1), O).copy(), ep)
        np.testing.assert_array_equal(fused.view(np.uint8), after.view(np.uint8))
        assert not np.array_equal(fused, run(x, w, bias, strides, pads, (1, 1), O))
