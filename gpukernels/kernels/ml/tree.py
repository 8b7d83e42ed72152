"""ai.onnx.ml tree ensembles: TreeEnsemble (opset 5), TreeEnsembleRegressor and
TreeEnsembleClassifier (opsets 1 and 3; deprecated from ai.onnx.ml opset 5, so they are
registered at 1 and 3 only).

Every ensemble is first normalised on the host into flat node arrays (feature, threshold,
comparison, true/false child, missing-value direction; leaves point to themselves) and
a list of leaf contributions (leaf, target, weight).  Evaluation is vectorised over
samples and trees together: the nodes are laid out as slots with each inner node's two
children side by side (Forest._walk), and each of the ``depth`` steps gathers the
current slot's feature, threshold and first child for every (tree, sample) pair and
moves it to first + condition, so the loop runs over tree depth, never over samples or
trees.  Contributions are then summed (or min/max-ed) per target; work is chunked over
samples to bound memory.

Comparisons: BRANCH_LEQ x <= t, LT x < t, GTE x >= t, GT x > t, EQ x == t, NEQ x != t,
MEMBER x in set.  A NaN feature follows the true branch where missing_value_tracks_true
is 1; otherwise it takes whatever the comparison gives (false, except NEQ).  Thresholds
keep their attribute precision (float32, or float64 from the *_as_tensor attributes)
and are compared in the common type with X (float64 for integer X).  Leaf weights are
accumulated in float64.

Planning is done once per kernel: the normalised Forest, the per-level arrays on the
device and the leaf-contribution layout are cached on the kernel object, keyed on the
identity of the attribute values (the runtime passes the same objects on every run).  A
direct caller that edits an attribute list in place between calls must pass a new list
(or use a new kernel object).  Leaf contributions are reduced through a dense [node,
target] table of leaf values (one gather and one sum/min/max over the trees) when it
holds at most tree.dense_max_entries (host/tuning.py) entries, else scattered per
contribution slot.  Measured on a 2-core host: TreeEnsembleClassifier, 64 rows x 20
trees of depth 6, Session.run 1.7 ms -> 0.3 ms (the attribute parsing that every call
repeated was 0.75 ms of it); the benchmark's scikit-learn exports (64 rows; a random
forest of 50 trees of depth 8, gradient boosting of 100 trees of depth 4), kernel call
0.30 -> 0.20 ms and 0.25 -> 0.145 ms (NumPy's 'wrap' take for the gathers instead of
fancy indexing, 2.6 instead of 3.9 us per 3200 values; tree-major pairs; the first
level precomputed per input shape; padded value rows).  Splitting the trees over two
host threads was 2x slower (each level's operations take 1-3 us: the GIL hand-offs
cost more).
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from ... import dtypes
from ...dtypes import DataType
from ...host import tuning
from ...tensor import Tensor
from ...xp import scatter_reduce
from ..base import KernelBase, register
from ._common import apply_post_transform, attr_array, given, label_output, parse_post_transform, \
    str_list, to_str

LEQ, LT, GTE, GT, EQ, NEQ, MEMBER, LEAF = range(8)
_MODE_NAMES = {"BRANCH_LEQ": LEQ, "BRANCH_LT": LT, "BRANCH_GTE": GTE, "BRANCH_GT": GT, "BRANCH_EQ": EQ,
               "BRANCH_NEQ": NEQ, "BRANCH_MEMBER": MEMBER, "LEAF": LEAF}
_AGGREGATES = ("AVERAGE", "SUM", "MIN", "MAX")
# Tuning (host/tuning.py): (sample, tree) pairs per evaluation chunk by the context's
# device_kind (tree.chunk_pairs_cpu / _cuda); the largest [node, target] table of leaf
# values (tree.dense_max_entries).


_INT32_MAX = 2 ** 31 - 1
_START_CACHE_PAIRS = 1 << 18  # the largest first level Forest._start keeps (5 arrays of this many)


def _host_take(a, idx, axis=None):
    """a.take(idx, axis) for indices known to be in range: NumPy's 'wrap' loop is about
    25% faster than its default bounds-checked one, with the same values (arguments by
    position: the cheapest call)."""
    return a.take(idx, axis, None, "wrap")


def _device_take(a, idx, axis=None):
    """a.take(idx, axis) on a GPU: CuPy's take always wraps (it has no mode argument)."""
    return a.take(idx, axis)


_SIMPLE = {LEQ: "less_equal", LT: "less", GTE: "greater_equal", GT: "greater", EQ: "equal"}


@dataclass
class _Walk:
    """A Forest laid out as slots for the level walk, on one device (Forest._walk)."""

    xp: object
    take: object            # gather for in-range indices (_host_take / _device_take)
    orig: np.ndarray        # int64 [S] on the host: the node each slot holds
    orig_dev: object        # the same on the device
    feature: object         # [S] index type: the slot's feature (0 in leaf slots)
    threshold: object       # [S] the slot's threshold (NaN in leaf slots)
    first: object           # [S] index type: the slot for a false condition (+ 1: true); leaves: itself
    modes: tuple            # the comparison modes of inner slots (NEQ turned into EQ)
    mode: object            # int8 [S], or None with a single mode
    missing: object         # bool [S] missing_value_tracks_true, or None where no slot has it
    member_rank: object     # int64 [S] BRANCH_MEMBER set rank (-1: none)
    member_values: object   # sorted distinct member values
    member_codes: object    # sorted rank * member_values.size + value index
    simple: object = None   # the comparison ufunc with one ordered/EQ mode and no missing tracks
    starts: dict = field(default_factory=dict)  # (n, f) -> Forest._start's arrays

    def condition(self, v, thr, pos):
        """The comparison outcome of every pair: [P] bool (always false in leaf slots)."""
        if self.simple is not None:
            return self.simple(v, thr)
        if len(self.modes) == 1:
            cond = self._compare(self.modes[0], v, thr, pos)
        else:
            xp = self.xp
            mode = self.take(self.mode, pos)
            cond = xp.zeros(pos.shape, dtype=bool)
            for md in self.modes:
                cond = xp.where(mode == md, self._compare(md, v, thr, pos), cond)
        if self.missing is not None:
            cond |= self.take(self.missing, pos) & self.xp.isnan(v)
        return cond

    def _compare(self, mode, v, thr, pos):
        if mode == LEQ:
            return v <= thr
        if mode == LT:
            return v < thr
        if mode == GTE:
            return v >= thr
        if mode == GT:
            return v > thr
        if mode == EQ:
            return v == thr
        # MEMBER: is (member rank of the node, value) one of the listed pairs?
        xp = self.xp
        uniq = self.member_values
        if uniq.size == 0:
            return xp.zeros(pos.shape, dtype=bool)
        rank = self.take(self.member_rank, pos)
        vi = xp.minimum(xp.searchsorted(uniq, v), uniq.size - 1)
        found = (uniq[vi] == v) & (rank >= 0)
        code = rank * uniq.size + vi
        codes = self.member_codes
        ci = xp.minimum(xp.searchsorted(codes, code), codes.size - 1)
        return found & (codes[ci] == code)


@dataclass
class Forest:
    """A normalised tree ensemble (host arrays)."""

    feature: np.ndarray      # int64 [M] (0 for leaves)
    threshold: np.ndarray    # float32/float64 [M]
    mode: np.ndarray         # int8 [M]
    true_child: np.ndarray   # int64 [M] (self for leaves)
    false_child: np.ndarray  # int64 [M]
    missing_true: np.ndarray  # bool [M]
    roots: np.ndarray        # int64 [T]
    leaf_node: np.ndarray    # int64 [E] contributions: node, target, weight
    leaf_target: np.ndarray  # int64 [E]
    leaf_weight: np.ndarray  # float64 [E]
    n_targets: int
    members: dict            # node -> np.ndarray of member values (BRANCH_MEMBER)
    depth: int = 0
    feature_range: tuple = None  # (lowest, highest) feature index of inner nodes

    def finish(self, kernel) -> "Forest":
        m = self.feature.size
        for name in ("true_child", "false_child"):
            arr = getattr(self, name)
            if arr.size and (arr.min() < 0 or arr.max() >= m):
                raise kernel.error(f"a node's {name.replace('_', ' ')} is out of range [0, {m})")
        if self.roots.size and (self.roots.min() < 0 or self.roots.max() >= m):
            raise kernel.error(f"a tree root is out of range [0, {m})")
        if self.leaf_target.size and (self.leaf_target.min() < 0 or self.leaf_target.max() >= self.n_targets):
            raise kernel.error(f"a leaf target/class id is out of range [0, {self.n_targets})")
        is_leaf = self.mode == LEAF
        if self.leaf_node.size and not is_leaf[self.leaf_node].all():
            raise kernel.error("a weight is attached to a node that is not a leaf")
        # depth by a level sweep (detects cycles)
        frontier = np.unique(self.roots)
        depth = 0
        while frontier.size:
            inner = frontier[~is_leaf[frontier]]
            if inner.size == 0:
                break
            depth += 1
            if depth > m:
                raise kernel.error("the trees contain a cycle")
            frontier = np.unique(np.concatenate([self.true_child[inner], self.false_child[inner]]))
        self.depth = depth
        inner = ~is_leaf
        self.feature_range = (int(self.feature[inner].min()), int(self.feature[inner].max())) \
            if inner.any() else None
        return self

    # ----------------------------------------------------------------- evaluation
    def slots(self, xp, x):
        """Slot (see _walk) reached by every (tree, sample) pair of x: [T, n], tree-major.

        Level by level over all pairs at once: a pair at slot s reads x at the slot's
        feature, compares it with the slot's threshold and moves to first[s] (condition
        false) or first[s] + 1 (true); leaf slots point to themselves and their condition
        is always false, so pairs that reach a leaf early stay there.  Seven array
        operations per level (four gathers, the row offset, the comparison, the move);
        the first level's gathers are precomputed per input shape (_start)."""
        n, f = x.shape
        walk = self._walk(xp)
        wide = xp is not np and n * f >= _INT32_MAX  # int32 indices on a GPU
        pos, row_base, fi, thr, first = self._start(walk, n, f, wide)
        take, x_flat, condition = walk.take, x.reshape(-1), walk.condition
        feature, threshold, first_slot = walk.feature, walk.threshold, walk.first
        with np.errstate(invalid="ignore"):  # NaN comparisons
            if self.depth:
                pos = first + condition(take(x_flat, fi), thr, pos)  # the cached arrays stay
            for _ in range(1, self.depth):
                fi = take(feature, pos)
                if wide:
                    fi = fi.astype(np.int64)
                fi += row_base
                cond = condition(take(x_flat, fi), take(threshold, pos), pos)
                pos = take(first_slot, pos)
                pos += cond
        return pos.reshape(self.roots.size, n)

    def _start(self, walk, n: int, f: int, wide: bool) -> tuple:
        """(every pair at its tree's root slot, each pair's row offset into x.reshape(-1),
        and the roots' x offsets, thresholds and first slots for every pair), for n rows
        of f features; the last four shapes' are kept (read only) when they have at most
        _START_CACHE_PAIRS pairs (a GPU chunk can have millions)."""
        key = (n, f)
        cache = walk.starts
        start = cache.get(key)
        if start is not None:
            return start
        xp, t = walk.xp, self.roots.size
        itype = walk.first.dtype
        pos = xp.repeat(xp.arange(t, dtype=itype), n)  # root slots are 0..T-1
        row_base = xp.tile(xp.arange(n, dtype=np.int64 if wide else itype) * f, t)
        fi = walk.take(walk.feature, pos).astype(row_base.dtype) + row_base
        start = (pos, row_base, fi, walk.take(walk.threshold, pos), walk.take(walk.first, pos))
        if pos.size > _START_CACHE_PAIRS:
            return start
        kept = dict(list(cache.items())[-3:])
        kept[key] = start
        walk.starts = kept  # one assignment: concurrent runs see the old or the new dict
        return start

    def _walk(self, xp) -> _Walk:
        """The forest as slots for the level walk, on xp's device (cached per namespace).

        Slots 0..T-1 hold the roots; every inner node u owns the slot pair (p_u, p_u + 1)
        holding copies of its false and true child, so a node's outcome picks the slot
        first + condition without a children table.  A node referenced twice gets two
        slots (copies of its record), never a copy of its subtree.  Leaf slots point to
        themselves and compare against NaN (always false).  NEQ nodes become EQ nodes with
        swapped children (the same result for every value, NaN included: x != t is the
        negation of x == t), so that no mode is true against a NaN threshold; they drop
        their missing-value flag (a NaN takes NEQ's true branch either way)."""
        cache = getattr(self, "_walks", None)
        if cache is not None and cache[0] is xp:
            return cache[1]
        m, t = self.feature.size, self.roots.size
        inner = self.mode != LEAF
        inner_ids = np.nonzero(inner)[0]
        neq = self.mode == NEQ
        pair = np.full(m, -1, dtype=np.int64)
        pair[inner_ids] = t + 2 * np.arange(inner_ids.size)
        orig = np.empty(t + 2 * inner_ids.size, dtype=np.int64)
        orig[:t] = self.roots
        orig[t::2] = np.where(neq, self.true_child, self.false_child)[inner_ids]
        orig[t + 1::2] = np.where(neq, self.false_child, self.true_child)[inner_ids]
        s = orig.size
        slot_inner = inner[orig]
        mode = np.where(neq, EQ, self.mode).astype(np.int8)[orig]
        modes = tuple(sorted(set(np.unique(mode[slot_inner]).tolist())))
        # int32 indices on a GPU (half the memory traffic); NumPy's gathers convert any
        # index type but intp first, a pass more per gather (about 2x)
        itype = np.int32 if xp is not np and s < _INT32_MAX else np.intp
        missing = (self.missing_true & ~neq)[orig]
        simple = None
        if len(modes) == 1 and modes[0] in _SIMPLE and not missing.any():
            simple = getattr(xp, _SIMPLE[modes[0]])
        walk = _Walk(
            xp=xp, take=_host_take if xp is np else _device_take, orig=orig, orig_dev=xp.asarray(orig),
            feature=xp.asarray(self.feature[orig].astype(itype)),
            threshold=xp.asarray(np.where(slot_inner, self.threshold[orig], np.nan).astype(self.threshold.dtype)),
            first=xp.asarray(np.where(slot_inner, pair[orig], np.arange(s)).astype(itype)),
            modes=modes, mode=xp.asarray(mode) if len(modes) > 1 else None,
            missing=xp.asarray(missing) if missing.any() else None, simple=simple, **self._member_tables(xp, orig))
        self._walks = (xp, walk)
        return walk

    def _member_tables(self, xp, orig) -> dict:
        """BRANCH_MEMBER lookups: each slot's member-set rank (-1: none), the sorted
        distinct member values and the sorted (rank * values + value index) codes."""
        member_nodes = sorted(self.members)
        rank = np.full(self.feature.size, -1, dtype=np.int64)
        rank[member_nodes] = np.arange(len(member_nodes))
        all_vals = [np.asarray(self.members[nd], dtype=np.float64) for nd in member_nodes]
        uniq = np.unique(np.concatenate(all_vals)) if all_vals else np.zeros(0)
        uniq = uniq[~np.isnan(uniq)]
        codes = []
        for r, vals in enumerate(all_vals):
            vals = vals[~np.isnan(vals)]
            codes.append(r * uniq.size + np.searchsorted(uniq, vals))
        codes = np.unique(np.concatenate(codes)) if codes else np.zeros(0, np.int64)
        return {"member_rank": xp.asarray(rank[orig]), "member_values": xp.asarray(uniq.astype(self.threshold.dtype)),
                "member_codes": xp.asarray(codes.astype(np.int64))}

    def _dense_values(self, xp, how: str):
        """(values [S, w] float64, hit [S, w] bool or None) on the device, per slot (see
        _walk): the contribution of the slot's node per target (the sum of its entries;
        for MIN / MAX their min / max, +-inf where none, with hit marking where some), or
        None when the table would exceed tree.dense_max_entries.  w is n_targets, or 4
        for 3 targets on the host (NumPy gathers rows of 8, 16 or 32 bytes in a faster
        loop than other sizes: 12 -> 7 us for 3200 rows); the padding target gets no
        contributions.  Cached per namespace."""
        walk = self._walk(xp)
        s, nt = walk.orig.size, self.n_targets
        if max(s, self.feature.size) * nt > tuning.value("tree.dense_max_entries"):
            return None
        cache = getattr(self, "_dense", None)
        if cache is None or cache[0] is not xp:
            cache = self._dense = (xp, {})
        table = cache[1].get(how)
        if table is None:
            m = self.feature.size
            width = 4 if nt == 3 and xp is np else nt
            hit = None
            if how in ("MIN", "MAX"):
                values = np.full((m, width), np.inf if how == "MIN" else -np.inf)
                (np.minimum if how == "MIN" else np.maximum).at(
                    values, (self.leaf_node, self.leaf_target), self.leaf_weight)
                hit = np.zeros((m, width), dtype=bool)
                hit[self.leaf_node, self.leaf_target] = True
                hit = xp.asarray(hit[walk.orig])
            else:
                values = np.zeros((m, width))
                np.add.at(values, (self.leaf_node, self.leaf_target), self.leaf_weight)
            table = cache[1][how] = (xp.asarray(values[walk.orig]), hit)
        return table

    def _leaf_layout(self, xp):
        """Contributions grouped by leaf (slot k of leaf l is entry start[l] + k), on
        the device: (targets, weights, count per node, start per node, most slots,
        whether every leaf has exactly one).  Cached per namespace."""
        cache = getattr(self, "_layout", None)
        if cache is not None and cache[0] is xp:
            return cache[1]
        order = np.argsort(self.leaf_node, kind="stable")
        e_node = self.leaf_node[order]
        m = self.feature.size
        count = np.bincount(e_node, minlength=m).astype(np.int64)
        start = np.concatenate([[0], np.cumsum(count)[:-1]]).astype(np.int64)
        max_slots = int(count.max()) if count.size else 0
        single = bool((count[self.mode == LEAF] == 1).all()) if max_slots == 1 else False
        layout = (xp.asarray(self.leaf_target[order]), xp.asarray(self.leaf_weight[order]),
                  xp.asarray(count), xp.asarray(start), max_slots, single)
        self._layout = (xp, layout)
        return layout

    def aggregate(self, kernel, x, how: str):
        """Per-target aggregate over the trees: [N, n_targets] float64; a target no leaf
        contributed to is 0.  Evaluated in chunks of rows sized for kernel's device."""
        xp = kernel.xp
        pairs = tuning.value(f"tree.chunk_pairs_{kernel.ctx.device_kind}")
        n = x.shape[0]
        nt = self.n_targets
        t = max(self.roots.size, 1)
        if n == 0 or nt == 0:
            return xp.zeros((n, nt), dtype=np.float64)
        dense = self._dense_values(xp, how)
        if dense is not None:  # a [slot, target] table: gather and reduce over the trees
            values, hit = dense
            take = self._walk(xp).take
            step = max(1, pairs // (t * nt))
            parts = []
            for lo in range(0, n, step):
                # tree-major [T, rows, nt]: the reduction over the trees runs over whole
                # rows, in tree order, about 5x faster than over axis 1 of [rows, T, nt]
                # for few targets
                pos = self.slots(xp, x[lo:lo + step])
                picked = take(values, pos, 0)
                if how == "MIN":
                    part = picked.min(axis=0)
                elif how == "MAX":
                    part = picked.max(axis=0)
                else:
                    part = picked.sum(axis=0)
                if hit is not None:
                    part = xp.where(take(hit, pos, 0).any(axis=0), part, 0.0)
                parts.append(part)
            out = parts[0] if len(parts) == 1 else xp.concatenate(parts)
            if out.shape[1] != nt:  # the padding target (_dense_values)
                out = xp.ascontiguousarray(out[:, :nt])
            return out / t if how == "AVERAGE" else out
        e_target, e_weight, count_d, start_d, max_slots, single = self._leaf_layout(xp)
        walk = self._walk(xp)
        minmax = how in ("MIN", "MAX")
        if minmax:
            fill = np.inf if how == "MIN" else -np.inf
            acc = xp.full(n * nt, fill)
            hits = xp.zeros(n * nt, dtype=np.int64)
        else:
            acc = xp.zeros(n * nt)
        step = max(1, pairs // t)
        for lo in range(0, n, step):
            hi = min(n, lo + step)
            pos = walk.take(walk.orig_dev, self.slots(xp, x[lo:hi])).T  # [rows, T] leaf nodes
            rows = xp.arange(lo, hi, dtype=np.int64)[:, None] * nt
            for k in range(max_slots):
                if single:  # every leaf has exactly one contribution: no masking
                    e = start_d[pos].reshape(-1)
                    flat = (rows + e_target[e].reshape(pos.shape)).reshape(-1)
                else:
                    valid = count_d[pos] > k
                    if not bool(valid.any()):
                        continue
                    e = (start_d[pos] + k)[valid]
                    flat = xp.broadcast_to(rows, pos.shape)[valid] + e_target[e]
                w = e_weight[e]
                if minmax:
                    scatter_reduce(xp, acc, flat, w, "min" if how == "MIN" else "max")
                    hits += xp.bincount(flat, minlength=n * nt)
                else:
                    acc += xp.bincount(flat, weights=w, minlength=n * nt)
        if minmax:
            acc = xp.where(hits > 0, acc, 0.0)
        out = acc.reshape(n, nt)
        if how == "AVERAGE":
            out = out / t
        return out


def _check_features(kernel, forest: Forest, n_features: int, x):
    if forest.feature_range is not None:
        lo, hi = forest.feature_range
        if lo < 0 or hi >= n_features:
            raise kernel.error(f"a node uses feature {hi if hi >= n_features else lo}, "
                               f"out of range for {n_features} features", X=x)


def _planned(kernel, attrs: tuple, build):
    """build(), cached on the kernel for these attribute values (compared by identity;
    the cache holds them, so their ids stay theirs).  At most 8 entries."""
    cache = kernel.__dict__.get("_tree_plans")
    key = tuple(map(id, attrs))
    if cache is not None:
        entry = cache.get(key)
        if entry is not None and all(map(operator.is_, entry[0], attrs)):
            return entry[1]
    plan = build()
    if cache is None:
        cache = kernel.__dict__["_tree_plans"] = {}
    if len(cache) >= 8:
        cache.pop(next(iter(cache)))
    cache[key] = (attrs, plan)
    return plan


def _prepare_input(kernel, x: Tensor, forest: Forest):
    """X as a 2-D compute array [N, F] (1-D is one row; more dims flatten) in the type
    its values are compared in: float64 for integer X or float64 thresholds, else X's
    float compute type (float32 for float32 thresholds)."""
    if x.ndim == 0:
        raise kernel.error("X must have at least one dimension", X=x)
    a = kernel.to_compute(x)
    thr = forest.threshold.dtype
    if a.dtype.kind in "iu" or (thr == np.float64 and a.dtype != np.float64):
        a = a.astype(np.float64)
    if x.ndim != 2:
        a = a.reshape(1, -1) if x.ndim == 1 else a.reshape(a.shape[0], math.prod(a.shape[1:]))
    _check_features(kernel, forest, a.shape[1], x)
    if a.shape[1] == 0:
        a = kernel.xp.zeros((a.shape[0], 1), dtype=a.dtype)
    if a.dtype != thr:
        a = a.astype(np.result_type(a.dtype, thr), copy=False)
    return a, a.dtype


# ------------------------------------------------------------ attribute parsing


def _legacy_forest(kernel, *, treeids, nodeids, featureids, values, modes, truenodeids, falsenodeids,
                   missing, w_tree, w_node, w_target, w_weight, n_targets, x) -> Forest:
    """Forest from the opset-1/3 attribute layout (node ids within trees)."""
    treeids = np.asarray(treeids if given(treeids) else [], dtype=np.int64)
    m = treeids.size
    if m == 0:
        raise kernel.error("the ensemble has no nodes (nodes_treeids is empty)", X=x)
    nodeids = np.asarray(nodeids if given(nodeids) else [], dtype=np.int64)
    featureids = np.asarray(featureids if given(featureids) else [], dtype=np.int64)
    modes_s = str_list(modes if given(modes) else [])
    tids = np.asarray(truenodeids if given(truenodeids) else [], dtype=np.int64)
    fids = np.asarray(falsenodeids if given(falsenodeids) else [], dtype=np.int64)
    lengths = {"nodes_nodeids": nodeids.size, "nodes_featureids": featureids.size,
               "nodes_values": values.size, "nodes_modes": len(modes_s),
               "nodes_truenodeids": tids.size, "nodes_falsenodeids": fids.size}
    bad = {k: v for k, v in lengths.items() if v != m}
    if bad:
        raise kernel.error(f"nodes_* attributes must all have {m} entries (nodes_treeids); got {bad}", X=x)
    miss = np.asarray(missing, dtype=bool) if given(missing) else np.zeros(m, dtype=bool)
    if miss.size != m:
        raise kernel.error(f"nodes_missing_value_tracks_true has {miss.size} entries for {m} nodes", X=x)
    try:
        mode = np.array([_MODE_NAMES[s] for s in modes_s], dtype=np.int8)
    except KeyError as exc:
        raise kernel.error(f"unknown node mode {exc.args[0]!r}", X=x) from None
    if (mode == MEMBER).any():
        raise kernel.error("BRANCH_MEMBER needs TreeEnsemble (opset 5)", X=x)
    if nodeids.min() < 0:
        raise kernel.error("node ids must be non-negative", X=x)
    span = int(nodeids.max()) + 1
    keys = treeids * span + nodeids
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    if sorted_keys.size > 1 and (sorted_keys[1:] == sorted_keys[:-1]).any():
        raise kernel.error("a (tree id, node id) pair appears twice", X=x)

    def find(tree, node, what):
        k = tree * span + node
        ok = (node >= 0) & (node < span)
        i = np.minimum(np.searchsorted(sorted_keys, np.where(ok, k, 0)), m - 1)
        found = ok & (sorted_keys[i] == k)
        if not found.all():
            raise kernel.error(f"{what} refers to a node id that does not exist in its tree", X=x)
        return order[i]

    is_leaf = mode == LEAF
    idx = np.arange(m, dtype=np.int64)
    inner = ~is_leaf
    tchild, fchild = idx.copy(), idx.copy()
    if inner.any():
        tchild[inner] = find(treeids[inner], tids[inner], "nodes_truenodeids")
        fchild[inner] = find(treeids[inner], fids[inner], "nodes_falsenodeids")
    referenced = np.zeros(m, dtype=bool)
    referenced[tchild[inner]] = True
    referenced[fchild[inner]] = True
    roots = []
    for tree in np.unique(treeids):
        cand = np.nonzero((treeids == tree) & ~referenced)[0]
        if cand.size == 0:
            raise kernel.error(f"tree {int(tree)} has no root (every node is some node's child)", X=x)
        roots.append(int(cand[0]))
    w_tree = np.asarray(w_tree if given(w_tree) else [], dtype=np.int64)
    w_node = np.asarray(w_node if given(w_node) else [], dtype=np.int64)
    w_target = np.asarray(w_target if given(w_target) else [], dtype=np.int64)
    if not (w_tree.size == w_node.size == w_target.size == w_weight.size):
        raise kernel.error("the leaf weight attributes (*_treeids, *_nodeids, *_ids, *_weights) differ in "
                           f"length: {[w_tree.size, w_node.size, w_target.size, w_weight.size]}", X=x)
    leaf_node = find(w_tree, w_node, "a leaf weight") if w_tree.size else np.zeros(0, np.int64)
    feature = np.where(is_leaf, 0, featureids)
    return Forest(feature=feature, threshold=values, mode=mode, true_child=tchild, false_child=fchild,
                  missing_true=miss & inner, roots=np.asarray(roots, dtype=np.int64), leaf_node=leaf_node,
                  leaf_target=w_target, leaf_weight=w_weight.astype(np.float64), n_targets=n_targets,
                  members={}).finish(kernel)


def _values(kernel, plain, as_tensor, name, x):
    """Float attribute: the *_as_tensor variant (double) when set, else the float list."""
    if given(as_tensor):
        if given(plain):
            raise kernel.error(f"only one of {name} and {name}_as_tensor may be set", X=x)
        return attr_array(as_tensor).reshape(-1)
    return np.asarray(list(plain) if given(plain) else [], dtype=np.float32)


@register(domain="ai.onnx.ml", versions=(1, 3))
class TreeEnsembleRegressor(KernelBase):
    """Y [N, n_targets] float32 = aggregate over trees of the reached leaves' weights
    (SUM, AVERAGE = sum / number of trees, MIN, MAX; a target no leaf contributes to
    gets 0) + base_values, then post_transform.  X is [N, F] (1-D: one row)."""

    def __call__(self, X, aggregate_function="SUM", base_values=None, base_values_as_tensor=None,
                 n_targets=None, nodes_falsenodeids=None, nodes_featureids=None, nodes_hitrates=None,
                 nodes_hitrates_as_tensor=None, nodes_missing_value_tracks_true=None, nodes_modes=None,
                 nodes_nodeids=None, nodes_treeids=None, nodes_truenodeids=None, nodes_values=None,
                 nodes_values_as_tensor=None, post_transform="NONE", target_ids=None, target_nodeids=None,
                 target_treeids=None, target_weights=None, target_weights_as_tensor=None):
        x = self.tensor(X, "X")
        self.check_inputs(x)
        attrs = (aggregate_function, base_values, base_values_as_tensor, n_targets, nodes_falsenodeids,
                 nodes_featureids, nodes_missing_value_tracks_true, nodes_modes, nodes_nodeids, nodes_treeids,
                 nodes_truenodeids, nodes_values, nodes_values_as_tensor, post_transform, target_ids,
                 target_nodeids, target_treeids, target_weights, target_weights_as_tensor)
        forest, base, agg, mode = _planned(self, attrs, lambda: self._plan(x, *attrs))
        a, _ = _prepare_input(self, x, forest)
        xp = self.xp
        y = forest.aggregate(self, a, agg)
        if base.size:
            y = y + xp.asarray(base)
        y = apply_post_transform(xp, y, mode)
        return self.result(y.astype(np.float32), DataType.FLOAT)

    def _plan(self, x, aggregate_function, base_values, base_values_as_tensor, n_targets, nodes_falsenodeids,
              nodes_featureids, nodes_missing_value_tracks_true, nodes_modes, nodes_nodeids, nodes_treeids,
              nodes_truenodeids, nodes_values, nodes_values_as_tensor, post_transform, target_ids,
              target_nodeids, target_treeids, target_weights, target_weights_as_tensor):
        mode = parse_post_transform(self, post_transform)
        agg = to_str(aggregate_function).upper()
        if agg not in _AGGREGATES:
            raise self.error(f"aggregate_function must be one of {', '.join(_AGGREGATES)}, got {agg!r}", X=x)
        weights = _values(self, target_weights, target_weights_as_tensor, "target_weights", x)
        ids = np.asarray(target_ids if given(target_ids) else [], dtype=np.int64)
        if n_targets is None:
            n_targets = int(ids.max()) + 1 if ids.size else 1
        if n_targets < 1:
            raise self.error(f"n_targets must be positive, got {n_targets}", X=x)
        forest = _legacy_forest(
            self, treeids=nodes_treeids, nodeids=nodes_nodeids, featureids=nodes_featureids,
            values=_values(self, nodes_values, nodes_values_as_tensor, "nodes_values", x), modes=nodes_modes,
            truenodeids=nodes_truenodeids, falsenodeids=nodes_falsenodeids,
            missing=nodes_missing_value_tracks_true, w_tree=target_treeids, w_node=target_nodeids,
            w_target=ids, w_weight=weights, n_targets=int(n_targets), x=x)
        base = _values(self, base_values, base_values_as_tensor, "base_values", x).astype(np.float64)
        if base.size not in (0, n_targets):
            raise self.error(f"base_values has {base.size} entries for {n_targets} targets", X=x)
        return forest, base, agg, mode


@register(domain="ai.onnx.ml", versions=(1, 3))
class TreeEnsembleClassifier(KernelBase):
    """Class scores = sum over trees of the reached leaves' class weights + base_values.

    In general the label is the class with the highest score (the first on ties) and Z
    the post-transformed scores [N, C].  Two labels with weights on one class id only
    (the usual binary encoding; base_values then may have 1 entry): with s that class's
    score, the label is the second when s > 0.5 (all weights non-negative) or s > 0
    (mixed signs), else the first; Z = [1 - t, t] with t = logistic(s) / probit(s) for
    LOGISTIC / PROBIT, else [1 - s, s] (all weights non-negative) or [-s, s].  This
    follows onnxruntime where it is self-consistent; onnxruntime differs with two classes
    that both get weights (it returns 0/1 instead of the labels) and with base values
    in the binary case."""

    class Result(NamedTuple):
        Y: Tensor
        Z: Tensor

    def __call__(self, X, base_values=None, base_values_as_tensor=None, class_ids=None, class_nodeids=None,
                 class_treeids=None, class_weights=None, class_weights_as_tensor=None,
                 classlabels_int64s=None, classlabels_strings=None, nodes_falsenodeids=None,
                 nodes_featureids=None, nodes_hitrates=None, nodes_hitrates_as_tensor=None,
                 nodes_missing_value_tracks_true=None, nodes_modes=None, nodes_nodeids=None,
                 nodes_treeids=None, nodes_truenodeids=None, nodes_values=None, nodes_values_as_tensor=None,
                 post_transform="NONE"):
        x = self.tensor(X, "X")
        self.check_inputs(x)
        attrs = (base_values, base_values_as_tensor, class_ids, class_nodeids, class_treeids, class_weights,
                 class_weights_as_tensor, classlabels_int64s, classlabels_strings, nodes_falsenodeids,
                 nodes_featureids, nodes_missing_value_tracks_true, nodes_modes, nodes_nodeids, nodes_treeids,
                 nodes_truenodeids, nodes_values, nodes_values_as_tensor, post_transform)
        forest, base, labels, using_strings, mode, binary, used, all_positive = _planned(
            self, attrs, lambda: self._plan(x, *attrs))
        a, _ = _prepare_input(self, x, forest)
        xp = self.xp
        scores = forest.aggregate(self, a, "SUM")
        if binary:
            c = int(used[0])
            s = scores[:, c] + (base[c if base.size == 2 else 0] if base.size else 0.0)
            positive = s > (0.5 if all_positive else 0.0)
            label = label_output(self, labels, positive.astype(np.int64), using_strings)
            if mode in ("LOGISTIC", "PROBIT"):
                t = apply_post_transform(xp, s, mode)
                z = xp.stack([1.0 - t, t], axis=-1)
            else:
                # softmax of one score is meaningless: the SOFTMAX modes keep it as is
                z = xp.stack([1.0 - s, s] if all_positive else [-s, s], axis=-1)
        else:
            if base.size:
                scores = scores + xp.asarray(base)
            best = xp.argmax(scores, axis=1)
            label = label_output(self, labels, best, using_strings)
            z = apply_post_transform(xp, scores, mode)
        return self.Result(label, self.result(z.astype(np.float32), DataType.FLOAT))

    def _plan(self, x, base_values, base_values_as_tensor, class_ids, class_nodeids, class_treeids, class_weights,
              class_weights_as_tensor, classlabels_int64s, classlabels_strings, nodes_falsenodeids,
              nodes_featureids, nodes_missing_value_tracks_true, nodes_modes, nodes_nodeids, nodes_treeids,
              nodes_truenodeids, nodes_values, nodes_values_as_tensor, post_transform):
        mode = parse_post_transform(self, post_transform)
        if given(classlabels_int64s) == given(classlabels_strings):
            raise self.error("exactly one of classlabels_int64s and classlabels_strings must be set", X=x)
        using_strings = given(classlabels_strings)
        labels = np.asarray(str_list(classlabels_strings), dtype=object) if using_strings else \
            np.asarray([int(v) for v in classlabels_int64s], dtype=np.int64)
        n_classes = len(labels)
        weights = _values(self, class_weights, class_weights_as_tensor, "class_weights", x)
        ids = np.asarray(class_ids if given(class_ids) else [], dtype=np.int64)
        forest = _legacy_forest(
            self, treeids=nodes_treeids, nodeids=nodes_nodeids, featureids=nodes_featureids,
            values=_values(self, nodes_values, nodes_values_as_tensor, "nodes_values", x), modes=nodes_modes,
            truenodeids=nodes_truenodeids, falsenodeids=nodes_falsenodeids,
            missing=nodes_missing_value_tracks_true, w_tree=class_treeids, w_node=class_nodeids,
            w_target=ids, w_weight=weights, n_targets=n_classes, x=x)
        base = _values(self, base_values, base_values_as_tensor, "base_values", x).astype(np.float64)
        used = np.unique(ids)
        binary = n_classes == 2 and used.size == 1
        if base.size not in (0, n_classes) and not (binary and base.size == 1):
            raise self.error(f"base_values has {base.size} entries for {n_classes} classes", X=x)
        all_positive = bool((weights >= 0).all())
        return forest, base, labels, using_strings, mode, binary, used, all_positive


@register(domain="ai.onnx.ml")
class TreeEnsemble(KernelBase):
    """Opset-5 tree ensemble: Y [N, n_targets] in X's type = aggregate_function (0
    AVERAGE, 1 SUM, 2 MIN, 3 MAX) of the reached leaves' weights per target (a target
    no leaf contributes to gets 0), then post_transform (0 NONE, 1 SOFTMAX, 2 LOGISTIC,
    3 SOFTMAX_ZERO, 4 PROBIT).  Interior nodes are nodes_*, leaves leaf_*; a child is
    a node or a leaf index according to nodes_trueleafs / nodes_falseleafs.
    membership_values lists the sets of the BRANCH_MEMBER nodes in order, each ended by
    NaN.  float16 input is evaluated in float32 and rounded once."""

    def __call__(self, X, aggregate_function=1, leaf_targetids=None, leaf_weights=None,
                 membership_values=None, n_targets=None, nodes_falseleafs=None, nodes_falsenodeids=None,
                 nodes_featureids=None, nodes_hitrates=None, nodes_missing_value_tracks_true=None,
                 nodes_modes=None, nodes_splits=None, nodes_trueleafs=None, nodes_truenodeids=None,
                 post_transform=0, tree_roots=None):
        x = self.tensor(X, "X")
        self.check_inputs(x)
        attrs = (x.data_type, aggregate_function, leaf_targetids, leaf_weights, membership_values, n_targets,
                 nodes_falseleafs, nodes_falsenodeids, nodes_featureids, nodes_missing_value_tracks_true,
                 nodes_modes, nodes_splits, nodes_trueleafs, nodes_truenodeids, post_transform, tree_roots)
        forest, agg, mode = _planned(self, attrs, lambda: self._plan(x, *attrs[1:]))
        a, _ = _prepare_input(self, x, forest)
        xp = self.xp
        y = forest.aggregate(self, a, agg)
        y = apply_post_transform(xp, y, mode)
        return self.from_compute(y, x.data_type)

    def _plan(self, x, aggregate_function, leaf_targetids, leaf_weights, membership_values, n_targets,
              nodes_falseleafs, nodes_falsenodeids, nodes_featureids, nodes_missing_value_tracks_true,
              nodes_modes, nodes_splits, nodes_trueleafs, nodes_truenodeids, post_transform, tree_roots):
        mode = parse_post_transform(self, post_transform)
        if not 0 <= int(aggregate_function) < 4:
            raise self.error(f"aggregate_function must be 0..3, got {aggregate_function}", X=x)
        agg = _AGGREGATES[int(aggregate_function)]
        forest = self._forest(x, leaf_targetids, leaf_weights, membership_values, n_targets, nodes_falseleafs,
                              nodes_falsenodeids, nodes_featureids, nodes_missing_value_tracks_true,
                              nodes_modes, nodes_splits, nodes_trueleafs, nodes_truenodeids, tree_roots)
        return forest, agg, mode

    def _forest(self, x, leaf_targetids, leaf_weights, membership_values, n_targets, nodes_falseleafs,
                nodes_falsenodeids, nodes_featureids, nodes_missing, nodes_modes, nodes_splits, nodes_trueleafs,
                nodes_truenodeids, tree_roots) -> Forest:
        required = {"leaf_targetids": leaf_targetids, "leaf_weights": leaf_weights,
                    "nodes_falseleafs": nodes_falseleafs, "nodes_falsenodeids": nodes_falsenodeids,
                    "nodes_featureids": nodes_featureids, "nodes_modes": nodes_modes, "nodes_splits": nodes_splits,
                    "nodes_trueleafs": nodes_trueleafs, "nodes_truenodeids": nodes_truenodeids,
                    "tree_roots": tree_roots}
        missing_attrs = [k for k, v in required.items() if v is None]
        if missing_attrs:
            raise self.error(f"required attribute(s) {missing_attrs} missing", X=x)
        modes = attr_array(nodes_modes).reshape(-1).astype(np.int64)
        ni = modes.size
        splits = attr_array(nodes_splits).reshape(-1)
        if isinstance(nodes_splits, Tensor) and nodes_splits.data_type != x.data_type:
            raise self.type_error(f"nodes_splits is {dtypes.describe(nodes_splits.data_type)} but X is "
                                  f"{dtypes.describe(x.data_type)}", X=x)
        splits = splits.astype(np.float64 if splits.dtype == np.float64 else np.float32)
        arrays = {name: np.asarray(v, dtype=np.int64).reshape(-1) for name, v in (
            ("nodes_featureids", nodes_featureids), ("nodes_truenodeids", nodes_truenodeids),
            ("nodes_falsenodeids", nodes_falsenodeids), ("nodes_trueleafs", nodes_trueleafs),
            ("nodes_falseleafs", nodes_falseleafs))}
        lengths = {k: v.size for k, v in arrays.items()}
        lengths["nodes_splits"] = splits.size
        bad = {k: v for k, v in lengths.items() if v != ni}
        if bad:
            raise self.error(f"nodes_* attributes must all have {ni} entries (nodes_modes); got {bad}", X=x)
        if ni and (modes.min() < 0 or modes.max() > MEMBER):
            raise self.error(f"nodes_modes values must be 0..6, got {sorted(set(modes.tolist()))}", X=x)
        miss = np.asarray(nodes_missing, dtype=bool).reshape(-1) if given(nodes_missing) else np.zeros(ni, bool)
        if miss.size != ni:
            raise self.error(f"nodes_missing_value_tracks_true has {miss.size} entries for {ni} nodes", X=x)
        weights = attr_array(leaf_weights).reshape(-1).astype(np.float64)
        targets = np.asarray(leaf_targetids, dtype=np.int64).reshape(-1)
        nl = targets.size
        if weights.size != nl:
            raise self.error(f"leaf_weights has {weights.size} entries for {nl} leaf_targetids", X=x)
        if n_targets is None:
            n_targets = int(targets.max()) + 1 if nl else 1
        if int(n_targets) < 1:
            raise self.error(f"n_targets must be positive, got {n_targets}", X=x)

        def child(ids, leafs, what):
            leafs = leafs.astype(bool)
            limit = np.where(leafs, nl, ni)
            if ids.size and ((ids < 0) | (ids >= limit)).any():
                raise self.error(f"{what} has an index out of range", X=x)
            return np.where(leafs, ni + ids, ids)

        tchild = child(arrays["nodes_truenodeids"], arrays["nodes_trueleafs"], "nodes_truenodeids")
        fchild = child(arrays["nodes_falsenodeids"], arrays["nodes_falseleafs"], "nodes_falsenodeids")
        roots = np.asarray(tree_roots, dtype=np.int64).reshape(-1)
        if roots.size and (roots.min() < 0 or roots.max() >= ni):
            raise self.error(f"tree_roots must index nodes_* ([0, {ni})), got {roots.tolist()}", X=x)
        members = {}
        member_nodes = np.nonzero(modes == MEMBER)[0]
        if member_nodes.size:
            if not given(membership_values):
                raise self.error("BRANCH_MEMBER nodes need membership_values", X=x)
            mv = attr_array(membership_values).reshape(-1).astype(np.float64)
            ends = np.nonzero(np.isnan(mv))[0]
            if ends.size != member_nodes.size:
                raise self.error(f"membership_values holds {ends.size} NaN-delimited sets for "
                                 f"{member_nodes.size} BRANCH_MEMBER nodes", X=x)
            begin = 0
            for node, end in zip(member_nodes.tolist(), ends.tolist()):
                members[node] = mv[begin:end]
                begin = end + 1
        m = ni + nl
        leaf_idx = np.arange(ni, m, dtype=np.int64)
        return Forest(
            feature=np.concatenate([arrays["nodes_featureids"], np.zeros(nl, np.int64)]),
            threshold=np.concatenate([splits, np.zeros(nl, splits.dtype)]),
            mode=np.concatenate([modes, np.full(nl, LEAF)]).astype(np.int8),
            true_child=np.concatenate([tchild, leaf_idx]), false_child=np.concatenate([fchild, leaf_idx]),
            missing_true=np.concatenate([miss, np.zeros(nl, bool)]), roots=roots, leaf_node=leaf_idx,
            leaf_target=targets, leaf_weight=weights, n_targets=int(n_targets), members=members).finish(self)
