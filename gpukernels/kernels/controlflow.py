"""Control flow: If and Loop (Scan, which shares their body runners, is in scan.py).

Subgraph attributes (branches, bodies) arrive as onnx GraphProtos.  A body is prepared
once through the runtime's SubgraphRunner (``kernels.subgraphs``: kernels resolved,
attributes bound) and run with its formal inputs bound positionally; outer-scope names
resolve through ``self.outer_scope``, which the runtime sets for each call.

Every kernel also has a form that needs no graph:

* ``If(ctx)(cond, then_value, else_value)`` picks one of two values;
* ``Loop(ctx).run_callback(M, cond, initial_values, body=f)`` runs a Python callback
  ``f(iteration, cond_in, state) -> [cond_out, *state, *scan_values]``;
* ``Loop(ctx).assemble(...)`` / ``Scan(ctx).assemble(...)`` build the operator's outputs
  from per-iteration values evaluated elsewhere.

Loop and Scan bodies are compiled for their input signature after one general
iteration (the runner's ``compile``: ``runtime.body.BodyProgram``): later iterations run
on arrays with pre-bound kernels; the context option ``compile_bodies=False`` turns this
off.

Return values: the single output itself when the operator has exactly one output, a
tuple otherwise.  Loop-carried values stay where the body leaves them (on the GPU in a
cuda context); scan outputs are collected per iteration and stacked once at the end.
Values are never modified in place.

A Loop runs at most ``max_loop_iterations`` iterations (option; default
DEFAULT_MAX_LOOP_ITERATIONS, 0: no limit), whatever its trip count, and raises a
ResourceLimitError naming the option when it would run more.
"""

from __future__ import annotations

import numpy as np

from ..dtypes import DataType
from ..errors import ResourceLimitError
from ..tensor import Optional, Sequence, Tensor
from .base import describe, register
from .sequence import prepare_body
from ._controlflow_common import (_UNSET, _Body, _Column, _ControlFlowBase, _declared_from, _Held, _loop_inputs,
                                  _pack, _truth)

# the most iterations one Loop runs unless the option max_loop_iterations says otherwise:
# far above the loops of real models (decoding steps, per-class NMS, ...), yet a loop
# whose condition never turns false ends in seconds with an error instead of never
DEFAULT_MAX_LOOP_ITERATIONS = 1_000_000


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
        passthrough = self.per_graph(body, "cond_passthrough", lambda: _cond_passthrough(body))
        return self._run(M, cond, v_initial, None, n, scan_types=runner.declared[1 + n:],
                         wrap=wrap, in_types=in_types, pass_iteration=0 not in unused,
                         check_states=False, body=runner, cond_passthrough=passthrough)

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
        rows, types, k = self.scan_rows(rows, scan_output_types)
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

    def _iteration_limit(self):
        """The option max_loop_iterations (None: no limit)."""
        limit = self.ctx.settings.max_loop_iterations
        limit = DEFAULT_MAX_LOOP_ITERATIONS if limit is None else int(limit)
        return limit or None

    def _over_limit(self, limit: int, trip):
        given = "no trip count M" if trip is None else f"the trip count M = {trip:,}"
        return ResourceLimitError(
            f"Loop: stopped after {limit:,} iterations ({given}, and the condition still true): the "
            f"option max_loop_iterations caps how many iterations one Loop may run (default "
            f"{DEFAULT_MAX_LOOP_ITERATIONS:,}); raise it, e.g. Session(model, options="
            f"{{'max_loop_iterations': {limit * 10}}}), or 0 for no limit, if the model needs more")

    def _run(self, M, cond, initial_values, step, n, scan_types=None, wrap=None, in_types=None,
             pass_iteration=True, check_states=True, body=None, cond_passthrough=False):
        """The loop: step(it, cond, state) -> outputs runs one iteration, or, for a graph
        body, body (a _Body) does, compiled once the signature is known.

        The scan values it holds count against max_tensor_bytes as they accumulate; when
        the body passes its condition through unchanged (cond_passthrough), the loop runs
        exactly M times, so the first iteration's scan bytes times M are checked at once."""
        trip = self._trip_count(M)
        held = _Held(self)
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
        limit = self._iteration_limit()
        stop = trip if limit is None else limit if trip is None else min(trip, limit)
        while keep_going and (trip is None or i < trip):
            if limit is not None and i >= limit:
                raise self._over_limit(limit, trip)
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
                    i, keep_going, cond_t, state, outs = self._fast(prog, i, stop, it, cond_t, state,
                                                                   scans, n, pass_iteration, held)
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
            scan_values = outs[1 + n:]
            for col, v in zip(scans, scan_values):
                col.add(v)
            if scan_values:
                held.add(scan_values)
                if i == 0 and cond_passthrough and trip is not None and keep_going:
                    held.expect(held.bytes, trip - 1, f" (the trip count M = {trip:,}; the body passes "
                                                      "its condition through)")
            i += 1
        results = list(state)
        if scans is not None:
            for j, col in enumerate(scans):
                results.append(col.stack(self, 0, f"scan output {j}"))
        elif scan_types:
            for j, declared in enumerate(scan_types):
                results.append(self.empty_scan_output(declared, 0, f"scan output {j}"))
        return _pack(results)

    def _fast(self, prog, i, trip, it, cond_t, state, scans, n, pass_iteration, held):
        """Iterations i, i+1, ... on arrays through the compiled body while the loop
        goes on and its signature holds (the cond and states keep theirs).  Returns
        (i, keep_going, cond_t, state, outs): outs are the unchecked outputs of
        iteration i when it left the compiled path, else None.  The scan bytes held
        (held, a _Held) grow by the same step each iteration: one add and a compare."""
        xp = self.xp
        out_sig = prog.out_sig
        stable = prog.in_sig[1:] == out_sig[:1 + n]
        appends = [col.fast(sig[0]) for col, sig in zip(scans, out_sig[1 + n:])]
        c_arr, c_in = cond_t.array, cond_t.array
        st = [t.array for t in state]
        it_arr = it.array
        keep_going = True
        run = prog.run
        first, total, cap, step = i, held.bytes, held.cap, None
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
                if appends:
                    for append, a in zip(appends, outs[1 + n:]):
                        append(a)
                    if step is None:
                        step = held.step_bytes(outs[1 + n:])
                    total += step
                    if total > cap:
                        raise held.over(total, held.iterations + i - first)
                if not (keep_going and stable and (trip is None or i < trip)):
                    break
                if pass_iteration:
                    it_arr = xp.asarray(np.int64(i))
        finally:
            prog.guard.leave(token)
            if appends:
                held.bytes = total
                held.iterations += i - first
        cond = cond_t if c_arr is c_in else Tensor.wrap(c_arr, DataType.BOOL)
        state = [Tensor.wrap(a, sig[0]) for a, sig in zip(st, out_sig[1:1 + n])]
        return i, keep_going, cond, state, None

    def _wrap_optional(self, v, type_proto):
        if isinstance(v, (Tensor, Sequence)):
            return Optional(v, type_proto)
        return v


def _cond_passthrough(body) -> bool:
    """Whether the body's condition output is its condition input (directly or through
    Identity nodes), so that a loop with a trip count runs exactly M times."""
    if len(body.input) < 2 or not len(body.output):
        return False
    producer = {o: node for node in body.node for o in node.output if o}
    name, cond_in = body.output[0].name, body.input[1].name
    for _ in range(len(body.node) + 1):
        if name == cond_in:
            return True
        node = producer.get(name)
        if node is None or node.op_type != "Identity" or node.domain not in ("", "ai.onnx") \
                or len(node.input) != 1:
            return False
        name = node.input[0]
    return False


# ========================================================================== Scan
