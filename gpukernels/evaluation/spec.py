"""What eval needs to know about a model: its inputs (element type, declared dimensions)
and outputs, and how many samples one run takes.

Every input and output carries the samples on its first axis.  A symbolic first
dimension takes a whole batch in one run; a fixed one (an export at batch 1, say) takes
exactly that many samples, so a batch runs as several runs (the last padded and cut).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from ..archive import safe_name
from ..errors import ModelError


class EvalError(ModelError):
    """A run over a dataset that could not finish for a reason other than bad data or a
    bad model (workers that kept dying, a cluster that went away)."""


class EvalArgumentError(ValueError):
    """An argument to evaluate() that cannot be used (the CLI turns it into exit 2)."""


class MissingExtraError(ImportError):
    """eval needs an optional dependency that is not installed; the message names the extra."""


@dataclass(frozen=True)
class InputSpec:
    name: str
    elem_type: int
    dtype: "np.dtype | None"     # host dtype of the element type (None: unknown)
    type_name: str                # FLOAT, INT64...
    dims: "tuple | None"          # declared dims, int or None (symbolic); None: no shape declared

    @property
    def sample_dims(self) -> "tuple | None":
        return None if self.dims is None else self.dims[1:]

    def describe(self) -> str:
        if self.dims is None:
            return f"{self.type_name} (no shape)"
        return f"{self.type_name}[{', '.join('?' if d is None else str(d) for d in self.dims)}]"

    def check_dtype(self, dtype: np.dtype) -> bool:
        if self.dtype is None:
            return True
        if self.type_name == "STRING":
            return np.dtype(dtype).kind in "US"
        return np.dtype(dtype) == self.dtype

    def sample_shape_error(self, shape) -> "str | None":
        """Why one sample of this shape does not fit the input (None: it fits)."""
        want = self.sample_dims
        if want is None:
            return None
        if len(shape) != len(want):
            return (f"one sample has {len(shape)} dimension(s) {list(shape)}; the model's input takes "
                    f"{self.describe()}, i.e. {len(want)} per sample after the batch axis")
        for i, (got, d) in enumerate(zip(shape, want)):
            if d is not None and got != d:
                return (f"one sample has shape {list(shape)}; the model's input takes {self.describe()} "
                        f"(dimension {i + 1} must be {d})")
        return None


@dataclass(frozen=True)
class ModelSpec:
    path: str                 # the model file (for messages)
    digest: str               # sha256 of the file's bytes, 16 hex digits
    inputs: tuple
    outputs: tuple            # output names
    run_size: "int | None"    # samples per run when the first dimension is fixed
    external_data: bool       # initializers stored outside the file (ship the path, not bytes)

    @property
    def input_names(self) -> list:
        return [i.name for i in self.inputs]


def _dims(tt) -> "tuple | None":
    if not tt.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim)


def model_spec(path, proto: onnx.ModelProto, data: bytes) -> ModelSpec:
    """The spec of a loaded (and checked) model; ModelError for a model eval cannot batch."""
    from .. import dtypes

    label = safe_name(path)
    init = {i.name for i in proto.graph.initializer}
    inputs = []
    for vi in proto.graph.input:
        if vi.name in init:
            continue
        kind = vi.type.WhichOneof("value")
        if kind != "tensor_type":
            raise ModelError(f"model {label}: input {safe_name(vi.name)!r} is a {kind or 'value of no type'}; "
                             "eval feeds tensors with the samples on the first axis")
        tt = vi.type.tensor_type
        try:
            info = dtypes.info(tt.elem_type)
            dtype, type_name = info.numpy, info.name
        except (TypeError, KeyError, ValueError):
            dtype, type_name = None, f"type {tt.elem_type}"
        dims = _dims(tt)
        if dims is not None and len(dims) == 0:
            raise ModelError(f"model {label}: input {safe_name(vi.name)!r} is a scalar; eval needs a sample "
                             "(batch) axis first on every input")
        inputs.append(InputSpec(vi.name, tt.elem_type, dtype, type_name, dims))
    if not inputs:
        raise ModelError(f"model {label} has no inputs: there is nothing to feed it from a dataset")
    fixed = {i.dims[0] for i in inputs if i.dims is not None and i.dims[0] is not None}
    if len(fixed) > 1:
        raise ModelError(f"model {label}: its inputs fix different first dimensions {sorted(fixed)}; eval "
                         "needs one sample (batch) axis shared by every input")
    run_size = fixed.pop() if fixed else None
    if run_size == 0:
        raise ModelError(f"model {label}: its inputs fix the batch dimension to 0")
    external = any(t.data_location == onnx.TensorProto.EXTERNAL for t in proto.graph.initializer)
    return ModelSpec(str(path), hashlib.sha256(data).hexdigest()[:16], tuple(inputs),
                     tuple(o.name for o in proto.graph.output), run_size, external)


def load_spec(model) -> "tuple[ModelSpec, bytes]":
    """(spec, file bytes) of the model file at path, loaded and checked as Session does."""
    from ..runtime import load_model

    path = Path(model)
    proto, _ = load_model(str(path))
    data = path.read_bytes()
    return model_spec(path, proto, data), data
