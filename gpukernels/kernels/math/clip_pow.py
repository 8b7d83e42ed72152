"""Clip, Mod, Pow.

Clip: opset 1 and 6 take min/max as attributes (opset 1: absent means unbounded; opset
6: defaults -FLT_MAX/FLT_MAX), opset 11+ as optional one-element inputs (absent means
the type's lowest/highest).  The result is Min(max, Max(input, min)), so min > max gives
max everywhere; NaN inputs stay NaN.  One output array, written in place; on the host
one pass of NumPy's clip (``Clip.bounds``; float32 ReLU6 on a 2-core host, 2x48x48x48:
346 -> 57 us, 1x32x112x112: 620 -> 76 us); compiled graphs call it without per-call
validation (``Clip.array_function``).

Mod: fmod=1 is C fmod (result has the dividend's sign); fmod=0 is floored modulo (the
divisor's sign), for integers at every version and for floats from opset 28 (earlier
versions require fmod=1 for floats, and we reject fmod=0 there as onnxruntime does).
Integer modulo by zero raises a KernelInputError; float modulo by zero is NaN.

Pow: the base type T and exponent type T1 may differ (opset 12+).  Floats are raised in
the wider of the two compute types and rounded once to T.  An integer base with a float
exponent is computed in float64 and converted toward zero.  Integer ** integer is exact
with wrap-around on overflow; a negative integer exponent gives trunc(x ** y) (1 or -1
for |x| = 1, else 0) and 0 ** negative raises a KernelInputError.

Pow with a float base and a one-element exponent equal to 0, 1, 2, 3, 4, -1 or 0.5 is
computed without pow, on both devices (``pow_by_products``): 1, x (a copy), x*x,
(x*x)*x, (x*x)*(x*x), 1/x and sqrt(x) (with sqrt(-0) = +0 and sqrt(-inf) = +inf, as
pow gives), in the wider of the two compute types, then rounded once to T.  ONNX does
not ask for a correctly rounded pow and products round differently from pow: x^2, x^-1
and x^0.5 are single IEEE operations (correctly rounded), x^3 is within 2 and x^4
within 3 units of 2^-24 (float32; 2^-53 for float64) relative to the exact value, as
the tests check against a float64 reference.  Each step is one IEEE-rounded operation,
so the host and a GPU give the same bits; on a GPU the exponent is read back (one
scalar copy per call, as Clip's bounds).  Measured on a 2-core host, 8M float32
elements: x^3 and x^4 10-14x faster than NumPy's pow (a scalar loop), x^0.5 4x; on
GPT-2's 1x128x3072 Gelu input x^3 9.5 ms -> 0.2 ms.  Integer ** integer stays exact
(NumPy's / CuPy's integer power).  Compiled graphs call pow_by_products directly
(``Pow.array_function``: the exponent is read at each call, no per-call validation).
"""

from __future__ import annotations

import numpy as np

from ...host import host_empty, pooled_empty
from ...tensor import Tensor
from ...xp import to_host
from ..base import KernelBase, register
from ..specialize import specialize
from ._mathcommon import broadcast_shape, legacy_broadcast, scalar_value

_FLT_MAX = float(np.finfo(np.float32).max)


@register()
class Clip(KernelBase):
    host_inputs = (1, 2)  # the bounds: read as host scalars

    def __call__(self, input, min=None, max=None, consumed_inputs=None):
        x = self.tensor(input, "input")
        if self.since_version < 11:
            self.check_inputs(x)
            lo, hi = self._attribute_bounds(min, max)
        else:
            tmin = self.host_tensor(min, "min", optional=True)
            tmax = self.host_tensor(max, "max", optional=True)
            self.check_inputs(x, tmin, tmax)
            lo = None if tmin.is_absent else scalar_value(self, tmin, "min")
            hi = None if tmax.is_absent else scalar_value(self, tmax, "max")
        xc = self.to_compute(x)
        if xc.size == 0:
            return self.from_compute(xc, x.data_type)
        return self.from_compute(self._clip_function(xc)(xc, lo, hi), x.data_type)

    def _attribute_bounds(self, lo, hi):
        """Opset 1 and 6 take the bounds as attributes (opset 6: +-FLT_MAX by default)."""
        if self.since_version >= 6:
            lo = -_FLT_MAX if lo is None else lo
            hi = _FLT_MAX if hi is None else hi
        return lo, hi

    def _clip_function(self, xc):
        """f(x, lo, hi): x clipped to the bounds (None: unbounded on that side), the
        bounds converted to x's type; the host specialisation or the reference."""
        fast = self.specialized("Clip.bounds", xc)
        step = fast if fast is not None else _clip_reference
        xp = self.xp

        def clip(x, lo, hi):
            dt = x.dtype
            return step(xp, x, None if lo is None else _bound(dt, lo), None if hi is None else _bound(dt, hi))

        return clip

    def array_function(self, inputs, attrs):
        """Compiled graphs: natively computed types, every given bound an input (opset
        11+) or an attribute; the bounds are read at each call."""
        from .arith import native_compute

        if not native_compute(inputs) or inputs[0].array.size == 0:
            return None
        clip = self._clip_function(inputs[0].array)
        if self.since_version < 11:
            if len(inputs) != 1:
                return None
            lo, hi = self._attribute_bounds(attrs.get("min"), attrs.get("max"))
            return lambda x: clip(x, lo, hi)
        if len(inputs) == 1:
            return lambda x: clip(x, None, None)
        if len(inputs) == 2:
            return lambda x, lo: clip(x, _host_scalar(lo), None)
        if _same_host_arrays(inputs) and self.specialized("Clip.bounds", inputs[0].array) is _clip_host:
            # bounds of x's type need no conversion: one NumPy call (ReLU6 on 2x192x6x6:
            # 13.6 -> 6.5 us a call on this host)
            return lambda x, lo, hi: _clip_host(np, x, lo.reshape(()), hi.reshape(()))
        return lambda x, lo, hi: clip(x, _host_scalar(lo), _host_scalar(hi))


def _same_host_arrays(inputs) -> bool:
    """Whether every input is a NumPy array of the first one's dtype."""
    dt = inputs[0].array.dtype
    return all(t.array.__class__ is np.ndarray and t.array.dtype == dt for t in inputs)


def _host_scalar(a):
    """The one value of a one-element bound array as a host NumPy scalar (a device
    array is copied to the host, as the kernel's scalar_value does)."""
    return to_host(a).reshape(-1)[0]


def _bound(dt, value):
    """A bound as a scalar of x's compute type dt (floats through float64)."""
    return dt.type(np.float64(value)) if dt.kind == "f" else dt.type(value)


def _clip_reference(xp, x, lo, hi, out=None):
    """Min(hi, Max(x, lo)) into one array, out or a new one (so lo > hi gives hi; NaN
    stays NaN)."""
    y = xp.empty_like(x) if out is None else out
    if lo is not None:
        xp.maximum(x, lo, out=y)
        if hi is not None:
            xp.minimum(y, hi, out=y)
    elif hi is not None:
        xp.minimum(x, hi, out=y)
    elif y is not x:
        y[...] = x
    return y


@specialize("Clip.bounds", device="cpu", ops=("Clip",),
            agreement="exact (equal values; a -0 input may keep its sign where the reference's "
                      "maximum gives +0: IEEE leaves the sign of equal zeros open)")
def _clip_host(xp, x, lo, hi):
    """NumPy's clip with both bounds, the type's extremes standing in for an absent one:
    one pass, 4-6x faster than maximum and minimum with a scalar (which NumPy 2.4 does
    not vectorise) or a one-sided clip.  NumPy's clip is min(max(x, lo), hi) too: lo >
    hi gives hi, NaN stays NaN.  Called as the ndarray method: the same loop without
    numpy.clip's dispatch (about 2 us less per call)."""
    dt = x.dtype
    if lo is None:
        lo = dt.type(-np.inf) if dt.kind == "f" else np.iinfo(dt).min
    if hi is None:
        hi = dt.type(np.inf) if dt.kind == "f" else np.iinfo(dt).max
    return x.clip(lo, hi, out=host_empty(x.shape, dt))


@register()
class Mod(KernelBase):
    def __call__(self, A, B, fmod=0):
        a = self.tensor(A, "A")
        b = self.tensor(B, "B")
        self.check_inputs(a, b)
        broadcast_shape(self, {"A": a, "B": b})
        if fmod not in (0, 1):
            raise self.error(f"fmod must be 0 or 1, got {fmod}", A=a, B=b)
        xp = self.xp
        ac, bc = self.to_compute(a), self.to_compute(b)
        integer = ac.dtype.kind in "iu"
        if not integer and fmod == 0 and self.since_version < 28:
            raise self.error("fmod must be 1 for floating-point inputs before opset 28", A=a, B=b)
        if integer:
            if bc.size and bool((bc == 0).any()):
                raise self.error("integer modulo by zero", A=a, B=b)
            y = xp.fmod(ac, bc) if fmod else xp.remainder(ac, bc)
        else:
            with np.errstate(all="ignore"):
                y = xp.fmod(ac, bc) if fmod else xp.remainder(ac, bc)
        return self.from_compute(y, a.data_type)


@register()
class Pow(KernelBase):
    host_inputs = (1,)  # a one-element exponent: read on the host (see _product_exponent)

    def __call__(self, X, Y, axis=None, broadcast=0):
        x = self.tensor(X, "X")
        y = self.host_tensor(Y, "Y")
        if y.size != 1 or self.since_version < 7:
            y = self.tensor(y, "Y")
        self.check_inputs(x, y)
        xp = self.xp
        xc, yc = self.to_compute(x), self.to_compute(y)
        if self.since_version < 7:
            yc = legacy_broadcast(self, x, y, broadcast, axis, names=("X", "Y")).astype(xc.dtype, copy=False)
        else:
            broadcast_shape(self, {"X": x, "Y": y})
        with np.errstate(all="ignore"):
            e = _product_exponent(xc, yc)
            if e is not None:
                out = pow_by_products(xp, xc, yc.dtype, e, np.broadcast_shapes(x.shape, y.shape))
            else:
                if self.on_gpu and yc.__class__ is np.ndarray:
                    yc = xp.asarray(yc)  # a host exponent computed with on the device
                out = self._pow(xp, xc, yc, x, y)
        return self.from_compute(out, x.data_type)

    def array_function(self, inputs, attrs):
        """Compiled graphs (opset 7+), a float base computed in its own type and a
        one-element exponent: the exponent is read at each call; one of
        _PRODUCT_EXPONENTS goes straight to pow_by_products (YOLO heads' x^2 on
        2x3x16x16x2: 66 -> ~10 us a call), any other through the kernel."""
        from .arith import native_compute

        if self.since_version < 7 or len(inputs) != 2 or not native_compute(inputs):
            return None
        x, y = inputs
        if x.array.dtype.kind != "f" or y.size != 1:
            return None
        xp, shape, tx, ty = self.xp, np.broadcast_shapes(x.shape, y.shape), x.data_type, y.data_type

        def power(a, b):
            e = _product_exponent(a, b)
            if e is None:
                return self(Tensor.wrap(a, tx), Tensor.wrap(b, ty)).array
            r = pow_by_products(xp, a, b.dtype, e, shape)
            return r if r.dtype == a.dtype else r.astype(a.dtype)  # a float64 exponent: rounded once

        return power

    def _pow(self, xp, xc, yc, x, y):
        if xc.dtype.kind == "f":
            ct = np.result_type(xc.dtype, yc.dtype) if yc.dtype.kind == "f" else xc.dtype
            return xp.power(xc.astype(ct, copy=False), yc.astype(ct, copy=False)).astype(xc.dtype, copy=False)
        if yc.dtype.kind == "f":
            r = xp.power(xc.astype(np.float64), yc.astype(np.float64))
            return _float_to_int(xp, r, xc.dtype)
        # integer ** integer
        e = yc.astype(np.int64) if yc.dtype != np.uint64 else yc
        neg = e < 0
        if bool(neg.any()):
            bxc, be, bneg = xp.broadcast_arrays(xc, e, neg)
            if bool(((bxc == 0) & bneg).any()):
                raise self.error("0 raised to a negative integer power", X=x, Y=y)
            safe_e = xp.where(bneg, 0, be)
            r = xp.power(bxc, safe_e.astype(xc.dtype))
            odd = (be % 2) != 0
            neg_result = xp.where(bxc == 1, 1, xp.where((bxc == -1) & odd, -1,
                                                        xp.where(bxc == -1, 1, 0)))
            return xp.where(bneg, neg_result.astype(xc.dtype), r)
        return xp.power(xc, e.astype(xc.dtype)) if e.dtype != xc.dtype else xp.power(xc, e)


# exponents computed as products / reciprocal / sqrt instead of pow
_PRODUCT_EXPONENTS = frozenset((0.0, 1.0, 2.0, 3.0, 4.0, -1.0, 0.5))


def _product_exponent(xc, yc):
    """The exponent's value when the base is float and the exponent one value in
    _PRODUCT_EXPONENTS, else None.  The formula must not depend on the device, so on a
    GPU the value is read on the host: a constant exponent stays there (host_inputs);
    one computed on the device is copied back (one scalar)."""
    if xc.dtype.kind != "f" or yc.size != 1 or yc.dtype.kind not in "fiu":
        return None
    e = float(to_host(yc).reshape(-1)[0])
    return e if e in _PRODUCT_EXPONENTS else None


def pow_by_products(xp, xc, y_dtype, e: float, shape):
    """xc ** e for e in _PRODUCT_EXPONENTS, on both devices, in the wider of the two
    compute types, shaped as the broadcast shape: 1, x (a copy), x*x, (x*x)*x,
    (x*x)*(x*x), 1/x and sqrt(x + 0) (sqrt(-0) = +0 and sqrt(-inf) = +inf, as C99 pow
    gives).  The spec does not ask for a correctly rounded pow; we chose the products (on
    the host 10-14x faster than NumPy's pow): each step is one IEEE-rounded operation, so
    every device gives the same bits."""
    ct = np.result_type(xc.dtype, y_dtype) if np.dtype(y_dtype).kind == "f" else xc.dtype
    x = xp.broadcast_to(xc.astype(ct, copy=False), shape)
    if e == 0.0:
        return xp.ones(shape, ct)  # pow(x, 0) is 1 for every x, NaN included
    if e == 1.0:
        return xp.array(x, copy=True)
    y = pooled_empty(xp, shape, ct)
    if e == -1.0:
        return xp.reciprocal(x, out=y)
    if e == 0.5:
        xp.add(x, ct.type(0), out=y)  # -0 + 0 = +0: pow(-0, 0.5) = +0
        xp.sqrt(y, out=y)
        xp.copyto(y, ct.type(np.inf), where=x == -np.inf)  # pow(-inf, 0.5) = +inf, sqrt(-inf) is NaN
        return y
    xp.multiply(x, x, out=y)
    if e == 3.0:
        y *= x
    elif e == 4.0:
        y *= y
    return y


def _float_to_int(xp, r, dtype):
    """float64 -> integer dtype toward zero; out-of-range values wrap like int64 -> dtype."""
    r = xp.trunc(r)
    if dtype == np.uint64:
        return r.astype(np.uint64)
    return r.astype(np.int64).astype(dtype)
