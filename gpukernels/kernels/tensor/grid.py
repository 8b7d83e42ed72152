"""GridSample (2-D, and N-D from opset 20) and AffineGrid (2-D and 3-D).

GridSample: grid[..., 0] addresses the last spatial axis (x), grid[..., 1] the one before
(y), and so on.  Normalised coordinates become pixel coordinates by
align_corners=1: (g + 1) / 2 * (L - 1);  align_corners=0: ((g + 1) * L - 1) / 2.
'nearest' first rounds half to even.  A coordinate outside [-0.5, L-0.5] ([0, L-1] with
align_corners) is clamped to [0, L-1] ('border') or reflected into that range until
inside ('reflection').  The taps of the kernel (1, 2 or 4 per axis; cubic uses
a = -0.75) then read zeros outside the input ('zeros'), the clamped index ('border') or
the reflected index ('reflection').  Integer outputs of linear/cubic are rounded half to
even and saturated.

The index maps and tap weights are computed once per call, for all channels, with array
operations.  A tap outside the input under 'zeros' padding reads a clamped index with
weight 0.  On the host, linear and cubic modes gather all taps of a block of channels of
one batch entry straight from the channels-first input with one np.take along the
flattened spatial axis (the output points run along the contiguous axis), and one einsum
sums them with their weights into the output rows; work units (groups of batch entries,
or channel blocks of a single entry) go to the host threads as they come free (the
specialisation "GridSample.sample").  The reference (nearest, a GPU) transposes the input
to channels-last once; one gather fetches the channel vectors of every tap of a chunk of
output points, one einsum sums them with their weights, and the result is transposed
back once.
"""

from __future__ import annotations

import threading

import numpy as np

from ... import dtypes
from ...dtypes import DataType
from ...host import tuning
from ...limits import check_allocation
from ...tensor import Tensor
from ...xp import in_namespace
from ...host import host_blocks
from ..base import KernelBase, register
from ..specialize import specialize
from ._common import host_ints, permuted_copy, product, xp_for

_MODE_ALIASES = {"bilinear": "linear", "bicubic": "cubic"}


def _taps(xp, gc, S, mode, padding_mode, align_corners):
    """Tap indices and weights for grid points gc (N, M, r) over spatial shape S.

    Per spatial axis, (T, N, M) tap indices (times the axis stride) and weights are
    combined over the axes by broadcasting: lin, the flat spatial index within a batch
    entry, and weight (None for nearest) have shape (T,) * r + (N, M) (taps leading, so the
    elementwise work runs along the long points axis); valid (nearest with zeros padding,
    else None) marks taps inside the input."""
    N, M, r = gc.shape
    T = 1 if mode == "nearest" else (2 if mode == "linear" else 4)
    lin = xp.zeros((N, 1), dtype=xp.int64)
    weight = None
    valid = None
    for k in range(r):
        L = S[k]
        n = gc[..., r - 1 - k]
        if align_corners:
            c = (n + 1) / 2 * (L - 1)
            lo, hi = 0.0, float(L - 1)
        else:
            c = ((n + 1) * L - 1) / 2
            lo, hi = -0.5, L - 0.5
        if mode == "nearest":
            c = xp.rint(c)
        if padding_mode == "border":
            c = xp.clip(c, 0, L - 1)
        elif padding_mode == "reflection":
            c = _reflect(xp, c, lo, hi)
        if mode == "nearest":
            p, w = xp.trunc(c)[None], None
        else:
            f = xp.floor(c)
            t = c - f
            if mode == "linear":
                p, w = xp.stack([f, f + 1]), xp.stack([1 - t, t])
            else:
                p, w = xp.stack([f - 1, f, f + 1, f + 2]), xp.stack(_cubic_w(xp, t))
        v = None
        if padding_mode == "zeros":
            v = (p >= 0) & (p <= L - 1)
            if w is not None:
                w = xp.where(v, w, 0)
        elif padding_mode == "reflection":
            p = xp.trunc(_reflect(xp, p, lo, hi))
        # a NaN coordinate reads index 0 (under zeros padding with weight 0 / invalid)
        idx = xp.clip(xp.where(xp.isnan(p), 0, p), 0, L - 1).astype(xp.int64) * product(S[k + 1:])
        shape = (1,) * k + (T,) + (1,) * (r - 1 - k) + (N, M)
        lin = lin + idx.reshape(shape)
        if w is not None:
            w = w.reshape(shape)
            weight = w if weight is None else weight * w
        if v is not None and mode == "nearest":
            v = v.reshape(shape)
            valid = v if valid is None else valid & v
    return lin, weight, valid


def _linear_taps_host(gc, S, padding_mode, align_corners):
    """_taps for linear mode with zeros or border padding, all axes at once and in fewer
    array operations (the same values): lin and weight as (N, 2 ** r, M), taps in
    row-major order of the spatial axes (each batch entry's taps contiguous, for one
    gather of all of them)."""
    N, M, r = gc.shape
    # (r, N, M) coordinates, spatial axis k first; L (r, 1, 1) the axis lengths
    c = np.ascontiguousarray(gc[..., ::-1].transpose(2, 0, 1))
    L = np.array(S, dtype=gc.dtype).reshape(r, 1, 1)
    c += 1
    if align_corners:
        c /= 2
        c *= L - 1
    else:
        c *= L
        c -= 1
        c /= 2
    if padding_mode == "border":
        np.clip(c, 0, L - 1, out=c)
    f = np.floor(c)
    # (r, N, 2, M): the lower and upper tap along each axis, their positions and weights
    pos = np.empty((r, N, 2, M), dtype=gc.dtype)
    pos[:, :, 0] = f
    np.add(f, 1, out=pos[:, :, 1])
    w = np.empty((r, N, 2, M), dtype=gc.dtype)
    np.subtract(c, f, out=w[:, :, 1])  # fractional part: weight of the upper tap
    np.subtract(1, w[:, :, 1], out=w[:, :, 0])
    # clamped positions (fmax/fmin: a NaN coordinate reads index 0); a tap is inside when
    # clamping left it alone
    clamped = np.fmax(pos, 0)
    np.fmin(clamped, L[..., None] - 1, out=clamped)
    if padding_mode == "zeros":  # (where, not a product: 0 also for a NaN coordinate)
        w = np.where(clamped == pos, w, 0).astype(w.dtype, copy=False)
    idx = clamped.astype(np.int64)
    for k in range(r - 1):
        idx[k] *= product(S[k + 1:])
    # the taps of all axes by broadcasting, axis 0 slowest; weights multiplied axis 0 first
    lin, weight = idx[0], w[0]
    for k in range(1, r):
        lin = np.add(lin[:, :, None], idx[k][:, None]).reshape(N, -1, M)
        weight = np.multiply(weight[:, :, None], w[k][:, None]).reshape(N, -1, M)
    return lin, weight


def _host_units(units: int, work: int, fn) -> None:
    """fn(u) for u in range(units), the units handed out one at a time to the host threads
    (xp.host_blocks); threads only for work (elements gathered) worth it."""
    host_blocks(units, 1, lambda u, _: fn(u), threads=max(1, work // tuning.value("grid_sample.thread_work")))


@specialize("GridSample.sample", device="cpu", ops=("GridSample",), when=lambda mode: mode != "nearest",
            agreement="rtol 1e-5 (float32): the taps summed by one einsum per channel block")
def _sample_host(src, gc, S, mode, padding_mode, align_corners, out_dtype):
    """Linear/cubic GridSample on the host: out (N, C, M) from src (N, C, P) and grid
    points gc (N, M, r).

    Per batch entry and block of channels, one gather fetches every tap from the
    channels-first planes (np.take along the flat spatial axis of the (K * M,) tap
    indices) into a (channels, K, M) buffer, and one einsum sums the taps with their weights straight into
    the output rows (one pass, the taps added in order).  Work units -- groups of batch
    entries computing their taps together, or for a single entry blocks of channels --
    go to the host threads as they come free."""
    N, C, _ = src.shape
    M = gc.shape[1]
    out = np.empty((N, C, M), dtype=out_dtype)
    K = (2 if mode == "linear" else 4) ** len(S)
    cb = max(1, min(C, tuning.value("grid_sample.host_block_elems") // max(1, K * M)))  # channels per block
    nblk = -(-C // cb)
    work = N * C * M * K

    # the lean linear taps are always in range ('wrap' is then the cheapest check); _taps
    # casts a NaN coordinate's position to an arbitrary integer (weight 0): 'clip' it
    lean = mode == "linear" and padding_mode != "reflection"
    take_mode = "wrap" if lean else "clip"

    def taps(lo, hi):
        """(hi - lo, K, M) tap indices and weights of batch entries lo..hi."""
        if lean:
            return _linear_taps_host(gc[lo:hi], S, padding_mode, align_corners)
        lin, weight, _ = _taps(np, gc[lo:hi], S, mode, padding_mode, align_corners)
        return (lin.reshape(K, hi - lo, M).transpose(1, 0, 2).copy(),
                weight.reshape(K, hi - lo, M).transpose(1, 0, 2))

    local = threading.local()  # one gather buffer per host thread

    def sample(n, lin, weight, b0, b1):
        """Channel blocks b0..b1 of batch entry n, with lin/weight (K, M) of that entry."""
        buf = getattr(local, "buf", None)
        if buf is None:
            buf = local.buf = np.empty(cb * K * M, dtype=out_dtype)
        idx = lin.reshape(-1)
        for b in range(b0, b1):
            c0, c1 = b * cb, min(C, (b + 1) * cb)
            g = buf[:(c1 - c0) * K * M].reshape(c1 - c0, K * M)
            np.take(src[n, c0:c1], idx, axis=1, out=g, mode=take_mode)
            np.einsum("km,ckm->cm", weight, g.reshape(c1 - c0, K, M), out=out[n, c0:c1])

    if N > 1:
        # units: groups of batch entries whose taps are computed together (at least 4 units)
        group = max(1, min(tuning.value("grid_sample.taps_points") // M, N // 4))

        def unit(u):
            g0, g1 = u * group, min(N, (u + 1) * group)
            lin, weight = taps(g0, g1)
            for n in range(g0, g1):
                sample(n, lin[n - g0], weight[n - g0], 0, nblk)

        _host_units(-(-N // group), work, unit)
    else:
        lin, weight = taps(0, 1)
        _host_units(nblk, work, lambda b: sample(0, lin[0], weight[0], b, b + 1))
    return out


def _reflect(xp, x, lo: float, hi: float):
    rng = hi - lo
    if rng <= 0:
        return xp.full_like(x, lo)
    below = x < lo
    above = x > hi
    dx = xp.where(below, lo - x, x - hi)
    n = xp.floor(dx / rng)
    r = dx - n * rng
    even = xp.fmod(n, 2) == 0
    from_below = xp.where(even, lo + r, hi - r)
    from_above = xp.where(even, hi - r, lo + r)
    return xp.where(below, from_below, xp.where(above, from_above, x))


def _cubic_w(xp, t, a: float = -0.75):
    """Weights of taps at floor-1 .. floor+2 for fractional position t."""
    def near(d):
        return ((a + 2) * d - (a + 3)) * d * d + 1

    def far(d):
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


@register()
class GridSample(KernelBase):
    def __call__(self, X, grid, align_corners=0, mode=None, padding_mode="zeros"):
        x = self.tensor(X, "X")
        g = self.tensor(grid, "grid")
        self.check_inputs(x, g)
        named = {"X": x, "grid": g}
        mode = mode.decode() if isinstance(mode, bytes) else (mode or ("bilinear" if self.since_version < 20
                                                                       else "linear"))
        padding_mode = padding_mode.decode() if isinstance(padding_mode, bytes) else str(padding_mode)
        allowed = ("bilinear", "nearest", "bicubic") if self.since_version < 20 else ("linear", "nearest", "cubic")
        if mode not in allowed:
            raise self.error(f"mode must be one of {list(allowed)}, got {mode!r}", **named)
        mode = _MODE_ALIASES.get(mode, mode)
        if padding_mode not in ("zeros", "border", "reflection"):
            raise self.error(f"padding_mode must be zeros, border or reflection, got {padding_mode!r}", **named)
        r = x.ndim - 2
        if r < 1 or (self.since_version < 20 and r != 2):
            raise self.error("X must be 4-D (opset 16) or have rank >= 3 (opset 20+)", **named)
        if g.ndim != r + 2 or g.shape[0] != x.shape[0] or g.shape[-1] != r:
            raise self.error(f"grid must have shape [N, *out_spatial, {r}] matching X's batch", **named)
        info = dtypes.info(x.data_type)
        if mode != "nearest" and info.kind in ("string", "bool"):
            raise self.type_error(f"mode {mode!r} cannot interpolate {dtypes.describe(x.data_type)}", **named)
        xp = xp_for(self, x)
        N, C = x.shape[:2]
        S = x.shape[2:]
        O = g.shape[1:-1]
        out_shape = (N, C) + O
        M = product(O)
        if product(out_shape) == 0 or product(S) == 0:
            fill = np.full(out_shape, "", object) if info.kind == "string" else xp.zeros(out_shape, x.array.dtype)
            return Tensor.wrap(fill, x.data_type)
        gc = self.to_compute(g)
        gc = in_namespace(xp, gc)  # STRING X: host arrays whatever the device
        work = np.float64 if gc.dtype == np.float64 or x.array.dtype in (np.float64, np.complex128) else np.float32
        gc = gc.astype(work).reshape(N, M, r)
        P = product(S)
        T = 1 if mode == "nearest" else (2 if mode == "linear" else 4)
        K = T ** r
        if mode == "nearest" or info.kind not in ("float", "complex"):
            src = x.array if mode == "nearest" else x.array.astype(np.float64)
        else:
            src = self.to_compute(x)
        fast = self.specialized("GridSample.sample", mode)
        if fast is not None:
            res = fast(src.reshape(N, C, P), gc, S, mode, padding_mode, align_corners,
                       np.result_type(src.dtype, work))
            return self._finish(xp, res.reshape(out_shape), info, x.data_type)
        lin, weight, valid = _taps(xp, gc, S, mode, padding_mode, align_corners)
        # (N * M, K): the taps of one output point side by side, as rows of (N * P, C)
        lin = lin + (xp.arange(N, dtype=xp.int64) * P).reshape(N, 1)
        lin = xp.ascontiguousarray(lin.reshape(K, N * M).T)
        # channels-last rows: every tap fetches a whole channel vector with one gather
        xt = permuted_copy(self, xp, src.reshape(N, C, P).transpose(0, 2, 1)).reshape(N * P, C)
        if mode == "nearest":
            acc = xp.take(xt, lin.reshape(-1), axis=0)
            if valid is not None:
                zero = "" if info.kind == "string" else xp.asarray(0, dtype=acc.dtype)
                acc = xp.where(valid.reshape(-1, 1), acc, zero)
            res = permuted_copy(self, xp, acc.reshape(N, M, C).transpose(0, 2, 1)).reshape(out_shape)
        else:
            wk = xp.ascontiguousarray(weight.reshape(K, N * M).T)
            acc = xp.empty((N * M, C), dtype=np.result_type(src.dtype, work))
            rows = max(1, tuning.value("grid_sample.gather_chunk_elems") // (K * C))  # bounded workspace
            for r0 in range(0, N * M, rows):
                g = xp.take(xt, lin[r0:r0 + rows].reshape(-1), axis=0).reshape(-1, K, C)
                # acc[m, c] = sum_k w[m, k] * g[m, k, c]
                acc[r0:r0 + rows] = xp.einsum("mk,mkc->mc", wk[r0:r0 + rows], g)
            res = permuted_copy(self, xp, acc.reshape(N, M, C).transpose(0, 2, 1)).reshape(out_shape)
        if mode == "nearest":
            return Tensor.wrap(res, x.data_type)
        return self._finish(xp, res, info, x.data_type)

    def _finish(self, xp, res, info, data_type):
        """The interpolated values in the output type (integers rounded half to even and
        saturated)."""
        if info.kind in ("int", "uint"):
            lim = np.iinfo(info.storage)
            res = xp.clip(xp.rint(res), lim.min, lim.max).astype(info.storage)
            return Tensor.wrap(res, data_type)
        if info.kind == "complex":
            return Tensor.wrap(res.astype(info.numpy), data_type)
        return self.from_compute(res, data_type)


@register()
class AffineGrid(KernelBase):
    """Sampling grid (N, H, W, 2) or (N, D, H, W, 3) of theta (N, 2, 3) / (N, 3, 4) applied
    to the normalised output coordinates: align_corners=1 spans [-1, 1] corner to corner
    (a size-1 axis gives -1); align_corners=0 uses pixel centres (2i + 1) / L - 1."""

    def __call__(self, theta, size, align_corners=0):
        t = self.tensor(theta, "theta")
        s = self.tensor(size, "size")
        self.check_inputs(t, s)
        named = {"theta": t, "size": s}
        dims = host_ints(self, s, "size")
        if len(dims) not in (4, 5):
            raise self.error(f"size must be [N, C, H, W] or [N, C, D, H, W], got {dims}", **named)
        if any(d < 0 for d in dims):
            raise self.error(f"negative size {dims}", **named)
        r = len(dims) - 2
        N = dims[0]
        if t.shape != (N, r, r + 1):
            raise self.error(f"theta must have shape [{N}, {r}, {r + 1}] for size {dims}", **named)
        xp = self.xp
        th = self.to_compute(t)
        work = th.dtype
        # the grid (N, *spatial, r) and the float64 coordinates (P, r + 1) and mesh
        check_allocation(self, [N] + dims[2:] + [r], work)
        check_allocation(self, dims[2:] + [2 * (r + 1)], np.float64, "coordinate grid")
        axes = []
        for L in dims[2:]:
            i = np.arange(L, dtype=np.float64)
            if align_corners:
                a = np.full(L, -1.0) if L <= 1 else i * 2 / (L - 1) - 1
            else:
                a = (2 * i + 1) / max(L, 1) - 1
            axes.append(a)
        mesh = np.meshgrid(*axes, indexing="ij")  # spatial order (D,) H, W
        coords = [m.reshape(-1) for m in mesh[::-1]]  # x, y(, z)
        base = np.stack(coords + [np.ones_like(coords[0])], axis=1)  # (P, r + 1)
        b = xp.asarray(base.astype(work))
        grid = xp.matmul(b[None], xp.swapaxes(th, 1, 2))  # (N, P, r)
        out = grid.reshape((N,) + tuple(dims[2:]) + (r,))
        return self.from_compute(out, t.data_type)
