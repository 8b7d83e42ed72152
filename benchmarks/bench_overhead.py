"""Runtime overhead: a chain of 1,000 small Add nodes through gpukernels.backend, versus
onnxruntime (2 threads) and onnx.reference in the same run.

    python benchmarks/bench_overhead.py [--nodes 1000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def chain_model(n: int) -> onnx.ModelProto:
    nodes = [helper.make_node("Add", ["x" if i == 0 else f"t{i}", "c"], [f"t{i + 1}"]) for i in range(n)]
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                          [helper.make_tensor_value_info(f"t{n}", TensorProto.FLOAT, [4])],
                          initializer=[numpy_helper.from_array(np.full(4, 0.5, np.float32), "c")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])
    m.ir_version = 8
    return m


def median_time(fn, repeat=7):
    fn()
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=1000)
    args = p.parse_args()
    model = chain_model(args.nodes)
    x = np.ones(4, np.float32)

    import gpukernels.backend as backend
    rep = backend.prepare(model, "CPU")
    gk = median_time(lambda: rep.run([x]))

    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    ort_t = median_time(lambda: sess.run(None, {"x": x}))

    from onnx.reference import ReferenceEvaluator
    ref = ReferenceEvaluator(model)
    ref_t = median_time(lambda: ref.run(None, {"x": x}))

    np.testing.assert_allclose(rep.run([x])[0], x + 0.5 * args.nodes, rtol=1e-6)
    print(f"\n## Runtime overhead: chain of {args.nodes} Add nodes on float32[4]\n")
    print("| runtime | ms per run | us per node | vs gpukernels |")
    print("|---|---:|---:|---:|")
    for name, t in (("gpukernels (backend)", gk), ("onnxruntime (2 threads)", ort_t), ("onnx.reference", ref_t)):
        print(f"| {name} | {t * 1e3:.2f} | {t / args.nodes * 1e6:.1f} | {t / gk:.2f}x |")
    print(f"\ngpukernels / onnxruntime = {gk / ort_t:.2f}; onnx.reference / gpukernels = {ref_t / gk:.2f}")


if __name__ == "__main__":
    main()
