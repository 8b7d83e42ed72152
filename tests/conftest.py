"""Shared fixtures: every test that takes ``device`` runs on cpu and, when CuPy sees a
usable GPU, on cuda (marked ``gpu``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

if os.environ.get("GPUKERNELS_SIMULATE_CUDA") == "1":
    # CPU simulation of CuPy (tests/cupy_sim/README.md): must come first on sys.path
    # before gpukernels probes CUDA.
    sys.path.insert(0, str(Path(__file__).resolve().parent / "cupy_sim"))

from gpukernels.xp import cuda_status  # noqa: E402


def _device_params():
    params = [pytest.param("cpu", id="cpu")]
    status = cuda_status()
    params.append(pytest.param(
        "cuda", id="cuda",
        marks=[pytest.mark.gpu] + ([] if status.available else
                                   [pytest.mark.skip(reason=f"no usable GPU: {status.reason}")])))
    return params


@pytest.fixture(params=_device_params())
def device(request):
    return request.param


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


@pytest.fixture
def count_transfers():
    """The CuPy simulation's transfer counter (tests/cupy_sim): ``with count_transfers() as
    log: ...`` then ``log.count`` is the number of device-to-host transfers and
    synchronisations made in the block, ``log.report()`` says which and where.  Skips
    unless the run simulates CUDA (GPUKERNELS_SIMULATE_CUDA=1)."""
    if os.environ.get("GPUKERNELS_SIMULATE_CUDA") != "1":
        pytest.skip("transfers are counted by the CuPy simulation (GPUKERNELS_SIMULATE_CUDA=1)")
    from cupy._sim import count_transfers as counter

    return counter


@pytest.fixture
def default_paths(monkeypatch):
    """The default paths ('auto') even when the suite runs with GPUKERNELS_PATHS=reference:
    for tests of the specialisations themselves (host fast paths), used as
    ``pytestmark = pytest.mark.usefixtures("default_paths")``."""
    monkeypatch.delenv("GPUKERNELS_PATHS", raising=False)


def pytest_collection_modifyitems(config, items):
    """Under the CuPy simulation, tests that need the hand-written CUDA kernels to run
    (gpu-marked tests in tests/gpu/) are skipped: the simulation runs the array path only."""
    if os.environ.get("GPUKERNELS_SIMULATE_CUDA") != "1":
        return
    skip = pytest.mark.skip(reason="needs the real CUDA kernels; the CuPy simulation "
                                   "(GPUKERNELS_SIMULATE_CUDA=1) runs the array path only")
    for item in items:
        if item.nodeid.startswith("tests/gpu/") and item.get_closest_marker("gpu"):
            item.add_marker(skip)
