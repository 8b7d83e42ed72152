"""Host overhead of the CUDA launch layer, measured without a GPU.

    python scripts/launch_overhead.py [--repeat N] [--json FILE]

Runs on the CPU through the CuPy simulation (tests/cupy_sim): a ``CupyBackend`` on the
simulated device whose ``cupy.RawModule`` is replaced by a stub that compiles nothing and
whose kernels do nothing, so that what is timed is gpukernels' own host work per call --
``compile_options()``, ``backend.function()`` on a cache hit, ``backend.launch()``, and a
whole ``run()`` of each operator's launch code (validation, output allocation, picking the
instantiation, argument packing) -- plus the kernel class call that reaches it
(``RotaryEmbedding(ctx)(...)`` through ``KernelBase.cuda_path``).  Simulated arrays cost
what NumPy arrays cost, not what CuPy's cost (CuPy's ``empty`` and a kernel launch add a
few microseconds each on a real GPU), so compare these numbers with each other, before and
after a change, not with GPU timings.  ``benchmarks/bench_gpu.py`` reports the same host
time per ``run()`` on a GPU.

This is a measurement helper, not a test: it never asserts on time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
os.environ["GPUKERNELS_SIMULATE_CUDA"] = "1"
os.environ.pop("GPUKERNELS_CUDA_POISON", None)
sys.path.insert(0, str(REPO / "tests" / "cupy_sim"))
sys.path.insert(1, str(REPO))

import numpy as np  # noqa: E402


def _per_call_us(fn, repeat: int, rounds: int = 7) -> float:
    """The best over rounds of the mean time of one call (microseconds): the least
    disturbed round on a shared machine."""
    fn()
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(repeat):
            fn()
        out.append((time.perf_counter() - t0) / repeat * 1e6)
    return min(out)


class _StubFunction:
    """What a compiled kernel looks like to the launch code: callable, takes attributes."""

    max_dynamic_shared_size_bytes = 0

    def __call__(self, grid, block, args, shared_mem=0):
        return None


class _StubModule:
    def __init__(self, code=None, options=(), name_expressions=(), backend="nvrtc", **kwargs):
        self.options = options

    def get_function(self, name):
        return _StubFunction()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=300, help="calls per timing round")
    ap.add_argument("--json", default=None, help="also write the numbers to this file")
    args = ap.parse_args(argv)

    import cupy

    cupy.RawModule = _StubModule  # compile nothing, launch nothing

    from gpukernels.gpu import accelerated
    from gpukernels.gpu import attention as ga, conv as gc, linear_attention as gla, launch

    accelerated.compiler_status = lambda: (True, "")  # let KernelBase.cuda_path reach the launch code
    from gpukernels.gpu import rotary_embedding as gr
    from gpukernels.kernels.base import KernelContext
    from gpukernels.kernels.nn.rotary import RotaryEmbedding
    from gpukernels.tensor import Tensor
    from gpukernels.xp import Device

    rng = np.random.default_rng(0)
    be = launch.CupyBackend(Device("cuda", 0))
    n = args.repeat
    rows: dict[str, float] = {}
    try:
        _measure(rows, n, rng, cupy, be, launch, ga, gc, gla, gr, KernelContext, RotaryEmbedding, Tensor)
        stopped = ""
    except KeyboardInterrupt:
        stopped = " -- interrupted, the rest not measured"
    width = max([len(r) for r in rows] + [10])
    print(f"host time per call (CuPy simulation, stub kernels; {n} calls x 7 rounds, best round){stopped}:")
    for name, us in rows.items():
        print(f"  {name:<{width}} {us:9.1f} us")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 124 if stopped else 0


def _measure(rows, n, rng, cupy, be, launch, ga, gc, gla, gr, KernelContext, RotaryEmbedding, Tensor):

    rows["compile_options()"] = _per_call_us(lambda: launch.compile_options(), n)
    expr = gr.expressions()[0]
    fn = be.function(gr.SOURCE, expr)
    rows["backend.function() (cached)"] = _per_call_us(lambda: be.function(gr.SOURCE, expr), n)
    out = be.empty((64,), np.float32)
    rows["backend.launch()"] = _per_call_us(
        lambda: be.launch(fn, (1,), (64,), (out, launch.i64(64)), 0, what="overhead probe"), n)

    def dev(a):
        return Tensor(cupy.asarray(a))

    # tiny tensors: the simulation's array work (NumPy, garbage-filled outputs) stays small
    B, H, S, D = 1, 2, 8, 64
    x = dev(rng.standard_normal((B, H, S, D)).astype(np.float16))
    ang = rng.uniform(-3, 3, (S, D // 2))
    cos, sin = dev(np.cos(ang).astype(np.float16)), dev(np.sin(ang).astype(np.float16))
    pos = dev(np.tile(np.arange(S, dtype=np.int64), (B, 1)))
    rot = dict(X=x, cos_cache=cos, sin_cache=sin, position_ids=pos, interleaved=0, num_heads=H,
               rotary_embedding_dim=D)
    rows["RotaryEmbedding run()"] = _per_call_us(lambda: gr.run(be, **rot), n)
    k = RotaryEmbedding(KernelContext("cuda", options={"cuda_kernels": "always"}))
    rows["RotaryEmbedding kernel class call"] = _per_call_us(lambda: k(x, cos, sin, pos), n)

    q = dev(rng.standard_normal((1, 2, 8, 64)).astype(np.float16))
    kk = dev(rng.standard_normal((1, 2, 8, 64)).astype(np.float16))
    att = dict(Q=q, K=kk, V=kk, is_causal=1, q_num_heads=2, kv_num_heads=2, scale=0.125,
               wants=(True, False, False, False))
    rows["Attention run()"] = _per_call_us(lambda: ga.run(be, **att), n)

    xc = dev(rng.standard_normal((1, 16, 8, 8)).astype(np.float16))
    wc = dev(rng.standard_normal((16, 16, 3, 3)).astype(np.float16))
    conv = dict(X=xc, W=wc, B=None, strides=[1, 1], pads=[1, 1, 1, 1], dilations=[1, 1], group=1)
    rows["Conv run()"] = _per_call_us(lambda: gc.run(be, **conv), n)

    ql = dev(rng.standard_normal((2, 1, 4 * 64)).astype(np.float32))
    vl = dev(rng.standard_normal((2, 1, 4 * 64)).astype(np.float32))
    la = dict(query=ql, key=ql, value=vl, kv_num_heads=4, q_num_heads=4, update_rule="linear")
    rows["LinearAttention run() (decode)"] = _per_call_us(lambda: gla.run(be, **la), n)


if __name__ == "__main__":
    sys.exit(main())
