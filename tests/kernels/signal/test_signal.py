"""DFT, STFT, windows and MelWeightMatrix against float64 references written from the
definitions (explicit DFT sums, window formulas, loops)."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from gpukernels.dtypes import DataType as D
from gpukernels.errors import KernelInputError, KernelTypeError
from gpukernels.kernels.base import KernelContext
from gpukernels.kernels.signal.dft import DFT, STFT
from gpukernels.kernels.signal.windows import BlackmanWindow, HammingWindow, HannWindow, MelWeightMatrix


def ref_dft(x, axis, n=None, inverse=False, onesided=False):
    """x: [..., 1|2] float64.  Direct O(n^2) sums."""
    sig = x[..., 0] + (1j * x[..., 1] if x.shape[-1] == 2 else 0)
    sig = np.moveaxis(sig, axis, -1)
    dim = sig.shape[-1]
    if onesided and inverse:
        n = n or 2 * (dim - 1)
        half = n // 2 + 1
        spec = np.zeros(sig.shape[:-1] + (half,), complex)
        m = min(half, dim)
        spec[..., :m] = sig[..., :m]
        full = np.zeros(sig.shape[:-1] + (n,), complex)
        full[..., :half] = spec
        for k in range(1, n - half + 1):
            full[..., n - k] = np.conj(spec[..., k])
        # Hermitian completion ignores imaginary parts of bins 0 and n/2
        full[..., 0] = full[..., 0].real
        if n % 2 == 0:
            full[..., n // 2] = full[..., n // 2].real
        t = np.arange(n)
        y = np.einsum("...k,nk->...n", full, np.exp(2j * np.pi * np.outer(t, t) / n)) / n
        return np.moveaxis(y.real, -1, axis)[..., None]
    n = n or dim
    padded = np.zeros(sig.shape[:-1] + (n,), complex)
    m = min(n, dim)
    padded[..., :m] = sig[..., :m]
    t = np.arange(n)
    mat = np.exp((2j if inverse else -2j) * np.pi * np.outer(t, t) / n)
    y = np.einsum("...t,kt->...k", padded, mat)
    if inverse:
        y /= n
    if onesided:
        y = y[..., : n // 2 + 1]
    y = np.moveaxis(y, -1, axis)
    return np.stack([y.real, y.imag], -1)


@pytest.mark.parametrize("complex_in", [False, True])
@pytest.mark.parametrize("inverse", [0, 1])
@pytest.mark.parametrize("onesided", [0, 1])
@pytest.mark.parametrize("axis", [1, 2, -2, -3])
@pytest.mark.parametrize("n", [None, 5, 12])
def test_dft_opset20(device, rng, complex_in, inverse, onesided, axis, n):
    x = rng.standard_normal((2, 8, 6, 2 if complex_in else 1)).astype(np.float64)
    k = DFT(KernelContext(device))
    y = k(x, None if n is None else np.int64(n), np.int64(axis), inverse=inverse, onesided=onesided)
    exp = ref_dft(x, axis % 4, n, bool(inverse), bool(onesided))
    assert y.shape == exp.shape
    np.testing.assert_allclose(y.numpy(), exp, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("dt,tol", [(np.float32, 1e-4), (np.float16, 2e-2), (ml_dtypes.bfloat16, 1e-1),
                                    (np.float64, 1e-10)])
def test_dft_dtypes_opset17(device, rng, dt, tol):
    x = rng.standard_normal((3, 16, 1)).astype(dt)
    y = DFT(KernelContext(device, 17))(x, axis=1)
    assert y.dtype == np.dtype(dt)
    exp = ref_dft(x.astype(np.float64), 1)
    np.testing.assert_allclose(y.numpy().astype(np.float64), exp, rtol=tol, atol=tol * 4)
    # opset 17 default axis is 1; opset 20 default is -2
    x = rng.standard_normal((4, 5, 6, 2))
    np.testing.assert_allclose(DFT(KernelContext(device, 17))(x).numpy(), ref_dft(x, 1), atol=1e-9)
    np.testing.assert_allclose(DFT(KernelContext(device))(x).numpy(), ref_dft(x, 2), atol=1e-9)


def test_dft_errors(device, rng):
    k = DFT(KernelContext(device))
    x = rng.standard_normal((2, 8, 1)).astype(np.float32)
    with pytest.raises(KernelInputError, match="DFT.*axis 2"):
        k(x, None, np.int64(2))
    with pytest.raises(KernelInputError, match="axis -1"):
        k(x, None, np.int64(-1))
    with pytest.raises(KernelInputError, match=r"\[\.\.\., 2\]"):
        k(rng.standard_normal((2, 8, 3)).astype(np.float32))
    with pytest.raises(KernelInputError, match="dft_length"):
        k(x, np.int64(0), np.int64(1))
    with pytest.raises(KernelTypeError):
        k(x.astype(np.int32))


def test_dft_empty_batch(device):
    y = DFT(KernelContext(device))(np.zeros((0, 8, 1), np.float32), None, np.int64(1))
    assert y.shape == (0, 8, 2)


@pytest.mark.parametrize("with_window", [False, True])
@pytest.mark.parametrize("onesided", [0, 1])
@pytest.mark.parametrize("complex_in", [False, True])
def test_stft(device, rng, with_window, onesided, complex_in):
    if complex_in and onesided:
        with pytest.raises(KernelInputError, match="STFT.*real"):
            STFT(KernelContext(device))(rng.standard_normal((1, 20, 2)), np.int64(3), None, np.int64(8))
        return
    sig = rng.standard_normal((2, 37, 2 if complex_in else 1))
    fl, step = 8, 5
    win = rng.uniform(0.1, 1, fl) if with_window else None
    y = STFT(KernelContext(device))(sig, np.int64(step), win, np.int64(fl), onesided=onesided)
    s = sig[..., 0] + (1j * sig[..., 1] if complex_in else 0)
    frames = (37 - fl) // step + 1
    bins = fl // 2 + 1 if onesided else fl
    exp = np.zeros((2, frames, bins, 2))
    for b in range(2):
        for f in range(frames):
            seg = s[b, f * step: f * step + fl] * (win if with_window else 1)
            for k in range(bins):
                v = sum(seg[t] * np.exp(-2j * np.pi * k * t / fl) for t in range(fl))
                exp[b, f, k] = [v.real, v.imag]
    np.testing.assert_allclose(y.numpy(), exp, rtol=1e-9, atol=1e-9)


def test_stft_defaults_and_errors(device, rng):
    k = STFT(KernelContext(device))
    sig = rng.standard_normal((1, 16, 1)).astype(np.float32)
    y = k(sig, np.int64(4), np.hanning(8).astype(np.float32))  # frame_length from the window
    assert y.shape == (1, 3, 5, 2)
    y = k(sig, np.int64(4))  # one frame of the whole signal
    assert y.shape == (1, 1, 9, 2)
    with pytest.raises(KernelInputError, match="window length"):
        k(sig, np.int64(4), np.ones(8, np.float32), np.int64(6))
    with pytest.raises(KernelInputError, match="frame_step"):
        k(sig, np.int64(0), None, np.int64(6))
    with pytest.raises(KernelInputError, match="frame_length"):
        k(sig, np.int64(1), None, np.int64(17))
    with pytest.raises(KernelInputError, match="signal must be"):
        k(sig[0], np.int64(1))


WINDOWS = [(HannWindow, (0.5, 0.5, 0.0)), (HammingWindow, (25 / 46, 21 / 46, 0.0)),
           (BlackmanWindow, (0.42, 0.5, 0.08))]


@pytest.mark.parametrize("cls,coef", WINDOWS)
@pytest.mark.parametrize("periodic", [0, 1])
@pytest.mark.parametrize("size", [0, 1, 2, 7, 10])
def test_windows(device, cls, coef, periodic, size):
    y = cls(KernelContext(device))(np.int64(size), periodic=periodic)
    assert y.dtype == np.float32 and y.shape == (size,)
    N = size if periodic else size - 1
    exp = [1.0 if N <= 0 else coef[0] - coef[1] * math.cos(2 * math.pi * n / N) + coef[2] * math.cos(4 * math.pi * n / N)
           for n in range(size)]
    np.testing.assert_allclose(y.numpy(), exp, atol=1e-6)


@pytest.mark.parametrize("out", [D.FLOAT16, D.DOUBLE, D.BFLOAT16, D.UINT8, D.INT32, D.INT64, D.UINT64])
def test_window_output_types(device, out):
    y = HannWindow(KernelContext(device))(np.int32(8), output_datatype=int(out))
    assert y.data_type == out
    exp = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(8) / 8)
    if out in (D.UINT8, D.INT32, D.INT64, D.UINT64):
        exp = np.trunc(exp)
    np.testing.assert_allclose(y.numpy().astype(np.float64), exp, atol=1e-2)


def test_window_errors(device):
    with pytest.raises(KernelInputError, match="HannWindow.*non-negative"):
        HannWindow(KernelContext(device))(np.int64(-1))
    with pytest.raises(KernelTypeError, match="output_datatype"):
        HannWindow(KernelContext(device))(np.int64(3), output_datatype=int(D.STRING))
    with pytest.raises(KernelInputError, match="scalar"):
        HannWindow(KernelContext(device))(np.array([3, 4], np.int64))
    with pytest.raises(KernelTypeError):
        HannWindow(KernelContext(device))(np.float32(3))


def ref_mel(mel, dft, rate, lo, hi):
    nspec = dft // 2 + 1
    lo_m = 2595 * math.log10(1 + lo / 700)
    hi_m = 2595 * math.log10(1 + hi / 700)
    step = (hi_m - lo_m) / (mel + 2)
    fb = [int(math.floor((dft + 1) * 700 * (10 ** ((i * step + lo_m) / 2595) - 1) / rate)) for i in range(mel + 2)]
    out = np.zeros((nspec, mel))
    for i in range(mel):
        a, c, b = fb[i], fb[i + 1], fb[i + 2]
        if c == a:
            if c < nspec:
                out[c, i] = 1
        else:
            for j in range(a, c + 1):
                if j < nspec:
                    out[j, i] = (j - a) / (c - a)
        if b > c:
            for j in range(c, b):
                if j < nspec:
                    out[j, i] = (b - j) / (b - c)
    return out


@pytest.mark.parametrize("args", [(8, 16, 8192, 0.0, 4096.0), (20, 512, 16000, 20.0, 8000.0),
                                  (5, 64, 22050, 300.0, 12000.0), (3, 7, 100, 0.0, 50.0)])
@pytest.mark.parametrize("tdt", [np.int32, np.int64])
def test_mel(device, args, tdt):
    mel, dft, rate, lo, hi = args
    y = MelWeightMatrix(KernelContext(device))(tdt(mel), tdt(dft), tdt(rate), np.float32(lo), np.float32(hi))
    np.testing.assert_allclose(y.numpy(), ref_mel(*args), atol=1e-6)
    y = MelWeightMatrix(KernelContext(device))(tdt(mel), tdt(dft), tdt(rate), np.float64(lo), np.float64(hi),
                                               output_datatype=int(D.DOUBLE))
    assert y.dtype == np.float64


def test_mel_errors(device):
    k = MelWeightMatrix(KernelContext(device))
    with pytest.raises(KernelInputError, match="MelWeightMatrix.*positive"):
        k(np.int64(0), np.int64(16), np.int64(100), np.float32(0), np.float32(50))
    with pytest.raises(KernelInputError, match="lower_edge_hertz"):
        k(np.int64(4), np.int64(16), np.int64(100), np.float32(60), np.float32(50))
    with pytest.raises(KernelTypeError):
        k(np.float32(4), np.int64(16), np.int64(100), np.float32(0), np.float32(50))
