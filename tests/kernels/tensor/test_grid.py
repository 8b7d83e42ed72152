"""GridSample (gpukernels/kernels/tensor/grid.py) against the float64 reference of
tests/reference, on both paths: the host path gathers taps from channels-first planes,
computes lean linear taps, and threads over batch entries and channel blocks.  (More
GridSample cases: tests/kernels/tensor/test_resample.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from gpukernels.host import tuning as tuning_table
from gpukernels.kernels import KernelContext
from gpukernels.kernels.tensor import grid as grid_mod
from gpukernels.kernels.tensor.grid import GridSample
from tests.reference import grid_sample

# ------------------------------------------------------------------ GridSample

def run(device, path, x, grid, opset=None, **attrs):
    return GridSample(KernelContext(device, opset, options={"paths": path}))(x, grid, **attrs).numpy()


@pytest.mark.parametrize("padding", ["zeros", "border"])
@pytest.mark.parametrize("align", [0, 1])
@pytest.mark.parametrize("dtype,tol", [(np.float32, 2e-5), (np.float64, 1e-12)])
def test_linear_2d(device, path, rng, padding, align, dtype, tol):
    x = rng.standard_normal((3, 5, 6, 7)).astype(dtype)
    grid = rng.uniform(-1.3, 1.3, (3, 9, 11, 2)).astype(dtype)
    grid[0, 0, :4] = [[-1, -1], [1, 1], [-1, 1], [1, -1]]  # the corners exactly
    got = run(device, path, x, grid, mode="linear", padding_mode=padding, align_corners=align)
    assert got.dtype == dtype
    np.testing.assert_allclose(got, grid_sample(x, grid, "linear", padding, align), rtol=tol, atol=tol)


@pytest.mark.parametrize("N", [1, 3])
def test_channel_blocks_and_batch_groups(device, path, rng, N):
    """C * points above the host block: several channel blocks (the last partial); one
    batch entry threads over channel blocks, several over batch entries in groups."""
    M = 64 * 64
    C = tuning_table.value("grid_sample.host_block_elems") // (4 * M) + 7  # 4 linear taps per point
    x = rng.standard_normal((N, C, 20, 30)).astype(np.float32)
    grid = rng.uniform(-1.1, 1.1, (N, 64, 64, 2)).astype(np.float32)
    got = run(device, path, x, grid, mode="linear")
    np.testing.assert_allclose(got, grid_sample(x, grid, "linear", "zeros", 0), rtol=2e-5, atol=2e-5)



@pytest.mark.parametrize("N,C", [(1, 1), (1, 6), (5, 1), (5, 3), (7, 13)])
@pytest.mark.parametrize("padding", ["zeros", "border"])
@pytest.mark.parametrize("align", [0, 1])
def test_threaded_units_blocks(device, path, rng, tuning, N, C, padding, align):
    """Work units handed to the host threads as they come free (batch-entry groups, or
    channel blocks of a single entry), small blocks (partial last block), grids partly
    outside the input, non-contiguous X and grid."""
    tuning({"grid_sample.thread_work": 1,
            "grid_sample.host_block_elems": 4 * 35 * 2,  # two channels a block
            "grid_sample.taps_points": 80})  # taps of two entries at once
    x = rng.standard_normal((N, 2 * C, 6, 9)).astype(np.float32)[:, ::2]
    grid = rng.uniform(-1.4, 1.4, (N, 7, 5, 2)).astype(np.float32).transpose(0, 2, 1, 3)
    got = run(device, path, x, grid, mode="linear", padding_mode=padding, align_corners=align)
    np.testing.assert_allclose(got, grid_sample(x, grid, "linear", padding, align), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_nan_grid_points_read_zeros(device, path, rng, mode):
    """Under zeros padding a NaN coordinate has no taps inside: the output there is 0;
    the other points are unaffected."""
    x = rng.standard_normal((3, 4, 6, 7)).astype(np.float32)
    grid = rng.uniform(-1.2, 1.2, (3, 5, 6, 2)).astype(np.float32)
    grid[1, 2, 3] = np.nan
    grid[2, 0, 1, 0] = np.nan
    with np.errstate(invalid="ignore"):
        got = run(device, path, x, grid, mode=mode)
    nan = np.isnan(grid).any(-1)  # (N, H, W)
    assert np.all(got.transpose(0, 2, 3, 1)[nan] == 0)
    clean = np.where(np.isnan(grid), 0, grid)
    want = grid_sample(x, clean, mode, "zeros", 0)
    keep = np.broadcast_to(~nan[:, None], got.shape)
    np.testing.assert_allclose(got[keep], want[keep], rtol=2e-5, atol=2e-5)

@pytest.mark.parametrize("padding", ["zeros", "border"])
def test_linear_1d_and_3d(device, path, rng, padding):
    x1 = rng.standard_normal((2, 3, 9))
    g1 = rng.uniform(-1.2, 1.2, (2, 13, 1))
    np.testing.assert_allclose(run(device, path, x1, g1, 20, mode="linear", padding_mode=padding),
                               grid_sample(x1, g1, "linear", padding, 0), rtol=1e-12, atol=1e-12)
    x3 = rng.standard_normal((2, 3, 4, 5, 6))
    g3 = rng.uniform(-1.2, 1.2, (2, 3, 4, 5, 3))
    np.testing.assert_allclose(run(device, path, x3, g3, 20, mode="linear", padding_mode=padding, align_corners=1),
                               grid_sample(x3, g3, "linear", padding, 1), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("padding", ["zeros", "border"])
def test_cubic_2d(device, path, rng, padding):
    x = rng.standard_normal((2, 4, 7, 8))
    grid = rng.uniform(-1.2, 1.2, (2, 5, 6, 2))
    np.testing.assert_allclose(run(device, path, x, grid, mode="cubic", padding_mode=padding),
                               grid_sample(x, grid, "cubic", padding, 0), rtol=1e-12, atol=1e-12)


def test_integer_input_rounds(device, path, rng):
    x = rng.integers(-100, 100, (2, 3, 5, 6)).astype(np.int32)
    grid = rng.uniform(-1, 1, (2, 4, 4, 2))
    got = run(device, path, x, grid, mode="linear")
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, np.rint(grid_sample(x, grid, "linear", "zeros", 0)))


def test_float16_and_noncontiguous(device, path, rng):
    x = rng.standard_normal((2, 3, 10, 12)).astype(np.float16)[:, :, ::2, 1::2]  # (2, 3, 5, 6) view
    grid = rng.uniform(-1, 1, (2, 4, 5, 2)).astype(np.float32).transpose(0, 2, 1, 3)  # (2, 5, 4, 2)
    got = run(device, path, x, grid, mode="linear")
    assert got.dtype == np.float16
    np.testing.assert_allclose(got, grid_sample(x, grid, "linear", "zeros", 0), rtol=3e-3, atol=3e-3)


@pytest.mark.parametrize("S", [(9,), (5, 7), (3, 4, 6), (2, 3, 4, 5)])
@pytest.mark.parametrize("padding", ["zeros", "border"])
@pytest.mark.parametrize("align", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_lean_linear_taps_match_general(rng, S, padding, align, dtype):
    r = len(S)
    g = rng.uniform(-1.3, 1.3, (3, 50, r)).astype(dtype)
    g[0, :5] = -1.0
    g[0, 5:10] = 1.0
    g[1, :3] = np.nan
    with np.errstate(invalid="ignore"):
        lin, w, _ = grid_mod._taps(np, g, S, "linear", padding, align)
        lin2, w2 = grid_mod._linear_taps_host(g, S, padding, align)
    if padding == "zeros":  # a NaN coordinate gives taps of weight 0 (indices unspecified)
        assert np.all(w2[1, :, :3] == 0)
    K = 2 ** r
    keep = np.ones((3, 50), bool)
    keep[1, :3] = False
    np.testing.assert_array_equal(lin.reshape(K, 3, 50)[:, keep], lin2.transpose(1, 0, 2)[:, keep])
    np.testing.assert_array_equal(w.reshape(K, 3, 50), w2.transpose(1, 0, 2))
