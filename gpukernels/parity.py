"""Compare a model's values across devices and runtimes, and find where they diverge.

``compare()`` runs a model on each side (gpukernels on a device, onnxruntime,
onnx.reference, or values saved earlier with ``save``), compares every graph output --
and with ``all_nodes=True`` every intermediate value in topological order -- against
the first side, and names the first node whose outputs diverge while its inputs agree.

Tolerance rule: an element passes when |a - b| <= atol + rtol * |b| (b from the first
side), NaN matching NaN and equal infinities matching.  With ``atol_relative=True`` atol
is a fraction of each value's largest finite |b| (so one tolerance fits values of any
scale: logits of 0.01 and boxes of 400); a value whose baseline is all zero keeps atol.
With ``exact_integers=True`` integer and boolean values pass only when equal (a tolerance
would let an index or a quantized value be off by one).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import onnx

from .archive import DataError, read_npz, safe_name, write_npz
from .errors import DeviceError, ModelError
from .inputs import random_inputs


@dataclass
class Side:
    """One way of running the model.  kind: 'gpukernels', 'onnxruntime', 'reference' or
    'saved'; device and options apply to gpukernels; path to saved values."""

    label: str
    kind: str = "gpukernels"
    device: str = "cpu"
    options: dict = field(default_factory=dict)
    path: str | None = None


@dataclass
class ValueDiff:
    name: str
    producer: str          # node name ('' for graph inputs)
    op_type: str
    shape: list
    dtype: str
    max_abs: float
    max_rel: float
    outside: float         # share of elements outside tolerance
    nan: tuple             # (baseline, other)
    inf: tuple
    min_atol: float        # smallest atol passing with rtol=0
    min_rtol: float        # smallest rtol passing with atol=0
    passed: bool
    note: str = ""


@dataclass
class Divergence:
    node: str
    op_type: str
    attributes: dict
    inputs: list           # [(name, shape, dtype)]; shape and dtype None: not compared
    outputs: list
    outputs_only: bool = False  # some input is an intermediate that was not compared


@dataclass
class SideReport:
    label: str
    values: list
    first_divergence: Divergence | None
    passed: bool


@dataclass
class ParityReport:
    model: str
    baseline: str
    rtol: float
    atol: float
    sides: list
    passed: bool
    notes: list = field(default_factory=list)  # what explains differences (random nodes)

    def to_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------- running sides


def _node_outputs(model: onnx.ModelProto) -> list[tuple[str, onnx.NodeProto]]:
    return [(o, n) for n in model.graph.node for o in n.output if o]


def _run_gpukernels(model, feeds, side: Side, all_nodes: bool) -> dict:
    from .runtime import Session
    from .tensor import Sequence, Tensor, to_host_value

    # every node is compared: folded constant nodes would not run (and not be observed)
    options = dict(side.options, fold_constants=False, optimize=False) if all_nodes else side.options
    sess = Session(model, device=side.device, options=options)
    captured = {}

    def observer(node, inputs, outputs, seconds):
        for name, v in zip(node.outputs, outputs):
            if name and isinstance(v, (Tensor, Sequence)):
                captured[name] = to_host_value(v)

    values = sess.run_values(feeds, observer=observer if all_nodes else None)
    out = dict(captured)
    for name, v in zip(sess.output_names, values):
        out[name] = to_host_value(v)
    return out


def _with_all_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of model whose graph also outputs every node output (typed by inference)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    try:
        inferred = onnx.shape_inference.infer_shapes(m)
        types = {vi.name: vi for vi in list(inferred.graph.value_info) + list(inferred.graph.output)}
    except Exception:
        types = {}
    have = {o.name for o in m.graph.output}
    for name, _ in _node_outputs(m):
        if name not in have and name in types and types[name].type.WhichOneof("value") == "tensor_type":
            m.graph.output.append(types[name])
    return m


def _run_external(model, feeds, side: Side, all_nodes: bool) -> dict:
    m = _with_all_outputs(model) if all_nodes else model
    names = [o.name for o in m.graph.output]
    if side.kind == "onnxruntime":
        try:
            import onnxruntime as ort
        except ImportError as exc:
            raise ModelError("onnxruntime is not installed (pip install onnxruntime)") from exc
        try:
            sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
            results = sess.run(names, feeds)
        except Exception as exc:
            raise ModelError(f"onnxruntime could not run the model: {exc}") from exc
    else:
        from onnx.reference import ReferenceEvaluator

        try:
            results = ReferenceEvaluator(m).run(names, feeds)
        except (MemoryError, RecursionError):
            raise
        except Exception as exc:
            raise ModelError(f"onnx.reference could not run the model: {type(exc).__name__}: {exc}") from exc
    return dict(zip(names, results))


def model_digest(model: onnx.ModelProto) -> str:
    return hashlib.sha256(model.SerializeToString(deterministic=True)).hexdigest()[:16]


def save_values(directory, label: str, model: onnx.ModelProto, feeds: dict, values: dict) -> None:
    """Write one side's values (and the inputs used) to directory: values.npz and
    inputs.npz (safe archives, see gpukernels.archive) and index.json."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    arrays = {name: v for name, v in values.items() if isinstance(v, np.ndarray) and v.dtype != object}
    write_npz(d / "values.npz", arrays)
    write_npz(d / "inputs.npz", feeds)
    (d / "index.json").write_text(json.dumps({"format": 2, "label": label, "model_digest": model_digest(model),
                                              "values": list(arrays)}, indent=1))


_INDEX_LIMIT = 64 << 20


def _read_index(directory: Path) -> dict:
    """index.json of a saved folder, its shape checked; DataError otherwise."""
    where = safe_name(directory)
    path = directory / "index.json"
    if not path.is_file():
        raise DataError(f"{where}: not a folder written by parity --save (no index.json)")
    if path.stat().st_size > _INDEX_LIMIT:
        raise DataError(f"{where}/index.json is larger than {_INDEX_LIMIT >> 20} MiB")
    try:
        index = json.loads(path.read_bytes().decode("utf-8"))
    except RecursionError:
        raise DataError(f"{where}/index.json is nested too deeply") from None
    except ValueError as exc:
        raise DataError(f"{where}/index.json is not valid JSON: {safe_name(exc)}") from None
    if not isinstance(index, dict):
        raise DataError(f"{where}/index.json must hold an object")
    for key in ("label", "model_digest"):
        if not isinstance(index.get(key), str):
            raise DataError(f"{where}/index.json: {key!r} is missing or not a string")
    values = index.get("values")
    if isinstance(values, list) and all(isinstance(v, str) for v in values):
        return index
    if isinstance(values, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in values.items()):
        return index
    raise DataError(f"{where}/index.json: 'values' must be a list of names (or a map of names to keys)")


def load_values(directory, model: onnx.ModelProto) -> tuple[str, dict, dict]:
    """(label, values, inputs) saved by save_values; checks it was the same model.
    Crafted folders get a DataError: missing or malformed index.json, pickled or
    oversized arrays, names missing from the archive."""
    d = Path(directory)
    where = safe_name(d)
    if not d.is_dir():
        raise DataError(f"{where}: no such folder")
    index = _read_index(d)
    if index["model_digest"] != model_digest(model):
        raise DataError(f"{where}: the saved values come from a different model "
                        f"(digest {safe_name(index['model_digest'], 40)} vs {model_digest(model)})")
    arrays = read_npz(d / "values.npz")
    keys = index["values"] if isinstance(index["values"], dict) else {n: n for n in index["values"]}
    missing = [n for n, k in keys.items() if k not in arrays]
    if missing:
        raise DataError(f"{where}/values.npz lacks value(s) listed in index.json: "
                        f"{', '.join(safe_name(n, 80) for n in missing[:5])}")
    values = {name: arrays[key] for name, key in keys.items()}
    inputs = read_npz(d / "inputs.npz")
    return index["label"], values, inputs


# ------------------------------------------------------------------- comparing


def diff_values(name: str, a, b, rtol: float, atol: float, atol_relative: bool = False,
                exact_integers: bool = False) -> dict:
    """Statistics of b against baseline a (atol_relative, exact_integers: see the module
    docstring)."""
    if isinstance(a, list) or isinstance(b, list):
        a, b = list(a or []), list(b or [])
        if len(a) != len(b):
            return dict(max_abs=float("inf"), max_rel=float("inf"), outside=1.0, nan=(0, 0), inf=(0, 0),
                        min_atol=float("inf"), min_rtol=float("inf"), passed=False,
                        note=f"sequence lengths differ ({len(a)} vs {len(b)})", shape=[len(a)], dtype="sequence")
        parts = [diff_values(name, x, y, rtol, atol, atol_relative, exact_integers) for x, y in zip(a, b)]
        worst = max(parts, key=lambda p: p["max_abs"], default=None)
        out = dict(worst) if worst else dict(max_abs=0.0, max_rel=0.0, outside=0.0, nan=(0, 0), inf=(0, 0),
                                              min_atol=0.0, min_rtol=0.0, passed=True, note="")
        out.update(passed=all(p["passed"] for p in parts), shape=[len(a)], dtype="sequence")
        return out
    a = np.asarray(a)
    b = np.asarray(b)
    base = dict(shape=list(a.shape), dtype=str(a.dtype), note="")
    if a.shape != b.shape:
        return {**base, "max_abs": float("inf"), "max_rel": float("inf"), "outside": 1.0, "nan": (0, 0),
                "inf": (0, 0), "min_atol": float("inf"), "min_rtol": float("inf"), "passed": False,
                "note": f"shapes differ: {list(a.shape)} vs {list(b.shape)}"}
    if a.dtype == object or b.dtype == object:
        eq = a == b
        return {**base, "max_abs": 0.0 if eq.all() else float("inf"), "max_rel": 0.0, "nan": (0, 0),
                "inf": (0, 0), "outside": float(1 - eq.mean()) if eq.size else 0.0, "min_atol": 0.0,
                "min_rtol": 0.0, "passed": bool(eq.all())}
    af = a.astype(np.complex128 if a.dtype.kind == "c" else np.float64)
    bf = b.astype(af.dtype)
    nan_a, nan_b = np.isnan(af), np.isnan(bf)
    inf_a, inf_b = np.isinf(af), np.isinf(bf)
    special_ok = (nan_a & nan_b) | (inf_a & inf_b & (af == bf))
    with np.errstate(all="ignore"):
        err = np.abs(af - bf)
        err = np.where(special_ok, 0.0, err)
        err = np.where((nan_a ^ nan_b) | ((inf_a | inf_b) & ~special_ok), np.inf, err)
        mag = np.abs(bf)
        rel = np.where(err == 0, 0.0, err / np.where(mag == 0, np.inf, mag))
        rel = np.where((err > 0) & (mag == 0), np.inf, rel)
        if atol_relative:
            finite = np.abs(af[np.isfinite(af)])
            scale = float(finite.max()) if finite.size else 0.0
            atol = atol * scale if scale > 0 else atol
        if exact_integers and a.dtype.kind in "iub" and b.dtype.kind in "iub":
            atol, rtol = 0.0, 0.0
        bad = err > atol + rtol * mag
    max_abs = float(err.max()) if err.size else 0.0
    max_rel = float(rel.max()) if rel.size else 0.0
    return {**base, "max_abs": max_abs, "max_rel": max_rel,
            "outside": float(bad.mean()) if bad.size else 0.0,
            "nan": (int(nan_a.sum()), int(nan_b.sum())), "inf": (int(inf_a.sum()), int(inf_b.sum())),
            "min_atol": max_abs, "min_rtol": max_rel, "passed": not bool(bad.any())}


def _first_divergence(model, diffs: dict) -> Divergence | None:
    """The first node (topological order) with a diverging output and agreeing inputs."""
    from onnx import helper

    produced = {o for n in model.graph.node for o in n.output if o}
    for node in model.graph.node:
        outs = [o for o in node.output if o in diffs]
        if not outs or all(diffs[o].passed for o in outs):
            continue
        ins = [i for i in node.input if i]
        if all(diffs[i].passed for i in ins if i in diffs):
            attrs = {a.name: _short(helper.get_attribute_value(a)) for a in node.attribute}
            return Divergence(node.name or node.op_type, node.op_type, attrs,
                              [(i, diffs[i].shape, diffs[i].dtype) if i in diffs else (i, None, None) for i in ins],
                              outs, outputs_only=any(i in produced and i not in diffs for i in ins))
    return None


RANDOM_OPS = frozenset({"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
                        "Bernoulli", "Multinomial"})


def random_nodes(model) -> list:
    """(name, op type) of the nodes that draw random numbers, subgraphs included: devices
    draw from different generators, so what they compute from them differs."""
    from .runtime.graph import _graphs_of

    found, stack = [], [model.graph]
    while stack:
        graph = stack.pop()
        for node in graph.node:
            if node.domain in ("", "ai.onnx") and node.op_type in RANDOM_OPS:
                found.append((node.name or node.op_type, node.op_type))
            for a in node.attribute:
                stack.extend(_graphs_of(a))
    return found


def _short(v):
    if isinstance(v, bytes):
        return v.decode(errors="replace")
    if isinstance(v, (int, float, str)):
        return v
    if isinstance(v, list) and len(v) <= 16 and all(isinstance(x, (int, float, bytes)) for x in v):
        return [x.decode() if isinstance(x, bytes) else x for x in v]
    return type(v).__name__


def default_devices() -> tuple[list, str]:
    """(devices, why) for a parity run given no devices: cpu, and cuda:0 when a GPU is
    usable here (a machine without one compares nothing across devices: add --against)."""
    from .xp import cuda_status

    status = cuda_status()
    if status.available:
        return ["cpu", "cuda:0"], "cpu and cuda:0 (a usable GPU was found)"
    return ["cpu"], f"cpu only: CUDA unavailable ({status.reason})"


def compare(model, sides: list | None = None, devices=("cpu",), against=None, inputs: dict | None = None,
            seed: int = 0, rtol: float = 1e-4, atol: float = 1e-5, all_nodes: bool = False,
            save: str | None = None, load: str | None = None, dims: dict | None = None,
            paths=None, atol_relative: bool = False, exact_integers: bool = False) -> ParityReport:
    """Run model on each side and compare every side with the first.

    devices: gpukernels devices to run on ('cpu', 'cuda'); paths: None, or the values of
    the option 'paths' to run each device with (('reference', 'auto') compares the
    registered specialisations with the reference implementations on one device; sides
    are labelled 'cpu[reference]'...); against: 'onnxruntime' or 'reference' adds that
    runtime; load: a directory written by an earlier save, used as the baseline side (its
    inputs are reused); save: write the first live side's values (and inputs) there;
    atol_relative: atol is a fraction of each value's largest finite baseline magnitude;
    exact_integers: integer and boolean values must be equal.
    """
    from .runtime import Session, load_model
    from .xp import Device, cuda_status

    proto, _ = load_model(model)
    label = model if isinstance(model, str) else "<model>"
    if not sides and paths:
        sides = [Side(f"{d}[{p}]", "gpukernels", str(d), {"paths": p}) for d in devices for p in paths]
    sides = list(sides) if sides else [Side(str(d), "gpukernels", str(d)) for d in devices]
    for s in sides:
        if s.kind == "gpukernels" and Device.parse(s.device).is_cuda and not cuda_status().available:
            raise DeviceError(f"device {s.device} is not usable: {cuda_status().reason}")
    if against:
        sides.append(Side(against, against))
    results = []
    if load:
        saved_label, saved_values, saved_inputs = load_values(load, proto)
        inputs = saved_inputs
        results.append((Side(f"saved:{saved_label}", "saved", path=load), saved_values))
    if inputs is None:
        inputs = random_inputs(Session(proto, device="cpu"), seed, dims or {})
    for s in sides:
        if s.kind == "gpukernels":
            values = _run_gpukernels(proto, inputs, s, all_nodes)
        else:
            values = _run_external(proto, inputs, s, all_nodes)
        results.append((s, values))
    if save:
        live = next((r for r in results if r[0].kind != "saved"), None)
        if live is not None:
            save_values(save, live[0].label, proto, inputs, live[1])
    if len(results) < 2:
        return ParityReport(label, results[0][0].label if results else "", rtol, atol, [], True)
    producers = {o: n for o, n in _node_outputs(proto)}
    order = [o.name for o in proto.graph.output]
    if all_nodes:
        order = [o for o, _ in _node_outputs(proto)] + [o for o in order if o not in producers]
    baseline_side, baseline = results[0]
    reports = []
    for side, values in results[1:]:
        diffs = {}
        for name in order:
            if name not in baseline or name not in values:
                continue
            d = diff_values(name, baseline[name], values[name], rtol, atol, atol_relative, exact_integers)
            node = producers.get(name)
            diffs[name] = ValueDiff(name, (node.name or node.op_type) if node else "", node.op_type if node else "",
                                    **d)
        first = _first_divergence(proto, diffs)
        passed = all(d.passed for d in diffs.values()) and all(
            o.name in diffs for o in proto.graph.output)
        reports.append(SideReport(side.label, list(diffs.values()), first, passed))
    notes = []
    randoms = random_nodes(proto)
    if randoms:
        shown = ", ".join(f"{op} '{safe_name(name)}'" for name, op in randoms[:4])
        more = f" and {len(randoms) - 4} more" if len(randoms) > 4 else ""
        notes.append(f"the model draws random numbers ({shown}{more}): every device and runtime draws "
                     "its own, so the values computed from them differ (and from run to run without a seed)")
    return ParityReport(label, baseline_side.label, rtol, atol, reports, all(r.passed for r in reports), notes)


def _cell(text, width: int) -> str:
    return f"{safe_name(text, width):{width}}"


def format_report(report: ParityReport) -> str:
    """The report as a text table; names from the model are escaped (safe_name)."""
    lines = [f"parity: {safe_name(report.model)}",
             f"baseline: {safe_name(report.baseline)}  (rtol {report.rtol:g}, atol {report.atol:g})"]
    for side in report.sides:
        lines.append(f"\n== {safe_name(side.label)} vs {safe_name(report.baseline)}")
        lines.append(f"{'value':32} {'op':18} {'max abs':>10} {'max rel':>10} {'outside':>8} "
                     f"{'nan':>9} {'inf':>9} {'min atol':>10} {'min rtol':>10}  ok")
        for v in side.values:
            lines.append(f"{_cell(v.name, 32)} {_cell(v.op_type, 18)} {v.max_abs:10.3g} {v.max_rel:10.3g} "
                         f"{v.outside * 100:7.2f}% {str(v.nan[0]) + '/' + str(v.nan[1]):>9} "
                         f"{str(v.inf[0]) + '/' + str(v.inf[1]):>9} {v.min_atol:10.3g} {v.min_rtol:10.3g}  "
                         f"{'yes' if v.passed else 'NO'}" + (f"  ({safe_name(v.note)})" if v.note else ""))
        if side.first_divergence:
            d = side.first_divergence
            what = "node of the first diverging output" if d.outputs_only else "first diverging node"
            lines.append(f"{what}: '{safe_name(d.node)}' ({safe_name(d.op_type)}) "
                         f"attributes {safe_name(d.attributes)}")
            for name, shape, dtype in d.inputs:
                lines.append(f"    input {safe_name(name)}: " + ("not compared" if shape is None else f"{dtype}{shape}"))
            lines.append(f"    outputs: {', '.join(safe_name(o) for o in d.outputs)}")
            if d.outputs_only:
                lines.append("    (only the outputs were compared: --all-nodes compares every intermediate "
                             "and names the node where the values start to differ)")
    for note in report.notes:
        lines.append(f"note: {note}")
    lines.append("\nPASSED" if report.passed else "\nFAILED")
    return "\n".join(lines)
