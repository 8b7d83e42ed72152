"""Host-only (NumPy) 2-D convolution paths, chosen by conv.conv_forward:

* ``pointwise``: 1x1 kernels, one product per image (the bias inside it when cheaper);
* ``conv2d``: column matrix over a phase split of the padded input, one product;
* ``conv2d_taps``: no column matrix, one product per kernel tap over wide-row views
  (unit strides, few output channels next to the input's; ``use_tap_products``);
* ``depthwise_2d``: depthwise convolution as one (taps x pixels) product per channel,
  or for tiny planes (``use_channels_last_taps``) as tap passes with the channels last
  (``depthwise_taps_nhwc``).

Each is measured against the others on a 2-core AVX-512 host; see their docstrings.
"""

from __future__ import annotations

import math
import threading

import numpy as np

from ...host import host_blocks, host_empty, tuning


# Host (NumPy) 2-D convolution.  Strides and dilations are removed by a phase split of the
# zero-padded input: along an axis with stride s, tap i reads padded position o*s + i*d =
# (o + q)*s + r with q, r = divmod(i*d, s), i.e. row o + q of phase image r (the padded
# rows r, r + s, ...), so every tap reads a contiguous, stride-1 run of a phase image.
# The column matrix is then filled by one copy per (kernel row, column phase) -- rows
# (channel, tap) -- and a row of ones carries the bias into the matrix product, whose
# output lands in NCHW order.  Two layouts of the columns:
# * "wide" (stride-1 width, kernels wider than 1): each output row is computed over the
#   whole phase-image width Wq = Wo + (kw-1)*dw/s and cropped afterwards, so a column block
#   is one long contiguous run per (channel, tap) (a near memcpy) instead of Wo-long runs;
#   chosen by _use_wide;
# * otherwise exact rows of Wo, with the product written straight into Y.
# The column buffer's size: tuning entry conv.host_cols_bytes (host/tuning.py).


def _use_wide(kw, Wq, Wo, K, M) -> bool:
    """Wide rows when the extra columns cost little and the column copy (K rows per
    pixel) outweighs the crop copy (M per pixel); measured on a 2-core AVX-512 host."""
    return kw > 1 and (Wq - Wo) * 8 <= Wo and K >= 4 * M


def _phase_split(x, sh, sw, ph, pw, Hq, Wq, out):
    """out[n, c, rh, rw, a, b] = padded x[n, c, a*sh + rh - ph, b*sw + rw - pw] (zero outside
    x), for a < Hq, b < Wq; out's spare row a = Hq is zeroed (wide reads run into it)."""
    H, W = x.shape[2:]
    out[:, :, :, :, Hq:] = 0
    for rh in range(sh):
        a0 = max(0, -(-(ph - rh) // sh))
        a1 = min(Hq, (H - 1 + ph - rh) // sh + 1)
        for rw in range(sw):
            b0 = max(0, -(-(pw - rw) // sw))
            b1 = min(Wq, (W - 1 + pw - rw) // sw + 1)
            dst = out[:, :, rh, rw, :Hq]
            if a1 <= a0 or b1 <= b0:
                dst[...] = 0
                continue
            dst[:, :, :a0] = 0
            dst[:, :, a1:] = 0
            dst[:, :, a0:a1, :b0] = 0
            dst[:, :, a0:a1, b1:] = 0
            y0, x0 = a0 * sh + rh - ph, b0 * sw + rw - pw
            dst[:, :, a0:a1, b0:b1] = x[:, :, y0:y0 + (a1 - a0 - 1) * sh + 1:sh,
                                        x0:x0 + (b1 - b0 - 1) * sw + 1:sw]


def conv2d(x, w, b, strides, pads, dilations, O):
    """Y = conv(x, w) + b for 2-D, group 1, float x on the host (see the comment above)."""
    N, C, H, W = x.shape
    M, _, kh, kw = w.shape
    (sh, sw), (dh, dw) = strides, dilations
    Ho, Wo = O
    dtype = x.dtype
    item = dtype.itemsize
    qi = [(i * dh) // sh for i in range(kh)]
    ri = [(i * dh) % sh for i in range(kh)]
    # kernel columns grouped by column phase: for phase r the taps js (ascending) have
    # q = (j*dw)//sw in steps of dw/gcd(sw, dw)
    groups = []
    for r in range(sw):
        js = [j for j in range(kw) if (j * dw) % sw == r]
        if js:
            groups.append((r, js, (js[0] * dw) // sw))
    qstep = dw // math.gcd(sw, dw)
    Hq = Ho + max(qi)
    Wq = Wo + ((kw - 1) * dw) // sw
    K = C * kh * kw
    wide = _use_wide(kw, Wq, Wo, K, M)
    Wc = Wq if wide else Wo
    # the bias rides in the product (a row of ones in the columns) when copying the weights
    # once costs less than a pass over the output
    ones_row = b is not None and K < N * Ho * Wo
    wm = w.reshape(M, K)
    if ones_row:
        wm = np.concatenate([wm, b.reshape(M, 1).astype(dtype, copy=False)], axis=1)
    Kc = K + ones_row
    # chunks: whole images while they fit the column budget, else row blocks of one image
    per_image = Kc * Ho * Wc * item
    cols_bytes = tuning.value("conv.host_cols_bytes")
    if per_image <= cols_bytes:
        nb = max(1, min(N, cols_bytes // per_image))
        chunks = [(n0, min(N, n0 + nb), 0, Ho) for n0 in range(0, N, nb)]
        rows = Ho
    else:
        nb = 1
        rows = max(1, cols_bytes // (Kc * Wc * item))
        chunks = [(n0, n0 + 1, r0, min(Ho, r0 + rows)) for n0 in range(N) for r0 in range(0, Ho, rows)]
    y = host_empty((N, M, Ho, Wo), dtype, tuning.value("conv.arena_min_bytes"))
    cols = np.empty((nb, Kc, rows * Wc), dtype=dtype)
    if ones_row:
        cols[:, K] = 1
    z = np.empty((nb, C, sh, sw, Hq + 1, Wq), dtype=dtype)
    zs = z.strides
    bias = None if b is None else b.reshape(M, 1, 1).astype(dtype, copy=False)
    done_images = None
    for n0, n1, r0, r1 in chunks:
        n = n1 - n0
        if done_images != (n0, n1):
            zc = z[:n]
            _phase_split(x[n0:n1], sh, sw, pads[0], pads[1], Hq, Wq, zc)
            done_images = (n0, n1)
        nr = r1 - r0
        L = nr * Wc
        cc = cols[:n, :, :L]
        # rows in W's own order (channel, kernel row, kernel column): no weight reordering
        c5 = cc[:, :K].reshape(n, C, kh, kw, L)
        for i in range(kh):
            for r, js, q0 in groups:
                # zc[0, 0, ri[i], r, r0 + qi[i], q0] onwards (np.ndarray over the scratch
                # is a much cheaper view than as_strided for these small calls)
                start = ri[i] * zs[2] + r * zs[3] + (r0 + qi[i]) * zs[4] + q0 * item
                view = np.ndarray((n, C, len(js), nr, Wc), dtype, z, start,
                                  (zs[0], zs[1], qstep * item, zs[4], item))
                step = js[1] - js[0] if len(js) > 1 else 1
                dst = c5[:, :, i, js[0]:js[-1] + 1:step]
                dst.reshape(n, C, len(js), nr, Wc)[...] = view
        if wide:
            y[n0:n1, :, r0:r1] = np.matmul(wm, cc).reshape(n, M, nr, Wq)[..., :Wo]
        else:
            dst = y[n0:n1].reshape(n, M, Ho * Wo)[:, :, r0 * Wo:r1 * Wo]
            np.matmul(wm, cc, out=dst)
    if bias is not None and not ones_row:
        y += bias
    return y


def pointwise(x, w, b, strides, O):
    """Y = conv(x, w) + b for a 1x1 kernel, one group, no padding, on the host: one
    product W (M x C) @ X[n] (C x pixels) per image, X subsampled by the strides.  The
    bias rides in the product as a row of ones under a copy of X (the copy also does the
    subsampling) when that copy and the widened weights cost less than a pass over Y
    (fewer input than output channels, planes larger than a few pixels): measured on a
    2-core host (1 thread, float32) 2x8x48x48 -> 48 channels 235 -> 170 us, 2x12x24x24
    -> 72 115 -> 86 us."""
    N, C = x.shape[:2]
    M = w.shape[0]
    P = math.prod(O)
    dtype = x.dtype
    if any(s != 1 for s in strides):
        x = x[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in strides)]
    wm = w.reshape(M, C)
    y = host_empty((N, M) + tuple(O), dtype, tuning.value("conv.arena_min_bytes"))
    if b is not None and M * (C + 1) + N * (C + 1) * P < N * M * P:
        cols = np.empty((N, C + 1, P), dtype)
        cols[:, :C].reshape(x.shape)[...] = x
        cols[:, C] = 1
        wm = np.concatenate([wm, b.reshape(M, 1).astype(dtype, copy=False)], axis=1)
        np.matmul(wm, cols, out=y.reshape(N, M, P))
        return y
    np.matmul(wm, x.reshape(N, C, P), out=y.reshape(N, M, P))
    if b is not None:
        y.reshape(N, M, P)[...] += b.reshape(M, 1).astype(dtype, copy=False)
    return y


def use_tap_products(C, M, strides, O, K, dilations) -> bool:
    """Tap products (conv2d_taps) for unit strides when the output has few channels
    next to the input's (the im2col copy is then most of the cost) and the rows are long
    enough for efficient products; measured on a 2-core AVX-512 host (128 -> 32 channels
    at 56x56: 1.5x faster; 64 -> 64: 10% slower)."""
    wide = O[0] * (O[1] + (K[1] - 1) * dilations[1])
    return tuple(strides) == (1, 1) and wide >= 128 and (2 * M <= C or (M <= 32 and C >= 64))


def conv2d_taps(x, w, b, pads, dilations, O):
    """Y = conv(x, w) + b for 2-D, group 1, unit strides on the host, without a column
    matrix: the zero-padded planes of an image are laid out with "wide" rows (the padded
    width Wp = Wo + (kw-1)*dw, plus a spare zero row), so the input window of kernel tap
    (i, j) is, for every channel, one contiguous run of Ho * Wp elements at offset
    i*dh*Wp + j*dw -- a (C, Ho*Wp) matrix view with the plane size as its row stride,
    which BLAS reads directly.  Y's wide rows are the sum over taps of W[:, :, i, j] @
    view (one product per tap, accumulated); the columns past Wo are dropped by the copy
    into Y, which also adds the bias."""
    N, C, H, W = x.shape
    M, _, kh, kw = w.shape
    dh, dw = dilations
    ph, pw = pads[0], pads[1]
    Ho, Wo = O
    Hp = Ho + (kh - 1) * dh
    Wp = Wo + (kw - 1) * dw
    L = Ho * Wp
    dtype = x.dtype
    item = dtype.itemsize
    rows, cols = max(0, min(Hp, ph + H) - ph), max(0, min(Wp, pw + W) - pw)
    pad = np.zeros((C, Hp + 1, Wp), dtype)
    plane = (Hp + 1) * Wp
    wt = np.ascontiguousarray(w.transpose(2, 3, 0, 1))  # (kh, kw, M, C)
    acc = np.empty((M, L), dtype)
    tmp = np.empty((M, L), dtype)
    bias = None if b is None else b.reshape(M, 1, 1).astype(dtype, copy=False)
    y = host_empty((N, M, Ho, Wo), dtype, tuning.value("conv.arena_min_bytes"))
    for n in range(N):
        if rows and cols:
            pad[:, ph:ph + rows, pw:pw + cols] = x[n, :, :rows, :cols]
        for i in range(kh):
            for j in range(kw):
                view = np.ndarray((C, L), dtype, pad, (i * dh * Wp + j * dw) * item, (plane * item, item))
                if i == 0 and j == 0:
                    np.matmul(wt[i, j], view, out=acc)
                else:
                    np.matmul(wt[i, j], view, out=tmp)
                    acc += tmp
        res = acc.reshape(M, Ho, Wp)[:, :, :Wo]
        if bias is None:
            y[n] = res
        else:
            np.add(res, bias, out=y[n])
    return y




def use_channels_last_taps(N, C, m, T, Ho, Wc) -> bool:
    """Whether depthwise_taps_nhwc beats depthwise_2d: its 2 x T ufunc passes over the
    whole batch (about 1 us each plus 1 us per 2000 elements) against depthwise_2d's
    product per (image, channel) of about 1 us; the tiny planes of mobile networks' last
    stages (3x3 and 6x6 at 96x96 inputs).  Measured on a 2-core host (shared, 1 thread,
    float32): 2x480x3x3 3x3 taps 290 -> 140 us, 2x576x3x3 5x5 640 -> 400 us, 2x192x6x6
    200 -> 150 us; 2x128x4x4 7x7 (rejected here) would go 360 -> 520 us."""
    return m == 1 and 2 * T * (1 + N * Ho * Wc * C / 2000) < N * C


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
    into an (N, Ho, Wc, C) accumulator -- two ufunc calls per tap over the whole batch,
    each with the channel as its long, contiguous inner loop (C times fewer calls than one
    product per channel); Wc = Wp with a unit column stride (wide rows, cropped at the
    end).  The transposed copy into Y adds the bias."""
    N, C, H, W = x.shape
    kh, kw = w.shape[2:]
    sh, sw = strides
    dh, dw = dilations
    ph, pw = pads[0], pads[1]
    Ho, Wo = O
    Hp, Wp, Wc = _window_extent((kh, kw), strides, dilations, O)
    dtype = x.dtype
    item = dtype.itemsize
    rows, cols = max(0, min(Hp, ph + H) - ph), max(0, min(Wp, pw + W) - pw)
    pad = np.zeros((N, Hp + 1, Wp, C), dtype)
    if rows and cols:
        pad[:, ph:ph + rows, pw:pw + cols] = x[:, :, :rows, :cols].transpose(0, 2, 3, 1)
    wt = np.ascontiguousarray(w.reshape(C, kh * kw).T)  # (taps, C)
    acc = np.empty((N, Ho, Wc, C), dtype)
    tmp = np.empty_like(acc)
    st = pad.strides
    for i in range(kh):
        for j in range(kw):
            view = np.ndarray((N, Ho, Wc, C), dtype, pad, (i * dh * Wp + j * dw) * C * item,
                              (st[0], sh * st[1], sw * st[2], item))
            if i == 0 and j == 0:
                np.multiply(view, wt[0], out=acc)
            else:
                np.multiply(view, wt[i * kw + j], out=tmp)
                acc += tmp
    y = host_empty((N, C, Ho, Wo), dtype, tuning.value("conv.arena_min_bytes"))
    res = acc[:, :, :Wo].transpose(0, 3, 1, 2)
    if b is None:
        y[...] = res
    else:
        np.add(res, b.reshape(1, C, 1, 1).astype(dtype, copy=False), out=y)
    return y


def depthwise_2d(x, w, b, strides, pads, dilations, O):
    """Depthwise 2-D convolution on the host (tiny planes: depthwise_taps_nhwc).

    Per (image, channel block) work unit, the block's planes are copied once into a
    zero-bordered scratch (plus one spare zero row), kept per thread and reused by its
    next units, so only the interior is ever written.  One copy then lays the windows of
    all taps out as a (taps, pixels) matrix per channel, and one batched matrix product
    (multiplier x taps) @ (taps x pixels) sums the taps -- one BLAS call per channel
    instead of two passes per tap, which matters most for the small planes of mobile
    networks.  With a column stride of 1 the windows are "wide" rows (the padded width
    Wp = Wo + (kw-1)*dw), so each tap's window is one contiguous run; the columns past
    Wo are dropped by the final copy into Y, which also adds the bias.  Units go to the
    host threads as they come free when the call is big enough to pay for waking a
    second thread."""
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
    if use_channels_last_taps(N, C, m, T, Ho, Wc):
        return depthwise_taps_nhwc(x, w, b, strides, pads, dilations, O)
    # padded rows/columns holding input data (pads may exceed what the output reads)
    rows, cols = max(0, min(Hp, ph + H) - ph), max(0, min(Wp, pw + W) - pw)
    cb = max(1, min(C, tuning.value("depthwise.taps_block_bytes") // max(1, T * L * item)))
    nblk = -(-C // cb)
    wv = w.reshape(C, m, T)
    bias = None if b is None else b.reshape(C, m, 1, 1).astype(dtype, copy=False)
    y = host_empty((N, C, m, Ho, Wo), dtype, tuning.value("conv.arena_min_bytes"))
    local = threading.local()

    def unit(u):
        n, blk = divmod(u, nblk)
        c0 = blk * cb
        c1 = min(C, c0 + cb)
        k = c1 - c0
        bufs = getattr(local, "bufs", None)
        if bufs is None:  # zeroed once per thread: the borders stay zero
            bufs = local.bufs = (np.zeros((cb, Hp + 1, Wp), dtype), np.empty((cb, T, L), dtype),
                                 np.empty((cb, m, L), dtype))
        pad, taps, acc = bufs
        if rows and cols:
            pad[:k, ph:ph + rows, pw:pw + cols] = x[n, c0:c1, :rows, :cols]
        st = pad.strides
        windows = np.ndarray((k, kh, kw, Ho, Wc), dtype, pad, 0,
                             (st[0], dh * Wp * item, dw * item, sh * Wp * item, sw * item))
        taps[:k].reshape(k, kh, kw, Ho, Wc)[...] = windows
        np.matmul(wv[c0:c1], taps[:k], out=acc[:k])
        res = acc[:k].reshape(k, m, Ho, Wc)[..., :Wo]
        if bias is None:
            y[n, c0:c1] = res
        else:
            np.add(res, bias[c0:c1], out=y[n, c0:c1])

    units = N * nblk
    threads = 2 if N * C * m * Ho * Wo >= tuning.value("depthwise.thread_items") else 1
    host_blocks(units, 1, lambda u0, u1: [unit(u) for u in range(u0, u1)], threads=threads)
    return y.reshape((N, C * m, Ho, Wo))
