"""Activation functions: Sigmoid, Softplus, Softsign, Mish, HardSwish, HardSigmoid, Elu,
Celu, Gelu, Swish, SwiGLU, ThresholdedRelu, LeakyRelu, PRelu, Shrink, Selu.

Half types are computed in float32 and rounded once.  Sigmoid, Softplus and Mish use
overflow-free forms (no inf/inf), so large |x| saturates cleanly; NaN propagates.
Long chains (Gelu, Softplus...) are evaluated block by block on the host to keep
temporaries in cache.

The logistic family (Sigmoid, HardSigmoid, Swish, HardSwish, Mish) is one chain of
in-place array operations per operator (``_LOGISTIC_CHAINS``), written once against
``xp`` and run by ``logistic_pass``: on the host block by block (64 Ki elements, the
blocks handed to the host threads), each block read once and written once; on a GPU
once over the whole array.  Compiled graphs call the chain directly
(``_logistic_array_function``: no per-call validation, 20-40 us less per node).  The forms:

* Sigmoid(x) = 1 / (1 + exp(-x)).  exp(-x) overflows to inf for x below about -88
  (float32), giving 1 / inf = 0 (the true value is below 1.2e-38 there); IEEE warnings
  are off, so no overflow warning.  Elsewhere within 2 float32 ulp of the float64 value.
* Swish(x) = x / (1 + exp(-alpha x)), the same form.
* Mish(x) = x * tanh(softplus(x)) = x * n / (n + 2) with n = e (e + 2), e = exp(min(x,
  20)) (at x >= 20, n / (n + 2) rounds to 1 in float32 and float64).
* HardSigmoid(x) = min(1, max(0, alpha x + beta)); HardSwish(x) = x * HardSigmoid(x)
  with alpha = 1/6, beta = 1/2.  NaN propagates.

Measured (2-core host shared with other work, float32, before -> after): Sigmoid on
1x96x112x112 9.4 -> 1.5 ms and on 8M elements 67 -> 11 ms; Swish 2.3-8x, Mish 5x,
HardSwish 1.5-2x faster; HardSigmoid unchanged (it was already three cheap passes).
scipy.special.expit measured slower here than this chain (5.2 ms against 2.7 ms whole
-array and 1.5 ms blocked on 1x96x112x112), so it is not used; on a GPU each step is
one CuPy elementwise kernel (cupyx.scipy.special.expit would fuse Sigmoid into one, but
the CuPy simulation the tests run on does not provide it).
"""

from __future__ import annotations

import math
import threading

import numpy as np

from ...host import host_blocks, host_empty, pooled_empty, tuning
from ..base import KernelBase, register
from ..specialize import specialize
from ._mathcommon import MathUnary, XUnary, blockwise, compute_step_function, erf
from .unary import host_bound


def _sigmoid(xp, x):
    """1 / (1 + exp(-x)) without overflow: exp(-|x|) is in (0, 1]."""
    e = xp.exp(-xp.abs(x))
    d = e + x.dtype.type(1)
    return xp.where(x >= 0, x.dtype.type(1), e) / d


def _softplus(xp, x):
    """log(1 + exp(x)) = max(x, 0) + log1p(exp(-|x|))."""
    return xp.maximum(x, x.dtype.type(0)) + xp.log1p(xp.exp(-xp.abs(x)))


# ------------------------------------------------------------- the logistic family

def clip_host(x, lo, hi, out):
    """numpy.clip(x, lo, hi, out=out) of a host array with both bounds (0-d arrays of x's
    type are fastest) through the ndarray method: the same clip loop, so the same bits,
    without numpy.clip's dispatch (27.6K float32: 7.4 -> 5.6 us; 480: 3.1 -> 1.4 us)."""
    return x.clip(lo, hi, out=out)


def _const(value, dtype):
    a = np.array(value, dtype)
    a.flags.writeable = False
    return a


# HardSigmoid's bounds 0 and 1 as 0-d host arrays per type (clip_host takes those fastest)
_UNIT_BOUNDS = {np.dtype(t): (_const(0, t), _const(1, t)) for t in (np.float32, np.float64)}


def _chain_sigmoid(xp, x, out, scratch):
    f = x.dtype.type
    xp.negative(x, out=out)
    xp.exp(out, out=out)
    out += f(1)
    xp.reciprocal(out, out=out)


def _chain_swish(xp, x, out, scratch, alpha=1.0):
    """x / (1 + exp(-alpha x)); the denominator in scratch when given (out may then be
    x: see _WRITES_OUT_LAST), else in out."""
    f = x.dtype.type
    d = out if scratch is None else scratch
    xp.multiply(x, f(-alpha), out=d)
    xp.exp(d, out=d)
    d += f(1)
    xp.divide(x, d, out=out)


def _chain_hard_sigmoid(xp, x, out, scratch, alpha=0.2, beta=0.5):
    f = x.dtype.type
    xp.multiply(x, f(alpha), out=out)
    out += f(beta)
    # NumPy's two-sided clip is 4x faster than maximum (on the host: clip_host)
    bounds = _UNIT_BOUNDS.get(x.dtype) if xp is np else None
    if bounds is not None:
        clip_host(out, bounds[0], bounds[1], out)
    else:
        xp.clip(out, f(0), f(1), out=out)


def _chain_hard_swish(xp, x, out, scratch):
    """HardSigmoid(x) * x; HardSigmoid in scratch when given (out may then be x: see
    _WRITES_OUT_LAST), else in out."""
    d = out if scratch is None else scratch
    _chain_hard_sigmoid(xp, x, d, None, 1.0 / 6.0, 0.5)
    xp.multiply(d, x, out=out)


def _chain_mish(xp, x, out, scratch):
    f = x.dtype.type
    if xp is np:  # min(x, 20); NaN stays NaN (the bits of clip(x, -inf, 20), faster)
        host_bound(np.minimum, x, f(20), out)
    else:
        xp.clip(x, f(-np.inf), f(20), out=out)
    xp.exp(out, out=out)                 # e
    xp.add(out, f(2), out=scratch)
    out *= scratch                       # n = e (e + 2)
    xp.add(out, f(2), out=scratch)
    out /= scratch                       # n / (n + 2) = tanh(softplus(x))
    out *= x


def _minimum(xp, x, c, out):
    """minimum(x, c) into out; on the host through host_bound (unary.py: the same bits,
    faster)."""
    if xp is np:
        host_bound(np.minimum, x, c, out)
    else:
        xp.minimum(x, c, out=out)


# chains that, given a scratch array (which they otherwise do not need), write out only
# in their last step, elementwise: out may be x itself (the epilogues' in-place case)
_WRITES_OUT_LAST = {"Swish", "HardSwish"}

# operator -> (chain, whether it needs a scratch block)
_LOGISTIC_CHAINS = {
    "Sigmoid": (_chain_sigmoid, False),
    "Swish": (_chain_swish, False),
    "HardSigmoid": (_chain_hard_sigmoid, False),
    "HardSwish": (_chain_hard_swish, False),
    "Mish": (_chain_mish, True),
}


def logistic_pass(xp, x, op: str, kernel=None, **params):
    """The logistic-family operator ``op`` of a float32/float64 array, in one pass of its
    chain over the whole array (the reference); on the host, arrays of more than one block
    go block by block over the host threads (the specialisation ``Logistic.blocks``,
    chosen through kernel; without a kernel the reference runs)."""
    chain, needs_scratch = _LOGISTIC_CHAINS[op]
    flat = x.reshape(-1)
    fast = kernel.specialized("Logistic.blocks", flat) if kernel is not None else None
    if fast is not None:
        return fast(flat, chain, needs_scratch, params).reshape(x.shape)
    out = pooled_empty(xp, flat.shape, flat.dtype)
    scratch = xp.empty_like(flat) if needs_scratch else None
    with np.errstate(all="ignore"):
        chain(xp, flat, out, scratch, **params)
    return out.reshape(x.shape)


def _logistic_array_function(kernel, inputs, attrs):
    """Compiled graphs (KernelBase.array_function of the logistic family): a float32 or
    float64 input (computed natively), the chain on arrays with the node's attributes
    (kernel._params: (name, the kernel's default) pairs); logistic_pass silences IEEE events
    itself, as the kernel does."""
    from .arith import native_compute

    if len(inputs) != 1 or not native_compute(inputs) or inputs[0].array.dtype.kind != "f":
        return None
    params = {k: float(attrs[k] if attrs.get(k) is not None else v) for k, v in kernel._params}
    xp, op = kernel.xp, kernel.op_type
    return lambda x: logistic_pass(xp, x, op, kernel, **params)


@specialize("Logistic.blocks", device="cpu", ops=tuple(_LOGISTIC_CHAINS),
            when=lambda flat: flat.size > tuning.value("logistic.block_elems"))
def _logistic_pass_host_blocked(flat, chain, needs_scratch, params):
    """The chain over blocks of logistic.block_elems elements (host/tuning.py), each
    block's temporaries in cache, the blocks shared among the host threads: the same
    elementwise steps as the reference, so the same values."""
    block = tuning.value("logistic.block_elems")
    out = host_empty(flat.shape, flat.dtype)
    local = threading.local()  # one scratch block per thread

    def one(lo, hi):
        scratch = None
        if needs_scratch:
            scratch = getattr(local, "scratch", None)
            if scratch is None:
                scratch = local.scratch = np.empty(block, flat.dtype)
            scratch = scratch[:hi - lo]
        with np.errstate(all="ignore"):
            chain(np, flat[lo:hi], out[lo:hi], scratch, **params)

    host_blocks(flat.size, block, one, min_per_thread=tuning.value("elementwise.thread_min_elems"))
    return out


@register()
class Sigmoid(XUnary):
    """1 / (1 + exp(-x)) (see the module docstring)."""

    def compute(self, xp, x):
        return logistic_pass(xp, x, "Sigmoid", self)

    _params = ()
    array_function = _logistic_array_function


@register()
class Softplus(MathUnary):
    def __call__(self, X):
        return self.apply(X, "X")

    def compute(self, xp, x):
        return blockwise(xp, lambda v: _softplus(xp, v), x, kernel=self)

    array_function = compute_step_function


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
        return logistic_pass(xp, x, "Mish", self)

    _params = ()
    array_function = _logistic_array_function


@register()
class HardSwish(MathUnary):
    """x * max(0, min(1, x / 6 + 1/2))."""

    def __call__(self, X):
        return self.apply(X, "X")

    def compute(self, xp, x):
        return logistic_pass(xp, x, "HardSwish", self)

    _params = ()
    array_function = _logistic_array_function


@register()
class HardSigmoid(MathUnary):
    """max(0, min(1, alpha * x + beta))."""

    def __call__(self, X, alpha=0.2, beta=0.5, consumed_inputs=None):
        return self.apply(X, "X", alpha=alpha, beta=beta)

    def compute(self, xp, x, alpha, beta):
        return logistic_pass(xp, x, "HardSigmoid", self, alpha=alpha, beta=beta)

    _params = (("alpha", 0.2), ("beta", 0.5))
    array_function = _logistic_array_function


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

# float32 Gelu on the host: Gelu(x) = x * Phi(x), Phi(x) = 1 / (1 + exp(-2 g(x))) with
# g(x) = atanh(erf(x / sqrt 2)), approximated as g(x) = x * P(z) / Q(z), z = min(x^2, 1e4),
# P cubic and Q monic cubic: a weighted least-squares (Lawson) fit on |x| <= 6 of the float64
# g, each point weighted by its effect on erf (x * sech(g)^2); fitted error 4e-9 in erf.
# exp(-2 g) is evaluated as exp2 of -2 log2(e) g, the factor folded into P's coefficients
# (rounded once to float32 either way, so no extra rounding step): NumPy's float32 exp2
# takes half the time of its exp (133K elements: 12 against 25 us on an AVX-512 EPYC).
# Measured in float32 against float64 on 7e5 points of [-12, 12]: relative error <= 3.1e-7
# for x >= -1 and <= 2.5e-6 on [-3, -1] (no 1 + erf cancellation), absolute <= 5.4e-7 (the
# former rational erf: 8e-5 on [-3, -1], 1.2e-6 absolute).  The large-|x| tails saturate
# through exp2: x / (1 + inf) = -0 and x / (1 + 0) = x.  18 in-place ufunc calls per block.
_GELU_P = (20064.30513059213, 2484.119269651739, 188.2809829766163, 4.770953939984689)
_GELU_Q = (25146.876477614733, 1968.199399786798, 147.50310082960888)  # + z^3
_GELU_PC = tuple(np.float32(-2.0 * math.log2(math.e) * c) for c in _GELU_P)  # -2 log2(e) g(x)
_GELU_QC = tuple(np.float32(c) for c in _GELU_Q)
_GELU_SCRATCH = threading.local()  # .zq: each host thread's two scratch blocks, kept


def _gelu_erf_f32(xp, x, kernel=None):
    """0.5 x (1 + erf(x / sqrt 2)) of a float32 array in one pass of _gelu_block (the
    reference); on the host, block by block over the host threads (the specialisation
    ``Gelu.blocks``, chosen through kernel)."""
    pc, qc = _GELU_PC, _GELU_QC
    flat = xp.ascontiguousarray(x).reshape(-1)
    fast = kernel.specialized("Gelu.blocks", flat) if kernel is not None else None
    if fast is not None:
        return fast(flat, pc, qc).reshape(x.shape)
    out = pooled_empty(xp, flat.shape, flat.dtype)
    if flat.size:
        with np.errstate(over="ignore", invalid="ignore"):
            zq = xp.empty((2, flat.size), np.float32)
            _gelu_block(xp, flat, out, zq[0], zq[1], pc, qc)
    return out.reshape(x.shape)


@specialize("Gelu.blocks", device="cpu", ops=("Gelu",))
def _gelu_erf_f32_host_blocked(flat, pc, qc):
    """_gelu_block over independent blocks of gelu.block_elems elements (host/tuning.py),
    handed out to the host threads: the same elementwise steps, so the same values."""
    n = flat.size
    out = host_empty(flat.shape, flat.dtype)
    block = max(1, min(n, tuning.value("gelu.block_elems")))

    def one(lo, hi):
        # kept from call to call (a fresh 1 MiB scratch is page-faulted in on every call)
        zq = getattr(_GELU_SCRATCH, "zq", None)
        if zq is None or zq.shape[1] < hi - lo:
            zq = _GELU_SCRATCH.zq = np.empty((2, block), np.float32)
        _gelu_block(np, flat[lo:hi], out[lo:hi], zq[0, :hi - lo], zq[1, :hi - lo], pc, qc)

    with np.errstate(over="ignore", invalid="ignore"):
        host_blocks(n, block, one, min_per_thread=tuning.value("elementwise.thread_min_elems"))
    return out


def _gelu_block(xp, xb, p, z, q, pc, qc):
    """Gelu of the block xb into p, with z and q as scratch of the same size."""
    f = np.float32
    xp.multiply(xb, xb, out=z)
    _minimum(xp, z, f(1e4), z)  # keeps z^3 finite; g(100) is far in the saturated tail
    xp.multiply(z, pc[3], out=p)
    p += pc[2]
    p *= z
    p += pc[1]
    p *= z
    p += pc[0]
    xp.add(z, qc[2], out=q)
    q *= z
    q += qc[1]
    q *= z
    q += qc[0]
    p /= q
    p *= xb
    xp.exp2(p, out=p)
    p += f(1)
    xp.divide(xb, p, out=p)


@register()
class Gelu(MathUnary):
    """approximate='none': 0.5 x (1 + erf(x / sqrt 2)); 'tanh': 0.5 x (1 + tanh(sqrt(2/pi)
    (x + 0.044715 x^3))).  float32 on the host uses a rational sigmoid form (see _GELU_P)."""

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
            return blockwise(xp, fn, x, kernel=self)
        if x.dtype == np.float32:  # the rational form below, the same on both devices
            return _gelu_erf_f32(xp, x, self)
        e = erf(xp, x * f(_SQRT1_2), kernel=self)
        e += f(1)
        e *= x
        e *= f(0.5)
        return e

    def array_function(self, inputs, attrs):
        """Compiled graphs: float32/float64 (computed natively), compute on arrays with
        IEEE events silenced as the kernel silences them."""
        from .arith import native_compute

        approximate = attrs.get("approximate", "none")
        if isinstance(approximate, bytes):
            approximate = approximate.decode()
        if len(inputs) != 1 or not native_compute(inputs) or inputs[0].array.dtype.kind != "f" \
                or approximate not in ("none", "tanh"):
            return None
        xp, compute = self.xp, self.compute

        def gelu(x):
            with np.errstate(all="ignore"):
                return compute(xp, x, approximate)

        return gelu


@register()
class Swish(MathUnary):
    """x * sigmoid(alpha * x)."""

    def __call__(self, X, alpha=1.0):
        return self.apply(X, "X", alpha=alpha)

    def compute(self, xp, x, alpha):
        return logistic_pass(xp, x, "Swish", self, alpha=alpha)

    _params = (("alpha", 1.0),)
    array_function = _logistic_array_function


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
            y = blockwise(xp, lambda u, v: u * _sigmoid(xp, u * al) * v, xa, None, xb, kernel=self)
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
