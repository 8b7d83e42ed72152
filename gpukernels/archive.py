"""Safe npz archives: the files ``run --inputs/--output/--dump`` and ``parity --save/--load`` use.

Writing.  Value names come from models, so they are never used as they are: a name that
is a plain file name (letters, digits, ``_ . -``, at most 100 characters, not starting with
a dot or a dash, not a Windows device name, unique ignoring case) is kept as the entry
name, any other gets ``v<index>_<sanitised name>``.  The archive holds ``__names__.json``,
the map from entry to value name, so every name round-trips and ``np.load(path)[name]``
still works for ordinary names.  No entry can contain a path separator.  The file is
written to a temporary file beside the target and renamed into place, so a failed write
leaves nothing behind.  ``path`` is used exactly as given (no ``.npz`` is appended) and
an existing folder is refused.

Reading.  Entries holding Python objects (pickles) are refused (DataError).  Before
anything is allocated, each entry's size from its ``.npy`` header is checked against
max_tensor_bytes (ResourceLimitError) and against the bytes the entry really holds, and
the entries together may not expand past what deflate can reach from the file's size
(overlapping entries, a "zip bomb").  Archives without a name map (written by
``numpy.savez``) read with the entry names as value names.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import zipfile
from pathlib import Path

import numpy as np

from .errors import GpuKernelsError

NAME_MAP = "__names__.json"

_PLAIN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}\Z")
_DEVICE_NAMES = re.compile(r"(con|prn|aux|nul|com[0-9]|lpt[0-9])(\..*)?\Z", re.IGNORECASE)
_NAME_MAP_LIMIT = 64 << 20
# deflate expands at most ~1032:1; an archive claiming more than this times its own size
# has entries that overlap
_MAX_EXPANSION = 1100


class DataError(GpuKernelsError, ValueError):
    """Data that cannot be read, written or generated safely: npz archives, saved parity
    folders, inputs that random data cannot be made for."""


def safe_name(text, limit: int | None = None) -> str:
    """text with every unprintable character (control characters, terminal escapes,
    bidirectional overrides, newlines) written as a Python escape such as ``\\x1b``;
    cut to ``limit`` characters (with '...') when given."""
    text = str(text)
    if not text.isprintable():
        text = "".join(c if c.isprintable() else _escape(c) for c in text)
    if limit is not None and len(text) > limit:
        text = text[:max(limit - 3, 0)] + "..."
    return text


def _escape(c: str) -> str:
    n = ord(c)
    if n < 0x100:
        return f"\\x{n:02x}"
    return f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def format_bytes(n: int) -> str:
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} bytes"


def max_tensor_bytes(session=None) -> int | None:
    """The size limit for one array (None: unlimited): the session's max_tensor_bytes
    option, else GPUKERNELS_MAX_TENSOR_BYTES, else 4 GiB (see gpukernels.limits)."""
    from . import limits

    return limits.max_tensor_bytes(getattr(session, "ctx", None))


# ------------------------------------------------------------------------- writing


def entry_names(names) -> dict:
    """{value name: entry name} for names in order (see the module docstring)."""
    used = {NAME_MAP.lower()}
    entries = {}
    for i, name in enumerate(names):
        if name in entries:
            raise DataError(f"value name {safe_name(name)!r} appears twice")
        entry = name
        if not (_PLAIN.match(name) and not _DEVICE_NAMES.match(name) and not name.endswith(".")
                and name.lower() not in used):
            stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._-")[:60]
            entry = f"v{i:03d}_{stem}".rstrip("_.")
            k = 1
            while entry.lower() in used:
                entry = f"v{i:03d}_{k}_{stem}".rstrip("_.")
                k += 1
        used.add(entry.lower())
        entries[name] = entry
    return entries


def check_output_path(path) -> Path:
    """path as a Path when an archive can be written there; DataError otherwise."""
    p = Path(path)
    if p.is_dir():
        raise DataError(f"{safe_name(p)} is a folder; give a file name such as {safe_name(p / 'outputs.npz')}")
    if not p.parent.is_dir():
        raise DataError(f"cannot write {safe_name(p)}: folder {safe_name(p.parent)} does not exist")
    return p


def storable(name: str, value) -> np.ndarray:
    """value as an array an npz can hold without pickling: strings become fixed-width
    unicode, ml_dtypes types (bfloat16, float8, int4...) become float32."""
    arr = np.asarray(value)
    if arr.dtype.type.__module__.startswith("ml_dtypes"):
        return arr.astype(np.float32)
    if arr.dtype.hasobject:
        flat = arr.ravel()
        if all(isinstance(x, str) for x in flat):
            return arr.astype(np.str_) if arr.size else arr.astype("<U1")
        if all(isinstance(x, bytes) for x in flat):
            return arr.astype(np.bytes_) if arr.size else arr.astype("S1")
        raise DataError(f"value {safe_name(name)!r} holds Python objects, which an npz archive cannot "
                        f"hold without pickling")
    return arr


def write_npz(path, arrays: dict) -> dict:
    """Write {name: array} to the npz archive path (atomically); returns {name: entry}."""
    target = check_output_path(path)
    names = list(arrays)
    for n in names:
        if not isinstance(n, str):
            raise DataError(f"value names must be strings, got {type(n).__name__}")
    entries = entry_names(names)
    prepared = {n: storable(n, arrays[n]) for n in names}
    tmp = target.parent / f".{target.name[:40]}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        with open(tmp, "xb") as fh, zipfile.ZipFile(fh, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
            for name in names:
                with zf.open(entries[name] + ".npy", "w", force_zip64=True) as f:
                    np.lib.format.write_array(f, prepared[name], allow_pickle=False)
            zf.writestr(NAME_MAP, json.dumps({"format": "gpukernels-npz/1",
                                              "names": {entries[n]: n for n in names}}, indent=1))
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return entries


# ------------------------------------------------------------------------- reading


_DEFAULT = object()


def read_npz(path, max_bytes=_DEFAULT) -> dict:
    """{value name: array} from an npz archive, checked as the module docstring says;
    max_bytes (None: unlimited) defaults to max_tensor_bytes()."""
    p = Path(path)
    limit = max_tensor_bytes() if max_bytes is _DEFAULT else max_bytes
    label = safe_name(p)
    if not p.exists():
        raise DataError(f"{label}: no such file")
    if p.is_dir():
        raise DataError(f"{label} is a folder, not an npz archive")
    try:
        zf = zipfile.ZipFile(p)
    except zipfile.BadZipFile:
        with open(p, "rb") as fh:
            magic = fh.read(6)
        hint = (" (it is a single .npy array: save inputs with numpy.savez(path, name=array))"
                if magic == b"\x93NUMPY" else "")
        raise DataError(f"{label} is not an npz archive{hint}") from None
    with zf:
        infos = zf.infolist()
        claimed = sum(i.file_size for i in infos)
        size = p.stat().st_size
        if claimed > _MAX_EXPANSION * size + (1 << 20):
            raise DataError(f"{label}: its entries claim {format_bytes(claimed)} in a file of "
                            f"{format_bytes(size)}, more than any real archive holds (overlapping entries?)")
        names = _read_name_map(zf, label) if NAME_MAP in zf.namelist() else None
        out = {}
        for info in infos:
            if info.filename == NAME_MAP:
                continue
            if not info.filename.endswith(".npy"):
                raise DataError(f"{label}: entry {safe_name(info.filename)!r} is not a .npy array")
            entry = info.filename[:-4]
            if names is None:
                name = entry
            elif entry in names:
                name = names[entry]
            else:
                raise DataError(f"{label}: entry {safe_name(entry)!r} is missing from {NAME_MAP}")
            if name in out:
                raise DataError(f"{label}: value {safe_name(name)!r} appears twice")
            out[name] = _read_entry(zf, info, limit, f"{label}: value {safe_name(name)!r}")
    return out


def _read_name_map(zf: zipfile.ZipFile, label: str) -> dict:
    info = zf.getinfo(NAME_MAP)
    if info.file_size > _NAME_MAP_LIMIT:
        raise DataError(f"{label}: {NAME_MAP} is {format_bytes(info.file_size)}, too large")
    try:
        data = json.loads(zf.read(info).decode("utf-8"))
    except RecursionError:
        raise DataError(f"{label}: {NAME_MAP} is nested too deeply") from None
    except ValueError as exc:
        raise DataError(f"{label}: {NAME_MAP} is not valid JSON ({safe_name(exc)})") from None
    names = data.get("names") if isinstance(data, dict) else None
    if not isinstance(names, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in names.items()):
        raise DataError(f"{label}: {NAME_MAP} must hold {{'names': {{entry: name}}}} with string keys and values")
    return names


def _read_entry(zf: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int | None, label: str) -> np.ndarray:
    try:
        with zf.open(info) as f:
            return _read_npy(f, info.file_size, limit, label)
    except (OSError, EOFError, RuntimeError, NotImplementedError, zipfile.BadZipFile) as exc:
        raise DataError(f"{label} cannot be read: {safe_name(exc)}") from None


def _read_npy(f, size: int, limit: int | None, label: str) -> np.ndarray:
    """One .npy array from the stream f holding size bytes, its header checked first."""
    fmt = np.lib.format
    try:
        version = fmt.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = fmt.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = fmt.read_array_header_2_0(f)
        else:
            raise ValueError(f"unsupported .npy format version {version}")
    except ValueError as exc:
        raise DataError(f"{label} is not a valid .npy array: {safe_name(exc)}") from None
    if dtype.hasobject:
        raise DataError(f"{label} holds Python objects (a pickle); gpukernels never unpickles files")
    if any(d < 0 for d in shape):
        raise DataError(f"{label} declares a negative dimension: {list(shape)}")
    count = math.prod(shape)
    nbytes = count * dtype.itemsize
    if limit is not None and nbytes > limit:
        from .limits import limit_error

        raise limit_error(None, nbytes, limit, f"{label} ({dtype})", shape)
    held = size - f.tell()
    if held < nbytes:
        raise DataError(f"{label} is truncated: its header declares {nbytes} bytes, the entry holds {held}")
    buf = bytearray(nbytes)
    view = memoryview(buf)
    got = 0
    while got < nbytes:
        n = f.readinto(view[got:])
        if not n:
            raise DataError(f"{label} is truncated: {got} of {nbytes} bytes")
        got += n
    try:
        arr = np.frombuffer(buf, dtype=dtype, count=count) if nbytes else np.zeros(shape, dtype)
        return arr.reshape(shape, order="F" if fortran else "C")
    except ValueError as exc:
        raise DataError(f"{label}: {safe_name(exc)}") from None
