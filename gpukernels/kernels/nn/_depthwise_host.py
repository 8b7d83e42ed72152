"""Host-only (NumPy) depthwise 2-D convolution paths, chosen by ``depthwise_2d``:

* ``depthwise_tap_products``: one (taps x pixels) product per channel over a phase split
  of the input (any stride);
* ``depthwise_plane_products``: planes no larger than the kernel (``use_plane_products``),
  one small (outputs x inputs) matrix per channel;
* ``depthwise_taps_nhwc``: other tiny outputs (``use_channels_last_taps``), tap passes
  with the channels last.

Each is measured against the others on a 2-core host; see their docstrings.  The
activation fused into a convolution (``epilogue``) is applied where the path writes Y.
"""

from __future__ import annotations

import functools

import numpy as np

from ...host import host_blocks, tuning
from ._conv_host import copy_regions, finish, kept_planes, output_array, phase_regions, scratch_flat, tap_groups


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
    against 500).  Planes no larger than the kernel take depthwise_plane_products first."""
    channels_last = 30 + 0.42e-3 * T * N * C * Ho * Wo + 0.9e-3 * N * C * H * W
    return m == 1 and channels_last < 40 + 0.4 * C + 0.25e-3 * T * N * C * Ho * Wq


def depthwise_taps_nhwc(x, w, b, strides, pads, dilations, O, epilogue=None):
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
    flat = _scratch(rows * (N * Ho + 1) * R + N * Ho * R, dtype)
    terms = flat[:rows * N * Ho * R].reshape(rows, N, Ho, R)  # every tap's products, the bias
    wt = flat[rows * N * Ho * R:][:rows * R].reshape(rows, 1, 1, Wo, C)  # weights tiled along a row
    np.copyto(wt[:T], w.reshape(C, T).T[:, None, None, None, :])
    if b is not None:
        np.copyto(wt[T], b.astype(dtype, copy=False))
        np.copyto(terms[T], wt[T].reshape(1, 1, R))
    wt = wt.reshape(rows, 1, 1, R)
    t5 = terms[:T].reshape(kh, kw, N, Ho, R)
    w5 = wt[:T].reshape(kh, kw, 1, 1, R)
    for ki, kj, rh, rw, ni, nj, start, row_step, col_step in copies:
        # a tap's window in its phase image: Ho runs of Wo * C contiguous elements
        view = np.ndarray((ni, nj, N, Ho, R), dtype, z, rh * zs[1] + rw * zs[2] + start * C * item,
                          (row_step * C * item, col_step * C * item, zs[0], zs[3], item))
        np.multiply(view, w5[ki, kj], out=t5[ki, kj])
    acc = flat[rows * (N * Ho + 1) * R:].reshape(N, Ho, R)
    np.add.reduce(terms, axis=0, out=acc)
    y = output_array((N, C, Ho, Wo), dtype)
    res = acc.reshape(N, Ho, Wo, C).transpose(0, 3, 1, 2)
    if epilogue is None:
        y[...] = res
    else:
        epilogue(res, y)
    return y


def _scratch(count, dtype) -> np.ndarray:
    """An uninitialised 1-D scratch: the per-thread buffer (_conv_host.scratch_flat) while it
    stays within conv.host_cols_bytes, else a fresh array (not kept)."""
    if count * np.dtype(dtype).itemsize <= tuning.value("conv.host_cols_bytes"):
        return scratch_flat(count, dtype)
    return np.empty(count, dtype)


_PLANE_MATRIX_MAX = 1 << 14  # entries of one channel's (outputs x inputs) matrix


def use_plane_products(H, W, kh, kw, Ho, Wo) -> bool:
    """Whether depthwise_plane_products beats the tap paths: its (outputs x inputs)
    matrices cost about as much as a tap pass per input pixel, so when a plane has no
    more pixels than the kernel has taps (convnext's 7x7 on 2x2 and 4x4 planes,
    efficientnet's 5x5 on 3x3), and the matrix stays small (huge pads could make the
    outputs many).  Measured on a 2-core host (shared, 1 thread, float32): 2x256x2x2
    7x7 430 -> 31 us, 2x128x4x4 7x7 320 -> 117 us, 2x576x3x3 5x5 390 -> 145 us,
    2x480x3x3 3x3 141 -> 109 us; 2x336x6x6 5x5 (rejected here) would go 560 -> 1090."""
    return H * W <= kh * kw and Ho * Wo * H * W <= _PLANE_MATRIX_MAX


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


def depthwise_plane_products(x, w, b, strides, pads, dilations, O):
    """Depthwise 2-D convolution of planes no larger than the kernel: each channel's
    taps laid out as an (outputs x inputs) matrix A[c] (gathered from the weights, zero
    where an input pixel is padding or outside an output's window), then one batched
    product A[c] @ x[n, c] per (image, channel) -- every tap that reads data is one
    multiply-add, none that reads padding is computed.  Only for finite x and w (a
    structural zero times an infinite input would be NaN, where the reference reads no
    such pixel): the caller checks.  The bias is added to Y."""
    N, C, H, W = x.shape
    M, _, kh, kw = w.shape
    m = M // C
    Ho, Wo = O
    T = kh * kw
    dtype = x.dtype
    index = _plane_taps(H, W, kh, kw, tuple(strides), tuple(pads[:2]), tuple(dilations), tuple(O))
    wz = np.zeros((C, m, T + 1), dtype)
    wz[:, :, :T] = w.reshape(C, m, T)
    taps = wz[:, :, index].reshape(C, m * Ho * Wo, H * W)  # A[c], the multiplier's rows stacked
    y = output_array((N, M, Ho, Wo), dtype)
    np.matmul(taps, x.reshape(N, C, H * W, 1), out=y.reshape(N, C, m * Ho * Wo, 1))
    if b is not None:
        y += b.reshape(1, M, 1, 1).astype(dtype, copy=False)
    return y


def _all_finite(*arrays) -> bool:
    """Whether every element of every array is finite."""
    return all(bool(np.isfinite(a).all()) for a in arrays)


def depthwise_2d(x, w, b, strides, pads, dilations, O, epilogue=None):
    """Depthwise 2-D convolution on the host: planes no larger than the kernel take
    depthwise_plane_products, other small outputs depthwise_taps_nhwc, the rest
    depthwise_tap_products.  epilogue: an activation fused into the convolution
    (epilogue(src, out) writes act(src) into out), applied by the tap paths in the copy
    that writes Y; the plane products write Y from BLAS, so there it follows the bias
    (_conv_host.finish; their outputs are a few pixels per plane)."""
    N, C, H, W = x.shape
    m = w.shape[0] // C
    kh, kw = w.shape[2:]
    Ho, Wo = O
    if use_plane_products(H, W, kh, kw, Ho, Wo) and _all_finite(x, w):
        return finish(depthwise_plane_products(x, w, b, strides, pads, dilations, O), epilogue)
    Wq = _tap_layout(H, W, kh, kw, tuple(strides), tuple(pads[:2]), tuple(dilations), tuple(O))[1]
    if use_channels_last_taps(N, C, m, kh * kw, H, W, Ho, Wo, Wq):
        return depthwise_taps_nhwc(x, w, b, strides, pads, dilations, O, epilogue)
    return depthwise_tap_products(x, w, b, strides, pads, dilations, O, epilogue)


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


def depthwise_tap_products(x, w, b, strides, pads, dilations, O, epilogue=None):
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
    wv = w.reshape(C, m, T)
    if b is not None:
        wv = np.concatenate([wv, b.reshape(C, m, 1).astype(dtype, copy=False)], axis=2)
    threads = 2 if N * M * Ho * Wo >= tuning.value("depthwise.thread_items") else 1
    cb = max(1, min(-(-C // threads), tuning.value("depthwise.taps_block_bytes") // (Tc * L * item)))
    y = output_array((N, C, m, Ho, Wo), dtype)

    def block(c0, c1):
        k = c1 - c0
        flat = _scratch(k * (Tc + m) * L, dtype)
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

    if threads == 1:  # host_blocks costs ~10 us even on one thread
        for c0 in range(0, C, cb):
            block(c0, min(C, c0 + cb))
    else:
        host_blocks(C, cb, block, threads=threads)
    return y.reshape(N, M, Ho, Wo)
