"""Attention's CUDA kernels (cuda/attention.cu + gpukernels/gpu/attention.py) run in the CPU
emulator, compared with the kernel class's array path and with a float64 reference, with the
tolerances of gpukernels.gpu.parity (the same as on a GPU)."""

from __future__ import annotations

import importlib

import ml_dtypes
import numpy as np
import pytest

import emulator
from gpukernels.dtypes import DataType
from gpukernels.gpu import attention as gpu_attention
from gpukernels.gpu import parity
from gpukernels.kernels.base import KernelContext
from gpukernels.kernels.nn.attention import Attention
from gpukernels.tensor import Tensor
from tests.reference.attention import attention_4d as reference
from tests.reference.attention import full_kv, make_qkv, to3d

DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
NEG_INF = -np.inf


# ---------------------------------------------------------------------- harness
def _emulated(emu, opset, requested, splits):
    kernel = Attention(KernelContext("cpu", opset=opset))
    kernel.requested_outputs = requested
    kernel.cuda_calls = []

    def cuda_path(**arguments):
        wants = tuple(kernel.wants_output(i) for i in range(4))
        result = emulator.run_op(gpu_attention.run, emu, wants=wants, splits=splits, **arguments)
        kernel.cuda_calls.append(result)
        return result

    kernel.cuda_path = cuda_path
    return kernel


def check(emu, inputs: dict, attrs: dict, *, opset=None, requested=(True, True, True, False), splits=None,
          ref=None, tags=(), expect_cuda=True):
    """Run the CUDA path (emulated) and the array path; compare all outputs; compare Y with
    the float64 reference ref (4-D) when given."""
    cpu = Attention(KernelContext("cpu", opset=opset))
    cpu.requested_outputs = requested
    want = cpu(**inputs, **attrs)
    k = _emulated(emu, opset, requested, splits)
    got = k(**inputs, **attrs)
    covered = bool(k.cuda_calls) and k.cuda_calls[-1] is not None
    assert covered == expect_cuda, f"CUDA path coverage {covered}, expected {expect_cuda}"
    if covered:
        emulator.tag("Attention", *tags)
    for idx, (g, w) in enumerate(zip(got, want)):
        if w is None:
            assert g is None or not requested[idx]
            continue
        assert g.data_type == w.data_type
        if idx in (1, 2):  # present key/value: exact copies
            np.testing.assert_array_equal(np.asarray(g.numpy()).view(np.uint8),
                                          np.ascontiguousarray(w.numpy()).view(np.uint8))
            continue
        msg = parity.compare(g.numpy(), w.numpy(), w.data_type, what=f"output {idx} vs array path")
        assert msg is None, f"{attrs} {tags}: {msg}"
    if ref is not None:
        y = got[0].numpy()
        if y.ndim == 3:  # (B, Sq, Hq*Dv) -> 4-D
            B, Sq, _ = y.shape
            y = y.reshape(B, Sq, ref.shape[1], ref.shape[3]).transpose(0, 2, 1, 3)
        msg = parity.compare(y, ref, got[0].data_type, what="Y vs float64 reference")
        assert msg is None, f"{attrs} {tags}: {msg}"
    return got, want


def make(rng, dtype, **shape):
    return make_qkv(rng, DTYPES[dtype], **shape)


# ---------------------------------------------------------------------- cases
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("rank", [4, 3])
def test_plain_gqa(emu, rng, dtype, rank):
    q, k, v, _, _ = make(rng, dtype, B=2, Hq=4, Hkv=2, Sq=19, Skv=70, D=16)
    attrs = {}
    inputs = dict(Q=q, K=k, V=v)
    if rank == 3:
        inputs = dict(Q=to3d(q), K=to3d(k), V=to3d(v))
        attrs = dict(q_num_heads=4, kv_num_heads=2)
    check(emu, inputs, attrs, ref=reference(q, k, v), tags=(dtype, f"rank{rank}", "GQA"))


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_causal_with_past_and_present(emu, rng, dtype):
    q, k, v, pk, pv = make(rng, dtype, B=2, Hq=2, Hkv=1, Sq=6, Skv=6, D=24, P=60)
    got, _ = check(emu, dict(Q=q, K=k, V=v, past_key=pk, past_value=pv), dict(is_causal=1),
                   ref=reference(q, full_kv(k, pk), full_kv(v, pv), causal=1, offset=[60, 60]),
                   tags=(dtype, "causal", "past", "MQA"))
    assert got[1].shape == (2, 1, 66, 24)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_causal_prefill_multiblock(emu, rng, dtype):
    # more query rows than one block holds: several row blocks, diagonal and skipped tiles
    q, k, v, _, _ = make(rng, dtype, B=1, Hq=2, Hkv=2, Sq=80, Skv=80, D=32)
    check(emu, dict(Q=q, K=k, V=v), dict(is_causal=1), ref=reference(q, k, v, causal=1),
          tags=(dtype, "causal", "multi-block"))


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("form", ["bool2d", "bool4d", "float3d_short", "float4d_bcast", "typed", "int8",
                                  "scalar", "fully_masked_rows"])
def test_masks(emu, rng, dtype, form):
    B, Hq, Hkv, Sq, Skv, D = 2, 4, 2, 7, 40, 16
    q, k, v, pk, pv = make(rng, dtype, B=B, Hq=Hq, Hkv=Hkv, Sq=Sq, Skv=Skv, D=D, P=10)
    T = Skv + 10
    if form == "bool2d":
        mask = rng.random((Sq, T)) < 0.7
    elif form == "bool4d":
        mask = rng.random((B, Hq, Sq, T)) < 0.7
    elif form == "float3d_short":  # (Hq, Sq, T - 13): padded with -inf
        mask = rng.standard_normal((Hq, Sq, T - 13)).astype(np.float32)
    elif form == "float4d_bcast":
        mask = rng.standard_normal((B, 1, 1, T)).astype(np.float32)
        mask[0, 0, 0, 5:9] = -np.inf
    elif form == "typed":  # the input type (half types read natively by the kernel)
        mask = rng.standard_normal((1, Hq, Sq, T)).astype(DTYPES[dtype])
    elif form == "int8":
        mask = rng.integers(-3, 3, (Sq, T)).astype(np.int8)
    elif form == "scalar":
        mask = np.array(-1.5, dtype=np.float32)
    else:
        mask = rng.random((B, Hq, Sq, T)) < 0.6
        mask[0, 1, 3, :] = False
        mask[1, :, 0, :] = False
    ref = reference(q, full_kv(k, pk), full_kv(v, pv), mask=mask, offset=[10, 10])
    got, _ = check(emu, dict(Q=q, K=k, V=v, attn_mask=mask, past_key=pk, past_value=pv), {}, ref=ref,
                   tags=(dtype, f"mask {form}"))
    if form == "fully_masked_rows":
        y = got[0].numpy().astype(np.float64)
        assert np.all(y[0, 1, 3] == 0) and np.all(y[1, :, 0] == 0)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("D,Dv", [(12, 20), (10, 18)])
def test_softcap_scale_dv(emu, rng, dtype, D, Dv):
    # head sizes not multiples of 8 / of 4 (scalar loads), Dv != D, explicit scale, softcap
    q, k, v, _, _ = make(rng, dtype, B=1, Hq=3, Hkv=3, Sq=9, Skv=33, D=D, Dv=Dv)
    attrs = dict(scale=0.37, softcap=2.5)
    check(emu, dict(Q=q, K=k, V=v), attrs, ref=reference(q, k, v, scale=0.37, softcap=2.5),
          tags=(dtype, "softcap", "scale", f"D={D} Dv={Dv}"))


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("splits", [None, 3])
def test_decode_split_kv(emu, rng, dtype, splits):
    # one query token, 4 q heads on 1 kv head, a long cache: split-KV + combine
    q, k, v, pk, pv = make(rng, dtype, B=2, Hq=4, Hkv=1, Sq=1, Skv=1, D=32, P=300)
    ref = reference(q, full_kv(k, pk), full_kv(v, pv), causal=1, offset=[300, 300])
    check(emu, dict(Q=q, K=k, V=v, past_key=pk, past_value=pv), dict(is_causal=1), ref=ref, splits=splits,
          requested=(True, False, False, False), tags=(dtype, "decode split-KV"))


def test_decode_split_chooses_splits(emu):
    # the launcher splits by itself when few blocks would run
    assert gpu_attention._choose_splits(emu, blocks=2, ntiles=5) > 1
    assert gpu_attention._choose_splits(emu, blocks=1000, ntiles=100) == 1


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("causal", [0, 1])
def test_nonpad_kv_seqlen(emu, rng, dtype, causal):
    q, k, v, _, _ = make(rng, dtype, B=3, Hq=2, Hkv=1, Sq=4, Skv=50, D=16)
    nonpad = np.array([50, 17, 2], dtype=np.int64)  # the last: causal rows before the frontier are empty
    ref = reference(q, k, v, causal=causal, offset=nonpad - 4, kvlen=nonpad)
    check(emu, dict(Q=q, K=k, V=v, nonpad_kv_seqlen=nonpad), dict(is_causal=causal), opset=24, ref=ref,
          tags=(dtype, "nonpad_kv_seqlen", "causal" if causal else "full"))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_window_opset25(emu, rng, dtype):
    q, k, v, pk, pv = make(rng, dtype, B=1, Hq=2, Hkv=1, Sq=8, Skv=8, D=16, P=70)
    ref = reference(q, full_kv(k, pk), full_kv(v, pv), causal=1, offset=[70], left=20, right=3)
    check(emu, dict(Q=q, K=k, V=v, past_key=pk, past_value=pv), dict(is_causal=1, left_window_size=20,
          right_window_size=3), opset=25, ref=ref, tags=(dtype, "window"))


@pytest.mark.parametrize("dtype,D,Sq", [("float32", 96, 17), ("float32", 128, 1), ("float32", 256, 17),
                                        ("float32", 256, 1), ("float16", 128, 17), ("float16", 128, 1),
                                        ("float16", 256, 17), ("float16", 200, 1), ("bfloat16", 128, 17),
                                        ("bfloat16", 128, 1), ("bfloat16", 200, 17), ("bfloat16", 256, 1)])
def test_large_heads(emu, rng, dtype, D, Sq):
    # every head-size bound (DMAX 128, 256) in the prefill and the decode configuration
    q, k, v, _, _ = make(rng, dtype, B=1, Hq=1, Hkv=1, Sq=Sq, Skv=40, D=D)
    causal = int(Sq > 1)
    check(emu, dict(Q=q, K=k, V=v), dict(is_causal=causal), ref=reference(q, k, v, causal=causal),
          tags=(dtype, f"D={D}", "decode" if Sq == 1 else "prefill"))


def test_rank3_past_present(emu, rng):
    q, k, v, pk, pv = make(rng, "float16", B=1, Hq=4, Hkv=2, Sq=3, Skv=3, D=8, P=5)
    inputs = dict(Q=to3d(q), K=to3d(k), V=to3d(v), past_key=pk, past_value=pv)
    ref = reference(q, full_kv(k, pk), full_kv(v, pv), causal=1, offset=[5])
    check(emu, inputs, dict(is_causal=1, q_num_heads=4, kv_num_heads=2), ref=ref,
          tags=("float16", "rank3", "past"))


def test_empty_cache(emu, rng):
    # no keys at all: every row is dead -> zeros
    q, k, v, _, _ = make(rng, "float32", B=1, Hq=2, Hkv=1, Sq=3, Skv=0, D=8)
    got, _ = check(emu, dict(Q=q, K=k, V=v), {}, tags=("float32", "no keys"))
    assert np.all(got[0].numpy() == 0)


# ---------------------------------------------------------------------- not covered
def test_not_covered_cases(emu, rng):
    q, k, v, _, _ = make(rng, "float32", B=1, Hq=2, Hkv=1, Sq=3, Skv=5, D=8)
    # the qk output is written by the array path
    check(emu, dict(Q=q, K=k, V=v), {}, requested=(True, True, True, True), expect_cuda=False)
    # a 16-bit softmax precision
    check(emu, dict(Q=q, K=k, V=v), dict(softmax_precision=int(DataType.FLOAT16)), expect_cuda=False)
    # double inputs
    q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
    check(emu, dict(Q=q64, K=k64, V=v64), {}, expect_cuda=False)
    # head size beyond 256
    q2, k2, v2, _, _ = make(rng, "float32", B=1, Hq=1, Hkv=1, Sq=2, Skv=3, D=264)
    check(emu, dict(Q=q2, K=k2, V=v2), {}, expect_cuda=False)


def test_declared_instantiations_exist():
    exprs = gpu_attention.expressions()
    assert len(exprs) == len(set(exprs))
    mod = importlib.import_module("gpukernels.gpu.accelerated")
    assert mod._MODULES["Attention"] == "gpukernels.gpu.attention"


def test_host_validation(emu, rng):
    from gpukernels.errors import CudaKernelError

    q, k, v, pk, pv = make(rng, "float32", B=1, Hq=2, Hkv=1, Sq=3, Skv=5, D=8, P=4)
    base = dict(Q=Tensor(q), K=Tensor(k), V=Tensor(v), q_num_heads=2, kv_num_heads=1, scale=0.3)
    with pytest.raises(CudaKernelError, match="inconsistent shapes"):
        emulator.run_op(gpu_attention.run, emu, **{**base, "V": Tensor(v[:, :, :4])})
    with pytest.raises(CudaKernelError, match="past_key"):
        emulator.run_op(gpu_attention.run, emu, **base, past_key=Tensor(pk[..., :6]), past_value=Tensor(pv))
    with pytest.raises(CudaKernelError, match="does not broadcast"):
        emulator.run_op(gpu_attention.run, emu, **base, attn_mask=Tensor(np.zeros((3, 3, 5), np.float32)))
    with pytest.raises(CudaKernelError, match="exceeds the total kv length"):
        emulator.run_op(gpu_attention.run, emu, **base, attn_mask=Tensor(np.zeros((3, 6), np.float32)))
