"""Simulated cupyx (see tests/cupy_sim/cupy)."""
import cupy as _cupy  # noqa: F401  (real cupyx imports cupy)
from cupy._sim_registry import populate as _populate

from . import scipy  # noqa: E402

_populate(globals(), "cupyx")
del _populate, _cupy
