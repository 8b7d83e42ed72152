"""The engine of the simulated CuPy: a device array class that wraps a NumPy array and
behaves, where it matters for finding GPU-only bugs, like ``cupy.ndarray``.

What it reproduces from CuPy 14 (see tests/cupy_sim/README.md):

* no implicit device->host conversion: ``__array__`` raises TypeError, so ``np.asarray``,
  ``np.array``, lists of device arrays given to NumPy, ``float16(x)``... fail as on a GPU;
  NumPy functions and ufuncs called with a device array dispatch to the (simulated) CuPy
  function of the same name through ``__array_function__`` / ``__array_ufunc__``, and
  fail where CuPy has no such function;
* ufuncs and operators accept device arrays and Python/NumPy scalars only (host arrays,
  lists: ``TypeError: Unsupported type``); ufunc keyword arguments are only
  out/dtype/casting; ``ufunc.reduce``/``accumulate`` exist for add and multiply only,
  ``reduceat`` for add, ``at`` for add/subtract/maximum/minimum/bitwise and/or/xor with
  CuPy's dtype limits (no int64 scatter-max, no int8 scatter-add...);
* dtypes CuPy lacks (object, strings, ml_dtypes bfloat16/float8/int4, longdouble,
  datetime) are refused;
* reductions and scalar indexing give 0-d device arrays, never NumPy scalars; no
  ``__index__`` on device arrays;
* integer-array indices wrap around instead of raising IndexError, and for repeated
  indices in an assignment a different update than NumPy's last one wins;
* ``empty``/``empty_like`` give garbage (NaN / 0xA5 bytes), not zeros;
* only the names, keyword arguments and methods real CuPy 14.2 has (recorded from a real
  install in ../cupy_api.json) exist;
* every device-to-host transfer or synchronisation is counted (``count_transfers``).
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
from pathlib import Path

import numpy as np

API = json.loads((Path(__file__).resolve().parents[1] / "cupy_api.json").read_text())
VERSION = API["version"]


class SimulationUnsupportedError(NotImplementedError):
    """Raised by parts of CuPy the CPU simulation cannot provide (compiling and launching
    hand-written CUDA kernels, memory pools, streams of other devices...)."""


def _unsupported(what: str):
    def fail(*args, **kwargs):
        raise SimulationUnsupportedError(
            f"simulated CuPy: {what} is not simulated (no GPU in this run; "
            "GPUKERNELS_SIMULATE_CUDA=1)")

    fail.__name__ = what.rpartition(".")[2]
    return fail


# ------------------------------------------------------ device-to-host transfers
# Every way real CuPy makes the host wait for the device: reading data back (get, asnumpy,
# item, tolist, int/float/bool of a device array, printing it, pickling it, exporting it
# to the host through DLPack), the functions whose result size depends on the data (CuPy
# counts the elements on the device and reads the count back: nonzero, boolean-mask
# indexing, unique, bincount...), and explicit synchronisation.  Each is one event.
_SIM_DIRS = tuple(str(Path(__file__).resolve().parents[1] / pkg) for pkg in ("cupy", "cupyx"))


class TransferLog:
    """The device-to-host transfers and synchronisations seen while it was active.

    ``count`` is the number of events; ``events`` lists (kind, what, where): what the array
    (dtype and shape), where the three innermost callers outside the simulation
    ("file:line function <- ...")."""

    def __init__(self):
        self.events: list[tuple[str, str, str]] = []

    @property
    def count(self) -> int:
        return len(self.events)

    def kinds(self) -> dict:
        out: dict = {}
        for kind, _, _ in self.events:
            out[kind] = out.get(kind, 0) + 1
        return out

    def report(self) -> str:
        return "; ".join(f"{kind} {what} at {where}" for kind, what, where in self.events) or "none"

    def __repr__(self):
        return f"<TransferLog {self.count}: {self.report()}>"


_logs: list[TransferLog] = []
_logs_lock = threading.Lock()
transfers_total = 0  # since the simulation was imported


def _caller(depth: int = 3) -> str:
    """The innermost depth frames outside the simulation, innermost first."""
    f = sys._getframe(2)
    while f is not None and f.f_code.co_filename.startswith(_SIM_DIRS):
        f = f.f_back
    parts = []
    while f is not None and len(parts) < depth:
        parts.append(f"{f.f_code.co_filename}:{f.f_lineno} {f.f_code.co_name}")
        f = f.f_back
    return " <- ".join(parts) or "?"


def note_transfer(kind: str, a=None) -> None:
    """Record one device-to-host transfer or synchronisation (a: the array, if any)."""
    global transfers_total
    transfers_total += 1
    if not _logs:
        return
    what = "" if a is None else f"{a.dtype}{list(a.shape)}"
    event = (kind, what, _caller())
    with _logs_lock:
        for log in _logs:
            log.events.append(event)


@contextlib.contextmanager
def count_transfers():
    """``with count_transfers() as log:`` -- log.count is the number of device-to-host
    transfers and synchronisations made inside the block (log.events says which, where)."""
    log = TransferLog()
    with _logs_lock:
        _logs.append(log)
    try:
        yield log
    finally:
        with _logs_lock:
            _logs.remove(log)


# ----------------------------------------------------------------------- dtypes
_SUPPORTED_DTYPES = frozenset(np.dtype(c) for c in "?bBhHiIlLqQefdFD")


def check_dtype(dtype) -> np.dtype:
    dt = np.dtype(dtype)
    if dt not in _SUPPORTED_DTYPES or not dt.isnative:
        raise TypeError(f"Unsupported dtype {dt}")
    return dt


def _garbage_fill(a: np.ndarray) -> None:
    """What uninitialised GPU memory looks like: NaN for floats, 0xA5 bytes otherwise."""
    if a.size == 0:
        return
    if a.dtype.kind in "fc":
        a.fill(np.nan)
    elif a.dtype.kind == "b":
        a.fill(True)
    else:
        a.view(np.uint8).fill(0xA5)


# ------------------------------------------------------------------- the array
_IMPLICIT = ("Implicit conversion to a NumPy array is not allowed. "
             "Please use `.get()` to construct a NumPy array explicitly.")


class Device:
    """cupy.cuda.Device: the simulation has one, id 0."""

    def __init__(self, device=None):
        if device is None:
            device = 0
        device = int(device.id if isinstance(device, Device) else device)
        if device != 0:
            from . import cuda

            raise cuda.runtime.CUDARuntimeError(
                "cudaErrorInvalidDevice: invalid device ordinal (the simulation has one GPU)")
        self.id = device

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def use(self):
        return None

    def synchronize(self):
        note_transfer("synchronize")

    @property
    def compute_capability(self):
        return COMPUTE_CAPABILITY[0]

    @property
    def pci_bus_id(self):
        return "0000:00:00.0"

    @property
    def mem_info(self):
        return (64 << 30, 80 << 30)

    @property
    def attributes(self):
        cc = int(COMPUTE_CAPABILITY[0])
        return {"MultiProcessorCount": 132, "WarpSize": 32, "MaxSharedMemoryPerBlock": 49152,
                "MaxSharedMemoryPerBlockOptin": 232448, "ComputeCapabilityMajor": cc // 10,
                "ComputeCapabilityMinor": cc % 10, "MaxThreadsPerBlock": 1024}

    def __eq__(self, other):
        return isinstance(other, Device) and other.id == self.id

    def __hash__(self):
        return hash(("cuda", self.id))

    def __repr__(self):
        return f"<CUDA Device {self.id}>"


# The simulated GPU's compute capability as CuPy spells it ("90": sm_90).  Tests of
# what happens on older GPUs change it with set_compute_capability (a test hook of the
# simulation; real CuPy has no such thing).
COMPUTE_CAPABILITY = ["90"]


def set_compute_capability(cc: str) -> None:
    COMPUTE_CAPABILITY[0] = str(cc)


Device.__module__ = "cupy.cuda.device"
_DEVICE0 = Device(0)


class _Pointer:
    def __init__(self, a):
        self.ptr = a.ctypes.data if a.size else 0
        self.device_id = 0
        self.device = _DEVICE0


def _new(a: np.ndarray) -> "ndarray":
    if type(a) is not np.ndarray:
        a = np.asarray(a)  # NumPy gives scalars for 0-d results of some operations
    check_dtype(a.dtype)
    arr = object.__new__(ndarray)
    arr._a = a
    return arr


def wrap(x):
    """NumPy results -> device arrays (NumPy scalars become 0-d arrays)."""
    if isinstance(x, np.ndarray):
        return _new(x)
    if isinstance(x, np.generic):
        return _new(np.asarray(x))
    if isinstance(x, tuple):
        items = [wrap(i) for i in x]
        return type(x)(*items) if hasattr(x, "_fields") else tuple(items)
    if isinstance(x, list):
        return [wrap(i) for i in x]
    return x


def unwrap(x, strict: str | None = None):
    """Device arrays -> their NumPy array, through lists and tuples.  With strict (the
    CuPy function's name), a host ndarray is refused as CuPy refuses it."""
    t = type(x)
    if t is ndarray:
        return x._a
    if t is list or t is tuple:
        return t(unwrap(i, strict) for i in x)
    if strict is not None and isinstance(x, np.ndarray):
        raise TypeError(
            f"simulated CuPy: {strict} got a numpy.ndarray (host array) argument; real CuPy "
            "does not move host arrays to the GPU implicitly here (use xp.asarray first)")
    if isinstance(x, dict):
        return {k: unwrap(v, strict) for k, v in x.items()}
    return x


def _scalar_ok(x) -> bool:
    return type(x) in (int, float, bool, complex) or isinstance(x, np.generic)


def _kernel_arg(x, what: str):
    """An argument of a CuPy elementwise kernel: device array or scalar, nothing else."""
    if type(x) is ndarray:
        return x._a
    if _scalar_ok(x):
        if isinstance(x, np.generic):
            check_dtype(x.dtype)
        return x
    raise TypeError(f"Unsupported type {type(x)}" + (f" (in {what})" if what else ""))


class flatiter:
    """cupy.flatiter: a.flat (getitem/setitem with ints, slices, index arrays)."""

    def __init__(self, base):
        self._base = base

    def __getitem__(self, key):
        return wrap(self._base._a.reshape(-1)[_index_key(self._base._a.reshape(-1), key)])

    def __setitem__(self, key, value):
        flat = self._base.ravel()
        flat[key] = value
        if not np.shares_memory(flat._a, self._base._a):
            self._base._a[...] = flat._a.reshape(self._base.shape)

    def __len__(self):
        return self._base.size

    def __iter__(self):
        for i in range(self._base.size):
            yield self[i]

    @property
    def base(self):
        return self._base


flatiter.__module__ = "cupy._indexing.iterate"


def _forwarded(name: str, wrap: bool = False) -> property:
    """A read-only ndarray property reading the host array's attribute name (wrapped as
    a simulated device array when wrap)."""
    if wrap:
        return property(lambda self: _new(getattr(self._a, name)))
    return property(lambda self: getattr(self._a, name))


class ndarray:
    """Simulated cupy.ndarray (device memory is a NumPy array the simulation owns)."""

    __slots__ = ("_a", "__weakref__")
    __array_priority__ = 100.0
    __hash__ = None

    def __init__(self, shape, dtype=float, memptr=None, strides=None, order="C"):
        if memptr is not None or strides is not None:
            raise SimulationUnsupportedError("simulated CuPy: ndarray(memptr=/strides=)")
        a = np.empty(shape, check_dtype(dtype), order=order)
        _garbage_fill(a)
        self._a = a

    # ------------------------------------------------------------ conversion
    def __array__(self, dtype=None, copy=None):
        raise TypeError(_IMPLICIT)

    def get(self, stream=None, order="C", out=None, blocking=True):
        note_transfer("get", self._a)
        if out is not None:
            if not isinstance(out, np.ndarray):
                raise TypeError("Only numpy.ndarray can be obtained fromcupy.ndarray")
            if out.dtype != self.dtype:
                raise TypeError(f"{out.dtype} array cannot be obtained from {self.dtype} array")
            if out.shape != self.shape:
                raise ValueError(f"Shape mismatch. Expected shape: {self.shape}, "
                                 f"actual shape: {out.shape}")
            out[...] = self._a
            return out
        order = order.upper()
        if order == "A":
            order = "F" if self._a.flags.f_contiguous and not self._a.flags.c_contiguous else "C"
        return np.array(self._a, order=order, copy=True)

    def set(self, arr, stream=None):
        if not isinstance(arr, np.ndarray):
            raise TypeError("Only numpy.ndarray can be set to cupy.ndarray")
        if self.dtype != arr.dtype:
            raise TypeError(f"{arr.dtype} array cannot be set to {self.dtype} array")
        if self.shape != arr.shape:
            raise ValueError(f"Shape mismatch. Old shape: {self.shape}, new shape: {arr.shape}")
        self._a[...] = arr

    def item(self, *args):
        note_transfer("item", self._a)
        return self._a.item(*args)

    def tolist(self):
        note_transfer("tolist", self._a)
        return self._a.tolist()

    def tobytes(self, order="C"):
        note_transfer("tobytes", self._a)
        return self._a.tobytes(order)

    def __int__(self):
        note_transfer("int()", self._a)
        return int(self._a)

    def __float__(self):
        note_transfer("float()", self._a)
        return float(self._a)

    def __complex__(self):
        note_transfer("complex()", self._a)
        return complex(self._a)

    def __bool__(self):
        note_transfer("bool()", self._a)
        return bool(self._a)

    def __oct__(self):
        note_transfer("oct()", self._a)
        return oct(int(self._a))

    def __hex__(self):
        note_transfer("hex()", self._a)
        return hex(int(self._a))

    def __bytes__(self):
        note_transfer("bytes()", self._a)
        return bytes(self._a)

    def __repr__(self):
        note_transfer("repr()", self._a)
        return repr(self._a)

    def __str__(self):
        note_transfer("str()", self._a)
        return str(self._a)

    def __format__(self, spec):
        note_transfer("format()", self._a)
        return format(self._a, spec)

    def __len__(self):
        return len(self._a)

    def __iter__(self):
        if self._a.ndim == 0:
            raise TypeError("iteration over a 0-d array")
        for i in range(self._a.shape[0]):
            yield _new(self._a[i, ...])

    def __copy__(self):
        return self.copy()

    def __deepcopy__(self, memo):
        return self.copy()

    def __reduce__(self):
        return (_rebuild, (self.get(),))

    def __getstate__(self):
        return None

    # ------------------------------------------------------------ properties
    @property
    def shape(self):
        return self._a.shape

    @shape.setter
    def shape(self, value):
        self._a = self._a.reshape(value)

    # read-only attributes forwarded to the host array, as is or as device arrays
    dtype, ndim, size, itemsize, nbytes, strides, flags = (
        _forwarded(n) for n in ("dtype", "ndim", "size", "itemsize", "nbytes", "strides", "flags"))
    T, mT = (_forwarded(n, wrap=True) for n in ("T", "mT"))

    @property
    def real(self):
        return _new(self._a.real)

    @real.setter
    def real(self, value):
        self._a.real = _kernel_arg(value, "ndarray.real")

    @property
    def imag(self):
        return _new(self._a.imag)

    @imag.setter
    def imag(self, value):
        self._a.imag = _kernel_arg(value, "ndarray.imag")

    @property
    def base(self):
        return None if self._a.base is None else _Base(self._a.base)

    @property
    def data(self):
        return _Pointer(self._a)

    @property
    def device(self):
        return _DEVICE0

    @property
    def flat(self):
        return flatiter(self)

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.dtype.str, "descr": self.dtype.descr,
                "data": (self.data.ptr, False), "version": 3,
                "strides": None if self._a.flags.c_contiguous else self.strides}

    def __dlpack_device__(self):
        return (2, 0)  # kDLCUDA, device 0

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        if dl_device is not None and tuple(dl_device)[0] == 1:
            note_transfer("__dlpack__ to the host", self._a)
            return self._a.__dlpack__(max_version=max_version, copy=True)
        raise SimulationUnsupportedError(
            "simulated CuPy: exporting a device array through DLPack to another library")

    def toDlpack(self):
        raise SimulationUnsupportedError("simulated CuPy: ndarray.toDlpack")

    # -------------------------------------------------------------- indexing
    def __getitem__(self, key):
        return wrap(self._a[_index_key(self._a, key)])

    def __setitem__(self, key, value):
        a = self._a
        k = _index_key(a, key)
        advanced = _has_advanced(k)
        if type(value) is ndarray:
            v = value._a
        elif isinstance(value, np.ndarray):
            if not advanced and value.ndim != 0:
                # CuPy: a[basic] = host_array goes through ndarray.fill
                raise ValueError("non-scalar numpy.ndarray cannot be used for fill")
            v = value
        elif _scalar_ok(value):
            v = value
        elif advanced and isinstance(value, (list, tuple)):
            v = np.asarray(unwrap(value))  # core.array(value)
            check_dtype(v.dtype)
        else:
            raise TypeError(f"Unsupported type {type(value)}")
        if advanced and _has_integer_array(k):
            _assign_first_wins(a, k, v)
        else:
            a[k] = v

    # ------------------------------------------------------------- operators
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        from . import _sim_registry

        name = ufunc.__name__
        func = _sim_registry.ufunc(name)
        if func is None:
            return NotImplemented
        if "out" in kwargs:
            out = kwargs["out"]
            if len(out) != 1:
                raise ValueError("The 'out' parameter must have exactly one array value")
            kwargs["out"] = out[0]
        if method != "__call__":
            func = getattr(func, method, None)
            if func is None:
                return NotImplemented
        return func(*inputs, **kwargs)

    def __array_function__(self, func, types_, args, kwargs):
        from . import _sim_registry

        target = _sim_registry.function_for(func)
        if target is None:
            return NotImplemented
        return target(*args, **kwargs)

    # ------------------------------------------------------------------- misc
    def astype(self, dtype, order="K", casting=None, subok=None, copy=True):
        dt = check_dtype(dtype)
        if casting is None:
            casting = "unsafe"
        if not copy and self._a.dtype == dt:
            return self
        if self._a.dtype.kind == "f" and dt.kind in "iu":
            return _new(float_to_int(self._a, dt, order))
        return _new(self._a.astype(dt, order=order, casting=casting, copy=True))

    def view(self, dtype=None, array_class=None):
        if array_class is not None:
            raise SimulationUnsupportedError("simulated CuPy: ndarray.view(array_class=)")
        if dtype is None:
            return _new(self._a.view())
        return _new(self._a.view(check_dtype(dtype)))

    def copy(self, order="C"):
        return _new(self._a.copy(order=order))

    def fill(self, value):
        if isinstance(value, np.ndarray):
            if value.shape != ():
                raise ValueError("non-scalar numpy.ndarray cannot be used for fill")
            value = value.item()
        self._a.fill(_kernel_arg(value, "ndarray.fill"))

    def take(self, indices, axis=None, out=None):
        idx = _as_index_array(indices)
        n = self._a.size if axis is None else self._a.shape[axis]
        if isinstance(idx, np.ndarray) and n and idx.size:
            idx = np.mod(idx.astype(np.int64), n)  # CuPy wraps
        if out is not None:
            out._a[...] = np.take(self._a, idx, axis=axis)
            return out
        return wrap(np.take(self._a, idx, axis=axis))

    def put(self, indices, values, mode="wrap"):
        if mode not in ("raise", "wrap", "clip"):
            raise ValueError(f"Unsupported mode {mode}")
        if mode == "raise":
            raise NotImplementedError("put() does not support mode='raise' in CuPy")
        idx = _as_index_array(indices)
        vals = values._a if type(values) is ndarray else values
        np.put(self._a, idx, vals, mode=mode)

    def sort(self, axis=-1, kind=None):
        self._a.sort(axis=axis, kind="stable")

    def argsort(self, axis=-1, kind=None):
        return _new(self._a.argsort(axis=axis, kind="stable"))

    def dot(self, b, out=None):
        if type(b) is not ndarray:
            raise TypeError(f"Argument 'b' has incorrect type (expected cupy.ndarray, got "
                            f"{type(b).__name__})")
        if out is not None:
            np.dot(self._a, b._a, out=out._a)
            return out
        return wrap(np.dot(self._a, b._a))

    def reduced_view(self, dtype=None):
        return _new(self._a.view())

    def _scatter_op(self, slices, value, op):
        scatter_op(self, slices, value, op)

    def scatter_add(self, slices, value):
        scatter_op(self, slices, value, "add")

    def scatter_max(self, slices, value):
        scatter_op(self, slices, value, "max")

    def scatter_min(self, slices, value):
        scatter_op(self, slices, value, "min")

    def _add_reduceat(self, indices, axis, dtype, out):
        return wrap(np.add.reduceat(self._a, _as_index_array(indices), axis=axis, dtype=dtype))


ndarray.__module__ = "cupy"


def float_to_int(a: np.ndarray, dt: np.dtype, order="K") -> np.ndarray:
    """A float -> integer conversion as CUDA does it (PTX cvt.rzi: truncate toward zero,
    clamp to the destination range, NaN -> 0), not as x86 NumPy does (wrap-around or
    INT_MIN for out-of-range values: undefined behaviour in C)."""
    info = np.iinfo(dt)
    with np.errstate(invalid="ignore"):
        x = np.trunc(a.astype(np.float64))
        x = np.where(np.isnan(x), 0.0, x)
        lo, hi = float(info.min), float(info.max)
        out = np.clip(x, lo, hi).astype(dt, order=order)
        if info.bits == 64:  # float(max) rounds up to 2**63 / 2**64: keep the max exactly
            out = np.where(x >= hi, info.max, out).astype(dt)
    return np.asarray(out)


class _Base:
    """What a.base gives: something that is not None for views."""

    def __init__(self, a):
        self._a = a


def _rebuild(host):
    return _new(np.array(host))


# --------------------------------------------------------------- index helpers
def _as_index_array(indices):
    if type(indices) is ndarray:
        return indices._a
    if isinstance(indices, (list, tuple)):
        return np.asarray(unwrap(indices), dtype=np.int64)
    return indices


def _component(x, a):
    if type(x) is ndarray:
        return x._a
    if isinstance(x, list):
        arr = np.asarray(unwrap(x))
        if arr.dtype.kind not in "biu" and arr.size:
            raise IndexError("arrays used as indices must be of integer (or boolean) type")
        return arr.astype(np.int64) if arr.dtype.kind != "b" else arr
    if isinstance(x, slice):
        for part in (x.start, x.stop, x.step):
            if type(part) is ndarray:
                raise TypeError("slice indices must be integers or None or have an __index__ "
                                "method")
    return x


def _index_key(a: np.ndarray, key):
    """NumPy index equivalent to CuPy's: device/host/list index arrays allowed, integer
    index arrays wrapped around (CuPy does not raise for out-of-bounds fancy indices)."""
    if type(key) is not tuple:
        key = (key,)
    comps = [_component(k, a) for k in key]
    # axes consumed by each component
    used = 0
    for c in comps:
        if c is None or c is Ellipsis:
            continue
        if isinstance(c, np.ndarray) and c.dtype.kind == "b":
            used += max(c.ndim, 1) if c.ndim else 0
        else:
            used += 1
    out = []
    axis = 0
    for c in comps:
        if c is None:
            out.append(c)
            continue
        if c is Ellipsis:
            axis += a.ndim - used
            out.append(c)
            continue
        if isinstance(c, np.ndarray):
            if c.dtype.kind == "b":
                if c.ndim:  # CuPy counts the True elements on the device and reads the count
                    note_transfer("boolean-mask index", c)
                axis += c.ndim
            elif c.dtype.kind in "iu":
                if axis < a.ndim and a.shape[axis] > 0 and c.size:
                    n = a.shape[axis]
                    if c.min() < 0 or c.max() >= n:
                        c = np.mod(c.astype(np.int64), n)
                axis += 1
            else:
                axis += 1
            out.append(c)
            continue
        axis += 1
        out.append(c)
    return tuple(out)


def _has_advanced(k) -> bool:
    return any(isinstance(c, np.ndarray) for c in k)


def _has_integer_array(k) -> bool:
    return any(isinstance(c, np.ndarray) and c.dtype.kind in "iu" for c in k)


def _assign_first_wins(a: np.ndarray, k, v) -> None:
    """a[k] = v where, for repeated target positions, NumPy's last update does not win
    (on a GPU the winner is unspecified): the first one does."""
    pos = np.arange(a.size, dtype=np.int64).reshape(a.shape)[k]
    flat = pos.reshape(-1)
    if flat.size < 2 or np.unique(flat).size == flat.size:
        a[k] = v
        return
    vals = np.broadcast_to(np.asarray(v, dtype=a.dtype), pos.shape).reshape(-1)
    idx = np.unravel_index(flat[::-1], a.shape)
    a[idx] = vals[::-1]


_SCATTER_DTYPES = {
    "add": ("int32", "float16", "float32", "float64", "uint32", "uint64"),
    "sub": ("int32", "uint32"),
    "max": ("int32", "float32", "float64", "uint32", "uint64"),
    "min": ("int32", "float32", "float64", "uint32", "uint64"),
    "and": ("int32", "int64", "uint32", "uint64"),
    "or": ("int32", "int64", "uint32", "uint64"),
    "xor": ("int32", "int64", "uint32", "uint64"),
}
_SCATTER_UFUNC = {"add": np.add, "sub": np.subtract, "max": np.maximum, "min": np.minimum,
                  "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}
_SCATTER_NAME = {"add": "add", "sub": "subtract", "max": "maximum", "min": "minimum",
                 "and": "bitwise_and", "or": "bitwise_or", "xor": "bitwise_xor"}


def scatter_op(a, slices, value, op):
    """cupy's ndarray._scatter_op: ufunc.at with CuPy's dtype limits (they apply when an
    integer index array is involved: CUDA atomics)."""
    if type(a) is not ndarray:
        raise TypeError(f"Argument 'a' has incorrect type (expected cupy.ndarray, got "
                        f"{type(a).__name__})")
    k = _index_key(a._a, slices)
    if type(value) is ndarray:
        v = value._a
    elif _scalar_ok(value) or isinstance(value, (np.ndarray, list, tuple)):
        v = np.asarray(unwrap(value))
        check_dtype(v.dtype)
    else:
        raise TypeError(f"Unsupported type {type(value)}")
    if _has_integer_array(k) and not any(isinstance(c, np.ndarray) and c.dtype.kind == "b"
                                         for c in k):
        if a.dtype.name not in _SCATTER_DTYPES[op]:
            names = ", ".join(_SCATTER_DTYPES[op])
            raise TypeError(f"cupy.{_SCATTER_NAME[op]}.at only supports {names} as data type")
    v = np.asarray(v).astype(a.dtype, copy=False)
    _SCATTER_UFUNC[op].at(a._a, k, v)


# ---------------------------------------------------------------------- ufuncs
class ufunc:
    """Simulated cupy ufunc: NumPy's ufunc of the same name with CuPy's argument rules,
    loop table (recorded ``types``) and methods."""

    def __init__(self, name, np_ufunc, info):
        self.__name__ = name
        self.name = "cupy_" + name
        self._np = np_ufunc
        self.nin = info["nin"]
        self.nout = info["nout"]
        self.nargs = self.nin + self.nout
        self.types = list(info["types"])
        self._scatter_op = info["scatter_op"]
        self._ops = [(tuple(np.dtype(c) for c in t.split("->")[0]),
                      tuple(np.dtype(c) for c in t.split("->")[1])) for t in self.types]
        self._cache = {}

    def __repr__(self):
        return f"<ufunc '{self.name}'>"

    def _loop(self, in_dtypes):
        op = self._cache.get(in_dtypes, ())
        if op == ():
            op = None
            for ins, outs in self._ops:
                if all(np.can_cast(i, o) for i, o in zip(in_dtypes, ins)):
                    op = (ins, outs)
                    break
            self._cache[in_dtypes] = op
        return op

    def __call__(self, *args, **kwargs):
        out = kwargs.pop("out", None)
        where = kwargs.pop("_where", None)
        dtype = kwargs.pop("dtype", None)
        casting = kwargs.pop("casting", None)
        if kwargs:
            raise TypeError(f"Wrong arguments {kwargs}")
        if not (self.nin <= len(args) <= self.nargs):
            raise TypeError(f"Wrong number of arguments for {self.name!r}. It must be either "
                            f"{self.nin} or {self.nargs} (with outputs), but given {len(args)}.")
        ins = [_kernel_arg(x, self.name) for x in args[:self.nin]]
        outs = list(args[self.nin:])
        if out is not None:
            if outs:
                raise ValueError("Cannot specify 'out' as both a positional and keyword argument")
            outs = list(out) if isinstance(out, tuple) else [out]
        for o in outs:
            if o is not None and type(o) is not ndarray:
                raise TypeError(f"Unsupported type {type(o)}")
        np_kwargs = {}
        if dtype is not None:
            np_kwargs["dtype"] = check_dtype(dtype)
        if casting is not None:
            np_kwargs["casting"] = casting
        if where is not None:
            np_kwargs["where"] = _kernel_arg(where, self.name)
        op = None
        if dtype is None and all(isinstance(x, np.ndarray) for x in ins):
            op = self._loop(tuple(x.dtype for x in ins))
            if op is None:
                raise TypeError(f"Wrong type ({tuple(x.dtype.type for x in ins)}) of arguments "
                                f"for {self.name}")
        if outs and any(o is not None for o in outs):
            np_kwargs["out"] = tuple(o._a if o is not None else None for o in outs)
            if op is not None and "casting" not in np_kwargs:
                # compute in CuPy's loop type, then cast into out ('same_kind')
                res = self._np(*[x.astype(t, copy=False) for x, t in zip(ins, op[0])])
                res = res if isinstance(res, tuple) else (res,)
                for o, r in zip(outs, res):
                    if o is not None:
                        if not np.can_cast(r.dtype, o.dtype, "same_kind"):
                            raise TypeError(f"output (typecode '{r.dtype.char}') could not be "
                                            f"coerced to provided output parameter (typecode "
                                            f"'{o.dtype.char}') according to the casting rule "
                                            "''same_kind''")
                        np.copyto(o._a, r, casting="unsafe")
                return outs[0] if self.nout == 1 else tuple(outs)
            self._np(*ins, **np_kwargs)
            return outs[0] if self.nout == 1 else tuple(outs)
        if op is not None:
            res = self._np(*[x.astype(t, copy=False) for x, t in zip(ins, op[0])], **np_kwargs)
            if self.nout == 1:
                return _new(np.asarray(res).astype(op[1][0], copy=False))
            return tuple(_new(np.asarray(r).astype(t, copy=False)) for r, t in zip(res, op[1]))
        res = self._np(*ins, **np_kwargs)
        return wrap(res) if self.nout > 1 else _new(np.asarray(res))

    def outer(self, A, B, **kwargs):
        A = _as_device(A)
        B = _as_device(B)
        ndim_a, ndim_b = A.ndim, B.ndim
        A = A.reshape(A.shape + (1,) * ndim_b)
        B = B.reshape((1,) * ndim_a + B.shape)
        return self(A, B, **kwargs)

    def at(self, a, indices, b=None):
        if self._scatter_op is None:
            raise NotImplementedError(f"`{self.name}.at` is not supported yet")
        scatter_op(a, indices, b, self._scatter_op)

    def reduce(self, array, axis=0, dtype=None, out=None, keepdims=False):
        if self.name == "cupy_add":
            return array.sum(axis, dtype, out, keepdims)
        if self.name == "cupy_multiply":
            return array.prod(axis, dtype, out, keepdims)
        raise NotImplementedError(f"`{self.name}.reduce` is not supported yet")

    def accumulate(self, array, axis=0, dtype=None, out=None):
        if self.name == "cupy_add":
            return array.cumsum(axis, dtype, out)
        if self.name == "cupy_multiply":
            return array.cumprod(axis, dtype, out)
        raise NotImplementedError(f"`{self.name}.accumulate` is not supported yet")

    def reduceat(self, array, indices, axis=0, dtype=None, out=None):
        if self.name == "cupy_add":
            return array._add_reduceat(indices, axis, dtype, out)
        raise NotImplementedError(f"`{self.name}.reduceat` is not supported yet")


ufunc.__module__ = "cupy._core._kernel"


def _as_device(x):
    """core.array(x): a device array from a device array, host array or Python value."""
    if type(x) is ndarray:
        return x
    arr = np.array(unwrap(x))
    return _new(arr)


# ------------------------------------------------------------- operator slots
def _binary(name, reflected=False, inplace=False):
    def op(self, other):
        from . import _sim_registry

        f = _sim_registry.ufunc(name)
        if inplace:
            return f(self, other, out=self)
        return f(other, self) if reflected else f(self, other)

    op.__name__ = name
    return op


for _slot, _uf in [("add", "add"), ("sub", "subtract"), ("mul", "multiply"),
                   ("truediv", "true_divide"), ("floordiv", "floor_divide"),
                   ("mod", "remainder"), ("pow", "power"), ("lshift", "left_shift"),
                   ("rshift", "right_shift"), ("and", "bitwise_and"), ("or", "bitwise_or"),
                   ("xor", "bitwise_xor"), ("matmul", "matmul")]:
    setattr(ndarray, f"__{_slot}__", _binary(_uf))
    setattr(ndarray, f"__r{_slot}__", _binary(_uf, reflected=True))
    if _slot != "matmul":
        setattr(ndarray, f"__i{_slot}__", _binary(_uf, inplace=True))
ndarray.__idiv__ = ndarray.__itruediv__
ndarray.__div__ = ndarray.__truediv__
for _slot, _uf in [("eq", "equal"), ("ne", "not_equal"), ("lt", "less"), ("le", "less_equal"),
                   ("gt", "greater"), ("ge", "greater_equal")]:
    setattr(ndarray, f"__{_slot}__", _binary(_uf))


def _unary(name):
    def op(self):
        from . import _sim_registry

        return _sim_registry.ufunc(name)(self)

    return op


ndarray.__neg__ = _unary("negative")
ndarray.__pos__ = _unary("positive")
ndarray.__abs__ = _unary("absolute")
ndarray.__invert__ = _unary("invert")


def _divmod(self, other):
    from . import _sim_registry

    return _sim_registry.ufunc("divmod")(self, other)


def _rdivmod(self, other):
    from . import _sim_registry

    return _sim_registry.ufunc("divmod")(other, self)


ndarray.__divmod__ = _divmod
ndarray.__rdivmod__ = _rdivmod


# ------------------------------------------------------------ method factory
def check_signature(qualname, signature, args, kwargs, skip_self=False):
    """Raise TypeError as real CuPy would for keywords/positionals its function lacks."""
    if signature is None:
        return
    params = signature[1:] if skip_self else signature
    names = {p[0] for p in params if p[1] in ("POSITIONAL_OR_KEYWORD", "KEYWORD_ONLY")}
    if not any(p[1] == "VAR_KEYWORD" for p in params):
        for k in kwargs:
            if k not in names:
                raise TypeError(f"{qualname}() got an unexpected keyword argument '{k}'")
    if not any(p[1] == "VAR_POSITIONAL" for p in params):
        npos = sum(1 for p in params if p[1] in ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD"))
        if len(args) > npos:
            raise TypeError(f"{qualname}() takes at most {npos} positional arguments "
                            f"({len(args)} given)")


# Methods and functions whose result size depends on the data: CuPy counts on the device
# and reads the count back (a synchronisation) before it allocates the result.
SYNCING = frozenset({"nonzero", "argwhere", "flatnonzero", "compress", "extract", "unique", "unique_all",
                     "unique_counts", "unique_inverse", "unique_values", "intersect1d", "setdiff1d",
                     "setxor1d", "union1d", "trim_zeros", "bincount", "histogram", "histogram2d",
                     "histogramdd"})


def _generic_method(name, signature):
    np_method = getattr(np.ndarray, name)
    syncs = name in SYNCING

    def method(self, *args, **kwargs):
        if syncs:
            note_transfer(f"ndarray.{name}", self._a)
        check_signature(f"cupy.ndarray.{name}", signature, args, kwargs, skip_self=True)
        out = kwargs.get("out")
        if out is not None and type(out) is not ndarray:
            raise TypeError(f"Unsupported type {type(out)}")
        res = np_method(self._a, *unwrap(args, f"cupy.ndarray.{name}"),
                        **unwrap(kwargs, f"cupy.ndarray.{name}"))
        if out is not None:
            return out
        return wrap(res)

    method.__name__ = name
    return method


def _install_methods():
    members = API["classes"]["ndarray"]
    defined = set(vars(ndarray))
    for name, info in members.items():
        if info["kind"] != "method" or name in defined:
            continue
        if hasattr(np.ndarray, name) and not name.startswith("_"):
            setattr(ndarray, name, _generic_method(name, info["signature"]))
        else:
            setattr(ndarray, name, _unsupported(f"cupy.ndarray.{name}"))
    # NumPy methods real CuPy lacks must not be reachable
    for name in list(vars(ndarray)):
        if name.startswith("__") or name in members or name.startswith("_"):
            continue
        if name in ("get", "set"):
            continue
        delattr(ndarray, name)


_install_methods()
