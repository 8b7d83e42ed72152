import subprocess
import sys

import numpy as np
import pytest

from gpukernels import xp
from gpukernels.errors import DeviceError


def test_import_does_not_import_cupy():
    code = "import gpukernels, gpukernels.kernels, gpukernels.runtime, sys; assert 'cupy' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("spec, kind, index", [("cpu", "cpu", 0), ("cuda", "cuda", 0), ("cuda:1", "cuda", 1),
                                                ("CUDA", "cuda", 0), ("gpu:2", "cuda", 2)])
def test_device_parse(spec, kind, index):
    d = xp.Device.parse(spec)
    assert (d.kind, d.index) == (kind, index)


@pytest.mark.parametrize("bad", ["tpu", "cuda:x", "cpu:3"])
def test_device_parse_rejects(bad):
    with pytest.raises(DeviceError):
        xp.Device.parse(bad)


def test_cuda_status_never_raises():
    status = xp.cuda_status()
    assert isinstance(status.available, bool) and status.reason
    devices = xp.available_devices()
    assert devices[0] == xp.CPU
    if not status.available:
        with pytest.raises(DeviceError, match="not usable"):
            xp.namespace("cuda")


def test_scatter_reduce_numpy():
    target = np.zeros(4)
    xp.scatter_reduce(np, target, (np.array([0, 0, 3]),), np.array([1.0, 2.0, 5.0]), "add")
    np.testing.assert_array_equal(target, [3, 0, 0, 5])
    target = np.ones(3)
    xp._scatter_mul_rounds(np, target, (np.array([1, 1, 2]),), np.array([2.0, 3.0, 4.0]))
    np.testing.assert_array_equal(target, [1, 6, 4])


def test_last_update_wins():
    target = np.zeros(3)
    xp.scatter_assign_last_wins(np, target, np.array([1, 1, 2]), np.array([5.0, 7.0, 1.0]))
    np.testing.assert_array_equal(target, [0, 7, 1])


