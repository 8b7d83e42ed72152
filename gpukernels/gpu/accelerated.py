"""Operators with a hand-written CUDA path.

``register(op_type)`` marks a function ``fn(kernel, **arguments) -> result | None`` as
the CUDA path of an operator; it returns None when it does not cover the case (the
kernel then runs its array-namespace code on the GPU).  Kernels reach it through
``KernelBase.cuda_path``.

The hand-written kernels use sm_80 features (cp.async, bf16 tensor cores): on an older
GPU (compute capability below 8.0) every registered path steps aside for the array code,
as ``gpukernels info`` reports (``paths``).
"""

from __future__ import annotations

import functools
import importlib

_IMPLS: dict[str, object] = {}
# op_type -> module that registers it when imported (kept lazy: importing compiles nothing)
_MODULES = {
    "Conv": "gpukernels.gpu.conv",
    "Attention": "gpukernels.gpu.attention",
    "LinearAttention": "gpukernels.gpu.linear_attention",
    "RotaryEmbedding": "gpukernels.gpu.rotary_embedding",
}

# The oldest GPU the hand-written kernels run on (major * 10 + minor).
MIN_COMPUTE_CAPABILITY = 80


def register(op_type: str):
    """Register fn as op_type's CUDA path.  The registered entry first checks the kernel's
    GPU (``kernels_supported``): below sm_80 it returns None (the array code runs), or
    raises CudaKernelError when the context demands the kernels (cuda_kernels='always').
    The module keeps fn itself (the emulator and the GPU check call it directly)."""

    def decorate(fn):
        @functools.wraps(fn)
        def checked(kernel, **arguments):
            ok, why = kernels_supported(kernel.device)
            if not ok:
                if kernel.ctx.settings.cuda_kernels == "always":
                    from ..errors import CudaKernelError

                    raise CudaKernelError(f"{op_type}: {why} (options cuda_kernels='always')")
                return None
            return fn(kernel, **arguments)

        _IMPLS[op_type] = checked
        return fn

    return decorate


def _compute_capability(index: int):
    from ..xp import compute_capability

    return compute_capability(index)


@functools.lru_cache(maxsize=None)
def kernels_supported(device) -> tuple[bool, str]:
    """(whether the hand-written CUDA kernels run on device, why not).  Never raises."""
    cc = _compute_capability(getattr(device, "index", 0))
    if cc is None:
        return False, f"{device} is not a usable GPU"
    if cc < MIN_COMPUTE_CAPABILITY:
        return False, (f"the hand-written CUDA kernels need compute capability "
                       f"{MIN_COMPUTE_CAPABILITY // 10}.{MIN_COMPUTE_CAPABILITY % 10} (sm_{MIN_COMPUTE_CAPABILITY}) "
                       f"or newer; {device} is sm_{cc}")
    return compiler_status()


def compiler_status() -> tuple[bool, str]:
    """(whether CuPy can compile the CUDA sources here, why not): NVRTC must load (a CuPy
    without its CUDA toolkit libraries, or the CPU simulation of CuPy, cannot)."""
    try:
        import cupy

        cupy.cuda.nvrtc.getVersion()
    except Exception as exc:  # noqa: BLE001 -- any failure means: no compiler
        return False, f"CuPy cannot compile CUDA sources here (NVRTC: {exc})"
    return True, ""


def paths(device) -> str:
    """Which code runs on device, in words (for ``gpukernels info``)."""
    ok, why = kernels_supported(device)
    if ok:
        return f"hand-written CUDA kernels for {', '.join(operators())}; CuPy array code for the rest"
    return f"CuPy array code only ({why})"


def get(op_type: str):
    """op_type's registered CUDA path (checking the GPU before it runs), or None."""
    if op_type not in _IMPLS and op_type in _MODULES:
        try:
            importlib.import_module(_MODULES[op_type])
        except ModuleNotFoundError:
            return None
    return _IMPLS.get(op_type)


def operators() -> list[str]:
    return sorted(_MODULES)
