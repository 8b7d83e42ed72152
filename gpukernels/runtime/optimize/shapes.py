"""Static types and shapes of a prepared graph's values, and Shape/Size folding.

``infer_types`` runs ``onnx.shape_inference.infer_shapes`` (data propagation on, strict
mode off) on a model built from the prepared graph's remaining nodes, and trusts only
what it builds from facts:

* constants (initializers and folded values) with their real shapes, the small integer
  ones with their values (so Reshape targets and the like propagate);
* graph inputs with their declared types when ``plan.checked_inputs`` (a Session
  checks every feed's element type, rank and fixed dimensions against them), or the
  exact types of a specialisation (input_types); otherwise element types only;
* none of the model's ``value_info`` or declared output shapes (an untrusted model
  could declare anything there): outputs are declared untyped;
* nodes that inference cannot see into -- subgraph holders (If/Loop/Scan: their bodies'
  declared output shapes are the model's word too), model-local function calls, nodes
  without a kernel -- are replaced by opaque nodes of an unknown domain, so their
  outputs are unknown.

Inference is bounded: graphs of more than MAX_NODES nodes are not inferred, and any
failure of the inference leaves the types unknown (every pass then does less).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper as oh

from ...tensor import Tensor
from ..graph import freeze

MAX_NODES = 200_000
# integer constants with at most this many elements go to inference with their values
_VALUE_ELEMENTS = 4096
_OPAQUE = "gpukernels.opaque"


class TypeInfo(dict):
    """{value name: (data_type or 0, dims or None)}, dims a tuple of int (static) or None
    (unknown/symbolic) per axis."""

    def dtype(self, name: str) -> int:
        v = self.get(name)
        return v[0] if v is not None else 0

    def rank(self, name: str):
        v = self.get(name)
        return len(v[1]) if v is not None and v[1] is not None else None

    def dims(self, name: str):
        v = self.get(name)
        return v[1] if v is not None else None

    def static_shape(self, name: str):
        """The shape as a tuple of ints when every dimension is known, else None."""
        d = self.dims(name)
        if d is None or any(x is None for x in d):
            return None
        return d


def _tensor_type(data_type: int, shape) -> onnx.TypeProto:
    return oh.make_tensor_type_proto(int(data_type), None if shape is None else [int(d) for d in shape])


def infer_types(plan, input_types: dict | None = None) -> TypeInfo:
    """The static types of plan's values (see the module docstring)."""
    info = TypeInfo()
    constants = plan.constants
    for name, t in constants.items():
        if t.__class__ is Tensor and t.array is not None:
            info[name] = (int(t.data_type), tuple(int(d) for d in t.array.shape))
    if len(plan.nodes) > MAX_NODES:
        return info
    known = TypeInfo(info)
    try:
        return _infer(plan, input_types, info)
    except Exception:  # noqa: BLE001 -- names protobuf refuses (not UTF-8) and the like:
        return known   # inference is an optimisation, never a requirement


def _infer(plan, input_types, info: TypeInfo) -> TypeInfo:
    constants = plan.constants
    checked = getattr(plan, "checked_inputs", False)
    inputs, initializers, declared = [], [], set()
    typed = set()  # names inference sees with a tensor type
    for name, tp in zip(plan.input_names, plan.input_types):
        if name in constants:
            continue
        declared.add(name)
        if input_types is not None and name in input_types:
            data_type, shape = input_types[name]
            inputs.append(oh.make_value_info(name, _tensor_type(data_type, shape)))
            info[name] = (int(data_type), tuple(int(d) for d in shape))
            typed.add(name)
            continue
        t = _declared_tensor_type(tp, keep_shape=checked)
        if t is None:
            continue  # not a plain tensor of a known type: its readers stay opaque
        inputs.append(oh.make_value_info(name, t))
        info[name] = _from_tensor_type(t.tensor_type)
        typed.add(name)
    for name, t in constants.items():
        if t.__class__ is not Tensor or t.array is None or name in declared:
            continue
        typed.add(name)
        kind = t.array.dtype.kind
        if kind in "iu" and t.array.size <= _VALUE_ELEMENTS:
            try:
                initializers.append(onnx.numpy_helper.from_array(np.asarray(t.numpy()), name))
                continue
            except Exception:  # noqa: BLE001 -- then by type only
                pass
        inputs.append(oh.make_value_info(name, _tensor_type(t.data_type, t.array.shape)))
    opsets = dict(plan.ctx.opset)
    opsets.setdefault("", onnx.defs.onnx_opset_version())
    candidates = []
    for k, p in enumerate(plan.nodes):
        if p.kernel is None or p.function is not None or p.needs_scope:
            candidates.append((None, p.outputs))
        elif hasattr(p.kernel, "inference_nodes"):
            candidates.extend((n, n.output) for n in p.kernel.inference_nodes())  # what it replaced
        elif p.domain == "" and p.since_version is not None and p.since_version > opsets[""]:
            candidates.extend((n, n.output) for n in _stand_in_nodes(p, k))  # fused, newer than the model
        else:
            candidates.append((p.node, p.outputs))
    nodes = _vetted(candidates, typed, opsets)
    if not nodes:
        return info
    outputs = [oh.make_value_info(n, onnx.TypeProto()) for n in plan.output_names]
    opsets[_OPAQUE] = 1
    try:
        graph = oh.make_graph(nodes, "inference", inputs, outputs, initializers)
        model = oh.make_model(graph, opset_imports=[oh.make_opsetid(d, v) for d, v in opsets.items()])
        inferred = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False,
                                                     data_prop=True)
    except Exception:  # noqa: BLE001 -- inference is an optimisation, never a requirement
        return info
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
        if vi.name in info or vi.type.WhichOneof("value") != "tensor_type":
            continue
        info[vi.name] = _from_tensor_type(vi.type.tensor_type)
    return info


# Operators whose outputs inference is given: common standard operators, each node also
# passing onnx.checker.check_node, with every input typed (a graph input of a known
# tensor type, a constant, or an output of an earlier vetted node).  Everything else --
# other operators, nodes reading values defined later or nowhere (a graph whose nodes are
# out of order), values of unknown or non-tensor types -- becomes an opaque node whose
# outputs are unknown.  (onnx's inference functions are C++ and some dereference the type
# of an input they were not given: a crash, not an exception.  The fuzzer of
# tests/safety found such models; vetting keeps them away from inference.)
_INFER_OPS = frozenset("""
Abs Acos Acosh Add And ArgMax ArgMin Asin Asinh Atan Atanh Attention AveragePool BatchNormalization
BitShift Cast CastLike Ceil Celu Clip Concat Constant ConstantOfShape Conv ConvTranspose Cos Cosh CumSum
DepthToSpace Div Dropout Einsum Elu Equal Erf Exp Expand EyeLike Flatten Floor Gather GatherElements
GatherND Gelu Gemm GlobalAveragePool GlobalMaxPool Greater GreaterOrEqual GroupNormalization HardSigmoid
HardSwish Identity InstanceNormalization IsInf IsNaN LayerNormalization LeakyRelu Less LessOrEqual Log
LogSoftmax LRN MatMul Max MaxPool Mean Min Mish Mod Mul Neg NonZero Not OneHot Or Pad Pow PRelu Range
Reciprocal ReduceL1 ReduceL2 ReduceLogSumExp ReduceMax ReduceMean ReduceMin ReduceProd ReduceSum
ReduceSumSquare Relu Reshape Resize RMSNormalization Round ScatterElements ScatterND Selu Shape Sigmoid
Sign Sin Sinh Size Slice Softmax Softplus Softsign SpaceToDepth Split Sqrt Squeeze Sub Sum Swish Tan Tanh
Tile TopK Transpose Trilu Unsqueeze Where Xor
""".split())

_KNOWN_TYPES = frozenset(int(v) for v in onnx.TensorProto.DataType.values() if v)
_MAX_DIM = (1 << 31) - 1


def _declared_tensor_type(tp, keep_shape: bool):
    """A clean copy of a declared tensor type (a known element type; dimensions outside
    [0, 2**31) or unchecked ones left unknown), or None for anything else."""
    if tp.WhichOneof("value") != "tensor_type" or tp.tensor_type.elem_type not in _KNOWN_TYPES:
        return None
    dims = None
    if keep_shape and tp.tensor_type.HasField("shape"):
        dims = [int(d.dim_value) if d.WhichOneof("value") == "dim_value" and 0 <= d.dim_value <= _MAX_DIM
                else None for d in tp.tensor_type.shape.dim]
    t = oh.make_tensor_type_proto(int(tp.tensor_type.elem_type), None)
    if dims is not None:
        t = oh.make_tensor_type_proto(int(tp.tensor_type.elem_type), dims)
    return t


def _vetted(candidates, typed: set, opsets: dict) -> list:
    """The nodes inference may see (see _INFER_OPS); the others as opaque nodes."""
    ctx = onnx.checker.C.CheckerContext()
    ctx.ir_version = onnx.IR_VERSION
    ctx.opset_imports = {d: v for d, v in opsets.items()}
    nodes = []
    for node, outputs in candidates:
        ok = (node is not None and node.domain in ("", "ai.onnx") and node.op_type in _INFER_OPS
              and all(n in typed for n in node.input if n))
        if ok:
            try:
                onnx.checker.check_node(node, ctx)
            except Exception:  # noqa: BLE001 -- a malformed node: opaque
                ok = False
        if ok:
            nodes.append(node)
            typed.update(o for o in outputs if o)
        else:
            nodes.append(oh.make_node("Opaque", [], [o for o in outputs if o], domain=_OPAQUE))
    return nodes


def _stand_in_nodes(p, k: int) -> list:
    """Nodes of the model's opset computing outputs of p's type and shape, for a node an
    optimisation made at a newer opset than the model's (inference would not know it)."""
    out = p.outputs[0] if p.outputs else ""
    if p.op_type in ("LayerNormalization", "RMSNormalization", "Gelu", "Swish") and len(p.outputs) == 1:
        return [oh.make_node("Identity", [p.inputs[0]], [out])]
    if p.op_type == "Attention" and len(p.outputs) == 1 and len(p.inputs) >= 3:
        kt, s, w = (f"__gpukernels_inference_{k}_{i}" for i in range(3))
        return [oh.make_node("Transpose", [p.inputs[1]], [kt], perm=[0, 1, 3, 2]),
                oh.make_node("MatMul", [p.inputs[0], kt], [s]),
                oh.make_node("Softmax", [s], [w], axis=-1),
                oh.make_node("MatMul", [w, p.inputs[2]], [out])]
    return [oh.make_node("Opaque", p.inputs, p.outputs, domain=_OPAQUE)]


def _from_tensor_type(tt) -> tuple:
    if not tt.HasField("shape"):
        return (int(tt.elem_type), None)
    dims = tuple(int(d.dim_value) if d.WhichOneof("value") == "dim_value" and d.dim_value >= 0 else None
                 for d in tt.shape.dim)
    return (int(tt.elem_type), dims)


def fold_shapes(plan, info: TypeInfo) -> int:
    """Shape and Size nodes of values with static shapes become constants (their
    outputs join plan.constants, the nodes move to plan.folded).  Graph outputs stay
    computed per run, as in constant folding.  Returns the number folded."""
    from ...kernels.base import lookup

    outputs = set(plan.output_names)
    kept, n = [], 0
    classes = {}
    for op in ("Shape", "Size"):
        try:
            classes[op] = lookup(op, "")[0]
        except Exception:  # noqa: BLE001
            pass
    for p in plan.nodes:
        value = None
        if (p.op_type in classes and p.domain == "" and type(p.kernel) is classes[p.op_type]
                and len(p.inputs) == 1 and p.inputs[0] and len(p.outputs) == 1
                and p.outputs[0] and p.outputs[0] not in outputs):
            shape = info.static_shape(p.inputs[0])
            if shape is not None:
                if p.op_type == "Size":
                    value = np.array(int(np.prod(shape, dtype=np.int64)), np.int64)
                else:
                    start = p.attrs.get("start", 0) or 0
                    end = p.attrs.get("end")
                    value = np.array(list(shape)[int(start):None if end is None else int(end)], np.int64)
        if value is None:
            kept.append(p)
            continue
        plan.constants[p.outputs[0]] = freeze(plan._place(Tensor(value)))
        plan.folded.append(p)
        n += 1
    plan.nodes = kept
    return n
