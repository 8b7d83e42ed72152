import ml_dtypes
import numpy as np
import onnx
import pytest

from gpukernels import DataType, Optional, Sequence, Tensor
from gpukernels.errors import DeviceError, KernelTypeError


def test_from_array_scalar_list():
    t = Tensor(np.arange(6, dtype=np.int32).reshape(2, 3))
    assert t.shape == (2, 3) and t.data_type == DataType.INT32 and t.device.kind == "cpu"
    assert Tensor(3.5).data_type == DataType.DOUBLE
    assert Tensor([1, 2], DataType.FLOAT).dtype == np.float32
    assert Tensor(["a", "b"]).data_type == DataType.STRING


def test_absent():
    t = Tensor()
    assert t.is_absent
    with pytest.raises(ValueError):
        t.numpy()


def test_exotic_types_keep_exact_dtype():
    x = np.array([1.5, -2.25], dtype=ml_dtypes.bfloat16)
    t = Tensor(x)
    assert t.data_type == DataType.BFLOAT16
    assert t.numpy().dtype == ml_dtypes.bfloat16
    t8 = Tensor(np.array([0.5], np.float32), DataType.FLOAT8E4M3FN)
    assert t8.numpy().dtype == ml_dtypes.float8_e4m3fn


def test_proto_round_trip(rng):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    t = Tensor.from_proto(onnx.numpy_helper.from_array(x))
    np.testing.assert_array_equal(t.numpy(), x)
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(t.to_proto("x")), x)


def test_dlpack(rng):
    x = rng.standard_normal(5).astype(np.float32)
    t = Tensor.from_dlpack(x)
    np.testing.assert_array_equal(np.from_dlpack(t), x)
    with pytest.raises(KernelTypeError):
        Tensor(x.astype(ml_dtypes.bfloat16)).__dlpack__()


def test_strings_stay_on_host():
    with pytest.raises(DeviceError):
        Tensor(["a"]).to("cuda")


def test_to_cpu_is_identity():
    t = Tensor(np.ones(3, np.float32))
    assert t.to("cpu") is t


def test_sequence_and_optional():
    s = Sequence([np.ones(2, np.int64), np.zeros(3, np.int64)])
    assert len(s) == 2 and s.elem_type == DataType.INT64
    with pytest.raises(KernelTypeError):
        Sequence([np.ones(2, np.int64), np.ones(2, np.float32)])
    assert Sequence([], DataType.BOOL).elem_type == DataType.BOOL
    o = Optional()
    assert not o.has_value
    assert Optional(s).has_value
