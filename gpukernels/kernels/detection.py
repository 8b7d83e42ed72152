"""NonMaxSuppression and RoiAlign.

NonMaxSuppression: boxes with score > score_threshold (strictly, as onnxruntime) are
visited in decreasing score order (ties: lower box index first; NaN scores, only valid
without a score_threshold, last); a box is suppressed when
its IoU with an already selected box of the same batch and class is strictly greater
than iou_threshold.  Boxes with zero area or no overlap never suppress.  The IoU is
inter / union in float32 (inter = max(ih, 0) * max(iw, 0), union = area_a + area_b -
inter), compared strictly with the float32 threshold.  Output rows [batch, class, box]
grouped by batch, then class, in selection order.

On the host each (batch, class) pair runs alone on 1-D arrays: the best candidates by a
partial sort, then only the pairs of boxes that can overlap (a sweep over the boxes sorted
by ymin, each compared with its next few neighbours through shifted views) get the exact
IoU test, and the greedy rule is applied to the few suppression edges left.  On a GPU all
pairs run at once: candidates are processed in blocks; each block is checked against the
boxes already selected (one vectorised IoU) and resolved internally by a fixed-point
iteration of the greedy rule on the block's IoU matrix (exact: the greedy selection is
its unique fixed point).

RoiAlign: bilinear samples on a regular grid per output bin, averaged ('avg') or, for
'max', the maximum over samples of the largest weighted corner value (w_i * v_i), which
is what onnxruntime computes.  Samples outside [-1, H] x [-1, W] count as 0.
coordinate_transformation_mode 'half_pixel' (opset 16+ default) shifts ROI corners by
-0.5 and does not clamp the ROI size; 'output_half_pixel' (and opset 10) clamps ROI width
and height to at least 1.  A bin whose adaptive grid is empty (a degenerate ROI) gives 0.
"""

from __future__ import annotations

import numpy as np

from ..host import tuning
from ..limits import check_allocation
from .base import KernelBase, register
from .specialize import specialize


def _scalar(kernel, t, name, named):
    if t.is_absent:
        return None
    if t.size != 1:
        raise kernel.error(f"{name} must be a scalar, got shape {list(t.shape)}", **named)
    return np.asarray(t.numpy()).reshape(()).item()


def _iou_suppresses(xp, a, a_area, b, b_area, thr):
    """(A, L, K) bool: IoU(a[:, l], b[:, k]) > thr.  a (A, L, 4), b (A, K, 4) as
    [ymin, xmin, ymax, xmax]."""
    ih = xp.minimum(a[:, :, None, 2], b[:, None, :, 2]) - xp.maximum(a[:, :, None, 0], b[:, None, :, 0])
    iw = xp.minimum(a[:, :, None, 3], b[:, None, :, 3]) - xp.maximum(a[:, :, None, 1], b[:, None, :, 1])
    inter = xp.maximum(ih, 0) * xp.maximum(iw, 0)
    union = a_area[:, :, None] + b_area[:, None, :] - inter
    ok = (inter > 0) & (a_area[:, :, None] > 0) & (b_area[:, None, :] > 0) & (union > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        iou = inter / xp.where(ok, union, 1)
    return ok & (iou > thr)


def _corners(xp, b, center):
    """[..., 4] boxes as [ymin, xmin, ymax, xmax]."""
    if center:
        half = b[..., 2:4] / 2
        lo = b[..., 0:2] - half
        hi = b[..., 0:2] + half
        return xp.concatenate([xp.minimum(lo, hi)[..., ::-1], xp.maximum(lo, hi)[..., ::-1]], axis=-1)
    return xp.concatenate([xp.minimum(b[..., 0:2], b[..., 2:4]), xp.maximum(b[..., 0:2], b[..., 2:4])], axis=-1)


_UPPER = {}


def _upper(xp, length):
    k = (id(xp), length)
    m = _UPPER.get(k)
    if m is None:
        m = _UPPER[k] = xp.triu(xp.ones((length, length), bool), 1)
    return m


def _head_order(xp, key, head):
    """The first `head` entries of the stable ascending argsort of each row of key,
    without sorting whole rows: the head smallest by (key, index), then sorted."""
    kth = xp.partition(key, head - 1, axis=1)[:, head - 1:head]
    less = key < kth
    eq = key == kth
    need = head - less.sum(axis=1, keepdims=True)
    sel = less | (eq & (xp.cumsum(eq, axis=1) <= need))
    idx = xp.nonzero(sel)[1].reshape(key.shape[0], head)  # ascending index per row
    sub = xp.take_along_axis(key, idx, axis=1)
    return xp.take_along_axis(idx, xp.argsort(sub, axis=1, kind="stable"), axis=1)


# --- host path: one (batch, class) pair at a time, on 1-D arrays -----------------------

# Tuning (host/tuning.py): one sweep lists at most nms.pair_budget candidate pairs (int64
# workspace of a few of these); a (batch, class) pair needing more goes through the blocks.


def _host_order(key, stop):
    """Indices of the `stop` smallest entries of the 1-D key by (key, index), in that
    order, without sorting the whole row when stop is small (partition, then a stable
    sort of the few entries at or below the stop-th value)."""
    n = key.size
    if stop < n:
        kth = np.partition(key, stop - 1)[stop - 1]
        if kth == kth:  # not NaN (NaN sorts last: then sort everything)
            cand = (key <= kth).nonzero()[0]  # ascending index: the stable sort keeps ties so
            return cand[key[cand].argsort(kind="stable")[:stop]]
    return key.argsort(kind="stable")[:stop]


def _host_corners(rows, center):
    """(5, L) float32 rows ymin, xmin, ymax, xmax, area of (L, 4) boxes (the same
    float32 operations as _corners)."""
    cols = rows.T
    if center:  # [x, y, w, h] -> [y, x] pairs
        half = cols[2:4] / 2
        lo, hi = (cols[0:2] - half)[::-1], (cols[0:2] + half)[::-1]
    else:
        lo, hi = cols[0:2], cols[2:4]
    geo = np.empty((5, rows.shape[0]), np.float32)
    np.minimum(lo, hi, out=geo[0:2])
    np.maximum(lo, hi, out=geo[2:4])
    size = geo[2:4] - geo[0:2]
    np.multiply(size[0], size[1], out=geo[4])
    return geo


# window padding: a box that overlaps nothing (ymin, xmin = inf; ymax, xmax = -inf)
_PAD = np.array([[np.inf], [np.inf], [-np.inf], [-np.inf]], np.float32)


def _iou_above(inter, aa, ab, thr):
    """inter / (aa + ab - inter) > thr for pairs of boxes with areas aa, ab and overlap
    inter (1-D float32), and inter, both areas and the union > 0 -- the float32 operations
    of _iou_suppresses (a NaN anywhere fails)."""
    union = aa + ab
    union -= inter
    with np.errstate(divide="ignore", invalid="ignore"):
        hit = inter / union > np.float32(thr)
    hit &= np.minimum(np.minimum(inter, union), np.minimum(aa, ab)) > 0
    return hit


def _sweep_edges(geo, thr):
    """Suppression edges among boxes in visiting order, geo as from _host_corners: index
    arrays (src, dst), src < dst, with IoU(src, dst) > thr by the exact float32 test of
    _iou_suppresses; None when the pairs to look at exceed nms.pair_budget.

    With the boxes sorted by ymin, box k can only overlap the boxes after it that start
    before it ends: at most the next w, w the longest such run (a searchsorted bound;
    pairs with NaN never suppress).  Box k is compared with its next w neighbours as
    (w, n) arrays whose rows are shifted views of the sorted corners (no gathers), by
    the y bound and the x overlap; the few pairs left get the exact IoU test."""
    n = geo.shape[1]
    perm = geo[0].argsort()
    g = geo[:, perm]  # sorted by ymin
    w = int((g[0].searchsorted(g[2]) - _one_to(n)).max())
    if w <= 0:
        return perm[:0], perm[:0]
    if w * n > tuning.value("nms.pair_budget"):
        return None
    pad = np.empty((4, n + w), np.float32)
    pad[:, :n] = g[:4]
    pad[:, n:] = _PAD

    def shifted(row):  # shifted(row)[d, k] = pad[row, k + 1 + d]
        return np.ndarray((w, n), np.float32, pad, (row * (n + w) + 1) * 4, (4, 4))

    near = shifted(0) < g[2]  # starts before box k ends
    iw = np.minimum(shifted(3), g[3])
    iw -= np.maximum(shifted(1), g[1])
    near &= iw > 0
    f = near.ravel().nonzero()[0]
    if f.size == 0:
        return perm[:0], perm[:0]
    iw = iw.ravel()[f]
    d, pa = np.divmod(f, n)
    d += pa  # the partner less one: pb = pa + d + 1, read through views shifted by one
    ymin, ymax, area = g[0], g[2], g[4]
    # max(ymin) is ymin[pb] (sorted; a NaN ymin sorts last, and maximum gives NaN too)
    ih = np.minimum(ymax[pa], ymax[1:][d])
    ih -= ymin[1:][d]
    inter = np.maximum(ih, 0, out=ih)
    inter *= iw
    hit = _iou_above(inter, area[pa], area[1:][d], thr)
    pa, pb = perm[pa[hit]], perm[1:][d[hit]]
    return np.minimum(pa, pb), np.maximum(pa, pb)


def _greedy_removed(size, gone, src, dst):
    """Greedy resolution of the edges (src, dst) among `size` candidates in visiting order,
    given the candidates already removed (a list of indices): the removed indices (a list
    or an array); a candidate is removed when a kept earlier one has an edge to it."""
    if src.size <= tuning.value("nms.greedy_loop_edges"):
        # few edges: in order of dst, every src is settled before its edge is seen
        gone = set(gone)
        for d, s in sorted(zip(dst.tolist(), src.tolist())):
            if s not in gone:
                gone.add(d)
        return list(gone)
    # many edges: the fixed point of keep = alive & ~(keep @ M) (unique: the greedy)
    m = np.zeros((size, size), np.float32)
    m[src, dst] = 1
    alive = np.ones(size, bool)
    alive[gone] = False
    keep = alive
    for _ in range(size + 1):
        new = alive & ~((keep.astype(np.float32) @ m) > 0)
        if np.array_equal(new, keep):
            break
        keep = new
    return np.flatnonzero(~keep)


_ONE_TO = np.arange(1, 4097)
_ONE_TO.flags.writeable = False


def _one_to(n):
    """1, 2, ..., n (cached for small n)."""
    return _ONE_TO[:n] if n <= _ONE_TO.size else np.arange(1, n + 1)


def _cross_hits(sel, geo, thr):
    """Which candidates (columns of geo, as from _host_corners) a selected box (columns of
    sel) suppresses: bool (m,), by the exact float32 test of _iou_suppresses.

    With the selected boxes sorted by ymin, candidate k can only overlap those starting
    before it ends and no earlier than its start minus the tallest selected box (two
    searchsorted bounds, in float64), so only those pairs are listed -- as flat index
    arrays, at most nms.pair_budget pairs at a time.  NaN corners never suppress (their
    tests fail, and a NaN bound lists no pair)."""
    m = geo.shape[1]
    hit = np.zeros(m, bool)
    if m == 0 or sel.shape[1] == 0:
        return hit
    s = sel[:, np.argsort(sel[0], kind="stable")]
    s0 = s[0].astype(np.float64)
    heights = s[2].astype(np.float64) - s0
    finite = heights[~np.isnan(heights)]
    tall = float(finite.max()) if finite.size else 0.0
    with np.errstate(invalid="ignore"):
        lo = np.searchsorted(s0, geo[0].astype(np.float64) - tall, side="left")
    hi = np.searchsorted(s0, geo[2].astype(np.float64), side="left")  # ymin < candidate's ymax
    counts = np.maximum(hi - lo, 0)
    ends = np.cumsum(counts)
    first = 0
    budget = tuning.value("nms.pair_budget")
    while first < m:
        done = int(ends[first - 1]) if first else 0
        last = max(first + 1, int(np.searchsorted(ends, done + budget, side="right")))
        c = counts[first:last]
        total = int(c.sum())
        if total:
            ci = np.repeat(np.arange(first, last), c)
            si = np.repeat(lo[first:last] - (np.cumsum(c) - c), c) + np.arange(total)
            ih = np.minimum(s[2][si], geo[2][ci]) - np.maximum(s[0][si], geo[0][ci])
            iw = np.minimum(s[3][si], geo[3][ci]) - np.maximum(s[1][si], geo[1][ci])
            inter = np.maximum(ih, 0, out=ih)
            inter *= np.maximum(iw, 0, out=iw)
            hit[ci[_iou_above(inter, s[4][si], geo[4][ci], thr)]] = True
        first = last
    return hit


def _host_pair(boxes, scores, valid, n, cap, thr, center):
    """Greedy NMS of one (batch, class) pair on the host: the box indices selected, in
    selection order, or None (workspace limit: use the block path).

    Candidates are taken best first in chunks: the first chunk is a little more than cap
    (usually enough), found by a partial sort.  Within a chunk, the suppression edges come
    from a sweep (_sweep_edges; a chunk with too many pairs to look at is halved); the
    candidates a box selected from earlier chunks suppresses are found by _cross_hits and
    removed first; the rest is resolved greedily in order (_greedy_removed)."""
    if valid is None:
        key = -scores
        nvalid = n
    else:
        key = np.where(valid, -scores, np.float32(np.inf))
        nvalid = int(np.count_nonzero(valid))
    sel_idx, sel_geo = [], None  # selected box indices per chunk; their corners + area
    count = start = 0
    stop = min(nvalid, cap + cap // 4 + 32)
    while True:
        cand = _host_order(key, stop)[start:]
        geo = _host_corners(boxes.take(cand, axis=0), center)
        edges = _sweep_edges(geo, thr)
        if edges is None:  # too many pairs in the chunk: a smaller chunk, else the blocks
            if stop - start <= 64:
                return None
            stop = start + (stop - start) // 2
            continue
        src, dst = edges
        gone = [] if sel_geo is None else np.flatnonzero(_cross_hits(sel_geo, geo, thr)).tolist()
        if src.size:
            gone = _greedy_removed(cand.size, gone, src, dst)
        if len(gone):
            live = np.ones(cand.size, bool)
            live[gone] = False
            kept = np.flatnonzero(live)[:cap - count]
        else:
            kept = slice(0, cap - count)
        new = cand[kept]
        sel_idx.append(new)
        count += new.size
        start = stop
        if count >= cap or start >= nvalid:
            break
        kg = geo[:, kept]
        sel_geo = kg if sel_geo is None else np.concatenate([sel_geo, kg], axis=1)
        # next chunk: about enough for the rest at the rate kept so far
        rate = max(count, 1) / stop
        stop = min(nvalid, stop + max(64, int((cap - count) / rate * 1.25) + 16))
    return sel_idx[0] if len(sel_idx) == 1 else np.concatenate(sel_idx)


@register()
class NonMaxSuppression(KernelBase):
    """Tuning (host/tuning.py): nms.block candidates per block of the block path; on the
    host, (batch, class) pairs run one at a time (_host_pair) when at most nms.host_pairs
    of them have a valid box, else through the vectorised blocks (the loop measured 2-3x
    faster than the blocks even for 80 classes, so it is always taken)."""

    def __call__(self, boxes, scores, max_output_boxes_per_class=None, iou_threshold=None,
                 score_threshold=None, center_point_box=0):
        bt = self.tensor(boxes, "boxes")
        st = self.tensor(scores, "scores")
        mt = self.tensor(max_output_boxes_per_class, "max_output_boxes_per_class", optional=True)
        it = self.tensor(iou_threshold, "iou_threshold", optional=True)
        tt = self.tensor(score_threshold, "score_threshold", optional=True)
        self.check_inputs(bt, st, mt, it, tt)
        named = dict(boxes=bt, scores=st)
        if bt.ndim != 3 or bt.shape[2] != 4:
            raise self.error("boxes must be [num_batches, spatial_dimension, 4]", **named)
        if st.ndim != 3:
            raise self.error("scores must be [num_batches, num_classes, spatial_dimension]", **named)
        if bt.shape[0] != st.shape[0] or bt.shape[1] != st.shape[2]:
            raise self.error("boxes and scores disagree on num_batches or spatial_dimension", **named)
        if center_point_box not in (0, 1):
            raise self.error(f"center_point_box must be 0 or 1, got {center_point_box}", **named)
        max_out = _scalar(self, mt, "max_output_boxes_per_class", named)
        iou_thr = _scalar(self, it, "iou_threshold", named)
        score_thr = _scalar(self, tt, "score_threshold", named)
        iou_thr = 0.0 if iou_thr is None else float(iou_thr)
        if not 0.0 <= iou_thr <= 1.0:
            raise self.error(f"iou_threshold must be in [0, 1], got {iou_thr}", **named)
        xp = self.xp
        nb, n = bt.shape[:2]
        nc = st.shape[1]
        max_out = 0 if max_out is None else int(max_out)
        if max_out <= 0 or n == 0 or nb * nc == 0:
            return self.result(xp.zeros((0, 3), np.int64))
        cap = min(max_out, n)
        b = self.to_compute(bt, np.float32)
        sc = self.to_compute(st, np.float32).reshape(nb * nc, n)
        valid = sc > np.float32(score_thr) if score_thr is not None else None
        args = (self, b, sc, valid, nc, cap, iou_thr, center_point_box)
        fast = self.specialized("NonMaxSuppression.select", *args)
        if fast is not None:
            return self.result(fast(*args))
        if valid is None:
            valid = xp.ones(sc.shape, bool)
        return self.result(self._blocks(b, sc, valid, nc, cap, iou_thr, center_point_box))

    def _blocks(self, b, sc, valid, nc, cap, iou_thr, center_point_box):
        """All (batch, class) pairs at once (the device path): candidates in blocks,
        each checked against the selected boxes and resolved by a fixed point."""
        xp = self.xp
        pairs, n = sc.shape
        key = xp.where(valid, -sc, np.float32(np.inf))
        nvalid = valid.sum(axis=1)
        nvalid_host = np.asarray(nvalid.get() if hasattr(nvalid, "get") else nvalid)
        top = int(nvalid_host.max()) if nvalid_host.size else 0
        pair_batch = xp.arange(pairs) // nc
        bs = tuning.value("nms.block")
        # Sort only the best few candidates first (most calls select early); the full
        # stable sort is computed only if the selection needs more.
        head = min(n, max(4 * bs, 2 * cap))
        order = None
        if head < top and not bool(xp.isnan(sc).any()):
            order = _head_order(xp, key, head)
        if order is None:
            order = xp.argsort(key, axis=1, kind="stable")
            head = n
        sel_pos = xp.full((pairs, cap), -1, np.int64)
        sel_box = xp.zeros((pairs, cap, 4), np.float32)
        sel_area = xp.zeros((pairs, cap), np.float32)
        count = xp.zeros(pairs, np.int64)
        cap_idx = xp.arange(cap)
        for start in range(0, top, bs):
            stop = min(start + bs, n)
            act = xp.nonzero((count < cap) & (nvalid > start))[0]
            if act.size == 0:
                break
            if stop > head:
                order = xp.argsort(key, axis=1, kind="stable")
                head = n
            cb = _corners(xp, b[pair_batch[act][:, None], order[act, start:stop]], center_point_box)
            ca = (cb[..., 2] - cb[..., 0]) * (cb[..., 3] - cb[..., 1])
            alive = (xp.arange(start, stop)[None, :] < nvalid[act, None])
            if bool(xp.any(count[act] > 0)):
                hit = _iou_suppresses(xp, cb, ca, sel_box[act], sel_area[act], iou_thr)
                hit &= (cap_idx[None, :] < count[act, None])[:, None, :]
                alive &= ~hit.any(axis=2)
            length = stop - start
            m = _iou_suppresses(xp, cb, ca, cb, ca, iou_thr)
            m &= _upper(xp, length)[None]  # m[a, j, i]: j < i
            keep = alive
            if bool(m.any()):
                mf = m.astype(np.float32)
                for _ in range(length + 1):
                    hit = xp.matmul(keep[:, None, :].astype(np.float32), mf)[:, 0, :] > 0
                    new = alive & ~hit
                    if bool(xp.all(new == keep)):
                        break
                    keep = new
            rank = xp.cumsum(keep, axis=1) - 1 + count[act, None]
            take = keep & (rank < cap)
            ai, li = xp.nonzero(take)
            rows, cols = act[ai], rank[ai, li]
            sel_pos[rows, cols] = start + li
            sel_box[rows, cols] = cb[ai, li]
            sel_area[rows, cols] = ca[ai, li]
            count[act] = xp.minimum(count[act] + keep.sum(axis=1), cap)
        pi, ki = xp.nonzero(sel_pos >= 0)
        box_idx = order[pi, sel_pos[pi, ki]]
        return xp.stack([pi // nc, pi % nc, box_idx], axis=1).astype(np.int64)


def _live_pairs(sc, valid):
    """The (batch * class) rows with a valid box."""
    return range(sc.shape[0]) if valid is None else np.flatnonzero(valid.any(axis=1)).tolist()


@specialize("NonMaxSuppression.select", device="cpu", ops=("NonMaxSuppression",),
            when=lambda kernel, b, sc, valid, *rest: len(_live_pairs(sc, valid)) <= tuning.value("nms.host_pairs"))
def _nms_host(kernel, b, sc, valid, nc, cap, iou_thr, center):
    """Host path: one (batch, class) pair with a valid box at a time (see _host_pair), while
    there are few enough of them for a Python loop (nms.host_pairs)."""
    n = sc.shape[1]
    parts = []
    for p in _live_pairs(sc, valid):
        bi, ci = divmod(p, nc)
        v = None if valid is None else valid[p]
        idx = _host_pair(b[bi], sc[p], v, n, cap, iou_thr, center)
        if idx is None:  # too many overlapping candidates for the sweep's workspace
            vv = np.ones((1, n), bool) if v is None else v[None]
            rows = kernel._blocks(b[bi:bi + 1], sc[p:p + 1], vv, 1, cap, iou_thr, center)
            idx = rows[:, 2]
        if idx.size:
            part = np.empty((idx.size, 3), np.int64)
            part[:, 0] = bi
            part[:, 1] = ci
            part[:, 2] = idx
            parts.append(part)
    if not parts:
        return np.zeros((0, 3), np.int64)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


@register()
class RoiAlign(KernelBase):
    def __call__(self, X, rois, batch_indices, coordinate_transformation_mode="half_pixel", mode="avg",
                 output_height=1, output_width=1, sampling_ratio=0, spatial_scale=1.0):
        xt = self.tensor(X, "X")
        rt = self.tensor(rois, "rois")
        bt = self.tensor(batch_indices, "batch_indices")
        self.check_inputs(xt, rt, bt)
        named = dict(X=xt, rois=rt, batch_indices=bt)
        if xt.ndim != 4:
            raise self.error("X must be 4-D (N, C, H, W)", **named)
        if rt.ndim != 2 or rt.shape[1] != 4:
            raise self.error("rois must be (num_rois, 4)", **named)
        if bt.shape != (rt.shape[0],):
            raise self.error("batch_indices must be 1-D with one entry per roi", **named)
        if mode not in ("avg", "max"):
            raise self.error(f"mode must be 'avg' or 'max', got {mode!r}", **named)
        if self.since_version < 16:
            coordinate_transformation_mode = "output_half_pixel"
        if coordinate_transformation_mode not in ("half_pixel", "output_half_pixel"):
            raise self.error("coordinate_transformation_mode must be 'half_pixel' or 'output_half_pixel', "
                             f"got {coordinate_transformation_mode!r}", **named)
        oh, ow = int(output_height), int(output_width)
        if oh < 1 or ow < 1 or sampling_ratio < 0:
            raise self.error(f"output_height ({oh}) and output_width ({ow}) must be positive and "
                             f"sampling_ratio ({sampling_ratio}) non-negative", **named)
        xp = self.xp
        n, c, h, w = xt.shape
        r = rt.shape[0]
        bi = bt.array.astype(np.int64, copy=False)
        if r and bool(xp.any((bi < 0) | (bi >= n))):
            raise self.error(f"batch_indices must lie in [0, {n})", **named)
        xc = self.to_compute(xt)
        dt = xc.dtype
        check_allocation(self, (r, c, oh, ow), dt)  # output_height/width are attributes
        if r == 0 or c == 0:
            return self.from_compute(xp.zeros((r, c, oh, ow), dt), xt.data_type)
        half = coordinate_transformation_mode == "half_pixel"
        roi = self.to_compute(rt, dt) * dt.type(spatial_scale) - dt.type(0.5 if half else 0.0)
        x1, y1, x2, y2 = roi[:, 0], roi[:, 1], roi[:, 2], roi[:, 3]
        rw, rh = x2 - x1, y2 - y1
        if not half:
            rw, rh = xp.maximum(rw, 1), xp.maximum(rh, 1)
        bin_h, bin_w = rh / oh, rw / ow
        if sampling_ratio > 0:
            gh = xp.full(r, sampling_ratio, np.int64)
            gw = gh
        else:
            gh = xp.ceil(rh / oh).astype(np.int64)
            gw = xp.ceil(rw / ow).astype(np.int64)
        count = xp.maximum(gh * gw, 1).astype(dt)
        gh_max = max(int(xp.max(gh)), 0)
        gw_max = max(int(xp.max(gw)), 0)
        # the samples per bin follow the RoI sizes (data): one gathered row of them is
        # (R, oh, ow * Gw, C), several alive at once
        check_allocation(self, (r, oh, ow * max(gw_max, 1), c), dt, "sample block")
        ghc = xp.maximum(gh, 1).astype(dt)
        gwc = xp.maximum(gw, 1).astype(dt)
        # x sample positions for every (roi, pw, ix): (R, ow * Gw)
        ix = xp.arange(max(gw_max, 1))
        xs = (x1[:, None, None] + xp.arange(ow)[None, :, None] * bin_w[:, None, None]
              + (ix[None, None, :] + dt.type(0.5)) * (bin_w / gwc)[:, None, None])
        x_in = (ix[None, None, :] < gw[:, None, None])
        xl, xh, lx, hx, x_ok = _axis_weights(xp, xs.reshape(r, -1), w, dt)
        x_ok = x_ok.reshape(r, ow, -1)
        acc = None
        for iy in range(gh_max):
            ys = y1[:, None] + xp.arange(oh)[None, :] * bin_h[:, None] + (iy + dt.type(0.5)) * (bin_h / ghc)[:, None]
            y_in = iy < gh  # (R,)
            yl, yh, ly, hy, y_ok = _axis_weights(xp, ys, h, dt)
            bidx = bi[:, None, None]
            v11 = xc[bidx, :, yl[:, :, None], xl[:, None, :]]  # (R, oh, ow*Gw, C)
            v12 = xc[bidx, :, yl[:, :, None], xh[:, None, :]]
            v21 = xc[bidx, :, yh[:, :, None], xl[:, None, :]]
            v22 = xc[bidx, :, yh[:, :, None], xh[:, None, :]]
            wy_l, wy_h = hy[:, :, None, None], ly[:, :, None, None]
            wx_l, wx_h = hx[:, None, :, None], lx[:, None, :, None]
            inside = (y_ok[:, :, None] & x_ok.reshape(r, 1, -1))[..., None]
            if mode == "avg":
                val = wy_l * (wx_l * v11 + wx_h * v12) + wy_h * (wx_l * v21 + wx_h * v22)
                val = xp.where(inside, val, 0)
                val = val.reshape(r, oh, ow, -1, c)
                val = xp.where(x_in[:, None, :, :, None], val, 0).sum(axis=3)
                val = xp.where(y_in[:, None, None, None], val, 0)
                acc = val if acc is None else acc + val
            else:
                val = xp.maximum(xp.maximum(wy_l * wx_l * v11, wy_l * wx_h * v12),
                                 xp.maximum(wy_h * wx_l * v21, wy_h * wx_h * v22))
                val = xp.where(inside, val, 0).reshape(r, oh, ow, -1, c)
                val = xp.where(x_in[:, None, :, :, None], val, -np.inf).max(axis=3)
                val = xp.where(y_in[:, None, None, None], val, -np.inf)
                acc = val if acc is None else xp.maximum(acc, val)
        if acc is None:
            out = xp.zeros((r, oh, ow, c), dt)
        elif mode == "avg":
            out = acc / count[:, None, None, None]
        else:
            out = xp.where(acc == -np.inf, 0, acc)
        out = xp.ascontiguousarray(xp.transpose(out, (0, 3, 1, 2))).astype(dt, copy=False)
        return self.from_compute(out, xt.data_type)


def _axis_weights(xp, pos, size, dt):
    """Bilinear indices and weights along one axis for sample positions pos."""
    ok = (pos >= -1.0) & (pos <= size)
    p = xp.maximum(pos, 0)
    low = xp.floor(p).astype(np.int64)
    at_end = low >= size - 1
    low = xp.where(at_end, size - 1, low)
    high = xp.where(at_end, size - 1, low + 1)
    p = xp.where(at_end, low.astype(dt), p)
    frac = (p - low).astype(dt)
    return low, high, frac, (1 - frac).astype(dt), ok
