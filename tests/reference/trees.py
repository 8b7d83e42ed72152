"""Tree ensembles: a plain recursive float64 evaluator (``evaluate``), and the random
ensembles it checks the kernels on, in the legacy (opset 1/3) layout and the opset-5
TreeEnsemble layout.  Import as ``from tests.reference.trees import evaluate``."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

MODES = ["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ"]


def random_forest(rng, n_trees, n_features, n_targets, max_depth=4, modes=("BRANCH_LEQ",), missing=False,
                  entries_per_leaf=1, weight_sign="mixed", thresholds=None):
    """A list of trees; a tree is a list of nodes (dicts) with node ids 0.. (root 0)."""
    trees = []
    for _ in range(n_trees):
        nodes = []

        def build(depth):
            nid = len(nodes)
            node = {"id": nid}
            nodes.append(node)
            if depth >= max_depth or (depth > 0 and rng.random() < 0.25):
                node["mode"] = "LEAF"
                tg = rng.choice(n_targets, size=min(entries_per_leaf, n_targets), replace=False)
                w = rng.standard_normal(tg.size)
                if weight_sign == "positive":
                    w = np.abs(w)
                node["weights"] = list(zip(tg.tolist(), w.tolist()))
                return nid
            node["mode"] = modes[rng.integers(len(modes))]
            node["feature"] = int(rng.integers(n_features))
            node["value"] = float(rng.choice(thresholds)) if thresholds is not None else float(rng.standard_normal())
            node["missing"] = int(rng.integers(2)) if missing else 0
            node["true"] = build(depth + 1)
            node["false"] = build(depth + 1)
            return nid

        build(0)
        trees.append(nodes)
    return trees


def legacy_attrs(trees, prefix="target"):
    a = {k: [] for k in ("nodes_treeids", "nodes_nodeids", "nodes_featureids", "nodes_values", "nodes_modes",
                         "nodes_truenodeids", "nodes_falsenodeids", "nodes_missing_value_tracks_true",
                         f"{prefix}_treeids", f"{prefix}_nodeids", f"{prefix}_ids", f"{prefix}_weights")}
    for t, nodes in enumerate(trees):
        for nd in nodes:
            a["nodes_treeids"].append(t)
            a["nodes_nodeids"].append(nd["id"])
            a["nodes_modes"].append(nd["mode"])
            a["nodes_featureids"].append(nd.get("feature", 0))
            a["nodes_values"].append(nd.get("value", 0.0))
            a["nodes_truenodeids"].append(nd.get("true", 0))
            a["nodes_falsenodeids"].append(nd.get("false", 0))
            a["nodes_missing_value_tracks_true"].append(nd.get("missing", 0))
            for tg, w in nd.get("weights", []):
                a[f"{prefix}_treeids"].append(t)
                a[f"{prefix}_nodeids"].append(nd["id"])
                a[f"{prefix}_ids"].append(tg)
                a[f"{prefix}_weights"].append(w)
    return a


def v5_attrs(trees, n_targets, dtype=np.float32):
    """TreeEnsemble (opset 5) attributes; needs one weight per leaf."""
    tp = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE,
          np.dtype(np.float16): TensorProto.FLOAT16}[np.dtype(dtype)]
    inner, leaves, roots = [], [], []
    for nodes in trees:
        gid = {}
        for nd in nodes:
            if nd["mode"] == "LEAF":
                assert len(nd["weights"]) == 1
                gid[nd["id"]] = ("leaf", len(leaves))
                leaves.append(nd["weights"][0])
            else:
                gid[nd["id"]] = ("node", len(inner))
                inner.append(nd)
        if nodes[0]["mode"] == "LEAF":  # a single-leaf tree: one node whose branches meet
            gid[-1] = ("node", len(inner))
            inner.append({"mode": "BRANCH_LEQ", "feature": 0, "value": 0.0, "missing": 0, "true": 0, "false": 0,
                          "_map": gid})
            roots.append(gid[-1][1])
        else:
            roots.append(gid[0][1])
        for nd in inner:
            nd.setdefault("_map", gid)
    a = {"nodes_featureids": [], "nodes_truenodeids": [], "nodes_trueleafs": [], "nodes_falsenodeids": [],
         "nodes_falseleafs": [], "nodes_missing_value_tracks_true": []}
    modes, splits = [], []
    for nd in inner:
        gid = nd["_map"]
        modes.append(MODES.index(nd["mode"]))
        splits.append(nd["value"])
        a["nodes_featureids"].append(nd["feature"])
        a["nodes_missing_value_tracks_true"].append(nd["missing"])
        for side in ("true", "false"):
            kind, idx = gid[nd[side]]
            a[f"nodes_{side}nodeids"].append(idx)
            a[f"nodes_{side}leafs"].append(int(kind == "leaf"))
    a["nodes_modes"] = helper.make_tensor("nodes_modes", TensorProto.UINT8, (len(modes),), modes)
    a["nodes_splits"] = helper.make_tensor("nodes_splits", tp, (len(splits),),
                                           np.asarray(splits, dtype=dtype).tolist())
    a["leaf_targetids"] = [t for t, _ in leaves]
    a["leaf_weights"] = helper.make_tensor("leaf_weights", tp, (len(leaves),),
                                           np.asarray([w for _, w in leaves], dtype=dtype).tolist())
    a["tree_roots"] = roots
    a["n_targets"] = n_targets
    return a


def _cmp(mode, v, t):
    return {"BRANCH_LEQ": v <= t, "BRANCH_LT": v < t, "BRANCH_GTE": v >= t, "BRANCH_GT": v > t,
            "BRANCH_EQ": v == t, "BRANCH_NEQ": v != t}[mode]


def evaluate(trees, x, n_targets, how="SUM", thr_dtype=np.float32):
    """Plain recursive evaluation: [N, n_targets] float64 and has-contribution mask."""
    x = np.asarray(x)
    out = np.zeros((x.shape[0], n_targets))
    has = np.zeros((x.shape[0], n_targets), bool)
    for n in range(x.shape[0]):
        for nodes in trees:
            nd = nodes[0]
            while nd["mode"] != "LEAF":
                v = x[n, nd["feature"]]
                t = thr_dtype(nd["value"])
                go = bool(_cmp(nd["mode"], v, t)) or (nd["missing"] and np.isnan(v))
                nd = nodes[nd["true"] if go else nd["false"]]
            for tg, w in nd["weights"]:
                if how in ("SUM", "AVERAGE"):
                    out[n, tg] += w
                elif not has[n, tg]:
                    out[n, tg] = w
                else:
                    out[n, tg] = min(out[n, tg], w) if how == "MIN" else max(out[n, tg], w)
                has[n, tg] = True
    if how == "AVERAGE":
        out /= len(trees)
    return out, has
