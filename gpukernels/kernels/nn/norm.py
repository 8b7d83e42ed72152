"""Normalizations: BatchNormalization, InstanceNormalization, LayerNormalization,
GroupNormalization, RMSNormalization, LpNormalization, LRN, MeanVarianceNormalization.

Half types are computed in float32 and rounded once (the spec's function bodies round
stage one's result to the input type before scaling; we round only the final output).
Statistics (mean, variance) are population statistics, computed as mean((x - mean)^2)
in the stage-one precision.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ...dtypes import DataType
from ...host import tuning
from ...tensor import Tensor
from ..base import KernelBase, register
from ..specialize import specialize
from ..math.arith import native_compute
from ..math.softmax import row_dots, row_ones, row_sums
from ..tensor.indexing import is_frozen
from ...host import host_blocks, host_empty


def _axis(kernel, axis, ndim, **tensors):
    if not -ndim <= axis < ndim:
        raise kernel.error(f"axis {axis} is out of range for rank {ndim}", **tensors)
    return axis % ndim


def _stash_dtype(kernel, stash_type, **tensors):
    """The compute dtype of stage one for a stash_type (an element type enum)."""
    st = int(stash_type)
    if st == DataType.DOUBLE:
        return np.dtype(np.float64), DataType.DOUBLE
    if st in (DataType.FLOAT, DataType.FLOAT16, DataType.BFLOAT16):
        return np.dtype(np.float32), DataType(st)
    raise kernel.error(f"stash_type {stash_type} is not a supported float type "
                       "(1 float, 10 float16, 11 double, 16 bfloat16)", **tensors)


# ------------------------------------------------------------------ BatchNormalization


@register()
class BatchNormalization(KernelBase):
    """ONNX BatchNormalization, every opset (1, 6, 7, 9, 14, 15).

    Mode: opset 14/15 -- the training_mode attribute.  Opset 1/6 -- the is_test
    attribute (0, the default, is training mode, as the spec says).  Opset 7/9 -- the
    spec's "output case #1": training mode exactly when the node declares any output
    besides Y (the runtime passes the declared outputs in ``requested_outputs``; a
    direct call is inference; use ``training_forward`` for training).

    Training: batch mean and population variance over every axis except the channel
    (except the batch axis only for opset 1/6/7 spatial=0, where scale, B, mean and var
    may have shape X.shape[1:]); running = input * momentum + batch * (1 - momentum).
    Outputs: opset 14/15 Y, running_mean, running_var; opset 1-9 Y, mean, var,
    saved_mean, saved_var where mean/var are the running statistics and saved_mean /
    saved_var the batch mean and batch (population) variance.  A 1-D X is (N,) with C = 1.
    """

    class Result(NamedTuple):
        Y: Tensor
        running_mean: Tensor | None = None
        running_var: Tensor | None = None

    class LegacyResult(NamedTuple):
        Y: Tensor
        mean: Tensor | None = None
        var: Tensor | None = None
        saved_mean: Tensor | None = None
        saved_var: Tensor | None = None

    def __call__(self, X, scale, B, input_mean=None, input_var=None, epsilon=1e-5, momentum=0.9,
                 training_mode=0, is_test=0, spatial=1, consumed_inputs=None, mean=None, var=None):
        if input_mean is None:
            input_mean = mean
        if input_var is None:
            input_var = var
        v = self.since_version
        if v >= 14:
            training = bool(training_mode)
        elif v >= 7:
            r = self.requested_outputs
            training = r is not None and any(r[1:])
        else:
            training = not is_test
        spatial = bool(spatial) if v < 9 else True
        return self._run(X, scale, B, input_mean, input_var, float(epsilon), float(momentum), training,
                         spatial)

    def training_forward(self, X, scale, B, input_mean, input_var, epsilon=1e-5, momentum=0.9,
                         spatial=1):
        """Training mode at any opset: normalise with the batch statistics and return the
        updated running statistics (Result, or LegacyResult before opset 14)."""
        return self._run(X, scale, B, input_mean, input_var, float(epsilon), float(momentum), True,
                         bool(spatial) if self.since_version < 9 else True)

    def _run(self, X, scale, B, input_mean, input_var, eps, momentum, training, spatial):
        x = self.tensor(X, "X")
        s = self.tensor(scale, "scale")
        b = self.tensor(B, "B")
        m = self.tensor(input_mean, "input_mean")
        var = self.tensor(input_var, "input_var")
        self.check_inputs(x, s, b, m, var)
        tensors = dict(X=x, scale=s, B=b, input_mean=m, input_var=var)
        if x.ndim < 1:
            raise self.error("X must have rank >= 1", **tensors)
        shape = x.shape if x.ndim >= 2 else (x.shape[0], 1)
        C = shape[1]
        per_feature = not spatial
        param_shapes = [(C,)]
        if per_feature:
            param_shapes.append(tuple(shape[1:]))
        for name, t in (("scale", s), ("B", b), ("input_mean", m), ("input_var", var)):
            if tuple(t.shape) not in param_shapes:
                want = " or ".join(str(list(p)) for p in param_shapes)
                raise self.error(f"{name} must have shape {want}", **tensors)
        xp = self.xp
        xc = self.to_compute(x).reshape(shape)
        dt = xc.dtype
        nd = len(shape)

        def param(t):
            a = self.to_compute(t, dt)
            if a.ndim == 1:
                return a.reshape((1, C) + (1,) * (nd - 2))
            return a.reshape((1,) + tuple(shape[1:]))

        sc, bc = param(s), param(b)
        if not training:
            mc, vc = param(m), param(var)
            a = sc / xp.sqrt(vc + dt.type(eps))
            shift = bc - mc * a
            fast = self.specialized("BatchNormalization.affine", xc, a, shift)
            y = fast(xc, a, shift) if fast is not None else xc * a + shift
            y = self.from_compute(y.reshape(x.shape), x.data_type)
            return self.Result(y) if self.since_version >= 14 else self.LegacyResult(y)
        axes = (0,) if per_feature else (0,) + tuple(range(2, nd))
        bmean = xp.mean(xc, axis=axes, keepdims=True)
        d = xc - bmean
        bvar = xp.mean(d * d, axis=axes, keepdims=True)
        y = d * (sc / xp.sqrt(bvar + dt.type(eps))) + bc
        y = self.from_compute(y.reshape(x.shape), x.data_type)

        def running(t, batch):
            prev = self.to_compute(t, dt)
            new = prev * dt.type(momentum) + batch.reshape(prev.shape) * dt.type(1.0 - momentum)
            return self.from_compute(new, t.data_type)

        run_mean = running(m, bmean) if self.wants_output(1) else None
        run_var = running(var, bvar) if self.wants_output(2) else None
        if self.since_version >= 14:
            return self.Result(y, run_mean, run_var)
        saved_mean = self.from_compute(bmean.reshape(m.shape), m.data_type) if self.wants_output(3) else None
        saved_var = self.from_compute(bvar.reshape(var.shape), var.data_type) if self.wants_output(4) else None
        return self.LegacyResult(y, run_mean, run_var, saved_mean, saved_var)


@specialize("BatchNormalization.affine", device="cpu", ops=("BatchNormalization",))
def _scale_shift_host(x, a, shift):
    """x * a + shift on the host, a and shift of shape (1, C, ...) broadcasting over x
    (N, C, ...): into a pooled output, in blocks of samples or channels of about
    batch_norm.host_block_bytes (host/tuning.py), so that the add reads the product while it is in cache (the
    same two roundings as the plain expression)."""
    N, C = x.shape[:2]
    y = host_empty(x.shape, x.dtype)
    per_channel = max(1, int(np.prod(x.shape[2:], dtype=np.int64)) * x.dtype.itemsize)
    block = tuning.value("batch_norm.host_block_bytes")
    if C * per_channel <= block:  # whole samples per block
        step = max(1, block // (C * per_channel))
        blocks = [(slice(n, n + step), slice(None)) for n in range(0, N, step)]
    else:  # one sample, blocks of channels
        step = max(1, block // per_channel)
        blocks = [(slice(n, n + 1), slice(c, c + step)) for n in range(N) for c in range(0, C, step)]
    for ns, cs in blocks:
        yb = y[ns, cs]
        np.multiply(x[ns, cs], a[:, cs], out=yb)
        np.add(yb, shift[:, cs], out=yb)
    return y


# ------------------------------------------------------------------ per-instance norms


def _moments(xp, x, axes):
    mean = xp.mean(x, axis=axes, keepdims=True)
    d = x - mean
    var = xp.mean(d * d, axis=axes, keepdims=True)
    return mean, d, var


@register()
class InstanceNormalization(KernelBase):
    """y = scale * (x - mean) / sqrt(var + epsilon) + B with statistics per (n, c) over
    the spatial axes (X of rank >= 3; rank 2 (N, C) normalises single values)."""

    def __call__(self, input, scale, B, epsilon=1e-5, consumed_inputs=None):
        x = self.tensor(input, "input")
        s = self.tensor(scale, "scale")
        b = self.tensor(B, "B")
        self.check_inputs(x, s, b)
        if x.ndim < 2:
            raise self.error("input must have rank >= 2 (N x C x ...)", input=x)
        C = x.shape[1]
        for name, t in (("scale", s), ("B", b)):
            if tuple(t.shape) != (C,):
                raise self.error(f"{name} must have shape ({C},)", input=x, scale=s, B=b)
        return self._step(x, s, b, epsilon)

    def array_function(self, inputs, attrs):
        """_step on the stored arrays (shapes and types as in the validated call)."""
        if len(inputs) != 3 or any(t.__class__ is not Tensor for t in inputs):
            return None
        types, epsilon, step = [t.data_type for t in inputs], attrs.get("epsilon", 1e-5), self._step

        def fn(x, scale, B):
            return step(Tensor.wrap(x, types[0]), Tensor.wrap(scale, types[1]), Tensor.wrap(B, types[2]),
                        epsilon).array

        return fn

    def _step(self, x: Tensor, s: Tensor, b: Tensor, epsilon) -> Tensor:
        """The compute step after validation: every (n, c) is a row of the spatial
        positions, normalised by the LayerNormalization rows (_normalize_rows, on both
        devices: row sums as BLAS dots, in place, over cache-sized row blocks on the host)
        with the row's scale folded into its inverse standard deviation and its B added:
        y = (x - mean) * (scale / sqrt(var + epsilon)) + B."""
        xp = self.xp
        xc = self.to_compute(x)
        dt = xc.dtype
        N, C = x.shape[:2]
        D = math.prod(x.shape[2:])
        if xc.size == 0:
            return self.from_compute(xp.empty(xc.shape, dt), x.data_type)
        rows = xp.ascontiguousarray(xc).reshape(N * C, D)
        per_row = [_per_row(xp, self.to_compute(t, dt), N) for t in (s, b)]
        y, _, _ = _normalize_rows(self, rows, epsilon, None, None, True, stats=False, row_params=per_row)
        return self.from_compute(y.reshape(xc.shape), x.data_type)


def _per_row(xp, values, N):
    """values (K,) repeated for each of N images: the (N * K,) per-row parameters of
    rows (n, k)."""
    return xp.broadcast_to(values.reshape(1, -1), (N, values.size)).reshape(-1)


def _unidirectional(kernel, t, x, name):
    """Check that t broadcasts to x's shape without growing x."""
    if t.ndim > x.ndim or any(d not in (1, xd) for d, xd in zip(reversed(t.shape), reversed(x.shape))):
        raise kernel.error(f"{name} {list(t.shape)} does not broadcast to X {list(x.shape)}",
                           X=x, **{name: t})


@register()
class LayerNormalization(KernelBase):
    """Statistics over axes [axis, rank); stage one in stash_type's precision (float32
    for stash_type 1, also for double X, as the spec's function body casts); Scale and
    B broadcast unidirectionally to X.  Mean and InvStdDev have X's shape with the
    normalised axes set to 1, in the stash type."""

    class Result(NamedTuple):
        Y: Tensor
        Mean: Tensor | None = None
        InvStdDev: Tensor | None = None

    def __call__(self, X, Scale, B=None, axis=-1, epsilon=1e-5, stash_type=1):
        x = self.tensor(X, "X")
        s = self.tensor(Scale, "Scale")
        b = self.tensor(B, "B", optional=True)
        self.check_inputs(x, s, b)
        if x.ndim < 1:
            raise self.error("X must have rank >= 1", X=x)
        ax = _axis(self, int(axis), x.ndim, X=x)
        _unidirectional(self, s, x, "Scale")
        if not b.is_absent:
            _unidirectional(self, b, x, "B")
        sdt, stype = _stash_dtype(self, stash_type, X=x)
        xp = self.xp
        cdt = np.dtype(np.float64 if x.data_type == DataType.DOUBLE else np.float32)
        xs = self.to_compute(x, sdt)
        lead = x.shape[:ax]
        stat_shape = tuple(lead) + (1,) * (x.ndim - ax)
        fast = _rows_fast_path(self, sdt, cdt, x.shape[ax:], s, b)
        if fast is not None:
            s_flat, b_flat = fast
            stats = self.wants_output(1) or self.wants_output(2)
            y, mean, inv = _normalize_rows(self, xs.reshape(-1, _prod(x.shape[ax:])), float(epsilon), s_flat,
                                           b_flat, center=True, stats=stats)
            y = y.reshape(x.shape)
            if stats:
                mean = mean.reshape(stat_shape)
                inv = inv.reshape(stat_shape)
        else:
            axes = tuple(range(ax, x.ndim))
            mean, d, var = _moments(xp, xs, axes)
            inv = 1.0 / xp.sqrt(var + sdt.type(epsilon))
            y = (d * inv).astype(cdt, copy=False) * self.to_compute(s, cdt)
            if not b.is_absent:
                y = y + self.to_compute(b, cdt)
        out = self.from_compute(y, x.data_type)
        mean_t = self.from_compute(mean, stype) if self.wants_output(1) else None
        inv_t = self.from_compute(inv, stype) if self.wants_output(2) else None
        return self.Result(out, mean_t, inv_t)

    def array_function(self, inputs, attrs):
        """Y alone, where the row path applies to X, Scale and B of one float type."""
        if len(inputs) not in (2, 3):
            return None
        return _rows_array_function(self, inputs, attrs, center=True)


def _prod(shape) -> int:
    return math.prod(int(d) for d in shape)  # np.prod of a tuple costs ~10 us


def _param_shape(shape, norm_shape):
    """A parameter's shape without leading 1s when it varies only over the normalised
    axes, else None."""
    shape = list(shape)
    while len(shape) > len(norm_shape) and shape[0] == 1:
        shape.pop(0)
    return tuple(shape) if len(shape) <= len(norm_shape) else None


def _flat_array(xp, a, shape, norm_shape):
    """A parameter array (of _param_shape ``shape``) as a flat (prod(norm_shape),) array."""
    a = a.reshape(shape)
    if shape == tuple(norm_shape):  # the usual case: nothing to broadcast
        return a.reshape(-1)
    return xp.ascontiguousarray(xp.broadcast_to(a, tuple(norm_shape))).reshape(-1)


def _flat_param(kernel, t, norm_shape, dtype):
    """t (broadcastable to X) as a flat (prod(norm_shape),) array when it varies only
    over the normalised axes, else None."""
    shape = _param_shape(t.shape, norm_shape)
    if shape is None:
        return None
    return _flat_array(kernel.xp, kernel.to_compute(t, dtype), shape, norm_shape)


def _rows_array_function(kernel, inputs, attrs, center: bool):
    """The array function of LayerNormalization (center) and RMSNormalization: where the
    kernel takes the row path with every input of X's type (float or double, stage one
    in that type too), _normalize_rows with the axis, epsilon and parameter shapes fixed."""
    x = inputs[0]
    if (not native_compute(inputs) or x.data_type not in (DataType.FLOAT, DataType.DOUBLE) or x.ndim < 1
            or any(t.data_type != x.data_type for t in inputs)):
        return None
    ax = _axis(kernel, int(attrs.get("axis", -1)), x.ndim, X=x)
    sdt, _ = _stash_dtype(kernel, attrs.get("stash_type", 1), X=x)
    norm = tuple(x.shape[ax:])
    shapes = [_param_shape(t.shape, norm) for t in inputs[1:]]
    if sdt != x.array.dtype or None in shapes:
        return None
    width, eps, xp = _prod(norm), float(attrs.get("epsilon", 1e-5)), kernel.xp
    tiles = _RowTiles()

    def normalize(a, scale, bias=None):
        x2 = a.reshape(-1, width)
        params = tiles.get(x2.shape[0], scale, bias)
        if params is None:
            b_flat = None if bias is None else _flat_array(xp, bias, shapes[1], norm)
            params = tiles.offer(x2.shape[0], scale, bias, _flat_array(xp, scale, shapes[0], norm), b_flat)
        y, _, _ = _normalize_rows(kernel, x2, eps, params[0], params[1], center, stats=False)
        return y.reshape(a.shape)

    return normalize


# Row tiles of the scale and bias (see _RowTiles) for rows up to this many elements and
# inputs up to this many bytes (each tile as large: at most 256 KiB per node), where
# NumPy's pass over (R, D) with a (D,) operand costs a loop per row (~10 ns each; 512
# rows of 16 or 32 in SegFormer and ConvNeXt at 96x96) and the tiles stay in cache.
_TILE_MAX_WIDTH = 256
_TILE_MAX_BYTES = 128 << 10


class _RowTiles:
    """The flat scale and bias of an array function repeated over the R rows of its
    input, kept while the same frozen host arrays (a graph's constants, which nobody can
    write: tensor.indexing.is_frozen) come back: y * s and y + b then run as single
    contiguous passes instead of one short loop per row, with the same products and sums
    (the same values).  Any other parameters are used flat, as given.  One entry,
    replaced whole (safe under concurrent runs)."""

    __slots__ = ("entry",)

    def __init__(self):
        self.entry = None  # (scale, bias, R, (scale tile, bias tile))

    def get(self, R, scale, bias):
        """The tiles for these very parameter arrays and R rows, or None."""
        e = self.entry
        if e is not None and e[0] is scale and e[1] is bias and e[2] == R:
            return e[3]
        return None

    def offer(self, R, scale, bias, s_flat, b_flat):
        """(scale, bias) to use: tiles made (and kept) where they pay, else the flat ones."""
        D = s_flat.shape[0]
        if (not 0 < D <= _TILE_MAX_WIDTH or R < 2 or R * D * s_flat.itemsize > _TILE_MAX_BYTES
                or not all(t is None or is_frozen(t) for t in (scale, bias))):
            return s_flat, b_flat
        made = tuple(None if f is None else np.tile(f, (R, 1)) for f in (s_flat, b_flat))
        for t in made:
            if t is not None:
                t.flags.writeable = False
        self.entry = (scale, bias, R, made)
        return made


def _rows_fast_path(kernel, sdt, cdt, norm_shape, s, b):
    """(scale, bias) flat for the row-blocked path, or None when it does not apply
    (stage one and two in different precisions, or parameters varying over leading axes)."""
    if sdt != cdt:
        return None
    s_flat = _flat_param(kernel, s, norm_shape, cdt)
    if s_flat is None:
        return None
    b_flat = None
    if b is not None and not b.is_absent:
        b_flat = _flat_param(kernel, b, norm_shape, cdt)
        if b_flat is None:
            return None
    return s_flat, b_flat


def _normalize_rows(kernel, x2, eps, s_flat, b_flat, center, stats=True, row_params=None):
    """Row-wise normalisation of x2 (R, D): y = (x - mean) * invstd * s + b (center) or
    x * rsqrt(mean(x^2) + eps) * s, s and b of shape (D,) or (R, D) (the same values
    repeated over the rows: see _RowTiles).  Returns y (R, D), mean (R,) (None when not
    centering) and the inverse (R,); with stats False the caller wants y alone (a path
    may then return None for both).  row_params: (scale, bias) of shape (R,) instead,
    one value per row (InstanceNormalization; s_flat and b_flat None; bias may be None):
    the scale is folded into the row's inverse (inv is then returned scaled).  The reference is
    _normalize_block on all rows."""
    fast = kernel.specialized("LayerNormalization.rows", x2)
    if fast is not None:
        return fast(x2, eps, s_flat, b_flat, center, stats, row_params)
    xp = kernel.xp
    y = xp.empty(x2.shape, dtype=x2.dtype)
    mean, inv = _normalize_block(xp, x2, y, eps, s_flat, b_flat, center, row_ones(xp, x2.shape[1], x2.dtype),
                                 row_params)
    return y, mean, inv


def _normalize_block(xp, xb, yb, eps, s_flat, b_flat, center, ones, row_params=None):
    """Normalise the rows of xb (R, D) into yb (xb may be yb); returns (mean or None, inv).

    Every step works in place on the output or on the (R,) statistics (no temporaries).
    The row sums and sums of squares are BLAS dot products (``row_sums``/``row_dots``,
    pairwise beyond 8192 columns) on both devices: the host blocks run this same
    function, so they agree with the reference bit for bit.  row_params: per-row
    (scale, bias) of shape (R,) (see _normalize_rows)."""
    D = xb.shape[1]
    dt = xb.dtype
    inv_d = dt.type(1.0 / D) if D else dt.type(0)
    mean = None
    if center:
        mean = row_sums(xp, xb, ones)
        mean *= inv_d
        xp.subtract(xb, mean[:, None], out=yb)
    elif yb is not xb:
        yb[...] = xb
    inv = row_dots(xp, yb, yb)  # 1 / sqrt(sum of squares / D + eps), in place
    inv *= inv_d
    inv += dt.type(eps)
    xp.sqrt(inv, out=inv)
    if row_params is not None:  # y = (x - mean) * (scale / sqrt(var + eps)) + bias, per row
        scale, bias = row_params
        xp.divide(scale, inv, out=inv)
        xp.multiply(yb, inv[:, None], out=yb)
        if bias is not None:
            xp.add(yb, bias[:, None], out=yb)
        return mean, inv
    xp.divide(dt.type(1), inv, out=inv)
    xp.multiply(yb, inv[:, None], out=yb)
    xp.multiply(yb, s_flat, out=yb)
    if b_flat is not None:
        xp.add(yb, b_flat, out=yb)
    return mean, inv


@specialize("LayerNormalization.rows", device="cpu",
            ops=("LayerNormalization", "RMSNormalization", "InstanceNormalization", "GroupNormalization"))
def _normalize_rows_host(x2, eps, s_flat, b_flat, center, stats=True, row_params=None):
    """_normalize_rows on the host: _normalize_block over blocks of rows that fit in
    cache, over the host threads, into a reusable output buffer (the same values).  An
    input of one block goes straight from x2 into the output (the cheapest for the
    small rows of vision models, where the call overhead is most of the cost); with
    stats False the statistics of several blocks are not gathered (returned as None)."""
    R, D = x2.shape
    dt = x2.dtype
    y = host_empty((R, D), dt)
    ones = row_ones(np, D, dt)  # kept and read-only on the host
    step = max(1, tuning.value("norm.host_row_block_bytes") // max(1, D * dt.itemsize))  # host/tuning.py
    if R <= step:  # one block: no hand-out (its bookkeeping costs more than small rows)
        mean, inv = _normalize_block(np, x2, y, eps, s_flat, b_flat, center, ones, row_params)
        return y, mean, inv
    mean_all = np.empty((R,), dtype=dt) if center and stats else None
    inv_all = np.empty((R,), dtype=dt) if stats else None

    def block(a, b):
        yb = y[a:b]
        # copying first reads x and brings the output lines in within one memory-bound
        # pass (measured ~18% faster than a read pass and a write pass); the statistics
        # are then the same sums of the same values
        yb[...] = x2[a:b]
        if row_params is None:
            sb = s_flat if s_flat.ndim == 1 else s_flat[a:b]  # flat, or tiled over the rows
            bb = b_flat if b_flat is None or b_flat.ndim == 1 else b_flat[a:b]
            rb = None
        else:
            sb = bb = None
            rb = tuple(None if p is None else p[a:b] for p in row_params)
        m, iv = _normalize_block(np, yb, yb, eps, sb, bb, center, ones, rb)
        if mean_all is not None:
            mean_all[a:b] = m
        if inv_all is not None:
            inv_all[a:b] = iv

    host_blocks(R, step, block)  # independent row blocks, handed out to the host threads
    return y, mean_all, inv_all


@register()
class GroupNormalization(KernelBase):
    """Statistics per (n, group) over the group's channels and the spatial axes.
    Opset 18: scale and bias have shape (num_groups,), one value per group (the opset-18
    text).  Opset 21: shape (C,), one value per channel; stage one runs in stash_type's
    precision."""

    def __call__(self, X, scale, bias, epsilon=1e-5, num_groups=None, stash_type=1):
        x = self.tensor(X, "X")
        s = self.tensor(scale, "scale")
        b = self.tensor(bias, "bias")
        self.check_inputs(x, s, b)
        tensors = dict(X=x, scale=s, bias=b)
        if num_groups is None:
            raise self.error("attribute 'num_groups' is required", **tensors)
        G = int(num_groups)
        if x.ndim < 2:
            raise self.error("X must have rank >= 2 (N x C x ...)", **tensors)
        N, C = x.shape[:2]
        if G < 1 or C % G:
            raise self.error(f"num_groups ({G}) must be >= 1 and divide the channels ({C})", **tensors)
        per_group = self.since_version < 21
        want = (G,) if per_group else (C,)
        for name, t in (("scale", s), ("bias", b)):
            if tuple(t.shape) != want:
                what = "num_groups" if per_group else "C"
                raise self.error(f"{name} must have shape {list(want)} ({what}) at opset "
                                 f"{self.since_version}", **tensors)
        sdt, _ = _stash_dtype(self, stash_type if self.since_version >= 21 else 1, **tensors)
        if x.data_type == DataType.DOUBLE and self.since_version < 21:
            sdt = np.dtype(np.float64)
        xp = self.xp
        xs = self.to_compute(x, sdt)
        cdt = np.float64 if x.data_type == DataType.DOUBLE else np.float32
        if not xs.size:  # an empty batch or empty spatial axes: nothing to normalise
            return self.from_compute(xp.empty(xs.shape, cdt), x.data_type)
        if sdt == cdt:
            return self.from_compute(self._rows(xs, s, b, epsilon, G, per_group), x.data_type)
        xg = xs.reshape((N, G, -1))
        mean, d, var = _moments(xp, xg, (2,))
        normalized = (d / xp.sqrt(var + sdt.type(epsilon))).reshape(x.shape)
        normalized = normalized.astype(cdt, copy=False)
        sc = self.to_compute(s, cdt)
        bc = self.to_compute(b, cdt)
        if per_group:
            cs = C // G
            sc = xp.repeat(sc, cs)
            bc = xp.repeat(bc, cs)
        shape = (1, C) + (1,) * (x.ndim - 2)
        y = normalized * sc.reshape(shape) + bc.reshape(shape)
        return self.from_compute(y, x.data_type)

    def _rows(self, xs, s, b, epsilon, G, per_group):
        """Both stages in xs's type through LayerNormalization's rows (each (n, group) a
        row: BLAS-dot sums, in place, cache-sized blocks on the host): opset 18's group
        scale and bias folded into the rows; opset 21's per-channel ones applied after,
        in place on the normalised rows.  (x - mean) / sqrt(var + epsilon), then
        * scale + bias, as the other path computes them."""
        xp, dt = self.xp, xs.dtype
        N, C = xs.shape[:2]
        rows = xp.ascontiguousarray(xs).reshape(N * G, -1)
        if per_group:
            params = [_per_row(xp, self.to_compute(t, dt), N) for t in (s, b)]
            y, _, _ = _normalize_rows(self, rows, epsilon, None, None, True, stats=False, row_params=params)
            return y.reshape(xs.shape)
        y, _, _ = _normalize_rows(self, rows, epsilon, None, None, True, stats=False,
                                  row_params=(xp.ones(N * G, dt), None))
        y3 = y.reshape(N, C, -1)
        xp.multiply(y3, self.to_compute(s, dt).reshape(1, C, 1), out=y3)
        xp.add(y3, self.to_compute(b, dt).reshape(1, C, 1), out=y3)
        return y.reshape(xs.shape)


@register()
class RMSNormalization(KernelBase):
    """Y = X / sqrt(mean(X^2 over [axis, rank)) + epsilon) * scale; stage one in
    stash_type's precision; scale broadcasts unidirectionally to X."""

    def __call__(self, X, scale, axis=-1, epsilon=1e-5, stash_type=1):
        x = self.tensor(X, "X")
        s = self.tensor(scale, "scale")
        self.check_inputs(x, s)
        if x.ndim < 1:
            raise self.error("X must have rank >= 1", X=x)
        ax = _axis(self, int(axis), x.ndim, X=x)
        _unidirectional(self, s, x, "scale")
        sdt, _ = _stash_dtype(self, stash_type, X=x)
        xp = self.xp
        xs = self.to_compute(x, sdt)
        cdt = np.dtype(np.float64 if x.data_type == DataType.DOUBLE or s.data_type == DataType.DOUBLE
                       else np.float32)
        fast = _rows_fast_path(self, sdt, cdt, x.shape[ax:], s, None)
        if fast is not None:
            y, _, _ = _normalize_rows(self, xs.reshape(-1, _prod(x.shape[ax:])), float(epsilon), fast[0], None,
                                      center=False, stats=False)
            return self.from_compute(y.reshape(x.shape), x.data_type)
        ms = xp.mean(xs * xs, axis=tuple(range(ax, x.ndim)), keepdims=True)
        normalized = xs / xp.sqrt(ms + sdt.type(epsilon))
        y = normalized.astype(cdt, copy=False) * self.to_compute(s, cdt)
        return self.from_compute(y, x.data_type)

    def array_function(self, inputs, attrs):
        """Where the row path applies to X and scale of one float type."""
        if len(inputs) != 2:
            return None
        return _rows_array_function(self, inputs, attrs, center=False)


@register()
class LpNormalization(KernelBase):
    """output = input / ||input||_p along axis (p = 1 or 2); a zero norm gives zero."""

    def __call__(self, input, axis=-1, p=2):
        x = self.tensor(input, "input")
        self.check_inputs(x)
        if int(p) not in (1, 2):
            raise self.error(f"p must be 1 or 2, got {p}", input=x)
        if x.ndim == 0:
            raise self.error("input must have rank >= 1", input=x)
        ax = _axis(self, int(axis), x.ndim, input=x)
        xp = self.xp
        xc = self.to_compute(x)
        if int(p) == 1:
            norm = xp.sum(xp.abs(xc), axis=ax, keepdims=True)
        else:
            norm = xp.sqrt(xp.sum(xc * xc, axis=ax, keepdims=True))
        with np.errstate(invalid="ignore", divide="ignore"):
            y = xp.where(norm == 0, xc.dtype.type(0), xc / xp.where(norm == 0, 1, norm))
        return self.from_compute(y, x.data_type)


@register()
class LRN(KernelBase):
    """Y = X / (bias + alpha / size * square_sum)^beta, square_sum over channels
    c - floor((size-1)/2) .. c + ceil((size-1)/2) clipped to [0, C)."""

    def __call__(self, X, alpha=1e-4, beta=0.75, bias=1.0, size=None):
        x = self.tensor(X, "X")
        self.check_inputs(x)
        if size is None or int(size) < 1:
            raise self.error(f"attribute 'size' must be a positive int, got {size}", X=x)
        if x.ndim < 2:
            raise self.error("X must have rank >= 2 (N x C x ...)", X=x)
        size = int(size)
        xp = self.xp
        xc = self.to_compute(x)
        C = x.shape[1]
        before = (size - 1) // 2
        after = size - 1 - before
        sq = xc * xc
        pad = [(0, 0)] * x.ndim
        pad[1] = (before, after)
        sqp = xp.pad(sq, pad)
        acc = xp.zeros_like(sq)
        for k in range(size):
            acc += sqp[:, k:k + C]
        dt = xc.dtype.type
        y = xc / xp.power(dt(bias) + dt(alpha / size) * acc, dt(beta))
        return self.from_compute(y, x.data_type)


@register()
class MeanVarianceNormalization(KernelBase):
    """Y = (X - mean) / (sqrt(var) + 1e-9) over axes (default [0, 2, 3]); the epsilon
    1e-9 is the one the spec's function body adds to the standard deviation."""

    def __call__(self, X, axes=None):
        x = self.tensor(X, "X")
        self.check_inputs(x)
        if axes is None:
            axes = [0, 2, 3]
        nd = x.ndim
        norm_axes = []
        for a in axes:
            a = int(a)
            if not -nd <= a < nd:
                raise self.error(f"axis {a} is out of range for rank {nd}", X=x)
            norm_axes.append(a % nd)
        if len(set(norm_axes)) != len(norm_axes):
            raise self.error(f"axes {list(axes)} repeat an axis", X=x)
        xp = self.xp
        xc = self.to_compute(x)
        mean, d, var = _moments(xp, xc, tuple(norm_axes))
        y = d / (xp.sqrt(var) + xc.dtype.type(1e-9))
        return self.from_compute(y, x.data_type)
