"""LinearAttention (opset 27): linear attention with a recurrent state.

Per KV head the state S (d_k x d_v) evolves per token t as

    linear:       S = S + k v^T
    gated:        S = diag(a) S + k v^T                         a = exp(decay_t)
    delta:        S = S + beta k (v - S^T k)^T
    gated_delta:  S = diag(a) S + beta k (v - (diag(a) S)^T k)^T

and o_t = scale * q_t^T S_t for each of the q_num_heads / kv_num_heads query heads that
share the KV head (query head j reads KV head j // group).  decay is per head (B, T, H_kv)
or per key dimension (B, T, H_kv * d_k); beta is (B, T, H_kv) or (B, T, 1).

Two exact algorithms compute this:

* the recurrence, one step per token (used for short inputs, T <= 16, and decode);
* the chunked form: tokens are cut into chunks of ``chunk_size``; inside a chunk the
  delta rules' pseudo-values U solve a unit lower-triangular system (the UT / WY
  transform, U = (I + A)^-1 beta (V - diag(b) K S0)), every chunk's intra-chunk parts are
  computed at once with batched matrix products, and a short loop over chunks carries
  the state.  Per-key-dimension decays are factorised as (x * e^G_t)(y * e^-G_s)^T when
  the in-chunk cumulative decay is small enough for float32, else formed pairwise.

``ctx.options['linear_attention_mode']`` = 'auto' (default) | 'recurrent' | 'chunked'
forces one algorithm.  Choices: decay is required by, and only allowed with, the gated
rules; beta likewise with the delta rules.  Computation is in float32 (the allowed
types are float, float16 and bfloat16); present_state has past_state's element type, or
query's when past_state is absent.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ...host import tuning
from ...tensor import Tensor
from ..base import KernelBase, register

_RULES = ("linear", "gated", "delta", "gated_delta")
_FACTOR_LIMIT = 20.0  # max |cumulative log-decay| inside a chunk for the factorised form
_SEGMENT_BYTES = 64 << 20


@register()
class LinearAttention(KernelBase):
    class Result(NamedTuple):
        output: Tensor
        present_state: Tensor | None

    def __call__(self, query, key, value, past_state=None, decay=None, beta=None, chunk_size=64,
                 kv_num_heads=None, q_num_heads=None, scale=0.0, update_rule="gated_delta"):
        q = self.tensor(query, "query")
        k = self.tensor(key, "key")
        v = self.tensor(value, "value")
        ps = self.tensor(past_state, "past_state", optional=True)
        dc = self.tensor(decay, "decay", optional=True)
        bt = self.tensor(beta, "beta", optional=True)
        self.check_inputs(q, k, v, ps, dc, bt)
        p = self._validate(q, k, v, ps, dc, bt, chunk_size, kv_num_heads, q_num_heads, scale, update_rule)

        fast = self.cuda_path(query=q, key=k, value=v, past_state=ps, decay=dc, beta=bt,
                              chunk_size=p["chunk"], kv_num_heads=p["Hkv"], q_num_heads=p["Hq"],
                              scale=p["scale"], update_rule=p["rule"])
        if fast is not None:
            return fast

        mode = self.ctx.option("linear_attention_mode", "auto")
        if mode not in ("auto", "recurrent", "chunked"):
            raise self.error(f"context option linear_attention_mode must be 'auto', 'recurrent' or "
                             f"'chunked', got {mode!r}")
        arrays = self._unpack(p, q, k, v, ps, dc, bt)
        if mode == "recurrent" or (mode == "auto" and p["T"] <= tuning.value("linear_attention.recurrent_max_t")):
            out, state = self._recurrent(p, *arrays)
        else:
            out, state = self._chunked(p, *arrays)
        B, T, Hq, dv = p["B"], p["T"], p["Hq"], p["dv"]
        y = self.from_compute(out.transpose(0, 3, 1, 2, 4).reshape(B, T, Hq * dv), q.data_type)
        st = None
        if self.wants_output(1):
            st = self.from_compute(state, ps.data_type if not ps.is_absent else q.data_type)
        return self.Result(y, st)

    # ------------------------------------------------------------------ validation
    def _validate(self, q, k, v, ps, dc, bt, chunk_size, kv_num_heads, q_num_heads, scale, update_rule):
        shapes = dict(query=q, key=k, value=v, past_state=ps, decay=dc, beta=bt)
        rule = update_rule.decode() if isinstance(update_rule, bytes) else str(update_rule)
        if rule not in _RULES:
            raise self.error(f"update_rule must be one of {_RULES}, got {rule!r}")
        if q_num_heads is None or kv_num_heads is None:
            raise self.error("the q_num_heads and kv_num_heads attributes are required")
        Hq, Hkv = int(q_num_heads), int(kv_num_heads)
        if Hq <= 0 or Hkv <= 0 or Hq % Hkv:
            raise self.error(f"q_num_heads ({Hq}) must be a positive multiple of kv_num_heads ({Hkv})",
                             **shapes)
        chunk = int(chunk_size)
        if chunk <= 0:
            raise self.error(f"chunk_size must be positive, got {chunk}")
        if q.ndim != 3 or k.ndim != 3 or v.ndim != 3:
            raise self.error("query, key and value must be 3-D (B, T, H*D)", **shapes)
        B, T = q.shape[:2]
        if k.shape[:2] != (B, T) or v.shape[:2] != (B, T):
            raise self.error("query, key and value must share batch and sequence sizes", **shapes)
        if q.shape[2] % Hq:
            raise self.error(f"query's last dimension {q.shape[2]} is not divisible by q_num_heads={Hq}",
                             **shapes)
        dk = q.shape[2] // Hq
        if k.shape[2] != Hkv * dk:
            raise self.error(f"key's last dimension must be kv_num_heads * d_k = {Hkv * dk}", **shapes)
        if v.shape[2] % Hkv:
            raise self.error(f"value's last dimension {v.shape[2]} is not divisible by kv_num_heads={Hkv}",
                             **shapes)
        dv = v.shape[2] // Hkv
        if not ps.is_absent and ps.shape != (B, Hkv, dk, dv):
            raise self.error(f"past_state must have shape (B, H_kv, d_k, d_v) = ({B}, {Hkv}, {dk}, {dv})",
                             **shapes)
        gated = rule in ("gated", "gated_delta")
        delta = rule in ("delta", "gated_delta")
        if gated and dc.is_absent:
            raise self.error(f"update_rule {rule!r} needs the decay input", **shapes)
        if not gated and not dc.is_absent:
            raise self.error(f"update_rule {rule!r} takes no decay input", **shapes)
        if delta and bt.is_absent:
            raise self.error(f"update_rule {rule!r} needs the beta input", **shapes)
        if not delta and not bt.is_absent:
            raise self.error(f"update_rule {rule!r} takes no beta input", **shapes)
        if not dc.is_absent and (dc.ndim != 3 or dc.shape[:2] != (B, T) or dc.shape[2] not in (Hkv, Hkv * dk)):
            raise self.error(f"decay must have shape (B, T, H_kv) or (B, T, H_kv * d_k) = ({B}, {T}, {Hkv}) "
                             f"or ({B}, {T}, {Hkv * dk})", **shapes)
        if not bt.is_absent and (bt.ndim != 3 or bt.shape[:2] != (B, T) or bt.shape[2] not in (Hkv, 1)):
            raise self.error(f"beta must have shape (B, T, H_kv) or (B, T, 1) = ({B}, {T}, {Hkv}) or "
                             f"({B}, {T}, 1)", **shapes)
        sc = float(scale or 0.0)
        if sc == 0.0:
            sc = 1.0 / math.sqrt(dk) if dk > 0 else 1.0
        return dict(rule=rule, Hq=Hq, Hkv=Hkv, G=Hq // Hkv, chunk=chunk, B=B, T=T, dk=dk, dv=dv, scale=sc,
                    gated=gated, delta=delta)

    def _unpack(self, p, q, k, v, ps, dc, bt):
        """q (B,Hkv,G,T,dk), k (B,Hkv,T,dk), v (B,Hkv,T,dv), S0 (B,Hkv,dk,dv) copy,
        g (B,Hkv,T,dk|1) or None, beta (B,Hkv|1,T,1) or None -- all float32."""
        xp = self.xp
        B, T, Hq, Hkv, G, dk, dv = p["B"], p["T"], p["Hq"], p["Hkv"], p["G"], p["dk"], p["dv"]
        f32 = np.float32
        qa = self.to_compute(q, f32).reshape(B, T, Hkv, G, dk).transpose(0, 2, 3, 1, 4)
        ka = self.to_compute(k, f32).reshape(B, T, Hkv, dk).transpose(0, 2, 1, 3)
        va = self.to_compute(v, f32).reshape(B, T, Hkv, dv).transpose(0, 2, 1, 3)
        if ps.is_absent:
            s0 = xp.zeros((B, Hkv, dk, dv), dtype=f32)
        else:
            s0 = self.to_compute(ps, f32).copy()
        g = None
        if not dc.is_absent:
            d = self.to_compute(dc, f32)
            width = d.shape[2] // Hkv  # dk or 1 (explicit: -1 is ambiguous when B or T is 0)
            g = d.reshape(B, T, Hkv, width).transpose(0, 2, 1, 3)  # (B, Hkv, T, dk|1)
        be = None
        if not bt.is_absent:
            b_ = self.to_compute(bt, f32)
            be = b_.transpose(0, 2, 1)[..., None]  # (B, Hkv|1, T, 1)
        return qa, ka, va, s0, g, be

    # ------------------------------------------------------------------ recurrence
    def _recurrent(self, p, qa, ka, va, S, g, be):
        xp = self.xp
        B, T, Hkv, G, dv = p["B"], p["T"], p["Hkv"], p["G"], p["dv"]
        out = xp.empty((B, Hkv, G, T, dv), dtype=np.float32)
        a = xp.exp(g) if g is not None else None
        sc = np.float32(p["scale"])
        for t in range(T):
            if a is not None:
                S = S * a[:, :, t, :, None]
            kt = ka[:, :, t]  # (B, Hkv, dk)
            u = va[:, :, t]  # (B, Hkv, dv)
            if be is not None:
                retrieved = xp.matmul(kt[:, :, None, :], S)[:, :, 0, :]
                u = be[:, :, t] * (u - retrieved)
            S = S + kt[..., :, None] * u[..., None, :]
            out[:, :, :, t] = xp.matmul(qa[:, :, :, t], S) * sc
        return out, S

    # ------------------------------------------------------------------ chunked
    def _chunked(self, p, qa, ka, va, S, g, be):
        xp = self.xp
        B, T, Hkv, G, dk, dv = p["B"], p["T"], p["Hkv"], p["G"], p["dk"], p["dv"]
        C = min(p["chunk"], max(T, 1))
        out = xp.empty((B, Hkv, G, T, dv), dtype=np.float32)
        # memory per token of a segment: the (C x C) matrices and the factor copies
        per_token = B * Hkv * (G + 2) * (C + dk + dv) * 4 * 2
        if g is not None and g.shape[-1] > 1:
            per_token += B * Hkv * C * dk * 4  # possible pairwise decay products
        seg_chunks = max(1, int(self.ctx.option("linear_attention_segment_bytes", _SEGMENT_BYTES))
                         // max(per_token * C, 1))
        seg = seg_chunks * C
        for t0 in range(0, T, seg):
            t1 = min(T, t0 + seg)
            S = self._segment(p, C, qa[:, :, :, t0:t1], ka[:, :, t0:t1], va[:, :, t0:t1], S,
                              None if g is None else g[:, :, t0:t1], None if be is None else be[:, :, t0:t1],
                              out, t0)
        return out, S

    def _segment(self, p, C, q, k, v, S, g, be, out, t0):
        """Process tokens [t0, t0 + len) in chunks of C; writes out, returns the new state."""
        xp = self.xp
        f32 = np.float32
        B, Hkv, G, dk, dv = p["B"], p["Hkv"], p["G"], p["dk"], p["dv"]
        L = k.shape[2]
        n = -(-L // C)
        pad = n * C - L

        def chunks(x, axis_t):  # pad the time axis with zeros and split it into (n, C)
            if pad:
                widths = [(0, 0)] * x.ndim
                widths[axis_t] = (0, pad)
                x = xp.pad(x, widths)
            shape = x.shape[:axis_t] + (n, C) + x.shape[axis_t + 1:]
            return x.reshape(shape)

        qc = chunks(q, 3)  # (B, H, G, n, C, dk)
        kc = chunks(k, 2)  # (B, H, n, C, dk)
        vc = chunks(v, 2)  # (B, H, n, C, dv)
        gam = None
        if g is not None:
            gam = xp.cumsum(chunks(g, 2), axis=3)  # (B, H, n, C, dk|1), in-chunk cumulative log decay
        incl = xp.tril(xp.ones((C, C), dtype=bool))
        strict = xp.tril(xp.ones((C, C), dtype=bool), -1)
        factor_ok = True
        if gam is not None and gam.shape[-1] > 1 and gam.size:
            factor_ok = float(xp.max(xp.abs(gam))) <= _FACTOR_LIMIT

        # decayed products M[t, s] = sum_d x_t[d] y_s[d] exp(gam_t[d] - gam_s[d]), masked
        def decayed(x, y, gx, gy, mask):
            if gam is None:
                m = xp.matmul(x, xp.swapaxes(y, -1, -2))
            elif gam.shape[-1] == 1:
                m = xp.matmul(x, xp.swapaxes(y, -1, -2))
                diff = gx - xp.swapaxes(gy, -1, -2)  # (.., C, C)
                with np.errstate(over="ignore"):
                    m = m * xp.exp(xp.where(mask, diff, -np.inf))
            elif factor_ok:
                m = xp.matmul(x * xp.exp(gx), xp.swapaxes(y * xp.exp(-gy), -1, -2))
            else:
                diff = gx[..., :, None, :] - gy[..., None, :, :]  # (.., C, C, dk)
                diff = xp.where(mask[..., None], diff, -np.inf)
                m = xp.sum(x[..., :, None, :] * y[..., None, :, :] * xp.exp(diff), axis=-1)
            return xp.where(mask, m, f32(0))

        # intra-chunk parts (all chunks at once)
        if p["delta"]:
            bc = chunks(be, 2)  # (B, H|1, n, C, 1)
            A = decayed(kc, kc, gam, gam, strict) * bc  # (B, H, n, C, C), strictly lower
            eye = xp.eye(C, dtype=f32)
            Mi = eye + A
            kb = kc * xp.exp(gam) if gam is not None else kc
            rhs = xp.concatenate([bc * vc, bc * kb], axis=-1)  # (B, H, n, C, dv + dk)
            sol = xp.linalg.solve(Mi, rhs)
            U0, Wm = sol[..., :dv], sol[..., dv:]  # U = U0 - Wm @ S0
        else:
            U0, Wm = vc, None
        gq = gam[:, :, None] if gam is not None else None
        Mqk = decayed(qc, kc[:, :, None], gq, gq, incl)  # (B, H, G, n, C, C)
        qb = qc * xp.exp(gq) if gq is not None else qc  # (B, H, G, n, C, dk)
        if gam is not None:
            last = gam[:, :, :, -1:, :]  # (B, H, n, 1, dk|1)
            kd = kc * xp.exp(last - gam)  # k_s * exp(gam_C - gam_s)
            bC = xp.exp(last[:, :, :, 0, :])[..., None]  # (B, H, n, dk|1, 1)
        else:
            kd, bC = kc, None
        kdT = xp.swapaxes(kd, -1, -2)  # (B, H, n, dk, C)

        # the chunk-to-chunk recurrence
        starts = xp.empty((B, Hkv, n, dk, dv), dtype=f32)
        Us = xp.empty((B, Hkv, n, C, dv), dtype=f32) if Wm is not None else U0
        for c in range(n):
            starts[:, :, c] = S
            if Wm is not None:
                U = U0[:, :, c] - xp.matmul(Wm[:, :, c], S)
                Us[:, :, c] = U
            else:
                U = U0[:, :, c]
            upd = xp.matmul(kdT[:, :, c], U)
            S = (S * bC[:, :, c] if bC is not None else S) + upd
        # outputs: o = scale * ((q * b) S_start + Mqk U)
        o = xp.matmul(qb, starts[:, :, None]) + xp.matmul(Mqk, Us[:, :, None])  # (B, H, G, n, C, dv)
        o *= f32(p["scale"])
        out[:, :, :, t0:t0 + L] = o.reshape(B, Hkv, G, n * C, dv)[:, :, :, :L]
        return S
