"""Tree ensembles: the level-by-level evaluation over all (row, tree) pairs, the dense
leaf-value table against the sparse scatter path, onnx.reference on random forests, and
the per-kernel planning cache (attributes are parsed once per attribute set).  The legacy
operators are compared with onnxruntime (onnx.reference treats NaN with missing-value
tracking differently) and the classifier with onnx.reference."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from gpukernels.kernels import KernelContext
from gpukernels.kernels.ml import tree as tree_mod
from gpukernels.kernels.ml.tree import TreeEnsemble, TreeEnsembleClassifier, TreeEnsembleRegressor
from gpukernels.runtime import Session
from gpukernels.tensor import Tensor

from tests.ort_reference import run_ml_node
from tests.reference.trees import MODES, evaluate, legacy_attrs, random_forest, v5_attrs


def _inputs(rng, n, f, nan=0.1):
    x = rng.standard_normal((n, f)).astype(np.float32)
    x[rng.random(x.shape) < nan] = np.nan
    x[rng.random(x.shape) < 0.1] = 0.5
    return x


def _reference(op, attrs, x, n_outputs=1, opset_ml=3):
    node = helper.make_node(op, ["X"], [f"Y{i}" for i in range(n_outputs)], domain="ai.onnx.ml", **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, None)],
                              [helper.make_value_info(f"Y{i}", __import__("onnx").TypeProto())
                               for i in range(n_outputs)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19),
                                                    helper.make_opsetid("ai.onnx.ml", opset_ml)])
    return ReferenceEvaluator(model).run(None, {"X": x})


@pytest.mark.parametrize("agg", ["SUM", "AVERAGE", "MIN", "MAX"])
@pytest.mark.parametrize("dense", [True, False])
def test_regressor_all_modes_vs_onnx_reference(device, rng, tuning, agg, dense):
    if not dense:
        tuning({"tree.dense_max_entries": 0})  # the sparse scatter path
    trees = random_forest(rng, 20, 6, 3, max_depth=6, modes=tuple(MODES), missing=True, entries_per_leaf=3,
                          thresholds=[-0.5, 0.0, 0.5, 1.0])
    x = _inputs(rng, 64, 6)
    attrs = legacy_attrs(trees)
    attrs.update(n_targets=3, aggregate_function=agg)
    y = TreeEnsembleRegressor(KernelContext(device), 3)(x, **attrs).numpy()
    ref, _ = evaluate(trees, x, 3, agg)
    np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(y, run_ml_node("TreeEnsembleRegressor", [x], attrs, opset_ml=3)[0], rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("post", ["NONE", "SOFTMAX", "LOGISTIC"])
def test_classifier_vs_onnx_reference(device, rng, post):
    trees = random_forest(rng, 20, 8, 4, max_depth=5, modes=("BRANCH_LEQ", "BRANCH_GT"), entries_per_leaf=4)
    x = _inputs(rng, 64, 8, nan=0.0)
    attrs = legacy_attrs(trees, "class")
    attrs.update(classlabels_int64s=[10, 11, 12, 13], post_transform=post)
    r = TreeEnsembleClassifier(KernelContext(device), 3)(x, **attrs)
    label, z = _reference("TreeEnsembleClassifier", attrs, x, 2)
    np.testing.assert_array_equal(r.Y.numpy(), label)
    np.testing.assert_allclose(r.Z.numpy(), z, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("agg", [0, 1, 2, 3])
def test_tree_ensemble_v5_dense_and_sparse_agree(device, rng, tuning, agg):
    trees = random_forest(rng, 12, 5, 3, max_depth=6, modes=tuple(MODES), missing=True)
    attrs = {k: Tensor.from_proto(v) if hasattr(v, "dims") else v for k, v in v5_attrs(trees, 3).items()}
    x = _inputs(rng, 50, 5)
    dense = TreeEnsemble(KernelContext(device))(x, aggregate_function=agg, **attrs).numpy()
    tuning({"tree.dense_max_entries": 0})
    sparse = TreeEnsemble(KernelContext(device))(x, aggregate_function=agg, **attrs).numpy()
    np.testing.assert_allclose(dense, sparse, rtol=1e-6, atol=1e-6)
    ref, _ = evaluate(trees, x, 3, ["AVERAGE", "SUM", "MIN", "MAX"][agg])
    np.testing.assert_allclose(dense, ref, rtol=1e-5, atol=1e-5)


def test_planning_is_cached_per_attribute_set(device, rng, monkeypatch):
    trees = random_forest(rng, 5, 4, 2, entries_per_leaf=2)
    attrs = legacy_attrs(trees)
    attrs["n_targets"] = 2
    k = TreeEnsembleRegressor(KernelContext(device), 3)
    x = _inputs(rng, 10, 4, nan=0.0)
    calls = []
    real = tree_mod._legacy_forest
    monkeypatch.setattr(tree_mod, "_legacy_forest", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    y1 = k(x, **attrs).numpy()
    y2 = k(x[:3], **attrs).numpy()
    assert len(calls) == 1  # parsed once for both calls
    np.testing.assert_array_equal(y1[:3], y2)
    # a new attribute value (a new list object) is a new plan
    other = dict(attrs, target_weights=[w * 2 for w in attrs["target_weights"]])
    np.testing.assert_allclose(k(x, **other).numpy(), 2 * y1, rtol=1e-6)
    assert len(calls) == 2
    np.testing.assert_array_equal(k(x, **attrs).numpy(), y1)  # the first plan is still cached
    assert len(calls) == 2


def test_session_runs_reuse_the_plan(rng):
    trees = random_forest(rng, 20, 10, 3, max_depth=6, entries_per_leaf=3)
    attrs = legacy_attrs(trees, "class")
    attrs.update(classlabels_int64s=[0, 1, 2])
    node = helper.make_node("TreeEnsembleClassifier", ["X"], ["Y", "Z"], domain="ai.onnx.ml", **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 10])],
                              [helper.make_tensor_value_info("Y", TensorProto.INT64, [None]),
                               helper.make_tensor_value_info("Z", TensorProto.FLOAT, [None, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])
    model.ir_version = 8
    sess = Session(model)
    x = _inputs(rng, 64, 10, nan=0.0)
    first = sess.run(None, {"X": x})
    kernel = sess.graph.nodes[0].kernel
    assert len(kernel.__dict__["_tree_plans"]) == 1
    second = sess.run(None, {"X": x})
    assert len(kernel.__dict__["_tree_plans"]) == 1
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)
    label, z = _reference("TreeEnsembleClassifier", attrs, x, 2)
    np.testing.assert_array_equal(first[0], label)
    np.testing.assert_allclose(first[1], z, rtol=1e-5, atol=1e-6)
