"""Host-only (NumPy) depthwise 2-D convolution paths, chosen by ``depthwise_2d``:

* ``depthwise_row_taps``: one (taps x pixels) product per channel over phase images as
  wide as the output (no padding columns: every copy is whole planes; ``row_layout``);
* ``depthwise_tap_products``: the same over phase images with padding columns (any
  geometry);
* ``depthwise_plane_products``: small planes (``use_plane_products``), one (outputs x
  inputs) matrix per channel, applied with the channels last;
* ``depthwise_row_toeplitz`` (_depthwise_toeplitz.py): planes narrow against the kernel
  (``use_row_toeplitz``; finite x and w only), one product per channel of overlapping
  input rows by banded matrices of the kernel rows;
* ``depthwise_taps_nhwc``: other tiny outputs (``use_channels_last_taps``), tap passes
  with the channels last.

Each is measured against the others on a 2-core host; see their docstrings.  The
activation fused into a convolution (``epilogue``) is applied where the path writes Y.
What the paths derive from the weights (reordered, tiled or gathered, with the bias) is
kept for constant weights by the node's ``memo`` (a _conv_host.ConstantMemo) when the
caller passes one.
"""

from __future__ import annotations

import functools

import numpy as np

from ...host import host_blocks, tuning
from ._conv_host import (
    bounded_scratch,
    copy_regions,
    derived,
    kept_planes,
    output_array,
    phase_regions,
    tap_groups,
)
from ._depthwise_toeplitz import depthwise_row_toeplitz, use_row_toeplitz


def use_channels_last_taps(N, C, m, T, H, W, Ho, Wo, Wq) -> bool:
    """Whether depthwise_taps_nhwc beats depthwise_tap_products (multiplier 1), by a
    cost model fitted to CPU times (1 thread, float32, 36 mobile-network shapes, a
    2-core AVX2 host shared with other jobs), in us: channels last 30 + 0.42 ns per tap
    and output + 0.9 ns per input element (the transposed copies); the products 40 +
    0.4 per channel (a BLAS call each) + 0.25 ns per tap and wide-row pixel (Wq
    columns).  It picks the faster path for all but one shape (2x64x8x8 7x7: 239
    against 226 us).  So the small outputs of mobile networks' last stages: 2x480x3x3
    3x3 200 -> 88 us, 2x288x6x6 5x5 stride 2 286 -> 148, 2x192x6x6 3x3 136 -> 117;
    not 2x48x16x16 stride 2 (94 against 115) nor 12x12 outputs (2x120x12x12 5x5 358
    against 500).  Small planes take depthwise_plane_products first (use_plane_products)."""
    channels_last = 30 + 0.42e-3 * T * N * C * Ho * Wo + 0.9e-3 * N * C * H * W
    return m == 1 and channels_last < 40 + 0.4 * C + 0.25e-3 * T * N * C * Ho * Wq


def depthwise_taps_nhwc(x, w, b, strides, pads, dilations, O, epilogue=None, memo=None):
    """Depthwise 2-D convolution (multiplier 1) with the channels last, for tiny outputs
    with many channels.  The input is copied once, transposed, into a zero-bordered
    phase-image scratch with the channels last (N, row phase, column phase, Hq + 1, Wq,
    C), kept per thread (_conv_host.kept_planes, as depthwise_tap_products); then one
    multiply per pair of row and column phases (one at unit strides) writes every tap's
    window times its weights, tiled along the output row, into a (taps + bias, N, Ho,
    Wo * C) buffer -- rows of Wo * C elements: NumPy's ufuncs on strided operands cost
    about 0.1-0.2 us per row, so rows of C were 2-3x slower -- and one add.reduce sums
    the taps (then the bias, tiled the same way; the reference's order).  The transposed
    copy into Y writes the final value (through the epilogue when there is one).
    Measured against two ufunc calls per tap over a plain zero-bordered scratch (CPU
    time, 1 thread, float32, a 2-core AVX2 host shared with other jobs): 2x192x6x6 3x3
    128 -> 117 us, 2x480x3x3 102 -> 88, 2x240x6x6 5x5 322 -> 261, 2x288x6x6 5x5
    stride 2 194 -> 148, 2x576x3x3 5x5 258 -> 191."""
    N, C, H, W = x.shape
    kh, kw = w.shape[2:]
    sh, sw = strides
    Ho, Wo = O
    dtype = x.dtype
    item = dtype.itemsize
    T = kh * kw
    Hq, Wq, regions, copies = _tap_layout(H, W, kh, kw, tuple(strides), tuple(pads[:2]), tuple(dilations), tuple(O))
    z = kept_planes(("depthwise_nhwc", dtype.str, N, C, sh, sw, Hq, Wq, H, W, pads[0], pads[1]),
                    (N, sh, sw, Hq + 1, Wq, C), dtype)
    copy_regions(x, sh, sw, regions, z.transpose(0, 5, 1, 2, 3, 4))
    zs = z.strides
    R = Wo * C  # one output row, the channels last
    rows = T + (b is not None)
    flat = bounded_scratch(rows * N * Ho * R + N * Ho * R, dtype)
    terms = flat[:rows * N * Ho * R].reshape(rows, N, Ho, R)  # every tap's products, the bias
    wt = derived(memo, ("nhwc", dtype.str, Wo), w, b, lambda w, b: _tiled_along_rows(w, b, dtype, Wo))
    if b is not None:
        np.copyto(terms[T], wt[T])
    t5 = terms[:T].reshape(kh, kw, N, Ho, R)
    w5 = wt[:T].reshape(kh, kw, 1, 1, R)
    for ki, kj, rh, rw, ni, nj, start, row_step, col_step in copies:
        # a tap's window in its phase image: Ho runs of Wo * C contiguous elements
        view = np.ndarray((ni, nj, N, Ho, R), dtype, z, rh * zs[1] + rw * zs[2] + start * C * item,
                          (row_step * C * item, col_step * C * item, zs[0], zs[3], item))
        np.multiply(view, w5[ki, kj], out=t5[ki, kj])
    acc = flat[rows * N * Ho * R:].reshape(N, Ho, R)
    np.add.reduce(terms, axis=0, out=acc)
    y = output_array((N, C, Ho, Wo), dtype)
    res = acc.reshape(N, Ho, Wo, C).transpose(0, 3, 1, 2)
    if epilogue is None:
        y[...] = res
    else:
        epilogue(res, y)
    return y


def _tiled_along_rows(w, b, dtype, Wo):
    """depthwise_taps_nhwc's weights: (taps + bias, 1, 1, Wo * C), each tap's (and the
    bias') per-channel values tiled along an output row with the channels last."""
    C, T = w.shape[0], w.shape[2] * w.shape[3]
    wt = np.empty((T + (b is not None), 1, 1, Wo, C), dtype)
    np.copyto(wt[:T], w.reshape(C, T).T[:, None, None, None, :])
    if b is not None:
        np.copyto(wt[T], b.astype(dtype, copy=False))
    return wt.reshape(-1, 1, 1, Wo * C)


_PLANE_MATRIX_MAX = 1 << 14  # entries of one channel's (inputs x outputs) matrix
_DENSE_RATIO = 2  # plane products while a plane's inputs are at most this many times the taps


def use_plane_products(H, W, kh, kw, Ho, Wo, strides=(1, 1), matrix_bytes=0) -> bool:
    """Whether depthwise_plane_products (one batched product, every (input, output) pair
    of a plane) beats the tap paths: when the inputs of a plane are at most twice the
    kernel's taps times the stride's phases (H*W <= 2 * kh*kw * sh*sw: the dense
    products' extra multiply-adds are then cheaper than the tap paths' many short ufunc
    calls), a channel's matrix has at most _PLANE_MATRIX_MAX entries and all of them
    (matrix_bytes per entry of one channel's matrix: channels x multiplier x item size)
    fit conv.depthwise_plane_bytes.  Node by node (330 shapes: 1-2 images, 32-576
    channels, 3x3 to 28x28 planes, 3x3/5x5/7x7 kernels, strides 1 and 2; float32, 2 BLAS
    threads, a 2-core AVX-512 EPYC VM) a ratio of 4 picked better still (2x192x6x6 3x3
    55 -> 34 us), but in whole models the matrices then streamed through the caches
    every run and slowed the other nodes: MobileNetV2's 3x3 depthwise on 6x6 planes (1-1.5
    MiB of matrices each) made the whole run 20-40% slower; with 2 it runs as before.
    Measured node by node: 2x240x6x6 5x5 140 -> 37 us, 2x96x8x8 7x7 197 -> 27, 2x576x3x3
    5x5 33 -> 27, 2x288x6x6 5x5 stride 2 59 -> 23, 2x240x12x12 5x5 stride 2 175 -> 95;
    whole runs (fastest of alternating processes): MobileNetV3 2.6-2.9 -> 2.1-2.3 ms,
    ConvNeXt 2.0 -> 1.7-1.8, EfficientNet-B0 6.0 -> 5.5-5.9."""
    Q, P = Ho * Wo, H * W
    if Q * P > _PLANE_MATRIX_MAX or matrix_bytes * Q * P > tuning.value("conv.depthwise_plane_bytes"):
        return False
    return P <= _DENSE_RATIO * kh * kw * strides[0] * strides[1]


@functools.lru_cache(maxsize=64)
def _plane_taps(H, W, kh, kw, strides, pads, dilations, O):
    """(Ho*Wo, H*W) index of the kernel tap (i*kw + j) linking output pixel o to input
    pixel p of one plane, kh*kw where none does (padding or outside the window)."""
    (sh, sw), (dh, dw), (Ho, Wo) = strides, dilations, O
    rows = np.arange(Ho)[:, None] * sh + np.arange(kh)[None, :] * dh - pads[0]  # (Ho, kh) input rows
    cols = np.arange(Wo)[:, None] * sw + np.arange(kw)[None, :] * dw - pads[1]  # (Wo, kw)
    index = np.full((Ho, Wo, H, W), kh * kw, np.intp)
    for i in range(kh):
        for j in range(kw):
            r, c = rows[:, i], cols[:, j]
            ok_r, ok_c = (r >= 0) & (r < H), (c >= 0) & (c < W)
            oh, ow = np.nonzero(ok_r[:, None] & ok_c[None, :])
            index[oh, ow, r[oh], c[ow]] = i * kw + j
    index.flags.writeable = False
    return index.reshape(Ho * Wo, H * W)


def _plane_matrices(w, dtype, H, W, strides, pads, dilations, O):
    """depthwise_plane_products' matrices, (outputs, inputs, output channels): entry
    (o, p, c) the weight of output channel c linking input pixel p to output pixel o
    (_plane_taps), zero where none does."""
    M, _, kh, kw = w.shape
    T = kh * kw
    wz = np.zeros((T + 1, M), dtype)
    wz[:T] = w.reshape(M, T).T
    index = _plane_taps(H, W, kh, kw, strides, pads, dilations, O)
    return wz[index]


def depthwise_plane_products(x, w, b, strides, pads, dilations, O, epilogue=None, memo=None):
    """Depthwise 2-D convolution of small planes (use_plane_products) as one batched
    product over the channels: per input channel c, the images' planes (N x inputs, a
    strided view of x) times the channel's (inputs x multiplier*outputs) matrix, whose
    entry (p, o) is the weight linking input pixel p to output pixel o (gathered from the
    weights, once per constant W with a memo; zero where p is padding or outside o's
    window).  The bias is added to the product and one transposed copy into Y applies
    the epilogue.  A structural zero times an infinite input would be NaN where the
    reference reads no such pixel, so only for finite x and w (the caller checks).
    Replaces two earlier forms: one BLAS call per image and channel (about 0.08 us a
    call, and the gather on every call), then every matrix entry as one multiply with the
    channels last and an add.reduce (2-10x slower than this one batched call; see
    use_plane_products)."""
    N, C, H, W = x.shape
    M = w.shape[0]
    m = M // C
    Ho, Wo = O
    Q, P = Ho * Wo, H * W
    dtype = x.dtype
    geometry = (H, W, tuple(strides), tuple(pads[:2]), tuple(dilations), tuple(O))
    A = derived(memo, ("plane", dtype.str) + geometry, w, None,
                lambda w, b: _channel_matrices(w, dtype, C, m, geometry))
    planes = x.reshape(N, C, P).transpose(1, 0, 2)  # (C, N, P)
    prod = bounded_scratch(C * N * m * Q, dtype).reshape(C, N, m * Q)
    np.matmul(planes, A, out=prod)
    prod = prod.reshape(C, N, m, Q)
    if b is not None:
        prod += b.astype(dtype, copy=False).reshape(C, 1, m, 1)
    y = output_array((N, M, Ho, Wo), dtype)
    src = prod.transpose(1, 0, 2, 3)
    dst = y.reshape(N, C, m, Q)
    if epilogue is None:
        dst[...] = src
    else:
        epilogue(src, dst)
    return y


def _channel_matrices(w, dtype, C, m, geometry):
    """depthwise_plane_products' matrices (C, inputs, multiplier * outputs), contiguous:
    entry (c, p, j*Q + o) links input pixel p of channel c to output pixel o of output
    channel c*m + j (_plane_matrices)."""
    H, W, _, _, _, (Ho, Wo) = geometry
    A = _plane_matrices(w, dtype, *geometry)  # (Q, P, M)
    A = A.reshape(Ho * Wo, H * W, C, m).transpose(2, 1, 3, 0)
    return np.ascontiguousarray(A).reshape(C, H * W, m * Ho * Wo)


def _finite_weights(w, b) -> bool:
    """Whether every weight is finite."""
    return bool(np.isfinite(w).all())


def _all_finite(*arrays) -> bool:
    """Whether every element of every array is finite."""
    return all(bool(np.isfinite(a).all()) for a in arrays)


def depthwise_2d(x, w, b, strides, pads, dilations, O, epilogue=None, memo=None):
    """Depthwise 2-D convolution on the host: small planes take depthwise_plane_products
    (use_plane_products; finite x and w only), other small outputs depthwise_taps_nhwc
    (as fast as the Toeplitz products there, 2x192x6x6 3x3 60 against 59 us, 2x240x6x6
    77 against 90), planes narrow against the kernel depthwise_row_toeplitz
    (use_row_toeplitz; finite only),
    narrow kernels on mid-sized outputs depthwise_row_taps (use_row_taps), the rest
    depthwise_tap_products.  epilogue: an activation fused into the convolution
    (epilogue(src, out) writes act(src) into out), applied by every path in the copy
    that writes Y.  memo: the node's _conv_host.ConstantMemo (or None), for what the
    paths derive from constant weights."""
    N, C, H, W = x.shape
    m = w.shape[0] // C
    kh, kw = w.shape[2:]
    Ho, Wo = O
    if (use_plane_products(H, W, kh, kw, Ho, Wo, strides, w.shape[0] * x.dtype.itemsize)
            and derived(memo, "finite", w, None, _finite_weights)
            and _all_finite(x)):
        return depthwise_plane_products(x, w, b, strides, pads, dilations, O, epilogue, memo)
    Wq = _tap_layout(H, W, kh, kw, tuple(strides), tuple(pads[:2]), tuple(dilations), tuple(O))[1]
    if use_channels_last_taps(N, C, m, kh * kw, H, W, Ho, Wo, Wq):
        return depthwise_taps_nhwc(x, w, b, strides, pads, dilations, O, epilogue, memo)
    if (use_row_toeplitz(H, W, kh, kw, strides, pads, dilations, O, w.shape[0] * x.dtype.itemsize)
            and derived(memo, "finite", w, None, _finite_weights)
            and _all_finite(x)):
        return depthwise_row_toeplitz(x, w, b, strides, pads, dilations, O, epilogue, memo)
    layout = row_layout(N, C, x.dtype.itemsize, H, W, kh, kw, tuple(strides), tuple(pads[:2]),
                        tuple(dilations), tuple(O))
    if layout is not None and use_row_taps(layout, Ho, Wo):
        return depthwise_row_taps(x, w, b, strides, pads, dilations, O, epilogue, memo)
    return depthwise_tap_products(x, w, b, strides, pads, dilations, O, epilogue, memo)


@functools.lru_cache(maxsize=128)
def _tap_layout(H, W, kh, kw, strides, pads, dilations, O):
    """The geometry of the tap paths for one plane: (Hq, Wq, regions, copies)
    -- the phase images' rows and columns, their data regions (_conv_host.phase_regions)
    and, per pair of row and column tap groups (_conv_host.tap_groups), the copy of
    their windows: (kernel rows, kernel columns (slices), row phase, column phase, rows,
    columns, first element in the phase image, row step, column step (in elements))."""
    (sh, sw), (dh, dw), (Ho, Wo) = strides, dilations, O
    rows, cols = tap_groups(kh, sh, dh), tap_groups(kw, sw, dw)
    Hq = Ho + max(g[4] + (g[3] - 1) * g[5] for g in rows)
    Wq = Wo + max(g[4] + (g[3] - 1) * g[5] for g in cols)
    regions = tuple(phase_regions(H, W, sh, sw, pads[0], pads[1], Hq, Wq))
    copies = tuple((slice(i0, i0 + (ni - 1) * istep + 1, istep), slice(j0, j0 + (nj - 1) * jstep + 1, jstep),
                    rh, rw, ni, nj, qh * Wq + qw, qhs * Wq, qws)
                   for rh, i0, istep, ni, qh, qhs in rows for rw, j0, jstep, nj, qw, qws in cols)
    return Hq, Wq, regions, copies


def depthwise_tap_products(x, w, b, strides, pads, dilations, O, epilogue=None, memo=None):
    """Depthwise 2-D convolution as one (multiplier x taps) @ (taps x pixels) product per
    channel, every image in the same product.

    The input is copied once into a zero-bordered phase-image scratch kept per thread
    (_conv_host.kept_planes: the borders stay zero from call to call; one copy per phase):
    along an axis with stride s, tap i reads phase image (i*d) % s from offset (i*d) // s
    on, so every tap's window is one contiguous run of "wide" rows (the phase width Wq,
    the columns past Wo dropped at the end), at any stride.  Per channel block, one copy
    per pair of row and column phases (one at unit strides) lays the windows of all taps
    and images out as a (channel, taps, images x Ho x Wq) matrix, one batched product
    sums the taps, and one copy writes Y (cropped, through the epilogue when there is
    one).  The bias rides in the product (a row of ones under the taps), so that copy
    writes the final value and the epilogue costs no pass of its own.

    Why not two ufunc passes per tap (acc += w[c] * window, all channels at once):
    NumPy (2.4) runs a ufunc over strided rows of a few hundred elements at 0.3-0.45
    ns/element (about 0.1-0.2 us per row), against 0.10 for the tap copy (a plain
    copy) and 0.10 for the product (2x72x24x24, 3x3): measured 567 against 355 us
    (wall time, 1 thread, a 2-core AVX2 host shared with other jobs).  The phase split
    pays at stride 2: one strided copy of the input (0.64 ns/element) instead of
    strided tap copies (0.59 ns per tap and output); against the previous path
    (per-image products, exact strided columns; CPU time, 1 thread): 2x48x48x48 3x3
    stride 2 490 -> 330 us, 2x72x24x24 5x5 stride 2 550 -> 280, 2x96x12x12 5x5
    stride 2 320 -> 180, 2x72x24x24 3x3 stride 2 270 -> 190; at unit strides, where
    the two differ only in folding the images into one product, 0-20% (2x48x16x16
    135 -> 114).  Inside a whole model (mobilenet_v2, every call timed in place) the
    calls take about twice as long as alone, for both paths, and the gain shrinks to
    0-10% per shape.

    Channel blocks hold depthwise.taps_block_bytes of taps; they go to the host threads
    as they come free from depthwise.thread_items output elements on (waking the second
    thread costs 40-50 us on the shared host, and it measured slower there for every
    mobile-network shape)."""
    N, C, H, W = x.shape
    M, _, kh, kw = w.shape
    m = M // C
    (sh, sw), (Ho, Wo) = strides, O
    dtype = x.dtype
    item = dtype.itemsize
    Hq, Wq, regions, copies = _tap_layout(H, W, kh, kw, tuple(strides), tuple(pads[:2]), tuple(dilations), tuple(O))
    P = Ho * Wq  # wide-row pixels of one image
    L = N * P
    T = kh * kw
    Tc = T + (b is not None)  # the taps, and the row of ones carrying the bias
    z = kept_planes(("depthwise", dtype.str, N, C, sh, sw, Hq, Wq, H, W, pads[0], pads[1]),
                    (N, C, sh, sw, Hq + 1, Wq), dtype)
    copy_regions(x, sh, sw, regions, z)
    zs = z.strides
    wv = derived(memo, ("taps", dtype.str), w, b, lambda w, b: _taps_weights(w, b, dtype, False)).reshape(C, m, Tc)
    threads, cb = _blocking(N * M * Ho * Wo, C, Tc * L * item)
    y = output_array((N, C, m, Ho, Wo), dtype)

    def block(c0, c1):
        k = c1 - c0
        flat = bounded_scratch(k * (Tc + m) * L, dtype)
        taps = flat[:k * Tc * L].reshape(k, Tc, L)
        t5 = taps[:, :T].reshape(k, kh, kw, N, P)
        for ki, kj, rh, rw, ni, nj, start, row_step, col_step in copies:
            t5[:, ki, kj] = np.ndarray((k, ni, nj, N, P), dtype, z,
                                       c0 * zs[1] + rh * zs[2] + rw * zs[3] + start * item,
                                       (zs[1], row_step * item, col_step * item, zs[0], item))
        if Tc > T:
            taps[:, T] = 1
        acc = flat[k * Tc * L:].reshape(k, m, L)
        np.matmul(wv[c0:c1], taps, out=acc)
        src = acc.reshape(k, m, N, Ho, Wq)[..., :Wo].transpose(2, 0, 1, 3, 4)
        if epilogue is None:
            y[:, c0:c1] = src
        else:
            epilogue(src, y[:, c0:c1])

    _channel_blocks(C, cb, threads, block)
    return y.reshape(N, M, Ho, Wo)


def _blocking(outputs, C, channel_bytes):
    """(threads, channels per block): a second thread from depthwise.thread_items output
    elements on, blocks of depthwise.taps_block_bytes of taps (channel_bytes each)."""
    threads = 2 if outputs >= tuning.value("depthwise.thread_items") else 1
    return threads, max(1, min(-(-C // threads), tuning.value("depthwise.taps_block_bytes") // channel_bytes))


def _taps_weights(w, b, dtype, columns_first):
    """The tap products' (channel, multiplier, taps + bias) weights: the taps in W's order
    (kernel row, kernel column), or with columns_first in (kernel column, kernel row)
    order; the bias last."""
    M, _, kh, kw = w.shape
    wv = np.empty((M, kh * kw + (b is not None)), dtype)
    taps = w.reshape(M, kh, kw).transpose(0, 2, 1) if columns_first else w.reshape(M, kh, kw)
    wv[:, :kh * kw].reshape(taps.shape)[...] = taps
    if b is not None:
        wv[:, -1] = b
    return wv


def _channel_blocks(C, cb, threads, block) -> None:
    """block(c0, c1) for the channel blocks [c0, c1) of cb channels, on the host threads
    when threads > 1 (host_blocks costs ~10 us even on one thread)."""
    if threads == 1:
        for c0 in range(0, C, cb):
            block(c0, min(C, c0 + cb))
    else:
        host_blocks(C, cb, block, threads=threads)


class _RowLayout:
    """depthwise_row_taps' geometry for one shape (see row_layout)."""

    def __init__(self, **fields):
        self.__dict__.update(fields)


@functools.lru_cache(maxsize=128)
def row_layout(N, C, item, H, W, kh, kw, strides, pads, dilations, O):
    """The geometry of depthwise_row_taps, or None where it does not apply.

    The input is split into phase images (row phase, column phase) Hq rows by Wo columns:
    column u of column phase r holds x's column u*sw + r (zero past x), the rows are
    padded as the pads say.  Kernel column j reads x's column ow*sw + j*dw - pl, i.e.
    column ow + q of phase r (q, r = divmod(j*dw - pl, sw)), so a tap's window is one
    run of Ho * Wo elements of its phase image -- except where ow + q falls outside
    [0, Wo): there the run has wrapped into the row above or below ("wraps", zeroed in
    the taps afterwards).  That is right only where the reference reads padding: always
    left of column 0; right of the last column only when Wo*sw + r >= W (every
    "same"-padded convolution), else None.  Fields: Hq, regions (the phase images'
    data, _conv_host.phase_regions), size and lead (the scratch's elements, and the
    slack before the first phase image for wrapped reads), copies (per pair of row and
    column tap groups: byte offset, strides of the (channel, kernel column, kernel row,
    image, pixel) view, kernel column and row slices), wraps ((kernel column, output
    column) pairs to zero)."""
    (sh, sw), (dh, dw), (Ho, Wo) = strides, dilations, O
    pt, pl = pads
    if pl < 0 or pt < 0:
        return None
    rows = tap_groups(kh, sh, dh)
    cols = []  # tap_groups' column groups, phase and offsets relative to x's columns
    for r, j0, jstep, nj, q0, qs in tap_groups(kw, sw, dw):
        cols.append(((r - pl) % sw, j0, jstep, nj, q0 + (r - pl) // sw, qs))
    wraps = []
    for j in range(kw):
        q, r = divmod(j * dw - pl, sw)
        if q > 0 and Wo * sw + r < W:
            return None  # a wrapped read would stand for data
        wraps += [(j, o) for o in (range(min(Wo, -q)) if q < 0 else range(max(0, Wo - q), Wo))]
    Hq = Ho + max(g[4] + (g[3] - 1) * g[5] for g in rows)
    offsets = [c[4] + t * c[5] for c in cols for t in range(c[3])]
    lead = max(0, -min(offsets))
    zs = [item * v for v in (C * sh * sw * Hq * Wo, sh * sw * Hq * Wo, sw * Hq * Wo, Hq * Wo)]
    copies = tuple(
        ((lead + qh * Wo + qw) * item + rh * zs[2] + rw * zs[3],
         (zs[1], qws * item, qhs * Wo * item, zs[0], item),
         slice(j0, j0 + (nj - 1) * jstep + 1, jstep), slice(i0, i0 + (ni - 1) * istep + 1, istep))
        for rh, i0, istep, ni, qh, qhs in rows for rw, j0, jstep, nj, qw, qws in cols)
    return _RowLayout(
        Hq=Hq, regions=tuple(phase_regions(H, W, sh, sw, pt, 0, Hq, Wo)), lead=lead,
        size=lead + N * C * sh * sw * Hq * Wo + max(0, max(offsets)) + Wo, copies=copies, wraps=tuple(wraps))


def use_row_taps(layout, Ho, Wo) -> bool:
    """Whether depthwise_row_taps beats depthwise_tap_products: it saves the row-by-row
    copies into and out of the scratch, but each wrapped output column costs a strided
    pass over the taps (a cache line per element), so kernels at most 3 wide, on outputs
    of 12x12 to 23x23 pixels.  Measured on a 2-core host shared with other jobs (1
    thread, float32): alone (CPU time, with bias) 2x96x12x12 3x3 148 -> 130 us,
    2x48x16x16 115 -> 101, 2x72x24x24 stride 2 193 -> 191; inside the models (each call
    timed in place, the fastest of 40 runs, old and new alternating) mobilenet_v2's
    2x96x12x12 176 -> 163 and 168 -> 152 us, mobilenet_v3's 2x88x12x12 180 -> 165,
    2x72x24x24 stride 2 256 -> 247, mobilevit's 2x32x32x32 stride 2 266 -> 250.  Not
    larger outputs: 5-15% faster alone, but inside the models as fast or slower
    (efficientnet's 2x72x24x24 629 -> 648, mobilevit's 2x32x32x32 586 -> 608); nor 5x5
    kernels (4 wrapped columns: 2x120x12x12 351 -> 361 alone) or 6x6 outputs (2x96x12x12
    stride 2 103 -> 116)."""
    return len(layout.wraps) <= 2 and 144 <= Ho * Wo < 576


def depthwise_row_taps(x, w, b, strides, pads, dilations, O, epilogue=None, memo=None):
    """Depthwise 2-D convolution as one (multiplier x taps) @ (taps x pixels) product per
    channel, like depthwise_tap_products, over phase images as wide as the output
    (row_layout; the caller checks it applies): the input's copy into the kept
    zero-bordered scratch, every tap's window and the copy into Y are whole planes (one
    run each, where the padding columns of depthwise_tap_products make them runs of a
    row: NumPy copies rows of 6-24 elements at ~10 ns a row).  The taps' reads that
    wrapped around a row are zeroed in the tap matrix (one strided pass per wrapped
    output column: the reference reads padding there, so an infinite input stays
    where the reference has it).  Taps in (kernel column, kernel row) order, so that a
    wrapped column's entries of every kernel row and image are one strided run per
    channel.  The bias rides in the product (a row of ones), the copy into Y applies
    the epilogue."""
    N, C, H, W = x.shape
    M, _, kh, kw = w.shape
    m = M // C
    (sh, sw), (Ho, Wo) = strides, O
    dtype = x.dtype
    item = dtype.itemsize
    lay = row_layout(N, C, item, H, W, kh, kw, tuple(strides), tuple(pads[:2]), tuple(dilations), tuple(O))
    P = Ho * Wo
    L = N * P
    T = kh * kw
    Tc = T + (b is not None)
    z = kept_planes(("depthwise_rows", dtype.str, N, C, H, W, kh, kw, sh, sw, lay.Hq, pads[0], pads[1]),
                    (lay.size,), dtype)
    copy_regions(x, sh, sw, lay.regions, z[lay.lead:lay.lead + N * C * sh * sw * lay.Hq * Wo]
                 .reshape(N, C, sh, sw, lay.Hq, Wo))
    wv = derived(memo, ("rows", dtype.str), w, b, lambda w, b: _taps_weights(w, b, dtype, True)).reshape(C, m, Tc)
    threads, cb = _blocking(N * M * P, C, Tc * L * item)
    y = output_array((N, C, m, Ho, Wo), dtype)

    def block(c0, c1):
        k = c1 - c0
        flat = bounded_scratch(k * (Tc + m) * L, dtype)
        taps = flat[:k * Tc * L].reshape(k, Tc, L)
        t5 = taps[:, :T].reshape(k, kw, kh, N, P)
        for offset, view_strides, js, is_ in lay.copies:
            dst = t5[:, js, is_]
            dst[...] = np.ndarray(dst.shape, dtype, z, offset + c0 * view_strides[0], view_strides)
        t6 = t5.reshape(k, kw, kh, N, Ho, Wo)
        for j, o in lay.wraps:
            t6[:, j, :, :, :, o] = 0
        if Tc > T:
            taps[:, T] = 1
        acc = flat[k * Tc * L:].reshape(k, m, L)
        np.matmul(wv[c0:c1], taps, out=acc)
        src = acc.reshape(k, m, N, Ho, Wo).transpose(2, 0, 1, 3, 4)
        if epilogue is None:
            y[:, c0:c1] = src
        else:
            epilogue(src, y[:, c0:c1])

    _channel_blocks(C, cb, threads, block)
    return y.reshape(N, M, Ho, Wo)
