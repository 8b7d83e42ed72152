"""Sqrt, Exp, Log, Relu.  NaN propagates; Sqrt and Log of negatives give NaN and Log(0)
gives -inf, as IEEE arithmetic does (no warnings are raised).

The math of each is its ``array_op``, which both the kernel and its array function call
(see arith.py).

``host_bound`` is the host's maximum/minimum of an array and a constant (Relu here, the
Gelu and Mish steps in activations.py, the Relu epilogue): NumPy 2.4 vectorises maximum
and minimum of two arrays but not of an array and a scalar, so on the host the constant
is read from a kept block of it (float32, 1 thread: 16 Ki elements 12.8 -> 2.7 us, 64 Ki
47.9 -> 10.9 us).  Each element meets the same constant in the same argument order, so
the bits are the scalar ufunc's, -0 and NaN payloads included (the tests check it).
"""

from __future__ import annotations

import math

import numpy as np

from ...host import host_empty, tuning
from ..base import register
from ._mathcommon import XUnary
from .arith import ArrayOpUnary, array_op_function, compute_by_array_op

# below this many elements the scalar ufunc (the block's slicing and lookup cost more
# than they save)
_BOUND_MIN_ELEMS = 4096
_BLOCKS: dict = {}  # (dtype char, value, sign of value) -> read-only block of the value
_MAX_BLOCKS = 32  # distinct constants kept (more: the scalar ufunc)
_BLOCK_TYPES = (np.float32, np.float64)


def host_bound(ufunc, x, c, out=None):
    """ufunc(x, c, out=out) for ufunc np.maximum or np.minimum, a host array x and a
    scalar c (out None: a new array).  float32/float64 C-contiguous
    arrays of _BOUND_MIN_ELEMS elements or more (and out the same) with a non-NaN c of
    their type are read against a kept block of c, block by block in the calling
    thread; anything else is the scalar
    call (the same bits either way; a 0-d x gives a scalar, as the ufunc does)."""
    n = x.size
    if n < _BOUND_MIN_ELEMS or x.__class__ is not np.ndarray or c.__class__ not in _BLOCK_TYPES \
            or c.__class__ is not x.dtype.type or not x.ndim or not x.flags.c_contiguous:
        return ufunc(x, c, out=out)
    if out is None:
        out = host_empty(x.shape, x.dtype)
    elif out.__class__ is not np.ndarray or out.dtype != x.dtype or out.shape != x.shape \
            or not out.flags.c_contiguous:
        return ufunc(x, c, out=out)
    block = _constant_block(x.dtype, c)
    if block is None:
        return ufunc(x, c, out=out)
    size = block.size
    if n <= size:
        ufunc(x, block[:n].reshape(x.shape) if x.ndim != 1 else block[:n], out=out)
        return out
    xf, of = x.reshape(-1), out.reshape(-1)
    for lo in range(0, n, size):
        hi = min(n, lo + size)
        ufunc(xf[lo:hi], block[:hi - lo], out=of[lo:hi])
    return out


def _constant_block(dt, c):
    """The kept read-only block of elementwise.block_elems copies of c (the sign of a
    zero kept); None for NaN (its payload would need its bits as the key) and past
    _MAX_BLOCKS constants."""
    v = float(c)
    key = (dt.char, v, math.copysign(1.0, v))
    block = _BLOCKS.get(key)
    if block is None and v == v and len(_BLOCKS) < _MAX_BLOCKS:
        block = np.full(tuning.value("elementwise.block_elems"), c, dt)
        block.flags.writeable = False
        _BLOCKS[key] = block  # a race only builds an equal block twice
    return block


class _QuietUnary(XUnary):
    """The xp function named by ``ufunc``, IEEE warnings silenced (MathUnary)."""

    ufunc = ""
    compute = compute_by_array_op
    array_function = array_op_function

    def array_op(self, xp, dtype):
        return getattr(xp, self.ufunc)


@register()
class Sqrt(_QuietUnary):
    ufunc = "sqrt"


@register()
class Exp(_QuietUnary):
    ufunc = "exp"


@register()
class Log(_QuietUnary):
    ufunc = "log"


@register()
class Relu(ArrayOpUnary):
    """maximum(x, 0); on the host through host_bound (the same bits)."""

    def array_op(self, xp, dtype):
        zero = dtype.type(0)
        if xp is np:
            return lambda x: host_bound(np.maximum, x, zero)
        return lambda x: xp.maximum(x, zero)
