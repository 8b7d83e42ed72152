"""Checks of input values on the GPU, read once per run instead of once per kernel call.

Most validation needs shapes, dtypes and attributes only, which the host has.  A few
checks need the data: position ids inside the cache, indices inside their axis.  Reading
such a value back (``int(xp.max(ids))``) makes the host wait for the GPU on every call.
Instead, a kernel computes the condition on the device -- one small reduction queued
behind the work that produced the data -- and hands the 0-d boolean result to
``require`` together with a function that makes the error:

    bad = ids.view(xp.uint64).max() >= limit          # True when the check fails (device)
    device_checks.require(bad, lambda: self.error("..."))

Inside ``deferred()`` the results are only collected; when the outermost ``deferred()``
block ends normally, all of them are read with one device-to-host transfer per device
and the first failed check raises its error.  A graph run wraps itself in one, so its
data checks cost one synchronisation per run.  Outside such a block ``require`` reads
its result at once: the one synchronisation of that kernel call.  Host (NumPy) results
are checked at once and cost nothing.

What a failed check leaves behind until it is read is the kernels' business: each must
stay memory-safe for any value (the CUDA kernels clamp and poison; CuPy's ``take`` wraps
indices around), and the error replaces every output of the run.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Callable

import numpy as np

_pending: contextvars.ContextVar = contextvars.ContextVar("gpukernels_device_checks", default=None)


def require(bad, error: Callable[[], BaseException]) -> None:
    """Fail with error() when bad (a 0-d boolean array, or a Python/NumPy bool) is true:
    at once for host values and outside ``deferred()``, else when the block ends."""
    if isinstance(bad, (bool, np.bool_, np.ndarray)):
        if bool(bad):
            raise error()
        return
    pending = _pending.get()
    if pending is None:
        if bool(bad):  # one device-to-host transfer
            raise error()
        return
    pending.append((bad, error))


def pending_count() -> int:
    """How many device checks wait to be read in the current ``deferred()`` block."""
    pending = _pending.get()
    return 0 if pending is None else len(pending)


@contextlib.contextmanager
def deferred():
    """Collect the device checks made inside the block and read them when it ends (one
    transfer per device).  Nested blocks join the outermost one.  When the block raises,
    the collected checks are dropped: that error wins."""
    if _pending.get() is not None:
        yield
        return
    pending: list = []
    token = _pending.set(pending)
    try:
        yield
    finally:
        _pending.reset(token)
    read(pending)


def read(pending: list) -> None:
    """Read the (flag, error) pairs with one transfer per device; raise the first error."""
    if not pending:
        return
    by_device: dict = {}
    for i, (flag, _) in enumerate(pending):
        device = getattr(getattr(flag, "device", None), "id", 0)
        by_device.setdefault(device, []).append(i)
    failed = []
    for device, indices in by_device.items():
        flags = [pending[i][0] for i in indices]
        xp = _namespace(flags[0])
        with xp.cuda.Device(device):
            values = xp.stack([xp.asarray(f, dtype=bool).reshape(()) for f in flags]).get()
        failed += [i for i, v in zip(indices, values) if v]
    if failed:
        raise pending[min(failed)][1]()


def _namespace(array):
    import sys

    return sys.modules[type(array).__module__.split(".")[0]]
