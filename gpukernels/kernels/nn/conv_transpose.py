"""ConvTranspose: the adjoint of Conv, as a matrix product followed by col2im.

cols = W_g^T @ X_g (one batched matmul per group), then every kernel tap's slice of cols
is added into the output at that tap's strided positions (a loop over taps, vectorised
over pixels).  cols is built per chunk of at most 256 MiB (over the batch, and over input
rows when one image alone is larger).  On the host, 1-D/2-D float inputs take the
specialisation "ConvTranspose.forward" instead when its cost model says so: the phase
(sub-pixel) path, one GEMM for every output phase, no scatter-adds.

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

import math

import numpy as np

from ...host import tuning
from ...limits import check_allocation
from ...host import host_empty
from ..base import KernelBase, register
from ..specialize import specialize
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


def conv_transpose_forward(kernel, x, w, b, group, strides, dilations, pads, out_shape):
    """x (N, C, *S), w (C, M/group, *K) compute arrays -> (N, M, *out_shape)."""
    args = (x, w, b, group, strides, dilations, pads, out_shape)
    fast = kernel.specialized("ConvTranspose.forward", *args)
    if fast is not None:
        return fast(*args)
    xp = kernel.xp
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


# ------------------------------------------------------------------ host phase path
#
# With stride s, full-output position o = s*i + k*d (input i, tap k) splits as o = s*q + r
# with r = (k*d) % s and i = q - e, e = (k*d) // s.  So every output phase r is a stride-1
# correlation of the input with the taps of that phase, and all phases read the same few
# input shifts e.  One GEMM computes every phase at once:
#     R[(ry, rx, m), (q)] = Wc[(ry, rx, m), (uy, ux, c)] @ cols[(uy, ux, c), (q)]
# where cols holds the input at each shift (a strided copy of the zero-padded input) and
# Wc holds each tap at its (phase, shift) slot (zeros elsewhere).  Each phase of R is then
# copied (with the bias) into its strided view of Y: no scatter-adds.  Along x, cols uses
# whole padded rows ("wide" rows of Wb = Qw + span columns) so one shift is one contiguous
# window of the flattened plane; the span extra columns per row are computed and dropped.

# host costs in GEMM multiply-adds: conv_transpose.phase_* in host/tuning.py


def _phase_axis(k, s, d, pb, out):
    """Phase geometry along one axis (see the comment above)."""
    r = [(j * d) % s for j in range(k)]
    e = [(j * d) // s for j in range(k)]
    phases = sorted(set(r))
    emin, emax = min(e), max(e)
    step = 0
    for v in e:
        step = math.gcd(step, v - emin)
    step = step or 1
    q0 = pb // s
    q1 = (pb + out - 1) // s + 1
    per_phase = []
    for ph in phases:
        oy0 = (ph - pb) % s
        count = len(range(oy0, out, s))
        per_phase.append((oy0, count, (oy0 + pb) // s - q0))
    return {
        "phase_of_tap": [phases.index(v) for v in r],
        "shift_of_tap": [(emax - v) // step for v in e],  # shift index u: row offset u*step
        "phases": phases, "per_phase": per_phase, "n_shift": (emax - emin) // step + 1,
        "step": step, "span": emax - emin, "lo": q0 - emax, "Q": q1 - q0, "emin": emin, "q1": q1,
    }


def _phase_applies(x, w, b, group, strides, dilations, pads, out_shape):
    """Host 1-D/2-D float path, when it costs less than the scatter path: its GEMM (with the
    zero slots of Wc, the padded rows and the wide columns) plus building Wc, against the
    exact GEMM plus the col2im adds."""
    n_sp = x.ndim - 2
    if n_sp not in (1, 2) or x.dtype not in (np.float32, np.float64) or x.size == 0 or w.size == 0:
        return False
    if any(v <= 0 for v in out_shape):
        return False
    K = w.shape[2:]
    slots = pixels = 1  # Wc slots per (input channel, output channel); GEMM columns
    for i in range(n_sp):
        ax = _phase_axis(K[i], strides[i], dilations[i], pads[i], out_shape[i])
        slots *= len(ax["phases"]) * ax["n_shift"]
        pixels *= ax["Q"] + (ax["span"] if i == n_sp - 1 else 0)
    N, Cg = x.shape[0], x.shape[1] // group
    phase = Cg * slots * (N * pixels + tuning.value("conv_transpose.phase_weight_cost"))
    add = tuning.value("conv_transpose.phase_scatter_cost" if any(s > 1 for s in strides)
                       else "conv_transpose.phase_scatter_cost_s1")
    scatter = sp.prod(K) * N * sp.prod(x.shape[2:]) * (Cg + add)
    return phase <= scatter


def _phase_weights(w, group, ay, ax):
    """Wc^T (G, Uy*Ux*Cg, Py*Px*Mg): each tap at its (shift, phase) slot, zeros elsewhere.

    Stored K-major so that filling it is one transpose of W plus contiguous row copies."""
    C, Mg, kh, kw = w.shape
    Cg = C // group
    Py, Px = len(ay["phases"]), len(ax["phases"])
    Uy, Ux = ay["n_shift"], ax["n_shift"]
    wt = np.ascontiguousarray(w.reshape(group, Cg, Mg, kh * kw).transpose(0, 3, 1, 2))
    wc = np.zeros((group, Uy, Ux, Cg, Py, Px, Mg), dtype=w.dtype)
    for ky in range(kh):
        uy, py = ay["shift_of_tap"][ky], ay["phase_of_tap"][ky]
        for kx in range(kw):
            ux, px = ax["shift_of_tap"][kx], ax["phase_of_tap"][kx]
            wc[:, uy, ux, :, py, px] = wt[:, ky * kw + kx]
    return wc.reshape(group, Uy * Ux * Cg, Py * Px * Mg)


def _phase_chunks(N, Q, bytes_per_row):
    """[(n0, n1, qa, qb)]: whole images while they fit the host budget, else row blocks."""
    budget = sp.chunk_target(np)
    per_image = bytes_per_row * Q
    if per_image <= budget:
        nb = max(1, budget // per_image)
        return [(n0, min(N, n0 + nb), 0, Q) for n0 in range(0, N, nb)]
    rows = max(1, budget // bytes_per_row)
    return [(n, n + 1, qa, min(Q, qa + rows)) for n in range(N) for qa in range(0, Q, rows)]


# bit-copy views of an output pixel's kw adjacent values (its row of kernel taps)
_PAIR_VIEW = {4: np.uint32, 8: np.uint64, 16: np.complex128}


def _tap_grid_applies(x, w, group, strides, dilations, pads, out_shape) -> bool:
    """The 2-D kernel == stride case (a decoder's upsampling: k2 s2 p0) without groups,
    dilation or padding: every output pixel gets exactly one tap, no sums across taps."""
    if x.ndim != 4 or group != 1 or any(d != 1 for d in dilations) or any(pads):
        return False
    kh, kw = w.shape[2:]
    return ([kh, kw] == list(strides) and list(out_shape) == [kh * x.shape[2], kw * x.shape[3]]
            and kw * x.dtype.itemsize in _PAIR_VIEW)


def _host_tap_grid_forward(x, w, b):
    """ConvTranspose with kernel == stride (see _tap_grid_applies): y[n, m, kh*i + a,
    kw*j + c] = sum_C x[n, C, i, j] w[C, m, a, c] + b[m].  One GEMM per image with the
    pixels as rows and (a, m, c) as columns, so that the kw values of an output pixel
    group are adjacent: they move as one bit-copied item into y by a single transposed
    copy (the phase path writes every value through stride-kw loops, which NumPy does
    not vectorise: 2x32x48x48 -> 2x16x96x96 0.66 -> 0.50 ms, one BLAS thread).  Sums
    over C only: the same products, BLAS's summation order."""
    N, C, H, W = x.shape
    M, kh, kw = w.shape[1:]
    wm = np.ascontiguousarray(w.transpose(0, 2, 1, 3)).reshape(C, kh * M * kw)
    pooled = tuning.value("conv_transpose.pooled_scratch_bytes")
    r = host_empty((N, H * W, kh * M * kw), x.dtype, pooled)
    xt = x.reshape(N, C, H * W).transpose(0, 2, 1)
    for n in range(N):  # 2-D products: NumPy's batched matmul of transposed operands can miss BLAS
        np.matmul(xt[n], wm, out=r[n])
    if b is not None:
        r += np.broadcast_to(b.reshape(1, M, 1), (kh, M, kw)).reshape(-1)
    y = host_empty((N, M, kh * H, kw * W), x.dtype, pooled)
    item = _PAIR_VIEW[kw * x.dtype.itemsize]
    src = r.view(item).reshape(N, H, W, kh, M).transpose(0, 4, 1, 3, 2)
    np.copyto(y.view(item).reshape(N, M, H, kh, W), src)
    return y


@specialize("ConvTranspose.forward", device="cpu", ops=("ConvTranspose",), when=_phase_applies,
            agreement="rtol 1e-5 (float32): one GEMM per output phase, another summation order")
def _host_phase_forward(x, w, b, group, strides, dilations, pads, out_shape):
    """ConvTranspose for 1-D/2-D float inputs on the host by the phase decomposition
    (kernel == stride: _host_tap_grid_forward)."""
    if _tap_grid_applies(x, w, group, strides, dilations, pads, out_shape):
        return _host_tap_grid_forward(x, w, b)
    if x.ndim == 3:  # 1-D as 2-D with a unit leading axis
        y = _host_phase_forward(x[:, :, None], w[:, :, None], b, group, [1] + list(strides),
                                [1] + list(dilations), [0, pads[0], 0, pads[1]],
                                [1] + list(out_shape))
        return y[:, :, 0]
    N, C, H, W = x.shape
    Mg, kh, kw = w.shape[1:]
    M, Cg = Mg * group, C // group
    (sy, sx), (dy, dx) = strides, dilations
    Ho, Wo = out_shape
    ay = _phase_axis(kh, sy, dy, pads[0], Ho)
    ax = _phase_axis(kw, sx, dx, pads[1], Wo)
    Py, Px = len(ay["phases"]), len(ax["phases"])
    Uy, Ux = ay["n_shift"], ax["n_shift"]
    Qh, Qw = ay["Q"], ax["Q"]
    Wb = Qw + ax["span"]
    extra = 1 if ax["span"] else 0  # the last shifted window runs past the last row
    block = sp.padded_block(np, x, [ay["lo"], ax["lo"]],
                            [ay["q1"] - ay["emin"] + extra, ax["q1"] - ax["emin"]])
    block = np.ascontiguousarray(block)
    wc = _phase_weights(w, group, ay, ax)
    dtype = x.dtype
    item = dtype.itemsize
    Kc = Uy * Ux * Cg
    PM = Py * Px * Mg
    y = np.empty((N, M, Ho, Wo), dtype=dtype)
    if Py < sy or Px < sx:  # phases without taps hold only the bias
        y[...] = 0 if b is None else b.reshape(1, M, 1, 1)
    y5 = y.reshape(N, group, Mg, Ho, Wo)
    b5 = None if b is None else b.reshape(1, group, Mg, 1, 1)
    sN, sC = block.strides[:2]
    # scratch from the reusable host buffer pool: a fresh multi-MB temporary on every
    # call costs page faults comparable to the GEMM
    pooled = tuning.value("conv_transpose.pooled_scratch_bytes")
    for n0, n1, qa, qb in _phase_chunks(N, Qh, (Kc + PM) * group * Wb * item):
        n, L = n1 - n0, (qb - qa) * Wb
        base = block[n0:n1, :, qa:]
        view = sp.as_strided(np, base, (group, Uy, Ux, Cg, n, L),
                             (Cg * sC, ay["step"] * Wb * item, ax["step"] * item, sC, sN, item))
        cols = host_empty((group, Uy, Ux, Cg, n, L), dtype, pooled)
        r = host_empty((group, PM, n * L), dtype, pooled)
        np.copyto(cols, view)
        cols = cols.reshape(group, Kc, n * L)
        if group == 1:
            np.matmul(wc[0].T, cols[0], out=r[0])
        else:
            np.matmul(wc.transpose(0, 2, 1), cols, out=r)
        r = r.reshape(group, Py, Px, Mg, n, qb - qa, Wb)
        for a, (oy0, cy, qy) in enumerate(ay["per_phase"]):
            j0, j1 = max(0, qa - qy), min(cy, qb - qy)
            if j1 <= j0:
                continue
            rows = slice(qy + j0 - qa, qy + j1 - qa)
            orows = slice(oy0 + sy * j0, oy0 + sy * (j1 - 1) + 1, sy)
            for c, (ox0, cx, qx) in enumerate(ax["per_phase"]):
                if cx == 0:
                    continue
                src = r[:, a, c, :, :, rows, qx:qx + cx].transpose(2, 0, 1, 3, 4)
                dst = y5[n0:n1, :, :, orows, ox0:ox0 + sx * (cx - 1) + 1:sx]
                if b5 is None:
                    dst[...] = src
                else:
                    np.add(src, b5, out=dst)
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
        # the output, and the buffer the scatter path fills (the full result and the
        # requested window), in the compute type, before either exists
        N = x.shape[0]
        check_allocation(self, [N, M] + out, xc.dtype)
        full = [strides[i] * (S[i] - 1) + ek[i] for i in range(n_sp)]
        check_allocation(self, [N, M] + [max(full[i], pads_r[i] + out[i]) - min(0, pads_r[i])
                                         for i in range(n_sp)], xc.dtype, what="working buffer")
        wc = self.to_compute(w, xc.dtype)
        bc = None if b.is_absent else self.to_compute(b, xc.dtype)
        y = conv_transpose_forward(self, xc, wc, bc, group, strides, dilations, pads_r, out)
        return self.from_compute(y, x.data_type)
