"""Python side of the hand-written CUDA kernels: compiling cuda/*.cu with NVRTC through
CuPy (lazily, per device and template instantiation), launchers, and the table of
operators that have an accelerated path (see accelerated.py)."""
