"""gpukernels.codec against ml_dtypes: every bit pattern, and many float32/float64 values.

ml_dtypes' astype is the non-saturating conversion; the saturating one is ml_dtypes of the
input clipped to +-max (the ONNX Cast table).  NaN results are compared by NaN-ness and
sign only where the format has several NaN codes (bfloat16)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from gpukernels import codec
from gpukernels.dtypes import DataType, info
from gpukernels.host import tuning as table

SMALL = [DataType.FLOAT8E4M3FN, DataType.FLOAT8E4M3FNUZ, DataType.FLOAT8E5M2,
         DataType.FLOAT8E5M2FNUZ, DataType.FLOAT6E2M3, DataType.FLOAT6E3M2, DataType.FLOAT4E2M1]
F8 = SMALL[:4]


def _edge_values(dt) -> np.ndarray:
    """Every representable value, the midpoints between neighbours (ties) and values just
    beside them, overflow thresholds, specials and random values over a wide range."""
    i = info(dt)
    table = np.arange(2 ** i.bits, dtype=np.uint8).view(i.numpy).astype(np.float64)
    finite = np.unique(np.abs(table[np.isfinite(table)]))
    mids = (finite[1:] + finite[:-1]) / 2
    top = finite[-1]
    step = finite[-1] - finite[-2]
    extra = np.array([top + step / 2, top + step / 2 * 0.999, top + step / 2 * 1.001, top * 2,
                      top + step, 1e30, 3.4e38, np.inf, np.nan, 0.0, 1e-45, 1e-40, 1e-30,
                      float(finite[1]) / 2, float(finite[1]) / 2 * 1.0001])
    base = np.concatenate([finite, mids, np.nextafter(mids, 0), np.nextafter(mids, np.inf), extra])
    rng = np.random.default_rng(7)
    rand = np.concatenate([rng.standard_normal(20000) * float(top) / 4,
                           np.exp(rng.uniform(-120, 88, 20000))])
    vals = np.concatenate([base, rand])
    vals = np.concatenate([vals, -vals]).astype(np.float32)
    return vals


def _expected(x, dt, saturate):
    i = info(dt)
    if saturate or dt not in F8:
        top = float(ml_dtypes.finfo(i.numpy).max)
        with np.errstate(invalid="ignore"):
            x = np.where(np.isnan(x), x, np.clip(x, -top, top)).astype(x.dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        return x.astype(i.numpy).view(np.uint8)


@pytest.mark.parametrize("dt", SMALL + [DataType.FLOAT8E8M0], ids=lambda d: d.name)
def test_decode_every_pattern(dt):
    i = info(dt)
    codes = np.arange(2 ** i.bits, dtype=np.uint8)
    got = codec.decode(np, codes, dt)
    want = codes.view(i.numpy).astype(np.float32)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)


def test_decode_bfloat16_every_pattern():
    codes = np.arange(2 ** 16, dtype=np.uint32).astype(np.uint16)
    got = codec.decode(np, codes, DataType.BFLOAT16)
    want = codes.view(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("saturate", [True, False])
@pytest.mark.parametrize("dt", SMALL, ids=lambda d: d.name)
def test_encode_roundtrip_every_pattern(dt, saturate):
    i = info(dt)
    codes = np.arange(2 ** i.bits, dtype=np.uint8)
    values = codes.view(i.numpy).astype(np.float32)
    got = codec.encode(np, values, dt, saturate)
    assert got.dtype == np.uint8
    np.testing.assert_array_equal(got, _expected(values, dt, saturate))
    # every non-NaN code maps back to itself (fnuz and fp4/fp6 have no -0 duplicates issue)
    keep = np.isfinite(values)
    np.testing.assert_array_equal(got[keep], codes[keep])


@pytest.mark.parametrize("saturate", [True, False])
@pytest.mark.parametrize("dt", SMALL, ids=lambda d: d.name)
def test_encode_float32_edges(dt, saturate):
    x = _edge_values(dt)
    got = codec.encode(np, x, dt, saturate)
    want = _expected(x, dt, saturate)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"{bad.size} mismatches, e.g. x={x[bad[:5]]} got={got[bad[:5]]} want={want[bad[:5]]}"


def _nearest_even_oracle(x: np.ndarray, dt) -> np.ndarray:
    """Exact round-to-nearest-even of float64 magnitudes within range, by table search
    (ml_dtypes rounds float64 through float32, which double-rounds)."""
    i = info(dt)
    codes = np.arange(2 ** i.bits, dtype=np.uint8)
    table = codes.view(i.numpy).astype(np.float64)
    pos = np.isfinite(table) & ~np.signbit(table)
    vals, ccodes = table[pos], codes[pos]
    order = np.argsort(vals)
    vals, ccodes = vals[order], ccodes[order]
    a = np.abs(x)
    hi = np.clip(np.searchsorted(vals, a), 1, vals.size - 1)
    lo = hi - 1
    dlo, dhi = a - vals[lo], vals[hi] - a
    pick = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(ccodes[lo] % 2 == 0, lo, hi)))
    code = ccodes[pick]
    sign = np.uint8(1 << (i.bits - 1))
    if dt in (DataType.FLOAT8E4M3FNUZ, DataType.FLOAT8E5M2FNUZ):
        return np.where(np.signbit(x) & (code != 0), code | sign, code).astype(np.uint8)
    return np.where(np.signbit(x), code | sign, code).astype(np.uint8)


@pytest.mark.parametrize("dt", SMALL, ids=lambda d: d.name)
def test_encode_float64_direct_rounding(dt):
    """float64 input rounds once (no detour through float32)."""
    top = float(ml_dtypes.finfo(info(dt).numpy).max)
    x = _edge_values(dt).astype(np.float64)
    x = np.concatenate([x, np.nextafter(x, np.inf), np.nextafter(x, -np.inf)])
    x = x[np.isfinite(x) & (np.abs(x) <= top)]
    got = codec.encode(np, x, dt, False)
    np.testing.assert_array_equal(got, _nearest_even_oracle(x, dt))
    assert (got == _nearest_even_oracle(x, dt)).all()


def test_onnx_table_specials():
    """The ONNX Cast tables, spelled out."""
    x = np.array([np.inf, -np.inf, 1e6, -1e6, np.nan, -0.0], np.float32)
    e4 = DataType.FLOAT8E4M3FN
    assert list(codec.encode(np, x, e4, True)) == [0x7E, 0xFE, 0x7E, 0xFE, 0x7F, 0x80]
    assert list(codec.encode(np, x, e4, False)) == [0x7F, 0xFF, 0x7F, 0xFF, 0x7F, 0x80]
    e5 = DataType.FLOAT8E5M2
    assert list(codec.encode(np, x, e5, True)) == [0x7B, 0xFB, 0x7B, 0xFB, 0x7E, 0x80]
    assert list(codec.encode(np, x, e5, False)) == [0x7C, 0xFC, 0x7C, 0xFC, 0x7E, 0x80]
    for uz in (DataType.FLOAT8E4M3FNUZ, DataType.FLOAT8E5M2FNUZ):
        assert list(codec.encode(np, x, uz, True)) == [0x7F, 0xFF, 0x7F, 0xFF, 0x80, 0x00]
        assert list(codec.encode(np, x, uz, False)) == [0x80, 0x80, 0x80, 0x80, 0x80, 0x00]
    # ties to even: 464 lies halfway between 448 (max, even mantissa) and 480 (NaN code)
    assert codec.encode(np, np.float32([464.0, 465.0]), e4, False).tolist() == [0x7E, 0x7F]


def test_bfloat16_every_float32_pattern_sample():
    rng = np.random.default_rng(3)
    u = np.concatenate([rng.integers(0, 2 ** 32, 400000, dtype=np.uint64).astype(np.uint32),
                        np.arange(0, 2 ** 20, dtype=np.uint32),  # subnormals, ties
                        np.arange(0x7F7F0000, 0x7F800001, 7, dtype=np.uint32),  # overflow edge
                        (np.arange(2 ** 16, dtype=np.uint32) << 16) | 0x8000])  # exact ties
    u = np.concatenate([u, u | np.uint32(0x80000000)])
    x = u.view(np.float32)
    got = codec.encode(np, x, DataType.BFLOAT16)
    with np.errstate(invalid="ignore"):
        want = x.astype(ml_dtypes.bfloat16).view(np.uint16)
    nan = np.isnan(x)
    np.testing.assert_array_equal(got[~nan], want[~nan])
    g = got[nan].view(ml_dtypes.bfloat16).astype(np.float32)
    assert np.isnan(g).all()
    np.testing.assert_array_equal(np.signbit(g), np.signbit(x[nan]))


def test_bfloat16_float64_input():
    rng = np.random.default_rng(4)
    x = np.concatenate([rng.standard_normal(50000) * 1e3, [1e300, -1e300, np.inf, 0.0, -0.0, 1e-300]])
    got = codec.encode(np, x, DataType.BFLOAT16)
    with np.errstate(over="ignore"):
        want = x.astype(ml_dtypes.bfloat16).view(np.uint16)
    np.testing.assert_array_equal(got, want)


def _e8m0_oracle(a: float, saturate: bool, mode: str) -> int:
    import math

    if math.isnan(a):
        return 255
    a = abs(a)
    if math.isinf(a) or a == 0:
        if not saturate:
            return 255
        return 254 if math.isinf(a) else 0
    m, e = math.frexp(a)
    k, f = e - 1, m * 2 - 1
    if mode == "up" and f > 0:
        k += 1
    if mode == "nearest" and f >= 0.5:
        k += 1
    code = k + 127
    if code > 254:
        return 254 if saturate else 255
    if code < 0:
        return 0 if saturate else 255
    return code


@pytest.mark.parametrize("mode", ["up", "down", "nearest"])
@pytest.mark.parametrize("saturate", [True, False])
def test_e8m0(mode, saturate):
    rng = np.random.default_rng(5)
    x = np.concatenate([np.exp2(np.arange(-149, 128)).astype(np.float32),
                        np.exp2(np.arange(-149, 128)) * 1.5, np.exp2(np.arange(-149, 128)) * 1.25,
                        np.exp2(np.arange(-149, 128)) * 1.75,
                        np.exp(rng.uniform(-100, 88, 3000)), [0.0, np.inf, np.nan, 3.4e38]]).astype(np.float32)
    got = codec.encode(np, x, DataType.FLOAT8E8M0, saturate, mode)
    want = [_e8m0_oracle(float(v), saturate, mode) for v in x]
    np.testing.assert_array_equal(got, want)
    if mode == "up" and saturate:
        from onnx.numpy_helper import to_float8e8m0

        normal = (x >= 2.0 ** -126) & np.isfinite(x)
        np.testing.assert_array_equal(got[normal], to_float8e8m0(x[normal]).view(np.uint8))
    # exact powers of two encode exactly in every mode
    p = np.exp2(np.arange(-127, 128)).astype(np.float32)
    np.testing.assert_array_equal(codec.encode(np, p, DataType.FLOAT8E8M0, saturate, mode),
                                  np.arange(0, 255))


def test_e8m0_bad_mode():
    with pytest.raises(ValueError):
        codec.encode(np, np.ones(2, np.float32), DataType.FLOAT8E8M0, True, "sideways")


# ------------------------------------------------------------------ host float32 fast path


def _arith(x, dt, saturate):
    """The array-arithmetic encoder (_encode_binary: float64 input; builds the float32 table)."""
    sat = False if dt == DataType.BFLOAT16 else saturate
    return codec._encode_binary(np, x, codec.FORMATS[dt], sat, info(dt).storage)


@pytest.mark.parametrize("saturate", [True, False])
@pytest.mark.parametrize("dt", SMALL, ids=lambda d: d.name)
def test_float32_table_every_class(dt, saturate):
    """The lookup table covers every float32: each (top 16 bits, lower bits zero / not)
    class, probed at its representative and at the ends of the nonzero class, encodes as
    the arithmetic path and as ml_dtypes."""
    hi = np.arange(2 ** 16, dtype=np.uint32) << 16
    for low in (0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF):
        x = (hi | np.uint32(low)).view(np.float32)
        got = codec.encode(np, x, dt, saturate)
        np.testing.assert_array_equal(got, _arith(x, dt, saturate))
        nan = np.isnan(x)
        np.testing.assert_array_equal(got[~nan], _expected(x[~nan], dt, saturate))


def test_float32_host_paths_match_arithmetic():
    """Chunked host path == arithmetic path on random bit patterns (several chunks,
    a ragged last one, a non-contiguous and a 2-D input)."""
    rng = np.random.default_rng(11)
    u = rng.integers(0, 2 ** 32, table.value("codec.encode_chunk_cpu") * 2 + 123, dtype=np.uint64).astype(np.uint32)
    x = u.view(np.float32)
    for dt in SMALL + [DataType.BFLOAT16]:
        for sat in (True, False):
            want = _arith(x, dt, sat)
            np.testing.assert_array_equal(codec.encode(np, x, dt, sat), want)
            np.testing.assert_array_equal(codec.encode(np, x[::3], dt, sat), want[::3])
            got2 = codec.encode(np, x[:600].reshape(20, 30), dt, sat)
            assert got2.shape == (20, 30)
            np.testing.assert_array_equal(got2.reshape(-1), want[:600])
    assert codec.encode(np, np.zeros((0, 3), np.float32), DataType.FLOAT8E4M3FN).shape == (0, 3)


def test_float32_encode_and_decode_on_each_device(device, tuning):
    """encode (float32 input) and decode run the same array code on NumPy and CuPy: equal
    bit patterns on both devices, over several chunks of the device's codec.encode_chunk_*
    (host/tuning.py), a ragged last one and NaNs of both signs."""
    from gpukernels.xp import namespace, to_device, to_host

    tuning({f"codec.encode_chunk_{'cuda' if device == 'cuda' else 'cpu'}": 1000})
    xp = namespace(device)
    rng = np.random.default_rng(12)
    u = rng.integers(0, 2 ** 32, 2 * 1000 + 79, dtype=np.uint64).astype(np.uint32)
    x = u.view(np.float32).reshape(-1, 7)
    xd = to_device(x, device)
    for dt in SMALL + [DataType.BFLOAT16]:
        for sat in (True, False):
            got = codec.encode(xp, xd, dt, sat)
            assert got.shape == x.shape and got.dtype == info(dt).storage
            want = _arith(x.reshape(-1), dt, sat).reshape(x.shape)
            np.testing.assert_array_equal(to_host(got), want, err_msg=f"{dt.name} saturate={sat}")
            back = to_host(codec.decode(xp, got, dt))
            np.testing.assert_array_equal(back, codec.decode(np, want, dt), err_msg=dt.name)
