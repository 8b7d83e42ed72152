"""Simulated cupy.lib.stride_tricks."""
import numpy as np  # noqa: F401  (real CuPy's module has it too)

from .._sim_registry import populate as _populate

_populate(globals(), "cupy.lib.stride_tricks")
del _populate
