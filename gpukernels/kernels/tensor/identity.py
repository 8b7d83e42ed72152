"""Identity: returns its input unchanged (tensors, sequences and optionals alike).

The output shares the input's buffer; kernels never write into their inputs, so sharing
is safe."""

from __future__ import annotations

from ...tensor import Optional, Sequence
from ..base import KernelBase, register


@register()
class Identity(KernelBase):
    def __call__(self, input):
        if isinstance(input, (Sequence, Optional)):
            return input.to(self.device)
        t = self.tensor(input, "input")
        self.check_inputs(t)
        return t

    def can_run_in_place(self) -> bool:
        return True
