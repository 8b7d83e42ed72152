"""Host fast paths of GridSample (channels-first tap gathers, the lean linear taps, batch
and channel-block threading) and ScatterND (rows assigned by several threads when they are
distinct) against float64 / loop references."""

from __future__ import annotations

import numpy as np
import pytest

from gpukernels.kernels import KernelContext
from gpukernels.kernels.tensor import grid as grid_mod
from gpukernels.kernels.tensor import scatter as scatter_mod
from gpukernels.kernels.tensor.grid import GridSample
from gpukernels.kernels.tensor.scatter import ScatterND


# ------------------------------------------------------------------ GridSample

def _cubic(d, a=-0.75):
    d = np.abs(d)
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


def ref_grid_sample(x, grid, mode, padding, align):
    """Linear or cubic sampling of x (N, C, *S) at grid (N, *O, r), zeros or border
    padding, float64: every output point sums its taps' weight * value over the axes'
    tap offsets."""
    x = np.asarray(x, np.float64)
    N, C = x.shape[:2]
    S = x.shape[2:]
    r = len(S)
    O = grid.shape[1:-1]
    g = np.asarray(grid, np.float64).reshape(N, -1, r)
    out = np.zeros((N, C, g.shape[1]))
    offs = [0, 1] if mode == "linear" else [-1, 0, 1, 2]
    for n in range(N):
        coords = []
        for k in range(r):
            L = S[k]
            v = g[n, :, r - 1 - k]
            c = (v + 1) / 2 * (L - 1) if align else ((v + 1) * L - 1) / 2
            if padding == "border":
                c = np.clip(c, 0, L - 1)
            coords.append(c)
        for taps in np.ndindex(*([len(offs)] * r)):
            w = np.ones(g.shape[1])
            inside = np.ones(g.shape[1], bool)
            pos = []
            for k in range(r):
                f = np.floor(coords[k])
                p = f + offs[taps[k]]
                t = coords[k] - p
                w = w * ((1 - np.abs(t)) if mode == "linear" else _cubic(t))
                inside &= (p >= 0) & (p <= S[k] - 1)
                pos.append(np.clip(p, 0, S[k] - 1).astype(int))
            vals = x[n][(slice(None),) + tuple(pos)]  # (C, M)
            if padding == "zeros":
                vals = np.where(inside, vals, 0.0)
            out[n] += w * vals
    return out.reshape((N, C) + O)


def run(device, x, grid, opset=None, **attrs):
    return GridSample(KernelContext(device, opset))(x, grid, **attrs).numpy()


@pytest.mark.parametrize("padding", ["zeros", "border"])
@pytest.mark.parametrize("align", [0, 1])
@pytest.mark.parametrize("dtype,tol", [(np.float32, 2e-5), (np.float64, 1e-12)])
def test_linear_2d(device, rng, padding, align, dtype, tol):
    x = rng.standard_normal((3, 5, 6, 7)).astype(dtype)
    grid = rng.uniform(-1.3, 1.3, (3, 9, 11, 2)).astype(dtype)
    grid[0, 0, :4] = [[-1, -1], [1, 1], [-1, 1], [1, -1]]  # the corners exactly
    got = run(device, x, grid, mode="linear", padding_mode=padding, align_corners=align)
    assert got.dtype == dtype
    np.testing.assert_allclose(got, ref_grid_sample(x, grid, "linear", padding, align), rtol=tol, atol=tol)


@pytest.mark.parametrize("N", [1, 3])
def test_channel_blocks_and_batch_groups(device, rng, N):
    """C * points above the host block: several channel blocks (the last partial); one
    batch entry threads over channel blocks, several over batch entries in groups."""
    M = 64 * 64
    C = grid_mod._HOST_BLOCK // (4 * M) + 7  # 4 linear taps per point
    x = rng.standard_normal((N, C, 20, 30)).astype(np.float32)
    grid = rng.uniform(-1.1, 1.1, (N, 64, 64, 2)).astype(np.float32)
    got = run(device, x, grid, mode="linear")
    np.testing.assert_allclose(got, ref_grid_sample(x, grid, "linear", "zeros", 0), rtol=2e-5, atol=2e-5)



@pytest.mark.parametrize("N,C", [(1, 1), (1, 6), (5, 1), (5, 3), (7, 13)])
@pytest.mark.parametrize("padding", ["zeros", "border"])
@pytest.mark.parametrize("align", [0, 1])
def test_threaded_units_blocks(device, rng, monkeypatch, N, C, padding, align):
    """Work units handed to the host threads as they come free (batch-entry groups, or
    channel blocks of a single entry), small blocks (partial last block), grids partly
    outside the input, non-contiguous X and grid."""
    monkeypatch.setattr(grid_mod, "_THREAD_WORK", 1)
    monkeypatch.setattr(grid_mod, "_HOST_BLOCK", 4 * 35 * 2)  # two channels a block
    monkeypatch.setattr(grid_mod, "_TAPS_POINTS", 80)  # taps of two entries at once
    x = rng.standard_normal((N, 2 * C, 6, 9)).astype(np.float32)[:, ::2]
    grid = rng.uniform(-1.4, 1.4, (N, 7, 5, 2)).astype(np.float32).transpose(0, 2, 1, 3)
    got = run(device, x, grid, mode="linear", padding_mode=padding, align_corners=align)
    np.testing.assert_allclose(got, ref_grid_sample(x, grid, "linear", padding, align), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_nan_grid_points_read_zeros(device, rng, mode):
    """Under zeros padding a NaN coordinate has no taps inside: the output there is 0;
    the other points are unaffected."""
    x = rng.standard_normal((3, 4, 6, 7)).astype(np.float32)
    grid = rng.uniform(-1.2, 1.2, (3, 5, 6, 2)).astype(np.float32)
    grid[1, 2, 3] = np.nan
    grid[2, 0, 1, 0] = np.nan
    with np.errstate(invalid="ignore"):
        got = run(device, x, grid, mode=mode)
    nan = np.isnan(grid).any(-1)  # (N, H, W)
    assert np.all(got.transpose(0, 2, 3, 1)[nan] == 0)
    clean = np.where(np.isnan(grid), 0, grid)
    want = ref_grid_sample(x, clean, mode, "zeros", 0)
    keep = np.broadcast_to(~nan[:, None], got.shape)
    np.testing.assert_allclose(got[keep], want[keep], rtol=2e-5, atol=2e-5)

@pytest.mark.parametrize("padding", ["zeros", "border"])
def test_linear_1d_and_3d(device, rng, padding):
    x1 = rng.standard_normal((2, 3, 9))
    g1 = rng.uniform(-1.2, 1.2, (2, 13, 1))
    np.testing.assert_allclose(run(device, x1, g1, 20, mode="linear", padding_mode=padding),
                               ref_grid_sample(x1, g1, "linear", padding, 0), rtol=1e-12, atol=1e-12)
    x3 = rng.standard_normal((2, 3, 4, 5, 6))
    g3 = rng.uniform(-1.2, 1.2, (2, 3, 4, 5, 3))
    np.testing.assert_allclose(run(device, x3, g3, 20, mode="linear", padding_mode=padding, align_corners=1),
                               ref_grid_sample(x3, g3, "linear", padding, 1), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("padding", ["zeros", "border"])
def test_cubic_2d(device, rng, padding):
    x = rng.standard_normal((2, 4, 7, 8))
    grid = rng.uniform(-1.2, 1.2, (2, 5, 6, 2))
    np.testing.assert_allclose(run(device, x, grid, mode="cubic", padding_mode=padding),
                               ref_grid_sample(x, grid, "cubic", padding, 0), rtol=1e-12, atol=1e-12)


def test_integer_input_rounds(device, rng):
    x = rng.integers(-100, 100, (2, 3, 5, 6)).astype(np.int32)
    grid = rng.uniform(-1, 1, (2, 4, 4, 2))
    got = run(device, x, grid, mode="linear")
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, np.rint(ref_grid_sample(x, grid, "linear", "zeros", 0)))


def test_float16_and_noncontiguous(device, rng):
    x = rng.standard_normal((2, 3, 10, 12)).astype(np.float16)[:, :, ::2, 1::2]  # (2, 3, 5, 6) view
    grid = rng.uniform(-1, 1, (2, 4, 5, 2)).astype(np.float32).transpose(0, 2, 1, 3)  # (2, 5, 4, 2)
    got = run(device, x, grid, mode="linear")
    assert got.dtype == np.float16
    np.testing.assert_allclose(got, ref_grid_sample(x, grid, "linear", "zeros", 0), rtol=3e-3, atol=3e-3)


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


# ------------------------------------------------------------------ ScatterND

def ref_scatter_nd(data, indices, updates):
    out = np.array(data, copy=True)
    k = indices.shape[-1]
    idx = indices.reshape(-1, k)
    upd = updates.reshape((idx.shape[0],) + data.shape[k:])
    for j in range(idx.shape[0]):  # in order: the last of repeated tuples wins
        out[tuple(idx[j])] = upd[j]
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.float16, np.bool_])
def test_scatter_nd_distinct_rows_threads(device, rng, monkeypatch, dtype):
    monkeypatch.setattr(scatter_mod, "_PARALLEL_ASSIGN", 1 << 10)
    data = (rng.standard_normal((300, 160)) * 10).astype(dtype)
    rows = rng.permutation(300)[:170].astype(np.int64)
    rows[::7] -= 300  # negative indices
    upd = (rng.standard_normal((170, 160)) * 10).astype(dtype)
    got = ScatterND(KernelContext(device))(data, rows[:, None], upd).numpy()
    np.testing.assert_array_equal(got, ref_scatter_nd(data, rows[:, None] % 300, upd))


def test_scatter_nd_repeated_rows_last_wins(device, rng, monkeypatch):
    monkeypatch.setattr(scatter_mod, "_PARALLEL_ASSIGN", 1 << 10)
    data = rng.standard_normal((50, 128)).astype(np.float32)
    rows = rng.integers(0, 50, 200).astype(np.int64)  # many repeats
    upd = rng.standard_normal((200, 128)).astype(np.float32)
    got = ScatterND(KernelContext(device))(data, rows[:, None], upd).numpy()
    np.testing.assert_array_equal(got, ref_scatter_nd(data, rows[:, None], upd))


def test_scatter_nd_large_rows(device, rng):
    """Large enough for the threaded paths at their real thresholds."""
    data = rng.standard_normal((1200, 2048)).astype(np.float32)
    rows = rng.permutation(1200)[:1100].astype(np.int64)
    upd = rng.standard_normal((1100, 2048)).astype(np.float32)
    got = ScatterND(KernelContext(device))(data, rows[:, None], upd).numpy()
    np.testing.assert_array_equal(got, ref_scatter_nd(data, rows[:, None], upd))
    rows[-1] = rows[3]  # one repeat: the later update wins
    got = ScatterND(KernelContext(device))(data, rows[:, None], upd).numpy()
    np.testing.assert_array_equal(got, ref_scatter_nd(data, rows[:, None], upd))
    np.testing.assert_array_equal(got[rows[3]], upd[-1])


def test_scatter_nd_tuples_address_rows(device, rng, monkeypatch):
    monkeypatch.setattr(scatter_mod, "_PARALLEL_ASSIGN", 1 << 8)
    data = rng.standard_normal((6, 7, 96)).astype(np.float32)
    idx = np.array([[[0, 1], [5, 6]], [[2, 3], [-1, 0]], [[4, -7], [3, 3]]], np.int64)  # (3, 2, 2)
    upd = rng.standard_normal((3, 2, 96)).astype(np.float32)
    got = ScatterND(KernelContext(device))(data, idx, upd).numpy()
    want = ref_scatter_nd(data, np.where(idx < 0, idx + np.array([6, 7]), idx), upd)
    np.testing.assert_array_equal(got, want)


def test_scatter_nd_input_not_modified(device, rng, monkeypatch):
    monkeypatch.setattr(scatter_mod, "_PARALLEL_ASSIGN", 1 << 8)
    data = rng.standard_normal((40, 64)).astype(np.float32)
    keep = data.copy()
    rows = rng.permutation(40)[:30].astype(np.int64)[:, None]
    ScatterND(KernelContext(device))(data, rows, rng.standard_normal((30, 64)).astype(np.float32))
    np.testing.assert_array_equal(data, keep)
