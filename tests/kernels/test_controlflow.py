"""If, Loop and Scan: graph forms (bodies run through the runtime), the value-selecting,
callback and assembling forms, checked against plain Python loops."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as oh
from onnx import numpy_helper

from gpukernels.dtypes import DataType
from gpukernels.errors import GpuKernelsError, KernelInputError, KernelTypeError
from gpukernels.kernels import KernelContext, load_all
from gpukernels.kernels.base import schema_versions
from gpukernels.tensor import Optional, Sequence, Tensor

load_all()
from gpukernels.kernels.controlflow import If, Loop  # noqa: E402
from gpukernels.kernels.scan import Scan  # noqa: E402


def vi(name, et, shape=None):
    return oh.make_tensor_value_info(name, et, shape)


def const(name, value):
    return oh.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value), name + "_v"))


def host(v):
    if isinstance(v, Sequence):
        return [t.numpy() for t in v]
    if isinstance(v, Optional):
        return None if v.value is None else host(v.value)
    return v.numpy()


def is_on(device, t):
    return type(t.array).__module__.startswith("cupy") == (device == "cuda")


# ============================================================================ If


def branch(name, nodes, outputs):
    return oh.make_graph(nodes, name, [], outputs)


def test_if_versions():
    assert schema_versions("If") == [1, 11, 13, 16, 19, 21, 23, 24, 25]
    assert schema_versions("Loop") == [1, 11, 13, 16, 19, 21, 23, 24, 25]
    assert schema_versions("Scan") == [8, 9, 11, 16, 19, 21, 23, 24, 25]


def test_if_value_form(device, rng):
    k = If(KernelContext(device))
    a, b = Tensor(rng.random(2).astype(np.float32)), Sequence([Tensor(np.int64(1))])
    assert k(np.array(True), a, b) is a
    assert k(np.array([False]), a, b) is b
    with pytest.raises(KernelInputError, match="If"):
        k(np.array(True), [a], [a, a])
    with pytest.raises(KernelInputError, match="If"):
        k(np.array(True), a)


@pytest.mark.parametrize("cond", [True, False])
def test_if_graph_form_different_shapes(device, rng, cond):
    x = rng.random((2, 3)).astype(np.float32) + 0.5
    y = rng.integers(1, 9, size=(5,)).astype(np.int64)
    then_g = branch("then", [const("a", x), const("b", y)], [vi("a", TP.FLOAT), vi("b", TP.INT64)])
    else_g = branch("else", [const("a2", x[:1]), const("b2", y[:2])], [vi("a2", TP.FLOAT), vi("b2", TP.INT64)])
    k = If(KernelContext(device))
    for c in (np.array(cond), np.array([cond]), np.array([[cond]])):
        a, b = k(c, then_branch=then_g, else_branch=else_g)
        np.testing.assert_array_equal(a.numpy(), x if cond else x[:1])
        np.testing.assert_array_equal(b.numpy(), y if cond else y[:2])
        assert is_on(device, a)


def test_if_sequences_and_optionals(device, rng):
    x = rng.random(4).astype(np.float32)
    seq_t = oh.make_sequence_type_proto(oh.make_tensor_type_proto(TP.FLOAT, None))
    then_g = branch("then", [const("x", x), oh.make_node("SequenceConstruct", ["x", "x"], ["s"])],
                    [oh.make_value_info("s", seq_t)])
    else_g = branch("else", [oh.make_node("SequenceEmpty", [], ["s2"])], [oh.make_value_info("s2", seq_t)])
    k = If(KernelContext(device, opset=13))
    out = k(np.array(True), then_branch=then_g, else_branch=else_g)
    assert isinstance(out, Sequence) and len(out) == 2
    out = k(np.array(False), then_branch=then_g, else_branch=else_g)
    assert isinstance(out, Sequence) and len(out) == 0
    # sequences are not If outputs before opset 13
    with pytest.raises(KernelTypeError, match="If"):
        If(KernelContext(device, opset=11))(np.array(True), then_branch=then_g, else_branch=else_g)
    opt_t = oh.make_optional_type_proto(oh.make_tensor_type_proto(TP.FLOAT, None))
    then_o = branch("then", [const("x", x), oh.make_node("Optional", ["x"], ["o"])], [oh.make_value_info("o", opt_t)])
    else_o = branch("else", [oh.make_node("Optional", [], ["o2"], type=oh.make_tensor_type_proto(TP.FLOAT, None))],
                    [oh.make_value_info("o2", opt_t)])
    k16 = If(KernelContext(device, opset=16))
    o = k16(np.array(True), then_branch=then_o, else_branch=else_o)
    np.testing.assert_array_equal(host(o), x)
    assert k16(np.array(False), then_branch=then_o, else_branch=else_o).value is None
    # optionals are not If outputs before opset 16 (branches resolved at opset 16)
    with pytest.raises(KernelTypeError, match="If"):
        If(KernelContext(device, opset=16), version=13)(np.array(True), then_branch=then_o, else_branch=else_o)


def test_if_errors(device, rng):
    x = rng.random(2).astype(np.float32)
    one = branch("one", [const("a", x)], [vi("a", TP.FLOAT)])
    two = branch("two", [const("a", x), const("b", x)], [vi("a", TP.FLOAT), vi("b", TP.FLOAT)])
    k = If(KernelContext(device))
    with pytest.raises(KernelInputError, match="If.*then_branch has 1 outputs, else_branch 2"):
        k(np.array(True), then_branch=one, else_branch=two)
    with pytest.raises(KernelInputError, match="If.*exactly one element"):
        k(np.array([True, False]), then_branch=one, else_branch=one)
    with pytest.raises(KernelInputError, match="If.*exactly one element"):
        k(np.zeros(0, bool), then_branch=one, else_branch=one)
    with pytest.raises(KernelTypeError, match="If.*bool"):
        k(np.array(1, np.int64), then_branch=one, else_branch=one)
    lying = branch("lying", [const("a", x)], [vi("a", TP.INT64)])
    with pytest.raises(KernelTypeError, match="If.*element type float32"):
        k(np.array(True), then_branch=lying, else_branch=lying)
    with pytest.raises(KernelInputError, match="If.*else_branch"):
        k(np.array(True), then_branch=one)
    with pytest.raises(KernelTypeError, match="If"):
        k(np.array(True), then_branch="graph", else_branch=one)


# ========================================================================== Loop


def counting_body(limit, scan_et=TP.FLOAT, scan_shape=(2,)):
    """state x (float[2]) += 1; cond_out = iteration < limit - 1 ... body reads iteration.
    Scan output: x_out, and the iteration number."""
    nodes = [
        const("one", np.ones(2, np.float32)),
        oh.make_node("Add", ["x_in", "one"], ["x_out"]),
        const("lim", np.int64(limit - 1)),
        oh.make_node("Less", ["i", "lim"], ["c_out"]),
        oh.make_node("Identity", ["x_out"], ["scan_x"]),
        oh.make_node("Identity", ["i"], ["scan_i"]),
    ]
    return oh.make_graph(nodes, "body",
                         [vi("i", TP.INT64, []), vi("c_in", TP.BOOL, []), vi("x_in", TP.FLOAT, [2])],
                         [vi("c_out", TP.BOOL, []), vi("x_out", TP.FLOAT, [2]), vi("scan_x", scan_et, list(scan_shape)),
                          vi("scan_i", TP.INT64, [])])


def loop_reference(M, cond, limit):
    """Number of iterations under the Loop rules with the body's cond honoured."""
    i = 0
    c = True if cond is None else cond
    while c and (M is None or i < M):
        c = i < limit - 1
        i += 1
    return i


CASES = [(None, None), (5, None), (None, True), (5, True), (5, False), (2 ** 62, False), (0, True),
         (-3, True), (None, False), (3, None), (1, True)]


@pytest.mark.parametrize("M,cond", CASES)
@pytest.mark.parametrize("limit", [1, 4, 9])
def test_loop_termination_rules(device, rng, M, cond, limit):
    x0 = rng.random(2).astype(np.float32)
    k = Loop(KernelContext(device))
    args = (None if M is None else np.array(M, np.int64), None if cond is None else np.array(cond))
    x, sx, si = k(*args, x0, body=counting_body(limit))
    n = loop_reference(M, cond, limit)
    np.testing.assert_allclose(x.numpy(), x0.astype(np.float64) + n, rtol=1e-6)
    assert sx.shape == (n, 2) and sx.data_type == DataType.FLOAT
    assert si.shape == (n,) and si.data_type == DataType.INT64
    np.testing.assert_array_equal(si.numpy(), np.arange(n))
    for t in range(n):
        np.testing.assert_allclose(sx.numpy()[t], x0.astype(np.float64) + t + 1, rtol=1e-6)
    assert is_on(device, x) and is_on(device, sx)


def test_loop_zero_iterations_scan_types(device, rng):
    body = counting_body(3, scan_et=TP.FLOAT, scan_shape=(2, "N"))
    x0 = rng.random(2).astype(np.float32)
    x, sx, si = Loop(KernelContext(device))(np.array(0, np.int64), None, x0, body=body)
    np.testing.assert_array_equal(x.numpy(), x0)
    assert sx.shape == (0, 2, 0) and sx.data_type == DataType.FLOAT
    assert si.shape == (0,) and si.data_type == DataType.INT64
    # a scan output with no declared shape: rank unknown -> (0,)
    body.output[3].type.tensor_type.ClearField("shape")
    _, _, si = Loop(KernelContext(device))(None, np.array(False), x0, body=body)
    assert si.shape == (0,) and si.data_type == DataType.INT64


def test_loop_carried_sequences_int64_bool(device, rng):
    """seq <- SequenceInsert(seq, i) and a bool sequence alongside."""
    seq_i = oh.make_sequence_type_proto(oh.make_tensor_type_proto(TP.INT64, None))
    seq_b = oh.make_sequence_type_proto(oh.make_tensor_type_proto(TP.BOOL, None))
    nodes = [
        oh.make_node("Identity", ["c_in"], ["c_out"]),
        oh.make_node("SequenceInsert", ["s_in", "i"], ["s_out"]),
        const("two", np.int64(2)),
        oh.make_node("Mod", ["i", "two"], ["r"]),
        const("zero", np.int64(0)),
        oh.make_node("Equal", ["r", "zero"], ["even"]),
        oh.make_node("SequenceInsert", ["b_in", "even", "zero"], ["b_out"]),
    ]
    body = oh.make_graph(nodes, "body",
                         [vi("i", TP.INT64, []), vi("c_in", TP.BOOL, []), oh.make_value_info("s_in", seq_i),
                          oh.make_value_info("b_in", seq_b)],
                         [vi("c_out", TP.BOOL, []), oh.make_value_info("s_out", seq_i), oh.make_value_info("b_out", seq_b)])
    k = Loop(KernelContext(device, opset=13))
    try:
        s, b = k(np.array(5, np.int64), None, Sequence([], DataType.INT64), Sequence([], DataType.BOOL), body=body)
    except GpuKernelsError as exc:  # Mod/Equal may be another helper's kernels
        if "no kernel" in str(exc):
            pytest.skip(str(exc))
        raise
    assert s.elem_type == DataType.INT64 and [int(v) for v in host(s)] == [0, 1, 2, 3, 4]
    assert b.elem_type == DataType.BOOL and [bool(v) for v in host(b)] == [True, False, True, False, True]
    # sequences are not loop-carried values before opset 13
    with pytest.raises(KernelTypeError, match="Loop"):
        Loop(KernelContext(device, opset=11))(np.array(5, np.int64), None, Sequence([], DataType.INT64),
                                               Sequence([], DataType.BOOL), body=body)


def test_loop_carried_optional(device, rng):
    """The body's state input is declared optional; a tensor carried back is wrapped."""
    opt_t = oh.make_optional_type_proto(oh.make_tensor_type_proto(TP.FLOAT, None))
    then_g = branch("then", [oh.make_node("OptionalGetElement", ["o_in"], ["v"])], [vi("v", TP.FLOAT)])
    else_g = branch("else", [const("z", np.zeros(2, np.float32))], [vi("z", TP.FLOAT)])
    nodes = [
        oh.make_node("Identity", ["c_in"], ["c_out"]),
        oh.make_node("OptionalHasElement", ["o_in"], ["has"]),
        oh.make_node("If", ["has"], ["prev"], then_branch=then_g, else_branch=else_g),
        const("one", np.ones(2, np.float32)),
        oh.make_node("Add", ["prev", "one"], ["nxt"]),
        oh.make_node("Optional", ["nxt"], ["o_out"]),
        oh.make_node("Identity", ["has"], ["scan_has"]),
    ]
    body = oh.make_graph(nodes, "body", [vi("i", TP.INT64, []), vi("c_in", TP.BOOL, []), oh.make_value_info("o_in", opt_t)],
                         [vi("c_out", TP.BOOL, []), oh.make_value_info("o_out", opt_t), vi("scan_has", TP.BOOL, [])])
    k = Loop(KernelContext(device, opset=16))
    empty = Optional(None, opt_t)
    o, has = k(np.array(3, np.int64), None, empty, body=body)
    np.testing.assert_array_equal(host(o), np.full(2, 3, np.float32))
    np.testing.assert_array_equal(has.numpy(), [False, True, True])
    # a plain tensor carried into the optional input is wrapped as a present optional
    o, has = k(np.array(2, np.int64), None, np.full(2, 5, np.float32), body=body)
    np.testing.assert_array_equal(host(o), np.full(2, 7, np.float32))
    np.testing.assert_array_equal(has.numpy(), [True, True])
    # zero iterations give back the initial value untouched
    o, has = k(np.array(0, np.int64), None, empty, body=body)
    assert isinstance(o, Optional) and o.value is None and has.shape == (0,)
    with pytest.raises(KernelTypeError, match="Loop"):
        Loop(KernelContext(device, opset=16), version=13)(np.array(1, np.int64), None, empty, body=body)


def test_loop_errors(device, rng):
    x0 = rng.random(2).astype(np.float32)
    k = Loop(KernelContext(device))
    body = counting_body(3)
    with pytest.raises(KernelInputError, match="Loop.*declares 3 inputs"):
        k(np.array(2, np.int64), None, x0, x0, body=body)
    with pytest.raises(KernelInputError, match="Loop.*declares 3 inputs"):
        k(np.array(2, np.int64), None, body=body)
    with pytest.raises(KernelInputError, match="Loop.*'cond'.*exactly one element"):
        k(np.array(2, np.int64), np.array([True, True]), x0, body=body)
    with pytest.raises(KernelTypeError, match="Loop.*'cond'.*bool"):
        k(np.array(2, np.int64), np.array(1, np.int64), x0, body=body)
    with pytest.raises(KernelInputError, match="Loop.*'M'.*exactly one element"):
        k(np.array([2, 3], np.int64), None, x0, body=body)
    with pytest.raises(KernelTypeError, match="Loop.*'M'"):
        k(np.array(2.0, np.float32), None, x0, body=body)
    with pytest.raises(KernelInputError, match="Loop.*'body' is missing"):
        k(np.array(2, np.int64), None, x0)
    # body state output of the wrong type
    lying = counting_body(3)
    lying.output[1].type.tensor_type.elem_type = TP.INT64
    with pytest.raises(KernelTypeError, match="Loop.*element type float32"):
        k(np.array(2, np.int64), None, x0, body=lying)
    # body cond output that is not a scalar
    nodes = [oh.make_node("Identity", ["x_in"], ["x_out"]), const("cc", np.array([True, True]))]
    bad_cond = oh.make_graph(nodes, "b", [vi("i", TP.INT64, []), vi("c", TP.BOOL, []), vi("x_in", TP.FLOAT)],
                             [vi("cc", TP.BOOL), vi("x_out", TP.FLOAT)])
    with pytest.raises(KernelInputError, match="Loop.*body output cond.*exactly one element"):
        k(np.array(2, np.int64), None, x0, body=bad_cond)
    # a scan output whose shape changes across iterations
    nodes = [oh.make_node("Identity", ["c"], ["co"]), const("one", np.int64(1)),
             oh.make_node("Add", ["i", "one"], ["n"]), oh.make_node("Unsqueeze", ["n", "zero"], ["n1"]),
             const("zero", np.array([0], np.int64)), oh.make_node("ConstantOfShape", ["n1"], ["ragged"])]
    nodes = [nodes[0], nodes[1], nodes[2], nodes[4], nodes[3], nodes[5]]
    ragged = oh.make_graph(nodes, "b", [vi("i", TP.INT64, []), vi("c", TP.BOOL, [])],
                           [vi("co", TP.BOOL), vi("ragged", TP.FLOAT)])
    try:
        with pytest.raises(KernelInputError, match="Loop.*scan output 0.*agree"):
            k(np.array(3, np.int64), None, body=ragged)
    except GpuKernelsError as exc:
        if "no kernel" in str(exc):
            pytest.skip(str(exc))
        raise


def test_loop_callback_form(device, rng):
    k = Loop(KernelContext(device))
    x0 = rng.random(3).astype(np.float32) + 0.5
    ctx = KernelContext(device)
    from gpukernels.kernels.math.arith import Add, Mul

    add, mul = Add(ctx), Mul(ctx)
    seen = []

    def body(i, c, state):
        (x,) = state
        seen.append(int(i.numpy()))
        nxt = mul(x, np.float32(2))
        return [Tensor(np.array(int(i.numpy()) < 3)), nxt, add(nxt, np.float32(1))]

    x, ys = k.run_callback(np.array(10, np.int64), np.array(True), [x0], body=body)
    assert seen == [0, 1, 2, 3]
    np.testing.assert_allclose(x.numpy(), x0.astype(np.float64) * 16, rtol=1e-6)
    ref = np.stack([x0.astype(np.float64) * 2 ** (t + 1) + 1 for t in range(4)])
    np.testing.assert_allclose(ys.numpy(), ref, rtol=1e-6)
    # zero iterations: typed scan outputs when given, only the states otherwise
    x, ys = k.run_callback(None, np.array(False), [x0], body=body, scan_output_types=[(TP.DOUBLE, [3])])
    np.testing.assert_array_equal(x.numpy(), x0)
    assert ys.shape == (0, 3) and ys.data_type == DataType.DOUBLE
    x = k.run_callback(np.array(0, np.int64), None, [x0], body=body)
    np.testing.assert_array_equal(x.numpy(), x0)
    # callback errors
    with pytest.raises(KernelInputError, match="Loop.*at least 2"):
        k.run_callback(np.array(1, np.int64), None, [x0], body=lambda i, c, s: [c])
    with pytest.raises(KernelTypeError, match="Loop"):
        k.run_callback(np.array(1, np.int64), None, [x0], body=lambda i, c, s: c)
    with pytest.raises(KernelInputError, match="Loop.*exactly one element"):
        k.run_callback(np.array(1, np.int64), None, [x0],
                       body=lambda i, c, s: [np.array([True, False]), s[0]])
    with pytest.raises(KernelTypeError, match="Loop"):
        k.run_callback(np.array(1, np.int64), None, [x0], body="not callable")


def test_loop_assemble(device, rng):
    k = Loop(KernelContext(device))
    x0 = rng.random(2).astype(np.float32)
    xf = rng.random(2).astype(np.float32)
    rows = [[rng.random(3).astype(np.float32), np.array([i], np.int64)] for i in range(4)]
    x, a, b = k.assemble(np.array(4, np.int64), np.array(True), [x0], [xf], rows)
    np.testing.assert_array_equal(x.numpy(), xf)
    np.testing.assert_array_equal(a.numpy(), np.stack([r[0] for r in rows]))
    np.testing.assert_array_equal(b.numpy(), np.arange(4).reshape(4, 1))
    x, a = k.assemble(None, np.array(False), [x0], None, [], scan_output_types=[(TP.INT64, [5])])
    np.testing.assert_array_equal(x.numpy(), x0)
    assert a.shape == (0, 5) and a.data_type == DataType.INT64
    with pytest.raises(KernelInputError, match="Loop.*trip count"):
        k.assemble(np.array(2, np.int64), None, [x0], [xf], rows)
    with pytest.raises(KernelInputError, match="Loop.*cond is false"):
        k.assemble(None, np.array(False), [x0], [xf], rows)
    with pytest.raises(KernelInputError, match="Loop.*agree"):
        k.assemble(None, None, [x0], [xf], [[np.zeros(2, np.float32)], [np.zeros(3, np.float32)]])


@pytest.mark.parametrize("opset", schema_versions("Loop"))
def test_loop_every_version(device, rng, opset):
    nodes = [oh.make_node("Identity", ["c"], ["co"]), oh.make_node("Identity", ["x"], ["xo"]),
             oh.make_node("Identity", ["i"], ["so"])]
    body = oh.make_graph(nodes, "b", [vi("i", TP.INT64, []), vi("c", TP.BOOL, []), vi("x", TP.FLOAT, [2])],
                         [vi("co", TP.BOOL, []), vi("xo", TP.FLOAT, [2]), vi("so", TP.INT64, [])])
    x0 = rng.random(2).astype(np.float32)
    x, s = Loop(KernelContext(device, opset=opset))(np.array(3, np.int64), np.array(True), x0, body=body)
    np.testing.assert_array_equal(x.numpy(), x0)
    np.testing.assert_array_equal(s.numpy(), [0, 1, 2])


# ========================================================================== Scan


def scan_body_graph():
    """state s[2]; scan elements a[2], b[2]: s' = s + a*b; outputs s', a - b."""
    nodes = [oh.make_node("Mul", ["a", "b"], ["ab"]), oh.make_node("Add", ["s", "ab"], ["s_out"]),
             oh.make_node("Identity", ["s_out"], ["o1"]), oh.make_node("Sub", ["a", "b"], ["o2"])]
    return oh.make_graph(nodes, "body", [vi("s", TP.FLOAT, [2]), vi("a", TP.FLOAT, [2]), vi("b", TP.FLOAT, [2])],
                         [vi("s_out", TP.FLOAT, [2]), vi("o1", TP.FLOAT, [2]), vi("o2", TP.FLOAT, [2])])


def scan_reference(s0, xs, in_axes, in_dirs, out_axes, out_dirs):
    seqs = []
    for x, ax, d in zip(xs, in_axes, in_dirs):
        m = np.moveaxis(x.astype(np.float64), ax, 0)
        seqs.append(m[::-1] if d else m)
    s = s0.astype(np.float64)
    o1, o2 = [], []
    for t in range(len(seqs[0])):
        a, b = seqs[0][t], seqs[1][t]
        s = s + a * b
        o1.append(s.copy())
        o2.append(a - b)
    outs = []
    for col, ax, d in zip((o1, o2), out_axes, out_dirs):
        if d:
            col = col[::-1]
        outs.append(np.stack(col, axis=ax))
    return s, outs


@pytest.mark.parametrize("in_axes,in_dirs,out_axes,out_dirs", [
    (None, None, None, None),
    ([1, 0], [1, 0], [1, -1], [0, 1]),
    ([-1, 1], [1, 1], [-2, 0], [1, 1]),
    ([0, 1], [0, 1], [1, 1], [1, 0]),
])
@pytest.mark.parametrize("opset", [9, 11, 25])
def test_scan_axes_and_directions(device, rng, in_axes, in_dirs, out_axes, out_dirs, opset):
    T = 5
    a_axis = (in_axes or [0, 0])[0] % 2
    b_axis = (in_axes or [0, 0])[1] % 2
    a = rng.random((T, 2) if a_axis == 0 else (2, T)).astype(np.float32) + 0.5
    b = rng.random((T, 2) if b_axis == 0 else (2, T)).astype(np.float32) + 0.5
    s0 = rng.random(2).astype(np.float32)
    attrs = {}
    if in_axes is not None:
        if opset == 9 and any(v < 0 for v in in_axes + out_axes):
            in_axes = [v % 2 for v in in_axes]
            out_axes = [v % 2 for v in out_axes]
        attrs = dict(scan_input_axes=in_axes, scan_input_directions=in_dirs,
                     scan_output_axes=out_axes, scan_output_directions=out_dirs)
    s, o1, o2 = Scan(KernelContext(device, opset=opset))(s0, a, b, body=scan_body_graph(), num_scan_inputs=2, **attrs)
    rs, (r1, r2) = scan_reference(s0, [a, b], in_axes or [0, 0], in_dirs or [0, 0], out_axes or [0, 0],
                                  out_dirs or [0, 0])
    np.testing.assert_allclose(s.numpy(), rs, rtol=1e-5)
    np.testing.assert_allclose(o1.numpy(), r1, rtol=1e-5)
    np.testing.assert_allclose(o2.numpy(), r2, rtol=1e-5, atol=1e-6)
    assert is_on(device, o1)


def test_scan_zero_length_and_errors(device, rng):
    k = Scan(KernelContext(device))
    s0 = rng.random(2).astype(np.float32)
    e = np.zeros((0, 2), np.float32)
    s, o1, o2 = k(s0, e, e, body=scan_body_graph(), num_scan_inputs=2, scan_output_axes=[1, 0])
    np.testing.assert_array_equal(s.numpy(), s0)
    assert o1.shape == (2, 0) and o2.shape == (0, 2) and o1.data_type == DataType.FLOAT
    a = rng.random((3, 2)).astype(np.float32)
    b = rng.random((4, 2)).astype(np.float32)
    with pytest.raises(KernelInputError, match="Scan.*scan input 1 has length 4.*3"):
        k(s0, a, b, body=scan_body_graph(), num_scan_inputs=2)
    with pytest.raises(KernelInputError, match="Scan.*declares 3 inputs"):
        k(s0, a, body=scan_body_graph(), num_scan_inputs=1)
    with pytest.raises(KernelInputError, match="Scan.*num_scan_inputs"):
        k(s0, a, a, body=scan_body_graph())
    with pytest.raises(KernelInputError, match="Scan.*num_scan_inputs"):
        k(s0, a, a, body=scan_body_graph(), num_scan_inputs=4)
    with pytest.raises(KernelInputError, match="Scan.*scan_input_axes.*out of range"):
        k(s0, a, a, body=scan_body_graph(), num_scan_inputs=2, scan_input_axes=[0, 2])
    with pytest.raises(KernelInputError, match="Scan.*scan_input_directions"):
        k(s0, a, a, body=scan_body_graph(), num_scan_inputs=2, scan_input_directions=[0, 2])
    with pytest.raises(KernelInputError, match="Scan.*scan_output_axes has 1 entries"):
        k(s0, a, a, body=scan_body_graph(), num_scan_inputs=2, scan_output_axes=[0])
    with pytest.raises(KernelInputError, match="Scan.*axis 3 is out of range"):
        k(s0, a, a, body=scan_body_graph(), num_scan_inputs=2, scan_output_axes=[3, 0])
    with pytest.raises(KernelInputError, match="Scan.*scalar"):
        k(s0, np.float32(1), np.float32(1), body=scan_body_graph(), num_scan_inputs=2)
    lying = scan_body_graph()
    lying.output[2].type.tensor_type.elem_type = TP.INT32
    with pytest.raises(KernelTypeError, match="Scan.*element type float32"):
        k(s0, a, a, body=lying, num_scan_inputs=2)
    with pytest.raises(KernelTypeError, match="Scan"):
        k(Sequence([Tensor(s0)]), a, a, body=scan_body_graph(), num_scan_inputs=2)


def test_scan8_batches_sequence_lens_directions(device, rng):
    B, T = 3, 4
    s0 = rng.random((B, 2)).astype(np.float32)
    a = rng.random((B, T, 2)).astype(np.float32) + 0.5
    b = rng.random((B, T, 2)).astype(np.float32) + 0.5
    lens = np.array([4, 0, 2], np.int64)
    k = Scan(KernelContext(device, opset=8))
    s, o1, o2 = k(lens, s0, a, b, body=scan_body_graph(), num_scan_inputs=2, directions=[0, 1])
    for bi in range(B):
        n = int(lens[bi])
        rs, (r1, r2) = scan_reference(s0[bi], [a[bi, :n], b[bi, :n]], [0, 0], [0, 1], [0, 0], [0, 0]) if n else \
            (s0[bi].astype(np.float64), (np.zeros((0, 2)), np.zeros((0, 2))))
        np.testing.assert_allclose(s.numpy()[bi], rs, rtol=1e-5)
        np.testing.assert_allclose(o1.numpy()[bi, :n], r1, rtol=1e-5)
        np.testing.assert_allclose(o2.numpy()[bi, :n], r2, rtol=1e-5, atol=1e-6)
        assert not o1.numpy()[bi, n:].any()
    assert o1.shape == (B, T, 2)
    s, o1, o2 = k(None, s0, a, b, body=scan_body_graph(), num_scan_inputs=2)
    rs, (r1, r2) = scan_reference(s0[1], [a[1], b[1]], [0, 0], [0, 0], [0, 0], [0, 0])
    np.testing.assert_allclose(o1.numpy()[1], r1, rtol=1e-5)
    with pytest.raises(KernelInputError, match="Scan.*sequence_lens"):
        k(np.array([5, 0, 1], np.int64), s0, a, b, body=scan_body_graph(), num_scan_inputs=2)
    with pytest.raises(KernelInputError, match="Scan.*sequence_lens"):
        k(np.array([1, 1], np.int64), s0, a, b, body=scan_body_graph(), num_scan_inputs=2)
    with pytest.raises(KernelInputError, match="Scan.*batch"):
        k(None, s0[:2], a, b, body=scan_body_graph(), num_scan_inputs=2)
    with pytest.raises(KernelInputError, match="Scan.*must agree"):
        k(None, s0, a, b[:, :3], body=scan_body_graph(), num_scan_inputs=2)
    with pytest.raises(KernelInputError, match="Scan.*opset-8"):
        k(None, s0, a, b, body=scan_body_graph(), num_scan_inputs=2, scan_input_axes=[0, 0])


def test_scan_assemble(device, rng):
    k = Scan(KernelContext(device))
    rows = [[rng.random(3).astype(np.float32)] for _ in range(4)]
    s0 = rng.random(2).astype(np.float32)
    s, y = k.assemble([s0], rows, scan_output_axes=[1], scan_output_directions=[1])
    np.testing.assert_array_equal(s.numpy(), s0)
    np.testing.assert_array_equal(y.numpy(), np.stack([r[0] for r in rows[::-1]], axis=1))
    s, y = k.assemble([s0], [], scan_output_types=[(TP.INT64, [3])], scan_output_axes=[-1])
    assert y.shape == (3, 0) and y.data_type == DataType.INT64


# ============================================================ nesting via the runtime


def test_if_in_loop_in_scan_reads_three_levels_up(device, rng):
    """Scan body (level 1) -> Loop body (level 2) -> If branch (level 3) reading `w`
    from the main graph, `u` from the Scan body and `v` from the Loop body."""
    from gpukernels.runtime import Session

    then_g = branch("then", [oh.make_node("Add", ["w", "u"], ["t1"]), oh.make_node("Add", ["t1", "v"], ["r"])],
                    [vi("r", TP.FLOAT, [2])])
    else_g = branch("else", [oh.make_node("Sub", ["v", "w"], ["r2"])], [vi("r2", TP.FLOAT, [2])])
    loop_body = oh.make_graph(
        [oh.make_node("Identity", ["lc"], ["lco"]),
         oh.make_node("Cast", ["li"], ["lf"], to=TP.FLOAT),
         oh.make_node("Add", ["acc", "lf"], ["v"]),
         const("two", np.int64(2)),
         oh.make_node("Less", ["li", "two"], ["small"]),
         oh.make_node("If", ["small"], ["acc_out"], then_branch=then_g, else_branch=else_g)],
        "loop_body", [vi("li", TP.INT64, []), vi("lc", TP.BOOL, []), vi("acc", TP.FLOAT, [2])],
        [vi("lco", TP.BOOL, []), vi("acc_out", TP.FLOAT, [2])])
    scan_body = oh.make_graph(
        [oh.make_node("Mul", ["x_t", "w"], ["u"]),
         oh.make_node("Loop", ["trips", "", "h"], ["h2"], body=loop_body),
         oh.make_node("Identity", ["h2"], ["y_t"])],
        "scan_body", [vi("h", TP.FLOAT, [2]), vi("x_t", TP.FLOAT, [2])],
        [vi("h2", TP.FLOAT, [2]), vi("y_t", TP.FLOAT, [2])])
    main = oh.make_graph(
        [oh.make_node("Scan", ["h0", "x"], ["h_final", "ys"], body=scan_body, num_scan_inputs=1)],
        "main", [vi("h0", TP.FLOAT, [2]), vi("x", TP.FLOAT, [3, 2]), vi("w", TP.FLOAT, [2]),
                 vi("trips", TP.INT64, [])],
        [vi("h_final", TP.FLOAT, [2]), vi("ys", TP.FLOAT, [3, 2])])
    model = oh.make_model(main, opset_imports=[oh.make_opsetid("", 17)])
    h0 = rng.random(2).astype(np.float32)
    x = rng.random((3, 2)).astype(np.float32) + 0.5
    w = rng.random(2).astype(np.float32) + 0.5
    trips = np.array(4, np.int64)

    h = h0.astype(np.float64)
    ys = []
    for t in range(3):
        u = x[t].astype(np.float64) * w
        acc = h
        for i in range(int(trips)):
            v = acc + i
            acc = (w + u + v) if i < 2 else (v - w)
        h = acc
        ys.append(h)
    hf, ysg = Session(model, device=device).run(None, {"h0": h0, "x": x, "w": w, "trips": trips})
    np.testing.assert_allclose(hf, h, rtol=1e-5)
    np.testing.assert_allclose(ysg, np.stack(ys), rtol=1e-5)


def test_loop_errors_through_runtime_name_the_operator(device, rng):
    from gpukernels.runtime import Session

    body = counting_body(3)
    g = oh.make_graph([oh.make_node("Loop", ["M", "", "x"], ["xf", "sx", "si"], body=body)], "g",
                      [vi("M", TP.INT64), vi("x", TP.FLOAT, [2])],
                      [vi("xf", TP.FLOAT, [2]), vi("sx", TP.FLOAT), vi("si", TP.INT64)])
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
    sess = Session(m, device=device)
    xf, sx, si = sess.run(None, {"M": np.array(2, np.int64), "x": np.zeros(2, np.float32)})
    np.testing.assert_array_equal(si, [0, 1])
    with pytest.raises(GpuKernelsError, match="Loop"):
        sess.run(None, {"M": np.array([2, 2], np.int64), "x": np.zeros(2, np.float32)})


def test_loop_iteration_read_only_by_nested_branch(device, rng):
    """The iteration number is read only inside an If branch: it must still be fresh
    every iteration (a body that never reads it gets a shared dummy)."""
    then_g = branch("then", [oh.make_node("Identity", ["i"], ["r"])], [vi("r", TP.INT64, [])])
    else_g = branch("else", [oh.make_node("Neg", ["i"], ["r2"])], [vi("r2", TP.INT64, [])])
    body = oh.make_graph([oh.make_node("Identity", ["c"], ["co"]),
                          oh.make_node("If", ["c"], ["s"], then_branch=then_g, else_branch=else_g)],
                         "b", [vi("i", TP.INT64, []), vi("c", TP.BOOL, [])],
                         [vi("co", TP.BOOL, []), vi("s", TP.INT64, [])])
    s = Loop(KernelContext(device))(np.array(4, np.int64), None, body=body)
    np.testing.assert_array_equal(s.numpy(), [0, 1, 2, 3])
    body2 = oh.make_graph([oh.make_node("Identity", ["c"], ["co"]), const("k", np.int64(7))], "b2",
                          [vi("i", TP.INT64, []), vi("c", TP.BOOL, [])],
                          [vi("co", TP.BOOL, []), vi("k", TP.INT64, [])])
    s = Loop(KernelContext(device))(np.array(3, np.int64), None, body=body2)
    np.testing.assert_array_equal(s.numpy(), [7, 7, 7])


def test_scan_with_outer_scope_and_no_state(device, rng):
    """Scan with no state (a pure map) reading an outer value through the runtime."""
    from gpukernels.runtime import Session

    body = oh.make_graph([oh.make_node("Mul", ["x_t", "w"], ["y_t"])], "b", [vi("x_t", TP.FLOAT, [3])],
                         [vi("y_t", TP.FLOAT, [3])])
    g = oh.make_graph([oh.make_node("Scan", ["x"], ["y"], body=body, num_scan_inputs=1,
                                    scan_input_axes=[1], scan_output_axes=[1], scan_input_directions=[1])],
                      "g", [vi("x", TP.FLOAT, [3, 5]), vi("w", TP.FLOAT, [3])], [vi("y", TP.FLOAT, [3, 5])])
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
    x = rng.random((3, 5)).astype(np.float32)
    w = rng.random(3).astype(np.float32)
    (y,) = Session(m, device=device).run(None, {"x": x, "w": w})
    np.testing.assert_allclose(y, (x.astype(np.float64) * w[:, None])[:, ::-1], rtol=1e-6)


def _endless_loop_model():
    """A Loop whose body passes its condition through: with cond true and no trip count
    it never ends by itself."""
    body = oh.make_graph([oh.make_node("Identity", ["c_in"], ["c_out"]),
                          oh.make_node("Add", ["v_in", "one"], ["v_out"])], "body",
                         [vi("i", TP.INT64, []), vi("c_in", TP.BOOL, []), vi("v_in", TP.INT64, [])],
                         [vi("c_out", TP.BOOL, []), vi("v_out", TP.INT64, [])],
                         [numpy_helper.from_array(np.array(1, np.int64), "one")])
    graph = oh.make_graph([oh.make_node("Loop", ["M", "c", "v0"], ["v"], body=body)], "g",
                          [vi("M", TP.INT64, []), vi("c", TP.BOOL, []), vi("v0", TP.INT64, [])],
                          [vi("v", TP.INT64, [])])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


@pytest.mark.parametrize("compile_bodies", [True, False])
def test_loop_iteration_limit(device, compile_bodies):
    """max_loop_iterations caps every Loop (default 1,000,000), on the compiled body and the
    general path; a trip count at the cap still runs; the error names the option."""
    from gpukernels.errors import NodeError, ResourceLimitError
    from gpukernels.kernels.controlflow import DEFAULT_MAX_LOOP_ITERATIONS
    from gpukernels.runtime import Session

    model = _endless_loop_model()
    feeds = {"c": np.array(True), "v0": np.array(5, np.int64)}
    options = {"max_loop_iterations": 40, "compile_bodies": compile_bodies}
    (v,) = Session(model, device=device, options=options).run(None, dict(feeds, M=np.array(40, np.int64)))
    assert int(v) == 45
    for m in (41, 2 ** 62):
        with pytest.raises(NodeError, match=r"Loop: stopped after 40 iterations.*max_loop_iterations") as info:
            Session(model, device=device, options=options).run(None, dict(feeds, M=np.array(m, np.int64)))
        assert isinstance(info.value.__cause__, ResourceLimitError)
    # no trip count at all: the same
    k = Loop(KernelContext(device, options={"max_loop_iterations": 7}))
    with pytest.raises(ResourceLimitError, match="no trip count M"):
        k.run_callback(None, np.array(True), [np.float32(0)], body=lambda i, c, s: [c, s[0]])
    # 0: no limit
    (v,) = Session(model, device=device, options={"max_loop_iterations": 0}).run(
        None, dict(feeds, M=np.array(50, np.int64)))
    assert int(v) == 55
    assert DEFAULT_MAX_LOOP_ITERATIONS == 1_000_000
