"""Elementwise steps after Conv/ConvTranspose/Gemm/MatMul applied in place on the
producer's output (pass ``inplace``).

    Y = Relu(Add(MatMul(X, W), b))   ->   one node: y = X @ W; y += b; max(y, 0, out=y)

The producer runs as its kernel does; then each step runs as the ufunc its kernel
computes with (``xp.add``, ``xp.subtract``, ``xp.multiply``, ``xp.divide``,
``xp.negative``, ``xp.abs``, and ``xp.maximum(y, 0)`` for Relu), written into the
producer's result instead of a new array.  Values are the same as the separate kernels'
to the bit: the same ufuncs on the same float32/float64 operands.

Conditions (all checked): the producer's output and every step's output except the
last are read by the next step only (no other node, graph output or subgraph); every
step computes natively in float32 or float64 (no up-casting) and is the registered
kernel class; a step's other operand is a constant that broadcasts into the value
without growing it, which needs the value's static shape; binary steps are opset 7 or
later (NumPy broadcasting).  At run time the producer's result is written into only
when it is a writeable array sharing no memory with the producer's inputs; otherwise a
copy is (the producers here always return fresh arrays); a result of another type or
shape than the one checked (a subgraph whose inputs nobody checks) goes through the
steps' own kernels.

In compiled runs (CompiledGraph/BodyProgram) the chain's array function is the
producer's followed by the steps in place, so inputs are never changed and a failed
step can be redone by the kernel.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper as oh

from ...dtypes import DataType
from ...kernels.base import KernelBase, lookup
from ...tensor import Tensor
from .rewrite import View

PRODUCERS = ("Conv", "ConvTranspose", "Gemm", "MatMul")
_BINARY = {"Add": "add", "Sub": "subtract", "Mul": "multiply", "Div": "divide"}
_UNARY = {"Neg": "negative", "Abs": "absolute"}
_NATIVE = {int(DataType.FLOAT), int(DataType.DOUBLE)}
DOMAIN = "com.gpukernels"


def apply_inplace(view: View) -> int:
    registered = {}
    for op in (*_BINARY, *_UNARY, "Relu"):
        try:
            registered[op] = lookup(op, "")[0]
        except Exception:  # noqa: BLE001
            pass
    for p in list(view.plan.nodes):
        if p.op_type in PRODUCERS and p.domain == "" and p.kernel is not None and id(p) not in view.claimed \
                and len(p.outputs) == 1 and p.outputs[0]:
            _try(view, p, registered)
    return view.commit()


def _try(view: View, producer, registered) -> bool:
    value = producer.outputs[0]
    dt = view.dtype(value)
    shape = view.shape(value)
    if dt not in _NATIVE or shape is None:
        return False
    steps, nodes, consts, kernels = [], [], [], []
    while True:
        c = view.consumer(value)
        if c is None or type(c.kernel) is not registered.get(c.op_type) or len(c.outputs) != 1 \
                or not c.outputs[0] or view.dtype(c.outputs[0]) != dt:
            break
        if c.op_type in _BINARY:
            if c.since_version < 7 or len(c.inputs) != 2 or c.inputs[0] == c.inputs[1]:
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
    if not steps or not view.free([producer] + nodes):
        return False
    originals = [producer.node] + [c.node for c in nodes]
    node = oh.make_node("InPlaceChain", list(producer.inputs) + consts, [value],
                        name=f"{producer.name}+{len(steps)} in place", domain=DOMAIN)
    from ..graph import PreparedNode

    p = PreparedNode(node)
    p.kernel = InPlaceChain(view.plan.ctx, producer, steps, originals, kernels, dt, shape)
    p.since_version = 1
    p.attrs = {}
    p.kernel.requested_outputs = (True,)
    p.simple = all(p.inputs)
    view.replace([producer] + nodes, p)
    return True


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
    """A producer kernel followed by elementwise steps written into its result (see the
    module docstring).  Built by the optimisation only: not in the registry."""

    op_type = "InPlaceChain"
    domain = DOMAIN
    versions = (1,)
    foldable = False

    def __init__(self, ctx, producer, steps, originals, kernels, data_type, shape):
        super().__init__(ctx, 1)
        self.producer = producer.kernel
        self.producer_attrs = producer.attrs
        self.n_in = len(producer.inputs)
        self.steps = tuple(steps)        # (ufunc name or 'relu', constant index or None, value first)
        self.originals = originals       # the NodeProtos it replaces (shape inference)
        self.kernels = tuple(kernels)    # the steps' own (kernel, attributes), for the fallback
        self.data_type = data_type       # the producer's output type and shape the steps were
        self.shape = tuple(shape)        # checked for (static when the graph was prepared)

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
        return y

    def __call__(self, *args):
        result = self.producer(*args[:self.n_in], **self.producer_attrs)
        t = result if result.__class__ is Tensor else result[0]
        if int(t.data_type) != self.data_type or tuple(t.array.shape) != self.shape:
            return self._separately(t, args[self.n_in:])  # not what was checked: the kernels
        consts = [a.array for a in args[self.n_in:]]
        inputs = [a.array for a in args[:self.n_in] if a.__class__ is Tensor]
        return Tensor.wrap(self._apply(self.xp, t.array, consts, inputs), t.data_type)

    def _separately(self, t, consts):
        """The steps through their own kernels (errors and results exactly theirs)."""
        for (kernel, attrs), (_, index, first) in zip(self.kernels, self.steps):
            if index is None:
                t = kernel(t, **attrs)
            else:
                t = kernel(t, consts[index], **attrs) if first else kernel(consts[index], t, **attrs)
        return t

    def array_function(self, inputs, attrs):
        from ..body import _hook_trusted

        if not _hook_trusted(type(self.producer)):
            return None
        fn = self.producer.array_function(list(inputs[:self.n_in]), dict(self.producer_attrs))
        if fn is None:
            return None
        xp, n, apply, shape = self.xp, self.n_in, self._apply, self.shape
        dtype = np.dtype(np.float32 if self.data_type == int(DataType.FLOAT) else np.float64)

        def chain(*arrays):
            y = fn(*arrays[:n])
            if y.shape != shape or y.dtype != dtype:
                raise ValueError("not the checked type/shape")  # the runtime redoes it by kernel
            return apply(xp, y, arrays[n:], arrays[:n])

        return chain

    def inference_nodes(self) -> list:
        return [onnx.NodeProto.FromString(n.SerializeToString()) for n in self.originals]
