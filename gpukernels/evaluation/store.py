"""Where eval writes: a folder of .npz files (one per batch) or a Zarr group (one array
per output, chunked by batch).  Only the driver writes, one batch at a time, in the order
batches finish; each batch is written so that a crash never leaves it half-written yet
counted as done, which is what --resume relies on:

* npz folder: ``index.json`` (what the run was: model digest, samples, batch, outputs,
  --against and tolerances), ``batch-NNNNNN.npz`` holding one array per output for the
  batch's samples (written to a temporary file and renamed), and with --against
  ``errors-NNNNNN.npz`` (the per-sample errors), renamed into place before the batch
  file.  A batch is done when its file is there and holds every output with the batch's
  sample count.
* Zarr group: the same description in the group's attributes (``gpukernels_eval``),
  one array per output of shape [samples, ...] chunked by batch (Zarr writes each chunk
  to a temporary file and renames it), per-sample errors in ``_gpukernels_errors_*``
  arrays, and ``_gpukernels_done`` (one byte per batch) set after the batch's chunks.

``read_outputs(path)`` reads either back as {output name: array} in sample order.
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import numpy as np

from ..archive import NAME_MAP, DataError, _read_name_map, entry_names, read_npz, safe_name, write_npz
from .data import npy_header

FORMAT = "gpukernels-eval/1"
_DONE = "_gpukernels_done"
_ERR = ("max_abs", "max_rel", "outside")
_COMPARED = ("model_digest", "samples", "batch", "outputs", "against", "rtol", "atol")


def output_format(path) -> str:
    p = Path(path)
    if p.suffix == ".zarr" or (p.is_dir() and ((p / "zarr.json").is_file() or (p / ".zgroup").is_file())):
        return "zarr"
    return "npz"


def open_store(path, manifest: dict, resume: bool):
    cls = ZarrStore if output_format(path) == "zarr" else NpzStore
    return cls(path, manifest, resume)


def _check_manifest(label: str, old, new: dict) -> None:
    if not isinstance(old, dict) or old.get("format") != FORMAT:
        raise DataError(f"{label} was not written by gpukernels eval; choose a new output")
    diffs = [f"{k} {safe_name(old.get(k), 60)} (now {safe_name(new[k], 60)})" for k in _COMPARED
             if old.get(k) != new[k]]
    if diffs:
        raise DataError(f"--resume: {label} holds a run with other settings: " + "; ".join(diffs) +
                        ". Resume with the same model, data, --batch and --against, or choose a new output")


def _existing_error(label: str) -> DataError:
    return DataError(f"output {label} already holds results; pass --resume to continue that run, "
                     "or remove it / choose a new output")


class NpzStore:
    kind = "npz"

    def __init__(self, path, manifest: dict, resume: bool):
        self.path = Path(path)
        self.label = safe_name(self.path)
        self.manifest = manifest
        nb = -(-manifest["samples"] // manifest["batch"])
        self.width = max(6, len(str(nb - 1)))
        if self.path.exists() and not self.path.is_dir():
            raise DataError(f"output {self.label} exists and is not a folder")
        index = self.path / "index.json"
        if self.path.is_dir() and any(self.path.iterdir()):
            if not resume:
                raise _existing_error(self.label)
            try:
                old = json.loads(index.read_text("utf-8"))
            except (OSError, ValueError):
                old = None
            _check_manifest(self.label, old, manifest)
            for stale in self.path.glob(".*.tmp"):   # temporary files of a write a crash cut short
                stale.unlink(missing_ok=True)
        else:
            if not self.path.parent.is_dir():
                raise DataError(f"cannot write {self.label}: folder {safe_name(self.path.parent)} does not exist")
            self.path.mkdir(exist_ok=True)
            tmp = self.path / f".index.json.{os.getpid()}.tmp"
            tmp.write_text(json.dumps(manifest, indent=1), "utf-8")
            os.replace(tmp, index)

    def _file(self, prefix: str, index: int) -> Path:
        return self.path / f"{prefix}-{index:0{self.width}d}.npz"

    def _complete(self, f: Path, names, count: int) -> bool:
        try:
            with zipfile.ZipFile(f) as zf:
                emap = _read_name_map(zf, safe_name(f)) if NAME_MAP in zf.namelist() else {}
                found = {}
                for info in zf.infolist():
                    if info.filename.endswith(".npy"):
                        with zf.open(info) as fh:
                            shape, _ = npy_header(fh, info.file_size, safe_name(f))
                        found[emap.get(info.filename[:-4], info.filename[:-4])] = shape
        except (OSError, ValueError, zipfile.BadZipFile, EOFError, DataError):
            return False
        return all(n in found and len(found[n]) >= 1 and found[n][0] == count for n in names)

    def done(self, batches) -> set:
        """Indices of the batches (index, start, stop) already written completely."""
        out = set()
        against = self.manifest.get("against")
        for index, start, stop in batches:
            f = self._file("batch", index)
            if not f.is_file() or not self._complete(f, self.manifest["outputs"], stop - start):
                continue
            if against and not self._complete(self._file("errors", index),
                                               [f"{o}/{k}" for o in self.manifest["outputs"] for k in _ERR],
                                               stop - start):
                continue
            out.add(index)
        return out

    def write(self, index: int, start: int, stop: int, outputs: dict, errors) -> None:
        if errors is not None:
            write_npz(self._file("errors", index),
                      {f"{o}/{k}": v for o, e in errors.items() for k, v in zip(_ERR, e)})
        write_npz(self._file("batch", index), outputs)

    def read_errors(self, index: int) -> dict:
        arrays = read_npz(self._file("errors", index), None)
        return {o: tuple(arrays[f"{o}/{k}"] for k in _ERR) for o in self.manifest["outputs"]}


def _zarr():
    from .extras import require

    return require("zarr", "a Zarr output")


def _create_array(group, name, shape, chunks, dtype, fill_value=0):
    if hasattr(group, "create_array"):    # zarr 3
        return group.create_array(name=name, shape=shape, chunks=chunks, dtype=dtype, fill_value=fill_value)
    return group.create_dataset(name, shape=shape, chunks=chunks, dtype=dtype, fill_value=fill_value)  # zarr 2


class ZarrStore:
    kind = "zarr"

    def __init__(self, path, manifest: dict, resume: bool):
        zarr = _zarr()
        self.path = Path(path)
        self.label = safe_name(self.path)
        self.manifest = manifest
        self.keys = entry_names(manifest["outputs"])
        clash = [k for k in self.keys.values() if k.startswith("_gpukernels_")]
        if clash:
            raise DataError(f"output name {safe_name(clash[0])!r} clashes with eval's own arrays in a Zarr output")
        n, b = manifest["samples"], manifest["batch"]
        nb = -(-n // b)
        if self.path.exists() and not self.path.is_dir():
            raise DataError(f"output {self.label} exists and is not a folder")
        if self.path.is_dir() and any(self.path.iterdir()):
            if not resume:
                raise _existing_error(self.label)
            try:
                self.group = zarr.open_group(str(self.path), mode="r+")
                old = dict(self.group.attrs).get("gpukernels_eval")
            except Exception:  # noqa: BLE001
                old = None
            _check_manifest(self.label, old, manifest)
        else:
            if not self.path.parent.is_dir():
                raise DataError(f"cannot write {self.label}: folder {safe_name(self.path.parent)} does not exist")
            self.group = zarr.open_group(str(self.path), mode="w")
            _create_array(self.group, _DONE, (nb,), (1,), "u1")
            if manifest.get("against"):
                k = len(manifest["outputs"])
                for e, dt in zip(_ERR, ("f8", "f8", "u1")):
                    _create_array(self.group, f"_gpukernels_errors_{e}", (n, k), (b, k), dt)
            self.group.attrs["gpukernels_eval"] = manifest
            self.group.attrs["names"] = {v: k for k, v in self.keys.items()}

    def done(self, batches) -> set:
        flags = np.asarray(self.group[_DONE][:])
        return {i for i, _, _ in batches if i < flags.size and flags[i]}

    def _array_for(self, name: str, value: np.ndarray):
        key = self.keys[name]
        n, b = self.manifest["samples"], self.manifest["batch"]
        try:
            arr = self.group[key]
        except KeyError:
            arr = None
        want = (n,) + tuple(value.shape[1:])
        if arr is None:
            return _create_array(self.group, key, want, (b,) + tuple(value.shape[1:]), value.dtype)
        if tuple(arr.shape) != want or np.dtype(arr.dtype) != value.dtype:
            raise DataError(f"output {safe_name(name)!r}: a batch gave {value.dtype}{list(value.shape)}, the Zarr "
                            f"array {self.label}/{safe_name(key)} holds {np.dtype(arr.dtype)}{list(arr.shape)}; "
                            "every batch of an output must have one per-sample shape and element type")
        return arr

    def write(self, index: int, start: int, stop: int, outputs: dict, errors) -> None:
        for name in self.manifest["outputs"]:
            self._array_for(name, outputs[name])[start:stop] = outputs[name]
        if errors is not None:
            for j, e in enumerate(_ERR):
                self.group[f"_gpukernels_errors_{e}"][start:stop] = np.stack(
                    [errors[o][j] for o in self.manifest["outputs"]], axis=1)
        self.group[_DONE][index] = 1

    def read_errors(self, index: int) -> dict:
        b = self.manifest["batch"]
        lo, hi = index * b, min(self.manifest["samples"], (index + 1) * b)
        cols = [np.asarray(self.group[f"_gpukernels_errors_{e}"][lo:hi]) for e in _ERR]
        return {o: (cols[0][:, j], cols[1][:, j], cols[2][:, j].astype(bool))
                for j, o in enumerate(self.manifest["outputs"])}


def read_outputs(path) -> dict:
    """{output name: array over all samples} from an eval output (npz folder or Zarr
    group).  DataError when a batch is missing (an interrupted run: --resume completes it)."""
    p = Path(path)
    label = safe_name(p)
    if output_format(p) == "zarr":
        zarr = _zarr()
        group = zarr.open_group(str(p), mode="r")
        manifest = dict(group.attrs).get("gpukernels_eval")
        _check_manifest(label, manifest, {k: manifest.get(k) for k in _COMPARED} if isinstance(manifest, dict)
                        else {k: None for k in _COMPARED})
        flags = np.asarray(group[_DONE][:])
        if not flags.all():
            raise DataError(f"{label}: batch {int(np.argmin(flags))} was not written (an interrupted run?)")
        keys = entry_names(manifest["outputs"])
        return {o: np.asarray(group[keys[o]][:]) for o in manifest["outputs"]}
    try:
        manifest = json.loads((p / "index.json").read_text("utf-8"))
    except (OSError, ValueError):
        raise DataError(f"{label}: not an eval output (no readable index.json)") from None
    _check_manifest(label, manifest, {k: manifest.get(k) for k in _COMPARED} if isinstance(manifest, dict)
                    else {k: None for k in _COMPARED})
    n, b = manifest["samples"], manifest["batch"]
    nb = -(-n // b)
    width = max(6, len(str(nb - 1)))
    parts: dict = {o: [] for o in manifest["outputs"]}
    for i in range(nb):
        f = p / f"batch-{i:0{width}d}.npz"
        if not f.is_file():
            raise DataError(f"{label}: batch {i} ({safe_name(f.name)}) was not written (an interrupted run?)")
        arrays = read_npz(f, None)
        for o in parts:
            parts[o].append(arrays[o])
    return {o: np.concatenate(v) for o, v in parts.items()}
