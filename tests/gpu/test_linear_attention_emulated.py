"""LinearAttention's CUDA kernels (cuda/linear_attention.cu + gpukernels/gpu/linear_attention.py)
run in the CPU emulator against the kernel class's array path and a float64 recurrence."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from gpukernels.gpu import linear_attention as gpu_la
from gpukernels.gpu import parity
from gpukernels.host import tuning as table
from gpukernels.kernels.nn.linear_attention import LinearAttention
from tests.gpu.emu_harness import check_op

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


CHUNKED = {"linear_attention_mode": "chunked"}


def _check_chunked(emu, case, rule, Hq, Hkv, dtype, tags, scale=0.0):
    q, k, v, s0, decay, beta = case
    attrs = dict(update_rule=rule, q_num_heads=Hq, kv_num_heads=Hkv, scale=scale)
    r = RTOL.get(dtype)
    got, _ = check_op(LinearAttention, emu, (q, k, v, s0, decay, beta), attrs, rtol=r, atol=r, tags=tags,
                      options=CHUNKED)
    dk = q.shape[2] // Hq
    want_out, want_state = reference(q, k, v, s0, decay, beta, rule, Hq, Hkv, scale or 1 / math.sqrt(dk))
    assert parity.compare(got[0].numpy(), want_out, got[0].data_type, r, r, what="output vs float64") is None
    assert parity.compare(got[1].numpy(), want_state, got[1].data_type, r, r, what="state vs float64") is None


@pytest.mark.parametrize("mode", ["chunked", "recurrent"])
@pytest.mark.parametrize("rule", ["linear", "gated", "delta", "gated_delta"])
@pytest.mark.parametrize("past", [True, False])
def test_la_empty_sequence_every_mode_and_rule(emu, rng, mode, rule, past):
    # T = 0: no kernel runs; present_state must be past_state (or zeros).  The chunked path
    # used to return its uninitialised (poisoned) state buffer; the gated rules' array path
    # raised on a reshape
    case = make_case(rng, "float16", rule, T=0, past=past, per_key=True)
    attrs = dict(update_rule=rule, q_num_heads=4, kv_num_heads=2)
    got, _ = check_op(LinearAttention, emu, case, attrs, tags=("T=0", mode, rule),
                      options={"linear_attention_mode": mode})
    want = case[3] if past else np.zeros((2, 2, 8, 12), np.float16)
    np.testing.assert_array_equal(got[1].numpy(), want)
    assert got[0].shape == (2, 0, 4 * 12)


@pytest.mark.parametrize("rule,per_key", [("linear", False), ("delta", False), ("gated", False), ("gated", True),
                                           ("gated_delta", False), ("gated_delta", True)])
def test_la_chunked_rules(emu, rng, rule, per_key):
    case = make_case(rng, "float32", rule, B=1, T=70, Hq=4, Hkv=2, dk=8, dv=36, per_key=per_key)
    _check_chunked(emu, case, rule, 4, 2, "float32",
                   ("chunked", rule, "per-key decay" if per_key else "per-head decay", "T=70 (3 chunks)"))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_la_chunked_half_types_no_past(emu, rng, dtype):
    case = make_case(rng, dtype, "gated_delta", B=2, T=33, Hq=2, Hkv=1, dk=6, dv=8, beta_shared=True, past=False)
    _check_chunked(emu, case, "gated_delta", 2, 1, dtype, ("chunked", dtype, "no past", "beta (B,T,1)"))


def test_la_chunked_segments(emu, rng, tuning):
    # a tiny workspace forces one chunk per segment: the state crosses launches
    tuning({"linear_attention.cuda_workspace_bytes": 1})
    case = make_case(rng, "float32", "delta", B=1, T=65, Hq=1, Hkv=1, dk=4, dv=4)
    _check_chunked(emu, case, "delta", 1, 1, "float32", ("chunked", "segmented workspace"))


def test_la_auto_mode_picks_chunked_for_long_sequences(emu, rng):
    T = table.value("linear_attention.cuda_recurrent_max_t") + 1
    case = make_case(rng, "float32", "gated", B=1, T=T, Hq=1, Hkv=1, dk=4, dv=8)
    import emulator

    before = sum(n for (s, e), n in emulator.LAUNCHES.items() if "chunk_state" in e)
    _check(emu, case, "gated", 1, 1, "float32", ("auto -> chunked",))
    assert sum(n for (s, e), n in emulator.LAUNCHES.items() if "chunk_state" in e) > before


@pytest.mark.parametrize("expr", gpu_la.expressions())
def test_la_every_instantiation_runs(emu, rng, expr):
    import emulator

    ctype = expr[expr.index("<") + 1:-1].split(",")[0].strip()
    dtype = {"float": "float32", "__half": "float16", "__nv_bfloat16": "bfloat16"}[ctype]
    if expr.startswith("gk_la_recurrent"):
        R = int(expr[:-1].split(",")[1])
        dk, T, opts = 4 * R - (1 if R > 1 else 0), 2, {"linear_attention_mode": "recurrent"}
    else:
        dk, T, opts = 12, 34, CHUNKED
    case = make_case(rng, dtype, "gated_delta", B=1, T=T, Hq=2, Hkv=1, dk=dk, dv=8, per_key=True)
    before = dict(emulator.LAUNCHES)
    q, k, v, s0, decay, beta = case
    r = RTOL.get(dtype)
    check_op(LinearAttention, emu, (q, k, v, s0, decay, beta),
             dict(update_rule="gated_delta", q_num_heads=2, kv_num_heads=1), rtol=r, atol=r, options=opts,
             tags=("instantiation sweep",))
    launched = {e for (src, e), n in emulator.LAUNCHES.items() if n != before.get((src, e), 0)}
    assert expr in launched
