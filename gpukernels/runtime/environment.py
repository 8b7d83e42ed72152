"""What the runtime owns for the graphs that run with one KernelContext.

A model's functions, the folder its external data is read from and the subgraphs
prepared so far belong to the runtime, not to the kernels: a Loop kernel asks the
SubgraphRunner to prepare its body with its own KernelContext, and the runner finds
here what the graph around it was prepared with.  Environments are kept beside the
contexts (a weak mapping keyed by the context object), never inside them, so a
KernelContext stays what kernels see: device, opset, options.

The first graph prepared with a context fixes its environment (a Session's graph,
then every subgraph and function body of it); a context used without a Session gets an
empty one (no functions, no base folder) when it first prepares a subgraph.
"""

from __future__ import annotations

import threading
import weakref

_ENVIRONMENTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


class GraphEnvironment:
    """functions: model-local functions by (domain, name); base_dir: the model's folder
    (external data); the cache of prepared subgraphs by graph object."""

    def __init__(self, functions: dict | None = None, base_dir: str | None = None):
        self.functions = functions or {}
        self.base_dir = base_dir
        self._plans: dict = {}  # id(graph) -> (graph, plan): the graph kept alive with its plan
        self._lock = threading.Lock()

    def prepared(self, graph, make):
        """The plan cached for graph, or make() cached now.  Two threads preparing one
        graph at once may both build it; the first stored is the one kept."""
        entry = self._plans.get(id(graph))
        if entry is not None and entry[0] is graph:
            return entry[1]
        plan = make()
        with self._lock:
            entry = self._plans.get(id(graph))
            if entry is None or entry[0] is not graph:
                entry = self._plans[id(graph)] = (graph, plan)
        return entry[1]


def environment_of(ctx, functions: dict | None = None, base_dir: str | None = None) -> GraphEnvironment:
    """The environment of ctx, created with functions and base_dir when it has none yet."""
    env = _ENVIRONMENTS.get(ctx)
    if env is None:
        with _LOCK:
            env = _ENVIRONMENTS.get(ctx)
            if env is None:
                env = _ENVIRONMENTS[ctx] = GraphEnvironment(functions, base_dir)
    return env
