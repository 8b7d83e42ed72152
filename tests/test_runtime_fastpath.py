"""Compiled Loop/Scan bodies (runtime BodyProgram) and the kernels' array functions.

Every model runs twice: with compiled bodies (the default) and with the context option
compile_bodies=False (the general path); results must be identical to the bit, errors
and warnings the same, and results close to a float64 reference written here."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper as oh

from gpukernels.errors import GpuKernelsError, KernelInputError
from gpukernels.kernels import KernelContext, load_all
from gpukernels.kernels.base import lookup
from gpukernels.runtime import Session
from gpukernels.runtime.body import BodyProgram
from gpukernels.tensor import Tensor
from tests.graphs import init, model_of, vi

load_all()


@pytest.fixture
def counts(monkeypatch):
    """How many iterations the compiled path completed ('ok') or left ('left')."""
    seen = {"ok": 0, "left": 0, "programs": []}
    run, compile_ = BodyProgram.run, BodyProgram.compile.__func__

    def counting_run(self, inputs):
        ok, outs = run(self, inputs)
        seen["ok" if ok else "left"] += 1
        return ok, outs

    def keeping_compile(cls, *args):
        prog = compile_(cls, *args)
        seen["programs"].append(prog)
        return prog

    monkeypatch.setattr(BodyProgram, "run", counting_run)
    monkeypatch.setattr(BodyProgram, "compile", classmethod(keeping_compile))
    return seen


def run_both(model, feeds, device):
    fast = Session(model, device=device).run(None, feeds)
    general = Session(model, device=device, options={"compile_bodies": False}).run(None, feeds)
    assert len(fast) == len(general)
    for a, b in zip(fast, general):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    return fast


def error_of(model, feeds, device, options=None):
    with pytest.raises(GpuKernelsError) as info:
        Session(model, device=device, options=options).run(None, feeds)
    return info.value


# ============================================================================ Loop


def loop_model(cond_shape=(), with_iter=True):
    """x <- tanh(x * w + i) - b while i < limit; scans x and exp(x); w (outer graph
    input) and b (outer initializer) are read from the outer scope."""
    nodes = [
        oh.make_node("Cast", ["i"], ["i_f"], to=TP.FLOAT),
        oh.make_node("Mul", ["x_in", "w"], ["xw"]),
        oh.make_node("Add", ["xw", "i_f" if with_iter else "xw"], ["pre"]),
        oh.make_node("Tanh", ["pre"], ["t"]),
        oh.make_node("Sub", ["t", "b"], ["x_out"]),
        oh.make_node("Identity", ["x_out"], ["x_scan"]),
        oh.make_node("Exp", ["x_out"], ["e_scan"]),
        oh.make_node("Add", ["i", "one"], ["next_i"]),
        oh.make_node("Less", ["next_i", "limit"], ["c0"]),
        oh.make_node("Reshape", ["c0", "cshape"], ["cond_out"]),
    ]
    body = oh.make_graph(
        nodes, "body",
        [vi("i", TP.INT64, []), vi("cond_in", TP.BOOL, None), vi("x_in", TP.FLOAT, [2, 3])],
        [vi("cond_out", TP.BOOL, None), vi("x_out", TP.FLOAT, [2, 3]),
         vi("x_scan", TP.FLOAT, [2, 3]), vi("e_scan", TP.FLOAT, [2, 3])],
        initializer=[init("one", np.int64(1)), init("cshape", np.array(cond_shape, np.int64))])
    loop = oh.make_node("Loop", ["M", "", "x0"], ["xf", "xs", "es"], body=body)
    return model_of([loop], [vi("M", TP.INT64, []), vi("x0", TP.FLOAT, [2, 3]), vi("w", TP.FLOAT, [3]),
                             vi("limit", TP.INT64, [])],
                    [vi("xf", TP.FLOAT, None), vi("xs", TP.FLOAT, None), vi("es", TP.FLOAT, None)],
                    [init("b", np.array([0.5], np.float32))])


def loop_reference(x0, w, M, limit, with_iter=True):
    x = x0.astype(np.float64)
    xs = []
    i = 0
    while i < M:
        x = np.tanh(x * w + (i if with_iter else x * w)) - 0.5
        xs.append(x)
        i += 1
        if not i < limit:
            break
    return x, np.stack(xs)


@pytest.mark.parametrize("cond_shape", [(), (1,)])
@pytest.mark.parametrize("M,limit", [(50, 1000), (1000, 37), (1, 5), (2, 5), (3, 2)])
def test_loop_compiled_matches_general(device, rng, counts, cond_shape, M, limit):
    x0 = rng.standard_normal((2, 3)).astype(np.float32)
    w = rng.standard_normal(3).astype(np.float32)
    feeds = {"M": np.array(M, np.int64), "x0": x0, "w": w, "limit": np.array(limit, np.int64)}
    xf, xs, es = run_both(loop_model(cond_shape), feeds, device)
    rf, rs = loop_reference(x0, w, M, limit)
    np.testing.assert_allclose(xf, rf, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(xs, rs, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(es, np.exp(rs), rtol=1e-5, atol=1e-6)
    if len(rs) > 2:
        assert counts["ok"] > 0


def test_loop_reruns_with_new_outer_values(device, rng, counts):
    sess = Session(loop_model(), device=device)
    x0 = rng.standard_normal((2, 3)).astype(np.float32)
    for scale in (1.0, -2.0):
        w = (scale * rng.standard_normal(3)).astype(np.float32)
        xf, xs, _ = sess.run(None, {"M": np.array(20, np.int64), "x0": x0, "w": w,
                                    "limit": np.array(100, np.int64)})
        rf, rs = loop_reference(x0, w, 20, 100)
        np.testing.assert_allclose(xs, rs, rtol=1e-5, atol=1e-6)
    assert counts["ok"] > 0


def test_loop_benchmark_shape_body_uses_aliases(device, rng, counts):
    """cond passed through Identity, scan output an Identity of the state: no op for
    either in the compiled program."""
    body = oh.make_graph(
        [oh.make_node("Identity", ["cond_in"], ["cond_out"]),
         oh.make_node("Add", ["x_in", "step"], ["x_out"]),
         oh.make_node("Identity", ["x_out"], ["x_scan"])],
        "body", [vi("i", TP.INT64, []), vi("cond_in", TP.BOOL, []), vi("x_in", TP.FLOAT, [1, 16])],
        [vi("cond_out", TP.BOOL, []), vi("x_out", TP.FLOAT, [1, 16]), vi("x_scan", TP.FLOAT, [1, 16])])
    m = model_of([oh.make_node("Loop", ["M", "cond", "x0"], ["xf", "xs"], body=body)],
                 [vi("M", TP.INT64, []), vi("cond", TP.BOOL, []), vi("x0", TP.FLOAT, [1, 16])],
                 [vi("xf", TP.FLOAT, None), vi("xs", TP.FLOAT, None)],
                 [init("step", np.full((1, 16), 0.25, np.float32))])
    x0 = rng.random((1, 16)).astype(np.float32)
    xf, xs = run_both(m, {"M": np.array(300, np.int64), "cond": np.array(True), "x0": x0}, device)
    expect = x0.copy()
    for k in range(300):
        expect = expect + np.float32(0.25)
        np.testing.assert_array_equal(xs[k], expect)
    np.testing.assert_array_equal(xf, expect)
    prog = counts["programs"][0]
    assert [op[0] for op in prog.ops] == [2]  # just the Add
    assert counts["ok"] == 299


def test_loop_state_changing_shape_and_sequences(device, rng, counts):
    """A state growing every iteration (new signature each time) and a sequence state
    (never compiled) give the general path's results."""
    body = oh.make_graph(
        [oh.make_node("Concat", ["x_in", "piece"], ["x_out"], axis=0),
         oh.make_node("SequenceInsert", ["s_in", "x_in"], ["s_out"]),
         oh.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [vi("i", TP.INT64, []), vi("cond_in", TP.BOOL, []), vi("x_in", TP.FLOAT, None),
                 oh.make_tensor_sequence_value_info("s_in", TP.FLOAT, None)],
        [vi("cond_out", TP.BOOL, []), vi("x_out", TP.FLOAT, None),
         oh.make_tensor_sequence_value_info("s_out", TP.FLOAT, None)])
    grow = model_of([oh.make_node("SequenceEmpty", [], ["s0"], dtype=TP.FLOAT),
                     oh.make_node("Loop", ["M", "", "x0", "s0"], ["xf", "sf"], body=body)],
                    [vi("M", TP.INT64, []), vi("x0", TP.FLOAT, [1, 2])],
                    [vi("xf", TP.FLOAT, None), oh.make_tensor_sequence_value_info("sf", TP.FLOAT, None)],
                    [init("piece", np.ones((1, 2), np.float32))])
    x0 = rng.random((1, 2)).astype(np.float32)
    fast = Session(grow, device=device).run(None, {"M": np.array(9, np.int64), "x0": x0})
    general = Session(grow, device=device, options={"compile_bodies": False}).run(
        None, {"M": np.array(9, np.int64), "x0": x0})
    np.testing.assert_array_equal(fast[0], general[0])
    assert fast[0].shape == (10, 2)
    assert [a.shape for a in fast[1]] == [a.shape for a in general[1]] == [(k + 1, 2) for k in range(9)]
    assert counts["ok"] == 0 and all(p is None for p in counts["programs"])


def test_loop_data_dependent_shapes_inside_body(device, rng, counts):
    """NonZero's output shape follows the data: the compiled path leaves the iteration
    where it changes and the general path finishes it."""
    body = oh.make_graph(
        [oh.make_node("Greater", ["x_in", "thr"], ["mask"]),
         oh.make_node("NonZero", ["mask"], ["nz"]),
         oh.make_node("Add", ["nz", "nz"], ["nz2"]),
         oh.make_node("ReduceSum", ["nz2"], ["total"], keepdims=1),
         oh.make_node("Sub", ["x_in", "dec"], ["x_out"]),
         oh.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [vi("i", TP.INT64, []), vi("cond_in", TP.BOOL, []), vi("x_in", TP.FLOAT, [6])],
        [vi("cond_out", TP.BOOL, []), vi("x_out", TP.FLOAT, [6]), vi("total", TP.INT64, None)])
    m = model_of([oh.make_node("Loop", ["M", "", "x0"], ["xf", "totals"], body=body)],
                 [vi("M", TP.INT64, []), vi("x0", TP.FLOAT, [6])],
                 [vi("xf", TP.FLOAT, None), vi("totals", TP.INT64, None)],
                 [init("thr", np.float32(0.0)), init("dec", np.float32(0.25))])
    x0 = np.array([0.1, 1.1, 2.1, 3.1, 2.1, 1.1], np.float32)  # crossings 4 iterations apart
    xf, totals = run_both(m, {"M": np.array(12, np.int64), "x0": x0}, device)
    x = x0.copy()
    expect = []
    for _ in range(12):
        expect.append(2 * int(np.nonzero(x > 0)[0].sum()))
        x = x - np.float32(0.25)
    np.testing.assert_array_equal(totals.reshape(-1), expect)
    assert counts["left"] > 0 and counts["ok"] > 0


def test_if_in_compiled_body_reads_body_and_outer_values(device, rng, counts):
    then_b = oh.make_graph([oh.make_node("Add", ["x_in", "w"], ["r"])], "then", [], [vi("r", TP.FLOAT, [3])])
    else_b = oh.make_graph([oh.make_node("Sub", ["x_in", "w"], ["r2"])], "else", [], [vi("r2", TP.FLOAT, [3])])
    body = oh.make_graph(
        [oh.make_node("Less", ["i", "half"], ["first"]),
         oh.make_node("If", ["first"], ["y"], then_branch=then_b, else_branch=else_b),
         oh.make_node("Mul", ["y", "k"], ["x_out"]),
         oh.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [vi("i", TP.INT64, []), vi("cond_in", TP.BOOL, []), vi("x_in", TP.FLOAT, [3])],
        [vi("cond_out", TP.BOOL, []), vi("x_out", TP.FLOAT, [3]), vi("y", TP.FLOAT, [3])])
    m = model_of([oh.make_node("Loop", ["M", "", "x0"], ["xf", "ys"], body=body)],
                 [vi("M", TP.INT64, []), vi("x0", TP.FLOAT, [3]), vi("w", TP.FLOAT, [3])],
                 [vi("xf", TP.FLOAT, None), vi("ys", TP.FLOAT, None)],
                 [init("half", np.int64(5)), init("k", np.float32(0.5))])
    x0, w = rng.random(3).astype(np.float32), rng.random(3).astype(np.float32)
    xf, ys = run_both(m, {"M": np.array(10, np.int64), "x0": x0, "w": w}, device)
    x = x0.astype(np.float64)
    for i in range(10):
        y = x + w if i < 5 else x - w
        np.testing.assert_allclose(ys[i], y, rtol=1e-6, atol=1e-6)
        x = y * 0.5
    assert counts["ok"] > 0


def test_body_output_type_changing_later_raises_as_general(device, rng, counts):
    """From iteration 3 the If yields float64 where the body declares float: the same
    error either way."""
    then_b = oh.make_graph([oh.make_node("Identity", ["x_in"], ["r"])], "then", [], [vi("r", TP.FLOAT, [2])])
    else_b = oh.make_graph([oh.make_node("Cast", ["x_in"], ["r2"], to=TP.DOUBLE)], "else", [],
                           [vi("r2", TP.DOUBLE, [2])])
    body = oh.make_graph(
        [oh.make_node("Less", ["i", "three"], ["early"]),
         oh.make_node("If", ["early"], ["y"], then_branch=then_b, else_branch=else_b),
         oh.make_node("Neg", ["x_in"], ["x_out"]),
         oh.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [vi("i", TP.INT64, []), vi("cond_in", TP.BOOL, []), vi("x_in", TP.FLOAT, [2])],
        [vi("cond_out", TP.BOOL, []), vi("x_out", TP.FLOAT, [2]), vi("y", TP.FLOAT, [2])])
    m = model_of([oh.make_node("Loop", ["M", "", "x0"], ["xf", "ys"], body=body)],
                 [vi("M", TP.INT64, []), vi("x0", TP.FLOAT, [2])],
                 [vi("xf", TP.FLOAT, None), vi("ys", TP.FLOAT, None)], [init("three", np.int64(3))])
    feeds = {"M": np.array(8, np.int64), "x0": rng.random(2).astype(np.float32)}
    fast = error_of(m, feeds, device)
    general = error_of(m, feeds, device, {"compile_bodies": False})
    assert type(fast) is type(general) and str(fast) == str(general)
    assert "Loop" in str(fast)
    assert counts["left"] == 1


def test_kernel_error_in_later_iteration_names_the_op(device, rng, counts):
    """Integer Div by a state that reaches zero at iteration 3."""
    body = oh.make_graph(
        [oh.make_node("Sub", ["d_in", "one"], ["d_out"]),
         oh.make_node("Div", ["c", "d_in"], ["q"]),
         oh.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [vi("i", TP.INT64, []), vi("cond_in", TP.BOOL, []), vi("d_in", TP.INT64, [2])],
        [vi("cond_out", TP.BOOL, []), vi("d_out", TP.INT64, [2]), vi("q", TP.INT64, [2])])
    m = model_of([oh.make_node("Loop", ["M", "", "d0"], ["df", "qs"], body=body)],
                 [vi("M", TP.INT64, []), vi("d0", TP.INT64, [2])],
                 [vi("df", TP.INT64, None), vi("qs", TP.INT64, None)],
                 [init("one", np.int64(1)), init("c", np.array([-7, 9], np.int64))])
    ok = {"M": np.array(3, np.int64), "d0": np.array([3, 5], np.int64)}
    _, qs = run_both(m, ok, device)
    np.testing.assert_array_equal(qs, [[-2, 1], [-3, 2], [-7, 3]])  # truncation toward zero
    bad = {"M": np.array(6, np.int64), "d0": np.array([3, 5], np.int64)}
    fast = error_of(m, bad, device)
    general = error_of(m, bad, device, {"compile_bodies": False})
    assert type(fast) is type(general) and str(fast) == str(general)
    assert isinstance(fast, ValueError) and "Div" in str(fast) and "division by zero" in str(fast)


def overflow_model(op):
    """x <- x * 1e10 each iteration, scanning op(x): overflows at iteration 3."""
    body = oh.make_graph(
        [oh.make_node("Mul", ["x_in", "big"], ["x_out"]),
         oh.make_node(op, ["x_out"] if op == "Exp" else ["x_out", "x_out"], ["y"]),
         oh.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [vi("i", TP.INT64, []), vi("cond_in", TP.BOOL, []), vi("x_in", TP.FLOAT, [2])],
        [vi("cond_out", TP.BOOL, []), vi("x_out", TP.FLOAT, [2]), vi("y", TP.FLOAT, [2])])
    return model_of([oh.make_node("Loop", ["M", "", "x0"], ["xf", "ys"], body=body)],
                    [vi("M", TP.INT64, []), vi("x0", TP.FLOAT, [2])],
                    [vi("xf", TP.FLOAT, None), vi("ys", TP.FLOAT, None)],
                    [init("big", np.float32(1e10))])


@pytest.mark.parametrize("op", ["Exp", "Add"])
def test_floating_point_events_warn_exactly_as_general(device, op):
    """Exp is quiet (no warning for its overflow); Mul and Add warn on overflow: the
    compiled path emits exactly the general path's warnings and values."""
    feeds = {"M": np.array(6, np.int64), "x0": np.array([1.0, -3.0], np.float32)}
    records = []
    for options in (None, {"compile_bodies": False}):
        with warnings.catch_warnings(record=True) as caught, np.errstate(all="warn"):
            warnings.simplefilter("always")
            out = Session(overflow_model(op), device=device, options=options).run(None, feeds)
        records.append((out, sorted(str(w.message) for w in caught if w.category is RuntimeWarning)))
    (fast, fw), (general, gw) = records
    for a, b in zip(fast, general):
        np.testing.assert_array_equal(a, b)
    assert fw == gw
    assert np.isinf(fast[1][-1][0]) and fast[1][-1][1] == (0 if op == "Exp" else -np.inf)


def test_floating_point_errors_raise_exactly_as_general(device):
    """With overflow set to raise, Mul's overflow fails the node in both paths."""
    feeds = {"M": np.array(6, np.int64), "x0": np.array([1.0, -3.0], np.float32)}
    with np.errstate(over="raise"):
        fast = error_of(overflow_model("Exp"), feeds, device)
        general = error_of(overflow_model("Exp"), feeds, device, {"compile_bodies": False})
    assert type(fast) is type(general) and str(fast) == str(general)
    if device == "cpu":
        assert "Mul" in str(fast)


def test_big_intermediates_are_freed_after_last_use(device, rng, counts):
    body = oh.make_graph(
        [oh.make_node("MatMul", ["x_in", "w"], ["big"]),       # 128x128 float32: 64 KiB
         oh.make_node("ReduceMean", ["big"], ["m"], keepdims=1),
         oh.make_node("Sub", ["x_in", "m"], ["x_out"]),
         oh.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [vi("i", TP.INT64, []), vi("cond_in", TP.BOOL, []), vi("x_in", TP.FLOAT, [128, 128])],
        [vi("cond_out", TP.BOOL, []), vi("x_out", TP.FLOAT, [128, 128])])
    m = model_of([oh.make_node("Loop", ["M", "", "x0"], ["xf"], body=body)],
                 [vi("M", TP.INT64, []), vi("x0", TP.FLOAT, [128, 128]), vi("w", TP.FLOAT, [128, 128])],
                 [vi("xf", TP.FLOAT, None)])
    x0 = rng.random((128, 128)).astype(np.float32)
    w = (rng.random((128, 128)) / 128).astype(np.float32)
    (xf,) = run_both(m, {"M": np.array(4, np.int64), "x0": x0, "w": w}, device)
    x = x0.astype(np.float64)
    for _ in range(4):
        x = x - (x @ w).mean(keepdims=True)
    np.testing.assert_allclose(xf, x, rtol=1e-4, atol=1e-5)
    prog = counts["programs"][0]
    big = prog.slot_of["big"]
    codes = [(op[0], op[2]) for op in prog.ops]
    # ReduceMean runs as its array function (code 1); big is dropped right after it
    assert codes[0][0] == 2 and codes[1][0] == 1 and codes[2] == (4, (big,))


# ============================================================================ Scan


def scan_model(in_axes, in_dirs, out_axes, out_dirs, opset=17):
    body = oh.make_graph(
        [oh.make_node("MatMul", ["h", "W"], ["hw"]),
         oh.make_node("Add", ["hw", "x_t"], ["pre"]),
         oh.make_node("Tanh", ["pre"], ["h_out"]),
         oh.make_node("Relu", ["h_out"], ["r"]),
         oh.make_node("Mul", ["r", "s_t"], ["y2"]),
         oh.make_node("Identity", ["h_out"], ["y1"])],
        "body", [vi("h", TP.FLOAT, [1, 4]), vi("x_t", TP.FLOAT, [1, 4]), vi("s_t", TP.FLOAT, [])],
        [vi("h_out", TP.FLOAT, [1, 4]), vi("y1", TP.FLOAT, [1, 4]), vi("y2", TP.FLOAT, [1, 4])])
    scan = oh.make_node("Scan", ["h0", "x", "s"], ["hf", "ys1", "ys2"], body=body, num_scan_inputs=2,
                        scan_input_axes=in_axes, scan_input_directions=in_dirs,
                        scan_output_axes=out_axes, scan_output_directions=out_dirs)
    return model_of([scan], [vi("h0", TP.FLOAT, [1, 4]), vi("x", TP.FLOAT, None), vi("s", TP.FLOAT, None)],
                    [vi("hf", TP.FLOAT, None), vi("ys1", TP.FLOAT, None), vi("ys2", TP.FLOAT, None)],
                    [init("W", np.linspace(-0.5, 0.5, 16, dtype=np.float32).reshape(4, 4))], opset)


@pytest.mark.parametrize("T", [0, 1, 2, 7])
@pytest.mark.parametrize("in_axes,in_dirs,out_axes,out_dirs", [
    ([0, 0], [0, 0], [0, 0], [0, 0]),
    ([2, 0], [1, 0], [1, -3], [0, 1]),
    ([-3, 0], [0, 1], [2, 0], [1, 1]),
])
def test_scan_compiled_matches_general(device, rng, counts, T, in_axes, in_dirs, out_axes, out_dirs):
    W = np.linspace(-0.5, 0.5, 16).reshape(4, 4)
    xs = rng.standard_normal((T, 1, 4)).astype(np.float32)
    x = np.moveaxis(xs, 0, in_axes[0] % 3).copy()
    s = rng.standard_normal(T).astype(np.float32)  # 1-D: 0-d slices
    h0 = rng.standard_normal((1, 4)).astype(np.float32)
    hf, ys1, ys2 = run_both(scan_model(in_axes, in_dirs, out_axes, out_dirs),
                            {"h0": h0, "x": x, "s": s}, device)
    order_x = range(T - 1, -1, -1) if in_dirs[0] else range(T)
    order_s = list(range(T - 1, -1, -1) if in_dirs[1] else range(T))
    h = h0.astype(np.float64)
    r1, r2 = [], []
    for step, t in enumerate(order_x):
        h = np.tanh(h @ W + xs[t])
        r1.append(h)
        r2.append(np.maximum(h, 0) * s[order_s[step]])
    np.testing.assert_allclose(hf, h, rtol=1e-5, atol=1e-6)
    for got, ref, axis, rev in ((ys1, r1, out_axes[0], out_dirs[0]), (ys2, r2, out_axes[1], out_dirs[1])):
        if T == 0:
            assert got.size == 0
            continue
        ref = np.stack(ref[::-1] if rev else ref, axis=axis)
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    if T > 2:
        assert counts["ok"] == T - 1


def test_scan8_batches_compiled(device, rng, counts):
    body = oh.make_graph(
        [oh.make_node("Add", ["acc", "x_t"], ["acc_out"]),
         oh.make_node("Mul", ["acc_out", "x_t"], ["y"])],
        "body", [vi("acc", TP.FLOAT, [2]), vi("x_t", TP.FLOAT, [2])],
        [vi("acc_out", TP.FLOAT, [2]), vi("y", TP.FLOAT, [2])])
    m = model_of([oh.make_node("Scan", ["lens", "a0", "x"], ["af", "ys"], body=body, num_scan_inputs=1,
                               directions=[1])],
                 [vi("lens", TP.INT64, [3]), vi("a0", TP.FLOAT, [3, 2]), vi("x", TP.FLOAT, [3, 6, 2])],
                 [vi("af", TP.FLOAT, None), vi("ys", TP.FLOAT, None)], opset=8)
    lens = np.array([6, 0, 4], np.int64)
    a0 = rng.random((3, 2)).astype(np.float32)
    x = rng.random((3, 6, 2)).astype(np.float32)
    af, ys = run_both(m, {"lens": lens, "a0": a0, "x": x}, device)
    for b in range(3):
        acc = a0[b].astype(np.float64)
        for k, t in enumerate(range(lens[b] - 1, -1, -1)):
            acc = acc + x[b, t]
            np.testing.assert_allclose(ys[b, k], acc * x[b, t], rtol=1e-6)
        np.testing.assert_allclose(af[b], acc, rtol=1e-6)
        assert not ys[b, lens[b]:].any()
    assert counts["ok"] == 5 + 4  # batches share the program compiled on batch 0


# ============================================================================ array functions


def _same(kernel, inputs, attrs=None):
    """The kernel's array function gives its result to the bit (or is None)."""
    attrs = attrs or {}
    tensors = [Tensor(a) for a in inputs]
    want = kernel(*tensors, **attrs).array
    fn = kernel.array_function(tensors, attrs)
    if fn is None:
        return False
    with np.errstate(all="ignore"):
        got = fn(*[t.array for t in tensors])
    assert got.__class__ is want.__class__ and got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    return True


def kernel(op, opset=None):
    cls, version = lookup(op, "", opset)
    return cls(KernelContext("cpu", opset), version)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64, np.uint8])
@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
def test_binary_array_functions(rng, op, dtype, recwarn):
    if np.dtype(dtype).kind == "f":
        a = rng.standard_normal((3, 1, 5)).astype(dtype)
        b = rng.standard_normal((4, 1)).astype(dtype)
    else:
        a = rng.integers(-50 if dtype != np.uint8 else 0, 50, (3, 1, 5)).astype(dtype)
        b = rng.integers(1, 9, (4, 1)).astype(dtype)
    assert _same(kernel(op), [a, b])
    assert _same(kernel(op), [np.asarray(a[0, 0, 0]), np.asarray(b[0, 0])])  # 0-d


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
def test_legacy_broadcast_has_no_array_function(rng, op):
    a = rng.standard_normal((3, 2, 5)).astype(np.float32)
    b = rng.standard_normal(5).astype(np.float32)
    k = kernel(op, 6)
    np.testing.assert_allclose(k(a, b, broadcast=1).array, kernel(op)(a, b).array)
    assert k.array_function([Tensor(a), Tensor(b)], {"broadcast": 1}) is None


def test_array_function_none_for_half_types(rng):
    a = rng.standard_normal((2, 3)).astype(np.float16)
    for op, args in (("Add", [a, a]), ("MatMul", [a, a.T]), ("Tanh", [a]), ("Exp", [a]), ("Relu", [a])):
        k = kernel(op)
        assert k.array_function([Tensor(x) for x in args], {}) is None


def test_integer_div_array_function_raises_on_zero():
    k = kernel("Div")
    a, b = np.array([4, -7], np.int64), np.array([2, 3], np.int64)
    fn = k.array_function([Tensor(a), Tensor(b)], {})
    np.testing.assert_array_equal(fn(a, b), [2, -2])
    with pytest.raises(KernelInputError, match="Div"):
        fn(a, np.array([1, 0], np.int64))


@pytest.mark.parametrize("op", ["Neg", "Abs", "Sqrt", "Exp", "Log", "Relu", "Acos", "Acosh", "Asin",
                                "Asinh", "Atan", "Atanh", "Cos", "Cosh", "Sin", "Sinh", "Tan", "Tanh"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_unary_array_functions(rng, op, dtype):
    x = (rng.standard_normal((4, 5)) * 3).astype(dtype)
    x[0, :3] = [np.nan, np.inf, -np.inf]
    x[1, :2] = [0.0, 1e-40 if dtype == np.float32 else 1e-310]
    assert _same(kernel(op), [x])
    assert _same(kernel(op), [np.asarray(x[2, 2])])


def test_unary_integer_array_functions(rng):
    x = rng.integers(-100, 100, (3, 4)).astype(np.int32)
    for op in ("Neg", "Abs", "Relu"):
        assert _same(kernel(op), [x])


@pytest.mark.parametrize("shapes", [((1, 128), (128, 128)), ((5, 3), (3, 7)), ((2, 5, 3), (3, 4)),
                                    ((3,), (3, 4)), ((4, 3), (3,)), ((2, 1, 4, 3), (5, 3, 2))])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
def test_matmul_array_function_and_reference(rng, shapes, dtype):
    a = (rng.standard_normal(shapes[0]) * 4).astype(dtype)
    b = (rng.standard_normal(shapes[1]) * 4).astype(dtype)
    assert _same(kernel("MatMul"), [a, b])
    got = kernel("MatMul")(a, b).array
    ref = np.matmul(a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(got, ref, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-4)


def test_matmul_2d_non_contiguous_operands(rng):
    a = rng.standard_normal((7, 5)).astype(np.float32).T     # (5, 7), Fortran order
    b = rng.standard_normal((9, 14)).astype(np.float32)[::2, ::2]  # (5, 7) strided
    b = b[:7, :7] if b.shape[0] >= 7 else rng.standard_normal((7, 3)).astype(np.float32)[:, ::1]
    got = kernel("MatMul")(a, b).array
    np.testing.assert_allclose(got, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-5, atol=1e-5)
    assert _same(kernel("MatMul"), [a, b])


@pytest.mark.parametrize("attrs", [{}, {"transA": 1}, {"transB": 1, "alpha": 0.5},
                                   {"alpha": 2.0, "beta": -1.5, "transA": 1, "transB": 1}])
def test_gemm_array_function(rng, attrs):
    a = rng.standard_normal((3, 4) if not attrs.get("transA") else (4, 3)).astype(np.float32)
    b = rng.standard_normal((4, 5) if not attrs.get("transB") else (5, 4)).astype(np.float32)
    for c in (rng.standard_normal((3, 5)), rng.standard_normal(5), rng.standard_normal((3, 1))):
        assert _same(kernel("Gemm"), [a, b, c.astype(np.float32)], dict(attrs))
    ints = [np.ones((2, 2), np.int32)] * 3
    k = kernel("Gemm")
    assert k.array_function([Tensor(x) for x in ints], {}) is None
