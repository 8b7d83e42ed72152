"""Host-only (NumPy) separable pooling for MaxPool (Y only) and AveragePool, the
specialisation "Pool.windows" of pool.pool_reduce: one axis at a time, each kernel tap
applied directly at the output positions through strided views (k - 1 ufunc passes over
the output size of the axis), so nothing is padded.  Output positions whose window
reaches outside the input ("edges", a few per side) are recomputed from their valid taps
afterwards.  NumPy's per-call and per-inner-loop costs decide the layout: the blocks'
leading axes are fused so that each tap is one long slice, a stride-2 non-last axis over
short rows reduces every row (contiguous 1-D passes, _strided_dense), and a strided last
axis is de-interleaved once so that its taps read contiguous data (_strided_flat).
2-D windows that all lie inside the input (or for MaxPool all read some of it: the input
is then copied into a kept border of -inf) take two passes of strided views instead
(_inside_2d), the same taps in the same order.
"""

from __future__ import annotations

import numpy as np

from ...host import tuning
from ...host import host_empty, parallel_ranges
from ..specialize import specialize
from ._conv_host import kept_planes
from . import _spatial as sp

# Tuning (host/tuning.py): blocks of pool.host_block_bytes (a block and its scratch
# copies), pool.host_thread_bytes of input per thread, host arrays from
# pool.pooled_bytes on from the reusable pool (fresh ones cost page faults).


def _axis_plan(S, O, s, offsets):
    """For one axis of length S with O outputs, stride s and tap offsets: the interior
    [lo, hi) where every tap is in [0, S), and the edge outputs with the in-range
    source positions of each (empty: no tap inside)."""
    lo = min(O, max(0, -(min(offsets) // s)))  # ceil(-min(offsets) / s)
    hi = max(lo, min(O, (S - 1 - max(offsets)) // s + 1))
    edges = [(j, [s * j + o for o in offsets if 0 <= s * j + o < S])
             for j in list(range(lo)) + list(range(hi, O))]
    return lo, hi, edges


def _reduce_views(op, views, dst):
    """dst = op over views (in order)."""
    if len(views) == 1:
        dst[...] = views[0]
        return
    op(views[0], views[1], out=dst)
    for v in views[2:]:
        op(dst, v, out=dst)


def _fix_edges(op, a, dst, axis, edges, fill):
    lead = (slice(None),) * axis
    for j, valid in edges:
        d = dst[lead + (j,)]
        if valid:
            _reduce_views(op, [a[lead + (i,)] for i in valid], d)
        else:
            d[...] = fill


def _strided_axis(op, a, axis, s, offsets, plan, fill, dst):
    """dst[..., j, ...] = op over the valid taps t of a[..., s * j + offsets[t], ...]
    (fill where none is valid); dst has a's shape with the axis's output length."""
    lo, hi, edges = plan
    if hi > lo:
        lead = (slice(None),) * axis
        views = [a[lead + (slice(s * lo + o, s * (hi - 1) + o + 1, s),)] for o in offsets]
        _reduce_views(op, views, dst[lead + (slice(lo, hi),)])
    _fix_edges(op, a, dst, axis, edges, fill)
    return dst


def _phases(s, offsets) -> list:
    """The residues mod s that the taps read (the de-interleaved columns needed)."""
    return sorted({o % s for o in offsets})


def _strided_flat(op, a, axis, s, O, offsets, plan, fill, buf, phase_buf=None):
    """_strided_axis along axis of a (whose length S there is a multiple of s), written
    into the flat buf as an array of a's shape with Q = S // s (>= O) at axis; returns
    its view with O there.  With the axes before it fused into rows of the trailing
    block, output row m reads input row s * m + offset: each tap is one 2-D slice (1-D
    along the last axis) that crosses into the neighbouring rows only at the edge
    outputs (and at the rows >= O, left unused), and the output is contiguous (NumPy
    coalesces its loops); the edges are recomputed.  a must be C-contiguous, except
    with phase_buf.

    With phase_buf (the last axis, s > 1, several taps), the columns are first
    de-interleaved by their residue mod s (one strided copy per residue read, into
    phase_buf rows), so that each tap is a contiguous slice: flat[s * m + o] =
    phase[o % s][m + o // s] (NumPy's strided inner loops are not vectorised).  The
    same values in the same order: the same bits."""
    lo, hi, edges = plan
    S = a.shape[axis]
    Q = S // s
    inner = sp.prod(a.shape[axis + 1:])
    R = a.size // (S * inner)
    out = buf[:R * Q * inner].reshape((R * Q, inner) if inner > 1 else (-1,))
    if hi > lo:
        m1 = (R - 1) * Q + hi
        if phase_buf is None:
            rows = a.reshape((R * S, inner) if inner > 1 else (-1,))
            views = [rows[s * lo + o:s * (m1 - 1) + o + 1:s] for o in offsets]
        else:
            phase = {}
            for k, p in enumerate(_phases(s, offsets)):
                phase[p] = phase_buf[k * R * Q:(k + 1) * R * Q]
                np.copyto(phase[p].reshape(a.shape[:-1] + (Q,)), a[..., p::s])
            views = [phase[o % s][lo + o // s:m1 + o // s] for o in offsets]
        _reduce_views(op, views, out[lo:m1])
    res = out.reshape(a.shape[:axis] + (Q,) + a.shape[axis + 1:])
    if O != Q:
        res = res[(slice(None),) * axis + (slice(0, O),)]
    _fix_edges(op, a, res, axis, edges, fill)
    return res


def _strided_dense(op, a, axis, s, O, offsets, plan, fill, buf):
    """_strided_axis along a non-last axis of the C-contiguous a by windows at every
    input row (stride 1) over the fused rows -- each tap one contiguous 1-D slice of
    the whole block, s times the outputs but no per-row loop overhead (short rows cost
    NumPy ~30 ns each) -- written into the flat buf (a's size); returns the strided
    view of its rows s * j.  Windows crossing into neighbouring rows are the edge
    outputs, recomputed as in _strided_flat."""
    lo, hi, edges = plan
    S = a.shape[axis]
    inner = sp.prod(a.shape[axis + 1:])
    R = a.size // (S * inner)
    flat = a.reshape(-1)
    full = buf[:a.size]
    if hi > lo:
        r0, r1 = s * lo, (R - 1) * S + s * (hi - 1) + 1  # the rows read as window starts
        views = [flat[(r0 + o) * inner:(r1 + o) * inner] for o in offsets]
        _reduce_views(op, views, full[r0 * inner:r1 * inner])
    res = full.reshape(a.shape)[(slice(None),) * axis + (slice(0, s * (O - 1) + 1, s),)]
    _fix_edges(op, a, res, axis, edges, fill)
    return res


def _inside_2d(op, a, geo, rows, dst):
    """dst = op over every 2-D window of a (NC, H, W) when every window lies inside a (no
    padding, no ceil_mode overhang; padded max pools pass their input copied into a
    border of the fill, _bordered): the kernel rows' strided row views reduced into rows
    (NC, Ho, W) -- each a run of whole rows -- then the kernel columns' strided views of
    rows into dst, taps in order (the passes and the order of _strided_flat and
    _strided_dense, so the same maxima and sums, without their edge outputs,
    de-interleaved phases and every-row windows).  Session runs of one node on a 2-vCPU
    AVX-512 EPYC VM: MaxPool 2x2 stride 2 on 2x16x96x96 171 -> 136 us, 2x32x48x48 114 ->
    89; 3x3 stride 2 pad 1 (ResNet's stem) on 2x32x48x48 181 -> 154, 2x16x48x48 155 ->
    102, 2x64x56x56 374 -> 320."""
    (kh, kw), (sh, sw), (dh, dw), (Ho, Wo) = geo.kernel, geo.strides, geo.dilations, geo.out
    views = [a[:, i * dh:i * dh + sh * (Ho - 1) + 1:sh] for i in range(kh)]
    if kh > 1:
        _reduce_views(op, views, rows)
        views = [rows]
    r = views[0]
    _reduce_views(op, [r[:, :, j * dw:j * dw + sw * (Wo - 1) + 1:sw] for j in range(kw)], dst)


def _bordered(block, Hn, Wn, top, left, fill, step):
    """The (n, Hn, Wn) padded planes of block (n, H, W): x's element (h, w) at (h + top,
    w + left), fill elsewhere, in a scratch kept per thread and geometry with room for
    step planes (_conv_host.kept_planes: a call writes only x's region, the border keeps
    its fill)."""
    n, H, W = block.shape
    z = kept_planes(("pool_border", block.dtype.str, step, Hn, Wn, top, left, H, W), (step, Hn, Wn),
                    block.dtype, fill)
    h, w = max(0, min(H, Hn - top)), max(0, min(W, Wn - left))
    z[:n, top:top + h, left:left + w] = block[:, :h, :w]
    return z[:n]


def _dense(S, s, O, inner) -> bool:
    """Whether a non-last axis takes _strided_dense: stride 2 over short rows (it reads
    each row twice as often; measured faster for rows up to some hundreds of items),
    every output's first row s * j inside the input."""
    return s == 2 and inner <= 512 and s * (O - 1) < S


_PLANS: dict = {}  # (spatial shape, geometry) -> _plans' result; a few entries per model


def _plans(x2, geo):
    """(tap offsets, _axis_plan) of every spatial axis (computed once per shape and
    geometry: some 10 us a call otherwise; callers do not modify them)."""
    S = x2.shape[1:]
    key = (S, *map(tuple, geo))
    got = _PLANS.get(key)
    if got is None:
        n_sp = len(S)
        offsets = [[t * geo.dilations[d] - geo.pads[d] for t in range(geo.kernel[d])] for d in range(n_sp)]
        got = offsets, [_axis_plan(S[d], geo.out[d], geo.strides[d], offsets[d]) for d in range(n_sp)]
        if len(_PLANS) >= 256:
            _PLANS.clear()
        _PLANS[key] = got
    return got


def covers(x2, geo, kind) -> bool:
    """Whether pool_strided takes a call: max or avg, and no axis with many edge outputs
    (kernel or padding much larger than the input)."""
    return kind in ("max", "avg") and not any(len(p[2]) > 8 for p in _plans(x2, geo)[1])


@specialize("Pool.windows", device="cpu", ops=("MaxPool", "AveragePool"), when=covers)
def pool_windows(x2, geo, kind, fill):
    """The unnormalised window reductions of pool.pool_reduce (max, or sums for avg)."""
    return pool_strided(x2, geo, np.maximum if kind == "max" else np.add, fill)


def pool_strided(x2, geo, op, fill):
    """op-reduction (np.maximum or np.add) of every window of the host array (NC, *S),
    skipping taps outside the input (fill where a window has none), by separable strided
    passes over cache-sized blocks of NC: the non-last axes first (largest reduction
    first; their taps read contiguous rows), the last axis -- whose strided reads are
    the costly ones -- last, on the smallest data.  None when an axis has many edge
    outputs (kernel or padding much larger than the input)."""
    n_sp = x2.ndim - 1
    S = x2.shape[1:]
    O = geo.out
    offsets, plans = _plans(x2, geo)
    if any(len(p[2]) > 8 for p in plans):
        return None
    NC = x2.shape[0]
    dtype = x2.dtype
    pooled = tuning.value("pool.pooled_bytes")
    out = host_empty((NC,) + tuple(O), dtype, pooled)
    per = max(1, sp.prod(S) * dtype.itemsize)
    step = min(NC, max(1, tuning.value("pool.host_block_bytes") // per))
    # 2-D windows all inside the input, or (max) all reading some of it: two passes over the
    # input, or over its copy in a kept border of fill (max(x, fill) is x, bit for bit)
    padded = n_sp == 2 and any(len(p[2]) for p in plans)
    if n_sp == 2 and (not padded or (op is np.maximum and all(v for p in plans for _, v in p[2]))):
        (kh, kw), (sh, sw), (dh, dw) = geo.kernel, geo.strides, geo.dilations
        Hn, Wn = sh * (O[0] - 1) + (kh - 1) * dh + 1, sw * (O[1] - 1) + (kw - 1) * dw + 1
        width = Wn if padded else S[1]

        def run_inside(lo, hi):
            rows = host_empty(step * O[0] * width, dtype, pooled)  # per thread, reused by its blocks
            for a in range(lo, hi, step):
                b = min(hi, a + step)
                src = _bordered(x2[a:b], Hn, Wn, geo.pads[0], geo.pads[1], fill, step) if padded else x2[a:b]
                _inside_2d(op, src, geo, rows[:(b - a) * O[0] * width].reshape(b - a, O[0], width), out[a:b])

        parallel_ranges(NC, max(step, -(-tuning.value("pool.host_thread_bytes") // per)), run_inside)
        return out
    order = sorted(range(n_sp - 1), key=lambda d: O[d] / max(1, S[d])) + [n_sp - 1]
    # axes taken by _strided_flat (given a contiguous block), with Q = S // s outputs
    flat = [S[d] % geo.strides[d] == 0 and O[d] <= S[d] // geo.strides[d] for d in range(n_sp)]
    s_last = geo.strides[-1]
    # block shapes after each stage (per NC item); the flat buffers hold Q at the axis
    shapes, sizes, dense = [], [], []
    shape = list(S)
    for k, d in enumerate(order):
        full = sp.prod(shape)
        dense.append(k < n_sp - 1 and _dense(S[d], geo.strides[d], O[d], sp.prod(shape[d + 1:])))
        shape[d] = O[d]
        shapes.append(tuple(shape))
        sizes.append(full if dense[k] else
                     sp.prod(shape) // O[d] * (S[d] // geo.strides[d]) if flat[d] else sp.prod(shape))
    last = order[-1]
    last_flat_buf = flat[last] and O[last] != S[last] // s_last  # else written into out directly
    n_phases = len(_phases(s_last, offsets[last])) if flat[last] and s_last > 1 and len(offsets[last]) > 1 else 0

    def run(lo, hi):
        # scratch buffers per thread, reused by each of its blocks
        bufs = [host_empty(step * n, dtype, pooled) for n in sizes[:-1]]
        last_buf = host_empty(step * sizes[-1], dtype, pooled) if last_flat_buf else None
        phase_buf = host_empty(step * sizes[-1] * n_phases, dtype, pooled) if n_phases else None
        for a in range(lo, hi, step):
            b = min(hi, a + step)
            cur = x2[a:b]
            for k, d in enumerate(order):
                args = (op, cur, d + 1, geo.strides[d], O[d], offsets[d], plans[d], fill)
                if k < n_sp - 1:
                    if dense[k] and cur.flags.c_contiguous:
                        cur = _strided_dense(*args, bufs[k])
                    elif flat[d] and cur.flags.c_contiguous:
                        cur = _strided_flat(*args, bufs[k])
                    else:
                        dst = bufs[k][:(b - a) * sp.prod(shapes[k])].reshape((b - a,) + shapes[k])
                        cur = _strided_axis(op, cur, d + 1, geo.strides[d], offsets[d], plans[d], fill, dst)
                elif flat[d]:
                    if not (cur.flags.c_contiguous or n_phases):
                        args = args[:1] + (np.ascontiguousarray(cur),) + args[2:]
                    if last_buf is None:
                        _strided_flat(*args, out[a:b].reshape(-1), phase_buf)
                    else:
                        out[a:b] = _strided_flat(*args, last_buf, phase_buf)
                else:
                    _strided_axis(op, cur, d + 1, s_last, offsets[d], plans[d], fill, out[a:b])

    # independent channel blocks over the host threads
    parallel_ranges(NC, max(step, -(-tuning.value("pool.host_thread_bytes") // per)), run)
    return out
