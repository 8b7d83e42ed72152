"""Shared machinery for elementwise kernels: unary and binary (broadcasting) operators.

A subclass implements ``compute(xp, *arrays, **attrs)`` on arrays in the compute dtype
(float32 for half and smaller floats, the element type otherwise); the base class
checks the schema's types, up-casts, and rounds the result once into the output type.
"""

from __future__ import annotations

import numpy as np

from ...dtypes import DataType
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

    def __call__(self, A, B, **attrs):
        a = self.tensor(A, "A")
        b = self.tensor(B, "B")
        self.check_inputs(a, b)
        self.check_broadcast(a, b)
        # STRING tensors stay on the host even in a cuda context
        xp = np if a.data_type == DataType.STRING else self.xp
        y = self.compute(xp, self.to_compute(a), self.to_compute(b), **attrs)
        out_type = self.output_type if self.output_type is not None else a.data_type
        return self.from_compute(y, out_type)

    def check_broadcast(self, a, b) -> None:
        sa, sb = a.shape, b.shape
        for da, db in zip(reversed(sa), reversed(sb)):
            if da != db and da != 1 and db != 1:
                raise self.error("shapes do not broadcast", A=a, B=b)

    def compute(self, xp, a, b, **attrs):  # pragma: no cover - abstract
        raise NotImplementedError
