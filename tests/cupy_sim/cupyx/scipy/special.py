"""Simulated cupyx.scipy.special (erf and erfc are computed; the rest are stubs)."""
from cupy._sim_registry import populate as _populate

_populate(globals(), "cupyx.scipy.special")
del _populate
