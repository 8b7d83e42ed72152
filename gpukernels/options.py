"""Options of a KernelContext (and so of a Session): one validated, documented dataclass.

``KernelContext(options={...})`` and ``Session(model, options={...})`` take a mapping;
``Options.from_mapping`` checks it once, when the context is made: an unknown key is an
OptionError that suggests the closest known name, and a value of the wrong kind is an
OptionError naming the option, what it accepts and what it got.  Kernels and the runtime
read the checked values as ``ctx.settings.<name>``.
"""

from __future__ import annotations

import difflib
import numbers
from dataclasses import dataclass, field, fields
from typing import Any

from .errors import OptionError

UNSET: Any = None  # an option left out: its documented default applies


def _option(default, doc: str, check=None):
    return field(default=default, metadata={"doc": doc, "check": check})


def _choice(*names):
    def check(value):
        if value not in names:
            return f"one of {', '.join(map(repr, names))}"
        return None
    return check


def _flag(value):
    if isinstance(value, bool) or (isinstance(value, numbers.Integral) and int(value) in (0, 1)):
        return None
    return "True or False"


def _positive_int(value):
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) > 0:
        return None
    return "a positive integer"


def _non_negative_int(value):
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) >= 0:
        return None
    return "a non-negative integer"


def _integer(value):
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return None
    return "an integer"


def _mapping(value):
    return None if isinstance(value, dict) else "a dict"


@dataclass(frozen=True)
class Options:
    """Every option, its default and what it does (``Options.describe()`` lists them)."""

    cuda_kernels: str = _option(
        "auto", "'auto' (default) | 'always' | 'never': use the hand-written CUDA kernels where "
        "they cover the case / insist on them / use the array code only",
        _choice("auto", "always", "never"))
    allow_tf32: bool = _option(False, "False (default): let float32 CUDA kernels use TF32 tensor cores", _flag)
    cuda_sync: bool = _option(False, "False (default): synchronise after every CUDA kernel launch (debugging)",
                              _flag)
    seed: Any = _option(UNSET, "int: seed for random operators without a seed attribute", _integer)
    max_tensor_bytes: Any = _option(
        UNSET, "int or text with a unit ('16GiB'; 0 or 'none': no limit): the largest tensor a kernel "
        "may allocate (see gpukernels.limits; also GPUKERNELS_MAX_TENSOR_BYTES)")
    fold_constants: bool = _option(
        True, "True (default): run nodes whose inputs are all constants once, when the graph is "
        "prepared", _flag)
    compile_graph: bool = _option(
        True, "True (default): run repeated same-shaped Session runs through a compiled plan", _flag)
    optimize: Any = _option(
        UNSET, "True (default unless fold_constants is False) | False | 'all' | list of pass names: "
        "graph optimisations when a graph is prepared -- 'shapes' (Shape/Size of static shapes "
        "folded), 'specialize' (a Session prepares graphs with symbolic input dimensions once more "
        "per input signature), 'conv_bn' (BatchNormalization folded into Conv weights), "
        "'dequantized' (Conv/Gemm/MatMul of DequantizeLinear outputs summed exactly), "
        "'layernorm', 'rmsnorm', 'gelu', 'silu', 'attention' (exporters' spelled-out forms mapped "
        "onto one kernel); 'inplace' (elementwise steps after Conv/Gemm/MatMul written into the "
        "producer's output) only when named or 'all'; see gpukernels.runtime.optimize")
    max_loop_iterations: Any = _option(
        UNSET, "int (default 1,000,000; 0: no limit): the most iterations one Loop may run, so that "
        "a loop whose condition never turns false ends with an error instead of running forever",
        _non_negative_int)
    compile_bodies: bool = _option(True, "True (default): compile Loop/Scan bodies for their input signature",
                                   _flag)
    attention_block_bytes: Any = _option(UNSET, "int: host Attention working-block size (tuning)",
                                         _positive_int)
    linear_attention_mode: str = _option(
        "auto", "'auto' (default) | 'recurrent' | 'chunked': LinearAttention algorithm on the GPU",
        _choice("auto", "recurrent", "chunked"))
    linear_attention_segment_bytes: Any = _option(UNSET, "int: LinearAttention segment size (tuning)",
                                                  _positive_int)
    kernel_overrides: Any = _option(UNSET, "{op_type: kernel class}: swap in another kernel class (testing)",
                                    _mapping)
    paths: Any = _option(
        UNSET, "'auto' (default) | 'reference': use the registered specialisations (host fast paths, "
        "CUDA kernels) where they apply / pin every kernel to its reference implementation (also "
        "GPUKERNELS_PATHS; see gpukernels.kernels.specialize)")

    @classmethod
    def from_mapping(cls, mapping) -> "Options":
        """Options from a dict of name -> value (None values mean 'default'); OptionError
        for an unknown name (with the closest known one) or a value of the wrong kind."""
        if mapping is None:
            return cls()
        if not isinstance(mapping, dict):
            raise OptionError(f"options must be a dict of name -> value, got {type(mapping).__name__}")
        known = {f.name: f for f in fields(cls)}
        for key, value in mapping.items():
            spec = known.get(key)
            if spec is None:
                close = difflib.get_close_matches(str(key), known, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise OptionError(f"unknown option {key!r}{hint} Known options: {', '.join(sorted(known))}")
            check = spec.metadata["check"]
            wanted = check(value) if check is not None and value is not None else None
            if wanted is not None:
                raise OptionError(f"option {key!r} must be {wanted}, got {value!r} ({type(value).__name__})")
        return cls(**{k: v for k, v in mapping.items() if v is not None})

    @classmethod
    def describe(cls) -> dict:
        """{name: what it does} for every option, in declaration order."""
        return {f.name: f.metadata["doc"] for f in fields(cls)}


OPTIONS = Options.describe()
