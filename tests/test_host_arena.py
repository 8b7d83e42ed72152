"""The host buffer arena (gpukernels.host.arena): one per Session, buffers handed out
again across runs and, at the runtime's release points, within a run; never a buffer
that a returned value, a failed run or an observer may still hold; bounded memory.

Most tests lower the arena's floor (``min_bytes``) so that small arrays exercise it,
and poison every buffer that comes back (``arena.poison``: 0xFF bytes, NaN in float32),
so that a value still using a recycled buffer shows up as a wrong result."""

from __future__ import annotations

import gc
import threading
import weakref

import numpy as np
import onnx
import pytest
from numpy.lib.stride_tricks import as_strided
from onnx import TensorProto as TP
from onnx import helper as oh
from onnx import numpy_helper

from gpukernels.host import HostArena, current_run, host_empty, parallel_ranges, root_of
from gpukernels.runtime import Session
from tests.reference import conv

pytestmark = pytest.mark.usefixtures("default_paths")  # the host Softmax path calls host_empty

ROWS, COLS = 8, 8192  # float32: 256 KiB, over the host Softmax threshold (64 Ki elements)
FLOOR = 1 << 16


def _model(nodes, inputs, outputs, inits=(), opset=17, functions=()):
    g = oh.make_graph(nodes, "g", inputs, outputs, list(inits))
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", opset), oh.make_opsetid("local", 1)],
                         functions=list(functions))


def _vi(name, shape, et=TP.FLOAT):
    return oh.make_tensor_value_info(name, et, shape)


def _session(model, compile_graph=True, poison=True, **arena):
    sess = Session(model, options={"compile_graph": compile_graph})
    sess.arena.min_bytes = arena.get("min_bytes", FLOOR)
    if "max_bytes" in arena:
        sess.arena.max_bytes = arena["max_bytes"]
    sess.arena.poison = poison
    return sess


def _spy_takes(monkeypatch, arena) -> list:
    """The buffers arena hands out from now on, in order."""
    taken = []
    take = arena._take

    def spy(nbytes):
        buf, addr = take(nbytes)
        taken.append(buf)
        return buf, addr

    monkeypatch.setattr(arena, "_take", spy)
    return taken


def softmax_ref(x, axis=-1):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def sigmoid_ref(x):
    return 1 / (1 + np.exp(-x.astype(np.float64)))


# a chain whose intermediates and outputs come from the arena: Softmax (host path) and
# views of its result (Reshape, Slice)
CHAIN = _model(
    [oh.make_node("Softmax", ["x"], ["s"], axis=-1),
     oh.make_node("Mul", ["s", "k"], ["m"]),
     oh.make_node("Softmax", ["m"], ["y"], axis=-1),
     oh.make_node("Reshape", ["y", "flat"], ["y_flat"]),
     oh.make_node("Softmax", ["s"], ["z"], axis=-1),
     oh.make_node("Slice", ["z", "starts", "ends"], ["z_row"])],
    [_vi("x", [ROWS, COLS])],
    [_vi("y_flat", [ROWS * COLS]), _vi("z_row", [1, COLS])],
    [numpy_helper.from_array(np.array(3.0, np.float32), "k"),
     numpy_helper.from_array(np.array([-1], np.int64), "flat"),
     numpy_helper.from_array(np.array([2], np.int64), "starts"),
     numpy_helper.from_array(np.array([3], np.int64), "ends")])


def chain_ref(x):
    s = softmax_ref(x)
    return [softmax_ref(s * 3).reshape(-1), softmax_ref(s)[2:3]]


def _check(outs, refs):
    for o, r in zip(outs, refs):
        np.testing.assert_allclose(o, r, rtol=2e-6, atol=1e-9)


# ------------------------------------------------------------------ reuse, aliasing


@pytest.mark.parametrize("compile_graph", [True, False])
def test_buffers_are_reused_across_runs(monkeypatch, rng, compile_graph):
    sess = _session(CHAIN, compile_graph)
    x = rng.standard_normal((ROWS, COLS)).astype(np.float32)
    sess.run(None, {"x": x})
    sess.run(None, {"x": x})  # the compiled path compiles on the second run
    idle = {id(b) for b in sess.arena.idle_buffers()}
    assert idle and sess.arena.idle_bytes <= sess.arena.max_bytes
    taken = _spy_takes(monkeypatch, sess.arena)
    _check(sess.run(None, {"x": x}), chain_ref(x))
    reused = [b for b in taken if id(b) in idle]
    assert reused, "no buffer of the earlier runs was handed out again"
    assert {id(b) for b in sess.arena.idle_buffers()} & idle  # the same buffers went back


@pytest.mark.parametrize("compile_graph", [True, False])
def test_outputs_never_alias_a_recycled_buffer(rng, compile_graph):
    sess = _session(CHAIN, compile_graph)
    xs = [rng.standard_normal((ROWS, COLS)).astype(np.float32) for _ in range(4)]
    for x in xs[:2]:  # warm up (and compile)
        sess.run(None, {"x": x})
    first = sess.run(None, {"x": xs[2]})
    kept = [a.copy() for a in first]
    second = sess.run(None, {"x": xs[3]})
    _check(first, chain_ref(xs[2]))
    _check(second, chain_ref(xs[3]))
    for a in second:
        assert not any(np.shares_memory(a, b) for b in first)
        a[...] = -7.0  # writing into run 2's outputs leaves run 1's alone
    for a, k in zip(first, kept):
        np.testing.assert_array_equal(a, k)
    for a in first:
        a[...] = 5.0  # and run 1's outputs are the caller's: a later run never reuses them
    third = sess.run(None, {"x": xs[2]})
    _check(third, chain_ref(xs[2]))
    assert all((a == 5.0).all() for a in first) and all((a == -7.0).all() for a in second)


def test_values_returned_inside_sequences_and_optionals_stay_out(rng):
    model = _model(
        [oh.make_node("Softmax", ["x"], ["s"], axis=-1),
         oh.make_node("Softmax", ["s"], ["t"], axis=-1),
         oh.make_node("Transpose", ["t"], ["u"], perm=[1, 0]),
         oh.make_node("SequenceConstruct", ["t", "u"], ["seq"]),
         oh.make_node("Optional", ["s"], ["opt"])],
        [_vi("x", [ROWS, COLS])],
        [oh.make_value_info("seq", oh.make_sequence_type_proto(oh.make_tensor_type_proto(TP.FLOAT, None))),
         oh.make_value_info("opt", oh.make_optional_type_proto(oh.make_tensor_type_proto(TP.FLOAT, None)))],
        opset=18)
    sess = _session(model)
    xs = [rng.standard_normal((ROWS, COLS)).astype(np.float32) for _ in range(3)]
    first = sess.run_values({"x": xs[0]})
    kept = [t.numpy().copy() for t in first[0].tensors] + [first[1].value.numpy().copy()]
    for x in xs[1:]:
        sess.run_values({"x": x})
    got = [t.numpy() for t in first[0].tensors] + [first[1].value.numpy()]
    for a, k in zip(got, kept):
        np.testing.assert_array_equal(a, k)
    s = softmax_ref(xs[0])
    _check(got, [softmax_ref(s), softmax_ref(s).T, s])


def test_escape_check_sees_hidden_bases():
    """A returned view made through a memoryview or as_strided still keeps its buffer."""
    arena = HostArena(max_bytes=1 << 24, min_bytes=1)
    arena.poison = True
    for make in (lambda a: np.frombuffer(memoryview(a), a.dtype),
                 lambda a: as_strided(a, (4,), (a.strides[0],))):
        with arena.run() as live:
            a = host_empty((1024,), np.float32)
            a[:] = 1.0
            view = make(a[8:])
            assert root_of(view) is root_of(a)
            live.finish([view])
        assert arena.idle_bytes == 0
        assert (view == 1.0).all()


def test_root_of_follows_every_kind_of_base():
    buf = np.empty(64, np.uint8)
    a = buf.view(np.float32).reshape(4, 4)
    assert root_of(a.T[1:]) is buf
    assert root_of(as_strided(a, (2, 2), a.strides)) is buf
    assert root_of(np.frombuffer(a.data, np.uint8)) is buf
    b = np.frombuffer(b"\0" * 16, np.uint8)
    assert root_of(b[2:]) is b  # bytes: not an array, the chain stops at b


# ----------------------------------------------------------- failures, observers


def test_a_failed_run_recycles_nothing(monkeypatch, rng):
    model = _model([oh.make_node("Softmax", ["x"], ["s"], axis=-1),
                    oh.make_node("Softmax", ["s"], ["t"], axis=-1),
                    oh.make_node("Reshape", ["t", "shape"], ["y"])],
                   [_vi("x", [ROWS, COLS]), _vi("shape", [2], TP.INT64)], [_vi("y", None)])
    sess = _session(model, compile_graph=False)
    x = rng.standard_normal((ROWS, COLS)).astype(np.float32)
    ok = sess.run(None, {"x": x, "shape": np.array([-1, COLS], np.int64)})[0]
    taken = _spy_takes(monkeypatch, sess.arena)
    with pytest.raises(Exception, match="Reshape"):
        sess.run(None, {"x": x, "shape": np.array([7, 7], np.int64)})
    # s was dropped before the failure (provably unused) and went back at once; t was
    # alive when Reshape failed (the traceback may hold it): never given back
    assert len(taken) == 2
    idle = [id(b) for b in sess.arena.idle_buffers()]
    assert id(taken[0]) in idle and id(taken[1]) not in idle
    again = sess.run(None, {"x": x, "shape": np.array([-1, COLS], np.int64)})[0]
    np.testing.assert_array_equal(again, ok)


def test_runs_with_an_observer_take_nothing(monkeypatch, rng):
    sess = _session(CHAIN)
    taken = _spy_takes(monkeypatch, sess.arena)
    seen = []

    def observer(p, args, outs, seconds):
        assert current_run() is None
        seen.extend(o.numpy() for o in outs if hasattr(o, "numpy"))

    x = rng.standard_normal((ROWS, COLS)).astype(np.float32)
    for _ in range(2):
        _check(sess.run(None, {"x": x}, observer=observer), chain_ref(x))
    assert seen and taken == [] and sess.arena.idle_bytes == 0


# ------------------------------------------------------------------ threads


def test_threads_share_a_session(rng):
    sess = _session(CHAIN)
    inputs = [rng.standard_normal((ROWS, COLS)).astype(np.float32) for _ in range(5)]
    expected = [sess.run(None, {"x": x}) for x in inputs]
    expected = [[a.copy() for a in outs] for outs in expected]
    errors, barrier = [], threading.Barrier(8)

    def work(t):
        try:
            barrier.wait()
            for i in range(50):
                k = (t + i) % len(inputs)
                for a, b in zip(sess.run(None, {"x": inputs[k]}), expected[k]):
                    np.testing.assert_array_equal(a, b)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors[0]
    assert sess.arena.idle_bytes <= sess.arena.max_bytes


def test_host_threads_of_a_run_use_its_arena(monkeypatch):
    monkeypatch.setenv("GPUKERNELS_CPU_THREADS", "4")
    arena = HostArena(max_bytes=1 << 24, min_bytes=1)
    seen, bufs = [], []
    with arena.run() as live:
        def part(lo, hi):
            seen.append(current_run())
            bufs.append(host_empty((1000,), np.float64))

        parallel_ranges(4, 1, part)
        assert len(live.taken) == 4
        live.finish([])
    assert len(seen) == 4 and all(r is live for r in seen)
    assert arena.idle_bytes == 4 * 8000


# ------------------------------------------------------------------ memory bounds


def _loop_model(iters: int, carried_big: bool):
    """A Loop whose body makes two big temporaries per iteration; with carried_big the
    loop-carried value is big too (a body output: pinned, held until the run ends)."""
    body_nodes = [oh.make_node("Softmax", ["v_in"], ["a"], axis=-1),
                  oh.make_node("Softmax", ["a"], ["b"], axis=-1),
                  oh.make_node("ReduceMax", ["b"], ["m"], keepdims=1),
                  oh.make_node("Sub", ["b", "m"], ["c"]),
                  oh.make_node("Identity", ["cond_in"], ["cond_out"])]
    if carried_big:
        body_nodes += [oh.make_node("Softmax", ["c"], ["v_out"], axis=-1)]
    else:
        body_nodes += [oh.make_node("Identity", ["v_in"], ["v_out"])]
    body_nodes += [oh.make_node("ReduceSum", ["c"], ["total"], keepdims=0)]
    body = oh.make_graph(body_nodes, "body",
                         [_vi("i", [], TP.INT64), _vi("cond_in", [], TP.BOOL), _vi("v_in", [ROWS, COLS])],
                         [_vi("cond_out", [], TP.BOOL), _vi("v_out", [ROWS, COLS]), _vi("total", [])])
    return _model([oh.make_node("Loop", ["n", "", "x"], ["v", "totals"], body=body)],
                  [_vi("x", [ROWS, COLS])], [_vi("v", [ROWS, COLS]), _vi("totals", [iters])],
                  [numpy_helper.from_array(np.array(iters, np.int64), "n")])


def _loop_ref(x, iters, carried_big):
    v, totals = x.astype(np.float64), []
    for _ in range(iters):
        b = softmax_ref(softmax_ref(v))
        c = b - b.max()  # ReduceMax without axes: over everything
        totals.append(c.sum())
        if carried_big:
            v = softmax_ref(c)
    return v, np.array(totals)


def _held_watch(monkeypatch, arena) -> list:
    """(bytes the current run holds, id of the buffer) for every buffer the arena
    hands out from now on."""
    held = []
    take = arena._take

    def spy(nbytes):
        got = take(nbytes)
        held.append((current_run().held, id(got[0])))
        return got

    monkeypatch.setattr(arena, "_take", spy)
    return held


@pytest.mark.parametrize("compile_bodies", [True, False])
def test_loop_temporaries_are_reused_inside_the_run(monkeypatch, rng, compile_bodies):
    iters = 60
    sess = Session(_loop_model(iters, False), options={"compile_bodies": compile_bodies})
    sess.arena.min_bytes, sess.arena.poison = FLOOR, True
    held = _held_watch(monkeypatch, sess.arena)
    x = rng.standard_normal((ROWS, COLS)).astype(np.float32)
    v, totals = sess.run(None, {"x": x})
    _, rt = _loop_ref(x, iters, False)
    np.testing.assert_allclose(totals, rt, rtol=1e-5, atol=1e-3)
    np.testing.assert_array_equal(v, x)
    size = ROWS * COLS * 4
    # every iteration takes 2 big temporaries (a, b): without reuse the run would hold
    # 2 * 60 of them; with it, the same two or three buffers go round
    assert len(held) == 2 * iters
    assert max(h for h, _ in held) <= 3 * size
    assert len({b for _, b in held}) <= 3


def test_loop_with_a_big_carried_value_stays_under_the_cap(monkeypatch, rng):
    iters, size = 40, ROWS * COLS * 4
    sess = _session(_loop_model(iters, True), max_bytes=6 * size)
    held = _held_watch(monkeypatch, sess.arena)
    x = rng.standard_normal((ROWS, COLS)).astype(np.float32)
    v, totals = sess.run(None, {"x": x})
    rv, rt = _loop_ref(x, iters, True)
    np.testing.assert_allclose(v, rv, rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(totals, rt, rtol=1e-5, atol=1e-3)
    # the carried values stay this run's (pinned) until the cap, then plain arrays
    assert held and max(h for h, _ in held) <= sess.arena.max_bytes
    assert len(held) < 3 * iters
    assert sess.arena.idle_bytes <= sess.arena.max_bytes


# ---------------------------------------------------- subgraphs, functions, compiled


def test_if_scan_and_local_functions_with_poisoned_reuse(rng):
    """Values crossing If branches, Scan bodies and model-local functions (inputs bound
    or pinned, outputs handed on): run many times, every result exact."""
    then_g = oh.make_graph([oh.make_node("Softmax", ["s"], ["r"], axis=-1)], "then", [], [_vi("r", None)])
    else_g = oh.make_graph([oh.make_node("Neg", ["s"], ["r"])], "else", [], [_vi("r", None)])
    scan_body = oh.make_graph(
        [oh.make_node("Add", ["acc", "row"], ["acc_out"]),
         oh.make_node("Softmax", ["acc_out"], ["row_out"], axis=-1)], "scan",
        [_vi("acc", [COLS]), _vi("row", [COLS])], [_vi("acc_out", [COLS]), _vi("row_out", [COLS])])
    fn = oh.make_function("local", "Soft2", ["a"], ["b"],
                          [oh.make_node("Softmax", ["a"], ["t"], axis=-1),
                           oh.make_node("Softmax", ["t"], ["b"], axis=-1)],
                          [oh.make_opsetid("", 17)])
    model = _model(
        [oh.make_node("Softmax", ["x"], ["s"], axis=-1),
         oh.make_node("If", ["flag"], ["i"], then_branch=then_g, else_branch=else_g),
         oh.make_node("Soft2", ["i"], ["f"], domain="local"),
         oh.make_node("Scan", ["zero", "f"], ["acc", "rows"], body=scan_body, num_scan_inputs=1),
         oh.make_node("Softmax", ["rows"], ["y"], axis=-1)],
        [_vi("x", [ROWS, COLS]), _vi("flag", [], TP.BOOL)],
        [_vi("y", [ROWS, COLS]), _vi("acc", [COLS])],
        [numpy_helper.from_array(np.zeros(COLS, np.float32), "zero")], functions=[fn])

    def ref(x, flag):
        s = softmax_ref(x)
        f = softmax_ref(softmax_ref(softmax_ref(s) if flag else -s))
        acc, rows = np.zeros(COLS), []
        for r in f:
            acc = acc + r
            rows.append(softmax_ref(acc))
        return [softmax_ref(np.array(rows)), acc]

    for compile_graph in (True, False):
        sess = _session(model, compile_graph, min_bytes=1 << 12)
        for k in range(6):
            x = rng.standard_normal((ROWS, COLS)).astype(np.float32)
            flag = np.array(k % 3 != 0)
            got = sess.run(None, {"x": x, "flag": flag})
            for g, r in zip(got, ref(x, bool(flag))):
                np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-7)
        assert sess.arena.idle_bytes > 0


def test_shipped_model_with_poisoned_reuse(rng):
    """The shipped hybrid block, arena on with a low floor and poisoned buffers, agrees
    exactly with the arena off, run after run."""
    from pathlib import Path

    import gpukernels

    path = Path(gpukernels.__file__).parent / "models" / "hybrid_block.onnx"
    model = onnx.load(str(path))
    feeds = {}
    for inp in model.graph.input:
        shape = [d.dim_value or 1 for d in inp.type.tensor_type.shape.dim]
        feeds[inp.name] = rng.standard_normal(shape).astype(np.float32)
    plain = _session(model, poison=False, max_bytes=0)
    want = plain.run(None, feeds)
    sess = _session(model, min_bytes=1 << 10)
    for _ in range(3):
        for a, b in zip(sess.run(None, feeds), want):
            np.testing.assert_array_equal(a, b)


# --------------------------------------------------------------- off, direct, gc


def test_arena_off(monkeypatch, rng):
    monkeypatch.setenv("GPUKERNELS_HOST_POOL_MB", "0")
    sess = Session(CHAIN)
    assert sess.arena.max_bytes == 0
    taken = _spy_takes(monkeypatch, sess.arena)
    x = rng.standard_normal((ROWS, COLS)).astype(np.float32)
    sess.arena.min_bytes = FLOOR
    for _ in range(3):
        _check(sess.run(None, {"x": x}), chain_ref(x))
    assert taken == [] and sess.arena.idle_bytes == 0


def test_limit_from_environment(monkeypatch):
    monkeypatch.setenv("GPUKERNELS_HOST_POOL_MB", "3")
    assert HostArena().max_bytes == 3 << 20
    monkeypatch.setenv("GPUKERNELS_HOST_POOL_MB", "nonsense")
    assert HostArena().max_bytes == 1 << 30


def test_idle_memory_and_what_a_run_holds_are_bounded():
    arena = HostArena(max_bytes=10_000, min_bytes=1)
    with arena.run() as live:
        a = host_empty((3000,), np.uint8)
        b = host_empty((750,), np.float32)
        c = host_empty((4000,), np.uint8)
        assert live.held == 10_000
        assert host_empty((1,), np.uint8).base is None  # over the cap: a plain array
        assert host_empty((4, 8), object).dtype == object and live.held == 10_000
        assert b.dtype == np.float32 and b.shape == (750,) and b.flags.c_contiguous
        live.finish([])
    assert arena.idle_bytes == 10_000
    with arena.run() as live:
        d = host_empty((5000,), np.uint8)
        live.finish([])
    assert arena.idle_bytes == 9000  # the oldest went
    assert [x.nbytes for x in arena.idle_buffers()] == [4000, 5000]
    del a, b, c, d


def test_a_kernel_called_directly_gets_plain_arrays(rng):
    from gpukernels.kernels import KernelContext, kernel_class

    assert current_run() is None
    x = rng.standard_normal((ROWS, COLS)).astype(np.float32)
    y = kernel_class("Softmax")(KernelContext("cpu"))(x).numpy()
    np.testing.assert_allclose(y, softmax_ref(x), rtol=2e-6, atol=1e-9)
    assert root_of(y).flags.owndata and root_of(y).dtype == np.float32  # np.empty, not a uint8 buffer
    big = host_empty((1 << 21,), np.float32)
    assert big.base is None and big.flags.owndata


def test_a_session_that_is_collected_frees_its_arena(rng):
    sess = _session(CHAIN)
    sess.run(None, {"x": rng.standard_normal((ROWS, COLS)).astype(np.float32)})
    assert sess.arena.idle_bytes > 0
    ref = weakref.ref(sess.arena)
    bufs = [weakref.ref(b) for b in sess.arena.idle_buffers()]
    del sess
    gc.collect()
    assert ref() is None and all(b() is None for b in bufs)


# ------------------------------------------------------------ Conv's own floor


def conv_ref(x, w, group=1):
    """float64 2-D convolution, stride 1, pads 1 (tests/reference/conv.py)."""
    return conv(x, w, pads=[1, 1, 1, 1], group=group)


@pytest.mark.parametrize("group", [1, 64], ids=["dense", "depthwise"])
def test_conv_outputs_come_from_the_arena_from_their_own_floor(monkeypatch, rng, group):
    """2-D Conv outputs from 256 KiB up (below the arena's 4 MB default) are arena
    buffers: the intermediate one is reused run after run, the results stay exact."""
    C, M = 64, 64
    w1 = (rng.standard_normal((M, C // group, 3, 3)) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((M, M // group, 3, 3)) * 0.1).astype(np.float32)
    model = _model([oh.make_node("Conv", ["x", "w1"], ["h"], pads=[1, 1, 1, 1], group=group),
                    oh.make_node("Conv", ["h", "w2"], ["y"], pads=[1, 1, 1, 1], group=group)],
                   [_vi("x", [1, C, 48, 48])], [_vi("y", [1, M, 48, 48])],
                   [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    sess = Session(model)
    sess.arena.poison = True
    xs = [rng.standard_normal((1, C, 48, 48)).astype(np.float32) for _ in range(4)]
    sess.run(None, {"x": xs[0]})
    sess.run(None, {"x": xs[1]})
    taken = _spy_takes(monkeypatch, sess.arena)
    idle = {id(b) for b in sess.arena.idle_buffers()}
    outs = [sess.run(None, {"x": x})[0] for x in xs[2:]]
    assert len(taken) == 4 and all(b.nbytes == 1 * M * 48 * 48 * 4 for b in taken)
    assert id(taken[0]) in idle and id(taken[2]) in idle  # h's buffer, both runs
    for x, y in zip(xs[2:], outs):
        ref = conv_ref(conv_ref(x, w1, group), w2, group)
        np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
