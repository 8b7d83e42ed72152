"""Control flow: If, Loop and Scan.

Subgraph attributes (branches, bodies) arrive as onnx GraphProtos.  A body is prepared
once through the runtime (``prepare_subgraph``: kernels resolved, attributes bound) and
run with its formal inputs bound positionally; outer-scope names resolve through
``self.outer_scope``, which the runtime sets before each call.

Every kernel also has a form that needs no graph:

* ``If(ctx)(cond, then_value, else_value)`` picks one of two values;
* ``Loop(ctx).run_callback(M, cond, initial_values, body=f)`` runs a Python callback
  ``f(iteration, cond_in, state) -> [cond_out, *state, *scan_values]``;
* ``Loop(ctx).assemble(...)`` / ``Scan(ctx).assemble(...)`` build the operator's outputs
  from per-iteration values evaluated elsewhere.

Loop and Scan bodies are compiled for their input signature after one general
iteration (see ``runtime.body.BodyProgram``): later iterations run on arrays with
pre-bound kernels; the context option ``compile_bodies=False`` turns this off.

Return values: the single output itself when the operator has exactly one output, a
tuple otherwise.  Loop-carried values stay where the body leaves them (on the GPU in a
cuda context); scan outputs are collected per iteration and stacked once at the end.
Values are never modified in place.
"""

from __future__ import annotations

import numpy as np
import onnx

from .. import dtypes
from ..dtypes import DataType
from ..tensor import Optional, Sequence, Tensor
from ..xp import is_cupy_array
from .base import describe, register
from .sequence import SequenceKernelBase, check_schema_value, declared_kind, prepare_body

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
    recorded and the body compiled for that signature (runtime BodyProgram), so later
    iterations with it run on arrays without per-node Tensor checks.  A program that an
    iteration leaves (a shape inside the body changed) is dropped, so the next
    iteration recompiles.  Bodies whose inputs or outputs are not all tensors always
    run the general way."""

    MAX_COMPILES = 8  # per call: a state growing each iteration would otherwise compile
    #                   every iteration

    def __init__(self, kernel, graph, schema):
        self.plan = prepare_body(kernel, graph)
        self.parent = kernel.outer_scope
        self.checker = kernel.output_checker(graph, "body", schema=schema)
        self.declared = self.checker.declared
        self.programs = {}
        self.compiles = 0
        self.compile = bool(kernel.ctx.option("compile_bodies", True))

    @staticmethod
    def key(values):
        from ..runtime.body import signature

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
        from ..runtime.body import BodyProgram, record_run

        outs, records = record_run(self.plan, values, self.parent)
        self.checker(outs)
        self.compiles += 1
        self.programs[key] = BodyProgram.compile(self.plan, self.parent, values, outs, records)
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


@register()
class If(_ControlFlowBase):
    """Run then_branch when cond is true, else_branch otherwise, and return the chosen
    branch's outputs.  cond is a BOOL tensor with exactly one element.

    Both branches must declare the same number of outputs; the outputs may differ in
    shape (and be tensors, sequences or optionals as the opset allows).  The branch that
    runs must produce the kinds and element types it declares.

    ``If(ctx)(cond, then_value, else_value)`` is the value-selecting form."""

    def __call__(self, cond, then_value=_UNSET, else_value=_UNSET, then_branch=None, else_branch=None):
        c = self.flag(cond, "cond")
        graphs = then_branch is not None or else_branch is not None
        values = then_value is not _UNSET or else_value is not _UNSET
        if graphs and values:
            raise self.error("give either branch values or then_branch/else_branch graphs, not both")
        if values:
            if then_value is _UNSET or else_value is _UNSET:
                raise self.error("the value-selecting form needs both then_value and else_value")
            if isinstance(then_value, (list, tuple)) and isinstance(else_value, (list, tuple)) \
                    and len(then_value) != len(else_value):
                raise self.error(f"then_value has {len(then_value)} values, else_value {len(else_value)}")
            return then_value if c else else_value
        then_g = self.graph_attr(then_branch, "then_branch")
        else_g = self.graph_attr(else_branch, "else_branch")
        if len(then_g.output) != len(else_g.output):
            raise self.error(f"then_branch has {len(then_g.output)} outputs, else_branch "
                             f"{len(else_g.output)}; they must match")
        graph = then_g if c else else_g
        if len(graph.input):
            raise self.error(f"{'then' if c else 'else'}_branch must take no inputs, it declares "
                             f"{len(graph.input)}")
        name = "then_branch" if c else "else_branch"
        plan = prepare_body(self, graph)
        checker = self.output_checker(graph, name, schema=("V", 0))
        outs = plan.run([], parent=self.outer_scope)
        checker(outs)
        return _pack(outs)


# ========================================================================== Loop


@register()
class Loop(_ControlFlowBase):
    """Run body while the trip count M is not reached and the condition holds.

    Inputs: M (INT64, one element; absent = no limit; negative = no iteration), cond
    (BOOL, one element; absent = true), then the N loop-carried initial values.  The body
    takes (iteration_num, cond_in, *state) and returns (cond_out, *state, *scan_values).
    Outputs: the N final values, then K scan outputs stacked along a new axis 0.

    Termination: the loop runs while ``(M absent or i < M) and cond``; cond false on
    entry runs nothing (whatever M is), and the body's cond_out ends the loop early.
    The spec says cond_out is ignored when the cond input is omitted; like onnxruntime
    and onnx.reference we always honour it, so a body can end a loop that has neither
    M nor cond (which would otherwise never end).

    With zero iterations the final values are the initial ones and each scan output is
    empty with the element type and trailing shape the body declares (unknown
    dimensions 0).  When a body input is declared optional, a plain tensor or sequence
    carried into it is wrapped as a present optional."""

    def __call__(self, M=None, cond=None, *v_initial, body=None):
        body = self.graph_attr(body, "body")
        n = len(v_initial)
        n_in, n_out = len(body.input), len(body.output)
        if n_in != 2 + n:
            raise self.error(f"body declares {n_in} inputs; with {n} loop-carried values it must "
                             f"declare {2 + n} (iteration_num, cond, state...)")
        if n_out < 1 + n:
            raise self.error(f"body declares {n_out} outputs; with {n} loop-carried values it needs "
                             f"at least {1 + n} (cond, state..., scan outputs...)")
        runner = _Body(self, body, ("V", 1))
        wrap, in_types, unused = self.per_graph(body, "inputs", lambda: _loop_inputs(body))
        return self._run(M, cond, v_initial, None, n, scan_types=runner.declared[1 + n:],
                         wrap=wrap, in_types=in_types, pass_iteration=0 not in unused,
                         check_states=False, body=runner)

    # ------------------------------------------------------------ other forms
    def run_callback(self, M=None, cond=None, initial_values=(), body=None, scan_output_types=None):
        """Run a Python callback as the body: ``body(iteration, cond_in, state)`` gets the
        iteration number (INT64 scalar Tensor), the incoming condition (BOOL scalar
        Tensor) and the list of loop-carried values, and returns
        ``[cond_out, *state, *scan_values]``.  scan_output_types (TypeProtos,
        ValueInfoProtos or (DataType, trailing shape) pairs) types the scan outputs when
        the loop runs zero times; without it a zero-iteration loop returns only the
        final values."""
        if not callable(body):
            raise self.type_error("run_callback needs a callable body")
        n = len(initial_values)
        types = [_declared_from(t) for t in scan_output_types] if scan_output_types is not None else None

        def step(it, c, state):
            outs = body(it, c, list(state))
            if not isinstance(outs, (list, tuple)):
                raise self.type_error(f"the body callback must return a list, got {type(outs).__name__}")
            outs = list(outs)
            if len(outs) < 1 + n:
                raise self.error(f"the body callback returned {len(outs)} values; it must return at least "
                                 f"{1 + n} (cond, state...)")
            if types is not None and len(outs) != 1 + n + len(types):
                raise self.error(f"the body callback returned {len(outs)} values, expected "
                                 f"{1 + n + len(types)} (cond, {n} state, {len(types)} scan values)")
            return [self.value_here(v, f"body output {k}") for k, v in enumerate(outs)]

        return self._run(M, cond, initial_values, step, n, scan_types=types)

    def assemble(self, M=None, cond=None, initial_values=(), final_values=None,
                 per_iteration_scan_values=(), scan_output_types=None):
        """The Loop outputs from values evaluated elsewhere: the final loop-carried values
        (the initial ones when there were no iterations) followed by the scan outputs
        stacked from per_iteration_scan_values (one list per iteration).  M and cond are
        checked against the number of iterations.  scan_output_types types the scan
        outputs of a zero-iteration loop."""
        trip = self._trip_count(M)
        rows = [list(r) for r in per_iteration_scan_values]
        iters = len(rows)
        if trip is not None and iters > max(trip, 0):
            raise self.error(f"{iters} iterations given but the trip count M is {trip}")
        if cond is not None and not (isinstance(cond, Tensor) and cond.is_absent):
            if not self.flag(cond, "cond") and iters:
                raise self.error(f"{iters} iterations given but cond is false on entry")
        initial = [self.value_here(v, f"v_initial[{i}]") for i, v in enumerate(initial_values)]
        if iters == 0:
            final = initial
        else:
            if final_values is None or len(final_values) != len(initial):
                raise self.error(f"final_values must hold {len(initial)} values after {iters} iterations")
            final = [self.value_here(v, f"final value {i}") for i, v in enumerate(final_values)]
        types = [_declared_from(t) for t in scan_output_types] if scan_output_types is not None else None
        k = len(rows[0]) if rows else (len(types) if types is not None else 0)
        for i, r in enumerate(rows):
            if len(r) != k:
                raise self.error(f"iteration {i} has {len(r)} scan values, iteration 0 has {k}")
        if types is not None and len(types) != k:
            raise self.error(f"{len(types)} scan output types for {k} scan values")
        for i, v in enumerate(final):
            self.check_value_type(v, f"loop-carried value {i}")
        scans = []
        for j in range(k):
            if iters:
                scans.append(self.stack([self.value_here(r[j], f"scan value {j}") for r in rows], 0,
                                        f"scan output {j}"))
            else:
                scans.append(self.empty_scan_output(types[j], 0, f"scan output {j}"))
        return _pack(final + scans)

    # ------------------------------------------------------------ the loop
    def _trip_count(self, M):
        if M is None or (isinstance(M, Tensor) and M.is_absent):
            return None
        t = self.tensor(M, "M")
        if t.data_type not in (DataType.INT64, DataType.INT32):
            raise self.type_error(f"'M' must be an int64 tensor, got {describe(t)}", M=t)
        if t.size != 1:
            raise self.error("'M' must hold exactly one element (a scalar)", M=t)
        return int(np.asarray(t.numpy()).reshape(-1)[0])

    def _run(self, M, cond, initial_values, step, n, scan_types=None, wrap=None, in_types=None,
             pass_iteration=True, check_states=True, body=None):
        """The loop: step(it, cond, state) -> outputs runs one iteration, or, for a graph
        body, body (a _Body) does, compiled once the signature is known."""
        trip = self._trip_count(M)
        cond_given = cond is not None and not (isinstance(cond, Tensor) and cond.is_absent)
        keep_going = self.flag(cond, "cond") if cond_given else True
        xp = self.xp
        if cond_given:
            cond_t = self.tensor(cond, "cond")
        else:
            cond_t = self.result(xp.asarray(np.bool_(True)), DataType.BOOL)
        state = []
        for i, v in enumerate(initial_values):
            v = self.value_here(v, f"v_initial[{i}]")
            self.check_value_type(v, f"v_initial[{i}]")
            state.append(v)
        dummy_iter = None if pass_iteration else self.result(xp.asarray(np.int64(0)), DataType.INT64)
        scans = None
        i = 0
        compiled = body is not None and wrap is None
        while keep_going and (trip is None or i < trip):
            it = self.result(xp.asarray(np.int64(i)), DataType.INT64) if pass_iteration else dummy_iter
            fed = state if wrap is None else [self._wrap_optional(v, tp) if w else v
                                              for v, w, tp in zip(state, wrap, in_types)]
            if body is None:
                outs = step(it, cond_t, fed)
            else:
                args = [it, cond_t, *fed]
                prog = body.program_for(args) if compiled else None
                if prog is None:
                    outs = body.run(args, record=compiled and (trip is None or trip - i >= 2))
                else:
                    if scans is None:
                        scans = [_Column() for _ in range(len(prog.out_sig) - 1 - n)]
                    i, keep_going, cond_t, state, outs = self._fast(prog, i, trip, it, cond_t, state,
                                                                   scans, n, pass_iteration)
                    if outs is None:
                        continue
                    body.left(prog, outs)  # iteration i left the compiled path
            c_out = outs[0]
            if c_out is not cond_t:
                keep_going = self.flag(c_out, "body output cond")
                cond_t = c_out
            state = outs[1:1 + n]
            if check_states:
                for j, v in enumerate(state):
                    self.check_value_type(v, f"body output {1 + j} (loop-carried value {j})")
            if scans is None:
                scans = [_Column() for _ in range(len(outs) - 1 - n)]
            elif len(outs) - 1 - n != len(scans):
                raise self.error(f"iteration {i} produced {len(outs) - 1 - n} scan values, earlier "
                                 f"iterations {len(scans)}")
            for col, v in zip(scans, outs[1 + n:]):
                col.add(v)
            i += 1
        results = list(state)
        if scans is not None:
            for j, col in enumerate(scans):
                results.append(col.stack(self, 0, f"scan output {j}"))
        elif scan_types:
            for j, declared in enumerate(scan_types):
                results.append(self.empty_scan_output(declared, 0, f"scan output {j}"))
        return _pack(results)

    def _fast(self, prog, i, trip, it, cond_t, state, scans, n, pass_iteration):
        """Iterations i, i+1, ... on arrays through the compiled body while the loop
        goes on and its signature holds (the cond and states keep theirs).  Returns
        (i, keep_going, cond_t, state, outs): outs are the unchecked outputs of
        iteration i when it left the compiled path, else None."""
        xp = self.xp
        out_sig = prog.out_sig
        stable = prog.in_sig[1:] == out_sig[:1 + n]
        appends = [col.fast(sig[0]) for col, sig in zip(scans, out_sig[1 + n:])]
        c_arr, c_in = cond_t.array, cond_t.array
        st = [t.array for t in state]
        it_arr = it.array
        keep_going = True
        run = prog.run
        token = prog.guard.enter_strict()
        try:
            while True:
                ok, outs = run([it_arr, c_arr, *st])
                if not ok:
                    cond = cond_t if c_arr is c_in else Tensor.wrap(c_arr, DataType.BOOL)
                    return i, True, cond, state, outs
                i += 1
                c = outs[0]
                if c is not c_arr:
                    keep_going = _truth(c)
                    c_arr = c
                st = outs[1:1 + n]
                for append, a in zip(appends, outs[1 + n:]):
                    append(a)
                if not (keep_going and stable and (trip is None or i < trip)):
                    break
                if pass_iteration:
                    it_arr = xp.asarray(np.int64(i))
        finally:
            prog.guard.leave(token)
        cond = cond_t if c_arr is c_in else Tensor.wrap(c_arr, DataType.BOOL)
        state = [Tensor.wrap(a, sig[0]) for a, sig in zip(st, out_sig[1:1 + n])]
        return i, keep_going, cond, state, None

    def _wrap_optional(self, v, type_proto):
        if isinstance(v, (Tensor, Sequence)):
            return Optional(v, type_proto)
        return v


# ========================================================================== Scan


@register()
class Scan(_ControlFlowBase):
    """Iterate body over slices of the scan inputs, carrying state.

    Opset 9+: inputs are N initial states then M = num_scan_inputs scan inputs, each
    scanned along scan_input_axes[i] (default 0; negative axes count from the back) in
    scan_input_directions[i] (0 forward, 1 reverse).  The body takes (*state,
    *scan_elements) and returns (*state, *scan_output_elements); each scan output is
    stacked along scan_output_axes[j] (default 0), appended (0) or prepended (1) per
    scan_output_directions[j].  All scan inputs must have the same length along their
    axis.  With length 0 the final states are the initial ones and the scan outputs are
    empty, typed from the body's declared outputs (unknown dimensions 0).

    Opset 8: the first input is sequence_lens (optional, INT64 [batch]); states and scan
    inputs carry a leading batch axis, scan inputs a sequence axis 1; ``directions``
    gives the scan direction per scan input.  Each batch entry runs its own loop of
    sequence_lens[b] steps (a reverse scan starts at its last valid step); scan output
    positions past sequence_lens[b] are left 0 (the spec leaves them undefined).

    ``assemble(final_states, per_iteration_scan_values, ...)`` stacks scan outputs
    evaluated elsewhere."""

    def __call__(self, *inputs, body=None, num_scan_inputs=None, scan_input_axes=None,
                 scan_input_directions=None, scan_output_axes=None, scan_output_directions=None,
                 directions=None):
        body = self.graph_attr(body, "body")
        if num_scan_inputs is None:
            raise self.error("required attribute 'num_scan_inputs' is missing")
        m = int(num_scan_inputs)
        if self.since_version < 9:
            if scan_input_axes is not None or scan_input_directions is not None or \
                    scan_output_axes is not None or scan_output_directions is not None:
                raise self.error("opset-8 Scan has no scan_input/output axes or directions attributes; "
                                 "use 'directions'")
            if not inputs:
                raise self.error("opset-8 Scan needs sequence_lens (possibly omitted) then its inputs")
            return self._scan8(inputs[0], list(inputs[1:]), body, m, directions)
        if directions is not None:
            raise self.error("'directions' is the opset-8 attribute; use scan_input_directions")
        n, k = self._counts(inputs, body, m)
        in_axes = self._int_list(scan_input_axes, m, "scan_input_axes", 0)
        in_dirs = self._int_list(scan_input_directions, m, "scan_input_directions", 0, flags=True)
        out_axes = self._int_list(scan_output_axes, k, "scan_output_axes", 0)
        out_dirs = self._int_list(scan_output_directions, k, "scan_output_directions", 0, flags=True)
        states = [self._state(v, f"initial state {i}") for i, v in enumerate(inputs[:n])]
        scan_in = [self._state(v, f"scan input {i}") for i, v in enumerate(inputs[n:])]
        length = None
        sliced = []
        for i, (x, axis, rev) in enumerate(zip(scan_in, in_axes, in_dirs)):
            r = x.ndim
            if r == 0:
                raise self.error(f"scan input {i} is a scalar; it needs an axis to scan", **{f"scan_input_{i}": x})
            if not -r <= axis < r:
                raise self.error(f"scan_input_axes[{i}] = {axis} is out of range for rank {r}",
                                 **{f"scan_input_{i}": x})
            a = axis % r
            if length is None:
                length = x.shape[a]
            elif x.shape[a] != length:
                raise self.error(f"scan input {i} has length {x.shape[a]} along axis {axis}, scan input 0 "
                                 f"has {length}; scan inputs must agree",
                                 **{f"scan_input_0": scan_in[0], f"scan_input_{i}": x})
            sliced.append(self._steps(x, a, rev))
        runner = _Body(self, body, ("V", 0))
        final, columns = self._loop(runner, states, sliced, length, n, k)
        return self._finish(final, columns, out_axes, out_dirs, runner.declared[n:])

    # ------------------------------------------------------------ helpers
    def _int_list(self, values, count, name, default, flags=False):
        if values is None:
            return [default] * count
        values = [int(v) for v in values]
        if len(values) != count:
            raise self.error(f"{name} has {len(values)} entries, expected {count}")
        if flags and any(v not in (0, 1) for v in values):
            raise self.error(f"{name} entries must be 0 (forward) or 1 (reverse), got {values}")
        return values

    def _state(self, value, where):
        v = self.value_here(value, where)
        if not isinstance(v, Tensor):
            raise self.type_error(f"{where} must be a tensor, got {describe(v)}")
        self.check_value_type(v, where)
        return v

    def _steps(self, x: Tensor, axis: int, reverse: bool):
        """(array with the scan axis first, contiguous, in scan order; element type)."""
        xp = self.xp_for(x.data_type)
        arr = xp.moveaxis(x.array, axis, 0) if axis else x.array
        if reverse:
            arr = arr[::-1]
        if not arr.flags.c_contiguous:
            arr = xp.ascontiguousarray(arr)
        return arr, x.data_type

    def _loop(self, body, states, sliced, length, n, k):
        """Run the body over steps 0..length-1: (final states, k _Columns)."""
        columns = [_Column() for _ in range(k)]
        wrap = Tensor.wrap
        t = 0
        length = length or 0
        while t < length:
            args = states + [wrap(arr[t, ...], dt) for arr, dt in sliced]
            prog = body.program_for(args)
            if prog is not None:
                t, states, outs = self._fast(prog, t, length, states, [arr for arr, _ in sliced],
                                             columns, n)
                if outs is None:
                    continue
                body.left(prog, outs)  # step t left the compiled path
            else:
                outs = body.run(args, record=length - t >= 2)
            states = outs[:n]
            for col, v in zip(columns, outs[n:]):
                col.add(v)
            t += 1
        return states, columns

    def _fast(self, prog, t, length, states, arrays, columns, n):
        """Steps t, t+1, ... on arrays through the compiled body while the states keep
        their signature.  Returns (t, states, outs): outs are the unchecked outputs of
        step t when it left the compiled path, else None."""
        out_sig = prog.out_sig
        stable = prog.in_sig[:n] == out_sig[:n]
        appends = [col.fast(sig[0]) for col, sig in zip(columns, out_sig[n:])]
        one = appends[0] if len(appends) == 1 else None
        st = [s.array for s in states]
        run = prog.run
        # the steps' slices (iterating a rank >= 2 array gives the same views as a[t, ...])
        steps = zip(*[iter(a[t:length]) if a.ndim > 1 else (a[i, ...] for i in range(t, length))
                      for a in arrays])
        token = prog.guard.enter_strict()
        try:
            for xs in steps:
                ok, outs = run([*st, *xs])
                if not ok:
                    return t, states, outs
                t += 1
                st = outs[:n]
                if one is not None:
                    one(outs[n])
                else:
                    for append, a in zip(appends, outs[n:]):
                        append(a)
                if not stable:
                    break
        finally:
            prog.guard.leave(token)
        return t, [Tensor.wrap(a, sig[0]) for a, sig in zip(st, out_sig[:n])], None

    def _finish(self, final, columns, out_axes, out_dirs, declared):
        results = list(final)
        for j, col in enumerate(columns):
            if col:
                results.append(col.stack(self, out_axes[j], f"scan output {j}", reverse=bool(out_dirs[j])))
            else:
                results.append(self.empty_scan_output(declared[j] if declared else ("", 0, None),
                                                      out_axes[j], f"scan output {j}"))
        return _pack(results)

    def assemble(self, final_states, per_iteration_scan_values, scan_output_axes=None,
                 scan_output_directions=None, scan_output_types=None):
        """The Scan outputs from values evaluated elsewhere: final_states followed by the
        scan outputs stacked from per_iteration_scan_values (one list per iteration, in
        iteration order) along scan_output_axes, reversed where scan_output_directions
        is 1.  scan_output_types types the outputs of a zero-length scan."""
        rows = [list(r) for r in per_iteration_scan_values]
        types = [_declared_from(t) for t in scan_output_types] if scan_output_types is not None else None
        k = len(rows[0]) if rows else (len(types) if types is not None else 0)
        for i, r in enumerate(rows):
            if len(r) != k:
                raise self.error(f"iteration {i} has {len(r)} scan values, iteration 0 has {k}")
        if types is not None and len(types) != k:
            raise self.error(f"{len(types)} scan output types for {k} scan values")
        out_axes = self._int_list(scan_output_axes, k, "scan_output_axes", 0)
        out_dirs = self._int_list(scan_output_directions, k, "scan_output_directions", 0, flags=True)
        final = [self._state(v, f"final state {i}") for i, v in enumerate(final_states)]
        columns = [_Column([self.value_here(r[j], f"scan value {j}") for r in rows]) for j in range(k)]
        return self._finish(final, columns, out_axes, out_dirs, types)

    def _counts(self, inputs, body, m):
        """(states, scan outputs) for num_scan_inputs m, checked against the body."""
        if m < 1:
            raise self.error(f"num_scan_inputs must be at least 1, got {m}")
        if m > len(inputs):
            raise self.error(f"num_scan_inputs is {m} but only {len(inputs)} states and scan inputs are given")
        n = len(inputs) - m
        n_in, n_out = len(body.input), len(body.output)
        if n_in != n + m:
            raise self.error(f"body declares {n_in} inputs; with {n} states and {m} scan inputs it "
                             f"must declare {n + m}")
        if n_out < n:
            raise self.error(f"body declares {n_out} outputs; it must return at least the {n} states")
        return n, n_out - n

    # ------------------------------------------------------------ opset 8
    def _scan8(self, sequence_lens, inputs, body, m, directions):
        n, k = self._counts(inputs, body, m)
        dirs = self._int_list(directions, m, "directions", 0, flags=True)
        states = [self._state(v, f"initial state {i}") for i, v in enumerate(inputs[:n])]
        scan_in = [self._state(v, f"scan input {i}") for i, v in enumerate(inputs[n:])]
        batch = length = None
        for i, x in enumerate(scan_in):
            if x.ndim < 2:
                raise self.error(f"scan input {i} needs a batch axis and a sequence axis",
                                 **{f"scan_input_{i}": x})
            if batch is None:
                batch, length = x.shape[0], x.shape[1]
            elif x.shape[0] != batch or x.shape[1] != length:
                raise self.error(f"scan input {i} has batch/sequence sizes {list(x.shape[:2])}, scan input 0 "
                                 f"has {[batch, length]}; scan inputs must agree",
                                 **{f"scan_input_0": scan_in[0], f"scan_input_{i}": x})
        for i, s in enumerate(states):
            if s.ndim < 1 or s.shape[0] != batch:
                raise self.error(f"initial state {i} must have the batch size {batch} as its first dimension",
                                 **{f"state_{i}": s})
        if sequence_lens is None or (isinstance(sequence_lens, Tensor) and sequence_lens.is_absent):
            lens = [length] * batch
        else:
            sl = self.tensor(sequence_lens, "sequence_lens")
            if sl.data_type != DataType.INT64:
                raise self.type_error(f"sequence_lens must be int64, got {describe(sl)}", sequence_lens=sl)
            if sl.shape != (batch,):
                raise self.error(f"sequence_lens must have shape [{batch}]", sequence_lens=sl)
            lens = [int(v) for v in np.asarray(sl.numpy())]
            if any(v < 0 or v > length for v in lens):
                raise self.error(f"sequence_lens values {lens} must lie in [0, {length}]", sequence_lens=sl)
        runner = _Body(self, body, ("V", 0))
        declared = runner.declared

        finals = [[] for _ in range(n)]
        per_batch = []  # per batch: list of k columns
        for b in range(batch):
            st = [self.result(s.array[b, ...], s.data_type) for s in states]
            steps = []
            for x, rev in zip(scan_in, dirs):
                arr = x.array[b, :lens[b]]
                if rev:
                    arr = arr[::-1]
                steps.append((arr, x.data_type))
            final, columns = self._loop(runner, st, steps, lens[b], n, k)
            for j, v in enumerate(final):
                finals[j].append(v)
            per_batch.append([col.values() for col in columns])
        results = []
        for j in range(n):
            if batch:
                results.append(self.stack(finals[j], 0, f"final state {j}"))
            else:
                results.append(states[j])
        for j in range(k):
            results.append(self._batched_output(per_batch, j, batch, length, declared[n + j]))
        return _pack(results)

    def _batched_output(self, per_batch, j, batch, length, declared):
        """[batch, length, ...] from each batch entry's scan values, zero-padded."""
        sample = next((cols[j][0] for cols in per_batch if cols[j]), None)
        if sample is None:
            empty = self.empty_scan_output(declared, 0, f"scan output {j}")  # [0, *elem]
            elem = empty.shape[1:]
            dt = empty.data_type
            xp = self.xp_for(dt)
            return self.result(xp.zeros((batch, length) + tuple(elem), dtype=empty.array.dtype), dt)
        rows = []
        for b, cols in enumerate(per_batch):
            col = cols[j]
            if col:
                stacked = self.stack(col, 0, f"scan output {j} (batch {b})")
                if stacked.shape[1:] != sample.shape or stacked.data_type != sample.data_type:
                    raise self.error(f"scan output {j}: batch {b} produced {describe(col[0])}, another batch "
                                     f"{describe(sample)}")
                arr = stacked.array
            else:
                arr = None
            rows.append(arr)
        xp = self.xp_for(sample.data_type)
        out = xp.zeros((batch, length) + tuple(sample.shape), dtype=sample.array.dtype)
        for b, arr in enumerate(rows):
            if arr is not None:
                out[b, :arr.shape[0]] = arr
        return self.result(out, sample.data_type)


# ------------------------------------------------------------ module helpers


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
