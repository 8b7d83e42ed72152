"""Host fast paths of Conv (phase-split / wide-row im2col; the depthwise path is tested in
test_depthwise_host.py) and MaxPool (threaded separable passes), against float64 references on random inputs,
including the boundaries of each special case (strides, dilations, asymmetric pads, row
and image chunking, wide vs exact rows, non-contiguous inputs, thread splitting)."""

from __future__ import annotations

import numpy as np
import pytest

from gpukernels.kernels.base import KernelContext
from gpukernels.kernels.nn import _conv_host as conv_host
from gpukernels.kernels.nn import conv as conv_mod
from gpukernels.kernels.nn.conv import Conv
from gpukernels.kernels.nn.pool import MaxPool
from tests.reference import conv


ref_conv = conv  # tests/reference/conv.py

# the host specialisations themselves: the default paths even under GPUKERNELS_PATHS=reference
pytestmark = pytest.mark.usefixtures("default_paths")


def ref_maxpool(x, k, s, p, d):
    x = np.asarray(x, np.float64)
    N, C, H, W = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (p[0], p[2]), (p[1], p[3])), constant_values=-np.inf)
    Ho = (xp.shape[2] - (k[0] - 1) * d[0] - 1) // s[0] + 1
    Wo = (xp.shape[3] - (k[1] - 1) * d[1] - 1) // s[1] + 1
    y = np.full((N, C, Ho, Wo), -np.inf)
    for i in range(k[0]):
        for j in range(k[1]):
            y = np.maximum(y, xp[:, :, i * d[0]:i * d[0] + s[0] * (Ho - 1) + 1:s[0],
                                 j * d[1]:j * d[1] + s[1] * (Wo - 1) + 1:s[1]])
    return y


CONV_CASES = [
    # (x shape, w shape, strides, pads, dilations)
    ((1, 8, 11, 13), (16, 8, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    ((2, 3, 23, 21), (8, 3, 7, 7), (2, 2), (3, 3, 3, 3), (1, 1)),
    ((2, 4, 17, 19), (5, 4, 4, 2), (3, 2), (0, 1, 2, 0), (1, 1)),
    ((1, 5, 16, 15), (6, 5, 3, 3), (1, 1), (2, 0, 1, 3), (2, 3)),
    ((3, 6, 12, 14), (4, 6, 3, 2), (2, 1), (1, 1, 0, 0), (2, 1)),
    ((1, 2, 9, 10), (3, 2, 1, 3), (1, 2), (0, 1, 0, 1), (1, 2)),
    ((2, 3, 8, 7), (4, 3, 5, 1), (1, 1), (2, 0, 2, 0), (1, 1)),
    ((1, 4, 6, 6), (2, 4, 6, 6), (1, 1), (0, 0, 0, 0), (1, 1)),  # one output pixel
    ((1, 3, 5, 5), (2, 3, 3, 3), (4, 4), (3, 3, 3, 3), (1, 1)),  # windows mostly in the padding
]


@pytest.mark.parametrize("case", CONV_CASES)
@pytest.mark.parametrize("wide", [None, True, False])
@pytest.mark.parametrize("budget", [None, 1])
def test_host_conv2d_matches_reference(case, wide, budget, rng, monkeypatch, tuning):
    xs, ws, strides, pads, dil = case
    if wide is not None:
        monkeypatch.setattr(conv_host, "_use_wide", lambda *a: wide)
    if budget is not None:  # one row per chunk: exercises the row chunking
        tuning({"conv.host_cols_bytes": budget})
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32)
    k = Conv(KernelContext("cpu"))
    for bias in (b, None):
        y = k(x, w, bias, strides=list(strides), pads=list(pads), dilations=list(dil)).numpy()
        want = ref_conv(x, w, bias, strides, pads, dil)
        assert y.shape == want.shape and y.dtype == np.float32
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)


def test_host_conv2d_image_chunks_double_and_noncontiguous(rng, monkeypatch, tuning):
    # a budget of ~2 images per chunk with 5 images: full and partial image chunks
    x = rng.standard_normal((5, 4, 9, 12)).transpose(0, 1, 3, 2)  # non-contiguous (5, 4, 12, 9)
    w = rng.standard_normal((6, 4, 3, 3))
    b = rng.standard_normal(6)
    per_image = (4 * 9 + 1) * 12 * 11 * 8
    tuning({"conv.host_cols_bytes": 2 * per_image + 5})
    for wide in (True, False):
        monkeypatch.setattr(conv_host, "_use_wide", lambda *a, wide=wide: wide)
        y = conv_mod.conv_forward(np, x, w, b, [1, 1], [1, 0, 0, 1], [1, 1], 1)
        assert y.dtype == np.float64
        np.testing.assert_allclose(y, ref_conv(x, w, b, (1, 1), (1, 0, 0, 1), (1, 1)), rtol=1e-10, atol=1e-10)


FOLD_CASES = [
    # (x shape, w shape, strides, pads, dilations): small images sharing one product
    ((2, 16, 3, 3), (24, 16, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    ((3, 8, 6, 6), (12, 8, 3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),
    ((4, 5, 5, 7), (6, 5, 3, 2), (1, 2), (2, 0, 1, 1), (2, 1)),
    ((5, 4, 4, 4), (3, 4, 2, 2), (1, 1), (0, 0, 0, 0), (1, 1)),
]


@pytest.mark.parametrize("case", FOLD_CASES)
@pytest.mark.parametrize("wide", [True, False])
@pytest.mark.parametrize("fold", [0, 1 << 20])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_host_conv2d_small_images_share_one_product(case, wide, fold, dtype, rng, monkeypatch, tuning):
    """conv.host_fold_pixels: the batch folded into one product (or not), with chunks of
    two images over an odd batch (a last chunk of one), bias inside the product or added."""
    xs, ws, strides, pads, dil = case
    monkeypatch.setattr(conv_host, "_use_wide", lambda *a: wide)
    per_image = (ws[1] * ws[2] * ws[3] + 1) * xs[2] * (xs[3] + 8) * np.dtype(dtype).itemsize
    tuning({"conv.host_fold_pixels": fold, "conv.host_cols_bytes": 2 * per_image})
    x = rng.standard_normal(xs).astype(dtype)
    w = rng.standard_normal(ws).astype(dtype)
    b = rng.standard_normal(ws[0]).astype(dtype)
    out = ref_conv(x, w, None, strides, pads, dil).shape[2:]
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for bias in (b, None):  # conv2d itself (dense_2d prefers conv2d_windows for these)
        y = conv_host.conv2d(x, w, bias, strides, pads, dil, out)
        assert y.dtype == dtype
        np.testing.assert_allclose(y, ref_conv(x, w, bias, strides, pads, dil), rtol=tol, atol=tol)


PATCH_CASES = [
    # (x shape, w shape, strides, pads, dilations): strides of more than 4 phases
    ((2, 3, 32, 32), (8, 3, 16, 16), (16, 16), (0, 0, 0, 0), (1, 1)),  # ViT's patch embedding
    ((2, 4, 17, 19), (6, 4, 4, 4), (4, 4), (0, 0, 0, 0), (1, 1)),      # the input's last rows unread
    ((2, 3, 23, 21), (5, 3, 7, 7), (4, 4), (3, 3, 3, 3), (1, 1)),      # SegFormer's overlapping patches
    ((1, 5, 16, 15), (4, 5, 3, 3), (3, 2), (2, 0, 1, 3), (2, 3)),      # asymmetric, dilated
    ((3, 2, 9, 10), (3, 2, 2, 3), (5, 3), (4, 1, 0, 2), (1, 1)),       # pads past the first window
]


@pytest.mark.parametrize("case", PATCH_CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("budget", [None, 1])
def test_host_conv2d_large_strides_match_reference(case, dtype, budget, rng, tuning):
    """Large strides through the Conv kernel: the windows read with the strides
    (conv2d_windows), or with a column budget of one image one image per chunk, or
    (budget 1) the phase-split row blocks of conv2d."""
    xs, ws, strides, pads, dil = case
    if budget is not None:
        tuning({"conv.host_cols_bytes": budget})
    x = rng.standard_normal(xs).astype(dtype)[:, :, ::-1]  # non-contiguous too
    w = rng.standard_normal(ws).astype(dtype)
    b = rng.standard_normal(ws[0]).astype(dtype)
    k = Conv(KernelContext("cpu"))
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for bias in (b, None):
        y = k(x, w, bias, strides=list(strides), pads=list(pads), dilations=list(dil)).numpy()
        assert y.dtype == dtype
        np.testing.assert_allclose(y, ref_conv(x, w, bias, strides, pads, dil), rtol=tol, atol=tol)


def test_host_conv2d_zero_padding_not_stale(rng):
    # the phase buffer is reused across chunks: the zero border must be rewritten each time
    x = rng.standard_normal((4, 2, 7, 7)).astype(np.float32) + 10
    w = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    y = conv_mod.conv_forward(np, x, w, None, [2, 2], [1, 1, 1, 1], [1, 1], 1)
    np.testing.assert_allclose(y, ref_conv(x, w, None, (2, 2), (1, 1, 1, 1), (1, 1)), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("threads", ["1", "2"])
@pytest.mark.parametrize("case", [
    ((1, 7, 20, 18), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),
    ((2, 3, 11, 13), (2, 3), (1, 2), (0, 1, 1, 2), (1, 1)),
    ((1, 5, 15, 16), (3, 2), (2, 3), (2, 0, 1, 1), (2, 1)),
])
def test_maxpool_threads(case, threads, rng, monkeypatch, tuning):
    xs, k, s, p, d = case
    monkeypatch.setenv("GPUKERNELS_CPU_THREADS", threads)
    tuning({"pool.host_thread_bytes": 1, "pool.host_block_bytes": 1})  # one image-channel per block
    x = rng.standard_normal(xs).astype(np.float32)
    x[0, 0, 0, 0] = np.nan
    y = MaxPool(KernelContext("cpu"))(x, kernel_shape=list(k), strides=list(s), pads=list(p),
                                      dilations=list(d)).Y.numpy()
    want = ref_maxpool(x, k, s, p, d)
    np.testing.assert_array_equal(y, want.astype(np.float32))
