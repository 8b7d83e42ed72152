"""Shape and layout operators against plain NumPy / loop references."""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest

from gpukernels.dtypes import DataType as D
from gpukernels.errors import KernelInputError, KernelTypeError
from gpukernels.kernels import KernelContext
from gpukernels.kernels.tensor.shape_ops import (CenterCropPad, Concat, DepthToSpace, Expand, Reshape, Shape,
                                                 Size, Slice, SpaceToDepth, Split, Squeeze, Transpose, Trilu,
                                                 Unsqueeze, Tile)
from gpukernels.tensor import Tensor

I64 = np.int64


def K(cls, device, opset=None):
    return cls(KernelContext(device, opset=opset))


def test_reshape(device, rng):
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    keep = x.copy()
    k = K(Reshape, device)
    assert k(x, I64([4, -1])).shape == (4, 6)
    assert k(x, I64([0, 0, -1])).shape == (2, 3, 4)
    assert k(x, I64([-1])).numpy().tolist() == x.reshape(-1).tolist()
    assert k(np.zeros((0, 3), np.float32), I64([0, 5]), allowzero=1).shape == (0, 5)
    assert k(np.float32([7]), I64([])).shape == ()
    assert K(Reshape, device, 1)(x, shape=[6, 4]).shape == (6, 4)
    for bad in ([5, -1], [-1, -1], [0, -2, 4], [2, 3, 4, 0]):
        with pytest.raises(KernelInputError, match="Reshape"):
            k(x, I64(bad))
    with pytest.raises(KernelInputError, match="allowzero"):
        k(x, I64([0, -1]), allowzero=1)
    np.testing.assert_array_equal(x, keep)


def test_shape_size(device):
    x = np.zeros((2, 3, 4, 5), np.int8)
    k = K(Shape, device)
    assert k(x).numpy().tolist() == [2, 3, 4, 5]
    assert k(x, start=1, end=-1).numpy().tolist() == [3, 4]
    assert k(x, start=-10, end=10).numpy().tolist() == [2, 3, 4, 5]
    assert k(x, start=3, end=1).numpy().tolist() == []
    assert k(x).data_type == D.INT64
    s = K(Size, device)(x)
    assert s.shape == () and int(s.numpy()) == 120


def test_squeeze_unsqueeze(device):
    x = np.arange(6, dtype=np.float32).reshape(1, 2, 1, 3)
    assert K(Squeeze, device)(x).shape == (2, 3)
    assert K(Squeeze, device)(x, I64([-2])).shape == (1, 2, 3)
    assert K(Squeeze, device, 11)(x, axes=[0]).shape == (2, 1, 3)
    with pytest.raises(KernelInputError, match="Squeeze"):
        K(Squeeze, device)(x, I64([1]))
    u = K(Unsqueeze, device)
    assert u(np.zeros((2, 3)), I64([0, -1])).shape == (1, 2, 3, 1)
    assert u(np.zeros((2, 3)), I64([1, 3])).shape == (2, 1, 3, 1)
    assert u(np.float32(1), I64([0])).shape == (1,)
    assert K(Unsqueeze, device, 1)(np.zeros((2, 3)), axes=[0]).shape == (1, 2, 3)
    with pytest.raises(KernelInputError, match="Unsqueeze"):
        u(np.zeros((2, 3)), I64([0, 0]))
    with pytest.raises(KernelInputError, match="Unsqueeze"):
        u(np.zeros((2, 3)), I64([4]))


def test_expand_tile(device, rng):
    x = rng.standard_normal((3, 1)).astype(np.float32)
    e = K(Expand, device)(x, I64([2, 1, 6]))
    np.testing.assert_array_equal(e.numpy(), np.broadcast_to(x, (2, 3, 6)))
    assert K(Expand, device)(x, I64([1])).shape == (3, 1)
    with pytest.raises(KernelInputError, match="Expand"):
        K(Expand, device)(x, I64([4, 2]))
    t = K(Tile, device)(x, I64([2, 3]))
    np.testing.assert_array_equal(t.numpy(), np.tile(x, (2, 3)))
    assert K(Tile, device)(x, I64([0, 1])).shape == (0, 1)
    with pytest.raises(KernelInputError, match="Tile"):
        K(Tile, device)(x, I64([2]))
    t1 = K(Tile, device, 1)(x, I64([3]), I64([0]))
    np.testing.assert_array_equal(t1.numpy(), np.tile(x, (3, 1)))


@pytest.mark.parametrize("dt", [np.float32, np.int64, ml_dtypes.bfloat16, np.bool_, object])
def test_transpose_dtypes(device, rng, dt):
    x = rng.integers(0, 5, (2, 3, 4, 5)).astype(dt)
    if dt is object:
        x = x.astype(str).astype(object)
    k = K(Transpose, device)
    np.testing.assert_array_equal(k(x).numpy(), x.transpose())
    np.testing.assert_array_equal(k(x, perm=[0, 2, 3, 1]).numpy(), x.transpose(0, 2, 3, 1))


@pytest.mark.parametrize("shape,perm", [((16, 130, 520), (0, 2, 1)), ((1100, 1000), (1, 0)),
                                        ((3, 200, 40, 45), (0, 3, 1, 2)), ((2, 700, 800), (2, 1, 0))])
def test_transpose_large_tiled(device, rng, shape, perm):
    """Big transposes (the host copies them in tiles of the output's last axis, with a
    ragged last tile) equal NumPy's; float64 and a 2-byte type."""
    x = rng.standard_normal(shape)
    for arr in (x, x.astype(np.float16)):
        got = K(Transpose, device)(arr, perm=list(perm)).numpy()
        assert got.flags.c_contiguous
        np.testing.assert_array_equal(got, arr.transpose(perm))


def test_transpose_out_and_errors(device, rng):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    if device == "cpu":
        buf = np.empty((4, 3), np.float32)
        r = Transpose()(x, perm=[1, 0], out=buf)
        assert r.array is buf
        np.testing.assert_array_equal(buf, x.T)
    for bad in ([0, 0], [0], [0, 2]):
        with pytest.raises(KernelInputError, match="Transpose"):
            K(Transpose, device)(x, perm=bad)


def test_concat(device, rng):
    a = rng.standard_normal((2, 3)).astype(np.float32)
    b = rng.standard_normal((2, 5)).astype(np.float32)
    c = np.zeros((2, 0), np.float32)
    k = K(Concat, device)
    np.testing.assert_array_equal(k(a, b, c, axis=-1).numpy(), np.concatenate([a, b], 1))
    if device == "cpu":
        buf = np.empty((2, 8), np.float32)
        assert k(a, b, axis=1, out=buf).array is buf
        np.testing.assert_array_equal(buf, np.concatenate([a, b], 1))
    assert K(Concat, device, 1)(a, a).shape == (2, 6)
    with pytest.raises(KernelInputError, match="Concat"):
        k(a, b, axis=0)
    with pytest.raises(KernelInputError, match="Concat"):
        k(a, b)
    with pytest.raises(KernelTypeError, match="Concat"):
        k(a, b.astype(np.float64), axis=1)
    s = k(Tensor(np.array(["a"], object)), Tensor(np.array(["b", "c"], object)), axis=0)
    assert s.numpy().tolist() == ["a", "b", "c"]


def test_split(device, rng):
    x = rng.standard_normal((7, 4)).astype(np.float32)
    parts = K(Split, device)(x, I64([2, 5]))
    assert [p.shape for p in parts] == [(2, 4), (5, 4)]
    np.testing.assert_array_equal(np.concatenate([p.numpy() for p in parts]), x)
    parts = K(Split, device)(x, num_outputs=3)
    assert [p.shape[0] for p in parts] == [3, 3, 1]
    parts = K(Split, device)(x, axis=1, num_outputs=2)
    assert [p.shape for p in parts] == [(7, 2), (7, 2)]
    k = K(Split, device, 13)
    k.requested_outputs = (True, True)
    assert [p.shape for p in k(x, axis=-1)] == [(7, 2), (7, 2)]
    with pytest.raises(KernelInputError, match="Split"):
        k(x)  # 7 does not split in 2
    assert [p.shape for p in K(Split, device, 11)(x, split=[3, 4])] == [(3, 4), (4, 4)]
    with pytest.raises(KernelInputError, match="Split"):
        K(Split, device)(x, I64([3, 3]))


def ref_slice(x, starts, ends, axes, steps):
    """Element-wise slice reference with the spec's clamping."""
    idx = [list(range(d)) for d in x.shape]
    for s, e, a, p in zip(starts, ends, axes, steps):
        d = x.shape[a]
        s = s + d if s < 0 else s
        e = e + d if e < 0 else e
        if p > 0:
            s, e = min(max(s, 0), d), min(max(e, 0), d)
            idx[a] = list(range(s, e, p))
        else:
            s, e = min(max(s, 0), d - 1), min(max(e, -1), d - 1)
            idx[a] = list(range(s, e, p))
    out = np.empty([len(i) for i in idx], x.dtype)
    for pos in itertools.product(*[range(len(i)) for i in idx]):
        out[pos] = x[tuple(idx[k][p] for k, p in enumerate(pos))]
    return out


def test_slice_random(device, rng):
    x = rng.standard_normal((5, 6, 7)).astype(np.float32)
    k = K(Slice, device)
    for _ in range(60):
        n = int(rng.integers(1, 4))
        axes = list(rng.permutation(3)[:n])
        starts = [int(v) for v in rng.integers(-10, 10, n)]
        ends = [int(v) for v in rng.integers(-10, 10, n)]
        steps = [int(v) for v in rng.choice([-3, -2, -1, 1, 2, 3], n)]
        axes_in = [a - 3 if rng.random() < 0.3 else a for a in axes]
        got = k(x, I64(starts), I64(ends), I64(axes_in), I64(steps)).numpy()
        np.testing.assert_array_equal(got, ref_slice(x, starts, ends, axes, steps))
    big = k(x, I64([2 ** 63 - 1]), I64([-(2 ** 63)]), I64([1]), I64([-1])).numpy()
    np.testing.assert_array_equal(big, x[:, ::-1])
    assert k(x, np.int32([1]), np.int32([3])).shape == (2, 6, 7)
    v1 = K(Slice, device, 1)(x, starts=[0, 1], ends=[2, -1], axes=[0, 2])
    np.testing.assert_array_equal(v1.numpy(), x[0:2, :, 1:-1])
    with pytest.raises(KernelInputError, match="Slice"):
        k(x, I64([0]), I64([1]), I64([0]), I64([0]))
    with pytest.raises(KernelInputError, match="Slice"):
        k(x, I64([0, 1]), I64([1]))


def test_depth_space(device, rng):
    x = rng.standard_normal((2, 8, 3, 5)).astype(np.float32)
    b = 2
    n, c, h, w = x.shape
    for mode in ("DCR", "CRD"):
        y = K(DepthToSpace, device)(x, blocksize=b, mode=mode).numpy()
        ref = np.empty((n, c // 4, h * 2, w * 2), np.float32)
        for ci in range(c // 4):
            for i in range(h * 2):
                for j in range(w * 2):
                    src_c = ((i % 2) * 2 + j % 2) * (c // 4) + ci if mode == "DCR" else ci * 4 + (i % 2) * 2 + j % 2
                    ref[:, ci, i, j] = x[:, src_c, i // 2, j // 2]
        np.testing.assert_array_equal(y, ref)
        back = K(SpaceToDepth, device)(y, blocksize=b, mode=mode).numpy()
        np.testing.assert_array_equal(back, x)
    with pytest.raises(KernelInputError, match="DepthToSpace"):
        K(DepthToSpace, device)(x, blocksize=3)
    with pytest.raises(KernelInputError, match="SpaceToDepth"):
        K(SpaceToDepth, device)(x, blocksize=2)
    with pytest.raises(KernelInputError, match="DepthToSpace"):
        K(DepthToSpace, device)(x, blocksize=2, mode="XYZ")


def test_trilu(device, rng):
    x = rng.integers(1, 9, (2, 4, 5)).astype(np.int32)
    for k_ in (-5, -1, 0, 2, 7):
        for upper in (0, 1):
            got = K(Trilu, device)(x, I64(k_), upper=upper).numpy()
            ref = x.copy()
            for i in range(4):
                for j in range(5):
                    if (upper and j - i < k_) or (not upper and j - i > k_):
                        ref[:, i, j] = 0
            np.testing.assert_array_equal(got, ref)
    with pytest.raises(KernelInputError, match="Trilu"):
        K(Trilu, device)(np.zeros(3))


def test_center_crop_pad(device, rng):
    x = rng.standard_normal((5, 4, 3)).astype(np.float32)
    y = K(CenterCropPad, device)(x, I64([2, 7]), axes=[0, 1]).numpy()
    assert y.shape == (2, 7, 3)
    ref = np.zeros((2, 7, 3), np.float32)
    ref[:, 1:5] = x[1:3]
    np.testing.assert_array_equal(y, ref)
    with pytest.raises(KernelInputError, match="CenterCropPad"):
        K(CenterCropPad, device)(x, I64([2, 7]))
