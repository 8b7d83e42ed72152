"""Rewriting a prepared graph's node list: producers, uses, constants, new nodes.

A View indexes plan.nodes once.  A pass finds a match, checks every condition, then
``replace``s the matched nodes by one new node that writes the match's final output
name(s); the new node takes the place of the match's last node (its root), which keeps
the list in graph order since every input of the match is computed before the root.
Nodes claimed by one rewrite are not matched again.  ``commit`` rebuilds plan.nodes and
drops the constants only the removed nodes read.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
from onnx import helper as oh

from ... import dtypes
from ...dtypes import DataType
from ...tensor import Tensor
from ..graph import _graphs_of, freeze, subgraph_free_names

FLOATS = frozenset({int(DataType.FLOAT), int(DataType.FLOAT16), int(DataType.DOUBLE), int(DataType.BFLOAT16)})
_PINNED = 1 << 30  # a use count meaning "read from outside the node list"


class View:
    def __init__(self, plan, info):
        self.plan = plan
        self.info = info
        self.producer: dict = {}
        self.consumers: dict = {}
        self.uses: Counter = Counter()
        self.index: dict = {}
        for i, p in enumerate(plan.nodes):
            self.index[id(p)] = i
            for n in p.inputs:
                if n:
                    self.uses[n] += 1
                    self.consumers.setdefault(n, []).append(p)
            for n in p.outputs:
                if n:
                    self.producer[n] = p
            if p.needs_scope:
                for attr in p.node.attribute:
                    for g in _graphs_of(attr):
                        for n in subgraph_free_names(g):
                            self.uses[n] += _PINNED
                reads = getattr(type(p.kernel), "scope_reads", None)
                if reads is not None and plan.graph is not None:
                    for n in reads(p.node, plan.graph):
                        self.uses[n] += _PINNED
        for n in plan.output_names:
            self.uses[n] += _PINNED
        self.inputs = set(plan.input_names)
        self.claimed: set = set()
        self.replacements: dict = {}   # id(root) -> new PreparedNode
        self.removed_inputs: set = set()
        self.deferred = False          # a rewrite waited for static shapes
        self._names = None  # every name in use, when a new one is first needed

    # ------------------------------------------------------------------ queries
    def node(self, name: str, *ops: str):
        """The unclaimed standard-domain node computing name, when its op is one of ops."""
        p = self.producer.get(name) if name else None
        if p is None or p.domain != "" or p.kernel is None or id(p) in self.claimed:
            return None
        if ops and p.op_type not in ops:
            return None
        return p

    def sole(self, name: str) -> bool:
        """Whether name is read by exactly one node and nothing else (no graph output,
        no subgraph reads it)."""
        return self.uses.get(name, 0) == 1

    def uses_of(self, name: str) -> int:
        return self.uses.get(name, 0)

    def consumer(self, name: str):
        """The one node reading name, when exactly one does (and nothing else)."""
        if not self.sole(name):
            return None
        (p,) = self.consumers[name]
        return p if id(p) not in self.claimed and p.domain == "" and p.kernel is not None else None

    def const(self, name: str):
        """The host array of a constant, else None.  Initializers also listed as graph
        inputs count as constants, as in constant folding (PreparedGraph._fold_constants)."""
        if not name:
            return None
        t = self.plan.constants.get(name)
        if t is None or t.__class__ is not Tensor or t.array is None:
            return None
        return t.numpy()

    def const_type(self, name: str) -> int:
        t = self.plan.constants.get(name)
        return int(t.data_type) if t is not None and t.__class__ is Tensor else 0

    def scalar(self, name: str):
        """The float value of a one-element numeric constant, else None."""
        a = self.const(name)
        if a is None or a.size != 1 or a.dtype.kind not in "fiu" and not _is_ml_float(a.dtype):
            return None
        return float(np.asarray(a, dtype=np.float64).reshape(-1)[0])

    def dtype(self, name: str) -> int:
        t = self.plan.constants.get(name)
        if t is not None and t.__class__ is Tensor:
            return int(t.data_type)
        return self.info.dtype(name) if self.info is not None else 0

    def rank(self, name: str):
        a = self.plan.constants.get(name)
        if a is not None and a.__class__ is Tensor and a.array is not None:
            return a.array.ndim
        return self.info.rank(name) if self.info is not None else None

    def shape(self, name: str):
        """The static shape (tuple of ints) or None."""
        a = self.plan.constants.get(name)
        if a is not None and a.__class__ is Tensor and a.array is not None:
            return tuple(a.array.shape)
        return self.info.static_shape(name) if self.info is not None else None

    def attr(self, p, name: str, default=None):
        v = p.attrs.get(name, default)
        return default if v is None else v

    # ------------------------------------------------------------------ changes
    def new_name(self, hint: str) -> str:
        if self._names is None:
            self._names = set(self.producer) | set(self.plan.constants) | self.inputs | set(self.uses)
        name, i = hint, 0
        while name in self._names:
            i += 1
            name = f"{hint}_{i}"
        self._names.add(name)
        return name

    def add_constant(self, hint: str, array: np.ndarray, data_type: int) -> str:
        """A new constant holding array (already of data_type's host dtype)."""
        name = self.new_name(hint)
        self.plan.constants[name] = freeze(self.plan._place(Tensor(np.ascontiguousarray(array), data_type)))
        return name

    def make(self, op_type: str, inputs: list, outputs: list, version: int, name: str,
             domain: str = "", attributes=(), **attrs):
        """A new PreparedNode for op_type at opset version (the kernel registered for it,
        attributes bound from that version's schema); attributes: AttributeProtos to
        copy, attrs: values for helper.make_node."""
        node = oh.make_node(op_type, inputs, outputs, name=name, domain=domain, **attrs)
        node.attribute.extend(attributes)
        return self.plan._prepare_node(node, opset=version)

    def free(self, nodes) -> bool:
        return all(id(p) not in self.claimed for p in nodes)

    def replace(self, nodes: list, new) -> None:
        """Replace nodes (a match; the root is the one latest in the list) by new."""
        root = max(nodes, key=lambda p: self.index[id(p)])
        for p in nodes:
            self.claimed.add(id(p))
            self.removed_inputs.update(n for n in p.inputs if n)
        self.replacements[id(root)] = new

    def commit(self) -> int:
        """Apply the replacements to plan.nodes; returns how many matches were replaced."""
        if not self.replacements:
            return 0
        plan = self.plan
        nodes = []
        for p in plan.nodes:
            new = self.replacements.get(id(p))
            if new is not None:
                nodes.append(new)
            elif id(p) not in self.claimed:
                nodes.append(p)
        plan.nodes = nodes
        # constants only the removed nodes read are dropped (memory held for the session)
        still = set(plan.output_names) | self.inputs
        for p in nodes:
            still.update(p.inputs)
        pinned = {n for n, c in self.uses.items() if c >= _PINNED}
        for n in self.removed_inputs:
            if n in plan.constants and n not in still and n not in pinned:
                del plan.constants[n]
        return len(self.replacements)


def _is_ml_float(dt) -> bool:
    try:
        return dtypes.from_numpy(dt).kind == "float"
    except Exception:  # noqa: BLE001
        return False


def close_to(value: float, exact: float, data_type: int) -> bool:
    """Whether a constant equals exact up to the rounding of its element type (4 ulps
    of the type's epsilon, relative)."""
    if value is None:
        return False
    eps = {int(DataType.FLOAT): 2.0 ** -23, int(DataType.FLOAT16): 2.0 ** -10,
           int(DataType.BFLOAT16): 2.0 ** -7, int(DataType.DOUBLE): 2.0 ** -52}.get(int(data_type), 0.0)
    return abs(value - exact) <= 4 * eps * abs(exact)
