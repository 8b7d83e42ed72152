"""Run gpukernels' CUDA sources on the CPU: build with g++ against cuda_emu.h, load with
ctypes, launch kernels with numpy buffers.

    from emulator import EmuBackend
    be = EmuBackend()
    fn = be.function("rotary_embedding.cu", "gk_rotary<float, 4, false>")
    be.launch(fn, grid, block, args, shared_mem)          # the CupyBackend interface

``EmuBackend`` offers the interface of ``gpukernels.gpu.launch.CupyBackend`` (xp=numpy,
function, empty, device_array, upload, to_host, pointer, launch, sm_count,
max_shared_optin, ...), so an operator's launch code runs unchanged.  Buffers from
``empty``/``device_array``/``upload`` sit just below a PROT_NONE guard page (and above
another one): an out-of-bounds access faults and is reported as a CudaKernelError naming
the buffer; writes into the <256-byte slack after the end are caught by a canary check
after the launch.

Device memory vs host memory, as CuPy sees it: emulated device arrays are ``DeviceArray``
(a NumPy subclass); a plain ``numpy.ndarray`` is a *host* array.  Where real CuPy refuses a
host array the emulator refuses it too: ``device_array`` (``cupy.ascontiguousarray``), a
kernel argument, a ufunc or NumPy function mixing device and host arrays (``Unsupported
type``), ``device[...] = host``.  Host data reaches the device through ``upload``
(``cupy.asarray``), which keeps the host array's address modulo 256 and its strides: a view
one element off alignment stays one element off alignment on the device, as a CuPy view into
a larger buffer would be.  (``numpy.asarray(device_array)`` gives a plain, i.e. host, array
here, where ``cupy.asarray`` would keep it on the device: launch code uses the device
array's own methods, ``.astype``/``.reshape``, instead.)

Alignment checking: kernels are compiled with ``-fsanitize=alignment`` in trap mode (g++
UBSan, ``GK_EMU_ALIGNMENT=0`` turns it off), so a load or store through a misaligned
pointer (a ``Vec<T, N>`` access, a ``float4``...) stops the launch with a CudaKernelError
("misaligned address"), as it faults on a GPU, instead of working by luck on x86.

Builds are cached under tools/cuda_emu/build/<hash>/ (hash of the sources, this header,
the instantiations and the compiler flags).  One build per (source, set of instantiations):
``function`` builds every instantiation the source declares (its CudaSource) at once, so a
test session compiles each source once.
"""

from __future__ import annotations

import ctypes
import hashlib
import mmap
import os
import re
import shutil
import subprocess
import sys
import threading
import weakref
from collections import Counter
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from gpukernels.errors import CudaKernelError  # noqa: E402
from gpukernels.gpu import launch as gl  # noqa: E402

BUILD_DIR = Path(os.environ.get("GK_EMU_BUILD_DIR", HERE / "build"))
CXX = os.environ.get("CXX", "g++")
# -fno-gnu-unique: a kernel template's static __shared__ arrays (static thread_locals of
# the instantiation) stay private to each build; as GNU_UNIQUE symbols the loader would
# bind every build that holds the same instantiation to the first one loaded, RTLD_LOCAL
# or not (two builds then share shared memory, and the performance counters, which look
# for it in their own module's thread-local block, miss it)
CXXFLAGS = ["-std=c++17", "-O1", "-g0", "-fPIC", "-shared", "-pthread", "-U_FORTIFY_SOURCE",
            "-fno-strict-aliasing", "-fno-stack-protector", "-fno-gnu-unique", "-w"]
# UBSan's alignment check in trap mode (no runtime library; the trap is a SIGILL the
# launcher turns into an error): a misaligned vector access faults here as on a GPU
ALIGNMENT_FLAGS = ["-fsanitize=alignment", "-fsanitize-undefined-trap-on-error"]
if os.environ.get("GK_EMU_ALIGNMENT", "1") != "0":
    CXXFLAGS += ALIGNMENT_FLAGS
# Performance-counter builds (EmuBackend(perf=True), GK_EMU_PERF=1): the kernel code is
# instrumented with -fsanitize=thread, whose __tsan_* calls cuda_emu.h defines (no TSan
# runtime; see "Performance counters" in README.md).  -fno-tree-sra keeps a float4 / Vec
# access one 16-byte access (as on the GPU) instead of four scalars; -g for the source lines.
PERF_FLAGS = ["-DGK_EMU_PERF", "-fsanitize=thread", "--param=tsan-instrument-func-entry-exit=0", "-fno-tree-sra",
              "-g"]
PAGE = mmap.PAGESIZE

# extern __shared__ [__align__(n)] T name[];  ->  T* name = (T*)::gk_emu::dynamic_shared();
_EXTERN_SHARED = re.compile(
    r"extern\s+__shared__\s+(?:__align__\s*\(\s*\d+\s*\)\s+)?([A-Za-z_][\w:<>, ]*?)\s+"
    r"(?:__align__\s*\(\s*\d+\s*\)\s+)?([A-Za-z_]\w*)\s*\[\s*\]\s*;")


def rewrite_source(text: str) -> str:
    """The source as g++ compiles it: dynamic shared memory declarations rewritten."""
    return _EXTERN_SHARED.sub(
        lambda m: f"{m.group(1)}* {m.group(2)} = reinterpret_cast<{m.group(1)}*>(::gk_emu::dynamic_shared());",
        text)


# ------------------------------------------------------------------ coverage
# (source, expr) -> launches; and free-form tags the tests add (op, attribute combination)
LAUNCHES: Counter = Counter()
TAGS: Counter = Counter()


def tag(*labels: str) -> None:
    """Record that a test exercised a case (shown in the pytest summary)."""
    TAGS[" / ".join(labels)] += 1


# ------------------------------------------------------------------ building


def _compiler_id() -> str:
    try:
        return subprocess.run([CXX, "--version"], capture_output=True, text=True, check=True).stdout.split("\n")[0]
    except (OSError, subprocess.CalledProcessError) as exc:
        raise CudaKernelError(f"the emulator needs a C++ compiler ({CXX}): {exc}") from exc


def _launcher(source: str, exprs: list[str]) -> str:
    lines = ['#include "cuda_emu.h"', f'#include "{source}"', "", "namespace {"]
    for i, e in enumerate(exprs):
        lines.append(f"gk_emu::LaunchResult L{i}(dim3 g, dim3 b, size_t s, void** a, int n) "
                     f"{{ return gk_emu::launch_kernel(&{e}, g, b, s, a, n); }}")
        lines.append(f"std::string S{i}() {{ return gk_emu::signature(&{e}); }}")
    lines.append("struct Entry { const char* name; gk_emu::LaunchResult (*launch)(dim3, dim3, size_t, void**, int);"
                 " std::string (*sig)(); };")
    lines.append("const Entry entries[] = {")
    for i, e in enumerate(exprs):
        lines.append(f"  {{{e!r}, L{i}, S{i}}},".replace("'", '"'))
    lines.append("};")
    # a trivially constructed thread_local: no TLS guard variable, which would sit in the
    # thread-local block that the performance counters take for static __shared__ arrays
    lines.append("thread_local char sig_buf[2048];")
    lines.append("}  // namespace")
    lines.append(f"""
extern "C" int gk_emu_count() {{ return {len(exprs)}; }}
extern "C" const char* gk_emu_name(int i) {{ return entries[i].name; }}
extern "C" const char* gk_emu_signature(int i) {{
  std::snprintf(sig_buf, sizeof sig_buf, "%s", entries[i].sig().c_str());
  return sig_buf;
}}
extern "C" void gk_emu_set_stack_size(size_t n) {{ gk_emu::g_stack_size = n; }}
extern "C" int gk_emu_launch(int i, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                             size_t smem, void** args, int nworkers, char* err, size_t errlen, void** fault) {{
  gk_emu::LaunchResult r = entries[i].launch(dim3(gx, gy, gz), dim3(bx, by, bz), smem, args, nworkers);
  if (r.status) {{ std::snprintf(err, errlen, "%s", r.message.c_str()); *fault = r.fault_addr; }}
  return r.status;
}}
""")
    return "\n".join(lines)


_build_lock = threading.Lock()


class EmuLibrary:
    """A built shared library holding some instantiations of one source."""

    def __init__(self, path: Path, source: str, perf: bool = False):
        self.path = path
        self.source = source
        self.perf = perf
        self.lib = ctypes.CDLL(str(path))
        lib = self.lib
        if perf:
            lib.gk_emu_perf_set_ranges.argtypes = [ctypes.POINTER(ctypes.c_ulonglong), ctypes.c_size_t]
            lib.gk_emu_perf_take.argtypes = [ctypes.POINTER(ctypes.c_ulonglong), ctypes.c_size_t]
            lib.gk_emu_perf_take.restype = ctypes.c_size_t
        lib.gk_emu_count.restype = ctypes.c_int
        lib.gk_emu_name.restype = ctypes.c_char_p
        lib.gk_emu_name.argtypes = [ctypes.c_int]
        lib.gk_emu_signature.restype = ctypes.c_char_p
        lib.gk_emu_signature.argtypes = [ctypes.c_int]
        lib.gk_emu_set_stack_size.argtypes = [ctypes.c_size_t]
        lib.gk_emu_launch.restype = ctypes.c_int
        lib.gk_emu_launch.argtypes = [ctypes.c_int] + [ctypes.c_uint] * 6 + [
            ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t,
            ctypes.POINTER(ctypes.c_void_p)]
        self.index = {}
        for i in range(lib.gk_emu_count()):
            name = lib.gk_emu_name(i).decode()
            sig = lib.gk_emu_signature(i).decode().rstrip(",")
            self.index[name] = (i, sig.split(",") if sig else [])


def build(source: str, exprs: list[str], defines: tuple[str, ...] = (), perf: bool = False) -> EmuLibrary:
    """Compile source's instantiations exprs into a shared library (cached); perf: with the
    performance counters (PERF_FLAGS).  source is a file of cuda/ or, for test kernels, an
    absolute path to a .cu file elsewhere (which may include cuda/'s common headers)."""
    src_root = gl.source_dir()
    extra = Path(source) if os.path.isabs(source) else None
    header = (HERE / "cuda_emu.h").read_text()
    launcher = _launcher(extra.name if extra else source, exprs)
    h = hashlib.sha256()
    for part in (header, launcher, " ".join(CXXFLAGS), " ".join(defines), _compiler_id(), gl.sources_digest(),
                 " ".join(PERF_FLAGS) if perf else "", extra.read_text() if extra else ""):
        h.update(part.encode())
        h.update(b"\0")
    key = h.hexdigest()[:20]
    out_dir = BUILD_DIR / key
    lib_path = out_dir / "kernels.so"
    with _build_lock:
        if not lib_path.is_file():
            stage = BUILD_DIR / f"{key}.tmp{os.getpid()}"
            if stage.exists():
                shutil.rmtree(stage)
            (stage / "src").mkdir(parents=True)
            for path in src_root.rglob("*"):
                if path.is_file() and path.suffix in (".cu", ".cuh", ".h"):
                    dst = stage / "src" / path.relative_to(src_root)
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    dst.write_text(rewrite_source(path.read_text()))
            if extra:
                (stage / "src" / extra.name).write_text(rewrite_source(extra.read_text()))
            (stage / "launcher.cpp").write_text(launcher)
            flags = [*CXXFLAGS, *[f"-D{d}" for d in defines], f"-I{HERE}", f"-I{stage / 'src'}"]
            if perf:  # compile instrumented, link without the TSan runtime (cuda_emu.h has the hooks)
                cmds = [[CXX, *[f for f in flags if f != "-shared"], *PERF_FLAGS, "-c",
                         str(stage / "launcher.cpp"), "-o", str(stage / "launcher.o")],
                        [CXX, "-shared", "-pthread", "-Wl,-z,defs", str(stage / "launcher.o"), "-o",
                         str(stage / "kernels.so")]]
            else:
                cmds = [[CXX, *flags, str(stage / "launcher.cpp"), "-o", str(stage / "kernels.so")]]
            for cmd in cmds:
                proc = subprocess.run(cmd, capture_output=True, text=True)
                if proc.returncode != 0:
                    log = proc.stderr[-6000:]
                    raise CudaKernelError(f"emulator build of {source} failed:\n{' '.join(cmd)}\n{log}")
            if out_dir.exists():
                shutil.rmtree(out_dir, ignore_errors=True)
            try:
                stage.rename(out_dir)
            except OSError:  # another process won the race
                shutil.rmtree(stage, ignore_errors=True)
    if extra and perf:
        import perfcount

        perfcount.add_source_dir(extra.parent)
    return EmuLibrary(lib_path, source, perf)


# ------------------------------------------------------------------ guarded buffers

_buffers: dict = {}  # data start address -> _Guarded, while the mapping lives
_libc = ctypes.CDLL(None)
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


class _Guarded:
    """Where one guarded buffer lies: guard page, data (ending <256 bytes below the next
    page), guard page.  Holds no reference to the mapping (the arrays do)."""

    def __init__(self, start: int, nbytes: int, slack: int, label: str):
        self.start, self.nbytes, self.slack, self.label = start, nbytes, slack, label

    def canary_ok(self) -> bool:
        return ctypes.string_at(self.start + self.nbytes, self.slack) == b"\xa5" * self.slack


class DeviceArray(np.ndarray):
    """An array in emulated device memory (what a cupy.ndarray is on a GPU).

    Views and results of NumPy operations on device arrays stay device arrays.  Like CuPy,
    a ufunc or NumPy function refuses to mix them with host arrays (plain numpy.ndarray or
    lists), and ``device[...] = host_array`` is refused."""

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        out = kwargs.get("out")
        outs = out if isinstance(out, tuple) else (() if out is None else (out,))
        _refuse_host(inputs + outs, f"{ufunc.__name__}.{method}" if method != "__call__" else ufunc.__name__)
        args = [x.view(np.ndarray) if isinstance(x, DeviceArray) else x for x in inputs]
        if outs:
            kwargs["out"] = tuple(o.view(np.ndarray) if isinstance(o, DeviceArray) else o for o in outs)
        result = getattr(ufunc, method)(*args, **kwargs)
        if outs:
            return out if not isinstance(out, tuple) or len(out) > 1 else out[0]
        return _as_device(result)

    def __array_function__(self, func, types, args, kwargs):
        _refuse_host(_flatten(args) + _flatten(tuple(kwargs.values())), getattr(func, "__name__", "function"))
        return super().__array_function__(func, types, args, kwargs)

    def __setitem__(self, key, value):
        if type(value) is np.ndarray and value.ndim > 0:
            # cupy: a[basic] = host_array goes through ndarray.fill, which takes scalars only
            raise ValueError("non-scalar numpy.ndarray cannot be used for fill (emulated CuPy: a host array "
                             "assigned into a device array)")
        super().__setitem__(key, value)


def _flatten(items) -> tuple:
    out = []
    for x in items:
        if isinstance(x, (list, tuple)):
            out.extend(_flatten(x))
        else:
            out.append(x)
    return tuple(out)


def _refuse_host(items, what: str) -> None:
    if not any(isinstance(x, DeviceArray) for x in items):
        return
    for x in items:
        if type(x) is np.ndarray or isinstance(x, list):
            raise TypeError(f"Unsupported type {type(x)} (emulated CuPy: {what} mixes a device array with a "
                            "host array; CuPy does not move host data implicitly)")


def _as_device(x):
    if type(x) is np.ndarray:
        return x.view(DeviceArray)
    if isinstance(x, tuple):
        return tuple(_as_device(i) for i in x)
    return x


def is_device_array(a) -> bool:
    return isinstance(a, DeviceArray)


def guarded_empty(shape, dtype, label: str = "buffer", offset: int = 0) -> DeviceArray:
    """An uninitialised-looking (poisoned) C-contiguous device array between guard pages,
    its data starting `offset` (0..255) bytes past a 256-byte boundary."""
    dtype = np.dtype(dtype)
    shape = tuple(int(s) for s in shape)
    offset = int(offset) % 256
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    nbytes = n * dtype.itemsize
    body = max(PAGE, -(-(nbytes + 512) // PAGE) * PAGE)
    mapping = mmap.mmap(-1, body + 2 * PAGE)
    holder = ctypes.c_char.from_buffer(mapping)
    base = ctypes.addressof(holder)
    del holder
    _libc.mprotect(base, PAGE, 0)
    _libc.mprotect(base + PAGE + body, PAGE, 0)
    end = base + PAGE + body
    start = (end - nbytes - offset) // 256 * 256 + offset
    slack = end - (start + nbytes)
    ctypes.memset(start + nbytes, 0xA5, slack)
    # poison the data: NaN for floats, 0xA5.. for integers
    ctypes.memset(start, 0xFF if dtype.kind in "fcV" or "float" in dtype.name else 0xA5, nbytes)
    _buffers[start] = _Guarded(start, nbytes, slack, label)
    weakref.finalize(mapping, _buffers.pop, start, None)
    arr = np.frombuffer(mapping, dtype=np.uint8, count=nbytes, offset=start - base)
    return arr.view(dtype).reshape(shape).view(DeviceArray)


def upload(array, label: str = "input") -> DeviceArray:
    """A host array copied to emulated device memory with its layout kept: same strides,
    same address modulo 256 (a misaligned host view gives a device view misaligned the
    same way).  Device arrays are returned as they are (cupy.asarray)."""
    if isinstance(array, DeviceArray):
        return array
    a = np.asarray(array)
    if a.size == 0 or a.ndim == 0:
        out = guarded_empty(a.shape, a.dtype, label, a.ctypes.data % 256)
        out.view(np.ndarray)[...] = a
        return out
    lo = sum(min(0, (n - 1) * st) for n, st in zip(a.shape, a.strides))
    hi = sum(max(0, (n - 1) * st) for n, st in zip(a.shape, a.strides)) + a.itemsize
    first = a.ctypes.data + lo  # the lowest byte the view touches
    raw = guarded_empty((hi - lo,), np.uint8, label, first % 256).view(np.ndarray)
    if a.dtype.kind in "fcV" or "float" in a.dtype.name:
        raw[...] = 0xFF  # bytes between strided elements: poisoned as empty() poisons floats
    dev = np.ndarray(a.shape, dtype=a.dtype, buffer=raw, offset=-lo, strides=a.strides)
    dev[...] = a
    return dev.view(DeviceArray)


def _live_buffers() -> list:
    """A snapshot of _buffers; a weakref finalizer may drop an entry while we copy."""
    while True:
        try:
            return list(_buffers.items())
        except RuntimeError:  # "dictionary changed size during iteration"
            continue


def _guard_of(array: np.ndarray):
    addr = array.ctypes.data
    for start, g in _live_buffers():
        if start <= addr < start + max(g.nbytes, 1):
            return g
    return None


def _describe_fault(addr: int | None) -> str:
    if not addr:
        return ""
    for start, g in _live_buffers():
        lo, hi = start - PAGE - 256, start + g.nbytes + g.slack + PAGE
        if lo <= addr < hi:
            off = addr - start
            return f" ({'before' if off < 0 else 'past the end of'} buffer {g.label!r} of {g.nbytes} bytes, " \
                   f"offset {off})"
    return ""


# ------------------------------------------------------------------ kernels and backend

_SCALAR_CODES = {np.dtype(np.int32): "i4", np.dtype(np.int64): "i8", np.dtype(np.uint32): "u4",
                 np.dtype(np.uint64): "u8", np.dtype(np.float32): "f4", np.dtype(np.float64): "f8",
                 np.dtype(np.int16): "i2", np.dtype(np.uint16): "u2", np.dtype(np.int8): "i1",
                 np.dtype(np.uint8): "u1", np.dtype(np.bool_): "b1"}


class EmuKernel:
    def __init__(self, lib: EmuLibrary, expr: str, source: str):
        if expr not in lib.index:
            raise CudaKernelError(f"{expr} is not among the instantiations built from {source}")
        self.lib = lib
        self.expr = expr
        self.source = source
        self.index, self.signature = lib.index[expr]

    def __repr__(self):
        return f"EmuKernel({self.expr})"


class EmuBackend:
    """The CupyBackend interface on the CPU emulator (see module doc)."""

    name = "emulator"

    def __init__(self, sm_count: int = 4, max_shared_optin: int = 227 * 1024, compute_capability: int = 90,
                 allow_tf32: bool = False, workers: int | None = None, check_canaries: bool = True,
                 perf: bool | None = None):
        self.xp = np
        self.sm_count = sm_count
        self.max_shared_optin = max_shared_optin
        self.compute_capability = compute_capability
        self.allow_tf32 = allow_tf32
        self.sync = True
        self.workers = workers if workers is not None else int(os.environ.get("GK_EMU_WORKERS", "1"))
        self.check_canaries = check_canaries
        self.records: list = []
        if perf is None:
            perf = os.environ.get("GK_EMU_PERF", "0") not in ("", "0")
        # performance counters (bank conflicts, sectors per request) of every launch; see perfcount.py
        self.perf = None
        if perf:
            import perfcount

            self.perf = perfcount.PerfLog()

    # ---- compile
    _libs: dict = {}

    def function(self, source: str, expr: str, options=()):
        exprs = None
        for cs in gl.all_sources():
            if cs.filename == source:
                exprs = cs.expressions()
        if exprs is None or expr not in exprs:
            exprs = sorted(set(exprs or []) | {expr})
        perf = self.perf is not None
        if perf:  # counted builds hold only what is launched (they compile slower)
            exprs = [expr]
        key = (source, tuple(exprs), tuple(options), perf)
        lib = EmuBackend._libs.get(key)
        if lib is None:
            lib = build(source, list(exprs), defines=tuple(o[2:] for o in options if o.startswith("-D")), perf=perf)
            EmuBackend._libs[key] = lib
        return EmuKernel(lib, expr, source)

    # ---- memory
    @staticmethod
    def dtype_for(data_type):
        """The host dtype of an ONNX element type (ml_dtypes for bfloat16): same bytes as on a GPU."""
        from gpukernels import dtypes

        return dtypes.info(data_type).numpy

    def empty(self, shape, dtype, label: str = "output"):
        return guarded_empty(shape, dtype, label)

    def device_array(self, array, label: str = "input"):
        """array (a device array) as a C-contiguous device array: itself when it already is
        one in emulator memory -- misaligned views included, as cupy.ascontiguousarray
        returns them -- else a copy.  A host array is refused as CuPy refuses it."""
        if not isinstance(array, DeviceArray):
            raise TypeError(f"device_array got a host {type(array).__module__}.{type(array).__name__}: "
                            "cupy.ascontiguousarray refuses host arrays (Argument 'a' has incorrect type); "
                            "copy host data with backend.upload")
        if array.flags.c_contiguous and (_guard_of(array) is not None or array.size == 0):
            return array
        out = guarded_empty(array.shape, array.dtype, label)
        out.view(np.ndarray)[...] = array.view(np.ndarray)
        return out

    def upload(self, array, label: str = "input"):
        """Host data copied to the device (cupy.asarray), as a C-contiguous device array."""
        return self.device_array(upload(array, label), label)

    @staticmethod
    def to_host(array) -> np.ndarray:
        """A host copy of a device array (cupy.asnumpy)."""
        if not isinstance(array, DeviceArray):
            raise TypeError(f"to_host expects a device array, got {type(array).__name__}")
        return np.array(array.view(np.ndarray))

    @staticmethod
    def pointer(array) -> int:
        return int(array.ctypes.data)

    # ---- launch
    def launch(self, fn: EmuKernel, grid, block, args, shared_mem: int = 0, what: str = "kernel") -> None:
        grid, block = gl.check_launch(self, grid, block, shared_mem, what)
        sig = fn.signature
        if len(args) != len(sig):
            raise CudaKernelError(f"{what}: {fn.expr} takes {len(sig)} parameters, got {len(args)}")
        keep, ptrs, guards = [], [], []
        for i, (a, code) in enumerate(zip(args, sig)):
            if isinstance(a, np.ndarray) and code == "p8":
                if not isinstance(a, DeviceArray):
                    raise CudaKernelError(f"{what}: argument {i} of {fn.expr} is a host numpy.ndarray (CuPy: "
                                          "Unsupported type); pass device arrays (backend.empty / "
                                          "device_array / upload)")
                if not a.flags.c_contiguous:
                    raise CudaKernelError(f"{what}: argument {i} of {fn.expr} is not C-contiguous")
                g = _guard_of(a)
                if g is None and a.size:
                    raise CudaKernelError(f"{what}: argument {i} of {fn.expr} is not an emulator buffer "
                                          "(use backend.empty / backend.device_array)")
                if g is not None:
                    guards.append(g)
                cell = ctypes.c_void_p(a.ctypes.data)
            elif code == "p8" and a is None:
                cell = ctypes.c_void_p(0)
            elif isinstance(a, np.generic):
                want = _SCALAR_CODES.get(a.dtype)
                if want != code:
                    raise CudaKernelError(f"{what}: argument {i} of {fn.expr} is {a.dtype} ({want}) but the "
                                          f"kernel parameter is {code}")
                cell = ctypes.create_string_buffer(a.tobytes(), max(8, a.nbytes))
            else:
                raise CudaKernelError(f"{what}: argument {i} of {fn.expr} is {type(a).__name__}; pass arrays "
                                      f"and NumPy scalars (parameter {code})")
            keep.append(cell)
            ptrs.append(ctypes.addressof(cell))
        argv = (ctypes.c_void_p * max(1, len(ptrs)))(*ptrs)
        err = ctypes.create_string_buffer(1024)
        fault = ctypes.c_void_p(0)
        if self.perf is not None:
            self.perf.before_launch(fn.lib, [(start, start + g.nbytes + g.slack) for start, g in _live_buffers()])
        status = fn.lib.lib.gk_emu_launch(fn.index, *grid, *block, int(shared_mem), argv, self.workers, err,
                                          len(err), ctypes.byref(fault))
        if self.perf is not None:
            self.perf.after_launch(fn.lib, fn.source, fn.expr, keep=status == 0)
        if not os.path.isabs(fn.source):  # (a test kernel from outside cuda/ is no declared instantiation)
            LAUNCHES[(fn.source, fn.expr)] += 1
        if status:
            msg = err.value.decode(errors="replace")
            raise CudaKernelError(f"{what}: {fn.expr} failed in the emulator (grid {grid}, block {block}, "
                                  f"{shared_mem} B shared): {msg}{_describe_fault(fault.value)}")
        if self.check_canaries:
            for g in guards:
                if not g.canary_ok():
                    raise CudaKernelError(f"{what}: {fn.expr} wrote past the end of buffer {g.label!r} "
                                          f"({g.nbytes} bytes)")


# ------------------------------------------------------------------ operator calls


def on_device(value, label: str = "input"):
    """A kernel class's argument as its CUDA path receives it on a GPU: a Tensor's array
    copied to emulated device memory (``upload``: strides and misalignment kept); other
    values unchanged."""
    from gpukernels.tensor import Tensor

    if isinstance(value, Tensor) and not value.is_absent and isinstance(value.array, np.ndarray) \
            and not isinstance(value.array, DeviceArray):
        return Tensor.wrap(upload(value.array, label), value.data_type)
    return value


def on_host(result):
    """A CUDA path's result (a Tensor, a named tuple of them, None) with every device
    array copied back to a host array."""
    from gpukernels.tensor import Tensor

    if isinstance(result, Tensor):
        if isinstance(result.array, DeviceArray):
            return Tensor.wrap(np.array(result.array.view(np.ndarray)), result.data_type)
        return result
    if isinstance(result, tuple):
        items = [on_host(r) for r in result]
        return type(result)(*items) if hasattr(result, "_fields") else tuple(items)
    return result


def run_op(run, backend, **arguments):
    """``run(backend, **arguments)`` (an operator module's launch function) the way a GPU
    sees it: Tensor arguments uploaded to device memory first, device results copied back."""
    on_dev = {k: on_device(v, k) for k, v in arguments.items()}
    return on_host(run(backend, **on_dev))
