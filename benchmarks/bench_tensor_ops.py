"""Tensor operators (shape, indexing, casting, resampling): gpukernels vs onnxruntime vs onnx.reference.

    python benchmarks/bench_tensor_ops.py [--device cuda] [--filter Resize]
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from harness import Case, parse_args, run_cases, single_node_model


def cases() -> list[Case]:
    rng = np.random.default_rng(0)
    out = []

    x = rng.standard_normal((1, 3, 224, 224)).astype(np.float32)
    out.append(Case("Resize linear 1x3x224x224 -> 448x448", single_node_model(
        "Resize", {"X": x, "roi": None, "scales": None},
        {"mode": "linear"}, initializers={"sizes": np.array([1, 3, 448, 448], np.int64)}), {"X": x}))

    x = rng.standard_normal((1, 3, 448, 448)).astype(np.float32)
    out.append(Case("Resize cubic antialias 1x3x448x448 -> 224x224", single_node_model(
        "Resize", {"X": x, "roi": None, "scales": None},
        {"mode": "cubic", "antialias": 1}, initializers={"sizes": np.array([1, 3, 224, 224], np.int64)}),
        {"X": x}))

    table = rng.standard_normal((50000, 768)).astype(np.float32)
    idx = rng.integers(0, 50000, 4096).astype(np.int64)
    out.append(Case("Gather 50000x768, 4096 indices", single_node_model(
        "Gather", {"data": table, "indices": idx}, {"axis": 0}), {"data": table, "indices": idx}))

    data = rng.standard_normal((8192, 1024)).astype(np.float32)
    rows = rng.permutation(8192)[:4096].astype(np.int64)[:, None]
    upd = rng.standard_normal((4096, 1024)).astype(np.float32)
    out.append(Case("ScatterND 4096 rows into 8192x1024", single_node_model(
        "ScatterND", {"data": data, "indices": rows, "updates": upd}),
        {"data": data, "indices": rows, "updates": upd}))

    t = rng.standard_normal((64, 128, 256)).astype(np.float32)
    out.append(Case("Transpose 64x128x256 perm (0,2,1)", single_node_model(
        "Transpose", {"data": t}, {"perm": [0, 2, 1]}), {"data": t}))

    xs = rng.standard_normal((8, 32, 64, 64)).astype(np.float32)
    grid = rng.uniform(-1, 1, (8, 64, 64, 2)).astype(np.float32)
    out.append(Case("GridSample bilinear 8x32x64x64", single_node_model(
        "GridSample", {"X": xs, "grid": grid}, {"mode": "linear"}), {"X": xs, "grid": grid}))

    xp_ = rng.standard_normal((1, 64, 112, 112)).astype(np.float32)
    out.append(Case("Pad reflect 1x64x112x112 by 3", single_node_model(
        "Pad", {"data": xp_}, {"mode": "reflect"},
        initializers={"pads": np.array([0, 0, 3, 3, 0, 0, 3, 3], np.int64)}), {"data": xp_}))

    big = (rng.standard_normal(16 * 1024 * 1024) * 10).astype(np.float32)
    out.append(Case("Cast float32 -> bfloat16, 16M", single_node_model(
        "Cast", {"input": big}, {"to": TensorProto.BFLOAT16}), {"input": big}))
    out.append(Case("Cast float32 -> float8e4m3fn, 16M", single_node_model(
        "Cast", {"input": big}, {"to": TensorProto.FLOAT8E4M3FN}), {"input": big}))
    return out


def main():
    args = parse_args(__doc__)
    selected = [c for c in cases() if args.filter in c.name]
    run_cases("tensor ops", selected, repeat=args.repeat, min_time=args.min_time, device=args.device,
              with_reference=not args.no_reference)


if __name__ == "__main__":
    main()
