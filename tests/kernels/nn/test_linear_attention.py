"""LinearAttention: recurrent and chunked algorithms vs a float64 per-token reference."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from gpukernels.errors import KernelInputError, KernelTypeError
from gpukernels.kernels import KernelContext
from gpukernels.kernels.nn.linear_attention import LinearAttention

RULES = ("linear", "gated", "delta", "gated_delta")


def naive(q, k, v, past=None, decay=None, beta=None, *, hq, hkv, rule, scale=0.0):
    """Obviously-correct float64 loops over batch, query head and token."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    B, T, _ = q.shape
    dk = q.shape[2] // hq
    dv = v.shape[2] // hkv
    grp = hq // hkv
    sc = scale if scale else 1 / np.sqrt(dk)
    out = np.zeros((B, T, hq * dv))
    states = np.zeros((B, hkv, dk, dv))
    for b in range(B):
        for h in range(hkv):
            S = np.zeros((dk, dv)) if past is None else np.asarray(past, np.float64)[b, h].copy()
            for t in range(T):
                kt = k[b, t, h * dk:(h + 1) * dk]
                vt = v[b, t, h * dv:(h + 1) * dv]
                if rule in ("gated", "gated_delta"):
                    d = np.asarray(decay, np.float64)[b, t]
                    a = np.exp(d[h * dk:(h + 1) * dk]) if d.size == hkv * dk else np.exp(d[h])
                    S = (S.T * a).T if np.ndim(a) else S * a
                if rule in ("delta", "gated_delta"):
                    bb = np.asarray(beta, np.float64)[b, t]
                    be = bb[h] if bb.size == hkv else bb[0]
                    vt = be * (vt - S.T @ kt)
                S = S + np.outer(kt, vt)
                for g in range(grp):
                    j = h * grp + g
                    out[b, t, j * dv:(j + 1) * dv] = sc * (q[b, t, j * dk:(j + 1) * dk] @ S)
            states[b, h] = S
    return out, states


def make(rng, B, T, hq, hkv, dk, dv, rule, per_key=True, beta_one=False, past=True, decay_scale=0.1):
    q = rng.standard_normal((B, T, hq * dk)).astype(np.float32)
    k = rng.standard_normal((B, T, hkv, dk))
    k = (k / np.linalg.norm(k, axis=-1, keepdims=True)).reshape(B, T, hkv * dk).astype(np.float32)
    v = rng.standard_normal((B, T, hkv * dv)).astype(np.float32)
    ps = rng.standard_normal((B, hkv, dk, dv)).astype(np.float32) * 0.5 if past else None
    decay = beta = None
    if rule in ("gated", "gated_delta"):
        decay = (-np.abs(rng.standard_normal((B, T, hkv * dk if per_key else hkv))) * decay_scale).astype(np.float32)
    if rule in ("delta", "gated_delta"):
        beta = rng.uniform(0.05, 1.0, (B, T, 1 if beta_one else hkv)).astype(np.float32)
    return q, k, v, ps, decay, beta


def kernel(device, mode="auto", **opts):
    return LinearAttention(KernelContext(device, options={"linear_attention_mode": mode, **opts}))


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("per_key", [True, False])
@pytest.mark.parametrize("mode", ["recurrent", "chunked"])
def test_rules_vs_naive(device, rng, rule, per_key, mode):
    B, T, hq, hkv, dk, dv = 2, 37, 4, 2, 8, 6
    q, k, v, ps, decay, beta = make(rng, B, T, hq, hkv, dk, dv, rule, per_key=per_key)
    ref_o, ref_s = naive(q, k, v, ps, decay, beta, hq=hq, hkv=hkv, rule=rule)
    res = kernel(device, mode)(q, k, v, ps, decay, beta, chunk_size=8, q_num_heads=hq, kv_num_heads=hkv,
                               update_rule=rule)
    np.testing.assert_allclose(res.output.numpy(), ref_o, rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(res.present_state.numpy(), ref_s, rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("chunk", [1, 5, 16, 64, 200])
def test_chunked_matches_recurrent(device, rng, rule, chunk):
    B, T, hq, hkv, dk, dv = 1, 70, 6, 3, 16, 8
    q, k, v, ps, decay, beta = make(rng, B, T, hq, hkv, dk, dv, rule, beta_one=True)
    args = dict(chunk_size=chunk, q_num_heads=hq, kv_num_heads=hkv, update_rule=rule)
    a = kernel(device, "recurrent")(q, k, v, ps, decay, beta, **args)
    b = kernel(device, "chunked")(q, k, v, ps, decay, beta, **args)
    np.testing.assert_allclose(b.output.numpy(), a.output.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(b.present_state.numpy(), a.present_state.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rule", ["gated", "gated_delta"])
def test_strong_per_key_decay_uses_stable_form(device, rng, rule):
    # cumulative decays far beyond float32's exp range inside one chunk
    B, T, hq, hkv, dk, dv = 1, 40, 2, 1, 4, 4
    q, k, v, ps, decay, beta = make(rng, B, T, hq, hkv, dk, dv, rule, decay_scale=6.0)
    ref_o, ref_s = naive(q, k, v, ps, decay, beta, hq=hq, hkv=hkv, rule=rule)
    res = kernel(device, "chunked")(q, k, v, ps, decay, beta, chunk_size=32, q_num_heads=hq, kv_num_heads=hkv,
                                    update_rule=rule)
    assert np.all(np.isfinite(res.output.numpy()))
    np.testing.assert_allclose(res.output.numpy(), ref_o, rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(res.present_state.numpy(), ref_s, rtol=2e-4, atol=2e-4)


def test_segments_bound_memory(device, rng):
    # a tiny segment budget forces several segments; the result must not change
    B, T, hq, hkv, dk, dv = 1, 50, 2, 2, 8, 8
    q, k, v, ps, decay, beta = make(rng, B, T, hq, hkv, dk, dv, "gated_delta")
    args = dict(chunk_size=4, q_num_heads=hq, kv_num_heads=hkv)
    a = kernel(device, "chunked")(q, k, v, ps, decay, beta, **args)
    b = kernel(device, "chunked", linear_attention_segment_bytes=1)(q, k, v, ps, decay, beta, **args)
    np.testing.assert_allclose(b.output.numpy(), a.output.numpy(), rtol=1e-5, atol=1e-5)


def test_defaults_scale_and_no_past(device, rng):
    B, T, hq, hkv, dk, dv = 2, 3, 2, 2, 4, 4
    q, k, v, _, decay, beta = make(rng, B, T, hq, hkv, dk, dv, "gated_delta", past=False)
    ref_o, ref_s = naive(q, k, v, None, decay, beta, hq=hq, hkv=hkv, rule="gated_delta", scale=0.3)
    res = kernel(device)(q, k, v, None, decay, beta, q_num_heads=hq, kv_num_heads=hkv, scale=0.3)
    np.testing.assert_allclose(res.output.numpy(), ref_o, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(res.present_state.numpy(), ref_s, rtol=1e-5, atol=1e-5)
    assert res.present_state.numpy().dtype == np.float32


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("mode", ["recurrent", "chunked"])
def test_half_types(device, rng, dtype, mode):
    B, T, hq, hkv, dk, dv = 1, 20, 2, 1, 8, 8
    q, k, v, ps, decay, beta = make(rng, B, T, hq, hkv, dk, dv, "gated_delta")
    cast = [a.astype(dtype) for a in (q, k, v, decay, beta)]
    ps32 = ps  # state kept in float32 (S may differ from T)
    ref_o, ref_s = naive(cast[0], cast[1], cast[2], ps32, cast[3], cast[4], hq=hq, hkv=hkv, rule="gated_delta")
    res = kernel(device, mode)(cast[0], cast[1], cast[2], ps32, cast[3], cast[4], chunk_size=8, q_num_heads=hq,
                               kv_num_heads=hkv)
    assert res.output.numpy().dtype == np.dtype(dtype)
    assert res.present_state.numpy().dtype == np.float32
    tol = 1e-2 if dtype == np.float16 else 2e-2
    np.testing.assert_allclose(res.output.numpy().astype(np.float64), ref_o, rtol=tol, atol=tol)
    np.testing.assert_allclose(res.present_state.numpy(), ref_s, rtol=1e-4, atol=1e-4)


def test_half_state_without_past_takes_query_type(device, rng):
    q, k, v, _, decay, beta = make(rng, 1, 4, 2, 2, 4, 4, "gated_delta", past=False)
    res = kernel(device)(q.astype(np.float16), k.astype(np.float16), v.astype(np.float16), None,
                         decay.astype(np.float16), beta.astype(np.float16), q_num_heads=2, kv_num_heads=2)
    assert res.present_state.numpy().dtype == np.float16


def test_empty_sequence(device, rng):
    q = np.zeros((2, 0, 8), np.float32)
    ps = rng.standard_normal((2, 2, 4, 4)).astype(np.float32)
    res = kernel(device)(q, q, q, ps, update_rule="linear", q_num_heads=2, kv_num_heads=2)
    assert res.output.shape == (2, 0, 8)
    np.testing.assert_array_equal(res.present_state.numpy(), ps)


@pytest.mark.parametrize("rule", ["gated", "gated_delta"])
@pytest.mark.parametrize("per_key", [True, False])
@pytest.mark.parametrize("B,T", [(0, 3), (2, 0)])
@pytest.mark.parametrize("mode", ["recurrent", "chunked"])
@pytest.mark.parametrize("past", [True, False])
def test_gated_rules_with_empty_batch_or_sequence(device, rng, rule, per_key, B, T, mode, past):
    # the decay reshape used -1, which is ambiguous when B or T is 0 (ValueError)
    q, k, v, ps, decay, beta = make(rng, B, T, 2, 1, 4, 3, rule, per_key=per_key, past=past)
    res = kernel(device, mode)(q, k, v, ps, decay, beta, update_rule=rule, q_num_heads=2, kv_num_heads=1)
    assert res.output.shape == (B, T, 2 * 3)
    want = ps if past else np.zeros((B, 1, 4, 3), np.float32)
    np.testing.assert_array_equal(res.present_state.numpy(), want)


def test_inputs_not_modified(device, rng):
    q, k, v, ps, decay, beta = make(rng, 1, 30, 2, 2, 4, 4, "gated_delta")
    copies = [a.copy() for a in (q, k, v, ps, decay, beta)]
    kernel(device, "chunked")(q, k, v, ps, decay, beta, q_num_heads=2, kv_num_heads=2, chunk_size=8)
    kernel(device, "recurrent")(q, k, v, ps, decay, beta, q_num_heads=2, kv_num_heads=2)
    for a, c in zip((q, k, v, ps, decay, beta), copies):
        np.testing.assert_array_equal(a, c)


def test_bad_inputs(device, rng):
    K = kernel(device)
    q, k, v, ps, decay, beta = make(rng, 1, 4, 4, 2, 4, 4, "gated_delta")
    with pytest.raises(KernelInputError, match="LinearAttention.*multiple"):
        K(q, k, v, ps, decay, beta, q_num_heads=4, kv_num_heads=3)
    with pytest.raises(KernelInputError, match="past_state"):
        K(q, k, v, ps[:, :, :3], decay, beta, q_num_heads=4, kv_num_heads=2)
    with pytest.raises(KernelInputError, match="needs the decay"):
        K(q, k, v, ps, None, beta, q_num_heads=4, kv_num_heads=2)
    with pytest.raises(KernelInputError, match="takes no beta"):
        K(q, k, v, ps, decay, beta, q_num_heads=4, kv_num_heads=2, update_rule="gated")
    with pytest.raises(KernelInputError, match="update_rule"):
        K(q, k, v, ps, decay, beta, q_num_heads=4, kv_num_heads=2, update_rule="fancy")
    with pytest.raises(KernelInputError, match="required"):
        K(q, k, v, ps, decay, beta)
    with pytest.raises(KernelInputError, match="3-D"):
        K(q[0], k[0], v[0], ps, decay, beta, q_num_heads=4, kv_num_heads=2)
    with pytest.raises(KernelInputError, match="decay must have shape"):
        K(q, k, v, ps, decay[..., :3], beta, q_num_heads=4, kv_num_heads=2)
    with pytest.raises(KernelInputError, match="beta must have shape"):
        K(q, k, v, ps, decay, np.concatenate([beta, beta], -1), q_num_heads=4, kv_num_heads=2)
    with pytest.raises(KernelTypeError, match="LinearAttention"):
        K(q.astype(np.float64), k, v, ps, decay, beta, q_num_heads=4, kv_num_heads=2)
