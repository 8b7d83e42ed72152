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
    _assert_unavailable(out, "not importable", "libcudart.so.12", "extra (pip install 'gpukernels[cuda1")


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


# ------------------------------------------------------------------ the right CuPy extra
@pytest.mark.parametrize("driver, extra", [(None, "cuda13"), (13000, "cuda13"), (13020, "cuda13"),
                                           (12080, "cuda12"), (12040, "cuda12")])
def test_messages_name_the_extra_that_fits_the_driver(driver, extra, monkeypatch):
    from gpukernels import xp

    monkeypatch.setattr(xp, "cuda_driver_version", lambda: driver)
    assert xp.cuda_extra() == extra
    hint = xp._install_hint()
    assert f"install the '{extra}' extra" in hint and f"gpukernels[{extra}]" in hint
    if driver is not None:
        assert f"the driver supports CUDA {driver // 1000}.{driver % 1000 // 10}" in hint


def test_a_cupy_built_for_a_newer_cuda_than_the_driver_is_named(monkeypatch):
    from types import SimpleNamespace

    from gpukernels import xp

    cupy = SimpleNamespace(cuda=SimpleNamespace(runtime=SimpleNamespace(runtimeGetVersion=lambda: 13000)))
    monkeypatch.setattr(xp, "cuda_driver_version", lambda: 12080)
    hint = xp._mismatch_hint(cupy)
    assert "built for CUDA 13 but the driver supports CUDA 12" in hint and "'cuda12' extra" in hint
    monkeypatch.setattr(xp, "cuda_driver_version", lambda: 13000)
    assert xp._mismatch_hint(cupy) == ""


def test_driver_version_is_read_without_cupy_and_never_raises():
    from gpukernels.xp import cuda_driver_version

    v = cuda_driver_version()
    assert v is None or (isinstance(v, int) and v >= 9000)


INFO_CUPY = '''
__version__ = "14.2.0"

class _Device:
    def __init__(self, index=0):
        self.index = index
    @property
    def compute_capability(self):
        return {cc!r}

cuda.Device = _Device
cuda.runtime.getDeviceProperties = lambda i: {{"name": b"Fake GPU"}}
class _Nvrtc:  # NVRTC loads: the hand-written kernels could compile
    @staticmethod
    def getVersion():
        return (12, 8)
cuda.nvrtc = _Nvrtc
'''


@pytest.mark.parametrize("cc, kernels", [("75", False), ("86", True)])
def test_info_reports_compute_capability_and_which_paths_run(tmp_path, cc, kernels):
    """`gpukernels info` on a GPU below sm_80 says the hand-written kernels step aside."""
    fake = _fake_cupy(tmp_path, extra=INFO_CUPY.format(cc=cc))
    env = dict(os.environ)
    env.pop("GPUKERNELS_SIMULATE_CUDA", None)
    env["PYTHONPATH"] = os.pathsep.join([str(fake), str(ROOT), env.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, "-m", "gpukernels.cli", "info", "--json"], cwd=fake, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    info = json.loads(run.stdout)
    assert info["cuda_available"] is True and info["cupy"] == "14.2.0"
    (dev,) = info["cuda_devices"]
    assert dev == {"device": "cuda:0", "name": "Fake GPU", "compute_capability": f"{cc[0]}.{cc[1]}",
                   "cuda_kernels": kernels, "paths": dev["paths"]}
    if kernels:
        assert dev["paths"].startswith("hand-written CUDA kernels for Attention, Conv, LinearAttention, "
                                       "RotaryEmbedding")
    else:
        assert dev["paths"] == ("CuPy array code only (the hand-written CUDA kernels need compute capability "
                                "8.0 (sm_80) or newer; cuda:0 is sm_75)")
