"""DFT and STFT.

Real signals are laid out as [..., 1] and complex ones as [..., 2] (real, imaginary);
outputs are complex ([..., 2]) except the inverse one-sided DFT (IRFFT), which returns a
real signal [..., 1].  Transforms run in complex64 (float32 and smaller inputs) or
complex128 (double) through the namespace's FFT and are rounded once to the input type.

Choices where the spec is silent: a complex input with onesided=1 and inverse=0 returns
the first floor(n/2)+1 bins of the full transform; a real input with inverse=1 is
treated as complex with zero imaginary part.  STFT with a complex signal and onesided=1
raises (the spec says one-sided output is not possible then).
"""

from __future__ import annotations

import numpy as np

from ... import dtypes
from ...host import tuning
from ...limits import check_allocation
from ...host import parallel_ranges
from ..base import KernelBase, register
from ..specialize import specialize


def _scalar_int(kernel, value, name, named):
    t = kernel.tensor(value, name)
    if t.size != 1:
        raise kernel.error(f"{name} must be a scalar, got shape {list(t.shape)}", **named)
    return t, int(np.asarray(t.numpy()).reshape(()))


def _to_complex(xp, x):
    """(signal, is_complex) from a [..., 1|2] compute array."""
    if x.shape[-1] == 1:
        return x[..., 0], False
    return x[..., 0] + 1j * x[..., 1], True


def _stack(xp, y, real_only=False):
    if real_only:
        return y[..., None]
    return xp.stack([y.real, y.imag], axis=-1)


def _transform(xp, sig, n, ax, inverse, onesided, is_complex):
    """The DFT of the complex-or-real signal array along ax, as a [..., 1|2] array."""
    fft = xp.fft
    if onesided and inverse:
        if not is_complex:
            sig = sig.astype(np.complex128 if sig.dtype == np.float64 else np.complex64)
        y = fft.irfft(sig, n=n, axis=ax)
        out = _stack(xp, y, real_only=True)
    elif onesided:
        if is_complex:
            y = fft.fft(sig, n=n, axis=ax)
            y = xp.take(y, xp.arange(n // 2 + 1), axis=ax)
        else:
            y = fft.rfft(sig, n=n, axis=ax)
        out = _stack(xp, y)
    else:
        y = fft.ifft(sig, n=n, axis=ax) if inverse else fft.fft(sig, n=n, axis=ax)
        out = _stack(xp, y)
    return out


@specialize("DFT.transform", device="cpu", ops=("DFT",),
            when=lambda sig, ax, transform: (ax != 0 and sig.shape[0] > 1
                                             and sig.size >= tuning.value("dft.thread_items")))
def _host_split(sig, ax, transform):
    """transform(sig) with the signals of axis 0 split over host threads (NumPy's FFT
    releases the GIL); each thread gets dft.thread_items (host/tuning.py) elements or more."""
    parts = {}
    per_signal = max(1, sig.size // sig.shape[0])
    parallel_ranges(sig.shape[0], max(1, -(-tuning.value("dft.thread_items") // per_signal)),
                    lambda lo, hi: parts.__setitem__(lo, transform(sig[lo:hi])))
    return np.concatenate([parts[k] for k in sorted(parts)], axis=0)


@register()
class DFT(KernelBase):
    """axis: an attribute in opset 17 (default 1), an optional int64 input from opset 20
    (default -2); valid range [-r, -2] or [0, r-2]."""

    def __call__(self, input, dft_length=None, axis=None, inverse=0, onesided=0):
        x = self.tensor(input, "input")
        lt = self.tensor(dft_length, "dft_length", optional=True)
        named = dict(input=x, dft_length=lt)
        if self.since_version >= 20:
            at = self.tensor(axis, "axis", optional=True) if not isinstance(axis, int) else None
            self.check_inputs(x, lt, at if at is not None else None)
            if at is not None and not at.is_absent:
                _, axis = _scalar_int(self, at, "axis", named)
            elif at is not None or axis is None:
                axis = -2
        else:
            self.check_inputs(x, lt)
            axis = 1 if axis is None else int(axis)
        r = x.ndim
        if r < 2 or x.shape[-1] not in (1, 2):
            raise self.error("input must be [..., signal dims, 1] (real) or [..., 2] (complex)", **named)
        if not (-r <= axis <= -2 or 0 <= axis <= r - 2):
            raise self.error(f"axis {axis} is out of range [{-r}, -2] or [0, {r - 2}] for rank {r}", **named)
        ax = axis % r
        if onesided not in (0, 1) or inverse not in (0, 1):
            raise self.error(f"onesided and inverse must be 0 or 1 (got {onesided}, {inverse})", **named)
        dim = x.shape[ax]
        if not lt.is_absent:
            _, n = _scalar_int(self, lt, "dft_length", named)
        else:
            n = 2 * (dim - 1) if (onesided and inverse) else dim
        if n < 1:
            raise self.error(f"dft_length must be positive, got {n}", **named)
        # the transform (complex, two compute-type values per element) before it exists
        out_shape = list(x.shape)
        out_shape[ax] = n // 2 + 1 if (onesided and not inverse) else n
        out_shape[-1] = 2
        check_allocation(self, out_shape, dtypes.info(x.data_type).compute)
        xp = self.xp
        xc = self.to_compute(x)
        sig, is_complex = _to_complex(xp, xc)
        def transform(part):
            return _transform(xp, part, n, ax, inverse, onesided, is_complex)

        fast = self.specialized("DFT.transform", sig, ax, transform)
        out = fast(sig, ax, transform) if fast is not None else transform(sig)
        return self.from_compute(out.astype(xc.dtype, copy=False), x.data_type)


@register()
class STFT(KernelBase):
    """signal [batch, length, 1|2] -> [batch, frames, bins, 2] with
    frames = (length - frame_length) // frame_step + 1."""

    def __call__(self, signal, frame_step, window=None, frame_length=None, onesided=1):
        s = self.tensor(signal, "signal")
        st = self.tensor(frame_step, "frame_step")
        wt = self.tensor(window, "window", optional=True)
        lt = self.tensor(frame_length, "frame_length", optional=True)
        self.check_inputs(s, st, wt, lt)
        named = dict(signal=s, frame_step=st, window=wt, frame_length=lt)
        if s.ndim != 3 or s.shape[-1] not in (1, 2):
            raise self.error("signal must be [batch, length, 1] (real) or [batch, length, 2] (complex)",
                             **named)
        _, step = _scalar_int(self, st, "frame_step", named)
        if step < 1:
            raise self.error(f"frame_step must be positive, got {step}", **named)
        length = s.shape[1]
        if not wt.is_absent and wt.ndim != 1:
            raise self.error("window must be 1-D", **named)
        if not lt.is_absent:
            _, fl = _scalar_int(self, lt, "frame_length", named)
            if not wt.is_absent and wt.shape[0] != fl:
                raise self.error(f"window length {wt.shape[0]} differs from frame_length {fl}", **named)
        elif not wt.is_absent:
            fl = wt.shape[0]
        else:
            fl = length
        if fl < 1 or fl > length:
            raise self.error(f"frame_length {fl} must be in [1, signal length {length}]", **named)
        if onesided not in (0, 1):
            raise self.error(f"onesided must be 0 or 1, got {onesided}", **named)
        if onesided and s.shape[-1] == 2:
            raise self.error("a one-sided STFT needs a real signal (set onesided=0 for complex input)",
                             **named)
        xp = self.xp
        xc = self.to_compute(s)
        sig, _ = _to_complex(xp, xc)
        frames = (length - fl) // step + 1
        # the frames (batch, frames, frame_length) overlap: up to length**2 / 2 complex
        # values from a signal of `length`; checked before they exist
        check_allocation(self, (s.shape[0], frames, fl, 2), dtypes.info(s.data_type).compute, "frames")
        idx = xp.arange(frames)[:, None] * step + xp.arange(fl)[None, :]
        chunks = sig[:, idx]  # (batch, frames, fl)
        if not wt.is_absent:
            chunks = chunks * self.to_compute(wt, xc.dtype)
        y = xp.fft.rfft(chunks, n=fl, axis=-1) if onesided else xp.fft.fft(chunks, n=fl, axis=-1)
        out = xp.stack([y.real, y.imag], axis=-1).astype(xc.dtype, copy=False)
        return self.from_compute(out, s.data_type)


__all__ = ["DFT", "STFT"]
