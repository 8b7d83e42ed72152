"""Flatten: (d0 * ... * d(axis-1), d(axis) * ... * d(n-1)).

axis in [0, rank] (opset 1, 9) or [-rank, rank] (opset 11+).  Every element type the
schema allows, strings included.  The output shares the input's buffer when the input is
contiguous (kernels never write into their inputs)."""

from __future__ import annotations

import math

from ..base import KernelBase, register


@register()
class Flatten(KernelBase):
    def __call__(self, input, axis=1):
        x = self.tensor(input, "input")
        self.check_inputs(x)
        r = x.ndim
        axis = int(axis)
        lo = -r if self.since_version >= 11 else 0
        if not lo <= axis <= r:
            raise self.error(f"axis {axis} is out of range [{lo}, {r}] for rank {r}", input=x)
        if axis < 0:
            axis += r
        outer = int(math.prod(x.shape[:axis]))
        inner = int(math.prod(x.shape[axis:]))
        return self.result(x.array.reshape(outer, inner), x.data_type)

    def can_run_in_place(self) -> bool:
        return True
