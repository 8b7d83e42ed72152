"""Helpers shared by the math and logic kernels: erf, cache-blocked evaluation of long
elementwise chains, axis handling, broadcasting checks, and the legacy (opset < 7)
broadcasting of binary operators."""

from __future__ import annotations

import functools
import importlib

import numpy as np

from ...host import parallel_ranges, tuning
from ..specialize import specialize

# ---------------------------------------------------------------- blocked evaluation


def _specialized(kernel, site: str, *args):
    """kernel.specialized(site, *args), or None without a kernel (no context to choose by:
    the reference runs)."""
    return kernel.specialized(site, *args) if kernel is not None else None


def blockwise(xp, fn, x, out_dtype=None, *others, kernel=None):
    """fn(x, *others) evaluated elementwise over equally shaped arrays.

    The reference calls fn once on the whole arrays.  On the host a long chain of ufuncs
    over a big array is memory bound: the specialisation 'Elementwise.blocks' evaluates it
    block by block over the host threads, the temporaries in cache (about 3x faster), with
    the same values.  kernel (the calling kernel) chooses; without one the reference runs.
    fn must be purely elementwise; out_dtype (default x's) is the dtype fn returns.
    """
    fast = _specialized(kernel, "Elementwise.blocks", fn, x, out_dtype, *others)
    if fast is not None:
        return fast(fn, x, out_dtype, *others)
    return fn(x, *others)


@specialize("Elementwise.blocks", device="cpu", ops=("Erf", "Softplus", "Gelu", "SwiGLU"),
            when=lambda fn, x, out_dtype=None, *others: x.size > 4 * tuning.value("elementwise.block_elems"))
def _blockwise_host(fn, x, out_dtype=None, *others):
    """fn over blocks of elementwise.block_elems (host/tuning.py) elements, independent
    blocks over the host threads (8 blocks or more per thread)."""
    block = tuning.value("elementwise.block_elems")
    out_dtype = np.dtype(out_dtype) if out_dtype is not None else x.dtype
    flat = np.ascontiguousarray(x).reshape(-1)
    oflat = [np.ascontiguousarray(o).reshape(-1) for o in others]
    out = np.empty(flat.size, out_dtype)

    def blocks(lo, hi):
        for s in range(lo, hi, block):
            e = min(hi, s + block)
            out[s:e] = fn(flat[s:e], *(o[s:e] for o in oflat))

    parallel_ranges(flat.size, 8 * block, blocks)
    return out.reshape(x.shape)


# ------------------------------------------------------------------------------ erf

# The array namespace's special functions (imported on first use): the one erf both
# devices use.  A NumPy/CuPy difference: it belongs in the dispatch layer (gpukernels.xp).
_SPECIAL_MODULES = {"numpy": "scipy.special", "cupy": "cupyx.scipy.special"}


def special_functions(xp):
    """scipy.special for NumPy, cupyx.scipy.special for CuPy."""
    return importlib.import_module(_SPECIAL_MODULES[xp.__name__])


# float32 erf, on both devices: erf(x) = x * P(x^2) / Q(x^2) on [-4, 4], clamped outside
# (on the host faster than scipy.special.erf from about 2000 elements: 20 ms against
# 110 ms on 4M values); measured on every 11th float32 of [-6, 6]: within 4.2e-7 relative
# of scipy.special.erf for |x| >= 1e-36, 6e-7 down to 1e-37, 4.2e-7 absolute everywhere
# (near-subnormal inputs lose relative accuracy).
_ERF32_P = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
            -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03,
            -1.60960333262415e-02)
_ERF32_Q = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
            -7.37332916720468e-03, -1.42647390514189e-02)
_ERF32_MIN_SIZE = 1 << 11  # below it scipy.special.erf's single call is faster


def _erf32(xp, x):
    """The rational erf of a float32 array (one IEEE-rounded ufunc call per step)."""
    f = x.dtype.type
    t = xp.clip(x, f(-4.0), f(4.0))
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


def erf(xp, x, kernel=None):
    """Elementwise erf of a float32 or float64 array (NaN propagates, erf(+-inf) = +-1).

    float32 arrays of _ERF32_MIN_SIZE elements or more: the rational approximation _erf32,
    on both devices (the spec leaves the accuracy open; we chose the form that is fast on
    the host: each step is one IEEE-rounded multiply, add, divide or clip, so every device
    computes the same bits); on the host block by block (``blockwise``:
    'Elementwise.blocks', the same values).  Smaller float32 arrays and float64: the
    namespace's erf (scipy.special.erf / cupyx.scipy.special.erf, a few ulp: one call,
    12x faster than the rational form's 25 calls on 500 values).  The choice depends on the
    dtype and size only, never on the device.  kernel (the calling kernel) chooses the
    blocking; without one the whole array is one block."""
    if x.dtype == np.float32 and x.size >= _ERF32_MIN_SIZE:
        return blockwise(xp, functools.partial(_erf32, xp), x, kernel=kernel)
    return special_functions(xp).erf(x)


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
from .arith import native_compute  # noqa: E402


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


def compute_step_function(kernel, inputs, attrs):
    """The array function (KernelBase.array_function) of a MathUnary without attributes:
    its own compute step on the stored array, for an input computed in its own type
    (the rounding step then keeps the array as it is); None otherwise.  IEEE warnings
    are not silenced here: the runtime redoes such a call through the kernel."""
    if len(inputs) != 1 or not native_compute(inputs):
        return None
    compute, xp, from_compute, dt = kernel.compute, kernel.xp, kernel.from_compute, inputs[0].data_type
    return lambda x: from_compute(compute(xp, x), dt).array


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
