"""The host depthwise path by row Toeplitz products (_depthwise_toeplitz), against the
float64 loop reference on random inputs: unit strides, strides 2 and 3, dilations,
asymmetric pads, pads larger than the kernel, trailing input rows no output reads,
multipliers, batches 1-3, float32 and float64, with and without bias, non-contiguous
inputs, blocks of one channel; the choice (depthwise_2d) for narrow planes and not for
wide ones; the matrices kept only for constant weights and within their byte budget;
the kept scratch across geometries.  Non-finite values (left to the tap paths) and fused
epilogues: test_depthwise_s8.py and test_depthwise_host.py."""

from __future__ import annotations

import numpy as np
import pytest

from gpukernels.kernels.nn import _depthwise_host as depthwise_host
from gpukernels.kernels.nn import _depthwise_toeplitz as toeplitz
from gpukernels.kernels.nn._conv_host import ConstantMemo
from tests.kernels.nn.test_depthwise_host import make, out_shape, ref_depthwise, tolerance

pytestmark = pytest.mark.usefixtures("default_paths")

CASES = [
    # x shape, multiplier, kernel, strides, pads (top, left, bottom, right), dilations
    ((2, 5, 16, 16), 1, (7, 7), (1, 1), (3, 3, 3, 3), (1, 1)),    # ConvNeXt's 7x7
    ((2, 6, 12, 12), 1, (5, 5), (1, 1), (2, 2, 2, 2), (1, 1)),
    ((1, 4, 24, 24), 1, (5, 5), (2, 2), (2, 2, 2, 2), (1, 1)),    # stride 2
    ((3, 3, 12, 12), 1, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),
    ((2, 3, 10, 9), 2, (3, 5), (1, 2), (0, 2, 1, 3), (1, 1)),     # multiplier, asymmetric
    ((1, 4, 11, 13), 1, (3, 3), (1, 1), (2, 2, 2, 2), (2, 2)),    # dilation
    ((2, 3, 13, 12), 3, (5, 3), (3, 1), (1, 0, 0, 1), (1, 2)),    # stride 3, rows no output reads
    ((1, 2, 4, 5), 1, (5, 5), (1, 1), (4, 4, 3, 5), (1, 1)),      # pads larger than the kernel
]


def run_case(case, dtype, rng, contiguous=True):
    xs, mult, ks, strides, pads, dil = case
    x, w, b = make(rng, xs, mult, ks, dtype, contiguous)
    return x, w, b, strides, pads, dil, out_shape(xs, ks, strides, pads, dil)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", CASES)
def test_toeplitz_matches_reference(case, dtype, rng):
    x, w, b, strides, pads, dil, O = run_case(case, dtype, rng, contiguous=False)
    for bias in (b, None):
        y = toeplitz.depthwise_row_toeplitz(x, w, bias, strides, pads, dil, O)
        assert y.dtype == dtype and y.shape == (x.shape[0], w.shape[0]) + O
        want = ref_depthwise(x, w, bias, strides, pads, dil)
        np.testing.assert_allclose(y, want, rtol=tolerance(dtype), atol=tolerance(dtype))


@pytest.mark.parametrize("case", CASES[:5])
def test_toeplitz_in_blocks_of_one_channel(case, rng, tuning):
    tuning({"depthwise.cache_block_bytes": 1})
    x, w, b, strides, pads, dil, O = run_case(case, np.float32, rng)
    y = toeplitz.depthwise_row_toeplitz(x, w, b, strides, pads, dil, O)
    np.testing.assert_allclose(y, ref_depthwise(x, w, b, strides, pads, dil), rtol=1e-5, atol=1e-5)


def test_toeplitz_scratch_kept_across_geometries(rng):
    """The kept zero-bordered scratch of one geometry never leaks into another: calls
    alternate between geometries (and inputs) and each matches the reference."""
    runs = [run_case(c, np.float32, rng) for c in CASES[:4]]
    for _ in range(2):
        for x, w, b, strides, pads, dil, O in runs:
            x = x + np.float32(1)  # new values every call
            y = toeplitz.depthwise_row_toeplitz(x, w, b, strides, pads, dil, O)
            np.testing.assert_allclose(y, ref_depthwise(x, w, b, strides, pads, dil), rtol=1e-5, atol=1e-5)


def test_toeplitz_chosen_for_narrow_planes_only():
    rule = toeplitz.use_row_toeplitz
    assert rule(16, 16, 7, 7, (1, 1), (3, 3), (1, 1), (16, 16))     # 22 columns, 3.1x the taps
    assert rule(12, 12, 5, 5, (1, 1), (2, 2), (1, 1), (12, 12))
    assert rule(24, 24, 5, 5, (2, 2), (2, 2), (1, 1), (12, 12))     # 27 columns: 5.4x
    assert rule(12, 12, 3, 3, (1, 1), (1, 1), (1, 1), (12, 12))     # 14 columns: 4.7x
    assert not rule(24, 24, 3, 3, (1, 1), (1, 1), (1, 1), (24, 24))  # 26 columns: 8.7x
    assert not rule(48, 48, 3, 3, (2, 2), (1, 1), (1, 1), (24, 24))


def test_toeplitz_matrices_bytes_follow_the_tuning_entry(tuning):
    rule = toeplitz.use_row_toeplitz
    geometry = (16, 16, 7, 7, (1, 1), (3, 3), (1, 1), (16, 16))
    assert rule(*geometry, 1024 * 4)  # 1024 float32 channels: 155 x 16 entries each, 9.7 MiB
    assert not rule(*geometry, 2048 * 4)  # 19.4 MiB: past the 16 MiB default
    tuning({"conv.depthwise_plane_bytes": 1 << 20})
    assert not rule(*geometry, 1024 * 4)
    assert rule(*geometry, 64 * 4)


@pytest.mark.parametrize("case", [((2, 16, 16, 16), (7, 7), (3, 3, 3, 3), True),
                                  ((2, 96, 12, 12), (3, 3), (1, 1, 1, 1), True),
                                  ((2, 32, 12, 12), (5, 5), (2, 2, 2, 2), True),  # test_depthwise_s8's
                                  ((2, 6, 12, 12), (5, 5), (2, 2, 2, 2), False),  # few channels: nhwc
                                  ((2, 8, 40, 40), (3, 3), (1, 1, 1, 1), False)])
def test_depthwise_2d_takes_toeplitz_where_the_rule_says(case, rng, monkeypatch):
    xs, ks, pads, expected = case
    taken = []
    real = depthwise_host.depthwise_row_toeplitz
    monkeypatch.setattr(depthwise_host, "depthwise_row_toeplitz", lambda *a: taken.append(1) or real(*a))
    x, w, b = make(rng, xs, 1, ks, np.float32)
    O = out_shape(xs, ks, (1, 1), pads, (1, 1))
    y = depthwise_host.depthwise_2d(x, w, b, (1, 1), pads, (1, 1), O)
    np.testing.assert_allclose(y, ref_depthwise(x, w, b, (1, 1), pads, (1, 1)), rtol=1e-5, atol=1e-5)
    assert bool(taken) == expected


def frozen(a):
    a = a.copy()
    a.flags.writeable = False
    return a


def test_matrices_kept_only_for_constants(rng, monkeypatch):
    """With the node's ConstantMemo: writeable weights changed in place between calls give
    the new results (matrices built on every call); frozen ones are built once."""
    made = []
    real = toeplitz._toeplitz_matrices
    monkeypatch.setattr(toeplitz, "_toeplitz_matrices", lambda *a: made.append(1) or real(*a))
    x, w, b, strides, pads, dil, O = run_case(CASES[1], np.float32, rng)
    memo = ConstantMemo()
    for _ in range(2):
        w[...] = rng.standard_normal(w.shape)
        y = toeplitz.depthwise_row_toeplitz(x, w, b, strides, pads, dil, O, memo=memo)
        np.testing.assert_allclose(y, ref_depthwise(x, w, b, strides, pads, dil), rtol=1e-5, atol=1e-5)
    assert len(made) == 2
    wf, bf = frozen(w), frozen(b)
    made.clear()
    for _ in range(3):
        y = toeplitz.depthwise_row_toeplitz(x, wf, bf, strides, pads, dil, O, memo=memo)
        np.testing.assert_allclose(y, ref_depthwise(x, wf, bf, strides, pads, dil), rtol=1e-5, atol=1e-5)
    assert len(made) == 1
