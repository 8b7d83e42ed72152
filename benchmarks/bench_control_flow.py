"""Control flow: a 10,000-iteration Loop and a 4,096-step Scan (RNN-like body), timed on
gpukernels, onnxruntime (2 threads) and onnx.reference in the same run.

    python benchmarks/bench_control_flow.py [--device cpu] [--filter Loop]

Loop: the body adds a constant (read from the outer scope) to a float[1, 16] state and
appends it to a scan output.  (cond is given explicitly: onnx.reference runs no iteration
when it is omitted.)  Scan: h_t = Tanh(h_{t-1} @ W + x_t) on float[1, 128] with
W float[128, 128] from the outer scope, collecting every h_t.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from harness import Case, parse_args, run_cases


def _vi(name, et, shape):
    return helper.make_tensor_value_info(name, et, shape)


def loop_model(width: int = 16) -> onnx.ModelProto:
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Add", ["x_in", "step"], ["x_out"]),
         helper.make_node("Identity", ["x_out"], ["x_scan"])],
        "loop_body",
        [_vi("i", TP.INT64, []), _vi("cond_in", TP.BOOL, []), _vi("x_in", TP.FLOAT, [1, width])],
        [_vi("cond_out", TP.BOOL, []), _vi("x_out", TP.FLOAT, [1, width]), _vi("x_scan", TP.FLOAT, [1, width])])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["M", "cond", "x0"], ["x_final", "xs"], body=body)],
        "loop",
        [_vi("M", TP.INT64, []), _vi("cond", TP.BOOL, []), _vi("x0", TP.FLOAT, [1, width])],
        [_vi("x_final", TP.FLOAT, [1, width]), _vi("xs", TP.FLOAT, ["N", 1, width])],
        initializer=[numpy_helper.from_array(np.full((1, width), 0.25, np.float32), "step")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def scan_model(hidden: int = 128, activation: str = "Tanh") -> onnx.ModelProto:
    body = helper.make_graph(
        [helper.make_node("MatMul", ["h", "W"], ["hw"]),
         helper.make_node("Add", ["hw", "x_t"], ["pre"]),
         helper.make_node(activation, ["pre"], ["h_out"]),
         helper.make_node("Identity", ["h_out"], ["y_t"])],
        "scan_body",
        [_vi("h", TP.FLOAT, [1, hidden]), _vi("x_t", TP.FLOAT, [1, hidden])],
        [_vi("h_out", TP.FLOAT, [1, hidden]), _vi("y_t", TP.FLOAT, [1, hidden])])
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((hidden, hidden)) / np.sqrt(hidden)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Scan", ["h0", "x"], ["h_final", "ys"], body=body, num_scan_inputs=1)],
        "scan",
        [_vi("h0", TP.FLOAT, [1, hidden]), _vi("x", TP.FLOAT, ["T", 1, hidden])],
        [_vi("h_final", TP.FLOAT, [1, hidden]), _vi("ys", TP.FLOAT, ["T", 1, hidden])],
        initializer=[numpy_helper.from_array(w, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def main():
    args = parse_args(__doc__.splitlines()[0])
    from gpukernels.kernels import has_kernel, load_all

    load_all()
    activation = "Tanh" if has_kernel("Tanh") else "Relu"
    rng = np.random.default_rng(1)
    steps, hidden = 4096, 128
    cases = [
        Case("Loop 10000 iters, Add + scan output, float[1,16]", loop_model(),
             {"M": np.array(10000, np.int64), "cond": np.array(True), "x0": rng.random((1, 16)).astype(np.float32)}),
        Case(f"Scan 4096 steps, MatMul+Add+{activation} float[1,128]", scan_model(hidden, activation),
             {"h0": np.zeros((1, hidden), np.float32),
              "x": (rng.standard_normal((steps, 1, hidden)) * 0.1).astype(np.float32)},
             flops=2.0 * steps * hidden * hidden),
    ]
    cases = [c for c in cases if args.filter in c.name]
    run_cases("control flow", cases, repeat=args.repeat, min_time=args.min_time, device=args.device,
              with_reference=not args.no_reference)


if __name__ == "__main__":
    main()
