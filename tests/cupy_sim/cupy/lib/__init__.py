"""Simulated cupy.lib."""
from . import stride_tricks  # noqa: F401
from .._sim_registry import populate as _populate

_populate(globals(), "cupy.lib")
del _populate
