"""KernelContext, KernelBase and the registry of kernel classes.

A kernel class is named as its ONNX operator and registered for the operator's schema
versions.  It is constructed with a KernelContext and called with the operator's inputs
in ONNX order (Tensors, arrays, Python values, or None for an omitted optional input)
and its attributes as keyword arguments named as in ONNX.  It returns a Tensor, or a
named tuple (``Result``) for several outputs.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import onnx

from .. import dtypes
from ..dtypes import DataType
from ..errors import KernelInputError, KernelTypeError, OptionError, UnsupportedOperatorError
from ..limits import resolve_limit
from ..options import OPTIONS, Options  # noqa: F401 -- OPTIONS: the listing, re-exported
from ..tensor import Optional, Sequence, Tensor
from ..xp import Device, is_cupy_array, namespace
from ._loader import load_all as _load_all
from .specialize import cuda_kernel as _cuda_kernel_entry
from .specialize import find as _find_specialization
from .specialize import note_chosen as _note_chosen
from .specialize import resolve_paths
from .subgraphs import runner as _subgraph_runner

LATEST_OPSET = {
    "": onnx.defs.onnx_opset_version(),
    "ai.onnx": onnx.defs.onnx_opset_version(),
}


_NO_OPTION = object()


@dataclass(eq=False)
class KernelContext:
    """Where and how kernels run.

    device: 'cpu', 'cuda', 'cuda:N' or a Device.
    opset: the model's opset, an int (default domain) or {domain: version}; kernels pick
      the newest registered version not newer than it.  Default: the newest onnx knows.
    options: a dict of switches, checked into ``settings`` (gpukernels.options.Options:
      each option, its default and what it does); an unknown key is an OptionError that
      suggests the closest known name, a value of the wrong kind one that says what fits.
    """

    device: Any = "cpu"
    opset: Any = None
    options: dict = field(default_factory=dict)

    def __post_init__(self):
        self.device = Device.parse(self.device)
        self.settings = Options.from_mapping(self.options)
        self.options = dict(self.options)
        self.paths  # validated now: a bad option or GPUKERNELS_PATHS fails here
        if self.opset is None:
            self.opset = {}
        elif isinstance(self.opset, int):
            self.opset = {"": int(self.opset)}
        else:
            self.opset = {("" if k == "ai.onnx" else k): int(v) for k, v in dict(self.opset).items()}

    @functools.cached_property
    def xp(self):
        return namespace(self.device)

    @functools.cached_property
    def paths(self) -> str:
        """'auto' or 'reference': the option 'paths', else GPUKERNELS_PATHS, else 'auto'."""
        return resolve_paths(self.options)

    @functools.cached_property
    def tensor_byte_limit(self) -> int | None:
        """The largest tensor a kernel may allocate, in bytes (None: no limit): the option
        max_tensor_bytes, else GPUKERNELS_MAX_TENSOR_BYTES (read on first use), else the
        default (gpukernels.limits)."""
        return resolve_limit(self.settings.max_tensor_bytes)

    @functools.cached_property
    def device_kind(self) -> str:
        """'cuda' or 'cpu': the device a specialisation is registered for."""
        return "cuda" if self.device.is_cuda else "cpu"

    def opset_for(self, domain: str) -> int | None:
        """The opset version for domain, or None for 'newest'."""
        return self.opset.get("" if domain == "ai.onnx" else domain)

    def option(self, key: str, default=None):
        """The checked value of option key (``settings``), or default when it was not given
        and has no default of its own."""
        value = getattr(self.settings, key, _NO_OPTION)
        if value is _NO_OPTION:
            raise OptionError(f"KernelContext.option: no option named {key!r} (gpukernels.options.Options)")
        return default if value is None else value


# ------------------------------------------------------------------ registry

_REGISTRY: dict[tuple[str, str], dict[int, type]] = {}


def schema_versions(op_type: str, domain: str = "") -> list[int]:
    """Every since_version the installed onnx defines for (domain, op_type)."""
    return _schema_versions_index().get((domain, op_type), [])


@functools.lru_cache(maxsize=1)
def _schema_versions_index() -> dict:
    """{(domain, op_type): sorted since_versions}, built once from the schema history."""
    index: dict = {}
    for s in onnx.defs.get_all_schemas_with_history():
        index.setdefault((s.domain, s.name), set()).add(s.since_version)
    return {k: sorted(v) for k, v in index.items()}


def register(op_type: str | None = None, *, domain: str = "", versions=None):
    """Class decorator: register a kernel for (domain, op_type) at the given since_versions
    (default: every version the onnx schema history defines, so the class must handle
    each one; it reads self.since_version where semantics changed)."""

    def decorate(cls):
        name = op_type or cls.__name__
        vers = list(versions) if versions is not None else schema_versions(name, domain)
        if not vers:
            raise ValueError(f"register: no schema versions for {domain or 'ai.onnx'}::{name}")
        cls.op_type = name
        cls.domain = domain
        cls.versions = tuple(sorted(vers))
        table = _REGISTRY.setdefault((domain, name), {})
        for v in vers:
            table[int(v)] = cls
        return cls

    return decorate


def lookup(op_type: str, domain: str = "", opset: int | None = None) -> tuple[type, int]:
    """(kernel class, since_version) for op_type at opset (newest when None)."""
    _ensure_loaded()
    domain = "" if domain == "ai.onnx" else domain
    table = _REGISTRY.get((domain, op_type))
    if not table:
        raise UnsupportedOperatorError(
            f"no kernel for operator {domain or 'ai.onnx'}::{op_type} (opset {opset or 'latest'}); "
            f"gpukernels has no registered versions of it")
    candidates = [v for v in table if opset is None or v <= opset]
    if not candidates:
        raise UnsupportedOperatorError(
            f"no kernel for operator {domain or 'ai.onnx'}::{op_type} at opset {opset}; "
            f"registered versions: {sorted(table)}")
    version = max(candidates)
    return table[version], version


def _ensure_loaded() -> None:
    _load_all()


def has_kernel(op_type: str, domain: str = "") -> bool:
    _ensure_loaded()
    return bool(_REGISTRY.get(("" if domain == "ai.onnx" else domain, op_type)))


def registered() -> dict[tuple[str, str], list[int]]:
    """{(domain, op_type): [since_versions]} of every registered kernel."""
    _ensure_loaded()
    return {k: sorted(v) for k, v in _REGISTRY.items()}


# ------------------------------------------------------------------ helpers

# (kernel, scope, next entry) chains of the calls running in this thread/context that
# were given an enclosing scope (KernelBase.in_scope): per call, never kernel state.
_ACTIVE_SCOPES: contextvars.ContextVar = contextvars.ContextVar("gpukernels_scopes", default=None)

# Element types whose compute dtype is the type itself, on both devices.
_NATIVE_COMPUTE = {i.data_type: i.numpy for i in dtypes._TABLE
                   if i.compute == i.numpy and i.storage == i.numpy and i.kind != "string"}


def describe(value) -> str:
    """'float32[2, 3]' for a Tensor or array, 'seq<float32>[4]', 'absent', ..."""
    if value is None:
        return "absent"
    if isinstance(value, Tensor):
        if value.is_absent:
            return "absent"
        return f"{dtypes.describe(value.data_type)}{list(value.shape)}"
    if isinstance(value, Sequence):
        return f"seq<{dtypes.describe(value.elem_type)}>[{len(value)}]"
    if isinstance(value, Optional):
        return "optional(empty)" if value.value is None else f"optional({describe(value.value)})"
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"{value.dtype}{list(value.shape)}"
    return type(value).__name__


class KernelBase:
    """Base of every kernel class."""

    op_type: ClassVar[str] = ""
    domain: ClassVar[str] = ""
    versions: ClassVar[tuple[int, ...]] = ()
    # whether a node whose inputs are all constants may be evaluated once when its graph
    # is prepared (false for kernels whose results differ from call to call: random draws)
    foldable: ClassVar[bool] = True
    # inputs (by index) the kernel reads as host values when they hold one element (Pow's
    # exponent, Clip's bounds): on a GPU the runtime keeps constants read only there on
    # the host, so reading them costs no device-to-host copy; the kernel takes them with
    # host_tensor and uploads one itself where it computes with it on the device
    host_inputs: ClassVar[tuple[int, ...]] = ()

    def __init__(self, ctx: KernelContext | None = None, version: int | None = None):
        self.ctx = ctx if ctx is not None else KernelContext()
        if version is None:
            opset = self.ctx.opset_for(self.domain)
            candidates = [v for v in self.versions if opset is None or v <= opset]
            if not candidates:
                raise UnsupportedOperatorError(
                    f"{self.op_type}: no version for opset {opset}; registered {list(self.versions)}")
            version = max(candidates)
        self.since_version = int(version)
        # Which outputs the node using this kernel declares (None: all of them, as in a
        # direct call).  Planning, set once by the runtime when it prepares the node.
        self.requested_outputs: tuple[bool, ...] | None = None

    @property
    def outer_scope(self):
        """The scope whose values this call's subgraphs may read: what the innermost
        active ``in_scope(scope)`` of this kernel gave, None in a plain direct call.
        Per call and per thread (a context variable), never stored on the kernel."""
        entry = _ACTIVE_SCOPES.get()
        while entry is not None:
            kernel, scope, entry = entry
            if kernel is self:
                return scope
        return None

    @contextlib.contextmanager
    def in_scope(self, scope):
        """Calls of this kernel inside the block read outer names from scope.

        >>> with kernel.in_scope(scope):
        ...     outputs = kernel(*inputs, **attributes)
        """
        token = _ACTIVE_SCOPES.set((self, scope, _ACTIVE_SCOPES.get()))
        try:
            yield self
        finally:
            _ACTIVE_SCOPES.reset(token)

    # --- environment
    @property
    def xp(self):
        return self.ctx.xp

    @property
    def device(self) -> Device:
        return self.ctx.device

    @property
    def on_gpu(self) -> bool:
        return self.ctx.device.is_cuda

    def wants_output(self, index: int) -> bool:
        """Whether the caller uses output index (all are wanted in a direct call)."""
        r = self.requested_outputs
        return r is None or (index < len(r) and r[index])

    def can_run_in_place(self) -> bool:
        """True when output 0 may alias input 0 (the runtime then may reuse its buffer)."""
        return False

    # array_function takes None for an input omitted before the last given one
    omitted_inputs_as_none = False

    def array_function(self, inputs: list, attrs: dict):
        """Optional fast path for a node called many times with inputs of unchanging
        element types and shapes (a Loop or Scan body): None (the default), or a
        function f(*arrays) -> array.

        inputs are the Tensors of a call that just succeeded (so they are valid) and
        attrs its attributes.  f must return the same array (storage dtype, shape and
        values) as ``self(*inputs, **attrs).array`` for any inputs of the same element
        types, shapes and device, provided no floating-point exception occurs: the
        runtime calls f with floating-point errors raising and, on any exception, redoes
        the call through the kernel (which then warns, ignores or raises as it does).

        The math is written once: f is (or calls) the function the kernel's own compute
        step calls after validation (e.g. ``array_op`` in kernels/math/arith.py), bound
        to the resolved attributes, never a restatement of it.  Every kernel defining
        one is compared with the kernel, to the bit (tests/kernels/test_array_functions.py).

        A node with several outputs returns a tuple of arrays, one per output (the ones
        the graph omits may be anything).  Trailing omitted inputs (empty names at the
        end of the node's input list) are not passed: f takes the given ones.  An input
        omitted before the last given one (Resize(X, '', '', sizes)) is None in inputs
        and in f's arguments, and only for kernels whose class sets
        ``omitted_inputs_as_none``; the runtime does not ask the others.  Where the
        output's shape depends on input values (Reshape's shape, Slice's starts...), f
        checks those values against the call it was made from and raises when they
        differ, so that the runtime redoes the call through the kernel."""
        return None

    def run_subgraph(self, graph, inputs: list, input_names=None) -> list:
        """Run an ONNX GraphProto (an If branch, a Loop/Scan body) with the given formal
        inputs; it reads outer names from self.outer_scope.  Returns its outputs.
        The runtime runs it, through the SubgraphRunner it installs (kernels.subgraphs)."""
        return _subgraph_runner().run(graph, inputs, self.outer_scope, self.ctx)

    def specialized(self, site: str, *args):
        """The registered specialisation of the reference step ``site`` for this kernel's
        device whose condition holds for args, or None: then the reference step runs.
        Always None when the context pins the reference path (option paths='reference',
        GPUKERNELS_PATHS).  See gpukernels.kernels.specialize."""
        ctx = self.ctx
        return _find_specialization(site, ctx.device_kind, ctx.paths, args)

    def cuda_path(self, **arguments):
        """The result of this operator's hand-written CUDA kernel, or None.

        None when not on a GPU, when the context option 'cuda_kernels' is 'never' or
        'paths' is 'reference' (GPUKERNELS_PATHS), or when the CUDA kernel does not
        cover this case (then the caller runs its array code on the GPU).  With 'cuda_kernels': 'always' an uncovered case raises.
        Kernels call it after validating inputs, passing normalised arguments
        (tensors and resolved attributes by their ONNX names).
        """
        if not self.on_gpu:
            return None
        mode = self.ctx.settings.cuda_kernels
        if mode == "never":
            return None
        if self.ctx.paths == "reference":  # the CUDA kernels are specialisations too
            if mode == "always":
                raise OptionError("options cuda_kernels='always' and paths='reference' contradict "
                                  "each other (paths='reference' runs the array code only)")
            return None
        from ..gpu import accelerated

        impl = accelerated.get(self.op_type)
        result = impl(self, **arguments) if impl is not None else None
        if result is None and mode == "always":
            from ..errors import CudaKernelError

            raise CudaKernelError(f"{self.op_type}: the CUDA kernel does not cover this case and "
                                  "the context demands it (options cuda_kernels='always')")
        if result is not None:
            _note_chosen(_cuda_kernel_entry(self.op_type))
        return result

    # --- inputs
    def tensor(self, value, name: str = "input", optional: bool = False) -> Tensor:
        """value as a Tensor on this kernel's device; None/absent allowed when optional."""
        if value.__class__ is Tensor and value.array is not None and \
                (value.array.__class__ is np.ndarray) != self.ctx.device.is_cuda:
            return value  # fast path: already a tensor on this kernel's device
        if value is None or (isinstance(value, Tensor) and value.array is None):
            if optional:
                return Tensor()
            raise self.error(f"required input '{name}' is missing")
        if isinstance(value, Tensor):
            t = value
        elif isinstance(value, (Sequence, Optional)):
            raise self.type_error(f"input '{name}' must be a tensor, got {describe(value)}")
        else:
            t = Tensor(value)
        if t.data_type != DataType.STRING and self.device.is_cuda != is_cupy_array(t.array):
            t = t.to(self.device)
        return t

    def host_tensor(self, value, name: str = "input", optional: bool = False) -> Tensor:
        """A shape-like input (a shape, axes, pads, repeats...) as a Tensor left where it
        is: a host value stays on the host, so reading it costs no device-to-host copy
        (the runtime keeps small integer constants on the host for this).  A device
        value is returned as it is; host_ints then reads it (one transfer)."""
        if value is None or (isinstance(value, Tensor) and value.array is None):
            if optional:
                return Tensor()
            raise self.error(f"required input '{name}' is missing")
        if isinstance(value, Tensor):
            return value
        if isinstance(value, (Sequence, Optional)):
            raise self.type_error(f"input '{name}' must be a tensor, got {describe(value)}")
        return Tensor(value)

    def result(self, array, data_type=None) -> Tensor:
        """Wrap an output array (already in storage dtype) as a Tensor."""
        if data_type is None:
            data_type = dtypes.from_numpy(array.dtype).data_type
        return Tensor.wrap(array, DataType(int(data_type)))

    def to_compute(self, t: Tensor, dtype=None):
        """The tensor's values as an array in its compute dtype (float32 for half and
        smaller floats), or in dtype when given."""
        arr = t.array
        if dtype is None and t.data_type in _NATIVE_COMPUTE:
            return arr  # computed in its own type (float32, float64, integers, bool)
        info = dtypes.info(t.data_type)
        if info.is_exotic and info.kind == "float" and self.on_gpu:
            from ..codec import decode

            arr = decode(self.xp, arr, t.data_type)
        want = np.dtype(dtype) if dtype is not None else info.compute
        return arr if arr.dtype == want else arr.astype(want)

    def from_compute(self, array, data_type, saturate: bool = True) -> Tensor:
        """Round a compute array once into data_type and wrap it."""
        if data_type in _NATIVE_COMPUTE and array.dtype == _NATIVE_COMPUTE[data_type]:
            return Tensor.wrap(array, data_type)
        info = dtypes.info(data_type)
        if info.is_exotic and info.kind == "float" and self.on_gpu:
            from ..codec import encode

            return Tensor.wrap(encode(self.xp, array, info.data_type, saturate), info.data_type)
        target = info.storage if self.on_gpu else info.numpy
        if array.dtype != target:
            array = array.astype(target)
        return Tensor.wrap(array, info.data_type)

    # --- errors
    def _message(self, message: str, inputs: dict) -> str:
        text = f"{self.op_type}: {message}"
        if inputs:
            text += " (" + ", ".join(f"{k}: {describe(v)}" for k, v in inputs.items()) + ")"
        return text

    def error(self, message: str, **inputs) -> KernelInputError:
        """A KernelInputError naming this operator and the given inputs' shapes/dtypes."""
        return KernelInputError(self._message(message, inputs))

    def type_error(self, message: str, **inputs) -> KernelTypeError:
        return KernelTypeError(self._message(message, inputs))

    def check_inputs(self, *inputs) -> None:
        """Raise a KernelTypeError when an input's element type is not allowed by the
        operator's schema at this version, or inputs sharing a type parameter differ."""
        # Remember type signatures that passed: a graph node sees the same types each run.
        key = tuple(v.data_type if v.__class__ is Tensor else v.__class__ for v in inputs)
        seen = self.__dict__.get("_types_ok")
        if seen is not None and key in seen:
            return
        _check_schema_types(self, inputs)
        if seen is None:
            seen = self.__dict__["_types_ok"] = set()
        if len(seen) < 64:
            seen.add(key)

    def check_type(self, name: str, t: Tensor, allowed) -> None:
        """Raise a KernelTypeError unless t's element type is one of allowed."""
        if t.data_type not in allowed:
            names = ", ".join(dtypes.describe(a) for a in allowed)
            raise self.type_error(f"input '{name}' has element type {dtypes.describe(t.data_type)}; "
                                  f"allowed: {names}", **{name: t})

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={self.device}, since_version={self.since_version})"


# ------------------------------------------------------------ schema type checks


@functools.lru_cache(maxsize=None)
def schema_input_types(op_type: str, domain: str, version: int):
    """For each formal input: (name, type parameter, allowed DataTypes or None, variadic).

    None means the input's type is not a plain tensor type (sequences, optionals, maps);
    those are left to the kernel.
    """
    try:
        schema = onnx.defs.get_schema(op_type, version, domain)
    except onnx.defs.SchemaError:
        return ()
    constraints = {c.type_param_str: c.allowed_type_strs for c in schema.type_constraints}
    out = []
    for formal in schema.inputs:
        allowed_strs = constraints.get(formal.type_str, [formal.type_str])
        allowed = set()
        for s in allowed_strs:
            if not s.startswith("tensor("):
                allowed = None
                break
            try:
                allowed.add(dtypes.info(s).data_type)
            except TypeError:
                pass
        variadic = formal.option == onnx.defs.OpSchema.FormalParameterOption.Variadic
        out.append((formal.name, formal.type_str, frozenset(allowed) if allowed is not None else None,
                    variadic))
    return tuple(out)


def _check_schema_types(kernel: "KernelBase", inputs) -> None:
    formals = kernel.__dict__.get("_formals")
    if formals is None:
        formals = kernel.__dict__["_formals"] = schema_input_types(
            kernel.op_type, kernel.domain, kernel.since_version)
    if not formals:
        return
    bound: dict[str, Tensor] = {}
    for i, value in enumerate(inputs):
        if i >= len(formals):
            if formals and formals[-1][3]:
                name, param, allowed, _ = formals[-1]
            else:
                break
        else:
            name, param, allowed, _ = formals[i]
        if allowed is None or not isinstance(value, Tensor) or value.array is None:
            continue
        if value.data_type not in allowed:
            names = ", ".join(sorted(dtypes.describe(a) for a in allowed))
            raise kernel.type_error(
                f"input '{name}' has element type {dtypes.describe(value.data_type)}, "
                f"which opset-{kernel.since_version} {kernel.op_type} does not allow (allowed: {names})",
                **{name: value})
        first = bound.setdefault(param, value)
        if first is not value and first.data_type != value.data_type and len(allowed) > 1:
            raise kernel.type_error(
                f"inputs bound to type '{param}' must share one element type, got "
                f"{dtypes.describe(first.data_type)} and {dtypes.describe(value.data_type)}",
                **{name: value})

