"""Record the public surface of a real CuPy install into cupy_api.json.

Run with a Python that has CuPy (no GPU needed), from a directory that does not shadow
the ``cuda`` namespace package (not the repository root, which has a ``cuda/`` folder):

    cd /tmp && /tmp/cupyvenv/bin/python /work/main/tests/cupy_sim/record_cupy_api.py

The simulated cupy (tests/cupy_sim/cupy) exposes exactly the names recorded here and
checks keyword arguments against the recorded signatures.
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
import sys
import types
from pathlib import Path

import numpy

MODULES = [
    "cupy", "cupy.random", "cupy.fft", "cupy.linalg", "cupy.cuda", "cupy.cuda.runtime",
    "cupy.lib", "cupy.lib.stride_tricks", "cupyx", "cupyx.scipy", "cupyx.scipy.special",
]
CLASSES = {
    "ndarray": "cupy.ndarray",
    "RandomState": "cupy.random.RandomState",
    "Generator": "cupy.random.Generator",
    "Device": "cupy.cuda.Device",
    "Stream": "cupy.cuda.Stream",
}


def signature_of(obj):
    """[(name, kind, has_default)] or None when unknown."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        sig = None
    if sig is None:
        doc = (getattr(obj, "__doc__", None) or "").strip().splitlines()
        m = re.match(r"[\w.]+\((.*)\)", doc[0]) if doc else None
        if not m:
            return None
        try:
            sig = inspect.signature(eval(f"lambda {m.group(1)}: None", {}))  # noqa: S307
        except Exception:
            return None
    return [(p.name, p.kind.name, p.default is not inspect.Parameter.empty)
            for p in sig.parameters.values()]


def describe(module_name, name, obj):
    np_obj = getattr(numpy, name, None)
    if isinstance(obj, types.ModuleType):
        return {"kind": "module", "module": obj.__name__}
    if type(obj).__name__ == "ufunc" and type(obj).__module__.startswith("cupy"):
        return {"kind": "ufunc", "nin": obj.nin, "nout": obj.nout, "types": list(obj.types),
                "scatter_op": obj._scatter_op}
    if module_name == "cupy" and np_obj is obj:
        return {"kind": "numpy_same"}
    if isinstance(obj, type):
        return {"kind": "class", "module": obj.__module__,
                "numpy_same": np_obj is obj or issubclass(obj, numpy.generic)}
    if callable(obj):
        return {"kind": "function", "signature": signature_of(obj)}
    if isinstance(obj, (int, float, str, bool)) or obj is None:
        return {"kind": "constant", "value": obj}
    return {"kind": "object", "type": type(obj).__name__}


def main():
    out = {"version": None, "modules": {}, "classes": {}}
    import cupy

    out["version"] = cupy.__version__
    for mod_name in MODULES:
        mod = importlib.import_module(mod_name)
        entries = {}
        for name in dir(mod):
            if name.startswith("__") and name not in ("__version__",):
                continue
            try:
                obj = getattr(mod, name)
            except Exception as exc:  # pragma: no cover
                entries[name] = {"kind": "error", "error": str(exc)}
                continue
            entries[name] = describe(mod_name, name, obj)
        out["modules"][mod_name] = entries
    for key, path in CLASSES.items():
        mod_name, _, cls_name = path.rpartition(".")
        cls = getattr(importlib.import_module(mod_name), cls_name)
        members = {}
        for name in dir(cls):
            if name.startswith("__") and name.endswith("__"):
                members[name] = {"kind": "dunder"}
                continue
            obj = getattr(cls, name)
            if isinstance(obj, property) or type(obj).__name__ == "getset_descriptor":
                members[name] = {"kind": "property"}
            elif callable(obj):
                members[name] = {"kind": "method", "signature": signature_of(obj)}
            else:
                members[name] = {"kind": "attribute"}
        out["classes"][key] = members
    path = Path(__file__).with_name("cupy_api.json")
    path.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"wrote {path} (CuPy {cupy.__version__})", file=sys.stderr)


if __name__ == "__main__":
    main()
