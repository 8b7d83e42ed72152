"""Compile every hand-written CUDA instantiation ahead of the tests, in parallel.

    python scripts/gpu_warmup.py [--jobs N] [--deadline SECONDS]   # GPU: into CuPy's kernel cache
    python scripts/gpu_warmup.py --emulator [--jobs N]             # no GPU: the emulator's libraries

On a GPU each instantiation every ``CUDA_SOURCES`` entry declares (``launch.all_sources``)
is compiled by NVRTC through exactly the call the kernels use at run time
(``CupyBackend.function``), so it lands in CuPy's on-disk cache (``CUPY_CACHE_DIR``) under
the key later processes look up; one worker process per core (the costliest instantiations,
the tensor-core attention kernels at about 4 s each, are started first).  With
``--emulator`` each source's shared library for the CPU emulator is built instead (one
per source, all its instantiations).

Prints one line per instantiation and a summary; exits 1 when a compile failed, 124 when
the deadline (or SIGINT/SIGTERM) stopped it first -- the summary is printed either way.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import signal
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def _cost(item) -> int:
    """Rough compile cost order: tensor-core / chunked kernels first."""
    source, expr = item
    for rank, prefix in enumerate(("gk_attn_tc", "gk_attn_simt", "gk_la_chunk", "gk_conv_tc", "gk_conv_simt")):
        if expr.startswith(prefix):
            return rank
    return 9


def gpu_items() -> list[tuple[str, str]]:
    from gpukernels.gpu.launch import all_sources

    items = [(s.filename, e) for s in all_sources() for e in s.expressions()]
    return sorted(items, key=_cost)


def emulator_items() -> list[tuple[str, str]]:
    from gpukernels.gpu.launch import all_sources

    # one instantiation per source: the emulator builds a source's library whole
    return [(s.filename, s.expressions()[0]) for s in all_sources()]


_backend = None


def _init_worker(emulator: bool) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    global _backend
    if emulator:
        sys.path.insert(0, str(REPO / "tools" / "cuda_emu"))
        import emulator as emu

        _backend = emu.EmuBackend()
    else:
        from gpukernels.gpu.launch import CupyBackend
        from gpukernels.xp import Device

        _backend = CupyBackend(Device("cuda", 0))


def _compile(item):
    source, expr = item
    t0 = time.perf_counter()
    try:
        _backend.function(source, expr)
        return source, expr, time.perf_counter() - t0, None
    except Exception as exc:  # a compile error: reported, the others go on
        return source, expr, time.perf_counter() - t0, f"{type(exc).__name__}: {exc}"[:2000]


class _Stop(Exception):
    pass


def _raise_stop(signum, frame):
    raise _Stop(signal.Signals(signum).name)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--emulator", action="store_true", help="build the CPU emulator's libraries instead")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes (default: cores)")
    ap.add_argument("--deadline", type=float, default=None, help="stop after this many seconds")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    items = emulator_items() if args.emulator else gpu_items()
    jobs = max(1, min(args.jobs, len(items)))
    where = "emulator libraries" if args.emulator else \
        f"CuPy kernel cache {os.environ.get('CUPY_CACHE_DIR', '~/.cupy/kernel_cache')}"
    print(f"warm-up: {len(items)} {'sources' if args.emulator else 'instantiations'} -> {where}, "
          f"{jobs} processes", flush=True)
    done, failed, stopped = [], [], None
    signal.signal(signal.SIGTERM, _raise_stop)
    signal.signal(signal.SIGINT, _raise_stop)
    pool = mp.get_context("spawn").Pool(jobs, initializer=_init_worker, initargs=(args.emulator,))
    try:
        results = pool.imap_unordered(_compile, items)
        for _ in items:
            timeout = None
            if args.deadline is not None:
                timeout = args.deadline - (time.perf_counter() - t_start)
                if timeout <= 0:
                    raise mp.TimeoutError
            source, expr, seconds, error = results.next(timeout=timeout)
            (failed if error else done).append((source, expr, seconds, error))
            status = "FAIL" if error else "ok"
            print(f"[{time.perf_counter() - t_start:6.1f}s] {status:<4} {seconds:6.2f}s  {source}: {expr}", flush=True)
            if error:
                print("      " + error.replace("\n", "\n      ")[:1500], flush=True)
        pool.close()
    except mp.TimeoutError:
        stopped = f"deadline of {args.deadline:.0f} s"
    except (_Stop, KeyboardInterrupt) as exc:
        stopped = f"interrupted ({str(exc) or 'SIGINT'})"
    except Exception:
        traceback.print_exc()
        stopped = "crashed (traceback above)"
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if stopped:
            pool.terminate()
        pool.join()
    total = time.perf_counter() - t_start
    compiled = sum(s for _, _, s, _ in done)
    missing = len(items) - len(done) - len(failed)
    print(f"warm-up summary: {len(done)} ok, {len(failed)} failed, {missing} not reached, "
          f"{total:.1f} s wall ({compiled:.1f} s of compiling in {jobs} processes)"
          + (f"; stopped: {stopped}" if stopped else ""), flush=True)
    for source, expr, _, error in failed:
        print(f"  FAIL {source}: {expr}: {error.splitlines()[0] if error else ''}"[:300])
    if stopped:
        return 124
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
