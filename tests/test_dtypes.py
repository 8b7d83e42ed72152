import ml_dtypes
import numpy as np
import onnx
import pytest

from gpukernels import dtypes
from gpukernels.dtypes import DataType
from gpukernels.tensor import array_from_proto, array_to_proto


def test_every_onnx_type_is_mapped():
    for name, value in onnx.TensorProto.DataType.items():
        if value == 0:
            continue
        info = dtypes.info(value)
        assert info.name == name
        assert info.data_type == value
        if value != DataType.STRING:
            assert onnx.helper.tensor_dtype_to_np_dtype(value) == info.numpy


@pytest.mark.parametrize("dt, bits", [(DataType.INT4, 4), (DataType.UINT2, 2), (DataType.FLOAT4E2M1, 4),
                                      (DataType.BFLOAT16, 16), (DataType.DOUBLE, 64), (DataType.FLOAT8E8M0, 8)])
def test_bit_widths(dt, bits):
    assert dtypes.bit_width(dt) == bits


def test_lookup_by_name_and_numpy():
    assert dtypes.info("tensor(float)").data_type == DataType.FLOAT
    assert dtypes.info("bfloat16").data_type == DataType.BFLOAT16
    assert dtypes.from_numpy(np.dtype(ml_dtypes.float8_e5m2)).data_type == DataType.FLOAT8E5M2
    assert dtypes.from_numpy(np.dtype("U3")).data_type == DataType.STRING
    with pytest.raises(TypeError):
        dtypes.info(99)


@pytest.mark.parametrize("dt", [DataType.INT4, DataType.UINT4, DataType.INT2, DataType.UINT2, DataType.FLOAT4E2M1])
def test_packed_round_trip(dt, rng):
    info = dtypes.info(dt)
    codes = rng.integers(0, 2 ** info.bits, size=7).astype(np.uint8)
    arr = codes.view(info.numpy) if info.kind == "float" else codes.astype(np.int64)
    if info.kind != "float":
        lo = -(2 ** (info.bits - 1)) if info.kind == "int" else 0
        arr = (codes.astype(np.int64) % (2 ** info.bits) + lo).astype(info.numpy)
    proto = array_to_proto(arr)
    # packed: 7 elements of <=4 bits take at most 4 bytes
    assert len(proto.raw_data) <= 4 or len(proto.int32_data) <= 7
    back = array_from_proto(proto)
    assert back.dtype == arr.dtype
    np.testing.assert_array_equal(back.view(np.uint8) if info.kind == "float" else back.astype(np.int64),
                                  arr.view(np.uint8) if info.kind == "float" else arr.astype(np.int64))


def test_string_round_trip():
    arr = np.array(["a", "bé", ""], dtype=object)
    back = array_from_proto(array_to_proto(arr))
    assert [x.decode() if isinstance(x, bytes) else x for x in back] == ["a", "bé", ""]
