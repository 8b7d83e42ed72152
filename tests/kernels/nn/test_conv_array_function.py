"""Conv on the host without per-call validation and the 1x1 host path:

* ``Conv.array_function`` (what compiled graphs call): the same array as the kernel for
  depthwise, 1x1, dense, grouped, 1-D and 3-D convolutions, auto_pad, float32/float64,
  with and without a bias; no array function for float16 or on a GPU;
* ``_conv_host.pointwise`` (site Conv.pointwise) against a float64 reference: the bias
  inside the product (fewer input than output channels, planes of more than a few
  pixels) or added after, strides,
  batches, float64, non-contiguous inputs;
* a Session running Conv -> Clip -> HardSwish / Swish / Gelu compiled (array functions)
  gives what the uncompiled graph gives.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from tests.reference import conv as ref_conv

from gpukernels.kernels.base import KernelContext
from gpukernels.kernels.nn import _conv_host as conv_host
from gpukernels.kernels.nn.conv import Conv
from gpukernels.tensor import Tensor

# these tests check the host specialisations themselves (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("default_paths")

ATTRS = {"auto_pad": "NOTSET", "dilations": None, "group": 1, "kernel_shape": None, "pads": None,
         "strides": None}

AF_CASES = [
    # x shape, w shape, attributes
    ((2, 24, 9, 8), (24, 1, 3, 3), {"group": 24, "pads": [1, 1, 1, 1]}),
    ((2, 160, 3, 3), (160, 1, 3, 3), {"group": 160, "pads": [1, 1, 1, 1]}),
    ((1, 8, 7, 9), (16, 1, 3, 3), {"group": 8, "strides": [2, 1], "pads": [0, 1, 1, 0]}),
    ((2, 8, 6, 5), (24, 8, 1, 1), {}),
    ((1, 12, 9, 9), (4, 12, 1, 1), {"strides": [2, 2]}),
    ((2, 6, 10, 11), (5, 6, 3, 3), {"auto_pad": "SAME_UPPER"}),
    ((1, 8, 9, 9), (6, 4, 3, 2), {"group": 2, "dilations": [2, 1], "pads": [1, 0, 1, 1]}),
    ((2, 4, 30), (6, 4, 5), {"pads": [2, 2]}),
    ((1, 6, 20), (6, 1, 3), {"group": 6, "strides": [2]}),
    ((1, 3, 5, 6, 4), (4, 3, 3, 3, 3), {"pads": [1, 1, 1, 1, 1, 1]}),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("case", AF_CASES)
def test_array_function_equals_kernel(case, bias, dtype, rng):
    xs, ws, attrs = case
    x = rng.standard_normal(xs).astype(dtype)
    w = rng.standard_normal(ws).astype(dtype)
    b = rng.standard_normal(ws[0]).astype(dtype)
    k = Conv(KernelContext("cpu"))
    args = [x, w, b] if bias else [x, w]
    want = k(*args, **attrs).numpy()
    fn = k.array_function([Tensor(a) for a in args], {**ATTRS, **attrs})
    assert fn is not None
    for _ in range(2):  # planned once, called again
        got = fn(*args)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    # other values of the same shapes
    x2 = rng.standard_normal(xs).astype(dtype)
    np.testing.assert_array_equal(fn(x2, *args[1:]), k(x2, *args[1:], **attrs).numpy())


def test_no_array_function_for_half(device):
    x = np.ones((1, 2, 4, 4), np.float16)
    w = np.ones((2, 2, 1, 1), np.float16)
    k = Conv(KernelContext(device))
    assert k.array_function([k.tensor(x), k.tensor(w)], ATTRS) is None


def test_array_function_only_on_the_host(device):
    """On a GPU the hand-written CUDA kernel decides per call: no array function."""
    k = Conv(KernelContext(device))
    x, w = k.tensor(np.ones((1, 2, 4, 4), np.float32)), k.tensor(np.ones((2, 2, 1, 1), np.float32))
    assert (k.array_function([x, w], ATTRS) is None) == (device == "cuda")


POINTWISE_CASES = [
    # x shape, M, strides
    ((2, 8, 13, 11), 24, (1, 1)),  # C < M: the bias inside the product
    ((2, 4, 16, 15), 32, (2, 2)),  # the bias inside, the copy subsampling
    ((1, 32, 10, 9), 16, (2, 3)),  # C > M: the bias added after
    ((3, 5, 7, 1), 5, (1, 1)),     # C == M, one column, batch 3
    ((1, 3, 1, 1), 7, (2, 2)),     # one pixel
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", POINTWISE_CASES)
def test_pointwise_host_matches_reference(case, dtype, rng):
    xs, M, strides = case
    x = rng.standard_normal(xs).astype(dtype)
    w = rng.standard_normal((M, xs[1], 1, 1)).astype(dtype)
    b = rng.standard_normal(M).astype(dtype)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    O = [(xs[2] - 1) // strides[0] + 1, (xs[3] - 1) // strides[1] + 1]
    for bias in (b, None):
        want = ref_conv(x, w, bias, strides, (0, 0, 0, 0), (1, 1))
        got = conv_host.pointwise(x, w, bias, strides, O)
        assert got.dtype == dtype
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
        got = Conv(KernelContext("cpu"))(x, w, bias, strides=list(strides)).numpy()
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    # a non-contiguous input
    xn = rng.standard_normal(xs[:1] + (2 * xs[1],) + xs[2:]).astype(dtype)[:, ::2]
    np.testing.assert_allclose(conv_host.pointwise(xn, w, b, strides, O),
                               ref_conv(xn, w, b, strides, (0, 0, 0, 0), (1, 1)), rtol=tol, atol=tol)


def _cnn_block_model():
    """x -> Conv 1x1 (expand) -> Clip(0, 6) -> depthwise Conv -> HardSwish -> Conv 1x1 ->
    Swish -> Gelu -> Sigmoid -> HardSigmoid: the activations of mobile networks."""
    rng = np.random.default_rng(7)
    inits = [onnx.numpy_helper.from_array(a.astype(np.float32), n) for n, a in (
        ("w1", rng.standard_normal((48, 8, 1, 1)) * 0.5), ("b1", rng.standard_normal(48)),
        ("lo", np.array(0.0)), ("hi", np.array(6.0)),
        ("w2", rng.standard_normal((48, 1, 3, 3)) * 0.5), ("b2", rng.standard_normal(48)),
        ("w3", rng.standard_normal((16, 48, 1, 1)) * 0.3))]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"]),
             helper.make_node("Clip", ["c1", "lo", "hi"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], group=48, pads=[1, 1, 1, 1]),
             helper.make_node("HardSwish", ["c2"], ["h2"]),
             helper.make_node("Conv", ["h2", "w3"], ["c3"]),
             helper.make_node("Swish", ["c3"], ["s3"], alpha=1.5, domain=""),
             helper.make_node("Gelu", ["s3"], ["g3"]),
             helper.make_node("Sigmoid", ["g3"], ["q3"]),
             helper.make_node("HardSigmoid", ["q3"], ["y"], alpha=0.3, beta=0.4)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16, 6, 6])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 24)])


def test_compiled_graph_takes_array_functions_and_agrees():
    from gpukernels.runtime import Session

    model = _cnn_block_model()
    x = (np.random.default_rng(8).standard_normal((2, 8, 6, 6)) * 3).astype(np.float32)
    plain = Session(model, options={"compile_graph": False}).run(None, {"x": x})[0]
    sess = Session(model)
    for _ in range(3):  # the first run records, the next ones run compiled
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], plain)
    programs = [p for p in sess._compiled.programs.values() if p is not None]
    assert programs, "the graph was not compiled"
    kinds = [op[0] for op in programs[0].ops if op[0] != 4]
    assert kinds and 0 not in kinds, f"some nodes still go through their kernels: {kinds}"
