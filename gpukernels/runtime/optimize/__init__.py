"""Graph optimisations applied when a graph is prepared (option ``optimize``).

``PreparedGraph.__init__`` calls :func:`optimize_graph` after constant folding.  Each
pass rewrites the prepared node list (never the model's protos) and can be switched off
by name; every rewrite keeps the names of the values it computes, so graph outputs, and
the intermediates that survive, keep theirs.

Passes (option ``optimize``: True = every pass but ``inplace``, the default; False = none;
``"all"``; or a list of these names):

``shapes``
    Static shapes are inferred (``onnx.shape_inference`` on a copy of the remaining
    nodes, see :mod:`.shapes`) from what is known for sure: constants, and the graph
    inputs' declared types where the runtime checks every feed against them (a
    Session's top-level graph).  Shape and Size of a value whose shape is fully static
    become constants, and constant folding then computes the shape arithmetic
    downstream (Gather/Slice/Concat/Unsqueeze/Range/Equal/Where...) once.
``specialize``
    Where the inputs' dimensions are symbolic, a Session prepares the graph once more
    per input signature (element types and shapes of the feeds, at most
    ``Specializer.MAX_SIGNATURES``) with those shapes taken as static, so the shape
    arithmetic folds per signature; see :class:`Specializer`.
``conv_bn``
    Conv followed by an inference BatchNormalization: the normalisation is folded into
    the Conv's weights and bias (computed in float64, rounded once); per-channel Mul/Add
    after a BatchNormalization or a Conv folded into it likewise; see :mod:`.conv_bn`.
``dequantized``
    Conv/ConvTranspose/Gemm/MatMul whose operands are DequantizeLinear outputs (QDQ
    models) computed with exact integer sums, scaled and biased the same way on every
    device, so that the QuantizeLinear after them gives the same integers on a CPU and a
    GPU; see :mod:`.dequantized`.
``layernorm`` ``rmsnorm`` ``gelu`` ``silu`` ``attention``
    The exporters' spelled-out forms mapped onto one kernel each: LayerNormalization,
    RMSNormalization, Gelu (erf and tanh forms), Swish (SiLU and x*sigmoid(a*x)),
    Attention; see :mod:`.patterns` for the exact forms and conditions.
``conv_activation``
    An activation after a Conv (Relu, Clip with constant bounds, LeakyRelu, Tanh,
    Sigmoid, HardSigmoid, HardSwish, Swish, Mish) applied as the convolution's epilogue,
    where the host paths write the output (elsewhere in place on the Conv's result), as
    one node; values identical to the bit; see :mod:`.inplace` and
    ``kernels/nn/epilogues.py``.  Measured (whole models, 2x3x96x96, 1 thread, CPU time
    on a shared 2-core host): MobileNetV2 3% faster (Clip), UNet, ResNet18, MobileNetV3,
    EfficientNet-B0 within +-1%, ResNet50 0.5-2% slower (small Relu inputs: the
    separate node costs about what the epilogue's calls do).
``inplace`` (not in the default set)
    Elementwise steps after Conv/ConvTranspose/Gemm/MatMul (bias Add, Mul/Sub/Div by a
    constant, Relu, Neg, Abs) applied in place on the producer's fresh output, as one
    node; values identical to the bit; see :mod:`.inplace`.  Measured no faster on the
    host (NumPy's allocations here are cheap, the steps memory bound either way; again
    with ``conv_activation`` on: ViT 1.6% and ConvNeXt 1.9% slower, BERT within noise),
    and per-operator profiles would show the chain instead of its operators.  With
    ``conv_activation`` too, an activation ends any chain, on every producer.

Default: all passes, unless the option ``fold_constants`` is False (the tools that
observe every original node -- ``gpukernels parity --all-nodes``, ``run --dump`` --
turn folding off, and so optimisations with it), or ``optimize`` says otherwise.
"""

from __future__ import annotations

import copy
import threading

from ...errors import OptionError
from ...tensor import Tensor
from ..graph import install_optimizer

PASSES = ("shapes", "specialize", "conv_bn", "dequantized", "layernorm", "rmsnorm", "gelu", "silu", "attention",
          "conv_activation", "inplace")
# the passes optimize=True (and the default) runs: 'inplace' measured no faster on the
# host and hides operators from per-operator profiles, so it is asked for by name
DEFAULT_PASSES = tuple(p for p in PASSES if p != "inplace")
PATTERN_PASSES = ("layernorm", "rmsnorm", "gelu", "silu", "attention")

_SHAPE_ROUNDS = 4


def enabled_passes(ctx) -> frozenset:
    """The passes the context's options switch on (see the module docstring)."""
    value = ctx.settings.optimize
    if value is None:  # not given: the default passes, unless folding is off
        return frozenset(DEFAULT_PASSES) if ctx.settings.fold_constants else frozenset()
    return parse_option(value)


def parse_option(value) -> frozenset:
    """The set of pass names an ``optimize`` option value names (True: DEFAULT_PASSES,
    'all': every pass)."""
    if value is True:
        return frozenset(DEFAULT_PASSES)
    if value == "all":
        return frozenset(PASSES)
    if value is False or value is None:
        return frozenset()
    if isinstance(value, str):
        names = [v.strip() for v in value.split(",") if v.strip()]
    else:
        try:
            names = list(value)
        except TypeError:
            raise OptionError(f"option optimize must be True, False or a list of pass names "
                              f"({', '.join(PASSES)}); got {value!r}") from None
    unknown = [n for n in names if n not in PASSES]
    if unknown:
        raise OptionError(f"option optimize: unknown pass name(s) {unknown}; known: {', '.join(PASSES)}")
    return frozenset(names)


def optimize_graph(plan, input_types: dict | None = None) -> None:
    """Run the enabled passes on a PreparedGraph (after its constant folding).

    input_types: {input name: (data_type, shape)} taken as the inputs' exact types (a
    per-signature specialisation); None: the declared types, where plan.checked_inputs
    says the runtime checks feeds against them.  Records what each pass did in
    plan.optimized ({pass: count}) and sets plan.deferred when a rewrite waited for
    static shapes (a specialisation per input signature may do it)."""
    plan.optimized = dict(getattr(plan, "optimized", None) or {})
    plan.deferred = False
    passes = enabled_passes(plan.ctx)
    if not passes or plan.graph is None or not plan.nodes:
        return
    from . import shapes
    from .rewrite import View

    info = shapes.infer_types(plan, input_types)
    if "shapes" in passes:
        # folding makes constants that inference can use (a Reshape's computed target, a
        # Where on shapes): infer again while Shape nodes fold, a few rounds at most
        for _ in range(_SHAPE_ROUNDS):
            n = shapes.fold_shapes(plan, info)
            if not n:
                break
            _count(plan, "shapes", n)
            if not plan.ctx.option("fold_constants", True):
                break
            plan._fold_constants()
            info = shapes.infer_types(plan, input_types)
    present = {p.op_type for p in plan.nodes if p.domain == ""}
    if "conv_bn" in passes and present & {"Conv", "BatchNormalization"}:
        from .conv_bn import fold_conv_bn

        _count(plan, "conv_bn", fold_conv_bn(plan, info))
    if "dequantized" in passes and "DequantizeLinear" in present and present & {"Conv", "ConvTranspose",
                                                                                  "Gemm", "MatMul"}:
        from .dequantized import fuse_dequantized

        _count(plan, "dequantized", fuse_dequantized(View(plan, info)))
    if any(p in passes for p in PATTERN_PASSES):
        from . import patterns

        for name in PATTERN_PASSES:  # layernorm before rmsnorm: LN holds an RMS-like core
            if name in passes and _NEEDS[name] <= present and (name != "gelu" or present & {"Erf", "Tanh"}):
                view = View(plan, info)
                _count(plan, name, getattr(patterns, "fuse_" + name)(view))
                plan.deferred = plan.deferred or view.deferred
    steps, activations = "inplace" in passes, "conv_activation" in passes
    if (steps and present & {"Conv", "ConvTranspose", "Gemm", "MatMul"}) or (activations and "Conv" in present):
        from .inplace import apply_inplace

        for name, n in apply_inplace(View(plan, info), steps, activations).items():
            _count(plan, name, n)


# operators a pass's matches always contain (a pass is skipped when one is missing)
_NEEDS = {"layernorm": {"ReduceMean", "Sub", "Sqrt"},
          "rmsnorm": {"ReduceMean", "Sqrt"}, "gelu": {"Mul", "Add"}, "silu": {"Sigmoid", "Mul"},
          "attention": {"Softmax", "MatMul", "Transpose"}}


def _count(plan, name: str, n: int) -> None:
    if n:
        plan.optimized[name] = plan.optimized.get(name, 0) + n


# ----------------------------------------------------------- per-signature preparation


class Specializer:
    """Per-input-signature preparations of a Session's top-level graph (pass
    ``specialize``).

    A graph whose inputs have symbolic dimensions keeps Shape nodes (and what they feed)
    after the ``shapes`` pass.  The first run with a new signature -- the feeds' element
    types and shapes -- prepares a copy of the graph in which those shapes are static:
    the copy shares the prepared nodes (kernels are stateless) and constants, and runs
    the passes again with the inputs' exact types, so shape arithmetic folds and
    shape-dependent rewrites apply.  Later runs with that signature use the copy (with
    its own CompiledGraph).  A copy that removes no node is not kept (the signature maps
    to the generic graph).  At most MAX_SIGNATURES signatures are specialised; runs with
    others, or with non-tensor inputs, use the generic graph."""

    MAX_SIGNATURES = 8

    def __init__(self, plan, compile_graph: bool):
        self.plan = plan
        self.compile_graph = compile_graph
        self.entries: dict = {}
        self._lock = threading.Lock()

    @classmethod
    def for_plan(cls, plan, compile_graph: bool):
        """A Specializer when specialising can help plan (symbolic input dimensions and
        shape nodes left, or rewrites waiting for static shapes), else None."""
        if "specialize" not in enabled_passes(plan.ctx) or plan.graph is None \
                or not getattr(plan, "checked_inputs", False):
            return None
        symbolic = False
        constants = plan.constants
        for name, tp in zip(plan.input_names, plan.input_types):
            if name in constants:
                continue
            if tp.WhichOneof("value") != "tensor_type":
                continue
            tt = tp.tensor_type
            if not tt.HasField("shape") or any(d.WhichOneof("value") != "dim_value" for d in tt.shape.dim):
                symbolic = True
        if not symbolic:
            return None
        shape_nodes = any(p.op_type in ("Shape", "Size") and p.domain == "" for p in plan.nodes)
        if not (shape_nodes or getattr(plan, "deferred", False)):
            return None
        return cls(plan, compile_graph)

    def lookup(self, values: dict):
        """(plan, compiled graph or None) for the feeds (runtime values by name), or None:
        use the generic graph."""
        key = []
        for name in self.plan.input_names:
            v = values.get(name)
            if v is None:
                if name in self.plan.constants:
                    key.append(None)
                    continue
                return None
            if v.__class__ is not Tensor or v.array is None:
                return None
            key.append((int(v.data_type), tuple(v.array.shape)))
        key = tuple(key)
        entry = self.entries.get(key)
        if entry is not None:
            return entry if entry[0] is not self.plan else None
        with self._lock:
            entry = self.entries.get(key)
            if entry is None:
                if len(self.entries) >= self.MAX_SIGNATURES:
                    return None
                entry = self._build(key)
                self.entries[key] = entry
        return entry if entry[0] is not self.plan else None

    def plans(self) -> list:
        """The specialised plans made so far."""
        return [e[0] for e in list(self.entries.values()) if e[0] is not self.plan]

    def _build(self, key):
        generic = self.plan
        types = {name: sig for name, sig in zip(generic.input_names, key) if sig is not None}
        plan = copy.copy(generic)
        plan.nodes = list(generic.nodes)
        plan.constants = dict(generic.constants)
        plan.folded = list(generic.folded)
        plan.optimized = dict(getattr(generic, "optimized", None) or {})
        try:
            optimize_graph(plan, types)
        except OptionError:
            raise
        except Exception:  # noqa: BLE001 -- a failed specialisation only costs speed
            return (generic, None)
        if len(plan.nodes) >= len(generic.nodes):
            return (generic, None)
        plan._finish()
        compiled = None
        if self.compile_graph:
            from ..body import CompiledGraph

            compiled = CompiledGraph(plan)
        return (plan, compiled)


install_optimizer(optimize_graph)
