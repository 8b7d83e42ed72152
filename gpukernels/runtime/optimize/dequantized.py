"""Products of dequantized values computed in exact arithmetic (pass ``dequantized``).

A QDQ model (onnxruntime's quantizer, TensorRT-style exports) spells an integer
convolution as float operators between DequantizeLinear and QuantizeLinear:

    x = DequantizeLinear(xq, sx, zx)             (xq: the activations, uint8/int8/...)
    w = DequantizeLinear(wq, sw, zw)             (constant: folded when the graph is prepared)
    y = Conv(x, w, b)  ->  QuantizeLinear(y, ...)

Run as written, the Conv sums float32 products in whatever order its path takes (a host
GEMM, the CUDA kernel, another BLAS), and a one-ulp difference at a rounding boundary
becomes one quantization step in the QuantizeLinear that follows -- so a CPU and a GPU,
or two paths on one device, disagree on the integers.  This pass computes such products
the way their numbers allow: with ``xi = xq - zx`` and ``wi = wq - zw`` (integers),

    y[m] = (sum over k of xi[k] * wi[m, k]) * (sx * sw[m]) + b[m]

where the sum is exact: it runs through the operator's own kernel on ``xi`` and ``wi``
held as float32 when every partial sum stays below 2**24 in magnitude (checked when the
graph is prepared from the weights and the range of xq's type: then every addition is
exact, in any order and with fused multiply-adds, and every operand fits the 11
significant bits of a GPU's TF32 tensor cores), else as float64 (exact below 2**53).
The scaling and the bias add are elementwise and rounded the same way on every device:
float32 ``acc * s + b`` with ``s = float32(float64(sx) * float64(sw[m]))`` after a
float32 sum, float64 then one rounding to float32 after a float64 sum.  The result
differs from the float32 evaluation of the written graph only by that evaluation's own
rounding (it is the value the written graph approximates); it is the same bits on every
device and path.  onnxruntime fuses the same groups into integer kernels.

Matched (all conditions checked; anything else is left as it is):

- Conv / ConvTranspose with X = DequantizeLinear of a dynamic 8- or 16-bit integer
  tensor with constant per-tensor scale and zero point, W a constant computed by a
  folded DequantizeLinear (per tensor, or per output channel: axis 0 for Conv, axis 1
  for ConvTranspose), B absent or a float32 constant;
- Gemm with A like X above, B like W (per tensor, or per output column), C absent or a
  float32 constant;
- MatMul with A like X above and B like W (rank 2, per tensor or per column), or with
  both operands like X (per tensor; the exact-sum check then uses the inner dimension
  of each call).

The output is float32 (the DequantizeLinear outputs are float32).  A call whose inputs are
not of the checked types (a subgraph whose inputs nobody checks), or that fails, runs the
original DequantizeLinear and operator kernels instead, so results and errors are then
exactly theirs.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper as oh

from ...dtypes import DataType
from ...kernels.base import KernelBase
from ...kernels.quant._common import INTEGER_RANGES
from ...tensor import Tensor
from ..body import _hook_trusted
from ..graph import PreparedNode
from .rewrite import View

DOMAIN = "com.gpukernels"
PRODUCTS = ("Conv", "ConvTranspose", "Gemm", "MatMul")
FLOAT = int(DataType.FLOAT)
# activation (dynamic) types: stored natively on both devices
_DYNAMIC_TYPES = {int(t) for t in (DataType.UINT8, DataType.INT8, DataType.UINT16, DataType.INT16)}
_CONSTANT_TYPES = _DYNAMIC_TYPES | {int(DataType.UINT4), int(DataType.INT4)}
_FLOAT32_EXACT = 1 << 24  # every integer of magnitude up to 2**24 is a float32
# operands of larger magnitude would not survive a GPU's TF32 tensor cores (11 significant
# bits) when the option allow_tf32 lets float32 products use them: float64 then
_TF32_EXACT = 1 << 11


def fuse_dequantized(view: View) -> int:
    folded = {o: p for p in view.plan.folded for o in p.outputs if o}
    for p in list(view.plan.nodes):
        if p.op_type in PRODUCTS and p.domain == "" and p.kernel is not None and id(p) not in view.claimed \
                and len(p.outputs) == 1 and p.outputs[0] and view.dtype(p.outputs[0]) in (FLOAT, 0):
            _try(view, p, folded)
    return view.commit()


# ----------------------------------------------------------------------- operands


class _Dynamic:
    """A DequantizeLinear of a dynamic integer tensor with constant per-tensor scale and
    zero point."""

    def __init__(self, node, data_type: int, scale: float, zero: int):
        self.node = node
        self.data_type = data_type
        self.scale = scale
        self.zero = zero
        lo, hi = INTEGER_RANGES[data_type]
        self.magnitude = max(abs(lo - zero), abs(hi - zero))  # largest |xq - zx|


def _dynamic(view: View, name: str):
    dq = view.node(name, "DequantizeLinear")
    if dq is None or len(dq.inputs) < 2 or not dq.inputs[0]:
        return None
    if int(view.attr(dq, "block_size", 0)) or int(view.attr(dq, "output_dtype", 0)) not in (0, FLOAT):
        return None
    scale = view.const(dq.inputs[1])  # its type is the output's (no output_dtype): float32
    if scale is None or scale.size != 1 or view.const_type(dq.inputs[1]) != FLOAT:
        return None
    zname = dq.inputs[2] if len(dq.inputs) > 2 else ""
    if zname:
        zero = view.const(zname)
        if zero is None or zero.size != 1:
            return None
        data_type = view.const_type(zname)
        zero = int(np.asarray(zero).reshape(-1)[0])
    else:
        data_type, zero = view.dtype(dq.inputs[0]), 0
    if data_type not in _DYNAMIC_TYPES or view.dtype(dq.inputs[0]) not in (data_type, 0):
        return None
    return _Dynamic(dq, data_type, float(np.asarray(scale, dtype=np.float64).reshape(-1)[0]), zero)


def _constant(view: View, name: str, folded: dict, axis: int):
    """(wi: int64 array of wq - zw, scale: float64 vector along axis, the folded
    DequantizeLinear) for a constant computed by a folded per-tensor or per-`axis`
    DequantizeLinear of constants, else None."""
    dq = folded.get(name)
    if dq is None or dq.op_type != "DequantizeLinear" or dq.domain != "" or len(dq.inputs) < 2 \
            or name not in view.plan.constants or view.const_type(name) != FLOAT:
        return None
    if int(view.attr(dq, "block_size", 0)) or int(view.attr(dq, "output_dtype", 0)) not in (0, FLOAT):
        return None
    wq, scale = view.const(dq.inputs[0]), view.const(dq.inputs[1])
    zname = dq.inputs[2] if len(dq.inputs) > 2 else ""
    zero = view.const(zname) if zname else None
    if wq is None or scale is None or (zname and zero is None) or view.const_type(dq.inputs[1]) != FLOAT \
            or view.const_type(dq.inputs[0]) not in _CONSTANT_TYPES or wq.ndim <= axis:
        return None
    scale = np.asarray(scale, dtype=np.float64)
    zero = np.zeros(1, np.int64) if zero is None else np.asarray(zero).astype(np.int64)
    size = wq.shape[axis]
    if scale.size == 1 and zero.size == 1:
        scale, zero = np.full(size, scale.reshape(-1)[0]), np.full(size, zero.reshape(-1)[0])
    else:
        dq_axis = int(view.attr(dq, "axis", 1))
        if scale.ndim != 1 or scale.shape != (size,) or zero.shape != (size,) \
                or dq_axis % wq.ndim != axis:
            return None
    shape = [1] * wq.ndim
    shape[axis] = size
    wi = np.asarray(wq).astype(np.int64) - zero.reshape(shape)
    return wi, scale, dq


def _float_constant(view: View, name: str):
    if not name:
        return None, True
    c = view.const(name)
    if c is None or view.const_type(name) != FLOAT:
        return None, False
    return np.asarray(c, dtype=np.float64), True


# ----------------------------------------------------------------------- matching


def _try(view: View, p, folded) -> bool:
    op = p.op_type
    x = _dynamic(view, p.inputs[0]) if p.inputs and p.inputs[0] else None
    if x is None or len(p.inputs) < 2 or not p.inputs[1]:
        return False
    attrs = dict(p.attrs)
    if op == "MatMul":
        y = _dynamic(view, p.inputs[1])
        if y is not None:
            if y.node is x.node:
                return False
            return _replace(view, p, [x, y], None, None, None, None, attrs)
        found = _constant(view, p.inputs[1], folded, 1)
        if found is None or found[0].ndim != 2:
            return False
        wi, scale, dq = found
        bound = x.magnitude * int(np.abs(wi).sum(axis=0).max(initial=0))
        return _replace(view, p, [x], (wi, dq), scale, None, bound, attrs)
    if op == "Gemm":
        trans_b = int(attrs.get("transB", 0) or 0)
        found = _constant(view, p.inputs[1], folded, 0 if trans_b else 1)
        if found is None or found[0].ndim != 2:
            return False
        wi, scale, dq = found
        bias, ok = _float_constant(view, p.inputs[2] if len(p.inputs) > 2 else "")
        if not ok:
            return False
        alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
        bound = x.magnitude * int(np.abs(wi).sum(axis=1 if trans_b else 0).max(initial=0))
        attrs["alpha"], attrs["beta"] = 1.0, 1.0
        return _replace(view, p, [x], (wi, dq), scale * alpha,
                        None if bias is None else (bias * beta, p.inputs[2]), bound, attrs)
    # Conv / ConvTranspose: output channels along axis 0 / 1 of W
    axis = 0 if op == "Conv" else 1
    found = _constant(view, p.inputs[1], folded, axis)
    if found is None or found[0].ndim < 3:
        return False
    wi, scale, dq = found
    bias, ok = _float_constant(view, p.inputs[2] if len(p.inputs) > 2 else "")
    if not ok:
        return False
    others = tuple(i for i in range(wi.ndim) if i != axis)
    bound = x.magnitude * int(np.abs(wi).sum(axis=others).max(initial=0))
    group = int(attrs.get("group", 1) or 1)
    if op == "ConvTranspose" and group > 1:
        scale = np.tile(scale, group)  # output channel g * (M / group) + j has W's channel j
    rank = wi.ndim
    if bias is not None:
        bias = (bias.reshape((-1,) + (1,) * (rank - 2)), p.inputs[2])
    scale = scale.reshape((-1,) + (1,) * (rank - 2))
    return _replace(view, p, [x], (wi, dq), scale, bias, bound, attrs)


def _replace(view: View, p, dynamic, weight, scale, bias, bound, attrs) -> bool:
    plan = view.plan
    out = p.outputs[0]
    wide = bound is not None and (bound >= _FLOAT32_EXACT or dynamic[0].magnitude > _TF32_EXACT
                                  or (weight is not None and int(np.abs(weight[0]).max(initial=0)) > _TF32_EXACT))
    acc = np.float64 if wide else np.float32
    inputs = [d.node.inputs[0] for d in dynamic]
    weight64 = None
    if weight is not None:
        wi = weight[0]
        # held as float32 (exact: |wi| < 2**16) for shape inference; float64 copy when wide
        inputs.append(view.add_constant(f"{out}__wi", wi.astype(np.float32), FLOAT))
        if wide:
            weight64 = plan._place(Tensor(wi.astype(np.float64), int(DataType.DOUBLE)))
    scales = None
    if scale is not None:  # s = sx * sw per output channel (Gemm: times alpha), in float64
        scale = np.asarray(scale, np.float64) * dynamic[0].scale
        scales = (plan._place(Tensor(scale.astype(np.float32), FLOAT)),
                  plan._place(Tensor(scale, int(DataType.DOUBLE))))
    biases = None
    if bias is not None:
        biases = (plan._place(Tensor(bias[0].astype(np.float32), FLOAT)),
                  plan._place(Tensor(bias[0], int(DataType.DOUBLE))))
    node = oh.make_node(f"Dequantized{p.op_type}", inputs, [out], name=f"{p.name}+dequantized", domain=DOMAIN)
    fused = PreparedNode(node)
    # what the original kernels read, kept for calls that run them (see _separately)
    kept = [n for d in dynamic for n in d.node.inputs[1:] if n]
    if weight is not None:
        kept += [n for n in weight[1].inputs if n]
    if bias is not None:
        kept.append(bias[1])
    fallback = {n: plan.constants[n] for n in kept}
    fused.kernel = DequantizedProduct(
        plan.ctx, p, dynamic, acc, scales, biases, weight64, attrs,
        weight_dq=None if weight is None else weight[1], bias_name=None if bias is None else bias[1],
        fallback=fallback, inference=_inference_nodes(view, p, dynamic, inputs))
    fused.since_version = 1
    fused.attrs = {}
    fused.simple = all(fused.inputs)
    # the activations' DequantizeLinear goes too when nothing else reads its output
    claimed = [d.node for d in dynamic if view.sole(d.node.outputs[0])]
    view.replace(claimed + [p], fused)
    return True


def _inference_nodes(view: View, p, dynamic, inputs) -> list:
    """Stand-ins for shape inference: the original product reading the integers as
    float32 (a Cast) and, for W, the float32 integer constant (same shape)."""
    nodes, names = [], []
    for d, q in zip(dynamic, inputs):
        name = view.new_name(f"{q}__as_float")
        nodes.append(oh.make_node("Cast", [q], [name], to=FLOAT))
        names.append(name)
    names += inputs[len(dynamic):]
    original = onnx.NodeProto.FromString(p.node.SerializeToString())
    del original.input[:]
    original.input.extend(names)  # bias left out: it does not change the output's type
    nodes.append(original)
    return nodes


# ----------------------------------------------------------------------- the kernel


class DequantizedProduct(KernelBase):
    """Conv/ConvTranspose/Gemm/MatMul of dequantized operands, summed exactly (see the
    module docstring).  Built by the optimisation only: not in the registry."""

    op_type = "DequantizedProduct"
    domain = DOMAIN
    versions = (1,)
    foldable = False

    def __init__(self, ctx, product, dynamic, acc, scales, biases, weight64, attrs, weight_dq, bias_name,
                 fallback, inference):
        super().__init__(ctx, 1)
        self.op_type = f"Dequantized{product.op_type}"
        self.product = product.kernel          # the operator's kernel, run on the integers
        self.product_attrs = attrs             # its attributes (Gemm: alpha = beta = 1)
        self.original_attrs = product.attrs
        self.dynamic = tuple(dynamic)          # _Dynamic operands, in input order
        self.acc = np.dtype(acc)               # float32 or float64 sums (exact)
        self.scales = scales                   # (float32, float64) Tensors, None: both dynamic
        self.biases = biases                   # (float32, float64) Tensors or None
        self.weight64 = weight64               # float64 copy of the integer weights (wide sums)
        self.weight_dq = weight_dq             # the folded DequantizeLinear of the weights
        self.bias_name = bias_name             # the original float bias constant's name
        self.fallback = fallback               # {name: Tensor} the original kernels read
        self._inference = inference

    def inference_nodes(self) -> list:
        return [onnx.NodeProto.FromString(n.SerializeToString()) for n in self._inference]

    def __call__(self, *args):
        n = len(self.dynamic)
        quantized, weight = args[:n], args[n:]
        if any(q.__class__ is not Tensor or int(q.data_type) != d.data_type for q, d in zip(quantized, self.dynamic)):
            return self._separately(quantized)
        try:
            return Tensor.wrap(self._exact(quantized, weight), FLOAT)
        except Exception:  # noqa: BLE001 -- the original kernels give their own result or error
            return self._separately(quantized)

    def _integers(self, q, d: _Dynamic, acc):
        """xq - zx (q: xq's array) in acc, exactly, into a new array: one pass, the
        conversion inside the subtraction (the dynamic types are stored natively on both
        devices)."""
        if d.zero:
            return self.xp.subtract(q, acc.type(d.zero), dtype=acc)
        return q.astype(acc)

    def array_function(self, inputs, attrs):
        """Compiled graphs, for constant scales: the steps of _exact around the product
        kernel's own array function, planned once for these shapes (a Conv then skips its
        per-call checks and path choice: mobilenet_v2 qdq, 52 convolutions); None where
        the product has none, or for two dynamic operands (their sum's type depends on
        each call's inner dimension)."""
        n = len(self.dynamic)
        if not _hook_trusted(type(self.product)):
            return None  # a swapped-in product kernel (kernel_overrides) is always called
        if self.scales is None or len(inputs) != n + (1 if self.weight_dq is not None else 0) or any(
                q.__class__ is not Tensor or int(q.data_type) != d.data_type
                for q, d in zip(inputs[:n], self.dynamic)):
            return None
        acc = self.acc
        wide = acc != np.float32
        sum_type = int(DataType.DOUBLE if wide else DataType.FLOAT)
        operands = [Tensor.wrap(self._integers(q.array, d, acc), sum_type) for q, d in zip(inputs, self.dynamic)]
        if self.weight_dq is not None:
            operands.append(self.weight64 if wide else inputs[n])
        product = self.product.array_function(operands, dict(self.product_attrs))
        if product is None:
            return None
        dynamic, integers, scaled = self.dynamic, self._integers, self._scaled
        weight64 = self.weight64.array if wide and self.weight_dq is not None else None

        def run(*arrays):
            ints = [integers(q, d, acc) for q, d in zip(arrays, dynamic)]
            if len(arrays) > n:
                ints.append(weight64 if wide else arrays[n])
            return scaled(product(*ints), acc)

        return run

    def _exact(self, quantized, weight):
        acc = self.acc
        if self.scales is None:  # both operands dynamic: the inner dimension decides
            a, b = self.dynamic
            k = quantized[0].array.shape[-1] if quantized[0].array.ndim else 1
            if a.magnitude * b.magnitude * k >= _FLOAT32_EXACT or max(a.magnitude, b.magnitude) > _TF32_EXACT:
                acc = np.dtype(np.float64)
        operands = [Tensor.wrap(self._integers(q.array, d, acc), int(DataType.FLOAT if acc == np.float32
                                                                        else DataType.DOUBLE))
                    for q, d in zip(quantized, self.dynamic)]
        if weight:
            operands.append(weight[0] if acc == np.float32 else self.weight64)
        result = self.product(*operands, **self.product_attrs)
        y = result.array if result.__class__ is Tensor else result[0].array
        if self.scales is None:
            if not y.flags.writeable:
                y = y.copy()
            s = self.dynamic[0].scale * self.dynamic[1].scale
            if acc == np.float32:
                y *= np.float32(s)
                return y
            return (y * s).astype(np.float32)
        return self._scaled(y, acc)

    def _scaled(self, y, acc):
        """The exact sums y (acc) scaled per output channel, the bias added, as float32
        (constant scales); y is modified in place when writeable."""
        xp = self.xp
        if not y.flags.writeable:
            y = y.copy()
        index = 0 if acc == np.float32 else 1
        xp.multiply(y, self.scales[index].array, out=y)
        if self.biases is not None:
            xp.add(y, self.biases[index].array, out=y)
        return y if acc == np.float32 else y.astype(np.float32)

    def _separately(self, quantized):
        """The original DequantizeLinear and operator kernels (their results and errors)."""
        kept = self.fallback

        def dequantize(dq, first):
            return dq.kernel(*([first] if first is not None else []),
                             *[kept[n] if n else None for n in dq.inputs[1 if first is not None else 0:]],
                             **dq.attrs)

        floats = [dequantize(d.node, q) for q, d in zip(quantized, self.dynamic)]
        if self.weight_dq is not None:
            floats.append(dequantize(self.weight_dq, None))
        if self.bias_name is not None:
            floats.append(kept[self.bias_name])
        return self.product(*floats, **self.original_attrs)
