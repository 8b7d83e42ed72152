"""Datasets eval reads: a folder of .npz files, a folder of .npy files (one per input,
memory-mapped) or a Zarr group (one array per input).

The driver opens a dataset with ``open_source``, which reads every file's headers (never
the data) and checks them against the model: each input present, of the model's element
type, each sample of the shape the model takes, the same number of samples for every
input.  A problem is a DataError naming the file and its samples.  ``Source.part(start,
stop)`` is what a task carries to a worker: a small, picklable reader of those samples
that reads them where they are (the workers need the same paths, a shared file system
on a cluster of several machines).

Samples are numbered from 0 in dataset order: the .npz files in natural order of their
names (``x2.npz`` before ``x10.npz``), then the order inside each file.  An .npz file holds
one sample (an array per input with the model's dimensions less the batch axis) or a
batch (the model's dimensions, the first counting samples); arrays for names that are
not inputs (labels, say) are ignored.  A .npy file or Zarr array is named after its input
(names that are not plain file names as gpukernels.archive.entry_names spells them) and
holds the samples on its first axis.
"""

from __future__ import annotations

import os
import re
import threading
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..archive import NAME_MAP, DataError, _read_entry, _read_name_map, entry_names, safe_name

__all__ = ["open_source", "Source", "detect_format"]


def _natural_key(name: str):
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", name)]


def _is_zarr_group(p: Path) -> bool:
    return p.is_dir() and ((p / "zarr.json").is_file() or (p / ".zgroup").is_file())


def detect_format(path) -> str:
    """'npz', 'npy' or 'zarr' for a dataset path; DataError when it is none of them."""
    p = Path(path)
    label = safe_name(p)
    if not p.exists():
        raise DataError(f"data {label}: no such file or folder")
    if p.is_file():
        if p.suffix == ".npz":
            return "npz"
        raise DataError(f"data {label}: expected a folder of .npz files, a folder of .npy files (one per input) "
                        "or a Zarr group")
    if _is_zarr_group(p):
        return "zarr"
    if p.suffix == ".zarr":
        raise DataError(f"data {label}: a .zarr folder without zarr.json or .zgroup is not a Zarr group")
    names = [e.name for e in p.iterdir() if e.is_file()]
    has_npz = any(n.endswith(".npz") for n in names)
    has_npy = any(n.endswith(".npy") for n in names)
    if has_npz and has_npy:
        raise DataError(f"data {label}: the folder holds both .npz and .npy files; keep one format per folder")
    if has_npz:
        return "npz"
    if has_npy:
        return "npy"
    raise DataError(f"data {label}: the folder holds no .npz or .npy files and is not a Zarr group")


class Source:
    """A dataset scanned on the driver: n samples, each input's per-sample shape and dtype."""

    kind = ""

    def __init__(self, path):
        self.path = str(path)
        self.n = 0
        self.shapes: dict = {}
        self.dtypes: dict = {}

    def part(self, start: int, stop: int) -> "Reader":
        raise NotImplementedError

    def describe(self, start: int, stop: int) -> str:
        return self.part(start, stop).where()


class Reader:
    """Samples [start, stop) of a dataset, read on a worker."""

    start = stop = 0

    def read(self) -> dict:
        raise NotImplementedError

    def where(self) -> str:
        raise NotImplementedError

    def locate(self, i: int) -> str:
        """Where sample i (numbered in the dataset) comes from."""
        raise NotImplementedError


def _check_against_model(spec, label_of, shapes: dict, dtypes: dict) -> None:
    for inp in spec.inputs:
        name = inp.name
        if not inp.check_dtype(dtypes[name]):
            raise DataError(f"{label_of(name)}: input {safe_name(name)!r} holds {dtypes[name]}; the model takes "
                            f"{inp.type_name}" + (f" ({inp.dtype})" if inp.dtype is not None else ""))
        why = inp.sample_shape_error(shapes[name])
        if why:
            raise DataError(f"{label_of(name)}: input {safe_name(name)!r}: {why}")


def _samples(start: int, count: int) -> str:
    if count == 1:
        return f"sample {start}"
    return f"samples {start}..{start + count - 1}"


# ------------------------------------------------------------------------ npz folder


def npy_header(f, size: int, label: str):
    """(shape, dtype) from the start of an .npy stream holding size bytes; DataError when
    the header is malformed, holds objects, or declares more bytes than the entry holds."""
    fmt = np.lib.format
    try:
        version = fmt.read_magic(f)
        if version == (1, 0):
            shape, _, dtype = fmt.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, _, dtype = fmt.read_array_header_2_0(f)
        else:
            raise ValueError(f"unsupported .npy format version {version}")
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise DataError(f"{label} is not a valid .npy array: {safe_name(exc)}") from None
    if dtype.hasobject:
        raise DataError(f"{label} holds Python objects (a pickle); gpukernels never unpickles files")
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    held = size - f.tell()
    if held < nbytes:
        raise DataError(f"{label} is truncated: its header declares {nbytes} bytes, the file holds {held}")
    return tuple(int(d) for d in shape), dtype


@dataclass
class _NpzFile:
    path: str
    start: int      # first sample (dataset numbering)
    count: int
    single: bool    # one sample: arrays without the batch axis
    entries: dict   # input name -> zip entry name


def _scan_npz(path: Path, spec) -> "tuple[_NpzFile, dict, dict]":
    label = safe_name(path)
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise DataError(f"{label}: not a readable .npz archive ({safe_name(exc)})") from None
    with zf:
        try:
            names = _read_name_map(zf, label) if NAME_MAP in zf.namelist() else None
        except (zipfile.BadZipFile, OSError, EOFError) as exc:
            raise DataError(f"{label}: corrupt archive ({safe_name(exc)})") from None
        by_name = {}
        for info in zf.infolist():
            if not info.filename.endswith(".npy"):
                continue
            entry = info.filename[:-4]
            by_name[names.get(entry, entry) if names else entry] = info
        missing = [i.name for i in spec.inputs if i.name not in by_name]
        if missing:
            held = ", ".join(safe_name(n, 40) for n in list(by_name)[:8]) or "no arrays"
            raise DataError(f"{label}: no array for input(s) {', '.join(repr(safe_name(m)) for m in missing)} "
                            f"(the file holds {held})")
        shapes, dtypes, counts, entries = {}, {}, {}, {}
        for inp in spec.inputs:
            info = by_name[inp.name]
            try:
                with zf.open(info) as f:
                    shape, dtype = npy_header(f, info.file_size, f"{label}: array {safe_name(inp.name)!r}")
            except (zipfile.BadZipFile, OSError, EOFError, RuntimeError) as exc:
                raise DataError(f"{label}: array {safe_name(inp.name)!r} cannot be read ({safe_name(exc)})") from None
            rank = None if inp.dims is None else len(inp.dims)
            if rank is not None and len(shape) == rank - 1:
                counts[inp.name], shapes[inp.name] = None, shape          # one sample
            elif rank is None or len(shape) == rank:
                if not shape:
                    raise DataError(f"{label}: input {safe_name(inp.name)!r} is a scalar; eval needs samples "
                                    "on a first axis")
                counts[inp.name], shapes[inp.name] = shape[0], shape[1:]
            else:
                raise DataError(f"{label}: input {safe_name(inp.name)!r} has shape {list(shape)}; the model's input "
                                f"takes {inp.describe()}: a file holds one sample ({rank - 1} dimensions) or a "
                                f"batch ({rank} dimensions, samples first)")
            dtypes[inp.name] = dtype
            entries[inp.name] = info.filename
        kinds = set(counts.values())
        if len(kinds) > 1:
            what = ", ".join(f"{safe_name(k)!r}: {'one sample' if v is None else f'{v} samples'}"
                             for k, v in counts.items())
            raise DataError(f"{label}: its inputs hold different numbers of samples ({what})")
        count = kinds.pop()
        return _NpzFile(str(path), 0, 1 if count is None else count, count is None, entries), shapes, dtypes


class NpzSource(Source):
    kind = "npz"

    def __init__(self, path, spec):
        super().__init__(path)
        p = Path(path)
        files = [p] if p.is_file() else sorted((e for e in p.iterdir() if e.is_file() and e.name.endswith(".npz")),
                                               key=lambda e: _natural_key(e.name))
        self.files: list = []
        first_shapes = first_file = None
        n = 0
        for f in files:
            entry, shapes, dtypes = _scan_npz(f, spec)
            label = safe_name(f)
            where = (lambda name, _l=label, _e=entry, _n=n:
                     f"{_l} ({_samples(_n, _e.count)} of the dataset)")
            _check_against_model(spec, where, shapes, dtypes)
            if first_shapes is None:
                first_shapes, first_file = shapes, label
                self.shapes, self.dtypes = shapes, dtypes
            else:
                for name in shapes:
                    if shapes[name] != first_shapes[name] or dtypes[name] != self.dtypes[name]:
                        raise DataError(
                            f"{where(name)}: input {safe_name(name)!r} holds samples of "
                            f"{dtypes[name]}{list(shapes[name])}, {first_file} holds "
                            f"{self.dtypes[name]}{list(first_shapes[name])}; every sample of an input must "
                            "have one shape and element type")
            entry.start = n
            n += entry.count
            if entry.count:
                self.files.append(entry)
        self.n = n

    def part(self, start, stop):
        return NpzReader([f for f in self.files if f.start < stop and f.start + f.count > start], start, stop)


_CACHE_LOCK = threading.Lock()
_NPZ_CACHE: dict = {}   # the last .npz file a worker read: {(path, mtime, size): {name: array}}


class NpzReader(Reader):
    def __init__(self, files, start, stop):
        self.files, self.start, self.stop = files, start, stop

    def _load(self, f: _NpzFile) -> dict:
        from ..archive import max_tensor_bytes

        label = safe_name(f.path)
        try:
            st = os.stat(f.path)
        except OSError as exc:
            raise DataError(f"{label} ({_samples(f.start, f.count)} of the dataset) cannot be read: "
                            f"{safe_name(exc)}") from None
        key = (f.path, st.st_mtime_ns, st.st_size)
        with _CACHE_LOCK:
            hit = _NPZ_CACHE.get(key)
        if hit is not None:
            return hit
        where = f"{label} ({_samples(f.start, f.count)} of the dataset)"
        try:
            with zipfile.ZipFile(f.path) as zf:
                arrays = {name: _read_entry(zf, zf.getinfo(entry), max_tensor_bytes(), f"{where}: array "
                                                                                         f"{safe_name(name)!r}")
                          for name, entry in f.entries.items()}
        except DataError:
            raise
        except (zipfile.BadZipFile, OSError, EOFError, KeyError, ValueError, zlib.error) as exc:
            raise DataError(f"{where} cannot be read: {safe_name(exc)}") from None
        with _CACHE_LOCK:
            _NPZ_CACHE.clear()
            _NPZ_CACHE[key] = arrays
        return arrays

    def read(self) -> dict:
        parts: dict = {}
        for f in self.files:
            arrays = self._load(f)
            lo, hi = max(self.start, f.start) - f.start, min(self.stop, f.start + f.count) - f.start
            for name, arr in arrays.items():
                parts.setdefault(name, []).append(arr[None] if f.single else arr[lo:hi])
        return {name: p[0] if len(p) == 1 else np.concatenate(p) for name, p in parts.items()}

    def where(self) -> str:
        names = [safe_name(f.path) for f in self.files]
        files = names[0] if len(names) == 1 else f"{names[0]} .. {names[-1]} ({len(names)} files)"
        return f"{_samples(self.start, self.stop - self.start)} (from {files})"

    def locate(self, i: int) -> str:
        for f in self.files:
            if f.start <= i < f.start + f.count:
                inside = "" if f.single else f", sample {i - f.start} in the file"
                return f"sample {i} of the dataset ({safe_name(f.path)}{inside})"
        return f"sample {i} of the dataset"


# ------------------------------------------------------------------------ npy folder


_MMAP_CACHE: dict = {}  # {(path, mtime, size): memory-mapped array}


def _open_npy(path: str, label: str) -> np.ndarray:
    try:
        st = os.stat(path)
        key = (path, st.st_mtime_ns, st.st_size)
        with _CACHE_LOCK:
            hit = _MMAP_CACHE.get(key)
        if hit is not None:
            return hit
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as exc:
        raise DataError(f"{label} is not a readable .npy array (truncated, corrupt or holding Python objects): "
                        f"{safe_name(exc)}") from None
    except OSError as exc:
        raise DataError(f"{label} cannot be read: {safe_name(exc)}") from None
    if not isinstance(arr, np.ndarray):
        raise DataError(f"{label} is not an .npy array")
    with _CACHE_LOCK:
        if len(_MMAP_CACHE) > 64:
            _MMAP_CACHE.clear()
        _MMAP_CACHE[key] = arr
    return arr


class NpySource(Source):
    kind = "npy"

    def __init__(self, path, spec):
        super().__init__(path)
        p = Path(path)
        entries = entry_names(spec.input_names)
        self.paths = {}
        counts = {}
        for inp in spec.inputs:
            f = p / f"{entries[inp.name]}.npy"
            label = safe_name(f)
            if not f.is_file():
                raise DataError(f"data {safe_name(p)}: no {safe_name(f.name)} for the model's input "
                                f"{safe_name(inp.name)!r} (a .npy file per input, samples on the first axis)")
            arr = _open_npy(str(f), label)
            if arr.ndim == 0:
                raise DataError(f"{label}: a scalar; eval needs the samples on the first axis")
            self.paths[inp.name] = str(f)
            counts[inp.name] = arr.shape[0]
            self.shapes[inp.name] = tuple(arr.shape[1:])
            self.dtypes[inp.name] = arr.dtype
        _check_against_model(spec, lambda name: safe_name(self.paths[name]), self.shapes, self.dtypes)
        if len(set(counts.values())) > 1:
            what = ", ".join(f"{safe_name(Path(self.paths[k]).name)}: {v}" for k, v in counts.items())
            raise DataError(f"data {safe_name(p)}: the inputs hold different numbers of samples ({what})")
        self.n = next(iter(counts.values()))

    def part(self, start, stop):
        return NpyReader(self.paths, start, stop)


class NpyReader(Reader):
    def __init__(self, paths, start, stop):
        self.paths, self.start, self.stop = paths, start, stop

    def read(self) -> dict:
        out = {}
        for name, path in self.paths.items():
            label = f"{safe_name(path)} ({_samples(self.start, self.stop - self.start)})"
            arr = _open_npy(path, label)
            try:
                out[name] = np.array(arr[self.start:self.stop])
            except (OSError, ValueError) as exc:
                raise DataError(f"{label} cannot be read: {safe_name(exc)}") from None
            if out[name].shape[0] != self.stop - self.start:
                raise DataError(f"{label}: the file holds {arr.shape[0]} samples; it changed during the run?")
        return out

    def where(self) -> str:
        files = ", ".join(safe_name(Path(p).name) for p in self.paths.values())
        folder = safe_name(Path(next(iter(self.paths.values()))).parent)
        return f"{_samples(self.start, self.stop - self.start)} of {folder} ({files})"

    def locate(self, i: int) -> str:
        return f"sample {i} of the dataset (row {i} of " + \
            ", ".join(safe_name(p) for p in self.paths.values()) + ")"


# ------------------------------------------------------------------------ Zarr group


_ZARR_CACHE: dict = {}


def _zarr_group(path: str, label: str):
    try:
        import zarr
    except ImportError:
        from .extras import missing

        raise missing("zarr", "a Zarr dataset") from None
    with _CACHE_LOCK:
        hit = _ZARR_CACHE.get(path)
    if hit is not None:
        return hit
    try:
        group = zarr.open_group(path, mode="r")
    except Exception as exc:  # noqa: BLE001 - zarr raises many types for bad metadata
        raise DataError(f"{label}: not a readable Zarr group ({type(exc).__name__}: {safe_name(exc)})") from None
    with _CACHE_LOCK:
        if len(_ZARR_CACHE) > 16:
            _ZARR_CACHE.clear()
        _ZARR_CACHE[path] = group
    return group


_UNSAFE_CODECS = {"pickle"}   # decoding runs pickle.loads on the file's bytes: code from the data


def _codec_ids(node) -> set:
    if isinstance(node, dict):
        ids = {node[k] for k in ("id", "name") if isinstance(node.get(k), str)}
        for v in node.values():
            ids |= _codec_ids(v)
        return ids
    if isinstance(node, list):
        return set().union(*(_codec_ids(v) for v in node)) if node else set()
    return set()


def _check_codecs(group_path: Path, key: str, label: str) -> None:
    """DataError when the array's metadata (read as plain JSON, before Zarr decodes
    anything), or its entry in the group's consolidated metadata, names a codec that
    unpickles: gpukernels never unpickles files."""
    import json

    def load(f: Path):
        try:
            return json.loads(f.read_text("utf-8"))
        except (OSError, ValueError, RecursionError):
            raise DataError(f"{label}: unreadable Zarr metadata {safe_name(f.name)}") from None

    found = []
    for f in (group_path / key / "zarr.json", group_path / key / ".zarray"):
        if f.is_file():
            found.append(load(f))
    if (group_path / ".zmetadata").is_file():
        meta = load(group_path / ".zmetadata")
        found.append(meta.get("metadata", {}).get(f"{key}/.zarray") if isinstance(meta, dict) else None)
    if (group_path / "zarr.json").is_file():
        meta = load(group_path / "zarr.json")
        consolidated = meta.get("consolidated_metadata") if isinstance(meta, dict) else None
        if isinstance(consolidated, dict) and isinstance(consolidated.get("metadata"), dict):
            found.append(consolidated["metadata"].get(key))
    bad = set().union(*(_codec_ids(m) for m in found)) & _UNSAFE_CODECS if found else set()
    if bad:
        raise DataError(f"{label}/{safe_name(key)}: its codecs include {', '.join(sorted(bad))}, which "
                        "unpickles the data; gpukernels never unpickles files")


class ZarrSource(Source):
    kind = "zarr"

    def __init__(self, path, spec):
        super().__init__(path)
        label = safe_name(path)
        entries = entry_names(spec.input_names)
        for inp in spec.inputs:
            for key in {inp.name, entries[inp.name]}:
                if "/" not in key and key not in (".", ".."):
                    _check_codecs(Path(path), key, label)
        group = _zarr_group(str(path), label)
        self.keys = {}
        counts = {}
        try:
            members = set(group.array_keys())
        except Exception as exc:  # noqa: BLE001
            raise DataError(f"{label}: cannot list the Zarr group ({safe_name(exc)})") from None
        for inp in spec.inputs:
            key = inp.name if inp.name in members else entries[inp.name]
            if key not in members:
                held = ", ".join(safe_name(k, 40) for k in sorted(members)[:8]) or "no arrays"
                raise DataError(f"{label}: no array for the model's input {safe_name(inp.name)!r} "
                                f"(the group holds {held})")
            try:
                arr = group[key]
                shape, dtype = tuple(arr.shape), np.dtype(arr.dtype)
            except Exception as exc:  # noqa: BLE001
                raise DataError(f"{label}/{safe_name(key)}: unreadable array metadata ({safe_name(exc)})") from None
            if not shape:
                raise DataError(f"{label}/{safe_name(key)}: a scalar; eval needs the samples on the first axis")
            self.keys[inp.name] = key
            counts[inp.name] = shape[0]
            self.shapes[inp.name] = shape[1:]
            self.dtypes[inp.name] = dtype
        _check_against_model(spec, lambda name: f"{label}/{safe_name(self.keys[name])}", self.shapes, self.dtypes)
        if len(set(counts.values())) > 1:
            what = ", ".join(f"{safe_name(self.keys[k])}: {v}" for k, v in counts.items())
            raise DataError(f"{label}: the input arrays hold different numbers of samples ({what})")
        self.n = next(iter(counts.values()))

    def part(self, start, stop):
        return ZarrReader(self.path, self.keys, start, stop)


class ZarrReader(Reader):
    def __init__(self, path, keys, start, stop):
        self.path, self.keys, self.start, self.stop = path, keys, start, stop

    def read(self) -> dict:
        label = safe_name(self.path)
        group = _zarr_group(self.path, label)
        out = {}
        for name, key in self.keys.items():
            try:
                out[name] = np.asarray(group[key][self.start:self.stop])
            except Exception as exc:  # noqa: BLE001 - codec and store errors
                raise DataError(f"{label}/{safe_name(key)} ({_samples(self.start, self.stop - self.start)}) cannot "
                                f"be read: {type(exc).__name__}: {safe_name(exc)}") from None
        return out

    def where(self) -> str:
        return f"{_samples(self.start, self.stop - self.start)} of {safe_name(self.path)}"

    def locate(self, i: int) -> str:
        return f"sample {i} of the dataset (row {i} of the arrays in {safe_name(self.path)})"


def open_source(path, spec) -> Source:
    """The dataset at path, scanned and checked against the model spec (see the module
    docstring); DataError naming the file for anything that does not fit."""
    kind = detect_format(path)
    path = Path(path).absolute()   # workers may run elsewhere: never a path relative to this process
    source = {"npz": NpzSource, "npy": NpySource, "zarr": ZarrSource}[kind](path, spec)
    if source.n == 0:
        raise DataError(f"data {safe_name(path)} holds no samples")
    return source
