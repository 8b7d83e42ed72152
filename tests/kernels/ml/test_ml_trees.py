"""TreeEnsemble (opset 5), TreeEnsembleRegressor and TreeEnsembleClassifier."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from gpukernels.errors import KernelInputError, KernelTypeError
from gpukernels.kernels import KernelContext
from gpukernels.kernels.ml.tree import TreeEnsemble, TreeEnsembleClassifier, TreeEnsembleRegressor
from gpukernels.tensor import Tensor

from tests.ort_reference import run_ml_node
from tests.reference import post_transform
from tests.reference.trees import MODES, evaluate, legacy_attrs, random_forest, v5_attrs

AGGS = ["AVERAGE", "SUM", "MIN", "MAX"]


def K(cls, device, version=None):
    return cls(KernelContext(device), version=version)


def tensors(attrs):
    return {k: Tensor.from_proto(v) if isinstance(v, TensorProto) else v for k, v in attrs.items()}


def inputs(rng, n, f, dtype=np.float32, nan=0.1):
    x = rng.standard_normal((n, f)).astype(dtype)
    x[rng.random(x.shape) < nan] = np.nan
    x[rng.random(x.shape) < 0.1] = 0.5  # hits the thresholds exactly (EQ / LEQ edges)
    return x


@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("modes", [("BRANCH_LEQ",), tuple(MODES)])
@pytest.mark.parametrize("entries", [1, 2])
@pytest.mark.parametrize("version", [1, 3])
def test_regressor_random(device, rng, agg, modes, entries, version):
    trees = random_forest(rng, 6, 4, 3, modes=modes, missing=True, entries_per_leaf=entries,
                          thresholds=[-0.5, 0.0, 0.5, 1.0])
    x = inputs(rng, 40, 4)
    attrs = legacy_attrs(trees)
    attrs.update(n_targets=3, aggregate_function=agg)
    y = K(TreeEnsembleRegressor, device, version)(x, **attrs).numpy()
    ref, _ = evaluate(trees, x, 3, agg)
    assert y.dtype == np.float32 and y.shape == (40, 3)
    np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(y, run_ml_node("TreeEnsembleRegressor", [x], attrs, opset_ml=3)[0],
                               rtol=1e-5, atol=1e-5)
    # base values are added to every target (onnxruntime skips targets no leaf reached)
    attrs["base_values"] = [0.5, -1.0, 2.0]
    yb = K(TreeEnsembleRegressor, device, version)(x, **attrs).numpy()
    np.testing.assert_allclose(yb, ref + [0.5, -1.0, 2.0], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float64, np.int64, np.int32])
def test_regressor_input_types_and_double_thresholds(device, rng, dtype):
    trees = random_forest(rng, 4, 3, 1, thresholds=[-1.0, 0.0, 1.0, 2.0])
    x = (rng.standard_normal((20, 3)) * 2).astype(dtype)
    attrs = legacy_attrs(trees)
    vals = attrs.pop("nodes_values")
    attrs["nodes_values_as_tensor"] = helper.make_tensor("v", TensorProto.DOUBLE, (len(vals),), vals)
    w = attrs.pop("target_weights")
    attrs["target_weights_as_tensor"] = helper.make_tensor("w", TensorProto.DOUBLE, (len(w),), w)
    y = K(TreeEnsembleRegressor, device, 3)(x, **tensors(attrs)).numpy()
    ref, _ = evaluate(trees, x.astype(np.float64), 1, "SUM", thr_dtype=np.float64)
    np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mode", ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO"])
@pytest.mark.parametrize("n_classes", [3, 4])
def test_classifier_multiclass(device, rng, mode, n_classes):
    trees = random_forest(rng, 5, 4, n_classes, entries_per_leaf=n_classes)
    x = inputs(rng, 30, 4, nan=0.0)
    attrs = legacy_attrs(trees, "class")
    attrs.update(classlabels_int64s=list(range(100, 100 + n_classes)), post_transform=mode,
                 base_values=rng.standard_normal(n_classes).tolist())
    r = K(TreeEnsembleClassifier, device, 3)(x, **attrs)
    scores, _ = evaluate(trees, x, n_classes)
    scores += np.float32(attrs["base_values"])
    np.testing.assert_array_equal(r.Y.numpy(), 100 + scores.argmax(1))
    np.testing.assert_allclose(r.Z.numpy(), post_transform(scores, mode), rtol=1e-5, atol=1e-6)
    ort_y, ort_z = run_ml_node("TreeEnsembleClassifier", [x], attrs, n_outputs=2, opset_ml=3)
    np.testing.assert_array_equal(r.Y.numpy(), ort_y)
    np.testing.assert_allclose(r.Z.numpy(), ort_z, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("sign", ["positive", "mixed"])
@pytest.mark.parametrize("mode", ["NONE", "LOGISTIC", "SOFTMAX"])
@pytest.mark.parametrize("base", [None, 1])
def test_classifier_binary(device, rng, sign, mode, base):
    trees = random_forest(rng, 4, 3, 1, entries_per_leaf=1, weight_sign=sign)
    x = inputs(rng, 30, 3, nan=0.0)
    attrs = legacy_attrs(trees, "class")
    attrs.update(classlabels_strings=["no", "yes"], post_transform=mode)
    if base:
        attrs["base_values"] = [0.25]
    r = K(TreeEnsembleClassifier, device, 3)(x, **attrs)
    s, _ = evaluate(trees, x, 1)
    s = s[:, 0] + (np.float32(0.25) if base else 0)
    pos = s > (0.5 if sign == "positive" else 0)
    assert r.Y.numpy().tolist() == ["yes" if p else "no" for p in pos]
    t = 1 / (1 + np.exp(-s)) if mode == "LOGISTIC" else s
    want = np.stack([1 - t, t] if (sign == "positive" or mode == "LOGISTIC") else [-t, t], 1)
    np.testing.assert_allclose(r.Z.numpy(), want, rtol=1e-5, atol=1e-6)
    ort_y, ort_z = run_ml_node("TreeEnsembleClassifier", [x], attrs, n_outputs=2, opset_ml=3)
    np.testing.assert_array_equal(r.Y.numpy(), ort_y)
    np.testing.assert_allclose(r.Z.numpy(), ort_z, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_tree_ensemble_v5_random(device, rng, agg, dtype):
    trees = random_forest(rng, 7, 5, 4, modes=tuple(MODES), missing=True, thresholds=[-0.5, 0.0, 0.5])
    x = inputs(rng, 50, 5, dtype=dtype)
    attrs = v5_attrs(trees, 4, dtype)
    attrs["nodes_missing_value_tracks_true"] = attrs["nodes_missing_value_tracks_true"]
    attrs["aggregate_function"] = AGGS.index(agg)
    y = K(TreeEnsemble, device)(x, **tensors(attrs)).numpy()
    ref, _ = evaluate(trees, x.astype(np.float32) if dtype == np.float16 else x, 4, agg,
                      thr_dtype=np.float64 if dtype == np.float64 else np.float32)
    assert y.dtype == dtype
    tol = 2e-3 if dtype == np.float16 else 1e-6
    np.testing.assert_allclose(y, ref, rtol=tol, atol=tol)
    if dtype != np.float16:
        np.testing.assert_allclose(y, run_ml_node("TreeEnsemble", [x], attrs, opset_ml=5)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("post", [1, 2, 3, 4])
def test_tree_ensemble_v5_post_transform(device, rng, post):
    trees = random_forest(rng, 3, 2, 3, thresholds=[0.0])
    x = inputs(rng, 10, 2, nan=0.0)
    attrs = v5_attrs(trees, 3)
    y = K(TreeEnsemble, device)(x, post_transform=post, **tensors(attrs)).numpy()
    ref, _ = evaluate(trees, x, 3)
    mode = ["NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT"][post]
    with np.errstate(all="ignore"):
        np.testing.assert_allclose(y, post_transform(ref, mode), rtol=1e-5, atol=1e-6)


def test_tree_ensemble_membership_and_single_leaf_tree(device):
    # tree 0: x0 in {1, 2.5} ? leaf0 : leaf1; tree 1 is a single leaf (both branches -> leaf 2)
    attrs = dict(
        n_targets=2, tree_roots=[0, 1],
        nodes_modes=Tensor(np.array([6, 0], np.uint8)),
        nodes_featureids=[0, 0], nodes_splits=Tensor(np.array([0.0, 0.0], np.float32)),
        nodes_truenodeids=[0, 2], nodes_trueleafs=[1, 1], nodes_falsenodeids=[1, 2], nodes_falseleafs=[1, 1],
        leaf_targetids=[0, 1, 1], leaf_weights=Tensor(np.array([1.0, 10.0, 100.0], np.float32)),
        membership_values=Tensor(np.array([1.0, 2.5, np.nan], np.float32)))
    x = np.array([[1.0], [2.5], [3.0], [np.nan]], np.float32)
    y = K(TreeEnsemble, device)(x, **attrs).numpy()
    np.testing.assert_array_equal(y, [[1, 100], [1, 100], [0, 110], [0, 110]])
    attrs["nodes_missing_value_tracks_true"] = [1, 0]
    y = K(TreeEnsemble, device)(x, **attrs).numpy()
    np.testing.assert_array_equal(y[3], [1, 100])


def test_chunking_and_deep_trees(device, rng, tuning):
    tuning({"tree.chunk_pairs_cpu": 64, "tree.chunk_pairs_cuda": 64})
    trees = random_forest(rng, 9, 6, 2, max_depth=9, modes=("BRANCH_LT", "BRANCH_GTE"))
    x = inputs(rng, 101, 6)
    attrs = legacy_attrs(trees)
    y = K(TreeEnsembleRegressor, device, 3)(x, n_targets=2, **attrs).numpy()
    np.testing.assert_allclose(y, evaluate(trees, x, 2)[0], rtol=1e-6, atol=1e-6)


def test_empty_and_1d_input(device, rng):
    trees = random_forest(rng, 2, 3, 1)
    attrs = legacy_attrs(trees)
    assert K(TreeEnsembleRegressor, device, 3)(np.zeros((0, 3), np.float32), **attrs).numpy().shape == (0, 1)
    x = rng.standard_normal(3).astype(np.float32)
    y = K(TreeEnsembleRegressor, device, 3)(x, **attrs).numpy()
    np.testing.assert_allclose(y, evaluate(trees, x[None], 1)[0], rtol=1e-6)


def test_tree_errors(device, rng):
    trees = random_forest(rng, 2, 3, 2)
    attrs = legacy_attrs(trees)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    with pytest.raises(KernelInputError, match="TreeEnsembleRegressor.*feature"):
        K(TreeEnsembleRegressor, device, 3)(x[:, :1], **attrs)
    bad = dict(attrs, nodes_truenodeids=[99] * len(attrs["nodes_truenodeids"]))
    with pytest.raises(KernelInputError, match="TreeEnsembleRegressor.*node id"):
        K(TreeEnsembleRegressor, device, 3)(x, **bad)
    with pytest.raises(KernelInputError, match="TreeEnsembleRegressor.*aggregate_function"):
        K(TreeEnsembleRegressor, device, 3)(x, aggregate_function="MEDIAN", **attrs)
    with pytest.raises(KernelInputError, match="TreeEnsembleRegressor.*entries"):
        K(TreeEnsembleRegressor, device, 3)(x, **dict(attrs, nodes_values=[0.0]))
    cyc = legacy_attrs([[{"id": 0, "mode": "BRANCH_LEQ", "feature": 0, "value": 0.0, "missing": 0, "true": 1,
                          "false": 1}, {"id": 1, "mode": "BRANCH_LEQ", "feature": 0, "value": 0.0, "missing": 0,
                                        "true": 0, "false": 0}]])
    with pytest.raises(KernelInputError, match="TreeEnsembleRegressor.*(root|cycle)"):
        K(TreeEnsembleRegressor, device, 3)(x, **cyc)
    with pytest.raises(KernelTypeError, match="TreeEnsembleRegressor"):
        K(TreeEnsembleRegressor, device, 3)(x.astype(np.float16), **attrs)
    v5 = tensors(v5_attrs(random_forest(rng, 2, 3, 2), 2))
    with pytest.raises(KernelTypeError, match="TreeEnsemble.*nodes_splits"):
        K(TreeEnsemble, device)(x.astype(np.float64), **v5)
    with pytest.raises(KernelInputError, match="TreeEnsemble.*aggregate_function"):
        K(TreeEnsemble, device)(x, aggregate_function=7, **v5)
    with pytest.raises(KernelInputError, match="TreeEnsemble.*tree_roots"):
        K(TreeEnsemble, device)(x, **dict(v5, tree_roots=[1000]))


def test_deprecated_versions_not_registered():
    assert TreeEnsembleRegressor.versions == (1, 3) and TreeEnsembleClassifier.versions == (1, 3)
