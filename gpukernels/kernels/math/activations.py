"""Activation functions: Sigmoid, Softplus, Softsign, Mish, HardSwish, HardSigmoid, Elu,
Celu, Gelu, Swish, SwiGLU, ThresholdedRelu, LeakyRelu, PRelu, Shrink, Selu.

Half types are computed in float32 and rounded once.  Sigmoid, Softplus and Mish use
overflow-free forms (no inf/inf), so large |x| saturates cleanly; NaN propagates.
Long chains (Gelu, Mish, Sigmoid...) are evaluated block by block on the host to keep
temporaries in cache.
"""

from __future__ import annotations

import math

import numpy as np

from ..base import KernelBase, register
from ._mathcommon import MathUnary, XUnary, blockwise, erf


def _sigmoid(xp, x):
    """1 / (1 + exp(-x)) without overflow: exp(-|x|) is in (0, 1]."""
    e = xp.exp(-xp.abs(x))
    d = e + x.dtype.type(1)
    return xp.where(x >= 0, x.dtype.type(1), e) / d


def _softplus(xp, x):
    """log(1 + exp(x)) = max(x, 0) + log1p(exp(-|x|))."""
    return xp.maximum(x, x.dtype.type(0)) + xp.log1p(xp.exp(-xp.abs(x)))


@register()
class Sigmoid(XUnary):
    def compute(self, xp, x):
        return blockwise(xp, lambda v: _sigmoid(xp, v), x)


@register()
class Softplus(MathUnary):
    def __call__(self, X):
        return self.apply(X, "X")

    def compute(self, xp, x):
        return blockwise(xp, lambda v: _softplus(xp, v), x)


@register()
class Softsign(MathUnary):
    def __call__(self, input):
        return self.apply(input, "input")

    def compute(self, xp, x):
        return x / (xp.abs(x) + x.dtype.type(1))


@register()
class Mish(MathUnary):
    """x * tanh(softplus(x))."""

    def __call__(self, X):
        return self.apply(X, "X")

    def compute(self, xp, x):
        return blockwise(xp, lambda v: v * xp.tanh(_softplus(xp, v)), x)


@register()
class HardSwish(MathUnary):
    """x * max(0, min(1, x / 6 + 1/2))."""

    def __call__(self, X):
        return self.apply(X, "X")

    def compute(self, xp, x):
        f = x.dtype.type
        return x * xp.clip(x * f(1.0 / 6.0) + f(0.5), f(0), f(1))


@register()
class HardSigmoid(MathUnary):
    """max(0, min(1, alpha * x + beta))."""

    def __call__(self, X, alpha=0.2, beta=0.5, consumed_inputs=None):
        return self.apply(X, "X", alpha=alpha, beta=beta)

    def compute(self, xp, x, alpha, beta):
        f = x.dtype.type
        return xp.clip(x * f(alpha) + f(beta), f(0), f(1))


@register()
class Elu(MathUnary):
    """x for x > 0, alpha * (exp(x) - 1) otherwise."""

    def __call__(self, X, alpha=1.0, consumed_inputs=None):
        return self.apply(X, "X", alpha=alpha)

    def compute(self, xp, x, alpha):
        return xp.where(x > 0, x, x.dtype.type(alpha) * xp.expm1(xp.minimum(x, x.dtype.type(0))))


@register()
class Celu(MathUnary):
    """max(0, x) + min(0, alpha * (exp(x / alpha) - 1)); alpha must be non-zero."""

    def __call__(self, X, alpha=1.0):
        if alpha == 0:
            raise self.error("alpha must be non-zero", X=X)
        return self.apply(X, "X", alpha=alpha)

    def compute(self, xp, x, alpha):
        f = x.dtype.type
        neg = f(alpha) * xp.expm1(xp.minimum(x, f(0)) / f(alpha))
        return xp.maximum(x, f(0)) + xp.minimum(neg, f(0))


_SQRT1_2 = 1.0 / math.sqrt(2.0)
_SQRT_2_PI = math.sqrt(2.0 / math.pi)

# float32 Gelu on the host: erf(x / sqrt 2) = tanh(t * G(t^2)) with t = clip(x, -6, 6) and G
# the degree-6 polynomial below (a weighted minimax fit of atanh(erf(x / sqrt 2)) / x).
# Against float64 the result is within 1.1e-7 of erf, so Gelu is within 1.6e-7 relative
# for x >= -1 and 7e-7 absolute everywhere (the former rational erf: 2.4e-7 / 1.2e-6).
# tanh(6 * G(36)) = tanh(10.7) is exactly 1 in float32, so the tails saturate cleanly.
# Fewer passes than a rational erf (19 in-place ufunc calls per block instead of ~30).
_GELU_G = (0.7978842123598643, 0.036335611581176756, -3.497889329194118e-05, -5.441374149485185e-05,
           3.81520109543707e-06, -1.2118055784503918e-07, 1.4642918914334346e-09)
_GELU_CLIP = 6.0
_GELU_BLOCK = 1 << 15  # elements: x, out and two scratch blocks stay in L2


def _gelu_erf_f32(xp, x):
    """0.5 x (1 + erf(x / sqrt 2)) of a float32 array, block by block, in place."""
    f = np.float32
    g = [f(c) for c in _GELU_G]
    flat = xp.ascontiguousarray(x).reshape(-1)
    out = xp.empty_like(flat)
    n = flat.size
    block = min(n, _GELU_BLOCK) if xp is np else n
    t_buf = xp.empty(block, f)
    z_buf = xp.empty(block, f)
    lo, hi = f(-_GELU_CLIP), f(_GELU_CLIP)
    for s in range(0, n, max(block, 1)):
        e = min(n, s + block)
        xb, p = flat[s:e], out[s:e]
        t, z = t_buf[:e - s], z_buf[:e - s]
        xp.clip(xb, lo, hi, out=t)
        xp.multiply(t, t, out=z)
        xp.multiply(z, g[6], out=p)
        for c in g[5:0:-1]:
            p += c
            p *= z
        p += g[0]
        p *= t
        xp.tanh(p, out=p)
        xp.multiply(xb, f(0.5), out=t)
        p *= t
        p += t
    return out.reshape(x.shape)


@register()
class Gelu(MathUnary):
    """approximate='none': 0.5 x (1 + erf(x / sqrt 2)); 'tanh': 0.5 x (1 + tanh(sqrt(2/pi)
    (x + 0.044715 x^3))).  float32 on the host uses a tanh-based erf (see _GELU_G)."""

    def __call__(self, X, approximate="none"):
        if isinstance(approximate, bytes):
            approximate = approximate.decode()
        if approximate not in ("none", "tanh"):
            raise self.error(f"approximate must be 'none' or 'tanh', got {approximate!r}", X=X)
        return self.apply(X, "X", approximate=approximate)

    def compute(self, xp, x, approximate):
        f = x.dtype.type
        if approximate == "tanh":
            def fn(v):
                inner = v * v
                inner *= f(0.044715)
                inner += f(1)
                inner *= v
                inner *= f(_SQRT_2_PI)
                t = xp.tanh(inner)
                t += f(1)
                t *= v
                t *= f(0.5)
                return t
            return blockwise(xp, fn, x)
        if xp is np and x.dtype == np.float32:
            return _gelu_erf_f32(xp, x)
        e = erf(xp, x * f(_SQRT1_2))
        e += f(1)
        e *= x
        e *= f(0.5)
        return e


@register()
class Swish(MathUnary):
    """x * sigmoid(alpha * x)."""

    def __call__(self, X, alpha=1.0):
        return self.apply(X, "X", alpha=alpha)

    def compute(self, xp, x, alpha):
        a = x.dtype.type(alpha)
        return blockwise(xp, lambda v: v * _sigmoid(xp, v * a), x)


@register()
class SwiGLU(KernelBase):
    """Y = Swish_alpha(A) * B; A and B must have the same shape (no broadcasting)."""

    def __call__(self, A, B, alpha=1.0):
        a = self.tensor(A, "A")
        b = self.tensor(B, "B")
        self.check_inputs(a, b)
        if a.shape != b.shape:
            raise self.error("A and B must have the same shape", A=a, B=b)
        xa, xb = self.to_compute(a), self.to_compute(b)
        al = xa.dtype.type(alpha)
        xp = self.xp
        with np.errstate(all="ignore"):
            y = blockwise(xp, lambda u, v: u * _sigmoid(xp, u * al) * v, xa, None, xb)
        return self.from_compute(y, a.data_type)


@register()
class ThresholdedRelu(MathUnary):
    """x for x > alpha, 0 otherwise."""

    def __call__(self, X, alpha=1.0):
        return self.apply(X, "X", alpha=alpha)

    def compute(self, xp, x, alpha):
        return xp.where(x > x.dtype.type(alpha), x, x.dtype.type(0))


@register()
class LeakyRelu(MathUnary):
    """x for x >= 0, alpha * x otherwise."""

    def __call__(self, X, alpha=0.01, consumed_inputs=None):
        return self.apply(X, "X", alpha=alpha)

    def compute(self, xp, x, alpha):
        return xp.where(x < 0, x * x.dtype.type(alpha), x)


@register()
class Selu(MathUnary):
    """gamma * x for x > 0, gamma * alpha * (exp(x) - 1) otherwise.  Defaults (when the
    attributes are not given) follow the version: opset 1 used alpha=1.6732,
    gamma=1.0507; opset 6+ the more precise 1.67326319..., 1.05070102..."""

    def __call__(self, X, alpha=None, gamma=None, consumed_inputs=None):
        if alpha is None:
            alpha = 1.673200011253357 if self.since_version < 6 else 1.6732631921768188
        if gamma is None:
            gamma = 1.0506999492645264 if self.since_version < 6 else 1.0507010221481323
        return self.apply(X, "X", alpha=alpha, gamma=gamma)

    def compute(self, xp, x, alpha, gamma):
        f = x.dtype.type
        neg = f(alpha) * xp.expm1(xp.minimum(x, f(0)))
        return f(gamma) * xp.where(x > 0, x, neg)


@register()
class Shrink(MathUnary):
    """x + bias for x < -lambd, x - bias for x > lambd, 0 otherwise.  Integer inputs are
    computed in float64 and converted back toward zero (wrapping like a C cast)."""

    def __call__(self, input, bias=0.0, lambd=0.5):
        return self.apply(input, "input", bias=bias, lambd=lambd)

    def compute(self, xp, x, bias, lambd):
        if x.dtype.kind in "iu":
            v = x.astype(np.float64)
            y = xp.where(v < -lambd, v + bias, xp.where(v > lambd, v - bias, 0.0))
            y = xp.trunc(y)
            return y.astype(np.int64).astype(x.dtype) if x.dtype != np.uint64 else y.astype(x.dtype)
        f = x.dtype.type
        return xp.where(x < f(-lambd), x + f(bias), xp.where(x > f(lambd), x - f(bias), f(0)))


@register()
class PRelu(KernelBase):
    """slope * x for x < 0, x otherwise.  Opset 7+: slope broadcasts unidirectionally to
    X.  Opset 1 and 6 (no broadcasting rule in the spec): slope may hold one value, have
    X's shape, or be a 1-D per-channel tensor of size X.shape[1]; other unidirectionally
    broadcastable shapes are accepted too."""

    def __call__(self, X, slope, consumed_inputs=None):
        x = self.tensor(X, "X")
        s = self.tensor(slope, "slope")
        self.check_inputs(x, s)
        xc = self.to_compute(x)
        sc = self.to_compute(s)
        if self.since_version < 7 and s.ndim == 1 and x.ndim >= 2 and s.shape[0] == x.shape[1] \
                and s.shape[0] != x.shape[-1]:
            sc = sc.reshape((x.shape[1],) + (1,) * (x.ndim - 2))
        try:
            target = np.broadcast_shapes(xc.shape, sc.shape)
        except ValueError:
            target = None
        if target != tuple(x.shape):
            raise self.error("slope does not broadcast unidirectionally to X", X=x, slope=s)
        xp = self.xp
        y = xp.where(xc < 0, xc * sc, xc)
        return self.from_compute(y, x.data_type)
