"""Simulated cupy.fft."""
from ._sim_registry import populate as _populate

config = None
_populate(globals(), "cupy.fft")
del _populate
