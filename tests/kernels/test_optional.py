"""Optional, OptionalHasElement, OptionalGetElement at every opset version, with tensor
and sequence payloads, directly and through the runtime."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as oh

from gpukernels.dtypes import DataType
from gpukernels.errors import GpuKernelsError, KernelInputError, KernelTypeError
from gpukernels.kernels import KernelContext, load_all
from gpukernels.kernels.base import schema_versions
from gpukernels.tensor import Optional as OptionalValue
from gpukernels.tensor import Sequence, Tensor

load_all()
from gpukernels.kernels.optional import Optional, OptionalGetElement, OptionalHasElement  # noqa: E402

OPT_VERSIONS = schema_versions("Optional")
HAS_VERSIONS = schema_versions("OptionalHasElement")
GET_VERSIONS = schema_versions("OptionalGetElement")


def test_versions_cover_history():
    assert OPT_VERSIONS == [15, 28]
    assert HAS_VERSIONS == [15, 18, 28]
    assert GET_VERSIONS == [15, 18, 28]


def payloads(rng):
    return [
        Tensor(rng.random((2, 3)).astype(np.float32) + 0.5),
        Tensor(rng.integers(1, 9, size=(4,)).astype(np.int64)),
        Tensor(rng.random(3) > 0.5),
        Sequence([Tensor(rng.integers(1, 9, size=(n,)).astype(np.int64)) for n in (1, 2)]),
        Sequence([Tensor(rng.random(2) > 0.5)]),
        Sequence([], DataType.FLOAT),
    ]


def same(a, b):
    if isinstance(a, Sequence):
        assert isinstance(b, Sequence) and a.elem_type == b.elem_type and len(a) == len(b)
        for x, y in zip(a, b):
            same(x, y)
        return
    assert isinstance(b, Tensor) and a.data_type == b.data_type
    np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("version", OPT_VERSIONS)
def test_optional_wraps_and_unwraps(device, rng, version):
    ctx = KernelContext(device, opset=version)
    for p in payloads(rng):
        opt = Optional(ctx)(p)
        assert isinstance(opt, OptionalValue) and opt.value is not None
        for v in [x for x in GET_VERSIONS if x <= max(version, 18)]:
            same(OptionalGetElement(KernelContext(device, opset=v))(opt), p)
        for v in HAS_VERSIONS:
            assert bool(OptionalHasElement(KernelContext(device, opset=v))(opt).numpy()) is True


@pytest.mark.parametrize("version", OPT_VERSIONS)
def test_empty_optional_needs_type(device, version):
    ctx = KernelContext(device, opset=version)
    tp = oh.make_tensor_type_proto(TP.FLOAT, [2])
    e = Optional(ctx)(type=tp)
    assert e.value is None and e.type_proto.HasField("optional_type")
    seq_tp = oh.make_sequence_type_proto(oh.make_tensor_type_proto(TP.INT64, None))
    e2 = Optional(ctx)(None, type=seq_tp)
    assert e2.value is None
    for v in HAS_VERSIONS:
        k = OptionalHasElement(KernelContext(device, opset=v))
        out = k(e)
        assert out.data_type == DataType.BOOL and out.shape == () and not bool(out.numpy())
        assert not bool(k(e2).numpy())
    with pytest.raises(KernelInputError, match="Optional.*'type'"):
        Optional(ctx)()
    with pytest.raises(KernelInputError, match="Optional"):
        Optional(ctx)(type=oh.make_optional_type_proto(tp))
    for v in GET_VERSIONS:
        with pytest.raises(KernelInputError, match="OptionalGetElement.*empty"):
            OptionalGetElement(KernelContext(device, opset=v))(e)


def test_optional_type_must_agree(device, rng):
    k = Optional(KernelContext(device))
    x = rng.random(3).astype(np.float32)
    assert k(x, type=oh.make_tensor_type_proto(TP.FLOAT, [3])).value is not None
    with pytest.raises(KernelTypeError, match="Optional"):
        k(x, type=oh.make_tensor_type_proto(TP.INT64, [3]))
    with pytest.raises(KernelTypeError, match="Optional"):
        k(x, type=oh.make_sequence_type_proto(oh.make_tensor_type_proto(TP.FLOAT, None)))
    with pytest.raises(KernelTypeError, match="Optional"):
        k(OptionalValue(Tensor(x)))


def test_element_types_by_version(device):
    b = np.ones(2, dtype=ml_dtypes.bfloat16)
    with pytest.raises(KernelTypeError, match="Optional"):
        Optional(KernelContext(device, opset=15))(b)
    opt = Optional(KernelContext(device, opset=28))(b)
    assert opt.value.data_type == DataType.BFLOAT16
    assert bool(OptionalHasElement(KernelContext(device, opset=28))(opt).numpy())
    assert OptionalGetElement(KernelContext(device, opset=28))(opt).data_type == DataType.BFLOAT16


@pytest.mark.parametrize("version", HAS_VERSIONS)
def test_has_element_plain_and_missing(device, rng, version):
    k = OptionalHasElement(KernelContext(device, opset=version))
    assert bool(k(rng.random(2).astype(np.float32)).numpy())
    assert bool(k(Sequence([Tensor(np.int64(3))])).numpy())
    assert not bool(k(None).numpy())
    assert not bool(k(Tensor()).numpy())
    assert not bool(k().numpy())


@pytest.mark.parametrize("version", GET_VERSIONS)
def test_get_element_plain(device, rng, version):
    k = OptionalGetElement(KernelContext(device, opset=version))
    x = Tensor(rng.random(3).astype(np.float32))
    same(k(x), x)
    s = Sequence([x, x])
    same(k(s), s)
    with pytest.raises(KernelInputError, match="OptionalGetElement"):
        k(None)


def _vi(name, tp):
    return oh.make_value_info(name, tp)


def test_optionals_through_runtime(device, rng):
    """Optional -> OptionalHasElement -> If(OptionalGetElement | constant) as a model."""
    from gpukernels.runtime import Session

    tt = oh.make_tensor_type_proto(TP.FLOAT, [3])
    then_g = oh.make_graph([oh.make_node("OptionalGetElement", ["opt"], ["got"])], "then", [],
                           [oh.make_tensor_value_info("got", TP.FLOAT, [3])])
    else_g = oh.make_graph([oh.make_node("Constant", [], ["c"], value=onnx.numpy_helper.from_array(
        np.full(3, -1, np.float32)))], "else", [], [oh.make_tensor_value_info("c", TP.FLOAT, [3])])
    nodes = [
        oh.make_node("Optional", ["x"], ["opt"]),
        oh.make_node("Optional", [], ["none"], type=tt),
        oh.make_node("OptionalHasElement", ["opt"], ["has"]),
        oh.make_node("OptionalHasElement", ["none"], ["has_none"]),
        oh.make_node("If", ["has"], ["y"], then_branch=then_g, else_branch=else_g),
    ]
    g = oh.make_graph(nodes, "g", [oh.make_tensor_value_info("x", TP.FLOAT, [3])],
                      [oh.make_tensor_value_info("y", TP.FLOAT, [3]),
                       oh.make_tensor_value_info("has_none", TP.BOOL, []),
                       _vi("none", oh.make_optional_type_proto(tt))])
    for opset in (16, 18, 28):
        m = oh.make_model(g, opset_imports=[oh.make_opsetid("", opset)])
        x = rng.random(3).astype(np.float32)
        y, has_none, none = Session(m, device=device).run(None, {"x": x})
        np.testing.assert_array_equal(y, x)
        assert not bool(has_none)
        assert none is None


def test_error_family(device):
    with pytest.raises(GpuKernelsError):
        OptionalGetElement(KernelContext(device))(OptionalValue(None))
