"""Sequence kernels called directly (and SequenceMap through its body graph), checked
against plain Python list operations on random data."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as oh

from gpukernels.dtypes import DataType
from gpukernels.errors import GpuKernelsError, KernelInputError, KernelTypeError
from gpukernels.kernels import KernelContext, load_all
from gpukernels.tensor import Sequence, Tensor

load_all()
from gpukernels.kernels.sequence import (ConcatFromSequence, SequenceAt, SequenceConstruct,  # noqa: E402
                                         SequenceEmpty, SequenceErase, SequenceInsert, SequenceLength,
                                         SequenceMap, SplitToSequence)


def host(v):
    if isinstance(v, Sequence):
        return [t.numpy() for t in v]
    return v.numpy()


def rand(rng, shape, dtype=np.float32):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) > 0.5
    if dtype.kind in "iu":
        return rng.integers(1, 100, size=shape).astype(dtype)
    return (rng.random(shape) + 0.5).astype(dtype)


def make_seq(rng, dtype=np.float32, shapes=((2, 3), (4,), (1, 1, 2))):
    return [rand(rng, s, dtype) for s in shapes]


def same_list(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        assert g.shape == w.shape
        np.testing.assert_array_equal(g, w)


# ---------------------------------------------------------------- construct/empty


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_, np.float16, np.int32, np.uint8])
def test_construct_heterogeneous_shapes(device, rng, dtype):
    items = make_seq(rng, dtype)
    seq = SequenceConstruct(KernelContext(device))(*items)
    assert isinstance(seq, Sequence)
    assert seq.elem_type == Tensor(items[0]).data_type
    same_list(host(seq), items)


def test_construct_as_sequence_and_stacked(device, rng):
    k = SequenceConstruct(KernelContext(device))
    items = make_seq(rng)
    same_list(host(k.as_sequence(items)), items)
    same = [rand(rng, (2, 3)) for _ in range(4)]
    st = k.stacked(same)
    np.testing.assert_array_equal(st.numpy(), np.stack(same))
    with pytest.raises(KernelInputError, match="SequenceConstruct"):
        k.stacked(items)
    with pytest.raises(KernelInputError, match="SequenceConstruct"):
        k.stacked([])


def test_construct_strings(device):
    seq = SequenceConstruct(KernelContext(device))(np.array(["a", "bc"], dtype=object), np.array("z", dtype=object))
    assert seq.elem_type == DataType.STRING
    assert host(seq)[0].tolist() == ["a", "bc"]


def test_construct_errors(device, rng):
    k = SequenceConstruct(KernelContext(device))
    with pytest.raises(KernelTypeError, match="SequenceConstruct.*mixed element types"):
        k(rand(rng, (2,)), rand(rng, (2,), np.int64))
    with pytest.raises(KernelInputError, match="SequenceConstruct"):
        k()
    import ml_dtypes

    with pytest.raises(KernelTypeError, match="SequenceConstruct"):  # not an opset-11 type
        k(np.ones(2, dtype=ml_dtypes.bfloat16))


def test_empty(device):
    k = SequenceEmpty(KernelContext(device))
    s = k()
    assert isinstance(s, Sequence) and len(s) == 0 and s.elem_type == DataType.FLOAT
    assert k(dtype=0).elem_type == DataType.FLOAT
    assert k(dtype=TP.INT64).elem_type == DataType.INT64
    assert k(dtype=TP.BOOL).elem_type == DataType.BOOL
    with pytest.raises(KernelTypeError, match="SequenceEmpty"):
        k(dtype=TP.BFLOAT16)  # not in the opset-11 type list
    with pytest.raises(KernelInputError, match="SequenceEmpty"):
        k(dtype=999)


# ---------------------------------------------------------------- at/insert/erase


@pytest.mark.parametrize("pos_dtype", [np.int32, np.int64])
def test_at_every_position(device, rng, pos_dtype):
    items = make_seq(rng, np.int64, shapes=((2,), (3, 1), (), (5,)))
    k = SequenceAt(KernelContext(device))
    n = len(items)
    for p in range(-n, n):
        got = k(items, np.array(p, dtype=pos_dtype))
        np.testing.assert_array_equal(got.numpy(), items[p])
        assert got.shape == items[p].shape
    # shape-[1] position is accepted too
    np.testing.assert_array_equal(k(items, np.array([-1], pos_dtype)).numpy(), items[-1])
    for bad in (-n - 1, n, 1000, -1000):
        with pytest.raises(KernelInputError, match=r"SequenceAt.*out of range \[-4, 3\]"):
            k(items, np.array(bad, dtype=pos_dtype))


def test_at_errors(device, rng):
    k = SequenceAt(KernelContext(device))
    items = make_seq(rng)
    with pytest.raises(KernelTypeError, match="SequenceAt"):
        k(items, np.array(0.0, np.float32))
    with pytest.raises(KernelInputError, match="SequenceAt"):
        k(items, np.array([0, 1], np.int64))
    with pytest.raises(KernelInputError, match="SequenceAt"):
        k([], np.array(0, np.int64))
    with pytest.raises(KernelTypeError, match="SequenceAt"):
        k(Tensor(np.zeros(3, np.float32)), np.array(0, np.int64))
    with pytest.raises(KernelTypeError, match="SequenceAt.*mixed"):
        k([np.zeros(2, np.float32), np.zeros(2, np.int64)], np.array(0, np.int64))


def test_insert_every_position(device, rng):
    items = make_seq(rng, np.int64)
    new = rand(rng, (7,), np.int64)
    k = SequenceInsert(KernelContext(device))
    seq = SequenceConstruct(KernelContext(device)).as_sequence(items)
    n = len(items)
    for p in range(-n, n + 1):
        want = list(items)
        want.insert(p, new)
        got = k(seq, new, np.array(p, np.int64))
        same_list(host(got), want)
        same_list(host(k(seq, new, np.array([p], np.int32))), want)
    assert len(seq) == n  # the input sequence is unchanged
    same_list(host(k(seq, new)), items + [new])
    for bad in (-n - 1, n + 1):
        with pytest.raises(KernelInputError, match=r"SequenceInsert.*out of range \[-3, 3\]"):
            k(seq, new, np.array(bad, np.int64))


def test_insert_into_empty_and_type_errors(device, rng):
    k = SequenceInsert(KernelContext(device))
    empty = SequenceEmpty(KernelContext(device))(dtype=TP.BOOL)
    b = rand(rng, (3,), np.bool_)
    same_list(host(k(empty, b)), [b])
    same_list(host(k(empty, b, np.array(0, np.int64))), [b])
    with pytest.raises(KernelInputError, match="SequenceInsert"):
        k(empty, b, np.array(1, np.int64))
    with pytest.raises(KernelTypeError, match="SequenceInsert.*int64.*bool"):
        k(empty, rand(rng, (3,), np.int64))


def test_erase_every_position(device, rng):
    items = make_seq(rng, np.bool_, shapes=((1,), (2, 2), (3,), ()))
    k = SequenceErase(KernelContext(device))
    n = len(items)
    for p in range(-n, n):
        want = list(items)
        del want[p]
        same_list(host(k(items, np.array(p, np.int64))), want)
    same_list(host(k(items)), items[:-1])
    for bad in (-n - 1, n):
        with pytest.raises(KernelInputError, match=r"SequenceErase.*out of range \[-4, 3\]"):
            k(items, np.array(bad, np.int32))
    with pytest.raises(KernelInputError, match="SequenceErase.*empty"):
        k(SequenceEmpty(KernelContext(device))())
    with pytest.raises(KernelInputError, match="SequenceErase"):
        k(SequenceEmpty(KernelContext(device))(), np.array(0, np.int64))


def test_length(device, rng):
    k = SequenceLength(KernelContext(device))
    for n in (0, 1, 5):
        out = k([rand(rng, (2,)) for _ in range(n)])
        assert out.data_type == DataType.INT64 and out.shape == ()
        assert int(out.numpy()) == n


# ---------------------------------------------------------------- concat/split


def concat_reference(items, axis, new_axis):
    items = [np.asarray(x, dtype=np.float64) if x.dtype.kind == "f" else x for x in items]
    if new_axis:
        r = items[0].ndim + 1
        axis = axis % r
        expanded = [np.expand_dims(x, axis) for x in items]
        return np.concatenate(expanded, axis=axis)
    return np.concatenate(items, axis=axis % items[0].ndim)


@pytest.mark.parametrize("shape", [(3,), (2, 3), (2, 1, 3, 2, 2)])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_])
def test_concat_from_sequence(device, rng, shape, dtype):
    k = ConcatFromSequence(KernelContext(device))
    r = len(shape)
    for axis in range(-r, r):
        items = []
        for i in range(3):
            s = list(shape)
            s[axis] = i + 1
            items.append(rand(rng, s, dtype))
        got = k(items, axis=axis)
        want = concat_reference(items, axis, 0)
        assert got.numpy().dtype == np.dtype(dtype)
        np.testing.assert_array_equal(got.numpy(), want.astype(dtype))
    same = [rand(rng, shape, dtype) for _ in range(4)]
    for axis in range(-r - 1, r + 1):
        got = k(same, axis=axis, new_axis=1)
        np.testing.assert_array_equal(got.numpy(), concat_reference(same, axis, 1).astype(dtype))


def test_concat_from_sequence_errors(device, rng):
    k = ConcatFromSequence(KernelContext(device))
    a, b = rand(rng, (2, 3)), rand(rng, (2, 4))
    with pytest.raises(KernelInputError, match="ConcatFromSequence"):
        k([a, b], axis=0)
    with pytest.raises(KernelInputError, match="ConcatFromSequence"):
        k([a, b], axis=1, new_axis=1)
    with pytest.raises(KernelInputError, match="ConcatFromSequence.*out of range"):
        k([a, a], axis=2)
    with pytest.raises(KernelInputError, match="ConcatFromSequence.*out of range"):
        k([a, a], axis=-4, new_axis=1)
    with pytest.raises(KernelInputError, match="ConcatFromSequence.*empty"):
        k(SequenceEmpty(KernelContext(device))(), axis=0)
    with pytest.raises(KernelInputError, match="ConcatFromSequence"):
        k([a], axis=None)
    np.testing.assert_array_equal(k([a, a], axis=2, new_axis=1).numpy(), np.stack([a, a], axis=2))
    # empty tensors concatenate fine
    e = np.zeros((0, 3), np.float32)
    assert k([e, e, a], axis=0).shape == (2, 3)


def split_reference(x, sizes, axis):
    out, start = [], 0
    for s in sizes:
        out.append(np.take(x, np.arange(start, start + s), axis=axis))
        start += s
    return out


@pytest.mark.parametrize("axis", [0, 1, -1, -3])
def test_split_to_sequence_default(device, rng, axis):
    x = rand(rng, (3, 4, 5))
    k = SplitToSequence(KernelContext(device))
    dim = x.shape[axis]
    got = host(k(x, axis=axis))
    same_list(got, split_reference(x, [1] * dim, axis))
    got = host(k(x, axis=axis, keepdims=0))
    same_list(got, [np.take(x, i, axis=axis) for i in range(dim)])


@pytest.mark.parametrize("split_dtype", [np.int32, np.int64])
def test_split_to_sequence_sizes(device, rng, split_dtype):
    x = rand(rng, (7, 3), np.int64)
    k = SplitToSequence(KernelContext(device))
    # scalar chunk size with a smaller last chunk; keepdims is ignored with split
    for size in (1, 2, 3, 7, 10):
        sizes = [size] * (7 // size) + ([7 % size] if 7 % size else [])
        same_list(host(k(x, np.array(size, split_dtype), keepdims=0)), split_reference(x, sizes, 0))
    same_list(host(k(x, np.array([2, 0, 5], split_dtype))), split_reference(x, [2, 0, 5], 0))
    same_list(host(k(x, np.array([1, 2], split_dtype), axis=-1)), split_reference(x, [1, 2], 1))


def test_split_to_sequence_edge_cases(device, rng):
    k = SplitToSequence(KernelContext(device))
    e = np.zeros((0, 3), np.float32)
    s = k(e)
    assert len(s) == 0 and s.elem_type == DataType.FLOAT
    assert len(k(e, np.array(2, np.int64))) == 0
    x1 = rand(rng, (4,))
    got = host(k(x1, keepdims=0))
    assert all(g.shape == () for g in got)
    np.testing.assert_array_equal(np.array(got), x1)
    strings = np.array([["a", "b"], ["c", "d"]], dtype=object)
    got = host(k(strings, axis=1, keepdims=0))
    assert [g.tolist() for g in got] == [["a", "c"], ["b", "d"]]
    x = rand(rng, (4, 2))
    with pytest.raises(KernelInputError, match="SplitToSequence.*sum"):
        k(x, np.array([1, 2], np.int64))
    with pytest.raises(KernelInputError, match="SplitToSequence"):
        k(x, np.array([5, -1], np.int64))
    with pytest.raises(KernelInputError, match="SplitToSequence.*positive"):
        k(x, np.array(0, np.int64))
    with pytest.raises(KernelInputError, match="SplitToSequence"):
        k(x, np.array([[1, 3]], np.int64))
    with pytest.raises(KernelTypeError, match="SplitToSequence"):
        k(x, np.array(2.0, np.float32))
    with pytest.raises(KernelInputError, match="SplitToSequence.*axis"):
        k(x, axis=2)
    with pytest.raises(KernelInputError, match="SplitToSequence"):
        k(np.float32(1.0))


def test_split_then_concat_roundtrip(device, rng):
    x = rand(rng, (5, 6, 2))
    ctx = KernelContext(device)
    seq = SplitToSequence(ctx)(x, np.array(4, np.int64), axis=1)
    back = ConcatFromSequence(ctx)(seq, axis=1)
    np.testing.assert_array_equal(back.numpy(), x)
    seq = SplitToSequence(ctx)(x, axis=2, keepdims=0)
    back = ConcatFromSequence(ctx)(seq, axis=-1, new_axis=1)
    np.testing.assert_array_equal(back.numpy(), x)


def test_split_bfloat16_only_from_opset_24(device):
    import ml_dtypes

    x = np.ones((2, 2), dtype=ml_dtypes.bfloat16)
    assert len(SplitToSequence(KernelContext(device, opset=24))(x)) == 2
    with pytest.raises(KernelTypeError, match="SplitToSequence"):
        SplitToSequence(KernelContext(device, opset=23))(x)


# ---------------------------------------------------------------- SequenceMap


def _vi(name, et, shape=None):
    return oh.make_tensor_value_info(name, et, shape)


def add_body():
    return oh.make_graph([oh.make_node("Add", ["a", "b"], ["s"]), oh.make_node("Mul", ["a", "b"], ["p"])],
                         "body", [_vi("a", TP.FLOAT), _vi("b", TP.FLOAT)],
                         [_vi("s", TP.FLOAT), _vi("p", TP.FLOAT, ["N"])])


def test_sequence_map_sequences_and_tensors(device, rng):
    k = SequenceMap(KernelContext(device))
    xs = [rand(rng, (n,)) for n in (1, 3, 4)]
    ys = [rand(rng, (n,)) for n in (1, 3, 4)]
    s, p = k(xs, ys, body=add_body())
    same_list(host(s), [(x.astype(np.float64) + y).astype(np.float32) for x, y in zip(xs, ys)])
    same_list(host(p), [(x.astype(np.float64) * y).astype(np.float32) for x, y in zip(xs, ys)])
    t = rand(rng, (4,))
    xs4 = [rand(rng, (4,)) for _ in range(3)]
    s, p = k(xs4, t, body=add_body())
    same_list(host(s), [x + t for x in xs4])


def test_sequence_map_empty_and_errors(device, rng):
    k = SequenceMap(KernelContext(device))
    s, p = k(SequenceEmpty(KernelContext(device))(), rand(rng, (2,)), body=add_body())
    assert len(s) == 0 and s.elem_type == DataType.FLOAT and len(p) == 0
    with pytest.raises(KernelInputError, match="SequenceMap.*2 elements.*3"):
        k([rand(rng, (2,))] * 3, [rand(rng, (2,))] * 2, body=add_body())
    with pytest.raises(KernelInputError, match="SequenceMap.*declares 2 inputs"):
        k([rand(rng, (2,))], body=add_body())
    with pytest.raises(KernelInputError, match="SequenceMap"):
        k([rand(rng, (2,))], rand(rng, (2,)))
    # a body output whose type contradicts its declaration
    bad = oh.make_graph([oh.make_node("Shape", ["a"], ["s"])], "bad", [_vi("a", TP.FLOAT)],
                        [_vi("s", TP.FLOAT)])
    with pytest.raises(KernelTypeError, match="SequenceMap.*element type int64"):
        k([rand(rng, (2,))], body=bad)


def test_sequence_map_shapes_int64_output(device, rng):
    body = oh.make_graph([oh.make_node("Shape", ["x"], ["shape"])], "b", [_vi("x", TP.FLOAT)],
                         [_vi("shape", TP.INT64, [None])])
    xs = [rand(rng, s) for s in ((2, 3), (4, 1), (1, 2))]
    out = SequenceMap(KernelContext(device))(xs, body=body)
    assert out.elem_type == DataType.INT64
    same_list(host(out), [np.array(x.shape, np.int64) for x in xs])


def test_sequence_map_assemble(device, rng):
    k = SequenceMap(KernelContext(device))
    a = [rand(rng, (2,)) for _ in range(3)]
    b = [rand(rng, (1,), np.int64) for _ in range(3)]
    s1, s2 = k.assemble([[Tensor(x), Tensor(y)] for x, y in zip(a, b)])
    same_list(host(s1), a)
    same_list(host(s2), b)
    e = k.assemble([], output_types=[TP.INT64])
    assert len(e) == 0 and e.elem_type == DataType.INT64
    with pytest.raises(KernelInputError, match="SequenceMap"):
        k.assemble([[Tensor(a[0])], [Tensor(a[1]), Tensor(a[2])]])


def test_errors_are_gpukernels_errors(device, rng):
    with pytest.raises(GpuKernelsError):
        SequenceAt(KernelContext(device))([rand(rng, (2,))], np.array(3, np.int64))
