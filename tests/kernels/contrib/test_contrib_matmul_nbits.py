"""MatMulNBits against onnxruntime (random packed weights, every zero-point form, bits 2/4/8)
and on a model quantized by onnxruntime.quantization's MatMulNBitsQuantizer."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from gpukernels.errors import KernelInputError, KernelTypeError
from gpukernels.kernels import KernelContext, load_all
from gpukernels.kernels.contrib.quantization import MatMulNBits

from tests.ort_reference import compare, run_gk, run_ort

load_all()


def _weights(rng, N, K, bits, bs, zp_kind, dtype=np.float32):
    kb = -(-K // bs)
    B = rng.integers(0, 256, (N, kb, bs * bits // 8)).astype(np.uint8)
    scales = (rng.random((N, kb)) * 0.1 + 0.01).astype(dtype)
    zp = {"none": None, "packed": rng.integers(0, 256, (N, -(-kb * bits // 8))).astype(np.uint8),
          "float": (rng.random((N, kb)) * (1 << bits)).astype(dtype)}[zp_kind]
    return B, scales, zp


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("zp_kind", ["none", "packed", "float"])
@pytest.mark.parametrize("K,N,bs", [(64, 8, 16), (72, 5, 32), (128, 3, 128)])
def test_matmul_nbits_vs_ort(device, rng, bits, zp_kind, K, N, bs):
    if bits == 8 and zp_kind == "float":
        pytest.skip("onnxruntime refuses unpacked zero points with 8 bits")
    B, scales, zp = _weights(rng, N, K, bits, bs, zp_kind)
    A = rng.standard_normal((2, 3, K)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    compare("MatMulNBits", [("A", A), ("B", B), ("scales", scales), ("zp", zp), ("g", None), ("bias", bias)],
            {"K": K, "N": N, "bits": bits, "block_size": bs}, device=device, rtol=1e-4, atol=1e-4,
            initializers=("B", "scales", "zp", "bias"))


def test_matmul_nbits_float16_flat_scales_2d(device, rng):
    K, N, bs = 48, 6, 16
    B, scales, zp = _weights(rng, N, K, 4, bs, "packed", np.float16)
    A = rng.standard_normal((5, K)).astype(np.float16)
    compare("MatMulNBits", [("A", A), ("B", B), ("scales", scales.reshape(-1)), ("zp", zp)],
            {"K": K, "N": N, "bits": 4, "block_size": bs}, device=device, rtol=5e-3, atol=5e-3,
            initializers=("B", "scales", "zp"))


def test_matmul_nbits_empty_weight_gives_bias(device, rng):
    k = MatMulNBits(KernelContext(device))
    A = rng.standard_normal((2, 32)).astype(np.float32)
    bias = rng.standard_normal(4).astype(np.float32)
    y = k(A, np.zeros((4, 0, 8), np.uint8), np.zeros((0,), np.float32), None, None, bias, K=32, N=4,
          block_size=16).numpy()
    np.testing.assert_array_equal(y, np.broadcast_to(bias, (2, 4)))


def test_matmul_nbits_errors(device, rng):
    k = MatMulNBits(KernelContext(device))
    B, scales, zp = _weights(rng, 4, 32, 4, 16, "packed")
    A = rng.standard_normal((2, 32)).astype(np.float32)
    attrs = {"K": 32, "N": 4, "block_size": 16}
    with pytest.raises(KernelInputError, match=r"B must be \(N, k_blocks, blob_size\) = \(4, 2, 8\)"):
        k(A, B[:, :1], scales, **attrs)
    with pytest.raises(KernelInputError, match="A's last dimension must be K = 32"):
        k(A[:, :16], B, scales, **attrs)
    with pytest.raises(KernelInputError, match="bits must be 2, 4 or 8"):
        k(A, B, scales, bits=3, **attrs)
    with pytest.raises(KernelInputError, match="block_size must be a power of two"):
        k(A, B, scales, K=32, N=4, block_size=24)
    with pytest.raises(KernelInputError, match="scales must hold"):
        k(A, B, scales[:, :1], **attrs)
    with pytest.raises(KernelInputError, match="packed zero_points"):
        k(A, B, scales, zp[:2], **attrs)
    with pytest.raises(KernelInputError, match="required"):
        k(A, B, scales, K=32, N=4)
    with pytest.raises(KernelTypeError, match="B"):
        k(A, B.astype(np.int8), scales, **attrs)
    with pytest.raises(KernelInputError, match="g_idx"):
        k(A, B, scales, None, np.zeros(32, np.int32), **attrs)


def test_model_quantized_by_onnxruntime(tmp_path, rng):
    """A two-MatMul model quantized to 4 bits by MatMulNBitsQuantizer runs end to end."""
    quantizer_mod = pytest.importorskip("onnxruntime.quantization.matmul_nbits_quantizer")
    K, H, N = 64, 96, 32
    w1 = rng.standard_normal((K, H)).astype(np.float32) * 0.2
    w2 = rng.standard_normal((H, N)).astype(np.float32) * 0.2
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", K])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", N])],
                              initializer=[numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    q = quantizer_mod.MatMulNBitsQuantizer(model, block_size=32, is_symmetric=False)
    q.process()
    qmodel = q.model.model
    assert {n.op_type for n in qmodel.graph.node} >= {"MatMulNBits"}
    x = rng.standard_normal((7, K)).astype(np.float32)
    want = run_ort(qmodel, {"x": x})[0]
    got = run_gk(qmodel, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    onnx.checker.check_model(qmodel)
