"""ImageDecoder: lossless formats round-trip exactly; channel orders; bad streams."""

from __future__ import annotations

import io
import sys

import numpy as np
import pytest

from gpukernels.errors import KernelInputError, KernelTypeError, UnsupportedOperatorError
from gpukernels.kernels.base import KernelContext
from gpukernels.kernels.image import ImageDecoder

PIL = pytest.importorskip("PIL.Image")


def encode(img: np.ndarray, fmt: str) -> np.ndarray:
    buf = io.BytesIO()
    PIL.fromarray(img).save(buf, format=fmt)
    return np.frombuffer(buf.getvalue(), np.uint8)


@pytest.mark.parametrize("fmt", ["PNG", "BMP", "TIFF", "PPM"])
def test_decode_lossless(device, rng, fmt):
    img = rng.integers(0, 256, (7, 5, 3), dtype=np.uint8)
    k = ImageDecoder(KernelContext(device))
    rgb = k(encode(img, fmt)).numpy()
    np.testing.assert_array_equal(rgb, img)
    bgr = k(encode(img, fmt), pixel_format="BGR").numpy()
    np.testing.assert_array_equal(bgr, img[:, :, ::-1])
    gray = k(encode(img, fmt), pixel_format="Grayscale").numpy()
    assert gray.shape == (7, 5, 1) and gray.dtype == np.uint8
    luma = img.astype(np.float64) @ np.array([299, 587, 114]) / 1000
    assert np.abs(gray[..., 0].astype(np.float64) - luma).max() <= 1.0


def test_decode_grayscale_source_and_jpeg(device, rng):
    g = rng.integers(0, 256, (6, 4), dtype=np.uint8)
    y = ImageDecoder(KernelContext(device))(encode(g, "PNG")).numpy()
    np.testing.assert_array_equal(y, np.repeat(g[:, :, None], 3, axis=2))
    smooth = np.tile(np.linspace(0, 255, 16, dtype=np.uint8)[None, :, None], (16, 1, 3))
    y = ImageDecoder(KernelContext(device))(encode(smooth, "JPEG")).numpy()
    assert y.shape == (16, 16, 3) and np.abs(y.astype(int) - smooth).max() < 16


def test_decode_bad_stream_and_errors(device):
    k = ImageDecoder(KernelContext(device))
    y = k(np.frombuffer(b"not an image at all", np.uint8))
    assert y.shape == (0, 0, 3) and y.dtype == np.uint8
    assert k(np.zeros(0, np.uint8), pixel_format="Grayscale").shape == (0, 0, 1)
    with pytest.raises(KernelInputError, match="ImageDecoder.*pixel_format"):
        k(np.zeros(4, np.uint8), pixel_format="RGBA")
    with pytest.raises(KernelTypeError, match="ImageDecoder"):
        k(np.zeros(4, np.int8))


def test_missing_pillow(monkeypatch):
    monkeypatch.setitem(sys.modules, "PIL.Image", None)
    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(UnsupportedOperatorError, match="pip install pillow"):
        ImageDecoder(KernelContext("cpu"))(np.zeros(4, np.uint8))
