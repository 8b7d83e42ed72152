"""Side-by-side timing of gpukernels, onnxruntime (2 threads) and onnx.reference.

Every case is an ONNX model (usually one node) with fixed inputs.  Each runtime runs it
after a warm-up, repeatedly until ``min_time`` seconds have passed (at least ``repeat``
times), and the median is reported.  Ratios are printed as gpukernels / onnxruntime
(lower is better; the targets say "within 2x") and onnx.reference / gpukernels (higher
is better; >1 means gpukernels is faster).

Usage from a benchmark script:

    from harness import Case, run_cases
    run_cases("tensor ops", [Case("Gather 50000x768", model, feeds, flops=None), ...])
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))


@dataclass
class Case:
    name: str
    model: onnx.ModelProto
    feeds: dict
    flops: float | None = None  # for GFLOP/s, when meaningful
    skip: set = field(default_factory=set)  # runtimes that cannot run it, with the reason in name


def single_node_model(op_type, inputs: dict, attrs: dict | None = None, n_outputs: int = 1,
                      opset: int = 23, domain: str = "", extra_opsets: dict | None = None,
                      initializers: dict | None = None) -> onnx.ModelProto:
    """A one-node model.  inputs maps name -> array (fed at run time); initializers maps
    name -> array (constant).  Names listed with value None are omitted inputs ('')."""
    initializers = initializers or {}
    names = []
    graph_inputs = []
    for name, arr in inputs.items():
        if arr is None:
            names.append("")
            continue
        names.append(name)
        graph_inputs.append(helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(np.asarray(arr).dtype), list(np.shape(arr))))
    inits = []
    for name, arr in initializers.items():
        names.append(name)
        inits.append(onnx.numpy_helper.from_array(np.asarray(arr), name))
    outputs = [f"out{i}" for i in range(n_outputs)]
    node = helper.make_node(op_type, names, outputs, domain=domain, **(attrs or {}))
    graph = helper.make_graph([node], op_type, graph_inputs,
                              [helper.make_value_info(o, onnx.TypeProto()) for o in outputs],
                              initializer=inits)
    opsets = [helper.make_opsetid("", opset)]
    for d, v in (extra_opsets or {}).items():
        opsets.append(helper.make_opsetid(d, v))
    if domain and domain not in (extra_opsets or {}):
        opsets.append(helper.make_opsetid(domain, 1))
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 10
    return model


def _time(fn, repeat: int, min_time: float) -> float:
    fn()  # warm-up (compilation, caches)
    times = []
    start = time.perf_counter()
    while len(times) < repeat or time.perf_counter() - start < min_time:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if len(times) >= 1000:
            break
    return statistics.median(times)


def runner(kind: str, model: onnx.ModelProto, device: str = "cpu"):
    """A zero-argument-after-feeds callable for one runtime, or None if unavailable."""
    if kind == "gpukernels":
        from gpukernels.runtime import Session

        sess = Session(model, device=device)

        def run(feeds):
            out = sess.run(None, feeds)
            if device != "cpu":
                from gpukernels.xp import synchronize
                synchronize(device)
            return out

        return run
    if kind == "onnxruntime":
        try:
            import onnxruntime as ort
        except ImportError:
            return None
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 2
        opts.inter_op_num_threads = 1
        sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        return lambda feeds: sess.run(None, feeds)
    if kind == "reference":
        from onnx.reference import ReferenceEvaluator

        sess = ReferenceEvaluator(model)
        return lambda feeds: sess.run(None, feeds)
    raise ValueError(kind)


def _time_alternating(fns: dict, repeat: int, min_time: float, blocks: int = 3,
                      settle: float = 0.15) -> dict:
    """Median time of each callable, timed in alternating blocks (A's calls, B's calls,
    A's again, ...) so that load from other processes hits every runtime alike and the
    ratios stay meaningful on a shared machine.  Both onnxruntime's and OpenBLAS's
    worker threads keep spinning for tens of milliseconds after a call returns, which
    would steal a core from whichever runtime runs next; so blocks are separated by a
    pause of `settle` seconds and not single calls."""
    times = {kind: [] for kind in fns}
    for fn in fns.values():
        fn()  # warm-up (compilation, caches)
    per_block = max(1, -(-repeat // blocks))
    for _ in range(blocks):
        for kind, fn in fns.items():
            time.sleep(settle)
            start = time.perf_counter()
            n = 0
            while n < per_block or time.perf_counter() - start < min_time / blocks:
                t0 = time.perf_counter()
                fn()
                times[kind].append(time.perf_counter() - t0)
                n += 1
                if n >= 400:
                    break
    return {kind: statistics.median(ts) for kind, ts in times.items()}


def run_cases(title: str, cases: list[Case], repeat: int = 5, min_time: float = 0.5,
              device: str = "cpu", reference_limit: float = 30.0,
              with_reference: bool = True) -> list[dict]:
    """Time every case on the three runtimes and print a table; returns the rows.
    gpukernels and onnxruntime are timed in alternating blocks; onnx.reference, often orders of
    magnitude slower, is timed on its own (once when a single run is already long)."""
    rows = []
    kinds = ("gpukernels", "onnxruntime", "reference") if with_reference else ("gpukernels", "onnxruntime")
    for case in cases:
        row = {"case": case.name}
        fns = {}
        for kind in kinds:
            row[kind] = None
            if kind in case.skip:
                continue
            try:
                fn = runner(kind, case.model, device if kind == "gpukernels" else "cpu")
                if fn is None:
                    continue
                t0 = time.perf_counter()
                fn(case.feeds)  # a first run also proves the runtime can run the case
                first = time.perf_counter() - t0
                if kind == "reference":
                    row[kind] = first if first * repeat > reference_limit else \
                        _time(lambda: fn(case.feeds), repeat, min_time)
                else:
                    fns[kind] = (lambda f: lambda: f(case.feeds))(fn)
            except Exception as exc:  # a runtime that cannot run a case is reported, not fatal
                row.setdefault("errors", []).append(f"{kind}: {type(exc).__name__}: {str(exc)[:120]}")
        if fns:
            row.update(_time_alternating(fns, repeat, min_time))
        if case.flops and row.get("gpukernels"):
            row["gflops"] = case.flops / row["gpukernels"] / 1e9
        rows.append(row)
        if sys.stderr.isatty():
            print(f"  done: {case.name}", file=sys.stderr)
    print_table(title, rows)
    return rows


def _ms(v):
    return "     n/a" if v is None else f"{v * 1e3:8.3f}"


def print_table(title: str, rows: list[dict]) -> None:
    print(f"\n## {title}\n")
    print("| case | gpukernels ms | onnxruntime ms | onnx.reference ms | gk/ort | ref/gk | GFLOP/s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        gk, ort_t, ref = r.get("gpukernels"), r.get("onnxruntime"), r.get("reference")
        ratio_ort = f"{gk / ort_t:.2f}" if gk and ort_t else "n/a"
        ratio_ref = f"{ref / gk:.1f}" if gk and ref else "n/a"
        gfl = f"{r['gflops']:.1f}" if "gflops" in r else ""
        print(f"| {r['case']} | {_ms(gk)} | {_ms(ort_t)} | {_ms(ref)} | {ratio_ort} | {ratio_ref} | {gfl} |")
    for r in rows:
        for e in r.get("errors", []):
            print(f"- {r['case']}: {e}")


def parse_args(description: str):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--device", default="cpu")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--min-time", type=float, default=0.5)
    p.add_argument("--filter", default="", help="only cases whose name contains this text")
    p.add_argument("--no-reference", action="store_true", help="skip onnx.reference (quick checks)")
    return p.parse_args()


def extra_cases(filename: str) -> list:
    """The CASES list (or CASES() result) of a sibling module of extra cases, if present."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parent / filename
    if not path.exists():
        return []
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    cases = getattr(mod, "CASES", [])
    return list(cases() if callable(cases) else cases)


def main_for(title: str, make_cases, doc: str) -> None:
    """The command line of a benchmark script: --filter, --repeat, --min-time, --device."""
    args = parse_args(doc)
    selected = [c for c in make_cases() if args.filter in c.name]
    run_cases(title, selected, repeat=args.repeat, min_time=args.min_time, device=args.device,
              with_reference=not args.no_reference)
