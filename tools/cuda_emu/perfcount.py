"""Performance counters of the CUDA emulator: shared-memory bank conflicts and global-memory
sectors per request, per kernel and per source line, counted while the kernels run.

    from emulator import EmuBackend
    import perfcount
    be = EmuBackend(perf=True)                 # or GK_EMU_PERF=1 in the environment
    ...                                        # launches (emulator.run_op, check_op, ...)
    rows = be.perf.rows()                      # one Row per (kernel, source line, space, load/store)
    print(perfcount.format_table(rows))

A perf backend builds its own libraries, one per launched instantiation: the kernel code
instrumented with ``-fsanitize=thread`` (every load/store calls a hook in cuda_emu.h; no TSan
runtime), 3-5x slower than a plain emulator run, blocks on one OS thread.  Counted launches
of one library must not run concurrently from several Python threads (the counters of a
launch are global to its library).  The counting model (what a "warp instruction", a
bank conflict and a sector are here) is described in README.md, "Performance counters",
and at the top of the counters' section of cuda_emu.h.  In short:

* shared memory, per warp instruction: ``ways`` = the most distinct 4-byte words one of
  the 32 banks serves in one phase (1 = conflict-free; lanes reading one word share it),
  phases of 32 / 16 / 8 lanes for accesses of <= 4 / 8 / 16 bytes; ``wavefronts`` = the
  sum over phases, ideal = the number of phases;
* global memory, per warp instruction: ``sectors`` = distinct 32-byte segments touched;
  ideal = ceil(distinct bytes / 32).
"""

from __future__ import annotations

import ctypes
import re
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

FIELDS = ("requests", "lanes", "bytes", "ways_sum", "ways_max", "conflicted", "wavefronts", "ideal_wavefronts",
          "sectors", "ideal_sectors")
_NREC = 3 + len(FIELDS)
_MAX_FIELD = FIELDS.index("ways_max")
SPACES = ("shared", "global")


@dataclass
class Row:
    """The counters of one source line of one kernel, for one memory space and direction."""

    kernel: str     # the instantiation, as launched ("gk_attn_simt<64, 64>")
    source: str     # the launched source file ("attention.cu")
    file: str       # the line's file, relative to cuda/ (the kernel body: call sites of inlined helpers)
    line: int
    code: str       # the line's text
    space: str      # "shared" / "global"
    op: str         # "load" / "store"
    via: tuple = ()  # innermost locations when the access is inside an inlined helper ("gk_common.cuh:72")
    counts: dict = field(default_factory=dict)
    site: int = 0    # rows(by_site=True): which access of the line (1, 2, ... in code order), else 0

    def __getattr__(self, name):
        counts = self.__dict__.get("counts", {})
        if name in counts:
            return counts[name]
        raise AttributeError(name)

    @property
    def ways_mean(self) -> float:
        return self.ways_sum / self.requests if self.requests else 0.0

    @property
    def wavefront_ratio(self) -> float:
        """wavefronts / ideal wavefronts (1.0: conflict-free)."""
        return self.wavefronts / self.ideal_wavefronts if self.ideal_wavefronts else 1.0

    @property
    def sectors_per_request(self) -> float:
        return self.sectors / self.requests if self.requests else 0.0

    @property
    def ideal_sectors_per_request(self) -> float:
        return self.ideal_sectors / self.requests if self.requests else 0.0

    @property
    def sector_ratio(self) -> float:
        """sectors / ideal sectors (1.0: every touched segment fully used)."""
        return self.sectors / self.ideal_sectors if self.ideal_sectors else 1.0

    @property
    def lanes_per_request(self) -> float:
        return self.lanes / self.requests if self.requests else 0.0


class PerfLog:
    """The counters of an EmuBackend(perf=True): accumulated over its launches until reset()."""

    def __init__(self):
        self.counts: dict = {}   # (lib path, source, expr, pc, space, store) -> np.ndarray of FIELDS
        self.launches: Counter = Counter()  # (source, expr) -> launches counted
        self._frames: dict = {}  # (lib path, pc) -> [(function, file, line)], innermost first

    def reset(self) -> None:
        self.counts.clear()
        self.launches.clear()

    # ---- the backend's side
    @staticmethod
    def before_launch(lib, ranges) -> None:
        """Register the device buffers ([lo, hi) address pairs) that count as global memory."""
        flat = [int(x) for pair in ranges for x in pair]
        arr = (ctypes.c_ulonglong * max(1, len(flat)))(*flat)
        lib.lib.gk_emu_perf_set_ranges(arr, len(flat) // 2)

    def after_launch(self, lib, source: str, expr: str, keep: bool = True) -> None:
        cap = 1024
        while True:
            buf = (ctypes.c_ulonglong * (cap * _NREC))()
            n = lib.lib.gk_emu_perf_take(buf, cap)
            if n <= cap:
                break
            cap = n  # the library keeps its counters until they fit
        if not keep:
            return
        data = np.ctypeslib.as_array(buf)[: n * _NREC].reshape(n, _NREC).astype(np.int64)
        for rec in data:
            key = (str(lib.path), source, expr, int(rec[0]), int(rec[1]), int(rec[2]))
            old = self.counts.get(key)
            if old is None:
                self.counts[key] = rec[3:].copy()
            else:
                mx = max(old[_MAX_FIELD], rec[3 + _MAX_FIELD])
                old += rec[3:]
                old[_MAX_FIELD] = mx
        self.launches[(source, expr)] += 1

    # ---- reading
    def rows(self, kernel: str | None = None, by_site: bool = False) -> list[Row]:
        """One Row per (kernel, file, line, space, op), sorted by kernel then line; kernel:
        only instantiations whose name starts with it ("gk_la_chunk_prep"); by_site: one Row
        per access instruction instead (a line often holds several: Ks[i * lk + d] *
        Ks[j * lk + d] is a broadcast and a strided load), numbered in code order."""
        self._symbolize()
        agg: dict = {}
        for (path, source, expr, pc, space, store), c in self.counts.items():
            if kernel is not None and not expr.startswith(kernel):
                continue
            frames = self._frames.get((path, pc)) or [("??", "??", 0)]
            _, file, line = frames[-1]  # the outermost frame: the kernel body (helpers are inlined)
            code = _source_line(file, line)
            if "__shared__" in code:
                continue  # a `static thread_local` array's initialisation guard, not the kernel's access
            via = tuple(f"{f}:{ln}" for _, f, ln in frames[:-1] if (f, ln) != (file, line))[:1]
            key = (expr, source, file, line, space, store) + ((pc,) if by_site else ())
            row = agg.get(key)
            if row is None:
                row = agg[key] = Row(expr, source, file, line, code, SPACES[space],
                                     "store" if store else "load", via, {f: 0 for f in FIELDS})
            elif via and via[0] not in row.via:
                row.via = row.via + via
            for f, v in zip(FIELDS, c):
                row.counts[f] = max(row.counts[f], int(v)) if f == "ways_max" else row.counts[f] + int(v)
        if by_site:
            seen: dict = {}
            for key in sorted(agg, key=lambda k: (k[:4], k[6])):
                n = seen[key[:4]] = seen.get(key[:4], 0) + 1
                agg[key].site = n
        return sorted(agg.values(), key=lambda r: (r.kernel, r.file != r.source, r.file, r.line, r.site, r.space,
                                                   r.op))

    def _symbolize(self) -> None:
        todo: dict = {}
        for (path, _s, _e, pc, _sp, _st) in self.counts:
            if (path, pc) not in self._frames:
                todo.setdefault(path, set()).add(pc)
        for path, pcs in todo.items():
            pcs = sorted(pcs)
            self._frames.update({(path, pc): fr for pc, fr in zip(pcs, _addr2line(path, pcs))})


_ADDR = re.compile(r"^0x[0-9a-fA-F]+$")
_LOC = re.compile(r"^(.*):(\d+|\?)(?: \(discriminator \d+\))?$")


def _addr2line(path: str, pcs: list[int]) -> list[list]:
    """[(function, file relative to the sources, line)] per pc, innermost inline frame first."""
    try:
        out = subprocess.run(["addr2line", "-e", path, "-a", "-f", "-C", "-i", *[hex(pc) for pc in pcs]],
                             capture_output=True, text=True, check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return [[("??", "??", 0)] for _ in pcs]
    result: list = []
    i = 0
    while i < len(out):
        if _ADDR.match(out[i]):
            result.append([])
            i += 1
            continue
        func = out[i]
        loc = out[i + 1] if i + 1 < len(out) else "??:0"
        i += 2
        m = _LOC.match(loc)
        file, line = (m.group(1), int(m.group(2)) if m.group(2).isdigit() else 0) if m else ("??", 0)
        if "/src/" in file:  # the build's copy of cuda/: .../build/<key>/src/<relative path>
            file = file.rsplit("/src/", 1)[1]
        else:
            file = Path(file).name
        if result:
            result[-1].append((func, file, line))
    result += [[("??", "??", 0)]] * (len(pcs) - len(result))
    return [r or [("??", "??", 0)] for r in result[: len(pcs)]]


_LINES: dict = {}
_SOURCE_DIRS: list = []  # besides cuda/: folders of test kernels built from absolute paths


def add_source_dir(path) -> None:
    if Path(path) not in _SOURCE_DIRS:
        _SOURCE_DIRS.append(Path(path))


def _source_line(file: str, line: int) -> str:
    if file not in _LINES:
        from gpukernels.gpu import launch as gl

        _LINES[file] = []
        for d in [gl.source_dir(), *_SOURCE_DIRS]:
            if (d / file).is_file():
                _LINES[file] = (d / file).read_text().splitlines()
                break
    lines = _LINES[file]
    return lines[line - 1].strip() if 0 < line <= len(lines) else ""


def find_line(file: str, text: str) -> int:
    """The line number of the single line of cuda/<file> that contains text (for tests that
    name a line by its code rather than by a number that shifts with edits)."""
    from gpukernels.gpu import launch as gl

    hits = [i + 1 for i, ln in enumerate((gl.source_dir() / file).read_text().splitlines()) if text in ln]
    if len(hits) != 1:
        raise ValueError(f"{text!r} is on {len(hits)} lines of {file} (want exactly one)")
    return hits[0]


def format_table(rows: list[Row], launches: Counter | None = None, width: int = 64) -> str:
    """A text table per kernel: per source line, requests (warp instructions), mean active
    lanes, and for shared memory the bank-conflict ways (mean / max), the share of conflicted
    requests and wavefronts over ideal; for global memory the sectors per request against the
    ideal and their ratio."""
    out = []
    kernel = None
    hdr = (f"{'line':>10} {'space':6} {'op':5} {'requests':>9} {'lanes':>5} {'ways':>9} {'confl':>6} "
           f"{'wavef':>6} {'sect/req':>8} {'ideal':>6} {'ratio':>6}  code")
    for r in rows:
        if r.kernel != kernel:
            kernel = r.kernel
            n = launches.get((r.source, r.kernel), 0) if launches else 0
            out.append("")
            out.append(f"== {r.kernel} ({r.source}{f', {n} launches' if n else ''})")
            out.append(hdr)
        loc = f"{'' if r.file == r.source else r.file + ':'}{r.line}{f'#{r.site}' if r.site else ''}"
        if r.space == "shared":
            mid = (f"{r.ways_mean:>4.1f}/{r.ways_max:<4d} {100 * r.conflicted / max(r.requests, 1):>5.0f}% "
                   f"{r.wavefront_ratio:>6.2f} {'':>8} {'':>6} {'':>6}")
        else:
            mid = (f"{'':>9} {'':>6} {'':>6} {r.sectors_per_request:>8.2f} {r.ideal_sectors_per_request:>6.2f} "
                   f"{r.sector_ratio:>6.2f}")
        code = r.code if len(r.code) <= width else r.code[: width - 3] + "..."
        if r.via:
            code += f"  [{', '.join(r.via)}]"
        out.append(f"{loc:>10} {r.space:6} {r.op:5} {r.requests:>9d} {r.lanes_per_request:>5.1f} {mid}  {code}")
    return "\n".join(out).lstrip("\n")
