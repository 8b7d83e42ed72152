"""Issue 15, session 8: per-call costs of MaxPool / AveragePool in compiled graphs (the
array function checks the attributes and computes the geometry once per node) and the
host max pooling arithmetic.  Max pooling is exact: every path must give the same bits
(NaN propagating as np.maximum does); averages match an independent float64 reference."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper as oh

from gpukernels.kernels.base import KernelContext, lookup
from gpukernels.runtime import Session
from gpukernels.tensor import Tensor
from tests.graphs import assert_same_bits, host_array, model_of, vi

pytestmark = pytest.mark.usefixtures("default_paths")

_ET = {np.dtype(np.float32): TP.FLOAT, np.dtype(np.float64): TP.DOUBLE}




# ------------------------------------------------------------------ MaxPool, AveragePool

POOLS = [  # (op, attributes, opset)
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, 22),  # resnet's stem
    ("MaxPool", {"kernel_shape": [2, 2], "strides": [2, 2]}, 7),
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1, "dilations": [1, 2]}, 12),
    ("MaxPool", {"kernel_shape": [3], "auto_pad": "SAME_UPPER", "strides": [2]}, 22),
    ("AveragePool", {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}, 22),
    ("AveragePool", {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1]}, 22),
    ("AveragePool", {"kernel_shape": [2, 2, 2], "strides": [2, 2, 2]}, 11),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("op,attrs,opset", POOLS)
def test_pool_compiled_same_bits(op, attrs, opset, dtype, device):
    n_sp = len(attrs["kernel_shape"])
    shape = [2, 5] + [13, 12, 7][:n_sp]
    et = _ET[np.dtype(dtype)]
    model = model_of([oh.make_node(op, ["x"], ["y"], **attrs)], [vi("x", et, shape)], [vi("y", et, None)],
                     opset=opset)
    compiled = Session(model, device=device)
    general = Session(model, device=device, options={"compile_graph": False})
    reference = Session(model, device=device, options={"paths": "reference", "compile_graph": False})
    rng = np.random.default_rng(13)
    for _ in range(3):
        x = rng.standard_normal(shape).astype(dtype)
        got = compiled.run(None, {"x": x})[0]
        assert_same_bits(got, general.run(None, {"x": x})[0], "compiled vs general")
        np.testing.assert_allclose(host_array(got), host_array(reference.run(None, {"x": x})[0]), rtol=1e-6, atol=1e-7)


def test_pool_array_function_only_for_valid_float_calls():
    from gpukernels.kernels.nn.pool import _pool_array_function

    cls, version = lookup("MaxPool", "", 22)
    k = cls(KernelContext("cpu"), version=version)
    x = Tensor(np.ones((1, 2, 5, 5), np.float32))
    assert _pool_array_function(k, [x], {"kernel_shape": [2, 2]}, "max") is not None
    assert _pool_array_function(k, [x], {"kernel_shape": [7, 7]}, "max") is None  # larger than the input
    assert _pool_array_function(k, [x], {}, "max") is None  # no kernel_shape
    assert _pool_array_function(k, [Tensor(np.ones((1, 2, 5, 5), np.uint8))], {"kernel_shape": [2, 2]}, "max") is None
    fn = _pool_array_function(k, [x], {"kernel_shape": [2, 2]}, "max")
    with pytest.raises(ValueError, match="MaxPool: input shape"):
        fn(np.ones((1, 2, 6, 6), np.float32))


def test_max_pool_with_indices_in_a_compiled_graph(device):
    model = model_of([oh.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[3, 3], strides=[2, 2])],
                     [vi("x", TP.FLOAT, [2, 3, 9, 9])], [vi("y", TP.FLOAT, None), vi("i", TP.INT64, None)], opset=22)
    compiled = Session(model, device=device)
    general = Session(model, device=device, options={"compile_graph": False})
    x = np.random.default_rng(1).standard_normal((2, 3, 9, 9)).astype(np.float32)
    for _ in range(3):
        for got, want in zip(compiled.run(None, {"x": x}), general.run(None, {"x": x})):
            assert_same_bits(got, want)


# ------------------------------------------------ host arithmetic (Pool.windows, _pool_host)


def _max_pool_reference(x, K, s, p):
    """Independent 2-D max pooling: -inf padding, every tap of every window."""
    N, C, H, W = x.shape
    xp = np.full((N, C, H + p[0] + p[2], W + p[1] + p[3]), -np.inf, np.float64)
    xp[:, :, p[0]:p[0] + H, p[1]:p[1] + W] = x
    OH = (H + p[0] + p[2] - K[0]) // s[0] + 1
    OW = (W + p[1] + p[3] - K[1]) // s[1] + 1
    y = np.full((N, C, OH, OW), -np.inf)
    for i in range(K[0]):
        for j in range(K[1]):
            y = np.maximum(y, xp[:, :, i:i + s[0] * (OH - 1) + 1:s[0], j:j + s[1] * (OW - 1) + 1:s[1]])
    return y


HOST_POOLS = [  # (shape, kernel, strides, pads): the exports' geometries and their edges
    ((2, 16, 48, 48), [3, 3], [2, 2], [1, 1, 1, 1]),  # resnet50 / deeplab stem
    ((2, 8, 96, 96), [2, 2], [2, 2], [0, 0, 0, 0]),  # unet
    ((2, 3, 13, 11), [3, 3], [2, 2], [1, 1, 1, 1]),  # odd sizes: no flat last pass
    ((2, 3, 12, 10), [2, 3], [2, 2], [1, 0, 0, 1]),  # asymmetric pads
    ((1, 2, 9, 7), [3, 2], [2, 2], [0, 0, 0, 0]),  # O < S / s
    ((40, 3, 20, 22), [3, 3], [2, 2], [1, 1, 1, 1]),  # several channel blocks
]


@pytest.mark.parametrize("nan", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,K,s,p", HOST_POOLS)
def test_host_max_pool_matches_the_reference(shape, K, s, p, dtype, nan):
    """Max pooling is exact: the same values as the reference (NaN where a window holds
    one; infinities kept)."""
    cls, version = lookup("MaxPool", "", 22)
    k = cls(KernelContext("cpu"), version=version)
    x = np.random.default_rng(5).standard_normal(shape).astype(dtype)
    if nan:
        flat = x.reshape(-1)
        flat[::97] = np.nan
        flat[5::89] = np.inf
        flat[7::83] = -np.inf
    y = k(x, kernel_shape=K, strides=s, pads=p).Y.numpy()
    want = _max_pool_reference(x.astype(np.float64), K, s, p).astype(dtype)
    assert y.dtype == want.dtype and y.shape == want.shape
    np.testing.assert_array_equal(y, want)


@pytest.mark.parametrize("shape,K,s,p", HOST_POOLS)
def test_host_average_pool_matches_float64(shape, K, s, p):
    cls, version = lookup("AveragePool", "", 22)
    k = cls(KernelContext("cpu"), version=version)
    x = np.random.default_rng(6).standard_normal(shape).astype(np.float32)
    y = k(x, kernel_shape=K, strides=s, pads=p, count_include_pad=1).numpy()
    x64 = x.astype(np.float64)
    N, C, H, W = shape
    xp = np.zeros((N, C, H + p[0] + p[2], W + p[1] + p[3]))
    xp[:, :, p[0]:p[0] + H, p[1]:p[1] + W] = x64
    OH, OW = y.shape[2:]
    want = sum(xp[:, :, i:i + s[0] * (OH - 1) + 1:s[0], j:j + s[1] * (OW - 1) + 1:s[1]]
               for i in range(K[0]) for j in range(K[1])) / (K[0] * K[1])
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


# ------------------------------------------------ ConvTranspose with kernel == stride


TAP_GRID = [  # (x shape, M, kernel == strides)
    ((2, 32, 12, 10), 16, [2, 2]),  # unet's upsampling
    ((1, 8, 5, 7), 6, [3, 3]),  # 12-byte rows (float32): the phase path
    ((2, 4, 6, 5), 3, [1, 2]),
    ((1, 3, 4, 3), 5, [2, 4]),
    ((1, 6, 7, 6), 4, [1, 1]),
]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,M,K", TAP_GRID)
def test_conv_transpose_kernel_equal_stride_matches_float64(shape, M, K, dtype, bias, device):
    cls, version = lookup("ConvTranspose", "", 22)
    k = cls(KernelContext(device), version=version)
    rng = np.random.default_rng(7)
    x = rng.standard_normal(shape).astype(dtype)
    w = rng.standard_normal((shape[1], M, *K)).astype(dtype)
    b = rng.standard_normal(M).astype(dtype) if bias else None
    y = host_array(k(x, w, b, strides=K).array)
    N, _, H, W = shape
    want = np.einsum("nchw,cmab->nmhawb", x.astype(np.float64), w.astype(np.float64))
    want = want.reshape(N, M, K[0] * H, K[1] * W) + (0 if b is None else b.astype(np.float64)[:, None, None])
    assert y.dtype == dtype and y.shape == want.shape
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(y, want, rtol=tol, atol=tol)


def test_conv_transpose_tap_grid_applies_to_unet_shapes_only():
    from gpukernels.kernels.nn import conv_transpose as ct

    x = np.ones((2, 32, 12, 12), np.float32)
    w = np.ones((32, 16, 2, 2), np.float32)
    assert ct._tap_grid_applies(x, w, 1, [2, 2], [1, 1], [0, 0, 0, 0], [24, 24])
    assert not ct._tap_grid_applies(x, w, 1, [2, 2], [1, 1], [1, 1, 1, 1], [22, 22])
    assert not ct._tap_grid_applies(x, w, 2, [2, 2], [1, 1], [0, 0, 0, 0], [24, 24])
    assert not ct._tap_grid_applies(x, w[..., :1], 1, [2, 2], [1, 1], [0, 0, 0, 0], [24, 24])
