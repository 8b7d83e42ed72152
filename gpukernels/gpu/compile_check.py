"""Compile every CUDA kernel and every template instantiation for sm_80 and sm_90 without
a GPU, and report the compiler's resource usage.

    python -m gpukernels.gpu.compile_check [--arch sm_80 --arch sm_90] [--source rotary_embedding.cu]

prints one row per (instantiation, architecture): registers, shared memory, stack frame and
spill stores/loads, from ptxas' ``-v`` report, and exits 1 when a compile fails or a hot
kernel (see ``CudaSource.no_spill``) spills to local memory.

The compiler is NVRTC, loaded with ctypes from the nvidia-cuda-nvrtc wheel (the ``test``
extra) or CuPy's or the system CUDA's libnvrtc; with ``--nvcc`` (or when no NVRTC is found)
nvcc is used.  Headers (cuda_fp16.h, cuda_bf16.h) come from the nvidia-cuda-runtime wheel
or a CUDA toolkit (``launch.cuda_include_dirs``).  Nothing here needs a GPU or a driver.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from . import launch

ARCHS = ("sm_80", "sm_90")


# ------------------------------------------------------------------ NVRTC through ctypes


def _nvrtc_candidates() -> list[str]:
    paths = []
    spec = importlib.util.find_spec("nvidia")
    for base in (spec.submodule_search_locations or []) if spec else []:
        for sub in ("cuda_nvrtc/lib", "cu13/lib", "cuda_nvrtc/bin"):
            paths += sorted(glob.glob(os.path.join(base, sub, "libnvrtc.so*")), reverse=True)
            paths += sorted(glob.glob(os.path.join(base, sub, "nvrtc64*.dll")), reverse=True)
    for env in ("CUDA_PATH", "CUDA_HOME"):
        if os.environ.get(env):
            paths += sorted(glob.glob(os.path.join(os.environ[env], "lib64", "libnvrtc.so*")), reverse=True)
    paths += sorted(glob.glob("/usr/local/cuda/lib64/libnvrtc.so*"), reverse=True)
    return [p for p in paths if "builtins" not in os.path.basename(p) and ".alt." not in os.path.basename(p)]


class Nvrtc:
    """The few NVRTC entry points the check needs."""

    def __init__(self, path: str | None = None):
        errors = []
        for cand in ([path] if path else _nvrtc_candidates()):
            try:
                self.lib = ctypes.CDLL(cand)
                self.path = cand
                break
            except OSError as exc:
                errors.append(f"{cand}: {exc}")
        else:
            raise RuntimeError("no libnvrtc found (install the nvidia-cuda-nvrtc-cu12 wheel, the 'test' extra)"
                               + (": " + "; ".join(errors) if errors else ""))
        lib = self.lib
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        major, minor = ctypes.c_int(), ctypes.c_int()
        lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
        self.version = (major.value, minor.value)

    def _check(self, rc, what):
        if rc != 0:
            raise RuntimeError(f"{what}: {self.lib.nvrtcGetErrorString(rc).decode()}")

    def compile(self, code: str, name: str, exprs: list[str], options: list[str]):
        """(ok, log, {expr: lowered name}, cubin bytes)."""
        lib = self.lib
        prog = ctypes.c_void_p()
        self._check(lib.nvrtcCreateProgram(ctypes.byref(prog), code.encode(), name.encode(), 0, None, None),
                    "nvrtcCreateProgram")
        try:
            for e in exprs:
                self._check(lib.nvrtcAddNameExpression(prog, e.encode()), f"nvrtcAddNameExpression({e})")
            opts = [o.encode() for o in options]
            arr = (ctypes.c_char_p * len(opts))(*opts)
            rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            buf = ctypes.create_string_buffer(size.value + 1)
            lib.nvrtcGetProgramLog(prog, buf)
            log = buf.value.decode(errors="replace")
            if rc != 0:
                return False, log, {}, b""
            lowered = {}
            for e in exprs:
                out = ctypes.c_char_p()
                if lib.nvrtcGetLoweredName(prog, e.encode(), ctypes.byref(out)) == 0 and out.value:
                    lowered[e] = out.value.decode()
            size = ctypes.c_size_t()
            cubin = b""
            if lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)) == 0 and size.value:
                cb = ctypes.create_string_buffer(size.value)
                lib.nvrtcGetCUBIN(prog, cb)
                cubin = cb.raw
            return True, log, lowered, cubin
        finally:
            lib.nvrtcDestroyProgram(ctypes.byref(prog))


# ------------------------------------------------------------------ ptxas report

_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\d+a?)'")
_PROPS = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:, used (\d+) barriers)?(?:, (\d+) bytes smem)?")


@dataclass
class Resources:
    registers: int = 0
    smem: int = 0
    stack: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    barriers: int = 0

    @property
    def spills(self) -> bool:
        return self.spill_stores > 0 or self.spill_loads > 0


def parse_ptxas(log: str) -> dict[str, Resources]:
    """{mangled entry name: Resources} from ptxas -v output."""
    out: dict[str, Resources] = {}
    current = None
    for line in log.splitlines():
        m = _ENTRY.search(line)
        if m:
            current = out.setdefault(m.group(1), Resources())
            continue
        m = _PROPS.search(line)
        if m:
            current = out.setdefault(m.group(1), Resources())
            continue
        if current is None:
            continue
        m = _FRAME.search(line)
        if m:
            current.stack, current.spill_stores, current.spill_loads = map(int, m.groups())
            continue
        m = _USED.search(line)
        if m:
            current.registers = int(m.group(1))
            current.barriers = int(m.group(2) or 0)
            current.smem = int(m.group(3) or 0)
    return out


# ------------------------------------------------------------------ the check


@dataclass
class Row:
    source: str
    expr: str
    arch: str
    ok: bool
    resources: Resources | None = None
    hot: bool = True
    message: str = ""

    @property
    def failed(self) -> bool:
        return not self.ok or (self.hot and self.resources is not None and self.resources.spills)


@dataclass
class SourceReport:
    source: str
    arch: str
    ok: bool
    log: str = ""
    rows: list[Row] = field(default_factory=list)


def check_source(src: launch.CudaSource, arch: str, compiler: str = "auto") -> SourceReport:
    exprs = src.expressions()
    code = launch.read_source(src.filename)
    base_opts = list(launch.compile_options(src.options))
    if compiler == "auto":
        try:
            nv = Nvrtc()
            compiler = "nvrtc"
        except RuntimeError:
            compiler = "nvcc" if shutil.which("nvcc") or os.path.exists("/usr/local/cuda/bin/nvcc") else "none"
    if compiler == "nvrtc":
        nv = Nvrtc()
        opts = base_opts + [f"-arch={arch}", "--ptxas-options=-v"]
        ok, log, lowered, _ = nv.compile(code, src.filename, exprs, opts)
    elif compiler == "nvcc":
        ok, log, lowered = _nvcc_compile(src.filename, exprs, base_opts, arch)
    else:
        return SourceReport(src.filename, arch, False, "no CUDA compiler: install nvidia-cuda-nvrtc-cu12")
    report = SourceReport(src.filename, arch, ok, log)
    res = parse_ptxas(log) if ok else {}
    for e in exprs:
        if not ok:
            report.rows.append(Row(src.filename, e, arch, False, None, src.is_hot(e), "compile failed"))
            continue
        name = lowered.get(e)
        r = res.get(name) if name else None
        if r is None:
            report.rows.append(Row(src.filename, e, arch, False, None, src.is_hot(e),
                                   "no resource report for this instantiation"))
        else:
            report.rows.append(Row(src.filename, e, arch, True, r, src.is_hot(e)))
    return report


def _nvcc_compile(filename: str, exprs: list[str], options: list[str], arch: str):
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    with tempfile.TemporaryDirectory() as tmp:
        tu = Path(tmp) / "check.cu"
        lines = [f'#include "{filename}"', "static void* gk_force_instantiation[] = {"]
        lines += [f"  (void*)&{e}," for e in exprs]
        lines += ["};", "void* gk_force_use() { return gk_force_instantiation; }"]
        tu.write_text("\n".join(lines) + "\n")
        opts = [o for o in options if o.startswith(("-I", "-D"))]
        cmd = [nvcc, "-std=c++17", "-cubin", f"-arch={arch}", "-Xptxas", "-v", *opts, str(tu), "-o",
               str(Path(tmp) / "check.cubin")]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        log = proc.stdout + proc.stderr
        if proc.returncode != 0:
            return False, log, {}
        # map instantiations to mangled names by demangling
        names = sorted(parse_ptxas(log))
        demangled = {}
        filt = shutil.which("c++filt") or shutil.which("cu++filt")
        if filt and names:
            out = subprocess.run([filt], input="\n".join(names), capture_output=True, text=True).stdout.split("\n")
            demangled = dict(zip(names, out))
        lowered = {}
        for e in exprs:
            key = re.sub(r"\s+", "", e)
            for m, d in demangled.items():
                if re.sub(r"\s+", "", re.sub(r"^void\s+", "", d)).split("(")[0] == key or m == e:
                    lowered[e] = m
            if e not in lowered and e in names:
                lowered[e] = e
        return True, log, lowered


def run(sources: list[str] | None = None, archs=ARCHS, compiler: str = "auto") -> list[SourceReport]:
    reports = []
    for src in launch.all_sources():
        if sources and src.filename not in sources:
            continue
        for arch in archs:
            reports.append(check_source(src, arch, compiler))
    return reports


def format_table(reports: list[SourceReport]) -> str:
    lines = [f"{'source':<22} {'instantiation':<58} {'arch':<6} {'regs':>4} {'smem':>6} {'stack':>5} "
             f"{'spill st/ld':>11}  status"]
    for rep in reports:
        for row in rep.rows:
            r = row.resources
            if r is None:
                lines.append(f"{row.source:<22} {row.expr[:58]:<58} {row.arch:<6} {'-':>4} {'-':>6} {'-':>5} "
                             f"{'-':>11}  FAIL {row.message}")
                continue
            status = "ok"
            if r.spills:
                status = "FAIL spills (hot kernel)" if row.hot else "spills"
            lines.append(f"{row.source:<22} {row.expr[:58]:<58} {row.arch:<6} {r.registers:>4} {r.smem:>6} "
                         f"{r.stack:>5} {f'{r.spill_stores}/{r.spill_loads}':>11}  {status}")
        if not rep.ok:
            lines.append(f"  {rep.source} for {rep.arch} failed to compile:\n" + _indent(rep.log[-4000:]))
    return "\n".join(lines)


def _indent(text: str) -> str:
    return "\n".join("    " + l for l in text.splitlines())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpukernels.gpu.compile_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", action="append", help="target, e.g. sm_80 (repeatable; default sm_80 and sm_90)")
    ap.add_argument("--source", action="append", help="only this source file (repeatable)")
    ap.add_argument("--nvcc", action="store_true", help="compile with nvcc instead of NVRTC")
    args = ap.parse_args(argv)
    reports = run(args.source, tuple(args.arch or ARCHS), "nvcc" if args.nvcc else "auto")
    print(format_table(reports))
    failed = [row for rep in reports for row in rep.rows if row.failed] + [rep for rep in reports if not rep.rows]
    n = sum(len(rep.rows) for rep in reports)
    print(f"\n{n} instantiation builds, {len(failed)} failed")
    return 1 if failed or not reports else 0


if __name__ == "__main__":
    sys.exit(main())
