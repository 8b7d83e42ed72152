"""Simulated cupy.cuda: one device (id 0), a null stream, no compiler."""

from __future__ import annotations

import contextlib

from .. import _sim
from .._sim_registry import populate as _populate
from . import runtime  # noqa: F401

Device = _sim.Device


class Stream:
    """Simulated cupy.cuda.Stream: every operation is already complete."""

    null = None

    def __init__(self, null=False, non_blocking=False, ptds=False, priority=None):
        self.ptr = 0
        self.device_id = 0

    def synchronize(self):
        _sim.note_transfer("synchronize")

    def use(self):
        return self

    def done(self):
        return True

    def record(self, event=None):
        return event

    def wait_event(self, event):
        return None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __eq__(self, other):
        return isinstance(other, Stream)

    def __hash__(self):
        return 0


Stream.null = Stream(null=True)
Stream.__module__ = "cupy.cuda.stream"


def get_current_stream(device_id=-1):
    return Stream.null


def get_device_id():
    return 0


def is_available():
    return True


def get_local_runtime_version():
    return runtime.runtimeGetVersion()


@contextlib.contextmanager
def profile():
    yield


_populate(globals(), "cupy.cuda", extra={
    "Device": Device, "Stream": Stream, "ExternalStream": Stream,
    "get_current_stream": get_current_stream, "get_device_id": get_device_id,
    "is_available": is_available, "get_local_runtime_version": get_local_runtime_version,
    "profile": profile, "runtime": runtime})
del _populate
