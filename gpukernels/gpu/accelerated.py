"""Operators with a hand-written CUDA path.

``register(op_type)`` marks a function ``fn(kernel, **arguments) -> result | None`` as
the CUDA path of an operator; it returns None when it does not cover the case (the
kernel then runs its array-namespace code on the GPU).  Kernels reach it through
``KernelBase.cuda_path``.
"""

from __future__ import annotations

import importlib
import sys

_IMPLS: dict[str, object] = {}
# op_type -> module that registers it when imported (kept lazy: importing compiles nothing)
_MODULES = {
    "Conv": "gpukernels.gpu.conv",
    "Attention": "gpukernels.gpu.attention",
    "LinearAttention": "gpukernels.gpu.linear_attention",
    "RotaryEmbedding": "gpukernels.gpu.rotary_embedding",
}

# How many times each CUDA path ran (tests use it to prove the kernel, not the fallback, ran).
launch_counts: dict[str, int] = {}


def register(op_type: str):
    def decorate(fn):
        _IMPLS[op_type] = fn
        return fn

    return decorate


def get(op_type: str):
    if getattr(sys.modules.get("cupy"), "__gpukernels_simulated__", False):
        return None  # the CPU simulation of CuPy (tests/cupy_sim) cannot run CUDA kernels
    if op_type not in _IMPLS and op_type in _MODULES:
        try:
            importlib.import_module(_MODULES[op_type])
        except ModuleNotFoundError:
            return None
    return _IMPLS.get(op_type)


def operators() -> list[str]:
    return sorted(_MODULES)
