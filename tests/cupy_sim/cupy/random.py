"""Simulated cupy.random: RandomState / Generator backed by NumPy's generators (the
streams differ from cuRAND's, as they would between any two GPUs' libraries; only the
API and the dtypes are CuPy's)."""

from __future__ import annotations

import numpy as _np

from . import _sim as _s
from ._sim_registry import populate as _populate

# methods whose NumPy counterpart takes dtype itself
_NUMPY_HAS_DTYPE = {("RandomState", "randint"), ("Generator", "random"),
                    ("Generator", "integers"), ("Generator", "standard_normal"),
                    ("Generator", "standard_exponential"), ("Generator", "standard_gamma")}
_FLOAT_ONLY = {"random_sample", "rand", "randn", "normal", "uniform", "standard_normal",
               "random", "standard_exponential", "standard_gamma", "lognormal"}


def _seed(seed):
    if seed is None:
        return None
    if isinstance(seed, (int, _np.integer)):
        return int(seed) & 0xFFFFFFFF
    if type(seed).__name__ == "ndarray" and type(seed).__module__ == "cupy":
        return int(seed.get().reshape(-1)[0]) & 0xFFFFFFFF
    return abs(hash(bytes(_np.asarray(seed)))) & 0xFFFFFFFF


def _method(cls_name, name, signature):
    def method(self, *args, **kwargs):
        _s.check_signature(f"cupy.random.{cls_name}.{name}", signature, args, kwargs,
                        skip_self=True)
        np_method = getattr(self._np, name, None)
        if np_method is None:
            raise NotImplementedError(f"simulated CuPy: {cls_name}.{name} is not simulated")
        dtype = None
        if "dtype" in kwargs and (cls_name, name) not in _NUMPY_HAS_DTYPE:
            dtype = kwargs.pop("dtype")
        if name in ("rand", "randn") and kwargs:
            raise TypeError(f"{name}() got unexpected keyword arguments {list(kwargs)}")
        if dtype is not None:
            dtype = _s.check_dtype(dtype)
            if name in _FLOAT_ONLY and dtype.kind != "f":
                raise TypeError(f"cupy.random {name}: dtype must be float32 or float64, got "
                                f"{dtype}")
        res = np_method(*_s.unwrap(args, f"cupy.random.{name}"),
                        **_s.unwrap(kwargs, f"cupy.random.{name}"))
        res = _np.asarray(res)
        if dtype is not None:
            res = res.astype(dtype)
        elif res.dtype == _np.float64 and name in _FLOAT_ONLY:
            pass
        return _s._new(res)

    method.__name__ = name
    return method


class RandomState:
    """Simulated cupy.random.RandomState."""

    def __init__(self, seed=None, method=None):
        self._np = _np.random.RandomState(_seed(seed))

    def seed(self, seed=None):
        self._np.seed(_seed(seed))


class _Generator:
    """What simulated cupy.random.default_rng returns."""

    def __init__(self, seed=None):
        self._np = _np.random.default_rng(_seed(seed))


for _cls, _key in ((RandomState, "RandomState"), (_Generator, "Generator")):
    for _name, _info in _s.API["classes"][_key].items():
        if _info["kind"] != "method" or _name.startswith("_") or _name in vars(_cls):
            continue
        setattr(_cls, _name, _method(_key, _name, _info["signature"]))
RandomState.__module__ = "cupy.random._generator"
_Generator.__module__ = "cupy.random._generator_api"

_state = [None]


def get_random_state():
    if _state[0] is None:
        _state[0] = RandomState()
    return _state[0]


def set_random_state(rs):
    _state[0] = rs


def reset_states():
    _state[0] = None


def default_rng(seed=None):
    return _Generator(seed)


def seed(seed=None):
    get_random_state().seed(seed)


def _module_function(name, signature):
    def f(*args, **kwargs):
        method = getattr(get_random_state(), name, None)
        if method is None:
            raise NotImplementedError(f"simulated CuPy: cupy.random.{name} is not simulated")
        return method(*args, **kwargs)

    f.__name__ = name
    return f


_extra = {"RandomState": RandomState, "get_random_state": get_random_state,
          "set_random_state": set_random_state, "reset_states": reset_states,
          "default_rng": default_rng, "seed": seed}
for _name, _info in _s.API["modules"]["cupy.random"].items():
    if _info["kind"] == "function" and _name not in _extra and not _name.startswith("_"):
        alias = {"random": "random_sample", "ranf": "random_sample", "sample": "random_sample"}
        _extra[_name] = _module_function(alias.get(_name, _name), _info["signature"])
_populate(globals(), "cupy.random", extra=_extra)
del _populate, _extra
