"""Reading a tensor's external data without leaving the model's folder.

ONNX lets an initializer keep its bytes in a file next to the model (``location``,
``offset``, ``length`` in ``external_data``).  A model may come from anyone, so the
location is treated as untrusted: it must be a relative path that stays inside the
model's folder once symbolic links are resolved, name a regular file, and the byte
range must lie inside that file and match the tensor's declared size.  A model given as
bytes or a ModelProto has no folder: its external data is refused unless the caller
names one (``Session(..., base_dir=...)``).
"""

from __future__ import annotations

import os

from onnx import TensorProto

from . import dtypes
from .errors import ModelError


def declared_nbytes(proto: TensorProto) -> int:
    """The bytes the tensor's dims and element type call for (sub-byte types packed)."""
    count = 1
    for d in proto.dims:
        if d < 0:
            raise ModelError(f"tensor {proto.name!r} declares a negative dimension {list(proto.dims)}")
        count *= int(d)
    if proto.data_type == TensorProto.STRING:
        raise ModelError(f"tensor {proto.name!r}: STRING tensors cannot use external data")
    bits = dtypes.bit_width(proto.data_type)
    return (count * bits + 7) // 8


def resolve_location(location: str, base_dir: str, name: str) -> str:
    """The real path of location inside base_dir, or a ModelError saying why not."""
    if not location:
        raise ModelError(f"tensor {name!r} uses external data but gives no location")
    if "\x00" in location or os.path.isabs(location) or os.path.splitdrive(location)[0]:
        raise ModelError(f"tensor {name!r}: external data location {location!r} must be a path "
                         "relative to the model's folder")
    base = os.path.realpath(base_dir)
    path = os.path.realpath(os.path.join(base, location))
    if os.path.commonpath([base, path]) != base:
        raise ModelError(f"tensor {name!r}: external data location {location!r} leads outside "
                         f"the model's folder {base_dir!r}; refused")
    if not os.path.isfile(path):
        raise ModelError(f"tensor {name!r}: external data file {location!r} does not exist in "
                         f"{base_dir!r} (or is not a regular file)")
    return path


def read_external(proto: TensorProto, base_dir: str | None) -> TensorProto:
    """A copy of proto with its external bytes read in as raw_data (checked as above)."""
    name = proto.name
    entries = {e.key: e.value for e in proto.external_data}
    location = entries.get("location", "")
    if base_dir is None:
        raise ModelError(
            f"tensor {name!r} keeps its data in the external file {location!r}, and the model was "
            "given as bytes or a ModelProto, so gpukernels reads no files for it: pass "
            "base_dir=<the model's folder> (Session(..., base_dir=...), backend.prepare(..., "
            "base_dir=...)) or load the model from its path")
    path = resolve_location(location, base_dir, name)
    try:
        offset = int(entries.get("offset", 0))
        length = int(entries["length"]) if "length" in entries else None
    except ValueError:
        raise ModelError(f"tensor {name!r}: external data offset/length are not integers: "
                         f"{entries.get('offset')!r}, {entries.get('length')!r}") from None
    want = declared_nbytes(proto)
    size = os.path.getsize(path)
    if offset < 0 or offset > size:
        raise ModelError(f"tensor {name!r}: external data offset {offset} is outside {location!r} "
                         f"({size} bytes)")
    if length is None:
        length = want
    if length != want:
        raise ModelError(f"tensor {name!r}: external data length {length} does not match its "
                         f"dims {list(proto.dims)} ({want} bytes)")
    if offset + length > size:
        raise ModelError(f"tensor {name!r}: external data asks for bytes {offset}..{offset + length} "
                         f"of {location!r}, which has {size}")
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read(length)
    copy = TensorProto()
    copy.CopyFrom(proto)
    del copy.external_data[:]
    copy.data_location = TensorProto.DEFAULT
    copy.raw_data = data
    return copy


def is_external(proto: TensorProto) -> bool:
    return proto.data_location == TensorProto.EXTERNAL


__all__ = ["read_external", "resolve_location", "declared_nbytes", "is_external"]
