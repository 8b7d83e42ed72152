"""ImageDecoder (host-side, through Pillow).

Pillow is an optional dependency, imported on first use; without it the kernel raises
UnsupportedOperatorError saying how to install it.  Decoding runs on the host (the
libraries are CPU code); the uint8 (H, W, C) result moves to the context's device.
pixel_format RGB and BGR give 3 channels, Grayscale 1 (Pillow's ITU-R 601-2 luma).  A
stream Pillow cannot decode gives an empty (0, 0, C) image, as the spec asks.  JPEG goes
through libjpeg with its default "fancy" chroma upsampling, which the spec describes.
"""

from __future__ import annotations

import io

import numpy as np

from ..dtypes import DataType
from ..errors import UnsupportedOperatorError
from ..limits import check_allocation
from .base import KernelBase, register


def _pillow():
    try:
        import PIL.Image
    except ImportError as exc:
        raise UnsupportedOperatorError(
            "ImageDecoder needs Pillow to decode images, and it is not importable "
            f"({exc}); install it with 'pip install pillow'") from None
    return PIL.Image


@register()
class ImageDecoder(KernelBase):
    def __call__(self, encoded_stream, pixel_format="RGB"):
        t = self.tensor(encoded_stream, "encoded_stream")
        self.check_inputs(t)
        if pixel_format not in ("RGB", "BGR", "Grayscale"):
            raise self.error(f"pixel_format must be RGB, BGR or Grayscale, got {pixel_format!r}",
                             encoded_stream=t)
        if t.ndim != 1:
            raise self.error("encoded_stream must be a 1-D uint8 tensor", encoded_stream=t)
        image_mod = _pillow()
        channels = 1 if pixel_format == "Grayscale" else 3
        data = t.numpy().tobytes()
        try:
            img = image_mod.open(io.BytesIO(data))  # reads the header only
        except Exception:  # any decoding failure: the spec asks for an empty image
            img = None
        arr = np.zeros((0, 0, channels), np.uint8)
        if img is not None:
            with img:
                # the header's size, checked before the pixels are decoded
                width, height = img.size
                check_allocation(self, (height, width, max(channels, len(img.getbands()))), 1,
                                 "decoded image")
                try:
                    img.load()
                    img = img.convert("L" if channels == 1 else "RGB")
                    arr = np.asarray(img, dtype=np.uint8)
                except Exception:  # any decoding failure: the spec asks for an empty image
                    arr = np.zeros((0, 0, channels), np.uint8)
        if arr.ndim == 2:
            arr = arr[:, :, None]
        if pixel_format == "BGR":
            arr = arr[:, :, ::-1]
        return self.result(self.xp.asarray(np.ascontiguousarray(arr)), DataType.UINT8)
