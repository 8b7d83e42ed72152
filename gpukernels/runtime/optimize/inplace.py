"""Elementwise steps and activations after Conv/ConvTranspose/Gemm/MatMul applied in
place on the producer's output (passes ``inplace`` and ``conv_activation``).

    Y = Relu(Add(MatMul(X, W), b))   ->   one node: y = X @ W; y += b; max(y, 0, out=y)
    Y = Sigmoid(Conv(X, W, B))       ->   one node: the convolution with the Sigmoid
                                          applied where it writes its output

``inplace``: the producer runs as its kernel does; then each step runs as the ufunc its
kernel computes with (``xp.add``, ``xp.subtract``, ``xp.multiply``, ``xp.divide``,
``xp.negative``, ``xp.abs``, and ``xp.maximum(y, 0)`` for Relu), written into the
producer's result instead of a new array.

``conv_activation``: an activation after a Conv (Relu, Clip with constant bounds,
LeakyRelu, Tanh, Sigmoid, HardSigmoid, HardSwish, Swish, Mish: kernels/nn/epilogues.py)
becomes the convolution's epilogue: compiled host runs call ``conv_function(...,
epilogue=)``, which applies it where the host paths write their output; elsewhere (a GPU,
the general path) the Conv kernel runs, then the epilogue on its result.  With
``inplace`` too, an activation ends any chain (after the steps, on every producer).

Values are the same as the separate kernels' to the bit: the same ufuncs on the same
float32/float64 operands (the epilogues run each activation kernel's own steps).

Conditions (all checked): the producer's output and every fused node's output except the
last are read by the next node only (no other node, graph output or subgraph); every
step computes natively in float32 or float64 (no up-casting) and is the registered
kernel class; a step's other operand is a constant that broadcasts into the value
without growing it, which needs the value's static shape; binary steps are opset 7 or
later (NumPy broadcasting); Clip's bounds are one-element constants of the input's type
(or attributes).  At run time the producer's result is written into only when it is a
writeable array sharing no memory with the producer's inputs; otherwise a copy is (the
producers here always return fresh arrays); a result of another type (or, with constant
steps, shape) than the one checked (a subgraph whose inputs nobody checks) goes through
the steps' and the activation's own kernels.

In compiled runs (CompiledGraph/BodyProgram) the chain's array function is the
producer's (for a registered Conv with only an activation: the convolution with its
epilogue) followed by the steps in place, so inputs are never changed and a failed
call can be redone by the kernels.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper as oh

from ...dtypes import DataType
from ...kernels.base import KernelBase, lookup
from ...kernels.nn.conv import Conv
from ...kernels.nn.epilogues import ACTIVATIONS, build_epilogue
from ...tensor import Tensor
from ..graph import PreparedNode
from .rewrite import View

PRODUCERS = ("Conv", "ConvTranspose", "Gemm", "MatMul")
_BINARY = {"Add": "add", "Sub": "subtract", "Mul": "multiply", "Div": "divide"}
_UNARY = {"Neg": "negative", "Abs": "absolute"}
_NATIVE = {int(DataType.FLOAT): np.dtype(np.float32), int(DataType.DOUBLE): np.dtype(np.float64)}
DOMAIN = "com.gpukernels"


def apply_inplace(view: View, steps: bool = True, activations: bool = False) -> dict:
    """Fuse the chains the passes allow: steps (pass ``inplace``: every producer) and a
    final activation (pass ``conv_activation``: Conv, or every producer with ``inplace``).
    Returns {pass name: chains fused}: a Conv with an activation only counts for
    ``conv_activation``, every other chain for ``inplace``."""
    registered = {}
    for op in (*_BINARY, *_UNARY, "Relu", *ACTIVATIONS):
        try:
            registered[op] = lookup(op, "")[0]
        except Exception:  # noqa: BLE001
            pass
    producers = PRODUCERS if steps else ("Conv",)
    counts = {"inplace": 0, "conv_activation": 0}
    for p in list(view.plan.nodes):
        if p.op_type in producers and p.domain == "" and p.kernel is not None and id(p) not in view.claimed \
                and len(p.outputs) == 1 and p.outputs[0]:
            kind = _try(view, p, registered, steps, activations)
            if kind:
                counts[kind] += 1
    view.commit()
    return counts


def _try(view: View, producer, registered, allow_steps: bool, allow_activation: bool):
    """Fuse the chain after producer; the pass it counts for, or None."""
    value = producer.outputs[0]
    dt = view.dtype(value)
    if dt not in _NATIVE:
        return None
    shape = view.shape(value)
    steps, nodes, consts, kernels = [], [], [], []
    activation = None
    while True:
        c = view.consumer(value)
        if c is None or type(c.kernel) is not registered.get(c.op_type) or len(c.outputs) != 1 \
                or not c.outputs[0] or view.dtype(c.outputs[0]) != dt:
            break
        if allow_activation and c.op_type in ACTIVATIONS:
            activation = _activation(view, c, value, dt)
            if activation is not None:
                nodes.append(c)
                value = c.outputs[0]
            break
        if not allow_steps:
            break
        if c.op_type in _BINARY:
            if c.since_version < 7 or len(c.inputs) != 2 or c.inputs[0] == c.inputs[1] or shape is None:
                break
            first = c.inputs[0] == value
            other = c.inputs[1] if first else c.inputs[0]
            a = view.const(other)
            if a is None or view.const_type(other) != dt or not _fits(a.shape, shape):
                break
            steps.append((_BINARY[c.op_type], len(consts), first))
            consts.append(other)
        elif c.op_type in _UNARY or c.op_type == "Relu":
            if len(c.inputs) != 1:
                break
            steps.append((_UNARY.get(c.op_type, "relu"), None, True))
        else:
            break
        nodes.append(c)
        kernels.append((c.kernel, c.attrs))
        value = c.outputs[0]
    if not nodes or not view.free([producer] + nodes):
        return None
    originals = [producer.node] + [c.node for c in nodes]
    if activation is not None and len(nodes[-1].inputs) > 1:  # Clip's bounds: read at prepare time
        originals[-1] = _without_bounds(nodes[-1].node)
    tail = f"+{len(steps)} in place" if steps else ""
    tail += f"+{nodes[-1].op_type}" if activation is not None else ""
    node = oh.make_node("InPlaceChain", list(producer.inputs) + consts, [value],
                        name=f"{producer.name}{tail}", domain=DOMAIN)
    p = PreparedNode(node)
    p.kernel = InPlaceChain(view.plan.ctx, producer, steps, originals, kernels, dt,
                            shape if consts else None, activation)
    p.since_version = 1
    p.attrs = {}
    p.kernel.requested_outputs = (True,)
    p.simple = all(p.inputs)
    view.replace([producer] + nodes, p)
    return "conv_activation" if not steps and producer.op_type == "Conv" else "inplace"


def _activation(view: View, c, value: str, dt: int):
    """(epilogue, kernel, attributes, extra kernel inputs) for the activation node c
    reading value, or None when it has none (kernels/nn/epilogues.py) or Clip's bounds are
    not one-element constants of the input's type."""
    if not c.inputs or c.inputs[0] != value:
        return None
    bounds = None
    if c.op_type == "Clip" and c.since_version >= 11:
        bounds = []
        for name in (c.inputs + ["", ""])[1:3]:
            if not name:
                bounds.append(None)
                continue
            a = view.const(name)
            if a is None or a.size != 1 or view.const_type(name) != dt or name == value:
                return None
            bounds.append(view.plan.constants[name])
        if len(c.inputs) > 3:
            return None
    elif len(c.inputs) != 1:
        return None
    epilogue = build_epilogue(c.kernel, c.attrs, _NATIVE[dt], bounds)
    if epilogue is None:
        return None
    return epilogue, c.kernel, c.attrs, tuple(bounds or ())


def _without_bounds(node):
    """A copy of a Clip node reading its input only (the bounds were read when fusing and
    their constants may be gone): what shape inference sees."""
    copy = onnx.NodeProto.FromString(node.SerializeToString())
    del copy.input[1:]
    return copy


def _fits(const_shape, shape) -> bool:
    """Whether a constant of const_shape broadcasts into shape without growing it."""
    if len(const_shape) > len(shape):
        return False
    return all(d in (1, s) for d, s in zip(reversed(const_shape), reversed(shape)))


def _shares(a, others) -> bool:
    """Whether array a may share memory with any of others (host: NumPy's bounds check;
    device: overlapping address ranges)."""
    if a.__class__ is np.ndarray:
        return any(o.__class__ is np.ndarray and np.may_share_memory(a, o) for o in others)
    lo = a.data.ptr
    hi = lo + a.nbytes
    for o in others:
        if o is not None and hasattr(o, "data") and o.__class__ is not np.ndarray:
            olo = o.data.ptr
            if olo < hi and lo < olo + o.nbytes:
                return True
    return False


class InPlaceChain(KernelBase):
    """A producer kernel followed by elementwise steps and an activation written into its
    result (see the module docstring).  Built by the optimisation only: not in the
    registry."""

    op_type = "InPlaceChain"
    domain = DOMAIN
    versions = (1,)
    foldable = False

    def __init__(self, ctx, producer, steps, originals, kernels, data_type, shape, activation=None):
        super().__init__(ctx, 1)
        self.producer = producer.kernel
        self.producer_attrs = producer.attrs
        self.n_in = len(producer.inputs)
        self.steps = tuple(steps)        # (ufunc name or 'relu', constant index or None, value first)
        self.originals = originals       # the NodeProtos it replaces (shape inference)
        self.kernels = tuple(kernels)    # the steps' own (kernel, attributes), for the fallback
        self.data_type = data_type       # the producer's output type and (with constant steps)
        self.shape = None if shape is None else tuple(shape)  # shape the steps were checked for
        # the activation's epilogue, and its (kernel, attributes, extra inputs) for the fallback
        self.epilogue = activation[0] if activation is not None else None
        self.activation = activation[1:] if activation is not None else None

    def _apply(self, xp, y, consts, inputs):
        if not hasattr(y, "flags") or y.ndim == 0 or not y.flags.writeable or _shares(y, inputs):
            y = xp.array(y, copy=True)
        for name, index, first in self.steps:
            if name == "relu":
                xp.maximum(y, y.dtype.type(0), out=y)
            elif index is None:
                getattr(xp, name)(y, out=y)
            elif first:
                getattr(xp, name)(y, consts[index], out=y)
            else:
                getattr(xp, name)(consts[index], y, out=y)
        if self.epilogue is not None:
            y = self.epilogue.apply(y)
        return y

    def _checked(self, dtype, shape) -> bool:
        return dtype == _NATIVE[self.data_type] and (self.shape is None or tuple(shape) == self.shape)

    def __call__(self, *args):
        result = self.producer(*args[:self.n_in], **self.producer_attrs)
        t = result if result.__class__ is Tensor else result[0]
        if int(t.data_type) != self.data_type or not self._checked(t.array.dtype, t.array.shape):
            return self._separately(t, args[self.n_in:])  # not what was checked: the kernels
        consts = [a.array for a in args[self.n_in:]]
        inputs = [a.array for a in args[:self.n_in] if a.__class__ is Tensor]
        return Tensor.wrap(self._apply(self.xp, t.array, consts, inputs), t.data_type)

    def _separately(self, t, consts):
        """The steps and the activation through their own kernels (errors and results
        exactly theirs)."""
        for (kernel, attrs), (_, index, first) in zip(self.kernels, self.steps):
            if index is None:
                t = kernel(t, **attrs)
            else:
                t = kernel(t, consts[index], **attrs) if first else kernel(consts[index], t, **attrs)
        if self.epilogue is not None:
            kernel, attrs, extra = self.activation
            t = kernel(t, *extra, **attrs)
        return t

    def array_function(self, inputs, attrs):
        from ..body import _hook_trusted

        if not _hook_trusted(type(self.producer)):
            return None
        n, checked = self.n_in, self._checked
        if self.epilogue is not None and not self.steps and type(self.producer) is Conv \
                and inputs[0].data_type == self.data_type:
            # the registered Conv on float32/float64 inputs returns their type: no check
            fused = self.producer.array_function(list(inputs[:n]), dict(self.producer_attrs), epilogue=self.epilogue)
            if fused is not None:
                return fused
        fn = self.producer.array_function(list(inputs[:n]), dict(self.producer_attrs))
        if fn is None:
            return None
        xp, apply = self.xp, self._apply

        def chain(*arrays):
            y = fn(*arrays[:n])
            if not checked(y.dtype, y.shape):
                raise ValueError("not the checked type/shape")  # the runtime redoes it by kernel
            return apply(xp, y, arrays[n:], arrays[:n])

        return chain

    def inference_nodes(self) -> list:
        return [onnx.NodeProto.FromString(n.SerializeToString()) for n in self.originals]
