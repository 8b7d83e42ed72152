"""Add, Sub, Mul, Div, Neg, Abs.

Integers wrap around on overflow (two's complement), as NumPy and CuPy do.  Integer Div
truncates toward zero (C semantics, as onnxruntime) and raises a KernelInputError on a
zero divisor rather than returning an arbitrary value.

Each kernel's math is written once, as ``array_op(xp, dtype)``: the function of compute
arrays (dtype: the first one's) that its compute step calls.  Compiled graphs and Loop/Scan
bodies (KernelBase.array_function) call that same function on the stored arrays where
they are the compute arrays (natively computed types), so the two cannot drift apart.
The elementwise kernels of unary.py and trig.py follow the same pattern.
"""

from __future__ import annotations

import functools

from ...tensor import Tensor
from ..base import _NATIVE_COMPUTE, register
from ._elementwise import BinaryKernel, UnaryKernel


def native_compute(inputs) -> bool:
    """True when every input is a tensor computed in its own element type (no up-cast
    and final rounding), so an array function can return the compute result as is."""
    return all(t.__class__ is Tensor and t.data_type in _NATIVE_COMPUTE for t in inputs)


def compute_by_array_op(kernel, xp, *arrays):
    """The compute step of a kernel whose math is ``kernel.array_op``."""
    return kernel.array_op(xp, arrays[0].dtype)(*arrays)


def array_op_function(kernel, inputs, attrs):
    """The array function of such a kernel: its array_op itself, for inputs computed in
    their own type; None otherwise, and for binary operators before opset 7 (their
    legacy broadcasting reshapes B before the math)."""
    if not native_compute(inputs):
        return None
    if isinstance(kernel, BinaryKernel) and kernel.since_version < 7 and not kernel.domain:
        return None
    return kernel.array_op(kernel.xp, inputs[0].array.dtype)


def compute_array_function(kernel, inputs, attrs):
    """The array function of a binary kernel whose math is ``compute(xp, a, b)`` with
    no attributes and whose result needs no rounding (comparisons: BOOL): compute bound
    to xp, on array_op_function's conditions."""
    if not native_compute(inputs) or (kernel.since_version < 7 and not kernel.domain):
        return None
    return functools.partial(kernel.compute, kernel.xp)


class ArrayOpBinary(BinaryKernel):
    """A binary kernel whose math is ``array_op(xp, dtype)`` (see the module docstring)."""

    compute = compute_by_array_op
    array_function = array_op_function

    def array_op(self, xp, dtype):  # pragma: no cover - abstract
        raise NotImplementedError


class ArrayOpUnary(UnaryKernel):
    """A unary kernel whose math is ``array_op(xp, dtype)`` (see the module docstring)."""

    compute = compute_by_array_op
    array_function = array_op_function

    def array_op(self, xp, dtype):  # pragma: no cover - abstract
        raise NotImplementedError


@register()
class Add(ArrayOpBinary):
    def array_op(self, xp, dtype):
        return xp.add


@register()
class Sub(ArrayOpBinary):
    def array_op(self, xp, dtype):
        return xp.subtract


@register()
class Mul(ArrayOpBinary):
    def array_op(self, xp, dtype):
        return xp.logical_and if dtype.kind == "b" else xp.multiply


@register()
class Div(ArrayOpBinary):
    def array_op(self, xp, dtype):
        if dtype.kind not in "iu":
            return xp.divide
        signed = dtype.kind == "i"

        def divide(a, b):
            """Integer division truncating toward zero; a zero divisor is an error."""
            if b.size and bool((b == 0).any()):
                raise self.error("integer division by zero", A=a, B=b)
            q = xp.floor_divide(a, b)
            if signed:
                # floor -> trunc: add one where the exact quotient is negative and inexact
                fix = (xp.remainder(a, b) != 0) & ((a < 0) != (b < 0))
                q = q + fix.astype(q.dtype)
            return q

        return divide


@register()
class Neg(ArrayOpUnary):
    def array_op(self, xp, dtype):
        return xp.negative


@register()
class Abs(ArrayOpUnary):
    def array_op(self, xp, dtype):
        return xp.abs
