"""CausalConvWithState (opset 27): stateful causal depthwise 1-D convolution.

With P = concat(past_state or zeros (batch, channels, k-1), input) along the length axis,
output[b, c, t] = act(bias[c] + sum_j weight[c, 0, j] * P[b, c, t + j]) and
present_state = the last k-1 positions of P.  activation is 'none', 'silu' or its alias
'swish' (x * sigmoid(x)); names match case-insensitively.  Half types compute in float32
and round once; a kernel of size 1 keeps an empty (batch, channels, 0) state.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ...tensor import Tensor
from ..base import KernelBase, register


@register()
class CausalConvWithState(KernelBase):
    class Result(NamedTuple):
        output: Tensor
        present_state: Tensor | None

    def __call__(self, input, weight, bias=None, past_state=None, activation="none"):
        x = self.tensor(input, "input")
        w = self.tensor(weight, "weight")
        b = self.tensor(bias, "bias", optional=True)
        ps = self.tensor(past_state, "past_state", optional=True)
        self.check_inputs(x, w, b, ps)
        shapes = dict(input=x, weight=w, bias=b, past_state=ps)
        act = (activation.decode() if isinstance(activation, bytes) else str(activation or "none")).lower()
        if act not in ("none", "silu", "swish"):
            raise self.error(f"activation must be 'none', 'silu' or 'swish', got {activation!r}", **shapes)
        if x.ndim != 3:
            raise self.error("input must be 3-D (batch, channels, length)", **shapes)
        B, C, L = x.shape
        if w.ndim != 3 or w.shape[0] != C or w.shape[1] != 1 or w.shape[2] < 1:
            raise self.error(f"weight must have shape (channels, 1, k) = ({C}, 1, k) with k >= 1", **shapes)
        k = w.shape[2]
        if not b.is_absent and b.shape != (C,):
            raise self.error(f"bias must have shape ({C},)", **shapes)
        if not ps.is_absent and ps.shape != (B, C, k - 1):
            raise self.error(f"past_state must have shape (batch, channels, k-1) = ({B}, {C}, {k - 1})",
                             **shapes)

        xp = self.xp
        xc = self.to_compute(x)
        cdt = xc.dtype
        past = self.to_compute(ps, cdt) if not ps.is_absent else xp.zeros((B, C, k - 1), dtype=cdt)
        padded = xp.concatenate([past, xc], axis=2) if k > 1 else xc
        wc = self.to_compute(w, cdt)[:, 0, :]  # (C, k)
        out = xp.zeros((B, C, L), dtype=cdt) if b.is_absent else \
            xp.broadcast_to(self.to_compute(b, cdt)[None, :, None], (B, C, L)).copy()
        for j in range(k):
            out += wc[None, :, j:j + 1] * padded[:, :, j:j + L]
        if act != "none":
            with np.errstate(over="ignore"):
                out = out / (1 + xp.exp(-out))
        y = self.from_compute(out, x.data_type)
        state = None
        if self.wants_output(1):
            state = self.from_compute(xp.ascontiguousarray(padded[:, :, padded.shape[2] - (k - 1):]), x.data_type)
        return self.Result(y, state)
