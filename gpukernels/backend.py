"""gpukernels as an ONNX backend (``onnx.backend.base.Backend``).

The official backend test runner, and any code written against that interface, can use
gpukernels through this module::

    import gpukernels.backend as backend
    rep = backend.prepare(model, "CPU")     # or "CUDA" when a GPU is usable
    outputs = rep.run([x])                  # host NumPy arrays, lists for sequences
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper
from onnx.backend.base import Backend, BackendRep, Device as OnnxDevice, DeviceType

from .errors import DeviceError
from .runtime import Session
from .xp import Device, cuda_status


def _device(device) -> Device:
    text = str(device or "CPU")
    if text.upper().startswith("CUDA"):
        return Device.parse(text.lower())
    return Device.parse(text)


class GpuKernelsRep(BackendRep):
    """A prepared model; ``run`` takes inputs in declared order (or a dict by name)."""

    def __init__(self, session: Session):
        self.session = session

    def run(self, inputs, **kwargs):
        names = self.session.input_names
        if isinstance(inputs, dict):
            feeds = dict(inputs)
        else:
            if not isinstance(inputs, (list, tuple)):
                inputs = [inputs]
            if len(inputs) > len(names):
                all_names = [i.name for i in self.session.model.graph.input]
                names = all_names  # inputs given for initializers too (old IR)
            feeds = dict(zip(names, inputs))
        return tuple(self.session.run(None, feeds))


class GpuKernelsBackend(Backend):
    @classmethod
    def is_compatible(cls, model, device: str = "CPU", **kwargs) -> bool:
        return cls.supports_device(device)

    @classmethod
    def prepare(cls, model, device: str = "CPU", **kwargs) -> GpuKernelsRep:
        dev = _device(device)
        if dev.is_cuda and not cuda_status().available:
            raise DeviceError(f"device {device} is not usable: {cuda_status().reason}")
        options = kwargs.get("options")
        return GpuKernelsRep(Session(model, device=dev, options=options))

    @classmethod
    def run_model(cls, model, inputs, device: str = "CPU", **kwargs):
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node, inputs, device: str = "CPU", outputs_info=None, **kwargs):
        """Run one NodeProto on NumPy inputs (in the node's input order)."""
        opset = kwargs.get("opset_version", onnx.defs.onnx_opset_version())
        names = [n for n in node.input if n]
        values = [v for n, v in zip(node.input, inputs) if n]
        graph_inputs = []
        for name, value in zip(names, values):
            arr = np.asarray(value)
            graph_inputs.append(helper.make_tensor_value_info(
                name, helper.np_dtype_to_tensor_dtype(arr.dtype), list(arr.shape)))
        graph = helper.make_graph([node], "run_node", graph_inputs,
                                  [helper.make_value_info(o, onnx.TypeProto()) for o in node.output if o])
        opsets = [helper.make_opsetid("", opset)]
        if node.domain not in ("", "ai.onnx"):
            opsets.append(helper.make_opsetid(node.domain, 1))
        model = helper.make_model(graph, opset_imports=opsets)
        return cls.prepare(model, device).run(dict(zip(names, values)))

    @classmethod
    def supports_device(cls, device: str) -> bool:
        try:
            dev = _device(device)
        except DeviceError:
            return False
        return not dev.is_cuda or cuda_status().available


prepare = GpuKernelsBackend.prepare
run_model = GpuKernelsBackend.run_model
run_node = GpuKernelsBackend.run_node
supports_device = GpuKernelsBackend.supports_device
is_compatible = GpuKernelsBackend.is_compatible
