#!/usr/bin/env python3
"""Shared-memory bank conflicts and global-memory coalescing of the hand-written CUDA kernels,
counted by the CPU emulator (no GPU needed).

    python scripts/emu_perf_report.py                   # every case, one table per kernel
    python scripts/emu_perf_report.py --case attn_f32   # some cases (repeat --case)
    python scripts/emu_perf_report.py --summary         # one line per kernel
    python scripts/emu_perf_report.py --sites           # one row per access instruction
    python scripts/emu_perf_report.py --list

Each case launches one operator's CUDA path once on small, representative shapes (inputs
256-byte aligned, as fresh CuPy allocations are) on an ``EmuBackend(perf=True)``: the
kernels are built with the emulator's performance counters (tools/cuda_emu/perfcount.py;
the model is in tools/cuda_emu/README.md, "Performance counters").  Per kernel and source
line the table shows the warp instructions ("requests"), mean active lanes, and

  shared memory   ways mean/max (1 = conflict-free; n = n distinct words in one bank in one
                  phase), the share of requests with a conflict, wavefronts / ideal
  global memory   32-byte sectors per request, the ideal (distinct bytes / 32), their ratio

The thresholds CI holds the hot kernels to are in tests/gpu/test_emu_perf.py, justified
in benchmarks/RESULTS.md ("Emulator performance counters").  Takes about a minute the first
time (the counted builds compile), seconds afterwards.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

REPO = Path(__file__).resolve().parents[1]
for p in (REPO, REPO / "tools" / "cuda_emu"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import emulator  # noqa: E402
import perfcount  # noqa: E402
from gpukernels.dtypes import DataType  # noqa: E402
from gpukernels.tensor import Tensor  # noqa: E402

_TYPES = {"float32": (np.float32, DataType.FLOAT), "float16": (np.float16, DataType.FLOAT16)}


def aligned(a: np.ndarray) -> np.ndarray:
    """a copied into a 256-byte aligned host array (emulator.upload keeps the address
    modulo 256, so the device copy is aligned as a fresh CuPy allocation is)."""
    a = np.ascontiguousarray(a)
    buf = np.empty(a.nbytes + 256, np.uint8)
    off = (-buf.ctypes.data) % 256
    out = buf[off:off + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


def _t(rng, shape, dtype="float32", scale=1.0) -> Tensor:
    npt, onnx = _TYPES[dtype]
    return Tensor(aligned((rng.standard_normal(shape) * scale).astype(npt)), onnx)


# ---------------------------------------------------------------------- cases
def la_chunked(be, rng, dk=64, dv=64):
    """LinearAttention gated_delta, per-key decay, chunked (prep + state): B 1, T 64 (two
    chunks of 32), 1 head, d_k = d_v = 64 (a multiple of 32: the case the prep's row
    padding is for)."""
    from gpukernels.gpu import linear_attention as m

    B, T = 1, 64
    k = rng.standard_normal((B, T, dk))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    emulator.run_op(m.run, be, query=_t(rng, (B, T, dk), scale=0.5), key=Tensor(aligned(k.astype(np.float32)),
                    DataType.FLOAT), value=_t(rng, (B, T, dv)), past_state=None,
                    decay=Tensor(aligned(rng.uniform(-0.5, -0.01, (B, T, dk)).astype(np.float32)), DataType.FLOAT),
                    beta=Tensor(aligned(rng.uniform(0.1, 0.9, (B, T, 1)).astype(np.float32)), DataType.FLOAT),
                    kv_num_heads=1, q_num_heads=1, scale=0.0, update_rule="gated_delta", mode="chunked")


def la_recurrent(be, rng):
    """LinearAttention gated_delta, per-head decay, recurrent: B 1, T 16, 2 heads, d 64."""
    from gpukernels.gpu import linear_attention as m

    B, T, H, d = 1, 16, 2, 64
    k = rng.standard_normal((B, T, H, d))
    k = (k / np.linalg.norm(k, axis=-1, keepdims=True)).reshape(B, T, H * d).astype(np.float32)
    emulator.run_op(m.run, be, query=_t(rng, (B, T, H * d), scale=0.5), key=Tensor(aligned(k), DataType.FLOAT),
                    value=_t(rng, (B, T, H * d)), past_state=_t(rng, (B, H, d, d), scale=0.3),
                    decay=Tensor(aligned(rng.uniform(-0.5, -0.01, (B, T, H)).astype(np.float32)), DataType.FLOAT),
                    beta=Tensor(aligned(rng.uniform(0.1, 0.9, (B, T, H)).astype(np.float32)), DataType.FLOAT),
                    kv_num_heads=H, q_num_heads=H, scale=0.0, update_rule="gated_delta", mode="recurrent")


def _attention(be, rng, dtype, B, H, Sq, Skv, D, causal=0):
    from gpukernels.gpu import attention as m

    emulator.run_op(m.run, be, Q=_t(rng, (B, H, Sq, D), dtype), K=_t(rng, (B, H, Skv, D), dtype),
                    V=_t(rng, (B, H, Skv, D), dtype), is_causal=causal, wants=(True, False, False, False))


def attn_f32(be, rng):
    """Attention float32 prefill (gk_attn_simt<64, 64>): B 1, 2 heads, 128 x 128, D 64."""
    _attention(be, rng, "float32", 1, 2, 128, 128, 64)


def attn_f32_d128(be, rng):
    """Attention float32 prefill, D 128 (gk_attn_simt<128, 64>): B 1, 1 head, 64 x 128."""
    _attention(be, rng, "float32", 1, 1, 64, 128, 128)


def attn_f32_decode(be, rng):
    """Attention float32 decoding, split-KV (gk_attn_simt<64, 16> + gk_attn_combine): 1 query,
    512 keys, 2 heads, D 64."""
    _attention(be, rng, "float32", 1, 2, 1, 512, 64)


def attn_f16(be, rng):
    """Attention float16 prefill on tensor cores (gk_attn_tc<__half, 64, 4>): B 1, 2 heads,
    128 x 128, D 64."""
    _attention(be, rng, "float16", 1, 2, 128, 128, 64)


def _conv(be, rng, dtype, xs, ws, group=1):
    from gpukernels.gpu import conv as m

    n_sp = len(xs) - 2
    emulator.run_op(m.run, be, X=_t(rng, xs, dtype), W=_t(rng, ws, dtype), B=_t(rng, (ws[0],), dtype),
                    strides=[1] * n_sp, pads=[1] * (2 * n_sp), dilations=[1] * n_sp, group=group)


def conv_f32(be, rng):
    """Conv float32 3x3 (implicit GEMM, gk_conv_simt): X 1x32x16x16, W 64x32x3x3."""
    _conv(be, rng, "float32", (1, 32, 16, 16), (64, 32, 3, 3))


def conv_f16(be, rng):
    """Conv float16 3x3 on tensor cores (gk_conv_tc): X 1x32x16x16, W 64x32x3x3."""
    _conv(be, rng, "float16", (1, 32, 16, 16), (64, 32, 3, 3))


def conv_depthwise(be, rng):
    """Depthwise Conv float32 3x3 (gk_conv_direct): X 1x32x16x16, W 32x1x3x3."""
    _conv(be, rng, "float32", (1, 32, 16, 16), (32, 1, 3, 3), group=32)


def rotary(be, rng):
    """RotaryEmbedding float32, position ids: X 1x4x64x64 (B, H, S, D)."""
    from gpukernels.gpu import rotary_embedding as m

    B, H, S, D = 1, 4, 64, 64
    ang = rng.uniform(-3, 3, (S, D // 2))
    emulator.run_op(m.run, be, X=_t(rng, (B, H, S, D)),
                    cos_cache=Tensor(aligned(np.cos(ang).astype(np.float32)), DataType.FLOAT),
                    sin_cache=Tensor(aligned(np.sin(ang).astype(np.float32)), DataType.FLOAT),
                    position_ids=Tensor(aligned(np.arange(S, dtype=np.int64)[None]), DataType.INT64),
                    interleaved=0, num_heads=None, rotary_embedding_dim=0)


@dataclass(frozen=True)
class Case:
    name: str
    run: Callable


CASES = {c.name: c for c in (
    Case("la_chunked", la_chunked), Case("la_recurrent", la_recurrent), Case("attn_f32", attn_f32),
    Case("attn_f32_d128", attn_f32_d128), Case("attn_f32_decode", attn_f32_decode), Case("attn_f16", attn_f16),
    Case("conv_f32", conv_f32), Case("conv_f16", conv_f16), Case("conv_depthwise", conv_depthwise),
    Case("rotary", rotary))}


def collect(names=None, backend=None, seed: int = 0, log=None):
    """Run the cases `names` (default: all) on a perf EmuBackend (given or new); returns it
    (counters in backend.perf)."""
    be = backend if backend is not None else emulator.EmuBackend(perf=True)
    if be.perf is None:
        raise ValueError("collect needs an EmuBackend(perf=True)")
    rng = np.random.default_rng(seed)
    for name in names or CASES:
        t0 = time.perf_counter()
        CASES[name].run(be, rng)
        if log:
            log(f"{name}: {time.perf_counter() - t0:.1f} s")
    return be


def summary(rows) -> str:
    """One line per kernel: shared requests, the worst line's ways, the conflicted share, the
    wavefront ratio; global requests and the sector ratio."""
    by: dict = {}
    for r in rows:
        by.setdefault(r.kernel, []).append(r)
    out = [f"{'kernel':44} {'sh.req':>8} {'maxways':>7} {'confl':>6} {'wavef':>6} {'gl.req':>7} {'sectors':>7}"]
    for k, rs in by.items():
        sh = [r for r in rs if r.space == "shared"]
        gl = [r for r in rs if r.space == "global"]
        req = sum(r.requests for r in sh)
        wf = sum(r.wavefronts for r in sh) / max(1, sum(r.ideal_wavefronts for r in sh))
        conf = sum(r.conflicted for r in sh) / max(1, req)
        sec = sum(r.sectors for r in gl) / max(1, sum(r.ideal_sectors for r in gl))
        out.append(f"{k:44} {req:>8d} {max((r.ways_max for r in sh), default=0):>7d} {100 * conf:>5.1f}% {wf:>6.2f} "
                   f"{sum(r.requests for r in gl):>7d} {sec:>7.2f}")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", action="append", choices=sorted(CASES), help="run only these cases (repeatable)")
    ap.add_argument("--kernel", help="show only kernels whose name starts with this")
    ap.add_argument("--summary", action="store_true", help="one line per kernel instead of the tables")
    ap.add_argument("--sites", action="store_true",
                    help="one row per access instruction (LINE#n, in code order) instead of per source line")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    args = ap.parse_args(argv)
    if args.list:
        for c in CASES.values():
            print(f"{c.name:16} {' '.join((c.run.__doc__ or '').split())}")
        return 0
    t0 = time.perf_counter()
    be = collect(args.case, log=lambda m: print(f"  {m}", file=sys.stderr))
    rows = be.perf.rows(args.kernel)
    print("== emulator performance counters (bank-conflict ways per warp shared access; 32-byte sectors per "
          "warp global access)")
    print(summary(rows))
    if not args.summary:
        print()
        print(perfcount.format_table(be.perf.rows(args.kernel, by_site=True) if args.sites else rows,
                                     be.perf.launches))
    print(f"\n({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
