"""One Session run from many threads at once gives each call its own results (issue 13.1).

The models hold If, Loop, Scan and Split, whose bodies read values of the enclosing
graph: a body must read its own call's values, never another thread's."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from onnx import TensorProto, helper

from gpukernels.runtime import Session

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
N = 4096


def _control_flow_model():
    """y_if: 2x when sum(x) > 0 else -x (branches read the outer x);
    y_loop: x summed n times (body reads the outer x), with a scan output of every step;
    y_scan: the running sum of the rows of m plus the outer x;
    y_a, y_b: the halves of x (Split)."""
    then_g = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", F, [N])],
                               [helper.make_tensor("two", F, [], [2.0])])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", F, [N])])
    loop_body = helper.make_graph(
        [helper.make_node("Add", ["acc_in", "x"], ["acc_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("ReduceSum", ["acc_out"], ["step_sum"], keepdims=0)],
        "loop_body",
        [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("cond_in", B, []),
         helper.make_tensor_value_info("acc_in", F, [N])],
        [helper.make_tensor_value_info("cond_out", B, []), helper.make_tensor_value_info("acc_out", F, [N]),
         helper.make_tensor_value_info("step_sum", F, [])])
    scan_body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "row"], ["s_mid"]),
         helper.make_node("Add", ["s_mid", "x"], ["s_out"]),
         helper.make_node("Identity", ["s_out"], ["s_each"])],
        "scan_body",
        [helper.make_tensor_value_info("s_in", F, [N]), helper.make_tensor_value_info("row", F, [N])],
        [helper.make_tensor_value_info("s_out", F, [N]), helper.make_tensor_value_info("s_each", F, [N])])
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["sx"], keepdims=0),
        helper.make_node("Greater", ["sx", "zero"], ["positive"]),
        helper.make_node("If", ["positive"], ["y_if"], then_branch=then_g, else_branch=else_g),
        helper.make_node("Loop", ["n", "true", "zeros"], ["y_loop", "y_steps"], body=loop_body),
        helper.make_node("Scan", ["zeros", "m"], ["y_scan", "y_rows"], body=scan_body, num_scan_inputs=1),
        helper.make_node("Split", ["x"], ["y_a", "y_b"], axis=0, num_outputs=2),
    ]
    inits = [helper.make_tensor("zero", F, [], [0.0]), helper.make_tensor("true", B, [], [True]),
             helper.make_tensor("zeros", F, [N], np.zeros(N, np.float32))]
    graph = helper.make_graph(
        nodes, "control_flow",
        [helper.make_tensor_value_info("x", F, [N]), helper.make_tensor_value_info("n", I64, []),
         helper.make_tensor_value_info("m", F, ["rows", N])],
        [helper.make_tensor_value_info(name, F, None)
         for name in ("y_if", "y_loop", "y_steps", "y_scan", "y_rows", "y_a", "y_b")],
        inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _feeds(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    sign = 1.0 if seed % 2 else -1.0  # both If branches are taken
    return {"x": (rng.standard_normal(N) + sign).astype(np.float32),
            "n": np.array(1 + seed % 5, np.int64),
            "m": rng.standard_normal((1 + seed % 3, N)).astype(np.float32)}


@pytest.mark.parametrize("compile_graph", [True, False])
def test_threads_get_the_results_of_their_own_calls(compile_graph):
    session = Session(_control_flow_model(), options={"compile_graph": compile_graph})
    n_threads, runs = 8, 200
    seeds = list(range(16))
    expected = {s: session.run(None, _feeds(s)) for s in seeds}
    errors: list = []
    start = threading.Barrier(n_threads)

    def worker(t: int):
        start.wait()
        for r in range(runs):
            s = seeds[(t * 7 + r) % len(seeds)]
            try:
                got = session.run(None, _feeds(s))
                for name, a, b in zip(session.output_names, got, expected[s]):
                    if a.shape != b.shape or not np.array_equal(a, b):
                        errors.append(f"thread {t} run {r} seed {s}: output {name} differs")
                        return
            except Exception as exc:  # noqa: BLE001 -- reported below
                errors.append(f"thread {t} run {r} seed {s}: {type(exc).__name__}: {exc}")
                return

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors[:5]


def test_outer_scope_is_per_call_not_kernel_state():
    """The scope a kernel's subgraphs read is given per call (KernelBase.in_scope) and
    is gone after it: nothing of a call stays on the kernel object."""
    session = Session(_control_flow_model())
    session.run(None, _feeds(3))
    for p in session.graph.nodes:
        if p.kernel is not None:
            assert p.kernel.outer_scope is None
            assert "outer_scope" not in vars(p.kernel)
