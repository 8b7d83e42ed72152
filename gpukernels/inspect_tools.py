"""Command-line glue for the inspection tools: ``gpukernels parity``, ``gpukernels
profile`` and ``gpukernels run --dump``."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np

EXIT_OK, EXIT_FAILED, EXIT_NO_DEVICE = 0, 1, 3


class IntermediateDumper:
    """An observer that keeps a host copy of every node output, then writes them to
    DIR/intermediates.npz with DIR/index.json (node, op, value, shape, dtype, key)."""

    def __init__(self, directory):
        self.directory = Path(directory)
        self.entries = []
        self.arrays = {}

    def __call__(self, node, inputs, outputs, seconds):
        from .tensor import to_host_value

        for name, v in zip(node.outputs, outputs):
            if not name:
                continue
            host = to_host_value(v)
            key = f"{len(self.arrays):05d}_" + re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:80]
            entry = {"node": node.name, "op_type": node.op_type, "value": name, "key": key}
            if isinstance(host, np.ndarray):
                self.arrays[key] = host.astype(np.float32) if host.dtype.type.__module__.startswith("ml_dtypes") else host
                entry.update(shape=list(host.shape), dtype=str(host.dtype))
            elif isinstance(host, list):
                for i, item in enumerate(host):
                    self.arrays[f"{key}.{i}"] = np.asarray(item)
                entry.update(kind="sequence", length=len(host))
            else:
                entry.update(kind="optional-empty" if host is None else type(host).__name__)
            self.entries.append(entry)

    def finish(self, feeds: dict, output_names, values) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        np.savez(self.directory / "intermediates.npz", **self.arrays)
        (self.directory / "index.json").write_text(json.dumps(
            {"inputs": {k: {"shape": list(np.shape(v)), "dtype": str(np.asarray(v).dtype)} for k, v in feeds.items()},
             "outputs": list(output_names), "values": self.entries}, indent=1))


def cmd_parity(args) -> int:
    from .cli import bundled_model_path, parse_dims
    from .errors import DeviceError
    from .parity import compare, format_report
    from .xp import Device, cuda_status

    model = args.model or str(bundled_model_path())
    devices = [d.strip() for d in args.devices.split(",") if d.strip()]
    for d in devices:
        try:
            dev = Device.parse(d)
        except DeviceError as exc:
            print(f"gpukernels parity: {exc}", file=sys.stderr)
            return 2
        if dev.is_cuda and not cuda_status().available:
            print(f"gpukernels parity: device {d} is not usable on this machine: {cuda_status().reason}. "
                  f"Run with --devices cpu (optionally --against onnxruntime), or --save here and --load "
                  f"on a GPU machine.", file=sys.stderr)
            return EXIT_NO_DEVICE
    inputs = None
    if args.inputs:
        with np.load(args.inputs) as z:
            inputs = {k: z[k] for k in z.files}
    report = compare(model, devices=devices, against=args.against, inputs=inputs, seed=args.seed,
                     rtol=args.rtol, atol=args.atol, all_nodes=args.all_nodes, save=args.save,
                     load=args.load, dims=parse_dims(args.dim))
    if args.json:
        print(json.dumps(report.to_dict(), indent=1, default=str))
    else:
        print(format_report(report))
    return EXIT_OK if report.passed else EXIT_FAILED


def cmd_profile(args) -> int:
    from .cli import model_and_device
    from .profiling import format_profile, profile

    resolved = model_and_device(args, "profile")
    if resolved is None:
        return EXIT_NO_DEVICE
    model, device, _ = resolved
    sync = None if args.sync == "auto" else args.sync == "on"
    report = profile(model, device, args.repeat, sync)
    if args.json:
        print(json.dumps(report.to_dict(), indent=1))
    else:
        print(format_profile(report, args.top))
    return EXIT_OK


def add_subcommands(sub) -> None:
    p = sub.add_parser("parity", help="compare a model across devices/runtimes and find the first diverging node",
                       description="Run MODEL on each device (and optionally onnxruntime or onnx.reference), compare "
                                   "every output (--all-nodes: every intermediate) with the first device, and name "
                                   "the first node whose outputs diverge while its inputs agree. Exit 0 PASSED, "
                                   "1 FAILED, 3 when a requested device is not usable.")
    p.add_argument("model", nargs="?", help="model.onnx (default: the bundled model)")
    p.add_argument("--devices", default="cpu,cuda", help="comma-separated gpukernels devices (default cpu,cuda)")
    p.add_argument("--against", choices=["onnxruntime", "reference"], help="also run this runtime")
    p.add_argument("--inputs", help="npz with the inputs (default: seeded random)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rtol", type=float, default=1e-4)
    p.add_argument("--atol", type=float, default=1e-5)
    p.add_argument("--all-nodes", action="store_true", help="compare every intermediate value")
    p.add_argument("--save", metavar="DIR", help="save the first side's values and the inputs to DIR")
    p.add_argument("--load", metavar="DIR", help="use values saved with --save as the baseline")
    p.add_argument("--dim", action="append", metavar="NAME=VALUE")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_parity)

    q = sub.add_parser("profile", help="time every node of a model and list the top operators and nodes",
                       description="Time each node (synchronising the GPU after each when --sync on), print the "
                                   "top operators and nodes, and the whole-model time with and without per-node "
                                   "synchronisation.")
    q.add_argument("model", nargs="?", help="model.onnx (default: the bundled model)")
    q.add_argument("--device", default="auto")
    q.add_argument("--repeat", type=int, default=10)
    q.add_argument("--sync", choices=["auto", "on", "off"], default="auto",
                   help="synchronise the device after every node (auto: on for cuda)")
    q.add_argument("--top", type=int, default=15)
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=cmd_profile)
