"""Shared machinery for elementwise kernels: unary and binary (broadcasting) operators.

A subclass implements ``compute(xp, *arrays, **attrs)`` on arrays in the compute dtype
(float32 for half and smaller floats, the element type otherwise); the base class
checks the schema's types, up-casts, and rounds the result once into the output type.
"""

from __future__ import annotations

import numpy as np

from ...dtypes import DataType
from ...tensor import Tensor
from ..base import KernelBase


class UnaryKernel(KernelBase):
    """y = f(x), same element type in and out."""

    def __call__(self, X, **attrs):
        x = self.tensor(X, "X")
        self.check_inputs(x)
        y = self.compute(self.xp, self.to_compute(x), **attrs)
        return self.from_compute(y, x.data_type)

    def compute(self, xp, x, **attrs):  # pragma: no cover - abstract
        raise NotImplementedError


class BinaryKernel(KernelBase):
    """C = f(A, B) with multidirectional (NumPy) broadcasting; output type = input type
    unless ``output_type`` is set (comparisons give BOOL)."""

    output_type: DataType | None = None

    def __call__(self, A, B, broadcast=None, axis=None, consumed_inputs=None, **attrs):
        a = self.tensor(A, "A")
        b = self.tensor(B, "B")
        self.check_inputs(a, b)
        if self.since_version < 7 and not self.domain:
            b = self._legacy_broadcast(a, b, broadcast or 0, axis)
        self.check_broadcast(a, b)
        # STRING tensors stay on the host even in a cuda context
        xp = np if a.data_type == DataType.STRING else self.xp
        y = self.compute(xp, self.to_compute(a), self.to_compute(b), **attrs)
        out_type = self.output_type if self.output_type is not None else a.data_type
        return self.from_compute(y, out_type)

    def _legacy_broadcast(self, a, b, broadcast: int, axis):
        """Opset 1-6 arithmetic: without broadcast=1 the shapes must match; with it, B
        broadcasts to A with its dimensions matching A's from ``axis`` on (default: the
        trailing dimensions)."""
        if not broadcast:
            if a.shape != b.shape:
                raise self.error("shapes differ and the opset-{} attribute broadcast is 0".format(
                    self.since_version), A=a, B=b)
            return b
        if b.ndim > a.ndim:
            raise self.error("B has more dimensions than A", A=a, B=b)
        start = a.ndim - b.ndim if axis is None else (axis % a.ndim if a.ndim else 0)
        if start + b.ndim > a.ndim or any(
                db not in (1, da) for db, da in zip(b.shape, a.shape[start:start + b.ndim])):
            raise self.error(f"B does not broadcast to A at axis {start}", A=a, B=b)
        shape = b.shape + (1,) * (a.ndim - start - b.ndim)
        return Tensor.wrap(b.array.reshape(shape), b.data_type)

    def check_broadcast(self, a, b) -> None:
        sa, sb = a.shape, b.shape
        for da, db in zip(reversed(sa), reversed(sb)):
            if da != db and da != 1 and db != 1:
                raise self.error("shapes do not broadcast", A=a, B=b)

    def compute(self, xp, a, b, **attrs):  # pragma: no cover - abstract
        raise NotImplementedError
