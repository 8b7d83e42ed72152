"""The official ONNX cases of Conv, Attention, LinearAttention and RotaryEmbedding must pass
through the hand-written CUDA kernels, not the array-namespace fallback, except where the
kernels do not cover the case by design.

Which cases those are is decided from each case's node -- its requested outputs, its
attributes and its inputs' declared types and shapes (``cuda_must_run``) -- never from the
case's name.  Two tests use it:

* on a GPU: each case runs on cuda and the CUDA path's launch counter must move exactly when
  ``cuda_must_run`` says so;
* everywhere (CPU emulator): each case runs with the four operators' CUDA paths wired to the
  emulator, must pass, and must take the CUDA path exactly when ``cuda_must_run`` says so --
  which checks the rule itself against the launch code in CI.
"""

from __future__ import annotations

import importlib

import onnx
import pytest
from onnx import TensorProto

import emulator
from gpukernels.conformance import collect, run_case
from gpukernels.gpu import accelerated
from gpukernels.kernels import specialize
from gpukernels.kernels.nn.attention import Attention
from gpukernels.kernels.nn.conv import Conv
from gpukernels.kernels.nn.linear_attention import LinearAttention
from gpukernels.kernels.nn.rotary import RotaryEmbedding
from gpukernels.xp import cuda_status

OPS = ("Conv", "Attention", "LinearAttention", "RotaryEmbedding")
KERNEL_TYPES = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16}


def _node(case) -> onnx.NodeProto:
    nodes = [n for n in case.testcase.model.graph.node if n.op_type == case.operator]
    assert len(nodes) == 1, f"{case.id}: expected one {case.operator} node"
    return nodes[0]


def _declared(graph) -> dict:
    """name -> (element type, shape as a tuple of ints or None per dim) of the graph inputs."""
    out = {}
    for vi in graph.input:
        tt = vi.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim)
        out[vi.name] = (tt.elem_type, dims)
    return out


def cuda_must_run(case) -> tuple[bool, str]:
    """(whether the CUDA kernel covers case, why not) from the node and its declared inputs."""
    graph = case.testcase.model.graph
    node = _node(case)
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    declared = _declared(graph)
    inputs = [declared.get(name) if name else None for name in node.input]
    if inputs[0][0] not in KERNEL_TYPES:
        return False, f"element type {TensorProto.DataType.Name(inputs[0][0])}"
    if case.operator == "Attention":
        if len(node.output) > 3 and node.output[3]:
            return False, "qk_matmul_output requested: the array path writes it"
        sp = attrs.get("softmax_precision")
        if sp is not None and sp != TensorProto.FLOAT:
            return False, f"softmax_precision {TensorProto.DataType.Name(sp)}"
        if len({i[0] for i in inputs[:3]}) > 1:
            return False, "mixed Q/K/V types"
        q, v = inputs[0][1], inputs[2][1]
        heads = (1, attrs.get("q_num_heads"), attrs.get("kv_num_heads"))
        if len(q) == 3 and (not heads[1] or not heads[2]):
            return False, "3-D inputs without head counts"
        dq = q[-1] if len(q) == 4 else q[-1] // heads[1]
        dv = v[-1] if len(v) == 4 else v[-1] // heads[2]
        if not 0 < max(dq, dv) <= 256 or min(dq, dv) == 0:
            return False, "head size outside 1..256"
    if case.operator == "LinearAttention":
        dk = inputs[0][1][-1] // attrs["q_num_heads"]
        if not 0 < dk <= 128:
            return False, "d_k outside 1..128"
    if case.operator == "Conv" and len(inputs[0][1]) - 2 > 3:
        return False, "more than 3 spatial dims"
    return True, ""


def _cases():
    out = []
    for case in collect(("node",)):
        if case.operator in OPS and not case.name.endswith("_expanded"):
            out.append(pytest.param(case, id=case.id))
    return out


CASES = _cases()


def test_the_rule_reads_the_node_not_the_name():
    by_name = {c.values[0].name: c.values[0] for c in CASES}
    # qk_matmul_output requested with softmax_precision DOUBLE, no "qk_matmul" in the name
    case = by_name.get("test_attention_local_window_gqa_rank4_mask")
    if case is not None:
        covered, why = cuda_must_run(case)
        assert not covered and "qk_matmul_output" in why
    assert cuda_must_run(by_name["test_attention_4d_with_qk_matmul"])[0] is False
    assert cuda_must_run(by_name["test_attention_4d"])[0] is True
    assert cuda_must_run(by_name["test_rotary_embedding_interleaved"])[0] is True


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
def test_case_runs_through_cuda_kernel(case):
    if not cuda_status().available:
        pytest.skip(f"no usable GPU: {cuda_status().reason}")
    with specialize.recording() as chosen:
        outcome = run_case(case, "cuda")
    assert outcome.status == "passed", outcome.message
    launched = sum(s.site == f"{case.operator}.cuda_kernel" for s in chosen)
    covered, why = cuda_must_run(case)
    if covered:
        assert launched > 0, f"{case.id} passed through the array fallback, not the CUDA kernel"
    else:
        assert launched == 0, f"{case.id}: the CUDA kernel ran although {why}"


@pytest.fixture
def emulated_cuda_paths(emu, monkeypatch):
    """The four operators' cuda_path wired to the emulator (device arrays uploaded, results
    copied back); returns the per-operator count of calls the CUDA path covered."""
    counts: dict = {}

    def cuda_path(self, **arguments):
        module = importlib.import_module(accelerated._MODULES[self.op_type])
        extra = module.run_options(self) if hasattr(module, "run_options") else {}
        result = emulator.run_op(module.run, emu, **arguments, **extra)
        if result is not None:
            counts[self.op_type] = counts.get(self.op_type, 0) + 1
        return result

    for cls in (Conv, Attention, LinearAttention, RotaryEmbedding):
        monkeypatch.setattr(cls, "cuda_path", cuda_path)
    return counts


@pytest.mark.parametrize("case", CASES)
def test_case_through_emulated_cuda_kernel(case, emulated_cuda_paths):
    outcome = run_case(case, "cpu")
    assert outcome.status == "passed", outcome.message
    launched = emulated_cuda_paths.get(case.operator, 0)
    covered, why = cuda_must_run(case)
    if covered:
        assert launched > 0, f"{case.id}: the CUDA path did not cover the case"
        emulator.tag("official case", case.operator)
    else:
        assert launched == 0, f"{case.id}: the CUDA path ran although {why}"
