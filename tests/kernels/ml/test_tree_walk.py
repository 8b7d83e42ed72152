"""Tree ensembles: the slot layout of the level walk (tree.Forest._walk) against the
plain recursive float64 evaluator: every single comparison mode (NEQ is walked as EQ with
swapped children; leaf slots compare against NaN), with and without missing-value
tracking, NaN thresholds, leaves at every depth, nodes shared by two parents, inputs of
changing row counts (the per-shape first level, kept only when small), and the padded
3-target value table."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from gpukernels.kernels import KernelContext
from gpukernels.kernels.ml import tree as tree_mod
from gpukernels.kernels.ml.tree import TreeEnsemble, TreeEnsembleClassifier, TreeEnsembleRegressor
from gpukernels.tensor import Tensor

from tests.reference.trees import MODES, evaluate, legacy_attrs, random_forest, v5_attrs


def _inputs(rng, n, f, nan=0.15):
    x = rng.standard_normal((n, f)).astype(np.float32)
    x[rng.random(x.shape) < 0.15] = 0.5  # hits a threshold exactly (EQ / NEQ / LEQ edges)
    x[rng.random(x.shape) < nan] = np.nan
    return x


@pytest.mark.parametrize("missing", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_single_mode_forest(device, rng, mode, missing):
    trees = random_forest(rng, 15, 5, 2, max_depth=6, modes=(mode,), missing=missing, entries_per_leaf=2,
                          thresholds=[-0.5, 0.0, 0.5, 1.0, np.nan])
    x = _inputs(rng, 37, 5)
    attrs = legacy_attrs(trees)
    attrs.update(n_targets=2)
    y = TreeEnsembleRegressor(KernelContext(device), 3)(x, **attrs).numpy()
    ref, _ = evaluate(trees, x, 2)
    np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mode", ["BRANCH_NEQ", "BRANCH_EQ", "BRANCH_GT"])
def test_single_mode_tree_ensemble_v5_double(device, rng, mode):
    trees = random_forest(rng, 10, 4, 3, max_depth=5, modes=(mode,), missing=True,
                          thresholds=[-0.5, 0.0, 0.5, 1.0])
    attrs = {k: Tensor.from_proto(v) if hasattr(v, "dims") else v for k, v in v5_attrs(trees, 3, np.float64).items()}
    x = _inputs(rng, 29, 4).astype(np.float64)
    y = TreeEnsemble(KernelContext(device))(x, aggregate_function=1, **attrs).numpy()
    ref, _ = evaluate(trees, x, 3, thr_dtype=np.float64)
    assert y.dtype == np.float64
    np.testing.assert_allclose(y, ref, rtol=1e-12, atol=1e-12)


def _shared_child_forest(rng):
    """Random trees where, in every tree with a grandchild, both children of the root's
    true child lead to the same node (a node with two parents)."""
    trees = random_forest(rng, 12, 4, 2, max_depth=5, modes=("BRANCH_LEQ", "BRANCH_NEQ"), missing=True,
                          thresholds=[-0.5, 0.0, 0.5])
    shared = 0
    for nodes in trees:
        top = nodes[0]
        if top["mode"] == "LEAF":
            continue
        mid = nodes[top["true"]]
        if mid["mode"] != "LEAF":
            mid["false"] = mid["true"]  # the false subtree stays, unreachable
            shared += 1
    assert shared
    return trees


def test_node_with_two_parents(device, rng):
    trees = _shared_child_forest(rng)
    x = _inputs(rng, 41, 4)
    attrs = legacy_attrs(trees)
    attrs.update(n_targets=2)
    for agg in ("SUM", "MIN"):
        y = TreeEnsembleRegressor(KernelContext(device), 3)(x, **dict(attrs, aggregate_function=agg)).numpy()
        ref, _ = evaluate(trees, x, 2, agg)
        np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-6)


def test_changing_row_counts_reuse_one_kernel(device, rng, tuning):
    trees = random_forest(rng, 9, 6, 2, max_depth=7, modes=("BRANCH_LT",), thresholds=[-0.5, 0.0, 0.5])
    attrs = legacy_attrs(trees)
    attrs.update(n_targets=2)
    k = TreeEnsembleRegressor(KernelContext(device), 3)
    x = _inputs(rng, 40, 6, nan=0.0)
    for n in (5, 7, 5, 1, 9, 11, 13, 5, 40):  # more shapes than the first-level cache keeps
        np.testing.assert_allclose(k(x[:n], **attrs).numpy(), evaluate(trees, x[:n], 2)[0], rtol=1e-6, atol=1e-6)
    tuning({"tree.chunk_pairs_cpu": 9 * 3, "tree.chunk_pairs_cuda": 9 * 3})  # chunks of 1 and 3 rows, the last shorter
    np.testing.assert_allclose(k(x[:17], **attrs).numpy(), evaluate(trees, x[:17], 2)[0], rtol=1e-6, atol=1e-6)


def test_large_first_levels_are_not_kept(device, rng, monkeypatch):
    trees = random_forest(rng, 6, 3, 1, max_depth=4)
    attrs = legacy_attrs(trees)
    k = TreeEnsembleRegressor(KernelContext(device), 3)
    x = _inputs(rng, 20, 3, nan=0.0)
    monkeypatch.setattr(tree_mod, "_START_CACHE_PAIRS", 6 * 10)
    for n in (20, 10, 20):
        np.testing.assert_allclose(k(x[:n], **attrs).numpy(), evaluate(trees, x[:n], 1)[0], rtol=1e-6, atol=1e-6)
    forest = next(iter(k.__dict__["_tree_plans"].values()))[1][0]
    assert list(forest._walk(k.xp).starts) == [(10, 3)]  # 20 rows x 6 trees: over the limit


@pytest.mark.parametrize("agg", ["SUM", "AVERAGE", "MIN", "MAX"])
def test_three_targets_negative_scores(device, rng, agg):
    """3 targets use a padded value table on the host: the padding never shows, not even
    as the argmax of all-negative class scores."""
    trees = random_forest(rng, 8, 5, 3, max_depth=5, entries_per_leaf=2, weight_sign="positive")
    for nodes in trees:
        for nd in nodes:
            if "weights" in nd:
                nd["weights"] = [(tg, -w - 0.1) for tg, w in nd["weights"]]
    x = _inputs(rng, 30, 5, nan=0.0)
    attrs = legacy_attrs(trees)
    attrs.update(n_targets=3, aggregate_function=agg)
    y = TreeEnsembleRegressor(KernelContext(device), 3)(x, **attrs).numpy()
    ref, _ = evaluate(trees, x, 3, agg)
    np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-6)
    cattrs = legacy_attrs(copy.deepcopy(trees), "class")
    cattrs.update(classlabels_strings=["a", "b", "c"])
    r = TreeEnsembleClassifier(KernelContext(device), 3)(x, **cattrs)
    scores, _ = evaluate(trees, x, 3)
    np.testing.assert_array_equal(r.Y.numpy(), np.array(["a", "b", "c"], dtype=object)[scores.argmax(axis=1)])
    np.testing.assert_allclose(r.Z.numpy(), scores, rtol=1e-6, atol=1e-6)
