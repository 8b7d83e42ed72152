"""Gather*, Compress, NonZero, OneHot, Unique, ReverseSequence, Scatter*, TensorScatter."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from gpukernels.errors import KernelInputError
from gpukernels.kernels import KernelContext
from gpukernels.kernels.tensor.indexing import (Compress, Gather, GatherElements, GatherND, NonZero, OneHot,
                                                ReverseSequence, Unique)
from gpukernels.kernels.tensor.scatter import Scatter, ScatterElements, ScatterND, TensorScatter

I64 = np.int64


def K(cls, device, opset=None):
    return cls(KernelContext(device, opset=opset))


@pytest.mark.parametrize("itype", [np.int32, np.int64])
def test_gather(device, rng, itype):
    x = rng.standard_normal((4, 5, 6)).astype(np.float32)
    keep = x.copy()
    idx = rng.integers(-5, 5, (3, 2)).astype(itype)
    got = K(Gather, device)(x, idx, axis=1).numpy()
    ref = np.empty((4, 3, 2, 6), np.float32)
    for i, j in itertools.product(range(3), range(2)):
        ref[:, i, j] = x[:, idx[i, j] % 5]
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(x, keep)
    assert K(Gather, device)(x, I64(2)).shape == (5, 6)
    if device == "cpu":
        buf = np.empty((4, 3, 2, 6), np.float32)
        assert Gather()(x, idx, axis=1, out=buf).array is buf
    with pytest.raises(KernelInputError, match="Gather.*out of range"):
        K(Gather, device)(x, I64([5]), axis=1)
    with pytest.raises(KernelInputError, match="Gather.*out of range"):
        K(Gather, device)(x, I64([-6]), axis=1)


def test_gather_elements_nd(device, rng):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    idx = rng.integers(-3, 3, (2, 4))
    got = K(GatherElements, device)(x, idx, axis=0).numpy()
    ref = np.array([[x[idx[i, j] % 3, j] for j in range(4)] for i in range(2)])
    np.testing.assert_array_equal(got, ref)
    idx2 = rng.integers(0, 4, (2, 3))
    got = K(GatherElements, device)(x, idx2, axis=-1).numpy()
    np.testing.assert_array_equal(got, np.array([[x[i, idx2[i, j]] for j in range(3)] for i in range(2)]))
    with pytest.raises(KernelInputError, match="GatherElements"):
        K(GatherElements, device)(x, I64([[3]]), axis=0)
    d = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    ind = np.stack([rng.integers(-3, 3, (2, 6)), rng.integers(0, 4, (2, 6))], -1)
    got = K(GatherND, device)(d, ind, batch_dims=1).numpy()
    ref = np.array([[d[b, ind[b, m, 0] % 3, ind[b, m, 1]] for m in range(6)] for b in range(2)])
    np.testing.assert_array_equal(got, ref)
    got = K(GatherND, device)(d, I64([[1, 2, 3, 4]])).numpy()
    np.testing.assert_array_equal(got, d[1, 2, 3, 4][None])
    with pytest.raises(KernelInputError, match="GatherND"):
        K(GatherND, device)(d, I64([[2]]))
    with pytest.raises(KernelInputError, match="GatherND"):
        K(GatherND, device)(d, I64([[0, 0, 0, 0, 0]]))


def test_compress_nonzero(device, rng):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    c = np.array([True, False, True])
    np.testing.assert_array_equal(K(Compress, device)(x, c, axis=0).numpy(), x[[0, 2]])
    np.testing.assert_array_equal(K(Compress, device)(x, np.array([False, True]), axis=-1).numpy(), x[:, [1]])
    np.testing.assert_array_equal(K(Compress, device)(x, c).numpy(), x.reshape(-1)[[0, 2]])
    with pytest.raises(KernelInputError, match="Compress"):
        K(Compress, device)(x, np.ones(5, bool), axis=0)
    z = np.array([[0, 2, 0], [3, 0, 1]], np.int32)
    np.testing.assert_array_equal(K(NonZero, device)(z).numpy(), np.array(np.nonzero(z)))
    assert K(NonZero, device)(np.zeros((2, 0))).shape == (2, 0)


def test_onehot(device):
    idx = np.array([[1, -1], [5, 0]], np.int64)
    vals = np.float32([-1, 7])
    got = K(OneHot, device)(idx, np.float32(3), vals).numpy()
    ref = np.full((2, 2, 3), -1, np.float32)
    ref[0, 0, 1] = ref[0, 1, 2] = ref[1, 1, 0] = 7
    np.testing.assert_array_equal(got, ref)
    got0 = K(OneHot, device)(idx, I64([3]), vals, axis=0).numpy()
    np.testing.assert_array_equal(got0, np.moveaxis(ref, -1, 0))
    got_f = K(OneHot, device)(np.float32([1.7, -2.2]), I64(3), np.int32([0, 1])).numpy()
    assert got_f.tolist() == [[0, 1, 0], [0, 1, 0]]
    with pytest.raises(KernelInputError, match="OneHot"):
        K(OneHot, device)(idx, I64(0), vals)


def ref_unique(x, axis, sorted_):
    rows = [tuple(np.moveaxis(x, axis, 0)[i].reshape(-1).tolist()) for i in range(x.shape[axis])] \
        if axis is not None else [(v,) for v in x.reshape(-1).tolist()]
    seen = {}
    for i, r in enumerate(rows):
        seen.setdefault(r, []).append(i)
    keys = sorted(seen) if sorted_ else list(seen)
    first = [seen[k][0] for k in keys]
    inverse = [keys.index(r) for r in rows]
    counts = [len(seen[k]) for k in keys]
    return first, inverse, counts


@pytest.mark.parametrize("sorted_", [0, 1])
@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_unique(device, rng, sorted_, axis):
    x = rng.integers(0, 3, (4, 3, 2)).astype(np.float32)
    r = K(Unique, device)(x, axis=axis, sorted=sorted_)
    first, inverse, counts = ref_unique(x, None if axis is None else axis % 3, sorted_)
    assert r.indices.numpy().tolist() == first
    assert r.inverse_indices.numpy().tolist() == inverse
    assert r.counts.numpy().tolist() == counts
    src = x.reshape(-1) if axis is None else x
    np.testing.assert_array_equal(r.Y.numpy(), np.take(src, first, axis=0 if axis is None else axis))


def test_reverse_sequence(device, rng):
    x = rng.standard_normal((4, 3, 2)).astype(np.float32)
    lens = I64([4, 0, 2])
    got = K(ReverseSequence, device)(x, lens, batch_axis=1, time_axis=0).numpy()
    ref = x.copy()
    for b, n in enumerate(lens):
        ref[:n, b] = x[:n, b][::-1]
    np.testing.assert_array_equal(got, ref)
    got = K(ReverseSequence, device)(x.transpose(1, 0, 2), lens, batch_axis=0, time_axis=1).numpy()
    np.testing.assert_array_equal(got, ref.transpose(1, 0, 2))
    with pytest.raises(KernelInputError, match="ReverseSequence"):
        K(ReverseSequence, device)(x, I64([5, 1, 1]))


def ref_scatter_elements(x, idx, upd, axis, red):
    out = x.astype(np.float64).copy()
    for pos in itertools.product(*[range(d) for d in idx.shape]):
        tgt = list(pos)
        tgt[axis] = idx[pos] % x.shape[axis]
        tgt = tuple(tgt)
        v = upd[pos]
        if red == "none":
            out[tgt] = v
        elif red == "add":
            out[tgt] += v
        elif red == "mul":
            out[tgt] *= v
        elif red == "max":
            out[tgt] = max(out[tgt], v)
        else:
            out[tgt] = min(out[tgt], v)
    return out


@pytest.mark.parametrize("red", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("dt", [np.float32, np.int8, np.float16])
def test_scatter_elements(device, rng, red, dt):
    x = rng.integers(-4, 5, (4, 5)).astype(dt)
    keep = x.copy()
    idx = rng.integers(-4, 4, (6, 3)).astype(np.int32)  # repeats guaranteed
    upd = rng.integers(-3, 4, (6, 3)).astype(dt)
    got = K(ScatterElements, device)(x, idx, upd, axis=0, reduction=red).numpy()
    ref = ref_scatter_elements(x, idx, upd, 0, red)
    if dt == np.int8:
        ref = ((ref.astype(np.int64) + 128) % 256 - 128)
    np.testing.assert_array_equal(got.astype(np.float64), ref)
    np.testing.assert_array_equal(x, keep)


def test_scatter_errors_and_legacy(device):
    x = np.zeros((3, 3), np.float32)
    with pytest.raises(KernelInputError, match="ScatterElements.*out of range"):
        K(ScatterElements, device)(x, I64([[3]]), np.float32([[1]]))
    with pytest.raises(KernelInputError, match="ScatterElements"):
        K(ScatterElements, device, 13)(x, I64([[0]]), np.float32([[1]]), reduction="add")
    with pytest.raises(KernelInputError, match="ScatterElements"):
        K(ScatterElements, device)(x, I64([[0]]), np.float32([[1]]), reduction="avg")
    got = K(Scatter, device, 9)(x, I64([[1, 2]]), np.float32([[5, 6]]), axis=1).numpy()
    assert got.tolist() == [[0, 5, 6], [0, 0, 0], [0, 0, 0]]


@pytest.mark.parametrize("red", ["none", "add", "mul", "max", "min"])
def test_scatter_nd(device, rng, red):
    x = rng.standard_normal((5, 4, 3)).astype(np.float32)
    idx = rng.integers(-5, 5, (7, 1))
    upd = rng.standard_normal((7, 4, 3)).astype(np.float32)
    got = K(ScatterND, device)(x, idx, upd, reduction=red).numpy()
    ref = x.astype(np.float64).copy()
    for m in range(7):
        r = idx[m, 0] % 5
        ops = {"none": lambda a, b: b, "add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}
        ref[r] = ops[red](ref[r], upd[m])
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    idx2 = I64([[0, 1, 2], [0, 1, 2], [4, 3, 0]])
    got = K(ScatterND, device)(x, idx2, np.float32([1, 2, 3])).numpy()
    assert got[0, 1, 2] == 2 and got[4, 3, 0] == 3  # the last repeated update wins
    with pytest.raises(KernelInputError, match="ScatterND"):
        K(ScatterND, device)(x, I64([[5]]), upd[:1])
    with pytest.raises(KernelInputError, match="ScatterND"):
        K(ScatterND, device)(x, I64([[0]]), upd[:1, :2])


@pytest.mark.parametrize("mode", ["linear", "circular"])
def test_tensor_scatter(device, rng, mode):
    past = rng.standard_normal((2, 3, 6, 4)).astype(np.float32)
    upd = rng.standard_normal((2, 3, 3, 4)).astype(np.float32)
    w = I64([1, 3]) if mode == "linear" else I64([5, 2])
    got = K(TensorScatter, device)(past, upd, w, mode=mode).numpy()
    ref = past.copy()
    for b in range(2):
        for s in range(3):
            ref[b, :, (w[b] + s) % 6] = upd[b, :, s]
    np.testing.assert_array_equal(got, ref)
    with pytest.raises(KernelInputError, match="TensorScatter"):
        K(TensorScatter, device)(past, upd, I64([4, 0]))
