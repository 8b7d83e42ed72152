"""The CPU simulation of CuPy (tests/cupy_sim, GPUKERNELS_SIMULATE_CUDA=1) in ordinary CI.

Each check runs in a subprocess: the simulated ``cupy`` must never be imported into this
process, where it would make CUDA look available to every other test.

* ``tests/cupy_sim/sim_checks.py``: the simulation behaves like real CuPy 14.2 where
  GPU-only bugs hide, and gpukernels' CuPy-specific helpers work on it;
* a slice of the kernel tests runs on device "cuda" through the simulation.

The whole simulated run (about a minute on one core) is a separate command, see
tests/cupy_sim/README.md::

    GPUKERNELS_SIMULATE_CUDA=1 python -m pytest tests/kernels tests/test_conformance.py -k cuda -q
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _pytest(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, GPUKERNELS_SIMULATE_CUDA="1")
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
         "--strict-markers", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_simulated_cupy_matches_real_cupy_and_gpukernels_helpers_work_on_it():
    run = _pytest("tests/cupy_sim/sim_checks.py", "-rs")
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert " passed" in run.stdout and "skipped" not in run.stdout, run.stdout[-3000:]


@pytest.mark.parametrize("target", [
    "tests/kernels/math/test_foundation_ops.py",
    "tests/kernels/tensor/test_cast.py",
    "tests/kernels/quant/test_quant_linear.py",
])
def test_kernel_tests_run_on_simulated_cuda(target):
    run = _pytest(target, "-k", "cuda", "-x", "-rs")
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert " passed" in run.stdout, run.stdout[-3000:]
    assert "no usable GPU" not in run.stdout, "the cuda tests were skipped: " + run.stdout[-3000:]
