"""Host-only (NumPy) depthwise 2-D convolution by row Toeplitz products, one of the paths
_depthwise_host.depthwise_2d chooses (``use_row_toeplitz``).

One output row of a channel is a sum over the kernel rows i of an input row (padded,
Wn columns) times a banded (Wn x Wo) matrix holding the kernel row's weights on its
diagonals.  The kh input rows an output row reads are consecutive rows of the padded
plane (at unit dilation one run of kh * Wn elements), so per channel the whole
convolution is one product (images x output rows, kh * Wn) @ (kh * Wn, Wo): the left
side is a copy of overlapping runs of the padded input, the right side (the "Toeplitz"
matrix) is built once per constant W.  It multiplies Wn / kw times more terms than the
taps (the band's zeros) but in BLAS instead of a copy of every tap's window followed by
a gemv per channel, so it wins where the plane is narrow against the kernel
(use_row_toeplitz).  A structural zero times an infinite input would be NaN where the
reference reads no such pixel, so only for finite x and w (the caller checks).
"""

from __future__ import annotations

import functools

import numpy as np

from ...host import tuning
from ._conv_host import bounded_scratch, derived, kept_planes, output_array

# the path while an output multiplies at most this many times the taps' terms (Wn / kw)
_MAX_WASTE = 6


@functools.lru_cache(maxsize=128)
def toeplitz_geometry(H, W, kh, kw, strides, pads, dilations, O):
    """(Hn, Wn, rows, cols): the padded rows and columns the outputs read, and how many
    of x's rows and columns land in them (x's row r at padded row r + top pad)."""
    (sh, sw), (dh, dw), (Ho, Wo) = strides, dilations, O
    Hn = (Ho - 1) * sh + (kh - 1) * dh + 1
    Wn = (Wo - 1) * sw + (kw - 1) * dw + 1
    return Hn, Wn, max(0, min(H, Hn - pads[0])), max(0, min(W, Wn - pads[1]))


def use_row_toeplitz(H, W, kh, kw, strides, pads, dilations, O, channel_bytes=0) -> bool:
    """Whether depthwise_row_toeplitz beats the tap paths: an output's row of kh * Wn
    terms at most _MAX_WASTE times the kernel's taps, and the matrices (channel_bytes per
    entry of one channel's: output channels x item size) within conv.depthwise_plane_bytes
    (they are kept per node, as the plane products' are).  Measured against
    depthwise_2d's previous choice (float32, bias, 2 BLAS threads, best of 200 calls
    on a 2-vCPU AVX-512 EPYC VM): ConvNeXt's 2x32x16x16 7x7 163 -> 63 us, 2x240x14x14
    5x5 441 -> 254, 2x72x24x24 5x5 367 -> 232, 2x120x12x12 5x5 187 -> 97, 2x96x12x12
    3x3 69 -> 54; even at 8.7x (2x144x24x24 3x3 321 against 314), slower at 16.7x
    (2x48x48x48 3x3 315 against 448)."""
    Wn = toeplitz_geometry(H, W, kh, kw, tuple(strides), tuple(pads[:2]), tuple(dilations), tuple(O))[1]
    if channel_bytes * (kh * Wn + 1) * O[1] > tuning.value("conv.depthwise_plane_bytes"):
        return False
    return Wn <= _MAX_WASTE * kw


def _toeplitz_matrices(w, b, dtype, C, Wn, strides, dilations, O):
    """(C, kh * Wn [+ 1], m * Wo): entry (c, i * Wn + o * sw + j * dw, jm * Wo + o) is
    W[c * m + jm, 0, i, j], zero elsewhere; with a bias, a last row holding it."""
    M, _, kh, kw = w.shape
    m = M // C
    (sw, dw), Wo = (strides[1], dilations[1]), O[1]
    K = kh * Wn
    T = np.zeros((C, K + (b is not None), m, Wo), dtype)
    wr = w.reshape(C, m, kh, kw).astype(dtype, copy=False)
    o = np.arange(Wo)
    for i in range(kh):
        for j in range(kw):
            # (Wo, C, m): the advanced indices' axis first
            T[:, i * Wn + o * sw + j * dw, :, o] = wr[:, :, i, j]
    if b is not None:
        T[:, K] = b.astype(dtype, copy=False).reshape(C, m, 1)
    return T.reshape(C, K + (b is not None), m * Wo)


def depthwise_row_toeplitz(x, w, b, strides, pads, dilations, O, epilogue=None, memo=None):
    """Depthwise 2-D convolution (any multiplier, strides, dilations, pads) as one batched
    product over the channels (see the module docstring): the padded input in a kept
    zero-bordered scratch (_conv_host.kept_planes: only x's region is written, the
    padding stays zero), the left sides copied from it per block of channels (rows
    (image, output row), columns (kernel row, padded column), then a column of ones
    carrying the bias), the Toeplitz matrices kept per constant W and B (memo), and the
    copy into Y applying the epilogue."""
    N, C, H, W = x.shape
    M, _, kh, kw = w.shape
    m = M // C
    (sh, dh), (Ho, Wo) = (strides[0], dilations[0]), O
    dtype = x.dtype
    item = dtype.itemsize
    geometry = (H, W, kh, kw, tuple(strides), tuple(pads[:2]), tuple(dilations), tuple(O))
    Hn, Wn, rows, cols = toeplitz_geometry(*geometry)
    K = kh * Wn
    Kc = K + (b is not None)
    T = derived(memo, ("toeplitz", dtype.str) + geometry, w, b,
                lambda w, b: _toeplitz_matrices(w, b, dtype, C, Wn, strides, dilations, O))
    z = kept_planes(("toeplitz", dtype.str, N, C, Hn, Wn, rows, cols, pads[0], pads[1]), (N, C, Hn, Wn), dtype)
    z[:, :, pads[0]:pads[0] + rows, pads[1]:pads[1] + cols] = x[:, :, :rows, :cols]
    zs = z.strides
    y = output_array((N, C, m, Ho, Wo), dtype)
    R = N * Ho  # rows of one channel's product
    per_channel = (R * Kc + R * m * Wo) * item
    cb = max(1, min(C, tuning.value("depthwise.cache_block_bytes") // per_channel))
    for c0 in range(0, C, cb):
        k = min(C, c0 + cb) - c0
        flat = bounded_scratch(k * R * (Kc + m * Wo), dtype)
        left = flat[:k * R * Kc].reshape(k, N, Ho, Kc)
        # (channel, image, output row, kernel row, padded column): overlapping runs of z
        windows = np.ndarray((k, N, Ho, kh, Wn), dtype, z, c0 * zs[1],
                             (zs[1], zs[0], sh * zs[2], dh * zs[2], item))
        left[..., :K].reshape(k, N, Ho, kh, Wn)[...] = windows
        if Kc > K:
            left[..., K] = 1
        prod = flat[k * R * Kc:].reshape(k, R, m * Wo)
        np.matmul(left.reshape(k, R, Kc), T[c0:c0 + k], out=prod)
        src = prod.reshape(k, N, Ho, m, Wo).transpose(1, 0, 3, 2, 4)
        if epilogue is None:
            y[:, c0:c0 + k] = src
        else:
            epilogue(src, y[:, c0:c0 + k])
    return y.reshape(N, M, Ho, Wo)
