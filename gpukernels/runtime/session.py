"""Session: load a model once, run it many times on one device."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx

from .. import dtypes
from ..errors import ModelError
from ..kernels.base import KernelContext
from ..tensor import Optional, Sequence, Tensor, to_host_value
from ..xp import Device, require
from .body import CompiledGraph
from .graph import PreparedGraph, functions_of


def load_model(model, load_external_data: bool = True) -> tuple[onnx.ModelProto, str | None]:
    """(ModelProto, base_dir) from a path, bytes or ModelProto.  External data is read
    from the model's folder."""
    if isinstance(model, onnx.ModelProto):
        return model, None
    if isinstance(model, (bytes, bytearray)):
        return onnx.load_model_from_string(bytes(model)), None
    path = Path(model)
    if not path.exists():
        raise ModelError(f"model file {str(path)!r} does not exist")
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as exc:
        raise ModelError(f"cannot parse {str(path)!r} as an ONNX model: {exc}") from exc
    base_dir = str(path.parent)
    if load_external_data:
        from onnx.external_data_helper import load_external_data_for_model

        if _uses_external_data(proto):
            load_external_data_for_model(proto, base_dir)
    return proto, base_dir


def _uses_external_data(model: onnx.ModelProto) -> bool:
    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)


def opsets_of(model: onnx.ModelProto) -> dict:
    return {("" if o.domain == "ai.onnx" else o.domain): int(o.version) for o in model.opset_import}


class Session:
    """A model prepared on one device.

    >>> sess = Session("model.onnx", device="cpu")
    >>> outputs = sess.run(None, {"x": x})        # host NumPy arrays (lists for sequences)
    >>> values = sess.run_values({"x": x})          # Tensors / Sequences on the device
    """

    def __init__(self, model, device="cpu", options: dict | None = None):
        self.model, self.base_dir = load_model(model)
        self.device = require(Device.parse(device))
        self.opsets = opsets_of(self.model)
        self.ctx = KernelContext(self.device, self.opsets, dict(options or {}))
        self.graph = PreparedGraph(self.model.graph, self.ctx, functions_of(self.model), self.base_dir)
        init_names = {i.name for i in self.model.graph.initializer}
        self.inputs = [i for i in self.model.graph.input if i.name not in init_names]
        self.outputs = list(self.model.graph.output)
        self.input_names = [i.name for i in self.inputs]
        self.output_names = [o.name for o in self.outputs]
        self._input_types = {i.name: i.type for i in self.model.graph.input}
        # repeated runs with the same input types and shapes go through a compiled plan
        # (see runtime.body.CompiledGraph); the option compile_graph=False turns it off
        self._compiled = CompiledGraph(self.graph) if self.ctx.option("compile_graph", True) else None

    def feed(self, name: str, value):
        """Convert a user value for input name into a runtime value on the device."""
        tp = self._input_types.get(name)
        return to_runtime_value(value, tp, self.device)

    def run_values(self, feeds: dict, observer=None) -> list:
        """Run with feeds {name: value}; returns runtime values (Tensors, Sequences...)."""
        unknown = set(feeds) - set(self._input_types)
        if unknown:
            raise ModelError(f"unknown input name(s) {sorted(unknown)}; the model's inputs are "
                             f"{self.input_names}")
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise ModelError(f"missing input(s) {missing}")
        values = {name: self.feed(name, v) for name, v in feeds.items()}
        if observer is None and self._compiled is not None:
            outs = self._compiled.run(values)
            if outs is not None:
                return outs
        return self.graph.run(values, observer=observer)

    def run(self, output_names, feeds: dict, observer=None) -> list:
        """onnxruntime-style: host values of the requested outputs (all when None)."""
        values = self.run_values(feeds, observer=observer)
        if output_names is None:
            return [to_host_value(v) for v in values]
        index = {n: i for i, n in enumerate(self.output_names)}
        try:
            return [to_host_value(values[index[n]]) for n in output_names]
        except KeyError as exc:
            raise ModelError(f"unknown output {exc.args[0]!r}; outputs are {self.output_names}") from None


def to_runtime_value(value, type_proto, device: Device):
    """A runtime value from a user value, guided by the declared TypeProto."""
    if isinstance(value, (Tensor, Sequence, Optional)):
        return value.to(device) if not (isinstance(value, Tensor) and value.data_type == dtypes.DataType.STRING) else value
    kind = type_proto.WhichOneof("value") if type_proto is not None else None
    if kind == "optional_type":
        if value is None:
            return Optional(None, type_proto)
        inner = to_runtime_value(value, type_proto.optional_type.elem_type, device)
        return Optional(inner, type_proto)
    if kind == "sequence_type":
        elem = type_proto.sequence_type.elem_type
        if elem.WhichOneof("value") == "tensor_type":
            et = elem.tensor_type.elem_type or None
            items = [Tensor(v, et) for v in value]
            seq = Sequence(items, et if et else (items[0].data_type if items else dtypes.DataType.FLOAT))
            return seq.to(device) if device.is_cuda else seq
        return list(value)
    if kind == "map_type" or isinstance(value, dict):
        return value
    if value is None:
        return None
    et = None
    if kind == "tensor_type" and type_proto.tensor_type.elem_type:
        et = type_proto.tensor_type.elem_type
    arr = value if hasattr(value, "dtype") else np.asarray(value)
    t = Tensor(arr, et) if et is None or _dtype_matches(arr, et) else Tensor(arr)
    if device.is_cuda and t.data_type != dtypes.DataType.STRING:
        t = t.to(device)
    return t


def _dtype_matches(arr, et) -> bool:
    try:
        want = dtypes.info(et)
    except TypeError:
        return False
    return (want.data_type == dtypes.DataType.STRING and arr.dtype.kind in "OUS") or arr.dtype == want.numpy
