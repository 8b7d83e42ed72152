"""Flatten: (d0 * ... * d(axis-1), d(axis) * ... * d(n-1)).

axis in [0, rank] (opset 1, 9) or [-rank, rank] (opset 11+).  Every element type the
schema allows, strings included.  The output shares the input's buffer when the input is
contiguous (kernels never write into their inputs)."""

from __future__ import annotations

import math

from ...tensor import Tensor
from ..base import KernelBase, register


@register()
class Flatten(KernelBase):
    def __call__(self, input, axis=1):
        x = self.tensor(input, "input")
        self.check_inputs(x)
        outer, inner = self._sizes(x, axis)
        return self.result(x.array.reshape(outer, inner), x.data_type)

    def _sizes(self, x, axis) -> tuple[int, int]:
        """(outer, inner): the products of the dimensions before and from axis."""
        r = x.ndim
        axis = int(axis)
        lo = -r if self.since_version >= 11 else 0
        if not lo <= axis <= r:
            raise self.error(f"axis {axis} is out of range [{lo}, {r}] for rank {r}", input=x)
        if axis < 0:
            axis += r
        return int(math.prod(x.shape[:axis])), int(math.prod(x.shape[axis:]))

    def array_function(self, inputs, attrs):
        """Compiled graphs: the same reshape, its sizes computed once (shapes are fixed
        per compiled program)."""
        if len(inputs) != 1 or inputs[0].__class__ is not Tensor:
            return None
        outer, inner = self._sizes(inputs[0], attrs.get("axis", 1))
        return lambda a: a.reshape(outer, inner)

    def can_run_in_place(self) -> bool:
        return True
