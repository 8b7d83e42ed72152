"""Host side of cuda/selftest.cu: kernels that pin down warp/block/mma semantics.

Each ``run_*`` takes a backend (CupyBackend on a GPU, EmuBackend in the emulator) and host
NumPy inputs, copies them to the device with ``backend.upload`` and returns host NumPy
results (``backend.to_host``), so the same call checks the emulator in CI and the real
device in scripts/gpu_check.sh.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from .launch import CudaSource, ceil_div, i32

SOURCE = "selftest.cu"


def expressions() -> list[str]:
    return ["gk_selftest_warp", "gk_selftest_block", "gk_selftest_mma16<0>", "gk_selftest_mma16<1>",
            "gk_selftest_mma_tf32"]


CUDA_SOURCES = [CudaSource(SOURCE, expressions)]


def run_warp(backend, x: np.ndarray, block: int = 64) -> np.ndarray:
    """(n, 8) float32 results of gk_selftest_warp for x (float32, n)."""
    n = x.size
    xd = backend.upload(np.ascontiguousarray(x, np.float32))
    out = backend.empty((n, 8), np.float32)
    fn = backend.function(SOURCE, "gk_selftest_warp")
    backend.launch(fn, (ceil_div(n, block),), (block,), (xd, out, i32(n)), 0, what="selftest warp")
    return backend.to_host(out)


def run_block(backend, x: np.ndarray, block: int = 128):
    """(per-block sums, total, per-block positive counts)."""
    n = x.size
    blocks = ceil_div(n, block)
    xd = backend.upload(np.ascontiguousarray(x, np.float32))
    sums = backend.empty((blocks,), np.float32)
    total = backend.upload(np.zeros(1, np.float32))
    counts = backend.empty((blocks,), np.int32)
    fn = backend.function(SOURCE, "gk_selftest_block")
    backend.launch(fn, (blocks,), (block,), (xd, sums, total, counts, i32(n)), block * 4, what="selftest block")
    return backend.to_host(sums), backend.to_host(total), backend.to_host(counts)


def mma_case(rng, kind: str):
    """Random operands A, B, C for run_mma and its float64 expectation: A and B rounded
    as the layer rounds them (tf32: to nearest, 10 mantissa bits kept; f16 / bf16: a cast),
    then A @ B + C."""
    if kind == "tf32":
        A = rng.standard_normal((16, 8)).astype(np.float32)
        B = rng.standard_normal((8, 16)).astype(np.float32)

        def rnd(m):
            u = m.view(np.uint32).astype(np.uint64)
            return ((u + 0x1000) & 0xFFFFE000).astype(np.uint32).view(np.float32)
    else:
        A = rng.standard_normal((16, 16)).astype(np.float32)
        B = rng.standard_normal((16, 16)).astype(np.float32)
        t = np.float16 if kind == "f16" else ml_dtypes.bfloat16

        def rnd(m):
            return m.astype(t).astype(np.float32)
    C = rng.standard_normal((16, 16)).astype(np.float32)
    return A, B, C, rnd(A).astype(np.float64) @ rnd(B).astype(np.float64) + C


def run_mma(backend, kind: str, A: np.ndarray, B: np.ndarray, C: np.ndarray) -> np.ndarray:
    """D = A @ B + C through the mma layer; kind 'f16' / 'bf16' (A, B 16x16) or 'tf32'
    (A 16x8, B 8x16).  C and D are 16x16 float32."""
    expr = {"f16": "gk_selftest_mma16<0>", "bf16": "gk_selftest_mma16<1>", "tf32": "gk_selftest_mma_tf32"}[kind]
    args = [backend.upload(np.ascontiguousarray(m, np.float32)) for m in (A, B, C)]
    D = backend.empty((16, 16), np.float32)
    fn = backend.function(SOURCE, expr)
    backend.launch(fn, (1,), (32,), (*args, D), 0, what=f"selftest mma {kind}")
    return backend.to_host(D)
