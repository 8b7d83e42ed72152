"""What the tools feed a model: the bundled model, seeded random inputs and input archives.

Used by the CLI, parity and profiling (library code never imports the CLI).  Random
inputs are checked before anything is drawn: every input must be a tensor (else
DataError: pass the inputs in a file) of a known element type with non-negative
dimensions (else ModelError), no larger than max_tensor_bytes (else ResourceLimitError).
"""

from __future__ import annotations

import math
from importlib import resources
from pathlib import Path

import numpy as np

from .archive import DataError, max_tensor_bytes, read_npz, safe_name
from .errors import ModelError

__all__ = ["bundled_model_path", "defaulted_dims", "index_bounds", "random_inputs", "read_inputs",
           "plan_random_inputs"]


def bundled_model_path() -> Path:
    """The small model shipped with the package (used when a command gets no MODEL)."""
    return Path(str(resources.files("gpukernels") / "models" / "hybrid_block.onnx"))


def read_inputs(path, session=None) -> dict:
    """{input name: array} from an npz archive, within the session's size limit."""
    return read_npz(path, max_tensor_bytes(session))


def _declared(tt) -> str:
    dims = [str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in tt.shape.dim]
    return f"[{', '.join(dims)}]" if tt.HasField("shape") else "(no shape)"


_DEFAULT = object()


def plan_random_inputs(session, dims: dict | None = None, max_bytes=_DEFAULT) -> list:
    """[(name, shape, DTypeInfo)] for every declared input, or an error naming the input,
    its declared type and dimensions.  Symbolic dimensions are 1 unless in dims.  Each
    input's size (elements times element size) must be at most max_bytes (None: no limit;
    default: max_tensor_bytes(session))."""
    from . import dtypes
    from .limits import limit_error

    dims = dims or {}
    limit = max_tensor_bytes(session) if max_bytes is _DEFAULT else max_bytes
    plan = []
    for vi in session.inputs:
        name = safe_name(vi.name)
        kind = vi.type.WhichOneof("value")
        if kind != "tensor_type":
            raise DataError(f"cannot make random data for input {name!r} of type {kind or 'undefined'}; "
                            "pass --inputs FILE.npz")
        tt = vi.type.tensor_type
        try:
            info = dtypes.info(tt.elem_type)
        except TypeError:
            info = None
        if info is None:
            what = "UNDEFINED" if tt.elem_type == 0 else "unknown"
            raise ModelError(f"input {name!r} declares element type {tt.elem_type} ({what}) with dims "
                             f"{_declared(tt)}; cannot make random data for it")
        shape = []
        for d in tt.shape.dim:
            v = d.dim_value if d.HasField("dim_value") else dims.get(d.dim_param, 1)
            if v < 0:
                raise ModelError(f"input {name!r} ({info.name}{_declared(tt)}) has a negative dimension {v}")
            shape.append(v)
        if len(shape) > 32:
            raise ModelError(f"input {name!r} ({info.name}) declares {len(shape)} dimensions; "
                             "at most 32 are supported")
        need = math.prod(shape) * info.numpy.itemsize
        if limit is not None and need > limit:
            raise limit_error(None, need, limit, f"random input {name!r} ({info.name}{_declared(tt)})", shape)
        plan.append((vi.name, shape, info))
    return plan


def defaulted_dims(session, dims: dict) -> list:
    """The symbolic dimensions of the session's inputs that plan_random_inputs sets to 1
    (those not in dims), in order of appearance."""
    names = []
    for vi in session.inputs:
        if vi.type.WhichOneof("value") != "tensor_type":
            continue
        for d in vi.type.tensor_type.shape.dim:
            if not d.HasField("dim_value") and d.dim_param not in dims and d.dim_param not in names:
                names.append(d.dim_param)
    return names


_INT_HIGH = 10  # random integers are drawn from [0, _INT_HIGH)
# ops whose first output holds their first input's values (as far as index ranges go)
_SAME_VALUES = frozenset({"Cast", "Identity", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Expand"})
# ops whose first output has their first input's shape (a table dequantized or cast)
_SAME_SHAPE = frozenset({"DequantizeLinear", "Cast", "Identity"})


def index_bounds(model) -> dict:
    """{graph input: n} for integer inputs that reach the indices of a top-level Gather of
    an initializer or a Constant (or of one dequantized or cast), directly or through ops
    that keep the values (Cast, Reshape...), n the smallest size of a gathered axis:
    token ids of an embedding table, token type ids of a two-row table.  Random integers
    are drawn below n there, so that the model runs (an index past the table is an
    error, as it is in onnxruntime)."""
    graph = model.graph
    dims = {t.name: list(t.dims) for t in graph.initializer}
    carries = {i.name: i.name for i in graph.input if i.name not in dims}  # value -> the input it carries
    bounds = {}
    for node in graph.node:
        if node.domain not in ("", "ai.onnx") or not node.output:
            continue
        if node.op_type == "Constant":  # a table in a Constant node
            value = next((a.t for a in node.attribute if a.name == "value" and a.HasField("t")), None)
            if value is not None:
                dims[node.output[0]] = list(value.dims)
            continue
        if not node.input:
            continue
        if node.op_type in _SAME_SHAPE and node.input[0] in dims:  # a quantized or cast table
            dims[node.output[0]] = dims[node.input[0]]
        elif node.op_type in _SAME_VALUES and node.input[0] in carries:
            carries[node.output[0]] = carries[node.input[0]]
        elif node.op_type == "Gather" and len(node.input) == 2 and node.input[1] in carries:
            shape = dims.get(node.input[0])
            axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
            if shape and -len(shape) <= axis < len(shape) and shape[axis] > 0:
                name = carries[node.input[1]]
                bounds[name] = min(bounds.get(name, shape[axis]), shape[axis])
    return bounds


def random_inputs(session, seed: int, dims: dict | None = None, max_bytes=_DEFAULT) -> dict:
    """Seeded random feeds for every declared input: normal floats, small non-negative
    integers (below the size of the table they index, see index_bounds), random
    booleans, strings from a, b, c; every input is checked (see plan_random_inputs)
    before any is drawn."""
    plan = plan_random_inputs(session, dims, max_bytes)
    model = getattr(session, "model", None)
    bounds = index_bounds(model) if model is not None else {}
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, shape, info in plan:
        if info.kind == "float":
            arr = rng.standard_normal(shape).astype(np.float32).astype(info.numpy)
        elif info.kind == "bool":
            arr = rng.random(shape) < 0.5
        elif info.kind in ("int", "uint"):
            arr = rng.integers(0, min(_INT_HIGH, bounds.get(name, _INT_HIGH)), shape).astype(info.numpy)
        elif info.kind == "complex":
            arr = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(info.numpy)
        else:
            arr = np.array(rng.choice(["a", "b", "c"], size=shape), dtype=object)
        feeds[name] = arr
    return feeds
