"""Attention in float64."""

from __future__ import annotations

import numpy as np


def to4d(x, heads):
    b, s, hd = x.shape
    return x.reshape(b, s, heads, hd // heads).transpose(0, 2, 1, 3)


def attention(Q, K, V, mask=None, past_k=None, past_v=None, nonpad=None, *, scale=None, causal=0, softcap=0.0,
          hq=None, hkv=None, left=-1, right=-1):
    """Y, present_k, present_v and the qk values of modes 0-3, float64, one query row and one
    key at a time (3-D inputs: hq/hkv heads)."""
    rank = Q.ndim
    Q, K, V = (np.asarray(a, np.float64) for a in (Q, K, V))
    if rank == 3:
        Q, K, V = to4d(Q, hq), to4d(K, hkv), to4d(V, hkv)
    P = 0
    if past_k is not None:
        P = past_k.shape[2]
        K = np.concatenate([np.asarray(past_k, np.float64), K], 2)
        V = np.concatenate([np.asarray(past_v, np.float64), V], 2)
    B, Hq, Sq, D = Q.shape
    Hkv, T, Dv = K.shape[1], K.shape[2], V.shape[3]
    grp = Hq // Hkv
    sc = 1 / np.sqrt(D) if scale is None else scale
    m4 = None
    if mask is not None:
        m = np.asarray(mask)
        if m.ndim and m.shape[-1] < T:
            padv = False if m.dtype == bool else -np.inf
            m = np.concatenate([m.astype(np.float64) if m.dtype != bool else m,
                                np.full(m.shape[:-1] + (T - m.shape[-1],), padv)], -1)
        m4 = np.broadcast_to(m, (B, Hq, Sq, T))
    Y = np.zeros((B, Hq, Sq, Dv))
    modes = [np.zeros((B, Hq, Sq, T)) for _ in range(4)]
    for b in range(B):
        off = P if past_k is not None else (int(nonpad[b]) - Sq if nonpad is not None else 0)
        for h in range(Hq):
            kh = h // grp
            for i in range(Sq):
                raw = np.array([Q[b, h, i] @ K[b, kh, j] * sc for j in range(T)])
                capped = softcap * np.tanh(raw / softcap) if softcap > 0 else raw
                bias = np.zeros(T)
                for j in range(T):
                    if m4 is not None:
                        mv = m4[b, h, i, j]
                        bias[j] += (0.0 if mv else -np.inf) if m4.dtype == bool else float(mv)
                    pos = i + off
                    if causal and j > pos:
                        bias[j] = -np.inf
                    if left >= 0 and j < pos - left:
                        bias[j] = -np.inf
                    if right >= 0 and j > pos + right:
                        bias[j] = -np.inf
                    if nonpad is not None and j >= nonpad[b]:
                        bias[j] = -np.inf
                s = capped + bias
                if T == 0 or np.all(np.isneginf(bias)):
                    prob = np.zeros(T)
                else:
                    e = np.exp(s - s.max())
                    prob = e / e.sum()
                Y[b, h, i] = prob @ V[b, kh]
                modes[0][b, h, i], modes[1][b, h, i], modes[2][b, h, i], modes[3][b, h, i] = raw, capped, s, prob
    if rank == 3:
        Y = Y.transpose(0, 2, 1, 3).reshape(B, Sq, Hq * Dv)
    return Y, K, V, modes


def attention_heads(Q, K, V, past_k=None, past_v=None, causal=0, scale=None):
    """float64 Y, one (batch, query head) at a time, stable softmax; 4-D inputs.  The
    causal frontier: query i sees key j iff j <= i + past length."""
    Q, K, V = (np.asarray(a, np.float64) for a in (Q, K, V))
    P = 0 if past_k is None else past_k.shape[2]
    if past_k is not None:
        K = np.concatenate([np.asarray(past_k, np.float64), K], 2)
        V = np.concatenate([np.asarray(past_v, np.float64), V], 2)
    B, Hq, Sq, D = Q.shape
    Hkv, T = K.shape[1], K.shape[2]
    G = Hq // Hkv
    sc = 1 / np.sqrt(D) if scale is None else scale
    Y = np.zeros((B, Hq, Sq, V.shape[3]))
    for b in range(B):
        for hq in range(Hq):
            s = Q[b, hq] @ K[b, hq // G].T * sc
            if causal:
                i = np.arange(Sq)[:, None] + P
                s = np.where(np.arange(T)[None, :] <= i, s, -np.inf)
            e = np.exp(s - s.max(axis=1, keepdims=True))
            Y[b, hq] = (e / e.sum(axis=1, keepdims=True)) @ V[b, hq // G]
    return Y


def attention_4d(q4, k4, v4, *, mask=None, causal=0, offset=None, kvlen=None, left=-1, right=-1, scale=None,
              softcap=0.0):
    """Y (B, Hq, Sq, Dv) in float64 from the operator's definition.  k4/v4 hold every key
    (past included); mask is the user's mask array (bool or numeric), offset/kvlen per batch."""
    q, k, v = (a.astype(np.float64) for a in (q4, k4, v4))
    B, Hq, Sq, D = q.shape
    Hkv, T = k.shape[1], k.shape[2]
    G = Hq // Hkv
    scale = 1 / np.sqrt(D) if scale is None else scale
    add = np.zeros((B, Hq, Sq, T))
    if mask is not None:
        m = np.where(mask, 0.0, -np.inf) if mask.dtype == np.bool_ else mask.astype(np.float32).astype(np.float64)
        if m.ndim and m.shape[-1] < T:
            m = np.concatenate([m, np.full(m.shape[:-1] + (T - m.shape[-1],), -np.inf)], axis=-1)
        add = add + m.reshape((1,) * (4 - m.ndim) + m.shape)
    y = np.zeros((B, Hq, Sq, v.shape[3]))
    for b in range(B):
        off = 0 if offset is None else offset[b]
        n = T if kvlen is None else kvlen[b]
        for h in range(Hq):
            s = scale * q[b, h] @ k[b, h // G].T
            if softcap > 0:
                s = softcap * np.tanh(s / softcap)
            bias = add[b, h].copy()
            for i in range(Sq):
                for j in range(T):
                    d = i + off - j
                    ok = j < n
                    if causal:
                        ok &= d >= 0
                    if left >= 0:
                        ok &= d <= left
                    if right >= 0:
                        ok &= -d <= right
                    if not ok:
                        bias[i, j] = -np.inf
            s = s + bias
            for i in range(Sq):
                if np.all(np.isneginf(bias[i])):
                    continue
                p = np.exp(s[i] - s[i].max())
                y[b, h, i] = (p / p.sum()) @ v[b, h // G]
    return y


def make_qkv(rng, t, B=2, Hq=4, Hkv=2, Sq=5, Skv=70, D=16, Dv=None, P=0):
    """Random 4-D q (B, Hq, Sq, D), k, v (B, Hkv, Skv, D/Dv) of element type t, and past
    key/value of P positions (None when P is 0)."""
    Dv = D if Dv is None else Dv
    q = rng.standard_normal((B, Hq, Sq, D)).astype(t)
    k = rng.standard_normal((B, Hkv, Skv, D)).astype(t)
    v = rng.standard_normal((B, Hkv, Skv, Dv)).astype(t)
    pk = rng.standard_normal((B, Hkv, P, D)).astype(t) if P else None
    pv = rng.standard_normal((B, Hkv, P, Dv)).astype(t) if P else None
    return q, k, v, pk, pv


def to3d(a):
    """(B, H, S, D) -> the operator's 3-D layout (B, S, H * D)."""
    B, H, S, D = a.shape
    return np.ascontiguousarray(a.transpose(0, 2, 1, 3).reshape(B, S, H * D))


def full_kv(k, pk):
    """Every key of a call: the past ones (pk, or None) then the new ones."""
    return k if pk is None else np.concatenate([pk, k], axis=2)
