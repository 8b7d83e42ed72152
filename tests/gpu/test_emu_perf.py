"""The emulator's performance counters (tools/cuda_emu/perfcount.py): the counting model on
access patterns with known answers (perf_patterns.cu), and the hot kernels held to the
thresholds justified in benchmarks/RESULTS.md ("Emulator performance counters"):

* shared memory: every inner-loop access of gk_la_chunk_prep, gk_la_chunk_state,
  gk_attn_simt and gk_attn_tc conflict-free (1 way), and so are the transposing stores the
  bank-conflict fixes of issue 16 made so (K^T, P, Q^T of gk_attn_simt; Ks/Gs of the prep);
  no kernel of these above 1.05 wavefronts per ideal wavefront overall;
* the TF32 variants (allow_tf32, issue 16: gk_attn_tc<float, ...>, gk_conv_tc<float, ...>,
  run on the report's attn_f32 / conv_f32 cases with a TF32 backend): their fragment loads
  (32-bit loads, not ldmatrix) conflict-free, the attention kernel within 1.05 wavefronts
  overall (the conv kernel's 16-byte weight-tile stores are 2-way, as in the half kernel:
  outside the inner loop);
* global memory: the main loads (Q/K/V tiles, the linear-attention inputs and workspaces)
  at the ideal number of 32-byte sectors per request (inputs 256-byte aligned, rows a
  multiple of 32 bytes, as in the report's cases).

The lines are named by their code (perfcount.find_line), not by number.  The counted
builds compile once per kernel (about 5 s of CPU each) and are cached like every emulator
build; the launches take a few seconds.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import emulator
import perfcount

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PATTERNS = HERE / "perf_patterns.cu"


def _report_module():
    spec = importlib.util.spec_from_file_location("emu_perf_report", REPO / "scripts" / "emu_perf_report.py")
    mod = sys.modules.get(spec.name)
    if mod is None:
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # (its dataclasses look their module up)
        spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def perf_backend():
    if shutil.which(emulator.CXX) is None or shutil.which("addr2line") is None:
        pytest.skip("the emulator's performance counters need a C++ compiler and addr2line")
    return emulator.EmuBackend(perf=True)


# ---------------------------------------------------------------------- the model
def _pattern_lines() -> dict:
    tags = {}
    for i, line in enumerate(PATTERNS.read_text().splitlines(), 1):
        m = re.search(r"// ([PGLC]\d+):", line)
        if m:
            tags[m.group(1)] = i
    return tags


@pytest.fixture(scope="module")
def patterns(perf_backend):
    be = perf_backend
    fn = be.function(str(PATTERNS), "gk_perf_patterns")
    g = be.empty((2048,), np.float32)  # 256-byte aligned (upload would keep a host array's alignment)
    g.view(np.ndarray)[...] = np.arange(2048, dtype=np.float32)
    out = be.empty((32,), np.float32)
    be.perf.reset()
    be.launch(fn, (1,), (32,), (g, out), 0, what="perf patterns")
    rows = be.perf.rows("gk_perf_patterns")
    lines = _pattern_lines()

    def row(tag, space, op="load"):
        hits = [r for r in rows if r.file == PATTERNS.name and r.line == lines[tag] and r.space == space
                and r.op == op]
        assert len(hits) == 1, f"{tag}: {len(hits)} rows ({space} {op}) at line {lines[tag]}"
        return hits[0]

    return row


@pytest.mark.parametrize("tag,ways,requests,lanes", [
    ("P1", 32, 1, 32), ("P2", 1, 1, 32), ("P3", 2, 1, 32), ("P4", 1, 1, 32), ("P5", 16, 1, 32),
    ("P9", 16, 1, 16), ("P10", 1, 4, 128), ("P11", 24, 3, 48)])
def test_model_bank_ways(patterns, tag, ways, requests, lanes):
    r = patterns(tag, "shared")
    assert (r.ways_max, r.requests, r.lanes) == (ways, requests, lanes)


def test_model_divergent_loop_is_grouped_by_iteration(patterns):
    # lanes < 8 r take part in iteration r: one request per iteration, each as many ways
    # as lanes (8 + 16 + 24), not lanes of different iterations merged
    r = patterns("P11", "shared")
    assert r.ways_sum == 8 + 16 + 24 and r.conflicted == 3


@pytest.mark.parametrize("tag,ways,wavefronts", [("P6", 1, 4), ("P7", 2, 8), ("P8", 1, 2)])
def test_model_wide_accesses_in_phases(patterns, tag, ways, wavefronts):
    r = patterns(tag, "shared")
    assert (r.ways_max, r.wavefronts) == (ways, wavefronts)
    assert r.ideal_wavefronts == {"P6": 4, "P7": 4, "P8": 2}[tag]


@pytest.mark.parametrize("tag,sectors,ideal", [("G1", 4, 4), ("G2", 8, 4), ("G3", 32, 4), ("G4", 1, 1),
                                               ("G5", 16, 16), ("G6", 5, 4)])
def test_model_global_sectors(patterns, tag, sectors, ideal):
    r = patterns(tag, "global")
    assert (r.requests, r.sectors, r.ideal_sectors) == (1, sectors, ideal)


def test_model_store_and_collectives(patterns):
    st = patterns("G7", "global", "store")
    assert (st.sectors, st.ideal_sectors) == (4, 4)
    l1, l2 = patterns("L1", "shared"), patterns("L2", "shared")  # ldmatrix: a phase per 8x8 matrix
    assert (l1.ways_max, l1.wavefronts, l2.ways_max, l2.wavefronts) == (8, 32, 1, 4)
    cg, cst = patterns("C1", "global"), patterns("C1", "shared", "store")  # byte-wise cp.async = 16 bytes
    assert (cg.sectors, cg.ideal_sectors, cg.bytes) == (16, 16, 512)
    assert (cst.ways_max, cst.wavefronts) == (1, 4)


def test_plain_backend_counts_nothing():
    assert emulator.EmuBackend().perf is None


# ---------------------------------------------------------------------- the hot kernels
@pytest.fixture(scope="module")
def hot(perf_backend):
    rep = _report_module()
    perf_backend.perf.reset()
    rep.collect(["la_chunked", "attn_f32", "attn_f16"], perf_backend)
    rows = perf_backend.perf.rows()
    tf32 = emulator.EmuBackend(perf=True, allow_tf32=True)  # the float32 cases on the TF32 kernels
    rep.collect(["attn_f32", "conv_f32"], tf32)
    return rows + tf32.perf.rows()


# (kernel, file, code on the line, space, op): must be conflict-free (max 1 way)
CONFLICT_FREE = [
    # gk_la_chunk_prep: A = beta K K^T (lane = key j), M = Q K^T (lane = key s), the substitution
    ("gk_la_chunk_prep", "acc += Ks[i * lk + d] * Ks[j * lk + d] * expf(Gs[i * lg + d] - Gs[j * lg + d]);"),
    ("gk_la_chunk_prep", "acc += Qs[i * dk + d] * Ks[s * lk + d] * expf(Gs[i * lg + d] - Gs[s * lg + d]);"),
    ("gk_la_chunk_prep", "for (int j = 0; j < i; ++j) r -= A[i * C + j] * X[j * nt + tid];"),
    ("gk_la_chunk_prep", "Ks[i * lk + d] = t < T_"),
    ("gk_la_chunk_prep", "Gs[i * lg + d] = acc;"),
    # gk_la_chunk_state: U = U0 - W S, O = Q S + M U, S += Kd^T U
    ("gk_la_chunk_state", "for (int d = 0; d < dk; ++d) acc -= Wm[i * dk + d] * S[d * NT + n];"),
    ("gk_la_chunk_state", "for (int d = 0; d < dk; ++d) acc += Qs[i * dk + d] * S[d * NT + n];"),
    ("gk_la_chunk_state", "for (int s = 0; s <= i; ++s) acc += M[i * C + s] * U[s * NT + n];"),
    ("gk_la_chunk_state", "for (int i = 0; i < C; ++i) acc += Kd[i * dk + d] * U[i * NT + n];"),
    # gk_attn_simt: the two products, and the transposing stores issue 16 named
    ("gk_attn_simt<64, 64>", "gk::lds<TM>(Qs + d * QLD + ty * TM, aq);"),
    ("gk_attn_simt<64, 64>", "gk::lds<TN>(Ks + d * KLD + tx * TN, bk);"),
    ("gk_attn_simt<64, 64>", "gk::lds<4>(Ps + (ty * TM + i) * PLD + c0, ap[i]);"),
    ("gk_attn_simt<64, 64>", "gk::lds<4>(Vs + (c0 + cc) * VLD + qd * 64 + tx * 4, vv);"),
    ("gk_attn_simt<64, 64>", "Ks[d * KLD + c] = kv.x;"),
    ("gk_attn_simt<64, 64>", "Ks[(d + 3) * KLD + c] = kv.w;"),
    ("gk_attn_simt<64, 64>", "*reinterpret_cast<float4*>(Vs + c * VLD + d) = vv;"),
    ("gk_attn_simt<64, 64>", "sts<TN>(Ps + (ty * TM + i) * PLD + tx * TN, s[i]);"),
    ("gk_attn_simt<64, 64>", "Qs[d * QLD + r] = val;"),
    # gk_attn_tc: fragments of Q, K and V (ldmatrix for __half; 32-bit loads for TF32), the
    # 16-byte tile copies
    *((kernel, text) for kernel in ("gk_attn_tc<__half, 64, 4>", "gk_attn_tc<float, 64, 4>") for text in (
        "TC::load_a(af, Qs + warp * 16 * LDK", "TC::load_b_nk(b0, b1, Kb + n2 * 16 * LDK",
        "TC::load_b_kn(b0, b1, Vb + kk * KS * LDV", "copy_chunk16(dst, src, q, d, a.D, a.vec_ok);",
        "copy_chunk16(dst, src, k, d, a.D, a.vec_ok);", "copy_chunk16(dst, src, v, d, a.Dv, a.vec_ok);")),
    # gk_conv_tc (TF32): the fragment loads of the inner loop
    ("gk_conv_tc<float, 64, false>", "TC::load_a(af[i], &As[buf]"),
    ("gk_conv_tc<float, 64, false>", "TC::load_b_kn(bf[2 * j2], bf[2 * j2 + 1], &Bs[buf]"),
]

# (kernel, code on the line): global loads at the ideal sectors per request
IDEAL_SECTORS = [
    ("gk_la_chunk_prep", "Ks[i * lk + d] = t < T_ ? gk::to_float(k["),
    ("gk_la_chunk_prep", "Qs[e] = t < T_ ? gk::to_float(q["),
    ("gk_la_chunk_prep", "r = t < T_ ? gk::to_float(v["),
    ("gk_la_chunk_state", "float kv = t < T_ ? gk::to_float(k["),
    ("gk_la_chunk_state", "float qv = t < T_ ? gk::to_float(q["),
    ("gk_la_chunk_state", "if (delta) Wm[e] = wm[w * C * dk + e];"),
    ("gk_la_chunk_state", "if (delta) uv = active ? u0[(w * C + i) * dv + col] : 0.0f;"),
    ("gk_attn_simt<64, 64>", "if (d < a.D) kv = *reinterpret_cast<const float4*>(kv_row(k,"),
    ("gk_attn_simt<64, 64>", "if (d < a.Dv) vv = *reinterpret_cast<const float4*>(kv_row(v,"),
    ("gk_attn_simt<64, 64>", "if (rho < a.M && d < a.D) val = q_row_f(q, a, rho)[d] * a.scale;"),
    ("gk_attn_tc<__half, 64, 4>", "copy_chunk16(dst, src, k, d, a.D, a.vec_ok);"),
    ("gk_attn_tc<__half, 64, 4>", "copy_chunk16(dst, src, v, d, a.Dv, a.vec_ok);"),
    ("gk_attn_tc<float, 64, 4>", "copy_chunk16(dst, src, q, d, a.D, a.vec_ok);"),
    ("gk_attn_tc<float, 64, 4>", "copy_chunk16(dst, src, k, d, a.D, a.vec_ok);"),
    ("gk_attn_tc<float, 64, 4>", "copy_chunk16(dst, src, v, d, a.Dv, a.vec_ok);"),
    ("gk_conv_tc<float, 64, false>", "ra[j] = gk::load_vec<T, CH>(wg + (i64)mr * Kg + kc);"),
]

WAVEFRONT_LIMIT = 1.05  # whole kernel, shared memory: wavefronts / ideal wavefronts


def _rows_at(rows, kernel, text, space, op=None):
    source = "linear_attention.cu" if kernel.startswith("gk_la") else "conv.cu" if kernel.startswith("gk_conv") \
        else "attention.cu"
    line = perfcount.find_line(source, text)
    hits = [r for r in rows if r.kernel.startswith(kernel) and r.file == source and r.line == line
            and r.space == space and (op is None or r.op == op)]
    assert hits and sum(r.requests for r in hits), f"{kernel}: no {space} access counted at {source}:{line} ({text})"
    return hits


@pytest.mark.parametrize("kernel,text", CONFLICT_FREE, ids=[f"{k}:{t[:40]}" for k, t in CONFLICT_FREE])
def test_hot_shared_accesses_conflict_free(hot, kernel, text):
    for r in _rows_at(hot, kernel, text, "shared"):
        assert r.ways_max == 1, f"{r.kernel} {r.file}:{r.line} {r.op}: {r.ways_max}-way bank conflicts " \
                                f"({r.conflicted}/{r.requests} requests)  {r.code}"


@pytest.mark.parametrize("kernel,text", IDEAL_SECTORS, ids=[f"{k}:{t[:40]}" for k, t in IDEAL_SECTORS])
def test_hot_main_loads_ideal_sectors(hot, kernel, text):
    for r in _rows_at(hot, kernel, text, "global", "load"):
        assert r.sectors == r.ideal_sectors, f"{r.kernel} {r.file}:{r.line}: {r.sectors_per_request:.2f} sectors " \
                                             f"per request, ideal {r.ideal_sectors_per_request:.2f}  {r.code}"


@pytest.mark.parametrize("kernel", ["gk_la_chunk_prep", "gk_la_chunk_state", "gk_attn_simt<64, 64>",
                                    "gk_attn_tc<__half, 64, 4>", "gk_attn_tc<float, 64, 4>"])
def test_hot_kernel_wavefronts(hot, kernel):
    sh = [r for r in hot if r.kernel.startswith(kernel) and r.space == "shared"]
    assert sh, f"{kernel}: no shared accesses counted"
    ratio = sum(r.wavefronts for r in sh) / sum(r.ideal_wavefronts for r in sh)
    worst = max(sh, key=lambda r: r.wavefront_ratio)
    assert ratio <= WAVEFRONT_LIMIT, f"{kernel}: {ratio:.2f} wavefronts per ideal (worst: line {worst.line}, " \
                                     f"{worst.ways_max}-way, {worst.code})"
