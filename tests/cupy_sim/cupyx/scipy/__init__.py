"""Simulated cupyx.scipy."""
from cupy._sim_registry import populate as _populate

from . import special  # noqa: E402

_populate(globals(), "cupyx.scipy")
del _populate
