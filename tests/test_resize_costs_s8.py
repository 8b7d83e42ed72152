"""Resize's cached plans and whole-plane matmul (kernels/tensor/resize.py: ResizePlan,
PlaneWeights) against float64 loop references, on the shapes of real exports (many small
planes upsampled), with non-finite inputs, and the host against the device's bits."""

from __future__ import annotations

import numpy as np
import pytest

from gpukernels.host import tuning
from gpukernels.kernels import KernelContext
from gpukernels.kernels.tensor import resize as R
from gpukernels.kernels.tensor.resize import Resize, Upsample
from gpukernels.tensor import Tensor
from tests.kernels.tensor.test_resample import ref_resize_1d

I64 = np.int64


def _ref(x, sizes, mode, coord, antialias=False, exclude=False):
    """float64 reference: x (..., H, W) resized on its last two axes, one axis at a time."""
    h, w = x.shape[-2:]
    flat = x.reshape(-1, h, w).astype(np.float64)
    out = np.empty((flat.shape[0],) + tuple(sizes))
    for p, plane in enumerate(flat):
        tmp = np.stack([ref_resize_1d(plane[:, j], sizes[0], sizes[0] / h, mode, coord, antialias, exclude)
                        for j in range(w)], 1)
        out[p] = np.stack([ref_resize_1d(tmp[i], sizes[1], sizes[1] / w, mode, coord, antialias, exclude)
                           for i in range(sizes[0])])
    return out.reshape(x.shape[:-2] + tuple(sizes))


def _plan_of(x, sizes, mode, coord, antialias=0, exclude=0):
    out = x.shape[:-2] + tuple(sizes)
    scales = [o / i for o, i in zip(out, x.shape)]
    return R.resize_plan(x.shape, out, tuple(scales), tuple(range(x.ndim)), mode, coord, "round_prefer_floor",
                         -0.75, bool(exclude), bool(antialias), None, tuple(map(float, out)),
                         tuning.value("resize.band_block"))


@pytest.mark.parametrize("mode,antialias,exclude", [("linear", 0, 0), ("cubic", 0, 0), ("cubic", 0, 1),
                                                    ("linear", 1, 0), ("cubic", 1, 0)])
@pytest.mark.parametrize("coord", ["half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel"])
@pytest.mark.parametrize("hw,sizes", [((1, 1), (12, 12)), ((2, 2), (16, 16)), ((4, 4), (16, 16)),
                                      ((3, 5), (7, 3)), ((4, 4), (2, 3))])
def test_plane_path_matches_reference(device, rng, mode, antialias, exclude, coord, hw, sizes):
    """Small trailing planes, many of them: one matmul against the planes' weights."""
    x = rng.standard_normal((2, 40) + hw)
    kw = {"mode": mode, "coordinate_transformation_mode": coord, "antialias": antialias, "exclude_outside": exclude}
    full = I64((2, 40) + sizes)
    assert _plan_of(x, sizes, mode, coord, antialias, exclude).plane is not None
    ref = _ref(x, sizes, mode, coord, antialias, exclude)
    got = Resize(KernelContext(device, opset=19))(Tensor(x).to(device), None, None, full, **kw).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-10)
    got32 = Resize(KernelContext(device, opset=19))(Tensor(x.astype(np.float32)).to(device), None, None, full,
                                                    **kw).numpy()
    assert got32.dtype == np.float32 and got32.shape == ref.shape
    np.testing.assert_allclose(got32, ref, rtol=1e-5, atol=1e-5)


def test_plane_path_non_finite_stays_local(device, rng):
    """A NaN or inf reaches only the outputs whose taps read it, as on the axis path."""
    x = rng.standard_normal((2, 64, 4, 4)).astype(np.float32)
    x[0, 3, 1, 2] = np.nan
    x[1, 7, 3, 0] = np.inf
    assert _plan_of(x, (16, 16), "linear", "half_pixel").plane is not None
    got = Resize(KernelContext(device, opset=19))(Tensor(x).to(device), None, None, I64([2, 64, 16, 16]),
                                                  mode="linear").numpy()
    ind = np.zeros(x.shape)
    ind[0, 3, 1, 2] = ind[1, 7, 3, 0] = 1.0
    touched = _ref(ind, (16, 16), "linear", "half_pixel") != 0
    clean = np.where(np.isfinite(x), x, 0)
    ref = _ref(clean, (16, 16), "linear", "half_pixel")
    assert not np.isfinite(got[touched]).any()
    assert np.isfinite(got[~touched]).all()
    np.testing.assert_allclose(got[~touched], ref[~touched], rtol=1e-5, atol=1e-5)
    assert 4 <= touched.sum() <= 2 * 64  # each reaches at most 8x8 outputs


def test_plane_path_near_the_float_limit(rng):
    """Values near max float32 (the finite check fails, both paths run): cubic weights
    overshoot, so some outputs overflow in float32; the rest match the reference."""
    x = (rng.standard_normal((2, 64, 2, 2)) * 1e38).astype(np.float32)
    got = Resize(KernelContext("cpu", opset=19))(x, None, None, I64([2, 64, 5, 5]), mode="cubic").numpy()
    ref = _ref(x, (5, 5), "cubic", "half_pixel")
    ok = np.abs(ref) < 3e38
    np.testing.assert_allclose(got[ok], ref[ok], rtol=1e-5, atol=1e33)


@pytest.mark.parametrize("shape,sizes", [((2, 64, 4, 4), (16, 16)), ((2, 64, 1, 1), (12, 12)),
                                         ((2, 64, 8, 8), (16, 16))])
def test_host_and_device_same_bits(device, rng, shape, sizes):
    x = rng.standard_normal(shape).astype(np.float32)
    x.reshape(-1)[[5, 100]] = [np.nan, -np.inf]
    full = I64(shape[:2] + sizes)
    want = Resize(KernelContext("cpu", opset=19))(x, None, None, full, mode="linear").numpy()
    got = Resize(KernelContext(device, opset=19))(Tensor(x).to(device), None, None, full, mode="linear").numpy()
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_plans_are_cached_per_shape_and_attributes(rng):
    k = Resize(KernelContext("cpu", opset=19))
    x = rng.standard_normal((2, 64, 4, 4)).astype(np.float32)
    a = k(x, None, None, I64([2, 64, 16, 16]), mode="linear").numpy()
    b = k(x, None, None, I64([2, 64, 8, 12]), mode="linear").numpy()
    c = k(x, None, None, I64([2, 64, 16, 16]), mode="linear", coordinate_transformation_mode="align_corners").numpy()
    assert a.shape == (2, 64, 16, 16) and b.shape == (2, 64, 8, 12)
    np.testing.assert_allclose(b, _ref(x, (8, 12), "linear", "half_pixel"), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(c, _ref(x, (16, 16), "linear", "align_corners"), rtol=1e-5, atol=1e-5)
    assert _plan_of(x, (16, 16), "linear", "half_pixel") is _plan_of(x, (16, 16), "linear", "half_pixel")
    with tuning.override(**{"resize.band_block": 4}):
        assert _plan_of(x, (16, 16), "linear", "half_pixel").plans[2].band == 4
        d = k(x, None, None, I64([2, 64, 16, 16]), mode="linear").numpy()
    np.testing.assert_allclose(d, a, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("coord,nearest_mode", [("asymmetric", "floor"), ("half_pixel", "round_prefer_floor"),
                                                ("half_pixel", "round_prefer_ceil"), ("align_corners", "ceil")])
def test_nearest_upsample_fresh_output(device, rng, coord, nearest_mode):
    """Integer nearest upsampling (YOLO's 2x): the index maps of the spec, a new array."""
    x = rng.standard_normal((2, 128, 4, 4)).astype(np.float32)
    xt = Tensor(x).to(device)
    got_t = Resize(KernelContext(device, opset=19))(xt, None, np.float32([1, 1, 2, 2]), mode="nearest",
                                                    coordinate_transformation_mode=coord,
                                                    nearest_mode=nearest_mode)
    got = got_t.numpy()
    src, _ = R.source_coords(coord, 4, 8, 2.0, 8.0)
    idx = R.nearest_index(src, 4, nearest_mode)
    np.testing.assert_array_equal(got, x[:, :, idx][:, :, :, idx])
    if device == "cpu":
        assert not np.shares_memory(got_t.array, x)
    up = Upsample(KernelContext(device, opset=9))(xt, np.float32([1, 1, 2, 2])).numpy()
    np.testing.assert_array_equal(up, np.repeat(np.repeat(x, 2, axis=2), 2, axis=3))


def test_identity_and_empty(rng):
    k = Resize(KernelContext("cpu", opset=19))
    x = rng.standard_normal((2, 64, 16, 16)).astype(np.float32)
    np.testing.assert_array_equal(k(x, None, None, I64([2, 64, 16, 16]), mode="linear").numpy(), x)
    e = k(x, None, np.float32([1, 1, 0.01, 1]), mode="linear").numpy()
    assert e.shape == (2, 64, 0, 16) and e.dtype == np.float32
