"""Math operators: gpukernels vs onnxruntime (2 threads) vs onnx.reference.

    python benchmarks/bench_math_ops.py [--device cpu|cuda] [--filter TEXT]

Cases: Gelu and Softmax on 32x512x3072 float32; ReduceSum and ReduceMean over the last
axis of 32x512x768; ArgMax over 1000 classes for 4096 rows; TopK k=50 of 64x50000;
Einsum "bhqd,bhkd->bhqk" on 1x8x512x64; plus ``CASES`` from math_extra_cases.py when that
file exists.
"""

from __future__ import annotations

import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from harness import Case, extra_cases, main_for, single_node_model  # noqa: E402


def cases() -> list[Case]:
    rng = np.random.default_rng(0)
    out = []
    big = rng.standard_normal((32, 512, 3072), dtype=np.float32)
    out.append(Case("Gelu 32x512x3072 f32", single_node_model("Gelu", {"X": big}, opset=20), {"X": big}))
    out.append(Case("Softmax 32x512x3072 f32 axis=-1", single_node_model("Softmax", {"X": big}), {"X": big}))
    mid = rng.standard_normal((32, 512, 768), dtype=np.float32)
    axes = np.array([-1], np.int64)
    for op in ("ReduceSum", "ReduceMean"):
        out.append(Case(f"{op} 32x512x768 last axis", single_node_model(
            op, {"X": mid}, initializers={"axes": axes}, opset=18), {"X": mid}))
    logits = rng.standard_normal((4096, 1000), dtype=np.float32)
    out.append(Case("ArgMax 4096x1000 axis=1", single_node_model(
        "ArgMax", {"X": logits}, {"axis": 1, "keepdims": 0}), {"X": logits}))
    scores = rng.standard_normal((64, 50000), dtype=np.float32)
    out.append(Case("TopK k=50 of 64x50000", single_node_model(
        "TopK", {"X": scores}, initializers={"K": np.array([50], np.int64)}, n_outputs=2), {"X": scores}))
    q = rng.standard_normal((1, 8, 512, 64), dtype=np.float32)
    k = rng.standard_normal((1, 8, 512, 64), dtype=np.float32)
    out.append(Case("Einsum bhqd,bhkd->bhqk 1x8x512x64", single_node_model(
        "Einsum", {"Q": q, "K": k}, {"equation": "bhqd,bhkd->bhqk"}), {"Q": q, "K": k},
        flops=2.0 * 8 * 512 * 512 * 64))
    out.extend(extra_cases("math_extra_cases.py"))
    return out


if __name__ == "__main__":
    main_for("math operators", cases, __doc__)
