"""Pad, Resize, Upsample, GridSample, AffineGrid against loop references."""

from __future__ import annotations

import itertools
import math

import ml_dtypes
import numpy as np
import pytest

from gpukernels.errors import KernelInputError
from gpukernels.kernels import KernelContext
from gpukernels.kernels.tensor.grid import AffineGrid, GridSample
from gpukernels.kernels.tensor.pad import Pad
from gpukernels.kernels.tensor.resize import Resize, Upsample
from gpukernels.tensor import Tensor

I64 = np.int64


def K(cls, device, opset=None):
    return cls(KernelContext(device, opset=opset))


def ref_pad_index(i, n, mode):
    if mode == "edge":
        return min(max(i, 0), n - 1)
    if mode == "wrap":
        return i % n
    while i < 0 or i >= n:  # reflect
        i = -i if i < 0 else 2 * (n - 1) - i
    return i


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad(device, rng, mode):
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    keep = x.copy()
    pads = [1, -1, 2, 2, 0, 3]  # begin per axis, then end per axis
    got = K(Pad, device)(x, I64(pads), np.float32(2.5), mode=mode).numpy()
    cropped = x[:, 1:, :]
    before, after = [1, 0, 2], [2, 0, 3]
    shape = [n + b + a for n, b, a in zip(cropped.shape, before, after)]
    ref = np.empty(shape, np.float32)
    for pos in itertools.product(*[range(s) for s in shape]):
        src = [p - b for p, b in zip(pos, before)]
        inside = all(0 <= s < n for s, n in zip(src, cropped.shape))
        if mode == "constant":
            ref[pos] = cropped[tuple(src)] if inside else 2.5
        else:
            ref[pos] = cropped[tuple(ref_pad_index(s, n, mode) for s, n in zip(src, cropped.shape))]
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(x, keep)


@pytest.mark.parametrize("mode", ["reflect", "edge", "wrap"])
@pytest.mark.parametrize("pad", [1, 3, 4, 9])
def test_pad_band_slices_and_gathers(device, rng, mode, pad):
    """Bands that are a reversed/forward run or one repeated element (slices) and bands
    longer than the axis (several periods: gathers), on both axes of a 2-D input."""
    x = rng.standard_normal((6, 5)).astype(np.float32)
    got = K(Pad, device)(x, I64([pad, pad + 1, pad + 1, pad]), mode=mode).numpy()
    want = np.pad(x, [(pad, pad + 1), (pad + 1, pad)], mode={"edge": "edge", "wrap": "wrap",
                                                               "reflect": "reflect"}[mode])
    np.testing.assert_array_equal(got, want)


def test_pad_axes_versions_errors(device, rng):
    x = rng.standard_normal((2, 3)).astype(np.float32)
    got = K(Pad, device)(x, I64([1, 2]), None, I64([-1])).numpy()
    np.testing.assert_array_equal(got, np.pad(x, [(0, 0), (1, 2)]))
    got = K(Pad, device, 2)(x, pads=[0, 1, 0, 1], mode="edge").numpy()
    np.testing.assert_array_equal(got, np.pad(x, [(0, 0), (1, 1)], mode="edge"))
    got = K(Pad, device, 1)(x, paddings=[1, 0, 0, 0], value=3.0).numpy()
    np.testing.assert_array_equal(got, np.pad(x, [(1, 0), (0, 0)], constant_values=3))
    bf = Tensor(x.astype(ml_dtypes.bfloat16))
    got = K(Pad, device)(bf, I64([0, 1, 0, 0]), Tensor(np.array(1.5, ml_dtypes.bfloat16))).numpy()
    assert got.dtype == ml_dtypes.bfloat16 and float(got[0, 0]) == 1.5
    s = K(Pad, device)(Tensor(np.array(["a", "b"], object)), I64([1, 0]), mode="constant").numpy()
    assert s.tolist() == ["", "a", "b"]
    with pytest.raises(KernelInputError, match="Pad"):
        K(Pad, device)(x, I64([1, 1]))
    with pytest.raises(KernelInputError, match="Pad"):
        K(Pad, device)(x, I64([0, 0, 0, 0]), mode="mirror")
    with pytest.raises(KernelInputError, match="Pad"):
        K(Pad, device, 18)(x, I64([0, 0, 0, 0]), mode="wrap")
    with pytest.raises(KernelInputError, match="Pad"):
        K(Pad, device)(x, I64([0, -2, 0, -2]))


# ------------------------------------------------------------------ Resize


def ref_coord(mode, y, n_in, n_out, scale):
    if mode == "half_pixel":
        return (y + 0.5) / scale - 0.5
    if mode == "asymmetric":
        return y / scale
    if mode == "align_corners":
        return 0.0 if n_out == 1 else y * (n_in - 1) / (n_out - 1)
    if mode == "pytorch_half_pixel":
        return (y + 0.5) / scale - 0.5 if n_out > 1 else 0.0


def ref_kernel(mode, d, a=-0.75):
    d = abs(d)
    if mode == "linear":
        return max(0.0, 1 - d)
    if d <= 1:
        return (a + 2) * d ** 3 - (a + 3) * d ** 2 + 1
    if d < 2:
        return a * d ** 3 - 5 * a * d ** 2 + 8 * a * d - 4 * a
    return 0.0


def ref_resize_1d(v, n_out, scale, mode, coord, antialias=False, exclude=False, a=-0.75):
    n_in = len(v)
    out = np.zeros(n_out)
    s = min(scale, 1.0) if antialias else 1.0
    support = (1 if mode == "linear" else 2) / s
    for y in range(n_out):
        x = ref_coord(coord, y, n_in, n_out, scale)
        taps = range(math.floor(x - support) - 1, math.ceil(x + support) + 2)
        ws = {}
        for p in taps:
            w = ref_kernel(mode, (p - x) * s, a)
            if w == 0 or (exclude and not 0 <= p < n_in):
                continue
            ws[p] = ws.get(p, 0.0) + w
        total = sum(ws.values())
        norm = total if (antialias or exclude) else 1.0
        out[y] = sum(w * v[min(max(p, 0), n_in - 1)] for p, w in ws.items()) / norm
    return out


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("coord", ["half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel"])
@pytest.mark.parametrize("antialias", [0, 1])
@pytest.mark.parametrize("sizes", [(7, 11), (3, 2)])
def test_resize_separable(device, rng, mode, coord, antialias, sizes):
    x = rng.standard_normal((2, 5, 6)).astype(np.float64)
    got = K(Resize, device).resize_sizes(x, I64(sizes), axes=[1, 2], mode=mode,
                                         coordinate_transformation_mode=coord, antialias=antialias,
                                         exclude_outside=int(mode == "cubic" and antialias == 0),
                                         cubic_coeff_a=-0.5).numpy()
    ref = np.empty((2,) + sizes)
    ex = mode == "cubic" and antialias == 0
    for b in range(2):
        tmp = np.stack([ref_resize_1d(x[b, :, j], sizes[0], sizes[0] / 5, mode, coord, antialias, ex, -0.5)
                        for j in range(6)], 1)
        ref[b] = np.stack([ref_resize_1d(tmp[i], sizes[1], sizes[1] / 6, mode, coord, antialias, ex, -0.5)
                           for i in range(sizes[0])])
    np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("mode,antialias,exclude,coord,sizes", [
    ("linear", 0, 0, "half_pixel", (40, 90)),       # upscale: narrow band windows
    ("linear", 0, 0, "asymmetric", (9, 13)),        # strong downscale without antialias: taps
    ("cubic", 1, 0, "half_pixel", (11, 17)),        # antialiased downscale: wide windows
    ("cubic", 0, 1, "align_corners", (33, 70)),
    ("cubic", 0, 0, "pytorch_half_pixel", (57, 31)),
    ("linear", 1, 0, "half_pixel", (23, 100)),
])
def test_resize_large_both_paths(device, rng, mode, antialias, exclude, coord, sizes):
    """Sizes over several band blocks, float64 and float32; the band (BLAS) and tap paths
    agree axis by axis."""
    x = rng.standard_normal((2, 37, 45))
    kw = dict(axes=[1, 2], mode=mode, coordinate_transformation_mode=coord, antialias=antialias,
              exclude_outside=exclude)
    got = K(Resize, device).resize_sizes(x, I64(sizes), **kw).numpy()
    ref = np.empty((2,) + sizes)
    for b in range(2):
        tmp = np.stack([ref_resize_1d(x[b, :, j], sizes[0], sizes[0] / 37, mode, coord, antialias, exclude)
                        for j in range(45)], 1)
        ref[b] = np.stack([ref_resize_1d(tmp[i], sizes[1], sizes[1] / 45, mode, coord, antialias, exclude)
                           for i in range(sizes[0])])
    np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-10)
    got32 = K(Resize, device).resize_sizes(x.astype(np.float32), I64(sizes), **kw).numpy()
    assert got32.dtype == np.float32
    np.testing.assert_allclose(got32, ref, rtol=1e-5, atol=1e-5)
    # the two interpolation paths, axis by axis
    from gpukernels.kernels.tensor import resize as R

    for axis, n_in in ((1, 37), (2, 45)):
        n_out = sizes[axis - 1]
        t = R.axis_taps(coord, n_in, n_out, n_out / n_in, float(n_out), (0.0, 1.0), mode, bool(antialias),
                        -0.75, bool(exclude))
        band = R.apply_band(np, x, axis, t, np.float64)
        taps = R.apply_taps(np, x, axis, t, np.float64)
        np.testing.assert_allclose(band, taps, rtol=1e-12, atol=1e-12)
    # the band is used where its zeros cost little: not for a strong downscale without antialias
    assert R.axis_taps("half_pixel", 224, 448, 2.0, 448.0, (0.0, 1.0), "linear", False, -0.75, False).band_pays
    assert R.axis_taps("half_pixel", 448, 224, 0.5, 224.0, (0.0, 1.0), "cubic", True, -0.75, False).band_pays
    assert not R.axis_taps("half_pixel", 400, 20, 0.05, 20.0, (0.0, 1.0), "linear", False, -0.75, False).band_pays


def test_resize_non_finite_stays_local(device, rng):
    x = rng.standard_normal((1, 1, 30, 40)).astype(np.float32)
    x[0, 0, 12, 17] = np.nan
    x[0, 0, 3, 33] = np.inf
    got = K(Resize, device)(x, None, None, I64([1, 1, 60, 80]), mode="linear").numpy()[0, 0]
    # outputs that read neither bad input (linear weights are >= 0: an indicator shows them)
    ind = np.zeros((30, 40))
    ind[12, 17] = ind[3, 33] = 1.0
    touched = np.stack([ref_resize_1d(c, 80, 2.0, "linear", "half_pixel")
                        for c in np.stack([ref_resize_1d(ind[:, j], 60, 2.0, "linear", "half_pixel")
                                           for j in range(40)], 1)]) != 0
    clean = np.where(np.isfinite(x[0, 0]), x[0, 0], 0).astype(np.float64)
    ref = np.stack([ref_resize_1d(c, 80, 2.0, "linear", "half_pixel")
                    for c in np.stack([ref_resize_1d(clean[:, j], 60, 2.0, "linear", "half_pixel")
                                       for j in range(40)], 1)])
    assert not np.isfinite(got[touched]).any()
    assert np.isfinite(got[~touched]).all()
    np.testing.assert_allclose(got[~touched], ref[~touched], rtol=1e-5, atol=1e-5)
    assert 4 <= touched.sum() <= 40


@pytest.mark.parametrize("nearest_mode", ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])
def test_resize_nearest(device, rng, nearest_mode):
    x = rng.integers(0, 100, (1, 1, 4, 6)).astype(np.uint8)
    scales = np.float32([1, 1, 1.5, 0.5])
    got = K(Resize, device)(x, None, scales, mode="nearest", nearest_mode=nearest_mode,
                            coordinate_transformation_mode="asymmetric").numpy()
    assert got.shape == (1, 1, 6, 3) and got.dtype == np.uint8
    rnd = {"round_prefer_floor": lambda v: math.ceil(v - 0.5), "round_prefer_ceil": lambda v: math.floor(v + 0.5),
           "floor": math.floor, "ceil": math.ceil}[nearest_mode]
    for i, j in itertools.product(range(6), range(3)):
        si = min(max(rnd(i / float(scales[2])), 0), 3)
        sj = min(max(rnd(j / float(scales[3])), 0), 5)
        assert got[0, 0, i, j] == x[0, 0, si, sj]


def test_resize_tf_crop_and_int_and_errors(device, rng):
    x = rng.standard_normal((1, 1, 4, 4)).astype(np.float32)
    roi = np.float32([0, 0, 0.4, 0.6, 1, 1, 1.2, 1.7])
    got = K(Resize, device)(x, roi, None, I64([1, 1, 3, 3]), mode="linear",
                            coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=10.0).numpy()
    for i in range(3):
        yi = 0.4 * 3 + i * (1.2 - 0.4) * 3 / 2
        for j in range(3):
            xj = 0.6 * 3 + j * (1.7 - 0.6) * 3 / 2
            if not (0 <= yi <= 3 and 0 <= xj <= 3):
                assert got[0, 0, i, j] == 10.0
    xi = np.int32([[0, 10, 20]])
    r = K(Resize, device)(xi, None, np.float32([1, 2]), mode="linear").numpy()
    assert r.dtype == np.int32 and r.tolist() == [[0, 2, 8, 12, 18, 20]]
    with pytest.raises(KernelInputError, match="Resize"):
        K(Resize, device)(x, None, np.float32([1, 1, 2, 2]), I64([1, 1, 8, 8]))
    with pytest.raises(KernelInputError, match="Resize"):
        K(Resize, device)(x, None, np.float32([1, 1, 2, 2]), mode="bogus")
    with pytest.raises(KernelInputError, match="Resize"):
        K(Resize, device)(x, None, None, I64([1, 1, -1, 2]))
    r = K(Resize, device).resize_sizes(x, I64([2, 8]), axes=[2, 3], keep_aspect_ratio_policy="not_larger")
    assert r.shape == (1, 1, 2, 2)
    r = K(Resize, device).resize_sizes(x, I64([2, 8]), axes=[2, 3], keep_aspect_ratio_policy="not_smaller")
    assert r.shape == (1, 1, 8, 8)


def test_upsample(device, rng):
    x = rng.standard_normal((2, 3)).astype(np.float32)
    n = K(Upsample, device)(x, np.float32([2, 1.5]), mode="nearest").numpy()
    for i, j in itertools.product(range(4), range(4)):
        assert n[i, j] == x[int(i / 2), int(j / 1.5)]
    lin = K(Upsample, device)(x[None], np.float32([1, 1, 2]), mode="linear").numpy()[0]
    for i in range(2):
        np.testing.assert_allclose(lin[i], ref_resize_1d(x[i], 6, 2.0, "linear", "asymmetric"), rtol=1e-6)
    assert K(Upsample, device, 7)(x, scales=[1.0, 2.0]).shape == (2, 6)
    with pytest.raises(KernelInputError, match="Upsample"):
        K(Upsample, device)(x, np.float32([1.0]))


# ------------------------------------------------------------------ GridSample / AffineGrid


def ref_grid_sample_2d(x, grid, mode, padding, align):
    N, C, H, W = x.shape
    Ho, Wo = grid.shape[1:3]
    out = np.zeros((N, C, Ho, Wo))

    def denorm(g, L):
        return (g + 1) / 2 * (L - 1) if align else ((g + 1) * L - 1) / 2

    def refl(v, lo, hi):
        rng_ = hi - lo
        while v < lo or v > hi:
            v = 2 * lo - v if v < lo else 2 * hi - v
        return v

    def pixel(n, c, i, j):
        lo_i, hi_i = (0, H - 1) if align else (-0.5, H - 0.5)
        lo_j, hi_j = (0, W - 1) if align else (-0.5, W - 0.5)
        if padding == "zeros":
            return x[n, c, i, j] if 0 <= i < H and 0 <= j < W else 0.0
        if padding == "border":
            return x[n, c, min(max(i, 0), H - 1), min(max(j, 0), W - 1)]
        return x[n, c, int(refl(i, lo_i, hi_i)), int(refl(j, lo_j, hi_j))]

    for n, a, b in itertools.product(range(N), range(Ho), range(Wo)):
        cx, cy = denorm(grid[n, a, b, 0], W), denorm(grid[n, a, b, 1], H)
        if mode == "nearest":
            cx, cy = float(np.rint(cx)), float(np.rint(cy))
        lo = (0, 0) if align else (-0.5, -0.5)
        if padding == "border":
            cx, cy = min(max(cx, 0), W - 1), min(max(cy, 0), H - 1)
        elif padding == "reflection":
            cx = refl(cx, lo[1], (W - 1) if align else W - 0.5)
            cy = refl(cy, lo[0], (H - 1) if align else H - 0.5)
        for c in range(C):
            if mode == "nearest":
                out[n, c, a, b] = pixel(n, c, int(cy), int(cx))
                continue
            fy, fx = math.floor(cy), math.floor(cx)
            ty, tx = cy - fy, cx - fx
            if mode == "linear":
                taps = [(0, 1 - ty), (1, ty)], [(0, 1 - tx), (1, tx)]
            else:
                taps = ([(k - 1, ref_kernel("cubic", k - 1 - ty)) for k in range(4)],
                        [(k - 1, ref_kernel("cubic", k - 1 - tx)) for k in range(4)])
            out[n, c, a, b] = sum(wy * wx * pixel(n, c, fy + dy, fx + dx)
                                  for dy, wy in taps[0] for dx, wx in taps[1])
    return out


@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
def test_grid_sample_2d(device, rng, mode, padding, align):
    x = rng.standard_normal((2, 3, 4, 5))
    grid = rng.uniform(-1.6, 1.6, (2, 3, 4, 2))
    got = K(GridSample, device)(x, grid, align_corners=align, mode=mode, padding_mode=padding).numpy()
    np.testing.assert_allclose(got, ref_grid_sample_2d(x, grid, mode, padding, align), rtol=1e-9, atol=1e-9)


def test_grid_sample_3d_and_errors(device, rng):
    x = rng.standard_normal((1, 2, 3, 4, 5)).astype(np.float32)
    theta = np.float32([[[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]]])
    grid = K(AffineGrid, device)(theta, I64([1, 2, 3, 4, 5])).numpy()
    assert grid.shape == (1, 3, 4, 5, 3)
    y = K(GridSample, device)(x, grid, mode="linear").numpy()
    np.testing.assert_allclose(y, x, rtol=1e-5, atol=1e-6)  # identity transform
    with pytest.raises(KernelInputError, match="GridSample"):
        K(GridSample, device, 16)(x, grid)
    with pytest.raises(KernelInputError, match="GridSample"):
        K(GridSample, device)(x, grid, mode="bilinear")


def test_affine_grid_2d(device, rng):
    theta = rng.standard_normal((2, 2, 3)).astype(np.float32)
    for align in (0, 1):
        got = K(AffineGrid, device)(theta, I64([2, 1, 3, 4]), align_corners=align).numpy()
        for n, i, j in itertools.product(range(2), range(3), range(4)):
            xs = (-1 + 2 * j / 3) if align else (2 * j + 1) / 4 - 1
            ys = (-1 + 2 * i / 2) if align else (2 * i + 1) / 3 - 1
            np.testing.assert_allclose(got[n, i, j], theta[n] @ np.array([xs, ys, 1.0]), rtol=1e-5, atol=1e-6)
    with pytest.raises(KernelInputError, match="AffineGrid"):
        K(AffineGrid, device)(theta, I64([3, 1, 3, 4]))
