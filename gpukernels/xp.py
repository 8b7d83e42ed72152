"""The dispatch layer: devices, the array namespace for a device, moving arrays (host
threads and the host buffer arena live in gpukernels.host).

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
def cuda_driver_version() -> int | None:
    """The CUDA version the installed NVIDIA driver supports (13000 for 13.0), read from
    the driver library itself without CuPy; None when there is no driver.  Never raises."""
    import ctypes
    import ctypes.util

    names = ["nvcuda.dll"] if sys.platform == "win32" else ["libcuda.so.1", "libcuda.so",
                                                            ctypes.util.find_library("cuda")]
    for name in names:
        if not name:
            continue
        try:
            lib = ctypes.CDLL(name)
            version = ctypes.c_int(0)
            if lib.cuDriverGetVersion(ctypes.byref(version)) == 0 and version.value > 0:
                return int(version.value)
        except (OSError, AttributeError):
            continue
    return None


def cuda_extra() -> str:
    """The gpukernels extra whose CuPy wheel fits this machine's driver: 'cuda12' for a
    CUDA 12 driver, 'cuda13' otherwise (CUDA 13 drivers, and when no driver is found)."""
    version = cuda_driver_version()
    return "cuda12" if version is not None and version // 1000 == 12 else "cuda13"


def _install_hint() -> str:
    version = cuda_driver_version()
    extra = cuda_extra()
    if version is None:
        return (f"install the '{extra}' extra (pip install 'gpukernels[{extra}]'; "
                "'cuda12' for a CUDA 12 driver)")
    return (f"install the '{extra}' extra (pip install 'gpukernels[{extra}]': the driver supports "
            f"CUDA {version // 1000}.{version % 1000 // 10})")


def _mismatch_hint(cupy) -> str:
    """A hint when CuPy was built for a newer CUDA than the driver supports."""
    try:
        built = int(cupy.cuda.runtime.runtimeGetVersion())
    except Exception:
        return ""
    driver = cuda_driver_version()
    if driver is not None and built // 1000 > driver // 1000:
        return (f"; this CuPy is built for CUDA {built // 1000} but the driver supports CUDA "
                f"{driver // 1000}: {_install_hint()}")
    return ""


@functools.lru_cache(maxsize=1)
def cuda_status() -> CudaStatus:
    """Whether CUDA is usable, and why not when it is not.  Never raises."""
    try:
        import cupy  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install
        return CudaStatus(False, f"CuPy is not importable ({type(exc).__name__}: {exc}); {_install_hint()}")
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return CudaStatus(False, f"CuPy found no usable CUDA driver or GPU ({exc}){_mismatch_hint(cupy)}")
    if count < 1:
        return CudaStatus(False, "CuPy is installed but no GPU is visible")
    try:
        cupy.zeros(1).sum()  # a real launch: catches broken drivers early
    except Exception as exc:
        return CudaStatus(False, f"a test launch on the GPU failed ({exc})")
    return CudaStatus(True, f"{count} GPU(s) usable", count)


def cuda_available() -> bool:
    return cuda_status().available


@functools.lru_cache(maxsize=None)
def compute_capability(index: int = 0) -> int | None:
    """The compute capability of GPU index as major * 10 + minor (90 for sm_90, 120 for
    sm_120); None when CUDA is not usable or the device does not exist.  Never raises."""
    if not cuda_status().available:
        return None
    try:
        import cupy

        return int(cupy.cuda.Device(int(index)).compute_capability)
    except Exception:
        return None


def device_name(index: int = 0) -> str | None:
    """The GPU's name as the driver reports it (None when unavailable).  Never raises."""
    if not cuda_status().available:
        return None
    try:
        import cupy

        name = cupy.cuda.runtime.getDeviceProperties(int(index))["name"]
        return name.decode(errors="replace") if isinstance(name, bytes) else str(name)
    except Exception:
        return None


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


def is_host_namespace(xp) -> bool:
    """Whether xp is NumPy (the host); per-device tuning asks this, algorithms never do."""
    return xp is np


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


def in_namespace(xp, array):
    """array in namespace xp: a host copy (or the array itself) for NumPy, a device copy
    (or the array itself) for CuPy."""
    if xp is np:
        return to_host(array)
    return xp.asarray(array)


def assign_rows_last_wins(xp, target, rows, values) -> None:
    """In place: target[rows] = values for a 2-D target (R, S), rows (M,), values (M, S);
    for repeated rows the one that comes last wins, on NumPy and CuPy alike."""
    if xp is np:
        target[rows] = values  # NumPy assigns in order: the last one wins
        return
    if rows.size == 0:
        return
    import cupyx

    # CUDA has no 64-bit signed atomicMax: rank the updates 1..M as uint64 (0 = none)
    order = xp.arange(1, rows.size + 1, dtype=xp.uint64)
    winner = xp.zeros(target.shape[0], dtype=xp.uint64)
    cupyx.scatter_max(winner, rows, order)
    keep = winner[rows] == order
    target[rows[keep]] = values[keep]


class RandomDraws:
    """Uniform [0, 1) and standard normal draws from one seeded generator in namespace xp
    (None: seeded from the OS): NumPy's PCG64 Generator, CuPy's RandomState.  The two
    draw different streams."""

    def __init__(self, xp, seed):
        self.xp = xp
        if xp is np:
            self.gen = np.random.Generator(np.random.PCG64(seed))
        else:
            self.gen = xp.random.RandomState(seed if seed is not None else
                                             int(np.random.SeedSequence().generate_state(1, np.uint64)[0]))

    def uniform(self, shape, dtype):
        if self.xp is np:
            return self.gen.random(shape, dtype=dtype)
        return self.gen.random_sample(shape, dtype=dtype)

    def normal(self, shape, dtype):
        return self.gen.standard_normal(shape, dtype=dtype)


def stable_argsort(xp, a, axis: int = -1):
    """argsort with ties in index order (NumPy needs kind='stable'; CuPy's argsort is
    always stable and older versions take no kind)."""
    if xp is np:
        return np.argsort(a, axis=axis, kind="stable")
    return xp.argsort(a, axis=axis)


def scatter_reduce(xp, target, indices, values, reduction: str) -> None:
    """In place: target[indices] (op)= values, with repeated indices all applied.

    reduction is 'add', 'mul', 'max' or 'min'.  indices is anything valid for basic or
    advanced indexing (a tuple of integer arrays, typically).
    """
    if xp is np:
        ufunc = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}[reduction]
        ufunc.at(target, indices, values)
        return
    if reduction in ("add", "max", "min"):
        _cupy_scatter(xp, target, indices, values, reduction)
    elif reduction == "mul":
        # CuPy has no scatter-multiply: apply the updates in rounds of distinct indices.
        _scatter_mul_rounds(xp, target, indices, values)
    else:
        raise ValueError(f"unknown scatter reduction {reduction!r}")


# dtypes CuPy's scatter (CUDA atomics) accepts when integer index arrays are involved
_CUPY_SCATTER_OK = {
    "add": frozenset(np.dtype(t) for t in ("int32", "float16", "float32", "float64", "uint32",
                                             "uint64")),
    "max": frozenset(np.dtype(t) for t in ("int32", "float32", "float64", "uint32", "uint64")),
}
_CUPY_SCATTER_OK["min"] = _CUPY_SCATTER_OK["max"]


def _cupy_scatter(xp, target, indices, values, op: str) -> None:
    """cupyx.scatter_add/max/min for every integer, bool and float dtype: the others go
    through a type the atomics support with the same result (int64 add as uint64,
    int64 max/min with the sign bit flipped, small types widened)."""
    import cupyx

    fn = {"add": cupyx.scatter_add, "max": cupyx.scatter_max, "min": cupyx.scatter_min}[op]
    dt = target.dtype
    if dt in _CUPY_SCATTER_OK[op]:
        fn(target, indices, values)
        return
    values = xp.asarray(values).astype(dt, copy=False)
    if dt == np.int64:
        t = target.view(xp.uint64)
        v = values.view(xp.uint64)
        if op == "add":  # two's complement: the same bits as unsigned addition
            fn(t, indices, v)
            return
        sign = np.uint64(1 << 63)  # order-preserving map int64 -> uint64
        t ^= sign
        fn(t, indices, v ^ sign)
        t ^= sign
        return
    if dt.kind in "biu" and dt.itemsize < 4:
        if op == "add":  # modular sum, wrapped back by the final cast
            signed = dt.kind == "i"
            work = target.astype(xp.int64).view(xp.uint64) if signed else target.astype(xp.uint64)
            vals = values.astype(xp.int64).view(xp.uint64) if signed else values.astype(xp.uint64)
            fn(work, indices, vals)
            target[...] = (work.view(xp.int64) if signed else work).astype(dt)
            return
        wdt = xp.int32 if dt.kind == "i" else xp.uint32
    elif dt == np.float16:
        wdt = xp.float32
    else:
        raise TypeError(f"scatter-{op} of {dt} is not supported on CuPy")
    work = target.astype(wdt)
    fn(work, indices, values.astype(wdt))
    target[...] = work.astype(dt)


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
    group_start = xp.searchsorted(flat_index, flat_index, side="left")
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
    # 1-based update number of the last update per position (0: none); uint64 because
    # CuPy's scatter_max has no int64
    order = xp.arange(1, n + 1, dtype=xp.uint64)
    winner = xp.zeros(flat_target.size, dtype=xp.uint64)
    import cupyx

    cupyx.scatter_max(winner, flat_indices, order)
    keep = winner[flat_indices] == order
    flat_target[flat_indices[keep]] = values[keep]
