"""ONNX element types and their NumPy counterparts.

Every ``TensorProto.DataType`` that onnx 1.23 defines has one ``DTypeInfo``: its enum
value, its ONNX name, the NumPy dtype that holds it on the host (ml_dtypes for the types
NumPy lacks), its bit width and its kind.  On a GPU the types CuPy lacks are held as
their bit pattern in ``storage`` (an unsigned integer of the same width; sub-byte
integers one value per byte), and computed by up-casting to ``compute``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import ml_dtypes
import numpy as np
from onnx import TensorProto


class DataType(IntEnum):
    """The TensorProto.DataType enum, with names as ONNX spells them."""

    UNDEFINED = 0
    FLOAT = 1
    UINT8 = 2
    INT8 = 3
    UINT16 = 4
    INT16 = 5
    INT32 = 6
    INT64 = 7
    STRING = 8
    BOOL = 9
    FLOAT16 = 10
    DOUBLE = 11
    UINT32 = 12
    UINT64 = 13
    COMPLEX64 = 14
    COMPLEX128 = 15
    BFLOAT16 = 16
    FLOAT8E4M3FN = 17
    FLOAT8E4M3FNUZ = 18
    FLOAT8E5M2 = 19
    FLOAT8E5M2FNUZ = 20
    UINT4 = 21
    INT4 = 22
    FLOAT4E2M1 = 23
    FLOAT8E8M0 = 24
    UINT2 = 25
    INT2 = 26
    FLOAT6E2M3 = 27
    FLOAT6E3M2 = 28


@dataclass(frozen=True)
class DTypeInfo:
    """What gpukernels knows about one ONNX element type.

    kind: 'float', 'int', 'uint', 'bool', 'complex' or 'string'.
    storage: the NumPy dtype that holds the value on a GPU (the bit pattern where CuPy has
    no such type; identical to ``numpy`` otherwise).
    compute: the dtype arithmetic is done in (half and smaller floats go to float32).
    """

    data_type: DataType
    name: str
    numpy: np.dtype
    bits: int
    kind: str
    storage: np.dtype
    compute: np.dtype

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_integer(self) -> bool:
        return self.kind in ("int", "uint")

    @property
    def is_exotic(self) -> bool:
        """True when NumPy itself has no such type (held with ml_dtypes on the host)."""
        return self.data_type in _EXOTIC


def _info(dt, np_type, bits, kind, storage=None, compute=None) -> DTypeInfo:
    np_dtype = np.dtype(np_type)
    return DTypeInfo(
        data_type=dt,
        name=dt.name,
        numpy=np_dtype,
        bits=bits,
        kind=kind,
        storage=np.dtype(storage) if storage is not None else np_dtype,
        compute=np.dtype(compute) if compute is not None else np_dtype,
    )


D = DataType
_TABLE = [
    _info(D.FLOAT, np.float32, 32, "float"),
    _info(D.UINT8, np.uint8, 8, "uint"),
    _info(D.INT8, np.int8, 8, "int"),
    _info(D.UINT16, np.uint16, 16, "uint"),
    _info(D.INT16, np.int16, 16, "int"),
    _info(D.INT32, np.int32, 32, "int"),
    _info(D.INT64, np.int64, 64, "int"),
    _info(D.STRING, object, 0, "string"),
    _info(D.BOOL, np.bool_, 8, "bool"),
    _info(D.FLOAT16, np.float16, 16, "float", compute=np.float32),
    _info(D.DOUBLE, np.float64, 64, "float"),
    _info(D.UINT32, np.uint32, 32, "uint"),
    _info(D.UINT64, np.uint64, 64, "uint"),
    _info(D.COMPLEX64, np.complex64, 64, "complex"),
    _info(D.COMPLEX128, np.complex128, 128, "complex"),
    _info(D.BFLOAT16, ml_dtypes.bfloat16, 16, "float", np.uint16, np.float32),
    _info(D.FLOAT8E4M3FN, ml_dtypes.float8_e4m3fn, 8, "float", np.uint8, np.float32),
    _info(D.FLOAT8E4M3FNUZ, ml_dtypes.float8_e4m3fnuz, 8, "float", np.uint8, np.float32),
    _info(D.FLOAT8E5M2, ml_dtypes.float8_e5m2, 8, "float", np.uint8, np.float32),
    _info(D.FLOAT8E5M2FNUZ, ml_dtypes.float8_e5m2fnuz, 8, "float", np.uint8, np.float32),
    _info(D.UINT4, ml_dtypes.uint4, 4, "uint", np.uint8, np.uint8),
    _info(D.INT4, ml_dtypes.int4, 4, "int", np.int8, np.int8),
    _info(D.FLOAT4E2M1, ml_dtypes.float4_e2m1fn, 4, "float", np.uint8, np.float32),
    _info(D.FLOAT8E8M0, ml_dtypes.float8_e8m0fnu, 8, "float", np.uint8, np.float32),
    _info(D.UINT2, ml_dtypes.uint2, 2, "uint", np.uint8, np.uint8),
    _info(D.INT2, ml_dtypes.int2, 2, "int", np.int8, np.int8),
    _info(D.FLOAT6E2M3, ml_dtypes.float6_e2m3fn, 6, "float", np.uint8, np.float32),
    _info(D.FLOAT6E3M2, ml_dtypes.float6_e3m2fn, 6, "float", np.uint8, np.float32),
]

_BY_TYPE: dict[int, DTypeInfo] = {i.data_type: i for i in _TABLE}
_EXOTIC = frozenset(i.data_type for i in _TABLE if i.numpy.type.__module__.startswith("ml_dtypes"))
_BY_NUMPY: dict[np.dtype, DTypeInfo] = {}
for _i in _TABLE:
    _BY_NUMPY.setdefault(_i.numpy, _i)
_BY_NAME: dict[str, DTypeInfo] = {i.name: i for i in _TABLE}

ALL_TYPES: tuple[DataType, ...] = tuple(i.data_type for i in _TABLE)
FLOAT_TYPES = tuple(i.data_type for i in _TABLE if i.kind == "float")
INTEGER_TYPES = tuple(i.data_type for i in _TABLE if i.kind in ("int", "uint"))
# Sub-byte types that TensorProto stores packed, several per byte.
PACKED_TYPES = tuple(i.data_type for i in _TABLE if i.bits < 8 and i.kind != "string")


def info(data_type: int | str | np.dtype | type) -> DTypeInfo:
    """The DTypeInfo for an ONNX enum value, an ONNX name ('FLOAT', 'tensor(float)') or
    a NumPy dtype."""
    found = _BY_TYPE.get(data_type) if data_type.__class__ is not bool else None
    if found is not None:
        return found
    if isinstance(data_type, (int, np.integer)) and not isinstance(data_type, bool):
        try:
            return _BY_TYPE[int(data_type)]
        except KeyError:
            raise TypeError(f"unknown ONNX data type {int(data_type)}") from None
    if isinstance(data_type, str):
        key = data_type.upper()
        if key.startswith("TENSOR(") and key.endswith(")"):
            key = key[7:-1]
        key = _ALIASES.get(key, key)
        try:
            return _BY_NAME[key]
        except KeyError:
            raise TypeError(f"unknown ONNX data type name {data_type!r}") from None
    return from_numpy(data_type)


_ALIASES = {
    "FLOAT32": "FLOAT",
    "FLOAT64": "DOUBLE",
    "BOOLEAN": "BOOL",
    "STR": "STRING",
}


def from_numpy(dtype) -> DTypeInfo:
    """The DTypeInfo for a NumPy dtype (str and bytes map to STRING)."""
    dt = np.dtype(dtype)
    found = _BY_NUMPY.get(dt)
    if found is not None:
        return found
    if dt.kind in ("U", "S", "O"):
        return _BY_TYPE[DataType.STRING]
    raise TypeError(f"NumPy dtype {dt} has no ONNX data type")


def to_numpy(data_type) -> np.dtype:
    """The host NumPy dtype for an ONNX data type."""
    return info(data_type).numpy


def name(data_type) -> str:
    return info(data_type).name


def bit_width(data_type) -> int:
    return info(data_type).bits


def describe(data_type) -> str:
    """Lower-case name as in error messages: 'float32', 'bfloat16', 'string'."""
    i = info(data_type)
    return "string" if i.kind == "string" else str(i.numpy)


def type_proto_string(data_type) -> str:
    """The schema's spelling, e.g. 'tensor(float)'."""
    dt = info(data_type).data_type
    return "tensor(" + _SCHEMA_NAMES.get(dt, dt.name.lower()) + ")"


_SCHEMA_NAMES = {
    D.DOUBLE: "double",
    D.FLOAT16: "float16",
    D.FLOAT8E4M3FN: "float8e4m3fn",
    D.FLOAT8E4M3FNUZ: "float8e4m3fnuz",
    D.FLOAT8E5M2: "float8e5m2",
    D.FLOAT8E5M2FNUZ: "float8e5m2fnuz",
    D.FLOAT4E2M1: "float4e2m1",
    D.FLOAT8E8M0: "float8e8m0",
    D.FLOAT6E2M3: "float6e2m3",
    D.FLOAT6E3M2: "float6e3m2",
}
