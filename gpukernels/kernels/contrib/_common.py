"""Shared pieces of the com.microsoft kernels."""

from __future__ import annotations

import numpy as np

from ... import dtypes
from ...dtypes import DataType
from ...tensor import Tensor
from ..base import KernelBase

DOMAIN = "com.microsoft"

FLOATS = frozenset((DataType.FLOAT, DataType.FLOAT16, DataType.BFLOAT16))
FLOATS_DOUBLE = FLOATS | {DataType.DOUBLE}


class ContribKernel(KernelBase):
    """Base of the contrib kernels.

    onnx has no schema for these operators, so the runtime passes a node's attributes as
    given (no defaults filled in, no names checked) and its inputs positionally: each
    kernel declares its attributes with their defaults, takes ``*more`` and ``**unknown``
    and calls ``check_signature`` so that a node with extra inputs or unknown attributes
    gets a clear error instead of a Python TypeError."""

    max_inputs: int = 0

    def check_signature(self, more: tuple, unknown: dict) -> None:
        if more:
            raise self.error(f"takes at most {self.max_inputs} inputs, got {self.max_inputs + len(more)}")
        if unknown:
            raise self.error(f"unknown attribute(s) {sorted(unknown)} for {self.domain or 'ai.onnx'}::"
                             f"{self.op_type}")

    def sub(self, cls, version: int):
        """An instance of another kernel class (at a fixed version) sharing this kernel's
        context: how the contrib kernels reuse the ONNX-domain math."""
        cache = self.__dict__.setdefault("_sub_kernels", {})
        key = (cls, version)
        k = cache.get(key)
        if k is None:
            k = cache[key] = cls(self.ctx, version)
        return k

    def floats(self, allowed, **named) -> None:
        """Element types: every given tensor in allowed, all of one type."""
        first = None
        for name, t in named.items():
            if t is None or t.is_absent:
                continue
            self.check_type(name, t, allowed)
            if first is None:
                first = (name, t)
            elif t.data_type != first[1].data_type:
                raise self.type_error(f"inputs '{first[0]}' and '{name}' must have one element type, got "
                                      f"{dtypes.describe(first[1].data_type)} and {dtypes.describe(t.data_type)}",
                                      **{first[0]: first[1], name: t})

    def compute_tensor(self, t: Tensor, dtype=None) -> Tensor:
        """t's values in its compute dtype (float32 for half types), as a Tensor."""
        arr = self.to_compute(t, dtype)
        return Tensor.wrap(arr, dtypes.from_numpy(arr.dtype).data_type)

    def vector(self, t: Tensor, name: str, size: int, **context) -> None:
        """t must be 1-D of the given size."""
        if t.ndim != 1 or t.shape[0] != size:
            raise self.error(f"'{name}' must be 1-D of size {size}, got shape {list(t.shape)}",
                             **{name: t}, **context)


def compute_dtype(*tensors) -> np.dtype:
    """float64 when any tensor is double, else float32."""
    for t in tensors:
        if t is not None and not t.is_absent and t.data_type == DataType.DOUBLE:
            return np.dtype(np.float64)
    return np.dtype(np.float32)


def host_ints(t: Tensor) -> np.ndarray:
    """An integer tensor's values on the host (int64)."""
    return np.asarray(t.numpy(), dtype=np.int64)
