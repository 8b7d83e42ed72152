"""The operators around the convolutions of CNN exports (issue 15): squeeze-excitation's
ReduceMean over H, W (and GlobalAveragePool), HardSigmoid, and the Clip (ReLU6) epilogue.

* float ReduceSum/ReduceMean over trailing axes: on the host one np.add.reduce over the
  (rows, count) view (reductions.sum_rows; rows of fewer than 16 elements column by
  column in NumPy's order), and in compiled graphs straight to it: the bits of
  numpy.sum / numpy.mean (the reference), whatever the split over threads; other
  layouts and types go the general way; a floating-point event in a compiled run sends
  the node back to the kernel.  GlobalAveragePool's host mean the same way.
* HardSigmoid's and the Clip epilogue's clip call ndarray.clip (activations.clip_host):
  the bits of numpy.clip.

Everything is compared with the general path to the bit and with float64 within the
reduction tests' tolerance, on random non-zero inputs.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper as oh

from gpukernels.kernels import specialize
from gpukernels.kernels.base import KernelContext, lookup
from gpukernels.kernels.math import reductions
from gpukernels.runtime import Session
from gpukernels.tensor import Tensor
from tests.graphs import assert_same_bits, host_array, init, model_of, vi

pytestmark = pytest.mark.usefixtures("default_paths")

_ET = {np.dtype(np.float32): TP.FLOAT, np.dtype(np.float64): TP.DOUBLE}
_TOL = {np.dtype(np.float32): 2e-6, np.dtype(np.float64): 1e-12}  # tests/kernels/math/test_math_reductions.py




def _reduce_model(op, shape, dtype, axes, keepdims, opset, pre=None):
    """A model x -> [pre] -> op(axes) -> y; axes as an input or attribute by opset (None: no
    axes, every axis reduced)."""
    et = _ET[np.dtype(dtype)]
    inits, nodes, src = [], [], "x"
    if pre is not None:
        nodes.append(oh.make_node("Transpose", ["x"], ["t"], perm=pre))
        src = "t"
    input_axes = opset >= (13 if op == "ReduceSum" else 18)
    if axes is not None and input_axes:
        inits.append(init("axes", np.array(axes, np.int64)))
        nodes.append(oh.make_node(op, [src, "axes"], ["y"], keepdims=keepdims))
    elif axes is not None:
        nodes.append(oh.make_node(op, [src], ["y"], axes=axes, keepdims=keepdims))
    else:
        nodes.append(oh.make_node(op, [src], ["y"], keepdims=keepdims))
    return model_of(nodes, [vi("x", et, list(shape))], [vi("y", et, None)], inits, opset=opset)


def _numpy_reduce(op, x, axes, keepdims):
    axes = tuple(range(x.ndim)) if axes is None else tuple(a % x.ndim for a in axes)
    f = np.mean if op == "ReduceMean" else np.sum
    return f(x, axis=axes, keepdims=bool(keepdims))


CASES = [  # (shape, axes, keepdims, opset)
    ((2, 16, 48, 48), [2, 3], 1, 18),  # efficientnet's squeeze-excitation
    ((2, 240, 6, 6), [-2, -1], 1, 18),
    ((2, 1280, 3, 3), [2, 3], 0, 17),  # axes as an attribute; short rows by columns
    ((2, 128, 2, 2), [-2, -1], 1, 18),  # 4-element rows by columns
    ((3, 400, 15), [2], 1, 18),  # 15-element rows by columns
    ((3, 5, 7), [-1], 1, 18),
    ((4, 37), None, 0, 18),  # every axis
    ((6,), [0], 1, 18),
    ((0, 3, 4), [1, 2], 1, 18),  # no rows
]


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceSum"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,axes,keepdims,opset", CASES)
def test_trailing_reduction_compiled_same_bits(op, dtype, shape, axes, keepdims, opset, device):
    rng = np.random.default_rng(7)
    model = _reduce_model(op, shape, dtype, axes, keepdims, opset)
    compiled = Session(model, device=device)
    general = Session(model, device=device, options={"compile_graph": False})
    reference = Session(model, device=device, options={"paths": "reference"})
    for _ in range(3):
        x = (rng.standard_normal(shape) * 3 + 0.5).astype(dtype)
        got = compiled.run(None, {"x": x})[0]
        assert_same_bits(got, general.run(None, {"x": x})[0], "compiled vs general")
        assert_same_bits(got, reference.run(None, {"x": x})[0], "auto vs reference")
        if device == "cpu":
            assert_same_bits(got, _numpy_reduce(op, x, axes, keepdims), "vs numpy")
        want = _numpy_reduce(op, x.astype(np.float64), axes, keepdims)
        if x.size:
            tol = _TOL[np.dtype(dtype)]
            np.testing.assert_allclose(host_array(got).astype(np.float64), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceSum"])
def test_trailing_reduction_takes_the_host_rows_step(op, monkeypatch):
    """The kernel call takes Reduce.rows; compiled runs go straight to sum_rows, without
    the kernel's _step."""
    x = np.random.default_rng(3).standard_normal((2, 48, 24, 24)).astype(np.float32)
    model = _reduce_model(op, x.shape, np.float32, [2, 3], 1, 18)
    session = Session(model)
    with specialize.recording() as chosen:
        session.run(None, {"x": x})
    assert "Reduce.rows" in {s.site for s in chosen}
    calls = {"rows": 0, "step": 0}
    sum_rows, step = reductions.sum_rows, reductions._Reduce._step

    def counted_rows(*a):
        calls["rows"] += 1
        return sum_rows(*a)

    def counted_step(*a):
        calls["step"] += 1
        return step(*a)

    monkeypatch.setattr(reductions, "sum_rows", counted_rows)
    monkeypatch.setattr(reductions._Reduce, "_step", counted_step)
    for _ in range(3):
        assert_same_bits(session.run(None, {"x": x})[0], _numpy_reduce(op, x, [2, 3], 1))
    assert calls == {"rows": 3, "step": 0}
    with specialize.recording() as chosen:
        Session(model, options={"paths": "reference"}).run(None, {"x": x})
    assert not chosen


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceSum"])
def test_trailing_reduction_split_over_threads_same_bits(op, tuning):
    """Rows split over the host threads (a small reduce.thread_items): each row's sum is
    still NumPy's, so the bits of one call."""
    tuning({"reduce.thread_items": 64})
    cls, version = lookup(op, "", 18)
    k = cls(KernelContext("cpu"), version=version)
    x = np.random.default_rng(5).standard_normal((3, 40, 50)).astype(np.float32)
    got = k(Tensor(x), np.array([1, 2], np.int64)).numpy()
    assert_same_bits(got, _numpy_reduce(op, x, [1, 2], 1), "threads vs numpy")
    got = k(Tensor(x), np.array([2], np.int64), keepdims=0).numpy()
    assert_same_bits(got, _numpy_reduce(op, x, [2], 0), "threads vs numpy, last axis")


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceSum"])
def test_non_trailing_and_transposed_inputs_go_the_general_way(op, device):
    rng = np.random.default_rng(11)
    for axes, pre in (([1], None), ([0, 2], None), ([2, 3], [0, 2, 3, 1])):
        model = _reduce_model(op, (2, 5, 6, 7), np.float32, axes, 1, 18, pre=pre)
        compiled = Session(model, device=device)
        general = Session(model, device=device, options={"compile_graph": False})
        for _ in range(2):
            x = rng.standard_normal((2, 5, 6, 7)).astype(np.float32)
            assert_same_bits(compiled.run(None, {"x": x})[0], general.run(None, {"x": x})[0], f"axes {axes} perm {pre}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_short_rows_by_columns_same_bits_as_numpy(dtype):
    """Rows of 2 to 15 elements summed column by column in NumPy's order (checked once
    per length by _columns_agree), special values included; longer rows by NumPy."""
    rng = np.random.default_rng(8)
    for n in range(1, 20):
        rows = (rng.standard_normal((reductions._COLUMN_ROWS * n + 3, n))
                * 10.0 ** rng.uniform(-20, 20, (reductions._COLUMN_ROWS * n + 3, 1))).astype(dtype)
        rows[:4] = -0.0
        rows[4, :] = [np.inf] + [1.0] * (n - 1)
        rows[5, -1] = -np.inf
        rows[6, 0] = np.nan
        rows[7, :2] = [0.0, -0.0][:n]
        with np.errstate(all="ignore"):
            want = np.add.reduce(rows, axis=1)
            got = reductions._add_rows(rows, None)
            assert_same_bits(got, want, f"{n} elements")
            out = np.empty(rows.shape[0], dtype)
            assert reductions._add_rows(rows, out) is out
            assert_same_bits(out, want, f"{n} elements into out")
            if 1 < n < reductions._SHORT_ROW and reductions._columns_agree(n, np.dtype(dtype)):
                assert_same_bits(reductions._column_sums(rows[:10]), np.add.reduce(rows[:10], axis=1), f"{n}: few rows")


def test_overflow_in_a_compiled_run_gives_the_kernels_result(device):
    """A float32 sum overflowing to inf: the compiled step raises under the runtime's
    error guard, the node is redone by the kernel (which ignores the event)."""
    model = _reduce_model("ReduceSum", (2, 3, 4), np.float32, [1, 2], 1, 18)
    compiled = Session(model, device=device)
    general = Session(model, device=device, options={"compile_graph": False})
    x = np.random.default_rng(2).uniform(1, 2, (2, 3, 4)).astype(np.float32)
    for _ in range(2):
        assert_same_bits(compiled.run(None, {"x": x})[0], general.run(None, {"x": x})[0], "finite")
    big = np.full((2, 3, 4), 3e38, np.float32)
    with np.errstate(all="raise"):
        got = compiled.run(None, {"x": big})[0]
    assert_same_bits(got, general.run(None, {"x": big})[0], "overflow")
    assert np.isinf(host_array(got)).all()


# ------------------------------------------------------------------ NumPy's clip ufunc


def _previous_hard_sigmoid(x, alpha, beta):
    """The chain as it was, with numpy.clip: the bits to keep."""
    f = x.dtype.type
    out = np.multiply(x, f(alpha))
    out += f(beta)
    return np.clip(out, f(0), f(1), out=out)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(2, 240, 1, 1), (2, 16, 96, 96)])  # one block; several
def test_hard_sigmoid_same_bits_as_numpy_clip(dtype, shape):
    alpha, beta = 1.0 / 6.0, 0.5
    cls, version = lookup("HardSigmoid", "", 22)
    k = cls(KernelContext("cpu"), version=version)
    x = (np.random.default_rng(4).standard_normal(shape) * 4).astype(dtype)
    x.reshape(-1)[:3] = [np.nan, np.inf, -np.inf]
    got = k(Tensor(x), alpha=alpha, beta=beta).numpy()
    assert_same_bits(got, _previous_hard_sigmoid(x, alpha, beta), "HardSigmoid")
    want = np.clip(x.astype(np.float64) * dtype(alpha).astype(np.float64) + beta, 0, 1)
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-7 if dtype == np.float32 else 1e-15,
                               atol=1e-7 if dtype == np.float32 else 1e-15)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_clip_epilogue_same_bits_as_numpy_clip(dtype):
    from gpukernels.kernels.nn.epilogues import build_epilogue

    cls, version = lookup("Clip", "", 13)
    k = cls(KernelContext("cpu"), version=version)
    bounds = (Tensor(np.array(0, dtype)), Tensor(np.array(6, dtype)))
    ep = build_epilogue(k, {}, dtype, bounds)
    x = (np.random.default_rng(6).standard_normal((2, 96, 12, 12)) * 5).astype(dtype)
    x.reshape(-1)[:2] = [np.nan, -0.0]
    want = np.clip(x, dtype(0), dtype(6))
    out = np.empty_like(x)
    ep(x, out)
    assert_same_bits(out, want, "into out")
    assert_same_bits(out, k(Tensor(x), *bounds).numpy(), "vs the Clip kernel")
    y = x.copy()
    ep(y, y)
    assert_same_bits(y, want, "in place")


# ------------------------------------------------------------------ GlobalAveragePool


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(2, 1152, 3, 3), (2, 16, 48, 48), (2, 3, 4, 5, 6), (1, 5, 7)])
def test_global_average_pool_same_bits_as_numpy_mean(dtype, shape, device):
    model = model_of([oh.make_node("GlobalAveragePool", ["x"], ["y"])], [vi("x", _ET[np.dtype(dtype)], list(shape))],
                     [vi("y", _ET[np.dtype(dtype)], None)])
    compiled = Session(model, device=device)
    general = Session(model, device=device, options={"compile_graph": False})
    rng = np.random.default_rng(9)
    axes = tuple(range(2, len(shape)))
    for _ in range(3):
        x = (rng.standard_normal(shape) * 2 + 1).astype(dtype)
        got = compiled.run(None, {"x": x})[0]
        assert_same_bits(got, general.run(None, {"x": x})[0], "compiled vs general")
        if device == "cpu":
            assert_same_bits(got, np.mean(x, axis=axes, keepdims=True), "vs numpy.mean")
        tol = _TOL[np.dtype(dtype)]
        np.testing.assert_allclose(host_array(got).astype(np.float64), x.astype(np.float64).mean(axis=axes, keepdims=True),
                                   rtol=tol, atol=tol)
    xt = np.ascontiguousarray(rng.standard_normal(shape[:1] + shape[2:] + shape[1:2]).astype(dtype))
    x = np.moveaxis(xt, -1, 1)  # not C-contiguous: numpy.mean's own path
    from gpukernels.kernels.nn.pool import global_mean
    assert_same_bits(global_mean(np, x), np.mean(x, axis=axes, keepdims=True), "strided input")

