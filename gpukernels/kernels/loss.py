"""NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.

Inputs are (N, C) or (N, C, d1, ..., dk), targets (N) or (N, d1, ..., dk).  Targets
must lie in [0, C) or equal ignore_index (anything else raises).  Ignored elements get
loss 0 and weight 0.  'mean' divides the summed loss by the summed weights of the
non-ignored elements (by their count when no weight is given); when every element is
ignored that is 0/0 = NaN, as the spec's formula gives.  Half types compute in float32
and round once.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..tensor import Tensor
from .base import KernelBase, register

_REDUCTIONS = ("none", "sum", "mean")


def _log_softmax(xp, x, axis):
    m = xp.max(x, axis=axis, keepdims=True)
    shifted = x - m
    return shifted - xp.log(xp.sum(xp.exp(shifted), axis=axis, keepdims=True))


class _LossBase(KernelBase):
    def _validate(self, x, t, w, reduction, names):
        named = {names[0]: x, names[1]: t, names[2]: w}
        if reduction not in _REDUCTIONS:
            raise self.error(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}", **named)
        if x.ndim < 2:
            raise self.error(f"{names[0]} must be (N, C) or (N, C, d1, ..., dk)", **named)
        want = (x.shape[0],) + x.shape[2:]
        if t.shape != want:
            raise self.error(f"{names[1]} must have shape {list(want)} for {names[0]} of shape "
                             f"{list(x.shape)}", **named)
        if not w.is_absent and w.shape != (x.shape[1],):
            raise self.error(f"{names[2]} must be 1-D with C={x.shape[1]} elements", **named)
        return named

    def _nll(self, logp, t, w, ignore_index, reduction, named, target_name):
        """loss (compute dtype) from log-probabilities logp (N, C, ...)."""
        xp = self.xp
        c = logp.shape[1]
        tgt = t.array.astype(np.int64, copy=False)
        ignored = (tgt == int(ignore_index)) if ignore_index is not None else None
        if tgt.size:
            bad = (tgt < 0) | (tgt >= c)
            if ignored is not None:
                bad &= ~ignored
            if bool(xp.any(bad)):
                first = int(tgt[bad].ravel()[0])
                raise self.error(f"{target_name} value {first} is outside [0, {c}) and is not "
                                 f"ignore_index ({ignore_index})", **named)
        safe = xp.where(ignored, 0, tgt) if ignored is not None else tgt
        picked = xp.take_along_axis(logp, safe[:, None], axis=1)[:, 0]
        loss = -picked
        weights = None
        if not w.is_absent:
            wc = self.to_compute(w, logp.dtype)
            weights = wc[safe]
            if ignored is not None:
                weights = xp.where(ignored, 0, weights).astype(logp.dtype)
            loss = loss * weights
        elif ignored is not None:
            weights = (~ignored).astype(logp.dtype)
            loss = xp.where(ignored, 0, loss).astype(logp.dtype)
        if reduction == "none":
            return loss
        total = xp.sum(loss)
        if reduction == "sum":
            return total
        with np.errstate(invalid="ignore", divide="ignore"):
            if weights is not None:
                return total / xp.sum(weights)
            return total / loss.size if loss.size else total * np.nan


@register()
class NegativeLogLikelihoodLoss(_LossBase):
    def __call__(self, input, target, weight=None, ignore_index=None, reduction="mean"):
        x = self.tensor(input, "input")
        t = self.tensor(target, "target")
        w = self.tensor(weight, "weight", optional=True)
        self.check_inputs(x, t, w)
        named = self._validate(x, t, w, reduction, ("input", "target", "weight"))
        logp = self.to_compute(x)
        loss = self._nll(logp, t, w, ignore_index, reduction, named, "target")
        return self.from_compute(self.xp.asarray(loss, dtype=logp.dtype), x.data_type)


@register()
class SoftmaxCrossEntropyLoss(_LossBase):
    class Result(NamedTuple):
        output: Tensor
        log_prob: Tensor

    def __call__(self, scores, labels, weights=None, ignore_index=None, reduction="mean"):
        x = self.tensor(scores, "scores")
        t = self.tensor(labels, "labels")
        w = self.tensor(weights, "weights", optional=True)
        self.check_inputs(x, t, w)
        named = self._validate(x, t, w, reduction, ("scores", "labels", "weights"))
        xc = self.to_compute(x)
        logp = _log_softmax(self.xp, xc, 1) if xc.size else xc
        loss = self._nll(logp, t, w, ignore_index, reduction, named, "labels")
        out = self.from_compute(self.xp.asarray(loss, dtype=xc.dtype), x.data_type)
        log_prob = self.from_compute(logp, x.data_type) if self.wants_output(1) else Tensor()
        return self.Result(out, log_prob)
