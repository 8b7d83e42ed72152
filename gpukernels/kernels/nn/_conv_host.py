"""Host-only (NumPy) 2-D convolution paths, chosen by conv.conv_forward:

* ``pointwise``: 1x1 kernels, one product per image (the bias inside it when cheaper);
* ``conv2d_windows``: column matrix of every window copied at once (per phase) from a
  kept zero-bordered scratch, one product for all small images, one copy into Y
  (with the epilogue); images whose columns fit ``conv.host_cols_bytes``;
* ``conv2d``: column matrix over a phase split of the padded input, in row blocks when
  one image's columns exceed the budget;
* ``conv2d_taps``: no column matrix, one product per kernel tap over wide-row views
  (unit strides, few output channels next to the input's; ``use_tap_products``);

Depthwise convolutions are in _depthwise_host.py.

Each is measured against the others (a 2-core AVX-512 host, later a 2-core AMD EPYC VM);
see their docstrings and host/tuning.py.  Every path takes ``epilogue`` (an activation
fused into the convolution, ``finish``): applied in the path's final copy into Y where
it has one, else as a pass over Y.
"""

from __future__ import annotations

import functools
import math
import threading

import numpy as np

from ...host import host_empty, tuning


# Host (NumPy) 2-D convolution by phase images (conv2d; conv2d_windows too for strides of
# up to 4 phases).  Strides and dilations are removed by a phase split of the zero-padded
# input: along an axis with stride s, tap i reads padded position o*s + i*d = (o + q)*s + r
# with q, r = divmod(i*d, s), i.e. row o + q of phase image r (the padded rows r, r + s,
# ...), so every tap reads a contiguous, stride-1 run of a phase image.
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


def output_array(shape, dtype) -> np.ndarray:
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
    left 1x1 without padding is a pointwise product), then per-tap products when the
    output has few channels next to the input's (no column matrix), else the columns of
    every window copied at once (conv2d_windows) when one image's columns fit the column
    budget, else phase-split columns in row blocks (conv2d).  epilogue: an activation
    applied to the result (see finish)."""
    trimmed = trim_taps(x, w, strides, pads, dilations, O)
    if trimmed is not None:
        x, w, pads = trimmed
        if w.shape[2:] == (1, 1) and not any(pads):
            return pointwise(x, w, b, strides, O, epilogue)
    C, M = x.shape[1], w.shape[0]
    if use_tap_products(C, M, strides, O, w.shape[2:], dilations):
        return conv2d_taps(x, w, b, pads, dilations, O, epilogue)
    wq = O[1] + (w.shape[3] - 1) * dilations[1]  # at most the wide rows' width
    if use_windows(x.dtype.itemsize * (C * w.shape[2] * w.shape[3] + 1 + M) * O[0] * wq):
        return conv2d_windows(x, w, b, strides, pads, dilations, O, epilogue)
    return conv2d(x, w, b, strides, pads, dilations, O, epilogue)


def _use_wide(kw, Wq, Wo, K, M) -> bool:
    """Wide rows when the extra columns cost little and the column copy (K rows per
    pixel) outweighs the crop copy (M per pixel); measured on a 2-core AVX-512 host."""
    return kw > 1 and (Wq - Wo) * 8 <= Wo and K >= 4 * M


def phase_regions(H, W, sh, sw, ph, pw, Hq, Wq):
    """The data of each phase image: (rh, rw, a0, a1, b0, b1, y0, x0) with phase image
    (rh, rw) rows a0:a1, columns b0:b1 read from x rows y0::sh, columns x0::sw (the rest
    of the phase image is padding); phases reading no data are left out."""
    for rh in range(sh):
        a0 = max(0, -(-(ph - rh) // sh))
        a1 = min(Hq, (H - 1 + ph - rh) // sh + 1)
        for rw in range(sw):
            b0 = max(0, -(-(pw - rw) // sw))
            b1 = min(Wq, (W - 1 + pw - rw) // sw + 1)
            if a1 > a0 and b1 > b0:
                yield rh, rw, a0, a1, b0, b1, a0 * sh + rh - ph, b0 * sw + rw - pw


def copy_regions(x, sh, sw, regions, out):
    """out[:, :, rh, rw, a0:a1, b0:b1] = the strided rows and columns of x they hold."""
    for rh, rw, a0, a1, b0, b1, y0, x0 in regions:
        out[:, :, rh, rw, a0:a1, b0:b1] = x[:, :, y0:y0 + (a1 - a0 - 1) * sh + 1:sh,
                                            x0:x0 + (b1 - b0 - 1) * sw + 1:sw]


def _phase_split(x, sh, sw, ph, pw, Hq, Wq, out):
    """out[n, c, rh, rw, a, b] = padded x[n, c, a*sh + rh - ph, b*sw + rw - pw] (zero outside
    x), for a < Hq, b < Wq; out's spare row a = Hq is zeroed (wide reads run into it)."""
    regions = list(phase_regions(x.shape[2], x.shape[3], sh, sw, ph, pw, Hq, Wq))
    data = {(r[0], r[1]): r for r in regions}
    out[:, :, :, :, Hq:] = 0
    for rh in range(sh):
        for rw in range(sw):
            dst = out[:, :, rh, rw, :Hq]
            if (rh, rw) not in data:
                dst[...] = 0
                continue
            _, _, a0, a1, b0, b1, _, _ = data[(rh, rw)]
            dst[:, :, :a0] = 0
            dst[:, :, a1:] = 0
            dst[:, :, a0:a1, :b0] = 0
            dst[:, :, a0:a1, b1:] = 0
    copy_regions(x, sh, sw, regions, out)


def conv2d(x, w, b, strides, pads, dilations, O, epilogue=None):
    """Y = act(conv(x, w) + b) for 2-D, group 1, float x on the host (see the comment
    above); the epilogue is a pass over Y at the end (finish): the product lands in Y
    in row blocks, the bias may be added at the end."""
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
    y = output_array((N, M, Ho, Wo), dtype)
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
    return finish(y, epilogue)


_SCRATCH = threading.local()  # per thread: "planes" (geometry -> zero-bordered phase images), "flat"


def kept_planes(key, shape, dtype) -> np.ndarray:
    """Zero-bordered phase-image scratch for one geometry (key), kept per thread: a call
    writes only the data regions, so the padding stays zero for the next call of that
    geometry.  The most recently used ones are kept, together at most
    conv.host_cols_bytes (a larger one is not kept)."""
    cache = getattr(_SCRATCH, "planes", None)
    if cache is None:
        cache = _SCRATCH.planes = {}
    z = cache.pop(key, None)
    if z is None:
        z = np.zeros(shape, dtype)
        budget = tuning.value("conv.host_cols_bytes")
        if z.nbytes > budget:
            return z
        held = sum(a.nbytes for a in cache.values())
        while cache and held + z.nbytes > budget:
            held -= cache.pop(next(iter(cache))).nbytes
    cache[key] = z  # last: the most recently used
    return z


def scratch_flat(count, dtype) -> np.ndarray:
    """An uninitialised 1-D scratch of count elements, from a per-thread buffer reused
    across calls (grown when a call needs more; the callers keep it within
    conv.host_cols_bytes)."""
    dtype = np.dtype(dtype)
    buf = getattr(_SCRATCH, "flat", None)
    nbytes = count * dtype.itemsize
    if buf is None or buf.nbytes < nbytes:
        buf = _SCRATCH.flat = np.empty(max(nbytes, 1), np.uint8)
    return buf[:nbytes].view(dtype)


def tap_groups(k, s, d):
    """The kernel taps along one axis grouped by the phase they read: (phase r, first tap,
    tap step, tap count, first offset q0, offset step) with tap t reading phase-image
    position o + (t*d)//s for output o."""
    groups = []
    for r in range(s):
        ts = [t for t in range(k) if (t * d) % s == r]
        if ts:
            step = ts[1] - ts[0] if len(ts) > 1 else 1
            groups.append((r, ts[0], step, len(ts), (ts[0] * d) // s, (step * d) // s))
    return groups


def use_windows(per_image_bytes) -> bool:
    """conv2d_windows when one image's columns and product fit the column budget."""
    return per_image_bytes <= tuning.value("conv.host_cols_bytes")


def conv2d_windows(x, w, b, strides, pads, dilations, O, epilogue=None, wide=None, phases=None,
                   fold=None):
    """Y = act(conv(x, w) + b) for 2-D, group 1, float x on the host in few NumPy calls,
    for images whose columns fit the column budget (the caller checks: use_windows).

    Per chunk of images (columns and product within conv.host_cols_bytes): (1) the
    interior of a per-thread zero-bordered scratch is written (kept_planes: kept across
    calls, so the padding is never rewritten) -- the padded images, or with strides of
    up to 4 phases their phase images (phases; one copy per phase); (2) one copy per
    pair of row and column phases (one in all at unit strides or without phase images)
    lays out every tap's windows as the column matrix, rows (channel, kernel row, kernel
    column) in W's own order -- with wide rows (wide; unit strides or phase images) a
    window is one run of Ho * Wq elements (the rows over the phase-image width, cropped
    afterwards), else Ho runs of Wo; (3) one product: small images (fold) share it,
    columns (rows, image, pixels), so BLAS packs the weights once; (4) one copy writes Y
    (transposed to NCHW, cropped, with the epilogue applied on the way).  Exact rows of
    unfolded images need no copy: the product writes Y and the epilogue is a pass over
    it (finish).  The bias rides in the product (a row of ones) when the pixels
    outnumber the weight columns (copying the weights costs less than a pass), else it
    is added to the product in place before the copy, so the epilogue sees the final
    value either way.  The geometry is planned once per shape (_windows_plan); wide,
    phases and fold (None: the tuning entries' choice) force a layout.

    Measured on a 2-core AMD EPYC VM shared with other jobs (OpenBLAS Haswell kernels;
    best of alternating runs, float32, against conv2d with its choices), 1 BLAS thread:
    2x16x24x24 by 16x16x3x3 182 -> 152 us, 2x64x12x12 by 64x64x3x3 413 -> 355 us,
    2x64x12x12 by 128x64x3x3 stride 2 302 -> 228 us, 2x48x8x8 by 48x48x3x3 191 -> 145 us,
    2x128x3x3 by 128x128x3x3 221 -> 192 us, 2x3x96x96 by 32x3x7x7 stride 2 854 -> 764 us;
    equal from 48x48 planes on.  2 BLAS threads (noisier): 2x64x12x12 by 64x64x3x3 600
    -> 457 us, 2x64x6x6 292 -> 205 us, 2x48x8x8 326 -> 217 us, 2x128x8x8 by 256x128x3x3
    stride 2 512 -> 412 us.  Large strides (more than 4 phases: "patchify" embeddings)
    read the windows with the strides, one copy in all; against the former conv2d_patches
    (one strided copy per chunk, fresh zero padding and columns, one product per image),
    1 thread: SegFormer's 7x7 stride 4 on 2x3x64x64 129 -> 118 us, 8x8 stride 8 on
    2x16x16x16 63 -> 53 us, 4x4 stride 4 on 2x32x8x8 49 -> 39 us, ViT's 16x16 stride 16
    on 2x3x32x32 49 -> 42 us, YOLOS' 8x8 stride 8 on 2x3x64x64 119 -> 117 us (2 threads:
    211 -> 195 us)."""
    M = w.shape[0]
    dtype = x.dtype
    p = _windows_plan(x.shape, w.shape, dtype, b is not None, tuple(strides), tuple(pads[:2]),
                      tuple(dilations), tuple(O), wide, phases, fold, tuning.value("conv.host_cols_bytes"),
                      tuning.value("conv.host_wide_cost"), tuning.value("conv.host_phase_pixels"),
                      tuning.value("conv.host_fold_pixels"))
    N, C, kh, kw, Ho, Wo, Wc, L, K, nb = p.N, p.C, p.kh, p.kw, p.Ho, p.Wo, p.Wc, p.L, p.K, p.nb
    fold, direct, Kc = p.fold, p.direct, p.Kc
    wm = w.reshape(M, K)
    if p.ones_row:
        wm = np.concatenate([wm, b.reshape(M, 1).astype(dtype, copy=False)], axis=1)
    z = kept_planes(p.key, p.z_shape, dtype)
    flat = scratch_flat(p.flat, dtype)
    y = output_array((N, M, Ho, Wo), dtype)
    for n0 in range(0, N, nb):
        n = min(N, n0 + nb) - n0
        copy_regions(x[n0:n0 + n], p.ps_h, p.ps_w, p.regions, z[:n])
        if fold:  # rows (channel, kernel row, kernel column), then (image, pixels)
            cc = flat[:Kc * n * L].reshape(Kc, n * L)
            c6 = cc[:K].reshape(C, kh, kw, n, Ho, Wc)
        else:  # (image, rows, pixels), seen as the same 6 axes
            cc = flat[:n * Kc * L].reshape(n, Kc, L)
            c6 = cc[:, :K].reshape(n, C, kh, kw, Ho, Wc).transpose(1, 2, 3, 0, 4, 5)
        for offset, strides6, ni, nj, taps in p.copies:
            c6[taps] = np.ndarray((C, ni, nj, n, Ho, Wc), dtype, z, offset, strides6)
        if p.ones_row:
            cc[K if fold else (slice(None), K)] = 1
        if direct:
            np.matmul(wm, cc, out=y[n0:n0 + n].reshape(n, M, L))
            continue
        res = flat[nb * Kc * L:][:M * n * L]
        if fold:
            np.matmul(wm, cc, out=res.reshape(M, n * L))
            src = res.reshape(M, n, Ho, Wc)[..., :Wo].transpose(1, 0, 2, 3)
        else:
            np.matmul(wm, cc, out=res.reshape(n, M, L))
            src = res.reshape(n, M, Ho, Wc)[..., :Wo]
        if b is not None and not p.ones_row:
            res.reshape((M, n * L) if fold else (n, M, L))[...] += b.reshape(M, 1).astype(dtype, copy=False)
        if epilogue is None:
            y[n0:n0 + n] = src
        else:
            epilogue(src, y[n0:n0 + n])
    if direct:
        if b is not None and not p.ones_row:
            y += b.reshape(M, 1, 1).astype(dtype, copy=False)
        return finish(y, epilogue)
    return y


class _WindowsPlan:
    """conv2d_windows' geometry for one shape (see _windows_plan)."""

    def __init__(self, **fields):
        self.__dict__.update(fields)


@functools.lru_cache(maxsize=512)
def _windows_plan(xs, ws, dtype, bias, strides, pads, dilations, O, wide, phases, fold,
                  cols_bytes, wide_cost, phase_pixels, fold_pixels):
    """The shape-only part of conv2d_windows: tap groups, scratch shapes, the copies'
    offsets and strides, the chunk size (the tuning values are arguments so that an
    override plans anew)."""
    N, C, H, W = xs
    M, _, kh, kw = ws
    (sh, sw), (dh, dw), (Ho, Wo) = strides, dilations, O
    item = dtype.itemsize
    if phases is None:
        # phase images for strides of up to 4 phases when the output is large enough that
        # the contiguous runs they give pay for one more copy per phase
        phases = tuple(strides) != (1, 1) and sh * sw <= 4 and Ho * Wo > phase_pixels
    if fold is None:
        fold = Ho * Wo <= fold_pixels  # small images: the weights packed once
    # per axis: the phase split's stride and the view's stride over outputs
    ps_h, ps_w, vs_h, vs_w = (sh, sw, 1, 1) if phases else (1, 1, sh, sw)
    rows, cols = tap_groups(kh, ps_h, dh), tap_groups(kw, ps_w, dw)
    Hq = (Ho - 1) * vs_h + 1 + max(g[4] + (g[3] - 1) * g[5] for g in rows)
    Wq = (Wo - 1) * vs_w + 1 + max(g[4] + (g[3] - 1) * g[5] for g in cols)
    if vs_h != 1 or vs_w != 1:
        wide = False
    elif wide is None:  # the product's extra columns against Ho copy runs per window
        wide = M * (Wq - Wo) <= wide_cost and 2 * (Wq - Wo) <= Wo
    Wc = Wq if wide else Wo
    L = Ho * Wc
    K = C * kh * kw
    ones_row = bias and K < N * L
    Kc = K + ones_row
    direct = not fold and not wide  # the product lands in Y
    nb = max(1, min(N, cols_bytes // ((Kc + (0 if direct else M)) * L * item)))
    z_shape = (nb, C, ps_h, ps_w, Hq + 1, Wq)
    zs = [item * math.prod(z_shape[i + 1:]) for i in range(len(z_shape))]  # z's strides
    copies = []
    for rh, i0, istep, ni, qh, qhs in rows:
        for rw, j0, jstep, nj, qw, qws in cols:
            # wide rows: a run of Ho * Wq per (channel, tap, image); else Ho runs of Wo
            copies.append((int(rh * zs[2] + rw * zs[3] + (qh * Wq + qw) * item),
                           tuple(int(v) for v in (zs[1], qhs * Wq * item, qws * item, zs[0],
                                                  vs_h * Wq * item, vs_w * item)),
                           ni, nj, (slice(None), slice(i0, i0 + (ni - 1) * istep + 1, istep),
                                    slice(j0, j0 + (nj - 1) * jstep + 1, jstep))))
    return _WindowsPlan(
        N=N, C=C, kh=kh, kw=kw, Ho=Ho, Wo=Wo, Wc=Wc, L=L, K=K, Kc=Kc, nb=nb,
        fold=fold, direct=direct, ones_row=ones_row, ps_h=ps_h, ps_w=ps_w,
        regions=tuple(phase_regions(H, W, ps_h, ps_w, pads[0], pads[1], Hq, Wq)),
        key=(dtype.str, nb, C, ps_h, ps_w, Hq, Wq, H, W, pads[0], pads[1]), z_shape=z_shape,
        copies=tuple(copies), flat=nb * (Kc * L + (0 if direct else M * L)))


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
    y = output_array((N, M) + tuple(O), dtype)
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
    planes) become 1x1 convolutions.  The geometry is planned once per shape
    (_trim_plan); the finiteness of w is checked on every call that trims."""
    plan = _trim_plan(x.shape, w.shape, tuple(strides), tuple(pads), tuple(dilations), tuple(O))
    if plan is None or not np.isfinite(w).all():
        return None
    crops, taps, new_pads = plan
    return x[crops], w[taps], list(new_pads)


@functools.lru_cache(maxsize=1024)
def _trim_plan(xs, ws, strides, pads, dilations, O):
    """trim_taps' shape-only part: (x's crop, w's taps, the pads left) as index tuples,
    or None when nothing is trimmed."""
    n_sp = len(xs) - 2
    K = ws[2:]
    crops, taps, begin, end = [], [], [], []
    for i in range(n_sp):
        k, d, p, s, o, S = K[i], dilations[i], pads[i], strides[i], O[i], xs[2 + i]
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
    if all(t.start == 0 and t.stop == k for t, k in zip(taps, K)):
        return None
    lead = (slice(None), slice(None))
    return lead + tuple(crops), lead + tuple(taps), tuple(begin + end)


def use_tap_products(C, M, strides, O, K, dilations) -> bool:
    """Tap products (conv2d_taps) for unit strides when the output has few channels
    next to the input's (the im2col copy is then most of the cost) and the rows are long
    enough for efficient products; measured on a 2-core AVX-512 host (128 -> 32 channels
    at 56x56: 1.5x faster; 64 -> 64: 10% slower)."""
    wide = O[0] * (O[1] + (K[1] - 1) * dilations[1])
    return tuple(strides) == (1, 1) and wide >= 128 and (2 * M <= C or (M <= 32 and C >= 64))


def conv2d_taps(x, w, b, pads, dilations, O, epilogue=None):
    """Y = conv(x, w) + b for 2-D, group 1, unit strides on the host, without a column
    matrix: the zero-padded planes of an image are laid out with "wide" rows (the padded
    width Wp = Wo + (kw-1)*dw, plus a spare zero row), so the input window of kernel tap
    (i, j) is, for every channel, one contiguous run of Ho * Wp elements at offset
    i*dh*Wp + j*dw -- a (C, Ho*Wp) matrix view with the plane size as its row stride,
    which BLAS reads directly.  Y's wide rows are the sum over taps of W[:, :, i, j] @
    view (one product per tap, accumulated); the columns past Wo are dropped by the copy
    into Y, which also adds the bias (or, with an epilogue, applies it: the bias is
    then added to the accumulator first)."""
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
    y = output_array((N, M, Ho, Wo), dtype)
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
        if epilogue is not None:  # the final value first (the bias into acc), then act
            if bias is not None:
                acc += bias.reshape(M, 1)
            epilogue(res, y[n])
        elif bias is None:
            y[n] = res
        else:
            np.add(res, bias, out=y[n])
    return y
