"""Checks of untrusted models and of the values fed to them.

A model may come from anyone.  Before anything runs, ``check_model`` refuses what would
otherwise be accepted silently or fail later with an unclear error (no graph, no or
unknown opsets, subgraphs nested past MAX_GRAPH_DEPTH, names that are not UTF-8), and
``check_graph`` (called for every graph the runtime prepares, subgraphs included)
enforces single assignment and the operator's input/output counts from its schema.
``check_feed`` compares a value given for a graph input with the declared type.
"""

from __future__ import annotations

import numpy as np
import onnx

from .. import dtypes
from ..errors import InputError, ModelError

# deepest nesting of subgraphs (If/Loop/Scan bodies inside each other) a model may have
MAX_GRAPH_DEPTH = 64

_KNOWN_DOMAIN_MAX = {("" if d == "ai.onnx" else d): hi
                     for d, (_, hi) in onnx.defs.C.schema_version_map().items()}


def check_model(model: onnx.ModelProto) -> None:
    """Raise a ModelError for a model that must not be run (see the module docstring)."""
    if not model.HasField("graph") and not model.opset_import:
        raise ModelError("not an ONNX model: it has no graph and no opset_import (an empty or "
                         "foreign file?)")
    if not model.opset_import:
        raise ModelError("the model declares no opset_import, so the operators' versions are "
                         "unknown; set opset_import (e.g. onnx.helper.make_opsetid('', 17))")
    seen = {}
    for o in model.opset_import:
        domain = "" if o.domain == "ai.onnx" else o.domain
        if not isinstance(domain, str):
            raise ModelError(f"an opset_import domain is not valid UTF-8: {escape(domain)}")
        # an exact repeat (skl2onnx 1.20 writes the default domain twice) is harmless, as
        # onnx.checker and onnxruntime agree; two versions of one domain are ambiguous
        if domain in seen and seen[domain] != o.version:
            raise ModelError(f"opset_import lists domain {escape(domain or 'ai.onnx')} twice, at versions "
                             f"{seen[domain]} and {o.version}: which one the operators follow is ambiguous")
        seen[domain] = o.version
        highest = _KNOWN_DOMAIN_MAX.get(domain)
        if o.version < 1 or (highest is not None and o.version > highest):
            raise ModelError(
                f"the model imports opset {o.version} of domain {escape(domain or 'ai.onnx')}; "
                f"the installed onnx ({onnx.__version__}) knows versions 1..{highest}"
                if highest is not None else
                f"the model imports opset {o.version} of domain {escape(domain)}; versions start at 1")
    _check_nesting(model)


def _check_nesting(model: onnx.ModelProto) -> None:
    """Subgraph depth at most MAX_GRAPH_DEPTH (an explicit stack: no recursion)."""
    stack = [(model.graph, 1)] + [(f, 1) for f in model.functions]
    while stack:
        graph, depth = stack.pop()
        if depth > MAX_GRAPH_DEPTH:
            raise ModelError(f"subgraphs are nested more than {MAX_GRAPH_DEPTH} deep "
                             "(If/Loop/Scan bodies inside each other); refused")
        for node in graph.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    stack.append((attr.g, depth + 1))
                elif attr.type == onnx.AttributeProto.GRAPHS:
                    stack.extend((g, depth + 1) for g in attr.graphs)


def escape(text) -> str:
    """A model-provided name made safe to print: quoted, with control and other
    unprintable characters escaped (bytes that are not UTF-8 shown as bytes)."""
    if isinstance(text, bytes):
        return repr(text)
    return repr(str(text)) if not str(text).isprintable() else f"'{text}'"


def check_graph(graph: onnx.GraphProto, where: str) -> None:
    """Single assignment inside one graph: distinct input names and initializer names,
    and every node output written once, by one node, never over an input or an
    initializer.  Names must be UTF-8."""
    defined: dict[str, str] = {}
    for i in graph.input:
        _check_name(i.name, where, "input")
        if i.name in defined:
            raise ModelError(f"{where}: input name {escape(i.name)} is declared twice")
        defined[i.name] = "a graph input"
    initializers = set()
    for t in list(graph.initializer) + [s.values for s in graph.sparse_initializer]:
        _check_name(t.name, where, "initializer")
        if t.name in initializers:
            raise ModelError(f"{where}: initializer {escape(t.name)} is defined twice")
        initializers.add(t.name)
        defined.setdefault(t.name, "an initializer")
    for k, node in enumerate(graph.node):
        for field in (node.op_type, node.domain, node.name):
            _check_name(field, where, f"node #{k}")
        label = f"node {escape(node.name or node.op_type)} (#{k}, {escape(node.op_type)})"
        for name in node.input:
            _check_name(name, where, label)
        for name in node.output:
            _check_name(name, where, label)
            if not name:
                continue
            if name in defined:
                raise ModelError(f"{where}: {label} writes {escape(name)}, which is already "
                                 f"{defined[name]}; every value must be assigned once")
            defined[name] = f"written by {label}"


def _check_name(name, where: str, what: str) -> None:
    if not isinstance(name, str):
        raise ModelError(f"{where}: a name of {what} is not valid UTF-8: {escape(name)}")


def check_arity(node: onnx.NodeProto, schema, where: str) -> None:
    """The node's input and output counts fit its schema, and no required (single, not
    optional) input or output is left empty."""
    if schema is None:
        return
    n_in, n_out = len(node.input), len(node.output)
    if n_in < schema.min_input or n_in > schema.max_input:
        raise ModelError(f"{where}: has {n_in} input(s); opset-{schema.since_version} "
                         f"{schema.name} takes {_count_range(schema.min_input, schema.max_input)}")
    if n_out < schema.min_output or n_out > schema.max_output:
        raise ModelError(f"{where}: has {n_out} output(s); opset-{schema.since_version} "
                         f"{schema.name} gives {_count_range(schema.min_output, schema.max_output)}")
    single = onnx.defs.OpSchema.FormalParameterOption.Single
    for names, formals, kind in ((node.input, schema.inputs, "input"),
                                 (node.output, schema.outputs, "output")):
        for i, formal in enumerate(formals):
            if i < len(names) and not names[i] and formal.option == single:
                raise ModelError(f"{where}: required {kind} {i} ({formal.name!r}) of "
                                 f"{schema.name} is empty")


def _count_range(lo: int, hi: int) -> str:
    if hi >= 2 ** 31 - 1:
        return f"at least {lo}"
    return f"{lo}" if lo == hi else f"{lo} to {hi}"


# ------------------------------------------------------------------ feeds


def check_feed(name: str, value, type_proto):
    """value checked against the declared TypeProto of input name; returns the value to
    use (plain Python numbers/lists are converted to the declared element type when that
    conversion is exact).  Raises an InputError naming the input, what the model
    declares and what was given."""
    if type_proto is None:
        return value
    kind = type_proto.WhichOneof("value")
    if kind == "tensor_type":
        return _check_tensor_feed(name, value, type_proto.tensor_type)
    if kind == "optional_type":
        return value if value is None else check_feed(name, value, type_proto.optional_type.elem_type)
    if kind == "sequence_type":
        from ..tensor import Sequence

        items = value.tensors if isinstance(value, Sequence) else value
        if not isinstance(items, (list, tuple)):
            raise InputError(f"input {escape(name)}: the model declares a sequence, got "
                             f"{type(value).__name__}")
        elem = type_proto.sequence_type.elem_type
        checked = [check_feed(f"{name}[{i}]", v, elem) for i, v in enumerate(items)]
        return value if isinstance(value, Sequence) else checked
    return value


def feed_checker(name: str, type_proto):
    """check_feed for one input, prepared once: a NumPy array of the declared dtype and
    of a fitting shape passes with a few comparisons (the per-run cost of checking)."""
    if type_proto is None or type_proto.WhichOneof("value") != "tensor_type":
        return lambda value: check_feed(name, value, type_proto)
    tt = type_proto.tensor_type
    try:
        want = dtypes.info(tt.elem_type).numpy if tt.elem_type else None
    except TypeError:
        want = None
    if want is None or want.kind in "OUS":
        return lambda value: check_feed(name, value, type_proto)
    rank = len(tt.shape.dim) if tt.HasField("shape") else None
    fixed = tuple((axis, d.dim_value) for axis, d in enumerate(tt.shape.dim)
                  if d.WhichOneof("value") == "dim_value") if rank is not None else ()
    ndarray = np.ndarray

    def check(value):
        if value.__class__ is ndarray and value.dtype == want and (rank is None or (
                value.ndim == rank and all(value.shape[a] == d for a, d in fixed))):
            return value
        return check_feed(name, value, type_proto)

    return check


def _declared(tt) -> str:
    try:
        text = dtypes.describe(tt.elem_type) if tt.elem_type else "tensor"
    except TypeError:  # an element type this onnx does not define (the model's word)
        text = f"tensor of unknown element type {tt.elem_type}"
    if tt.HasField("shape"):
        dims = [str(d.dim_value) if d.WhichOneof("value") == "dim_value" else (d.dim_param or "?")
                for d in tt.shape.dim]
        text += f"[{', '.join(dims)}]"
    return text


def _check_tensor_feed(name: str, value, tt):
    from ..tensor import Sequence, Tensor

    if value is None or isinstance(value, (Sequence, dict)):
        raise InputError(f"input {escape(name)}: the model declares {_declared(tt)}, got "
                         f"{'nothing' if value is None else type(value).__name__}")
    if isinstance(value, Tensor):
        given_type, shape = (value.data_type if not value.is_absent else None), value.shape
    elif hasattr(value, "dtype") and hasattr(value, "shape"):
        given_type, shape = _data_type_of(value.dtype), tuple(value.shape)
    else:
        value = _from_python(name, value, tt)
        given_type, shape = _data_type_of(value.dtype), value.shape
    if tt.elem_type and given_type != tt.elem_type:
        shown = dtypes.describe(given_type) if given_type is not None else "an unknown element type"
        raise InputError(f"input {escape(name)}: the model declares {_declared(tt)}, got "
                         f"{shown}{list(shape)}")
    if tt.HasField("shape"):
        dims = tt.shape.dim
        if len(dims) != len(shape):
            raise InputError(f"input {escape(name)}: the model declares {_declared(tt)} (rank "
                             f"{len(dims)}), got shape {list(shape)} (rank {len(shape)})")
        for axis, (d, size) in enumerate(zip(dims, shape)):
            if d.WhichOneof("value") == "dim_value" and d.dim_value != size:
                raise InputError(f"input {escape(name)}: the model declares {_declared(tt)}, got "
                                 f"shape {list(shape)} (dimension {axis} must be {d.dim_value})")
    return value


def _data_type_of(dtype):
    dtype = np.dtype(dtype)
    if dtype.kind in "OUS":
        return dtypes.DataType.STRING
    try:
        return dtypes.from_numpy(dtype).data_type
    except (TypeError, KeyError, ValueError):
        return None


def _from_python(name: str, value, tt) -> np.ndarray:
    """A plain Python number or (nested) list as an array of the declared element type,
    when every value converts exactly."""
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError) as exc:
        raise InputError(f"input {escape(name)}: cannot read {type(value).__name__} as a tensor: "
                         f"{exc}") from None
    if not tt.elem_type or arr.dtype.kind in "OUS":
        return arr
    try:
        want = dtypes.info(tt.elem_type).numpy
        converted = arr.astype(want)
        exact = np.array_equal(converted.astype(arr.dtype), arr, equal_nan=arr.dtype.kind in "fc")
    except (TypeError, ValueError, OverflowError):
        exact = False
    if not exact:
        raise InputError(f"input {escape(name)}: the model declares {_declared(tt)}; the "
                         f"{arr.dtype} values given do not convert exactly")
    return converted
