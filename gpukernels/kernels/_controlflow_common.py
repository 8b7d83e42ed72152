"""What If, Loop and Scan share: the control-flow kernel base, body runners (general and
compiled through the runtime's SubgraphRunner, see kernels.subgraphs), scan-output columns
and body-signature helpers."""

from __future__ import annotations

import numpy as np
import onnx

from .. import dtypes
from ..dtypes import DataType
from ..limits import ELEMENT_OVERHEAD, held_bytes, limit_error, max_tensor_bytes
from ..tensor import Optional, Sequence, Tensor
from ..xp import is_cupy_array
from .base import describe
from .sequence import SequenceKernelBase, check_schema_value, declared_kind, prepare_body
from .subgraphs import runner, signature

_UNSET = object()


class _ControlFlowBase(SequenceKernelBase):
    """Shared checks for kernels that run subgraphs."""

    def flag(self, value, name: str) -> bool:
        """A boolean condition: a BOOL tensor with exactly one element, read on the host."""
        if not isinstance(value, Tensor):
            if isinstance(value, (Sequence, Optional)):
                raise self.type_error(f"'{name}' must be a bool tensor, got {describe(value)}")
            value = Tensor(value)
        if value.is_absent:
            raise self.error(f"'{name}' is missing")
        if value.data_type != DataType.BOOL:
            raise self.type_error(f"'{name}' must be a bool tensor, got {describe(value)}", **{name: value})
        if value.size != 1:
            raise self.error(f"'{name}' must hold exactly one element (a scalar)", **{name: value})
        a = value.array
        return bool(a.reshape(-1)[0].get() if is_cupy_array(a) else a.reshape(-1)[0])

    def graph_attr(self, graph, name: str) -> onnx.GraphProto:
        if graph is None:
            raise self.error(f"required attribute '{name}' is missing")
        if not isinstance(graph, onnx.GraphProto):
            raise self.type_error(f"attribute '{name}' must be an onnx GraphProto, got {type(graph).__name__}")
        return graph

    def check_value_type(self, value, where: str, type_param: str = "V") -> None:
        """Raise unless the schema at this version allows the value's kind and element type."""
        check_schema_value(self, value, where, type_param)

    def value_here(self, value, where: str):
        """A loop-carried / scanned value on this kernel's device."""
        if isinstance(value, Tensor):
            if value.is_absent:
                raise self.error(f"{where} is missing")
            if value.data_type == DataType.STRING or is_cupy_array(value.array) == self.on_gpu:
                return value
            return value.to(self.device)
        if isinstance(value, Sequence):
            return self.on_device(value)
        if isinstance(value, (list, tuple)):
            return self.sequence(value, where, "V")
        if isinstance(value, Optional):
            if value.value is None:
                return value
            inner = self.value_here(value.value, where)
            return value if inner is value.value else Optional(inner, value.type_proto)
        if value is None:
            raise self.error(f"{where} is missing")
        return self.tensor(value, where)

    def scan_rows(self, per_iteration_scan_values, scan_output_types):
        """(rows, declared types or None, k) of an assembling call's per-iteration scan
        values, checked to hold k values in every iteration and k declared types."""
        rows = [list(r) for r in per_iteration_scan_values]
        types = [_declared_from(t) for t in scan_output_types] if scan_output_types is not None else None
        k = len(rows[0]) if rows else (len(types) if types is not None else 0)
        for i, r in enumerate(rows):
            if len(r) != k:
                raise self.error(f"iteration {i} has {len(r)} scan values, iteration 0 has {k}")
        if types is not None and len(types) != k:
            raise self.error(f"{len(types)} scan output types for {k} scan values")
        return rows, types, k

    def stack(self, values, axis: int, where: str) -> Tensor:
        """Stack per-iteration tensors along a new axis, checking they agree."""
        first = values[0]
        for i, v in enumerate(values):
            if not isinstance(v, Tensor) or v.is_absent:
                raise self.type_error(f"{where}: iteration {i} produced {describe(v)}; scan outputs "
                                      "must be tensors")
            if v.data_type != first.data_type or v.shape != first.shape:
                raise self.error(f"{where}: iteration {i} produced {describe(v)}, iteration 0 "
                                 f"{describe(first)}; scan output elements must agree in type and shape")
        return self.stack_arrays([v.array for v in values], first.data_type, axis, where)

    def stack_arrays(self, arrays, data_type, axis: int, where: str) -> Tensor:
        """Stack arrays already known to share element type and shape."""
        first = arrays[0]
        r = first.ndim + 1
        if not -r <= axis < r:
            raise self.error(f"{where}: axis {axis} is out of range for rank-{r} output")
        xp = self.xp_for(data_type)
        if axis % r == 0 and first.ndim:
            # one concatenation, no per-array expand_dims: much faster for many small arrays
            y = xp.concatenate(arrays, axis=0).reshape((len(arrays),) + tuple(first.shape))
        else:
            y = xp.stack(arrays, axis=axis % r)
        return self.result(y, data_type)

    def empty_scan_output(self, declared, axis: int, where: str, leading: tuple = ()) -> Tensor:
        """A scan output with zero iterations: element type and trailing shape from the
        body's declared output type (unknown dimensions become 0, an unknown element
        type FLOAT, an unknown rank rank 0)."""
        kind, et, dims = declared
        if kind not in ("tensor", ""):
            raise self.type_error(f"{where}: the body declares {kind} but scan outputs must be tensors")
        data_type = DataType(et) if et else DataType.FLOAT
        elem = [d if d is not None else 0 for d in (dims or [])]
        r = len(elem) + 1
        if not -r <= axis < r:
            raise self.error(f"{where}: axis {axis} is out of range for rank-{r} output")
        shape = list(elem)
        shape.insert(axis % r, 0)
        shape = list(leading) + shape
        info = dtypes.info(data_type)
        if data_type == DataType.STRING:
            return Tensor.wrap(np.empty(shape, dtype=object), data_type)
        dt = info.storage if self.on_gpu else info.numpy
        return self.result(self.xp.empty(shape, dtype=dt), data_type)


class _Held:
    """The bytes of the scan values a Loop or Scan holds until it stacks them, checked
    against the context's max_tensor_bytes as iterations accumulate them (each value's
    bytes plus ELEMENT_OVERHEAD), and up front where the number of iterations is known.
    The compiled fast paths keep the running count in a local and write it back."""

    __slots__ = ("kernel", "limit", "cap", "bytes", "iterations")

    def __init__(self, kernel):
        self.kernel = kernel
        self.limit = max_tensor_bytes(kernel.ctx)
        self.cap = self.limit if self.limit is not None else float("inf")
        self.bytes = 0
        self.iterations = 0

    def add(self, values) -> None:
        """One general iteration's scan values."""
        if values:
            self.bytes += held_bytes(values)
            self.iterations += 1
            if self.bytes > self.cap:
                raise self.over()

    def over(self, nbytes=None, iterations=None, why: str = "") -> Exception:
        nbytes = self.bytes if nbytes is None else nbytes
        iterations = self.iterations if iterations is None else iterations
        return limit_error(self.kernel, int(nbytes), self.limit,
                           f"the scan outputs of {iterations:,} iterations{why}")

    def expect(self, per_iteration: int, iterations: int, why: str) -> None:
        """Raise now when iterations more iterations of per_iteration bytes each would
        pass the limit."""
        total = self.bytes + per_iteration * iterations
        if total > self.cap:
            raise self.over(total, self.iterations + iterations, why)

    @staticmethod
    def step_bytes(arrays) -> int:
        """Per-iteration bytes of one compiled iteration's scan arrays."""
        return sum(a.nbytes for a in arrays) + ELEMENT_OVERHEAD * len(arrays)


def _pack(outputs):
    outputs = list(outputs)
    return outputs[0] if len(outputs) == 1 else tuple(outputs)


class _Column:
    """One scan output's per-iteration values, in order: runs of arrays of one element
    type (from compiled iterations, their shape proven equal) and runs of general values
    (checked when stacked).  Stacked once at the end."""

    __slots__ = ("parts",)

    def __init__(self, values=None):
        self.parts = [[None, list(values)]] if values else []  # [data_type or None, items]

    def add(self, value) -> None:
        """A general iteration's value."""
        if not self.parts or self.parts[-1][0] is not None:
            self.parts.append([None, []])
        self.parts[-1][1].append(value)

    def fast(self, data_type):
        """The append function for a run of arrays of data_type."""
        self.parts.append([data_type, []])
        return self.parts[-1][1].append

    def __bool__(self) -> bool:
        return any(items for _, items in self.parts)

    def values(self) -> list:
        """Every iteration's value, arrays wrapped as Tensors."""
        out = []
        for dt, items in self.parts:
            out.extend(items if dt is None else [Tensor.wrap(a, dt) for a in items])
        return out

    def stack(self, kernel, axis: int, where: str, reverse: bool = False) -> Tensor:
        arrays = self._arrays()
        if arrays is not None:
            dt, items = arrays
            return kernel.stack_arrays(items[::-1] if reverse else items, dt, axis, where)
        values = self.values()  # something differs: the general check names the iteration
        return kernel.stack(values[::-1] if reverse else values, axis, where)

    def _arrays(self):
        """(data_type, arrays) when every value is a present tensor of one element type
        and shape (array runs are checked by their first item), else None."""
        dt = shape = None
        out = []
        for part_dt, items in self.parts:
            if not items:
                continue
            if part_dt is None:
                for v in items:
                    if v.__class__ is not Tensor or v.array is None:
                        return None
                    if dt is None:
                        dt, shape = v.data_type, v.array.shape
                    elif v.data_type != dt or v.array.shape != shape:
                        return None
                    out.append(v.array)
            else:
                if dt is None:
                    dt, shape = part_dt, items[0].shape
                elif part_dt != dt or items[0].shape != shape:
                    return None
                out.extend(items)
        return (dt, out) if out else None


class _Body:
    """A Loop/Scan body run in the kernel's outer scope, its outputs checked.

    A general iteration whose input signature (element types, shapes) is new is
    recorded and the body compiled for that signature (SubgraphRunner.record and
    .compile: the runtime's BodyProgram), so later iterations with it run on arrays
    without per-node Tensor checks.  A program that an iteration leaves (a shape
    inside the body changed) is dropped, so the next iteration recompiles.  Bodies
    whose inputs or outputs are not all tensors always run the general way."""

    MAX_COMPILES = 8  # per call: a state growing each iteration would otherwise compile
    #                   every iteration

    def __init__(self, kernel, graph, schema):
        self.plan = prepare_body(kernel, graph)
        self.runner = runner()
        self.parent = kernel.outer_scope
        self.checker = kernel.output_checker(graph, "body", schema=schema)
        self.declared = self.checker.declared
        self.programs = {}
        self.compiles = 0
        self.compile = bool(kernel.ctx.settings.compile_bodies)

    @staticmethod
    def key(values):
        sigs = tuple(signature(v) for v in values)
        return None if None in sigs else sigs

    def program_for(self, values):
        if not self.programs:
            return None
        key = self.key(values)
        return self.programs.get(key) if key is not None else None

    def run(self, values, record: bool = False) -> list:
        """A general iteration; with record, compile the body for these inputs'
        signature when not done yet."""
        key = self.key(values) if record and self.compile and self.compiles < self.MAX_COMPILES \
            else None
        if key is None or key in self.programs:
            outs = self.plan.run(values, parent=self.parent)
            self.checker(outs)
            return outs
        outs, records = self.runner.record(self.plan, values, self.parent)
        self.checker(outs)
        self.compiles += 1
        self.programs[key] = self.runner.compile(self.plan, self.parent, values, outs, records)
        return outs

    def left(self, prog, outs) -> None:
        """An iteration left prog: check its outputs the general way and drop prog
        (while compiles remain) so the next iteration compiles for the new shapes."""
        self.checker(outs)
        if self.compiles < self.MAX_COMPILES:
            self.programs = {k: p for k, p in self.programs.items() if p is not prog}


def _truth(a) -> bool:
    """The value of a one-element BOOL array (proven so by the recorded iteration)."""
    if is_cupy_array(a):
        return bool(a.reshape(-1)[0].get())
    return bool(a) if a.ndim == 0 else bool(a.reshape(-1)[0])


# ============================================================================ If


def _declared_from(t):
    """A (kind, elem_type, dims) triple from a TypeProto, ValueInfoProto or a
    (DataType, trailing shape) pair."""
    if isinstance(t, (onnx.TypeProto, onnx.ValueInfoProto)):
        return declared_kind(t)
    if isinstance(t, tuple) and len(t) == 2:
        return "tensor", int(dtypes.info(t[0]).data_type), [int(d) for d in t[1]]
    return "tensor", int(dtypes.info(t).data_type), None


def _loop_inputs(body):
    """(which state inputs are declared optional or None, their TypeProtos, indices of
    unused formal inputs) for a Loop body."""
    wrap = [declared_kind(v)[0] in ("opt_tensor", "opt_seq", "opt") for v in body.input[2:]]
    return (wrap if any(wrap) else None), [v.type for v in body.input[2:]], _unused_inputs(body)


_USED_CACHE: dict = {}


def _unused_inputs(graph: onnx.GraphProto) -> set:
    """Indices of a body's formal inputs that nothing in it reads (so a shared dummy can
    be passed instead of a fresh value each iteration)."""
    entry = _USED_CACHE.get(id(graph))
    if entry is not None and entry[0] is graph:
        return entry[1]
    used = _names_read(graph)
    unused = {i for i, v in enumerate(graph.input) if v.name not in used}
    if len(_USED_CACHE) > 256:
        _USED_CACHE.clear()
    _USED_CACHE[id(graph)] = (graph, unused)
    return unused


def _names_read(graph: onnx.GraphProto) -> set:
    used = {o.name for o in graph.output}
    for node in graph.node:
        used.update(n for n in node.input if n)
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                used |= _names_read(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    used |= _names_read(g)
    return used
