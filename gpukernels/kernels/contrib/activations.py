"""Activation fusions of onnxruntime (com.microsoft): Gelu, FastGelu, BiasGelu, QuickGelu,
BiasAdd.

Gelu is ONNX Gelu (erf form); FastGelu is ONNX Gelu with approximate='tanh'
(0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), onnxruntime's 0.797885 x +
0.035677 x^3 written out); BiasGelu is Gelu(A + B); QuickGelu is x * sigmoid(alpha x),
the logistic-family chain of Swish.  A bias is 1-D and added along the last axis, in the
compute type (float32 for half types), and the result is rounded once.
"""

from __future__ import annotations

import numpy as np

from ...dtypes import DataType
from ...tensor import Tensor
from ..base import register
from ..math.activations import Gelu as _OnnxGelu
from ..math.activations import logistic_pass
from ._common import DOMAIN, FLOATS_DOUBLE, ContribKernel


class _BiasedGelu(ContribKernel):
    approximate = "none"

    def _gelu(self, X, bias, bias_required: bool):
        x = self.tensor(X, "X")
        b = self.tensor(bias, "bias", optional=not bias_required)
        self.floats(FLOATS_DOUBLE, X=x, bias=b)
        gelu = self.sub(_OnnxGelu, 20)
        if b.is_absent:
            return gelu(x, approximate=self.approximate)
        if x.ndim < 1:
            raise self.error("X must have at least one dimension to add a bias", X=x, bias=b)
        self.vector(b, "bias", x.shape[-1], X=x)
        s = self.to_compute(x) + self.to_compute(b)
        y = gelu(Tensor.wrap(s, DataType.DOUBLE if s.dtype == np.float64 else DataType.FLOAT),
                 approximate=self.approximate)
        return self.from_compute(y.array, x.data_type)


@register("Gelu", domain=DOMAIN, versions=(1,))
class Gelu(_BiasedGelu):
    """0.5 x (1 + erf(x / sqrt 2)): ONNX Gelu."""

    max_inputs = 1

    def __call__(self, X, *more, **unknown):
        self.check_signature(more, unknown)
        return self._gelu(X, None, False)


@register(domain=DOMAIN, versions=(1,))
class FastGelu(_BiasedGelu):
    """The tanh approximation of Gelu of X (+ bias, 1-D along the last axis)."""

    max_inputs = 2
    approximate = "tanh"

    def __call__(self, X, bias=None, *more, **unknown):
        self.check_signature(more, unknown)
        return self._gelu(X, bias, False)


@register(domain=DOMAIN, versions=(1,))
class BiasGelu(_BiasedGelu):
    """Gelu (erf form) of A + B, B 1-D along A's last axis."""

    max_inputs = 2

    def __call__(self, A, B, *more, **unknown):
        self.check_signature(more, unknown)
        return self._gelu(A, B, True)


@register(domain=DOMAIN, versions=(1,))
class QuickGelu(ContribKernel):
    """x * sigmoid(alpha x), alpha default 1.702."""

    max_inputs = 1

    def __call__(self, X, *more, alpha=1.702, **unknown):
        self.check_signature(more, unknown)
        x = self.tensor(X, "X")
        self.check_type("X", x, FLOATS_DOUBLE)
        xc = self.to_compute(x)
        with np.errstate(all="ignore"):
            y = logistic_pass(self.xp, xc, "Swish", alpha=float(alpha))
        return self.from_compute(y, x.data_type)


@register(domain=DOMAIN, versions=(1,))
class BiasAdd(ContribKernel):
    """Y = X + bias + skip: X and skip (N, S, C), bias (C,)."""

    max_inputs = 3

    def __call__(self, X, bias, skip, *more, **unknown):
        self.check_signature(more, unknown)
        x = self.tensor(X, "X")
        b = self.tensor(bias, "bias")
        s = self.tensor(skip, "skip")
        self.floats({DataType.FLOAT, DataType.FLOAT16}, X=x, bias=b, skip=s)
        if x.ndim != 3:
            raise self.error("X must be 3-D (N, S, C)", X=x, bias=b, skip=s)
        if s.shape != x.shape:
            raise self.error("skip must have X's shape", X=x, bias=b, skip=s)
        self.vector(b, "bias", x.shape[2], X=x)
        y = self.to_compute(x) + self.to_compute(b)
        y += self.to_compute(s)
        return self.from_compute(y, x.data_type)


__all__ = ["Gelu", "FastGelu", "BiasGelu", "QuickGelu", "BiasAdd"]
