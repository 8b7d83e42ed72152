"""Simulated cupy.cuda.runtime: one device; the queries gpukernels makes answer like an
H100-class GPU, anything else says it is not simulated."""

from __future__ import annotations

from .._sim_registry import populate as _populate


class CUDARuntimeError(RuntimeError):
    def __init__(self, status=0, *args):
        self.status = status
        super().__init__(status if isinstance(status, str) else f"cudaError {status}")


CUDARuntimeError.__module__ = "cupy_backends.cuda.api.runtime"

is_hip = False


def getDeviceCount():
    return 1


def getDevice():
    return 0


def setDevice(device):
    if int(device) != 0:
        raise CUDARuntimeError("cudaErrorInvalidDevice: invalid device ordinal")


def deviceSynchronize():
    from .. import _sim

    _sim.note_transfer("synchronize")


def runtimeGetVersion():
    return 12090


def driverGetVersion():
    return 12090


def memGetInfo():
    return (64 << 30, 80 << 30)


def getDeviceProperties(device):
    from .. import _sim

    setDevice(device)
    cc = int(_sim.COMPUTE_CAPABILITY[0])
    return {"name": b"Simulated GPU (gpukernels cupy_sim)", "totalGlobalMem": 80 << 30,
            "sharedMemPerBlock": 49152, "sharedMemPerBlockOptin": 232448,
            "sharedMemPerMultiprocessor": 233472, "regsPerBlock": 65536, "warpSize": 32,
            "maxThreadsPerBlock": 1024, "maxThreadsDim": (1024, 1024, 64),
            "maxGridSize": (2147483647, 65535, 65535), "multiProcessorCount": 132,
            "major": cc // 10, "minor": cc % 10, "clockRate": 1980000, "l2CacheSize": 52428800,
            "computeMode": 0, "pciBusID": 0, "pciDeviceID": 0}


def deviceGetAttribute(attrib, device):
    setDevice(device)
    return 0


_populate(globals(), "cupy.cuda.runtime", extra={
    "CUDARuntimeError": CUDARuntimeError, "is_hip": is_hip, "getDeviceCount": getDeviceCount,
    "getDevice": getDevice, "setDevice": setDevice, "deviceSynchronize": deviceSynchronize,
    "runtimeGetVersion": runtimeGetVersion, "driverGetVersion": driverGetVersion,
    "memGetInfo": memGetInfo, "getDeviceProperties": getDeviceProperties,
    "deviceGetAttribute": deviceGetAttribute})
del _populate
