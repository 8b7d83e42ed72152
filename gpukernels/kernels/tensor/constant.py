"""Constant and ConstantOfShape."""

from __future__ import annotations

import numpy as np

from ...dtypes import DataType
from ...limits import check_allocation
from ...tensor import Tensor
from ..base import KernelBase, register


@register()
class Constant(KernelBase):
    """Exactly one of the value attributes must be set; sparse_value arrives already
    densified by the runtime (or as a Tensor when called directly)."""

    _ATTRS = ("value", "sparse_value", "value_float", "value_floats", "value_int",
              "value_ints", "value_string", "value_strings")

    def __call__(self, **attrs):
        given = {k: v for k, v in attrs.items() if v is not None}
        unknown = set(given) - set(self._ATTRS)
        if unknown:
            raise self.error(f"unknown attribute(s) {sorted(unknown)}")
        if len(given) != 1:
            raise self.error(f"exactly one value attribute must be set, got {sorted(given) or 'none'}")
        (key, value), = given.items()
        if key in ("value", "sparse_value"):
            t = value if isinstance(value, Tensor) else Tensor(value)
        elif key == "value_float":
            t = Tensor(np.float32(value))
        elif key == "value_floats":
            t = Tensor(np.asarray(value, dtype=np.float32))
        elif key == "value_int":
            t = Tensor(np.int64(value))
        elif key == "value_ints":
            t = Tensor(np.asarray(value, dtype=np.int64))
        elif key == "value_string":
            t = Tensor(np.array(value, dtype=object), DataType.STRING)
        else:
            t = Tensor(np.array(list(value), dtype=object).reshape(len(value)), DataType.STRING)
        if t.data_type == DataType.STRING:
            return t
        return t.to(self.device)


@register()
class ConstantOfShape(KernelBase):
    """A tensor of the given shape filled with value (a one-element tensor, default
    float32 zero).  An empty shape gives a scalar; a zero dimension an empty tensor."""

    def __call__(self, input, value=None):
        shape_t = self.host_tensor(input, "input")
        self.check_inputs(shape_t)
        shape = [int(d) for d in np.asarray(shape_t.numpy()).reshape(-1)]
        if any(d < 0 for d in shape):
            raise self.error(f"negative dimension in shape {shape}", input=shape_t)
        if value is None:
            fill = Tensor(np.zeros(1, np.float32))
        else:
            fill = value if isinstance(value, Tensor) else Tensor(value)
        if fill.size != 1:
            raise self.error(f"value must hold exactly one element, got shape {list(fill.shape)}")
        fill_host = fill.numpy().reshape(())
        check_allocation(self, shape, fill.dtype)
        out = np.full(shape, fill_host, dtype=fill.dtype)
        return Tensor(out, fill.data_type).to(self.device) if self.on_gpu else Tensor.wrap(out, fill.data_type)
