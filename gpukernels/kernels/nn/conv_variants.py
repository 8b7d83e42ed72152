"""ConvInteger, DeformConv and Col2Im.

ConvInteger: (x - x_zero_point) conv (w - w_zero_point), int32 output.  The products
are exact in float64 (|value| <= 255 * 255 per product; sums stay exact below 2**53),
so the convolution reuses the float matmul path in float64 and the int64 result is
wrapped to int32 (the spec allows the accumulation to overflow only in 32 bits).
Padding contributes zero, i.e. the input is padded with its zero point.

DeformConv: every kernel tap samples the input at its regular position plus a learned
offset, with N-linear interpolation (bilinear in 2-D); each of the 2**n corners outside
the input contributes zero.  The sampled values (times the mask) form the column matrix
of an ordinary grouped matmul.  Offset channels are laid out
[offset_group][kernel tap (row-major)][spatial axis], mask channels
[offset_group][kernel tap], as in torchvision and onnxruntime.  Columns are built in
chunks of at most 256 MiB (over the batch, then over output pixels).

Col2Im: the inverse of im2col: block values are summed into the padded image (a loop
over block taps) and the padding is cropped.  Integers wrap on overflow, bool sums are
logical OR, strings concatenate (on the host).
"""

from __future__ import annotations

import numpy as np

from ...dtypes import DataType
from ...limits import check_allocation
from ..base import KernelBase, register
from . import _spatial as sp
from .conv import conv_attributes, conv_forward
from .conv_transpose import scatter_taps


@register()
class ConvInteger(KernelBase):
    def __call__(self, x, w, x_zero_point=None, w_zero_point=None, auto_pad="NOTSET", dilations=None,
                 group=1, kernel_shape=None, pads=None, strides=None):
        xt = self.tensor(x, "x")
        wt = self.tensor(w, "w")
        xz = self.tensor(x_zero_point, "x_zero_point", optional=True)
        wz = self.tensor(w_zero_point, "w_zero_point", optional=True)
        self.check_inputs(xt, wt, xz, wz)
        strides, pads, dilations, out = conv_attributes(
            self, xt, wt, kernel_shape, strides, dilations, pads, auto_pad, group, w_name="w")
        xp = self.xp
        M = wt.shape[0]
        n_sp = xt.ndim - 2
        xc = xt.array.astype(np.float64)
        wc = wt.array.astype(np.float64)
        if not xz.is_absent:
            if xz.size != 1:
                raise self.error("x_zero_point must be a scalar (per-tensor quantization)", x=xt,
                                 x_zero_point=xz)
            xc = xc - xz.array.reshape(()).astype(np.float64)
        if not wz.is_absent:
            if wz.size == 1:
                wc = wc - wz.array.reshape(()).astype(np.float64)
            elif wz.ndim == 1 and wz.shape[0] == M:
                wc = wc - wz.array.astype(np.float64).reshape((M,) + (1,) * (n_sp + 1))
            else:
                raise self.error(f"w_zero_point must be a scalar or have shape ({M},)", w=wt,
                                 w_zero_point=wz)
        y = conv_forward(xp, xc, wc, None, strides, pads, dilations, int(group), out, kernel=self)
        y = xp.rint(y).astype(np.int64).astype(np.int32)
        return self.result(y, DataType.INT32)


@register()
class DeformConv(KernelBase):
    def __call__(self, X, W, offset, B=None, mask=None, dilations=None, group=1, kernel_shape=None,
                 offset_group=1, pads=None, strides=None):
        x = self.tensor(X, "X")
        w = self.tensor(W, "W")
        off = self.tensor(offset, "offset")
        b = self.tensor(B, "B", optional=True)
        mk = self.tensor(mask, "mask", optional=True)
        self.check_inputs(x, w, off, b, mk)
        strides, pads, dilations, out = conv_attributes(
            self, x, w, kernel_shape, strides, dilations, pads, "NOTSET", group)
        n_sp = x.ndim - 2
        N, C = x.shape[:2]
        M = w.shape[0]
        K = tuple(w.shape[2:])
        kk = sp.prod(K)
        og = int(offset_group)
        if og < 1 or C % og:
            raise self.error(f"offset_group ({og}) must be >= 1 and divide the channels ({C})", X=x)
        want = (N, og * kk * n_sp) + tuple(out)
        if tuple(off.shape) != want:
            raise self.error(f"offset must have shape {list(want)}", X=x, W=w, offset=off)
        if not mk.is_absent and tuple(mk.shape) != (N, og * kk) + tuple(out):
            raise self.error(f"mask must have shape {[N, og * kk] + list(out)}", X=x, W=w, mask=mk)
        if not b.is_absent and tuple(b.shape) != (M,):
            raise self.error(f"B must have shape ({M},)", W=w, B=b)
        xp = self.xp
        xc = self.to_compute(x)
        dt = xc.dtype
        wc = self.to_compute(w, dt)
        offc = self.to_compute(off, dt).reshape(N, og, kk, n_sp, -1)
        mkc = None if mk.is_absent else self.to_compute(mk, dt).reshape(N, og, kk, -1)
        g = int(group)
        S = x.shape[2:]
        P = sp.prod(out)
        y = xp.empty((N, M, P), dtype=dt)
        # regular sampling grid per tap: base[d] (P,) for output positions
        grids = np.meshgrid(*[np.arange(o) for o in out], indexing="ij")
        base_pos = [xp.asarray((grids[d].reshape(-1) * strides[d] - pads[d]).astype(dt))
                    for d in range(n_sp)]
        per_pixel = C * kk * dt.itemsize * 3
        target = sp.chunk_target(xp)
        pix = max(1, min(P, target // max(1, per_pixel)))
        nb = max(1, min(N, target // max(1, per_pixel * P))) if pix == P else 1
        wg = wc.reshape(g, M // g, (C // g) * kk)
        Cog = C // og
        xr = xc.reshape(N, og, Cog, -1)
        for n0 in range(0, N, nb):
            n1 = min(N, n0 + nb)
            for p0 in range(0, P, pix):
                p1 = min(P, p0 + pix)
                cols = xp.empty((n1 - n0, og, Cog, kk, p1 - p0), dtype=dt)
                for t_index, tap in enumerate(sp.taps(K)):
                    coords = [base_pos[d][p0:p1] + tap[d] * dilations[d]
                              + offc[n0:n1, :, t_index, d, p0:p1] for d in range(n_sp)]
                    val = _interpolate(xp, xr[n0:n1], coords, S)
                    if mkc is not None:
                        val *= mkc[n0:n1, :, t_index, p0:p1][:, :, None, :]
                    cols[:, :, :, t_index, :] = val
                cols = cols.reshape(n1 - n0, g, (C // g) * kk, p1 - p0)
                y[n0:n1, :, p0:p1] = xp.matmul(wg, cols).reshape(n1 - n0, M, p1 - p0)
        if not b.is_absent:
            y += self.to_compute(b, dt).reshape(1, M, 1)
        return self.from_compute(y.reshape((N, M) + tuple(out)), x.data_type)


def _interpolate(xp, xr, coords, S):
    """N-linear interpolation of xr (n, og, Cog, prod(S)) at coords (each (n, og, p));
    corners outside the input count as zero.  Returns (n, og, Cog, p)."""
    n_sp = len(S)
    floors = [xp.floor(c) for c in coords]
    fracs = [c - f for c, f in zip(coords, floors)]
    floors = [f.astype(np.int64) for f in floors]
    flat_strides = [sp.prod(S[d + 1:]) for d in range(n_sp)]
    n, og, cog = xr.shape[:3]
    total = None
    for corner in np.ndindex(*([2] * n_sp)):
        weight = None
        valid = None
        index = None
        for d in range(n_sp):
            idx = floors[d] + corner[d]
            wd = fracs[d] if corner[d] else 1 - fracs[d]
            ok = (idx >= 0) & (idx < S[d])
            weight = wd if weight is None else weight * wd
            valid = ok if valid is None else valid & ok
            term = xp.clip(idx, 0, S[d] - 1) * flat_strides[d]
            index = term if index is None else index + term
        weight = weight * valid
        gathered = xp.take_along_axis(xr, xp.broadcast_to(index[:, :, None, :], (n, og, cog, index.shape[-1])),
                                      axis=3)
        contrib = gathered * weight[:, :, None, :]
        total = contrib if total is None else total + contrib
    return total


@register()
class Col2Im(KernelBase):
    def __call__(self, input, image_shape, block_shape, dilations=None, pads=None, strides=None):
        t = self.tensor(input, "input")
        ims = self.tensor(image_shape, "image_shape")
        bls = self.tensor(block_shape, "block_shape")
        self.check_inputs(t, ims, bls)
        image = [int(v) for v in np.asarray(ims.numpy()).reshape(-1)]
        block = [int(v) for v in np.asarray(bls.numpy()).reshape(-1)]
        tensors = {"input": t, "image_shape": ims, "block_shape": bls}
        n_sp = len(image)
        if len(block) != n_sp or n_sp < 1:
            raise self.error(f"image_shape {image} and block_shape {block} must have the same "
                             "non-zero length", **tensors)
        if any(v < 1 for v in block) or any(v < 0 for v in image):
            raise self.error("block_shape values must be >= 1 and image_shape values >= 0", **tensors)
        if t.ndim != 3:
            raise self.error("input must be 3-D (N, C * prod(block_shape), L)", **tensors)
        strides = sp.int_list(self, "strides", strides, n_sp, 1, minimum=1, **tensors)
        dilations = sp.int_list(self, "dilations", dilations, n_sp, 1, minimum=1, **tensors)
        pads = sp.explicit_pads(self, pads, n_sp, **tensors)
        kk = sp.prod(block)
        N, CK, L = t.shape
        if CK % kk:
            raise self.error(f"input.shape[1] ({CK}) is not a multiple of prod(block_shape) ({kk})",
                             **tensors)
        C = CK // kk
        counts = sp.conv_output_shape(self, image, block, strides, dilations, pads, **tensors)
        if sp.prod(counts) != L:
            raise self.error(f"input has {L} blocks but image_shape, block_shape, strides, pads and "
                             f"dilations give {counts} = {sp.prod(counts)}", **tensors)
        is_string = t.data_type == DataType.STRING
        xp = np if is_string else self.xp
        arr = t.array if is_string else self.to_compute(t)
        padded = [image[i] + pads[i] + pads[i + n_sp] for i in range(n_sp)]
        check_allocation(self, [N, C] + padded, arr.dtype, "padded image")
        if is_string:
            buf = np.full((N, C) + tuple(padded), "", dtype=object)
        else:
            buf = xp.zeros((N, C) + tuple(padded), dtype=arr.dtype)
        cols = arr.reshape((N, C) + tuple(block) + tuple(counts))
        scatter_taps(xp, buf, cols, tuple(block), strides, dilations, counts, [0] * n_sp)
        crop = (slice(None), slice(None)) + tuple(slice(pads[i], pads[i] + image[i]) for i in range(n_sp))
        out = xp.ascontiguousarray(buf[crop])
        if is_string:
            return self.result(out, DataType.STRING)
        return self.from_compute(out, t.data_type)
