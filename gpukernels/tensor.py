"""Tensor, Sequence and Optional: the values kernels take and return.

A Tensor wraps one array (numpy.ndarray on the host, cupy.ndarray on a GPU) and its ONNX
element type.  Host arrays of the types NumPy lacks use ml_dtypes; on a GPU those types
are held as their bit pattern (dtypes.DTypeInfo.storage) and ``numpy()`` turns them back
into ml_dtypes arrays.  STRING tensors are object arrays and live on the host only.
``Tensor()`` is the absent value (an omitted optional input).
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
from onnx import TensorProto, numpy_helper

from . import dtypes
from .dtypes import DataType
from .errors import DeviceError, KernelTypeError, ModelError
from .external_data import is_external, read_external
from .xp import CPU, Device, device_of, is_cupy_array, namespace, to_device, to_host

_ABSENT = object()


class Tensor:
    """One ONNX tensor value: ``array`` plus ``data_type`` (a DataType)."""

    __slots__ = ("array", "data_type")

    def __init__(self, value=_ABSENT, data_type=None, device=None):
        if value is _ABSENT:
            self.array = None
            self.data_type = DataType.UNDEFINED
            return
        if isinstance(value, Tensor):
            array, dt = value.array, value.data_type
            if data_type is not None and dtypes.info(data_type).data_type != dt:
                raise KernelTypeError(
                    f"Tensor: cannot reinterpret {dtypes.describe(dt)} as {dtypes.describe(data_type)}")
        elif is_cupy_array(value):
            array, dt = _from_device_array(value, data_type)
        else:
            array, dt = _from_host_value(value, data_type)
        self.array = array
        self.data_type = dt
        if device is not None:
            moved = self.to(device)
            self.array = moved.array

    # -------------------------------------------------------------- construction
    @classmethod
    def wrap(cls, array, data_type: DataType) -> "Tensor":
        """Fast constructor for kernels: array already has the storage dtype."""
        t = cls.__new__(cls)
        t.array = array
        t.data_type = data_type
        return t

    @classmethod
    def from_proto(cls, proto, base_dir: str | None = None) -> "Tensor":
        return cls(array_from_proto(proto, base_dir), proto.data_type)

    @classmethod
    def from_dlpack(cls, producer, data_type=None) -> "Tensor":
        """Build from any object with ``__dlpack__`` (NumPy, CuPy, PyTorch, JAX...).

        GPU producers give a CuPy array (zero copy), host producers a NumPy array."""
        kind, _ = producer.__dlpack_device__()
        if int(kind) == 1:  # kDLCPU
            return cls(np.from_dlpack(producer), data_type)
        cp = namespace(Device("cuda"))
        return cls(cp.from_dlpack(producer), data_type)

    # ------------------------------------------------------------------- queries
    @property
    def is_absent(self) -> bool:
        return self.array is None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.array.shape)

    @property
    def ndim(self) -> int:
        return self.array.ndim

    @property
    def size(self) -> int:
        return int(self.array.size)

    @property
    def dtype(self) -> np.dtype:
        """The host NumPy dtype of the element type (ml_dtypes types included)."""
        return dtypes.info(self.data_type).numpy

    @property
    def device(self) -> Device:
        return CPU if self.array is None else device_of(self.array)

    @property
    def xp(self):
        return namespace(self.device) if self.array is not None and is_cupy_array(self.array) else np

    # ------------------------------------------------------------------ movement
    def numpy(self) -> np.ndarray:
        """A host array with the exact dtype (ml_dtypes for bfloat16, float8, int4...)."""
        self._check_present("numpy")
        host = to_host(self.array)
        want = self.dtype
        if host.dtype != want and self.data_type != DataType.STRING:
            host = host.view(want) if host.dtype.itemsize == want.itemsize else host.astype(want)
        return host

    def to(self, device) -> "Tensor":
        """This tensor on device; returns self when it is already there."""
        self._check_present("to")
        device = Device.parse(device)
        if device == self.device:
            return self
        if device.is_cuda:
            if self.data_type == DataType.STRING:
                raise DeviceError("STRING tensors live on the host and cannot move to a GPU")
            storage = dtypes.info(self.data_type).storage
            host = self.array if not is_cupy_array(self.array) else to_host(self.array)
            if host.dtype != storage:
                # float types CuPy lacks travel as their bit pattern; int4/int2 as their value
                # (one sign-extended value per byte: a view would drop the sign)
                bit_pattern = host.dtype.itemsize == storage.itemsize and \
                    dtypes.info(self.data_type).kind == "float"
                host = host.view(storage) if bit_pattern else host.astype(storage)
            return Tensor.wrap(to_device(host, device), self.data_type)
        if is_cupy_array(self.array) and device.kind == "cuda":
            return Tensor.wrap(to_device(self.array, device), self.data_type)
        return Tensor.wrap(self.numpy(), self.data_type)

    def to_proto(self, name: str = ""):
        return array_to_proto(self.numpy(), name)

    def __dlpack__(self, *args, **kwargs):
        self._check_present("__dlpack__")
        if dtypes.info(self.data_type).is_exotic or self.data_type == DataType.STRING:
            raise KernelTypeError(f"DLPack cannot carry {dtypes.describe(self.data_type)} tensors")
        return self.array.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()

    def __array__(self, dtype=None, copy=None):
        arr = self.numpy()
        return arr if dtype is None else arr.astype(dtype)

    def _check_present(self, what: str) -> None:
        if self.array is None:
            raise ValueError(f"Tensor.{what}: the tensor is absent (an omitted optional input)")

    def __repr__(self) -> str:
        if self.array is None:
            return "Tensor(<absent>)"
        return f"Tensor({dtypes.describe(self.data_type)}{list(self.shape)}, device={self.device})"

    def __len__(self) -> int:
        return self.shape[0]


def _from_host_value(value, data_type):
    if data_type is not None:
        want = dtypes.info(data_type)
        if want.data_type == DataType.STRING:
            arr = np.array(value, dtype=object)
            return arr, DataType.STRING
        arr = np.asarray(value)
        if arr.dtype != want.numpy:
            if arr.dtype.itemsize == want.numpy.itemsize and arr.dtype == want.storage and want.is_exotic:
                arr = arr.view(want.numpy)  # a bit pattern handed over explicitly
            else:
                arr = arr.astype(want.numpy)
        return arr, want.data_type
    arr = np.asarray(value)
    if arr.dtype.kind in ("U", "S"):
        arr = arr.astype(object)
    if arr.dtype == object:
        return arr, DataType.STRING
    return arr, dtypes.from_numpy(arr.dtype).data_type


def _from_device_array(array, data_type):
    if data_type is None:
        return array, dtypes.from_numpy(array.dtype).data_type
    want = dtypes.info(data_type)
    if want.data_type == DataType.STRING:
        raise DeviceError("STRING tensors live on the host")
    if array.dtype != want.storage:
        if array.dtype.itemsize * 8 == want.bits or array.dtype.itemsize == want.storage.itemsize:
            array = array.view(want.storage)
        else:
            raise KernelTypeError(
                f"Tensor: a GPU array of {array.dtype} cannot hold {want.name} "
                f"(expected its bit pattern as {want.storage})")
    return array, want.data_type


def as_tensor(value, device: Device | None = None) -> Tensor:
    """Tensor from a Tensor, array or Python value; moved to device when given."""
    t = value if isinstance(value, Tensor) else Tensor(value)
    if device is not None and not t.is_absent and t.device != device and t.data_type != DataType.STRING:
        t = t.to(device)
    return t


def is_absent(value) -> bool:
    return value is None or (isinstance(value, Tensor) and value.array is None)


class Sequence:
    """An ONNX sequence: an element type and a list of Tensors of that type."""

    # held_bytes: set by kernels that build a sequence from another (SequenceInsert) to
    # the bytes its tensors hold, so a sequence grown in a loop is not summed anew on
    # every insert (gpukernels.limits); unset otherwise
    __slots__ = ("elem_type", "tensors", "held_bytes")

    def __init__(self, tensors: Iterable = (), elem_type=None):
        items = [t if isinstance(t, Tensor) else Tensor(t) for t in tensors]
        if elem_type is None:
            elem_type = items[0].data_type if items else DataType.FLOAT
        self.elem_type = DataType(dtypes.info(elem_type).data_type)
        for t in items:
            if t.data_type != self.elem_type:
                raise KernelTypeError(
                    f"Sequence: element of type {dtypes.describe(t.data_type)} in a sequence of "
                    f"{dtypes.describe(self.elem_type)}")
        self.tensors = items

    def __len__(self) -> int:
        return len(self.tensors)

    def __iter__(self):
        return iter(self.tensors)

    def __getitem__(self, i) -> Tensor:
        return self.tensors[i]

    def to(self, device) -> "Sequence":
        return Sequence([t.to(device) for t in self.tensors], self.elem_type)

    def numpy(self) -> list[np.ndarray]:
        return [t.numpy() for t in self.tensors]

    def __repr__(self) -> str:
        return f"Sequence<{dtypes.describe(self.elem_type)}>(len={len(self.tensors)})"


class Optional:
    """An ONNX optional: empty, or holding a Tensor or a Sequence.

    type_proto (an onnx TypeProto, optional) records the declared type of an empty one."""

    __slots__ = ("value", "type_proto")

    def __init__(self, value=None, type_proto=None):
        if value is not None and not isinstance(value, (Tensor, Sequence)):
            value = Tensor(value)
        self.value = value
        self.type_proto = type_proto

    @property
    def has_value(self) -> bool:
        return self.value is not None

    def to(self, device) -> "Optional":
        return Optional(None if self.value is None else self.value.to(device), self.type_proto)

    def __repr__(self) -> str:
        return f"Optional({self.value!r})"


def to_host_value(value):
    """What the ONNX backend API hands back: arrays, lists for sequences, None for an
    empty optional."""
    if isinstance(value, Tensor):
        return value.numpy()
    if isinstance(value, Sequence):
        return value.numpy()
    if isinstance(value, Optional):
        return None if value.value is None else to_host_value(value.value)
    if isinstance(value, dict):
        return value
    if isinstance(value, list):
        return [to_host_value(v) for v in value]
    return value


# ---------------------------------------------------------------- TensorProto


def array_from_proto(proto: TensorProto, base_dir: str | None = None) -> np.ndarray:
    """Decode a TensorProto to a host array of the exact dtype.

    Packed sub-byte types (int4, uint4, int2, uint2, float4e2m1) are unpacked low bits
    first, as the ONNX spec lays them out.  External data is read from inside base_dir
    only, and refused when base_dir is None (see gpukernels.external_data).  Data that
    does not decode is a ModelError naming the tensor.
    """
    if is_external(proto):
        proto = read_external(proto, base_dir)
    try:
        return numpy_helper.to_array(proto)
    except Exception as exc:  # noqa: BLE001 -- onnx/NumPy errors, re-raised with the tensor named
        kind = TensorProto.DataType.Name(proto.data_type) \
            if proto.data_type in TensorProto.DataType.values() else f"unknown type {proto.data_type}"
        raise ModelError(f"tensor {proto.name!r} ({kind}, dims {list(proto.dims)}) cannot be "
                         f"decoded: {type(exc).__name__}: {exc}") from exc


def array_to_proto(array: np.ndarray, name: str = "") -> TensorProto:
    """Encode a host array as a TensorProto, packing sub-byte types."""
    arr = np.asarray(array)
    if arr.dtype.kind in ("U", "S"):
        arr = arr.astype(object)
    return numpy_helper.from_array(arr, name)
