"""HannWindow, HammingWindow, BlackmanWindow and MelWeightMatrix.

Windows: w[n] = a0 - a1 cos(2 pi n / N) + a2 cos(4 pi n / N), n in [0, size), with
N = size (periodic) or size - 1 (symmetric); computed in float64 and cast to
output_datatype (integer outputs truncate toward zero, as Cast does).  A symmetric
window of size 1 is [1] (the spec's formula divides by zero there).

MelWeightMatrix follows the spec's reference construction: num_mel_bins + 2 points
equally spaced on the mel scale over (num_mel_bins + 2) steps between the edges,
mapped to spectrogram bins floor((dft_length + 1) * hz / sample_rate), triangles with
peak 1.0; output [dft_length // 2 + 1, num_mel_bins].  Band edges beyond the last
spectrogram bin are dropped.  Built on the host (it is small), then moved.
"""

from __future__ import annotations

import numpy as np

from ...limits import check_allocation
from ..base import KernelBase, register
from ..quant._common import check_output_type


def _scalar(kernel, value, name, named):
    t = kernel.tensor(value, name)
    if t.size != 1:
        raise kernel.error(f"{name} must be a scalar, got shape {list(t.shape)}", **named)
    return t, np.asarray(t.numpy()).reshape(())


class _Window(KernelBase):
    coefficients = (0.0, 0.0, 0.0)

    def __call__(self, size, output_datatype=1, periodic=1):
        t = self.tensor(size, "size")
        self.check_inputs(t)
        named = dict(size=t)
        _, n = _scalar(self, t, "size", named)
        n = int(n)
        if n < 0:
            raise self.error(f"size must be non-negative, got {n}", **named)
        out = check_output_type(self, output_datatype, "output_datatype")
        check_allocation(self, (n,), np.float64)  # computed in float64
        a0, a1, a2 = self.coefficients
        denom = n if periodic else n - 1
        k = np.arange(n, dtype=np.float64)
        if denom <= 0:
            w = np.ones(n)
        else:
            ang = 2 * np.pi * k / denom
            w = a0 - a1 * np.cos(ang) + a2 * np.cos(2 * ang)
        arr = self.xp.asarray(w)
        return self.from_compute(arr, out)


@register()
class HannWindow(_Window):
    coefficients = (0.5, 0.5, 0.0)


@register()
class HammingWindow(_Window):
    coefficients = (25 / 46, 21 / 46, 0.0)


@register()
class BlackmanWindow(_Window):
    coefficients = (0.42, 0.5, 0.08)


@register()
class MelWeightMatrix(KernelBase):
    def __call__(self, num_mel_bins, dft_length, sample_rate, lower_edge_hertz, upper_edge_hertz,
                 output_datatype=1):
        ts = [self.tensor(v, n) for v, n in zip(
            (num_mel_bins, dft_length, sample_rate, lower_edge_hertz, upper_edge_hertz),
            ("num_mel_bins", "dft_length", "sample_rate", "lower_edge_hertz", "upper_edge_hertz"))]
        self.check_inputs(*ts)
        named = dict(zip(("num_mel_bins", "dft_length", "sample_rate", "lower_edge_hertz",
                          "upper_edge_hertz"), ts))
        mel, dft, rate, lo, hi = (_scalar(self, t, n, named)[1] for n, t in named.items())
        mel, dft, rate = int(mel), int(dft), int(rate)
        lo, hi = float(lo), float(hi)
        out = check_output_type(self, output_datatype, "output_datatype")
        if mel < 1 or dft < 1 or rate < 1:
            raise self.error(f"num_mel_bins ({mel}), dft_length ({dft}) and sample_rate ({rate}) must "
                             "be positive", **named)
        if not 0 <= lo <= hi:
            raise self.error(f"need 0 <= lower_edge_hertz ({lo}) <= upper_edge_hertz ({hi})", **named)
        nspec = dft // 2 + 1
        check_allocation(self, (nspec, mel), np.float64)  # computed in float64
        lo_mel = 2595.0 * np.log10(1.0 + lo / 700.0)
        hi_mel = 2595.0 * np.log10(1.0 + hi / 700.0)
        pts = np.arange(mel + 2, dtype=np.float64) * ((hi_mel - lo_mel) / (mel + 2)) + lo_mel
        hz = 700.0 * (10.0 ** (pts / 2595.0) - 1.0)
        fb = np.floor((dft + 1) * hz / rate).astype(np.int64)
        left, center, right = fb[:-2][None, :], fb[1:-1][None, :], fb[2:][None, :]
        j = np.arange(nspec, dtype=np.int64)[:, None]
        rise_w = center - left
        fall_w = right - center
        with np.errstate(divide="ignore", invalid="ignore"):
            rise = np.where((rise_w > 0) & (j >= left) & (j <= center), (j - left) / np.maximum(rise_w, 1), 0.0)
            fall = np.where((fall_w > 0) & (j >= center) & (j < right), (right - j) / np.maximum(fall_w, 1), 0.0)
        w = np.where((fall_w > 0) & (j >= center) & (j < right), fall, rise)
        w = np.where((rise_w == 0) & (j == center), 1.0, w)
        return self.from_compute(self.xp.asarray(w), out)


__all__ = ["HannWindow", "HammingWindow", "BlackmanWindow", "MelWeightMatrix"]
