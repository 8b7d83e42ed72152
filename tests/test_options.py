"""Options (gpukernels.options): one checked dataclass; runtime state kept beside the
context (gpukernels.runtime.environment), not inside it."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from gpukernels.errors import OptionError
from gpukernels.kernels.base import KernelContext
from gpukernels.options import OPTIONS, Options
from gpukernels.runtime.environment import environment_of
from gpukernels.runtime.session import Session


def test_every_option_is_documented_with_its_default():
    assert set(OPTIONS) == {f for f in Options.__dataclass_fields__}
    assert all(len(text) > 20 for text in OPTIONS.values())
    assert Options().cuda_kernels == "auto" and Options().fold_constants is True


@pytest.mark.parametrize("key, value, wanted", [
    ("cuda_kernels", "sometimes", "one of 'auto', 'always', 'never'"),
    ("fold_constants", "yes", "True or False"),
    ("seed", 1.5, "an integer"),
    ("attention_block_bytes", 0, "a positive integer"),
    ("linear_attention_mode", "fast", "'recurrent'"),
    ("kernel_overrides", ["Relu"], "a dict"),
])
def test_a_value_of_the_wrong_kind_names_the_option(key, value, wanted):
    with pytest.raises(OptionError, match=f"option '{key}' must be .*{wanted}.*got"):
        KernelContext(options={key: value})


def test_options_must_be_a_mapping():
    with pytest.raises(OptionError, match="must be a dict"):
        KernelContext(options=[("seed", 1)])


def test_checked_values_are_read_through_settings():
    ctx = KernelContext(options={"seed": np.int64(7), "fold_constants": 0, "cuda_kernels": "never"})
    assert ctx.settings.seed == 7 and not ctx.settings.fold_constants
    assert ctx.option("seed") == 7 and ctx.option("attention_block_bytes", 123) == 123
    with pytest.raises(OptionError, match="no option named 'sed'"):
        ctx.option("sed")


def _model_with_function():
    f = helper.make_function("local", "Twice", ["a"], ["b"], [helper.make_node("Add", ["a", "a"], ["b"])],
                             [helper.make_opsetid("", 18)])
    body = helper.make_graph([helper.make_node("Twice", ["x"], ["y"], domain="local")], "then",
                             [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["out"], then_branch=body, else_branch=body)], "g",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("local", 1)],
                             functions=[f])


def test_runtime_state_lives_beside_the_context():
    s = Session(_model_with_function())
    out = s.run(None, {"c": np.array(True), "x": np.array([1.5, -2.0], np.float32)})[0]
    np.testing.assert_array_equal(out, [3.0, -4.0])  # the If branch found the model's function
    env = environment_of(s.ctx)
    assert ("local", "Twice") in env.functions or any("Twice" in str(k) for k in env.functions)
    # nothing of the runtime's is kept in the context's attributes
    assert not [k for k in vars(s.ctx) if k.startswith("_")]
