"""Compiling and launching the hand-written CUDA kernels.

Sources live in the top-level ``cuda/`` folder, installed as the package
``gpukernels.cuda_sources``.  A kernel is named by its source file and a *name expression*
(``"rotary_kernel<float, 4, true>"``): the template instantiation NVRTC is asked for.

Nothing compiles at import.  ``CupyBackend.function`` compiles one ``cupy.RawModule`` per
(device, source, name expression, options) the first time it is asked for and caches it;
CuPy's own disk cache then makes later processes fast.  The options carry a digest of every
file under ``cuda/`` so that an edited header is never served from a stale cache.

A *backend* is what an operator's launch code talks to: ``xp`` (the array namespace),
``function(source, expr)``, ``empty``, ``device_array`` (a device array made C-contiguous;
host arrays are refused, as CuPy refuses them), ``upload`` (host data to the device),
``to_host``, ``launch`` and a few device properties.  The
CuPy backend here runs on a GPU; ``tools/cuda_emu/emulator.py`` provides the same interface
on the CPU emulator, so that the very same launch code is exercised without a GPU.

Scalars go to kernels with explicit NumPy types (``i32``, ``i64``, ``u32``, ``f32``), which
check their range: a Python int is never passed through.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from .. import dtypes
from ..errors import CudaKernelError

INT32_MAX = 2**31 - 1

# ------------------------------------------------------------------ sources


@functools.lru_cache(maxsize=1)
def source_dir() -> Path:
    """The folder holding the .cu/.cuh sources (installed package or the checkout's cuda/)."""
    # Installed: setup.py maps the top-level cuda/ folder to gpukernels/cuda_sources (a
    # namespace package: no __init__.py, so the folder cannot shadow NVIDIA's `cuda`
    # package when Python runs from the checkout).
    package = Path(__file__).resolve().parents[1]
    installed = package / "cuda_sources"
    if installed.is_dir():
        return installed
    path = package.parent / "cuda"
    if not path.is_dir():
        raise CudaKernelError(f"CUDA sources not found (looked for package gpukernels.cuda_sources and {path})")
    return path


def read_source(name: str) -> str:
    path = source_dir() / name
    try:
        return path.read_text()
    except OSError as exc:
        raise CudaKernelError(f"cannot read CUDA source {name}: {exc}") from exc


@functools.lru_cache(maxsize=1)
def sources_digest() -> str:
    """A digest of every source file: part of each compile key."""
    h = hashlib.sha256()
    root = source_dir()
    for path in sorted(root.rglob("*")):
        if path.suffix in (".cu", ".cuh", ".h") and path.is_file():
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def cuda_include_dirs() -> list[str]:
    """Folders with the CUDA headers NVRTC needs (cuda_fp16.h, cuda_bf16.h): the
    nvidia-cuda-runtime wheel's include/, $CUDA_PATH/include, /usr/local/cuda/include."""
    dirs = []
    try:
        spec = importlib.util.find_spec("nvidia")
        for base in (spec.submodule_search_locations or []) if spec else []:
            for sub in ("cuda_runtime", "cu13", "cuda_cccl"):
                inc = Path(base) / sub / "include"
                if (inc / "cuda_fp16.h").is_file():
                    dirs.append(str(inc))
    except (ImportError, ValueError):
        pass
    for env in ("CUDA_PATH", "CUDA_HOME"):
        if os.environ.get(env):
            dirs.append(os.path.join(os.environ[env], "include"))
    dirs.append("/usr/local/cuda/include")
    seen, out = set(), []
    for d in dirs:
        if d not in seen and os.path.isfile(os.path.join(d, "cuda_fp16.h")):
            seen.add(d)
            out.append(d)
    return out


def compile_options(extra: Sequence[str] = ()) -> tuple[str, ...]:
    """NVRTC options shared by the run-time compile and the compile check (no -arch).

    Computed once per process and set of extra options: finding the include folders probes
    the file system (tens of microseconds), which no launch should pay."""
    return _compile_options(tuple(extra))


@functools.lru_cache(maxsize=64)
def _compile_options(extra: tuple[str, ...]) -> tuple[str, ...]:
    opts = ["--std=c++17", f"-I{source_dir()}", f"-DGK_SOURCES_DIGEST=0x{sources_digest()[:12]}ull"]
    opts += [f"-I{d}" for d in cuda_include_dirs()]
    opts += list(extra)
    return tuple(opts)


@dataclass
class CudaSource:
    """One .cu file and every instantiation the Python side can request from it.

    expressions: () -> list of name expressions (all template instantiations).
    no_spill: name-expression prefixes of hot kernels that must not spill registers to
      local memory (the compile check fails when they do); None means every kernel.
    """

    filename: str
    expressions: Callable[[], list[str]]
    no_spill: tuple[str, ...] | None = None
    options: tuple[str, ...] = ()

    def is_hot(self, expr: str) -> bool:
        return self.no_spill is None or any(expr.startswith(p) for p in self.no_spill)


# Modules that declare CUDA_SOURCES (a list of CudaSource): the operators' modules
# (accelerated._MODULES) plus these.
EXTRA_SOURCE_MODULES = ["gpukernels.gpu.selftest"]


def all_sources() -> list[CudaSource]:
    """Every CudaSource any gpukernels.gpu module declares."""
    import importlib

    from . import accelerated

    out: list[CudaSource] = []
    for mod_name in list(accelerated._MODULES.values()) + EXTRA_SOURCE_MODULES:
        try:
            mod = importlib.import_module(mod_name)
        except ModuleNotFoundError as exc:
            if exc.name == mod_name:
                continue  # not written yet
            raise
        out.extend(getattr(mod, "CUDA_SOURCES", []))
    return out


# ------------------------------------------------------------------ scalars


def i32(value, what: str = "value") -> np.int32:
    v = int(value)
    if not -(2**31) <= v <= INT32_MAX:
        raise CudaKernelError(f"{what}={v} does not fit a 32-bit kernel parameter")
    return np.int32(v)


def u32(value, what: str = "value") -> np.uint32:
    v = int(value)
    if not 0 <= v < 2**32:
        raise CudaKernelError(f"{what}={v} does not fit an unsigned 32-bit kernel parameter")
    return np.uint32(v)


def i64(value, what: str = "value") -> np.int64:
    v = int(value)
    if not -(2**63) <= v < 2**63:
        raise CudaKernelError(f"{what}={v} does not fit a 64-bit kernel parameter")
    return np.int64(v)


def f32(value) -> np.float32:
    return np.float32(value)


def ceil_div(a: int, b: int) -> int:
    return -(-int(a) // int(b))


class Lazy:
    """Text made only when shown: a launch's description (``what``) is needed by error
    messages alone, so launch code passes ``Lazy(lambda: f"...")`` instead of formatting
    shapes and dtypes on every call.  Works wherever text is formatted (f-strings, str(),
    ``+`` with a string)."""

    __slots__ = ("_make",)

    def __init__(self, make: Callable[[], str]):
        self._make = make

    def __str__(self) -> str:
        return str(self._make())

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)

    def __repr__(self) -> str:
        return repr(str(self))

    def __add__(self, other) -> "Lazy":
        return Lazy(lambda: str(self) + str(other))

    def __radd__(self, other) -> "Lazy":
        return Lazy(lambda: str(other) + str(self))


def describe_arrays(**arrays) -> str:
    parts = []
    for k, a in arrays.items():
        if a is None:
            continue
        parts.append(f"{k}: {getattr(a, 'dtype', type(a).__name__)}{list(getattr(a, 'shape', ()))}")
    return ", ".join(parts)


# ------------------------------------------------------------------ launch checks


def check_launch(backend, grid, block, shared_mem: int, what: str) -> tuple[tuple, tuple]:
    """Normalise grid/block to 3-tuples and check them against the device limits."""
    grid = tuple(int(g) for g in (tuple(grid) + (1, 1, 1))[:3])
    block = tuple(int(b) for b in (tuple(block) + (1, 1, 1))[:3])
    if min(grid) < 1 or grid[0] > INT32_MAX or grid[1] > 65535 or grid[2] > 65535:
        raise CudaKernelError(f"{what}: grid {grid} is outside the device limits")
    threads = block[0] * block[1] * block[2]
    if min(block) < 1 or threads > 1024 or block[2] > 64:
        raise CudaKernelError(f"{what}: block {block} is outside the device limits")
    if shared_mem < 0 or shared_mem > backend.max_shared_optin:
        raise CudaKernelError(f"{what}: needs {shared_mem} bytes of shared memory, the device allows "
                              f"{backend.max_shared_optin}")
    return grid, block


# ------------------------------------------------------------------ the CuPy backend

_lock = threading.Lock()
_modules: dict = {}


class CupyBackend:
    """Launches kernels on one GPU through CuPy (NVRTC)."""

    name = "cuda"

    def __init__(self, device, allow_tf32: bool = False, sync: bool = False):
        import cupy

        self.xp = cupy
        self.device = device
        self.allow_tf32 = bool(allow_tf32)
        self.sync = bool(sync)
        # GPUKERNELS_CUDA_POISON=1: outputs start as 0xFF bytes (NaN), so a kernel that
        # leaves an element unwritten cannot pass a parity check by luck
        self.poison = os.environ.get("GPUKERNELS_CUDA_POISON") == "1"
        with cupy.cuda.Device(device.index) as dev:
            attrs = dev.attributes
            self.sm_count = int(attrs.get("MultiProcessorCount", 1))
            self.max_shared_optin = int(attrs.get("MaxSharedMemoryPerBlockOptin",
                                                  attrs.get("MaxSharedMemoryPerBlock", 48 * 1024)))
            cc = dev.compute_capability
            self.compute_capability = int(cc)
        self._functions: dict = {}  # (source, expr, options) -> compiled function
        self._dynamic_smem: dict = {}  # id(function) -> the opt-in shared memory already set

    def function(self, source: str, expr: str, options: Sequence[str] = ()):
        """The kernel expr of source, compiled on first use (per device) and cached.

        A launch asks for its function on every call: the hit is one dict lookup keyed by
        what the caller passed (no option list is rebuilt)."""
        key = (source, expr, options if type(options) is tuple else tuple(options))
        fn = self._functions.get(key)
        if fn is not None:
            return fn
        fn = self._compile(source, expr, key[2])
        self._functions[key] = fn
        return fn

    def _compile(self, source: str, expr: str, options: tuple):
        import cupy

        opts = compile_options(options)
        key = (self.device.index, source, expr, opts)
        fn = _modules.get(key)
        if fn is not None:
            return fn
        with _lock:
            fn = _modules.get(key)
            if fn is None:
                code = read_source(source)
                try:
                    with cupy.cuda.Device(self.device.index):
                        module = cupy.RawModule(code=code, options=opts, name_expressions=[expr],
                                                backend="nvrtc")
                        fn = module.get_function(expr)
                except Exception as exc:  # CompileException, CUDADriverError
                    raise CudaKernelError(f"compiling {expr} from cuda/{source} failed: {exc}") from exc
                _modules[key] = fn
        return fn

    @staticmethod
    def dtype_for(data_type):
        """The array dtype that holds an ONNX element type here (its GPU storage type)."""
        return dtypes.info(data_type).storage

    def empty(self, shape, dtype):
        with self.xp.cuda.Device(self.device.index):
            out = self.xp.empty(tuple(int(s) for s in shape), dtype=dtype)
            if self.poison and out.size:
                out.view(self.xp.uint8).fill(0xFF)
            return out

    def device_array(self, array):
        """array (a device array) as a C-contiguous array on this device (no copy when it
        already is).  Host arrays are refused, as cupy.ascontiguousarray refuses them: host
        data goes through ``upload``, so that no launch copies host data by accident."""
        if not isinstance(array, self.xp.ndarray):
            raise TypeError(f"device_array got a host {type(array).__module__}.{type(array).__name__}, not a "
                            "cupy.ndarray (cupy.ascontiguousarray refuses host arrays); copy host data with "
                            "backend.upload")
        with self.xp.cuda.Device(self.device.index):
            return self.xp.ascontiguousarray(array)

    def upload(self, array):
        """Host data (a NumPy array) copied to this device as a C-contiguous array."""
        with self.xp.cuda.Device(self.device.index):
            return self.xp.ascontiguousarray(self.xp.asarray(array))

    def to_host(self, array) -> np.ndarray:
        """A host (NumPy) copy of a device array."""
        return self.xp.asnumpy(array)

    @staticmethod
    def pointer(array) -> int:
        return int(array.data.ptr)

    def launch(self, fn, grid, block, args, shared_mem: int = 0, what: str = "kernel") -> None:
        grid, block = check_launch(self, grid, block, shared_mem, what)
        try:
            with self.xp.cuda.Device(self.device.index):
                if shared_mem > 48 * 1024 and self._dynamic_smem.get(id(fn), 0) < shared_mem:
                    # a driver call: made once per function and size, not on every launch
                    fn.max_dynamic_shared_size_bytes = int(shared_mem)
                    self._dynamic_smem[id(fn)] = int(shared_mem)
                # None stands for a null pointer (an absent optional input)
                args = tuple(np.uint64(0) if a is None else a for a in args)
                fn(grid, block, args, shared_mem=int(shared_mem))
                if self.sync:
                    self.xp.cuda.get_current_stream().synchronize()
        except CudaKernelError:
            raise
        except Exception as exc:
            raise CudaKernelError(f"{what}: launch failed (grid {grid}, block {block}, "
                                  f"{shared_mem} B shared): {exc}") from exc


@functools.lru_cache(maxsize=None)
def _cupy_backend(device, allow_tf32: bool, sync: bool) -> CupyBackend:
    return CupyBackend(device, allow_tf32, sync)


def backend_for(kernel) -> CupyBackend:
    """The CuPy backend for a kernel instance's device and context options
    ('allow_tf32'; 'cuda_sync' or env GPUKERNELS_CUDA_SYNC=1 synchronise after each launch
    so that an asynchronous fault names its kernel)."""
    ctx = kernel.ctx
    sync = bool(ctx.settings.cuda_sync) or os.environ.get("GPUKERNELS_CUDA_SYNC") == "1"
    return _cupy_backend(kernel.device, bool(ctx.settings.allow_tf32), sync)


def aligned(backend, array, nbytes: int) -> bool:
    """Whether array's data pointer is a multiple of nbytes."""
    return backend.pointer(array) % nbytes == 0


@dataclass
class LaunchRecord:
    """What a launch did (kept by backends that record, e.g. the emulator)."""

    source: str
    expr: str
    tags: dict = field(default_factory=dict)
