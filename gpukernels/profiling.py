"""Per-node timing of a model: ``profile(model, device, repeat)``.

Each node is timed around its kernel call; with ``synchronize=True`` (the default on a
GPU) the device is synchronised after every node so each node's time is its own, not
the launch cost.  The whole-model time is measured both with and without per-node
synchronisation, so the cost of the measurement itself is visible.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import asdict, dataclass

from .archive import safe_name


@dataclass
class NodeTime:
    node: str
    op_type: str
    seconds: float  # total over repeats
    calls: int


@dataclass
class ProfileReport:
    model: str
    device: str
    repeat: int
    synchronized: bool
    model_seconds_synced: float     # median whole-model time with per-node sync
    model_seconds_free: float       # median whole-model time without it
    nodes: list
    operators: dict                 # op_type -> total seconds
    folded: int = 0                 # top-level nodes folded into constants when loading

    def to_dict(self) -> dict:
        return asdict(self)


class _Timer:
    def __init__(self, synchronize: bool):
        self.synchronize = synchronize
        self.times = defaultdict(float)
        self.calls = defaultdict(int)
        self.ops = {}

    def __call__(self, node, inputs, outputs, seconds):
        self.times[node.name] += seconds
        self.calls[node.name] += 1
        self.ops[node.name] = node.op_type


def profile(model, device: str = "cpu", repeat: int = 10, synchronize: bool | None = None,
            inputs: dict | None = None, seed: int = 0) -> ProfileReport:
    from .inputs import random_inputs
    from .runtime import Session
    from .xp import Device, synchronize as sync

    sess = Session(model, device=device)
    feeds = inputs if inputs is not None else random_inputs(sess, seed, {})
    dev = Device.parse(device)
    if synchronize is None:
        synchronize = dev.is_cuda
    sess.run_values(feeds)  # warm-up (compilation, caches)
    sync(dev)
    timer = _Timer(synchronize)
    synced, free = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        sess.run_values(feeds, observer=timer)
        sync(dev)
        synced.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        sess.run_values(feeds)
        sync(dev)
        free.append(time.perf_counter() - t0)
    nodes = sorted((NodeTime(n, timer.ops[n], t, timer.calls[n]) for n, t in timer.times.items()),
                   key=lambda x: -x.seconds)
    ops = defaultdict(float)
    for n in nodes:
        ops[n.op_type] += n.seconds
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    return ProfileReport(model if isinstance(model, str) else "<model>", str(dev), repeat, synchronize,
                         med(synced), med(free), nodes, dict(sorted(ops.items(), key=lambda kv: -kv[1])),
                         len(sess.graph.folded))


def format_profile(r: ProfileReport, top: int = 15) -> str:
    """The report as text; names from the model are escaped (safe_name)."""
    total = sum(r.operators.values()) or 1.0
    lines = [f"profile: {safe_name(r.model)} on {r.device}, {r.repeat} runs, "
             f"per-node sync {'on' if r.synchronized else 'off'}",
             f"whole model: {r.model_seconds_synced * 1e3:.3f} ms with per-node timing, "
             f"{r.model_seconds_free * 1e3:.3f} ms without"]
    if r.folded:
        lines.append(f"{r.folded} constant node(s) folded when the model was loaded (not timed per run)")
    lines += ["", "top operators (total over runs):",
              f"{'op':24} {'ms/run':>10} {'share':>7}"]
    for op, t in r.operators.items():
        lines.append(f"{safe_name(op, 24):24} {t / r.repeat * 1e3:10.3f} {t / total * 100:6.1f}%")
    lines += ["", f"top {top} nodes:", f"{'node':32} {'op':18} {'ms/run':>10}"]
    for n in r.nodes[:top]:
        lines.append(f"{safe_name(n.node, 32):32} {safe_name(n.op_type, 18):18} {n.seconds / r.repeat * 1e3:10.3f}")
    return "\n".join(lines)
