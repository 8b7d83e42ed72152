"""The graph runtime: Session, run_graph, run_node, run_subgraph, prepare_subgraph.

Importing it installs ``RUNNER``, the SubgraphRunner through which kernels run their
subgraphs (gpukernels.kernels.subgraphs: kernels never import the runtime)."""

from __future__ import annotations

import onnx

from ..kernels import subgraphs
from ..kernels.base import KernelContext
from .body import BodyProgram, record_run
from .environment import environment_of
from .graph import PreparedGraph, Scope, functions_of
from .session import Session, load_model, opsets_of, to_runtime_value

__all__ = ["Session", "Scope", "PreparedGraph", "RuntimeContext", "run_graph", "run_node",
           "run_subgraph", "prepare_subgraph", "load_model", "graph_of", "Runner", "RUNNER"]


class RuntimeContext:
    """Values by name with a parent scope, plus the device and opsets graphs run with."""

    def __init__(self, device="cpu", opsets=None, options=None, parent: Scope | None = None,
                 functions: dict | None = None, base_dir: str | None = None):
        self.kernel_context = KernelContext(device, opsets, dict(options or {}))
        self.scope = Scope({}, parent)
        self.functions = functions or {}
        self.base_dir = base_dir

    @property
    def device(self):
        return self.kernel_context.device

    @property
    def values(self) -> dict:
        return self.scope.values


def run_graph(graph: onnx.GraphProto, inputs, context: RuntimeContext | None = None, observer=None) -> list:
    """Run a GraphProto with inputs (list in formal order or dict by name) in context;
    returns the graph outputs in order.  Outer names resolve through context.scope."""
    context = context or RuntimeContext()
    plan = PreparedGraph(graph, context.kernel_context, context.functions, context.base_dir)
    return plan.run(inputs, parent=context.scope, observer=observer)


def run_node(node: onnx.NodeProto, inputs: list, context: RuntimeContext | None = None) -> list:
    """Run a single NodeProto on input values; returns its outputs."""
    context = context or RuntimeContext()
    names = [n for n in node.input if n]
    graph = onnx.helper.make_graph([node], "run_node",
                                   [onnx.helper.make_value_info(n, onnx.TypeProto()) for n in names],
                                   [onnx.helper.make_value_info(n, onnx.TypeProto()) for n in node.output if n])
    given = [to_runtime_value(v, None, context.device) for n, v in zip(node.input, inputs) if n]
    return run_graph(graph, dict(zip(names, given)), context)


def prepare_subgraph(graph: onnx.GraphProto, ctx: KernelContext) -> PreparedGraph:
    """A prepared subgraph, cached per graph object in the context's GraphEnvironment (the
    model's functions and folder come from there), so Loop and Scan bodies resolve
    kernels and bind attributes once."""
    env = environment_of(ctx)
    return env.prepared(graph, lambda: PreparedGraph(graph, ctx, env.functions, env.base_dir))


def run_subgraph(graph: onnx.GraphProto, inputs: list, parent: Scope | None = None,
                 ctx: KernelContext | None = None) -> list:
    """Run a subgraph (If branch, Loop/Scan body) with formal inputs bound positionally;
    outer names resolve through parent."""
    ctx = ctx or KernelContext()
    return prepare_subgraph(graph, ctx).run(list(inputs), parent=parent)


def graph_of(scope: Scope):
    """The PreparedGraph a scope belongs to (its .graph is the GraphProto)."""
    return scope.graph if scope is not None else None


class Runner(subgraphs.SubgraphRunner):
    """The runtime's SubgraphRunner: PreparedGraph plans (prepare_subgraph), bodies
    compiled into BodyPrograms (runtime.body)."""

    def prepare(self, graph, ctx):
        return prepare_subgraph(graph, ctx)

    def run(self, graph, inputs, parent, ctx) -> list:
        return run_subgraph(graph, inputs, parent, ctx)

    def record(self, plan, inputs, parent):
        return record_run(plan, inputs, parent)

    def compile(self, plan, parent, inputs, outputs, records):
        return BodyProgram.compile(plan, parent, inputs, outputs, records)

    def graph_of(self, scope):
        prepared = graph_of(scope)
        return getattr(prepared, "graph", prepared)


RUNNER = Runner()
subgraphs.install(RUNNER)
