"""Compiled top-level graphs (runtime.body.CompiledGraph): a Session's second run with
the same input types and shapes goes through a compiled plan.  Its results must equal
the general path's to the bit, its errors and floating-point behaviour must be the
kernels' own, and kernels swapped in through kernel_overrides must never be bypassed."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper as oh

from gpukernels.errors import GpuKernelsError, KernelInputError
from gpukernels.kernels.math.unary import Relu
from gpukernels.runtime import Session
from gpukernels.runtime.body import BodyProgram, CompiledGraph

from tests.graphs import init, model_of, vi


@pytest.fixture
def program_runs(monkeypatch):
    """How many runs the compiled top-level plans completed ('ok') or left ('left')."""
    seen = {"ok": 0, "left": 0}
    run = BodyProgram.run

    def counting(self, inputs):
        ok, outs = run(self, inputs)
        if self.parent is not None and self.parent.parent is None and self.plan.name == "graph 'g'":
            seen["ok" if ok else "left"] += 1
        return ok, outs

    monkeypatch.setattr(BodyProgram, "run", counting)
    return seen


def mlp_model():
    """y = relu(x @ w + b) * s - x.sum(-1, keepdims); an If reading an initializer from
    the outer graph; z = y / d (integer division in a second output)."""
    then_g = oh.make_graph([oh.make_node("Add", ["y", "bias2"], ["r"])], "then", [],
                           [vi("r", TP.FLOAT, None)])
    else_g = oh.make_graph([oh.make_node("Sub", ["y", "bias2"], ["r"])], "else", [],
                           [vi("r", TP.FLOAT, None)])
    nodes = [
        oh.make_node("MatMul", ["x", "w"], ["xw"]),
        oh.make_node("Add", ["xw", "b"], ["pre"]),
        oh.make_node("Relu", ["pre"], ["act"]),
        oh.make_node("Mul", ["act", "s"], ["scaled"]),
        oh.make_node("ReduceSum", ["x", "axes"], ["xs"], keepdims=1),
        oh.make_node("Sub", ["scaled", "xs"], ["y"]),
        oh.make_node("If", ["flag"], ["branch"], then_branch=then_g, else_branch=else_g),
        oh.make_node("Div", ["n", "d"], ["q"]),
        oh.make_node("Identity", ["q"], ["q_out"]),
    ]
    return model_of(
        nodes,
        [vi("x", TP.FLOAT, ["B", 4]), vi("flag", TP.BOOL, []), vi("n", TP.INT32, [3]), vi("d", TP.INT32, [3])],
        [vi("branch", TP.FLOAT, None), vi("q_out", TP.INT32, None)],
        [init("w", np.arange(12, dtype=np.float32).reshape(4, 3) / 7), init("b", np.float32([0.5, -1, 2])),
         init("s", np.float32(1.5)), init("axes", np.int64([-1])), init("bias2", np.float32(0.25))],
        opset=17)


def feeds_for(rng, batch=5, flag=True, d=(1, 2, 3)):
    return {"x": rng.standard_normal((batch, 4)).astype(np.float32), "flag": np.array(flag),
            "n": np.int32([7, -7, 9]), "d": np.int32(d)}


def reference(f):
    x = f["x"].astype(np.float64)
    w = np.arange(12, dtype=np.float64).reshape(4, 3) / 7
    y = np.maximum(x @ w + [0.5, -1, 2], 0) * 1.5 - x.sum(-1, keepdims=True)
    return y + (0.25 if f["flag"] else -0.25)


def test_repeated_runs_match_the_general_path_bitwise(rng, program_runs):
    model = mlp_model()
    fast, general = Session(model), Session(model, options={"compile_graph": False})
    for k in range(4):  # new values, same signature: no stale results
        f = feeds_for(rng, flag=bool(k % 2))
        got, want = fast.run(None, f), general.run(None, f)
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
        np.testing.assert_allclose(got[0], reference(f), rtol=1e-5, atol=1e-5)
        assert got[1].tolist() == [7, -3, 3]  # truncating integer division
    assert program_runs["ok"] == 3 and program_runs["left"] == 0


def test_new_shapes_compile_new_programs_and_stay_correct(rng):
    sess = Session(mlp_model())
    for batch in [1, 5, 1, 2, 5, 3, 4, 6, 7, 8, 9, 10, 11, 5]:  # more signatures than kept
        f = feeds_for(rng, batch=batch)
        np.testing.assert_allclose(sess.run(None, f)[0], reference(f), rtol=1e-5, atol=1e-5)
    assert len(sess._compiled.programs) <= CompiledGraph.MAX_PROGRAMS


def test_errors_in_a_compiled_run_are_the_kernels_own(rng):
    sess = Session(mlp_model())
    sess.run(None, feeds_for(rng))  # compiles
    with pytest.raises(GpuKernelsError) as fast_exc:
        sess.run(None, feeds_for(rng, d=(1, 0, 3)))
    general = Session(mlp_model(), options={"compile_graph": False})
    with pytest.raises(GpuKernelsError) as general_exc:
        general.run(None, feeds_for(rng, d=(1, 0, 3)))
    assert str(fast_exc.value) == str(general_exc.value)
    assert isinstance(fast_exc.value.__cause__, KernelInputError) or "Div" in str(fast_exc.value)
    # the session keeps working afterwards
    f = feeds_for(rng)
    np.testing.assert_allclose(sess.run(None, f)[0], reference(f), rtol=1e-5, atol=1e-5)


def test_floating_point_state_of_the_caller_is_honoured(rng):
    model = model_of([oh.make_node("Exp", ["x"], ["e"]), oh.make_node("Mul", ["e", "e"], ["y"])],
                     [vi("x", TP.FLOAT, [3])], [vi("y", TP.FLOAT, [3])])
    sess = Session(model)
    small = {"x": np.float32([0.5, 1, 2])}
    big = {"x": np.float32([0.5, 80, 2])}  # exp fits, its square overflows
    with np.errstate(over="ignore"):
        sess.run(None, small)
        sess.run(None, small)  # compiled
        assert np.isinf(sess.run(None, big)[0][1])
    with np.errstate(over="raise"):
        with pytest.raises((FloatingPointError, GpuKernelsError)):
            sess.run(None, big)
    with np.errstate(over="warn"):
        with pytest.warns(RuntimeWarning):
            assert np.isinf(sess.run(None, big)[0][1])


class HalvingRelu(Relu):
    """A deliberately different Relu (as a user's override might be)."""

    def compute(self, xp, x):
        return xp.maximum(x, 0) / 2


def test_kernel_overrides_are_never_bypassed(rng):
    model = model_of([oh.make_node("Relu", ["x"], ["y"])], [vi("x", TP.FLOAT, [4])], [vi("y", TP.FLOAT, [4])])
    sess = Session(model, options={"kernel_overrides": {"Relu": HalvingRelu}})
    x = np.float32([-1, 2, -3, 4])
    for _ in range(3):
        assert sess.run(None, {"x": x})[0].tolist() == [0, 1, 0, 2]


def test_first_run_frees_intermediates(rng):
    """Recording the first run keeps only stand-ins of big values: a chain of 4 MiB
    tensors still peaks at a few buffers."""
    import tracemalloc

    n = 1 << 20
    nodes = [oh.make_node("Add", ["x" if k == 0 else f"t{k}", "one"], [f"t{k + 1}"]) for k in range(30)]
    model = model_of(nodes, [vi("x", TP.FLOAT, [n])], [vi("t30", TP.FLOAT, [n])], [init("one", np.float32(1))])
    sess = Session(model)
    x = rng.standard_normal(n).astype(np.float32)
    for _ in range(2):  # the recorded first run, then the compiled one
        tracemalloc.start()
        y = sess.run(None, {"x": x})[0]
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < 8 * 4 * n, peak
        np.testing.assert_allclose(y, x + 30, rtol=1e-6)
