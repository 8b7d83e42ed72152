"""Simulated CuPy 14.2 for running gpukernels' CUDA code paths on a machine without a GPU.

Activated only by tests/conftest.py when GPUKERNELS_SIMULATE_CUDA=1 (it puts
tests/cupy_sim first on sys.path).  Device arrays wrap NumPy arrays but refuse implicit
conversion to NumPy and follow CuPy's rules; see tests/cupy_sim/README.md.
"""

__gpukernels_simulated__ = True

from . import _sim, _sim_registry  # noqa: E402
from . import cuda, fft, lib, linalg, random  # noqa: E402

_sim_registry.populate(globals(), "cupy")
del _sim, _sim_registry
