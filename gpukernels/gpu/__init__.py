"""Python side of the hand-written CUDA kernels: compiling cuda/*.cu with NVRTC through
CuPy (lazily, per device and template instantiation), launchers, and the table of
operators that have an accelerated path (see accelerated.py)."""


def cache_dir() -> str:
    """Where compiled CUDA modules are cached: CuPy's kernel cache (CUPY_CACHE_DIR, by
    default ~/.cupy/kernel_cache), keyed by source, options and device."""
    import os

    return os.environ.get("CUPY_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cupy", "kernel_cache"))
