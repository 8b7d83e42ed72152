"""Compiled Loop/Scan bodies.

A Loop or Scan body runs thousands of times with inputs of the same types and shapes.
After one iteration has run the general way (every check made, the body's outputs
checked by the calling kernel), BodyProgram compiles the body for that input
signature: values live in a list indexed by slot; each node becomes
  * an array function chosen by its kernel (KernelBase.array_function) called on
    arrays, when the kernel offers one for these input types and shapes (for a node
    with several outputs, one returning a tuple of arrays, one per output: Split);
  * nothing at all for an Identity of a tensor (its output is its input's slot);
  * otherwise a pre-bound kernel call (Tensors wrapped from the slots, the result's
    type and shape checked against the recorded iteration's).
Shapes and types of array-function results follow from those of their inputs, so once
the inputs match the signature every slot does.  Anything unexpected -- an exception
in an array function, a kernel result of another type or shape -- finishes the
iteration through the general path from that node on (redoing the failed node there,
so errors and warnings are exactly the kernel's).

The host buffer arena (gpukernels.host.arena) sees a program's slots as it sees a
graph's scopes: results are bound when stored, dropped slots unbound, the inputs
pinned.  Compiling runs outside the arena: a program outlives the run that compiles it.
"""

from __future__ import annotations

import operator

import numpy as np

from .. import dtypes
from ..errors import UnsupportedOperatorError
from ..host import current_run, suspended
from ..kernels.base import lookup
from ..kernels.subgraphs import signature
from ..tensor import Tensor
from ..xp import namespace_of
from .graph import _MISSING, PreparedGraph, PreparedNode, Scope, _as_outputs, _graphs_of, subgraph_free_names

# intermediates at least this big are dropped right after their last use; smaller ones
# are dropped with the iteration's slot list
_FREE_BYTES = 1 << 15


class FloatingPointGuard:
    """Switches NumPy between the caller's floating-point error state and a strict one
    (every category the caller does not ignore raises), so array functions can run
    without per-call np.errstate and any floating-point event sends the node back to
    its kernel.  (CuPy reports no floating-point events; switching costs little there.)

    Public NumPy API only: each switch enters an ``np.errstate`` (a fresh one: an
    errstate object is entered once, and one program may run in several threads), and
    ``leave`` exits it.  The loops enter the strict state once per run of iterations,
    not per iteration; the caller's state is entered around each pre-bound kernel call
    inside the body (a kernel call costs some 30 us, a switch about 1 us)."""

    __slots__ = ("active", "caller", "strict")

    def __init__(self, active: bool = True):
        self.active = active
        self.caller = np.geterr() if active else None
        self.strict = {k: ("ignore" if v == "ignore" else "raise") for k, v in self.caller.items()} \
            if active else None

    def enter_strict(self):
        return self._enter(self.strict)

    def enter_caller(self):
        return self._enter(self.caller)

    def _enter(self, settings):
        """Switch to settings; the token is for leave()."""
        if not self.active:
            return None
        state = np.errstate(**settings)
        state.__enter__()
        return state

    def leave(self, token) -> None:
        if token is not None:
            token.__exit__(None, None, None)


_NOTHING_TAKEN: dict = {}  # BodyProgram.run's stand-in for a run without an arena


class _Diverged(Exception):
    """A pre-bound kernel call returned something other than the recorded type/shape."""

    def __init__(self, next_node: int, values: dict):
        self.next_node = next_node
        self.values = values


class _NotCompilable(Exception):
    pass


def record_run(plan: PreparedGraph, inputs: list, parent: Scope | None):
    """Run plan the general way, recording each node's inputs and outputs as stand-ins
    of the same signatures (so the run frees its values as usual):
    (outputs, {id(prepared node): (inputs, outputs)})."""
    records = {}

    def observe(p, args, outs, seconds):
        records[id(p)] = ([_stand_in(a) for a in args], [_stand_in(o) for o in outs])

    return plan.run(inputs, parent=parent, observer=observe), records


_STAND_IN_BYTES = 1 << 12


def _stand_in(value):
    """For a tensor of 4 KiB or more, a tensor of its element type, shape and array class
    holding no memory (zeros broadcast from one element); a smaller view of host memory
    copied (the memory may be a host arena buffer that goes back before the recording is
    compiled); other values as they are."""
    if value.__class__ is Tensor and value.array is not None:
        a = value.array
        xp = namespace_of(a)
        if a.__class__ is xp.ndarray and a.nbytes >= _STAND_IN_BYTES:
            return Tensor.wrap(xp.broadcast_to(xp.zeros((), a.dtype), a.shape), value.data_type)
        if a.__class__ is np.ndarray and a.base is not None:
            return Tensor.wrap(a.copy(), value.data_type)
    return value


class BodyProgram:
    """A prepared body compiled for one input signature (see the comment above).

    ``run(arrays)`` takes the body's inputs as arrays matching ``in_sig`` and returns
    ``(True, output arrays)`` (matching ``out_sig``) or ``(False, output values)`` when
    the iteration left the fast path (values as the general path returns them, still to
    be checked by the caller).  Call it between ``guard.enter_strict()`` and
    ``guard.leave(token)``."""

    def __init__(self, plan: PreparedGraph, parent: Scope | None):
        self.plan = plan
        self.parent = parent
        self.guard = FloatingPointGuard()
        self.slot_of: dict = {}
        self.slot_dt: list = []   # element type of an array slot, None for a value slot
        self.init: list = []      # slot values at the start of an iteration
        self.slot_sig: dict = {}  # array slot -> recorded signature
        self.ops: list = []       # (code, fn, a, b, o), see run()
        self.op_nodes: list = []  # index of the node each op belongs to
        self.in_sig: list = []
        self.out_sig: list = []
        self.producer: dict = {}  # node-result slot -> index of the op computing it

    # ----------------------------------------------------------------- compiling
    @classmethod
    def compile(cls, plan: PreparedGraph, parent: Scope | None, inputs, outputs, records):
        """The program for the signature of a recorded iteration (inputs, outputs,
        records from record_run), or None when the body cannot be compiled (inputs or
        outputs that are not tensors, a function body)."""
        if plan.graph is None or len(inputs) != len(plan.input_names):
            return None
        prog = cls(plan, parent)
        try:
            with suspended():
                prog._compile(inputs, outputs, records)
        except _NotCompilable:
            return None
        return prog

    def _new_slot(self, value, sig) -> int:
        self.slot_dt.append(sig[0] if sig is not None else None)
        self.init.append(value)
        s = len(self.init) - 1
        if sig is not None:
            self.slot_sig[s] = sig
        return s

    def _none_slot(self) -> int:
        """The slot passing None for an omitted input (never written or freed)."""
        s = self.slot_of.get("")
        if s is None:
            s = self.slot_of[""] = self._new_slot(None, None)
        return s

    def _resolve(self, name: str) -> int:
        """The slot of a name read by a node: local, a constant or an outer value."""
        s = self.slot_of.get(name)
        if s is not None:
            return s
        value = self.plan.constants.get(name, _MISSING)
        if value is _MISSING:
            try:
                value = self.parent.lookup(name) if self.parent is not None else _MISSING
            except KeyError:
                value = _MISSING
            if value is _MISSING:
                raise _NotCompilable(name)
        sig = signature(value)
        s = self._new_slot(value.array if sig is not None else value, sig)
        self.slot_of[name] = s
        return s

    def _compile(self, inputs, outputs, records) -> None:
        plan = self.plan
        for name, value in zip(plan.input_names, inputs):
            sig = signature(value)
            if sig is None:
                raise _NotCompilable(name)
            self.slot_of[name] = self._new_slot(None, sig)
            self.in_sig.append(sig)
        self.n_in = len(inputs)
        produced = []  # slots holding node results
        reads = []     # slots each op reads
        identity = _registered_identity()
        for j, p in enumerate(plan.nodes):
            rec = records.get(id(p))
            if rec is None:
                raise _NotCompilable(p.name)
            args, outs = rec
            in_slots = [self._resolve(n) if n else None for n in p.inputs]
            given = _given(p.inputs)  # trailing omitted inputs: as if not listed
            # inputs omitted before the last given one ('' in the middle: Resize(X, '', '',
            # sizes)) reach an array function as None, from a slot that always holds None
            arrays_in = all(s is not None and self.slot_dt[s] is not None
                            for s, n in zip(in_slots[:given], p.inputs) if n)
            if (p.kernel is not None and p.kernel.__class__ is identity and len(in_slots) == 1
                    and arrays_in and len(p.outputs) == 1 and p.outputs[0]):
                self.slot_of[p.outputs[0]] = in_slots[0]  # Identity of a tensor: the same value
                continue
            fn = self._array_function(p, args[:given], outs) if arrays_in else None
            if fn is not None:
                in_slots = [self._none_slot() if s is None else s for s in in_slots[:given]]
            if fn is not None and len(p.outputs) > 1:
                op = (5, fn, tuple(in_slots), self._result_slots(p, outs, produced), None)
                reads.append(set(in_slots))
            elif fn is not None:
                sig = signature(outs[0])
                o = self._new_slot(None, sig)
                self.slot_of[p.outputs[0]] = o
                produced.append(o)
                self.producer[o] = len(self.ops)
                n = len(in_slots)
                if n == 1:
                    op = (1, fn, in_slots[0], None, o)
                elif n == 2:
                    op = (2, fn, in_slots[0], in_slots[1], o)
                else:
                    op = (3, fn, tuple(in_slots), None, o)
                reads.append(set(in_slots))
            else:
                op, op_reads = self._bound_call(j, p, in_slots, outs, produced)
                reads.append(op_reads)
            self.ops.append(op)
            self.op_nodes.append(j)
        out_slots = []
        for name, value in zip(plan.output_names, outputs):
            s = self._resolve(name)
            sig = signature(value)
            if sig is None or self.slot_sig.get(s) != sig:
                raise _NotCompilable(name)
            out_slots.append(s)
            self.out_sig.append(sig)
        self.out_slots = out_slots
        self.outputs_of = _getter(out_slots)
        self._plan_frees(produced, reads, set(out_slots))
        self.tail = self.init[self.n_in:]

    def _array_function(self, p: PreparedNode, args, outs):
        """The kernel's array function for this node, checked once on the recorded
        inputs: its result must have the recorded output's type and shape or, for a node
        with several outputs, be a tuple of as many arrays, each with its output's."""
        n = len(p.outputs)
        if (p.kernel is None or p.needs_scope or n == 0 or len(outs) != n
                or (n == 1 and (p.requested is not None or not p.outputs[0]))
                or any(signature(o) is None for o in outs)):
            return None
        if not _hook_trusted(type(p.kernel)):
            return None
        if any(a is None for a in args) and not getattr(type(p.kernel), "omitted_inputs_as_none", False):
            return None  # only kernels that say so take None for an omitted input
        fn = p.kernel.array_function(list(args), dict(p.attrs))
        if fn is None:
            return None
        try:
            with np.errstate(all="ignore"):
                got = fn(*[None if a is None else a.array for a in args])
        except Exception:
            return None
        if n == 1:
            got = (got,)
        elif got.__class__ is not tuple or len(got) != n:
            return None  # a single array for a node with several outputs
        for g, o in zip(got, outs):
            w = o.array
            if g.__class__ is not w.__class__ or g.dtype != w.dtype or g.shape != w.shape:
                return None
        return fn

    def _result_slots(self, p: PreparedNode, outs, produced) -> tuple:
        """New slots for the named outputs of a node (None for an omitted one)."""
        slots = []
        for name, value in zip(p.outputs, outs):
            if not name:
                slots.append(None)
                continue
            s = self._new_slot(None, signature(value))
            self.slot_of[name] = s
            produced.append(s)
            self.producer[s] = len(self.ops)
            slots.append(s)
        return tuple(slots)

    def _bound_call(self, j: int, p: PreparedNode, in_slots, outs, produced):
        """(op, slots read) for a node run through its kernel on Tensors."""
        ins = tuple((s, self.slot_dt[s] if s is not None else None) for s in in_slots)
        out_specs = []
        for name, value in zip(p.outputs, outs):
            if not name:
                out_specs.append((None, None, name))
                continue
            sig = signature(value)
            s = self._new_slot(None, sig)
            self.slot_of[name] = s
            produced.append(s)
            self.producer[s] = len(self.ops)
            out_specs.append((s, sig, name))
        read = {s for s in in_slots if s is not None}
        scope_names = None
        if p.needs_scope:
            scope_names = []
            for name in self._scope_reads(p):
                s = self.slot_of.get(name)
                if s is not None:
                    scope_names.append((name, s, self.slot_dt[s]))
                    read.add(s)
        plan, parent, guard = self.plan, self.parent, self.guard
        execute, wrap = plan._execute, Tensor.wrap
        n_outputs = p.n_outputs

        def call(v):
            args = [None if s is None else (v[s] if dt is None else wrap(v[s], dt)) for s, dt in ins]
            scope = None
            if scope_names is not None:
                scope = Scope({name: (v[s] if dt is None else wrap(v[s], dt))
                               for name, s, dt in scope_names if v[s] is not _MISSING}, parent, plan)
            token = guard.enter_caller()
            try:
                result = execute(p, args, scope, None)
            finally:
                guard.leave(token)
            results = [result] if result.__class__ is Tensor else _as_outputs(result)
            if len(results) < n_outputs:
                plan._store(p, args, result, {})  # raises the usual error
            diverged = False
            for (s, sig, name), value in zip(out_specs, results):
                if s is None:
                    continue
                if sig is None:
                    v[s] = value
                elif (value.__class__ is Tensor and value.data_type == sig[0]
                      and value.array.__class__ is sig[2] and value.array.shape == sig[1]):
                    v[s] = value.array
                else:
                    diverged = True
            if diverged:
                raise _Diverged(j + 1, {name: value for (s, sig, name), value in zip(out_specs, results)
                                        if name})

        return (0, call, None, tuple(s for s, _, _ in out_specs if s is not None), None), read

    def _scope_reads(self, p: PreparedNode) -> set:
        names = set()
        for attr in p.node.attribute:
            for g in _graphs_of(attr):
                names |= subgraph_free_names(g)
        reads = getattr(type(p.kernel), "scope_reads", None)
        if reads is not None and self.plan.graph is not None:
            names.update(reads(p.node, self.plan.graph))
        return names

    def _plan_frees(self, produced, reads, keep) -> None:
        """Insert ops dropping big (or non-array) intermediates after their last use."""
        last = {}
        for k, slots in enumerate(reads):
            for s in slots:
                last[s] = k
        frees = {}
        for s in produced:
            if s in keep:
                continue
            sig = self.slot_sig.get(s)
            if sig is not None and _nbytes(sig) < _FREE_BYTES:
                continue  # small: dropped with the slot list at the end of the iteration
            k = last.get(s, self.producer[s])  # never read: dropped at once
            frees.setdefault(k, []).append(s)
        if not frees:
            return
        ops, nodes = [], []
        for k, (op, j) in enumerate(zip(self.ops, self.op_nodes)):
            ops.append(op)
            nodes.append(j)
            if k in frees:
                ops.append((4, None, tuple(frees[k]), None, None))
                nodes.append(j)
        self.ops, self.op_nodes = ops, nodes

    # ------------------------------------------------------------------- running
    def accepts(self, values) -> bool:
        """Whether body input values (Tensors) match the compiled signature."""
        return len(values) == len(self.in_sig) and all(
            signature(v) == s for v, s in zip(values, self.in_sig))

    def run(self, inputs: list):
        """One iteration on input arrays; see the class docstring.

        Op codes: 1 and 2: v[o] = fn(v[a]) / fn(v[a], v[b]); 3: v[o] = fn(*v[a...]);
        5: v[b...] = fn(*v[a...]) (several outputs; None in b: an omitted one);
        0: fn(v), a pre-bound kernel call writing the slots in b; 4: drop the slots in a.
        While the current run's host arena has buffers out (``taken``), results are
        bound and dropped slots unbound."""
        v = inputs + self.tail
        live = current_run()
        taken = live.taken if live is not None else _NOTHING_TAKEN
        # the arena hands out views of its buffers: an array owning its memory (most
        # results, and .base is a short test) never uses one
        if taken:
            for x in inputs:
                if x.base is not None:
                    live.pin(inputs)
                    break
        k = 0
        try:
            for k, (code, fn, a, b, o) in enumerate(self.ops):
                if code == 1:
                    r = fn(v[a])
                elif code == 2:
                    r = fn(v[a], v[b])
                elif code == 0:
                    fn(v)
                    if taken:
                        live.bind([v[s] for s in b])
                    continue
                elif code == 3:
                    r = fn(*[v[i] for i in a])
                elif code == 5:
                    for s, r in zip(b, fn(*[v[i] for i in a])):
                        if s is not None:
                            v[s] = r
                            if taken and r.base is not None:
                                live.bind(r)
                    continue
                else:
                    for i in a:
                        dropped, v[i] = v[i], _MISSING
                        if taken:
                            live.unbind(dropped)
                    continue
                v[o] = r
                if taken and r.base is not None:
                    live.bind(r)
        except _Diverged as exc:
            return False, self._finish(v, exc.next_node, exc.values)
        except Exception:
            if self.ops[k][0] == 0:
                raise  # the kernel's own error, raised as the general path raises it
            return False, self._finish(v, self.op_nodes[k], None)
        return True, self.outputs_of(v)

    def _finish(self, v: list, start: int, extra: dict | None) -> list:
        """Complete an iteration through the general path from node start on."""
        plan = self.plan
        values = dict(plan.constants)
        names = list(plan.input_names)
        for p in plan.nodes[:start]:
            names.extend(n for n in p.outputs if n)
        wrap = Tensor.wrap
        placed = {}
        for name in names:
            s = self.slot_of.get(name)
            if s is None or v[s] is _MISSING:
                continue
            dt = self.slot_dt[s]
            placed[name] = v[s] if dt is None else wrap(v[s], dt)
        if extra:
            placed.update(extra)
        live = current_run()
        if live is not None and live.taken:
            # bound anew by name (the slots' counts are left behind: never too low)
            live.bind(list(placed.values()))
        values.update(placed)
        scope = Scope(values, self.parent, plan)
        token = self.guard.enter_caller()
        try:
            plan._run_steps(scope, start, None)
        finally:
            self.guard.leave(token)
        return plan._outputs(scope)


def _given(names: list) -> int:
    """How many of a node's inputs are listed before its trailing omitted ('') ones."""
    n = len(names)
    while n and not names[n - 1]:
        n -= 1
    return n


def _owner(cls, name: str):
    """The class of cls's MRO that defines attribute name (None when none does)."""
    return next((c for c in cls.__mro__ if name in c.__dict__), None)


def _hook_trusted(cls) -> bool:
    """Whether cls's array_function speaks for cls: it must come from a class at or below
    the ones defining __call__ and compute, so that a subclass changing either (say a
    kernel swapped in through the kernel_overrides option) is never bypassed by an
    inherited array function."""
    hook = _owner(cls, "array_function")
    return hook is not None and all(
        issubclass(hook, owner) for owner in (_owner(cls, "__call__"), _owner(cls, "compute"))
        if owner is not None)


class CompiledGraph:
    """A top-level graph run through BodyPrograms, one per input signature (element
    types and shapes) and NumPy error state: the first run with a new one runs the
    general way, recording every node, and compiles; later runs with it run on arrays.
    A run that leaves the compiled path (a shape inside the graph changed) finishes
    the general way and drops that program.  Runs with non-tensor inputs, and graphs
    that cannot be compiled, always run the general way (run() returns None)."""

    MAX_PROGRAMS = 8

    def __init__(self, plan: PreparedGraph):
        self.plan = plan
        self.programs: dict = {}
        # compiled nodes reach the initializers through this scope (as nested graphs do)
        self.scope = Scope(dict(plan.constants), None, plan)

    def run(self, feeds: dict):
        """The graph's outputs for feeds {name: value}, or None: run it the general way."""
        plan = self.plan
        inputs = [feeds.get(name, plan.constants.get(name)) for name in plan.input_names]
        sigs = tuple(signature(v) if v is not None else None for v in inputs)
        if None in sigs:
            return None
        key = (sigs, tuple(sorted(np.geterr().items())))
        prog = self.programs.get(key, _MISSING)
        if prog is _MISSING:
            if len(self.programs) >= self.MAX_PROGRAMS:
                return None
            outs, records = record_run(plan, inputs, None)
            self.programs[key] = BodyProgram.compile(plan, self.scope, inputs, outs, records)
            return outs
        if prog is None:
            return None
        token = prog.guard.enter_strict()
        try:
            ok, outs = prog.run([v.array for v in inputs])
        finally:
            prog.guard.leave(token)
        if not ok:
            self.programs[key] = None  # a shape inside changed: stay on the general path
            return list(outs)
        return [Tensor.wrap(a, sig[0]) for a, sig in zip(outs, prog.out_sig)]


def _getter(slots):
    """v -> tuple of v[s] for s in slots."""
    if len(slots) == 1:
        s = slots[0]
        return lambda v: (v[s],)
    if not slots:
        return lambda v: ()
    return operator.itemgetter(*slots)


def _nbytes(sig) -> int:
    size = 1
    for d in sig[1]:
        size *= d
    return size * dtypes.info(sig[0]).numpy.itemsize if sig[0] != dtypes.DataType.STRING else 1 << 30


def _registered_identity():
    try:
        return lookup("Identity", "")[0]
    except UnsupportedOperatorError:  # pragma: no cover
        return None
