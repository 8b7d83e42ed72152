"""Fills the simulated cupy / cupyx modules with exactly the names real CuPy 14.2 has
(tests/cupy_sim/cupy_api.json), each implemented by delegating to NumPy with device
arrays unwrapped and results wrapped, or by a stub that says it is not simulated."""

from __future__ import annotations

import math
import sys
import types

import numpy as np

from . import _sim
from ._sim import (API, SimulationUnsupportedError, _new, _unsupported, check_dtype,
                   check_signature, ndarray, unwrap, wrap)

_UFUNCS: dict[str, _sim.ufunc] = {}
_FUNCTIONS: dict[tuple[str, str], object] = {}  # (module, name) -> simulated function

# Functions of real CuPy that take host arrays (they copy to the device themselves).
# (ascontiguousarray / asfortranarray do not: their argument is a typed device array.)
_TAKES_HOST = {"array", "asarray", "asanyarray", "asnumpy", "get_array_module", "result_type", "can_cast",
               "isscalar", "shape", "ndim", "size", "min_scalar_type", "copyto", "isdtype"}

# NumPy names for CuPy names NumPy 2 no longer has
_ALIASES = {"float_": np.float64, "complex_": np.complex128, "cfloat": np.complex128,
            "singlecomplex": np.complex64}


# --------------------------------------------------------------- ufunc lookup
def ufunc(name: str):
    """What CuPy's __array_ufunc__ finds for a NumPy ufunc name: cupy.<name>, else
    cupyx.scipy.special.<name> (any callable, e.g. the matmul gufunc)."""
    found = _UFUNCS.get(name)
    if found is not None:
        return found
    cp = sys.modules.get("cupy")
    f = getattr(cp, name, None) if cp is not None else None
    if f is None or isinstance(f, types.ModuleType):
        f = _UFUNCS.get("special." + name)
    return f


def function_for(np_func):
    """The simulated CuPy function NumPy's __array_function__ protocol would dispatch to
    (same module path under cupy, same name), or None (NumPy then raises TypeError)."""
    module = getattr(np_func, "__module__", "") or ""
    parts = module.split(".")[1:]
    # numpy._core.fromnumeric etc. are exposed at the top level
    mod = "cupy" if not parts or parts[0].startswith("_") else "cupy." + ".".join(parts)
    return _FUNCTIONS.get((mod, np_func.__name__))


# ----------------------------------------------------------- special values
def _erf(x):
    return _np_vectorized(math.erf, x)


def _erfc(x):
    return _np_vectorized(math.erfc, x)


def _np_vectorized(fn, x):
    x = np.asarray(x)
    out_dtype = x.dtype if x.dtype.kind == "f" else np.float64
    if x.dtype == np.float16:
        out_dtype = np.float16
    flat = np.fromiter((fn(float(v)) for v in x.reshape(-1)), dtype=np.float64, count=x.size)
    return flat.reshape(x.shape).astype(out_dtype)


class _PyUfunc:
    """A NumPy-ufunc-like object for special functions NumPy lacks."""

    def __init__(self, name, fn, nin=1, nout=1):
        self.__name__ = name
        self._fn = fn
        self.nin = nin
        self.nout = nout

    def __call__(self, *args, out=None, dtype=None, casting=None, where=None):
        res = self._fn(*args)
        if dtype is not None:
            res = res.astype(dtype)
        if out is not None:
            target = out[0] if isinstance(out, tuple) else out
            np.copyto(target, res, casting="unsafe")
            return target
        return res


_SPECIAL = {"erf": _PyUfunc("erf", _erf), "erfc": _PyUfunc("erfc", _erfc)}


# -------------------------------------------------------------- functions
def _generic_function(qualname: str, np_func, signature, strict: bool):
    syncs = qualname.rpartition(".")[2] in _sim.SYNCING

    def f(*args, **kwargs):
        if syncs:
            _sim.note_transfer(qualname)
        check_signature(qualname, signature, args, kwargs)
        out = kwargs.get("out")
        if out is not None and type(out) is not ndarray and not isinstance(out, tuple):
            raise TypeError(f"{qualname}: out must be a cupy.ndarray, got {type(out)}")
        a = unwrap(args, qualname if strict else None)
        k = unwrap(kwargs, qualname if strict else None)
        res = np_func(*a, **k)
        if out is not None:
            return out
        return wrap(res)

    f.__name__ = qualname.rpartition(".")[2]
    f.__qualname__ = qualname
    return f


def _garbage(res):
    _sim._garbage_fill(res._a)
    return res


def _array(obj, dtype=None, copy=True, order="K", subok=False, ndmin=0, *, blocking=False):
    return _to_device(obj, dtype, copy, order, ndmin)


def _asarray(a, dtype=None, order=None, *, copy=None, blocking=False):
    return _to_device(a, dtype, False if copy is None else copy, order or "K", 0)


def _asanyarray(a, dtype=None, order=None, *, blocking=False):
    return _asarray(a, dtype, order)


def _device_only(name, a):
    # CuPy: cpdef _ndarray_base ascontiguousarray(_ndarray_base a, dtype=*) -- a typed
    # Cython argument, so anything but a device array is a TypeError (no host copy)
    if type(a) is not ndarray:
        raise TypeError(f"Argument 'a' has incorrect type (expected cupy._core.core._ndarray_base, got "
                        f"{type(a).__name__}) (simulated CuPy: cupy.{name} takes device arrays only; "
                        "use cupy.asarray for host data)")


def _ascontiguousarray(a, dtype=None):
    _device_only("ascontiguousarray", a)
    if a._a.flags.c_contiguous and (dtype is None or np.dtype(dtype) == a.dtype):
        return a  # CuPy returns the array itself when no copy is needed
    r = _asarray(a, dtype)
    return r if r._a.flags.c_contiguous else _new(np.ascontiguousarray(r._a))


def _asfortranarray(a, dtype=None):
    _device_only("asfortranarray", a)
    r = _asarray(a, dtype)
    return _new(np.asfortranarray(r._a))


def _leaves(obj):
    if isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _leaves(o)
    else:
        yield obj


def _to_device(obj, dtype, copy, order, ndmin):
    if dtype is not None:
        dtype = check_dtype(dtype)
    if type(obj) is ndarray:
        a = obj._a
        if dtype is not None and a.dtype != dtype:
            a = a.astype(dtype)
        elif copy:
            a = a.copy(order="C" if order in ("K", "A", None) else order)
        r = _new(a)
    elif isinstance(obj, (list, tuple)) and any(type(x) is ndarray for x in _leaves(obj)):
        # CuPy concatenates a nested sequence of device arrays on the device -- only when
        # every leaf is a device array of one shape and dtype; otherwise it hands the
        # sequence to NumPy, which refuses the device arrays.
        leaves = list(_leaves(obj))
        if not all(type(x) is ndarray for x in leaves) or \
                len({(x.shape, x.dtype) for x in leaves}) != 1:
            raise TypeError(_sim._IMPLICIT)
        a = np.array(unwrap(obj), dtype=dtype)
        r = _new(a)
    else:
        if hasattr(obj, "__cuda_array_interface__"):
            raise SimulationUnsupportedError("simulated CuPy: __cuda_array_interface__ import")
        a = np.array(obj, dtype=dtype, copy=True, order=order)
        if a.dtype.kind in "US":
            raise ValueError(f"Unsupported dtype {a.dtype}")
        r = _new(a)
    if ndmin > r.ndim:
        r = _new(r._a.reshape((1,) * (ndmin - r.ndim) + r.shape))
    return r


def _asnumpy(a, stream=None, order="C", out=None, *, blocking=True):
    if type(a) is ndarray:
        return a.get(stream=stream, order=order, out=out, blocking=blocking)
    if hasattr(a, "__cuda_array_interface__"):
        raise SimulationUnsupportedError("simulated CuPy: asnumpy of a foreign device array")
    a = np.asarray(a, order=order)
    if out is not None:
        out[...] = a
        return out
    return a


def _get_array_module(*args):
    for a in args:
        if type(a) is ndarray:
            return sys.modules["cupy"]
    return np


def _from_dlpack(array, *, device=None, copy=None):
    if type(array) is ndarray:
        return array if not copy else array.copy()
    dev = getattr(array, "__dlpack_device__", None)
    if dev is None:
        raise TypeError("from_dlpack: the object does not support DLPack")
    kind = int(dev()[0])
    if kind == 1:  # kDLCPU
        if copy is False:
            raise BufferError("from_dlpack: a host array cannot be imported without a copy")
        host = np.from_dlpack(array)
        if copy is None:
            raise BufferError("CuPy from_dlpack: the producer is on the host (kDLCPU); "
                              "pass copy=True to copy it to the GPU")
        return _new(np.array(host))
    raise SimulationUnsupportedError("simulated CuPy: from_dlpack of another library's "
                                     "device array")


def _empty(shape, dtype=float, order="C"):
    return _garbage(_new(np.empty(shape, check_dtype(dtype), order=order)))


def _empty_like(prototype, dtype=None, order="K", subok=None, shape=None):
    if type(prototype) is not ndarray:
        raise TypeError(f"Unsupported type {type(prototype)}")
    return _garbage(_new(np.empty_like(prototype._a, dtype=None if dtype is None else
                                       check_dtype(dtype), order=order, shape=shape)))


def _take(a, indices, axis=None, out=None):
    if type(a) is not ndarray:
        raise TypeError(f"Unsupported type {type(a)}")
    return a.take(indices, axis, out)


def _take_along_axis(a, indices, axis):
    if type(a) is not ndarray or type(indices) is not ndarray:
        raise TypeError("take_along_axis: arguments must be cupy arrays")
    if indices.dtype.kind not in "iu":
        raise IndexError("`indices` must be an integer array")
    A = a._a
    I = indices._a
    if axis is None:
        A = A.reshape(-1)
        axis = 0
    axis = axis % A.ndim if A.ndim else 0
    if A.ndim != I.ndim:
        raise ValueError("`indices` and `a` must have the same number of dimensions")
    n = A.shape[axis]
    if n and I.size:
        I = np.mod(I.astype(np.int64), n)
    return _new(np.take_along_axis(A, I, axis))


def _ravel_multi_index(multi_index, dims, mode="wrap", order="C"):
    idx = tuple(unwrap(m, "cupy.ravel_multi_index") for m in multi_index)
    return wrap(np.ravel_multi_index(idx, dims, mode=mode, order=order))


def _sort(a, axis=-1, kind=None):
    if type(a) is not ndarray:
        raise TypeError(f"Unsupported type {type(a)}")
    return _new(np.sort(a._a, axis=axis, kind="stable"))


def _argsort(a, axis=-1, kind=None):
    if type(a) is not ndarray:
        raise TypeError(f"Unsupported type {type(a)}")
    return _new(np.argsort(a._a, axis=axis, kind="stable"))


def _searchsorted(a, v, side="left", sorter=None):
    if type(a) is not ndarray:
        raise NotImplementedError("Only int or ndarray are supported for a")
    if type(v) is not ndarray and not isinstance(v, (int, float, complex)):
        raise NotImplementedError("Only python scalars or ndarrays are supported for v")
    if a.ndim > 1:
        raise ValueError("object too deep for desired array")
    if a.ndim < 1:
        raise ValueError("object of too small depth for desired array")
    return wrap(np.searchsorted(a._a, unwrap(v), side=side, sorter=unwrap(sorter)))


def _bincount(x, weights=None, minlength=None):
    if type(x) is not ndarray:
        raise TypeError(f"Unsupported type {type(x)}")
    if x.ndim > 1:
        raise ValueError("object too deep for desired array")
    if x.ndim < 1:
        raise ValueError("object of too small depth for desired array")
    if x.dtype.kind == "f":
        raise TypeError("x must be int array")
    _sim.note_transfer("cupy.bincount (reads max(x))", x._a)
    return wrap(np.bincount(x._a, weights=unwrap(weights, "cupy.bincount"),
                            minlength=0 if minlength is None else int(minlength)))


def _copyto(dst, src, casting="same_kind", where=None):
    if type(dst) is not ndarray:
        raise TypeError(f"copyto: dst must be a cupy.ndarray, got {type(dst)}")
    if isinstance(src, np.ndarray):
        if src.size != 1:
            raise ValueError("non-scalar numpy.ndarray cannot be used for copyto")
        src = src.reshape(())[()]
    np.copyto(dst._a, unwrap(src, "cupy.copyto"), casting=casting,
              where=True if where is None else _sim._kernel_arg(where, "cupy.copyto"))


def _where(condition, x=None, y=None):
    if (x is None) != (y is None):
        raise ValueError("Must provide both 'x' and 'y' or neither.")
    if x is None:
        _sim.note_transfer("cupy.where(condition) (nonzero)")
        return wrap(np.nonzero(unwrap(condition, "cupy.where")))
    c, xx, yy = (_sim._kernel_arg(v, "cupy.where") for v in (condition, x, y))
    return wrap(np.where(c, xx, yy))


def _result_type(*arrays_and_dtypes):
    return np.result_type(*[a._a.dtype if type(a) is ndarray else a for a in arrays_and_dtypes])


def _as_strided(x, shape=None, strides=None):
    if type(x) is not ndarray:
        raise TypeError(f"Unsupported type {type(x)}")
    return _new(np.lib.stride_tricks.as_strided(x._a, shape=shape, strides=strides))


def _sliding_window_view(x, window_shape, axis=None, *, subok=False, writeable=False):
    if type(x) is not ndarray:
        raise TypeError(f"Unsupported type {type(x)}")
    return _new(np.lib.stride_tricks.sliding_window_view(x._a, window_shape, axis=axis,
                                                         writeable=writeable))


def _scatter(op):
    def f(a, slices, value):
        _sim.scatter_op(a, slices, value, op)

    f.__name__ = "scatter_" + op
    return f


_OVERRIDES = {
    "cupy": {
        "array": _array, "asarray": _asarray, "asanyarray": _asanyarray,
        "ascontiguousarray": _ascontiguousarray, "asfortranarray": _asfortranarray,
        "asnumpy": _asnumpy, "get_array_module": _get_array_module,
        "from_dlpack": _from_dlpack, "fromDlpack": _from_dlpack, "empty": _empty,
        "empty_like": _empty_like, "take": _take, "take_along_axis": _take_along_axis,
        "ravel_multi_index": _ravel_multi_index, "sort": _sort, "argsort": _argsort,
        "searchsorted": _searchsorted, "bincount": _bincount, "copyto": _copyto,
        "where": _where, "result_type": _result_type, "ndarray": ndarray,
        "ufunc": _sim.ufunc, "flatiter": _sim.flatiter, "is_available": lambda: True,
    },
    "cupy.lib.stride_tricks": {"as_strided": _as_strided,
                               "sliding_window_view": _sliding_window_view},
    "cupyx": {"scatter_add": _scatter("add"), "scatter_max": _scatter("max"),
              "scatter_min": _scatter("min")},
}


def _numpy_target(modname: str, name: str):
    """The NumPy object behind cupy[.sub].name, or None."""
    sub = modname.split(".", 1)[1] if "." in modname else ""
    if modname.startswith("cupyx"):
        return None
    base = np
    for part in sub.split(".") if sub else ():
        base = getattr(base, part, None)
        if base is None:
            return None
    return getattr(base, name, None)


def _kernel_class(name):
    class Kernel:
        def __init__(self, *args, **kwargs):
            raise SimulationUnsupportedError(
                f"simulated CuPy: cupy.{name} cannot compile or launch CUDA code "
                "(GPUKERNELS_SIMULATE_CUDA=1 runs on the CPU); the hand-written CUDA kernels "
                "are exercised by tests/gpu with the CUDA emulator instead")

    Kernel.__name__ = Kernel.__qualname__ = name
    Kernel.__module__ = "cupy._core.raw"
    return Kernel


def _stub_module(fullname):
    mod = types.ModuleType(fullname)

    def __getattr__(attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise SimulationUnsupportedError(f"simulated CuPy: {fullname}.{attr} is not simulated")

    mod.__getattr__ = __getattr__
    return mod


def populate(namespace: dict, modname: str, extra: dict | None = None) -> None:
    """Define in namespace every public name real CuPy's module modname has."""
    entries = API["modules"][modname]
    overrides = dict(_OVERRIDES.get(modname, {}))
    overrides.update(extra or {})
    for name, info in entries.items():
        if name.startswith("_") and name not in overrides and name != "__version__":
            continue
        kind = info["kind"]
        if name in overrides:
            obj = overrides[name]
            if callable(obj) and kind == "function" and not isinstance(obj, type):
                _FUNCTIONS[(modname, name)] = obj
            namespace[name] = obj
            continue
        if kind == "constant":
            namespace[name] = info["value"]
        elif kind == "numpy_same":
            namespace[name] = getattr(np, name)
        elif kind == "module":
            if name in namespace:
                continue
            namespace[name] = _stub_module(f"{modname}.{name}")
        elif kind == "ufunc":
            np_uf = getattr(np, name, None) if modname == "cupy" else None
            if modname == "cupy" and np_uf is None and name == "divmod":
                np_uf = np.divmod
            if np_uf is None:
                np_uf = _SPECIAL.get(name)
            if np_uf is None:
                namespace[name] = _unsupported(f"{modname}.{name}")
                continue
            uf = _sim.ufunc(name, np_uf, info)
            _UFUNCS[name if modname == "cupy" else "special." + name] = uf
            namespace[name] = uf
        elif kind == "class":
            target = _ALIASES.get(name) or (getattr(np, name, None) if info["numpy_same"] else None)
            if target is None and info["module"].startswith("numpy"):
                target = getattr(np, name, None) or getattr(np.exceptions, name, None) or \
                    getattr(np.linalg, name, None)
            if target is None and name in ("RawModule", "RawKernel", "ElementwiseKernel",
                                           "ReductionKernel"):
                target = _kernel_class(name)
            namespace[name] = target if target is not None else _unsupported(f"{modname}.{name}")
        elif kind == "function":
            np_obj = _numpy_target(modname, name)
            if np_obj is None or not callable(np_obj):
                namespace[name] = _unsupported(f"{modname}.{name}")
                continue
            f = _generic_function(f"{modname}.{name}", np_obj, info["signature"],
                                  strict=name not in _TAKES_HOST)
            _FUNCTIONS[(modname, name)] = f
            namespace[name] = f
        else:
            namespace[name] = _unsupported(f"{modname}.{name}")
    # names real CuPy's module does not have must not be reachable
    for name in list(namespace):
        if not name.startswith("_") and name not in entries:
            value = namespace[name]
            if isinstance(value, types.ModuleType) and value.__name__ == f"{modname}.{name}":
                continue  # a submodule real CuPy imports lazily (cupyx.scipy.special)
            del namespace[name]
