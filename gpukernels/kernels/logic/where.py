"""Where: elements of X where condition is true, else of Y, with three-way
multidirectional broadcasting.  Works on the stored values directly, so every element
type (bfloat16 and strings included) is selected exactly; STRING tensors stay on the host.
"""

from __future__ import annotations

import numpy as np

from ...dtypes import DataType
from ...tensor import Tensor
from ...xp import to_host
from ..base import KernelBase, register


@register()
class Where(KernelBase):
    def __call__(self, condition, X, Y):
        c = self.tensor(condition, "condition")
        x = self.tensor(X, "X")
        y = self.tensor(Y, "Y")
        self.check_inputs(c, x, y)
        if x.data_type != y.data_type:
            raise self.type_error("X and Y must have the same element type", X=x, Y=y)
        try:
            shape = np.broadcast_shapes(c.shape, x.shape, y.shape)
        except ValueError:
            raise self.error("shapes do not broadcast", condition=c, X=x, Y=y) from None
        if x.data_type == DataType.STRING:
            out = np.where(to_host(c.array), x.array, y.array)
            return self.result(np.asarray(out, dtype=object).reshape(shape), DataType.STRING)
        out = self.xp.where(c.array, x.array, y.array)
        return self.result(out, x.data_type)

    def array_function(self, inputs, attrs):
        """Non-string values: xp.where on the stored arrays, as above."""
        if len(inputs) != 3 or any(t.__class__ is not Tensor for t in inputs) \
                or inputs[1].data_type == DataType.STRING:
            return None
        return self.xp.where
