"""The foundation operators against float64 references on random inputs, every dtype."""

import ml_dtypes
import numpy as np
import pytest

from gpukernels import Tensor
from gpukernels.errors import KernelInputError, KernelTypeError
from gpukernels.kernels import KernelContext, kernel_class

FLOATS = [np.float32, np.float64, np.float16, ml_dtypes.bfloat16]
INTS = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]


def _tol(dt):
    return {np.float16: 2e-3, ml_dtypes.bfloat16: 1e-2, np.float32: 2e-6}.get(dt, 1e-12)


def _rand(rng, shape, dt):
    if np.dtype(dt).kind in "iu":
        return rng.integers(1, 20, shape).astype(dt)
    return rng.uniform(0.5, 2.0, shape).astype(dt) * np.where(rng.random(shape) < 0.5, -1, 1).astype(dt)


@pytest.mark.parametrize("op, ref", [("Add", np.add), ("Sub", np.subtract), ("Mul", np.multiply),
                                     ("Div", np.divide)])
@pytest.mark.parametrize("dt", FLOATS + INTS)
def test_binary_arithmetic(device, rng, op, ref, dt):
    a = _rand(rng, (2, 3, 4), dt)
    b = _rand(rng, (3, 1), dt)  # broadcasting
    y = kernel_class(op)(KernelContext(device))(a, b).numpy()
    assert y.dtype == np.dtype(dt) and y.shape == (2, 3, 4)
    if np.dtype(dt).kind in "iu":
        a64, b64 = a.astype(np.int64), b.astype(np.int64)
        exp = (np.trunc(a64 / b64).astype(np.int64) if op == "Div" else ref(a64, b64)).astype(dt)
        np.testing.assert_array_equal(y, exp)
    else:
        exp = ref(a.astype(np.float64), b.astype(np.float64))
        np.testing.assert_allclose(y.astype(np.float64), exp, rtol=_tol(dt))


def test_integer_division_truncates_and_rejects_zero(device):
    div = kernel_class("Div")(KernelContext(device))
    np.testing.assert_array_equal(div(np.array([-7, 7, -7], np.int32), np.array([2, -2, -2], np.int32)).numpy(),
                                  [-3, -3, 3])
    with pytest.raises(KernelInputError, match="Div: integer division by zero"):
        div(np.array([1], np.int64), np.array([0], np.int64))


@pytest.mark.parametrize("op, ref", [("Neg", np.negative), ("Abs", np.abs), ("Relu", lambda x: np.maximum(x, 0)),
                                     ("Sqrt", lambda x: np.sqrt(np.abs(x))), ("Exp", np.exp),
                                     ("Log", lambda x: np.log(np.abs(x)))])
@pytest.mark.parametrize("dt", FLOATS)
def test_unary(device, rng, op, ref, dt):
    x = _rand(rng, (5, 7), dt)
    if op in ("Sqrt", "Log"):
        x = np.abs(x)
    y = kernel_class(op)(KernelContext(device))(x).numpy()
    assert y.dtype == np.dtype(dt)
    np.testing.assert_allclose(y.astype(np.float64), ref(x.astype(np.float64)), rtol=_tol(dt))


def test_unary_edge_values(device):
    x = np.array([0.0, -1.0, np.inf, np.nan], np.float32)
    assert np.isneginf(kernel_class("Log")(KernelContext(device))(x).numpy()[0])
    assert np.isnan(kernel_class("Sqrt")(KernelContext(device))(x).numpy()[1])
    assert np.isnan(kernel_class("Relu")(KernelContext(device))(x).numpy()[3])
    empty = kernel_class("Exp")(KernelContext(device))(np.zeros((0, 3), np.float32))
    assert empty.shape == (0, 3)


@pytest.mark.parametrize("op, ref", [("Less", np.less), ("Greater", np.greater), ("Equal", np.equal)])
@pytest.mark.parametrize("dt", [np.float32, np.int64, np.uint8, ml_dtypes.bfloat16])
def test_comparisons(device, rng, op, ref, dt):
    a = _rand(rng, (4, 5), dt)
    b = a.copy()
    b[::2] = _rand(rng, (2, 5), dt)
    y = kernel_class(op)(KernelContext(device))(a, b[:, :1] if op == "Less" else b).numpy()
    assert y.dtype == np.bool_
    np.testing.assert_array_equal(y, ref(a.astype(np.float64), (b[:, :1] if op == "Less" else b).astype(np.float64)))


def test_equal_strings():
    y = kernel_class("Equal")(KernelContext("cpu"))(np.array(["a", "b"]), np.array(["a", "c"])).numpy()
    np.testing.assert_array_equal(y, [True, False])


@pytest.mark.parametrize("dt", [np.float32, np.float64, np.float16, ml_dtypes.bfloat16, np.int32, np.uint64])
@pytest.mark.parametrize("shapes", [((3, 4), (4, 5)), ((2, 3, 4), (4, 6)), ((4,), (4, 3)), ((2, 1, 3, 4), (5, 4, 2)),
                                    ((3, 4), (4,))])
def test_matmul(device, rng, dt, shapes):
    a, b = _rand(rng, shapes[0], dt), _rand(rng, shapes[1], dt)
    y = kernel_class("MatMul")(KernelContext(device))(a, b).numpy()
    exp = np.matmul(a.astype(np.float64), b.astype(np.float64))
    assert y.shape == exp.shape
    np.testing.assert_allclose(y.astype(np.float64), exp.astype(y.dtype).astype(np.float64) if np.dtype(dt).kind in "iu" else exp,
                               rtol=max(_tol(dt), 1e-5))


def test_matmul_shape_errors(device):
    with pytest.raises(KernelInputError, match=r"MatMul: inner dimensions differ .*float32\[3, 4\]"):
        kernel_class("MatMul")(KernelContext(device))(np.ones((3, 4), np.float32), np.ones((5, 2), np.float32))


@pytest.mark.parametrize("transA, transB", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("c_shape", [None, (), (5,), (3, 1), (3, 5)])
def test_gemm(device, rng, transA, transB, c_shape):
    a = rng.standard_normal((4, 3) if transA else (3, 4))
    b = rng.standard_normal((5, 4) if transB else (4, 5))
    c = None if c_shape is None else rng.standard_normal(c_shape)
    y = kernel_class("Gemm")(KernelContext(device))(a, b, c, alpha=0.7, beta=-1.3, transA=transA, transB=transB)
    exp = 0.7 * ((a.T if transA else a) @ (b.T if transB else b)) + (0 if c is None else -1.3 * c)
    np.testing.assert_allclose(y.numpy(), exp, rtol=1e-12)


def test_gemm_integers_and_bad_c(device):
    a = np.array([[1, 2]], np.int32)
    b = np.array([[3], [4]], np.int32)
    assert kernel_class("Gemm")(KernelContext(device))(a, b, np.array([1], np.int32)).numpy().tolist() == [[12]]
    with pytest.raises(KernelInputError, match="C does not broadcast"):
        kernel_class("Gemm")(KernelContext(device))(a, b, np.ones((2, 2), np.int32))
    with pytest.raises(KernelTypeError):
        kernel_class("Gemm")(KernelContext(device))(a.astype(np.int8), b.astype(np.int8))


@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("axis", [0, 1, -1, 2])
@pytest.mark.parametrize("dt", [np.float32, np.float16, np.float64, ml_dtypes.bfloat16])
def test_softmax(device, rng, opset, axis, dt):
    x = (rng.standard_normal((2, 3, 4)) * 3).astype(dt)
    if opset < 13 and dt is ml_dtypes.bfloat16:  # the opset-11 schema has no bfloat16
        with pytest.raises(KernelTypeError, match="opset-11 Softmax does not allow"):
            kernel_class("Softmax")(KernelContext(device, opset=opset))(x, axis=axis)
        return
    y = kernel_class("Softmax")(KernelContext(device, opset=opset))(x, axis=axis).numpy()
    x64 = x.astype(np.float64)
    if opset < 13:
        ax = axis % 3
        flat = x64.reshape(int(np.prod(x.shape[:ax])), -1)
        e = np.exp(flat - flat.max(1, keepdims=True))
        exp = (e / e.sum(1, keepdims=True)).reshape(x.shape)
    else:
        e = np.exp(x64 - x64.max(axis, keepdims=True))
        exp = e / e.sum(axis, keepdims=True)
    np.testing.assert_allclose(y.astype(np.float64), exp, rtol=_tol(dt) * 5, atol=1e-7)


def test_softmax_bad_axis(device):
    with pytest.raises(KernelInputError, match="Softmax: axis 3 is out of range"):
        kernel_class("Softmax")(KernelContext(device))(np.ones((2, 2), np.float32), axis=3)


def test_constant_variants():
    C = kernel_class("Constant")(KernelContext("cpu"))
    assert C(value_ints=[1, 2]).numpy().dtype == np.int64
    assert C(value_float=2.5).numpy() == np.float32(2.5)
    assert C(value_strings=["a", "b"]).numpy().tolist() == ["a", "b"]
    assert C(value=Tensor(np.eye(2, dtype=np.float16))).numpy().dtype == np.float16
    with pytest.raises(KernelInputError, match="exactly one"):
        C(value_int=1, value_float=2.0)


def test_constant_of_shape(device):
    K = kernel_class("ConstantOfShape")(KernelContext(device))
    y = K(np.array([2, 3], np.int64), value=Tensor(np.array([7], np.int32)))
    assert y.numpy().dtype == np.int32 and (y.numpy() == 7).all() and y.shape == (2, 3)
    assert K(np.array([], np.int64)).shape == ()
    assert K(np.array([0, 4], np.int64)).shape == (0, 4)
    with pytest.raises(KernelInputError, match="negative"):
        K(np.array([-1], np.int64))


def test_inputs_are_not_modified(device, rng):
    a = rng.standard_normal((3, 3)).astype(np.float32)
    keep = a.copy()
    for op in ("Add", "Mul", "Sub", "Div"):
        kernel_class(op)(KernelContext(device))(a, a)
    kernel_class("Softmax")(KernelContext(device))(a)
    np.testing.assert_array_equal(a, keep)


def test_opset6_legacy_broadcast(rng):
    a = rng.standard_normal((2, 3, 4)).astype(np.float32)
    b = rng.standard_normal(3).astype(np.float32)
    add = kernel_class("Add")(KernelContext("cpu", opset=6))
    np.testing.assert_allclose(add(a, b, broadcast=1, axis=1).numpy(), a + b[None, :, None], rtol=1e-6)
    c = rng.standard_normal(4).astype(np.float32)
    np.testing.assert_allclose(add(a, c, broadcast=1).numpy(), a + c, rtol=1e-6)
    with pytest.raises(KernelInputError, match="broadcast is 0"):
        add(a, c)
    with pytest.raises(KernelInputError, match="does not broadcast"):
        add(a, b, broadcast=1, axis=2)
