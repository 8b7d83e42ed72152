"""Benchmark cases for the quantization, signal and detection kernels.

Imported by bench_math_ops.py; ``CASES`` is a list of harness.Case with fixed (seeded)
inputs: per-axis QuantizeLinear and DequantizeLinear on 4096x4096, a DFT of 64 signals
of 4096 points, and NonMaxSuppression of 5000 boxes (1 batch, 1 class, at most 200
outputs, IoU threshold 0.5).
"""

from __future__ import annotations

import numpy as np

from harness import Case, single_node_model

_rng = np.random.default_rng(77)


def _quant_cases() -> list[Case]:
    n = 4096
    x = _rng.standard_normal((n, n)).astype(np.float32) * 4
    scale = _rng.uniform(0.01, 0.05, n).astype(np.float32)
    zp = _rng.integers(-20, 20, n).astype(np.int8)
    q_model = single_node_model("QuantizeLinear", {"x": x}, {"axis": 1}, opset=21,
                                initializers={"y_scale": scale, "y_zero_point": zp})
    xq = _rng.integers(-128, 128, (n, n)).astype(np.int8)
    dq_model = single_node_model("DequantizeLinear", {"x": xq}, {"axis": 1}, opset=21,
                                 initializers={"x_scale": scale, "x_zero_point": zp})
    return [Case(f"QuantizeLinear per-axis {n}x{n} f32->int8", q_model, {"x": x}),
            Case(f"DequantizeLinear per-axis {n}x{n} int8->f32", dq_model, {"x": xq})]


def _dft_case() -> Case:
    b, length = 64, 4096
    sig = _rng.standard_normal((b, length, 1)).astype(np.float32)
    model = single_node_model("DFT", {"input": sig}, {}, opset=20,
                              initializers={"dft_length": np.array(length, np.int64),
                                            "axis": np.array(1, np.int64)})
    # ~5 n log2 n flops per complex transform of length n
    return Case(f"DFT {b} signals x {length} (real in)", model, {"input": sig},
                flops=5.0 * b * length * np.log2(length))


def _nms_case() -> Case:
    n = 5000
    xy = _rng.uniform(0, 1000, (n, 2))
    wh = _rng.uniform(10, 100, (n, 2))
    boxes = np.concatenate([xy[:, ::-1], (xy + wh)[:, ::-1]], 1)[None].astype(np.float32)  # [y1, x1, y2, x2]
    scores = _rng.random((1, 1, n)).astype(np.float32)
    model = single_node_model("NonMaxSuppression", {"boxes": boxes, "scores": scores}, {}, opset=11,
                              initializers={"max_output_boxes_per_class": np.array([200], np.int64),
                                            "iou_threshold": np.array([0.5], np.float32)})
    return Case(f"NonMaxSuppression {n} boxes, max 200, iou 0.5", model, {"boxes": boxes, "scores": scores})


CASES: list[Case] = _quant_cases() + [_dft_case(), _nms_case()]
