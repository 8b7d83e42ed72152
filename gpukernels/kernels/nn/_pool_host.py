"""Host-only (NumPy) separable pooling for MaxPool (Y only) and AveragePool, the
specialisation "Pool.windows" of pool.pool_reduce: one axis at a time, each kernel tap
applied directly at the output positions through strided views (k - 1 ufunc passes over
the output size of the axis), so nothing is padded.  Output positions whose window
reaches outside the input ("edges", a few per side) are recomputed from their valid taps
afterwards.
"""

from __future__ import annotations

import numpy as np

from ...host import tuning
from ...host import host_empty, parallel_ranges
from ..specialize import specialize
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


def _strided_last_flat(op, a, s, O, offsets, plan, fill, buf):
    """_strided_axis along the last axis of the C-contiguous a (row length W, a multiple
    of s) written into the flat buf with row length W // s (>= O); returns the (..., O)
    view.  Output m of the flattened rows reads flat[s * m + offset]: each tap is one
    long 1-D strided slice, which crosses into the neighbouring rows only at the edge
    outputs (and at the columns >= O, left unused); the edges are recomputed."""
    lo, hi, edges = plan
    W = a.shape[-1]
    Q = W // s
    R = a.size // W
    flat = a.reshape(-1)
    if hi > lo:
        m1 = (R - 1) * Q + hi
        views = [flat[s * lo + o:s * (m1 - 1) + o + 1:s] for o in offsets]
        _reduce_views(op, views, buf[lo:m1])
    res = buf[:R * Q].reshape(a.shape[:-1] + (Q,))[..., :O]
    _fix_edges(op, a, res, a.ndim - 1, edges, fill)
    return res


def _plans(x2, geo):
    """(tap offsets, _axis_plan) of every spatial axis."""
    n_sp = x2.ndim - 1
    S = x2.shape[1:]
    offsets = [[t * geo.dilations[d] - geo.pads[d] for t in range(geo.kernel[d])] for d in range(n_sp)]
    return offsets, [_axis_plan(S[d], geo.out[d], geo.strides[d], offsets[d]) for d in range(n_sp)]


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
    order = sorted(range(n_sp - 1), key=lambda d: O[d] / max(1, S[d])) + [n_sp - 1]
    s_last = geo.strides[-1]
    flat_last = S[-1] % s_last == 0 and O[-1] <= S[-1] // s_last
    # block shapes after each stage (per NC item)
    shapes = []
    shape = list(S)
    for d in order:
        shape[d] = O[d]
        shapes.append(tuple(shape))
    last_q = list(shapes[-1])
    last_q[-1] = S[-1] // s_last

    def run(lo, hi):
        # scratch buffers per thread, reused by each of its blocks
        bufs = [host_empty(step * sp.prod(sh), dtype, pooled) for sh in shapes[:-1]]
        last_buf = None
        if flat_last and O[-1] != last_q[-1]:
            last_buf = host_empty(step * sp.prod(last_q), dtype, pooled)
        for a in range(lo, hi, step):
            b = min(hi, a + step)
            cur = x2[a:b]
            for k, d in enumerate(order):
                if k < n_sp - 1:
                    dst = bufs[k][:(b - a) * sp.prod(shapes[k])].reshape((b - a,) + shapes[k])
                    cur = _strided_axis(op, cur, d + 1, geo.strides[d], offsets[d], plans[d], fill, dst)
                elif flat_last:
                    if not cur.flags.c_contiguous:
                        cur = np.ascontiguousarray(cur)
                    if last_buf is None:
                        _strided_last_flat(op, cur, s_last, O[d], offsets[d], plans[d], fill,
                                           out[a:b].reshape(-1))
                    else:
                        out[a:b] = _strided_last_flat(op, cur, s_last, O[d], offsets[d], plans[d],
                                                      fill, last_buf)
                else:
                    _strided_axis(op, cur, d + 1, s_last, offsets[d], plans[d], fill, out[a:b])

    # independent channel blocks over the host threads
    parallel_ranges(NC, max(step, -(-tuning.value("pool.host_thread_bytes") // per)), run)
    return out
