"""The ``gpukernels`` command.

    gpukernels run [MODEL] [--device auto|cpu|cuda[:N]] [--inputs in.npz] [--output out.npz]
                   [--seed N] [--dim name=value] [--dump DIR] [--json]
    gpukernels info [--json]
    gpukernels conformance [--device D] [--filter RE] [--json]
    gpukernels parity ... / gpukernels profile ...   (see --help of each)

MODEL defaults to the small model bundled with the package.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from importlib import resources
from pathlib import Path

import numpy as np

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NO_DEVICE = 0, 1, 2, 3


def bundled_model_path() -> Path:
    return Path(str(resources.files("gpukernels") / "models" / "hybrid_block.onnx"))


def resolve_device(spec: str) -> tuple[str, str]:
    """(device, why) for --device; 'auto' picks cuda when usable."""
    from .xp import Device, cuda_status, require

    status = cuda_status()
    if spec == "auto":
        if status.available:
            return "cuda:0", "auto: a usable GPU was found"
        return "cpu", f"auto: CUDA unavailable ({status.reason})"
    dev = Device.parse(spec)
    require(dev)
    return str(dev), "requested"


def parse_dims(items) -> dict:
    dims = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not value.strip().lstrip("-").isdigit():
            raise SystemExit(f"gpukernels: --dim expects name=value, got {item!r}")
        dims[name.strip()] = int(value)
    return dims


def random_inputs(session, seed: int, dims: dict) -> dict:
    """Seeded random feeds for every declared input: normal floats, small non-negative
    integers, random booleans; symbolic dimensions are 1 unless set in dims."""
    from . import dtypes

    rng = np.random.default_rng(seed)
    feeds = {}
    for vi in session.inputs:
        tt = vi.type.tensor_type
        if vi.type.WhichOneof("value") != "tensor_type":
            raise SystemExit(f"gpukernels: cannot make random data for non-tensor input {vi.name!r}; "
                             "pass --inputs FILE.npz")
        shape = []
        for d in tt.shape.dim:
            if d.HasField("dim_value"):
                shape.append(d.dim_value)
            else:
                shape.append(dims.get(d.dim_param, 1))
        info = dtypes.info(tt.elem_type)
        if info.kind == "float":
            arr = rng.standard_normal(shape).astype(np.float32).astype(info.numpy)
        elif info.kind == "bool":
            arr = rng.random(shape) < 0.5
        elif info.kind in ("int", "uint"):
            arr = rng.integers(0, 10, shape).astype(info.numpy)
        elif info.kind == "complex":
            arr = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(info.numpy)
        else:
            arr = np.array(rng.choice(["a", "b", "c"], size=shape), dtype=object)
        feeds[vi.name] = arr
    return feeds


def summarize(name: str, value) -> dict:
    from . import dtypes
    from .tensor import to_host_value

    host = to_host_value(value)
    if isinstance(host, list):
        return {"name": name, "kind": "sequence", "length": len(host)}
    if host is None:
        return {"name": name, "kind": "optional", "empty": True}
    arr = np.asarray(host)
    out = {"name": name, "shape": list(arr.shape), "dtype": str(arr.dtype)}
    if arr.size and arr.dtype != object and arr.dtype.kind != "c":
        f = arr.astype(np.float64)
        finite = np.isfinite(f)
        out.update(min=float(np.min(f)), max=float(np.max(f)), mean=float(np.mean(f)),
                   std=float(np.std(f)), nan=int(np.isnan(f).sum()), inf=int(np.isinf(f).sum()))
        if not finite.all():
            out["finite"] = int(finite.sum())
    return out


def model_and_device(args, command: str):
    """(model path, device, why) for a command's MODEL and --device; None after printing
    the reason when the device is not usable."""
    model = args.model or str(bundled_model_path())
    try:
        device, why = resolve_device(args.device)
    except Exception as exc:
        print(f"gpukernels {command}: {exc}", file=sys.stderr)
        return None
    return model, device, why


def cmd_run(args) -> int:
    from .runtime import Session

    resolved = model_and_device(args, "run")
    if resolved is None:
        return EXIT_NO_DEVICE
    model, device, why = resolved
    t0 = time.perf_counter()
    # a dump lists every node's outputs: no constant folding (folded nodes would not run)
    session = Session(model, device=device, options={"fold_constants": False} if args.dump else None)
    t_prepare = time.perf_counter() - t0
    if args.inputs:
        with np.load(args.inputs, allow_pickle=False) as data:
            feeds = {k: data[k] for k in data.files}
    else:
        feeds = random_inputs(session, args.seed, parse_dims(args.dim))
    observer = None
    dumper = None
    if args.dump:
        from .inspect_tools import IntermediateDumper

        dumper = IntermediateDumper(args.dump)
        observer = dumper
    t1 = time.perf_counter()
    values = session.run_values(feeds, observer=observer)
    from .xp import synchronize

    synchronize(session.device)
    t_run = time.perf_counter() - t1
    if dumper is not None:
        dumper.finish(feeds, session.output_names, values)
    summaries = [summarize(n, v) for n, v in zip(session.output_names, values)]
    if args.output:
        from .tensor import to_host_value

        np.savez(args.output, **{n: np.asarray(to_host_value(v)) for n, v in zip(session.output_names, values)})
    report = {"model": model, "device": device, "device_reason": why,
              "prepare_seconds": t_prepare, "run_seconds": t_run, "outputs": summaries}
    if args.json:
        print(json.dumps(report, indent=1))
        return EXIT_OK
    print(f"model:  {model}")
    print(f"device: {device} ({why})")
    for s in summaries:
        if "shape" in s and "mean" in s:
            print(f"  {s['name']}: {s['dtype']}{s['shape']}  min {s['min']:.6g}  max {s['max']:.6g}  "
                  f"mean {s['mean']:.6g}  std {s['std']:.6g}" +
                  (f"  nan {s['nan']} inf {s['inf']}" if s['nan'] or s['inf'] else ""))
        else:
            print(f"  {s['name']}: {s}")
    print(f"time:   prepare {t_prepare * 1e3:.1f} ms, run {t_run * 1e3:.1f} ms")
    if args.output:
        print(f"outputs written to {args.output}")
    if args.dump:
        print(f"intermediates written to {args.dump}")
    return EXIT_OK


def cmd_info(args) -> int:
    import onnx

    from . import __version__
    from .gpu import accelerated
    from .kernels import load_all, registered
    from .xp import cuda_status

    load_all()
    status = cuda_status()
    from .gpu import cache_dir

    cache = cache_dir()
    info = {
        "gpukernels": __version__, "python": sys.version.split()[0], "numpy": np.__version__,
        "onnx": onnx.__version__, "onnx_opset": onnx.defs.onnx_opset_version(),
        "cuda_available": status.available, "cuda_reason": status.reason,
        "cuda_kernel_cache": cache, "cuda_kernels": accelerated.operators(),
        "operators": len(registered()),
    }
    try:
        import cupy

        info["cupy"] = cupy.__version__
    except Exception:
        info["cupy"] = None
    if args.json:
        print(json.dumps(info, indent=1))
    else:
        for k, v in info.items():
            print(f"{k:18} {v}")
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpukernels", description="ONNX kernels on GPU (CuPy/CUDA) and CPU (NumPy).")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="run a model (the bundled one by default) and summarise its outputs",
                       description="Run an ONNX model on a device with seeded random inputs (or --inputs) and "
                                   "print each output's shape, dtype and statistics, the device and the time.")
    r.add_argument("model", nargs="?", help="model.onnx (default: the bundled hybrid_block model)")
    r.add_argument("--device", default="auto", help="auto (default), cpu, cuda or cuda:N")
    r.add_argument("--inputs", help="npz file with one array per input name")
    r.add_argument("--output", help="write the outputs to this npz file")
    r.add_argument("--seed", type=int, default=0, help="seed for random inputs (default 0)")
    r.add_argument("--dim", action="append", metavar="NAME=VALUE", help="value of a symbolic dimension")
    r.add_argument("--dump", metavar="DIR", help="write every intermediate value to DIR (npz + index.json)")
    r.add_argument("--json", action="store_true", help="machine-readable output")
    r.set_defaults(func=cmd_run)

    i = sub.add_parser("info", help="versions, devices, CUDA kernel cache and CUDA-accelerated operators")
    i.add_argument("--json", action="store_true")
    i.set_defaults(func=cmd_info)

    from .conformance.report import build_parser as conformance_parser, run as conformance_run

    c = sub.add_parser("conformance", help="run the official ONNX backend test cases",
                       description="Run the official ONNX backend test cases through gpukernels.backend; "
                                   "prints a per-kind and per-operator table.")
    conformance_parser(c)
    c.set_defaults(func=conformance_run)

    try:
        from . import inspect_tools
    except ImportError:
        inspect_tools = None
    if inspect_tools is not None and hasattr(inspect_tools, "add_subcommands"):
        inspect_tools.add_subcommands(sub)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        from .errors import GpuKernelsError

        if isinstance(exc, GpuKernelsError):
            model = getattr(args, "model", None)
            if args.command in ("run", "parity", "profile"):
                model = model or str(bundled_model_path())
                print(f"gpukernels {args.command}: model {model}: {exc}", file=sys.stderr)
            else:
                print(f"gpukernels {args.command}: {exc}", file=sys.stderr)
            return EXIT_FAILED
        raise


if __name__ == "__main__":
    sys.exit(main())
