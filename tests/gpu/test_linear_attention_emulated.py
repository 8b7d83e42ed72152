"""LinearAttention's CUDA kernels (cuda/linear_attention.cu + gpukernels/gpu/linear_attention.py)
run in the CPU emulator against the kernel class's array path and a float64 recurrence."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from emu_harness import check_op
from gpukernels.gpu import linear_attention as gpu_la
from gpukernels.gpu import parity
from gpukernels.kernels.nn.linear_attention import LinearAttention
from gpukernels.tensor import Tensor

DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
# The kernels and the array path sum in different orders (and the chunked forms solve a
# triangular system): float32 agreement is to a few ulps of the running state.
RTOL = {"float32": 1e-4}


def reference(q, k, v, s0, decay, beta, rule, Hq, Hkv, scale):
    """float64 recurrence straight from the operator's definition."""
    B, T, _ = q.shape
    dk = q.shape[2] // Hq
    dv = v.shape[2] // Hkv
    G = Hq // Hkv
    q = q.astype(np.float64).reshape(B, T, Hq, dk)
    k = k.astype(np.float64).reshape(B, T, Hkv, dk)
    v = v.astype(np.float64).reshape(B, T, Hkv, dv)
    S = np.zeros((B, Hkv, dk, dv)) if s0 is None else s0.astype(np.float64).copy()
    out = np.zeros((B, T, Hq, dv))
    for b in range(B):
        for h in range(Hkv):
            for t in range(T):
                if rule in ("gated", "gated_delta"):
                    d = decay[b, t].astype(np.float64)
                    a = np.exp(d[h * dk:(h + 1) * dk] if d.size == Hkv * dk else d[h])
                    S[b, h] = S[b, h] * (a[:, None] if np.ndim(a) else a)
                u = v[b, t, h]
                if rule in ("delta", "gated_delta"):
                    bb = beta[b, t].astype(np.float64)
                    bt = bb[h] if bb.size == Hkv else bb[0]
                    u = bt * (u - S[b, h].T @ k[b, t, h])
                S[b, h] = S[b, h] + np.outer(k[b, t, h], u)
                for j in range(G):
                    out[b, t, h * G + j] = scale * (q[b, t, h * G + j] @ S[b, h])
    return out.reshape(B, T, Hq * dv), S


def make_case(rng, dtype, rule, B=2, T=5, Hq=4, Hkv=2, dk=8, dv=12, per_key=False, beta_shared=False,
              past=True, state_dtype=None):
    t = DTYPES[dtype]
    q = (rng.standard_normal((B, T, Hq * dk)) * 0.5).astype(t)
    k = rng.standard_normal((B, T, Hkv, dk))
    k = (k / np.linalg.norm(k, axis=-1, keepdims=True)).reshape(B, T, Hkv * dk).astype(t)
    v = rng.standard_normal((B, T, Hkv * dv)).astype(t)
    s0 = (rng.standard_normal((B, Hkv, dk, dv)) * 0.3).astype(DTYPES[state_dtype or dtype]) if past else None
    decay = None
    if rule in ("gated", "gated_delta"):
        decay = rng.uniform(-0.5, -0.01, (B, T, Hkv * dk if per_key else Hkv)).astype(t)
    beta = None
    if rule in ("delta", "gated_delta"):
        beta = rng.uniform(0.1, 0.9, (B, T, 1 if beta_shared else Hkv)).astype(t)
    return q, k, v, s0, decay, beta


def _check(emu, case, rule, Hq, Hkv, dtype, tags, scale=0.0):
    q, k, v, s0, decay, beta = case
    attrs = dict(update_rule=rule, q_num_heads=Hq, kv_num_heads=Hkv, scale=scale)
    got, _ = check_op(LinearAttention, emu, (q, k, v, s0, decay, beta), attrs, rtol=RTOL.get(dtype),
                      atol=RTOL.get(dtype), tags=tags)
    dk = q.shape[2] // Hq
    want_out, want_state = reference(q, k, v, s0, decay, beta, rule, Hq, Hkv, scale or 1 / math.sqrt(dk))
    dt = got[0].data_type
    r = RTOL.get(dtype)
    assert parity.compare(got[0].numpy(), want_out, dt, r, r, what="output vs float64") is None
    assert parity.compare(got[1].numpy(), want_state, got[1].data_type, r, r, what="state vs float64") is None
    return got


@pytest.mark.parametrize("rule", ["linear", "gated", "delta", "gated_delta"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_la_recurrent_rules(emu, rng, rule, dtype):
    case = make_case(rng, dtype, rule)
    _check(emu, case, rule, 4, 2, dtype, ("recurrent", rule, dtype, "GQA 4/2", "past_state"))


@pytest.mark.parametrize("rule", ["gated", "gated_delta"])
def test_la_recurrent_per_key_decay_shared_beta(emu, rng, rule):
    case = make_case(rng, "float32", rule, Hq=2, per_key=True, beta_shared=True, past=False)
    _check(emu, case, rule, 2, 2, "float32", ("recurrent", rule, "per-key decay", "beta (B,T,1)", "no past"))


@pytest.mark.parametrize("dk,dv", [(1, 3), (5, 8), (16, 20), (128, 8)])
def test_la_recurrent_head_sizes(emu, rng, dk, dv):
    case = make_case(rng, "float32", "gated_delta", B=1, T=3, Hq=3, Hkv=1, dk=dk, dv=dv, per_key=True)
    _check(emu, case, "gated_delta", 3, 1, "float32", ("recurrent", f"dk={dk} dv={dv}", "MQA 3/1"), scale=0.7)


def test_la_recurrent_mixed_state_type(emu, rng):
    case = make_case(rng, "float16", "delta", state_dtype="bfloat16")
    got = _check(emu, case, "delta", 4, 2, "float16", ("recurrent", "float16 x / bfloat16 state"))
    assert got[1].numpy().dtype == ml_dtypes.bfloat16


def test_la_decode_step(emu, rng):
    case = make_case(rng, "bfloat16", "gated_delta", B=3, T=1, Hq=8, Hkv=2, dk=16, dv=16)
    _check(emu, case, "gated_delta", 8, 2, "bfloat16", ("recurrent", "decode T=1"))


def test_la_empty_sequence(emu, rng):
    case = make_case(rng, "float32", "linear", T=0)
    got = _check(emu, case, "linear", 4, 2, "float32", ("T=0",))
    np.testing.assert_array_equal(got[1].numpy(), case[3])
