"""ConvTranspose: the adjoint of Conv, as a matrix product followed by col2im.

cols = W_g^T @ X_g (one batched matmul per group), then every kernel tap's slice of cols
is added into the output at that tap's strided positions (a loop over taps, vectorised
over pixels).  cols is built per chunk of at most 256 MiB (over the batch, and over input
rows when one image alone is larger).

Output size and pads follow the ONNX text:
* explicit pads: out = stride*(in-1) + output_padding + (k-1)*dilation + 1 - pads_begin - pads_end;
* output_shape (spatial dims; a full N, C, ... shape is accepted too): total padding
  stride*(in-1) + output_padding + (k-1)*dilation + 1 - out is split with the larger half
  at the end for SAME_UPPER and at the beginning otherwise; a negative total (an output
  larger than the full result) is clamped to zero and the extra positions hold only the
  bias, as onnxruntime does;
* SAME_UPPER / SAME_LOWER without output_shape: out = in * stride, pads as above.
"""

from __future__ import annotations

from ..base import KernelBase, register
from . import _spatial as sp
from .conv import check_conv_ranks


def scatter_taps(xp, out, cols, K, strides, dilations, counts, origin):
    """out[..., origin + k*dilation + stride*i] += cols[..., k, i] for every tap k.

    out: (n, c, *L); cols: (n, c, *K, *counts); origin: per-axis start in out."""
    n_sp = len(K)
    lead = (slice(None), slice(None))
    for tap in sp.taps(K):
        sl = sp.tap_slices([origin[i] + tap[i] * dilations[i] for i in range(n_sp)], strides, counts)
        target = out[lead + sl]
        src = cols[lead + tuple(tap)]
        if out.dtype == bool:
            xp.logical_or(target, src, out=target)
        else:
            target += src


def conv_transpose_forward(xp, x, w, b, group, strides, dilations, pads, out_shape):
    """x (N, C, *S), w (C, M/group, *K) compute arrays -> (N, M, *out_shape)."""
    n_sp = x.ndim - 2
    N, C = x.shape[:2]
    Mg = w.shape[1]
    M = Mg * group
    K = tuple(w.shape[2:])
    S = tuple(x.shape[2:])
    Cg = C // group
    kk = sp.prod(K)
    pb = pads[:n_sp]
    ek = [(K[i] - 1) * dilations[i] + 1 for i in range(n_sp)]
    full = [strides[i] * (S[i] - 1) + ek[i] for i in range(n_sp)]
    # buffer covering both the full result and the requested window [pb, pb + out)
    start = [min(0, pb[i]) for i in range(n_sp)]
    stop = [max(full[i], pb[i] + out_shape[i]) for i in range(n_sp)]
    buf = xp.zeros((N, M) + tuple(stop[i] - start[i] for i in range(n_sp)), dtype=x.dtype)
    wt = w.reshape(group, Cg, Mg * kk).transpose(0, 2, 1)
    P_in = sp.prod(S)
    if N and M and P_in and C:
        per_image = M * kk * P_in * x.dtype.itemsize
        target = sp.chunk_target(xp)
        if per_image <= target:
            nb = max(1, target // per_image)
            chunks = [(n0, min(N, n0 + nb), 0, S[0]) for n0 in range(0, N, nb)]
        else:
            rows = sp.row_chunks(S[0], per_image // S[0], target)
            chunks = [(n0, n0 + 1, r0, r1) for n0 in range(N) for r0, r1 in rows]
        for n0, n1, r0, r1 in chunks:
            xc = x[n0:n1, :, r0:r1]
            counts = (r1 - r0,) + S[1:]
            xg = xc.reshape(n1 - n0, group, Cg, sp.prod(counts))
            cols = xp.matmul(wt, xg) if group > 1 else xp.matmul(wt[0], xg[:, 0])
            cols = cols.reshape((n1 - n0, M) + K + counts)
            origin = [r0 * strides[0] - start[0]] + [-start[i] for i in range(1, n_sp)]
            scatter_taps(xp, buf[n0:n1], cols, K, strides, dilations, counts, origin)
    crop = (slice(None), slice(None)) + tuple(
        slice(pb[i] - start[i], pb[i] - start[i] + out_shape[i]) for i in range(n_sp))
    y = buf[crop]
    if y.shape != buf.shape:
        y = xp.ascontiguousarray(y)
    if b is not None:
        y += b.reshape((1, M) + (1,) * n_sp)
    return y


@register()
class ConvTranspose(KernelBase):
    """ONNX ConvTranspose (opsets 1, 11, 22), N-D, with groups, dilations,
    output_padding, output_shape and every auto_pad mode.  output_padding must be
    smaller than max(stride, dilation) along its axis (the spec's 'stride/dilation')."""

    def __call__(self, X, W, B=None, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                 output_padding=None, output_shape=None, pads=None, strides=None):
        x = self.tensor(X, "X")
        w = self.tensor(W, "W")
        b = self.tensor(B, "B", optional=True)
        self.check_inputs(x, w, b)
        tensors = {"X": x, "W": w}
        n_sp, group = check_conv_ranks(self, x, w, group)
        C = x.shape[1]
        if w.shape[0] != C:
            raise self.error(f"channel mismatch: X has {C} channels but W.shape[0] is {w.shape[0]}",
                             **tensors)
        if C % group:
            raise self.error(f"the number of input channels ({C}) is not a multiple of group ({group})",
                             **tensors)
        M = w.shape[1] * group
        K = list(w.shape[2:])
        if kernel_shape is not None and len(kernel_shape) and [int(k) for k in kernel_shape] != K:
            raise self.error(f"kernel_shape {list(kernel_shape)} does not match the weight's spatial "
                             f"shape {K}", **tensors)
        strides = sp.int_list(self, "strides", strides, n_sp, 1, minimum=1, **tensors)
        dilations = sp.int_list(self, "dilations", dilations, n_sp, 1, minimum=1, **tensors)
        out_pad = sp.int_list(self, "output_padding", output_padding, n_sp, 0, minimum=0, **tensors)
        for i in range(n_sp):
            if out_pad[i] >= max(strides[i], dilations[i]):
                raise self.error(f"output_padding {out_pad} must be smaller than the stride or "
                                 f"dilation along each axis (strides {strides}, dilations {dilations})",
                                 **tensors)
        mode = sp.auto_pad_name(self, auto_pad, **tensors)
        S = list(x.shape[2:])
        ek = [(K[i] - 1) * dilations[i] + 1 for i in range(n_sp)]
        natural = [strides[i] * (S[i] - 1) + out_pad[i] + ek[i] for i in range(n_sp)]
        if output_shape is not None and len(output_shape):
            out = [int(v) for v in output_shape]
            if len(out) == n_sp + 2:
                out = out[2:]
            if len(out) != n_sp or any(v < 0 for v in out):
                raise self.error(f"output_shape {list(output_shape)} must give {n_sp} non-negative "
                                 "spatial sizes", **tensors)
        elif mode in ("SAME_UPPER", "SAME_LOWER"):
            out = [S[i] * strides[i] for i in range(n_sp)]
        else:
            out = None
        if out is not None:
            pads_r = [0] * (2 * n_sp)
            for i in range(n_sp):
                total = max(0, natural[i] - out[i])
                if mode == "SAME_UPPER":
                    pads_r[i], pads_r[i + n_sp] = total // 2, total - total // 2
                else:
                    pads_r[i], pads_r[i + n_sp] = total - total // 2, total // 2
        else:
            if mode == "VALID":
                pads_r = [0] * (2 * n_sp)
            else:
                pads_r = sp.explicit_pads(self, pads, n_sp, **tensors)
            out = [natural[i] - pads_r[i] - pads_r[i + n_sp] for i in range(n_sp)]
            if any(v < 0 for v in out):
                raise self.error(f"pads {pads_r} remove more than the whole output "
                                 f"(full size {natural})", **tensors)
        if not b.is_absent and tuple(b.shape) != (M,):
            raise self.error(f"B must have shape ({M},), got {list(b.shape)}", X=x, W=w, B=b)
        xc = self.to_compute(x)
        wc = self.to_compute(w, xc.dtype)
        bc = None if b.is_absent else self.to_compute(b, xc.dtype)
        y = conv_transpose_forward(self.xp, xc, wc, bc, group, strides, dilations, pads_r, out)
        return self.from_compute(y, x.data_type)
