"""Executing ONNX graphs with gpukernels kernels.

A graph is *prepared* once: kernels resolved for the model's opsets, attributes bound,
initializers placed on the device, calls of model-local functions and of schema
functions (operators with a function body but no kernel) set up, and a release plan
computed so every intermediate is dropped right after its last use.  Running a prepared
graph only looks values up, calls kernels and releases values.

Preparing runs outside the host buffer arena (host.suspended: what it makes outlives
every run).  Running tells the current run's arena which values are bound to names and
when the release plan drops them (HostRun.bind / unbind), so a buffer no value uses any
more is handed out again within the run; a graph's inputs given by a kernel pin theirs
(see gpukernels.host.arena).
"""

from __future__ import annotations

import functools
import time
import warnings
from dataclasses import dataclass

import numpy as np
import onnx

from .. import dtypes
from ..errors import GpuKernelsError, ModelError, UnsupportedOperatorError, node_error_for
from ..host import current_run, suspended
from ..kernels import load_all
from ..kernels.base import KernelContext, describe, has_kernel, lookup
from ..tensor import Optional, Sequence, Tensor
from .attributes import bind_attributes
from .environment import environment_of
from .validation import MAX_GRAPH_DEPTH, check_arity, check_graph, escape


class Scope:
    """Values by name, with a parent scope that subgraphs read outer names from.

    A subgraph's own names (formal inputs, node outputs) shadow the parent's; writes go
    to the innermost scope only, so a body cannot change its parent's values."""

    __slots__ = ("values", "parent", "graph")

    def __init__(self, values: dict | None = None, parent: "Scope | None" = None, graph=None):
        self.values = values if values is not None else {}
        self.parent = parent
        self.graph = graph

    def lookup(self, name: str):
        scope = self
        while scope is not None:
            v = scope.values.get(name, _MISSING)
            if v is not _MISSING:
                return v
            scope = scope.parent
        raise KeyError(name)

    def __contains__(self, name: str) -> bool:
        try:
            self.lookup(name)
            return True
        except KeyError:
            return False


_MISSING = object()
# Exceptions a kernel may raise that are reported as a NodeError naming the node.
_KERNEL_ERRORS = (ValueError, TypeError, IndexError, KeyError, ArithmeticError, RuntimeError,
                  NotImplementedError, AttributeError, AssertionError)


@dataclass
class FunctionDef:
    """A callable function body: formal inputs/outputs, attribute defaults, nodes, opsets."""

    domain: str
    name: str
    inputs: list
    outputs: list
    attribute_defaults: dict
    nodes: list
    opsets: dict


def functions_of(model: onnx.ModelProto) -> dict:
    """{(domain, name): FunctionDef} for the model's local functions."""
    out = {}
    for f in model.functions:
        for what, text in (("domain", f.domain), ("name", f.name)):
            if not isinstance(text, str):  # protobuf hands invalid UTF-8 back as bytes
                raise ModelError(f"a model-local function's {what} is not valid UTF-8: {escape(text)}")
        defaults = {a.name: a for a in f.attribute_proto}
        for a in f.attribute:
            defaults.setdefault(a, None)
        opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in f.opset_import}
        out[(f.domain, f.name)] = FunctionDef(f.domain, f.name, list(f.input), list(f.output),
                                              defaults, list(f.node), opsets)
    _check_calls(out)
    return out


def _check_calls(functions: dict) -> None:
    """Refuse model-local functions that call themselves, directly or through others,
    and chains of calls deeper than MAX_GRAPH_DEPTH: each call prepares its callee's
    body when it first runs, so either would only end in a RecursionError.  A node is a
    call when it names a model-local function and no kernel (as in _prepare_node).
    Explicit stacks: no recursion here either."""
    if not functions:
        return
    load_all()
    calls = {}
    for key, f in functions.items():
        callees, stack = set(), list(f.nodes)
        while stack:
            node = stack.pop()
            callee = ("" if node.domain == "ai.onnx" else node.domain, node.op_type)
            if callee in functions and not has_kernel(callee[1], callee[0]):
                callees.add(callee)
            for attr in node.attribute:
                for g in _graphs_of(attr):
                    stack.extend(g.node)
        calls[key] = sorted(callees)

    def shown(key):
        return f"{escape(key[0])}::{escape(key[1])}"

    depth = {}  # key -> length of the longest call chain starting there
    for root in sorted(calls):
        if root in depth:
            continue
        path, on_path, pending = [root], {root}, [iter(calls[root])]
        while pending:
            callee = next(pending[-1], None)
            if callee is None:
                done = path.pop()
                on_path.discard(done)
                pending.pop()
                depth[done] = 1 + max((depth[c] for c in calls[done]), default=0)
                if depth[done] > MAX_GRAPH_DEPTH:
                    raise ModelError(f"model-local function {shown(done)} starts a chain of calls "
                                     f"{depth[done]} functions deep, more than {MAX_GRAPH_DEPTH}; refused")
            elif callee in on_path:
                cycle = path[path.index(callee):] + [callee]
                raise ModelError(f"model-local function {shown(callee)} calls itself ("
                                 f"{' -> '.join(shown(k) for k in cycle)}); recursive functions are refused")
            elif callee not in depth:
                path.append(callee)
                on_path.add(callee)
                pending.append(iter(calls[callee]))


def subgraph_free_names(graph: onnx.GraphProto) -> set:
    """Names a graph reads from enclosing scopes (used but not defined inside it)."""
    defined = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    defined |= {i.values.name for i in graph.sparse_initializer}
    used = set()
    for node in graph.node:
        used.update(n for n in node.input if n)
        for attr in node.attribute:
            for g in _graphs_of(attr):
                used |= subgraph_free_names(g)
        defined.update(node.output)
    used.update(o.name for o in graph.output)
    return used - defined


# at most this many bytes of folded constants per graph
_FOLD_MAX_BYTES = 2 << 30
# folding stops starting new nodes after this many seconds per graph (the rest run at
# run time): preparing a graph never does unbounded work for a model that asks for it
_FOLD_MAX_SECONDS = 5.0


# fn(PreparedGraph) -> None, run on every prepared graph (not function bodies) after
# constant folding: runtime.optimize.optimize_graph, installed by that module (so this
# module never imports it: the optimisations build on PreparedGraph)
_OPTIMIZER = None


def install_optimizer(fn) -> None:
    """Install the graph optimisations PreparedGraph runs (runtime.optimize does)."""
    global _OPTIMIZER
    _OPTIMIZER = fn


def _graphs_of(attr: onnx.AttributeProto):
    if attr.type == onnx.AttributeProto.GRAPH:
        return [attr.g]
    if attr.type == onnx.AttributeProto.GRAPHS:
        return list(attr.graphs)
    return []


def _outside_runs(fn):
    """fn run with the host arena suspended: initializers, folded constants and
    optimised graphs made while preparing (lazily, inside a run, for subgraphs and
    function bodies) outlive the run."""
    @functools.wraps(fn)
    def prepared(*args, **kwargs):
        with suspended():
            return fn(*args, **kwargs)

    return prepared


class PreparedNode:
    """One node ready to run: a kernel and its bound attributes, or a function call."""

    __slots__ = ("node", "name", "op_type", "domain", "inputs", "outputs", "kernel", "attrs",
                 "function", "needs_scope", "since_version", "schema_function", "_expanded",
                 "n_outputs", "requested", "simple")

    def __init__(self, node: onnx.NodeProto):
        self.node = node
        self.name = node.name or f"{node.op_type}_{id(node) & 0xffff:x}"
        self.op_type = node.op_type
        self.domain = "" if node.domain == "ai.onnx" else node.domain
        self.inputs = list(node.input)
        self.outputs = list(node.output)
        self.kernel = None
        self.attrs = {}
        self.function = None        # FunctionDef of a model-local function
        self.schema_function = None  # OpSchema whose function body replaces a missing kernel
        self.needs_scope = False
        self.since_version = None
        self._expanded = {}          # input-type signature -> PreparedGraph
        self.n_outputs = sum(1 for o in self.outputs if o)
        # which outputs the graph uses, when not all of them (kernels may skip the rest)
        self.requested = tuple(bool(o) for o in self.outputs) \
            if len(self.outputs) > 1 or (self.outputs and not self.outputs[0]) else None
        self.simple = False  # set once the kernel is known (see PreparedGraph._prepare_node)

    def describe(self) -> str:
        return f"node {escape(self.name)} ({escape(self.domain or 'ai.onnx')}::{escape(self.op_type)})"


class PreparedGraph:
    """A graph (or function body) prepared to run repeatedly.

    graph: a GraphProto, or a FunctionDef for function bodies.
    ctx: the KernelContext every kernel of this graph uses.
    """

    @_outside_runs
    def __init__(self, graph, ctx: KernelContext, functions: dict | None = None,
                 base_dir: str | None = None, attribute_values: dict | None = None,
                 checked_inputs: bool = False):
        load_all()
        self.ctx = ctx
        # whether every run's inputs are checked against the declared types, ranks and
        # fixed dimensions (a Session's graph): optimisations may then rely on them
        self.checked_inputs = checked_inputs
        self.functions = functions or {}
        self.base_dir = base_dir
        self.attribute_values = attribute_values  # for function bodies: bound attributes
        # subgraphs prepared later through this context see the same functions and folder
        environment_of(ctx, self.functions, base_dir)
        if isinstance(graph, FunctionDef):
            self.graph = None
            self.name = f"function {graph.domain}::{graph.name}"
            self.input_names = list(graph.inputs)
            self.output_names = list(graph.outputs)
            self.output_types = []
            self.input_types = []
            nodes = graph.nodes
            self.constants = {}
        else:
            self.graph = graph
            self.name = f"graph {escape(graph.name)}"
            check_graph(graph, self.name)
            self.input_names = [i.name for i in graph.input]
            self.output_names = [o.name for o in graph.output]
            self.input_types = [i.type for i in graph.input]
            self.output_types = [o.type for o in graph.output]
            nodes = graph.node
            self.constants = self._load_initializers(graph)
        self.nodes = [self._prepare_node(n) for n in nodes]
        # nodes computing constants from constants run once, now (option fold_constants)
        self.folded = []
        if self.graph is not None and ctx.settings.fold_constants:
            self._fold_constants()
        # graph optimisations (option optimize): runtime.optimize installs them here
        self.optimized = {}
        self.deferred = False
        if self.graph is not None and _OPTIMIZER is not None:
            _OPTIMIZER(self)
        self._finish()

    def _finish(self) -> None:
        """Fast-path flags and the release plan for the final node list."""
        # the fast path only serves nodes whose inputs all live in this graph's own scope
        local = set(self.input_names) | set(self.constants)
        for p in self.nodes:
            if p.simple and not all(n in local for n in p.inputs):
                p.simple = False
            local.update(p.outputs)
        if self.ctx.device.is_cuda:
            self._keep_host_scalars()
        self.release_plan = self._plan_releases()
        self._steps = list(zip(self.nodes, self.release_plan))

    def _keep_host_scalars(self) -> None:
        """On a GPU, one-element constants that every reader takes as a host input
        (``KernelBase.host_inputs``: Pow's exponent, Clip's bounds) move back to the host,
        so that reading them costs no device-to-host copy.  Values read by a subgraph, or
        that are graph outputs, stay where they are."""
        readers: dict = {}
        pinned = set(self.output_names)
        for p in self.nodes:
            if p.needs_scope:
                for attr in p.node.attribute:
                    for g in _graphs_of(attr):
                        pinned |= subgraph_free_names(g)
            host = getattr(type(p.kernel), "host_inputs", ()) if p.kernel is not None else ()
            for i, n in enumerate(p.inputs):
                if n:
                    readers.setdefault(n, []).append(i in host)
        for name, flags in readers.items():
            t = self.constants.get(name)
            if (t is None or name in pinned or not all(flags) or t.__class__ is not Tensor
                    or t.array is None or t.array.__class__ is np.ndarray or t.array.size != 1):
                continue
            self.constants[name] = freeze(t.to("cpu"))

    # ------------------------------------------------------------- preparation
    def _load_initializers(self, graph) -> dict:
        from .attributes import sparse_to_dense

        values = {}
        for init in graph.initializer:
            values[init.name] = freeze(self._place(Tensor.from_proto(init, self.base_dir)))
        for sp in graph.sparse_initializer:
            values[sp.values.name] = freeze(self._place(sparse_to_dense(sp, self.base_dir, ctx=self.ctx)))
        return values

    def _foldable(self, p: PreparedNode, graph_outputs: set) -> bool:
        """A node that computes the same tensors on every run from this graph's constants:
        a kernel (no subgraphs, no reads of enclosing values) whose class allows it, every
        input a constant, no output a graph output (those stay fresh values per run)."""
        return (p.kernel is not None and not p.needs_scope and type(p.kernel).foldable
                and all(not n or n in self.constants for n in p.inputs)
                and not any(n in graph_outputs for n in p.outputs))

    def _fold_constants(self) -> None:
        """Constant folding: run each foldable node once (in graph order, so chains of
        them fold too); its outputs join self.constants and the node leaves self.nodes
        (listed in self.folded).  A node is left to run normally when it raises, warns,
        returns something other than tensors, or its outputs would push the folded bytes
        past _FOLD_MAX_BYTES (memory held for the session's life)."""
        graph_outputs = set(self.output_names)
        kept, total = [], 0
        deadline = time.perf_counter() + _FOLD_MAX_SECONDS
        for p in self.nodes:
            if not self._foldable(p, graph_outputs) or time.perf_counter() > deadline:
                kept.append(p)
                continue
            args = [self.constants[n] if n else None for n in p.inputs]
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    result = self._execute(p, args, None, None)
                    outputs = [result] if result.__class__ is Tensor else _as_outputs(result)
            except Exception:  # noqa: BLE001 -- the node raises again, with context, at run time
                kept.append(p)
                continue
            named = [(n, v) for n, v in zip(p.outputs, outputs) if n]
            if (caught or len(outputs) < p.n_outputs
                    or not all(v.__class__ is Tensor and v.array is not None for _, v in named)):
                kept.append(p)
                continue
            size = sum(v.array.nbytes for _, v in named)
            if total + size > _FOLD_MAX_BYTES:
                kept.append(p)
                continue
            total += size
            self.constants.update((n, freeze(self._place(v))) for n, v in named)
            self.folded.append(p)
        self.nodes = kept

    def _place(self, t: Tensor) -> Tensor:
        """A constant on the device its kernels read it from: small integer tensors
        (shapes, axes, pads: at most _HOST_INT_ELEMENTS) stay on the host, where shape
        arguments are read without a device-to-host copy; kernels using one as data
        upload it (KernelBase.tensor).  Everything else goes to the graph's device."""
        if not self.ctx.device.is_cuda or t.data_type == dtypes.DataType.STRING:
            return t
        if _is_small_int(t):
            return t.to("cpu") if t.array.__class__ is not np.ndarray else t
        return t.to(self.ctx.device)

    def _prepare_node(self, node: onnx.NodeProto, opset: int | None = None) -> PreparedNode:
        """node ready to run; opset: the version to resolve it at (default: the graph's
        opset for its domain; graph optimisations give the version of a fused operator)."""
        p = PreparedNode(node)
        p.needs_scope = any(_graphs_of(a) for a in node.attribute)
        key = (p.domain, p.op_type)
        if key in self.functions and not has_kernel(p.op_type, p.domain):
            p.function = self.functions[key]
            return p
        if opset is None:
            opset = self.ctx.opset_for(p.domain)
        try:
            cls, version = lookup(p.op_type, p.domain, opset)
            # options={'kernel_overrides': {op_type: class}} swaps in another kernel class
            # (parity tests inject faulty kernels this way)
            cls = (self.ctx.settings.kernel_overrides or {}).get(p.op_type, cls)
        except UnsupportedOperatorError:
            schema = _schema(p.op_type, p.domain, opset)
            if schema is not None and (schema.has_function or schema.has_context_dependent_function):
                check_arity(node, schema, p.describe())
                p.schema_function = schema
                p.since_version = schema.since_version
                p.attrs = self._bind(node, schema, p)
                return p
            raise
        p.since_version = version
        # kernels like Gradient read values of the enclosing graph by name
        p.needs_scope = p.needs_scope or bool(getattr(cls, "needs_outer_scope", False))
        schema = _schema(p.op_type, p.domain, opset if opset is not None else version)
        check_arity(node, schema, p.describe())
        p.attrs = self._bind(node, schema, p)
        p.kernel = cls(self.ctx, version)
        if p.requested is not None:
            p.kernel.requested_outputs = p.requested
        elif len(p.outputs) == 1:
            # a one-output node: the kernel may skip its optional later outputs
            p.kernel.requested_outputs = (True,)
        p.simple = (not p.needs_scope and p.requested is None and len(p.outputs) == 1
                    and all(p.inputs))
        return p

    def _bind(self, node, schema, p: PreparedNode) -> dict:
        if self.attribute_values is not None and any(a.ref_attr_name for a in node.attribute):
            node = _substitute_attribute_refs(node, self.attribute_values)
        attrs = bind_attributes(node, schema, self.base_dir, where=p.describe(), ctx=self.ctx)
        for value in attrs.values():
            freeze(value)  # tensor attributes (Constant's value) are shared by every run
        return attrs

    def _plan_releases(self) -> list:
        """For node i, the names to drop after it runs (their last use)."""
        keep = set(self.output_names)
        last_use = {}
        for i, p in enumerate(self.nodes):
            for name in p.inputs:
                if name:
                    last_use[name] = i
            if p.needs_scope:
                for attr in p.node.attribute:
                    for g in _graphs_of(attr):
                        for name in subgraph_free_names(g):
                            last_use[name] = i
                # kernels that read enclosing values by name (Gradient) say which
                reads = getattr(type(p.kernel), "scope_reads", None)
                if reads is not None and self.graph is not None:
                    for name in reads(p.node, self.graph):
                        last_use[name] = i
            for name in p.outputs:
                if name:
                    last_use.setdefault(name, i)  # produced but never read: drop at once
        plan = [[] for _ in self.nodes]
        for name, i in last_use.items():
            if name not in keep and name not in self.constants:
                plan[i].append(name)
        return plan

    # ------------------------------------------------------------------ running
    def run(self, inputs, parent: Scope | None = None, observer=None) -> list:
        """Run with inputs (a list in formal order, or a dict by name); returns outputs in
        order.  observer(prepared_node, input_values, output_values, seconds), when given,
        is called after every node.  The inputs' host buffers stay the current run's
        (pinned): the caller, a kernel, may hold them."""
        return self._run(inputs, parent, observer, True)

    def _run(self, inputs, parent: Scope | None, observer, pin: bool) -> list:
        """run(); pin=False when the inputs are values the caller keeps bound in its own
        scope (a function call from a node of this runtime): they are counted instead."""
        values = dict(self.constants) if self.constants else {}
        if isinstance(inputs, dict):
            values.update(inputs)
        else:
            if len(inputs) > len(self.input_names):
                raise ModelError(f"{self.name}: {len(inputs)} inputs given, it declares "
                                 f"{len(self.input_names)}")
            values.update(zip(self.input_names, inputs))
        live = current_run()
        if live is not None and live.taken:
            given = list(inputs.values() if isinstance(inputs, dict) else inputs)
            if pin:
                live.pin(given)
            else:
                live.bind(given)
        scope = Scope(values, parent, self)
        self._run_steps(scope, 0, observer)
        outputs = self._outputs(scope)
        if live is not None and live.taken:
            # bound here, handed on: the caller binds them where it stores them
            live.forget([values[n] for n in set(self.output_names)
                         if n in values and n not in self.constants])
        return outputs

    def _run_steps(self, scope: Scope, start: int, observer) -> None:
        """Run nodes start.. on scope's values, releasing each value after its last use
        (and telling the current run's host arena, when it has buffers out)."""
        values = scope.values
        run_node = self._run_node
        pop = values.pop
        live = current_run()
        for p, release in (self._steps if start == 0 else self._steps[start:]):
            if p.simple and observer is None:
                # fast path: a one-output kernel whose inputs are all local values
                try:
                    args = [values[n] for n in p.inputs]
                except KeyError:
                    run_node(p, scope, observer)
                else:
                    result = self._execute(p, args, scope, None)
                    if result.__class__ is Tensor:
                        values[p.outputs[0]] = result
                    else:
                        self._store(p, args, result, values)
            else:
                run_node(p, scope, observer)
            if live is not None and live.taken:
                live.bind([values[n] for n in p.outputs if n and n in values])
                for name in release:
                    v = pop(name, _MISSING)
                    if v is not _MISSING:
                        live.unbind(v)
            else:
                for name in release:
                    pop(name, None)

    def _outputs(self, scope: Scope) -> list:
        values = scope.values
        out = []
        for name in self.output_names:
            v = values.get(name, _MISSING)
            if v is _MISSING:
                try:
                    v = scope.lookup(name)
                except KeyError:
                    raise ModelError(f"{self.name}: output {name!r} was never computed") from None
            out.append(v)
        return out

    def _run_node(self, p: PreparedNode, scope: Scope, observer) -> None:
        local = scope.values
        args = []
        for name in p.inputs:
            v = local.get(name, _MISSING) if name else None
            if v is _MISSING:
                try:
                    v = scope.lookup(name)
                except KeyError:
                    raise ModelError(f"{p.describe()}: input {name!r} is not defined in {self.name} "
                                     "or any enclosing scope") from None
            args.append(v)
        t0 = time.perf_counter() if observer is not None else 0.0
        result = self._execute(p, args, scope, observer)
        outputs = self._store(p, args, result, scope.values)
        if observer is not None:
            observer(p, args, outputs[:len(p.outputs)], time.perf_counter() - t0)

    def _execute(self, p: PreparedNode, args, scope: Scope, observer):
        """The node's result: its kernel, model-local function or schema function body.
        A failure comes out as a NodeError naming the node and its inputs."""
        try:
            if p.kernel is not None:
                k = p.kernel
                if p.needs_scope:
                    with k.in_scope(scope):
                        result = k(*args, **p.attrs)
                else:
                    result = k(*args, **p.attrs)
                if observer is not None and getattr(observer, "synchronize", False):
                    from ..xp import synchronize

                    synchronize(self.ctx.device)
                return result
            if p.function is not None:
                return self._call_function(p, args)
            return self._call_schema_function(p, args)
        except GpuKernelsError as exc:
            if getattr(exc, "node_name", None):
                raise
            raise self._wrap(p, args, exc) from exc
        except _KERNEL_ERRORS as exc:
            raise self._wrap(p, args, exc) from exc

    def _store(self, p: PreparedNode, args, result, values: dict) -> list:
        """Bind a kernel's result to the node's output names; returns the outputs."""
        outputs = [result] if result.__class__ is Tensor else _as_outputs(result)
        if len(outputs) < p.n_outputs:
            raise self._wrap(p, args, ModelError(
                f"kernel returned {len(outputs)} output(s), the node names {len(p.outputs)}"))
        for name, v in zip(p.outputs, outputs):
            if name:
                values[name] = v
        return outputs

    def _wrap(self, p: PreparedNode, args, exc: BaseException):
        shown = ", ".join(f"{n or '<omitted>'}: {describe(a)}" for n, a in zip(p.inputs, args))
        msg = f"{p.describe()} in {self.name} failed: {exc}\n  inputs: {shown or 'none'}"
        return node_error_for(exc, msg, p.name, p.op_type)

    # -------------------------------------------------------------- functions
    def _call_function(self, p: PreparedNode, args) -> list:
        body = p._expanded.get(None)
        if body is None:
            f = p.function
            attrs = {}
            for name, default in f.attribute_defaults.items():
                if default is not None:
                    attrs[name] = default
            for a in p.node.attribute:
                attrs[a.name] = a
            ctx = KernelContext(self.ctx.device, {**self.ctx.opset, **f.opsets}, self.ctx.options)
            body = PreparedGraph(f, ctx, self.functions, self.base_dir, attribute_values=attrs)
            p._expanded[None] = body
        return body._run(list(args), None, None, False)

    def _call_schema_function(self, p: PreparedNode, args) -> list:
        schema = p.schema_function
        signature = tuple(_type_signature(a) for a in args)
        body = p._expanded.get(signature)
        if body is None:
            body = self._expand_schema_function(p, schema, args)
            p._expanded[signature] = body
        return body._run(list(args), None, None, False)

    def _expand_schema_function(self, p: PreparedNode, schema, args) -> "PreparedGraph":
        opset = self.ctx.opset_for(p.domain) or schema.since_version
        if schema.has_function and schema.function_opset_versions:
            versions = [v for v in schema.function_opset_versions if v <= opset]
            raw = schema.get_function_with_opset_version(max(versions)) if versions else None
        else:
            raw = None
        if raw is None and schema.has_context_dependent_function:
            versions = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
            types = [_type_proto_of(a).SerializeToString() for a in args]
            raw = schema.get_context_dependent_function_with_opset_version(
                max(versions) if versions else schema.since_version, p.node.SerializeToString(), types)
        if not raw:
            raise UnsupportedOperatorError(f"{p.describe()}: no kernel and no function body at opset {opset}")
        fproto = onnx.FunctionProto()
        fproto.ParseFromString(raw)
        opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in fproto.opset_import}
        opsets.setdefault("", opset)
        attrs = {a.name: a for a in p.node.attribute}
        for name, spec in schema.attributes.items():
            if name not in attrs and spec.default_value is not None and spec.default_value.name:
                attrs[name] = spec.default_value
        fdef = FunctionDef(p.domain, p.op_type, list(fproto.input), list(fproto.output), {},
                           list(fproto.node), opsets)
        ctx = KernelContext(self.ctx.device, {**self.ctx.opset, **opsets}, self.ctx.options)
        return PreparedGraph(fdef, ctx, self.functions, self.base_dir, attribute_values=attrs)


# integer constants up to this many elements stay on the host on a GPU (see _place)
_HOST_INT_ELEMENTS = 64


def _is_small_int(t: Tensor) -> bool:
    return (t.array is not None and t.array.size <= _HOST_INT_ELEMENTS
            and t.array.dtype.kind in "iu" and dtypes.info(t.data_type).is_integer)


def freeze(value):
    """Mark a value the prepared graph keeps across runs (an initializer, a folded
    constant, a tensor attribute) read-only where the array library can (NumPy): a
    kernel writing into it fails loudly, and Session copies any read-only array it
    returns, so no caller ever holds the session's own memory.  Returns value."""
    array = value.array if value.__class__ is Tensor else value
    if array.__class__ is np.ndarray:
        array.flags.writeable = False
    return value


def _substitute_attribute_refs(node: onnx.NodeProto, values: dict) -> onnx.NodeProto:
    """A copy of node whose ref_attr_name attributes take the calling node's values
    (dropped when the caller did not set them and there is no default)."""
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    del copy.attribute[:]
    for a in node.attribute:
        if a.ref_attr_name:
            given = values.get(a.ref_attr_name)
            if given is None:
                continue
            b = onnx.AttributeProto()
            b.CopyFrom(given)
            b.name = a.name
            copy.attribute.append(b)
        else:
            copy.attribute.append(a)
    return copy


def _schema(op_type: str, domain: str, opset):
    try:
        if opset is None:
            return onnx.defs.get_schema(op_type, domain)
        return onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return None


def _type_signature(value):
    if isinstance(value, Tensor):
        return ("t", int(value.data_type), value.ndim if not value.is_absent else -1)
    if isinstance(value, Sequence):
        return ("s", int(value.elem_type))
    if isinstance(value, Optional):
        return ("o", _type_signature(value.value) if value.value is not None else None)
    return (type(value).__name__,)


def _type_proto_of(value) -> onnx.TypeProto:
    from onnx import helper

    if isinstance(value, Tensor) and not value.is_absent:
        return helper.make_tensor_type_proto(int(value.data_type), list(value.shape))
    if isinstance(value, Sequence):
        return helper.make_sequence_type_proto(helper.make_tensor_type_proto(int(value.elem_type), None))
    return onnx.TypeProto()


def _as_outputs(result) -> list:
    """A kernel's return value as a list of node outputs.  A tuple (named or not) is
    several outputs; a list is several outputs when it holds values (Tensors, Sequences,
    Optionals, None), and one value otherwise (a list of maps, say)."""
    if isinstance(result, tuple):
        return list(result)
    if isinstance(result, list):
        if all(v is None or isinstance(v, (Tensor, Sequence, Optional)) for v in result):
            return result
        return [result]
    return [result]

