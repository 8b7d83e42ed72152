"""gpukernels as an ONNX backend (``onnx.backend.base.Backend``).

The official backend test runner, and any code written against that interface, can use
gpukernels through this module::

    import gpukernels.backend as backend
    rep = backend.prepare(model, "CPU")     # or "CUDA" when a GPU is usable
    outputs = rep.run([x])                  # host NumPy arrays, lists for sequences
"""

from __future__ import annotations

import onnx
from onnx.backend.base import Backend, BackendRep, Device as OnnxDevice, DeviceType

from .errors import DeviceError
from .runtime import RuntimeContext, Session
from .runtime import run_node as run_single_node
from .tensor import to_host_value
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
        dev = _device(device)
        if dev.is_cuda and not cuda_status().available:
            raise DeviceError(f"device {device} is not usable: {cuda_status().reason}")
        opsets = {"": kwargs.get("opset_version", onnx.defs.onnx_opset_version())}
        if node.domain not in ("", "ai.onnx"):
            opsets[node.domain] = 1
        outputs = run_single_node(node, list(inputs), RuntimeContext(dev, opsets))
        return tuple(to_host_value(v) for v in outputs)

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
