"""The conformance command: progress on stderr, a per-kind and per-operator table on
stdout (or JSON), exit status 1 on an unlisted failure or a listed case that passes."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict

from . import KINDS, collect, known_failures, run_case
from ..progress import Progress


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = parser or argparse.ArgumentParser(prog="gpukernels conformance",
                                          description="Run the official ONNX backend test cases "
                                                      "through gpukernels.backend.")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("--paths", choices=("auto", "reference"), default=None,
                   help="'auto': the registered specialisations where they apply; 'reference': "
                        "every kernel's reference implementation only (default: GPUKERNELS_PATHS, "
                        "else auto)")
    p.add_argument("--filter", default=None, metavar="RE",
                   help="only cases whose id (kind/name) matches this regular expression")
    p.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated subset of {','.join(KINDS)}")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--show", type=int, default=40, help="failures to print in full (default 40)")
    return p


def run(args) -> int:
    from ..xp import Device, cuda_status

    if Device.parse(args.device).is_cuda and not cuda_status().available:
        print(f"gpukernels conformance: CUDA is not usable here: {cuda_status().reason}", file=sys.stderr)
        return 3
    cases = collect(tuple(k for k in args.kinds.split(",") if k), args.filter)
    known = known_failures()
    outcomes = []
    with Progress(len(cases), "conformance") as bar:
        for case in cases:
            outcomes.append(run_case(case, args.device, getattr(args, "paths", None)))
            bar.advance(case.id)
    unexpected = [o for o in outcomes if o.status == "failed" and o.case.id not in known]
    fixed = [o for o in outcomes if o.status == "passed" and o.case.id in known]
    if args.json:
        print(json.dumps({
            "device": args.device,
            "paths": getattr(args, "paths", None) or os.environ.get("GPUKERNELS_PATHS") or "auto",
            "total": len(outcomes),
            "passed": sum(o.status == "passed" for o in outcomes),
            "cases": [{"id": o.case.id, "operator": o.case.operator, "status": o.status,
                       "known_failure": known.get(o.case.id), "message": o.message,
                       "seconds": round(o.seconds, 4)} for o in outcomes],
        }, indent=1))
    else:
        print_report(outcomes, known, args.show)
    return 1 if unexpected or fixed else 0


def print_report(outcomes, known, show: int = 40) -> None:
    by_kind = defaultdict(lambda: [0, 0, 0])
    by_op = defaultdict(lambda: [0, 0, 0])
    for o in outcomes:
        for table, key in ((by_kind, o.case.kind), (by_op, o.case.operator)):
            table[key][1] += 1
            if o.status == "passed":
                table[key][0] += 1
            elif o.status == "missing-kernel":
                table[key][2] += 1
    print("| kind | passed | total | no kernel yet |")
    print("|---|---:|---:|---:|")
    for k, (p, t, m) in sorted(by_kind.items()):
        print(f"| {k} | {p} | {t} | {m} |")
    print()
    print("| operator | passed | total | no kernel yet |")
    print("|---|---:|---:|---:|")
    for k, (p, t, m) in sorted(by_op.items()):
        print(f"| {k} | {p} | {t} | {m} |")
    failed = [o for o in outcomes if o.status == "failed"]
    print()
    shown = 0
    for o in failed:
        tag = "known failure" if o.case.id in known else "FAILED"
        if shown < show:
            print(f"{tag}: {o.case.id}: {o.message}")
            shown += 1
    for o in outcomes:
        if o.status == "passed" and o.case.id in known:
            print(f"PASSES BUT LISTED: {o.case.id} (remove it from known_failures.txt)")
    missing = sorted({m for o in outcomes for m in o.missing_ops})
    total = len(outcomes)
    passed = sum(o.status == "passed" for o in outcomes)
    if missing:
        print(f"\noperators without a kernel: {', '.join(missing)}")
    listed = sum(1 for o in failed if o.case.id in known)
    print(f"\n{passed} passed, {len(failed) - listed} failed, {listed} known failures, "
          f"{sum(o.status == 'missing-kernel' for o in outcomes)} without kernel, {total} total")


def main(argv=None) -> int:
    return run(build_parser().parse_args(argv))
