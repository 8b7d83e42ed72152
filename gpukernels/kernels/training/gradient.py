"""ai.onnx.preview.training Gradient: reverse-mode differentiation of the enclosing graph.

The Gradient node names, in its attributes, the differentiated tensors ``xs``, the
non-differentiated inputs ``zs`` and the target ``y`` -- all values of the graph the
node sits in.  Its inputs are the values of xs then zs at which to differentiate.  The
kernel

1. slices the enclosing graph: the nodes needed to compute y, walking back from y and
   stopping at xs and zs (other inputs of the slice -- initializers, graph inputs --
   are read from the enclosing scope);
2. re-runs that slice forward through the graph runtime with the given xs/zs values,
   keeping every intermediate;
3. propagates dy = ones(y.shape) backwards (so a non-scalar y is differentiated as
   sum(y)) with the rules in ``VJP`` and returns dy/dx for each x in xs, in x's type.

Differentiable operators: Add, Sub, Mul, Div, Neg, MatMul, Gemm, Relu, Sigmoid, Tanh,
Exp, Log, Sqrt, Abs, Identity.  Others on the path raise a KernelInputError naming them.
A name in xs that y does not depend on gets a zero gradient.

The kernel needs the enclosing graph: the runtime sets ``self.outer_scope`` (the class
says ``needs_outer_scope = True``) and the installed SubgraphRunner's
``graph_of(scope)`` returns its GraphProto (gpukernels.kernels.subgraphs).
``Gradient.scope_reads(node, graph)`` lists the values it reads through the scope, which
the runtime must not free before the node runs.  ``differentiate`` is the same computation as a plain function.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from ...dtypes import DataType
from ...tensor import Tensor
from ..base import KernelBase, register
from ..subgraphs import runner


def _unbroadcast(xp, g, shape):
    """Sum g over the axes along which a value of shape was broadcast."""
    shape = tuple(shape)
    if g.shape == shape:
        return g
    extra = g.ndim - len(shape)
    if extra > 0:
        g = g.sum(axis=tuple(range(extra)))
    axes = tuple(i for i, d in enumerate(shape) if d == 1 and g.shape[i] != 1)
    if axes:
        g = g.sum(axis=axes, keepdims=True)
    return g.reshape(shape)


def _attr(node, name, default):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _matmul_vjp(xp, g, a, b):
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    g2 = g
    if a.ndim == 1:
        g2 = xp.expand_dims(g2, -2)
    if b.ndim == 1:
        g2 = xp.expand_dims(g2, -1)
    ga = xp.matmul(g2, xp.swapaxes(b2, -1, -2))
    gb = xp.matmul(xp.swapaxes(a2, -1, -2), g2)
    ga = _unbroadcast(xp, ga, a2.shape).reshape(a.shape)
    gb = _unbroadcast(xp, gb, b2.shape).reshape(b.shape)
    return ga, gb


def _gemm_vjp(xp, node, g, ins):
    a, b = ins[0], ins[1]
    ta, tb = int(_attr(node, "transA", 0)), int(_attr(node, "transB", 0))
    alpha, beta = float(_attr(node, "alpha", 1.0)), float(_attr(node, "beta", 1.0))
    am = a.T if ta else a
    bm = b.T if tb else b
    ga_m = alpha * (g @ bm.T)
    gb_m = alpha * (am.T @ g)
    out = [ga_m.T if ta else ga_m, gb_m.T if tb else gb_m]
    if len(ins) > 2 and ins[2] is not None:
        out.append(_unbroadcast(xp, beta * g, ins[2].shape))
    return out


# op_type -> f(xp, node, g, inputs, outputs) -> gradient per input (None: not differentiable)
VJP = {
    "Add": lambda xp, n, g, i, o: [_unbroadcast(xp, g, i[0].shape), _unbroadcast(xp, g, i[1].shape)],
    "Sub": lambda xp, n, g, i, o: [_unbroadcast(xp, g, i[0].shape), _unbroadcast(xp, -g, i[1].shape)],
    "Mul": lambda xp, n, g, i, o: [_unbroadcast(xp, g * i[1], i[0].shape), _unbroadcast(xp, g * i[0], i[1].shape)],
    "Div": lambda xp, n, g, i, o: [_unbroadcast(xp, g / i[1], i[0].shape),
                                   _unbroadcast(xp, -g * i[0] / (i[1] * i[1]), i[1].shape)],
    "Neg": lambda xp, n, g, i, o: [-g],
    "Identity": lambda xp, n, g, i, o: [g],
    "MatMul": lambda xp, n, g, i, o: list(_matmul_vjp(xp, g, i[0], i[1])),
    "Gemm": lambda xp, n, g, i, o: _gemm_vjp(xp, n, g, i),
    "Relu": lambda xp, n, g, i, o: [g * (i[0] > 0)],
    "Sigmoid": lambda xp, n, g, i, o: [g * o[0] * (1 - o[0])],
    "Tanh": lambda xp, n, g, i, o: [g * (1 - o[0] * o[0])],
    "Exp": lambda xp, n, g, i, o: [g * o[0]],
    "Log": lambda xp, n, g, i, o: [g / i[0]],
    "Sqrt": lambda xp, n, g, i, o: [g / (2 * o[0])],
    "Abs": lambda xp, n, g, i, o: [g * xp.sign(i[0])],
}


def forward_slice(graph: onnx.GraphProto, xs, zs, y):
    """(nodes computing y from xs/zs in graph order, names the slice reads that neither
    it nor xs/zs define)."""
    leaves = set(xs) | set(zs)
    producer = {}
    for idx, node in enumerate(graph.node):
        for o in node.output:
            if o:
                producer[o] = idx
    needed, stack, seen = set(), [y], set()
    while stack:
        name = stack.pop()
        if name in seen or name in leaves:
            continue
        seen.add(name)
        idx = producer.get(name)
        if idx is None:
            continue
        if idx not in needed:
            needed.add(idx)
            stack.extend(i for i in graph.node[idx].input if i)
    nodes = [graph.node[i] for i in sorted(needed)]
    produced = {o for n in nodes for o in n.output if o}
    external = []
    for n in nodes:
        for i in n.input:
            if i and i not in produced and i not in leaves and i not in external:
                external.append(i)
    if y not in produced and y not in leaves:
        external.append(y) if y not in external else None
    return nodes, external


def differentiate(xp, graph, xs, zs, y, values: dict, run_forward, lookup):
    """dy/dx for x in xs (arrays), with values {name: Tensor} for xs and zs.

    run_forward(graph_proto, inputs: list[Tensor]) -> list[Tensor] runs a graph;
    lookup(name) -> Tensor gives values the slice reads from the enclosing graph."""
    nodes, external = forward_slice(graph, xs, zs, y)
    if y in external:
        raise KeyError(f"y={y!r} is not computed by the graph from xs/zs and is not one of them")
    ext_values = [lookup(name) for name in external]
    inputs = list(xs) + list(zs) + external
    unique_inputs = list(dict.fromkeys(inputs))
    feed = {**{n: values[n] for n in list(xs) + list(zs)}, **dict(zip(external, ext_values))}
    intermediates = list(dict.fromkeys(o for n in nodes for o in n.output if o))
    if nodes:
        sub = helper.make_graph(
            list(nodes), "gradient_forward",
            [helper.make_value_info(n, onnx.TypeProto()) for n in unique_inputs],
            [helper.make_value_info(n, onnx.TypeProto()) for n in intermediates])
        outs = run_forward(sub, [feed[n] for n in unique_inputs])
        env = dict(zip(intermediates, outs))
    else:
        env = {}
    env.update(feed)

    def arr(name):
        v = env[name]
        a = v.array if isinstance(v, Tensor) else v
        return a.astype(np.float64) if a.dtype.kind in "fiub" or a.dtype.kind == "V" else a

    grads = {y: xp.ones(env[y].array.shape if isinstance(env[y], Tensor) else env[y].shape, dtype=np.float64)}
    for node in reversed(nodes):
        gs = [grads.get(o) for o in node.output if o]
        if all(g is None for g in gs):
            continue
        rule = VJP.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        if rule is None:
            raise NotImplementedError(f"no gradient rule for {node.domain or 'ai.onnx'}::{node.op_type} "
                                      f"(node '{node.name}')")
        g = gs[0] if gs[0] is not None else xp.zeros(arr(node.output[0]).shape)
        ins = [arr(i) if i else None for i in node.input]
        outs = [arr(o) for o in node.output if o]
        for name, gi in zip(node.input, rule(xp, node, g, ins, outs)):
            if not name or gi is None:
                continue
            grads[name] = grads[name] + gi if name in grads else gi
    result = []
    for x in xs:
        shape = values[x].shape
        result.append(grads[x] if x in grads else xp.zeros(shape, dtype=np.float64))
    return result


@register(domain="ai.onnx.preview.training")
class Gradient(KernelBase):
    """Outputs dy/dx for each x in xs (see the module doc), each in x's float type.

    Inputs: the values of xs followed by zs.  The runtime must set ``outer_scope`` (the
    scope of the graph holding this node); without it the kernel raises."""

    needs_outer_scope = True

    @staticmethod
    def scope_reads(node: onnx.NodeProto, graph: onnx.GraphProto) -> list[str]:
        """Names of the enclosing graph this node reads through the scope (not through its
        inputs): the runtime must keep them alive until the node has run."""
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        dec = lambda v: v.decode() if isinstance(v, bytes) else str(v)  # noqa: E731
        xs = [dec(v) for v in attrs.get("xs", [])]
        zs = [dec(v) for v in attrs.get("zs", [])]
        if "y" not in attrs:
            return []
        _, external = forward_slice(graph, xs, zs, dec(attrs["y"]))
        return external

    def __call__(self, *Inputs, xs=None, y=None, zs=None):
        if not xs or y is None:
            raise self.error("attributes 'xs' and 'y' are required")
        xs = [s.decode() if isinstance(s, bytes) else str(s) for s in xs]
        zs = [s.decode() if isinstance(s, bytes) else str(s) for s in (zs or [])]
        y = y.decode() if isinstance(y, bytes) else str(y)
        if len(Inputs) != len(xs) + len(zs):
            raise self.error(f"expected {len(xs) + len(zs)} inputs (xs then zs), got {len(Inputs)}")
        ts = [self.tensor(v, n) for v, n in zip(Inputs, xs + zs)]
        self.check_inputs(*ts)
        for name, t in zip(xs, ts):
            if t.data_type not in (DataType.FLOAT16, DataType.FLOAT, DataType.DOUBLE):
                raise self.type_error(f"xs value '{name}' must be a float tensor", **{name: t})
        scope = self.outer_scope
        if scope is None:
            raise self.error("Gradient needs the enclosing graph: run it inside a graph (the runtime sets "
                             "outer_scope), or call gpukernels.kernels.training.gradient.differentiate")
        graph = runner().graph_of(scope)
        if not isinstance(graph, onnx.GraphProto):
            raise self.error("the enclosing scope has no GraphProto to differentiate")
        values = dict(zip(xs + zs, ts))

        def lookup(name):
            try:
                return scope.lookup(name)
            except KeyError:
                raise self.error(f"value '{name}' read by the differentiated graph is not available in the "
                                 "enclosing scope") from None

        try:
            grads = differentiate(self.xp, graph, xs, zs, y, values, self.run_subgraph, lookup)
        except NotImplementedError as exc:
            raise self.error(str(exc)) from None
        except KeyError as exc:
            raise self.error(str(exc.args[0])) from None
        out = []
        for i, (name, g) in enumerate(zip(xs, grads)):
            t = values[name]
            out.append(self.from_compute(g.reshape(t.shape), t.data_type) if self.wants_output(i) else Tensor())
        return tuple(out)
