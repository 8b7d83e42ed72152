"""Conv: N-D convolution as matrix products.

Paths (all on the array namespace, so they run on NumPy and CuPy alike):

* 1x1 kernels without padding: the input (subsampled by the strides) is already the
  column matrix; one batched matmul per group.
* depthwise (group == C, one input channel per group): a loop over kernel taps, each a
  fused multiply-add of a strided slice, over channel blocks small enough to stay in cache.
* everything else: im2col through a strided window view (no Python loop over pixels),
  copied into a column buffer, then one batched matmul
  (group, M/group, C/group*k) @ (chunk, group, C/group*k, pixels) that lands directly in
  NCHW order.  Workspace: the column buffer is built per chunk -- over the batch, and
  over output rows when one image alone is larger -- of at most 256 MiB on a GPU and
  8 MiB on the CPU (where a cache-sized buffer makes the copy and the matmul faster);
  the zero padding is applied per chunk too (only the rows a chunk reads), so the
  scratch never exceeds the bound plus one padded row block, whatever the input size.

Half types (float16, bfloat16) are computed in float32 and rounded once; double stays
double.  On a GPU the hand-written CUDA kernel (gpukernels.gpu.conv) is tried first.
"""

from __future__ import annotations

import math
import threading

import numpy as np

from ...xp import host_blocks, parallel_ranges
from ..base import KernelBase, register
from . import _spatial as sp

_CACHE_BLOCK_BYTES = 256 * 1024
# output elements per host thread before splitting: high, because waking a second thread
# costs more than it saves for calls of a few milliseconds (measured on a 2-core VM)
_DEPTHWISE_THREAD_ITEMS = 1 << 22


def conv_forward(xp, x, w, b, strides, pads, dilations, group, out_shape=None):
    """Y = conv(x, w) + b on compute arrays; x (N, C, *S), w (M, C/group, *K), b (M,) or
    None; pads = begin..end.  Attributes must be validated already."""
    n_sp = x.ndim - 2
    N, C = x.shape[:2]
    M = w.shape[0]
    K = w.shape[2:]
    S = x.shape[2:]
    pb, pe = pads[:n_sp], pads[n_sp:]
    if out_shape is None:
        out_shape = [(S[i] + pb[i] + pe[i] - (K[i] - 1) * dilations[i] - 1) // strides[i] + 1
                     for i in range(n_sp)]
    O = list(out_shape)
    P = sp.prod(O)
    dtype = x.dtype
    if N == 0 or M == 0 or P == 0:
        y = xp.zeros((N, M, *O), dtype=dtype)
    elif group == C and w.shape[1] == 1 and group > 1:
        if xp is np and n_sp == 2:
            return _depthwise_host_2d(x, w, b, strides, pads, dilations, O)
        return _depthwise(xp, x, w, b, strides, pads, dilations, O)
    elif all(k == 1 for k in K) and not any(pads):
        y = _pointwise(xp, x, w, strides, group, O)
    elif xp is np and n_sp == 2 and group == 1 and x.dtype.kind == "f":
        if _use_tap_products(x.shape[1], M, strides, O, K, dilations):
            return _host_conv2d_taps(x, w, b, pads, dilations, O)
        return _host_conv2d(x, w, b, strides, pads, dilations, O)
    else:
        y = _im2col(xp, x, w, strides, pads, dilations, group, O)
    if b is not None:
        y += b.reshape((1, M) + (1,) * n_sp).astype(dtype, copy=False)
    return y


def _pointwise(xp, x, w, strides, group, O):
    N, C = x.shape[:2]
    M = w.shape[0]
    if any(s != 1 for s in strides):
        x = x[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in strides)]
    cols = x.reshape(N, group, C // group, sp.prod(O))
    wg = w.reshape(group, M // group, C // group)
    if group == 1:
        y = xp.matmul(wg[0], cols[:, 0])
    else:
        y = xp.matmul(wg, cols)
    return y.reshape((N, M) + tuple(O))


def _im2col(xp, x, w, strides, pads, dilations, group, O):
    n_sp = x.ndim - 2
    N, C = x.shape[:2]
    M = w.shape[0]
    K = tuple(w.shape[2:])
    S = x.shape[2:]
    pb = pads[:n_sp]
    Cg, Mg = C // group, M // group
    kk = sp.prod(K)
    wg = w.reshape(group, Mg, Cg * kk)
    item = x.dtype.itemsize
    ek = [(K[i] - 1) * dilations[i] + 1 for i in range(n_sp)]
    per_image = C * kk * sp.prod(O) * item
    target = sp.chunk_target(xp)
    if per_image <= target:
        nb = max(1, target // per_image)
        chunks = [(n0, min(N, n0 + nb), 0, O[0]) for n0 in range(0, N, nb)]
    else:
        rows = sp.row_chunks(O[0], per_image // O[0], target)
        chunks = [(n0, n0 + 1, r0, r1) for n0 in range(N) for r0, r1 in rows]
    single = len(chunks) == 1
    y = None if single else xp.empty((N, M) + tuple(O), dtype=x.dtype)
    for n0, n1, r0, r1 in chunks:
        nr = r1 - r0
        lo = [r0 * strides[0] - pb[0]] + [-pb[i] for i in range(1, n_sp)]
        hi = [(r1 - 1) * strides[0] + ek[0] - pb[0]] + \
             [(O[i] - 1) * strides[i] + ek[i] - pb[i] for i in range(1, n_sp)]
        block = sp.padded_block(xp, x[n0:n1], lo, hi)
        oc = [nr] + list(O[1:])
        st = block.strides
        view = sp.as_strided(
            xp, block,
            (n1 - n0, group, Cg) + K + tuple(oc),
            (st[0], st[1] * Cg, st[1])
            + tuple(st[2 + i] * dilations[i] for i in range(n_sp))
            + tuple(st[2 + i] * strides[i] for i in range(n_sp)))
        cols = view.reshape(n1 - n0, group, Cg * kk, sp.prod(oc))
        if xp is np and not single and nr == O[0]:
            # whole images: the product lands in the output directly (no copy)
            lead = (n1 - n0, M) if group == 1 else (n1 - n0, group, Mg)
            dst = y[n0:n1].reshape(lead + (sp.prod(oc),))
            if group == 1:
                np.matmul(wg[0], cols[:, 0], out=dst)
            else:
                np.matmul(wg, cols, out=dst)
            continue
        if group == 1:
            part = xp.matmul(wg[0], cols[:, 0])
        else:
            part = xp.matmul(wg, cols)
        part = part.reshape((n1 - n0, M) + tuple(oc))
        if single:
            return part
        y[n0:n1, :, r0:r1] = part
    return y


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
_HOST_COLS_BYTES = 8 * 1024 * 1024


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


def _host_conv2d(x, w, b, strides, pads, dilations, O):
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
    if per_image <= _HOST_COLS_BYTES:
        nb = max(1, min(N, _HOST_COLS_BYTES // per_image))
        chunks = [(n0, min(N, n0 + nb), 0, Ho) for n0 in range(0, N, nb)]
        rows = Ho
    else:
        nb = 1
        rows = max(1, _HOST_COLS_BYTES // (Kc * Wc * item))
        chunks = [(n0, n0 + 1, r0, min(Ho, r0 + rows)) for n0 in range(N) for r0 in range(0, Ho, rows)]
    y = np.empty((N, M, Ho, Wo), dtype=dtype)
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


def _use_tap_products(C, M, strides, O, K, dilations) -> bool:
    """Tap products (_host_conv2d_taps) for unit strides when the output has few channels
    next to the input's (the im2col copy is then most of the cost) and the rows are long
    enough for efficient products; measured on a 2-core AVX-512 host (128 -> 32 channels
    at 56x56: 1.5x faster; 64 -> 64: 10% slower)."""
    wide = (O[0]) * (O[1] + (K[1] - 1) * dilations[1])
    return tuple(strides) == (1, 1) and wide >= 128 and (2 * M <= C or (M <= 32 and C >= 64))


def _host_conv2d_taps(x, w, b, pads, dilations, O):
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
    y = np.empty((N, M, Ho, Wo), dtype)
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


def _depthwise(xp, x, w, b, strides, pads, dilations, O):
    """group == C: each output channel c*m + j reads input channel c only.

    A loop over kernel taps; each tap is one multiply and one add over a channel block
    that fits in cache.  When the last axis has stride 1 (and there are >= 2 spatial
    axes) the taps read whole padded rows ("wide" rows of the padded width, cropped at
    the end), so every slice is one long contiguous run instead of short rows.  The bias is
    added to each block while it is in cache; on the host the blocks are spread over the
    host threads (NumPy releases the GIL in its ufuncs)."""
    n_sp = x.ndim - 2
    N, C = x.shape[:2]
    M = w.shape[0]
    m = M // C
    K = tuple(w.shape[2:])
    pb = pads[:n_sp]
    ek = [(K[i] - 1) * dilations[i] + 1 for i in range(n_sp)]
    y = xp.empty((N, C, m) + tuple(O), dtype=x.dtype)
    wv = w.reshape(C, m, sp.prod(K))
    lo = [-pb[i] for i in range(n_sp)]
    hi = [(O[i] - 1) * strides[i] + ek[i] - pb[i] for i in range(n_sp)]
    wide = n_sp >= 2 and strides[-1] == 1
    if wide:
        hi[-2] += 1  # one spare row: the wide rows of the last tap run into it
        Lw = hi[-1] - lo[-1]
        acc_shape = tuple(O[:-1]) + (Lw,)
    else:
        acc_shape = tuple(O)
    per_channel = max(1, N * sp.prod(acc_shape) * x.dtype.itemsize)
    cb = max(1, min(C, _CACHE_BLOCK_BYTES // per_channel))
    tap_list = sp.taps(K)
    item = x.dtype.itemsize

    def run_block(c0):
        c1 = min(C, c0 + cb)
        block = sp.padded_block(xp, x[:, c0:c1], lo, hi)
        if wide:
            block = xp.ascontiguousarray(block)
        acc = xp.empty((N, c1 - c0) + acc_shape, dtype=x.dtype)
        tmp = xp.empty_like(acc)
        st = block.strides
        # one view holding every tap: (N, cb, *K, *acc_shape)
        if wide:
            inner = tuple(st[2 + i] * strides[i] for i in range(n_sp - 1)) + (item,)
        else:
            inner = tuple(st[2 + i] * strides[i] for i in range(n_sp))
        windows = sp.as_strided(xp, block, (N, c1 - c0) + K + acc_shape,
                                st[:2] + tuple(st[2 + i] * dilations[i] for i in range(n_sp)) + inner)
        for j in range(m):
            for t_index, tap in enumerate(tap_list):
                sl = windows[(slice(None), slice(None)) + tap]
                wt = wv[c0:c1, j, t_index].reshape((1, c1 - c0) + (1,) * n_sp)
                if t_index == 0:
                    xp.multiply(sl, wt, out=acc)
                else:
                    xp.multiply(sl, wt, out=tmp)
                    xp.add(acc, tmp, out=acc)
            dst = y[:, c0:c1, j]
            dst[...] = acc[..., :O[-1]] if wide else acc
            if bias is not None:
                dst += bias[c0:c1, j].reshape((1, c1 - c0) + (1,) * n_sp)

    bias = None if b is None else b.reshape(C, m).astype(x.dtype, copy=False)
    starts = list(range(0, C, cb))
    if xp is np:
        per_block = max(1, N * cb * m * sp.prod(O))
        parallel_ranges(len(starts), max(1, -(-_DEPTHWISE_THREAD_ITEMS // per_block)),
                        lambda first, last: [run_block(c0) for c0 in starts[first:last]])
    else:
        for c0 in starts:
            run_block(c0)
    return y.reshape((N, M) + tuple(O))


# host depthwise: the tap copies of one channel block (512 KiB: 5-15% faster than 1 MiB)
_DEPTHWISE_TAPS_BYTES = 1 << 19


def _depthwise_host_2d(x, w, b, strides, pads, dilations, O):
    """Depthwise 2-D convolution on the host.

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
    Hp = (Ho - 1) * sh + (kh - 1) * dh + 1
    Wp = (Wo - 1) * sw + (kw - 1) * dw + 1
    Wc = Wp if sw == 1 else Wo  # columns per window row: wide rows, or the exact outputs
    L = Ho * Wc
    dtype = x.dtype
    item = dtype.itemsize
    # padded rows/columns holding input data (pads may exceed what the output reads)
    rows, cols = max(0, min(Hp, ph + H) - ph), max(0, min(Wp, pw + W) - pw)
    cb = max(1, min(C, _DEPTHWISE_TAPS_BYTES // max(1, T * L * item)))
    nblk = -(-C // cb)
    wv = w.reshape(C, m, T)
    bias = None if b is None else b.reshape(C, m, 1, 1).astype(dtype, copy=False)
    y = np.empty((N, C, m, Ho, Wo), dtype=dtype)
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
    threads = 2 if N * C * m * Ho * Wo >= _DEPTHWISE_THREAD_ITEMS else 1
    host_blocks(units, 1, lambda u0, u1: [unit(u) for u in range(u0, u1)], threads=threads)
    return y.reshape((N, C * m, Ho, Wo))


def check_conv_ranks(kernel, x, w, group, w_name="W") -> tuple[int, int]:
    """Check X is N x C x D1... with W of the same rank and group >= 1; returns
    (spatial rank, group)."""
    tensors = {"X": x, w_name: w}
    if x.ndim < 3:
        raise kernel.error("X must have rank >= 3 (N x C x D1 ...)", **tensors)
    if w.ndim != x.ndim:
        raise kernel.error(f"{w_name} must have the rank of X ({x.ndim}), got {w.ndim}", **tensors)
    group = int(group)
    if group < 1:
        raise kernel.error(f"group must be >= 1, got {group}", **tensors)
    return x.ndim - 2, group


def conv_attributes(kernel, x, w, kernel_shape, strides, dilations, pads, auto_pad, group,
                    w_name="W"):
    """Validate Conv-style inputs and attributes; returns (strides, pads, dilations,
    out_shape) with pads resolved (begin..end)."""
    tensors = {"X": x, w_name: w}
    n_sp, group = check_conv_ranks(kernel, x, w, group, w_name)
    C = x.shape[1]
    M = w.shape[0]
    if w.shape[1] * group != C:
        raise kernel.error(f"channel mismatch: X has {C} channels but {w_name}.shape[1] * group = "
                           f"{w.shape[1]} * {group} = {w.shape[1] * group}", **tensors)
    if M % group:
        raise kernel.error(f"the number of output channels ({M}) is not a multiple of group ({group})",
                           **tensors)
    K = list(w.shape[2:])
    if kernel_shape is not None and len(kernel_shape):
        if [int(k) for k in kernel_shape] != K:
            raise kernel.error(f"kernel_shape {list(kernel_shape)} does not match the weight's spatial "
                               f"shape {K}", **tensors)
    strides = sp.int_list(kernel, "strides", strides, n_sp, 1, minimum=1, **tensors)
    dilations = sp.int_list(kernel, "dilations", dilations, n_sp, 1, minimum=1, **tensors)
    S = list(x.shape[2:])
    pads = sp.resolve_pads(kernel, auto_pad, pads, S, K, strides, dilations, **tensors)
    out = sp.conv_output_shape(kernel, S, K, strides, dilations, pads, **tensors)
    return strides, pads, dilations, out


@register()
class Conv(KernelBase):
    """ONNX Conv (opsets 1, 11, 22): 1-D, 2-D, 3-D and higher; strides, pads,
    dilations, groups, every auto_pad mode.  Explicit pads combined with a SAME/VALID
    auto_pad are rejected unless all zero."""

    def __call__(self, X, W, B=None, auto_pad="NOTSET", dilations=None, group=1,
                 kernel_shape=None, pads=None, strides=None):
        x = self.tensor(X, "X")
        w = self.tensor(W, "W")
        b = self.tensor(B, "B", optional=True)
        self.check_inputs(x, w, b)
        strides, pads, dilations, out = conv_attributes(
            self, x, w, kernel_shape, strides, dilations, pads, auto_pad, group)
        M = w.shape[0]
        if not b.is_absent and tuple(b.shape) != (M,):
            raise self.error(f"B must have shape ({M},), got {list(b.shape)}", X=x, W=w, B=b)
        fast = self.cuda_path(X=x, W=w, B=None if b.is_absent else b, strides=strides,
                              pads=pads, dilations=dilations, group=int(group))
        if fast is not None:
            return fast
        xc = self.to_compute(x)
        wc = self.to_compute(w, xc.dtype)
        bc = None if b.is_absent else self.to_compute(b, xc.dtype)
        y = conv_forward(self.xp, xc, wc, bc, strides, pads, dilations, int(group), out)
        return self.from_compute(y, x.data_type)
