"""What kernels need from a graph runtime to run subgraphs, as an interface.

If branches, Loop/Scan bodies, SequenceMap bodies, FlexAttention score functions and the
graph a Gradient differentiates are ONNX graphs: running them takes a graph runtime, which
sits a layer above the kernels (it resolves kernels, binds their attributes, calls them).
Kernels never import the runtime.  They reach it through a ``SubgraphRunner``, which the
runtime implements and installs when ``gpukernels.runtime`` is imported (the package
``gpukernels`` imports it, so a kernel called directly -- ``If(ctx)(cond,
then_branch=g, else_branch=h)`` -- finds it too).

A kernel uses ``runner()``::

    plan = runner().prepare(graph, self.ctx)          # once per graph and context
    outputs = plan.run(inputs, parent=self.outer_scope)

A Loop or Scan body that runs many times with inputs of one signature (``signature``)
is recorded once the general way and compiled for that signature (``record`` then
``compile``); the program returned runs later iterations on arrays.
"""

from __future__ import annotations

import abc

from ..tensor import Tensor


class SubgraphRunner(abc.ABC):
    """The runtime's services to kernels that run subgraphs.

    A *plan* is a graph prepared for a KernelContext (kernels resolved, attributes
    bound): ``plan.run(inputs, parent=scope) -> list`` runs it with its formal inputs
    bound positionally, outer names read from scope (the calling kernel's
    ``outer_scope``; None: no enclosing graph).  A *scope* is the runtime's; kernels only
    pass it on, read a value with ``scope.lookup(name)`` (KeyError when absent), or ask
    ``graph_of(scope)``."""

    @abc.abstractmethod
    def prepare(self, graph, ctx):
        """The plan of an onnx GraphProto for ctx (cached: preparing happens once per
        graph object and context)."""

    def run(self, graph, inputs, parent, ctx) -> list:
        """Run graph once: its outputs for the formal inputs, outer names from parent."""
        return self.prepare(graph, ctx).run(list(inputs), parent=parent)

    @abc.abstractmethod
    def record(self, plan, inputs, parent):
        """Run plan the general way, recording what compile needs:
        (outputs, records)."""

    @abc.abstractmethod
    def compile(self, plan, parent, inputs, outputs, records):
        """A program for the signatures of a recorded run (record's inputs, outputs and
        records), or None when the plan cannot be compiled.

        A program has ``in_sig`` and ``out_sig`` (lists of ``signature`` values), a
        ``guard`` (``enter_strict() -> token``, ``leave(token)``: its calls run between
        them) and ``run(arrays) -> (True, output arrays) | (False, output values)``, the
        latter when an iteration left the compiled path (values still to be checked)."""

    @abc.abstractmethod
    def graph_of(self, scope):
        """The onnx GraphProto whose values scope holds, or None."""


def signature(value):
    """(element type, shape, array class) of a present Tensor, else None: what a compiled
    body program is specialised for."""
    if value.__class__ is Tensor and value.array is not None:
        return value.data_type, value.array.shape, value.array.__class__
    return None


_INSTALLED: SubgraphRunner | None = None


def install(subgraph_runner: SubgraphRunner) -> SubgraphRunner | None:
    """Make subgraph_runner the one kernels use; returns the one it replaces."""
    global _INSTALLED
    if not isinstance(subgraph_runner, SubgraphRunner):
        raise TypeError(f"install: expected a SubgraphRunner, got {type(subgraph_runner).__name__}")
    previous, _INSTALLED = _INSTALLED, subgraph_runner
    return previous


def runner() -> SubgraphRunner:
    """The installed SubgraphRunner (gpukernels.runtime installs one on import)."""
    if _INSTALLED is None:
        raise RuntimeError("no subgraph runner is installed: import gpukernels.runtime (importing "
                           "gpukernels does) before running kernels with subgraph attributes")
    return _INSTALLED
