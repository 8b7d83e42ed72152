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
from ..tensor.indexing import is_frozen


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


def dense_2d(x, w, b, strides, pads, dilations, O, epilogue=None, memo=None):
    """2-D, one group, float: the taps that read only padding dropped (trim_taps; a kernel
    left 1x1 without padding is a pointwise product), then per-tap products when the
    output has few channels next to the input's (no column matrix), else the columns of
    every window copied at once (conv2d_windows) when one image's columns fit the column
    budget, else phase-split columns in row blocks (conv2d).  epilogue: an activation
    applied to the result (see finish); memo: a ConstantMemo for the node (or None)."""
    trimmed = trim_taps(x, w, strides, pads, dilations, O, memo)
    if trimmed is not None:
        x, w, pads = trimmed
        if w.shape[2:] == (1, 1) and not any(pads):
            return pointwise(x, w, b, strides, O, epilogue, memo)
    C, M = x.shape[1], w.shape[0]
    if use_tap_products(C, M, strides, O, w.shape[2:], dilations):
        return conv2d_taps(x, w, b, pads, dilations, O, epilogue)
    wq = O[1] + (w.shape[3] - 1) * dilations[1]  # at most the wide rows' width
    if use_windows(x.dtype.itemsize * (C * w.shape[2] * w.shape[3] + 1 + M) * O[0] * wq):
        return conv2d_windows(x, w, b, strides, pads, dilations, O, epilogue, memo=memo)
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


def kept_planes(key, shape, dtype, fill=0) -> np.ndarray:
    """Zero-bordered (or fill-bordered) phase-image scratch for one geometry (key), kept
    per thread: a call writes only the data regions, so the padding keeps its value for
    the next call of that geometry.  The most recently used ones are kept, together at
    most conv.host_cols_bytes (a larger one is not kept)."""
    cache = getattr(_SCRATCH, "planes", None)
    if cache is None:
        cache = _SCRATCH.planes = {}
    key = (key, fill) if fill != 0 else key
    z = cache.pop(key, None)
    if z is None:
        z = np.zeros(shape, dtype) if fill == 0 else np.full(shape, fill, dtype)
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


def bounded_scratch(count, dtype) -> np.ndarray:
    """An uninitialised 1-D scratch: the per-thread buffer (scratch_flat) while it stays
    within conv.host_cols_bytes, else a fresh array (not kept)."""
    if count * np.dtype(dtype).itemsize <= tuning.value("conv.host_cols_bytes"):
        return scratch_flat(count, dtype)
    return np.empty(count, dtype)


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
                   fold=None, memo=None, gather=None):
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
    (transposed to NCHW, cropped), adding the bias when it is not in the product
    (add_bias).  Exact rows of unfolded images need no copy: the product writes Y (the
    bias added in place).  The bias rides in the product (a row of ones) when the weights
    with the bias column are kept (constant W and B with a memo: the row costs 1/K of the
    product, against an add in the copy pass: 2x256x3x3 by 256x256x3x3 178 -> 153 us,
    2x64x12x12 by 64 148 -> 132, 2x32x24x24 by 64 stride 2 119 -> 98, best of three
    alternating runs on a 2-vCPU AVX-512 EPYC VM, Relu epilogue), else when the pixels
    outnumber the weight columns (copying the weights costs less than a pass).  The
    epilogue is a pass over the chunk's contiguous elements of Y (finish: the final
    values, in memory order, while in cache; reading the product's transposed layout
    instead runs NumPy's strided, scalar-operand loops, several times slower on small
    images).  The geometry is planned once per shape (_windows_plan); wide, phases and
    fold (None: the tuning entries' choice) force a layout; memo (a ConstantMemo) keeps
    the weights with the bias column and the bias block for constant weights.  Images
    at most _GATHER_MAX_WIDTH wide that fit one folded chunk take their columns (exact
    rows, the ones row included) in one np.take of x by indices planned once (gather;
    None: that choice, unless a layout is forced), instead of the scratch and the
    copies, whose runs of a few elements cost several times more per element.

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
    bias = 0 if b is None else 2 if _kept(memo, w, b) else 1  # 2: the bias column is kept
    p = _windows_plan(x.shape, w.shape, dtype, bias, tuple(strides), tuple(pads[:2]),
                      tuple(dilations), tuple(O), wide, phases, fold, tuning.value("conv.host_cols_bytes"),
                      tuning.value("conv.host_wide_cost"), tuning.value("conv.host_phase_pixels"),
                      tuning.value("conv.host_fold_pixels"), gather)
    N, C, kh, kw, Ho, Wo, Wc, L, K, nb = p.N, p.C, p.kh, p.kw, p.Ho, p.Wo, p.Wc, p.L, p.K, p.nb
    fold, direct, Kc = p.fold, p.direct, p.Kc
    if p.ones_row:
        wm = derived(memo, "weights+bias", w, b, _weights_with_bias(K))
    else:
        wm = w.reshape(M, K)
    flat = scratch_flat(p.flat, dtype)
    y = output_array((N, M, Ho, Wo), dtype)
    if p.gather is not None:
        _gather_columns(x, p.gather, flat[:Kc * N * L])
    else:
        z = kept_planes(p.key, p.z_shape, dtype)
    for n0 in range(0, N, nb):
        n = min(N, n0 + nb) - n0
        if fold:  # rows (channel, kernel row, kernel column), then (image, pixels)
            cc = flat[:Kc * n * L].reshape(Kc, n * L)
        else:  # (image, rows, pixels)
            cc = flat[:n * Kc * L].reshape(n, Kc, L)
        if p.gather is None:
            copy_regions(x[n0:n0 + n], p.ps_h, p.ps_w, p.regions, z[:n])
            # the columns seen as (channel, kernel row, kernel column, image, rows, pixels)
            if fold:
                c6 = cc[:K].reshape(C, kh, kw, n, Ho, Wc)
            else:
                c6 = cc[:, :K].reshape(n, C, kh, kw, Ho, Wc).transpose(1, 2, 3, 0, 4, 5)
            for offset, strides6, ni, nj, taps in p.copies:
                c6[taps] = np.ndarray((C, ni, nj, n, Ho, Wc), dtype, z, offset, strides6)
            if p.ones_row:
                cc[K if fold else (slice(None), K)] = 1
        dst = y[n0:n0 + n]
        if direct:
            np.matmul(wm, cc, out=dst.reshape(n, M, L))
            if b is not None and not p.ones_row:
                add_bias(dst, dst, b, memo, (Ho, Wo))
            finish(dst, epilogue)
            continue
        res = flat[nb * Kc * L:][:M * n * L]
        if fold:
            np.matmul(wm, cc, out=res.reshape(M, n * L))
            src = res.reshape(M, n, Ho, Wc)[..., :Wo].transpose(1, 0, 2, 3)
        else:
            np.matmul(wm, cc, out=res.reshape(n, M, L))
            src = res.reshape(n, M, Ho, Wc)[..., :Wo]
        # one pass from the product's layout into Y (with the bias when it is not in the
        # product); the epilogue then runs on Y's contiguous elements
        if b is not None and not p.ones_row:
            add_bias(dst, src, b, memo, (Ho, Wo))
        else:
            dst[...] = src
        finish(dst, epilogue)
    return y


@functools.lru_cache(maxsize=512)
def _windows_plan(xs, ws, dtype, bias, strides, pads, dilations, O, wide, phases, fold,
                  cols_bytes, wide_cost, phase_pixels, fold_pixels, gather=None):
    """The shape-only part of conv2d_windows: tap groups, scratch shapes, the copies'
    offsets and strides, the chunk size, or the gather's indices (the tuning values are
    arguments so that an override plans anew)."""
    N, C, H, W = xs
    M, _, kh, kw = ws
    (sh, sw), (dh, dw), (Ho, Wo) = strides, dilations, O
    item = dtype.itemsize
    if fold is None:
        fold = Ho * Wo <= fold_pixels  # small images: the weights packed once
    K = C * kh * kw
    if gather is None:  # narrow images, unless a layout is forced
        gather = wide is None and phases is None and Wo <= _GATHER_MAX_WIDTH
    # one folded chunk of exact rows (the columns and the product within the budget), its
    # index (kept with the plan) at most _GATHER_MAX_INDEX entries
    gather = gather and fold and (K + 1 + M) * N * Ho * Wo * item <= cols_bytes \
        and (K + 1) * N * Ho * Wo <= _GATHER_MAX_INDEX
    if gather:
        ones_row = bias and (K < N * Ho * Wo or bias == 2)
        return _Plan(N=N, C=C, kh=kh, kw=kw, Ho=Ho, Wo=Wo, Wc=Wo, L=Ho * Wo, K=K, Kc=K + ones_row, nb=N,
                     fold=True, direct=False, ones_row=ones_row,
                     gather=_gather_index(xs, ws, strides, pads, dilations, O, ones_row),
                     flat=(K + ones_row + M) * N * Ho * Wo)
    if phases is None:
        # phase images for strides of up to 4 phases when the output is large enough that
        # the contiguous runs they give pay for one more copy per phase
        phases = tuple(strides) != (1, 1) and sh * sw <= 4 and Ho * Wo > phase_pixels
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
    ones_row = bias and (K < N * L or bias == 2)
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
    return _Plan(
        N=N, C=C, kh=kh, kw=kw, Ho=Ho, Wo=Wo, Wc=Wc, L=L, K=K, Kc=Kc, nb=nb,
        fold=fold, direct=direct, ones_row=ones_row, ps_h=ps_h, ps_w=ps_w,
        regions=tuple(phase_regions(H, W, ps_h, ps_w, pads[0], pads[1], Hq, Wq)),
        key=(dtype.str, nb, C, ps_h, ps_w, Hq, Wq, H, W, pads[0], pads[1]), z_shape=z_shape,
        copies=tuple(copies), flat=nb * (Kc * L + (0 if direct else M * L)), gather=None)


# conv2d_windows gathers the columns of images at most this wide (when they fit one
# folded chunk): the copies' runs of Wo elements (or wide rows' extra product columns)
# cost more than np.take's ~0.6 ns per element there.  Measured on a 2-core EPYC VM
# (busy), 1 thread, 3x3 kernels with a Relu epilogue, scratch and copies -> gather:
# 2x256x4x4 by 256 channels 774 -> 580 us, 2x128x6x6 by 128 401 -> 352 us, 2x64x6x6 by
# 64 144 -> 137 us, 2x64x12x12 by 128 stride 2 248 -> 201 us; 8 wide is a loss
# (2x128x8x8 by 128 623 -> 627 us, 2x32x8x8 by 32 94 -> 106 us, 2x16x8x8 47 -> 59 us)
_GATHER_MAX_WIDTH = 6
_GATHER_MAX_INDEX = 1 << 18  # 2 MiB of intp indices per plan


def _gather_index(xs, ws, strides, pads, dilations, O, ones_row):
    """The folded column matrix (rows (channel, kernel row, kernel column[, ones]),
    columns (image, output row, output column)) as flat indices into x's elements
    followed by a zero and a one: element (n, c, h, w) at its C-order index, a tap
    reading padding at the zero, the ones row at the one."""
    N, C, H, W = xs
    _, _, kh, kw = ws
    (sh, sw), (dh, dw), (ph, pw), (Ho, Wo) = strides, dilations, pads, O
    h = (np.arange(kh)[:, None] * dh + np.arange(Ho)[None, :] * sh - ph)  # (kh, Ho)
    w = (np.arange(kw)[:, None] * dw + np.arange(Wo)[None, :] * sw - pw)  # (kw, Wo)
    hh = h[None, :, None, None, :, None]  # (c, i, j, n, oh, ow) axes
    ww = w[None, None, :, None, None, :]
    c = np.arange(C)[:, None, None, None, None, None]
    n = np.arange(N)[None, None, None, :, None, None]
    inside = (hh >= 0) & (hh < H) & (ww >= 0) & (ww < W)
    idx = np.where(inside, ((n * C + c) * H + hh) * W + ww, N * C * H * W).astype(np.intp)
    idx = idx.reshape(C * kh * kw, N * Ho * Wo)
    if ones_row:
        idx = np.concatenate([idx, np.full((1, N * Ho * Wo), N * C * H * W + 1, np.intp)])
    idx = idx.reshape(-1)
    idx.flags.writeable = False
    return idx


def _gather_columns(x, index, out):
    """out = the folded column matrix of x by its gather index (_gather_index): x copied
    into a kept per-thread source that ends in a zero and a one, then one take."""
    n = x.size
    src = kept_planes(("gather", x.dtype.str, n), (n + 2,), x.dtype)
    if src[n + 1] != 1:  # a new source (zeros): its one, kept with it
        src[n + 1] = 1
    src[:n].reshape(x.shape)[...] = x
    np.take(src, index, out=out, mode="wrap")  # (every index is in range: wrap checks nothing)


class ConstantMemo:
    """What a Conv node derives from its weights and bias (the weights with the bias as one
    more column, a block of the bias), computed once when both are constants and kept
    for the node: conv.conv_function gives each planned function its own.  Constants are
    frozen arrays (tensor.indexing.is_frozen), passed again as the same objects; any other
    weights or bias are derived again on every call.  One (w, b, value) tuple per kind,
    replaced in one assignment: threads sharing the node never pair an array with
    another array's value."""

    __slots__ = ("_kept",)

    def __init__(self):
        self._kept = {}

    def get(self, kind, w, b, make):
        """make(w, b), kept under kind while w and b (None or an array) are constants."""
        kept = self._kept.get(kind)
        if kept is not None and kept[0] is w and kept[1] is b:
            return kept[2]
        value = make(w, b)
        if self.keeps(w, b):
            self._kept[kind] = (w, b, value)
        return value

    @staticmethod
    def keeps(w, b) -> bool:
        """Whether what is derived from w and b is kept: both constants (b may be None)."""
        return is_frozen(w) and (b is None or is_frozen(b))


def _kept(memo, w, b) -> bool:
    """Whether what memo derives from w and b is kept (both constants, a memo given)."""
    return memo is not None and memo.keeps(w, b)


def derived(memo, kind, w, b, make):
    """make(w, b), through memo (a ConstantMemo: the node's, kept while w and b are
    constants) when there is one, else derived on every call."""
    return make(w, b) if memo is None else memo.get(kind, w, b, make)


def _weights_with_bias(K):
    """make(w, b) for ConstantMemo: the (M, K + 1) weights, the bias as the last column."""
    def make(w, b):
        wm = w.reshape(w.shape[0], K)
        return np.concatenate([wm, b.reshape(-1, 1).astype(wm.dtype, copy=False)], axis=1)
    return make


def _bias_block(shape, dtype):
    """make(w, b) for ConstantMemo: the bias broadcast to shape (M, pixels...), contiguous:
    adding it is a same-shape add, about twice as fast as adding a (M, 1) column to
    short rows (2x64x576 float32: 9.3 against 19.7 us on a 2-core EPYC VM)."""
    def make(w, b):
        return np.ascontiguousarray(np.broadcast_to(
            b.astype(dtype, copy=False).reshape((-1,) + (1,) * (len(shape) - 1)), shape))
    return make


def add_bias(y, src, b, memo, pixels_shape):
    """y = src + b (b along axis 1 of y's (N, M, *pixels) shape; src may be y or a view of
    another layout: the add is also the copy), by a kept bias block for short rows, else
    by the bias column."""
    M = y.shape[1]
    pixels = math.prod(pixels_shape)
    if pixels <= _BLOCK_ROW_PIXELS and M * pixels * y.dtype.itemsize <= _BLOCK_MAX_BYTES:
        block = derived(memo, ("bias", pixels_shape), None, b, _bias_block((M,) + pixels_shape, y.dtype))
        np.add(src, block, out=y)
    else:
        np.add(src, b.astype(y.dtype, copy=False).reshape((M,) + (1,) * len(pixels_shape)), out=y)


# rows of up to this many pixels take the bias block (longer rows: the column, within 10%
# from 2304 pixels on), blocks of up to this many bytes (kept per node)
_BLOCK_ROW_PIXELS = 2304
_BLOCK_MAX_BYTES = 512 << 10


def pointwise(x, w, b, strides, O, epilogue=None, memo=None):
    """Y = act(conv(x, w) + b) for a 1x1 kernel, one group, no padding, on the host: one
    product W (M x C) @ X[n] (C x pixels) per image (one batched matmul), X subsampled by
    the strides.  The bias rides in the product as a row of ones under a copy of X (the
    copy also does the subsampling: a kept per-thread scratch whose ones row is written
    once) when that copy costs less than a pass over Y (fewer input than output
    channels, or strides); else it is added to Y (add_bias); then the epilogue (finish).
    The geometry is planned once per shape (_pointwise_plan); memo (a ConstantMemo)
    keeps the weights with the bias column for constant weights.  Measured on a 2-core
    host (1 thread, float32) 2x8x48x48 -> 48 channels 235 -> 170 us, 2x12x24x24 -> 72
    115 -> 86 us (the ones row against a pass over Y)."""
    p = _pointwise_plan(x.shape, w.shape, x.dtype, b is not None, tuple(strides), tuple(O))
    N, C, M, P = p.N, p.C, p.M, p.P
    dtype = x.dtype
    y = output_array(p.y_shape, dtype)
    y3 = y.reshape(N, M, P)
    if p.ones_row:
        cols = kept_planes(("pointwise", dtype.str, N, C, P), (N, C + 1, P), dtype)
        if cols[0, C, 0] != 1:  # a new scratch: its ones row, kept with it
            cols[:, C] = 1
        cols[:, :C].reshape(p.x_sub_shape)[...] = x[p.sub] if p.sub else x
        wb = derived(memo, "weights+bias", w, b, _weights_with_bias(C))
        np.matmul(wb, cols, out=y3)
        return finish(y, epilogue)
    if p.sub:
        xs = scratch_flat(N * C * P, dtype).reshape(p.x_sub_shape)
        xs[...] = x[p.sub]
        x = xs
    np.matmul(w.reshape(M, C), x.reshape(N, C, P), out=y3)
    if b is not None:
        add_bias(y3, y3, b, memo, (P,))
    return finish(y, epilogue)


class _Plan:
    """Shape-only choices of a host path for one shape (see _pointwise_plan, _windows_plan)."""

    def __init__(self, **fields):
        self.__dict__.update(fields)


@functools.lru_cache(maxsize=512)
def _pointwise_plan(xs, ws, dtype, bias, strides, O):
    """pointwise's geometry: the subsampling index (None when X is read whole: unit
    strides, every row and column an output), the subsampled X's shape, and whether the
    bias rides in the product (a copy of X of N*(C+1)*P and weights of M*(C+1) against a
    pass over Y of N*M*P; with strides the copy is made anyway)."""
    N, C = xs[:2]
    M = ws[0]
    P = math.prod(O)
    # the rows and columns read: o*s for each output o (an axis with one output may come
    # with stride 1, see conv_function, and more input rows than the first)
    strided = any(s != 1 for s in strides) or tuple(xs[2:]) != tuple(O)
    sub = (slice(None), slice(None)) + tuple(slice(None, (o - 1) * s + 1, s) for s, o in zip(strides, O)) \
        if strided else None
    ones_row = bias and (strided or M * (C + 1) + N * (C + 1) * P < N * M * P)
    return _Plan(N=N, C=C, M=M, P=P, sub=sub, ones_row=ones_row, y_shape=(N, M) + tuple(O),
                 x_sub_shape=(N, C) + tuple(O))


def trim_taps(x, w, strides, pads, dilations, O, memo=None):
    """(x, w, pads) without the kernel taps that read only padding, or None when every
    tap reads data for some output (or none does, or w holds an infinity or NaN: the
    reference's 0 * inf = NaN must stay).  Along an axis the taps reading data form one
    range [t0, t1); the input is cropped to the rows the remaining taps read (views) and
    the pads are what is left of the padding on each side, so the output shape is O
    again.  Skipped taps would add exact zeros: the values are the same (up to the sign
    of a zero sum).  DeepLabV3's ASPP branches (3x3, dilation 12 and 18, on 12x12
    planes) become 1x1 convolutions.  The geometry is planned once per shape
    (_trim_plan); the finiteness of w is checked on every call that trims, once for
    constant weights (memo, a ConstantMemo), which also keep their trimmed copy."""
    plan = _trim_plan(x.shape, w.shape, tuple(strides), tuple(pads), tuple(dilations), tuple(O))
    if plan is None:
        return None
    crops, taps, new_pads = plan
    wt = derived(memo, ("trimmed", x.shape), w, None, lambda w, _: _kept_taps(w, taps))
    if wt is None:
        return None
    return x[crops], wt, list(new_pads)


def _kept_taps(w, taps):
    """A read-only contiguous copy of w's taps (frozen: what the paths derive from it can
    be kept too), or None when w holds an infinity or NaN."""
    if not np.isfinite(w).all():
        return None
    wt = np.ascontiguousarray(w[taps])
    wt.flags.writeable = False
    return wt


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
    at 56x56: 1.5x faster; 64 -> 64: 10% slower).  Not for 64 output channels or more on
    planes of fewer than 1024 wide-row pixels, where the nine small products cost more
    than the columns: 3x3 kernels, dilations 1 and 2, against conv2d_windows on a 2-vCPU
    AVX-512 EPYC VM (best of three alternating runs), 128 -> 64 channels at 8x8 to 32x32
    1.05-1.54x slower, 256 -> 64 at 8x8 to 16x16 1.06-1.46x, 256 -> 128 1.12-1.40x;
    with 16-32 output channels the taps stay 0.4-0.9x there."""
    wide = O[0] * (O[1] + (K[1] - 1) * dilations[1])
    return tuple(strides) == (1, 1) and wide >= 128 and (2 * M <= C or (M <= 32 and C >= 64)) \
        and (M <= 32 or wide >= 1024)


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
