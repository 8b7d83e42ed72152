"""A bounded, seeded fuzzer (issue 13): mutated models and inputs through ``Session``
and the ``gpukernels`` CLI end in a result or a clear error, never in a crash, a hang,
a memory blowup or an unclear exception.

How it works
------------
* ``seed_models()`` builds a handful of small valid models with onnx.helper: an
  elementwise chain, Conv+Relu+pooling, MatMul+Softmax+Gemm, Reshape/Slice/Gather/Concat
  shape arithmetic, If/Loop/Scan bodies reading outer values, string operators, sequence
  operators, indexing operators and a model-local function.
* ``make_case(seed, i)`` picks one of them and applies 0-3 structural mutations
  (``MUTATIONS``: attribute values and types, dims, element types, node and graph
  inputs/outputs, op types and domains, opset versions, initializer data (truncated
  raw_data, both data fields, external references), sparse initializers with bad indices,
  deep If nesting, recursive model-local functions, node order), sometimes byte-level
  damage of the serialized model, and chooses the feeds: matching ones, mutated ones
  (wrong dtype/rank/dims, empty tensors, NaN/inf, extreme integers, non-arrays, missing
  or unknown names) or ``gpukernels.inputs.random_inputs`` (which must refuse declared
  dims such as 2**40).  Case i of a seed is the same on every machine: it depends only
  on (seed, i).
* ``run_case`` loads the bytes with ``Session(bytes, options={"max_tensor_bytes": 64 MiB})``
  and runs it twice (the second run goes through the compiled plan).

What is accepted (``judge``)
----------------------------
A case passes when the session runs, or when it raises a ``GpuKernelsError`` whose
message is *clear*:

* non-empty, and naming what it is about: a name or op type taken from the (mutated)
  model or the feeds (quoted, or verbatim when at least 4 characters long), or one of
  the whole-model subjects in ``WHOLE_MODEL_WORDS`` (the file is "not an ONNX model", an
  "opset", "max_tensor_bytes", a "graph"...);
* not a NodeError (the runtime's wrapper of a kernel failure, which names the node, its
  op type and its inputs' shapes and dtypes) around an exception that only a programming
  error raises (``BUG_TYPES``: AttributeError, NameError, KeyError, AssertionError,
  ZeroDivisionError, SystemError) -- a wrapped NumPy ``IndexError``/``ValueError`` says
  what went wrong and is accepted, a wrapped ``'NoneType' object has no attribute`` is
  not (deliberate wrappers such as "tensor 'w' cannot be decoded: KeyError: 99" are
  fine);
* with no RecursionError or MemoryError anywhere in its ``__cause__``/``__context__``
  chain (unbounded recursion or allocation, wrapped or not).

Anything else fails: another exception type escaping (IndexError, KeyError,
RecursionError, MemoryError, a protobuf or NumPy error without a gpukernels wrapper),
a crash, a case running past ``CASE_TIMEOUT`` seconds (a hang) or allocating past the
child's address-space limit (a memory blowup, seen as MemoryError).  One kind of long run is the model's own
doing and is counted apart ("long loop"), not failed: a Loop, stopped inside the Loop
kernel by the watchdog, whose trip count is absent or a constant of at least 2**16 and
whose body has no scan outputs (scan outputs count against max_tensor_bytes, so a huge
trip count with them must be refused, and a hang there is a failure): gpukernels
bounds memory, not the time a model asks for (DESIGN.md, "Untrusted models").

The loop runs in a child process (``python this_file.py worker ...``) with a global
deadline (``GPUKERNELS_FUZZ_SECONDS``, default 20 s) and a per-case watchdog
(``faulthandler.dump_traceback_later(CASE_TIMEOUT, exit=True)``, so a hang leaves its
traceback); the parent restarts it after the case that hung or crashed.  Every failure
is reported with its seed, case number, mutations and exception; reproduce one with

    .venv/bin/python tests/safety/test_fuzz_models.py repro SEED CASE

(which prints the case and lets the exception propagate with its traceback);
``... fuzz SEED SECONDS`` runs the loop alone and prints every failure.
``GPUKERNELS_FUZZ_SEED`` changes the seed (default 13), ``GPUKERNELS_FUZZ_CASE_TIMEOUT``
the watchdog (default 10 s).  Adding a mutation or a seed model renumbers the cases.

The CLI part (``test_fuzz_cli``) runs ``gpukernels run`` and ``gpukernels parity
--devices cpu`` in this process on a few mutated models (and mutated ``--inputs``
archives): the exit status must be documented and never 5 (internal error), stderr one
``gpukernels COMMAND: error:`` line, never a traceback.
"""

from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import AttributeProto, TensorProto, helper, numpy_helper

F, D, I64, B, S = TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT64, TensorProto.BOOL, TensorProto.STRING
LIMIT = 64 << 20                          # max_tensor_bytes of every fuzzed Session
CASE_TIMEOUT = float(os.environ.get("GPUKERNELS_FUZZ_CASE_TIMEOUT", "10"))  # seconds per case
SEED = int(os.environ.get("GPUKERNELS_FUZZ_SEED", "13"))
BUDGET = float(os.environ.get("GPUKERNELS_FUZZ_SECONDS", "20"))
MIN_CASES = 50   # fewer means a broken harness (an idle machine runs thousands; a loaded one ~100)
ADDRESS_SPACE = 6 << 30                   # the child's RLIMIT_AS: a blowup is a MemoryError
# what a kernel raises only by mistake: wrapped in a NodeError it still says nothing clear
BUG_TYPES = (AttributeError, NameError, KeyError, AssertionError, ZeroDivisionError, SystemError)
# unbounded recursion or allocation: never accepted, wrapped or not
RESOURCE_TYPES = (RecursionError, MemoryError)
WHOLE_MODEL_WORDS = ("ONNX model", "opset", "max_tensor_bytes", "graph", "subgraph", "function",
                     "model declares", "nested")
HERE = Path(__file__).resolve()
# {case: 'hang' | 'crash' | 'oom'}: faults the worker injects to check its own watchdog
INJECT = {int(k): v for k, _, v in (item.partition("=") for item in
                                    os.environ.get("GPUKERNELS_FUZZ_INJECT", "").split(",") if item)}


# ------------------------------------------------------------------ seed models


def _vi(name, elem, dims):
    return helper.make_tensor_value_info(name, elem, dims)


def _init(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def _model(nodes, inputs, outputs, inits=(), opset=18, extra_opsets=(), functions=(), name="g"):
    graph = helper.make_graph(nodes, name, inputs, outputs, list(inits))
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in extra_opsets]
    m = helper.make_model(graph, opset_imports=opsets, functions=list(functions))
    m.ir_version = 9
    return m


def _elementwise():
    n = helper.make_node
    nodes = [n("Add", ["x", "y"], ["a"], name="add"), n("Mul", ["a", "c"], ["b"], name="mul"),
             n("Relu", ["b"], ["r"], name="relu"), n("Sigmoid", ["r"], ["s"], name="sig"),
             n("Sub", ["s", "x"], ["d"], name="sub"), n("Abs", ["d"], ["e"], name="abs"),
             n("Sqrt", ["e"], ["f"], name="sqrt"), n("Clip", ["f", "lo", "hi"], ["g"], name="clip"),
             n("LeakyRelu", ["g"], ["h"], name="leaky", alpha=0.1),
             n("Pow", ["h", "two"], ["p"], name="pow"), n("Cast", ["p"], ["z"], name="cast", to=D),
             n("Div", ["x", "y"], ["q"], name="div"), n("Greater", ["x", "y"], ["gt"], name="gt"),
             n("Where", ["gt", "x", "y"], ["w"], name="where"),
             n("Elu", ["w"], ["el"], name="elu", alpha=1.0)]
    inits = [_init("c", np.array([0.5, 1.0, 2.0], np.float32)), _init("lo", np.float32(0.0)),
             _init("hi", np.float32(6.0)), _init("two", np.float32(2.0))]
    return _model(nodes, [_vi("x", F, [2, 3]), _vi("y", F, [2, 3])],
                  [_vi("z", D, [2, 3]), _vi("q", F, [2, 3]), _vi("el", F, [2, 3])], inits)


def _conv():
    n = helper.make_node
    rng = np.random.default_rng(0)
    nodes = [n("Conv", ["X", "W", "B"], ["c"], name="conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1],
               strides=[1, 1], dilations=[1, 1], group=1),
             n("Relu", ["c"], ["r"], name="relu"),
             n("MaxPool", ["r"], ["m"], name="maxpool", kernel_shape=[2, 2], strides=[2, 2]),
             n("AveragePool", ["m"], ["a"], name="avgpool", kernel_shape=[2, 2], strides=[1, 1],
               pads=[0, 0, 1, 1], count_include_pad=0),
             n("BatchNormalization", ["a", "scale", "bias", "mean", "var"], ["bn"], name="bn", epsilon=1e-5),
             n("GlobalAveragePool", ["bn"], ["gp"], name="gap"),
             n("Flatten", ["gp"], ["Y"], name="flatten", axis=1)]
    inits = [_init("W", rng.standard_normal((3, 2, 3, 3)).astype(np.float32)),
             _init("B", np.zeros(3, np.float32)), _init("scale", np.ones(3, np.float32)),
             _init("bias", np.zeros(3, np.float32)), _init("mean", np.zeros(3, np.float32)),
             _init("var", np.ones(3, np.float32))]
    return _model(nodes, [_vi("X", F, [1, 2, 6, 6])], [_vi("Y", F, [1, 3])], inits)


def _matmul():
    n = helper.make_node
    rng = np.random.default_rng(1)
    nodes = [n("MatMul", ["A", "Bm"], ["mm"], name="matmul"), n("Add", ["mm", "bias"], ["ab"], name="add"),
             n("Softmax", ["ab"], ["sm"], name="softmax", axis=-1),
             n("Gemm", ["sm", "Wg", "Cg"], ["gm"], name="gemm", alpha=1.0, beta=1.0, transA=0, transB=0),
             n("LayerNormalization", ["gm", "ln_s", "ln_b"], ["ln"], name="layernorm", axis=-1, epsilon=1e-5),
             n("ReduceMean", ["ln", "axes"], ["rm"], name="reducemean", keepdims=1),
             n("TopK", ["ln", "k"], ["tv", "ti"], name="topk", axis=-1, largest=1, sorted=1),
             n("ArgMax", ["ln"], ["am"], name="argmax", axis=1, keepdims=0)]
    inits = [_init("Bm", rng.standard_normal((4, 3)).astype(np.float32)), _init("bias", np.ones(3, np.float32)),
             _init("Wg", rng.standard_normal((3, 5)).astype(np.float32)), _init("Cg", np.zeros(5, np.float32)),
             _init("ln_s", np.ones(5, np.float32)), _init("ln_b", np.zeros(5, np.float32)),
             _init("axes", np.array([1], np.int64)), _init("k", np.array([2], np.int64))]
    return _model(nodes, [_vi("A", F, ["batch", 4])],
                  [_vi("rm", F, ["batch", 1]), _vi("tv", F, ["batch", 2]), _vi("ti", I64, ["batch", 2]),
                   _vi("am", I64, ["batch"])], inits)


def _shapes():
    n = helper.make_node
    nodes = [n("Shape", ["x"], ["s"], name="shape"),
             n("Gather", ["s", "i0"], ["d0"], name="gather_dim", axis=0),
             n("Unsqueeze", ["d0", "ax0"], ["d0v"], name="unsqueeze"),
             n("Concat", ["d0v", "m1"], ["newshape"], name="concat_shape", axis=0),
             n("Reshape", ["x", "newshape"], ["r"], name="reshape"),
             n("Slice", ["r", "starts", "ends", "axes", "steps"], ["sl"], name="slice"),
             n("Gather", ["sl", "gi"], ["g"], name="gather", axis=0),
             n("Transpose", ["g"], ["t"], name="transpose", perm=[0, 2, 1]),
             n("Tile", ["x", "reps"], ["tile"], name="tile"),
             n("ConstantOfShape", ["cshape"], ["cos"], name="cos",
               value=numpy_helper.from_array(np.array([1.5], np.float32))),
             n("Expand", ["cos", "eshape"], ["ex"], name="expand"),
             n("Pad", ["x", "pads"], ["pad"], name="pad", mode="constant"),
             n("Split", ["x", "split"], ["sp0", "sp1"], name="split", axis=2),
             n("Squeeze", ["d0v", "ax0"], ["sq"], name="squeeze"),
             n("Flatten", ["x"], ["fl"], name="flatten", axis=2)]
    inits = [_init("i0", np.int64(0)), _init("ax0", np.array([0], np.int64)),
             _init("m1", np.array([-1], np.int64)), _init("starts", np.array([0, 1], np.int64)),
             _init("ends", np.array([2, 10], np.int64)), _init("axes", np.array([0, 1], np.int64)),
             _init("steps", np.array([1, 2], np.int64)), _init("gi", np.array([[0, 1], [1, 0]], np.int64)),
             _init("reps", np.array([1, 2, 1], np.int64)), _init("cshape", np.array([2, 1], np.int64)),
             _init("eshape", np.array([2, 3], np.int64)), _init("pads", np.array([0, 1, 0, 0, 1, 0], np.int64)),
             _init("split", np.array([1, 3], np.int64))]
    outs = [_vi("t", F, [2, 5, 2]), _vi("tile", F, [2, 6, 4]), _vi("ex", F, [2, 3]), _vi("pad", F, [2, 5, 4]),
            _vi("sp0", F, [2, 3, 1]), _vi("sp1", F, [2, 3, 3]), _vi("sq", I64, []), _vi("fl", F, [6, 4])]
    return _model(nodes, [_vi("x", F, [2, 3, 4])], outs, inits)


def _if():
    n = helper.make_node
    then_g = helper.make_graph([n("Add", ["x", "c"], ["t0"], name="then_add"),
                                n("Identity", ["t0"], ["tout"], name="then_id")],
                               "then", [], [_vi("tout", F, [3])])
    else_g = helper.make_graph([n("Mul", ["x", "c"], ["e0"], name="else_mul"),
                                n("Neg", ["e0"], ["eout"], name="else_neg")],
                               "else", [], [_vi("eout", F, [3])])
    nodes = [n("If", ["cond"], ["y"], name="if", then_branch=then_g, else_branch=else_g),
             n("Relu", ["y"], ["z"], name="relu")]
    return _model(nodes, [_vi("cond", B, []), _vi("x", F, [3])], [_vi("z", F, [3])],
                  [_init("c", np.array([1.0, -2.0, 3.0], np.float32))])


def _loop():
    n = helper.make_node
    body = helper.make_graph(
        [n("Add", ["v_in", "x"], ["v_out"], name="body_add"),
         n("Identity", ["cond_in"], ["cond_out"], name="body_cond"),
         n("Cast", ["iter"], ["itf"], name="body_cast", to=F),
         n("Mul", ["v_out", "itf"], ["scan"], name="body_mul")],
        "body", [_vi("iter", I64, []), _vi("cond_in", B, []), _vi("v_in", F, [2])],
        [_vi("cond_out", B, []), _vi("v_out", F, [2]), _vi("scan", F, [2])])
    nodes = [n("Loop", ["M", "cond", "v0"], ["final", "scans"], name="loop", body=body)]
    inits = [_init("M", np.int64(4)), _init("cond", np.array(True)), _init("v0", np.zeros(2, np.float32))]
    return _model(nodes, [_vi("x", F, [2])], [_vi("final", F, [2]), _vi("scans", F, [None, 2])], inits)


def _scan():
    n = helper.make_node
    body = helper.make_graph(
        [n("Add", ["s_in", "x_t"], ["s_out"], name="body_add"),
         n("Mul", ["s_out", "w"], ["y_t"], name="body_mul")],
        "scan_body", [_vi("s_in", F, [2]), _vi("x_t", F, [2])], [_vi("s_out", F, [2]), _vi("y_t", F, [2])])
    nodes = [n("Scan", ["s0", "xs"], ["final", "ys"], name="scan", body=body, num_scan_inputs=1,
               scan_input_axes=[0], scan_output_axes=[0])]
    inits = [_init("s0", np.zeros(2, np.float32)), _init("w", np.array([2.0, 0.5], np.float32))]
    return _model(nodes, [_vi("xs", F, ["T", 2])], [_vi("final", F, [2]), _vi("ys", F, ["T", 2])], inits)


def _strings():
    n = helper.make_node
    nodes = [n("StringNormalizer", ["s"], ["norm"], name="normalizer", case_change_action="LOWER",
               is_case_sensitive=0, stopwords=["zzz"]),
             n("StringConcat", ["norm", "suffix"], ["cat"], name="concat"),
             n("RegexFullMatch", ["cat"], ["match"], name="regex", pattern="[a-z]+ x"),
             n("StringSplit", ["cat"], ["parts", "counts"], name="split", delimiter=" ", maxsplit=2),
             n("Equal", ["s", "ref"], ["eq"], name="equal")]
    inits = [_init("suffix", np.array([" x"], dtype=object)), _init("ref", np.array(["a", "b", "c"], dtype=object))]
    return _model(nodes, [_vi("s", S, [3])],
                  [_vi("match", B, [3]), _vi("parts", S, [3, None]), _vi("counts", I64, [3]),
                   _vi("eq", B, [3])], inits, opset=20)


def _sequences():
    n = helper.make_node
    relu_body = helper.make_graph([n("Relu", ["item"], ["item_out"], name="map_relu")], "map_body",
                                  [_vi("item", F, None)], [_vi("item_out", F, None)])
    nodes = [n("SequenceConstruct", ["x", "y"], ["seq"], name="construct"),
             n("Add", ["x", "y"], ["xy"], name="add"),
             n("SequenceInsert", ["seq", "xy", "one"], ["seq2"], name="insert"),
             n("SequenceAt", ["seq2", "minus1"], ["at"], name="at"),
             n("SequenceLength", ["seq2"], ["len"], name="length"),
             n("ConcatFromSequence", ["seq2"], ["cat"], name="concat", axis=0, new_axis=0),
             n("SplitToSequence", ["cat", "split"], ["seq3"], name="split", axis=0),
             n("SequenceErase", ["seq3", "one"], ["seq4"], name="erase"),
             n("SequenceMap", ["seq4"], ["seq5"], name="map", body=relu_body)]
    inits = [_init("one", np.int64(1)), _init("minus1", np.int64(-1)), _init("split", np.array([2, 4], np.int64))]
    seq_f = helper.make_tensor_sequence_value_info("seq5", F, None)
    return _model(nodes, [_vi("x", F, [2, 3]), _vi("y", F, [2, 3])],
                  [_vi("at", F, [2, 3]), _vi("len", I64, []), _vi("cat", F, [6, 3]), seq_f], inits)


def _indexing():
    n = helper.make_node
    nodes = [n("Gather", ["data", "idx"], ["g"], name="gather", axis=1),
             n("ScatterND", ["data", "nd_idx", "nd_upd"], ["snd"], name="scatternd"),
             n("ScatterElements", ["data", "el_idx", "el_upd"], ["sel"], name="scatterel", axis=0),
             n("GatherElements", ["data", "el_idx"], ["gel"], name="gatherel", axis=0),
             n("OneHot", ["idx", "depth", "ohv"], ["oh"], name="onehot", axis=-1),
             n("CumSum", ["data", "cs_axis"], ["cs"], name="cumsum"),
             n("Range", ["r0", "r1", "rd"], ["rg"], name="range"),
             n("Greater", ["data", "zero"], ["pos"], name="greater"),
             n("NonZero", ["pos"], ["nz"], name="nonzero"),
             n("Trilu", ["data", "tk"], ["tr"], name="trilu", upper=1),
             n("Compress", ["data", "keep"], ["cmp"], name="compress", axis=0),
             n("Unique", ["idx"], ["uq", "uqi", "uqinv", "uqc"], name="unique", sorted=1)]
    inits = [_init("nd_idx", np.array([[0], [2]], np.int64)), _init("nd_upd", np.ones((2, 4), np.float32)),
             _init("el_idx", np.array([[1, 0, 2, 2]], np.int64)), _init("el_upd", np.ones((1, 4), np.float32)),
             _init("depth", np.int64(5)), _init("ohv", np.array([0.0, 1.0], np.float32)),
             _init("cs_axis", np.int64(1)), _init("r0", np.int64(0)), _init("r1", np.int64(7)),
             _init("rd", np.int64(2)), _init("zero", np.float32(0.0)), _init("tk", np.int64(1)),
             _init("keep", np.array([True, False, True]))]
    outs = [_vi(o, F, dims) for o, dims in (("g", [3, 2]), ("snd", [3, 4]), ("sel", [3, 4]), ("gel", [1, 4]),
                                             ("oh", [2, 5]), ("cs", [3, 4]), ("tr", [3, 4]), ("cmp", [2, 4]))]
    outs += [_vi("rg", I64, [4]), _vi("nz", I64, [2, "nnz"]), _vi("uq", I64, ["u"]), _vi("uqc", I64, ["u"])]
    return _model(nodes, [_vi("data", F, [3, 4]), _vi("idx", I64, [2])], outs, inits)


def _function():
    n = helper.make_node
    alpha = helper.make_attribute_ref("value_float", AttributeProto.FLOAT, ref_attr_name="alpha")
    const = n("Constant", [], ["a"], name="f_const")
    const.attribute.append(alpha)
    fn = helper.make_function("fuzz.local", "ScaledRelu", ["X"], ["Y"],
                              [const, n("Mul", ["X", "a"], ["xa"], name="f_mul"),
                               n("Relu", ["xa"], ["Y"], name="f_relu")],
                              [helper.make_opsetid("", 18)], attributes=["alpha"])
    nodes = [n("ScaledRelu", ["x"], ["h"], name="call", domain="fuzz.local", alpha=0.5),
             n("Tanh", ["h"], ["y"], name="tanh")]
    return _model(nodes, [_vi("x", F, [2, 2])], [_vi("y", F, [2, 2])], extra_opsets=[("fuzz.local", 1)],
                  functions=[fn])


SEEDS = {"elementwise": _elementwise, "conv": _conv, "matmul": _matmul, "shapes": _shapes, "if": _if,
         "loop": _loop, "scan": _scan, "strings": _strings, "sequences": _sequences,
         "indexing": _indexing, "function": _function}
_SEED_CACHE: dict = {}


def seed_models() -> dict:
    """{family: ModelProto} of the valid seed models (built once per process)."""
    if not _SEED_CACHE:
        _SEED_CACHE.update((k, f()) for k, f in SEEDS.items())
    return _SEED_CACHE


# ------------------------------------------------------------------ walking a model


def graphs_of(model) -> list:
    """Every GraphProto of the model: the main graph first, then the subgraphs."""
    out, stack = [], [model.graph]
    while stack:
        g = stack.pop()
        out.append(g)
        for node in g.node:
            for a in node.attribute:
                if a.type == AttributeProto.GRAPH:
                    stack.append(a.g)
                elif a.type == AttributeProto.GRAPHS:
                    stack.extend(a.graphs)
        if len(out) > 200:
            break
    return out


def nodes_of(model) -> list:
    """Every NodeProto of the model's graphs and functions."""
    nodes = [nd for g in graphs_of(model) for nd in g.node]
    return nodes + [nd for f in model.functions for nd in f.node]


def value_infos_of(model) -> list:
    return [v for g in graphs_of(model) for v in list(g.input) + list(g.output) + list(g.value_info)]


def initializers_of(model) -> list:
    return [t for g in graphs_of(model) for t in g.initializer]


def names_of(model) -> set:
    """Every name and op type the model uses: what a clear error talks about."""
    names = set()
    for g in graphs_of(model):
        names.add(g.name)
        names.update(v.name for v in list(g.input) + list(g.output) + list(g.value_info))
        names.update(t.name for t in g.initializer)
        names.update(t.values.name for t in g.sparse_initializer)
    for nd in nodes_of(model):
        names.update([nd.name, nd.op_type, nd.domain, *nd.input, *nd.output])
        names.update(a.name for a in nd.attribute)
    for f in model.functions:
        names.update([f.name, f.domain])
    names.update(o.domain for o in model.opset_import)
    return {n for n in names if isinstance(n, str) and n}


# ------------------------------------------------------------------ mutations

HUGE_INTS = [0, 1, -1, 2, 3, -2, 7, 2 ** 31 - 1, 2 ** 31, -(2 ** 31), 2 ** 40, 2 ** 62, 2 ** 63 - 1, -(2 ** 63)]
ODD_FLOATS = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1e38, -3.4e38, 1e-45, 2.0, -1.0]
GARBAGE = [b"", b"\xff\xfe\xfd", b"garbage", b"A" * 5000, b"\x00", b"NOTSET\x00x", b"\x1b[31mred", "é∂ƒ".encode(),
           b"constant", b"reflect", b"edge", b"UPPER", b"(", b"[a-"]
ODD_DIMS = [-1, 0, 2 ** 40, 2 ** 62, -(2 ** 63), 1, 100000]
DATA_TYPES = list(range(0, 27)) + [99, -1, 2 ** 31 - 1]


def _pick(rng, seq):
    return seq[int(rng.integers(len(seq)))]


def _ops(rng):
    from gpukernels.kernels import load_all, registered

    load_all()
    ops = sorted(k[1] for k in registered() if k[0] == "")
    return ops + ["NoSuchOp", "", "If", "Loop", "Scan", "Constant"]


def mut_attr_value(rng, m):
    cands = [(nd, a) for nd in nodes_of(m) for a in nd.attribute]
    if not cands:
        return None
    nd, a = _pick(rng, cands)
    t = a.type
    if t == AttributeProto.INT:
        a.i = _pick(rng, HUGE_INTS)
        shown = a.i
    elif t == AttributeProto.FLOAT:
        a.f = _pick(rng, ODD_FLOATS)
        shown = a.f
    elif t == AttributeProto.STRING:
        a.s = _pick(rng, GARBAGE)
        shown = a.s[:20]
    elif t == AttributeProto.INTS:
        vals = list(a.ints)
        how = int(rng.integers(4))
        if how == 0 or not vals:
            vals = []
        elif how == 1:
            vals[int(rng.integers(len(vals)))] = _pick(rng, HUGE_INTS)
        elif how == 2:
            vals = vals + [_pick(rng, HUGE_INTS)] * int(rng.integers(1, 70))
        else:
            vals = vals[::-1] + vals
        del a.ints[:]
        a.ints.extend(vals)
        shown = vals[:8]
    elif t == AttributeProto.FLOATS:
        del a.floats[:]
        a.floats.extend([_pick(rng, ODD_FLOATS) for _ in range(int(rng.integers(0, 4)))])
        shown = list(a.floats)
    elif t == AttributeProto.STRINGS:
        del a.strings[:]
        a.strings.extend([_pick(rng, GARBAGE) for _ in range(int(rng.integers(0, 4)))])
        shown = [s[:10] for s in a.strings]
    elif t == AttributeProto.TENSOR:
        return f"attribute {nd.name}.{a.name}: " + (_mutate_tensor(rng, a.t) or "unchanged")
    elif t == AttributeProto.GRAPH:
        inner = onnx.ModelProto()
        inner.graph.CopyFrom(a.g)
        desc = _pick(rng, [mut_node_io, mut_graph_io, mut_drop_node, mut_op_type, mut_attr_value])(rng, inner)
        a.g.CopyFrom(inner.graph)
        return f"subgraph {nd.name}.{a.name}: {desc}"
    else:
        return None
    return f"attribute {nd.name}.{a.name} = {shown!r}"


def mut_attr_type(rng, m):
    cands = [(nd, a) for nd in nodes_of(m) for a in nd.attribute]
    if not cands:
        return None
    nd, a = _pick(rng, cands)
    how = int(rng.integers(4))
    if how == 0:
        new = _pick(rng, [AttributeProto.INT, AttributeProto.FLOAT, AttributeProto.STRING, AttributeProto.INTS,
                          AttributeProto.TENSOR, AttributeProto.GRAPH, AttributeProto.UNDEFINED,
                          AttributeProto.SPARSE_TENSOR, AttributeProto.TYPE_PROTO])
        a.type = new
        return f"attribute {nd.name}.{a.name} type -> {AttributeProto.AttributeType.Name(new)}"
    if how == 1:
        nd.attribute.remove(a)
        return f"attribute {nd.name}.{a.name} removed"
    if how == 2:
        extra = nd.attribute.add()
        extra.CopyFrom(a)
        return f"attribute {nd.name}.{a.name} duplicated"
    nd.attribute.append(helper.make_attribute(_pick(rng, ["zzz", "axis", "to", "body", "perm"]),
                                              _pick(rng, [3, 1.5, "x", [1, 2]])))
    return f"attribute added to {nd.name}: {nd.attribute[-1].name}"


def _mutate_tensor(rng, t):
    how = int(rng.integers(6))
    if how == 0 and t.dims:
        k = int(rng.integers(len(t.dims)))
        t.dims[k] = _pick(rng, ODD_DIMS)
        return f"tensor {t.name} dims -> {list(t.dims)}"
    if how == 1:
        t.data_type = _pick(rng, DATA_TYPES)
        return f"tensor {t.name} data_type -> {t.data_type}"
    if how == 2:
        try:
            arr = numpy_helper.to_array(t)
            raw = numpy_helper.from_array(arr, t.name)
        except Exception:  # noqa: BLE001 -- an already broken tensor
            return None
        if raw.HasField("raw_data") and raw.raw_data:
            cut = int(rng.integers(0, len(raw.raw_data)))
            raw.raw_data = raw.raw_data[:cut] if rng.random() < 0.7 else raw.raw_data + b"\x01" * 3
        t.CopyFrom(raw)
        return f"tensor {t.name} raw_data -> {len(t.raw_data)} bytes"
    if how == 3:
        t.raw_data = b"\x00\x00\x80\x7f" * 2
        return f"tensor {t.name} raw_data and typed data both set"
    if how == 4:
        t.data_location = TensorProto.EXTERNAL
        del t.external_data[:]
        for k, v in (("location", _pick(rng, ["../../etc/passwd", "/etc/passwd", "w.bin", "", "a\x00b"])),
                     ("offset", str(_pick(rng, [0, -1, 2 ** 62]))), ("length", str(_pick(rng, [4, 2 ** 40])))):
            e = t.external_data.add()
            e.key, e.value = k, v
        return f"tensor {t.name} -> external data {t.external_data[0].value!r}"
    del t.dims[:]
    t.dims.extend([_pick(rng, ODD_DIMS) for _ in range(int(rng.integers(0, 4)))])
    return f"tensor {t.name} dims -> {list(t.dims)}"


def mut_initializer(rng, m):
    inits = initializers_of(m)
    if not inits:
        return None
    return _mutate_tensor(rng, _pick(rng, inits))


def mut_init_values(rng, m):
    """An element of an initializer (or of a tensor attribute) set to an extreme value: the
    shapes, indices, trip counts, repeats, pads and sizes that kernels allocate from."""
    tensors = initializers_of(m) + [a.t for nd in nodes_of(m) for a in nd.attribute
                                    if a.type == AttributeProto.TENSOR]
    if not tensors:
        return None
    t = _pick(rng, tensors)
    try:
        arr = numpy_helper.to_array(t).copy()
    except Exception:  # noqa: BLE001 -- an already broken tensor
        return None
    if arr.dtype.kind in "iu":
        info = np.iinfo(arr.dtype)
        value = int(np.clip(_pick(rng, HUGE_INTS + [1000, 2 ** 20, 2 ** 30, -1000]), info.min, info.max))
    elif arr.dtype.kind == "f":
        value = _pick(rng, ODD_FLOATS + [1e6, -1e6])
    elif arr.dtype.kind == "b":
        value = not bool(arr.reshape(-1)[0]) if arr.size else True
    else:
        value = _pick(rng, ["", "\x00", "((((", "ab" * 500])
    if arr.size and rng.random() < 0.8:
        arr.reshape(-1)[int(rng.integers(arr.size))] = value
    else:
        arr = np.full(arr.shape if arr.size else (1,), value, dtype=arr.dtype)
    t.CopyFrom(numpy_helper.from_array(arr, t.name))
    return f"tensor {t.name or '(attribute)'} values -> {arr.reshape(-1)[:6].tolist()}"


def mut_value_info(rng, m):
    vis = value_infos_of(m)
    if not vis:
        return None
    v = _pick(rng, vis)
    how = int(rng.integers(5))
    if v.type.WhichOneof("value") != "tensor_type" or how == 4:
        kind = _pick(rng, ["sequence", "optional", "empty", "tensor"])
        if kind == "sequence":
            v.type.CopyFrom(helper.make_sequence_type_proto(helper.make_tensor_type_proto(F, None)))
        elif kind == "optional":
            v.type.CopyFrom(helper.make_optional_type_proto(helper.make_tensor_type_proto(F, [2])))
        elif kind == "empty":
            v.type.Clear()
        else:
            v.type.CopyFrom(helper.make_tensor_type_proto(_pick(rng, [F, I64, S, B]), [2 ** 40, 3]))
        return f"value {v.name} type -> {kind}"
    tt = v.type.tensor_type
    if how == 0:
        tt.elem_type = _pick(rng, DATA_TYPES)
        return f"value {v.name} elem_type -> {tt.elem_type}"
    if how == 1 and tt.HasField("shape") and tt.shape.dim:
        d = tt.shape.dim[int(rng.integers(len(tt.shape.dim)))]
        d.dim_value = _pick(rng, ODD_DIMS)
        return f"value {v.name} dim -> {d.dim_value}"
    if how == 2:
        tt.ClearField("shape")
        for _ in range(int(rng.integers(0, 4))):
            tt.shape.dim.add().dim_value = _pick(rng, [1, 2, 3, 2 ** 40])
        return f"value {v.name} shape -> {[d.dim_value for d in tt.shape.dim]}"
    tt.ClearField("shape")
    return f"value {v.name} shape removed"


def _rename(rng, name):
    return _pick(rng, ["", "undefined_value", name + "_x", "x", "c", "\x1b[2J", "a" * 300])


def mut_node_io(rng, m):
    nodes = nodes_of(m)
    if not nodes:
        return None
    nd = _pick(rng, nodes)
    field = nd.input if (rng.random() < 0.6 and nd.input) or not nd.output else nd.output
    which = "input" if field is nd.input else "output"
    how = int(rng.integers(4))
    if how == 0 and field:
        k = int(rng.integers(len(field)))
        del field[k]
        return f"node {nd.name}: {which} {k} dropped"
    if how == 1 and field:
        field.append(field[int(rng.integers(len(field)))] if which == "input" else "extra_out")
        return f"node {nd.name}: {which} added"
    if field:
        k = int(rng.integers(len(field)))
        field[k] = _rename(rng, field[k])
        return f"node {nd.name}: {which} {k} -> {field[k]!r}"
    field.append("undefined_value")
    return f"node {nd.name}: {which} added"


def mut_graph_io(rng, m):
    g = _pick(rng, graphs_of(m))
    how = int(rng.integers(6))
    lst = g.input if how in (0, 1, 2) else g.output
    what = "input" if lst is g.input else "output"
    if not lst:
        return None
    k = int(rng.integers(len(lst)))
    if how in (0, 3):
        name = lst[k].name
        del lst[k]
        return f"graph {g.name}: {what} {name} dropped"
    if how in (1, 4):
        lst.add().CopyFrom(lst[k])
        return f"graph {g.name}: {what} {lst[k].name} duplicated"
    old = lst[k].name
    lst[k].name = _rename(rng, old)
    return f"graph {g.name}: {what} {old} -> {lst[k].name!r}"


def mut_drop_node(rng, m):
    g = _pick(rng, graphs_of(m))
    if not g.node:
        return None
    k = int(rng.integers(len(g.node)))
    how = int(rng.integers(3))
    if how == 0:
        name = g.node[k].name
        del g.node[k]
        return f"graph {g.name}: node {name} dropped"
    if how == 1:
        g.node.add().CopyFrom(g.node[k])
        return f"graph {g.name}: node {g.node[k].name} duplicated"
    nodes = list(g.node)
    rng.shuffle(nodes)
    del g.node[:]
    g.node.extend(nodes)
    return f"graph {g.name}: nodes shuffled"


def mut_op_type(rng, m):
    nodes = nodes_of(m)
    if not nodes:
        return None
    nd = _pick(rng, nodes)
    if rng.random() < 0.2:
        nd.domain = _pick(rng, ["ai.onnx.ml", "com.microsoft", "garbage", "ai.onnx", "fuzz.local",
                                "ai.onnx.preview.training"])
        return f"node {nd.name}: domain -> {nd.domain!r}"
    old, nd.op_type = nd.op_type, _pick(rng, _ops(rng))
    return f"node {nd.name}: op {old} -> {nd.op_type}"


def mut_opset(rng, m):
    how = int(rng.integers(4))
    if how == 0 and m.opset_import:
        o = _pick(rng, list(m.opset_import))
        o.version = _pick(rng, [0, -1, 1, 6, 7, 9, 11, 13, 17, 19, 21, 22, 23, 24, 10 ** 6])
        return f"opset {o.domain or 'ai.onnx'} -> {o.version}"
    if how == 1:
        m.opset_import.add().CopyFrom(helper.make_opsetid(_pick(rng, ["", "ai.onnx", "ai.onnx.ml", "x.y"]),
                                                          int(rng.integers(1, 5))))
        return f"opset added {m.opset_import[-1].domain!r}"
    if how == 2:
        del m.opset_import[:]
        return "opset_import removed"
    m.ir_version = _pick(rng, [0, 1, 3, 100, -1])
    return f"ir_version -> {m.ir_version}"


def mut_sparse(rng, m):
    g = m.graph
    inits = list(g.initializer)
    how = int(rng.integers(6))
    dims = [3, 4]
    values = np.array([1.0, 2.0], np.float32)
    indices = _pick(rng, [np.array([0, 11], np.int64), np.array([-1, 2], np.int64), np.array([5, 12], np.int64),
                          np.array([[0, 1], [2, 9]], np.int64), np.array([[0, 1]], np.int64),
                          np.array([0.5, 1.5], np.float32), np.array([2 ** 62, 0], np.int64)])
    if how == 1:
        dims = [2 ** 40, 2 ** 40]
    elif how == 2:
        dims = [-3, 4]
    elif how == 3:
        dims = []
    target = None
    if inits and rng.random() < 0.6:
        target = _pick(rng, inits)
        name = target.name
        g.initializer.remove(target)
    else:
        name = "fuzz_sparse"
    sp = helper.make_sparse_tensor(numpy_helper.from_array(values, name),
                                   numpy_helper.from_array(indices, name + "_idx"), dims)
    g.sparse_initializer.append(sp)
    return f"sparse initializer {name} dims {dims} indices {indices.tolist()}"


def mut_nest(rng, m):
    """Move the main graph's nodes into K nested If then-branches (outer reads all the way)."""
    # protobuf's parser stops at about 31 If levels (upb's depth limit), before
    # validation's MAX_GRAPH_DEPTH: deeper ones are refused while building or loading
    depth = _pick(rng, [1, 2, 5, 10, 20, 30, 31, 32, 100])
    g = m.graph
    outputs = list(g.output)
    inner = helper.make_graph(list(g.node), "level_last", [], outputs)
    for level in range(depth, 0, -1):
        else_nodes = [helper.make_node("Constant", [], [o.name], name=f"else{level}_{k}", value_float=0.0)
                      for k, o in enumerate(outputs)]
        else_g = helper.make_graph(else_nodes, f"else{level}", [], outputs)
        node = helper.make_node("If", ["fuzz_true"], [o.name for o in outputs], name=f"nest{level}",
                                then_branch=inner, else_branch=else_g)
        if level > 1:
            inner = helper.make_graph([node], f"level{level}", [], outputs)
    del g.node[:]
    g.node.append(node)
    g.initializer.append(_init("fuzz_true", np.array(True)))
    return f"main graph nested {depth} If levels deep"


def mut_function(rng, m):
    """A model-local function that calls itself (directly or through a second one), or an
    ordinary one called with a wrong attribute."""
    n = helper.make_node
    how = int(rng.integers(4))
    if how == 3:
        k = _pick(rng, [2, 10, 40, 64, 65, 300])
        fns = [helper.make_function("fuzz.rec", "Rec" if j == 0 else f"F{j}", ["X"], ["Y"],
                                    [n(f"F{j + 1}", ["X"], ["Y"], domain="fuzz.rec") if j + 1 < k
                                     else n("Neg", ["X"], ["Y"])],
                                    [helper.make_opsetid("", 18), helper.make_opsetid("fuzz.rec", 1)])
               for j in range(k)]
        what = f"a chain of {k} functions"
    elif how == 0:
        body = [n("Rec", ["X"], ["Y"], name="rec_self", domain="fuzz.rec")]
        fns = [helper.make_function("fuzz.rec", "Rec", ["X"], ["Y"], body, [helper.make_opsetid("", 18),
                                                                             helper.make_opsetid("fuzz.rec", 1)])]
        what = "a function calling itself"
    elif how == 1:
        fns = [helper.make_function("fuzz.rec", "Rec", ["X"], ["Y"], [n("Rec2", ["X"], ["Y"], domain="fuzz.rec")],
                                    [helper.make_opsetid("fuzz.rec", 1)]),
               helper.make_function("fuzz.rec", "Rec2", ["X"], ["Y"], [n("Rec", ["X"], ["Y"], domain="fuzz.rec")],
                                    [helper.make_opsetid("fuzz.rec", 1)])]
        what = "two functions calling each other"
    else:
        fns = [helper.make_function("fuzz.rec", "Rec", ["X"], ["Y"], [n("Neg", ["X"], ["Y"])],
                                    [helper.make_opsetid("", 18)])]
        what = "a plain function"
    m.functions.extend(fns)
    m.opset_import.add().CopyFrom(helper.make_opsetid("fuzz.rec", 1))
    src = m.graph.input[0].name if m.graph.input else (m.graph.initializer[0].name if m.graph.initializer else "")
    m.graph.node.append(n("Rec", [src], ["fuzz_rec_out"], name="rec_call", domain="fuzz.rec"))
    m.graph.output.append(_vi("fuzz_rec_out", F, None))
    return what


def mut_declared_input(rng, m):
    """A main-graph input declared with a huge, negative or odd dimension or element type:
    what gpukernels.inputs.random_inputs must refuse before drawing anything."""
    if not m.graph.input:
        return None
    v = _pick(rng, list(m.graph.input))
    tt = v.type.tensor_type
    if rng.random() < 0.25:
        tt.elem_type = _pick(rng, [0, 99, S, TensorProto.BFLOAT16, TensorProto.INT4, TensorProto.COMPLEX64])
        return f"input {v.name} declared elem_type {tt.elem_type}"
    tt.shape.dim.add().dim_value = 1
    d = tt.shape.dim[int(rng.integers(len(tt.shape.dim)))]
    d.dim_value = _pick(rng, [2 ** 40, 2 ** 62, -1, 2 ** 31, 100000])
    return f"input {v.name} declared dims {[x.dim_value for x in tt.shape.dim]}"


# drawn uniformly: a function listed twice or three times is drawn that much more often
MUTATIONS = [mut_init_values, mut_init_values, mut_init_values, mut_declared_input, mut_attr_value,
             mut_attr_value, mut_attr_type, mut_initializer, mut_initializer, mut_value_info,
             mut_node_io, mut_graph_io, mut_drop_node, mut_op_type, mut_op_type, mut_opset, mut_sparse,
             mut_nest, mut_function]


def mutate_bytes(rng, data: bytes) -> tuple[bytes, str]:
    buf = bytearray(data)
    how = int(rng.integers(4))
    if how == 0 and buf:
        k = int(rng.integers(1, 9))
        for _ in range(k):
            buf[int(rng.integers(len(buf)))] ^= 1 << int(rng.integers(8))
        return bytes(buf), f"{k} bit flips"
    if how == 1:
        cut = int(rng.integers(0, len(buf) + 1))
        return bytes(buf[:cut]), f"truncated to {cut} of {len(buf)} bytes"
    if how == 2:
        at = int(rng.integers(0, len(buf) + 1))
        junk = rng.integers(0, 256, int(rng.integers(1, 16)), dtype=np.uint8).tobytes()
        return bytes(buf[:at]) + junk + bytes(buf[at:]), f"{len(junk)} random bytes inserted at {at}"
    at = int(rng.integers(0, len(buf) + 1))
    return bytes(buf[:at]) + bytes(buf[at:at + 64]) * 2 + bytes(buf[at + 64:]), f"64 bytes at {at} doubled"


# ------------------------------------------------------------------ feeds


def _elem_dtype(elem):
    from gpukernels import dtypes

    try:
        return dtypes.info(elem).numpy
    except Exception:  # noqa: BLE001 -- an unknown or UNDEFINED element type
        return np.dtype(np.float32)


def _array_for(rng, tt, dim_params):
    dtype = _elem_dtype(tt.elem_type)
    shape = []
    if tt.HasField("shape"):
        for d in tt.shape.dim:
            if d.HasField("dim_value"):
                shape.append(int(d.dim_value) if 0 <= d.dim_value <= 16 else 2)
            else:
                shape.append(dim_params.setdefault(d.dim_param or f"?{len(shape)}", int(rng.integers(1, 4))))
    if dtype.kind in "OUS":
        return np.array(rng.choice(["a", "b", "c", "Hello World", ""], size=shape), dtype=object)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        return rng.integers(0, 2, shape).astype(dtype)
    if dtype.kind == "c":
        return (rng.standard_normal(shape) + 1j).astype(dtype)
    return rng.standard_normal(shape).astype(np.float32).astype(dtype)


def _value_for(rng, type_proto, dim_params):
    kind = type_proto.WhichOneof("value")
    if kind == "sequence_type":
        elem = type_proto.sequence_type.elem_type
        return [_value_for(rng, elem, dim_params) for _ in range(2)]
    if kind == "optional_type":
        return None if rng.random() < 0.3 else _value_for(rng, type_proto.optional_type.elem_type, dim_params)
    if kind == "tensor_type":
        return _array_for(rng, type_proto.tensor_type, dim_params)
    return np.zeros(2, np.float32)


def _mutate_feed(rng, feeds: dict) -> str:
    if not feeds or rng.random() < 0.1:
        how = int(rng.integers(2))
        if how == 0 or not feeds:
            feeds["no_such_input"] = np.zeros(1, np.float32)
            return "unknown input added"
        name = _pick(rng, sorted(feeds))
        del feeds[name]
        return f"input {name} missing"
    name = _pick(rng, sorted(feeds))
    v = feeds[name]
    arr = np.asarray(v) if not isinstance(v, list) else None
    how = int(rng.integers(9))
    if arr is None or how == 0:
        feeds[name] = _pick(rng, [None, "abc", 3, [1.0, "x"], {"a": 1}, object(), [[1, 2], [3]], np.float64(1.5)])
        return f"input {name} -> {type(feeds[name]).__name__}"
    if how == 1:
        dt = _pick(rng, [np.float64, np.float16, np.int64, np.int32, np.uint8, np.bool_, np.complex64, object])
        try:
            feeds[name] = arr.astype(dt) if dt is not object else arr.astype(str).astype(object)
        except (ValueError, TypeError):  # strings that are not numbers
            feeds[name] = np.zeros(arr.shape, dt)
        return f"input {name} dtype -> {np.dtype(dt)}"
    if how == 2:
        feeds[name] = arr[None] if rng.random() < 0.5 or arr.ndim == 0 else arr.reshape(-1)[0]
        return f"input {name} rank -> {np.ndim(feeds[name])}"
    if how == 3 and arr.ndim:
        shape = list(arr.shape)
        shape[int(rng.integers(len(shape)))] = 0
        feeds[name] = np.zeros(shape, arr.dtype)
        return f"input {name} empty {shape}"
    if how == 4 and arr.ndim:
        shape = list(arr.shape)
        shape[int(rng.integers(len(shape)))] += int(rng.integers(1, 3))
        feeds[name] = np.resize(arr, shape)
        return f"input {name} shape -> {shape}"
    if how in (5, 6) and arr.dtype.kind == "f":
        feeds[name] = np.full_like(arr, _pick(rng, [np.nan, np.inf, -np.inf, 3e38, -0.0]))
        return f"input {name} filled with {feeds[name].flat[0] if feeds[name].size else 'nothing'}"
    if how in (5, 6, 7) and arr.dtype.kind in "iu":
        info = np.iinfo(arr.dtype)
        feeds[name] = np.full_like(arr, _pick(rng, [info.min, info.max, -1, 1000, 2 ** 20]) if info.min < 0
                                   else _pick(rng, [info.max, 1000]))
        return f"input {name} filled with {feeds[name].flat[0] if feeds[name].size else 'nothing'}"
    if how == 7:
        feeds[name] = np.asfortranarray(arr) if arr.ndim > 1 else arr[::-1] if arr.ndim else arr[()]
        return f"input {name} non-contiguous"
    feeds[name] = arr.tolist()
    return f"input {name} as a Python list"


# ------------------------------------------------------------------ cases


class Case:
    def __init__(self, seed, index, family, data: bytes, desc: list, feed_mode, model):
        self.seed, self.index, self.family = seed, index, family
        self.data, self.desc, self.feed_mode, self.model = data, desc, feed_mode, model
        self.feed_names = []
        self.inject = INJECT.get(index)

    def describe(self) -> str:
        return f"seed {self.seed} case {self.index} [{self.family}]: " + "; ".join(self.desc or ["no mutation"])


def make_case(seed: int, index: int) -> Case:
    """Case index of seed: a seed model, its mutations and the serialized bytes.  The
    feeds are drawn in run_case, from the session actually built."""
    rng = np.random.default_rng([seed, index])
    family = _pick(rng, sorted(SEEDS))
    model = copy.deepcopy(seed_models()[family])
    desc = []
    n_mut = int(rng.choice([0, 1, 2, 3], p=[0.15, 0.5, 0.25, 0.1]))
    tries = 0
    while len(desc) < n_mut and tries < 10:
        tries += 1
        mut = _pick(rng, MUTATIONS)
        try:
            d = mut(rng, model)
        except Exception as exc:  # noqa: BLE001 -- protobuf refused the value or the depth itself
            d = f"{mut.__name__} refused by protobuf ({type(exc).__name__})"
        if d:
            desc.append(d)
    try:
        data = model.SerializeToString()
    except Exception as exc:  # noqa: BLE001
        desc.append(f"unserializable ({type(exc).__name__}): empty bytes")
        data = b""
    if rng.random() < 0.12:
        data, d = mutate_bytes(rng, data)
        desc.append(d)
    feed_mode = str(rng.choice(["matching", "mutated", "random_inputs"], p=[0.55, 0.3, 0.15]))
    desc.append(f"feeds {feed_mode}")
    return Case(seed, index, family, data, desc, feed_mode, model)


def _inject(fault: str) -> None:
    if fault == "hang":
        time.sleep(3600)
    elif fault == "crash":
        import signal

        os.kill(os.getpid(), signal.SIGSEGV)
    elif fault == "oom":
        np.ones(1 << 40, np.uint8)


class HarnessError(Exception):
    """The fuzzer's own code failed (not gpukernels): a bug to fix here."""


def _feeds(case: Case, session, rng) -> dict:
    if case.feed_mode == "random_inputs":
        from gpukernels.inputs import random_inputs

        feeds = random_inputs(session, int(rng.integers(1000)))
    else:
        try:
            dim_params = {}
            feeds = {vi.name: _value_for(rng, vi.type, dim_params) for vi in session.inputs}
            if case.feed_mode == "mutated":
                case.desc.append(_mutate_feed(rng, feeds))
        except Exception as exc:  # noqa: BLE001
            raise HarnessError(f"making the feeds failed: {type(exc).__name__}: {exc}") from exc
    case.feed_names = list(feeds)
    return feeds


def execute(case: Case):
    """Load and run the case; raises whatever gpukernels raises."""
    from gpukernels.runtime import Session

    if case.inject:  # the harness's own check (test_watchdog_reports_hangs_crashes_and_blowups)
        _inject(case.inject)
    rng = np.random.default_rng([case.seed, case.index, 1])
    session = Session(case.data, options={"max_tensor_bytes": LIMIT})
    feeds = _feeds(case, session, rng)
    outputs = None
    for _ in range(2):  # the second run goes through the compiled plan
        outputs = session.run(None, dict(feeds))
    assert len(outputs) == len(session.output_names), "Session.run returned the wrong number of outputs"
    for value in outputs:
        assert value is None or isinstance(value, (np.ndarray, np.generic, list, dict)), \
            f"Session.run returned a {type(value).__name__}, not a host value"
    return outputs


def _chain(exc):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ if exc.__cause__ is not None or exc.__suppress_context__ else exc.__context__


def _names_something(message: str, names) -> bool:
    for name in names:
        if f"'{name}'" in message or f'"{name}"' in message or repr(name) in message:
            return True
        if len(name) >= 4 and name in message:
            return True
    return any(w in message for w in WHOLE_MODEL_WORDS)


def judge(exc: BaseException, names) -> str | None:
    """None when exc is an accepted outcome, else why not (see the module docstring)."""
    from gpukernels.errors import GpuKernelsError

    if isinstance(exc, HarnessError):
        return f"the fuzzer itself failed: {exc}"
    if not isinstance(exc, GpuKernelsError):
        return f"{type(exc).__name__} escaped (not a GpuKernelsError)"
    message = str(exc)
    if not message.strip():
        return f"{type(exc).__name__} with an empty message"
    chain = list(_chain(exc))
    blowup = next((e for e in chain if isinstance(e, RESOURCE_TYPES)), None)
    if blowup is not None:
        return f"{type(exc).__name__} wraps {type(blowup).__name__} (unbounded recursion or allocation)"
    raw = kernel_exception(exc)
    if isinstance(raw, BUG_TYPES):
        return f"{type(exc).__name__} wraps {type(raw).__name__} raised by the kernel (a programming error)"
    if not _names_something(message, names):
        return f"{type(exc).__name__} names nothing of the model"
    return None


def kernel_exception(exc):
    """What the failing kernel itself raised, when exc is (or wraps) the runtime's
    NodeError and that is not a deliberate gpukernels error; else None."""
    from gpukernels.errors import GpuKernelsError, NodeError

    for e in _chain(exc):
        cause = e.__cause__
        if isinstance(e, NodeError) and cause is not None and not isinstance(cause, GpuKernelsError):
            return cause
    return None


def _root(exc):
    return list(_chain(exc))[-1]


def run_case(case: Case) -> dict:
    """The verdict on one case: {'outcome': 'ok' | 'refused' | 'FAIL', ...}."""
    names = names_of(case.model)
    try:
        execute(case)
    except BaseException as exc:  # noqa: BLE001 -- judged below
        if isinstance(exc, KeyboardInterrupt):
            raise
        names |= {k for k in case.feed_names if isinstance(k, str) and k}
        why = judge(exc, names)
        root = _root(exc)
        verdict = {"outcome": "FAIL" if why else "refused", "error": type(exc).__name__,
                   "root": type(root).__name__, "message": str(exc)[:600], "desc": case.describe(),
                   "op": getattr(exc, "op_type", "")}
        raw = kernel_exception(exc)
        if raw is not None:
            verdict["raw"] = f"{type(raw).__name__}: {str(raw)[:200]}"
        if why:
            verdict["why"] = why
        return verdict
    return {"outcome": "ok"}


# ------------------------------------------------------------------ the child process


def worker(seed: int, start: int, deadline: float, case_timeout: float, out_path: str) -> None:
    import faulthandler
    import resource
    import warnings

    warnings.simplefilter("ignore")
    faulthandler.enable()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    want = ADDRESS_SPACE if hard == resource.RLIM_INFINITY else min(ADDRESS_SPACE, hard)
    resource.setrlimit(resource.RLIMIT_AS, (want, hard))
    seed_models()
    import gpukernels.runtime  # noqa: F401 -- imported before the first case's clock starts

    with open(out_path, "a", buffering=1) as out:
        i = start
        # at least one case per worker started, and every case with an injected fault
        while i == start or i <= max(INJECT, default=-1) or time.time() < deadline:
            case = make_case(seed, i)
            out.write(json.dumps({"i": i, "start": case.describe()}) + "\n")
            out.flush()
            faulthandler.dump_traceback_later(case_timeout, exit=True)
            t0 = time.perf_counter()
            try:
                verdict = run_case(case)
            finally:
                faulthandler.cancel_dump_traceback_later()
            verdict.update(i=i, seconds=round(time.perf_counter() - t0, 4))
            out.write(json.dumps(verdict) + "\n")
            out.flush()
            i += 1


LONG_LOOP = 2 ** 16  # iterations: past this a Loop asks for work without bound (see _long_loop)


def _long_loop(model) -> str | None:
    """Why the model legitimately asks for a very long run, or None.  A Loop whose trip
    count M is absent or a constant of at least LONG_LOOP, and whose body accumulates no
    scan outputs (those count against max_tensor_bytes and are refused), runs as long as
    the model says: gpukernels bounds memory, not time (DESIGN.md, Untrusted models)."""
    consts = {}
    for g in graphs_of(model):
        for t in g.initializer:
            try:
                consts[t.name] = numpy_helper.to_array(t)
            except Exception:  # noqa: BLE001
                pass
    for nd in nodes_of(model):
        if nd.op_type != "Loop":
            continue
        body = next((a.g for a in nd.attribute if a.name == "body" and a.type == AttributeProto.GRAPH), None)
        carried = max(len(nd.input) - 2, 0)
        if body is None or len(body.output) > 1 + carried:
            continue
        m_name = nd.input[0] if nd.input else ""
        m = consts.get(m_name)
        if not m_name:
            return f"Loop {nd.name!r} has no trip count and no scan outputs"
        if m is not None and m.size == 1 and m.dtype.kind in "iu" and int(m.reshape(-1)[0]) >= LONG_LOOP:
            return f"Loop {nd.name!r} asks for {int(m.reshape(-1)[0])} iterations and has no scan outputs"
    return None


def run_fuzz(seed: int, budget: float, workdir: Path, case_timeout: float = CASE_TIMEOUT,
             inject: str = "") -> dict:
    """Run the fuzz loop in child processes until budget seconds have passed; returns
    {'cases', 'seconds', 'counts', 'failures', 'refusals', 'verdicts'}."""
    import gpukernels

    root = Path(gpukernels.__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
               OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONFAULTHANDLER="1",
               GPUKERNELS_FUZZ_INJECT=inject)
    t_start = time.time()
    deadline = t_start + budget
    verdicts, failures = {}, []
    start, attempt = 0, 0
    forced = max((int(item.partition("=")[0]) for item in inject.split(",") if item), default=-1)
    while (time.time() < deadline or start <= forced) and attempt < 20:
        attempt += 1
        out_path = workdir / f"fuzz-{attempt}.jsonl"
        err_path = workdir / f"fuzz-{attempt}.err"
        with open(err_path, "wb") as err:
            proc = subprocess.Popen([sys.executable, str(HERE), "worker", str(seed), str(start), repr(deadline),
                                     str(case_timeout), str(out_path)],
                                    stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=str(root))
            try:
                proc.wait(timeout=max(deadline - time.time(), 0) + case_timeout + 60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        started = {}
        if out_path.exists():
            for line in out_path.read_text().splitlines():
                rec = json.loads(line)
                if "start" in rec:
                    started[rec["i"]] = rec["start"]
                else:
                    verdicts[rec["i"]] = rec
        pending = [i for i in started if i not in verdicts]
        stderr = err_path.read_text(errors="replace")
        if pending:
            i = pending[0]
            kind = "hang" if "Timeout (" in stderr else f"crash (exit status {proc.returncode})"
            start = i + 1
            asked = _long_loop(make_case(seed, i).model) if kind == "hang" else None
            if asked and "kernels/controlflow.py" in stderr:
                verdicts[i] = {"i": i, "outcome": "long loop", "desc": started[i], "why": asked}
                continue
            failures.append({"i": i, "outcome": "FAIL", "why": f"{kind} past {case_timeout} s" if kind == "hang"
                             else kind, "desc": started[i], "error": kind, "message": stderr[-3000:]})
            continue
        if proc.returncode != 0:
            failures.append({"i": -1, "outcome": "FAIL", "why": f"worker exited with {proc.returncode}",
                             "desc": "outside any case", "error": "worker", "message": stderr[-3000:]})
        break
    seconds = time.time() - t_start
    failures += [v for v in verdicts.values() if v["outcome"] == "FAIL"]
    counts = {}
    for v in verdicts.values():
        key = v["outcome"] if v["outcome"] != "refused" else f"refused:{v['error']}"
        counts[key] = counts.get(key, 0) + 1
    refusals = [v for v in verdicts.values() if v["outcome"] == "refused"]
    return {"cases": len(verdicts) + sum(1 for f in failures if f["i"] >= 0 and f["i"] not in verdicts),
            "seconds": seconds, "counts": counts, "failures": sorted(failures, key=lambda f: f["i"]),
            "refusals": refusals, "verdicts": [verdicts[i] for i in sorted(verdicts)]}


def _report(failures, seed: int = SEED) -> str:
    lines = []
    for f in failures:
        why = f["why"] if f["why"] == f["error"] else f"{f['why']}: {f['error']}"
        lines.append(f"- {f['desc']}\n    {why}: {f['message'][:1500]}\n"
                     f"    reproduce: .venv/bin/python {HERE.relative_to(HERE.parents[2])} repro {seed} {f['i']}")
    return "\n".join(lines)


# ------------------------------------------------------------------ tests


def test_seed_models_run_clean():
    """Every unmutated seed model runs with matching feeds: the fuzzer starts from valid
    models, so a refusal after a mutation is the mutation's doing."""
    from gpukernels.runtime import Session

    for family, model in seed_models().items():
        onnx.checker.check_model(model, full_check=family not in ("function",))
        session = Session(model.SerializeToString(), options={"max_tensor_bytes": LIMIT})
        rng = np.random.default_rng(0)
        feeds = {vi.name: _value_for(rng, vi.type, {}) for vi in session.inputs}
        outputs = session.run(None, feeds)
        assert len(outputs) == len(model.graph.output), family


def test_fuzz_session(tmp_path):
    """Seeded mutated models and feeds through Session: success or a clear
    GpuKernelsError, no crash, hang or memory blowup (see the module docstring)."""
    result = run_fuzz(SEED, BUDGET, tmp_path)
    rate = result["cases"] / max(result["seconds"], 1e-9)
    summary = (f"fuzz seed {SEED}: {result['cases']} cases in {result['seconds']:.1f} s ({rate:.0f}/s); "
               f"outcomes {dict(sorted(result['counts'].items()))}")
    print(summary)
    for v in result["verdicts"]:
        if v["outcome"] == "long loop":
            print(f"  long loop (the model asks for it): {v['desc']}: {v['why']}")
    assert not result["failures"], (f"{summary}\n{len(result['failures'])} failing case(s):\n"
                                     + _report(result["failures"]))
    assert result["cases"] >= MIN_CASES, summary


def test_watchdog_reports_hangs_crashes_and_blowups(tmp_path):
    """The harness itself: a case that hangs, one that crashes the worker and one that
    allocates past the address-space limit are each reported, and the loop goes on."""
    result = run_fuzz(SEED, 0.5, tmp_path, case_timeout=1.0, inject="0=oom,1=hang,2=crash")
    why = {f["i"]: f["why"] for f in result["failures"]}
    assert "MemoryError" in why.get(0, ""), result["failures"]
    assert why.get(1, "").startswith("hang past 1.0 s"), result["failures"]
    assert why.get(2, "").startswith("crash"), result["failures"]
    assert "Timeout" in next(f["message"] for f in result["failures"] if f["i"] == 1)  # with its traceback


def _cli_cases(n: int) -> list:
    """n mutated models for the CLI (byte-damaged ones included), fixed by the seed."""
    cases, i = [], 0
    while len(cases) < n:
        case = make_case(SEED + 1, i)
        i += 1
        # the CLI runs in this process: leave out deep nesting and recursion, which the
        # child-process fuzz covers with a watchdog
        if any("nested" in d or "function" in d for d in case.desc):
            continue
        cases.append(case)
    return cases


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NaN/inf feeds: overflow warnings are expected
def test_fuzz_cli(tmp_path, capsys, monkeypatch):
    """`gpukernels run` and `gpukernels parity --devices cpu` on mutated models (and on
    mutated --inputs archives) end with a documented exit status, never 5 (internal
    error), and with one error line, never a traceback."""
    import faulthandler

    from gpukernels.cli import EXIT_INTERNAL, main

    monkeypatch.setenv("GPUKERNELS_MAX_TENSOR_BYTES", str(LIMIT))
    allowed = {0, 1, 2, 3, 4, 6}
    problems, codes = [], {}
    huge = seed_models()["elementwise"].__deepcopy__({})
    huge.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 2 ** 40
    specials = [("huge-declared-input.onnx", huge.SerializeToString()), ("empty.onnx", b""),
                ("garbage.onnx", b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01 garbage")]
    models = [(f"case{c.index}.onnx", c.data, c) for c in _cli_cases(24)] + [(n, d, None) for n, d in specials]
    faulthandler.dump_traceback_later(120, exit=True, file=sys.__stderr__)  # a hang: a traceback, the end
    try:
        for k, (fname, data, case) in enumerate(models):
            path = tmp_path / fname
            path.write_bytes(data)
            argvs = [["run", str(path), "--device", "cpu", "--seed", str(k)],
                     ["parity", str(path), "--devices", "cpu", "--seed", str(k)]]
            if case is not None and k % 2 == 0:
                rng = np.random.default_rng([SEED, k])
                feeds = {vi.name: _value_for(rng, vi.type, {}) for vi in case.model.graph.input}
                _mutate_feed(rng, feeds)
                try:
                    arrays = {n: np.asarray(v) for n, v in feeds.items()}
                    np.savez(tmp_path / f"in{k}.npz", **arrays)
                    argvs.append(["run", str(path), "--device", "cpu", "--inputs", str(tmp_path / f"in{k}.npz")])
                except Exception:  # noqa: BLE001 -- a feed NumPy cannot store
                    pass
            for argv in argvs:
                code = main(argv)
                out, err = capsys.readouterr()
                codes[code] = codes.get(code, 0) + 1
                where = f"{' '.join(argv)}  [{case.describe() if case else fname}]"
                if code not in allowed or code == EXIT_INTERNAL:
                    problems.append(f"exit {code}: {where}\n    {err.strip()[:800]}")
                if "Traceback" in err or "Traceback" in out:
                    problems.append(f"traceback: {where}\n    {err[-800:]}")
                lines = [ln for ln in err.splitlines() if ln.strip()]
                if code != 0 and (len(lines) != 1 or not lines[0].startswith(f"gpukernels {argv[0]}: error: ")):
                    problems.append(f"not one error line: {where}\n    {err[-800:]}")
    finally:
        faulthandler.cancel_dump_traceback_later()
    print(f"CLI exit statuses: {dict(sorted(codes.items()))}")
    assert not problems, "\n".join(problems)
    assert codes.get(0) and len(codes) > 2, codes  # some ran, several kinds of failure were seen


# ------------------------------------------------------------------ command line


def _main(argv) -> int:
    if argv[:1] == ["worker"]:
        seed, start, deadline, case_timeout, out_path = argv[1:6]
        worker(int(seed), int(start), float(deadline), float(case_timeout), out_path)
        return 0
    if argv[:1] == ["repro"]:
        case = make_case(int(argv[1]), int(argv[2]))
        print(case.describe(), flush=True)
        outputs = execute(case)
        print(f"ran: {len(outputs)} output(s)")
        return 0
    if argv[:1] == ["fuzz"]:  # the test's loop for SECONDS with SEED, failures printed
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            result = run_fuzz(int(argv[1]), float(argv[2]), Path(tmp))
        print(f"seed {argv[1]}: {result['cases']} cases in {result['seconds']:.1f} s; {result['counts']}")
        print(_report(result["failures"], int(argv[1])))
        return 1 if result["failures"] else 0
    if argv[:1] == ["sweep"]:  # run cases in this process and print each verdict
        seed, lo, hi = (int(a) for a in argv[1:4])
        raw = {}
        for i in range(lo, hi):
            v = run_case(make_case(seed, i))
            if v["outcome"] == "FAIL":
                print(i, json.dumps(v)[:2000], flush=True)
            if "raw" in v:
                raw.setdefault((v["op"], v["raw"].split(":")[0]), []).append((i, v["raw"]))
        for (op, kind), hits in sorted(raw.items()):
            print(f"wrapped {kind} from {op}: {len(hits)}x, e.g. case {hits[0][0]}: {hits[0][1][:150]}")
        return 0
    print("usage: test_fuzz_models.py fuzz SEED SECONDS | repro SEED CASE | sweep SEED LO HI | "
          "worker SEED START DEADLINE CASE_TIMEOUT OUT")
    return 2


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parents[2]))  # this checkout's gpukernels, not an installed one
    sys.exit(_main(sys.argv[1:]))
