"""Pooling: AveragePool, MaxPool (with Indices), LpPool, MaxUnpool, MaxRoiPool and the
global pools.

Windows are strided slices of a padded block (one slice per kernel tap, a loop over
taps vectorised over every pixel); the batch and channel axes are fused and processed in
chunks that stay in cache on the CPU (and under 256 MiB anywhere).  On the host, MaxPool
(Y only) and AveragePool take the specialisation "Pool.windows" instead (_pool_host.py):
one axis at a time with strided views of the unpadded block taken at the output
positions; the same maxima, the same sums in another order.

Output sizes follow the ONNX text: explicit pads use floor (or ceil with ceil_mode) of
(in + pads - ((k - 1) * dilation + 1)) / stride + 1, and with ceil_mode a last window
that would start in the end padding is dropped; SAME_* gives ceil(in / stride) with the
total padding split evenly (odd pixel at the end for SAME_UPPER, at the beginning for
SAME_LOWER); VALID gives floor((in - ((k - 1) * dilation + 1)) / stride) + 1.

AveragePool divides by the number of window elements inside the input
(count_include_pad=0) or inside the padded input (count_include_pad=1; positions a
ceil_mode window adds past the end padding are never counted).  MaxPool's Indices are
flat indices into the whole input (n, c included), row-major over the spatial axes for
storage_order=0 and column-major for storage_order=1; the first maximum in row-major
tap order wins, padding never wins, and a NaN is returned only when it is the first
value of its window.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ...dtypes import DataType
from ...errors import GpuKernelsError
from ...host import tuning
from ...limits import check_allocation
from ...tensor import Tensor
from ...xp import is_host_namespace
from ..base import KernelBase, register
from ..math.reductions import FLOAT_TYPES, sum_rows
from . import _pool_host  # noqa: F401 -- registers the specialisation "Pool.windows"
from . import _spatial as sp

# ------------------------------------------------------------------ geometry


class Geometry(NamedTuple):
    kernel: list
    strides: list
    dilations: list
    pads: list  # begin..end (explicit or resolved)
    out: list


def pool_geometry(kernel, x, kernel_shape, strides, pads, auto_pad, dilations=None, ceil_mode=0):
    if x.ndim < 3:
        raise kernel.error("X must have rank >= 3 (N x C x D1 ...)", X=x)
    n_sp = x.ndim - 2
    if kernel_shape is None or len(kernel_shape) == 0:
        raise kernel.error("attribute 'kernel_shape' is required", X=x)
    K = sp.int_list(kernel, "kernel_shape", kernel_shape, n_sp, 1, minimum=1, X=x)
    strides = sp.int_list(kernel, "strides", strides, n_sp, 1, minimum=1, X=x)
    dilations = sp.int_list(kernel, "dilations", dilations, n_sp, 1, minimum=1, X=x)
    S = list(x.shape[2:])
    mode = sp.auto_pad_name(kernel, auto_pad, X=x)
    ek = [(K[i] - 1) * dilations[i] + 1 for i in range(n_sp)]
    given = sp.explicit_pads(kernel, pads, n_sp, X=x)
    out = []
    if mode == "NOTSET":
        pads = given
        for i in range(n_sp):
            span = S[i] + pads[i] + pads[i + n_sp] - ek[i]
            if span < 0:
                raise kernel.error(f"the kernel (extent {ek[i]}) is larger than the padded input "
                                   f"({S[i] + pads[i] + pads[i + n_sp]}) along spatial axis {i}", X=x)
            o = (-(-span // strides[i]) if ceil_mode else span // strides[i]) + 1
            if ceil_mode and (o - 1) * strides[i] >= S[i] + pads[i]:
                o -= 1
            out.append(o)
    else:
        if any(given):
            raise kernel.error(f"attribute 'pads' {given} cannot be combined with auto_pad={mode}", X=x)
        if mode == "VALID":
            pads = [0] * (2 * n_sp)
            for i in range(n_sp):
                if S[i] < ek[i]:
                    raise kernel.error(f"the kernel (extent {ek[i]}) is larger than the input "
                                       f"({S[i]}) along spatial axis {i}", X=x)
                out.append((S[i] - ek[i]) // strides[i] + 1)
        else:
            pads = sp.resolve_pads(kernel, mode, None, S, K, strides, dilations, X=x)
            out = [-(-S[i] // strides[i]) for i in range(n_sp)]
    # the output and the padded input some paths build, before either exists
    itemsize = max(x.array.dtype.itemsize, 4)
    check_allocation(kernel, list(x.shape[:2]) + out, itemsize)
    check_allocation(kernel, list(x.shape[:2]) + [S[i] + pads[i] + pads[i + n_sp] for i in range(n_sp)],
                     itemsize, "padded input")
    return Geometry(K, strides, dilations, pads, out)


def _window_counts(geo, S, include_pad):
    """Per-axis number of taps of each output window that fall inside the input
    (or inside the explicitly padded input)."""
    n_sp = len(S)
    counts = []
    for i in range(n_sp):
        o = np.arange(geo.out[i])[:, None]
        k = np.arange(geo.kernel[i])[None, :]
        pos = o * geo.strides[i] - geo.pads[i] + k * geo.dilations[i]
        lo, hi = (-geo.pads[i], S[i] + geo.pads[i + n_sp]) if include_pad else (0, S[i])
        counts.append(((pos >= lo) & (pos < hi)).sum(axis=1))
    return counts


def _outer(xp, vectors, dtype):
    """Outer product of per-axis vectors as an array of shape (len(v0), len(v1), ...)."""
    res = np.ones((), dtype=np.float64)
    for v in vectors:
        res = np.multiply.outer(res, np.asarray(v, dtype=np.float64))
    return xp.asarray(res.astype(dtype))


def _blocks(xp, x2, geo, fill):
    """Yield (a, b, block) over chunks of the fused N*C axis; block covers every window."""
    n_sp = x2.ndim - 1
    NC = x2.shape[0]
    lo = [-geo.pads[i] for i in range(n_sp)]
    hi = [lo[i] + (geo.out[i] - 1) * geo.strides[i] + (geo.kernel[i] - 1) * geo.dilations[i] + 1
          for i in range(n_sp)]
    per = max(1, sp.prod([h - l for h, l in zip(hi, lo)]) * x2.dtype.itemsize)
    # padded input per block: cache-sized on the host, the whole workspace on a GPU
    budget = tuning.value("pool.host_window_block_bytes") if is_host_namespace(xp) else sp.workspace_bytes()
    step = max(1, budget // per)
    for a in range(0, NC, step):
        b = min(NC, a + step)
        yield a, b, sp.padded_block(xp, x2[a:b], lo, hi, fill)


def _tap_view(block, geo, tap):
    n_sp = block.ndim - 1
    return block[(slice(None),) + sp.tap_slices([tap[i] * geo.dilations[i] for i in range(n_sp)],
                                                geo.strides, geo.out)]


def pool_reduce(kernel, x, geo, kind, p=2.0, include_pad=False):
    """kind 'max' | 'avg' | 'lp' over (N, C, *S) compute array x."""
    xp = kernel.xp
    N, C = x.shape[:2]
    S = x.shape[2:]
    n_sp = len(S)
    if N * C == 0 or sp.prod(geo.out) == 0:
        return xp.empty((N, C) + tuple(geo.out), dtype=x.dtype)
    x2 = x.reshape((N * C,) + tuple(S))
    if kind == "max":
        fill = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    else:
        fill = 0
    fast = kernel.specialized("Pool.windows", x2, geo, kind)
    if fast is not None:
        out = fast(x2, geo, kind, fill)
    else:
        out = xp.empty((N * C,) + tuple(geo.out), dtype=x.dtype)
    for a, b, block in (() if fast is not None else _blocks(xp, x2, geo, fill)):
        if kind == "lp":
            block = xp.abs(block) if p == 1 else (block * block if p == 2 else xp.power(xp.abs(block), p))
        # box windows are separable: reduce one spatial axis at a time
        cur = block
        for d in range(n_sp):
            last = d == n_sp - 1
            lead = (slice(None),) * (1 + d)
            acc = None
            for k in range(geo.kernel[d]):
                start = k * geo.dilations[d]
                sl = cur[lead + (slice(start, start + geo.strides[d] * (geo.out[d] - 1) + 1, geo.strides[d]),)]
                if acc is None:
                    acc = out[a:b] if last else xp.empty(sl.shape, dtype=x.dtype)
                    acc[...] = sl
                elif kind == "max":
                    xp.maximum(acc, sl, out=acc)
                else:
                    xp.add(acc, sl, out=acc)
            cur = acc
    if kind == "avg":
        counts = _window_counts(geo, S, include_pad)
        div = _outer(xp, counts, x.dtype)
        with np.errstate(invalid="ignore", divide="ignore"):
            out /= div
    elif kind == "lp":
        if p == 2:
            xp.sqrt(out, out=out)
        elif p != 1:
            xp.power(out, 1.0 / p, out=out)
    return out.reshape((N, C) + tuple(geo.out))


def max_pool_with_indices(xp, x, geo, storage_order):
    N, C = x.shape[:2]
    S = x.shape[2:]
    n_sp = len(S)
    O = tuple(geo.out)
    y = xp.empty((N * C,) + O, dtype=x.dtype)
    idx = xp.empty((N * C,) + O, dtype=np.int64)
    if N * C == 0 or sp.prod(O) == 0:
        return y.reshape((N, C) + O), idx.reshape((N, C) + O)
    if storage_order:
        flat_st = [sp.prod(S[:d]) for d in range(n_sp)]
    else:
        flat_st = [sp.prod(S[d + 1:]) for d in range(n_sp)]
    # per-axis starting positions of the windows, on the host
    starts = [np.arange(O[d]) * geo.strides[d] - geo.pads[d] for d in range(n_sp)]
    base = np.zeros(O, dtype=np.int64)
    for d in range(n_sp):
        shape = [1] * n_sp
        shape[d] = O[d]
        base = base + (starts[d] * flat_st[d]).reshape(shape)
    taps = sp.taps(geo.kernel)
    tap_info = []
    for tap in taps:
        off = sum(tap[d] * geo.dilations[d] * flat_st[d] for d in range(n_sp))
        valid = np.ones(O, dtype=bool)
        for d in range(n_sp):
            pos = starts[d] + tap[d] * geo.dilations[d]
            shape = [1] * n_sp
            shape[d] = O[d]
            valid = valid & ((pos >= 0) & (pos < S[d])).reshape(shape)
        tap_info.append((off, None if valid.all() else xp.asarray(valid)))
    base = xp.asarray(base)
    x2 = x.reshape((N * C,) + tuple(S))
    spatial = sp.prod(S)
    for a, b, block in _blocks(xp, x2, geo, 0):
        acc = y[a:b]
        best = idx[a:b]
        have = None
        for t, tap in enumerate(taps):
            sl = _tap_view(block, geo, tap)
            off, valid = tap_info[t]
            if have is None:
                if valid is None:
                    acc[...] = sl
                    best[...] = base + off
                    have = True
                    continue
                acc[...] = sl
                best[...] = base + off
                have = xp.broadcast_to(valid, acc.shape).copy()
                continue
            better = sl > acc
            if have is not True:
                better = (better | ~have)
            if valid is not None:
                better &= valid
            xp.copyto(acc, sl, where=better)
            xp.copyto(best, base + off, where=better)
            if have is not True:
                have |= better
        nc = xp.arange(a, b, dtype=np.int64).reshape((b - a,) + (1,) * n_sp)
        best += nc * spatial
    return y.reshape((N, C) + O), idx.reshape((N, C) + O)


def _pool_array_function(kernel, inputs, attrs, kind):
    """Compiled graphs: Y of MaxPool (kind 'max') or AveragePool ('avg') of one natively
    computed float input, the attributes checked and the geometry computed once for the
    recorded shape (pool_geometry and the call's checks: some 20 us a node); the same
    pool_reduce as the kernel.  None otherwise, or when the attributes are invalid (the
    kernel then runs and raises).  An input of another shape raises, which sends the
    node back to the kernel."""
    from ..math.arith import native_compute

    if len(inputs) != 1 or not native_compute(inputs) or inputs[0].array.dtype.kind != "f":
        return None
    if kind == "max" and attrs.get("storage_order", 0) not in (0, 1, None):
        return None
    x = inputs[0]
    try:
        geo = pool_geometry(kernel, x, attrs.get("kernel_shape"), attrs.get("strides"), attrs.get("pads"),
                            attrs.get("auto_pad", "NOTSET"), attrs.get("dilations"), attrs.get("ceil_mode", 0) or 0)
    except GpuKernelsError:
        return None
    include_pad = bool(attrs.get("count_include_pad", 0))
    shape, op = x.shape, kernel.op_type

    def pool(a):
        if a.shape != shape:
            raise ValueError(f"{op}: input shape {a.shape} is not the compiled {shape}")
        return pool_reduce(kernel, a, geo, kind, include_pad=include_pad)

    return pool


# ------------------------------------------------------------------ kernels


@register()
class AveragePool(KernelBase):
    """ONNX AveragePool (opsets 1, 7, 10, 11, 19, 22)."""

    def __call__(self, X, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None,
                 kernel_shape=None, pads=None, strides=None):
        x = self.tensor(X, "X")
        self.check_inputs(x)
        geo = pool_geometry(self, x, kernel_shape, strides, pads, auto_pad, dilations, ceil_mode)
        y = pool_reduce(self, self.to_compute(x), geo, "avg", include_pad=bool(count_include_pad))
        return self.from_compute(y, x.data_type)

    def array_function(self, inputs, attrs):
        return _pool_array_function(self, inputs, attrs, "avg")


@register()
class LpPool(KernelBase):
    """ONNX LpPool (opsets 1, 2, 11, 18, 22): (sum |x|^p)^(1/p) over each window;
    padding contributes zero."""

    def __call__(self, X, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None, p=2,
                 pads=None, strides=None):
        x = self.tensor(X, "X")
        self.check_inputs(x)
        if p is None or float(p) <= 0:
            raise self.error(f"p must be positive, got {p}", X=x)
        geo = pool_geometry(self, x, kernel_shape, strides, pads, auto_pad, dilations, ceil_mode)
        y = pool_reduce(self, self.to_compute(x), geo, "lp", p=float(p))
        return self.from_compute(y, x.data_type)


@register()
class MaxPool(KernelBase):
    """ONNX MaxPool (opsets 1, 8, 10, 11, 12, 22), with the Indices output from opset 8
    and int8/uint8 from opset 12.

    ``__call__`` computes Indices only when the caller declares output 1
    (``requested_outputs``, which the runtime sets for nodes with several outputs);
    otherwise Result.Indices is None.  ``with_indices`` always returns both."""

    class Result(NamedTuple):
        Y: Tensor
        Indices: Tensor | None

    def __call__(self, X, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None, pads=None,
                 storage_order=0, strides=None):
        x = self.tensor(X, "X")
        self.check_inputs(x)
        r = self.requested_outputs
        want_indices = self.since_version >= 8 and r is not None and len(r) > 1 and bool(r[1])
        return self._run(x, want_indices, auto_pad=auto_pad, ceil_mode=ceil_mode, dilations=dilations,
                         kernel_shape=kernel_shape, pads=pads, storage_order=storage_order, strides=strides)

    def with_indices(self, X, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None,
                     pads=None, storage_order=0, strides=None) -> "MaxPool.Result":
        """Y and Indices, whatever the caller's requested outputs."""
        x = self.tensor(X, "X")
        self.check_inputs(x)
        return self._run(x, True, auto_pad=auto_pad, ceil_mode=ceil_mode, dilations=dilations,
                         kernel_shape=kernel_shape, pads=pads, storage_order=storage_order, strides=strides)

    def _run(self, x, want_indices, auto_pad, ceil_mode, dilations, kernel_shape, pads, storage_order,
             strides):
        if int(storage_order) not in (0, 1):
            raise self.error(f"storage_order must be 0 or 1, got {storage_order}", X=x)
        geo = pool_geometry(self, x, kernel_shape, strides, pads, auto_pad, dilations, ceil_mode)
        xc = self.to_compute(x)
        if want_indices:
            y, idx = max_pool_with_indices(self.xp, xc, geo, int(storage_order))
            return self.Result(self.from_compute(y, x.data_type), self.result(idx, DataType.INT64))
        y = self.from_compute(pool_reduce(self, xc, geo, "max"), x.data_type)
        if self.since_version < 8:
            return y
        return self.Result(y, None)

    def array_function(self, inputs, attrs):
        """Y only (a node that also outputs Indices gets a single array and runs the
        kernel instead)."""
        return _pool_array_function(self, inputs, attrs, "max")


@register()
class MaxUnpool(KernelBase):
    """ONNX MaxUnpool (opsets 9, 11, 22): unpooled.flat[I] = X, zeros elsewhere, where the
    unpooled spatial size is (in - 1) * stride + kernel - pads_begin - pads_end and the
    indices are flat positions in that unpadded tensor (N and C included), as the spec
    says ("the linear indices should not consider padding").

    output_shape (full (N, C, ...) or spatial only) replaces the pads: the spec says pads
    are then auto-generated, and its official example places the unpooled tensor at the
    start of each axis with the extra rows/columns after it, which is what we do (ORT
    instead reads the indices as positions in output_shape).  An output_shape smaller
    than the unpooled size raises.  Indices must lie in [0, prod(unpooled shape)); for
    repeated indices the last one in row-major order wins."""

    def __call__(self, X, I, output_shape=None, kernel_shape=None, pads=None, strides=None):
        x = self.tensor(X, "X")
        i = self.tensor(I, "I")
        osh = self.tensor(output_shape, "output_shape", optional=True)
        self.check_inputs(x, i, osh)
        if x.ndim < 3:
            raise self.error("X must have rank >= 3 (N x C x D1 ...)", X=x, I=i)
        if tuple(i.shape) != tuple(x.shape):
            raise self.error("I must have the shape of X", X=x, I=i)
        n_sp = x.ndim - 2
        if kernel_shape is None or len(kernel_shape) == 0:
            raise self.error("attribute 'kernel_shape' is required", X=x)
        K = sp.int_list(self, "kernel_shape", kernel_shape, n_sp, 1, minimum=1, X=x)
        strides = sp.int_list(self, "strides", strides, n_sp, 1, minimum=1, X=x)
        pads = sp.explicit_pads(self, pads, n_sp, X=x)
        final_shape = None
        if not osh.is_absent:
            final_shape = [int(v) for v in np.asarray(osh.numpy()).reshape(-1)]
            if len(final_shape) == n_sp:
                final_shape = list(x.shape[:2]) + final_shape
            if len(final_shape) != x.ndim or final_shape[:2] != list(x.shape[:2]) or any(v < 0 for v in final_shape):
                raise self.error(f"output_shape {final_shape} must be [N, C, ...] of rank {x.ndim} with "
                                 f"N, C = {list(x.shape[:2])}", X=x, output_shape=osh)
            pads = [0] * (2 * n_sp)  # replaced by the auto-generated padding
        spatial = [(x.shape[2 + d] - 1) * strides[d] + K[d] - pads[d] - pads[d + n_sp]
                   for d in range(n_sp)]
        if any(v < 0 for v in spatial):
            raise self.error(f"pads {pads} leave a negative output size {spatial}", X=x)
        shape = list(x.shape[:2]) + spatial
        if final_shape is not None and any(f < u for f, u in zip(final_shape[2:], spatial)):
            raise self.error(f"output_shape {final_shape} is smaller than the unpooled size {shape}",
                             X=x, output_shape=osh)
        check_allocation(self, shape, x.array.dtype)
        if final_shape is not None:
            check_allocation(self, final_shape, x.array.dtype)
        xp = self.xp
        total = sp.prod(shape)
        flat_idx = i.array.reshape(-1)
        if flat_idx.size:
            lo, hi = int(flat_idx.min()), int(flat_idx.max())
            if lo < 0 or hi >= total:
                raise self.error(f"indices must lie in [0, {total}) for output shape {shape}; got "
                                 f"values in [{lo}, {hi}]", X=x, I=i)
        storage = x.array
        out = xp.zeros(total, dtype=storage.dtype)
        from ...xp import scatter_assign_last_wins

        scatter_assign_last_wins(xp, out, flat_idx, storage.reshape(-1))
        out = out.reshape(shape)
        if final_shape is not None and final_shape != shape:
            padded = xp.zeros(final_shape, dtype=storage.dtype)
            padded[tuple(slice(0, u) for u in shape)] = out
            out = padded
        return self.result(out, x.data_type)


@register()
class MaxRoiPool(KernelBase):
    """ONNX MaxRoiPool (opsets 1, 22), with Caffe's RoIPool geometry: the RoI corners are
    scaled by spatial_scale and rounded (half away from zero), the RoI size is at least
    1x1, bin (ph, pw) covers rows floor(ph * h / PH) .. ceil((ph + 1) * h / PH) (and the
    same for columns) offset by the RoI start and clipped to the image; an empty bin gives
    0.  batch_id must index X's batch."""

    def __call__(self, X, rois, pooled_shape=None, spatial_scale=1.0):
        x = self.tensor(X, "X")
        r = self.tensor(rois, "rois")
        self.check_inputs(x, r)
        if pooled_shape is None or len(pooled_shape) != 2 or any(int(v) < 1 for v in pooled_shape):
            raise self.error(f"pooled_shape must be two positive ints, got {pooled_shape}", X=x)
        if x.ndim != 4:
            raise self.error("X must be 4-D (N, C, H, W)", X=x, rois=r)
        if r.ndim != 2 or r.shape[1] != 5:
            raise self.error("rois must have shape (num_rois, 5)", X=x, rois=r)
        PH, PW = (int(v) for v in pooled_shape)
        N, C, H, W = x.shape
        R = r.shape[0]
        # the output and the per-RoI bin masks (R, PH, H) and (R, PW, W), before they exist
        check_allocation(self, (R, C, PH, PW), max(x.array.dtype.itemsize, 4))
        check_allocation(self, (R, max(PH * H, PW * W)), 1, "bin masks")
        xp = self.xp
        xc = self.to_compute(x)
        rc = self.to_compute(r, np.float64)
        host = np.asarray(rc.get() if hasattr(rc, "get") else rc, dtype=np.float64)
        batch = host[:, 0].astype(np.int64)
        if R and (batch.min() < 0 or batch.max() >= N):
            raise self.error(f"RoI batch indices must lie in [0, {N})", X=x, rois=r)

        def rnd(v):
            return np.sign(v) * np.floor(np.abs(v) + 0.5)

        scale = float(spatial_scale)
        x1, y1 = rnd(host[:, 1] * scale), rnd(host[:, 2] * scale)
        x2, y2 = rnd(host[:, 3] * scale), rnd(host[:, 4] * scale)
        rh = np.maximum(y2 - y1 + 1, 1.0)
        rw = np.maximum(x2 - x1 + 1, 1.0)

        def bins(start, size, pooled, limit):
            p = np.arange(pooled)[None, :]
            lo = np.floor(p * size[:, None] / pooled) + start[:, None]
            hi = np.ceil((p + 1) * size[:, None] / pooled) + start[:, None]
            lo = np.clip(lo, 0, limit).astype(np.int64)
            hi = np.clip(hi, 0, limit).astype(np.int64)
            pos = np.arange(limit)[None, None, :]
            return (pos >= lo[:, :, None]) & (pos < hi[:, :, None]), hi > lo  # (R, P, L), (R, P)

        mh, okh = bins(y1, rh, PH, H)
        mw, okw = bins(x1, rw, PW, W)
        y = xp.zeros((R, C, PH, PW), dtype=xc.dtype)
        if R and C and H and W:
            neg = -np.inf
            per_roi = max(1, C * H * W * PW * xc.dtype.itemsize)
            step = max(1, sp.workspace_bytes() // 4 // per_roi)
            for a in range(0, R, step):
                b = min(R, a + step)
                xr = xc[xp.asarray(batch[a:b])]  # (r, C, H, W)
                mwa = xp.asarray(mw[a:b])[:, None, None, :, :]  # (r, 1, 1, PW, W)
                t = xp.where(mwa, xr[:, :, :, None, :], neg).max(axis=-1)  # (r, C, H, PW)
                mha = xp.asarray(mh[a:b])[:, None, :, :, None]  # (r, 1, PH, H, 1)
                v = xp.where(mha, t[:, :, None, :, :], neg).max(axis=3)  # (r, C, PH, PW)
                ok = xp.asarray(okh[a:b][:, :, None] & okw[a:b][:, None, :])[:, None]
                y[a:b] = xp.where(ok, v, 0)
        return self.from_compute(y, x.data_type)


def global_mean(xp, x):
    """The mean over the spatial axes (N, C, 1, ...) of a float compute array, by the
    namespace's mean (pairwise sums), on every device; a C-contiguous host float32/float64
    array through reductions.sum_rows (the loop numpy.mean runs, the same bits, without
    its Python wrapper: 2x240x6x6 23 -> 17 us).  A BLAS sum per plane measured faster on
    small planes (2x1152x3x3: 60 -> 10 us) but rounds differently: the official
    squeezenet case's 1000 planes of ~1e10 then get means one ulp apart, which its
    Softmax turns into a far-from-uniform output where the expected one is uniform."""
    n = math.prod(x.shape[2:])
    if x.__class__ is np.ndarray and n and x.flags.c_contiguous and x.dtype in FLOAT_TYPES:
        return sum_rows(x.reshape(-1, n), n, True).reshape(x.shape[:2] + (1,) * (x.ndim - 2))
    return xp.mean(x, axis=tuple(range(2, x.ndim)), keepdims=True)


def _global(kernel, X, kind, p=2.0):
    x = kernel.tensor(X, "X")
    kernel.check_inputs(x)
    if x.ndim < 3:
        raise kernel.error("X must have rank >= 3 (N x C x D1 ...)", X=x)
    xp = kernel.xp
    xc = kernel.to_compute(x)
    axes = tuple(range(2, x.ndim))
    if kind == "max":
        if any(d == 0 for d in x.shape[2:]):
            raise kernel.error("GlobalMaxPool needs non-empty spatial dimensions", X=x)
        y = xp.max(xc, axis=axes, keepdims=True)
    elif kind == "avg":
        y = global_mean(xp, xc)
    else:
        if p == 2:
            y = xp.sqrt(xp.sum(xc * xc, axis=axes, keepdims=True))
        elif p == 1:
            y = xp.sum(xp.abs(xc), axis=axes, keepdims=True)
        else:
            y = xp.power(xp.sum(xp.power(xp.abs(xc), p), axis=axes, keepdims=True), 1.0 / p)
    return kernel.from_compute(y, x.data_type)


def _global_array_function(kernel, inputs, kind):
    """Compiled graphs: the global mean or max of one natively computed input (float32,
    float64), the same global_mean / xp.max as _global without the per-call checks (some
    30 us a node); None otherwise (the kernel then checks and raises)."""
    from ..math.arith import native_compute

    if len(inputs) != 1 or not native_compute(inputs):
        return None
    x = inputs[0].array
    if x.ndim < 3 or (kind == "max" and 0 in x.shape[2:]):
        return None
    xp = kernel.xp
    if kind == "avg":
        return lambda a: global_mean(xp, a)
    axes = tuple(range(2, x.ndim))
    return lambda a: xp.max(a, axis=axes, keepdims=True)


@register()
class GlobalAveragePool(KernelBase):
    def __call__(self, X):
        return _global(self, X, "avg")

    def array_function(self, inputs, attrs):
        return _global_array_function(self, inputs, "avg")


@register()
class GlobalMaxPool(KernelBase):
    def __call__(self, X):
        return _global(self, X, "max")

    def array_function(self, inputs, attrs):
        return _global_array_function(self, inputs, "max")


@register()
class GlobalLpPool(KernelBase):
    """(sum |x|^p)^(1/p) over all spatial axes; p is a float at opset 1, an int later."""

    def __call__(self, X, p=2):
        if p is None or float(p) <= 0:
            raise self.error(f"p must be positive, got {p}")
        return _global(self, X, "lp", float(p))
