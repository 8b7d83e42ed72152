"""Resize and Upsample.

Resizing is separable: each resized axis gets an index map (nearest) or clamped tap
indices with float64 weights (linear, cubic, antialiased), built on the host from the
coordinate transformation and cached per axis geometry; the data is then gathered /
interpolated one axis at a time, in the order that costs least.  Real data is
interpolated with BLAS where the band pays, on both devices: one matmul per block of 16
outputs against the input window the block reads (a dense band slice); outputs whose band
result is not finite take the tap-by-tap result (gather, scale, add), so a NaN or inf
only reaches the outputs whose taps read it.  Complex data and bands that do not pay go
tap by tap.  Both sum the same products; they differ only in rounding order, and the
choice depends on shapes only, so the host and a GPU run the same operations
(``interpolate``).  Small trailing planes (real exports' 1x1 .. 4x4 maps upsampled) take
one matmul against the Kronecker product of their axes' weights (``PlaneWeights``).
Everything that depends on shapes and attributes only is planned once per call signature
(``resize_plan``, cached), so a repeated call pays for the data passes only.

Conventions (following the spec and the ONNX reference outputs):
* The scale in the coordinate formulas is the given scale (scales input) or out/in (sizes
  input, or the common scale of keep_aspect_ratio_policy); ``output_width`` in
  align_corners, tf_crop_and_resize, pytorch_half_pixel and half_pixel_symmetric is
  in * scale (a float when scales are given), as the ONNX reference computes it.
* linear/cubic taps outside the input repeat the edge, unless exclude_outside=1 (their
  weights become 0 and the rest are renormalised).  antialias=1 stretches the linear /
  cubic kernel by 1/scale when downscaling and normalises the weights.
* tf_crop_and_resize: output elements whose source coordinate on any resized axis lies
  outside [0, in-1] get extrapolation_value.
* Integer outputs are rounded half to even and saturated to the type's range.
* Opset 10 Resize and Upsample: coordinates are asymmetric (x_out / scale); nearest takes
  floor.
"""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np

from ... import dtypes
from ...host import tuning
from ...limits import check_allocation
from ...tensor import Tensor
from ..base import KernelBase, register
from ._common import host_floats, host_ints, norm_axes, product, xp_for
from .shape_ops import values_guarded

COORD_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
               "asymmetric", "tf_crop_and_resize")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
MODES = ("nearest", "linear", "cubic")
POLICIES = ("stretch", "not_larger", "not_smaller")


def _s(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def source_coords(mode: str, n_in: int, n_out: int, scale: float, out_width: float, roi=(0.0, 1.0)):
    """(x_original for every output index, extrapolated mask or None), float64 host."""
    y = np.arange(n_out, dtype=np.float64)
    extra = None
    if mode == "align_corners":
        x = np.zeros(n_out) if out_width == 1 else y * (n_in - 1) / (out_width - 1)
    elif mode == "asymmetric":
        x = y / scale
    elif mode == "tf_crop_and_resize":
        start, end = roi
        if out_width == 1:
            x = np.full(n_out, (end - start) * (n_in - 1) / 2)
        else:
            x = y * (end - start) * (n_in - 1) / (out_width - 1)
        x = x + start * (n_in - 1)
        extra = (x < 0) | (x > n_in - 1)
    elif mode == "pytorch_half_pixel":
        x = np.full(n_out, -0.5) if out_width == 1 else (y + 0.5) / scale - 0.5
    elif mode == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    else:  # half_pixel_symmetric
        adjustment = n_out / out_width
        offset = n_in / 2 * (1 - adjustment)
        x = offset + (y + 0.5) / scale - 0.5
    return x, extra


def nearest_index(x: np.ndarray, n_in: int, nearest_mode: str) -> np.ndarray:
    if nearest_mode == "round_prefer_floor":
        i = np.ceil(x - 0.5)
    elif nearest_mode == "round_prefer_ceil":
        i = np.floor(x + 0.5)
    elif nearest_mode == "floor":
        i = np.floor(x)
    else:
        i = np.ceil(x)
    return np.clip(i, 0, n_in - 1).astype(np.int64)


def _cubic(d: np.ndarray, a: float) -> np.ndarray:
    d = np.abs(d)
    d2, d3 = d * d, d * d * d
    near = (a + 2) * d3 - (a + 3) * d2 + 1
    far = a * d3 - 5 * a * d2 + 8 * a * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


def tap_weights(x: np.ndarray, n_in: int, mode: str, scale: float, antialias: bool, cubic_a: float,
                exclude_outside: bool):
    """Per output position: input indices (n_out, taps) clamped into range (edge
    repetition) and their float64 weights."""
    s = min(scale, 1.0) if antialias else 1.0
    support = 1.0 if mode == "linear" else 2.0
    start = int(math.floor(-support / s) + 1)
    taps = np.arange(start, 2 - start)  # linear: [0, 1], cubic: [-1, 2]; wider when antialiased
    base = np.floor(x)
    pos = base[:, None] + taps[None, :]  # (n_out, n_taps) input positions
    dist = (pos - x[:, None]) * s
    if mode == "linear":
        w = np.clip(1 - np.abs(dist), 0, 1)
    else:
        w = _cubic(dist, cubic_a)
    if antialias:
        w = w / w.sum(axis=1, keepdims=True)
    if exclude_outside:
        w = np.where((pos < 0) | (pos > n_in - 1), 0.0, w)
        total = w.sum(axis=1, keepdims=True)
        w = w / np.where(total == 0, 1.0, total)
    return np.clip(pos, 0, n_in - 1).astype(np.int64), w


class AxisTaps:
    """The interpolation of one axis: tap indices (n_out, taps), clamped, and float64
    weights, with the tap columns whose weight is zero for every output dropped.  Built on
    the host; cached per axis geometry (see ``axis_taps``), so treat it as read-only; it
    keeps band, the resize.band_block (outputs per block of the banded matmul,
    host/tuning.py) it was built with."""

    def __init__(self, idx: np.ndarray, w: np.ndarray, n_in: int, extra, band: int):
        nz = np.flatnonzero(np.any(w != 0, axis=0))
        j0, j1 = (int(nz[0]), int(nz[-1]) + 1) if nz.size else (0, 1)
        self.idx, self.w = idx[:, j0:j1], w[:, j0:j1]
        self.n_in = n_in
        self.n_out, self.taps = self.idx.shape
        self.extra = extra  # tf_crop_and_resize: outputs that get extrapolation_value
        self.band = band
        self._cast = {}

    @functools.cached_property
    def spans(self):
        """Per block of self.band outputs: its first output and the input window [lo, hi)
        its taps read."""
        starts = np.arange(0, self.n_out, self.band)
        lo = np.minimum.reduceat(self.idx.min(axis=1), starts)
        hi = np.maximum.reduceat(self.idx.max(axis=1), starts) + 1
        return starts, lo, hi

    @functools.cached_property
    def blocks(self):
        """Banded weights: per block of outputs [o0, o1), its input window [lo, hi) and the
        dense (o1 - o0, hi - lo) float64 weight block (repeated clamped indices summed)."""
        n_out, B = self.n_out, self.band
        starts, lo, hi = self.spans
        o = np.arange(n_out)
        blk = o // B
        dense = np.zeros((starts.size, B, int((hi - lo).max())))
        np.add.at(dense, (blk[:, None], (o % B)[:, None], self.idx - lo[blk][:, None]), self.w)
        return [(int(o0), min(int(o0) + B, n_out), int(a), int(b), dense[k, :min(B, n_out - int(o0)), :b - a])
                for k, (o0, a, b) in enumerate(zip(starts, lo, hi))]

    @functools.cached_property
    def dense(self) -> np.ndarray:
        """The (n_out, n_in) float64 weight matrix (repeated clamped indices summed)."""
        m = np.zeros((self.n_out, self.n_in))
        np.add.at(m, (np.arange(self.n_out)[:, None], self.idx), self.w)
        return m

    def cast(self, work):
        """(tap weight columns, banded blocks with their transposes) in dtype work."""
        key = np.dtype(work)
        if key not in self._cast:
            self._cast[key] = (
                [np.ascontiguousarray(self.w[:, j].astype(work)) for j in range(self.taps)],
                [(o0, o1, a, b, m.astype(work), np.ascontiguousarray(m.T.astype(work)))
                 for o0, o1, a, b, m in self.blocks])
        return self._cast[key]

    @functools.cached_property
    def abs_weight_sum(self) -> float:
        """The largest sum of |weight| over the taps of one output (at least 1)."""
        return max(1.0, float(np.abs(self.w).sum(axis=1).max(initial=0.0)))

    @functools.cached_property
    def window(self) -> float:
        """Mean input window of a band block (the band's multiply-adds per output)."""
        _, lo, hi = self.spans
        return float(np.mean(hi - lo))

    @property
    def band_pays(self) -> bool:
        """Whether the banded matmul's extra multiply-adds (zeros in the blocks) stay few
        enough for BLAS to beat the taps: not for a strong downscale without antialias."""
        return self.window <= 4 * self.taps + 2 * self.band

    def cost(self, last: bool, band: bool) -> float:
        """Relative work per output element, to order the axes."""
        c = self.window if band and self.band_pays else float(self.taps)
        return c * 1.5 if last else c  # reading along the contiguous axis is slower


def axis_taps(coord, n_in, n_out, scale, width, roi, mode, antialias, cubic_a, exclude) -> AxisTaps:
    """The cached AxisTaps of one axis geometry, for the current resize.band_block."""
    return _axis_taps(coord, n_in, n_out, scale, width, roi, mode, antialias, cubic_a, exclude,
                      tuning.value("resize.band_block"))


@functools.lru_cache(maxsize=64)
def _axis_taps(coord, n_in, n_out, scale, width, roi, mode, antialias, cubic_a, exclude, band) -> AxisTaps:
    src, extra = source_coords(coord, n_in, n_out, scale, width, roi)
    idx, w = tap_weights(src, n_in, mode, scale, antialias, cubic_a, exclude)
    return AxisTaps(idx, w, n_in, extra if extra is not None and extra.any() else None, band)


def _split(arr, axis: int):
    """(lead, n, trail) sizes around axis; trail 1 means the axis is the contiguous one."""
    return product(arr.shape[:axis]), arr.shape[axis], product(arr.shape[axis + 1:])


def apply_band(xp, arr, axis: int, taps: AxisTaps, work):
    """Interpolate a real array along axis with one matmul per block of outputs (its
    weight block against the input window it reads): BLAS (cuBLAS on a GPU) does the
    multiply-adds, writing straight into the strided output block.  A non-finite input
    spreads to every output of its blocks whose window holds it (0 * inf is NaN)."""
    lead, n_in, trail = _split(arr, axis)
    blocks = taps.cast(work)[1]
    if trail == 1:
        src = arr.reshape(lead, n_in)
        out = xp.empty((lead, taps.n_out), dtype=arr.dtype)
        for o0, o1, a, b, _, mt in blocks:
            xp.matmul(src[:, a:b], xp.asarray(mt), out=out[:, o0:o1])
    else:
        src = arr.reshape(lead, n_in, trail)
        out = xp.empty((lead, taps.n_out, trail), dtype=arr.dtype)
        for o0, o1, a, b, m, _ in blocks:
            xp.matmul(xp.asarray(m), src[:, a:b, :], out=out[:, o0:o1, :])
    return out.reshape(arr.shape[:axis] + (taps.n_out,) + arr.shape[axis + 1:])


def interpolate(xp, arr, plans: dict, work, wait: bool, order=None):
    """Every planned axis of arr (the reference, both devices), in the order of least
    work (``order``, else ``axis_order``).  Real data through BLAS (banded blocks,
    ``apply_band``) where that pays (the band's zeros cost little and
    resize.band_min_rows interpolated rows or more, host/tuning.py), else tap by tap
    (``apply_taps``).

    Where the spec leaves the arithmetic open we chose BLAS, which is fast on the host;
    every step depends on the shapes only, so the host and a GPU run the same operations
    (bit for bit on NumPy, as the CuPy simulation runs them).  A non-finite value stays
    local: outputs whose band result is not finite take the tap result (only the taps'
    own inputs reach it).  wait (the host) first checks whether any band output is
    non-finite (``_band_stays_finite``, on the input of all axes, else of each) and skips
    the taps when none can be; a GPU never waits: it always computes both and selects."""
    min_rows = tuning.value("resize.band_min_rows")
    # one check of the input can cover every axis: its bound is over the product of
    # their weight sums, and the check's factor 2 covers the intermediate roundings
    finite = wait and arr.dtype.kind == "f" and _band_stays_finite(
        xp, arr, math.prod(t.abs_weight_sum for t in plans.values()))
    with np.errstate(invalid="ignore", over="ignore"):  # non-finite data: see above
        for a in (axis_order(arr.shape, plans, True) if order is None else order):
            lead_trail = arr.size // max(arr.shape[a], 1)
            if arr.dtype.kind == "f" and plans[a].band_pays and lead_trail >= min_rows:
                band = apply_band(xp, arr, a, plans[a], work)
                if not (finite or (wait and _band_stays_finite(xp, arr, plans[a].abs_weight_sum))):
                    band = xp.where(xp.isfinite(band), band, apply_taps(xp, arr, a, plans[a], work))
                arr = band
            else:
                arr = apply_taps(xp, arr, a, plans[a], work)
    return arr


def apply_taps(xp, arr, axis: int, taps: AxisTaps, work):
    """Interpolate arr along axis tap by tap: gather, scale, add (in the taps' order).
    Only the taps' own inputs reach an output, so a non-finite input stays local."""
    lead, n_in, trail = _split(arr, axis)
    src = arr.reshape(lead, n_in, trail)
    cols = taps.cast(work)[0]
    out = tmp = None
    for j in range(taps.taps):
        g = xp.take(src, xp.asarray(taps.idx[:, j]), axis=1)
        w = xp.asarray(cols[j]).reshape(-1, 1)
        if out is None:
            out = xp.multiply(g, w, out=g)
        else:
            tmp = xp.multiply(g, w, out=g)
            out += tmp
    return out.reshape(arr.shape[:axis] + (taps.n_out,) + arr.shape[axis + 1:])


def _band_stays_finite(xp, arr, abs_weight_sum: float) -> bool:
    """True when no band output of arr can be non-finite: every input is finite and at
    most max|float| / (2 * abs_weight_sum, the largest sum of |weights| of an output),
    so that no product or partial sum overflows (NaN fails the comparisons too).  Two
    reductions of the input, read back (the host)."""
    if arr.size == 0:
        return True
    bound = float(np.finfo(arr.dtype).max) / (2.0 * abs_weight_sum)
    return bool(arr.max() <= bound) and bool(arr.min() >= -bound)


def axis_order(shape, plans: dict, band: bool) -> list:
    """The order of the interpolated axes with the least estimated work."""
    axes = list(plans)
    if len(axes) < 2 or len(axes) > 4:
        return axes
    best, best_cost = axes, None
    for order in itertools.permutations(axes):
        cur, total = list(shape), 0.0
        for a in order:
            cur[a] = plans[a].n_out
            total += product(cur) * plans[a].cost(product(cur[a + 1:]) == 1, band)
        if best_cost is None or total < best_cost:
            best, best_cost = list(order), total
    return best


# Trailing interpolated axes whose input planes have at most this many elements go through
# one matmul against the Kronecker product of their weights (PlaneWeights): for the small
# maps of real exports (1x1 .. 4x4 upsampled), one BLAS call instead of one per axis.
_PLANE_MAX_IN = 16
_PLANE_MAX_ELEMENTS = 1 << 16  # elements of that matrix (cached with its plan)


class PlaneWeights:
    """The interpolation of the trailing axes [first, ndim) at once: the dense
    (prod n_in, prod n_out) matrix kron(A_first, ..., A_last)^T of the axes' float64
    weights, rounded once to the work type (the axis-by-axis path rounds after each
    axis; the spec leaves the arithmetic open).  Read-only; cached with its plan."""

    def __init__(self, first: int, taps: list):
        m = np.ones((1, 1))
        for t in taps:
            m = np.kron(m, t.dense)
        self.first = first
        self.taps = taps
        self.matrix = np.ascontiguousarray(m.T)
        self.out_plane = tuple(t.n_out for t in taps)
        self.abs_weight_sum = math.prod(t.abs_weight_sum for t in taps)
        self._cast = {}

    def cast(self, work) -> np.ndarray:
        key = np.dtype(work)
        if key not in self._cast:
            self._cast[key] = self.matrix.astype(work)
        return self._cast[key]

    def apply(self, xp, arr, work, wait: bool):
        """arr interpolated on the trailing axes: (planes, n_in) @ matrix, or a product
        per output for one-element planes (the same rounding as that matmul).  Outputs
        whose result is not finite take the axis-by-axis taps (see ``interpolate``)."""
        lead = arr.shape[:self.first]
        src = arr.reshape(product(lead), self.matrix.shape[0])
        mt = xp.asarray(self.cast(work))
        with np.errstate(invalid="ignore", over="ignore"):
            out = xp.multiply(src, mt) if mt.shape[0] == 1 else xp.matmul(src, mt)
            out = out.reshape(lead + self.out_plane)
            if not (wait and _band_stays_finite(xp, arr, self.abs_weight_sum)):
                taps = arr
                for a, t in enumerate(self.taps, self.first):
                    taps = apply_taps(xp, taps, a, t, work)
                out = xp.where(xp.isfinite(out), out, taps)
        return out


class ResizePlan:
    """Everything of one resize that depends on shapes and attributes only (built on the
    host, cached by ``resize_plan``; read-only): the nearest index maps (a gather per
    axis; for an integer repeat that measured faster here than a broadcast copy); the
    interpolated axes, their order, and the whole-plane weights where they pay; the
    tf_crop_and_resize mask."""

    def __init__(self, shape, out_shape, scales, axes, mode, coord, nearest_mode, cubic_a, exclude,
                 antialias, roi, out_widths):
        self.out_shape = tuple(out_shape)
        self.empty = False
        self.takes, self.plans, masks = [], {}, []
        for k, a in enumerate(axes):
            n_in, n_out = shape[a], out_shape[a]
            if n_out == n_in and scales[k] == 1.0 and coord != "tf_crop_and_resize":  # identity
                continue
            if n_in == 0 or n_out == 0:
                self.empty = True  # the output has no elements
                continue
            width = out_widths[k] if out_widths is not None else scales[k] * n_in
            r = roi[k] if roi is not None else (0.0, 1.0)
            if mode == "nearest":
                src, extra = source_coords(coord, n_in, n_out, scales[k], width, r)
                self.takes.append((a, nearest_index(src, n_in, nearest_mode)))
            else:
                self.plans[a] = axis_taps(coord, n_in, n_out, float(scales[k]), float(width), tuple(map(float, r)),
                                          mode, antialias, cubic_a, exclude)
                extra = self.plans[a].extra
            if extra is not None and extra.any():
                masks.append(extra.reshape((1,) * a + (extra.size,) + (1,) * (len(shape) - a - 1)))
        self.mask = functools.reduce(np.logical_or, masks) if masks else None
        self.order = axis_order(shape, self.plans, True) if self.plans else []
        self.plane = self._plane(shape)

    def _plane(self, shape):
        """PlaneWeights when the interpolated axes are the trailing ones and their input
        planes small (_PLANE_MAX_IN), else None."""
        if not self.plans:
            return None
        first = min(self.plans)
        if sorted(self.plans) != list(range(first, len(shape))):
            return None
        n_in = product(shape[first:])
        if n_in > _PLANE_MAX_IN or n_in * product(self.out_shape[first:]) > _PLANE_MAX_ELEMENTS:
            return None
        return PlaneWeights(first, [self.plans[a] for a in range(first, len(shape))])

    def run(self, xp, arr, work, wait: bool):
        """arr resized (before the tf_crop_and_resize mask and the output cast)."""
        if self.empty:
            return xp.zeros(self.out_shape, dtype=arr.dtype)
        for a, idx in self.takes:
            arr = xp.take(arr, xp.asarray(idx), axis=a)
        if not self.plans:
            return arr
        plane = self.plane
        if (plane is not None and arr.dtype.kind == "f"
                and product(arr.shape[:plane.first]) >= tuning.value("resize.band_min_rows")):
            return plane.apply(xp, arr, work, wait)
        return interpolate(xp, arr, self.plans, work, wait, self.order)


@functools.lru_cache(maxsize=64)
def resize_plan(shape, out_shape, scales, axes, mode, coord, nearest_mode, cubic_a, exclude, antialias, roi,
                out_widths, band_block) -> ResizePlan:
    """The cached ResizePlan (all arguments hashable; band_block: the tuning value the
    axes' AxisTaps are built with, so that an override makes a new plan)."""
    return ResizePlan(shape, out_shape, scales, axes, mode, coord, nearest_mode, cubic_a, exclude, antialias,
                      roi, out_widths)


class _ResizeCore(KernelBase):
    def resize(self, x: Tensor, out_shape, scales, axes, *, mode, coord, nearest_mode="round_prefer_floor",
               cubic_coeff_a=-0.75, exclude_outside=0, extrapolation_value=0.0, antialias=0,
               roi=None, out_widths=None) -> Tensor:
        """x resized on ``axes`` to out_shape (full rank) with per-axis scales."""
        info = dtypes.info(x.data_type)
        if mode != "nearest" and info.kind in ("string", "bool"):
            raise self.type_error(f"mode {mode!r} cannot interpolate {dtypes.describe(x.data_type)}", X=x)
        xp = xp_for(self, x)
        if mode == "nearest":
            arr = x.array
        elif info.kind == "float":
            arr = self.to_compute(x)
        elif info.kind == "complex":
            arr = x.array
        else:
            arr = x.array.astype(np.float64)
        # the output, and its intermediates in the compute type, before any of them exists
        check_allocation(self, out_shape, max(x.array.dtype.itemsize, arr.dtype.itemsize))
        work = np.float64 if arr.dtype in (np.float64, np.complex128) or info.kind in ("int", "uint") \
            else np.float32
        # the callers pass Python ints and floats (an int equal to a float is the same key)
        plan = resize_plan(tuple(x.shape), tuple(out_shape), tuple(scales), tuple(axes), mode, coord, nearest_mode,
                           float(cubic_coeff_a), bool(exclude_outside), bool(antialias),
                           None if roi is None else tuple(roi), None if out_widths is None else tuple(out_widths),
                           tuning.value("resize.band_block"))
        arr = plan.run(xp, arr, work, wait=not self.on_gpu)
        if plan.mask is not None:
            fill = float(extrapolation_value)
            if mode == "nearest":
                from .cast import cast_tensor

                fill = xp.asarray(cast_tensor(self, Tensor(np.array(fill)), x.data_type).array.reshape(()))
            arr = xp.where(xp.asarray(plan.mask), fill, arr).astype(arr.dtype)
        if mode == "nearest":
            return Tensor.wrap(arr if arr is not x.array else arr.copy(), x.data_type)
        if info.kind in ("int", "uint"):
            lim = np.iinfo(info.storage)
            arr = xp.clip(xp.rint(arr), lim.min, lim.max).astype(info.storage)
            return Tensor.wrap(arr if not info.is_exotic or self.on_gpu else arr.view(info.numpy), x.data_type)
        if info.kind == "complex":
            return Tensor.wrap(arr.astype(info.numpy), x.data_type)
        return self.from_compute(arr, x.data_type)


@register()
class Resize(_ResizeCore):
    """Resize(X, roi, scales, sizes) with every attribute of opset 19 (opset 10:
    Resize(X, scales)).  ``Resize.resize_sizes(X, sizes, **attrs)`` is the sizes form.
    An empty roi/scales/sizes tensor counts as absent; exactly one of scales and sizes
    must be given."""

    def __call__(self, X, roi=None, scales=None, sizes=None, *, antialias=0, axes=None,
                 coordinate_transformation_mode="half_pixel", cubic_coeff_a=-0.75, exclude_outside=0,
                 extrapolation_value=0.0, keep_aspect_ratio_policy="stretch", mode="nearest",
                 nearest_mode="round_prefer_floor"):
        x = self.tensor(X, "X")
        if self.since_version < 11:
            # opset 10: Resize(X, scales)
            sc = self.tensor(roi if scales is None else scales, "scales")
            self.check_inputs(x, sc)
            return self._run(x, Tensor(), sc, Tensor(), antialias=0, axes=None, coord="asymmetric",
                             cubic_coeff_a=-0.75, exclude_outside=0, extrapolation_value=0.0,
                             policy="stretch", mode=_s(mode), nearest_mode="floor")
        r = self.tensor(roi, "roi", optional=True)
        sc = self.tensor(scales, "scales", optional=True)
        sz = self.tensor(sizes, "sizes", optional=True)
        self.check_inputs(x, r, sc, sz)
        return self._run(x, r, sc, sz, **self._attributes(locals()))  # the attributes above, by name

    def resize_sizes(self, X, sizes, **attrs):
        """Resize to explicit output sizes (for the resized axes)."""
        return self(X, None, None, sizes, **attrs)

    omitted_inputs_as_none = True  # array_function: Resize(X, '', '', sizes) is common

    def array_function(self, inputs, attrs):
        """Opset 11+: resize() for the recorded call's roi, scales and sizes, resolved
        once (the output's shape depends on their values: other values raise, so that the
        runtime redoes the node through the kernel; a constant found equal is not read
        again).  inputs: X, then roi, scales, sizes as given (None where omitted)."""
        if self.since_version < 11 or not inputs or any(
                t is not None and t.__class__ is not Tensor for t in inputs):
            return None
        x = inputs[0]
        if any(t is not None and t.array.__class__ is not np.ndarray for t in inputs[1:]):
            return None  # roi, scales or sizes on a device: compared on the host only
        rest = list(inputs[1:]) + [None] * (4 - len(inputs))
        r, sc, sz = (self.tensor(t, name, optional=True) for t, name in zip(rest, ("roi", "scales", "sizes")))
        args, keywords = self._resolve(x, r, sc, sz, **self._attributes(attrs))
        guards = {name: None if t is None else t.array.tolist()
                  for name, t in zip(("roi", "scales", "sizes"), inputs[1:])}
        data_type, resize = x.data_type, self.resize
        return values_guarded("Resize", guards,
                              lambda data: resize(Tensor.wrap(data, data_type), *args, **keywords).array)

    @classmethod
    def _attributes(cls, attrs) -> dict:
        """_resolve's keyword arguments from attributes by their ONNX names (any other
        keys ignored), __call__'s defaults where absent."""
        a = {k: attrs.get(k, default) for k, default in cls.__call__.__kwdefaults__.items()}
        return dict(antialias=a["antialias"], axes=a["axes"], coord=_s(a["coordinate_transformation_mode"]),
                    cubic_coeff_a=a["cubic_coeff_a"], exclude_outside=a["exclude_outside"],
                    extrapolation_value=a["extrapolation_value"], policy=_s(a["keep_aspect_ratio_policy"]),
                    mode=_s(a["mode"]), nearest_mode=_s(a["nearest_mode"]))

    def _run(self, x, r, sc, sz, **kwargs):
        args, keywords = self._resolve(x, r, sc, sz, **kwargs)
        return self.resize(x, *args, **keywords)

    def _resolve(self, x, r, sc, sz, *, antialias, axes, coord, cubic_coeff_a, exclude_outside,
                 extrapolation_value, policy, mode, nearest_mode):
        """The checked arguments of resize() for this call: ((out_shape, scales, axes),
        keywords)."""
        named = {"X": x}
        if mode not in MODES:
            raise self.error(f"unknown mode {mode!r}; expected one of {list(MODES)}", **named)
        if coord not in COORD_MODES or (coord == "half_pixel_symmetric" and self.since_version < 19):
            raise self.error(f"unknown coordinate_transformation_mode {coord!r}", **named)
        if nearest_mode not in NEAREST_MODES:
            raise self.error(f"unknown nearest_mode {nearest_mode!r}", **named)
        if policy not in POLICIES:
            raise self.error(f"unknown keep_aspect_ratio_policy {policy!r}", **named)
        if antialias and mode == "nearest":
            antialias = 0  # antialias applies to linear and cubic only
        rank = x.ndim
        ax = list(range(rank)) if axes is None else norm_axes(self, axes, rank, **named)
        has_scales = not sc.is_absent and sc.size > 0
        has_sizes = not sz.is_absent and sz.size > 0
        if has_scales == has_sizes:
            raise self.error("exactly one of 'scales' and 'sizes' must be given", scales=sc, sizes=sz, **named)
        out_shape = list(x.shape)
        out_widths = None
        if has_scales:
            scales = host_floats(self, sc, "scales")
            if len(scales) != len(ax):
                raise self.error(f"scales has {len(scales)} values for {len(ax)} axes", scales=sc, **named)
            if any(not (s > 0) or not math.isfinite(s) for s in scales):
                raise self.error(f"scales must be positive, got {scales}", scales=sc, **named)
            for a, s in zip(ax, scales):
                out_shape[a] = int(math.floor(x.shape[a] * s))
        else:
            sizes = host_ints(self, sz, "sizes")
            if len(sizes) != len(ax):
                raise self.error(f"sizes has {len(sizes)} values for {len(ax)} axes", sizes=sz, **named)
            if any(s < 0 for s in sizes):
                raise self.error(f"sizes must be non-negative, got {sizes}", sizes=sz, **named)
            if any(x.shape[a] == 0 for a in ax):
                raise self.error("cannot resize an empty axis to a size", **named)
            ratios = [s / x.shape[a] for a, s in zip(ax, sizes)]
            if policy == "stretch":
                scales = ratios
                for a, s in zip(ax, sizes):
                    out_shape[a] = s
                out_widths = [float(s) for s in sizes]
            else:
                common = min(ratios) if policy == "not_larger" else max(ratios)
                scales = [common] * len(ax)
                for a in ax:
                    out_shape[a] = int(common * x.shape[a] + 0.5)
        roi = None
        if coord == "tf_crop_and_resize":
            if r.is_absent or r.size == 0:
                raise self.error("tf_crop_and_resize needs the 'roi' input", **named)
            vals = host_floats(self, r, "roi")
            n = len(ax)
            if len(vals) == 2 * rank and n != rank:
                vals = [vals[a] for a in ax] + [vals[rank + a] for a in ax]
            if len(vals) != 2 * n:
                raise self.error(f"roi has {len(vals)} values; expected {2 * n}", roi=r, **named)
            roi = [(vals[k], vals[n + k]) for k in range(n)]
        return (out_shape, scales, ax), dict(mode=mode, coord=coord, nearest_mode=nearest_mode,
                                             cubic_coeff_a=cubic_coeff_a, exclude_outside=exclude_outside,
                                             extrapolation_value=extrapolation_value, antialias=antialias,
                                             roi=roi, out_widths=out_widths)


@register()
class Upsample(_ResizeCore):
    """Deprecated Upsample: nearest (floor of x / scale) or linear (asymmetric
    coordinates, edge-clamped) on any rank.  Opset 1: height_scale/width_scale on a 4-D
    input; 7: scales attribute; 9+: scales input."""

    def __call__(self, X, scales=None, mode="nearest", height_scale=None, width_scale=None):
        x = self.tensor(X, "X")
        mode = _s(mode)
        if mode == "bilinear":
            mode = "linear"
        if mode not in ("nearest", "linear"):
            raise self.error(f"mode must be 'nearest' or 'linear', got {mode!r}", X=x)
        if self.since_version >= 9:
            sc = self.tensor(scales, "scales")
            self.check_inputs(x, sc)
            vals = host_floats(self, sc, "scales")
        elif self.since_version >= 7:
            self.check_inputs(x)
            if scales is None:
                raise self.error("attribute 'scales' is required", X=x)
            vals = [float(v) for v in scales]
        else:
            self.check_inputs(x)
            if height_scale is None or width_scale is None or x.ndim != 4:
                raise self.error("opset-1 Upsample needs height_scale, width_scale and a 4-D input", X=x)
            vals = [1.0, 1.0, float(height_scale), float(width_scale)]
        if len(vals) != x.ndim:
            raise self.error(f"scales has {len(vals)} values for a rank-{x.ndim} input", X=x)
        if any(not (v >= 1.0) for v in vals):
            raise self.error(f"Upsample scales must be >= 1, got {vals}", X=x)
        out_shape = [int(math.floor(d * s)) for d, s in zip(x.shape, vals)]
        return self.resize(x, out_shape, vals, list(range(x.ndim)), mode=mode, coord="asymmetric",
                           nearest_mode="floor")
