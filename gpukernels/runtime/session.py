"""Session: load a model once, run it many times on one device."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from .. import dtypes
from ..errors import InputError, ModelError
from ..gpu import device_checks
from ..host import HostArena, suspended
from ..kernels.base import KernelContext
from ..tensor import Optional, Sequence, Tensor, to_host_value
from ..xp import Device, require
from .body import CompiledGraph
from .graph import PreparedGraph, functions_of
from .optimize import Specializer
from .validation import check_model, feed_checker


def load_model(model, base_dir: str | None = None) -> tuple[onnx.ModelProto, str | None]:
    """(ModelProto, base_dir) from a path, bytes or ModelProto.

    External data is read lazily, tensor by tensor, from inside base_dir only: the
    model's own folder for a path; for bytes or a ModelProto, the base_dir the caller
    gives (None: external data is refused, see gpukernels.external_data)."""
    if isinstance(model, onnx.ModelProto):
        proto = model
    elif isinstance(model, (bytes, bytearray, memoryview)):
        proto = onnx.ModelProto()
        try:
            proto.ParseFromString(bytes(model))
        except Exception as exc:  # noqa: BLE001 -- protobuf's DecodeError and friends
            raise ModelError(f"the bytes given are not an ONNX model: {type(exc).__name__}: {exc}"
                             f"{_depth_hint(exc)}") from exc
    else:
        path = Path(model)
        if not path.is_file():
            raise ModelError(f"model file {str(path)!r} does not exist or is not a file")
        proto = onnx.ModelProto()
        try:
            proto.ParseFromString(path.read_bytes())
        except Exception as exc:  # noqa: BLE001
            raise ModelError(f"cannot parse {str(path)!r} as an ONNX model: "
                             f"{type(exc).__name__}: {exc}{_depth_hint(exc)}") from exc
        if base_dir is None:
            base_dir = str(path.parent)
    check_model(proto)
    return proto, base_dir


def _depth_hint(exc) -> str:
    if "MaxDepth" in str(exc) or "recursion" in str(exc).lower():
        return (" (messages nested deeper than the protobuf parser allows, such as subgraphs "
                "inside each other)")
    return ""


def opsets_of(model: onnx.ModelProto) -> dict:
    return {("" if o.domain == "ai.onnx" else o.domain): int(o.version) for o in model.opset_import}


class Session:
    """A model prepared on one device.

    >>> sess = Session("model.onnx", device="cpu")
    >>> outputs = sess.run(None, {"x": x})        # host NumPy arrays (lists for sequences)
    >>> values = sess.run_values({"x": x})          # Tensors / Sequences on the device

    model: a path, bytes or a ModelProto.  base_dir: the folder external data is read
    from (default: the model file's folder; none for bytes/ModelProto, which then may
    not use external data).  options: see KernelContext.OPTIONS.

    One Session may be run from any number of threads at once: runs share only the
    prepared graph, which no run changes, and the session's host buffer arena
    (``arena``: large host arrays handed out again from run to run, see
    gpukernels.host.arena; runs with an observer do without it).  Inputs are checked against the model's
    declared element types, ranks and fixed dimensions; the arrays returned never share
    memory with the session's constants.
    """

    def __init__(self, model, device="cpu", options: dict | None = None, base_dir: str | None = None):
        self.model, self.base_dir = load_model(model, base_dir)
        self.device = require(Device.parse(device))
        self.opsets = opsets_of(self.model)
        self.ctx = KernelContext(self.device, self.opsets, dict(options or {}))
        # feeds are checked against the declared inputs (below), so graph optimisations
        # may rely on the declared types, ranks and fixed dimensions (checked_inputs)
        self.graph = PreparedGraph(self.model.graph, self.ctx, functions_of(self.model), self.base_dir,
                                   checked_inputs=True)
        init_names = {i.name for i in self.model.graph.initializer}
        self.inputs = [i for i in self.model.graph.input if i.name not in init_names]
        self.outputs = list(self.model.graph.output)
        self.input_names = [i.name for i in self.inputs]
        self.output_names = [o.name for o in self.outputs]
        self._input_types = {i.name: i.type for i in self.model.graph.input}
        self._checkers = {name: feed_checker(name, tp) for name, tp in self._input_types.items()}
        self._feeders = {name: self._feeder(name, tp) for name, tp in self._input_types.items()}
        self._input_set = frozenset(self.input_names)
        self._device_spans = None  # device memory ranges of the constants, when first needed
        # repeated runs with the same input types and shapes go through a compiled plan
        # (see runtime.body.CompiledGraph); the option compile_graph=False turns it off
        self._compiled = CompiledGraph(self.graph) if self.ctx.option("compile_graph", True) else None
        # graphs with symbolic input dimensions: prepared again per input signature, so
        # their shape arithmetic folds too (optimize pass 'specialize', runtime.optimize)
        self._specializer = Specializer.for_plan(self.graph, self._compiled is not None)
        self.arena = HostArena()

    def feed(self, name: str, value):
        """Convert a user value for input name into a runtime value on the device."""
        return self._feeders[name](value)

    def _feeder(self, name: str, type_proto):
        """feed() for one input, prepared once: on the host, an array the checker passes
        with the declared dtype is wrapped as it is (what to_runtime_value does for it,
        without the look-ups); anything else goes through to_runtime_value."""
        check, device = self._checkers[name], self.device
        dt = _host_tensor_type(type_proto) if not device.is_cuda else None

        def general(value):
            return to_runtime_value(check(value), type_proto, device)

        if dt is None:
            return general
        want, ndarray, wrap = dtypes.info(dt).numpy, np.ndarray, Tensor.wrap

        def fast(value):
            value = check(value)
            if value.__class__ is ndarray and value.dtype == want:
                return wrap(value, dt)
            return to_runtime_value(value, type_proto, device)

        return fast

    def run_values(self, feeds: dict, observer=None) -> list:
        """Run with feeds {name: value}; returns runtime values (Tensors, Sequences...)
        on the session's device.  Returned tensors never share memory with the
        session's constants (those are copied)."""
        return [self._detach(v) for v in self._run_values(feeds, observer)]

    def _detach(self, value):
        """value, or a copy of it where its array is one of the session's constants (or a
        view of one): read-only NumPy arrays, or CuPy arrays inside a constant's memory."""
        if value.__class__ is Tensor and value.array is not None:
            arr = value.array
            if arr.__class__ is np.ndarray:
                return value if arr.flags.writeable else Tensor.wrap(arr.copy(), value.data_type)
            if self._device_spans is None or (self._specializer is not None
                                              and self._device_spans[0] != len(self._specializer.entries)):
                plans = [self.graph] + (self._specializer.plans() if self._specializer is not None else [])
                self._device_spans = (len(self._specializer.entries) if self._specializer is not None else 0,
                                      [s for plan in plans for s in _device_spans(plan.constants)])
            lo = arr.data.ptr
            hi = lo + arr.nbytes
            if any(lo < end and start < hi for start, end in self._device_spans[1]):
                return Tensor.wrap(arr.copy(), value.data_type)
            return value
        if isinstance(value, Sequence):
            return Sequence([self._detach(t) for t in value.tensors], value.elem_type)
        if isinstance(value, Optional) and value.value is not None:
            return Optional(self._detach(value.value), value.type_proto)
        return value

    def _run_values(self, feeds: dict, observer=None) -> list:
        if self.device.is_cuda:
            # data checks on the device (position ids, indices) are read once per run
            with device_checks.deferred():
                return self._run_graph(feeds, observer)
        return self._run_graph(feeds, observer)

    def _run_graph(self, feeds: dict, observer=None) -> list:
        if feeds.keys() != self._input_set:  # else: exactly the inputs, the common case
            unknown = set(feeds) - set(self._input_types)
            if unknown:
                raise InputError(f"unknown input name(s) {sorted(unknown)}; the model's inputs are "
                                 f"{self.input_names}")
            missing = [n for n in self.input_names if n not in feeds]
            if missing:
                raise InputError(f"missing input(s) {missing}; the model's inputs are {self.input_names}")
        feeders = self._feeders
        values = {name: feeders[name](v) for name, v in feeds.items()}
        graph, compiled = self.graph, self._compiled
        if self._specializer is not None:
            with suspended():  # a new signature's graph is prepared: its constants stay
                found = self._specializer.lookup(values)
            if found is not None:
                graph, compiled = found
        if observer is not None:
            with suspended():  # an observer may keep any intermediate
                return graph.run(values, observer=observer)
        with self.arena.run() as live:
            outs = compiled.run(values) if compiled is not None else None
            if outs is None:
                outs = graph.run(values)
            if live is not None:
                live.finish(outs)
            return outs

    def run(self, output_names, feeds: dict, observer=None) -> list:
        """onnxruntime-style: host values of the requested outputs (all when None)."""
        values = self._run_values(feeds, observer=observer)
        if output_names is None:
            return [_host_output(v) for v in values]
        index = {n: i for i, n in enumerate(self.output_names)}
        try:
            return [_host_output(values[index[n]]) for n in output_names]
        except KeyError as exc:
            raise ModelError(f"unknown output {exc.args[0]!r}; outputs are {self.output_names}") from None


def _device_spans(constants: dict) -> list:
    """(start, end) device addresses of the device arrays among constants."""
    spans = []
    for t in constants.values():
        arr = getattr(t, "array", None)
        if arr is not None and arr.__class__ is not np.ndarray and hasattr(arr, "data"):
            spans.append((arr.data.ptr, arr.data.ptr + arr.nbytes))
    return spans


def _host_tensor_type(type_proto):
    """The declared element type of a tensor input whose host arrays are stored as
    they are (not STRING), else None."""
    if type_proto is None or type_proto.WhichOneof("value") != "tensor_type":
        return None
    et = type_proto.tensor_type.elem_type
    try:
        info = dtypes.info(et) if et else None
    except TypeError:
        return None
    if info is None or info.data_type == dtypes.DataType.STRING:
        return None
    return info.data_type


def _host_output(value):
    """_owned(to_host_value(value)); a host Tensor whose array has its exact dtype (the
    common case) without the general walk."""
    if value.__class__ is Tensor:
        arr = value.array
        if arr.__class__ is np.ndarray and arr.dtype == dtypes.info(value.data_type).numpy:
            return arr if arr.flags.writeable else arr.copy()
    return _owned(to_host_value(value))


def _owned(value):
    """value with every read-only host array copied: read-only arrays are the session's
    constants or views of them (see runtime.graph.freeze), which a caller must not hold."""
    if value.__class__ is np.ndarray:
        return value if value.flags.writeable else value.copy()
    if isinstance(value, list):
        return [_owned(v) for v in value]
    return value


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
