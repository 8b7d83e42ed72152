"""Cast, CastLike, BitCast against simple references; CPU path == codec path."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from gpukernels import codec
from gpukernels.dtypes import DataType as D
from gpukernels.dtypes import info
from gpukernels.errors import KernelInputError, KernelTypeError
from gpukernels.kernels import KernelContext
from gpukernels.kernels.tensor.cast import BitCast, Cast, CastLike
from gpukernels.tensor import Tensor

NUMERIC = [D.FLOAT, D.DOUBLE, D.FLOAT16, D.BFLOAT16, D.INT8, D.UINT8, D.INT16, D.UINT16, D.INT32, D.UINT32,
           D.INT64, D.UINT64, D.BOOL, D.FLOAT8E4M3FN, D.FLOAT8E4M3FNUZ, D.FLOAT8E5M2, D.FLOAT8E5M2FNUZ,
           D.UINT4, D.INT4, D.FLOAT4E2M1, D.FLOAT8E8M0, D.UINT2, D.INT2, D.FLOAT6E2M3, D.FLOAT6E3M2]


def ref_int(v: float, bits: int, signed: bool) -> int:
    """The documented float -> integer rule, in Python integers."""
    if math.isnan(v) or math.isinf(v):
        return 0
    t = int(v)  # trunc toward zero, exact
    t %= 1 << bits
    if signed and t >= 1 << (bits - 1):
        t -= 1 << bits
    return t


def _sample(rng, dt) -> np.ndarray:
    i = info(dt)
    if i.kind == "bool":
        return rng.integers(0, 2, 40).astype(bool)
    if i.kind in ("int", "uint"):
        lo = -(2 ** (i.bits - 1)) if i.kind == "int" else 0
        hi = 2 ** (i.bits - 1) - 1 if i.kind == "int" else 2 ** i.bits - 1
        vals = rng.integers(max(lo, -1000), min(hi, 1000) + 1, 40)
        return np.append(vals.astype(i.numpy), np.array([lo, hi], dtype=i.numpy))
    vals = np.concatenate([rng.standard_normal(40) * 3, [0.5, 1.0, 2.0, 4.0]]).astype(np.float32)
    if dt == D.FLOAT8E8M0:
        vals = np.abs(vals) + 0.1
    return vals.astype(i.numpy)


def _ints(values, out) -> np.ndarray:
    wide = np.uint64 if out.kind == "uint" else np.int64
    return np.array(values, dtype=wide).astype(out.numpy)


def _reference(src: np.ndarray, to: D, saturate=True) -> np.ndarray:
    """Element-wise reference via float64 / Python ints and ml_dtypes for small floats."""
    out = info(to)
    if src.dtype == np.bool_ or src.dtype.kind in "iu" or src.dtype in (ml_dtypes.int4, ml_dtypes.uint4,
                                                                       ml_dtypes.int2, ml_dtypes.uint2):
        ints = [int(v) for v in (src.reshape(-1).tolist() if src.dtype == np.uint64 else
                                 src.astype(np.int64).reshape(-1))]
        if to == D.BOOL:
            return np.array([v != 0 for v in ints], bool)
        if out.kind in ("int", "uint"):
            wrapped = [v % (1 << out.bits) for v in ints]
            if out.kind == "int":
                wrapped = [w - (1 << out.bits) if w >= 1 << (out.bits - 1) else w for w in wrapped]
            return _ints(wrapped, out)
        vals = np.array(ints, dtype=np.float64)
    else:
        vals = src.astype(np.float64).reshape(-1)
        if to == D.BOOL:
            return vals != 0
        if out.kind in ("int", "uint"):
            return _ints([ref_int(v, out.bits, out.kind == "int") for v in vals], out)
    if to in (D.FLOAT, D.DOUBLE, D.FLOAT16):
        with np.errstate(over="ignore"):
            return vals.astype(out.numpy)
    bits = codec.encode(np, vals, to, saturate)
    return bits.view(out.numpy)


@pytest.mark.parametrize("src", NUMERIC, ids=lambda d: d.name)
def test_cast_every_pair(device, rng, src):
    k = Cast(KernelContext(device))
    x = _sample(rng, src)
    for to in NUMERIC:
        got = k(Tensor(x, src), to=int(to)).numpy()
        want = _reference(x, to)
        assert got.dtype == info(to).numpy, (src, to)
        if info(to).kind == "float":
            np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64), err_msg=f"{src}->{to}")
        else:
            np.testing.assert_array_equal(got, want, err_msg=f"{src}->{to}")


def test_float_to_int_rule(device):
    k = Cast(KernelContext(device))
    x = np.array([300.7, -1.5, np.nan, np.inf, -np.inf, -9, 1e20, -1e30, 2.0 ** 63, 2.0 ** 64 + 4096,
                  -(2.0 ** 63), 65535.9, -0.9], np.float64)
    for to in (D.INT8, D.UINT8, D.INT16, D.UINT16, D.INT32, D.UINT32, D.INT64, D.UINT64, D.INT4, D.UINT4,
               D.INT2, D.UINT2):
        i = info(to)
        got = k(x, to=int(to)).numpy().astype(object)
        want = [ref_int(v, i.bits, i.kind == "int") for v in x]
        assert [int(v) for v in got] == want, to
    assert k(np.float32([300.7]), to=int(D.INT8)).numpy().tolist() == [44]
    assert k(np.float32([-9.0]), to=int(D.INT4)).numpy().astype(int).tolist() == [7]


@pytest.mark.parametrize("to", [D.BFLOAT16, D.FLOAT8E4M3FN, D.FLOAT8E4M3FNUZ, D.FLOAT8E5M2, D.FLOAT8E5M2FNUZ,
                                D.FLOAT4E2M1, D.FLOAT6E2M3, D.FLOAT6E3M2, D.FLOAT8E8M0], ids=lambda d: d.name)
@pytest.mark.parametrize("saturate", [0, 1])
def test_host_path_agrees_with_codec(rng, to, saturate):
    x = np.concatenate([rng.standard_normal(5000) * 100, [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e6, -1e6,
                                                           464.0, 1e-7, 5e-8]]).astype(np.float32)
    if to == D.FLOAT8E8M0:
        x = np.abs(x)
    for src in (np.float32, np.float16):
        with np.errstate(over="ignore"):
            xs = x.astype(src)
        got = Cast()(xs, to=int(to), saturate=saturate).numpy().view(np.uint8 if info(to).bits <= 8 else np.uint16)
        want = codec.encode(np, xs, to, bool(saturate))
        np.testing.assert_array_equal(got, want)


def test_saturate_tables():
    x = np.array([np.inf, -np.inf, 1e6, np.nan, -0.0], np.float32)
    r = Cast()(x, to=int(D.FLOAT8E4M3FN)).numpy().astype(np.float32)
    assert r[:3].tolist() == [448, -448, 448] and np.isnan(r[3]) and np.signbit(r[4])
    r = Cast()(x, to=int(D.FLOAT8E5M2), saturate=0).numpy().astype(np.float32)
    assert r[:3].tolist() == [np.inf, -np.inf, np.inf]
    r = Cast()(x, to=int(D.FLOAT8E4M3FNUZ), saturate=0).numpy().astype(np.float32)
    assert np.isnan(r[:4]).all() and not np.signbit(r[4])


def test_e8m0_round_modes():
    x = np.float32([3.0, 1.5, 1.25, 0.0])
    up = Cast()(x, to=int(D.FLOAT8E8M0)).numpy().astype(np.float32).tolist()
    down = Cast()(x, to=int(D.FLOAT8E8M0), round_mode="down").numpy().astype(np.float32).tolist()
    near = Cast()(x, to=int(D.FLOAT8E8M0), round_mode="nearest").numpy().astype(np.float32)
    assert up[:3] == [4.0, 2.0, 2.0] and down[:3] == [2.0, 1.0, 1.0] and near[:3].tolist() == [4.0, 2.0, 1.0]
    assert up[3] == 2.0 ** -127
    assert np.isnan(Cast()(x, to=int(D.FLOAT8E8M0), saturate=0, round_mode="nearest").numpy().astype(np.float32)[3])
    with pytest.raises(KernelInputError, match="Cast"):
        Cast()(x, to=int(D.FLOAT8E8M0), round_mode="sideways")


def test_strings_both_ways(device):
    k = Cast(KernelContext(device))
    s = np.array(["1e5", " -INF", "NaN", "+inf", "3.5", "1E-3", "inf", "-nan"], dtype=object)
    f = k(Tensor(s, D.STRING), to=int(D.FLOAT)).numpy()
    np.testing.assert_array_equal(f[[0, 1, 3, 4, 5, 6]], np.float32([1e5, -np.inf, np.inf, 3.5, 1e-3, np.inf]))
    assert np.isnan(f[2]) and np.isnan(f[7])
    i = k(Tensor(np.array(["9223372036854775807", "-3", "12"], object), D.STRING), to=int(D.INT64)).numpy()
    assert i.tolist() == [2 ** 63 - 1, -3, 12]
    assert k(Tensor(np.array(["100.5", "-2.7"], object), D.STRING), to=int(D.INT32)).numpy().tolist() == [100, -2]
    out = k(np.float32([0.1, 1e-7, np.nan, np.inf, -2.0]), to=int(D.STRING)).numpy()
    assert out.tolist() == ["0.1", "1e-07", "nan", "inf", "-2.0"]
    assert k(np.int64([-5, 7]), to=int(D.STRING)).numpy().tolist() == ["-5", "7"]
    back = k(Tensor(out, D.STRING), to=int(D.FLOAT)).numpy()
    np.testing.assert_array_equal(back[[0, 1, 3, 4]], np.float32([0.1, 1e-7, np.inf, -2.0]))
    with pytest.raises(KernelInputError, match="Cast"):
        k(Tensor(np.array(["hello"], object), D.STRING), to=int(D.FLOAT))


def test_cast_out_and_no_mutation(device):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    keep = x.copy()
    buf = np.zeros((2, 3), np.int32)
    k = Cast(KernelContext(device))
    if device == "cpu":
        r = k(x, to=int(D.INT32), out=buf)
        assert r.array is buf and buf.tolist() == [[0, 1, 2], [3, 4, 5]]
    np.testing.assert_array_equal(x, keep)
    with pytest.raises(KernelInputError):
        Cast()(x, to=int(D.INT32), out=np.zeros((3, 2), np.int32))


def test_cast_opset1_string_to_and_errors():
    k = Cast(KernelContext(opset=1))
    assert k(np.float32([1.5]), to="INT32").numpy().tolist() == [1]
    with pytest.raises(KernelTypeError, match="Cast"):
        Cast(KernelContext(opset=6))(np.float32([1.5]), to=int(D.BFLOAT16))
    with pytest.raises(KernelInputError, match="Cast"):
        Cast()(np.float32([1.5]))
    assert Cast()(np.zeros((0, 3), np.float32), to=int(D.BFLOAT16)).shape == (0, 3)


def test_castlike(device):
    like = Tensor(np.zeros(1, ml_dtypes.bfloat16), D.BFLOAT16)
    r = CastLike(KernelContext(device))(np.float32([1.00390625, 3.0]), like)
    assert r.data_type == D.BFLOAT16 and r.numpy().astype(np.float32).tolist() == [1.0, 3.0]
    r = CastLike()(np.float32([1e6]), Tensor(np.zeros(1, ml_dtypes.float8_e4m3fn)), saturate=0)
    assert np.isnan(r.numpy().astype(np.float32)[0])


def test_bitcast(device):
    k = BitCast(KernelContext(device))
    x = np.float32([1.0, -2.5, 3.75])
    assert k(x, to=int(D.INT32)).numpy().tolist() == x.view(np.int32).tolist()
    assert k(np.int8([-1, -128, 127]), to=int(D.UINT8)).numpy().tolist() == [255, 128, 127]
    assert k(np.uint16([0x3F80]), to=int(D.BFLOAT16)).numpy().astype(np.float32).tolist() == [1.0]
    assert k(np.float64([1.0]), to=int(D.UINT64)).numpy().tolist() == [0x3FF0000000000000]
    assert k(np.complex64([1 + 2j]), to=int(D.UINT64)).numpy().tolist() == [np.complex64(1 + 2j).view(np.uint64)]
    assert k(Tensor(np.int8([-1, 7, -8]), D.INT4), to=int(D.UINT4)).numpy().astype(int).tolist() == [15, 7, 8]
    assert k(Tensor(np.uint8([15, 1]), D.UINT4), to=int(D.INT4)).numpy().astype(int).tolist() == [-1, 1]
    assert k(Tensor(np.uint8([2]), D.UINT4), to=int(D.FLOAT4E2M1)).numpy().astype(np.float32).tolist() == [1.0]
    assert k(np.uint8([0, 1, 2]), to=int(D.BOOL)).numpy().tolist() == [False, True, True]
    assert k(np.array([True, False]), to=int(D.UINT8)).numpy().tolist() == [1, 0]
    with pytest.raises(KernelInputError, match="BitCast.*widths"):
        k(x, to=int(D.INT64))
    with pytest.raises(KernelTypeError, match="BitCast"):
        k(Tensor(np.array(["a"], object), D.STRING), to=int(D.INT8))
