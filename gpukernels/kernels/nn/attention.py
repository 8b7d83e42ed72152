"""Attention (opsets 23, 24, 25): scaled dot-product attention.

Scores are ``scale * Q @ K^T`` (scale defaults to 1/sqrt(head_size)), soft-capped
(``softcap * tanh(s / softcap)`` when softcap > 0), then the additive bias is added
(attn_mask, the causal frontier, the opset-25 sliding window and the nonpad_kv_seqlen
padding), softmax runs over the keys, and the probabilities multiply V.  Everything is
batched matrix products, chunked over blocks of query rows so that at most about
``ctx.options['attention_block_bytes']`` (default 64 MiB) of scores live at once.
On the host, calls without padding, window, softcap or qk output (the common prefill
and decode cases, with or without attn_mask) take the specialisation "Attention.blocks"
(_HostAttention), a leaner schedule of the same softmax: exp with the scale folded into
Q, and the row max subtracted only where the unshifted sums overflow or underflow (the
reference always subtracts it).  In compiled graphs a one-output node runs as an array
function (Attention.array_function), validated once per input signature.

Choices where the spec leaves room:

* Masks: a BOOL mask selects (True = attend); every other mask type (float or integer)
  is added to the scores in the compute precision.  A mask whose last dimension is
  shorter than the total kv length is padded with -inf (False) -- also a last dimension
  of 1, as the spec's wording says "shorter" -- in every opset version.  Masks of rank
  0 to 4 broadcast right-aligned against (batch, q_num_heads, q_len, total_len).
* Causal frontier (bottom-right): query i sees key j iff j <= i + offset with
  offset = past_len (past_key given), nonpad_kv_seqlen[b] - q_len (external cache,
  opset 24+), else 0.  The window bounds of opset 25 use the same offset.
* A fully masked query row (the combined additive bias is -inf for every key) gives a
  zero output row and a zero row in the mode-3 qk output, as the 1.23 errata define;
  the decision is made on the bias, never on the (possibly NaN) logits.
* Half types compute in float32 (double stays double; a float/double mix computes in
  double) and round once.  softmax_precision=FLOAT16/BFLOAT16 rounds the softmax input
  and its result to that type; DOUBLE computes the softmax in float64.
* q_num_heads/kv_num_heads given with 4-D inputs must agree with the shapes.
* When past_key/past_value are absent, present_key/present_value are K and V (4-D).
* nonpad_kv_seqlen values must lie in [0, kv_sequence_length]; it cannot be combined
  with past_key (the spec's two cache use cases are exclusive).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ... import dtypes
from ...dtypes import DataType
from ...host import tuning
from ...tensor import Tensor
from ..base import KernelBase, register
from ..specialize import specialize

_SOFTMAX_PRECISIONS = {int(DataType.FLOAT), int(DataType.FLOAT16), int(DataType.DOUBLE),
                       int(DataType.BFLOAT16)}
_DEFAULT_BLOCK_BYTES = 64 << 20


@register()
class Attention(KernelBase):
    """Scaled dot-product attention; see the module docstring for the choices made."""

    class Result(NamedTuple):
        Y: Tensor
        present_key: Tensor | None = None
        present_value: Tensor | None = None
        qk_matmul_output: Tensor | None = None

    @dataclass
    class Attributes:
        is_causal: int = 0
        kv_num_heads: int | None = None
        q_num_heads: int | None = None
        qk_matmul_output_mode: int = 0
        scale: float | None = None
        softcap: float = 0.0
        softmax_precision: int | None = None
        left_window_size: int = -1  # opset 25
        right_window_size: int = -1  # opset 25

    def __call__(self, Q, K, V, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None,
                 is_causal=0, kv_num_heads=None, q_num_heads=None, qk_matmul_output_mode=0, scale=None,
                 softcap=0.0, softmax_precision=None, left_window_size=-1, right_window_size=-1) -> "Attention.Result":
        attrs = self.Attributes(is_causal=is_causal, kv_num_heads=kv_num_heads, q_num_heads=q_num_heads,
                                qk_matmul_output_mode=qk_matmul_output_mode, scale=scale, softcap=softcap,
                                softmax_precision=softmax_precision, left_window_size=left_window_size,
                                right_window_size=right_window_size)
        return self.run(attrs, Q, K, V, attn_mask=attn_mask, past_key=past_key, past_value=past_value,
                        nonpad_kv_seqlen=nonpad_kv_seqlen)

    # ------------------------------------------------------------------ main path
    def run(self, attributes: "Attention.Attributes | None", Q, K, V, attn_mask=None, past_key=None,
            past_value=None, nonpad_kv_seqlen=None) -> "Attention.Result":
        a = attributes if attributes is not None else self.Attributes()
        q = self.tensor(Q, "Q")
        k = self.tensor(K, "K")
        v = self.tensor(V, "V")
        mask = self.tensor(attn_mask, "attn_mask", optional=True)
        pk = self.tensor(past_key, "past_key", optional=True)
        pv = self.tensor(past_value, "past_value", optional=True)
        nonpad = self.tensor(nonpad_kv_seqlen, "nonpad_kv_seqlen", optional=True)
        if self.since_version < 24 and not nonpad.is_absent:
            raise self.error("nonpad_kv_seqlen is an input of opset 24 and later", nonpad_kv_seqlen=nonpad)
        self.check_inputs(q, k, v, mask, pk, pv, *([nonpad] if self.since_version >= 24 else []))
        p = self._validate(a, q, k, v, mask, pk, pv, nonpad)

        fast = self.cuda_path(
            Q=q, K=k, V=v, attn_mask=mask, past_key=pk, past_value=pv, nonpad_kv_seqlen=nonpad,
            is_causal=p["is_causal"], kv_num_heads=p["kv_heads"], q_num_heads=p["q_heads"],
            qk_matmul_output_mode=p["mode"], scale=p["scale"], softcap=p["softcap"],
            softmax_precision=p["softmax_precision"], left_window_size=p["left"],
            right_window_size=p["right"])
        if fast is not None:
            return fast
        return self._compute(p, q, k, v, mask, pk, pv, nonpad)

    def array_function(self, inputs, attrs):
        """Y alone (a one-output node) on the host from Q, K, V and optionally attn_mask,
        past_key and past_value: _compute on the arrays, with the plan validated once for
        these types and shapes (it depends on nothing else without nonpad_kv_seqlen).  On
        a GPU the node keeps its kernel call (the hand-written kernel's choice)."""
        if (self.on_gpu or self.requested_outputs != (True,) or len(inputs) not in (3, 4, 6)
                or any(t.__class__ is not Tensor for t in inputs)):
            return None
        a = self.Attributes(**attrs)
        absent = [Tensor()] * (7 - len(inputs))
        p = self._validate(a, *inputs, *absent)
        types = [t.data_type for t in inputs]
        host = self._planned_host(p, inputs)
        if host is not None:
            return host
        compute, wrap = self._compute, Tensor.wrap

        def attention_y(*arrays):
            return compute(p, *[wrap(x, dt) for x, dt in zip(arrays, types)], *absent).Y.array

        return attention_y

    def _planned_host(self, p, inputs):
        """For array_function: Y as _compute gives it when Q, K and V (no cache) are all
        float32 or all float64 (computed as they are) and "Attention.blocks" applies,
        with that choice, the compute type and the mask's type fixed once: per call only
        the mask's bias, the Y buffer and the host blocks.  None otherwise."""
        q, k, v = inputs[:3]
        mask = inputs[3] if len(inputs) == 4 else Tensor()
        cdt = q.array.dtype
        if (len(inputs) not in (3, 4) or mask.is_absent and len(inputs) == 4 or cdt.kind != "f"
                or q.data_type not in (DataType.FLOAT, DataType.DOUBLE)
                or k.data_type != q.data_type or v.data_type != q.data_type
                or min(p["Sq"], p["T"], p["B"], p["q_heads"]) == 0):
            return None
        fast = self.specialized("Attention.blocks", p, mask, False, cdt)
        if fast is None:
            return None
        kernel, rank, mask_type = self, p["rank"], mask.data_type
        B, Hq, Hkv, Sq, T, Dv = p["B"], p["q_heads"], p["kv_heads"], p["Sq"], p["T"], p["Dv"]

        def attention_y_host(q, k, v, mask=None):
            Y = np.empty((B, Hq, Sq, Dv), dtype=cdt)
            bias = None if mask is None else kernel._prepare_mask(Tensor.wrap(mask, mask_type), T, cdt)[0]
            fast(kernel, p, cdt, kernel._to4d(q, Hq, rank), kernel._to4d(k, Hkv, rank),
                 kernel._to4d(v, Hkv, rank), Y, bias)
            return Y if rank == 4 else Y.transpose(0, 2, 1, 3).reshape(B, Sq, Hq * Dv)

        return attention_y_host

    # ------------------------------------------------------------------ validation
    def _validate(self, a, q, k, v, mask, pk, pv, nonpad) -> dict:
        shapes = dict(Q=q, K=k, V=v)
        rank = q.ndim
        if rank not in (3, 4) or k.ndim != rank or v.ndim != rank:
            raise self.error("Q, K and V must all be 3-D or all be 4-D", **shapes)
        qh, kvh = a.q_num_heads, a.kv_num_heads
        B = q.shape[0]
        if k.shape[0] != B or v.shape[0] != B:
            raise self.error("Q, K and V must have the same batch size", **shapes)
        if rank == 3:
            if qh is None or kvh is None:
                raise self.error("3-D inputs need the q_num_heads and kv_num_heads attributes", **shapes)
            qh, kvh = int(qh), int(kvh)
            if qh <= 0 or kvh <= 0:
                raise self.error(f"head counts must be positive (q_num_heads={qh}, kv_num_heads={kvh})",
                                 **shapes)
            for name, t, h in (("Q", q, qh), ("K", k, kvh), ("V", v, kvh)):
                if t.shape[2] % h:
                    raise self.error(f"the hidden size of {name} ({t.shape[2]}) is not divisible by its "
                                     f"head count {h}", **shapes)
            Sq, Skv = q.shape[1], k.shape[1]
            D, Dk, Dv = q.shape[2] // qh, k.shape[2] // kvh, v.shape[2] // kvh
            if v.shape[1] != Skv:
                raise self.error("K and V must have the same sequence length", **shapes)
        else:
            Bq, hq, Sq, D = q.shape
            _, hk, Skv, Dk = k.shape
            _, hv, Sv, Dv = v.shape
            if hk != hv or Sv != Skv:
                raise self.error("K and V must have the same number of heads and sequence length", **shapes)
            if qh is not None and int(qh) != hq or kvh is not None and int(kvh) != hk:
                raise self.error(f"q_num_heads={qh}/kv_num_heads={kvh} disagree with the 4-D shapes", **shapes)
            qh, kvh = hq, hk
        if Dk != D:
            raise self.error(f"Q and K head sizes differ ({D} vs {Dk})", **shapes)
        if kvh == 0 or qh % kvh:
            raise self.error(f"q_num_heads ({qh}) must be a multiple of kv_num_heads ({kvh})", **shapes)

        # caches
        if pk.is_absent != pv.is_absent:
            raise self.error("past_key and past_value must be given together", past_key=pk, past_value=pv)
        P = 0
        if not pk.is_absent:
            if not nonpad.is_absent:
                raise self.error("nonpad_kv_seqlen cannot be combined with past_key/past_value",
                                 past_key=pk, nonpad_kv_seqlen=nonpad)
            if pk.ndim != 4 or pv.ndim != 4:
                raise self.error("past_key and past_value must be 4-D", past_key=pk, past_value=pv)
            P = pk.shape[2]
            if pk.shape != (B, kvh, P, D) or pv.shape != (B, kvh, P, Dv):
                raise self.error(f"past_key/past_value must have shapes ({B}, {kvh}, P, {D}) and "
                                 f"({B}, {kvh}, P, {Dv}) with one P", past_key=pk, past_value=pv, K=k, V=v)
        T = P + Skv

        nonpad_host = None
        if not nonpad.is_absent:
            if nonpad.shape != (B,):
                raise self.error(f"nonpad_kv_seqlen must have shape ({B},)", nonpad_kv_seqlen=nonpad, Q=q)
            nonpad_host = np.asarray(nonpad.numpy(), dtype=np.int64)
            if nonpad_host.size and (nonpad_host.min() < 0 or nonpad_host.max() > Skv):
                raise self.error(f"nonpad_kv_seqlen values must lie in [0, {Skv}], got {nonpad_host.tolist()}",
                                 nonpad_kv_seqlen=nonpad, K=k)

        # attributes
        mode = int(a.qk_matmul_output_mode)
        if mode not in (0, 1, 2, 3):
            raise self.error(f"qk_matmul_output_mode must be 0, 1, 2 or 3, got {mode}")
        sp = a.softmax_precision
        if sp is not None:
            sp = int(sp)
            if sp not in _SOFTMAX_PRECISIONS:
                raise self.error(f"softmax_precision must be one of FLOAT (1), FLOAT16 (10), DOUBLE (11) or "
                                 f"BFLOAT16 (16), got {sp}")
        left, right = int(a.left_window_size), int(a.right_window_size)
        if self.since_version < 25 and (left != -1 or right != -1):
            raise self.error("left_window_size/right_window_size are attributes of opset 25 and later")
        if left < -1 or right < -1:
            raise self.error(f"window sizes must be -1 or non-negative, got left={left}, right={right}")
        scale = (1.0 / math.sqrt(D) if D > 0 else 1.0) if a.scale is None else float(a.scale)
        softcap = float(a.softcap or 0.0)
        if softcap < 0:
            raise self.error(f"softcap must be non-negative, got {softcap}")

        # mask shape: pad the last axis to T, then broadcast to (B, qh, Sq, T)
        if not mask.is_absent:
            ms = mask.shape
            if mask.ndim > 4:
                raise self.error("attn_mask must have rank 4 or less", attn_mask=mask, Q=q)
            if ms and ms[-1] > T:
                raise self.error(f"the last dimension of attn_mask ({ms[-1]}) exceeds the total kv length {T}",
                                 attn_mask=mask, Q=q, K=k)
            padded = ms[:-1] + (T,) if ms else ms
            target = (B, qh, Sq, T)
            for dm, dt in zip(reversed(padded), reversed(target)):
                if dm != 1 and dm != dt:
                    raise self.error(f"attn_mask does not broadcast to (batch, q_num_heads, q_len, total_len) "
                                     f"= {target}", attn_mask=mask, Q=q, K=k)
        return dict(rank=rank, B=B, q_heads=qh, kv_heads=kvh, Sq=Sq, Skv=Skv, P=P, T=T, D=D, Dv=Dv,
                    is_causal=int(a.is_causal), mode=mode, scale=scale, softcap=softcap,
                    softmax_precision=sp, left=left, right=right, nonpad=nonpad_host)

    # ------------------------------------------------------------------ compute
    def _to4d(self, arr, heads, rank):
        if rank == 4:
            return arr
        b, s, h = arr.shape
        return arr.reshape(b, s, heads, h // heads).transpose(0, 2, 1, 3)

    def _compute(self, p, q, k, v, mask, pk, pv, nonpad) -> "Attention.Result":
        xp = self.xp
        rank, B, Hq, Hkv = p["rank"], p["B"], p["q_heads"], p["kv_heads"]
        Sq, T, D, Dv, P = p["Sq"], p["T"], p["D"], p["Dv"], p["P"]
        G = Hq // Hkv
        cq = dtypes.info(q.data_type).compute
        cv = dtypes.info(v.data_type).compute
        cdt = np.dtype(np.float64) if np.float64 in (cq, cv) else np.dtype(np.float32)

        # present key/value (storage arrays, exact) and compute copies
        k4s = self._to4d(k.array, Hkv, rank)
        v4s = self._to4d(v.array, Hkv, rank)
        if not pk.is_absent:
            present_k = xp.concatenate([pk.array, k4s], axis=2)
            present_v = xp.concatenate([pv.array, v4s], axis=2)
        else:
            present_k, present_v = k4s, v4s
        Kc = self.to_compute(Tensor.wrap(present_k, k.data_type), cdt)
        Vc = self.to_compute(Tensor.wrap(present_v, v.data_type), cdt)
        Qc = self._to4d(self.to_compute(q, cdt), Hq, rank)

        mode = p["mode"]
        want_qk = self.wants_output(3)
        nonempty = Sq > 0 and T > 0 and B > 0 and Hq > 0
        fast = self.specialized("Attention.blocks", p, mask, want_qk, cdt) if nonempty else None
        Y = (xp.empty if fast is not None else xp.zeros)((B, Hq, Sq, Dv), dtype=cdt)
        qk_out = xp.zeros((B, Hq, Sq, T), dtype=cdt) if want_qk else None

        if fast is not None:
            fast(self, p, cdt, Qc, Kc, Vc, Y, self._prepare_mask(mask, T, cdt)[0])
        elif nonempty:
            mask_add, mask_q = self._prepare_mask(mask, T, cdt)
            offset = self._offset(p)
            has_window = p["left"] >= 0 or p["right"] >= 0
            sp = p["softmax_precision"]
            sdt = np.dtype(np.float64) if sp == int(DataType.DOUBLE) else \
                (np.dtype(np.float32) if sp is not None else cdt)
            round_to = sp if sp in (int(DataType.FLOAT16), int(DataType.BFLOAT16)) else None
            # contiguous operands: NumPy's batched matmul only reaches BLAS for them.  With
            # few query rows per KV head (decoding) K @ q^T avoids copying K^T.
            few_rows = G * Sq <= 64
            Kc = xp.ascontiguousarray(Kc)
            Kt = None if few_rows else xp.ascontiguousarray(Kc.transpose(0, 1, 3, 2))  # (B, Hkv, D, T)
            Vc = xp.ascontiguousarray(Vc)
            budget = int(self.ctx.option("attention_block_bytes", _DEFAULT_BLOCK_BYTES))
            row_bytes = B * Hq * T * max(cdt.itemsize, sdt.itemsize) * 2
            block = max(1, min(Sq, budget // max(row_bytes, 1)))
            # Causal rows never see keys past their own position: with a fixed offset each
            # query block only multiplies the key prefix it can attend to (masked keys
            # contribute exact zeros, so the result is the same up to summation order).
            causal_prefix = bool(p["is_causal"]) and isinstance(offset, int) and not want_qk
            if causal_prefix and Sq >= 128:
                block = min(block, max(64, -(-Sq // 8)))
            scale = cdt.type(p["scale"])
            for r0 in range(0, Sq, block):
                r1 = min(Sq, r0 + block)
                n = r1 - r0
                Tb = min(T, r1 + offset) if causal_prefix else T  # offset >= 0: Tb >= 1
                qb = Qc[:, :, r0:r1] * scale  # (B, Hq, n, D)
                qb = qb.reshape(B, Hkv, G * n, D)
                if Kt is None:
                    s = xp.matmul(Kc[:, :, :Tb], xp.ascontiguousarray(qb.transpose(0, 1, 3, 2)))
                    s = xp.ascontiguousarray(s.transpose(0, 1, 3, 2)).reshape(B, Hq, n, Tb)
                else:
                    s = xp.matmul(qb, Kt[..., :Tb]).reshape(B, Hq, n, Tb)
                if want_qk and mode == 0:
                    qk_out[:, :, r0:r1] = s
                if p["softcap"] > 0:
                    c = cdt.type(p["softcap"])
                    s *= 1 / c
                    xp.tanh(s, out=s)
                    s *= c
                if want_qk and mode == 1:
                    qk_out[:, :, r0:r1] = s
                bias = self._bias(p, mask_add, mask_q, offset, has_window, r0, r1, cdt, Tb)
                if bias is not None:
                    s += bias
                if want_qk and mode == 2:
                    qk_out[:, :, r0:r1] = s
                if s.dtype != sdt:
                    s = s.astype(sdt)
                if round_to is not None:
                    s = self._round(s, round_to)
                with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
                    m = xp.max(s, axis=-1, keepdims=True)
                    if bias is not None:
                        m = xp.where(xp.isneginf(m), sdt.type(0), m)
                    s -= m
                    xp.exp(s, out=s)
                    total = xp.sum(s, axis=-1, keepdims=True)
                    if bias is not None:
                        total = xp.where(total == 0, sdt.type(1), total)
                    s /= total
                if round_to is not None:
                    s = self._round(s, round_to)
                if bias is not None:
                    dead = xp.isneginf(xp.max(bias, axis=-1, keepdims=True))
                    s = xp.where(dead, sdt.type(0), s)
                if s.dtype != cdt:
                    s = s.astype(cdt)
                if want_qk and mode == 3:
                    qk_out[:, :, r0:r1] = s
                y = xp.matmul(s.reshape(B, Hkv, G * n, Tb), Vc[:, :, :Tb])  # (B, Hkv, G*n, Dv)
                Y[:, :, r0:r1] = y.reshape(B, Hq, n, Dv)

        if rank == 3:
            Y = Y.transpose(0, 2, 1, 3).reshape(B, Sq, Hq * Dv)
        y_t = self.from_compute(Y, q.data_type)
        pk_t = Tensor.wrap(present_k, k.data_type) if self.wants_output(1) else None
        pv_t = Tensor.wrap(present_v, v.data_type) if self.wants_output(2) else None
        qk_t = self.from_compute(qk_out, q.data_type) if want_qk else None
        return self.Result(y_t, pk_t, pv_t, qk_t)

    def _round(self, arr, data_type):
        """arr rounded to a half type and back to float32."""
        return self.to_compute(self.from_compute(arr, data_type), np.float32)

    def _prepare_mask(self, mask, T, cdt):
        """(additive mask as 4-D compute array or None, whether its q axis is > 1)."""
        if mask.is_absent:
            return None, False
        xp = self.xp
        if mask.data_type == DataType.BOOL:
            m = xp.where(mask.array, cdt.type(0), cdt.type(-np.inf))
        else:
            m = self.to_compute(mask, cdt)
        if m.ndim and m.shape[-1] < T:
            pad = xp.full(m.shape[:-1] + (T - m.shape[-1],), -np.inf, dtype=cdt)
            m = xp.concatenate([m, pad], axis=-1)
        m = m.reshape((1,) * (4 - m.ndim) + m.shape)
        return m, m.shape[2] > 1

    def _offset(self, p):
        """The causal/window offset: an int, or a (B, 1, 1, 1) array per batch."""
        if p["P"] > 0:
            return p["P"]
        if p["nonpad"] is not None:
            return self.xp.asarray((p["nonpad"] - p["Sq"]).reshape(-1, 1, 1, 1))
        return 0

    def _bias(self, p, mask_add, mask_q, offset, has_window, r0, r1, cdt, T=None):
        """The additive bias for query rows r0:r1 and the first T keys (all by default),
        broadcastable to (B, Hq, n, T), or None."""
        xp = self.xp
        full = p["T"]
        T = full if T is None else T
        allowed = None
        if p["is_causal"] or has_window:
            i = xp.arange(r0, r1, dtype=np.int64).reshape(-1, 1)
            j = xp.arange(T, dtype=np.int64).reshape(1, -1)
            diff = (i + offset) - j  # query absolute position minus key index
            if p["is_causal"]:
                allowed = diff >= 0
            if p["left"] >= 0:
                ok = diff <= p["left"]
                allowed = ok if allowed is None else allowed & ok
            if p["right"] >= 0:
                ok = -diff <= p["right"]
                allowed = ok if allowed is None else allowed & ok
        if p["nonpad"] is not None:
            j = xp.arange(T, dtype=np.int64).reshape(1, 1, 1, -1)
            ok = j < xp.asarray(p["nonpad"].reshape(-1, 1, 1, 1))
            allowed = ok if allowed is None else allowed & ok
        bias = None
        if mask_add is not None:
            bias = mask_add[:, :, r0:r1] if mask_q else mask_add
            if T < full:
                bias = bias[..., :T]
        if allowed is not None:
            add = xp.where(allowed, cdt.type(0), cdt.type(-np.inf))
            bias = add if bias is None else bias + add
        return bias


# ---------------------------------------------------------------------- host fast path
# Tuning (host/tuning.py): blocks of at most attention.host_block_bytes score bytes (or
# attention_block_bytes when smaller), about one 512 x 512 head, so that exp(s) and the row
# sums run in cache (BLAS is called once per head either way); causal attention in blocks
# of attention.host_causal_rows query rows (each multiplies only the keys it sees);
# scores as K @ q^T (decoding) up to attention.few_rows query rows per KV head.
# exp(s) without the row-max shift is kept when every row sum lands in this range (no
# term overflowed, the largest term is a normal number) and E @ V is finite; otherwise
# the block is redone with the shift.
_SUM_LO = 1e-20
_SUM_HI = 1e30


def _host_plain(p, mask, want_qk, cdt) -> bool:
    """Whether _HostAttention covers a call: no padding or window, no softcap, no qk
    output, softmax in the compute type, and the causal frontier (if any) at the fixed
    offset past_len.  attn_mask (any type) is allowed: it arrives as the reference's
    additive bias."""
    sp = p["softmax_precision"]
    sdt = cdt if sp is None else {int(DataType.FLOAT): np.float32, int(DataType.DOUBLE): np.float64}.get(sp)
    return (p["nonpad"] is None and p["softcap"] == 0
            and p["left"] < 0 and p["right"] < 0 and not want_qk
            and sdt is not None and np.dtype(sdt) == cdt)


@specialize("Attention.blocks", device="cpu", ops=("Attention",), when=_host_plain,
            agreement="rtol 1e-5 (float32): the scale folded into Q, the row max subtracted "
                      "only for blocks whose unshifted sums leave a safe range")
def _host_attention(kernel, p, cdt, Qc, Kc, Vc, Y, bias=None):
    """Y (B, Hq, Sq, Dv) of a plain call on the host, by _HostAttention; bias is the
    reference's additive mask (_prepare_mask: 4-D, last axis T) or None."""
    budget = int(kernel.ctx.option("attention_block_bytes", _DEFAULT_BLOCK_BYTES))
    _HostAttention(p, cdt, min(budget, tuning.value("attention.host_block_bytes")), bias).run(Qc, Kc, Vc, Y)


class _HostAttention:
    """NumPy-only attention for the plain cases (see _host_plain).

    Works through blocks of (batch, KV heads, query rows).  Per block: scores by one
    batched BLAS product with the scale folded into Q (a scaled copy of the block's
    rows in a reused buffer; K^T is a transposed view, no copy; K and V are read in place
    when their rows have unit stride, as the exporters' (B, H, S, D) views of (B, S, H, D)
    projections do: _blas_rows) written into one score
    workspace reused by every block, the causal frontier as a -inf triangle on the
    trailing square only (earlier keys are visible to every row of the block, later ones
    are not multiplied at all), E = exp(s) in place (NumPy's float32 exp is vectorised:
    measured 1.5-1.8x faster than its exp2 on 16K-256K elements on an AVX2 host; one
    thread, as waking a second costs more than it saves on blocks this size), its row
    sums as E @ ones (a BLAS product, faster than np.sum; with a few rows, decoding, one
    np.add.reduce) written into one (rows, 1) array of the whole call, and E @ V written
    straight into Y.  After the last block Y is
    divided by the row sums in one pass (on Dv columns instead of T).

    Softmax is shift-invariant, so the row max is subtracted only when the sums show that
    exp(s) overflowed or underflowed: one check over all row sums and Y after the blocks;
    when it fails, each block is checked and the failing ones are recomputed with the
    shift (a rare path).

    An attn_mask comes as the reference's additive bias, added to each block's scores.
    A row the bias masks entirely (or whose every term is zero) sums to 0, fails the
    check and gives a zero row in the shifted block, as in the reference.
    """

    def __init__(self, p, cdt, block_bytes, bias=None):
        self.B, self.Hq, self.Hkv = p["B"], p["q_heads"], p["kv_heads"]
        self.G = self.Hq // self.Hkv
        self.Sq, self.T, self.D, self.Dv = p["Sq"], p["T"], p["D"], p["Dv"]
        self.causal = bool(p["is_causal"])
        self.offset = p["P"]  # causal frontier: query i sees keys j <= i + offset
        self.cdt = cdt
        self.scale = cdt.type(p["scale"])
        self.block_bytes = block_bytes
        self.causal_rows = tuning.value("attention.host_causal_rows")
        self.few_rows = tuning.value("attention.few_rows")
        self.bias = bias  # additive, (1|B, 1|Hq, 1|Sq, T), or None
        self.fold = None  # (B, Hq) once _fold_batches merged the batches into the KV heads
        self.work = None  # score workspace, flat; allocated by run()
        self.qbuf = None  # scaled query rows of a block, flat
        self.ones = None  # (T, 1) ones: row sums as a matrix product

    def _blocks(self):
        """(query rows per block, KV heads per block)."""
        G, Sq, T, isz = self.G, self.Sq, self.T, self.cdt.itemsize
        if self.causal and Sq > self.causal_rows:
            n = self.causal_rows
        else:
            n = max(1, min(Sq, self.block_bytes // max(1, G * T * isz)))
        hb = max(1, min(self.Hkv, self.block_bytes // max(1, G * n * T * isz)))
        return n, hb

    def _each_block(self, n, hb):
        """(b, h0, h1, r0, r1) of every block."""
        for b in range(self.B):
            for h0 in range(0, self.Hkv, hb):
                h1 = min(self.Hkv, h0 + hb)
                for r0 in range(0, self.Sq, n):
                    yield b, h0, h1, r0, min(self.Sq, r0 + n)

    def run(self, Qc, Kc, Vc, Y):
        n, hb = self._blocks()
        if self.B > 1 and n == self.Sq and hb == self.Hkv and self.G * n <= self.few_rows:
            self._fold_batches()
            hb = self.Hkv
        blocks = list(self._each_block(n, hb)) if self.fold is None else [(0, 0, self.Hkv, 0, self.Sq)]
        B, Hkv, G, Sq = self.B, self.Hkv, self.G, self.Sq
        Q5 = Qc.reshape(B, Hkv, G, Sq, self.D)  # a view: splits the head axis
        K4 = _blas_rows(Kc).reshape(B, Hkv, self.T, self.D)  # read only: a copy if a fold needs one
        V4 = _blas_rows(Vc).reshape(B, Hkv, self.T, self.Dv)
        Y5 = Y.reshape(B, Hkv, G, Sq, self.Dv)  # Y is a new C-contiguous array: a view
        tot = np.empty((B, Hkv, G, Sq, 1), dtype=self.cdt)  # row sums of exp(s)
        if G * n > self.few_rows:  # the few-rows path (decoding) makes its own small arrays
            self.work = np.empty(hb * G * n * self.T, dtype=self.cdt)
            self.qbuf = np.empty(hb * G * n * self.D, dtype=self.cdt)
            self.ones = np.ones((self.T, 1), dtype=self.cdt)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
            for b, h0, h1, r0, r1 in blocks:
                self._block(Q5[b, h0:h1, :, r0:r1], K4[b, h0:h1], V4[b, h0:h1],
                            Y5[b, h0:h1, :, r0:r1], tot[b, h0:h1, :, r0:r1], r0, r1, self._bias_of(b, h0, h1))
            if not self._fine(tot, Y):  # rare: redo the blocks that need the max shift
                for b, h0, h1, r0, r1 in blocks:
                    y, tb = Y5[b, h0:h1, :, r0:r1], tot[b, h0:h1, :, r0:r1]
                    if not self._fine(tb, y):
                        self._shifted_block(Q5[b, h0:h1, :, r0:r1], K4[b, h0:h1], V4[b, h0:h1], y, tb, r0, r1,
                                            self._bias_of(b, h0, h1))
            np.reciprocal(tot, out=tot)
            np.multiply(Y5, tot, out=Y5)

    def _fold_batches(self):
        """Decoding (one block per batch, a few query rows): the batch axis folded into the
        KV heads, so that one block covers the call (the causal offset is the same for
        every batch).  The bias stays as it is: _scores adds it to the (B, Hq, n, T) view
        of the block's scores."""
        self.fold = (self.B, self.Hq)
        self.Hkv, self.Hq, self.B = self.B * self.Hkv, self.B * self.Hq, 1

    @staticmethod
    def _fine(tot, y) -> bool:
        """Whether unshifted row sums tot and E @ V y are usable: every sum in range (no
        term overflowed, the largest term is a normal number) and y finite."""
        return bool(np.minimum.reduce(tot, axis=None) > _SUM_LO and np.maximum.reduce(tot, axis=None) < _SUM_HI
                    and np.isfinite(np.add.reduce(y, axis=None)))  # the ufuncs: no wrappers

    def _bias_of(self, b, h0, h1):
        """The bias of batch b and KV heads h0:h1 as (h or 1, G or 1, 1|Sq, T), or None."""
        m = self.bias
        if m is None or self.fold is not None:  # folded: the one block takes the whole bias
            return m
        m = m[b if m.shape[0] > 1 else 0]
        if m.shape[0] == 1:
            return m[None]
        return m[h0 * self.G:h1 * self.G].reshape(h1 - h0, self.G, m.shape[1], m.shape[2])

    def _scores(self, q, K, r0, r1, bias=None):
        """Scores (h, G*n, Tb) with the bias (from _bias_of) and the causal triangle
        applied; and Tb."""
        h, G, n, D = q.shape
        Tb = min(self.T, r1 + self.offset) if self.causal else self.T  # keys the block sees
        Kb = K[:, :Tb]
        if G * n == 1:  # one query row per KV head: q^T and the scores are free reshapes
            s = np.matmul(Kb, np.multiply(q, self.scale).reshape(h, D, 1)).reshape(h, 1, Tb)
        elif G * n <= self.few_rows:  # decoding: K @ q^T runs as a fast matrix-vector-like product
            qs = np.multiply(q, self.scale).reshape(h, G * n, D)
            st = np.matmul(Kb, qs.transpose(0, 2, 1).copy())  # (h, Tb, G*n)
            s = np.ascontiguousarray(st.transpose(0, 2, 1))
        else:  # BLAS reads K^T through the view and writes into the workspace
            qs = self.qbuf[:h * G * n * D].reshape(h, G, n, D)
            np.multiply(q, self.scale, out=qs)
            s = np.matmul(qs.reshape(h, G * n, D), Kb.transpose(0, 2, 1),
                          out=self.work[:h * G * n * Tb].reshape(h, G * n, Tb))
        if bias is not None and self.fold is not None:  # the one block: all batches, heads and rows
            s.reshape(self.fold + (n, Tb))[...] += bias[..., :Tb]
        elif bias is not None:
            s.reshape(h, G, n, Tb)[...] += bias[:, :, r0:r1, :Tb] if bias.shape[2] > 1 else bias[..., :Tb]
        j0 = r0 + self.offset + 1  # keys below j0 are visible to every row of the block
        if self.causal and j0 < Tb:
            i = np.arange(r0, r1).reshape(-1, 1) + self.offset
            j = np.arange(j0, Tb).reshape(1, -1)
            tri = np.where(j > i, self.cdt.type(-np.inf), self.cdt.type(0))
            s.reshape(h, G, n, Tb)[..., j0:] += tri
        return s, Tb

    def _block(self, q, K, V, y, tot, r0, r1, bias=None):
        """Unnormalised E @ V of one block into y (h, G, n, Dv), its row sums into tot
        (h, G, n, 1)."""
        h, G, n, _ = q.shape
        s, Tb = self._scores(q, K, r0, r1, bias)
        np.exp(s, out=s)  # one thread: waking a second one costs more than it saves here
        s4 = s.reshape(h, G, n, Tb)
        if self.ones is None:  # a few rows: the row sums as one reduction
            np.add.reduce(s4, axis=-1, keepdims=True, out=tot)
        else:
            np.matmul(s4, self.ones[:Tb], out=tot)  # row sums
        _times_v(s4, V[:, :Tb], y)

    def _shifted_block(self, q, K, V, y, tot, r0, r1, bias=None):
        """One block redone as a stable softmax does: exp(s - row max).  With a bias, as
        the reference: a row max of -inf is taken as 0 and a zero row sum as 1, so a
        fully masked row is a zero row (without one, the max is finite unless the inputs
        are not, and such rows give NaN as in the reference)."""
        h, G, n, _ = q.shape
        s, Tb = self._scores(q, K, r0, r1, bias)
        m = np.max(s, axis=-1, keepdims=True)
        if bias is not None:
            m[np.isneginf(m)] = 0
        s -= m
        np.exp(s, out=s)
        s4 = s.reshape(h, G, n, Tb)
        np.sum(s4, axis=-1, keepdims=True, out=tot)
        if bias is not None:
            tot[tot == 0] = 1
        _times_v(s4, V[:, :Tb], y)


def _blas_rows(a):
    """a itself where NumPy's matmul hands its matrices to BLAS as they are (unit stride
    along the last axis, rows at least a row apart: the (B, H, S, D) views of (B, S, H, D)
    projections that exporters transpose), else a C-contiguous copy."""
    isz = a.itemsize
    if a.flags.c_contiguous:  # the common case first (the copy below would be a itself)
        return a
    if a.ndim >= 2 and a.strides[-1] == isz and a.strides[-2] % isz == 0 and a.strides[-2] >= a.shape[-1] * isz \
            and all(st >= 0 for st in a.strides):
        return a
    return np.ascontiguousarray(a)


def _times_v(e, v, y):
    """y = e @ v for e (h, G, n, T) and v (h, T, Dv), v shared by the G query heads of a
    KV head: one (h, G*n, T) @ (h, T, Dv) product where y's (G, n) axes merge in place
    (NumPy runs the 5-D broadcast form about 2x slower), else the broadcast form."""
    h, G, n, T = e.shape
    if G > 1 and n > 1 and y.strides[1] != n * y.strides[2]:  # (G, n) do not merge in place
        np.matmul(e, v[:, None], out=y)
        return
    np.matmul(e.reshape(h, G * n, T), v, out=y.reshape(h, G * n, y.shape[-1]))  # a view of y

