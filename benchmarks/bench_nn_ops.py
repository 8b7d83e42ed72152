"""Neural-network operators: gpukernels vs onnxruntime (2 threads) vs onnx.reference.

    python benchmarks/bench_nn_ops.py [--device cpu|cuda] [--filter TEXT]

Cases: Conv 1x64x56x56 * 64x64x3x3 pad 1; Conv 1x256x14x14 * 256x256x3x3 pad 1; Conv
8x3x224x224 * 64x3x7x7 stride 2 pad 3; depthwise Conv 1x256x56x56 group 256 3x3 pad 1;
ConvTranspose 1x64x28x28 -> 32 channels 4x4 stride 2 pad 1; LayerNormalization
32x512x768; MaxPool 1x64x112x112 k3 s2 pad 1; plus ``CASES`` from nn_attention_cases.py
when that file exists.  Targets: within 2x of onnxruntime (depthwise within 4x).
"""

from __future__ import annotations

import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from harness import Case, extra_cases, main_for, single_node_model  # noqa: E402


def _conv_flops(n, c, m, k, out_pixels, group=1):
    return 2.0 * n * m * (c // group) * k * out_pixels


def cases() -> list[Case]:
    rng = np.random.default_rng(0)
    out = []

    def conv(name, xs, ws, attrs, group=1):
        x = rng.standard_normal(xs, dtype=np.float32)
        w = rng.standard_normal(ws, dtype=np.float32)
        b = rng.standard_normal(ws[0], dtype=np.float32)
        model = single_node_model("Conv", {"X": x}, dict(attrs, group=group), initializers={"W": w, "B": b})
        s = attrs.get("strides", [1, 1])
        p = attrs.get("pads", [0, 0, 0, 0])
        oh = (xs[2] + p[0] + p[2] - ws[2]) // s[0] + 1
        ow = (xs[3] + p[1] + p[3] - ws[3]) // s[1] + 1
        flops = _conv_flops(xs[0], xs[1], ws[0], ws[2] * ws[3], oh * ow, group)
        out.append(Case(name, model, {"X": x}, flops=flops))

    conv("Conv 1x64x56x56 k3x3 64->64 pad1", (1, 64, 56, 56), (64, 64, 3, 3), {"pads": [1, 1, 1, 1]})
    conv("Conv 1x256x14x14 k3x3 256->256 pad1", (1, 256, 14, 14), (256, 256, 3, 3), {"pads": [1, 1, 1, 1]})
    conv("Conv 8x3x224x224 k7x7 3->64 s2 pad3", (8, 3, 224, 224), (64, 3, 7, 7),
         {"pads": [3, 3, 3, 3], "strides": [2, 2]})
    conv("Conv depthwise 1x256x56x56 k3x3 g256 pad1", (1, 256, 56, 56), (256, 1, 3, 3),
         {"pads": [1, 1, 1, 1]}, group=256)

    x = rng.standard_normal((1, 64, 28, 28), dtype=np.float32)
    w = rng.standard_normal((64, 32, 4, 4), dtype=np.float32)
    model = single_node_model("ConvTranspose", {"X": x}, {"strides": [2, 2], "pads": [1, 1, 1, 1]},
                              initializers={"W": w})
    out.append(Case("ConvTranspose 1x64x28x28 -> 32 k4x4 s2 pad1", model, {"X": x},
                    flops=2.0 * 64 * 32 * 16 * 28 * 28))

    x = rng.standard_normal((32, 512, 768), dtype=np.float32)
    scale = rng.standard_normal(768, dtype=np.float32)
    bias = rng.standard_normal(768, dtype=np.float32)
    model = single_node_model("LayerNormalization", {"X": x}, {"axis": -1, "epsilon": 1e-5},
                              initializers={"Scale": scale, "B": bias}, opset=17)
    out.append(Case("LayerNormalization 32x512x768", model, {"X": x}))

    x = rng.standard_normal((1, 64, 112, 112), dtype=np.float32)
    model = single_node_model("MaxPool", {"X": x}, {"kernel_shape": [3, 3], "strides": [2, 2],
                                                    "pads": [1, 1, 1, 1]})
    out.append(Case("MaxPool 1x64x112x112 k3 s2 pad1", model, {"X": x}))

    out.extend(extra_cases("nn_attention_cases.py"))
    return out


if __name__ == "__main__":
    main_for("nn operators", cases, __doc__)
