"""Simulated cupy.linalg."""
from ._sim_registry import populate as _populate

_populate(globals(), "cupy.linalg")
del _populate
