"""The ``gpukernels`` command.

    gpukernels [--debug] run [MODEL] [--device auto|cpu|cuda[:N]] [--inputs in.npz] [--output out.npz]
                             [--seed N] [--dim name=value] [--dump DIR] [--json]
    gpukernels info [--json]
    gpukernels conformance [--device D] [--paths auto|reference] [--filter RE] [--json]
    gpukernels parity ... / gpukernels profile ... / gpukernels eval ...   (see --help of each)

MODEL defaults to the small model bundled with the package.  Every command ends a failure
with one line on stderr, ``gpukernels COMMAND: error: MESSAGE`` (unprintable characters
escaped), and an exit status from EXIT_CODES_HELP; ``--debug`` shows the traceback instead.
This module is a leaf: nothing in the package imports it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import numpy as np

from .archive import DataError, check_output_path, safe_name, write_npz
from .inputs import bundled_model_path, defaulted_dims, random_inputs, read_inputs

EXIT_OK = 0           # success; parity PASSED
EXIT_FAILED = 1       # parity FAILED (values differ); conformance: an unexpected result
EXIT_USAGE = 2        # bad arguments, missing/unreadable/unsafe files, inputs that do not fit the model
EXIT_NO_DEVICE = 3    # the requested device is not usable here
EXIT_MODEL = 4        # the model was refused or failed to run (a gpukernels error)
EXIT_INTERNAL = 5     # an unexpected error: a bug in gpukernels (--debug shows the traceback)
EXIT_RESOURCES = 6    # past max_tensor_bytes, out of memory, or nesting past the recursion limit
EXIT_INTERRUPTED = 130

EXIT_CODES_HELP = """\
exit status:
  0    success (parity: PASSED)
  1    parity: FAILED, values differ; conformance: an unexpected failure or pass
  2    bad arguments; an input/output file or folder that is missing, unreadable or
       unsafe (not an npz, pickled, truncated, malformed --load folder); inputs that
       do not match what the model declares, or that cannot be generated
  3    the requested device is not usable on this machine
  4    the model was refused or failed to run (malformed model or declared inputs,
       a kernel error)
  5    internal error (a bug): rerun with --debug for the traceback
  6    a resource limit: a tensor (input, file entry or kernel output) past
       max_tensor_bytes (GPUKERNELS_MAX_TENSOR_BYTES=N raises it), out of memory,
       or data nested past the recursion limit
  130  interrupted
"""


class UsageError(ValueError):
    """A command-line argument that cannot be used."""


# ------------------------------------------------------------------------- helpers


def resolve_device(spec: str) -> tuple[str, str]:
    """(device, why) for --device; 'auto' picks cuda when usable.  UsageError for a
    malformed spec, DeviceError when the device is not usable."""
    from .errors import DeviceError
    from .xp import Device, cuda_status, require

    status = cuda_status()
    if spec == "auto":
        if status.available:
            return "cuda:0", "auto: a usable GPU was found"
        return "cpu", f"auto: CUDA unavailable ({status.reason})"
    try:
        dev = Device.parse(spec)
    except DeviceError as exc:
        raise UsageError(str(exc)) from None
    require(dev)
    return str(dev), "requested"


def parse_dims(items) -> dict:
    """{name: value} from --dim NAME=VALUE arguments."""
    dims = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not re.fullmatch(r"\s*\d{1,19}\s*", value):
            raise UsageError(f"--dim expects NAME=VALUE with a non-negative whole number, got {item!r}")
        dims[name.strip()] = int(value)
    return dims


def summarize(name: str, value) -> dict:
    from .tensor import to_host_value

    host = to_host_value(value)
    if isinstance(host, list):
        return {"name": name, "kind": "sequence", "length": len(host)}
    if host is None:
        return {"name": name, "kind": "optional", "empty": True}
    arr = np.asarray(host)
    out = {"name": name, "shape": list(arr.shape), "dtype": str(arr.dtype)}
    if arr.size and arr.dtype != object and arr.dtype.kind not in "cUS":
        f = arr.astype(np.float64)
        finite = np.isfinite(f)
        out.update(min=float(np.min(f)), max=float(np.max(f)), mean=float(np.mean(f)),
                   std=float(np.std(f)), nan=int(np.isnan(f).sum()), inf=int(np.isinf(f).sum()))
        if not finite.all():
            out["finite"] = int(finite.sum())
    return out


def archive_values(names, values) -> tuple[dict, list]:
    """({archive name: host array}, [skipped names]) for runtime values: a sequence's
    items are written as NAME[i]; empty optionals and maps are skipped."""
    from .tensor import to_host_value

    arrays, skipped = {}, []
    for name, value in zip(names, values):
        host = to_host_value(value)
        items = [(f"{name}[{i}]", x) for i, x in enumerate(host)] if isinstance(host, list) else [(name, host)]
        for key, item in items:
            if item is None or isinstance(item, dict):
                skipped.append(key)
            elif key in arrays:
                raise DataError(f"two outputs would be written as {safe_name(key)!r}")
            else:
                arrays[key] = item
    return arrays, skipped


def model_and_device(args) -> tuple[str, str, str]:
    """(model path, device, why) for a command's MODEL and --device."""
    model = _model_arg(args)
    device, why = resolve_device(args.device)
    return model, device, why


def _model_arg(args) -> str:
    """MODEL, or the bundled model; UsageError when the file does not exist."""
    model = args.model or str(bundled_model_path())
    if not Path(model).is_file():
        raise UsageError(f"model file {model!r} does not exist" if not Path(model).exists()
                         else f"model {model!r} is not a file")
    return model


def _check_dir_arg(flag: str, path) -> None:
    """UsageError when path (to be created as a folder) is an existing file."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise UsageError(f"{flag} {safe_name(p)} exists and is not a folder")


# ------------------------------------------------------------------------ commands


def cmd_run(args) -> int:
    from .runtime import Session

    model, device, why = model_and_device(args)
    if args.output:
        check_output_path(args.output)
    if args.dump:
        _check_dir_arg("--dump", args.dump)
    dims = parse_dims(args.dim)
    t0 = time.perf_counter()
    # a dump lists every node's outputs: no constant folding (folded nodes would not run)
    session = Session(model, device=device, options={"fold_constants": False, "optimize": False} if args.dump else None)
    t_prepare = time.perf_counter() - t0
    if args.inputs:
        feeds = read_inputs(args.inputs, session)
        inputs_from = f"file {args.inputs}"
    else:
        feeds = random_inputs(session, args.seed, dims)
        args.defaulted_dims = defaulted_dims(session, dims)  # named in a failure's message
        set_dims = [f"{n}={v}" for n, v in dims.items()] + [f"{n or '(unnamed)'}=1" for n in args.defaulted_dims]
        inputs_from = f"random (seed {args.seed}" + (f"; symbolic dimensions {', '.join(set_dims)}" if set_dims else "") + ")"
    dumper = None
    if args.dump:
        from .inspect_tools import IntermediateDumper

        dumper = IntermediateDumper(args.dump)
    t1 = time.perf_counter()
    values = session.run_values(feeds, observer=dumper)
    from .xp import synchronize

    synchronize(session.device)
    args.defaulted_dims = None
    t_run = time.perf_counter() - t1
    if dumper is not None:
        dumper.finish(feeds, session.output_names, values)
    summaries = [summarize(n, v) for n, v in zip(session.output_names, values)]
    written = skipped = None
    if args.output:
        arrays, skipped = archive_values(session.output_names, values)
        write_npz(args.output, arrays)
        written = len(arrays)
    report = {"model": model, "device": device, "device_reason": why, "inputs": inputs_from,
              "prepare_seconds": t_prepare, "run_seconds": t_run, "outputs": summaries}
    if args.output:
        report.update(output_file=args.output, output_arrays=written, output_skipped=skipped)
    if args.json:
        print(json.dumps(report, indent=1))
        return EXIT_OK
    print(f"model:  {safe_name(model)}")
    print(f"device: {device} ({safe_name(why)})")
    print(f"inputs: {safe_name(inputs_from)}")
    for s in summaries:
        name = safe_name(s["name"])
        if "shape" in s and "mean" in s:
            print(f"  {name}: {s['dtype']}{s['shape']}  min {s['min']:.6g}  max {s['max']:.6g}  "
                  f"mean {s['mean']:.6g}  std {s['std']:.6g}" +
                  (f"  nan {s['nan']} inf {s['inf']}" if s['nan'] or s['inf'] else ""))
        else:
            print(f"  {name}: " + ", ".join(f"{k} {v}" for k, v in s.items() if k != "name"))
    print(f"time:   prepare {t_prepare * 1e3:.1f} ms, run {t_run * 1e3:.1f} ms")
    if args.output:
        note = f"; not written (empty): {', '.join(safe_name(n) for n in skipped)}" if skipped else ""
        print(f"outputs written to {safe_name(args.output)} ({written} arrays{note})")
    if args.dump:
        print(f"intermediates written to {safe_name(args.dump)}")
    return EXIT_OK


def cmd_info(args) -> int:
    import onnx

    from . import __version__
    from .gpu import accelerated, cache_dir
    from .kernels import load_all, registered
    from .xp import Device, compute_capability, cuda_driver_version, cuda_extra, cuda_status, device_name

    load_all()
    status = cuda_status()
    driver = cuda_driver_version()
    info = {
        "gpukernels": __version__, "python": sys.version.split()[0], "numpy": np.__version__,
        "onnx": onnx.__version__, "onnx_opset": onnx.defs.onnx_opset_version(),
        "cuda_available": status.available, "cuda_reason": status.reason,
        "cuda_driver": None if driver is None else f"{driver // 1000}.{driver % 1000 // 10}",
        "cuda_extra": cuda_extra(),
        "cuda_kernel_cache": cache_dir(), "cuda_kernels": accelerated.operators(),
        "operators": len(registered()),
    }
    try:
        import cupy

        info["cupy"] = cupy.__version__
    except Exception:
        info["cupy"] = None
    devices = []
    for i in range(status.device_count if status.available else 0):
        cc = compute_capability(i)
        devices.append({"device": f"cuda:{i}", "name": device_name(i),
                        "compute_capability": None if cc is None else f"{cc // 10}.{cc % 10}",
                        "cuda_kernels": accelerated.kernels_supported(Device("cuda", i))[0],
                        "paths": accelerated.paths(Device("cuda", i))})
    if args.json:
        print(json.dumps(dict(info, cuda_devices=devices), indent=1))
    else:
        for k, v in info.items():
            print(f"{k:18} {safe_name(v)}")
        for d in devices:
            cc = d["compute_capability"]
            print(f"{d['device']:18} {safe_name(d['name'])}, compute capability {cc} "
                  f"(sm_{cc.replace('.', '') if cc else '?'}): {safe_name(d['paths'])}")
    return EXIT_OK


def cmd_parity(args) -> int:
    from .errors import DeviceError
    from .parity import compare, format_report
    from .xp import Device, cuda_status

    model = _model_arg(args)
    if args.devices is None:
        from .parity import default_devices

        devices, why = default_devices()
        print(f"gpukernels parity: devices: {why}" +
              ("" if len(devices) > 1 or args.against or args.load else
               "; one side only, nothing to compare: add --against onnxruntime|reference") , file=sys.stderr)
    else:
        devices = [d.strip() for d in args.devices.split(",") if d.strip()]
    for d in devices:
        try:
            dev = Device.parse(d)
        except DeviceError as exc:
            raise UsageError(str(exc)) from None
        if dev.is_cuda and not cuda_status().available:
            raise DeviceError(f"device {d} is not usable on this machine: {cuda_status().reason}. "
                              "Run with --devices cpu (optionally --against onnxruntime), or --save here and "
                              "--load on a GPU machine.")
    if args.save:
        _check_dir_arg("--save", args.save)
    inputs = read_inputs(args.inputs) if args.inputs else None
    report = compare(model, devices=devices, against=args.against, inputs=inputs, seed=args.seed,
                     rtol=args.rtol, atol=args.atol, all_nodes=args.all_nodes, save=args.save,
                     load=args.load, dims=parse_dims(args.dim))
    if args.json:
        print(json.dumps(report.to_dict(), indent=1, default=str))
    else:
        print(format_report(report))
    return EXIT_OK if report.passed else EXIT_FAILED


def cmd_profile(args) -> int:
    from .profiling import format_profile, profile

    model, device, _ = model_and_device(args)
    if args.repeat < 1:
        raise UsageError(f"--repeat must be at least 1, got {args.repeat}")
    sync = None if args.sync == "auto" else args.sync == "on"
    report = profile(model, device, args.repeat, sync)
    if args.json:
        print(json.dumps(report.to_dict(), indent=1))
    else:
        print(format_profile(report, args.top))
    return EXIT_OK


def cmd_conformance(args) -> int:
    from .conformance.report import run
    from .errors import DeviceError
    from .xp import Device, cuda_status

    try:
        dev = Device.parse(args.device)
    except DeviceError as exc:
        raise UsageError(str(exc)) from None
    if dev.is_cuda and not cuda_status().available:
        raise DeviceError(f"device {args.device} is not usable on this machine: {cuda_status().reason}")
    return run(args)


def cmd_eval(args) -> int:
    import logging

    from .evaluation import EvalArgumentError, MissingExtraError, evaluate

    model = _model_arg(args)
    # the cluster's own log lines (a worker restarting, say) would bury the result
    logging.getLogger("distributed").setLevel(logging.ERROR)
    try:
        result = evaluate(model, args.data, args.output, device=args.device, batch=args.batch,
                          workers=args.workers, scheduler=args.scheduler, against=args.against,
                          resume=args.resume, rtol=args.rtol, atol=args.atol, report=args.report,
                          threads=args.threads)
    except (EvalArgumentError, MissingExtraError) as exc:
        raise UsageError(str(exc)) from None
    if args.json:
        print(json.dumps(result.to_dict(), indent=1, default=str))
        return EXIT_OK if result.passed else EXIT_FAILED
    print(format_eval(result))
    return EXIT_OK if result.passed else EXIT_FAILED


def format_eval(result) -> str:
    """The text summary of an eval run (names from the model escaped)."""
    r = result
    lines = [f"model:   {safe_name(r.model)}",
             f"data:    {safe_name(r.data)} ({r.data_format}, {r.samples} samples)",
             f"device:  {r.device} on {safe_name(r.scheduler)}",
             f"batches: {r.batches} of {r.batch} samples: {r.batches_run} run, {r.batches_skipped} already written"]
    for w in r.workers:
        lines.append(f"  worker {safe_name(w['address'])} ({safe_name(w['host'])}): {w['batches']} batches, "
                     f"{w.get('nthreads')} task thread(s) x {w['threads']} host thread(s)")
    if r.output:
        lines.append(f"output:  {safe_name(r.output)} ({r.output_format})")
    lines.append(f"time:    {r.seconds:.2f} s in all, {r.run_seconds:.2f} s running: "
                 f"{r.samples_per_second:.1f} samples/s")
    p = r.parity
    if p is not None:
        lines.append(f"parity:  {p.device} against {p.against} (rtol {p.rtol:g}, atol {p.atol:g}), "
                     "per-sample largest errors")
        lines.append(f"  {'output':30} {'max abs':>10} {'p99 abs':>10} {'max rel':>10} {'p99 rel':>10}  outside")
        for o in p.outputs:
            lines.append(f"  {safe_name(o.name, 30):30} {o.max_abs:10.3g} {o.p99_abs:10.3g} {o.max_rel:10.3g} "
                         f"{o.p99_rel:10.3g}  {o.outside}/{o.samples} ({o.outside_share * 100:.2f}%)")
            worst = ", ".join(f"{w['sample']} ({w['max_abs']:.3g})" for w in o.worst[:5] if w["max_abs"] > 0)
            if worst:
                lines.append(f"    worst samples: {worst}")
        if p.report:
            lines.append(f"report:  {safe_name(p.report)} (histogram {safe_name(p.histogram)})")
        lines.append("PASSED" if p.passed else "FAILED")
    for note in r.notes:
        lines.append(f"note:    {safe_name(note)}")
    return "\n".join(lines)


# ------------------------------------------------------------------------- parsing


def _subparser(sub, name: str, **kw) -> argparse.ArgumentParser:
    p = sub.add_parser(name, epilog=EXIT_CODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter, **kw)
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                   help="show the traceback of an error instead of one line")
    return p


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpukernels", description="ONNX kernels on GPU (CuPy/CUDA) and CPU (NumPy).",
                                epilog=EXIT_CODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--debug", action="store_true", help="show the traceback of an error instead of one line")
    sub = p.add_subparsers(dest="command", required=True)

    r = _subparser(sub, "run", help="run a model (the bundled one by default) and summarise its outputs",
                   description="Run an ONNX model on a device with seeded random inputs (or --inputs) and "
                               "print each output's shape, dtype and statistics, the device and the time.")
    r.add_argument("model", nargs="?", help="model.onnx (default: the bundled hybrid_block model)")
    r.add_argument("--device", default="auto", help="auto (default), cpu, cuda or cuda:N")
    r.add_argument("--inputs", help="npz file with one array per input name (pickled entries are refused)")
    r.add_argument("--output", help="write the outputs to this npz file (exactly this name; not a folder). "
                                    "Entries are the output names when those are plain file names, else "
                                    "vNNN_<name>; __names__.json inside maps entries to output names")
    r.add_argument("--seed", type=int, default=0, help="seed for random inputs (default 0)")
    r.add_argument("--dim", action="append", metavar="NAME=VALUE", help="value of a symbolic dimension")
    r.add_argument("--dump", metavar="DIR", help="write every intermediate value to DIR (npz + index.json)")
    r.add_argument("--json", action="store_true", help="machine-readable output")
    r.set_defaults(func=cmd_run)

    i = _subparser(sub, "info", help="versions, devices, CUDA kernel cache and CUDA-accelerated operators")
    i.add_argument("--json", action="store_true")
    i.set_defaults(func=cmd_info)

    from .conformance.report import build_parser as conformance_parser

    c = _subparser(sub, "conformance", help="run the official ONNX backend test cases",
                   description="Run the official ONNX backend test cases through gpukernels.backend; "
                               "prints a per-kind and per-operator table.")
    conformance_parser(c)
    c.set_defaults(func=cmd_conformance)

    q = _subparser(sub, "parity", help="compare a model across devices/runtimes and find the first diverging node",
                   description="Run MODEL on each device (and optionally onnxruntime or onnx.reference), compare "
                               "every output (--all-nodes: every intermediate) with the first device, and name "
                               "the first node whose outputs diverge while its inputs agree.")
    q.add_argument("model", nargs="?", help="model.onnx (default: the bundled model)")
    q.add_argument("--devices", help="comma-separated gpukernels devices (default: cpu, and cuda:0 when a "
                                     "GPU is usable; the devices used are named on stderr)")
    q.add_argument("--against", choices=["onnxruntime", "reference"], help="also run this runtime")
    q.add_argument("--inputs", help="npz with the inputs (default: seeded random)")
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--rtol", type=float, default=1e-4)
    q.add_argument("--atol", type=float, default=1e-5)
    q.add_argument("--all-nodes", action="store_true", help="compare every intermediate value")
    q.add_argument("--save", metavar="DIR", help="save the first side's values and the inputs to DIR")
    q.add_argument("--load", metavar="DIR", help="use values saved with --save as the baseline")
    q.add_argument("--dim", action="append", metavar="NAME=VALUE")
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=cmd_parity)

    f = _subparser(sub, "profile", help="time every node of a model and list the top operators and nodes",
                   description="Time each node (synchronising the GPU after each when --sync on), print the "
                               "top operators and nodes, and the whole-model time with and without per-node "
                               "synchronisation.")
    f.add_argument("model", nargs="?", help="model.onnx (default: the bundled model)")
    f.add_argument("--device", default="auto")
    f.add_argument("--repeat", type=int, default=10)
    f.add_argument("--sync", choices=["auto", "on", "off"], default="auto",
                   help="synchronise the device after every node (auto: on for cuda)")
    f.add_argument("--top", type=int, default=15)
    f.add_argument("--json", action="store_true")
    f.set_defaults(func=cmd_profile)

    v = _subparser(sub, "eval", help="run a model over a dataset on Dask (a local cluster by default) and "
                                     "optionally compare it with another runtime per sample",
                   description="Run MODEL over every sample of --data (a folder of .npz files, a folder of .npy "
                               "files, one per input, or a Zarr group) on a Dask cluster, write the outputs "
                               "(--output: a folder of .npz files, or a Zarr group when the path ends in .zarr) "
                               "and with --against compare every sample. Needs the 'dist' extra: "
                               "pip install 'gpukernels[dist]'.")
    v.add_argument("model", nargs="?", help="model.onnx (default: the bundled model)")
    v.add_argument("--data", required=True, metavar="PATH", help="npz folder, npy folder or Zarr group")
    v.add_argument("--output", metavar="PATH", help="npz folder, or Zarr group (PATH ending in .zarr)")
    v.add_argument("--device", default="auto", help="auto (default: cuda when usable here), cpu, cuda or cuda:N")
    v.add_argument("--batch", type=int, metavar="N", help="samples per task and per written batch "
                                                          "(default: about 4 MiB of input, at most 256)")
    v.add_argument("--workers", type=int, metavar="N", help="local worker processes (default: one per core, "
                                                            "or one per GPU)")
    v.add_argument("--scheduler", metavar="ADDRESS", help="an existing Dask scheduler, e.g. tcp://host:8786 "
                                                          "(default: start a local cluster)")
    v.add_argument("--against", choices=["onnxruntime", "reference", "cpu", "cuda"],
                   help="also run this runtime or device and compare every sample")
    v.add_argument("--rtol", type=float, default=1e-4)
    v.add_argument("--atol", type=float, default=1e-5)
    v.add_argument("--report", metavar="PATH.md", help="the parity report (default with --output: "
                                                        "OUTPUT-parity.md; the PNG histogram goes beside it)")
    v.add_argument("--resume", action="store_true", help="skip the batches --output already holds")
    v.add_argument("--threads", type=int, metavar="N", help="host threads per task (default: cores / task "
                                                            "threads of the workers on each machine)")
    v.add_argument("--json", action="store_true")
    v.set_defaults(func=cmd_eval)
    return p


# ---------------------------------------------------------------------------- main


def _causes(exc: BaseException):
    """exc and the exceptions it was raised from."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__


def classify(exc: BaseException, args) -> tuple[int, str]:
    """(exit status, message) for an exception that ended a command."""
    from .errors import DeviceError, GpuKernelsError, InputError, ResourceLimitError

    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED, "interrupted"
    if isinstance(exc, (UsageError, DataError, InputError, re.error)):
        return EXIT_USAGE, str(exc)
    if isinstance(exc, DeviceError):
        return EXIT_NO_DEVICE, str(exc)
    model = ""
    if args.command in ("run", "parity", "profile"):
        model = f"model {getattr(args, 'model', None) or bundled_model_path()}: "
    limit = next((e for e in _causes(exc) if isinstance(e, (ResourceLimitError, MemoryError, RecursionError))), None)
    if isinstance(limit, MemoryError):
        return EXIT_RESOURCES, f"{model}out of memory: {str(exc) or 'MemoryError'}"
    if isinstance(limit, RecursionError):
        return EXIT_RESOURCES, f"{model}nesting too deep: {exc}"
    if limit is not None:
        return EXIT_RESOURCES, f"{model}{exc}"
    if isinstance(exc, GpuKernelsError):
        hint = ""
        defaulted = getattr(args, "defaulted_dims", None)
        if defaulted:  # the run on random inputs failed: the 1s may not suit the model
            shown = ", ".join(repr(safe_name(n)) if n else "(unnamed)" for n in defaulted[:6])
            hint = (f" (the random inputs set the symbolic dimension(s) {shown} to 1: pass "
                    "--dim NAME=VALUE or --inputs FILE.npz)")
        return EXIT_MODEL, f"{model}{exc}{hint}"
    if isinstance(exc, OSError):
        return EXIT_USAGE, str(exc)
    return EXIT_INTERNAL, (f"internal error: {type(exc).__name__}: {exc} "
                           "(rerun with --debug for the traceback and report it)")


def one_line(message: str) -> str:
    """message on one line: line breaks become '; ', other unprintables are escaped."""
    return "; ".join(safe_name(part.strip()) for part in str(message).split("\n") if part.strip())


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - every failure ends in one line
        if args.debug:
            raise
        code, message = classify(exc, args)
    print(f"gpukernels {args.command}: error: {one_line(message)}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
