"""Host-only (NumPy) depthwise 2-D convolution paths, chosen by ``depthwise_2d``:

* ``depthwise_2d``: one (taps x pixels) product per channel;
* ``depthwise_plane_products``: planes no larger than the kernel (``use_plane_products``),
  one small (outputs x inputs) matrix per channel;
* ``depthwise_taps_nhwc``: other tiny planes (``use_channels_last_taps``), tap passes
  with the channels last.

Each is measured against the others on a 2-core host; see their docstrings.
"""

from __future__ import annotations

import functools
import threading

import numpy as np

from ...host import host_blocks, tuning
from ._conv_host import _output, finish


def use_channels_last_taps(N, C, m, T, Ho, Wo) -> bool:
    """Whether depthwise_taps_nhwc beats depthwise_2d: its 2 x T ufunc passes over the
    whole batch (about 1 us each plus 1 us per 2000 elements) against depthwise_2d's
    product per (image, channel) of about 1 us; the tiny planes of mobile networks' last
    stages (3x3 and 6x6 at 96x96 inputs).  Measured on a 2-core host (shared, 1 thread,
    float32): 2x480x3x3 3x3 taps 290 -> 140 us, 2x576x3x3 5x5 640 -> 400 us, 2x192x6x6
    200 -> 150 us, 2x672x6x6 5x5 1040 -> 800 us; 2x128x4x4 7x7 (rejected here) would go
    360 -> 520 us."""
    return m == 1 and 2 * T * (1 + N * Ho * Wo * C / 2000) < N * C


def _window_extent(kernel_hw, strides, dilations, O):
    """(Hp, Wp, Wc) of a 2-D depthwise pass: the padded rows and columns the output windows
    span, and the columns per window row -- Wp (wide rows, cropped at the end) when the
    column stride is 1, else the exact Wo outputs."""
    (kh, kw), (sh, sw), (dh, dw), (Ho, Wo) = kernel_hw, strides, dilations, O
    Hp = (Ho - 1) * sh + (kh - 1) * dh + 1
    Wp = (Wo - 1) * sw + (kw - 1) * dw + 1
    return Hp, Wp, (Wp if sw == 1 else Wo)


def depthwise_taps_nhwc(x, w, b, strides, pads, dilations, O):
    """Depthwise 2-D convolution (multiplier 1) with the channels last: the input is
    copied once, transposed, into a zero-bordered (N, Hp + 1, Wp, C) scratch; tap (i, j)
    reads the view starting i*dh rows and j*dw columns in, and adds w[:, i, j] times it
    into an (N, Ho, Wo, C) accumulator -- two ufunc calls per tap over the whole batch,
    each with the channel as its long, contiguous inner loop (C times fewer calls than one
    product per channel).  No wide rows here: with the channels innermost they would
    only add columns (2x the work for 5x5 taps on 3x3 planes).  The transposed copy into
    Y adds the bias."""
    N, C, H, W = x.shape
    kh, kw = w.shape[2:]
    sh, sw = strides
    dh, dw = dilations
    ph, pw = pads[0], pads[1]
    Ho, Wo = O
    Hp, Wp, _ = _window_extent((kh, kw), strides, dilations, O)
    dtype = x.dtype
    item = dtype.itemsize
    rows, cols = max(0, min(Hp, ph + H) - ph), max(0, min(Wp, pw + W) - pw)
    pad = np.zeros((N, Hp, Wp, C), dtype)
    if rows and cols:
        pad[:, ph:ph + rows, pw:pw + cols] = x[:, :, :rows, :cols].transpose(0, 2, 3, 1)
    wt = np.ascontiguousarray(w.reshape(C, kh * kw).T)  # (taps, C)
    acc = np.empty((N, Ho, Wo, C), dtype)
    tmp = np.empty_like(acc)
    st = pad.strides
    for i in range(kh):
        for j in range(kw):
            view = np.ndarray((N, Ho, Wo, C), dtype, pad, (i * dh * Wp + j * dw) * C * item,
                              (st[0], sh * st[1], sw * st[2], item))
            if i == 0 and j == 0:
                np.multiply(view, wt[0], out=acc)
            else:
                np.multiply(view, wt[i * kw + j], out=tmp)
                acc += tmp
    y = _output((N, C, Ho, Wo), dtype)
    res = acc.transpose(0, 3, 1, 2)
    if b is None:
        y[...] = res
    else:
        np.add(res, b.reshape(1, C, 1, 1).astype(dtype, copy=False), out=y)
    return y


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
    y = _output((N, M, Ho, Wo), dtype)
    np.matmul(taps, x.reshape(N, C, H * W, 1), out=y.reshape(N, C, m * Ho * Wo, 1))
    if b is not None:
        y += b.reshape(1, M, 1, 1).astype(dtype, copy=False)
    return y


def _all_finite(*arrays) -> bool:
    """Whether every element of every array is finite."""
    return all(bool(np.isfinite(a).all()) for a in arrays)


def depthwise_2d(x, w, b, strides, pads, dilations, O, epilogue=None):
    """Depthwise 2-D convolution on the host (planes no larger than the kernel:
    depthwise_plane_products; other tiny planes: depthwise_taps_nhwc).

    Per (image, channel block) work unit, the block's planes are copied once into a
    zero-bordered scratch (plus one spare zero row), kept per thread and reused by its
    next units, so only the interior is ever written.  One copy then lays the windows of
    all taps out as a (taps, pixels) matrix per channel, and one batched matrix product
    (multiplier x taps) @ (taps x pixels) sums the taps -- one BLAS call per channel
    instead of two passes per tap, which matters most for the small planes of mobile
    networks.  The bias rides in the product (a row of ones under the taps, set once per
    thread): the final copy into Y is then a plain copy, 10-25% faster than adding the
    bias there (2x72x24x24, 3x3: 150 -> 110-130 us per image).  With a column stride of
    1 the windows are "wide" rows (the padded width Wp = Wo + (kw-1)*dw), so each tap's
    window is one contiguous run; the columns past Wo are dropped by the final copy into
    Y.  Units go to the host threads as they come free when the call is big enough to pay
    for waking a second thread.  epilogue: an activation applied to the result
    (_conv_host.finish)."""
    N, C, H, W = x.shape
    m = w.shape[0] // C
    kh, kw = w.shape[2:]
    T = kh * kw
    sh, sw = strides
    dh, dw = dilations
    ph, pw = pads[0], pads[1]
    Ho, Wo = O
    Hp, Wp, Wc = _window_extent((kh, kw), strides, dilations, O)
    L = Ho * Wc
    dtype = x.dtype
    item = dtype.itemsize
    if use_plane_products(H, W, kh, kw, Ho, Wo) and _all_finite(x, w):
        return finish(depthwise_plane_products(x, w, b, strides, pads, dilations, O), epilogue)
    if use_channels_last_taps(N, C, m, T, Ho, Wo):
        return finish(depthwise_taps_nhwc(x, w, b, strides, pads, dilations, O), epilogue)
    # padded rows/columns holding input data (pads may exceed what the output reads)
    rows, cols = max(0, min(Hp, ph + H) - ph), max(0, min(Wp, pw + W) - pw)
    Tc = T + (b is not None)  # taps, and the row of ones carrying the bias
    cb = max(1, min(C, tuning.value("depthwise.taps_block_bytes") // max(1, Tc * L * item)))
    nblk = -(-C // cb)
    wv = w.reshape(C, m, T)
    if b is not None:
        wv = np.concatenate([wv, b.reshape(C, m, 1).astype(dtype, copy=False)], axis=2)
    y = _output((N, C, m, Ho, Wo), dtype)
    local = threading.local()

    def unit(u):
        n, blk = divmod(u, nblk)
        c0 = blk * cb
        c1 = min(C, c0 + cb)
        k = c1 - c0
        bufs = getattr(local, "bufs", None)
        if bufs is None:  # zeroed once per thread: the borders stay zero, the ones row ones
            taps = np.empty((cb, Tc, L), dtype)
            taps[:, T:] = 1
            bufs = local.bufs = (np.zeros((cb, Hp + 1, Wp), dtype), taps, np.empty((cb, m, L), dtype))
        pad, taps, acc = bufs
        if rows and cols:
            pad[:k, ph:ph + rows, pw:pw + cols] = x[n, c0:c1, :rows, :cols]
        st = pad.strides
        windows = np.ndarray((k, kh, kw, Ho, Wc), dtype, pad, 0,
                             (st[0], dh * Wp * item, dw * item, sh * Wp * item, sw * item))
        taps[:k, :T].reshape(k, kh, kw, Ho, Wc)[...] = windows
        np.matmul(wv[c0:c1], taps[:k], out=acc[:k])
        y[n, c0:c1] = acc[:k].reshape(k, m, Ho, Wc)[..., :Wo]

    units = N * nblk
    threads = 2 if N * C * m * Ho * Wo >= tuning.value("depthwise.thread_items") else 1
    host_blocks(units, 1, lambda u0, u1: [unit(u) for u in range(u0, u1)], threads=threads)
    return finish(y.reshape((N, C * m, Ho, Wo)), epilogue)
