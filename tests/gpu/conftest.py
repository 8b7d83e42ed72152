"""Fixtures for the CUDA-source tests: the CPU emulator backend (``emu``) and a coverage
summary of which kernels/instantiations/cases ran in the emulator, printed at the end
of the run."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools" / "cuda_emu"))

import emulator  # noqa: E402


@pytest.fixture(scope="session")
def emu():
    """An EmuBackend (skips when no C++ compiler is available)."""
    if shutil.which(emulator.CXX) is None:
        pytest.skip(f"the CUDA emulator needs a C++ compiler ({emulator.CXX})")
    return emulator.EmuBackend()


def pytest_terminal_summary(terminalreporter):
    launches = emulator.LAUNCHES
    if not launches and not emulator.TAGS:
        return
    tr = terminalreporter
    tr.section("CUDA emulator coverage")
    try:
        from gpukernels.gpu.launch import all_sources

        declared = {s.filename: s.expressions() for s in all_sources()}
    except Exception as exc:  # pragma: no cover - shown, not fatal
        tr.write_line(f"(cannot list declared instantiations: {exc})")
        declared = {}
    by_source: dict = {}
    for (source, expr), n in launches.items():
        by_source.setdefault(source, {})[expr] = n
    for source in sorted(set(declared) | set(by_source)):
        ran = by_source.get(source, {})
        decl = declared.get(source, [])
        tr.write_line(f"{source}: {len([e for e in decl if e in ran])}/{len(decl)} declared instantiations "
                      f"launched ({sum(ran.values())} launches)")
        missing = [e for e in decl if e not in ran]
        if missing and len(missing) <= 12:
            tr.write_line("    not launched: " + "; ".join(missing))
        elif missing:
            tr.write_line(f"    not launched: {len(missing)} (e.g. {'; '.join(missing[:6])})")
    if emulator.TAGS:
        tr.write_line("cases:")
        for label, n in sorted(emulator.TAGS.items()):
            tr.write_line(f"    {label}: {n}")
