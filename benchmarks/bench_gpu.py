"""GPU check: selftests, parity and benchmarks of the hand-written CUDA kernels.

    python benchmarks/bench_gpu.py                 # on a machine with a GPU, CuPy and (optionally) PyTorch
    python benchmarks/bench_gpu.py --parity-only   # selftests + parity    (scripts/gpu_check.sh step 3)
    python benchmarks/bench_gpu.py --bench-only    # benchmarks            (scripts/gpu_check.sh step 4)
    python benchmarks/bench_gpu.py --emulator      # selftests + parity (small) on the CPU emulator
    scripts/gpu_check.sh                           # the whole device check with time budgets

1. selftests (cuda/selftest.cu): warp shuffles/votes, barriers, atomics, and the mma layer
   (mma.sync f16/bf16/tf32, ldmatrix, cp.async) against NumPy -- what makes the emulator's
   results for the real kernels trustworthy;
2. parity: every operator case runs three ways -- the CUDA kernel (context option
   cuda_kernels='always', outputs poisoned with NaN bytes before each run), the kernel
   class' array path on the same device (cuda_kernels='never') and a float64 NumPy
   reference -- on fresh random inputs, compared with gpukernels.gpu.parity tolerances;
3. benchmarks against PyTorch (when importable) and the array path, outputs NOT poisoned
   (poisoning writes every output once more).  A kernel's time is measured with CUDA
   events around replays of its prepared launches (the launches one run() made, recorded
   with their arguments and replayed without the Python launch code) and, where CuPy can
   capture it, as a CUDA graph; the host time of one run() call (validation, allocation,
   argument packing, launch) is reported separately.  float32 PyTorch baselines run twice:
   IEEE float32 (fp32_precision='ieee', the CUDA-core baseline our float32 kernels compare
   with) and TF32.

--deadline S (default: env GPUKERNELS_BENCH_BUDGET or 420) stops starting new cases after S
seconds; SIGINT/SIGTERM stop the current one.  Either way the summary table is printed
last (and written to --summary FILE); exits 1 when a selftest or parity case failed, 124
when stopped early or when the deadline left cases unrun (without failures): a check that
skipped cases for lack of time did not pass.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import statistics
import sys
import time
import traceback
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("GPUKERNELS_CUDA_POISON", "1")

import ml_dtypes  # noqa: E402

from gpukernels.dtypes import DataType  # noqa: E402
from gpukernels.gpu import device_checks, parity, selftest  # noqa: E402
from gpukernels.gpu.launch import check_launch  # noqa: E402
from gpukernels.kernels.base import KernelContext  # noqa: E402

DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
START = time.perf_counter()
ROWS: list[tuple[str, str, str, str]] = []  # (section, case, status, detail)
# seconds after START after which no new case starts (the table still prints); --deadline
DEADLINE = float(os.environ.get("GPUKERNELS_BENCH_BUDGET", "420"))


def elapsed() -> float:
    return time.perf_counter() - START


def time_left(section: str, case: str) -> bool:
    """False (and a 'skip' row) once the deadline has passed: call before each case."""
    if elapsed() > DEADLINE:
        record(section, case, "skip", "time budget")
        return False
    return True


def record(section, case, ok, detail=""):
    status = "ok" if ok is True else ("FAIL" if ok is False else str(ok))
    ROWS.append((section, case, status, detail))
    print(f"[{elapsed():6.1f}s] {section:<9} {case:<58} {status:<5} {detail}", flush=True)


# ------------------------------------------------------------------ environments


class GpuEnv:
    name = "cuda"

    def __init__(self):
        import cupy

        from gpukernels.gpu.launch import CupyBackend
        from gpukernels.xp import Device

        self.cp = cupy
        self.backend = CupyBackend(Device("cuda", 0))
        self.backend.poison = True  # selftests and parity: outputs start as NaN bytes
        # benchmarks: no poisoning (it writes every output once more: a third more traffic
        # for RotaryEmbedding)
        self.bench_backend = CupyBackend(Device("cuda", 0))
        self.bench_backend.poison = False

    def kernel(self, cls, cuda: bool, options=None):
        opts = dict(options or {})
        opts["cuda_kernels"] = "always" if cuda else "never"
        return cls(KernelContext("cuda", options=opts))

    def launches(self, op):
        """How many times op's CUDA kernel ran since this environment was made."""
        if not hasattr(self, "_chosen"):
            from gpukernels.kernels import specialize

            self._recording = specialize.recording()
            self._chosen = self._recording.__enter__()
        return sum(s.site == f"{op}.cuda_kernel" for s in self._chosen)


class EmuEnv:
    name = "emulator"

    def __init__(self):
        sys.path.insert(0, str(REPO / "tools" / "cuda_emu"))
        import emulator

        self.emulator = emulator
        self.backend = emulator.EmuBackend()
        self.count = {}

    def kernel(self, cls, cuda: bool, options=None):
        k = cls(KernelContext("cpu", options=dict(options or {})))
        if cuda:
            import importlib

            from gpukernels.gpu import accelerated

            module = importlib.import_module(accelerated._MODULES[k.op_type])

            def cuda_path(**arguments):
                extra = module.run_options(k) if hasattr(module, "run_options") else {}
                r = self.emulator.run_op(module.run, self.backend, **arguments, **extra)
                if r is None:
                    raise RuntimeError(f"{k.op_type}: the CUDA path does not cover this case")
                self.count[k.op_type] = self.count.get(k.op_type, 0) + 1
                return r

            k.cuda_path = cuda_path
        return k

    def launches(self, op):
        return self.count.get(op, 0)


# ------------------------------------------------------------------ selftests


def run_selftests(env, rng):
    be = env.backend
    try:
        x = (rng.standard_normal(256) * 2).astype(np.float32)
        got = selftest.run_warp(be, x, block=128)
        w = x.reshape(-1, 32)
        ok = np.allclose(got[:, 0], np.repeat(w.astype(np.float64).sum(1), 32), rtol=1e-5, atol=1e-5)
        lanes = np.arange(32)
        ok &= np.array_equal(got[:, 1], w[:, (lanes * 7) % 32].ravel())
        ok &= np.array_equal(got[:, 3], np.where(lanes + 5 < 32, w[:, np.minimum(lanes + 5, 31)], w).ravel())
        bal = np.array([sum(1 << l for l in range(32) if r[l] > 0) for r in w], np.uint32)
        ok &= np.array_equal(got[:, 5].view(np.uint32), np.repeat(bal, 32))
        record("selftest", "warp shuffles / votes", bool(ok))
    except Exception as exc:
        record("selftest", "warp shuffles / votes", False, repr(exc)[:120])
    try:
        x = rng.standard_normal(1000).astype(np.float32)
        sums, total, counts = selftest.run_block(be, x, block=128)
        xp = np.zeros(1024, np.float32)
        xp[:1000] = x
        ok = np.allclose(sums, xp.reshape(8, 128).sum(1), rtol=1e-4, atol=1e-4)
        ok &= abs(float(total[0]) - float(x.sum())) < 1e-3
        ok &= np.array_equal(counts, (xp.reshape(8, 128) > 0).sum(1))
        record("selftest", "barriers / dynamic shared / atomics", bool(ok))
    except Exception as exc:
        record("selftest", "barriers / dynamic shared / atomics", False, repr(exc)[:120])
    for kind in ("f16", "bf16", "tf32"):
        try:
            A, B, C, want = selftest.mma_case(rng, kind)
            D = selftest.run_mma(be, kind, A, B, C)
            err = float(np.max(np.abs(D - want)))
            record("selftest", f"mma layer {kind} (ldmatrix, cp.async)", err < 1e-3, f"max err {err:.2e}")
        except Exception as exc:
            record("selftest", f"mma layer {kind}", False, repr(exc)[:120])


# ------------------------------------------------------------------ references (float64)


def rotary_reference(x, cos, sin, pos, interleaved, num_heads, rd):
    x = x.astype(np.float64)
    cos, sin = cos.astype(np.float64), sin.astype(np.float64)
    x4 = x.transpose(0, 2, 1, 3) if x.ndim == 4 else x.reshape(x.shape[0], x.shape[1], num_heads, -1)
    D = x4.shape[-1]
    rd = rd or D
    if pos is not None:
        cos, sin = cos[pos], sin[pos]
    c, s = cos[:, :, None, :], sin[:, :, None, :]
    out = x4.copy()
    if interleaved:
        a, b = x4[..., 0:rd:2], x4[..., 1:rd:2]
        out[..., 0:rd:2], out[..., 1:rd:2] = c * a - s * b, s * a + c * b
    else:
        a, b = x4[..., :rd // 2], x4[..., rd // 2:rd]
        out[..., :rd // 2], out[..., rd // 2:rd] = c * a - s * b, s * a + c * b
    return out.transpose(0, 2, 1, 3) if x.ndim == 4 else out.reshape(x.shape)


def la_reference(q, k, v, s0, decay, beta, rule, Hq, Hkv, scale):
    B, T, _ = q.shape
    dk, dv, G = q.shape[2] // Hq, v.shape[2] // Hkv, Hq // Hkv
    q = q.astype(np.float64).reshape(B, T, Hkv, G, dk)
    k = k.astype(np.float64).reshape(B, T, Hkv, dk)
    v = v.astype(np.float64).reshape(B, T, Hkv, dv)
    S = np.zeros((B, Hkv, dk, dv)) if s0 is None else s0.astype(np.float64).copy()
    out = np.zeros((B, T, Hkv, G, dv))
    for t in range(T):
        if decay is not None:
            d = decay[:, t].astype(np.float64)
            a = np.exp(d.reshape(B, Hkv, dk, 1) if d.shape[1] == Hkv * dk else d.reshape(B, Hkv, 1, 1))
            S = S * a
        u = v[:, t]
        if beta is not None:
            bt = beta[:, t].astype(np.float64).reshape(B, -1, 1)
            u = bt * (u - np.einsum("bhkv,bhk->bhv", S, k[:, t]))
        S = S + k[:, t, :, :, None] * u[:, :, None, :]
        out[:, t] = scale * np.einsum("bhgk,bhkv->bhgv", q[:, t], S)
    return out.reshape(B, T, Hq * dv), S


# ------------------------------------------------------------------ parity


def _compare3(section, case, cuda_out, array_out, ref, data_type, rtol=None, atol=None):
    m1 = parity.compare(cuda_out, array_out, data_type, rtol, atol, what="cuda vs array path")
    m2 = parity.compare(cuda_out, ref, data_type, rtol, atol, what="cuda vs float64")
    ok = m1 is None and m2 is None
    record(section, case, ok, "" if ok else (m1 or m2)[:160])
    return ok


def parity_rotary(env, rng, quick: bool):
    from gpukernels.kernels.nn.rotary import RotaryEmbedding

    cuda_k = env.kernel(RotaryEmbedding, True)
    array_k = env.kernel(RotaryEmbedding, False)
    small = env.name == "emulator"
    B, H, S, D = (2, 3, 5, 16) if small else (2, 4, 37, 96)
    for dtype in DTYPES:
        for rank in (3, 4):
            for inter in (0, 1):
                for rd in (0, D // 2):
                    for with_pos in (True, False):
                        if quick and (rd or not with_pos):
                            continue
                        t = DTYPES[dtype]
                        shape = (B, H, S, D) if rank == 4 else (B, S, H * D)
                        x = rng.standard_normal(shape).astype(t)
                        half = (rd or D) // 2
                        if with_pos:
                            ang = rng.uniform(-3, 3, (S + 7, half))
                            pos = rng.integers(0, S + 7, (B, S)).astype(np.int64)
                        else:
                            ang = rng.uniform(-3, 3, (B, S, half))
                            pos = None
                        cos, sin = np.cos(ang).astype(t), np.sin(ang).astype(t)
                        attrs = dict(interleaved=inter, rotary_embedding_dim=rd)
                        if rank == 3:
                            attrs["num_heads"] = H
                        case = f"RotaryEmbedding {dtype} rank{rank} {'inter' if inter else 'halves'} " \
                               f"rd={rd or D} {'pos' if with_pos else 'cache3'}"
                        if not time_left("parity", case):
                            continue
                        try:
                            n0 = env.launches("RotaryEmbedding")
                            y = cuda_k(x, cos, sin, pos, **attrs).numpy()
                            if env.launches("RotaryEmbedding") != n0 + 1:
                                raise RuntimeError("the CUDA kernel did not run")
                            ya = array_k(x, cos, sin, pos, **attrs).numpy()
                            ref = rotary_reference(x, cos, sin, pos, inter, H, rd)
                            _compare3("parity", case, y, ya, ref, DataType[{"float32": "FLOAT", "float16": "FLOAT16",
                                                                            "bfloat16": "BFLOAT16"}[dtype]])
                        except Exception as exc:
                            record("parity", case, False, repr(exc)[:160])


def parity_linear_attention(env, rng, quick: bool):
    from gpukernels.kernels.nn.linear_attention import LinearAttention

    small = env.name == "emulator"
    lengths = (1, 9) if small else (1, 40, 300)
    modes = [None] if small else [None, "recurrent"]
    for mode in modes:
        cuda_k = env.kernel(LinearAttention, True, {"linear_attention_mode": mode} if mode else None)
        array_k = env.kernel(LinearAttention, False)
        for dtype in DTYPES:
            for rule in ("linear", "gated", "delta", "gated_delta"):
                for T in lengths:
                    if quick and dtype != "float32" and T != lengths[-1]:
                        continue
                    if mode == "recurrent" and T != lengths[-1]:
                        continue
                    t = DTYPES[dtype]
                    B, Hq, Hkv, dk, dv = (2, 4, 2, 8, 12) if small else (2, 8, 4, 64, 96)
                    per_key = T % 2 == 0 or T == 1
                    q = (rng.standard_normal((B, T, Hq * dk)) * 0.5).astype(t)
                    kk = rng.standard_normal((B, T, Hkv, dk))
                    k = (kk / np.linalg.norm(kk, axis=-1, keepdims=True)).reshape(B, T, Hkv * dk).astype(t)
                    v = rng.standard_normal((B, T, Hkv * dv)).astype(t)
                    s0 = (rng.standard_normal((B, Hkv, dk, dv)) * 0.3).astype(t)
                    decay = rng.uniform(-0.3, -0.01, (B, T, Hkv * dk if per_key else Hkv)).astype(t) \
                        if rule in ("gated", "gated_delta") else None
                    beta = rng.uniform(0.1, 0.9, (B, T, Hkv)).astype(t) if rule in ("delta", "gated_delta") else None
                    attrs = dict(update_rule=rule, q_num_heads=Hq, kv_num_heads=Hkv)
                    case = f"LinearAttention {dtype} {rule} T={T}{' per-key' if decay is not None and per_key else ''}" \
                           f"{' ' + mode if mode else ''}"
                    if not time_left("parity", case):
                        continue
                    try:
                        n0 = env.launches("LinearAttention")
                        r = cuda_k(q, k, v, s0, decay, beta, **attrs)
                        if env.launches("LinearAttention") != n0 + 1:
                            raise RuntimeError("the CUDA kernel did not run")
                        ra = array_k(q, k, v, s0, decay, beta, **attrs)
                        ref_o, ref_s = la_reference(q, k, v, s0, decay, beta, rule, Hq, Hkv, 1 / math.sqrt(dk))
                        dt = r.output.data_type
                        tol = 1e-4 if dtype == "float32" else None
                        ok = _compare3("parity", case, r.output.numpy(), ra.output.numpy(), ref_o, dt, tol, tol)
                        if ok:
                            m = parity.compare(r.present_state.numpy(), ref_s, r.present_state.data_type, tol, tol,
                                               what="present_state vs float64")
                            if m:
                                record("parity", case + " state", False, m[:160])
                    except Exception as exc:
                        record("parity", case, False, repr(exc)[:160])


# ------------------------------------------------------------------ benchmarks


def _time_gpu(cp, fn, min_time=0.3, repeat=10):
    """Median seconds of fn() between CUDA events (host work inside fn included when the
    GPU waits for it): for PyTorch and the array path."""
    fn()
    cp.cuda.get_current_stream().synchronize()
    times = []
    t_start = time.perf_counter()
    while len(times) < repeat or time.perf_counter() - t_start < min_time:
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        times.append(cp.cuda.get_elapsed_time(e0, e1) / 1e3)
        if len(times) > 500:
            break
    return statistics.median(times)


class RecordingBackend:
    """The benchmark backend seen through run(): every launch is made and also kept
    (function, grid, block, arguments, shared memory) so that it can be replayed without
    the Python launch code.  Everything else goes to the wrapped backend."""

    def __init__(self, inner):
        self._inner = inner
        self.launches: list = []

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def launch(self, fn, grid, block, args, shared_mem: int = 0, what="kernel") -> None:
        self._inner.launch(fn, grid, block, args, shared_mem, what)
        grid, block = check_launch(self._inner, grid, block, shared_mem, str(what))
        args = tuple(np.uint64(0) if a is None else a for a in args)
        self.launches.append((fn, grid, block, args, int(shared_mem)))


def _replay(launches, times: int = 1) -> None:
    for _ in range(times):
        for fn, grid, block, args, smem in launches:
            fn(grid, block, args, shared_mem=smem)


class Timing:
    """One kernel's numbers: kernel seconds per call (CUDA events around replays of the
    prepared launches), the same as a CUDA graph (None when capture failed), and the host
    seconds of one run() call."""

    def __init__(self, kernel: float, graph, host: float, launches: int, graph_note: str = ""):
        self.kernel, self.graph, self.host, self.launches, self.graph_note = kernel, graph, host, launches, graph_note

    @property
    def best(self) -> float:
        return min(self.kernel, self.graph) if self.graph else self.kernel

    def text(self, scale: float = 1e3, unit: str = "ms") -> str:
        graph = f"graph {self.graph * scale:.3f}" if self.graph else f"graph n/a{self.graph_note}"
        return (f"{self.kernel * scale:.3f} {unit} ({graph}; {self.launches} launch"
                f"{'es' if self.launches > 1 else ''}; host {self.host * 1e6:.0f} us/run())")


def time_prepared(env, run, min_time: float = 0.2, repeat: int = 5) -> Timing:
    """Time run(backend) -- an operator's launch code -- on env.bench_backend."""
    cp = env.cp
    rec = RecordingBackend(env.bench_backend)
    run(rec)  # compiles (or loads from CuPy's cache) and records the launches
    cp.cuda.get_current_stream().synchronize()
    launches = rec.launches
    if not launches:
        raise RuntimeError("run() made no launch")
    # kernel time: events around `inner` replays (several when one replay is short)
    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
    _replay(launches, 2)
    e0.record()
    _replay(launches)
    e1.record()
    e1.synchronize()
    one = max(cp.cuda.get_elapsed_time(e0, e1) / 1e3, 1e-7)
    inner = int(max(1, min(200, 1e-3 / one)))
    times = []
    t_start = time.perf_counter()
    while len(times) < repeat or time.perf_counter() - t_start < min_time:
        e0.record()
        _replay(launches, inner)
        e1.record()
        e1.synchronize()
        times.append(cp.cuda.get_elapsed_time(e0, e1) / 1e3 / inner)
        if len(times) >= 200:
            break
    kernel = statistics.median(times)
    # host time of the launch code: calls queued without synchronisation between them (at
    # most 0.2 s of GPU work, so the launch queue never fills)
    n_host = int(max(3, min(20, 0.2 / max(kernel, 1e-9))))
    run(env.bench_backend)
    cp.cuda.get_current_stream().synchronize()
    t0 = time.perf_counter()
    for _ in range(n_host):
        run(env.bench_backend)
    host = (time.perf_counter() - t0) / n_host
    cp.cuda.get_current_stream().synchronize()
    graph, note = None, ""
    try:
        stream = cp.cuda.Stream(non_blocking=True)
        with stream:
            stream.begin_capture()
            try:
                _replay(launches, inner)
            finally:
                g = stream.end_capture()
            g.launch(stream)
            stream.synchronize()
            gt = []
            for _ in range(max(3, repeat)):
                e0.record(stream)
                g.launch(stream)
                e1.record(stream)
                e1.synchronize()
                gt.append(cp.cuda.get_elapsed_time(e0, e1) / 1e3 / inner)
        graph = statistics.median(gt)
    except Exception as exc:  # no graph support in this CuPy, capture refused...
        note = f" ({type(exc).__name__})"
    return Timing(kernel, graph, host, len(launches), note)


def torch_fp32(torch, mode: str) -> None:
    """PyTorch's float32 matmuls, convolutions and attention in 'ieee' (true float32, CUDA
    cores: our float32 kernels' baseline) or 'tf32' (tensor cores) precision: the
    fp32_precision API where this torch has it (2.9+), else the allow_tf32 switches."""
    if torch is None:
        return
    if hasattr(torch.backends, "fp32_precision"):
        for owner in (torch.backends, torch.backends.cuda.matmul, torch.backends.cudnn,
                      getattr(torch.backends.cudnn, "conv", None)):
            if owner is not None and hasattr(owner, "fp32_precision"):
                owner.fp32_precision = mode
        return
    torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
    torch.backends.cudnn.allow_tf32 = mode == "tf32"


def bench_rotary(env, rng, torch):
    from gpukernels.gpu import rotary_embedding as gr
    from gpukernels.kernels.nn.rotary import RotaryEmbedding
    from gpukernels.tensor import Tensor

    cp = env.cp
    # device-to-device copy bandwidth, the reference for the memory-bound target (80 %)
    buf = cp.empty(1 << 28, dtype=cp.uint8)
    dst = cp.empty_like(buf)
    t_copy = _time_gpu(cp, lambda: cp.copyto(dst, buf))
    copy_bw = 2 * buf.nbytes / t_copy
    record("bench", "device-to-device copy 256 MiB", "-", f"{copy_bw / 1e9:6.0f} GB/s (read + write)")
    del buf, dst
    for dtype, rank, inter, B in (("float32", 4, 0, 1), ("float16", 4, 0, 1), ("bfloat16", 4, 0, 1),
                                  ("float16", 3, 1, 8)):
        H, S, D = 32, 4096 if B == 1 else 2048, 128
        name = f"RotaryEmbedding {dtype} rank{rank}{' inter' if inter else ''} {B}x{H}x{S}x{D}"
        if not time_left("bench", name):
            continue
        t = DTYPES[dtype]
        shape = (B, H, S, D) if rank == 4 else (B, S, H * D)
        x = Tensor(rng.standard_normal(shape).astype(t), device="cuda")
        ang = rng.uniform(-3, 3, (S, D // 2))
        cos = Tensor(np.cos(ang).astype(t), device="cuda")
        sin = Tensor(np.sin(ang).astype(t), device="cuda")
        pos = Tensor(np.tile(np.arange(S, dtype=np.int64), (B, 1)), device="cuda")
        args = dict(X=x, cos_cache=cos, sin_cache=sin, position_ids=pos, interleaved=inter, num_heads=H,
                    rotary_embedding_dim=D)
        nbytes = 2 * x.array.nbytes + 2 * cos.array.nbytes + pos.array.nbytes
        tk = time_prepared(env, lambda be: gr.run(be, **args))
        arr_k = RotaryEmbedding(KernelContext("cuda", options={"cuda_kernels": "never"}))
        attrs = dict(interleaved=inter, rotary_embedding_dim=D, **({"num_heads": H} if rank == 3 else {}))
        with device_checks.deferred():  # the position check read once, not per timed call
            t_a = _time_gpu(cp, lambda: arr_k(x, cos, sin, pos, **attrs), min_time=0.2, repeat=3)
        t_k = tk.best
        detail = (f"{tk.text(1e6, 'us')} {nbytes / t_k / 1e9:5.0f} GB/s = {nbytes / t_k / copy_bw * 100:3.0f}% "
                  f"of copy (target 80%) | array path {t_a / t_k:4.1f}x")
        if torch is not None and dtype != "bfloat16":
            tt = {"float16": torch.float16, "float32": torch.float32}[dtype]
            tx = torch.randn(shape, device="cuda", dtype=tt)  # rank 4 (B, H, S, D)
            tc = torch.randn((S, D // 2), device="cuda", dtype=tt)
            ts = torch.randn((S, D // 2), device="cuda", dtype=tt)
            tp = torch.arange(S, device="cuda").repeat(B, 1)

            def torch_rope():
                c = tc[tp].unsqueeze(1)
                s_ = ts[tp].unsqueeze(1)
                x1, x2 = tx[..., :D // 2], tx[..., D // 2:]
                return torch.cat([x1 * c - x2 * s_, x1 * s_ + x2 * c], -1)

            t_t = _time_gpu(cp, torch_rope)
            detail += f" | torch eager {t_t / t_k:4.1f}x"
        record("bench", name, "-", detail)


def bench_linear_attention(env, rng, torch):
    from gpukernels.gpu import linear_attention as gla
    from gpukernels.kernels.nn.linear_attention import LinearAttention
    from gpukernels.tensor import Tensor

    cp = env.cp
    torch_fp32(torch, "ieee")
    for label, B, T, H, dk, dv in (("decode", 4, 1, 16, 128, 128), ("prefill", 4, 4096, 16, 128, 128)):
        name = f"LinearAttention gated_delta f32 {label} B={B} T={T} H={H} {dk}x{dv}"
        if not time_left("bench", name):
            continue
        t = np.float32
        q = Tensor((rng.standard_normal((B, T, H * dk)) * 0.1).astype(t), device="cuda")
        kk = rng.standard_normal((B, T, H, dk))
        k = Tensor((kk / np.linalg.norm(kk, axis=-1, keepdims=True)).reshape(B, T, H * dk).astype(t), device="cuda")
        v = Tensor(rng.standard_normal((B, T, H * dv)).astype(t), device="cuda")
        s0 = Tensor((rng.standard_normal((B, H, dk, dv)) * 0.1).astype(t), device="cuda")
        decay = Tensor(rng.uniform(-0.1, -0.01, (B, T, H)).astype(t), device="cuda")
        beta = Tensor(rng.uniform(0.1, 0.9, (B, T, H)).astype(t), device="cuda")
        args = dict(query=q, key=k, value=v, past_state=s0, decay=decay, beta=beta, chunk_size=64, kv_num_heads=H,
                    q_num_heads=H, scale=1 / math.sqrt(dk), update_rule="gated_delta")
        tk = time_prepared(env, lambda be: gla.run(be, **args))
        t_k = tk.best
        arr_k = LinearAttention(KernelContext("cuda", options={"cuda_kernels": "never"}))
        t_a = _time_gpu(cp, lambda: arr_k(q, k, v, s0, decay, beta, update_rule="gated_delta", q_num_heads=H,
                                          kv_num_heads=H), min_time=0.2, repeat=2)
        detail = f"{tk.text()} | array path {t_a / t_k:6.1f}x"
        if T == 1:  # decode: the state is read and written once (target 70 % of HBM, ~4.8 TB/s)
            state_bytes = 2 * s0.array.nbytes
            detail += f" | state {state_bytes / t_k / 1e9:5.0f} GB/s ({state_bytes / t_k / 4.8e12 * 100:3.0f}% of HBM)"
        else:  # chunked vs the recurrent kernel on the same input (target >= 10x)
            tr = time_prepared(env, lambda be: gla.run(be, **args, mode="recurrent"), min_time=0.1, repeat=2)
            detail += f" | recurrent kernel {tr.best / t_k:5.1f}x (target >= 10x)"
        if torch is not None and T <= 1024:
            tq = torch.randn((B, T, H, dk), device="cuda") * 0.1
            tkk = torch.nn.functional.normalize(torch.randn((B, T, H, dk), device="cuda"), dim=-1)
            tv = torch.randn((B, T, H, dv), device="cuda")
            tg = -torch.rand((B, T, H), device="cuda") * 0.1
            tb = torch.rand((B, T, H), device="cuda")
            tS = torch.randn((B, H, dk, dv), device="cuda") * 0.1

            def torch_recurrence():
                S = tS
                outs = []
                for i in range(T):
                    S = S * torch.exp(tg[:, i])[..., None, None]
                    r = torch.einsum("bhkv,bhk->bhv", S, tkk[:, i])
                    u = tb[:, i][..., None] * (tv[:, i] - r)
                    S = S + tkk[:, i][..., :, None] * u[..., None, :]
                    outs.append(torch.einsum("bhk,bhkv->bhv", tq[:, i], S))
                return torch.stack(outs, 1)

            t_t = _time_gpu(cp, torch_recurrence, min_time=0.2, repeat=2)
            detail += f" | torch eager (ieee fp32) {t_t / t_k:6.1f}x"
        record("bench", name, "-", detail)


# ------------------------------------------------------------------ main

# parity_<op>(env, rng, quick) and bench_<op>(env, rng, torch_or_None): add new operators here.
# env.kernel(cls, cuda=True/False, options) gives a kernel instance on the device (CUDA path
# forced / array path only); env.launches(op) counts CUDA launches; env.backend is the
# CupyBackend (GPU, outputs poisoned) or EmuBackend; env.bench_backend the unpoisoned one for
# timing (time_prepared); record(section, case, ok, detail) adds a table row; time_left(section,
# case) before each case honours the deadline.
PARITY = [parity_rotary, parity_linear_attention]
BENCHES = [bench_rotary, bench_linear_attention]

from gpu_attention_conv_cases import BENCHES as _AC_BENCHES, PARITY as _AC_PARITY  # noqa: E402

PARITY += _AC_PARITY
BENCHES += _AC_BENCHES


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def summary(env_name: str, seed: int, stopped: str | None) -> str:
    failed = [r for r in ROWS if r[2] == "FAIL"]
    lines = ["=" * 100,
             f"SUMMARY ({env_name}, seed {seed}, {elapsed():.0f} s): {sum(r[2] == 'ok' for r in ROWS)} ok, "
             f"{len(failed)} failed, {sum(r[2] == 'skip' for r in ROWS)} skipped"
             + (f"; STOPPED EARLY: {stopped}" if stopped else "")]
    for section in ("selftest", "parity", "error"):
        rows = [r for r in ROWS if r[0] == section]
        if rows:
            n_ok = sum(r[2] == "ok" for r in rows)
            n_skip = sum(r[2] == "skip" for r in rows)
            lines.append(f"  {section:<9} {n_ok}/{len(rows)} ok" + (f" ({n_skip} skipped: time budget)" if n_skip else ""))
    for r in failed:
        lines.append(f"  FAIL {r[0]:<9} {r[1]:<58} {r[3]}")
    for r in ROWS:
        if r[0] == "bench":
            lines.append(f"  {r[1]:<58} {r[2] if r[2] != '-' else ''} {r[3]}".rstrip())
    return "\n".join(lines)


def main(argv=None) -> int:
    global DEADLINE
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--emulator", action="store_true", help="run selftests and parity on the CPU emulator")
    ap.add_argument("--quick", action="store_true", help="fewer parity cases")
    ap.add_argument("--no-bench", action="store_true", help="selftests and parity only (= --parity-only)")
    ap.add_argument("--parity-only", action="store_true", help="selftests and parity, no benchmarks")
    ap.add_argument("--bench-only", action="store_true", help="benchmarks only")
    ap.add_argument("--seed", type=int, default=None, help="default: fresh random inputs")
    ap.add_argument("--deadline", type=float, default=None,
                    help="seconds after which no new case starts (default: env GPUKERNELS_BENCH_BUDGET or 420)")
    ap.add_argument("--summary", default=None, help="also write the summary table to this file")
    args = ap.parse_args(argv)
    if args.deadline is not None:
        DEADLINE = args.deadline
    old_handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return _main(args)
    finally:
        for sig, handler in old_handlers.items():
            signal.signal(sig, handler)


def _main(args) -> int:
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    rng = np.random.default_rng(seed)
    env_name, stopped = "emulator" if args.emulator else "cuda", None
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        print(f"gpukernels GPU check, seed {seed}, deadline {DEADLINE:.0f} s", flush=True)
        if args.emulator:
            env = EmuEnv()
        else:
            try:
                import cupy  # noqa: F401
            except Exception as exc:
                from gpukernels.xp import cuda_extra

                extra = cuda_extra()
                print(f"CuPy is not importable ({type(exc).__name__}: {exc}).\n"
                      f"The GPU check needs CuPy (pip install 'gpukernels[{extra}]', or cupy-cuda13x for CUDA 13 / "
                      "cupy-cuda12x for CUDA 12 drivers); without network access it cannot be installed here.  "
                      "Nothing was run.")
                return 2
            from gpukernels.xp import cuda_status

            status = cuda_status()
            if not status.available:
                print(f"No usable GPU: {status.reason}.  Nothing was run.")
                return 2
            env = GpuEnv()
            props = cupy.cuda.runtime.getDeviceProperties(0)
            print(f"device: {props['name'].decode()} (sm_{env.backend.compute_capability}, "
                  f"{env.backend.sm_count} SMs), CuPy {cupy.__version__}", flush=True)
        if not args.bench_only:
            for step in [run_selftests] + PARITY:
                try:
                    step(env, rng) if step is run_selftests else step(env, rng, args.quick)
                except Exception:
                    traceback.print_exc()
                    record("error", step.__name__, False, "crashed (traceback above)")
        if not args.emulator and not (args.no_bench or args.parity_only):
            try:
                import torch

                if not torch.cuda.is_available():
                    torch = None
            except Exception:
                torch = None
            if torch is None:
                print("PyTorch with CUDA not available: benchmarks compare with the array path only")
            else:
                print(f"PyTorch {torch.__version__}", flush=True)
            for bench in BENCHES:
                if not time_left("bench", bench.__name__):
                    continue
                try:
                    bench(env, rng, torch)
                except Exception:
                    traceback.print_exc()
                    record("bench", bench.__name__, False, "crashed (traceback above)")
    except KeyboardInterrupt as exc:
        stopped = f"interrupted ({str(exc) or 'SIGINT'}) at {elapsed():.0f} s"
        record("error", "run stopped", "STOP", stopped)
    finally:
        # a second signal must not cut the summary short
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    text = summary(env_name, seed, stopped)
    print("\n" + text, flush=True)
    if args.summary:
        Path(args.summary).write_text(text + "\n")
    if any(r[2] == "FAIL" for r in ROWS):
        return 1
    out_of_time = any(r[2] == "skip" and r[3] == "time budget" for r in ROWS)
    return 124 if stopped or out_of_time else 0


if __name__ == "__main__":
    sys.exit(main())
