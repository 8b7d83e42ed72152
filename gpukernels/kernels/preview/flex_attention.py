"""ai.onnx.preview FlexAttention."""

from __future__ import annotations

import math

import numpy as np

from ... import dtypes
from ...dtypes import DataType
from ...tensor import Tensor
from ..base import KernelBase, register

_PRECISIONS = {int(DataType.FLOAT): np.float32, int(DataType.DOUBLE): np.float64,
               int(DataType.FLOAT16): np.float32, int(DataType.BFLOAT16): np.float32}


@register(domain="ai.onnx.preview")
class FlexAttention(KernelBase):
    """Y = prob_mod(softmax(score_mod((Q @ K^T) * scale))) @ V over rank-4 inputs
    Q [B, Hq, L, E], K [B, Hkv, S, E], V [B, Hkv, S, Ev]; query head h uses K/V head
    h // (Hq / Hkv).

    scale defaults to 1/sqrt(E).  The scores, the softmax and the final product are
    computed in the softmax precision (softmax_precision: FLOAT or DOUBLE; FLOAT16 and
    BFLOAT16 are accepted and computed in float32 -- the spec leaves them open; default
    float32, or double for double inputs); Y is rounded once to the input type.  The
    modifier graphs get one tensor of the softmax precision ([B, Hq, L, S]) and must
    return one of the same shape; they run through the graph runtime
    (``run_subgraph``) and may read outer-scope values.  A row whose scores are all
    -inf gives NaN, as exp/sum does."""

    def __call__(self, Q, K, V, prob_mod=None, scale=None, score_mod=None, softmax_precision=None):
        q = self.tensor(Q, "Q")
        k = self.tensor(K, "K")
        v = self.tensor(V, "V")
        self.check_inputs(q, k, v)
        named = dict(Q=q, K=k, V=v)
        if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
            raise self.error("Q, K and V must be rank-4", **named)
        b, hq, l_, e = q.shape
        bk, hkv, s, ek = k.shape
        bv, hv, sv, ev = v.shape
        if bk != b or bv != b:
            raise self.error("Q, K and V must share the batch size", **named)
        if ek != e:
            raise self.error(f"K's head size {ek} differs from Q's {e}", **named)
        if hv != hkv or sv != s:
            raise self.error("K and V must share the number of heads and the sequence length", **named)
        if hkv == 0 or hq % hkv:
            raise self.error(f"q_num_heads ({hq}) must be a multiple of kv_num_heads ({hkv})", **named)
        if softmax_precision is None:
            cdtype = np.float64 if q.data_type == DataType.DOUBLE else np.float32
            cprec = DataType.DOUBLE if q.data_type == DataType.DOUBLE else DataType.FLOAT
        else:
            if int(softmax_precision) not in _PRECISIONS:
                raise self.error(f"softmax_precision {softmax_precision} is not FLOAT(1), DOUBLE(11), "
                                 "FLOAT16(10) or BFLOAT16(16)", **named)
            cdtype = _PRECISIONS[int(softmax_precision)]
            cprec = DataType.DOUBLE if cdtype == np.float64 else DataType.FLOAT
        if scale is None:
            scale = 1.0 / math.sqrt(e) if e else 1.0
        xp = self.xp
        qc = self.to_compute(q, cdtype)
        kc = self.to_compute(k, cdtype)
        vc = self.to_compute(v, cdtype)
        group = hq // hkv
        # group query heads by their K/V head: [B, Hkv, group*L, E], no K/V copies
        qg = qc.reshape(b, hkv, group * l_, e)
        scores = xp.matmul(qg, xp.swapaxes(kc, -1, -2)).reshape(b, hq, l_, s) * cdtype(scale)
        scores = scores.astype(cdtype, copy=False)
        if score_mod is not None:
            scores = self._modify(score_mod, scores, cprec, cdtype, "score_mod")
        with np.errstate(invalid="ignore", over="ignore"):
            if s:
                m = xp.max(scores, axis=-1, keepdims=True)
                ex = xp.exp(scores - m)
                probs = ex / xp.sum(ex, axis=-1, keepdims=True)
            else:
                probs = scores
        if prob_mod is not None:
            probs = self._modify(prob_mod, probs, cprec, cdtype, "prob_mod")
        y = xp.matmul(probs.reshape(b, hkv, group * l_, s), vc).reshape(b, hq, l_, ev)
        return self.from_compute(y, q.data_type)

    def _modify(self, graph, values, cprec, cdtype, what):
        outs = self.run_subgraph(graph, [Tensor.wrap(values, cprec)])
        if len(outs) != 1:
            raise self.error(f"{what} must produce exactly one output, got {len(outs)}")
        out = outs[0]
        if not isinstance(out, Tensor):
            out = self.tensor(out, what)
        if tuple(out.shape) != tuple(values.shape):
            raise self.error(f"{what} changed the shape {list(values.shape)} to {list(out.shape)}")
        if out.data_type != cprec:
            raise self.type_error(f"{what} returned {dtypes.describe(out.data_type)}, expected "
                                  f"{dtypes.describe(cprec)}")
        out = out if out.device == self.device else out.to(self.device)
        return out.array.astype(cdtype, copy=False)
