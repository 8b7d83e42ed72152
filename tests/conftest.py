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


# The float64 reference library is imported as ``from tests.reference import ...``: the
# repository root on sys.path (python -m pytest puts it there, the pytest script may not).
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(1, _ROOT)


@pytest.fixture(params=["auto", "reference"])
def path(request):
    """The kernel context option ``paths``: 'auto' (specialisations allowed) or
    'reference'; the option overrides GPUKERNELS_PATHS, so both run in every suite."""
    return request.param


@pytest.fixture
def tuning():
    """Overrides entries of gpukernels/host/tuning.py for the test's duration:
    ``tuning({"attention.host_block_bytes": 4096})``; later calls add to earlier ones."""
    from contextlib import ExitStack

    from gpukernels.host import tuning as table

    with ExitStack() as stack:
        def override(values: dict):
            stack.enter_context(table.override(**values))

        yield override


@pytest.fixture
def sites_taken():
    """``with sites_taken() as taken: ...`` -- after the block, ``taken`` holds the sites
    ("Attention.blocks", ...) of the specialisations chosen inside it."""
    from contextlib import contextmanager

    from gpukernels.kernels import specialize

    @contextmanager
    def record():
        taken = set()
        with specialize.recording() as chosen:
            try:
                yield taken
            finally:
                taken.update(s.site for s in chosen)

    return record
