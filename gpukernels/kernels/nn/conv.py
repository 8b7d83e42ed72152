"""Conv: N-D convolution as matrix products.

Paths (all on the array namespace, so they run on NumPy and CuPy alike):

* 1x1 kernels without padding: the input (subsampled by the strides) is already the
  column matrix; one batched matmul per group.
* depthwise (group == C, one input channel per group): a loop over kernel taps, each a
  fused multiply-add of a strided slice, over channel blocks small enough to stay in cache.
* everything else: im2col through a strided window view (no Python loop over pixels),
  copied into a column buffer, then one batched matmul
  (group, M/group, C/group*k) @ (chunk, group, C/group*k, pixels) that lands directly in
  NCHW order.  Workspace: the column buffer is built per chunk -- over the batch, and
  over output rows when one image alone is larger -- of at most 256 MiB on a GPU and
  8 MiB on the CPU (where a cache-sized buffer makes the copy and the matmul faster);
  the zero padding is applied per chunk too (only the rows a chunk reads), so the
  scratch never exceeds the bound plus one padded row block, whatever the input size.

Host specialisations (registered, chosen by the kernel; paths='reference' turns them
off): 1x1 convolutions of one group are one product per image with the bias inside
when that is cheaper (``Conv.pointwise``); 2-D convolutions take the NumPy-only paths
of _conv_host.py (``Conv.dense``: window columns copied at once from a kept padded
scratch, a phase-split column matrix in row blocks for large images, or tap products
without columns) and _depthwise_host.py (``Conv.depthwise``), depthwise convolutions
of other ranks spread their channel blocks over the host threads, and im2col products
of whole images are written straight into the output (``Conv.product``).
``conv_function`` makes every choice once per input signature, which is what a
compiled graph calls (``Conv.array_function``: no per-call validation).

Half types (float16, bfloat16) are computed in float32 and rounded once; double stays
double.  On a GPU the hand-written CUDA kernel (gpukernels.gpu.conv) is tried first.
"""

from __future__ import annotations

import numpy as np

from ...host import parallel_ranges, tuning
from ..base import KernelBase, register
from ..math.arith import native_compute
from ..specialize import specialize
from . import _conv_host as host
from . import _depthwise_host as depthwise_host
from . import _spatial as sp



def conv_forward(xp, x, w, b, strides, pads, dilations, group, out_shape=None, kernel=None):
    """Y = conv(x, w) + b on compute arrays; x (N, C, *S), w (M, C/group, *K), b (M,) or
    None; pads = begin..end.  Attributes must be validated already.  kernel (the calling
    kernel, when given) chooses the registered specialisations of the depthwise and the
    dense 2-D steps (host paths in _conv_host); without it the reference steps run."""
    return conv_function(xp, x, w, strides, pads, dilations, group, out_shape, kernel)(x, w, b)


def conv_function(xp, x, w, strides, pads, dilations, group, out_shape=None, kernel=None, epilogue=None):
    """The convolution of conv_forward planned once for arrays shaped and typed as x and
    w: a function f(x, w, b=None) -> y for any such arrays (the path, the output shape
    and the specialisation are chosen here, from shapes, dtypes and attributes only).
    epilogue: None, or an activation fused into the convolution, epilogue(src, out)
    writing act(src) into out with xp's ufuncs (out may be src); the host paths apply
    it where they write their output, the others to the finished result.  The host
    paths (Conv.pointwise, Conv.dense, Conv.depthwise) get a ConstantMemo of their own
    (the last argument): what they derive from constant weights and bias is kept with
    the function."""
    n_sp = x.ndim - 2
    N, C = x.shape[:2]
    M = w.shape[0]
    K = w.shape[2:]
    S = x.shape[2:]
    pb, pe = pads[:n_sp], pads[n_sp:]
    if out_shape is None:
        out_shape = [(S[i] + pb[i] + pe[i] - (K[i] - 1) * dilations[i] - 1) // strides[i] + 1
                     for i in range(n_sp)]
    O = list(out_shape)
    # an axis with one output position reads only the first window: its stride is moot,
    # and a huge one must not size the host paths' phase loops and scratch
    strides = [1 if O[i] == 1 else strides[i] for i in range(n_sp)]
    dtype = x.dtype
    bias_shape = (1, M) + (1,) * n_sp

    def with_epilogue(step):
        def run(x, w, b=None):
            y = step(x, w, b)
            if epilogue is not None:
                epilogue(y, y)
            return y
        return run

    def with_bias(step):
        def add_bias(x, w, b):
            y = step(x, w)
            if b is not None:
                y += b.reshape(bias_shape).astype(dtype, copy=False)
            return y
        return with_epilogue(add_bias)

    if N == 0 or M == 0 or sp.prod(O) == 0 or C == 0:  # C == 0: an empty sum, the output is the bias
        return with_bias(lambda x, w: xp.zeros((N, M, *O), dtype=dtype))
    if group == C and w.shape[1] == 1 and group > 1:
        fast = kernel.specialized("Conv.depthwise", x, w) if kernel is not None else None
        if fast is not None:
            memo = host.ConstantMemo()
            return lambda x, w, b=None: fast(x, w, b, strides, pads, dilations, O, epilogue, memo)
        return with_epilogue(lambda x, w, b: _depthwise(xp, x, w, b, strides, pads, dilations, O))
    if all(k == 1 for k in K) and not any(pads):
        fast = kernel.specialized("Conv.pointwise", x, w, group) if kernel is not None else None
        if fast is not None:
            memo = host.ConstantMemo()
            return lambda x, w, b=None: fast(x, w, b, strides, O, epilogue, memo)
        return with_bias(lambda x, w: _pointwise(xp, x, w, strides, group, O))
    fast = kernel.specialized("Conv.dense", x, w, group) if kernel is not None else None
    if fast is not None:
        memo = host.ConstantMemo()
        return lambda x, w, b=None: fast(x, w, b, strides, pads, dilations, O, epilogue, memo)
    return with_bias(lambda x, w: _im2col(xp, x, w, strides, pads, dilations, group, O, kernel))


def _pointwise(xp, x, w, strides, group, O):
    N, C = x.shape[:2]
    M = w.shape[0]
    if any(s != 1 for s in strides) or tuple(x.shape[2:]) != tuple(O):
        # the rows read: o*s for each output o (an axis with one output has stride 1 here
        # and may have more input rows)
        x = x[(slice(None), slice(None)) + tuple(slice(None, (o - 1) * s + 1, s) for s, o in zip(strides, O))]
    cols = x.reshape(N, group, C // group, sp.prod(O))
    wg = w.reshape(group, M // group, C // group)
    if group == 1:
        y = xp.matmul(wg[0], cols[:, 0])
    else:
        y = xp.matmul(wg, cols)
    return y.reshape((N, M) + tuple(O))


def _im2col(xp, x, w, strides, pads, dilations, group, O, kernel=None):
    n_sp = x.ndim - 2
    N, C = x.shape[:2]
    M = w.shape[0]
    K = tuple(w.shape[2:])
    pb = pads[:n_sp]
    Cg, Mg = C // group, M // group
    kk = sp.prod(K)
    wg = w.reshape(group, Mg, Cg * kk)
    item = x.dtype.itemsize
    ek = [(K[i] - 1) * dilations[i] + 1 for i in range(n_sp)]
    per_image = C * kk * sp.prod(O) * item
    target = sp.chunk_target(xp)
    if per_image <= target:
        nb = max(1, target // per_image)
        chunks = [(n0, min(N, n0 + nb), 0, O[0]) for n0 in range(0, N, nb)]
    else:
        rows = sp.row_chunks(O[0], per_image // O[0], target)
        chunks = [(n0, n0 + 1, r0, r1) for n0 in range(N) for r0, r1 in rows]
    single = len(chunks) == 1
    y = None if single else xp.empty((N, M) + tuple(O), dtype=x.dtype)
    product = None
    if not single:
        product = kernel.specialized("Conv.product", y) if kernel is not None else None
        if product is None:
            product = _product_reference
    for n0, n1, r0, r1 in chunks:
        nr = r1 - r0
        lo = [r0 * strides[0] - pb[0]] + [-pb[i] for i in range(1, n_sp)]
        hi = [(r1 - 1) * strides[0] + ek[0] - pb[0]] + \
             [(O[i] - 1) * strides[i] + ek[i] - pb[i] for i in range(1, n_sp)]
        block = sp.padded_block(xp, x[n0:n1], lo, hi)
        oc = [nr] + list(O[1:])
        st = block.strides
        view = sp.as_strided(
            xp, block,
            (n1 - n0, group, Cg) + K + tuple(oc),
            (st[0], st[1] * Cg, st[1])
            + tuple(st[2 + i] * dilations[i] for i in range(n_sp))
            + tuple(st[2 + i] * strides[i] for i in range(n_sp)))
        cols = view.reshape(n1 - n0, group, Cg * kk, sp.prod(oc))
        if group == 1:
            wm, cols = wg[0], cols[:, 0]
        else:
            wm = wg
        if single:
            return xp.matmul(wm, cols).reshape((n1 - n0, M) + tuple(oc))
        if nr == O[0]:  # whole images: the product's layout is the output's
            lead = (n1 - n0, M) if group == 1 else (n1 - n0, group, Mg)
            product(wm, cols, y[n0:n1].reshape(lead + (sp.prod(oc),)))
        else:
            y[n0:n1, :, r0:r1] = xp.matmul(wm, cols).reshape((n1 - n0, M) + tuple(oc))
    return y


def _product_reference(wm, cols, dst):
    """dst = wm @ cols (the im2col product of whole images, in the output's layout)."""
    dst[...] = wm @ cols


@specialize("Conv.product", device="cpu", ops=("Conv", "ConvInteger"),
            agreement="exact: the same product, written into the output instead of copied")
def _product_host(wm, cols, dst):
    np.matmul(wm, cols, out=dst)


def _in_order(starts, run_block, per_block):
    """Run the depthwise channel blocks one after another (the reference order)."""
    for c0 in starts:
        run_block(c0)


def _depthwise(xp, x, w, b, strides, pads, dilations, O, run_blocks=_in_order):
    """group == C: each output channel c*m + j reads input channel c only.

    A loop over kernel taps; each tap is one multiply and one add over a channel block
    that fits in cache.  When the last axis has stride 1 (and there are >= 2 spatial
    axes) the taps read whole padded rows ("wide" rows of the padded width, cropped at
    the end), so every slice is one long contiguous run instead of short rows.  The bias is
    added to each block while it is in cache.  run_blocks(starts, run_block, items per
    block) runs the channel blocks: in order here, on the host threads in the host
    specialisation (_depthwise_nd_host)."""
    n_sp = x.ndim - 2
    N, C = x.shape[:2]
    M = w.shape[0]
    m = M // C
    K = tuple(w.shape[2:])
    pb = pads[:n_sp]
    ek = [(K[i] - 1) * dilations[i] + 1 for i in range(n_sp)]
    y = xp.empty((N, C, m) + tuple(O), dtype=x.dtype)
    wv = w.reshape(C, m, sp.prod(K))
    lo = [-pb[i] for i in range(n_sp)]
    hi = [(O[i] - 1) * strides[i] + ek[i] - pb[i] for i in range(n_sp)]
    wide = n_sp >= 2 and strides[-1] == 1
    if wide:
        hi[-2] += 1  # one spare row: the wide rows of the last tap run into it
        Lw = hi[-1] - lo[-1]
        acc_shape = tuple(O[:-1]) + (Lw,)
    else:
        acc_shape = tuple(O)
    per_channel = max(1, N * sp.prod(acc_shape) * x.dtype.itemsize)
    cb = max(1, min(C, tuning.value("depthwise.cache_block_bytes") // per_channel))
    tap_list = sp.taps(K)
    item = x.dtype.itemsize

    def run_block(c0):
        c1 = min(C, c0 + cb)
        block = sp.padded_block(xp, x[:, c0:c1], lo, hi)
        if wide:
            block = xp.ascontiguousarray(block)
        acc = xp.empty((N, c1 - c0) + acc_shape, dtype=x.dtype)
        tmp = xp.empty_like(acc)
        st = block.strides
        # one view holding every tap: (N, cb, *K, *acc_shape)
        if wide:
            inner = tuple(st[2 + i] * strides[i] for i in range(n_sp - 1)) + (item,)
        else:
            inner = tuple(st[2 + i] * strides[i] for i in range(n_sp))
        windows = sp.as_strided(xp, block, (N, c1 - c0) + K + acc_shape,
                                st[:2] + tuple(st[2 + i] * dilations[i] for i in range(n_sp)) + inner)
        for j in range(m):
            for t_index, tap in enumerate(tap_list):
                sl = windows[(slice(None), slice(None)) + tap]
                wt = wv[c0:c1, j, t_index].reshape((1, c1 - c0) + (1,) * n_sp)
                if t_index == 0:
                    xp.multiply(sl, wt, out=acc)
                else:
                    xp.multiply(sl, wt, out=tmp)
                    xp.add(acc, tmp, out=acc)
            dst = y[:, c0:c1, j]
            dst[...] = acc[..., :O[-1]] if wide else acc
            if bias is not None:
                dst += bias[c0:c1, j].reshape((1, c1 - c0) + (1,) * n_sp)

    bias = None if b is None else b.reshape(C, m).astype(x.dtype, copy=False)
    run_blocks(list(range(0, C, cb)), run_block, N * cb * m * sp.prod(O))
    return y.reshape((N, M) + tuple(O))


def _on_host_threads(starts, run_block, per_block):
    """Run the depthwise channel blocks on the host threads (NumPy releases the GIL in
    its ufuncs) when the call is big enough to pay for waking them."""
    parallel_ranges(len(starts), max(1, -(-tuning.value("depthwise.thread_items") // max(1, per_block))),
                    lambda first, last: [run_block(c0) for c0 in starts[first:last]])


@specialize("Conv.depthwise", device="cpu", ops=("Conv", "ConvInteger"), when=lambda x, w: x.ndim != 4,
            agreement="exact: the reference's channel blocks, spread over the host threads")
def _depthwise_nd_host(x, w, b, strides, pads, dilations, O, epilogue=None, memo=None):
    return host.finish(_depthwise(np, x, w, b, strides, pads, dilations, O, _on_host_threads), epilogue)


@specialize("Conv.depthwise", device="cpu", ops=("Conv",), when=lambda x, w: x.ndim == 4,
            agreement="rtol 1e-5 (float32): per-channel (multiplier x taps) @ (taps x pixels) "
                      "products over zero-bordered scratch (the bias in the product), "
                      "(outputs x inputs) products for planes no larger than the kernel, "
                      "row Toeplitz products for narrow planes (the bias in the product), or "
                      "channels-last tap products summed by add.reduce (the bias last) "
                      "sum the taps in another order")
def _depthwise_2d_host(x, w, b, strides, pads, dilations, O, epilogue=None, memo=None):
    return depthwise_host.depthwise_2d(x, w, b, strides, pads, dilations, O, epilogue, memo)


@specialize("Conv.pointwise", device="cpu", ops=("Conv", "ConvInteger"),
            when=lambda x, w, group: group == 1 and x.dtype.kind == "f",
            agreement="rtol 1e-5 (float32): the bias may be added inside the product "
                      "(another rounding order)")
def _pointwise_host(x, w, b, strides, O, epilogue=None, memo=None):
    return host.pointwise(x, w, b, strides, O, epilogue, memo)


@specialize("Conv.dense", device="cpu", ops=("Conv",),
            when=lambda x, w, group: x.ndim == 4 and group == 1 and x.dtype.kind == "f",
            agreement="rtol 1e-5 (float32): window or phase-split columns, or per-tap products (BLAS) "
                      "sum in another order than the im2col product (or the im2col product "
                      "with the bias inside), without the taps that read only padding "
                      "(finite weights)")
def _dense_2d_host(x, w, b, strides, pads, dilations, O, epilogue=None, memo=None):
    return host.dense_2d(x, w, b, strides, pads, dilations, O, epilogue, memo)


def check_conv_ranks(kernel, x, w, group, w_name="W") -> tuple[int, int]:
    """Check X is N x C x D1... with W of the same rank and group >= 1; returns
    (spatial rank, group)."""
    tensors = {"X": x, w_name: w}
    if x.ndim < 3:
        raise kernel.error("X must have rank >= 3 (N x C x D1 ...)", **tensors)
    if w.ndim != x.ndim:
        raise kernel.error(f"{w_name} must have the rank of X ({x.ndim}), got {w.ndim}", **tensors)
    group = int(group)
    if group < 1:
        raise kernel.error(f"group must be >= 1, got {group}", **tensors)
    return x.ndim - 2, group


def conv_attributes(kernel, x, w, kernel_shape, strides, dilations, pads, auto_pad, group,
                    w_name="W"):
    """Validate Conv-style inputs and attributes; returns (strides, pads, dilations,
    out_shape) with pads resolved (begin..end)."""
    tensors = {"X": x, w_name: w}
    n_sp, group = check_conv_ranks(kernel, x, w, group, w_name)
    C = x.shape[1]
    M = w.shape[0]
    if w.shape[1] * group != C:
        raise kernel.error(f"channel mismatch: X has {C} channels but {w_name}.shape[1] * group = "
                           f"{w.shape[1]} * {group} = {w.shape[1] * group}", **tensors)
    if M % group:
        raise kernel.error(f"the number of output channels ({M}) is not a multiple of group ({group})",
                           **tensors)
    K = list(w.shape[2:])
    if kernel_shape is not None and len(kernel_shape):
        if [int(k) for k in kernel_shape] != K:
            raise kernel.error(f"kernel_shape {list(kernel_shape)} does not match the weight's spatial "
                               f"shape {K}", **tensors)
    strides = sp.int_list(kernel, "strides", strides, n_sp, 1, minimum=1, **tensors)
    dilations = sp.int_list(kernel, "dilations", dilations, n_sp, 1, minimum=1, **tensors)
    S = list(x.shape[2:])
    pads = sp.resolve_pads(kernel, auto_pad, pads, S, K, strides, dilations, **tensors)
    out = sp.conv_output_shape(kernel, S, K, strides, dilations, pads, **tensors)
    return strides, pads, dilations, out


@register()
class Conv(KernelBase):
    """ONNX Conv (opsets 1, 11, 22): 1-D, 2-D, 3-D and higher; strides, pads,
    dilations, groups, every auto_pad mode.  Explicit pads combined with a SAME/VALID
    auto_pad are rejected unless all zero."""

    def __call__(self, X, W, B=None, auto_pad="NOTSET", dilations=None, group=1,
                 kernel_shape=None, pads=None, strides=None):
        x = self.tensor(X, "X")
        w = self.tensor(W, "W")
        b = self.tensor(B, "B", optional=True)
        self.check_inputs(x, w, b)
        strides, pads, dilations, out = conv_attributes(
            self, x, w, kernel_shape, strides, dilations, pads, auto_pad, group)
        M = w.shape[0]
        if not b.is_absent and tuple(b.shape) != (M,):
            raise self.error(f"B must have shape ({M},), got {list(b.shape)}", X=x, W=w, B=b)
        fast = self.cuda_path(X=x, W=w, B=None if b.is_absent else b, strides=strides,
                              pads=pads, dilations=dilations, group=int(group))
        if fast is not None:
            return fast
        xc = self.to_compute(x)
        wc = self.to_compute(w, xc.dtype)
        bc = None if b.is_absent else self.to_compute(b, xc.dtype)
        y = conv_forward(self.xp, xc, wc, bc, strides, pads, dilations, int(group), out, kernel=self)
        return self.from_compute(y, x.data_type)

    def array_function(self, inputs, attrs, epilogue=None):
        """Compiled graphs: float32/float64 inputs (computed natively) on the host, the
        attributes resolved and the path chosen once for these shapes (conv_function),
        so a call is the convolution alone.  None on a GPU, where the hand-written CUDA
        kernel decides per call.  epilogue: an activation fused into the output write
        (conv_function; the graph pass conv_activation)."""
        if self.on_gpu or len(inputs) not in (2, 3) or not native_compute(inputs) \
                or inputs[0].array.dtype.kind != "f":
            return None
        x, w = inputs[0], inputs[1]
        a = {k: attrs.get(k) for k in ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")}
        group = int(a["group"] if a["group"] is not None else 1)
        strides, pads, dilations, out = conv_attributes(
            self, x, w, a["kernel_shape"], a["strides"], a["dilations"], a["pads"],
            a["auto_pad"] if a["auto_pad"] is not None else "NOTSET", group)
        return conv_function(self.xp, x.array, w.array, strides, pads, dilations, group, out, kernel=self,
                             epilogue=epilogue)
