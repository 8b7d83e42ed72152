"""Benchmark cases for Attention, RotaryEmbedding, LinearAttention and LSTM.

Imported by bench_nn_ops.py; ``CASES`` is a list of harness.Case.  Inputs are fixed
(seeded) so every runtime sees the same data.  ``flops`` counts multiply-adds as two
operations for the dominant matrix products (the causal case counts the full square,
as implementations that skip masked blocks are then visibly faster).
"""

from __future__ import annotations

import numpy as np

from harness import Case, single_node_model

_rng = np.random.default_rng(2024)


def _randn(*shape, dtype=np.float32):
    return _rng.standard_normal(shape).astype(dtype)


def _attention_cases() -> list[Case]:
    cases = []
    B, H, S, D = 1, 8, 512, 64
    feeds = {"Q": _randn(B, H, S, D), "K": _randn(B, H, S, D), "V": _randn(B, H, S, D)}
    flops = 4.0 * B * H * S * S * D
    for causal in (0, 1):
        model = single_node_model("Attention", feeds, {"is_causal": causal}, n_outputs=1, opset=23)
        cases.append(Case(f"Attention {B}x{H}x{S}x{D}{' causal' if causal else ''}", model, dict(feeds),
                          flops=flops))
    # decode: 32 query heads, 8 kv heads, one new token, 2048 cached, head 128
    Hq, Hkv, P, D = 32, 8, 2048, 128
    inputs = {"Q": _randn(1, Hq, 1, D), "K": _randn(1, Hkv, 1, D), "V": _randn(1, Hkv, 1, D), "attn_mask": None,
              "past_key": _randn(1, Hkv, P, D), "past_value": _randn(1, Hkv, P, D)}
    model = single_node_model("Attention", inputs, {"is_causal": 1}, n_outputs=3, opset=23)
    feeds = {k: v for k, v in inputs.items() if v is not None}
    cases.append(Case(f"Attention decode q{Hq}/kv{Hkv} past {P} d{D}", model, feeds,
                      flops=4.0 * Hq * (P + 1) * D))
    return cases


def _rotary_case() -> Case:
    B, H, S, D = 1, 32, 512, 128
    ang = _rng.uniform(0, 2 * np.pi, (S, D // 2))
    feeds = {"X": _randn(B, H, S, D), "cos_cache": np.cos(ang).astype(np.float32),
             "sin_cache": np.sin(ang).astype(np.float32),
             "position_ids": np.arange(S, dtype=np.int64).reshape(1, S)}
    model = single_node_model("RotaryEmbedding", feeds, {}, n_outputs=1, opset=23)
    return Case(f"RotaryEmbedding {B}x{H}x{S}x{D}", model, feeds, flops=3.0 * B * H * S * D)


def _linear_attention_case() -> Case:
    B, T, H, d = 1, 512, 8, 128
    k = _randn(B, T, H, d)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    feeds = {"query": _randn(B, T, H * d), "key": k.reshape(B, T, H * d).astype(np.float32),
             "value": _randn(B, T, H * d), "past_state": None,
             "decay": (-np.abs(_randn(B, T, H)) * 0.1).astype(np.float32),
             "beta": _rng.uniform(0.1, 0.9, (B, T, H)).astype(np.float32)}
    model = single_node_model("LinearAttention", feeds,
                              {"q_num_heads": H, "kv_num_heads": H, "update_rule": "gated_delta"},
                              n_outputs=2, opset=27)
    feeds = {n: v for n, v in feeds.items() if v is not None}
    # per token and head: retrieve S^T k, rank-1 update, read q^T S -> 3 products of d x d
    return Case(f"LinearAttention gated_delta B{B} T{T} H{H} d{d}", model, feeds, flops=6.0 * B * T * H * d * d)


def _lstm_case() -> Case:
    S, N, I, Hd = 128, 16, 256, 256
    feeds = {"X": _randn(S, N, I)}
    inits = {"W": _randn(1, 4 * Hd, I) * 0.05, "R": _randn(1, 4 * Hd, Hd) * 0.05, "B": _randn(1, 8 * Hd) * 0.05}
    model = single_node_model("LSTM", feeds, {"hidden_size": Hd}, n_outputs=3, opset=22, initializers=inits)
    return Case(f"LSTM seq {S} batch {N} in {I} hidden {Hd}", model, feeds, flops=2.0 * S * N * (I + Hd) * 4 * Hd)


CASES: list[Case] = [*_attention_cases(), _rotary_case(), _linear_attention_case(), _lstm_case()]


if __name__ == "__main__":
    from harness import parse_args, run_cases

    args = parse_args("Attention / RoPE / LinearAttention / LSTM")
    chosen = [c for c in CASES if args.filter in c.name]
    run_cases("nn attention-family ops", chosen, repeat=args.repeat, min_time=args.min_time, device=args.device)
