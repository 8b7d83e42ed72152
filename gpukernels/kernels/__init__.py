"""All kernel classes.  Every module under this package is imported once, on first use
of the registry, and registers its classes; ``gpukernels.kernels.Gemm`` and
``from gpukernels.kernels import Conv`` find a class by its operator name (the default
ONNX domain first, then the others)."""

from __future__ import annotations

from ._loader import load_all
from .base import KernelBase, KernelContext, has_kernel, lookup, register, registered


def kernel_class(op_type: str, domain: str | None = None) -> type:
    """The newest-version kernel class for op_type (searching all domains when None)."""
    load_all()
    from .base import _REGISTRY

    keys = [(domain, op_type)] if domain is not None else \
        [k for k in sorted(_REGISTRY, key=lambda k: (k[0] != "", k[0])) if k[1] == op_type]
    for key in keys:
        table = _REGISTRY.get(key)
        if table:
            return table[max(table)]
    raise AttributeError(f"gpukernels.kernels has no kernel named {op_type!r}")


def __getattr__(name: str):
    if name.startswith("_"):
        raise AttributeError(name)
    return kernel_class(name)


__all__ = ["KernelBase", "KernelContext", "register", "lookup", "has_kernel", "registered",
           "load_all", "kernel_class"]
