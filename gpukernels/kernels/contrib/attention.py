"""Attention fusions of onnxruntime (com.microsoft): RotaryEmbedding, MultiHeadAttention,
Attention, GroupQueryAttention.  The math is the ONNX Attention and RotaryEmbedding
kernels; this module turns the contrib layouts, masks and caches into their inputs.

Masks follow onnxruntime's CPU kernels: a key padding mask or mask_index (1-D
lengths, 2-D/3-D 0/1 masks, and for Attention the (2 * batch) end/start form) adds
``mask_filter_value`` (default -10000) to the scores of masked keys -- an additive
mask, so a row whose keys are all masked averages them as if unmasked -- while the
causal frontier (unidirectional, causal) and GroupQueryAttention's local window exclude
keys outright.  attention_bias is added to the scores.

MultiHeadAttention's packed QKV / KV layouts are covered (onnxruntime's CPU kernel lacks
them).  Not covered, each refused with a KernelInputError that says so: the (3 * batch +
2) and 4-D mask formats, buffer sharing (past_present_share_buffer,
past_sequence_length), beam search cache_indirection, Attention's do_rotary, the qk
outputs, and GroupQueryAttention's quantized caches, head_sink, smooth_softmax, Q/K norm
weights and sliding_window_cache.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ...dtypes import DataType
from ...tensor import Tensor
from ..base import register
from ..math.matmul import MatMul as _OnnxMatMul
from ..nn.attention import Attention as _OnnxAttention
from ..nn.rotary import RotaryEmbedding as _OnnxRotaryEmbedding
from ._common import DOMAIN, FLOATS, ContribKernel, host_ints

_MASK_TYPES = {DataType.INT32}
_NO_QK = (True, True, True, False)


class _AttentionBase(ContribKernel):
    def attention(self, version: int = 23):
        """The ONNX Attention kernel (its qk output never requested)."""
        k = self.sub(_OnnxAttention, version)
        k.requested_outputs = _NO_QK
        return k

    def scale_of(self, scale, head_size: int) -> float:
        """onnxruntime's scale: the attribute when given and non-zero, else 1/sqrt(head_size)."""
        if scale is None or float(scale) == 0.0:
            return 1.0 / math.sqrt(head_size) if head_size > 0 else 1.0
        return float(scale)

    def unsupported(self, what: str, **tensors):
        return self.error(f"{what} is not supported by gpukernels' {self.op_type}", **tensors)

    def padding_mask(self, mask: Tensor, B: int, S: int, T: int, P: int, fill: float, allow_end_start: bool,
                     shapes: dict):
        """An additive float32 mask broadcastable to (B, 1, S, T) from a contrib mask, or None."""
        if mask.is_absent:
            return None
        name = "mask_index" if "mask_index" in shapes else "key_padding_mask"
        self.check_type(name, mask, _MASK_TYPES)
        xp = self.xp
        f = np.float32
        j = xp.arange(T, dtype=np.int64)
        if mask.ndim == 1 and mask.shape[0] == B:  # key lengths (right padding)
            ok = j[None, :] < mask.array.astype(np.int64)[:, None]
            return xp.where(ok, f(0), f(fill)).reshape(B, 1, 1, T)
        if mask.ndim == 1 and mask.shape[0] == 2 * B and allow_end_start:  # end (exclusive), start
            m = mask.array.astype(np.int64)
            ok = (j[None, :] < m[:B, None]) & (j[None, :] >= m[B:, None])
            return xp.where(ok, f(0), f(fill)).reshape(B, 1, 1, T)
        if mask.ndim == 2 and mask.shape == (B, T):
            return xp.where(mask.array != 0, f(0), f(fill)).reshape(B, 1, 1, T)
        if mask.ndim == 3 and mask.shape == (B, S, T):
            return xp.where(mask.array != 0, f(0), f(fill)).reshape(B, 1, S, T)
        forms = f"({B},), {'(' + str(2 * B) + ',), ' if allow_end_start else ''}({B}, {T}) or ({B}, {S}, {T})"
        raise self.error(f"the mask must have shape {forms} (total length {T} = past {P} + new); "
                         f"got {list(mask.shape)} (the (3*batch+2) and 4-D forms are not supported)", **shapes)

    def add_bias(self, add, ab: Tensor, B: int, H: int, S: int, T: int, shapes: dict):
        """add (or None) + attention_bias (B or 1, H or 1, S, T), as float32."""
        if ab.is_absent:
            return add
        if ab.ndim != 4 or ab.shape[0] not in (1, B) or ab.shape[1] not in (1, H) or ab.shape[2:] != (S, T):
            raise self.error(f"attention_bias must have shape ({B} or 1, {H} or 1, {S}, {T})", **shapes)
        b = self.to_compute(ab, np.float32)
        return b if add is None else add + b

    def run_attention(self, q4, k4, v4, pk, pv, add, causal: bool, scale: float, data_types, version=23,
                      **window):
        """ONNX Attention on BNSH arrays (storage dtype of data_types[0] for q, [1] for
        k/v).  Returns (Y (B, S, H * dv) in q's type, present_key, present_value)."""
        qt, kt = data_types
        r = self.attention(version)(
            Tensor.wrap(q4, qt), Tensor.wrap(k4, kt), Tensor.wrap(v4, kt),
            None if add is None else Tensor.wrap(add, DataType.FLOAT),
            None if pk is None else Tensor.wrap(pk, kt), None if pv is None else Tensor.wrap(pv, kt),
            is_causal=int(causal), scale=scale, **window)
        y = r.Y.array
        B, H, S, dv = y.shape
        return y.transpose(0, 2, 1, 3).reshape(B, S, H * dv), r.present_key, r.present_value


def _bnsh(xp, a, heads):
    """(B, S, H * d) -> (B, H, S, d)."""
    B, S, D = a.shape
    return a.reshape(B, S, heads, D // heads).transpose(0, 2, 1, 3)


@register("RotaryEmbedding", domain=DOMAIN, versions=(1,))
class RotaryEmbedding(ContribKernel):
    """onnxruntime's RotaryEmbedding: input (batch, seq, hidden) or (batch, num_heads, seq,
    head_size); position_ids (1,) -- the first position, the others following -- or
    (batch, seq); cos_cache/sin_cache (max_seq, rotary_dim / 2).  Without num_heads a 3-D
    input's head size is 2 * cos_cache.shape[1].  The scale attribute is accepted and
    ignored, as onnxruntime's CPU kernel does; is_packed_batching=1 is not supported."""

    max_inputs = 4

    def __call__(self, input, position_ids, cos_cache, sin_cache, *more, interleaved=0, is_packed_batching=0,
                 num_heads=0, rotary_embedding_dim=0, scale=1.0, **unknown):
        self.check_signature(more, unknown)
        x = self.tensor(input, "input")
        pid = self.tensor(position_ids, "position_ids")
        cos = self.tensor(cos_cache, "cos_cache")
        sin = self.tensor(sin_cache, "sin_cache")
        shapes = dict(input=x, position_ids=pid, cos_cache=cos, sin_cache=sin)
        self.floats(FLOATS, input=x, cos_cache=cos, sin_cache=sin)
        self.check_type("position_ids", pid, {DataType.INT64})
        if int(is_packed_batching):
            raise self.error("is_packed_batching=1 is not supported", **shapes)
        if x.ndim not in (3, 4):
            raise self.error(f"input must be 3-D or 4-D, got rank {x.ndim}", **shapes)
        if cos.ndim != 2 or cos.shape != sin.shape:
            raise self.error("cos_cache and sin_cache must be 2-D (max_seq, rotary_dim / 2) of one shape", **shapes)
        B = x.shape[0]
        S = x.shape[1] if x.ndim == 3 else x.shape[2]
        heads = int(num_heads or 0)
        rd = int(rotary_embedding_dim or 0)
        if x.ndim == 3 and heads <= 0:
            if rd:
                raise self.error("rotary_embedding_dim needs num_heads with a 3-D input", **shapes)
            hd = 2 * cos.shape[1]
            if hd == 0 or x.shape[2] % hd:
                raise self.error(f"the hidden size {x.shape[2]} is not a multiple of the head size {hd} "
                                 "(2 * cos_cache.shape[1]); give num_heads", **shapes)
            heads = x.shape[2] // hd
        if rd and rd != 2 * cos.shape[1]:
            raise self.error(f"rotary_embedding_dim {rd} disagrees with cos_cache's {cos.shape[1]} columns "
                             f"(rotary_dim / 2)", **shapes)
        xp = self.xp
        if pid.shape == (1,) or pid.ndim == 0:
            base = int(host_ints(pid).reshape(-1)[0])
            if base < 0 or base + S > cos.shape[0]:
                raise self.error(f"position_ids base value {base} with sequence length {S} exceeds the cache "
                                 f"range [0, {cos.shape[0]})", **shapes)
            positions = xp.broadcast_to(xp.arange(base, base + S, dtype=np.int64)[None, :], (B, S))
            pid = Tensor.wrap(xp.ascontiguousarray(positions), DataType.INT64)
        elif pid.shape != (B, S):
            raise self.error(f"position_ids must have shape (1,) or ({B}, {S})", **shapes)
        return self.sub(_OnnxRotaryEmbedding, 23)(x, cos, sin, pid, interleaved=int(interleaved),
                                                  num_heads=heads if x.ndim == 3 else None,
                                                  rotary_embedding_dim=2 * cos.shape[1])


@register(domain=DOMAIN, versions=(1,))
class MultiHeadAttention(_AttentionBase):
    """Multi-head attention with the input projection's bias.

    query (B, S, D) or packed QKV (B, S, N, 3, h); key (B, L, D), packed KV (B, L, N, 2, h)
    or a BNSH cache (B, N, L, h); value (B, L, Dv) or BNSH.  bias (D + D + Dv) is added to
    the 3-D query, key and value (to the query only when key/value are BNSH).
    key_padding_mask (int32): (B,) lengths, (B, T) or (B, S, T) 0/1; attention_bias
    (B or 1, N or 1, S, T); past_key/past_value (B, N, P, h) are prepended to key/value.
    unidirectional=1: query i sees keys j <= P + i.  Outputs: output (B, S, Dv),
    present_key, present_value (B, N, T, h)."""

    max_inputs = 10

    class Result(NamedTuple):
        output: Tensor
        present_key: Tensor | None = None
        present_value: Tensor | None = None
        qk: Tensor | None = None

    def __call__(self, query, key=None, value=None, bias=None, key_padding_mask=None, attention_bias=None,
                 past_key=None, past_value=None, past_sequence_length=None, cache_indirection=None, *more,
                 num_heads=None, unidirectional=0, scale=None, mask_filter_value=-10000.0, **unknown):
        self.check_signature(more, unknown)
        q = self.tensor(query, "query")
        k = self.tensor(key, "key", optional=True)
        v = self.tensor(value, "value", optional=True)
        b = self.tensor(bias, "bias", optional=True)
        mask = self.tensor(key_padding_mask, "key_padding_mask", optional=True)
        ab = self.tensor(attention_bias, "attention_bias", optional=True)
        pk = self.tensor(past_key, "past_key", optional=True)
        pv = self.tensor(past_value, "past_value", optional=True)
        shapes = dict(query=q, key=k, value=v, bias=b, key_padding_mask=mask, attention_bias=ab,
                      past_key=pk, past_value=pv)
        self.floats(FLOATS, query=q, key=k, value=v, bias=b, attention_bias=ab, past_key=pk, past_value=pv)
        if not self.tensor(past_sequence_length, "past_sequence_length", optional=True).is_absent:
            raise self.unsupported("past_sequence_length (buffer sharing)", **shapes)
        if not self.tensor(cache_indirection, "cache_indirection", optional=True).is_absent:
            raise self.unsupported("cache_indirection (beam search)", **shapes)
        if self.wants_output(3) and self.requested_outputs is not None:
            raise self.unsupported("the qk output", **shapes)
        if num_heads is None or int(num_heads) <= 0:
            raise self.error("the num_heads attribute (> 0) is required", **shapes)
        N = int(num_heads)
        xp = self.xp
        qa = q.array
        # unpack the packed layouts
        if q.ndim == 5:
            if not (k.is_absent and v.is_absent) or q.shape[2] != N or q.shape[3] != 3:
                raise self.error(f"a 5-D query is packed QKV (B, S, {N}, 3, h) with no key/value", **shapes)
            Bq, S = q.shape[:2]
            qa, ka, va = (qa[:, :, :, i].reshape(Bq, S, -1) for i in range(3))
            kv_bnsh = False
        elif q.ndim == 3:
            if k.is_absent:
                raise self.error("key is required unless query is packed QKV", **shapes)
            if k.ndim == 5:
                if not v.is_absent or k.shape[2] != N or k.shape[3] != 2:
                    raise self.error(f"a 5-D key is packed KV (B, L, {N}, 2, h) with no value", **shapes)
                ka, va = (k.array[:, :, :, i].reshape(k.shape[0], k.shape[1], -1) for i in range(2))
                kv_bnsh = False
            elif k.ndim in (3, 4) and not v.is_absent and v.ndim == k.ndim:
                ka, va = k.array, v.array
                kv_bnsh = k.ndim == 4
            else:
                raise self.error("key/value must both be 3-D (B, L, hidden) or 4-D (B, N, L, h)", **shapes)
        else:
            raise self.error(f"query must be 3-D or packed 5-D, got rank {q.ndim}", **shapes)
        B, S, D = qa.shape
        if D % N:
            raise self.error(f"the query hidden size {D} is not divisible by num_heads {N}", **shapes)
        h = D // N
        if kv_bnsh:
            if ka.shape[:2] != (B, N) or va.shape[:3] != ka.shape[:3] or ka.shape[3] != h:
                raise self.error(f"BNSH key/value must be ({B}, {N}, L, {h}) with one L", **shapes)
            L, Dv = ka.shape[2], va.shape[3] * N
        else:
            if ka.shape[0] != B or va.shape[0] != B or ka.shape[1] != va.shape[1] or ka.shape[2] != D \
                    or va.shape[2] % N:
                raise self.error(f"key must be ({B}, L, {D}) and value ({B}, L, Dv) with Dv divisible by {N}",
                                 **shapes)
            L, Dv = ka.shape[1], va.shape[2]
        # everything in float32 (half types up-cast; float32 arrays are used as they are)
        cdt = np.float32

        def compute(a):
            return self.to_compute(Tensor.wrap(a, q.data_type), cdt)

        qa, ka, va = compute(qa), compute(ka), compute(va)
        if not b.is_absent:
            self.vector(b, "bias", 2 * D + Dv, query=q)
            bc = self.to_compute(b, cdt)
            qa = qa + bc[:D]
            if not kv_bnsh:
                ka = ka + bc[D:2 * D]
                va = va + bc[2 * D:]
        q4 = _bnsh(xp, qa, N)
        k4 = ka if kv_bnsh else _bnsh(xp, ka, N)
        v4 = va if kv_bnsh else _bnsh(xp, va, N)
        P = 0
        if pk.is_absent != pv.is_absent:
            raise self.error("past_key and past_value must be given together", **shapes)
        pka = pva = None
        if not pk.is_absent:
            if kv_bnsh:
                raise self.error("past_key/past_value cannot be combined with a BNSH key/value", **shapes)
            if pk.ndim != 4 or pk.shape[:2] != (B, N) or pk.shape[3] != h or pv.shape != pk.shape[:3] + (Dv // N,):
                raise self.error(f"past_key/past_value must be ({B}, {N}, P, {h}) / ({B}, {N}, P, {Dv // N})",
                                 **shapes)
            P = pk.shape[2]
            pka, pva = self.to_compute(pk, cdt), self.to_compute(pv, cdt)
        T = P + L
        add = self.padding_mask(mask, B, S, T, P, float(mask_filter_value), False, shapes)
        add = self.add_bias(add, ab, B, N, S, T, shapes)
        y, pres_k, pres_v = self.run_attention(q4, k4, v4, pka, pva, add, bool(int(unidirectional)),
                                               self.scale_of(scale, h), (DataType.FLOAT, DataType.FLOAT))
        out = self.from_compute(y, q.data_type)
        pk_t = self.from_compute(pres_k.array, q.data_type) if self.wants_output(1) else None
        pv_t = self.from_compute(pres_v.array, q.data_type) if self.wants_output(2) else None
        return self.Result(out, pk_t, pv_t, None)


@register("Attention", domain=DOMAIN, versions=(1,))
class Attention(_AttentionBase):
    """BERT/GPT-2 attention with the merged input projection: Q, K, V = split(input @
    weights + bias) by qkv_hidden_sizes (default three equal parts); then
    MultiHeadAttention's math.  mask_index (int32): (B,) lengths, (2B,) end (exclusive)
    and start (inclusive) positions, (B, T) or (B, S, T) 0/1.  past (2, B, N, P, h) and
    present (2, B, N, T, h) hold key and value."""

    max_inputs = 7

    class Result(NamedTuple):
        output: Tensor
        present: Tensor | None = None

    def __call__(self, input, weights, bias=None, mask_index=None, past=None, attention_bias=None,
                 past_sequence_length=None, *more, num_heads=None, qkv_hidden_sizes=None, unidirectional=0,
                 scale=None, mask_filter_value=-10000.0, do_rotary=0, past_present_share_buffer=0,
                 rotary_embedding_dim=0, **unknown):
        self.check_signature(more, unknown)
        x = self.tensor(input, "input")
        w = self.tensor(weights, "weights")
        b = self.tensor(bias, "bias", optional=True)
        mask = self.tensor(mask_index, "mask_index", optional=True)
        past_t = self.tensor(past, "past", optional=True)
        ab = self.tensor(attention_bias, "attention_bias", optional=True)
        psl = self.tensor(past_sequence_length, "past_sequence_length", optional=True)
        shapes = dict(input=x, weights=w, bias=b, mask_index=mask, past=past_t, attention_bias=ab)
        self.floats(FLOATS, input=x, weights=w, bias=b, past=past_t, attention_bias=ab)
        if int(do_rotary):
            raise self.unsupported("do_rotary=1", **shapes)
        if int(past_present_share_buffer) or not psl.is_absent:
            raise self.unsupported("past_present_share_buffer (past_sequence_length)", **shapes)
        if num_heads is None or int(num_heads) <= 0:
            raise self.error("the num_heads attribute (> 0) is required", **shapes)
        N = int(num_heads)
        if x.ndim != 3 or w.ndim != 2 or w.shape[0] != x.shape[2]:
            raise self.error("input must be (B, S, in_hidden) and weights (in_hidden, q + k + v hidden)", **shapes)
        total = w.shape[1]
        if qkv_hidden_sizes is not None and len(qkv_hidden_sizes):
            sizes = [int(s) for s in qkv_hidden_sizes]
            if len(sizes) != 3 or sum(sizes) != total or sizes[0] != sizes[1] or \
                    any(s <= 0 or s % N for s in sizes):
                raise self.error(f"qkv_hidden_sizes {sizes} must be three positive multiples of num_heads {N} "
                                 f"(Q and K equal) summing to the weights' {total} columns", **shapes)
        else:
            if total % 3 or (total // 3) % N:
                raise self.error(f"the weights' {total} columns must split into three hidden sizes divisible "
                                 f"by num_heads {N}", **shapes)
            sizes = [total // 3] * 3
        Dq, _, Dv = sizes
        if not b.is_absent:
            self.vector(b, "bias", total, weights=w)
        B, S, _ = x.shape
        cdt = np.float32
        qkv = self.sub(_OnnxMatMul, 13)(self.compute_tensor(x, cdt), self.compute_tensor(w, cdt)).array
        if not b.is_absent:
            qkv += self.to_compute(b, cdt)
        xp = self.xp
        q4 = _bnsh(xp, qkv[..., :Dq], N)
        k4 = _bnsh(xp, qkv[..., Dq:2 * Dq], N)
        v4 = _bnsh(xp, qkv[..., 2 * Dq:], N)
        h = Dq // N
        P = 0
        pk = pv = None
        if not past_t.is_absent:
            if Dv != Dq:
                raise self.error("past needs equal Q, K and V hidden sizes", **shapes)
            if past_t.ndim != 5 or past_t.shape[:3] != (2, B, N) or past_t.shape[4] != h:
                raise self.error(f"past must be (2, {B}, {N}, P, {h})", **shapes)
            P = past_t.shape[3]
            pa = self.to_compute(past_t, cdt)
            pk, pv = pa[0], pa[1]
        T = P + S
        add = self.padding_mask(mask, B, S, T, P, float(mask_filter_value), True, shapes)
        add = self.add_bias(add, ab, B, N, S, T, shapes)
        y, pres_k, pres_v = self.run_attention(q4, k4, v4, pk, pv, add, bool(int(unidirectional)),
                                               self.scale_of(scale, h), (DataType.FLOAT, DataType.FLOAT))
        out = self.from_compute(y, x.data_type)
        present = None
        if self.wants_output(1):
            present = self.from_compute(xp.stack([pres_k.array, pres_v.array]), x.data_type)
        return self.Result(out, present)


@register(domain=DOMAIN, versions=(1,))
class GroupQueryAttention(_AttentionBase):
    """Grouped-query attention with a KV cache (BNSH), as onnxruntime-genai runs it.

    query (B, S, N * h) (or packed QKV (B, S, (N + 2 Nkv) h) with key/value absent), key and
    value (B, S, Nkv * h), past_key/past_value (B, Nkv, C, h), seqlens_k (B,) int32 (the
    total length minus 1 of each entry), total_sequence_length (one int32).  For entry b:
    T = seqlens_k[b] + 1 tokens after the step, Q = query_seqlens[b] (default min(S, T))
    valid query rows, P = T - Q cached before it; the new keys go to rows [P, T) of the
    present cache (B, Nkv, max(C, total_sequence_length), h), rows [0, P) come from
    past_key.  Query row s sits at position P + s: causal attention, local_window_size W
    (keys j > P + s - W) and the rotary embedding (do_rotary: cos_cache/sin_cache
    (max_seq, rotary_dim / 2), positions from position_ids when given) use it.  Output
    rows [Q, S) are zeros; present rows past T keep past_key's rows (zeros beyond C)."""

    max_inputs = 17

    class Result(NamedTuple):
        output: Tensor
        present_key: Tensor | None = None
        present_value: Tensor | None = None
        output_qk: Tensor | None = None

    def __call__(self, query, key=None, value=None, past_key=None, past_value=None, seqlens_k=None,
                 total_sequence_length=None, cos_cache=None, sin_cache=None, position_ids=None,
                 attention_bias=None, head_sink=None, k_scale=None, v_scale=None, q_norm_weight=None,
                 k_norm_weight=None, query_seqlens=None, *more, num_heads=None, kv_num_heads=None, scale=None,
                 softcap=0.0, local_window_size=-1, do_rotary=0, rotary_interleaved=0, causal=1, qk_output=0,
                 smooth_softmax=-1, k_quant_type="NONE", v_quant_type="NONE", kv_cache_bit_width=0,
                 sliding_window_cache=0, qk_norm_epsilon=1e-6, q_norm_epsilon=None, k_norm_epsilon=None,
                 **unknown):
        self.check_signature(more, unknown)
        q = self.tensor(query, "query")
        k = self.tensor(key, "key", optional=True)
        v = self.tensor(value, "value", optional=True)
        pk = self.tensor(past_key, "past_key", optional=True)
        pv = self.tensor(past_value, "past_value", optional=True)
        sl = self.tensor(seqlens_k, "seqlens_k")
        tot = self.tensor(total_sequence_length, "total_sequence_length")
        cos = self.tensor(cos_cache, "cos_cache", optional=True)
        sin = self.tensor(sin_cache, "sin_cache", optional=True)
        pid = self.tensor(position_ids, "position_ids", optional=True)
        ab = self.tensor(attention_bias, "attention_bias", optional=True)
        qsl = self.tensor(query_seqlens, "query_seqlens", optional=True)
        shapes = dict(query=q, key=k, value=v, past_key=pk, past_value=pv, seqlens_k=sl,
                      total_sequence_length=tot)
        for name, t in (("head_sink", head_sink), ("k_scale", k_scale), ("v_scale", v_scale),
                        ("q_norm_weight", q_norm_weight), ("k_norm_weight", k_norm_weight)):
            if not self.tensor(t, name, optional=True).is_absent:
                raise self.unsupported(f"the input {name}", **shapes)
        for name, value_, default in (("k_quant_type", k_quant_type, "NONE"), ("v_quant_type", v_quant_type, "NONE")):
            text = value_.decode() if isinstance(value_, bytes) else str(value_)
            if text.upper() != default:
                raise self.unsupported(f"{name}={text!r} (a quantized KV cache)", **shapes)
        if int(smooth_softmax) == 1:
            raise self.unsupported("smooth_softmax=1", **shapes)
        if int(sliding_window_cache):
            raise self.unsupported("sliding_window_cache=1", **shapes)
        if int(qk_output) or (self.requested_outputs is not None and self.wants_output(3)):
            raise self.unsupported("the qk output", **shapes)
        self.floats(FLOATS, query=q, key=k, value=v, past_key=pk, past_value=pv, cos_cache=cos, sin_cache=sin,
                    attention_bias=ab)
        for name, t in (("seqlens_k", sl), ("total_sequence_length", tot), ("query_seqlens", qsl)):
            if not t.is_absent:
                self.check_type(name, t, {DataType.INT32})
        if not pid.is_absent:
            self.check_type("position_ids", pid, {DataType.INT64})
        if num_heads is None or kv_num_heads is None or int(num_heads) <= 0 or int(kv_num_heads) <= 0:
            raise self.error("the num_heads and kv_num_heads attributes (> 0) are required", **shapes)
        N, Nkv = int(num_heads), int(kv_num_heads)
        if N % Nkv:
            raise self.error(f"num_heads {N} must be a multiple of kv_num_heads {Nkv}", **shapes)
        causal = int(causal)
        W = int(local_window_size)
        if causal not in (0, 1) or (W != -1 and (W <= 0 or not causal)):
            raise self.error(f"causal must be 0 or 1 and local_window_size -1 or positive (with causal=1); got "
                             f"causal={causal}, local_window_size={W}", **shapes)
        if softcap is not None and float(softcap) < 0:
            raise self.error(f"softcap must be non-negative, got {softcap}", **shapes)

        # ------------------------------------------------------------------ shapes
        if q.ndim != 3:
            raise self.error("query must be 3-D (B, S, hidden)", **shapes)
        B, S, Dq = q.shape
        xp = self.xp
        if k.is_absent and v.is_absent:
            if Dq % (N + 2 * Nkv):
                raise self.error(f"packed QKV hidden size {Dq} is not a multiple of num_heads + 2 * kv_num_heads "
                                 f"= {N + 2 * Nkv}", **shapes)
            h = Dq // (N + 2 * Nkv)
            qa, ka, va = q.array[..., :N * h], q.array[..., N * h:(N + Nkv) * h], q.array[..., (N + Nkv) * h:]
        elif k.is_absent or v.is_absent:
            raise self.error("key and value must be given together (or both omitted for packed QKV)", **shapes)
        else:
            if Dq % N:
                raise self.error(f"the query hidden size {Dq} is not divisible by num_heads {N}", **shapes)
            h = Dq // N
            if k.shape != (B, S, Nkv * h) or v.shape != (B, S, Nkv * h):
                raise self.error(f"key and value must be ({B}, {S}, {Nkv * h}) (new tokens only)", **shapes)
            qa, ka, va = q.array, k.array, v.array
        if pk.is_absent != pv.is_absent:
            raise self.error("past_key and past_value must be given together", **shapes)
        C = 0
        if not pk.is_absent:
            if pk.ndim != 4 or pk.shape[:2] != (B, Nkv) or pk.shape[3] != h or pv.shape != pk.shape:
                raise self.error(f"past_key/past_value must be ({B}, {Nkv}, C, {h}) of one shape", **shapes)
            C = pk.shape[2]
        if sl.shape != (B,):
            raise self.error(f"seqlens_k must have shape ({B},)", **shapes)
        if tot.size != 1:
            raise self.error("total_sequence_length must hold one value", **shapes)
        lens = host_ints(sl) + 1
        total = int(host_ints(tot).reshape(-1)[0])
        if not qsl.is_absent:
            if qsl.shape != (B,):
                raise self.error(f"query_seqlens must have shape ({B},)", query_seqlens=qsl, **shapes)
            qlen = host_ints(qsl)
        else:
            qlen = np.minimum(S, lens)
        past_len = lens - qlen
        if (lens < 1).any() or (qlen < 0).any() or (qlen > np.minimum(S, lens)).any() or (past_len > C).any():
            raise self.error(f"seqlens_k + 1 = {lens.tolist()} with {S} new tokens per entry (valid: "
                             f"{qlen.tolist()}) needs past lengths {past_len.tolist()} within the past cache's {C} "
                             "rows", **shapes)
        Tp = max(C, total, int(lens.max()) if B else 0)
        if not ab.is_absent and (ab.ndim != 4 or ab.shape[0] not in (1, B) or ab.shape[1] not in (1, N)
                                 or ab.shape[2] != S or ab.shape[3] < int(lens.max())):
            raise self.error(f"attention_bias must be ({B} or 1, {N} or 1, {S}, total length >= "
                             f"{int(lens.max())})", attention_bias=ab, **shapes)
        rotary = None
        if int(do_rotary):
            if cos.is_absent or sin.is_absent or cos.ndim != 2 or cos.shape != sin.shape or 2 * cos.shape[1] > h:
                raise self.error(f"do_rotary needs cos_cache/sin_cache of one shape (max_seq, rotary_dim / 2 <= "
                                 f"{h // 2})", cos_cache=cos, sin_cache=sin, **shapes)
            if not pid.is_absent and pid.shape != (B, S):
                raise self.error(f"position_ids must be ({B}, {S})", position_ids=pid, **shapes)
            rotary = (cos, sin, int(rotary_interleaved))

        # ------------------------------------------------------------------ compute
        kv_type = k.data_type if not k.is_absent else q.data_type
        present_k = xp.zeros((B, Nkv, Tp, h), dtype=pk.array.dtype if C else ka.dtype)
        present_v = xp.zeros_like(present_k)
        if C:
            present_k[:, :, :C] = pk.array
            present_v[:, :, :C] = pv.array
        out = xp.zeros((B, S, N * h), dtype=qa.dtype)
        sc = self.scale_of(scale, h)
        window = {"left_window_size": W - 1} if W > 0 else {}
        version = 25 if window else 23
        softcap_ = {"softcap": float(softcap)} if softcap else {}
        # entries with the same (valid rows, past length) run together
        groups: dict = {}
        for bi in range(B):
            groups.setdefault((int(qlen[bi]), int(past_len[bi])), []).append(bi)
        for (nq, np_), members in groups.items():
            if nq == 0:
                continue
            idx = xp.asarray(np.asarray(members, dtype=np.int64))
            full = len(members) == B
            qb = qa[:, :nq] if full else qa[idx, :nq]
            kb = ka[:, :nq] if full else ka[idx, :nq]
            vb = va[:, :nq] if full else va[idx, :nq]
            if rotary is not None:
                if pid.is_absent:
                    pos = np.broadcast_to(np.arange(np_, np_ + nq, dtype=np.int64), (len(members), nq))
                    pos = Tensor.wrap(xp.asarray(np.ascontiguousarray(pos)), DataType.INT64)
                else:
                    pos = Tensor.wrap(xp.ascontiguousarray((pid.array if full else pid.array[idx])[:, :nq]),
                                      DataType.INT64)
                rot = self.sub(_OnnxRotaryEmbedding, 23)
                c, s_, il = rotary
                qb = rot(Tensor.wrap(xp.ascontiguousarray(qb), q.data_type), c, s_, pos, interleaved=il,
                         num_heads=N, rotary_embedding_dim=2 * c.shape[1]).array
                kb = rot(Tensor.wrap(xp.ascontiguousarray(kb), kv_type), c, s_, pos, interleaved=il,
                         num_heads=Nkv, rotary_embedding_dim=2 * c.shape[1]).array
            past_b = None
            if np_:
                past_b = (present_k[:, :, :np_] if full else present_k[idx, :, :np_],
                          present_v[:, :, :np_] if full else present_v[idx, :, :np_])
            add = None
            if not ab.is_absent:
                a = self.to_compute(ab, np.float32)
                a = a if a.shape[0] == 1 or full else a[idx]
                add = xp.ascontiguousarray(a[:, :, :nq, :np_ + nq])
            y, pres_k, pres_v = self.run_attention(
                _bnsh(xp, qb, N), _bnsh(xp, kb, Nkv), _bnsh(xp, vb, Nkv),
                None if past_b is None else past_b[0], None if past_b is None else past_b[1], add,
                bool(causal), sc, (q.data_type, kv_type), version, **window, **softcap_)
            if full:
                out[:, :nq] = y
                present_k[:, :, :np_ + nq] = pres_k.array
                present_v[:, :, :np_ + nq] = pres_v.array
            else:
                out[idx, :nq] = y
                present_k[idx, :, :np_ + nq] = pres_k.array
                present_v[idx, :, :np_ + nq] = pres_v.array
        return self.Result(Tensor.wrap(out, q.data_type),
                           Tensor.wrap(present_k, pk.data_type if C else kv_type) if self.wants_output(1) else None,
                           Tensor.wrap(present_v, pv.data_type if C else kv_type) if self.wants_output(2) else None,
                           None)


__all__ = ["RotaryEmbedding", "MultiHeadAttention", "Attention", "GroupQueryAttention"]
