"""Host-only (NumPy) 2-D convolution paths, chosen by conv.conv_forward:

* ``pointwise``: 1x1 kernels, one product per image (the bias inside it when cheaper);
* ``conv2d``: column matrix over a phase split of the padded input, one product;
* ``conv2d_taps``: no column matrix, one product per kernel tap over wide-row views
  (unit strides, few output channels next to the input's; ``use_tap_products``);
* ``conv2d_patches``: column matrix copied from one strided view of every window, for
  large strides ("patchify" embeddings; ``use_patches``);

Depthwise convolutions are in _depthwise_host.py.

Each is measured against the others on a 2-core AVX-512 host; see their docstrings.
"""

from __future__ import annotations

import math

import numpy as np

from ...host import host_empty, tuning


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
# The column buffer's size: tuning entry conv.host_cols_bytes (host/tuning.py).  Small
# images (conv.host_fold_pixels) share one product: the columns are laid out (rows,
# image, pixels), so BLAS packs the weights once per chunk instead of once per image,
# and the (M, image, pixels) result is copied into Y transposed.


def _output(shape, dtype) -> np.ndarray:
    """Y of a host Conv path: from the run's arena from conv.arena_min_bytes on (fresh
    arrays of a few MB are page-faulted in again on every call), else a plain np.empty."""
    return host_empty(shape, dtype, tuning.value("conv.arena_min_bytes"))


def finish(y, epilogue):
    """y with the epilogue (an activation fused into the convolution: epilogue(src, out)
    writes act(src) into out) applied in place; y itself without one."""
    if epilogue is not None:
        epilogue(y, y)
    return y


def dense_2d(x, w, b, strides, pads, dilations, O, epilogue=None):
    """2-D, one group, float: the taps that read only padding dropped (trim_taps; a kernel
    left 1x1 without padding is a pointwise product), then columns copied from strided
    windows for large strides, per-tap products when the output has few channels next to
    the input's (no column matrix), else phase-split columns (conv2d).  epilogue: an
    activation applied to the result (see finish)."""
    trimmed = trim_taps(x, w, strides, pads, dilations, O)
    if trimmed is not None:
        x, w, pads = trimmed
        if w.shape[2:] == (1, 1) and not any(pads):
            return pointwise(x, w, b, strides, O, epilogue)
    per_image = x.dtype.itemsize * (x.shape[1] * w.shape[2] * w.shape[3] + 1) * O[0] * O[1]
    if use_patches(strides, per_image):
        return finish(conv2d_patches(x, w, b, strides, pads, dilations, O), epilogue)
    if use_tap_products(x.shape[1], w.shape[0], strides, O, w.shape[2:], dilations):
        return finish(conv2d_taps(x, w, b, pads, dilations, O), epilogue)
    return finish(conv2d(x, w, b, strides, pads, dilations, O), epilogue)


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
    y = _output((N, M, Ho, Wo), dtype)
    fold = nb > 1 and Ho * Wc <= tuning.value("conv.host_fold_pixels")
    cols = np.empty(nb * Kc * rows * Wc, dtype=dtype)
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
        # rows in W's own order (channel, kernel row, kernel column): no weight reordering;
        # c5 is (image, channel, kernel row, kernel column, pixels) in either layout
        if fold:
            cc = cols[:Kc * n * L].reshape(Kc, n, L)
            c5 = cc[:K].reshape(C, kh, kw, n, L).transpose(3, 0, 1, 2, 4)
        else:
            cc = cols[:n * Kc * L].reshape(n, Kc, L)
            c5 = cc[:, :K].reshape(n, C, kh, kw, L)
        if ones_row:
            cc[(K,) if fold else (slice(None), K)] = 1
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
        if fold:  # whole images: (M, image, pixels) into Y transposed
            res = np.matmul(wm, cc.reshape(Kc, n * L)).reshape(M, n, Ho, Wc)[..., :Wo]
            y[n0:n1] = res.transpose(1, 0, 2, 3)
        elif wide:
            y[n0:n1, :, r0:r1] = np.matmul(wm, cc).reshape(n, M, nr, Wq)[..., :Wo]
        else:
            dst = y[n0:n1].reshape(n, M, Ho * Wo)[:, :, r0 * Wo:r1 * Wo]
            np.matmul(wm, cc, out=dst)
    if bias is not None and not ones_row:
        y += bias
    return y


def use_patches(strides, per_image_bytes) -> bool:
    """conv2d_patches for strides of more than 4 phases (sh * sw > 4), where conv2d's
    phase split costs a few small copies per phase, when one image's columns fit the
    column budget.  Measured on a 2-core host (shared, 1 thread, float32): ViT's 16x16
    stride-16 embedding of 2x3x64x64 2780 -> 150 us, CLIP's 32x32 stride 32 10.5 -> 0.2
    ms, SegFormer's 8x8 stride 8 on 2x16x16x16 730 -> 64 us, its 7x7 stride 4 340 -> 150
    us.  At stride 2 the two are within 10-15% either way (3x3 kernels on large images
    favour the patches, folded small images and 7x7 stems the phase split), and no model
    ran measurably faster with patches there."""
    return strides[0] * strides[1] > 4 and per_image_bytes <= tuning.value("conv.host_cols_bytes")


def conv2d_patches(x, w, b, strides, pads, dilations, O):
    """Y = conv(x, w) + b for 2-D, group 1, float x on the host: per chunk of images
    (columns within conv.host_cols_bytes), the zero-padded input (when there is padding,
    else x itself) is read through one strided view of every window, (image, channel,
    kernel row, kernel column, output row, output column), and copied at once into the
    column matrix, one product per image writes Y; the bias rides in the product as a
    row of ones."""
    N, C, H, W = x.shape
    M, _, kh, kw = w.shape
    (sh, sw), (dh, dw), (Ho, Wo) = strides, dilations, O
    ph, pw = pads[0], pads[1]
    dtype = x.dtype
    Hp, Wp = (Ho - 1) * sh + (kh - 1) * dh + 1, (Wo - 1) * sw + (kw - 1) * dw + 1
    rows, cols_in = max(0, min(Hp, ph + H) - ph), max(0, min(Wp, pw + W) - pw)
    padded = ph or pw or Hp > H or Wp > W
    K = C * kh * kw
    ones = b is not None
    wm = w.reshape(M, K)
    if ones:
        wm = np.concatenate([wm, b.reshape(M, 1).astype(dtype, copy=False)], axis=1)
    P = Ho * Wo
    nb = max(1, min(N, tuning.value("conv.host_cols_bytes") // max(1, (K + ones) * P * dtype.itemsize)))
    cols = np.empty((nb, K + ones, P), dtype)
    if ones:
        cols[:, K] = 1
    pad = np.zeros((nb, C, Hp, Wp), dtype) if padded else None
    y = _output((N, M, Ho, Wo), dtype)
    for n0 in range(0, N, nb):
        n = min(N, n0 + nb) - n0
        src = x[n0:n0 + n]
        if padded:
            if rows and cols_in:
                pad[:n, :, ph:ph + rows, pw:pw + cols_in] = src[:, :, :rows, :cols_in]
            src = pad[:n]
        st = src.strides
        windows = np.lib.stride_tricks.as_strided(
            src, (n, C, kh, kw, Ho, Wo), (st[0], st[1], dh * st[2], dw * st[3], sh * st[2], sw * st[3]),
            writeable=False)
        cols[:n, :K].reshape(n, C, kh, kw, Ho, Wo)[...] = windows
        np.matmul(wm, cols[:n], out=y[n0:n0 + n].reshape(n, M, P))
    return y


def pointwise(x, w, b, strides, O, epilogue=None):
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
    y = _output((N, M) + tuple(O), dtype)
    if b is not None and M * (C + 1) + N * (C + 1) * P < N * M * P:
        cols = np.empty((N, C + 1, P), dtype)
        cols[:, :C].reshape(x.shape)[...] = x
        cols[:, C] = 1
        wm = np.concatenate([wm, b.reshape(M, 1).astype(dtype, copy=False)], axis=1)
        np.matmul(wm, cols, out=y.reshape(N, M, P))
        return finish(y, epilogue)
    np.matmul(wm, x.reshape(N, C, P), out=y.reshape(N, M, P))
    if b is not None:
        y.reshape(N, M, P)[...] += b.reshape(M, 1).astype(dtype, copy=False)
    return finish(y, epilogue)


def trim_taps(x, w, strides, pads, dilations, O):
    """(x, w, pads) without the kernel taps that read only padding, or None when every
    tap reads data for some output (or none does, or w holds an infinity or NaN: the
    reference's 0 * inf = NaN must stay).  Along an axis the taps reading data form one
    range [t0, t1); the input is cropped to the rows the remaining taps read (views) and
    the pads are what is left of the padding on each side, so the output shape is O
    again.  Skipped taps would add exact zeros: the values are the same (up to the sign
    of a zero sum).  DeepLabV3's ASPP branches (3x3, dilation 12 and 18, on 12x12
    planes) become 1x1 convolutions."""
    n_sp = x.ndim - 2
    K = w.shape[2:]
    crops, taps, begin, end = [], [], [], []
    for i in range(n_sp):
        k, d, p, s, o, S = K[i], dilations[i], pads[i], strides[i], O[i], x.shape[2 + i]
        t0 = max(0, -(-(p - (o - 1) * s) // d))  # first tap reading row >= 0 for the last output
        t1 = min(k, (S - 1 + p) // d + 1)         # past the last tap reading row <= S - 1
        if t0 >= t1:
            return None
        start = t0 * d - p
        stop = start + (o - 1) * s + (t1 - 1 - t0) * d + 1
        crops.append(slice(max(start, 0), min(stop, S)))
        taps.append(slice(t0, t1))
        begin.append(max(0, -start))
        end.append(max(0, stop - S))
    if all(t.start == 0 and t.stop == k for t, k in zip(taps, K)) or not np.isfinite(w).all():
        return None
    lead = (slice(None), slice(None))
    return x[lead + tuple(crops)], w[lead + tuple(taps)], begin + end


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
    y = _output((N, M, Ho, Wo), dtype)
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
