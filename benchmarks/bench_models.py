"""Whole models: gpukernels vs onnxruntime (2 threads) vs onnx.reference.

    python benchmarks/bench_models.py [--device cpu|cuda] [--filter TEXT] [--no-reference]

Cases: the nine light models shipped with onnx (resnet50, densenet121, inception v1/v2,
vgg19, squeezenet, shufflenet, alexnet, zfnet512) on one random image each.  Their
weights are built at load time by ConstantOfShape nodes, so a runtime that folds
constants (onnxruntime, gpukernels) does that work once per session; onnx.reference
redoes it every run.  No target: this shows where whole-model time goes relative to the
per-operator benchmarks.
"""

from __future__ import annotations

import pathlib
import sys

import numpy as np
import onnx

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from harness import Case, main_for  # noqa: E402

MODELS = ("resnet50", "densenet121", "inception_v1", "inception_v2", "vgg19", "squeezenet", "shufflenet",
          "bvlc_alexnet", "zfnet512")


def cases() -> list[Case]:
    light = pathlib.Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
    rng = np.random.default_rng(0)
    out = []
    for name in MODELS:
        path = light / f"light_{name}.onnx"
        if not path.exists():
            continue
        model = onnx.load(str(path))
        inits = {i.name for i in model.graph.initializer}
        feeds = {}
        for inp in model.graph.input:
            if inp.name in inits:
                continue
            shape = [d.dim_value or 1 for d in inp.type.tensor_type.shape.dim]
            feeds[inp.name] = rng.standard_normal(shape, dtype=np.float32)
        out.append(Case(f"{name} 1x{'x'.join(str(d) for d in next(iter(feeds.values())).shape[1:])}", model, feeds))
    return out


if __name__ == "__main__":
    main_for("Light ONNX models", cases, __doc__)
