"""Helpers shared by the math and logic kernels: a vectorised erf, cache-blocked
evaluation of long elementwise chains, axis handling, broadcasting checks, and the
legacy (opset < 7) broadcasting of binary operators."""

from __future__ import annotations

import numpy as np

from ...xp import is_cupy_array, parallel_ranges

# ---------------------------------------------------------------- blocked evaluation

# elements per block: the chain's float32 temporaries (256 KiB each) stay in L2; 4x the
# former 1 << 14, whose per-call overhead made Mish on 8M elements 1.7x slower
_BLOCK = 1 << 16


def blockwise(xp, fn, x, out_dtype=None, *others):
    """fn(x, *others) evaluated elementwise over equally shaped arrays.

    On the host a long chain of ufuncs over a big array is memory bound; evaluating it
    block by block keeps the temporaries in cache (about 3x faster).  On a GPU (or for
    small arrays) fn runs once on the whole arrays.  fn must be purely elementwise.
    """
    if xp is not np or x.size <= 4 * _BLOCK:
        return fn(x, *others)
    out_dtype = np.dtype(out_dtype) if out_dtype is not None else x.dtype
    flat = np.ascontiguousarray(x).reshape(-1)
    oflat = [np.ascontiguousarray(o).reshape(-1) for o in others]
    out = np.empty(flat.size, out_dtype)

    def blocks(lo, hi):
        for s in range(lo, hi, _BLOCK):
            e = min(hi, s + _BLOCK)
            out[s:e] = fn(flat[s:e], *(o[s:e] for o in oflat))

    parallel_ranges(flat.size, 8 * _BLOCK, blocks)  # independent blocks over host threads
    return out.reshape(x.shape)


# ------------------------------------------------------------------------------ erf

# Rational approximation used for float32 (and half types computed in float32):
# erf(x) = x * P(x^2) / Q(x^2) on [-4, 4], clamped outside; max error about 7 float32
# ulp (4e-7 relative).
_ERF32_P = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
            -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03,
            -1.60960333262415e-02)
_ERF32_Q = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
            -7.37332916720468e-03, -1.42647390514189e-02)

# W. J. Cody's rational Chebyshev approximations (float64, a few ulp).
_C_A = (3.16112374387056560e00, 1.13864154151050156e02, 3.77485237685302021e02,
        3.20937758913846947e03, 1.85777706184603153e-1)
_C_B = (2.36012909523441209e01, 2.44024637934444173e02, 1.28261652607737228e03,
        2.84423683343917062e03)
_C_C = (5.64188496988670089e-1, 8.88314979438837594e00, 6.61191906371416295e01,
        2.98635138197400131e02, 8.81952221241769090e02, 1.71204761263407058e03,
        2.05107837782607147e03, 1.23033935479799725e03, 2.15311535474403846e-8)
_C_D = (1.57449261107098347e01, 1.17693950891312499e02, 5.37181101862009858e02,
        1.62138957456669019e03, 3.29079923573345963e03, 4.36261909014324716e03,
        3.43936767414372164e03, 1.23033935480374942e03)
_C_P = (3.05326634961232344e-1, 3.60344899949804439e-1, 1.25781726111229246e-1,
        1.60837851487422766e-2, 6.58749161529837803e-4, 1.63153871373020978e-2)
_C_Q = (2.56852019228982242e00, 1.87295284992346725e00, 5.27905102951428412e-1,
        6.05183413124413191e-2, 2.33520497626869185e-3)
_SQRPI = 5.6418958354775628695e-1


def _erf32(x):
    f = x.dtype.type
    t = np.clip(x, f(-4.0), f(4.0))
    z = t * t
    p = z * f(_ERF32_P[0])
    for c in _ERF32_P[1:-1]:
        p += f(c)
        p *= z
    p += f(_ERF32_P[-1])
    q = z * f(_ERF32_Q[0])
    for c in _ERF32_Q[1:-1]:
        q += f(c)
        q *= z
    q += f(_ERF32_Q[-1])
    p *= t
    p /= q
    return p


def _erf64(x):
    with np.errstate(all="ignore"):
        x = np.clip(x, -6.0, 6.0)  # erf(6) rounds to 1 in float64; NaN passes through
        y = np.abs(x)
        out = np.empty_like(x)
        small = y <= 0.46875
        if small.any():
            xs = x[small]
            z = xs * xs
            num = _C_A[4] * z
            den = z
            for i in range(3):
                num = (num + _C_A[i]) * z
                den = (den + _C_B[i]) * z
            out[small] = xs * (num + _C_A[3]) / (den + _C_B[3])
        rest = ~small
        if rest.any():
            yr = y[rest]
            mid = yr <= 4.0
            erfc = np.empty_like(yr)
            ym = yr[mid]
            num = _C_C[8] * ym
            den = ym
            for i in range(7):
                num = (num + _C_C[i]) * ym
                den = (den + _C_D[i]) * ym
            erfc[mid] = (num + _C_C[7]) / (den + _C_D[7])
            yl = yr[~mid]
            z = 1.0 / (yl * yl)
            num = _C_P[5] * z
            den = z
            for i in range(4):
                num = (num + _C_P[i]) * z
                den = (den + _C_Q[i]) * z
            large = z * (num + _C_P[4]) / (den + _C_Q[4])
            erfc[~mid] = (_SQRPI - large) / yl
            ysq = np.trunc(yr * 16.0) / 16.0
            d = (yr - ysq) * (yr + ysq)
            erfc *= np.exp(-ysq * ysq) * np.exp(-d)
            out[rest] = np.copysign(1.0 - erfc, x[rest])
        return out


def erf(xp, x):
    """Elementwise erf of a float32 or float64 array (NaN propagates, erf(+-inf) = +-1)."""
    if xp is not np or is_cupy_array(x):
        from cupyx.scipy.special import erf as cupy_erf

        return cupy_erf(x)
    if x.dtype == np.float64:
        return _erf64(x)
    return blockwise(np, _erf32, x)


# ------------------------------------------------------------------------- axes


def normalize_axis(kernel, axis, ndim: int, **inputs) -> int:
    """axis in [-r, r-1] (r = max(ndim, 1) so that scalars accept 0 and -1) -> [0, r)."""
    r = max(ndim, 1)
    axis = int(axis)
    if not -r <= axis < r:
        raise kernel.error(f"axis {axis} is out of range for rank {ndim}", **inputs)
    return axis % r


def normalize_axes(kernel, axes, ndim: int, **inputs) -> tuple[int, ...]:
    """Distinct axes in [-ndim, ndim-1] -> sorted non-negative tuple."""
    out = []
    for a in axes:
        a = int(a)
        if not -ndim <= a < max(ndim, 0) or (ndim == 0 and a not in (0, -1)):
            raise kernel.error(f"axis {a} is out of range for rank {ndim}", **inputs)
        out.append(a % ndim if ndim else 0)
    if len(set(out)) != len(out):
        raise kernel.error(f"axes {list(axes)} repeat an axis", **inputs)
    return tuple(sorted(out))


def broadcast_shape(kernel, tensors: dict) -> tuple[int, ...]:
    """The multidirectional broadcast shape of the named tensors, or a KernelInputError."""
    shapes = [t.shape for t in tensors.values()]
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise kernel.error("shapes do not broadcast", **tensors) from None


def legacy_broadcast(kernel, a, b, broadcast, axis, names=("A", "B")):
    """Opset < 7 broadcasting of a binary operator: returns B's array reshaped to align
    with A.  broadcast=0 requires equal shapes; broadcast=1 lets B be a one-element
    tensor or a contiguous run of A's dimensions starting at ``axis`` (default: suffix
    matching)."""
    barr = b.array
    if not broadcast:
        if a.shape != b.shape:
            raise kernel.error("shapes must be equal when the legacy attribute broadcast=0",
                               **{names[0]: a, names[1]: b})
        return barr
    if b.size == 1 and b.ndim <= a.ndim:
        return barr.reshape(())
    if b.ndim > a.ndim:
        raise kernel.error("B has a higher rank than A", **{names[0]: a, names[1]: b})
    start = a.ndim - b.ndim if axis is None else int(axis)
    if start < 0:
        start += a.ndim
    if start < 0 or start + b.ndim > a.ndim or a.shape[start:start + b.ndim] != b.shape:
        raise kernel.error(f"B's shape is not a contiguous run of A's shape at axis {axis}",
                           **{names[0]: a, names[1]: b})
    return barr.reshape(b.shape + (1,) * (a.ndim - start - b.ndim))


# -------------------------------------------------------------------- dtype limits


def lowest(dtype):
    """-inf for floats, the minimum for integers, False for bool."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return -np.inf
    if dtype.kind == "b":
        return False
    return np.iinfo(dtype).min


def highest(dtype):
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return np.inf
    if dtype.kind == "b":
        return True
    return np.iinfo(dtype).max


def scalar_value(kernel, t, name):
    """The single value of a one-element tensor as a host numpy scalar."""
    if t.size != 1:
        raise kernel.error(f"input '{name}' must hold exactly one value", **{name: t})
    return t.numpy().reshape(-1)[0]


# ------------------------------------------------------------------ kernel bases

from ._elementwise import UnaryKernel  # noqa: E402


class MathUnary(UnaryKernel):
    """UnaryKernel with the input named as the schema names it and IEEE warnings
    silenced (NaN and infinities propagate as the arithmetic gives them).

    Subclasses implement ``compute(xp, x, **attrs)`` on the compute array; ``__call__``
    is written per class with the schema's input name and attributes and calls
    ``apply``."""

    def apply(self, value, name="X", **attrs):
        x = self.tensor(value, name)
        self.check_inputs(x)
        xc = self.to_compute(x)
        with np.errstate(all="ignore"):
            y = self.compute(self.xp, xc, **attrs)
        return self.from_compute(y, x.data_type)

    def __call__(self, X, **attrs):
        return self.apply(X, "X", **attrs)


class InputUnary(MathUnary):
    """A MathUnary whose formal input is named 'input' (Acos, Sin, Erf, Sign...)."""

    def __call__(self, input, consumed_inputs=None):
        return self.apply(input, "input")


class XUnary(MathUnary):
    """A MathUnary with formal input 'X' and no attributes but the legacy
    consumed_inputs (ignored)."""

    def __call__(self, X, consumed_inputs=None):
        return self.apply(X, "X")


def contiguous(xp, a):
    """A C-contiguous array with a's shape (xp.ascontiguousarray turns 0-D into 1-D)."""
    if a.ndim == 0:
        return xp.array(a, copy=True)
    return xp.ascontiguousarray(a)
