"""The device check's plumbing without a GPU: scripts/gpu_check.sh on the CPU emulator
(budgets, logs under $OUT, the summary table last even when a step times out),
benchmarks/bench_gpu.py's deadline and signal handling, scripts/gpu_warmup.py, and
gpukernels.gpu.device_checks with host values."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
# what the device tool brings back from $OUT: at most 8 files, these characters only
OUT_NAME = re.compile(r"^[A-Za-z0-9._-]+$")

needs_bash = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                                reason="needs bash and coreutils timeout")
needs_cxx = pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None,
                               reason="the CUDA emulator needs a C++ compiler")


def _env(**extra) -> dict:
    env = dict(os.environ, PYTHON=sys.executable, **extra)
    env.pop("GPUKERNELS_SIMULATE_CUDA", None)
    return env


def _check(*args: str, out: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, env=_env(OUT=str(out)),
                          capture_output=True, text=True, timeout=timeout)


@needs_bash
def test_script_parses_and_says_how_to_run_it():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    usage = subprocess.run(["bash", str(SCRIPT), "--help"], capture_output=True, text=True)
    assert usage.returncode == 0
    assert 'run(command="bash scripts/gpu_check.sh", timeout_s=600)' in usage.stdout
    for step in ("probe", "warmup", "tests", "parity", "bench"):
        assert re.search(rf"^#?\s*{step}\s+\d+ / +\d+", SCRIPT.read_text(), re.M), step
    bad = subprocess.run(["bash", str(SCRIPT), "--bogus"], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown option" in bad.stderr


def _table(stdout: str) -> list[str]:
    lines = stdout.rstrip().splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith("==== gpukernels device check"))
    return lines[start:]


@needs_bash
@needs_cxx
def test_emulator_parity_step_writes_its_logs_and_ends_with_the_table(tmp_path):
    run = _check("--emulator", "--quick", "--steps", "parity", "--seed", "5", out=tmp_path)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    table = _table(run.stdout)
    assert table[-1] == "ALL STEPS OK"
    assert re.match(r"parity\s+ok\s+\d+s/150\s+SUMMARY \(emulator, seed 5", table[2]), table
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["gpu_check_parity.log", "gpu_check_parity_summary.txt", "gpu_check_summary.txt"]
    assert all(OUT_NAME.match(f) for f in files)
    assert "parity    " in (tmp_path / "gpu_check_parity_summary.txt").read_text()
    assert (tmp_path / "gpu_check_summary.txt").read_text().rstrip().endswith("ALL STEPS OK")


@needs_bash
def test_a_step_past_its_budget_is_stopped_and_the_table_still_comes_last(tmp_path):
    run = _check("--emulator", "--steps", "parity,bench", "--budget-scale", "0.01", out=tmp_path, timeout=300)
    assert run.returncode == 1
    table = _table(run.stdout)
    assert table[-1] == "SOME STEPS FAILED OR TIMED OUT (see the logs)"
    rows = {line.split()[0]: line.split()[1] for line in table[2:-1]}
    # parity (108 cases) cannot finish in its 1 s; the bench step after it still runs (its
    # 100 launches may finish within the second on a fast machine)
    assert rows["parity"] == "TIMEOUT" and rows["bench"] in ("ok", "TIMEOUT") and len(rows) == 2, table
    assert len(list(tmp_path.iterdir())) <= 8


def _bench(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-u", str(ROOT / "benchmarks" / "bench_gpu.py"), *args], cwd=ROOT,
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


@needs_cxx
def test_bench_deadline_skips_cases_and_keeps_the_summary(tmp_path):
    summary = tmp_path / "s.txt"
    p = _bench("--emulator", "--quick", "--parity-only", "--deadline", "0", "--seed", "1", "--summary", str(summary))
    out, _ = p.communicate(timeout=600)
    assert p.returncode == 124, out[-3000:]  # cases left unrun for lack of time: not a pass
    text = summary.read_text()
    assert "SUMMARY (emulator, seed 1" in text and " 0 failed" in text
    assert re.search(r"parity\s+0/\d+ ok \(\d+ skipped: time budget\)", text), text
    assert out.rstrip().endswith(text.rstrip())


@needs_cxx
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_bench_stopped_by_a_signal_still_prints_its_summary(tmp_path, sig):
    summary = tmp_path / "s.txt"
    p = _bench("--emulator", "--parity-only", "--seed", "2", "--summary", str(summary))
    first = p.stdout.readline()
    assert first.startswith("gpukernels GPU check, seed 2"), first
    p.send_signal(sig)
    out, _ = p.communicate(timeout=600)
    assert p.returncode == 124, out[-3000:]
    text = summary.read_text()
    assert f"STOPPED EARLY: interrupted ({sig.name}) at " in text, text
    assert out.rstrip().endswith(text.rstrip())


def test_warmup_lists_every_instantiation_costliest_first():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gpu_warmup
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    from gpukernels.gpu.launch import all_sources

    items = gpu_warmup.gpu_items()
    declared = [(s.filename, e) for s in all_sources() for e in s.expressions()]
    assert sorted(items) == sorted(declared) and len(set(items)) == len(items)
    assert items[0][1].startswith("gk_attn_tc")
    assert len(gpu_warmup.emulator_items()) == len(all_sources())


def test_warmup_stops_at_its_deadline_with_a_summary():
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_warmup.py"), "--emulator", "--jobs", "1",
                          "--deadline", "0.001"], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert run.returncode == 124, run.stdout + run.stderr
    assert re.search(r"warm-up summary: \d+ ok, 0 failed, \d+ not reached, .*stopped: deadline", run.stdout)


def test_device_checks_read_host_values_at_once():
    from gpukernels.gpu import device_checks

    with device_checks.deferred():
        device_checks.require(np.bool_(False), lambda: ValueError("no"))
        device_checks.require(np.array(False), lambda: ValueError("no"))
        assert device_checks.pending_count() == 0
        with pytest.raises(ValueError, match="bad ids"):
            device_checks.require(np.array(True), lambda: ValueError("bad ids"))
    assert device_checks.pending_count() == 0


# ------------------------------------------------------------------ bench_gpu's timing helpers
@pytest.fixture
def bench_gpu(monkeypatch):
    monkeypatch.setenv("GPUKERNELS_CUDA_POISON", "0")  # bench_gpu sets it by default at import
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import bench_gpu

    return bench_gpu


class _FakeCp:
    """Just enough of cupy for time_prepared: events whose elapsed time is what the fake
    kernels 'took', a stream that refuses graph capture."""

    def __init__(self, seconds_per_launch: float):
        from types import SimpleNamespace

        fake = self
        self.launched = 0
        self.per = seconds_per_launch

        class Event:
            def record(self, stream=None):
                self.at = fake.launched

            def synchronize(self):
                pass

        class Stream:
            def __init__(self, non_blocking=False):
                pass

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

            def begin_capture(self):
                raise RuntimeError("no graphs here")

            def synchronize(self):
                pass

        def elapsed(e0, e1):
            return (e1.at - e0.at) * fake.per * 1e3

        null = SimpleNamespace(synchronize=lambda: None)
        self.cuda = SimpleNamespace(Event=Event, Stream=Stream, get_elapsed_time=elapsed,
                                    get_current_stream=lambda: null)


class _FakeBackend:
    max_shared_optin = 100 * 1024

    def __init__(self, cp):
        self.cp = cp

    def launch(self, fn, grid, block, args, shared_mem=0, what="kernel"):
        fn(grid, block, args, shared_mem=shared_mem)


def test_time_prepared_replays_the_recorded_launches(bench_gpu):
    from types import SimpleNamespace

    cp = _FakeCp(20e-6)

    def kernel(grid, block, args, shared_mem=0):
        assert args[1] == np.uint64(0) or args[1] is None
        cp.launched += 1

    runs = []

    def run(backend):
        runs.append(type(backend).__name__)
        backend.launch(kernel, (4,), (128,), (np.zeros(3), None), 0, what="op")
        backend.launch(kernel, (2, 2), (64, 2), (np.zeros(3), None), 0)

    env = SimpleNamespace(cp=cp, bench_backend=_FakeBackend(cp))
    t = bench_gpu.time_prepared(env, run, min_time=0.0, repeat=3)
    assert runs[0] == "RecordingBackend" and runs.count("_FakeBackend") == 21  # 1 + 20 timed host calls
    assert t.launches == 2 and t.kernel == pytest.approx(40e-6)  # two 20 us launches per replay
    assert t.graph is None and "RuntimeError" in t.graph_note and t.best == t.kernel
    assert t.host > 0
    assert re.match(r"0\.040 ms \(graph n/a \(RuntimeError\); 2 launches; host \d+ us/run\(\)\)$", t.text())


def test_torch_fp32_sets_ieee_or_tf32_with_either_api(bench_gpu):
    from types import SimpleNamespace as NS

    new = NS(backends=NS(fp32_precision="none", cuda=NS(matmul=NS(fp32_precision="none")),
                         cudnn=NS(fp32_precision="none", conv=NS(fp32_precision="none"))))
    bench_gpu.torch_fp32(new, "ieee")
    b = new.backends
    assert {b.fp32_precision, b.cuda.matmul.fp32_precision, b.cudnn.fp32_precision,
            b.cudnn.conv.fp32_precision} == {"ieee"}
    old = NS(backends=NS(cuda=NS(matmul=NS(allow_tf32=True)), cudnn=NS(allow_tf32=True)))
    bench_gpu.torch_fp32(old, "ieee")
    assert old.backends.cuda.matmul.allow_tf32 is False and old.backends.cudnn.allow_tf32 is False
    bench_gpu.torch_fp32(old, "tf32")
    assert old.backends.cuda.matmul.allow_tf32 is True and old.backends.cudnn.allow_tf32 is True
    bench_gpu.torch_fp32(None, "ieee")  # no torch: nothing to do
