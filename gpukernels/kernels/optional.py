"""Optional, OptionalHasElement and OptionalGetElement.

An optional value is a ``gpukernels.tensor.Optional``: empty (``value is None``, with the
declared optional TypeProto in ``type_proto`` when known) or holding a Tensor or a
Sequence.  Python lists/tuples are taken as sequences.
"""

from __future__ import annotations

import numpy as np
import onnx

from .. import dtypes
from ..dtypes import DataType
from ..tensor import Optional as OptionalValue
from ..tensor import Sequence, Tensor
from .base import describe, register
from .sequence import SequenceKernelBase, allowed_types, declared_kind


class _OptionalKernelBase(SequenceKernelBase):
    def payload(self, value, name: str, type_param: str):
        """A Tensor or Sequence payload on this device, its type allowed by the schema."""
        if isinstance(value, OptionalValue):
            raise self.type_error(f"input '{name}' cannot be an optional of an optional")
        if isinstance(value, (Sequence, list, tuple)):
            return self.sequence(value, name, type_param)
        if isinstance(value, Tensor) and value.data_type == DataType.STRING:
            t = value
        else:
            t = self.tensor(value, name)
        allowed = allowed_types(self.op_type, self.since_version, type_param, "tensor")
        if allowed is not None and t.data_type not in allowed:
            raise self.type_error(f"input '{name}' has element type {dtypes.describe(t.data_type)}, which "
                                  f"opset-{self.since_version} {self.op_type} does not allow", **{name: t})
        return t

    def optional_input(self, value, name: str = "input"):
        """An Optional input (its payload moved to this device), or a plain Tensor or
        Sequence (allowed from opset 18 on; accepted at every version), or None."""
        if value is None or (isinstance(value, Tensor) and value.is_absent):
            return None
        if isinstance(value, OptionalValue):
            if value.value is None:
                return value
            inner = value.value
            kind = "opt_seq" if isinstance(inner, Sequence) else "opt_tensor"
            et = inner.elem_type if isinstance(inner, Sequence) else inner.data_type
            allowed = allowed_types(self.op_type, self.since_version, "O", kind)
            if allowed is not None and et not in allowed:
                raise self.type_error(f"input '{name}' is {describe(value)}, which opset-{self.since_version} "
                                      f"{self.op_type} does not allow")
            moved = self.on_device(inner) if isinstance(inner, Sequence) else self._tensor_here(inner)
            return value if moved is inner else OptionalValue(moved, value.type_proto)
        return self.payload(value, name, "O" if self.since_version >= 18 else "V")

    def _tensor_here(self, t: Tensor) -> Tensor:
        if t.data_type == DataType.STRING:
            return t
        return self.tensor(t, "input")


@register()
class Optional(_OptionalKernelBase):
    """An optional holding input, or an empty optional of the element type given by the
    ``type`` attribute (a TypeProto of a tensor or sequence type; required when input is
    absent).  When both are given they must agree."""

    def __call__(self, input=None, type=None):
        tp = _coerce_type(self, type)
        if input is None or (isinstance(input, Tensor) and input.is_absent):
            if tp is None:
                raise self.error("an empty optional needs the 'type' attribute (the element's TypeProto)")
            return OptionalValue(None, onnx.helper.make_optional_type_proto(tp))
        value = self.payload(input, "input", "V")
        if tp is not None:
            kind, et, _ = declared_kind(tp)
            got = "seq" if isinstance(value, Sequence) else "tensor"
            vet = value.elem_type if isinstance(value, Sequence) else value.data_type
            if kind != got or (et and et != int(vet)):
                raise self.type_error(f"input is {describe(value)} but the 'type' attribute declares "
                                      f"{onnx.helper.printable_type(tp)}")
        out_tp = onnx.helper.make_optional_type_proto(tp) if tp is not None else None
        return OptionalValue(value, out_tp)


def _coerce_type(kernel, type_attr):
    """The type attribute as a TypeProto of a tensor or sequence (None when unset).
    A DataType (or its name) is taken as a tensor of that element type."""
    if type_attr is None:
        return None
    if isinstance(type_attr, onnx.TypeProto):
        kind = declared_kind(type_attr)[0]
        if kind not in ("tensor", "seq"):
            raise kernel.error("the 'type' attribute must be a tensor or sequence type, got "
                               f"{onnx.helper.printable_type(type_attr)}")
        allowed = allowed_types(kernel.op_type, kernel.since_version, "V", kind)
        et = declared_kind(type_attr)[1]
        if et and allowed is not None and et not in allowed:
            raise kernel.type_error(f"the 'type' attribute's element type {dtypes.describe(et)} is not "
                                    f"allowed for opset-{kernel.since_version} Optional")
        return type_attr
    try:
        et = dtypes.info(type_attr).data_type
    except TypeError:
        raise kernel.error(f"the 'type' attribute must be an onnx TypeProto, got {type_attr!r}") from None
    return onnx.helper.make_tensor_type_proto(int(et), None)


@register()
class OptionalHasElement(_OptionalKernelBase):
    """True when input is a non-empty optional, a tensor or a sequence; False when it is
    an empty optional or omitted.  (Plain tensors/sequences and an omitted input are
    spelled out from opset 18; they are accepted at opset 15 as well.)"""

    def __call__(self, input=None):
        v = self.optional_input(input)
        has = v is not None and not (isinstance(v, OptionalValue) and v.value is None)
        return self.result(self.xp.asarray(np.bool_(has)), DataType.BOOL)


@register()
class OptionalGetElement(_OptionalKernelBase):
    """The optional's element; a plain tensor or sequence is returned as it is (spelled
    out from opset 18, accepted at opset 15 too).  An empty optional raises (the spec
    leaves it undefined)."""

    def __call__(self, input=None):
        v = self.optional_input(input)
        if v is None:
            raise self.error("required input 'input' is missing")
        if isinstance(v, OptionalValue):
            if v.value is None:
                raise self.error("the optional is empty; it has no element to get", input=v)
            return v.value
        return v
