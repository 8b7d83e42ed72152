"""Sequence operators: SequenceConstruct, SequenceEmpty, SequenceAt, SequenceInsert,
SequenceErase, SequenceLength, ConcatFromSequence, SplitToSequence and SequenceMap.

A sequence is a ``gpukernels.tensor.Sequence``: an element type plus a Python list of
Tensors.  Kernels never change a sequence in place: insert/erase return a new Sequence
whose list shares the (immutable) element Tensors with the input.  Python lists or
tuples of tensors/arrays are accepted wherever a sequence is expected.

Positions are host integers (a scalar, or a one-element 1-D tensor, of INT32/INT64);
reading one from a GPU tensor is a small device-to-host copy.

The helpers at the bottom (value kinds, schema type sets, declared subgraph types) are
shared with the control-flow and optional kernels.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx

from .. import dtypes
from ..dtypes import DataType
from ..limits import (ELEMENT_OVERHEAD, check_allocation, check_bytes, held_bytes, limit_error,
                      max_tensor_bytes)
from ..tensor import Optional, Sequence, Tensor
from ..xp import is_cupy_array
from .base import KernelBase, describe, register
from .subgraphs import runner

_INDEX_TYPES = (DataType.INT32, DataType.INT64)


# ------------------------------------------------------------------ shared helpers


class SequenceKernelBase(KernelBase):
    """KernelBase plus coercion and checks for sequence values."""

    def sequence(self, value, name: str = "input_sequence", type_param: str = "S") -> Sequence:
        """value (a Sequence, or a list/tuple of Tensors/arrays) as a Sequence whose tensors
        live on this kernel's device; element type checked against the schema."""
        if isinstance(value, Sequence):
            seq = value
        elif isinstance(value, (list, tuple)):
            items = [self._element(v, name, i) for i, v in enumerate(value)]
            seq = self._make_sequence(items, None, name)
        elif isinstance(value, Optional):
            raise self.type_error(f"input '{name}' must be a sequence, got an optional "
                                  f"({describe(value)}); unwrap it with OptionalGetElement")
        elif value is None or (isinstance(value, Tensor) and value.is_absent):
            raise self.error(f"required input '{name}' is missing")
        else:
            raise self.type_error(f"input '{name}' must be a sequence of tensors, got {describe(value)}")
        allowed = allowed_types(self.op_type, self.since_version, type_param, "seq")
        if allowed is not None and seq.elem_type not in allowed:
            raise self.type_error(
                f"input '{name}' is a sequence of {dtypes.describe(seq.elem_type)}, which "
                f"opset-{self.since_version} {self.op_type} does not allow", **{name: seq})
        return self.on_device(seq)

    def _element(self, v, name, i) -> Tensor:
        if isinstance(v, Tensor):
            if v.is_absent:
                raise self.error(f"element {i} of '{name}' is absent")
            return v
        if isinstance(v, (Sequence, Optional)):
            raise self.type_error(f"element {i} of '{name}' must be a tensor, got {describe(v)}")
        return Tensor(v)

    def _make_sequence(self, items, elem_type, name) -> Sequence:
        if elem_type is None:
            elem_type = items[0].data_type if items else DataType.FLOAT
        for i, t in enumerate(items):
            if t.data_type != elem_type:
                raise self.type_error(
                    f"mixed element types in sequence '{name}': element {i} is "
                    f"{dtypes.describe(t.data_type)}, the sequence holds {dtypes.describe(elem_type)}")
        seq = Sequence.__new__(Sequence)
        seq.elem_type = DataType(int(elem_type))
        seq.tensors = list(items)
        return seq

    def on_device(self, seq: Sequence) -> Sequence:
        """seq with every tensor on this kernel's device (STRING tensors stay on the host);
        returns seq itself when nothing has to move."""
        want_gpu = self.on_gpu
        if all(t.data_type == DataType.STRING or is_cupy_array(t.array) == want_gpu for t in seq.tensors):
            return seq
        moved = [t if t.data_type == DataType.STRING else t.to(self.device) for t in seq.tensors]
        return self._make_sequence(moved, seq.elem_type, "sequence")

    def element_tensor(self, value, name: str, type_param: str = "T") -> Tensor:
        """A tensor input (STRING stays on the host) whose type the schema allows."""
        if isinstance(value, Tensor) and value.data_type == DataType.STRING and not value.is_absent:
            t = value
        else:
            t = self.tensor(value, name)
        allowed = allowed_types(self.op_type, self.since_version, type_param, "tensor")
        if allowed is not None and t.data_type not in allowed:
            raise self.type_error(
                f"input '{name}' has element type {dtypes.describe(t.data_type)}, which "
                f"opset-{self.since_version} {self.op_type} does not allow", **{name: t})
        return t

    def position(self, value, n: int, allow_end: bool, name: str = "position") -> int:
        """A position input as a host int in [0, n) (or [0, n] with allow_end); negative
        positions count from the back."""
        t = self.tensor(value, name)
        if t.data_type not in _INDEX_TYPES:
            raise self.type_error(f"'{name}' must be int32 or int64, got {dtypes.describe(t.data_type)}",
                                  **{name: t})
        if t.size != 1 or t.ndim > 1:
            raise self.error(f"'{name}' must be a scalar (or a one-element 1-D tensor)", **{name: t})
        p = int(np.asarray(t.numpy()).reshape(-1)[0])
        hi = n if allow_end else n - 1
        if not -n <= p <= hi:
            raise self.error(f"{name} {p} is out of range [{-n}, {hi}] for a sequence of length {n}",
                             **{name: t})
        return p + n if p < 0 else p

    def per_graph(self, graph, tag: str, factory):
        """factory() computed once per (subgraph object, tag) and kept on this kernel, so
        a node run many times (inside a loop body) prepares its checks once."""
        cache = self.__dict__.setdefault("_per_graph", {})
        key = (id(graph), tag)
        entry = cache.get(key)
        if entry is not None and entry[0] is graph:
            return entry[1]
        value = factory()
        if len(cache) > 64:
            cache.clear()
        cache[key] = (graph, value)
        return value

    def output_checker(self, graph, what: str, schema=None) -> "OutputChecker":
        return self.per_graph(graph, "checker:" + what,
                              lambda: OutputChecker(self, what, graph.output, schema=schema))

    def checked_body(self, graph, schema):
        """(run, declared outputs) for a Loop/Scan body: run(inputs) runs the prepared
        body in this kernel's outer scope and checks its outputs against the declared ones."""
        plan = prepare_body(self, graph)
        parent = self.outer_scope
        checker = self.output_checker(graph, "body", schema=schema)

        def run(args):
            outs = plan.run(args, parent=parent)
            checker(outs)
            return outs

        return run, checker.declared

    def xp_for(self, data_type):
        """The array namespace for a tensor type: STRING tensors always use NumPy."""
        return np if data_type == DataType.STRING else self.xp


# ---------------------------------------------------------------------- kernels


@register()
class SequenceConstruct(SequenceKernelBase):
    """A sequence of the given tensors (one element type, any shapes).

    ``as_sequence(tensors)`` does the same from a Python list; ``stacked(tensors)``
    stacks same-shape tensors into one tensor with a new leading axis."""

    def __call__(self, *inputs):
        if not inputs:
            raise self.error("needs at least one input tensor")
        return self.as_sequence(inputs)

    def as_sequence(self, tensors) -> Sequence:
        items = [self.element_tensor(v, f"inputs[{i}]") for i, v in enumerate(tensors)]
        if items and self.on_gpu:
            items = [t if t.data_type == DataType.STRING else t.to(self.device) for t in items]
        return self._make_sequence(items, None, "inputs")

    def stacked(self, tensors) -> Tensor:
        """The tensors stacked along a new axis 0 (all must share shape and type)."""
        seq = self.as_sequence(tensors)
        if not len(seq):
            raise self.error("stacked needs at least one tensor")
        first = seq.tensors[0]
        for i, t in enumerate(seq.tensors):
            if t.shape != first.shape:
                raise self.error(f"stacked needs tensors of one shape; element {i} differs",
                                 first=first, other=t)
        xp = self.xp_for(seq.elem_type)
        return self.result(xp.stack([t.array for t in seq.tensors]), seq.elem_type)


@register()
class SequenceEmpty(SequenceKernelBase):
    """An empty sequence of dtype (0 or unset: FLOAT)."""

    def __call__(self, dtype=None):
        dt = DataType.FLOAT if not dtype else dtype
        try:
            dt = dtypes.info(dt).data_type
        except TypeError:
            raise self.error(f"unknown dtype {dtype!r}") from None
        allowed = allowed_types(self.op_type, self.since_version, "S", "seq")
        if allowed is not None and dt not in allowed:
            raise self.type_error(f"dtype {dtypes.describe(dt)} is not allowed for "
                                  f"opset-{self.since_version} SequenceEmpty")
        return self._make_sequence([], dt, "output")


@register()
class SequenceAt(SequenceKernelBase):
    """The tensor at position (in [-n, n-1]).  The returned Tensor shares the element's
    buffer: kernels never write into their inputs."""

    def __call__(self, input_sequence, position=None):
        seq = self.sequence(input_sequence)
        if position is None:
            raise self.error("required input 'position' is missing")
        p = self.position(position, len(seq), allow_end=False)
        return seq.tensors[p]


@register()
class SequenceInsert(SequenceKernelBase):
    """A new sequence with tensor inserted at position (in [-n, n]; default: the end).
    The tensor's element type must be the sequence's."""

    def __call__(self, input_sequence, tensor=None, position=None):
        seq = self.sequence(input_sequence)
        t = self.element_tensor(tensor, "tensor")
        if t.data_type != seq.elem_type:
            raise self.type_error(
                f"cannot insert a {dtypes.describe(t.data_type)} tensor into a sequence of "
                f"{dtypes.describe(seq.elem_type)}", input_sequence=seq, tensor=t)
        n = len(seq)
        p = n if position is None or _absent(position) else self.position(position, n, allow_end=True)
        items = list(seq.tensors)
        items.insert(p, t)
        # a sequence grown in a loop: its elements' bytes count as one value (the input's
        # total is kept on the sequences this kernel makes: O(1) per insert)
        before = getattr(seq, "held_bytes", None)
        if before is None or len(seq.tensors) != n:
            before = held_bytes(seq.tensors)
        total = check_bytes(self, before + held_bytes((t,)), f"the output sequence of {len(items):,} elements")
        out = self._make_sequence(items, seq.elem_type, "output")
        out.held_bytes = total
        return out


@register()
class SequenceErase(SequenceKernelBase):
    """A new sequence without the tensor at position (in [-n, n-1]; default: the last)."""

    def __call__(self, input_sequence, position=None):
        seq = self.sequence(input_sequence)
        n = len(seq)
        if position is None or _absent(position):
            if n == 0:
                raise self.error("cannot erase from an empty sequence", input_sequence=seq)
            p = n - 1
        else:
            p = self.position(position, n, allow_end=False)
        items = list(seq.tensors)
        del items[p]
        return self._make_sequence(items, seq.elem_type, "output")


@register()
class SequenceLength(SequenceKernelBase):
    """The number of tensors, as an INT64 scalar."""

    def __call__(self, input_sequence):
        seq = self.sequence(input_sequence)
        return self.result(self.xp.asarray(np.int64(len(seq))), DataType.INT64)


@register()
class ConcatFromSequence(SequenceKernelBase):
    """Concatenate (new_axis=0) or stack (new_axis=1) the sequence's tensors along axis.

    axis is in [-r, r-1] for concatenation and [-r-1, r] for stacking (r: the elements'
    rank).  An empty sequence has no shape to build a result from and raises."""

    def __call__(self, input_sequence, axis=None, new_axis=0):
        seq = self.sequence(input_sequence)
        if axis is None:
            raise self.error("required attribute 'axis' is missing")
        if new_axis not in (0, 1):
            raise self.error(f"new_axis must be 0 or 1, got {new_axis}")
        if len(seq) == 0:
            raise self.error("cannot concatenate an empty sequence (no shape to take)", input_sequence=seq)
        first = seq.tensors[0]
        r = first.ndim
        out_rank = r + 1 if new_axis else r
        if not -out_rank <= axis < out_rank or out_rank == 0:
            raise self.error(f"axis {axis} is out of range for {'stacking' if new_axis else 'concatenating'} "
                             f"rank-{r} tensors", input_sequence=seq)
        a = axis + out_rank if axis < 0 else axis
        for i, t in enumerate(seq.tensors):
            ok = (t.shape == first.shape) if new_axis else (
                t.ndim == r and all(d1 == d2 for k, (d1, d2) in enumerate(zip(t.shape, first.shape)) if k != a))
            if not ok:
                raise self.error(f"element {i} has shape {list(t.shape)}, incompatible with element 0 "
                                 f"{list(first.shape)} for axis {axis} (new_axis={new_axis})",
                                 input_sequence=seq)
        out_shape = list(first.shape)
        if new_axis:
            out_shape.insert(a, len(seq))
        else:
            out_shape[a] = sum(t.shape[a] for t in seq.tensors)
        check_allocation(self, out_shape, first.array.dtype)
        xp = self.xp_for(seq.elem_type)
        arrays = [t.array for t in seq.tensors]
        out = xp.stack(arrays, axis=a) if new_axis else xp.concatenate(arrays, axis=a)
        return self.result(out, seq.elem_type)


@register()
class SplitToSequence(SequenceKernelBase):
    """Split input along axis into a sequence.

    split absent: chunks of 1, the axis removed when keepdims=0.  Scalar split: chunks of
    that size (> 0), the last one smaller when the axis does not divide.  1-D split: those
    sizes, which must sum to the axis length (zero sizes are allowed and give empty
    chunks; negative ones raise).  keepdims only applies when split is absent, as the
    spec says.  An axis of length 0 gives an empty sequence."""

    def __call__(self, input, split=None, axis=0, keepdims=1):
        x = self.element_tensor(input, "input")
        r = x.ndim
        if r == 0:
            raise self.error("input must have at least one dimension", input=x)
        if not -r <= axis < r:
            raise self.error(f"axis {axis} is out of range for a rank-{r} input", input=x)
        a = axis + r if axis < 0 else axis
        dim = x.shape[a]
        xp = self.xp_for(x.data_type)
        arr = x.array
        if split is None or _absent(split):
            if keepdims not in (0, 1):
                raise self.error(f"keepdims must be 0 or 1, got {keepdims}")
            check_bytes(self, arr.nbytes + dim * ELEMENT_OVERHEAD, f"the output sequence of {dim:,} elements")
            moved = xp.moveaxis(arr, a, 0)
            if keepdims:
                parts = [_contiguous(xp.expand_dims(moved[i, ...], a)) for i in range(dim)]
            else:
                parts = [_contiguous(moved[i, ...]) for i in range(dim)]
            return self._make_sequence([self.result(p, x.data_type) for p in parts], x.data_type, "output")
        s = self.tensor(split, "split")
        if s.data_type not in _INDEX_TYPES:
            raise self.type_error(f"'split' must be int32 or int64, got {dtypes.describe(s.data_type)}", split=s)
        values = np.asarray(s.numpy()).astype(np.int64)
        count = -(-dim // int(values)) if s.ndim == 0 and int(values) > 0 else values.size
        # checked before the list of sizes exists (an axis of 10**9 with empty slices
        # would still make 10**9 Tensors)
        check_bytes(self, arr.nbytes + count * ELEMENT_OVERHEAD, f"the output sequence of {count:,} elements")
        if s.ndim == 0:
            size = int(values)
            if size <= 0:
                raise self.error(f"a scalar split must be positive, got {size}", split=s)
            sizes = [size] * (dim // size) + ([dim % size] if dim % size else [])
        elif s.ndim == 1:
            sizes = [int(v) for v in values]
            if any(v < 0 for v in sizes):
                raise self.error(f"split sizes must not be negative, got {sizes}", split=s)
            if sum(sizes) != dim:
                raise self.error(f"split sizes {sizes} sum to {sum(sizes)}, the axis has length {dim}",
                                 input=x, split=s)
        else:
            raise self.error("split must be a scalar or a 1-D tensor", split=s)
        index = [slice(None)] * r
        parts = []
        start = 0
        for size in sizes:
            index[a] = slice(start, start + size)
            parts.append(self.result(_contiguous(arr[tuple(index)]), x.data_type))
            start += size
        return self._make_sequence(parts, x.data_type, "output")


@register()
class SequenceMap(SequenceKernelBase):
    """Run body once per element of input_sequence.  Additional inputs that are sequences
    are mapped element-wise (their lengths must match); tensors are passed whole.  Returns
    one sequence per body output (a tuple when the body has several).

    The iterations run in order, one after another.  With an empty input_sequence the
    output sequences are empty, typed from the body's declared outputs (FLOAT when the
    body does not declare an element type).  ``assemble(per_iteration_outputs)`` builds
    the output sequences from body outputs that were evaluated elsewhere."""

    def __call__(self, input_sequence, *additional_inputs, body=None):
        if body is None:
            raise self.error("required attribute 'body' is missing")
        first = self.sequence(input_sequence)
        extras = []
        for j, v in enumerate(additional_inputs):
            if isinstance(v, (Sequence, list, tuple)):
                extras.append(self.sequence(v, f"additional_inputs[{j}]", "V"))
            elif isinstance(v, Optional):
                raise self.type_error(f"additional_inputs[{j}] must be a tensor or a sequence, "
                                      f"got {describe(v)}")
            else:
                t = self.tensor(v, f"additional_inputs[{j}]") if not (
                    isinstance(v, Tensor) and v.data_type == DataType.STRING) else v
                extras.append(t)
        n = len(first)
        for j, e in enumerate(extras):
            if isinstance(e, Sequence) and len(e) != n:
                raise self.error(f"additional_inputs[{j}] has {len(e)} elements, input_sequence has {n}",
                                 input_sequence=first, **{f"additional_inputs_{j}": e})
        n_in = len(body.input)
        if n_in != 1 + len(extras):
            raise self.error(f"body declares {n_in} inputs, the node gives {1 + len(extras)}")
        n_out = len(body.output)
        if n_out < 1:
            raise self.error("body must have at least one output")
        plan = prepare_body(self, body)
        checker = self.output_checker(body, "body")
        parent = self.outer_scope
        per_iteration = []
        limit = max_tensor_bytes(self.ctx)
        held = 0  # bytes of the body outputs kept for the output sequences
        for i in range(n):
            args = [first.tensors[i]] + [e.tensors[i] if isinstance(e, Sequence) else e for e in extras]
            outs = plan.run(args, parent=parent)
            checker(outs)
            per_iteration.append(outs)
            if limit is not None:
                held += held_bytes(outs)
                if held > limit:
                    raise limit_error(self, held, limit, f"the output sequences of {i + 1:,} iterations")
        return self.assemble(per_iteration, body.output, n_outputs=n_out)

    def assemble(self, per_iteration_outputs, output_types=None, n_outputs=None):
        """Output sequences from per-iteration body outputs (a list, one entry per
        iteration, of lists of tensors).  output_types (onnx ValueInfoProtos/TypeProtos
        or DataTypes) types the sequences when there are no iterations.  Returns a
        Sequence, or a tuple of them for several outputs."""
        rows = [list(r) if isinstance(r, (list, tuple)) else [r] for r in per_iteration_outputs]
        if n_outputs is None:
            n_outputs = len(rows[0]) if rows else (len(output_types) if output_types is not None else 1)
        types = [None] * n_outputs
        if output_types is not None:
            if len(output_types) != n_outputs:
                raise self.error(f"{len(output_types)} output types for {n_outputs} outputs")
            types = [_elem_type_of(t) for t in output_types]
        columns = [[] for _ in range(n_outputs)]
        for i, row in enumerate(rows):
            if len(row) != n_outputs:
                raise self.error(f"iteration {i} produced {len(row)} outputs, expected {n_outputs}")
            for k, v in enumerate(row):
                if not isinstance(v, Tensor) or v.is_absent:
                    raise self.type_error(f"iteration {i}: body output {k} must be a tensor, got {describe(v)}")
                columns[k].append(v)
        out = []
        for k, col in enumerate(columns):
            et = types[k] if types[k] else (col[0].data_type if col else DataType.FLOAT)
            out.append(self._make_sequence(col, et, f"out_sequence[{k}]"))
        return out[0] if n_outputs == 1 else tuple(out)


# ------------------------------------------------------------ module helpers


def _contiguous(a):
    """a, copied when it is not C-contiguous (keeps 0-d arrays 0-d)."""
    return a if a.flags.c_contiguous else a.copy()


def _absent(v) -> bool:
    return v is None or (isinstance(v, Tensor) and v.is_absent)


@functools.lru_cache(maxsize=None)
def _schema_type_sets(op_type: str, version: int, type_param: str):
    """{'tensor'|'seq'|'opt_tensor'|'opt_seq': frozenset of DataTypes} for a type
    parameter of a schema, or None when the schema is unknown."""
    try:
        schema = onnx.defs.get_schema(op_type, version, "")
    except onnx.defs.SchemaError:
        return None
    strs = None
    for c in schema.type_constraints:
        if c.type_param_str == type_param:
            strs = list(c.allowed_type_strs)
    if strs is None:
        return None
    sets = {"tensor": set(), "seq": set(), "opt_tensor": set(), "opt_seq": set()}
    for s in strs:
        kind = "tensor"
        if s.startswith("optional(seq("):
            kind, inner = "opt_seq", s[len("optional(seq("):-2]
        elif s.startswith("optional("):
            kind, inner = "opt_tensor", s[len("optional("):-1]
        elif s.startswith("seq("):
            kind, inner = "seq", s[len("seq("):-1]
        else:
            inner = s
        try:
            sets[kind].add(dtypes.info(inner).data_type)
        except TypeError:
            continue
    return {k: frozenset(v) for k, v in sets.items()}


def allowed_types(op_type: str, version: int, type_param: str, kind: str):
    """The element types a schema's type parameter allows for a value kind ('tensor',
    'seq', 'opt_tensor', 'opt_seq'); None when unknown (no check)."""
    sets = _schema_type_sets(op_type, int(version), type_param)
    if sets is None:
        return None
    return sets[kind]


def value_kind(value) -> str:
    """'tensor', 'seq', 'opt_tensor', 'opt_seq', 'opt' (empty, type unknown) or 'absent'."""
    if isinstance(value, Tensor):
        return "absent" if value.is_absent else "tensor"
    if isinstance(value, Sequence):
        return "seq"
    if isinstance(value, Optional):
        if value.value is None:
            tp = value.type_proto
            if tp is not None:
                k = declared_kind(tp)[0]
                if k in ("opt_tensor", "opt_seq"):
                    return k
                if k == "tensor":
                    return "opt_tensor"
                if k == "seq":
                    return "opt_seq"
            return "opt"
        return "opt_seq" if isinstance(value.value, Sequence) else "opt_tensor"
    if value is None:
        return "absent"
    return type(value).__name__


def value_elem_type(value):
    if isinstance(value, Tensor):
        return value.data_type
    if isinstance(value, Sequence):
        return value.elem_type
    if isinstance(value, Optional) and value.value is not None:
        return value_elem_type(value.value)
    return None


def declared_kind(type_proto) -> tuple:
    """(kind, elem_type or 0, dims or None) of an onnx TypeProto; kind '' when unset.
    dims lists ints (None for unknown dimensions)."""
    if isinstance(type_proto, onnx.ValueInfoProto):
        type_proto = type_proto.type
    which = type_proto.WhichOneof("value")
    if which == "tensor_type":
        tt = type_proto.tensor_type
        dims = None
        if tt.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
        return "tensor", int(tt.elem_type), dims
    if which == "sequence_type":
        inner = declared_kind(type_proto.sequence_type.elem_type)
        return "seq", inner[1], inner[2]
    if which == "optional_type":
        inner = declared_kind(type_proto.optional_type.elem_type)
        kind = {"tensor": "opt_tensor", "seq": "opt_seq"}.get(inner[0], "opt")
        return kind, inner[1], inner[2]
    return "", 0, None


def declared_kinds(value_infos) -> list:
    return [declared_kind(v) for v in value_infos]


_COMPATIBLE = {
    "tensor": {"tensor"},
    "seq": {"seq"},
    "opt_tensor": {"opt_tensor", "opt", "tensor", "absent"},
    "opt_seq": {"opt_seq", "opt", "seq", "absent"},
    "opt": {"opt_tensor", "opt_seq", "opt", "tensor", "seq", "absent"},
}


def check_body_outputs(kernel: KernelBase, what: str, outputs, declared) -> None:
    """Raise when a subgraph produced a different number of outputs than it declares, or
    an output whose kind (tensor/sequence/optional) or element type contradicts its
    declared type.  Undeclared types are not checked."""
    if len(outputs) != len(declared):
        raise kernel.error(f"{what} produced {len(outputs)} outputs, it declares {len(declared)}")
    for k, (v, d) in enumerate(zip(outputs, declared)):
        check_one_output(kernel, what, k, v, d)


class OutputChecker:
    """check_body_outputs prepared once per subgraph: outputs declared as tensors of a
    known element type are checked with two attribute reads per iteration; the rest
    (and any mismatch) go through the full check.  With schema=(kernel, type_param,
    first_index), declared types from first_index on are checked against the kernel's
    schema once, here, and values whose type is not declared on every call."""

    __slots__ = ("kernel", "what", "declared", "fast", "schema_param", "schema_from", "n")

    def __init__(self, kernel: KernelBase, what: str, value_infos, schema=None):
        self.kernel = kernel
        self.what = what
        self.declared = declared_kinds(value_infos)
        self.n = len(self.declared)
        self.fast = [DataType(et) if kind == "tensor" and et else None for kind, et, _ in self.declared]
        self.schema_param, self.schema_from = (schema[0], schema[1]) if schema else (None, 0)
        if schema:
            for k in range(self.schema_from, self.n):
                kind, et = self.declared[k][:2]
                if kind and et:
                    allowed = allowed_types(kernel.op_type, kernel.since_version, self.schema_param, kind)
                    if allowed is not None and et not in allowed:
                        raise kernel.type_error(
                            f"{what} output {k} is declared {_kind_text(kind, et)}, which opset-"
                            f"{kernel.since_version} {kernel.op_type} does not allow")
                else:
                    self.fast[k] = None

    def __call__(self, outputs) -> None:
        if len(outputs) != self.n:
            check_body_outputs(self.kernel, self.what, outputs, self.declared)
        for k, (v, et) in enumerate(zip(outputs, self.fast)):
            if et is None or v.__class__ is not Tensor or v.data_type != et or v.array is None:
                self.slow(k, v)

    def slow(self, k, v) -> None:
        check_one_output(self.kernel, self.what, k, v, self.declared[k])
        if self.schema_param is not None and k >= self.schema_from:
            check_schema_value(self.kernel, v, f"{self.what} output {k}", self.schema_param)


def check_one_output(kernel: KernelBase, what: str, k: int, v, declared) -> None:
    kind, et, _ = declared
    if not kind:
        return
    got = value_kind(v)
    if got not in _COMPATIBLE[kind]:
        raise kernel.type_error(f"{what} output {k} is {describe(v)}, it declares {_kind_text(kind, et)}")
    if et:
        vet = value_elem_type(v)
        if vet is not None and int(vet) != et:
            raise kernel.type_error(f"{what} output {k} has element type {dtypes.describe(vet)}, "
                                    f"it declares {_kind_text(kind, et)}")


def check_schema_value(kernel: KernelBase, value, where: str, type_param: str = "V") -> None:
    """Raise unless the kernel's schema at its version allows the value's kind and
    element type for type_param."""
    kind = value_kind(value)
    if kind == "opt":
        if not allowed_types(kernel.op_type, kernel.since_version, type_param, "opt_tensor"):
            raise kernel.type_error(f"{where} is an optional, which opset-{kernel.since_version} "
                                    f"{kernel.op_type} does not allow")
        return
    if kind == "absent":
        raise kernel.error(f"{where} is missing")
    if kind not in ("tensor", "seq", "opt_tensor", "opt_seq"):
        raise kernel.type_error(f"{where} is a {kind}, not an ONNX value")
    allowed = allowed_types(kernel.op_type, kernel.since_version, type_param, kind)
    if allowed is None:
        return
    et = value_elem_type(value)
    if not allowed or (et is not None and et not in allowed):
        raise kernel.type_error(f"{where} is {describe(value)}, which opset-{kernel.since_version} "
                                f"{kernel.op_type} does not allow")


def _kind_text(kind: str, et: int) -> str:
    name = dtypes.describe(et) if et else "?"
    return {"tensor": f"tensor({name})", "seq": f"seq(tensor({name}))",
            "opt_tensor": f"optional(tensor({name}))", "opt_seq": f"optional(seq(tensor({name})))",
            "opt": "optional"}.get(kind, kind)


def _elem_type_of(t):
    if t is None:
        return None
    if isinstance(t, (onnx.ValueInfoProto, onnx.TypeProto)):
        et = declared_kind(t)[1]
        return DataType(et) if et else None
    return dtypes.info(t).data_type


def prepare_body(kernel: KernelBase, graph):
    """The runtime's prepared plan for a subgraph (resolved once per graph object and
    context), through the installed SubgraphRunner."""
    if not isinstance(graph, onnx.GraphProto):
        raise kernel.type_error(f"a subgraph attribute must be an onnx GraphProto, got {type(graph).__name__}")
    return runner().prepare(graph, kernel.ctx)
