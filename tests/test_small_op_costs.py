"""The array functions of small tensor operators plan once per signature (issue 15).

Gather, GatherND, ScatterElements and ScatterND check and normalise constant indices
(frozen arrays, runtime.graph.freeze) once, at their first call, and check other indices
on every call; Cast chooses its conversion once; Max/Min/Sum/Mean of two inputs are one
ufunc call; values_guarded (Reshape, Expand, ...) reads a constant once.  Everything here
is compared with the kernels' general path to the bit, on random non-zero inputs, and an
index out of range still raises the kernel's error through a compiled Session run.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper as oh

from gpukernels import dtypes
from gpukernels.dtypes import DataType
from gpukernels.errors import GpuKernelsError
from gpukernels.kernels.base import KernelContext, lookup
from gpukernels.kernels.tensor import indexing
from gpukernels.kernels.tensor.indexing import constant_memo, is_frozen
from gpukernels.kernels.tensor.shape_ops import values_guarded
from gpukernels.runtime import Session
from gpukernels.tensor import Tensor
from tests.graphs import assert_same_bits, host_array, init, model_of, vi




def _sessions(model, device):
    return (Session(model, device=device),
            Session(model, device=device, options={"compile_graph": False}))


def _program(session):
    (program,) = [p for p in session._compiled.programs.values() if p is not None]
    return program


def _run_both(compiled, general, feeds, steps=3):
    for _ in range(steps):
        for got, want in zip(compiled.run(None, feeds), general.run(None, feeds)):
            assert_same_bits(got, want)


def _frozen(array):
    array = np.array(array)
    array.flags.writeable = False
    return array


# ----------------------------------------------------------- constants: planned once


def test_is_frozen_only_for_arrays_nobody_can_write():
    a = np.arange(4)
    assert not is_frozen(a)
    assert is_frozen(_frozen(a))
    view = a[1:]
    view.flags.writeable = False  # read-only view of writeable memory: may still change
    assert not is_frozen(view)
    assert is_frozen(np.frombuffer(b"\x01\x00\x00\x00", dtype=np.int32))
    assert not is_frozen(np.broadcast_to(a, (2, 4)))


def test_constant_memo_plans_a_frozen_array_once_and_others_every_call():
    calls = []
    memo = constant_memo(lambda idx: calls.append(idx) or idx.sum())
    const = _frozen([1, 2, 3])
    assert [memo(const) for _ in range(3)] == [6, 6, 6] and len(calls) == 1
    live = np.array([1, 2, 3])
    assert memo(live) == 6
    live[0] = 10  # the same (writeable) object with new values: planned again
    assert memo(live) == 15 and len(calls) == 3
    assert memo(const) == 6 and len(calls) == 3  # live arrays never replace the kept constant


def _gather_model(axis, const_idx):
    nodes = [oh.make_node("Gather", ["x", "i"], ["y"], axis=axis)]
    inputs = [vi("x", TP.FLOAT, [3, 5, 4])]
    inits = []
    if const_idx is None:
        inputs.append(vi("i", TP.INT64, [2, 2]))
    else:
        inits.append(init("i", const_idx))
    return model_of(nodes, inputs, [vi("y", TP.FLOAT, None)], inits)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_constant_indices_checked_once(axis, device, monkeypatch, rng):
    """Constant indices (negative ones among them) are checked at the program's first
    call and kept: later runs make no checked_indices call for them."""
    size = (3, 5, 4)[axis]
    model = _gather_model(axis, np.int64([[0, -1], [size - 1, -size]]))
    compiled, general = _sessions(model, device)
    feeds = {"x": rng.standard_normal((3, 5, 4)).astype(np.float32)}
    _run_both(compiled, general, feeds, steps=2)  # records, compiles, runs compiled
    assert 0 not in [op[0] for op in _program(compiled).ops]
    calls = []
    real = indexing.checked_indices
    monkeypatch.setattr(indexing, "checked_indices", lambda *a, **k: calls.append(1) or real(*a, **k))
    _run_both(compiled, general, {"x": rng.standard_normal((3, 5, 4)).astype(np.float32)})
    assert len(calls) == 3  # the general session's only


def test_gather_non_constant_indices_checked_every_call(device, rng):
    compiled, general = _sessions(_gather_model(1, None), device)
    x = rng.standard_normal((3, 5, 4)).astype(np.float32)
    for idx in ([[0, 1], [2, 3]], [[-1, -5], [4, 0]], [[3, -2], [-3, 1]]):
        _run_both(compiled, general, {"x": x, "i": np.int64(idx)}, steps=2)
    assert 0 not in [op[0] for op in _program(compiled).ops]
    for bad in (5, -6):
        with pytest.raises(GpuKernelsError, match=r"Gather.*out of range.*data.*float32.*\[3, 5, 4\]"):
            compiled.run(None, {"x": x, "i": np.int64([[0, bad], [1, 2]])})
    _run_both(compiled, general, {"x": x, "i": np.int64([[0, -1], [1, 2]])})  # the program still serves


def test_gather_int32_indices_and_the_threaded_take(device, rng):
    """int32 indices, and data large enough for the host's threaded take."""
    x = rng.standard_normal((600, 64)).astype(np.float32)
    model = model_of([oh.make_node("Gather", ["x", "i"], ["y"], axis=0),
                      oh.make_node("Gather", ["x", "c"], ["z"], axis=0)],
                     [vi("x", TP.FLOAT, [600, 64]), vi("i", TP.INT32, [700])],
                     [vi("y", TP.FLOAT, None), vi("z", TP.FLOAT, None)],
                     [init("c", rng.integers(-600, 600, 700).astype(np.int32))])
    compiled, general = _sessions(model, device)
    for _ in range(2):
        _run_both(compiled, general, {"x": x, "i": rng.integers(-600, 600, 700).astype(np.int32)}, steps=2)
    with pytest.raises(GpuKernelsError, match="Gather.*out of range"):
        compiled.run(None, {"x": x, "i": np.full(700, 600, np.int32)})


@pytest.mark.parametrize("batch_dims", [0, 1])
def test_gather_nd_constant_and_non_constant_indices(batch_dims, device, rng):
    const = np.int64([[[1, -1], [0, -2]], [[-2, 0], [1, 1]]])  # (2, 2, 2): b=1 needs batch 2
    nodes = [oh.make_node("GatherND", ["x", "i"], ["y"], batch_dims=batch_dims),
             oh.make_node("GatherND", ["x", "c"], ["z"], batch_dims=batch_dims)]
    model = model_of(nodes, [vi("x", TP.FLOAT, [2, 3, 4, 5]), vi("i", TP.INT64, [2, 2, 2])],
                     [vi("y", TP.FLOAT, None), vi("z", TP.FLOAT, None)], [init("c", const)])
    compiled, general = _sessions(model, device)
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    for idx in (const, np.clip(-1 - np.abs(const), -2, 0), np.abs(const) % 2):
        _run_both(compiled, general, {"x": x, "i": idx}, steps=2)
    assert 0 not in [op[0] for op in _program(compiled).ops]
    with pytest.raises(GpuKernelsError, match=r"GatherND.*out of range.*indices.*int64"):
        compiled.run(None, {"x": x, "i": np.int64([[[1, 9], [0, 0]], [[0, 0], [0, 0]]])})


# ------------------------------------------------------------------------ scatters


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("dt", [TP.FLOAT, TP.FLOAT16, TP.INT32])
def test_scatter_nd_constant_indices_and_reductions(reduction, dt, device, rng):
    """Constant indices (repeated and negative ones among them) linearised once, and
    live ones, for every reduction; repeated rows with 'none': the last one wins."""
    np_dt = dtypes.info(dt).numpy
    const = np.int64([[0, 1], [-1, 2], [0, 1], [1, -4]])
    nodes = [oh.make_node("ScatterND", ["x", "c", "u"], ["y"], reduction=reduction),
             oh.make_node("ScatterND", ["x", "i", "u"], ["z"], reduction=reduction)]
    model = model_of(nodes, [vi("x", dt, [2, 4, 6]), vi("u", dt, [4, 6]), vi("i", TP.INT64, [4, 2])],
                     [vi("y", dt, None), vi("z", dt, None)], [init("c", const)], opset=18)
    compiled, general = _sessions(model, device)

    def values(shape):
        v = rng.integers(1, 5, shape) * rng.choice([-1, 1], shape)
        return (v + rng.random(shape) if np_dt != np.int32 else v).astype(np_dt)

    for idx in (const, np.int64([[1, 3], [1, -1], [0, 0], [-2, -4]])):
        _run_both(compiled, general, {"x": values((2, 4, 6)), "u": values((4, 6)), "i": idx}, steps=2)
    assert 0 not in [op[0] for op in _program(compiled).ops]
    with pytest.raises(GpuKernelsError, match=r"ScatterND.*out of range.*data.*\[2, 4, 6\]"):
        compiled.run(None, {"x": values((2, 4, 6)), "u": values((4, 6)), "i": np.int64([[0, 0]] * 3 + [[2, 0]])})


def test_scatter_nd_large_distinct_rows_take_the_threaded_assignment(device, rng):
    """Constant distinct rows large enough for the threaded row assignment (chosen once),
    and the same rows as a live input (chosen per call)."""
    rows = rng.permutation(512)[:256].reshape(256, 1).astype(np.int64)
    nodes = [oh.make_node("ScatterND", ["x", "c", "u"], ["y"]), oh.make_node("ScatterND", ["x", "i", "u"], ["z"])]
    model = model_of(nodes, [vi("x", TP.FLOAT, [512, 256]), vi("u", TP.FLOAT, [256, 256]),
                             vi("i", TP.INT64, [256, 1])],
                     [vi("y", TP.FLOAT, None), vi("z", TP.FLOAT, None)], [init("c", rows)])
    compiled, general = _sessions(model, device)
    for i in (rows, np.zeros_like(rows)):
        feeds = {"x": rng.standard_normal((512, 256)).astype(np.float32),
                 "u": rng.standard_normal((256, 256)).astype(np.float32), "i": i}
        _run_both(compiled, general, feeds, steps=2)


@pytest.mark.parametrize("reduction", ["none", "add", "max"])
def test_scatter_elements_constant_and_live_indices(reduction, device, rng):
    const = np.int64([[[4, -1, 2]], [[-5, 1, 3]]])
    nodes = [oh.make_node("ScatterElements", ["x", "c", "u"], ["y"], axis=1, reduction=reduction),
             oh.make_node("ScatterElements", ["x", "i", "u"], ["z"], axis=1, reduction=reduction)]
    model = model_of(nodes, [vi("x", TP.FLOAT, [2, 5, 6]), vi("u", TP.FLOAT, [2, 1, 3]),
                             vi("i", TP.INT64, [2, 1, 3])],
                     [vi("y", TP.FLOAT, None), vi("z", TP.FLOAT, None)], [init("c", const)], opset=18)
    compiled, general = _sessions(model, device)
    for i in (const, -const - 1):
        feeds = {"x": rng.standard_normal((2, 5, 6)).astype(np.float32),
                 "u": rng.standard_normal((2, 1, 3)).astype(np.float32), "i": i}
        _run_both(compiled, general, feeds, steps=2)
    assert 0 not in [op[0] for op in _program(compiled).ops]
    with pytest.raises(GpuKernelsError, match="ScatterElements.*out of range"):
        compiled.run(None, {**feeds, "i": np.int64([[[0, 5, 0]], [[0, 0, 0]]])})


# ---------------------------------------------------------------------------- Cast

CAST_TYPES = (DataType.FLOAT, DataType.DOUBLE, DataType.FLOAT16, DataType.BFLOAT16, DataType.FLOAT8E4M3FN,
              DataType.FLOAT8E5M2, DataType.INT4, DataType.UINT4, DataType.INT8, DataType.UINT8, DataType.INT16,
              DataType.UINT16, DataType.INT32, DataType.UINT32, DataType.INT64, DataType.UINT64, DataType.BOOL)
_NATIVE_FLOATS = (DataType.FLOAT, DataType.DOUBLE, DataType.FLOAT16)
# compiled graphs' error state (runtime.body.FloatingPointGuard) for NumPy's defaults
_STRICT = {k: "ignore" if v == "ignore" else "raise" for k, v in np.geterr().items()}


def _cast(device, version=21):
    return lookup("Cast", "", version)[0](KernelContext(device), version)


def _source(kernel, rng, src: DataType) -> Tensor:
    """Random values of src, made by the kernel from float64 (floats: wide magnitudes,
    NaN and infinities; integers: the type's whole range)."""
    info = dtypes.info(src)
    if info.kind == "float":
        v = rng.standard_normal(64) * np.exp(rng.uniform(-12, 50, 64))
        v[:4] = [np.nan, np.inf, -np.inf, -0.0]
    elif info.kind == "bool":
        v = rng.integers(0, 2, 64).astype(np.float64)
    else:
        lo, hi = (-(2 ** (info.bits - 1)), 2 ** (info.bits - 1)) if info.kind == "int" else (0, 2 ** info.bits)
        v = rng.integers(max(lo, -(2 ** 52)), min(hi, 2 ** 52), 64).astype(np.float64)
        if info.bits == 64:
            return kernel.tensor(kernel.xp.asarray(rng.integers(np.iinfo(info.numpy).min, np.iinfo(info.numpy).max,
                                                                64, dtype=info.numpy, endpoint=True).reshape(4, 16)))
    with np.errstate(all="ignore"):
        return kernel(Tensor(v.reshape(4, 16)), to=int(src))


@pytest.mark.parametrize("src", CAST_TYPES, ids=lambda t: t.name)
def test_cast_function_equals_the_kernel_for_every_pair(src, device):
    kernel = _cast(device)
    rng = np.random.default_rng(int(src))
    t = _source(kernel, rng, src)
    for to in CAST_TYPES:
        for attrs in ({"to": int(to)}, {"to": int(to), "saturate": 0}):
            with np.errstate(all="ignore"):
                want = kernel(t, **attrs).array
            fn = kernel.array_function([t], dict(attrs))
            assert fn is not None
            where = f"Cast {src.name} -> {to.name} {attrs} on {device}"
            if to in _NATIVE_FLOATS:
                with np.errstate(**_STRICT):  # as compiled graphs call it: overflow is no error
                    got = fn(t.array)
            else:
                with np.errstate(all="ignore"):
                    got = fn(t.array)
            assert got.__class__ is want.__class__, where
            assert_same_bits(got, want, where)
            fresh = _source(kernel, rng, src)  # the function serves other values of the type
            with np.errstate(all="ignore"):
                assert_same_bits(fn(fresh.array), kernel(fresh, **attrs).array, where + " (other values)")


def test_cast_like_and_cast_through_a_compiled_session(device, rng):
    nodes = [oh.make_node("Cast", ["x"], ["h"], to=TP.FLOAT16),
             oh.make_node("Cast", ["x"], ["i"], to=TP.INT8),
             oh.make_node("CastLike", ["h", "b"], ["hb"]),
             oh.make_node("Cast", ["i"], ["d"], to=TP.DOUBLE)]
    model = model_of(nodes, [vi("x", TP.FLOAT, [3, 8])],
                     [vi("h", TP.FLOAT16, None), vi("i", TP.INT8, None), vi("hb", TP.BFLOAT16, None),
                      vi("d", TP.DOUBLE, None)],
                     [init("b", np.zeros(1, np.float32).astype(dtypes.info(DataType.BFLOAT16).numpy))], opset=21)
    compiled, general = _sessions(model, device)
    for scale in (1.0, 1e5):  # 1e5: float16 overflows to inf, int8 wraps
        _run_both(compiled, general, {"x": (rng.standard_normal((3, 8)) * scale).astype(np.float32)})
    assert 0 not in [op[0] for op in _program(compiled).ops]


# ---------------------------------------------------------------- Max/Min/Sum/Mean


@pytest.mark.parametrize("op", ["Max", "Min", "Sum", "Mean"])
@pytest.mark.parametrize("dt", [np.float32, np.float64, np.float16, np.int32])
def test_variadic_functions_equal_the_kernel(op, dt, device, rng):
    cls, version = lookup(op, "", 13)
    kernel = cls(KernelContext(device), version)
    if op in ("Sum", "Mean") and dt == np.int32:
        return  # floats only
    for shapes in ([(3, 4), (3, 4)], [(3, 4), (4,)], [(1, 4), (3, 1)], [(), ()], [(3, 4), (4,), (3, 1)]):
        arrays = [(rng.standard_normal(s) * 10).astype(dt) for s in shapes]
        if dt != np.int32 and arrays[0].size >= 3:
            arrays[0].reshape(-1)[:3] = [np.nan, np.inf, -0.0]
        tensors = [kernel.tensor(kernel.xp.asarray(a)) for a in arrays]
        fn = kernel.array_function(tensors, {})
        if dt == np.float16:
            assert fn is None  # computed in float32 and rounded: the kernel runs
            continue
        with np.errstate(all="ignore"):
            want = kernel(*tensors).array
            got = fn(*[t.array for t in tensors])
        assert got.__class__ is want.__class__
        assert_same_bits(got, want, f"{op} {dt.__name__} {shapes}")
        assert not np.shares_memory(host_array(got), host_array(arrays[0]))


# ------------------------------------------------------- values_guarded and Expand


def test_values_guarded_reads_a_constant_once_and_live_values_every_call():
    fn = values_guarded("Reshape", {"shape": [2, 3]}, lambda data: data.reshape(2, 3))
    x = np.arange(6.0)
    const = _frozen([2, 3])
    reads = []

    class Counted(np.ndarray):
        def tolist(self):
            reads.append(1)
            return super().tolist()

    fn(x, const)
    fn(x, const)
    live = np.array([2, 3]).view(Counted)
    fn(x, live)
    fn(x, live)
    assert len(reads) == 2
    live[0] = 3
    with pytest.raises(ValueError, match=r"Reshape: shape \[3, 3\] is not the compiled \[2, 3\]"):
        fn(x, live)
    two = values_guarded("Slice", {"starts": [0], "ends": [2]}, lambda data: data[:2])
    assert two(x, const[:1] * 0, np.int64([2])).tolist() == [0.0, 1.0]
    with pytest.raises(ValueError, match="ends"):
        two(x, np.int64([0]), np.int64([3]))


@pytest.mark.parametrize("shape, dims", [((3, 1), [3, 4]), ((4,), [2, 3, 4]), ((1, 4), [1, 1, 4]),
                                          ((3, 4), [3, 4]), ((), [])])
def test_expand_copies_or_gives_a_read_only_view(shape, dims, device, rng):
    kernel = lookup("Expand", "", 13)[0](KernelContext(device), 13)
    x = kernel.tensor(kernel.xp.asarray(rng.standard_normal(shape).astype(np.float32)))
    s = Tensor(np.int64(dims).reshape(len(dims)))
    want = kernel(x, s)
    assert want.shape == tuple(np.broadcast_shapes(shape, tuple(dims)))
    got = kernel.array_function([x, s], {})(x.array, s.array)
    assert_same_bits(got, want.array)
    assert_same_bits(got, np.broadcast_to(host_array(x.array), want.shape))
    if isinstance(got, np.ndarray) and np.shares_memory(got, x.array):
        assert not got.flags.writeable  # a view of the input is never written through
