"""The dispatch layer: devices, the array namespace for a device, moving arrays.

CuPy is imported lazily, the first time a CUDA device is asked for, never by
``import gpukernels``.  A machine with CuPy but no usable GPU reports CUDA as
unavailable with the reason instead of failing.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass

import numpy as np

from .errors import DeviceError


@dataclass(frozen=True)
class Device:
    """A device: kind 'cpu' or 'cuda', and a GPU index."""

    kind: str = "cpu"
    index: int = 0

    @classmethod
    def parse(cls, spec: "str | Device | None") -> "Device":
        """'cpu', 'cuda', 'cuda:1', 'gpu', 'CUDA' (ONNX backend spelling) or a Device."""
        if spec is None:
            return CPU
        if isinstance(spec, Device):
            return spec
        text = str(spec).strip().lower()
        kind, _, index = text.partition(":")
        if kind == "gpu":
            kind = "cuda"
        if kind not in ("cpu", "cuda"):
            raise DeviceError(f"unknown device {spec!r}: expected 'cpu', 'cuda' or 'cuda:N'")
        if index and not index.isdigit():
            raise DeviceError(f"bad device index in {spec!r}")
        if kind == "cpu" and index not in ("", "0"):
            raise DeviceError(f"device {spec!r}: cpu has no index")
        return cls(kind, int(index) if index else 0)

    @property
    def is_cuda(self) -> bool:
        return self.kind == "cuda"

    def __str__(self) -> str:
        return "cpu" if self.kind == "cpu" else f"cuda:{self.index}"


CPU = Device("cpu", 0)


@dataclass(frozen=True)
class CudaStatus:
    available: bool
    reason: str
    device_count: int = 0


@functools.lru_cache(maxsize=1)
def cuda_status() -> CudaStatus:
    """Whether CUDA is usable, and why not when it is not.  Never raises."""
    try:
        import cupy  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install
        return CudaStatus(False, f"CuPy is not importable ({type(exc).__name__}: {exc}); "
                                 "install the 'cuda12' extra")
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return CudaStatus(False, f"CuPy found no usable CUDA driver or GPU ({exc})")
    if count < 1:
        return CudaStatus(False, "CuPy is installed but no GPU is visible")
    try:
        cupy.zeros(1).sum()  # a real launch: catches broken drivers early
    except Exception as exc:
        return CudaStatus(False, f"a test launch on the GPU failed ({exc})")
    return CudaStatus(True, f"{count} GPU(s) usable", count)


def cuda_available() -> bool:
    return cuda_status().available


def available_devices() -> list[Device]:
    """cpu always, then every usable GPU."""
    devices = [CPU]
    status = cuda_status()
    if status.available:
        devices += [Device("cuda", i) for i in range(status.device_count)]
    return devices


def require(device: Device) -> Device:
    """Raise a DeviceError with the reason when device is not usable."""
    if device.is_cuda:
        status = cuda_status()
        if not status.available:
            raise DeviceError(f"device {device} is not usable: {status.reason}")
        if device.index >= status.device_count:
            raise DeviceError(f"device {device} does not exist: {status.device_count} GPU(s) visible")
    return device


def namespace(device: "Device | str") -> object:
    """numpy for cpu, cupy for cuda (checked usable)."""
    device = Device.parse(device)
    if not device.is_cuda:
        return np
    require(device)
    import cupy

    return cupy


def is_cupy_array(array) -> bool:
    """True for a cupy.ndarray; never imports CuPy."""
    return type(array).__module__.startswith("cupy") and "cupy" in sys.modules


def namespace_of(array) -> object:
    if is_cupy_array(array):
        return sys.modules["cupy"]
    return np


def device_of(array) -> Device:
    if is_cupy_array(array):
        return Device("cuda", int(array.device.id))
    return CPU


def to_host(array) -> np.ndarray:
    if is_cupy_array(array):
        return array.get()
    return np.asarray(array)


def to_device(array, device: "Device | str"):
    """Move an array to device (a no-op when it is already there)."""
    device = Device.parse(device)
    if not device.is_cuda:
        return to_host(array)
    cp = namespace(device)
    if is_cupy_array(array) and array.device.id == device.index:
        return array
    with cp.cuda.Device(device.index):
        return cp.asarray(array)


def synchronize(device: "Device | str") -> None:
    device = Device.parse(device)
    if device.is_cuda:
        import cupy

        with cupy.cuda.Device(device.index):
            cupy.cuda.get_current_stream().synchronize()


# ----------------------------------------------------------------- differences
# The few operations where NumPy and CuPy spell things differently.  Kernels call these
# instead of branching on the namespace themselves.


def scatter_reduce(xp, target, indices, values, reduction: str) -> None:
    """In place: target[indices] (op)= values, with repeated indices all applied.

    reduction is 'add', 'mul', 'max' or 'min'.  indices is anything valid for basic or
    advanced indexing (a tuple of integer arrays, typically).
    """
    if xp is np:
        ufunc = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}[reduction]
        ufunc.at(target, indices, values)
        return
    import cupyx

    if reduction == "add":
        cupyx.scatter_add(target, indices, values)
    elif reduction == "max":
        cupyx.scatter_max(target, indices, values)
    elif reduction == "min":
        cupyx.scatter_min(target, indices, values)
    elif reduction == "mul":
        # CuPy has no scatter-multiply: apply the updates in rounds of distinct indices.
        _scatter_mul_rounds(xp, target, indices, values)
    else:
        raise ValueError(f"unknown scatter reduction {reduction!r}")


def _scatter_mul_rounds(xp, target, indices, values) -> None:
    flat_index = xp.ravel_multi_index(tuple(xp.asarray(i) for i in indices), target.shape) \
        if isinstance(indices, tuple) else xp.asarray(indices)
    flat_index = xp.broadcast_to(flat_index, values.shape).ravel()
    vals = values.ravel()
    order = xp.argsort(flat_index, kind="stable")
    flat_index = flat_index[order]
    vals = vals[order]
    # rank of each entry among equal indices; every round touches distinct positions
    n = flat_index.size
    if n == 0:
        return
    starts = xp.concatenate([xp.ones(1, bool), flat_index[1:] != flat_index[:-1]])
    group_start = xp.maximum.accumulate(xp.where(starts, xp.arange(n), 0))
    rank = xp.arange(n) - group_start
    flat_target = target.reshape(-1)
    for r in range(int(rank.max()) + 1):
        sel = rank == r
        flat_target[flat_index[sel]] *= vals[sel]


def scatter_assign_last_wins(xp, target, flat_indices, values) -> None:
    """target.flat[flat_indices] = values where, for repeated indices, the update that
    comes last in index order wins, identically on NumPy and CuPy (CuPy's plain
    assignment leaves the winner unspecified)."""
    flat_target = target.reshape(-1)
    if xp is np:
        flat_target[flat_indices] = values  # NumPy applies updates in order: last wins
        return
    n = flat_indices.size
    if n == 0:
        return
    order = xp.arange(n)
    winner = xp.full(flat_target.size, -1, dtype=xp.int64)
    import cupyx

    cupyx.scatter_max(winner, flat_indices, order)
    keep = winner[flat_indices] == order
    flat_target[flat_indices[keep]] = values[keep]
