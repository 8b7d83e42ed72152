"""CUDA detection with a CuPy that imports but cannot use a GPU, and import hygiene.

Every scenario runs in a subprocess with a fake ``cupy`` package first on sys.path (the
probe's result is cached per process, and a fake cupy must not leak into other tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

RUNTIME = '''
class CUDARuntimeError(RuntimeError):
    pass

def getDeviceCount():
    {count}
'''

INIT = '''
from . import cuda
{extra}

def zeros(*args, **kwargs):
    {zeros}
'''

PROBE = textwrap.dedent('''
    import json, sys
    import gpukernels
    imported_by_package = "cupy" in sys.modules
    from gpukernels.xp import available_devices, cuda_available, cuda_status, require, Device
    from gpukernels.errors import DeviceError
    imported_by_xp = "cupy" in sys.modules
    status = cuda_status()
    again = cuda_status()
    try:
        require(Device("cuda"))
        require_error = None
    except DeviceError as exc:
        require_error = str(exc)
    try:
        from gpukernels.kernels.base import KernelContext
        KernelContext("cuda").xp
        context_error = None
    except DeviceError as exc:
        context_error = str(exc)
    print(json.dumps(dict(
        imported_by_package=imported_by_package, imported_by_xp=imported_by_xp,
        available=status.available, reason=status.reason, count=status.device_count,
        cached=status is again, cuda_available=cuda_available(),
        devices=[str(d) for d in available_devices()],
        require_error=require_error, context_error=context_error,
        cupy_file=getattr(sys.modules.get("cupy"), "__file__", None))))
''')


def _fake_cupy(root: Path, count="return 1", zeros="return _Launch()", extra="", broken_import=False):
    pkg = root / "cupy"
    (pkg / "cuda").mkdir(parents=True)
    if broken_import:
        (pkg / "__init__.py").write_text("raise OSError('libcudart.so.12: cannot open shared object file')\n")
    else:
        (pkg / "__init__.py").write_text(INIT.format(extra=extra, zeros=zeros) + textwrap.dedent('''
            class _Launch:
                def sum(self):
                    return 0.0
            '''))
    (pkg / "cuda" / "__init__.py").write_text("from . import runtime\n")
    (pkg / "cuda" / "runtime.py").write_text(RUNTIME.format(count=count))
    return root


def _probe(fake_root: Path | None) -> dict:
    env = dict(os.environ)
    env.pop("GPUKERNELS_SIMULATE_CUDA", None)
    paths = ([str(fake_root)] if fake_root else []) + [str(ROOT)]
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, "-c", PROBE], cwd=fake_root or ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


def _assert_unavailable(out: dict, *reason_parts: str):
    assert out["available"] is False and out["cuda_available"] is False
    assert out["count"] == 0
    assert out["cached"] is True
    assert out["devices"] == ["cpu"]
    for part in reason_parts:
        assert part in out["reason"], out["reason"]
        assert part in out["require_error"], out["require_error"]
        assert part in out["context_error"], out["context_error"]


def test_import_gpukernels_does_not_import_cupy(tmp_path):
    out = _probe(_fake_cupy(tmp_path))
    assert out["imported_by_package"] is False
    assert out["imported_by_xp"] is False
    assert out["cupy_file"] is not None and str(tmp_path) in out["cupy_file"]  # the probe used the fake


def test_cupy_without_a_usable_driver_reports_unavailable_with_the_reason(tmp_path):
    fake = _fake_cupy(tmp_path, count="raise CUDARuntimeError("
                      "'cudaErrorInsufficientDriver: CUDA driver version is insufficient for "
                      "CUDA runtime version')")
    out = _probe(fake)
    _assert_unavailable(out, "no usable CUDA driver", "cudaErrorInsufficientDriver")


def test_cupy_that_sees_no_gpu_reports_unavailable(tmp_path):
    out = _probe(_fake_cupy(tmp_path, count="return 0"))
    _assert_unavailable(out, "no GPU is visible")


def test_cupy_whose_first_launch_fails_reports_unavailable(tmp_path):
    fake = _fake_cupy(tmp_path, zeros="raise RuntimeError('CUDA_ERROR_NO_BINARY_FOR_GPU')")
    out = _probe(fake)
    _assert_unavailable(out, "test launch", "CUDA_ERROR_NO_BINARY_FOR_GPU")


def test_cupy_that_fails_to_import_reports_unavailable(tmp_path):
    out = _probe(_fake_cupy(tmp_path, broken_import=True))
    _assert_unavailable(out, "not importable", "libcudart.so.12")


def test_no_cupy_at_all_reports_unavailable():
    import importlib.util

    try:
        installed = importlib.util.find_spec("cupy") is not None
    except ValueError:  # a cupy module without a spec is already imported
        installed = True
    if installed:
        pytest.skip("CuPy is installed here")
    out = _probe(None)
    _assert_unavailable(out, "not importable")
