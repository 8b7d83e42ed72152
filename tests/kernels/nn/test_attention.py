"""Attention vs the float64 references of tests/reference (loops over batch, head and
query), and its host path (_HostAttention: blocks of KV heads and query rows, 2**s
without the max shift where the row sums allow it, the causal frontier on the trailing
square of each row block, K @ q^T for few rows) on both paths, with block sizes set small
through the tuning table so that every boundary case occurs on small inputs."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from gpukernels.errors import KernelInputError, KernelTypeError
from gpukernels.host import tuning as tuning_table
from gpukernels.kernels import KernelContext
from gpukernels.kernels.nn import attention as attention_mod
from gpukernels.kernels.nn.attention import Attention
from gpukernels.tensor import Tensor
from tests.reference import attention as naive
from tests.reference import attention_heads


def kernel(device, opset=25, **options):
    return Attention(KernelContext(device, opset, options=options))


def rand(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def check(res, ref, tol=1e-5, mode=None):
    Y, pk, pv, modes = ref
    np.testing.assert_allclose(res.Y.numpy().astype(np.float64), Y, rtol=tol, atol=tol)
    if mode is not None:
        got = res.qk_matmul_output.numpy().astype(np.float64)
        np.testing.assert_allclose(got, modes[mode], rtol=tol, atol=tol)


# ---------------------------------------------------------------------------- basics


@pytest.mark.parametrize("hq,hkv", [(4, 4), (4, 2), (6, 1)])
@pytest.mark.parametrize("causal", [0, 1])
def test_4d_heads_and_causal(device, rng, hq, hkv, causal):
    Q, K, V = rand(rng, 2, hq, 5, 8), rand(rng, 2, hkv, 7, 8), rand(rng, 2, hkv, 7, 3)
    res = kernel(device)(Q, K, V, is_causal=causal)
    check(res, naive(Q, K, V, causal=causal))
    assert isinstance(res, Attention.Result)
    np.testing.assert_array_equal(res.present_key.numpy(), K)


@pytest.mark.parametrize("hq,hkv", [(4, 4), (4, 2), (3, 1)])
def test_3d_layout(device, rng, hq, hkv):
    Q, K, V = rand(rng, 2, 5, hq * 8), rand(rng, 2, 6, hkv * 8), rand(rng, 2, 6, hkv * 4)
    res = kernel(device)(Q, K, V, q_num_heads=hq, kv_num_heads=hkv, is_causal=1)
    assert res.Y.shape == (2, 5, hq * 4)
    check(res, naive(Q, K, V, hq=hq, hkv=hkv, causal=1))
    assert res.present_key.shape == (2, hkv, 6, 8)


def test_scale_and_softcap(device, rng):
    Q, K, V = rand(rng, 1, 2, 4, 8) * 3, rand(rng, 1, 2, 6, 8) * 3, rand(rng, 1, 2, 6, 8)
    res = kernel(device)(Q, K, V, scale=0.7, softcap=2.5)
    check(res, naive(Q, K, V, scale=0.7, softcap=2.5))


# ---------------------------------------------------------------------------- masks


@pytest.mark.parametrize("shape", [(6,), (4, 6), (2, 4, 6), (1, 2, 4, 6), (3, 1, 1, 6), (3, 2, 4, 6), (4, 1),
                                   (3,), (2, 4, 2), (1, 1, 4, 4)])
@pytest.mark.parametrize("kind", ["bool", "float", "int"])
@pytest.mark.parametrize("causal", [0, 1])
def test_masks(device, rng, shape, kind, causal):
    Q, K, V = rand(rng, 3, 2, 4, 8), rand(rng, 3, 2, 6, 8), rand(rng, 3, 2, 6, 5)
    if kind == "bool":
        mask = rng.random(shape) > 0.3
    elif kind == "float":
        mask = rand(rng, *shape)
        mask[rng.random(shape) < 0.2] = -np.inf
    else:
        mask = rng.integers(-3, 3, shape).astype(np.int32)
    res = kernel(device)(Q, K, V, mask, is_causal=causal, qk_matmul_output_mode=2)
    ref = naive(Q, K, V, mask, causal=causal)
    check(res, ref)
    got = res.qk_matmul_output.numpy()
    np.testing.assert_allclose(got, ref[3][2], rtol=1e-5, atol=1e-5)


def test_half_mask_and_float64_mask(device, rng):
    Q, K, V = rand(rng, 1, 2, 4, 8), rand(rng, 1, 2, 6, 8), rand(rng, 1, 2, 6, 8)
    for dt in (np.float16, np.float64, ml_dtypes.bfloat16):
        mask = rand(rng, 4, 6).astype(dt)
        check(kernel(device)(Q, K, V, mask), naive(Q, K, V, mask.astype(np.float64)))


def test_fully_masked_rows_are_zero(device, rng):
    Q, K, V = rand(rng, 1, 2, 3, 8), rand(rng, 1, 2, 5, 8), rand(rng, 1, 2, 5, 8)
    mask = np.ones((3, 5), bool)
    mask[1] = False
    fmask = np.zeros((3, 5), np.float32)
    fmask[2] = -np.inf
    for m in (mask, fmask):
        res = kernel(device)(Q, K, V, m, qk_matmul_output_mode=3)
        Y = res.Y.numpy()
        assert np.all(np.isfinite(Y))
        row = 1 if m.dtype == bool else 2
        assert np.all(Y[:, :, row] == 0)
        assert np.all(res.qk_matmul_output.numpy()[:, :, row] == 0)
        check(res, naive(Q, K, V, m), mode=3)


# ---------------------------------------------------------------------------- caches


@pytest.mark.parametrize("past", [0, 1, 5])
@pytest.mark.parametrize("rank", [3, 4])
def test_past_and_present_with_causal(device, rng, past, rank):
    hq, hkv = 4, 2
    pk, pv = rand(rng, 2, hkv, past, 8), rand(rng, 2, hkv, past, 6)
    if rank == 4:
        Q, K, V = rand(rng, 2, hq, 3, 8), rand(rng, 2, hkv, 3, 8), rand(rng, 2, hkv, 3, 6)
        attrs = {}
    else:
        Q, K, V = rand(rng, 2, 3, hq * 8), rand(rng, 2, 3, hkv * 8), rand(rng, 2, 3, hkv * 6)
        attrs = dict(q_num_heads=hq, kv_num_heads=hkv)
    mask = rng.random((3, past + 2)) > 0.2  # shorter than total: padded with False
    res = kernel(device)(Q, K, V, mask, pk, pv, is_causal=1, **attrs)
    ref = naive(Q, K, V, mask, pk, pv, causal=1, hq=hq, hkv=hkv)
    check(res, ref)
    np.testing.assert_array_equal(res.present_key.numpy(), ref[1].astype(np.float32))
    np.testing.assert_array_equal(res.present_value.numpy(), ref[2].astype(np.float32))


@pytest.mark.parametrize("sq", [1, 3, 6])
@pytest.mark.parametrize("causal", [0, 1])
def test_nonpad_kv_seqlen(device, rng, sq, causal):
    Q, K, V = rand(rng, 3, 4, sq, 8), rand(rng, 3, 2, 6, 8), rand(rng, 3, 2, 6, 8)
    nonpad = np.array([6, 4, 2], np.int64)
    res = kernel(device, 24)(Q, K, V, None, None, None, nonpad, is_causal=causal)
    check(res, naive(Q, K, V, nonpad=nonpad, causal=causal))


@pytest.mark.parametrize("left,right", [(2, 0), (2, 1), (-1, 1), (0, -1), (1, 3)])
@pytest.mark.parametrize("causal", [0, 1])
def test_windows(device, rng, left, right, causal):
    Q, K, V = rand(rng, 2, 2, 4, 8), rand(rng, 2, 2, 7, 8), rand(rng, 2, 2, 7, 8)
    pk, pv = rand(rng, 2, 2, 2, 8), rand(rng, 2, 2, 2, 8)
    res = kernel(device, 25)(Q, K, V, None, pk, pv, is_causal=causal, left_window_size=left,
                             right_window_size=right)
    check(res, naive(Q, K, V, None, pk, pv, causal=causal, left=left, right=right))
    nonpad = np.array([7, 3])
    mask = rng.random((4, 7)) > 0.1
    res = kernel(device, 25)(Q, K, V, mask, None, None, nonpad, is_causal=causal, left_window_size=left,
                             right_window_size=right)
    check(res, naive(Q, K, V, mask, nonpad=nonpad, causal=causal, left=left, right=right))


# ---------------------------------------------------------------------------- qk output, precision


@pytest.mark.parametrize("mode", [0, 1, 2, 3])
def test_qk_modes(device, rng, mode):
    Q, K, V = rand(rng, 2, 4, 3, 8), rand(rng, 2, 2, 4, 8), rand(rng, 2, 2, 4, 8)
    pk, pv = rand(rng, 2, 2, 2, 8), rand(rng, 2, 2, 2, 8)
    mask = rand(rng, 2, 1, 3, 6)
    res = kernel(device)(Q, K, V, mask, pk, pv, qk_matmul_output_mode=mode, softcap=1.5, is_causal=1)
    check(res, naive(Q, K, V, mask, pk, pv, softcap=1.5, causal=1), mode=mode)
    assert res.qk_matmul_output.shape == (2, 4, 3, 6)


@pytest.mark.parametrize("sp", [1, 10, 11, 16])
def test_softmax_precision(device, rng, sp):
    Q, K, V = rand(rng, 1, 2, 4, 8), rand(rng, 1, 2, 5, 8), rand(rng, 1, 2, 5, 8)
    res = kernel(device)(Q, K, V, softmax_precision=sp, qk_matmul_output_mode=3)
    ref = naive(Q, K, V)
    tol = {1: 1e-5, 11: 1e-5, 10: 2e-3, 16: 1.5e-2}[sp]
    check(res, ref, tol=tol, mode=3)
    assert res.qk_matmul_output.numpy().dtype == np.float32
    if sp in (10, 16):  # the probabilities are values of the half type
        half = np.float16 if sp == 10 else ml_dtypes.bfloat16
        p = res.qk_matmul_output.numpy()
        np.testing.assert_array_equal(p, p.astype(half).astype(np.float32))


@pytest.mark.parametrize("dtype,tol", [(np.float16, 3e-3), (ml_dtypes.bfloat16, 2e-2), (np.float64, 1e-12)])
def test_dtypes(device, rng, dtype, tol):
    Q, K, V = (rand(rng, 2, 4, 5, 8).astype(dtype), rand(rng, 2, 2, 6, 8).astype(dtype),
               rand(rng, 2, 2, 6, 8).astype(dtype))
    mask = rng.random((5, 6)) > 0.2
    res = kernel(device)(Q, K, V, mask, is_causal=1, qk_matmul_output_mode=3)
    assert res.Y.numpy().dtype == np.dtype(dtype)
    assert res.qk_matmul_output.numpy().dtype == np.dtype(dtype)
    assert res.present_key.numpy().dtype == np.dtype(dtype)
    check(res, naive(Q.astype(np.float64), K.astype(np.float64), V.astype(np.float64), mask, causal=1), tol=tol,
          mode=3)


def test_mixed_value_type(device, rng):
    Q, K = rand(rng, 1, 2, 3, 8), rand(rng, 1, 2, 4, 8)
    V = rand(rng, 1, 2, 4, 8, dtype=np.float64)
    res = kernel(device)(Q, K, V)
    assert res.Y.numpy().dtype == np.float32
    assert res.present_value.numpy().dtype == np.float64
    check(res, naive(Q, K, V))


# ---------------------------------------------------------------------------- chunking, API


def test_query_blocks_give_same_result(device, rng):
    Q, K, V = rand(rng, 2, 4, 37, 16), rand(rng, 2, 2, 50, 16), rand(rng, 2, 2, 50, 8)
    pk, pv = rand(rng, 2, 2, 3, 16), rand(rng, 2, 2, 3, 8)
    mask = rand(rng, 2, 1, 37, 40)
    args = dict(is_causal=1, qk_matmul_output_mode=3, softcap=3.0)
    a = kernel(device)(Q, K, V, mask, pk, pv, **args)
    b = kernel(device, attention_block_bytes=1)(Q, K, V, mask, pk, pv, **args)  # one query row per block
    np.testing.assert_allclose(b.Y.numpy(), a.Y.numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(b.qk_matmul_output.numpy(), a.qk_matmul_output.numpy(), rtol=1e-6, atol=1e-6)
    check(b, naive(Q, K, V, mask, pk, pv, causal=1, softcap=3.0), mode=3)


def test_run_with_attributes(device, rng):
    Q, K, V = rand(rng, 1, 4, 3, 8), rand(rng, 1, 2, 4, 8), rand(rng, 1, 2, 4, 8)
    pk, pv = rand(rng, 1, 2, 2, 8), rand(rng, 1, 2, 2, 8)
    attrs = Attention.Attributes(is_causal=1, scale=0.5, softcap=0.0, qk_matmul_output_mode=1)
    res = kernel(device).run(attrs, Q, K, V, past_key=pk, past_value=pv)
    check(res, naive(Q, K, V, None, pk, pv, causal=1, scale=0.5), mode=1)
    res2 = kernel(device)(Tensor(Q), Tensor(K), Tensor(V))
    check(res2, naive(Q, K, V))


def test_wanted_outputs_only(device, rng):
    Q, K, V = rand(rng, 1, 2, 3, 8), rand(rng, 1, 2, 4, 8), rand(rng, 1, 2, 4, 8)
    k = kernel(device)
    k.requested_outputs = (True, False, False, False)
    res = k(Q, K, V)
    assert res.present_key is None and res.qk_matmul_output is None
    check(res, naive(Q, K, V))


def test_empty(device, rng):
    Q, K, V = rand(rng, 1, 2, 0, 8), rand(rng, 1, 2, 4, 8), rand(rng, 1, 2, 4, 8)
    assert kernel(device)(Q, K, V).Y.shape == (1, 2, 0, 8)
    Q = rand(rng, 1, 2, 3, 8)
    K0, V0 = rand(rng, 1, 2, 0, 8), rand(rng, 1, 2, 0, 8)
    res = kernel(device)(Q, K0, V0)
    np.testing.assert_array_equal(res.Y.numpy(), np.zeros((1, 2, 3, 8), np.float32))


def test_inputs_not_modified(device, rng):
    arrays = [rand(rng, 1, 2, 3, 8), rand(rng, 1, 2, 4, 8), rand(rng, 1, 2, 4, 8), rand(rng, 3, 6),
              rand(rng, 1, 2, 2, 8), rand(rng, 1, 2, 2, 8)]
    copies = [a.copy() for a in arrays]
    kernel(device)(*arrays, is_causal=1, softcap=1.0, qk_matmul_output_mode=2)
    for a, c in zip(arrays, copies):
        np.testing.assert_array_equal(a, c)


def test_opset_23_and_24_differences(device, rng):
    Q, K, V = rand(rng, 1, 2, 3, 8), rand(rng, 1, 2, 4, 8), rand(rng, 1, 2, 4, 8)
    with pytest.raises(KernelInputError, match="opset 24"):
        kernel(device, 23)(Q, K, V, None, None, None, np.array([4]))
    with pytest.raises(KernelInputError, match="opset 25"):
        kernel(device, 24)(Q, K, V, left_window_size=1)
    check(kernel(device, 23)(Q, K, V, is_causal=1), naive(Q, K, V, causal=1))


def test_bad_inputs(device, rng):
    K_ = kernel(device)
    Q, K, V = rand(rng, 1, 4, 3, 8), rand(rng, 1, 3, 4, 8), rand(rng, 1, 3, 4, 8)
    with pytest.raises(KernelInputError, match="Attention.*multiple.*float32"):
        K_(Q, K, V)
    Q3, K3, V3 = rand(rng, 1, 3, 32), rand(rng, 1, 4, 16), rand(rng, 1, 4, 16)
    with pytest.raises(KernelInputError, match="q_num_heads"):
        K_(Q3, K3, V3)
    with pytest.raises(KernelInputError, match="divisible"):
        K_(Q3, K3, V3, q_num_heads=3, kv_num_heads=2)
    with pytest.raises(KernelInputError, match="3-D or all be 4-D"):
        K_(Q3, rand(rng, 1, 2, 4, 8), V3)
    Q, K, V = rand(rng, 1, 2, 3, 8), rand(rng, 1, 2, 4, 8), rand(rng, 1, 2, 4, 8)
    with pytest.raises(KernelInputError, match="does not broadcast"):
        K_(Q, K, V, rand(rng, 3, 3, 4))
    with pytest.raises(KernelInputError, match="exceeds"):
        K_(Q, K, V, rand(rng, 3, 5))
    with pytest.raises(KernelInputError, match="together"):
        K_(Q, K, V, None, rand(rng, 1, 2, 2, 8))
    with pytest.raises(KernelInputError, match="past_key/past_value must have shapes"):
        K_(Q, K, V, None, rand(rng, 1, 2, 2, 8), rand(rng, 1, 2, 3, 8))
    with pytest.raises(KernelInputError, match="head sizes"):
        K_(Q, rand(rng, 1, 2, 4, 7), V)
    with pytest.raises(KernelInputError, match="nonpad_kv_seqlen values"):
        K_(Q, K, V, None, None, None, np.array([9]))
    with pytest.raises(KernelInputError, match="cannot be combined"):
        K_(Q, K, V, None, rand(rng, 1, 2, 2, 8), rand(rng, 1, 2, 2, 8), np.array([2]))
    with pytest.raises(KernelInputError, match="qk_matmul_output_mode"):
        K_(Q, K, V, qk_matmul_output_mode=4)
    with pytest.raises(KernelInputError, match="softmax_precision"):
        K_(Q, K, V, softmax_precision=7)
    with pytest.raises(KernelInputError, match="disagree"):
        K_(Q, K, V, q_num_heads=4, kv_num_heads=2)
    with pytest.raises(KernelTypeError, match="Attention"):
        K_(Q.astype(np.int32), K, V)
    with pytest.raises(KernelTypeError, match="Attention"):
        K_(Q, K.astype(np.float64), V)


@pytest.mark.parametrize("past", [0, 37])
@pytest.mark.parametrize("sq, t_new", [(300, 300), (200, 150)])
def test_long_causal_uses_key_prefixes(device, rng, past, sq, t_new):
    """Long causal runs work in query blocks over the key prefix each block can see; with
    float and bool masks, GQA and a past cache the result matches the reference."""
    hq, hkv = 4, 2
    Q, K, V = rand(rng, 1, hq, sq, 16), rand(rng, 1, hkv, t_new, 16), rand(rng, 1, hkv, t_new, 8)
    pk, pv = (rand(rng, 1, hkv, past, 16), rand(rng, 1, hkv, past, 8)) if past else (None, None)
    T = past + t_new
    for mask in (rand(rng, sq, T), rng.random((1, 1, sq, T)) > 0.3):
        res = kernel(device)(Q, K, V, mask, pk, pv, is_causal=1)
        check(res, naive(Q, K, V, mask, pk, pv, causal=1), tol=2e-5)
    res = kernel(device)(Q, K, V, None, pk, pv, is_causal=1)
    check(res, naive(Q, K, V, None, pk, pv, causal=1), tol=2e-5)


# ---------------------------------------------------------------------------- host path


def host_kernel(device, path, opset=23, requested=(True,), **options):
    """A kernel whose caller wants only Y (as the runtime says for a one-output node)."""
    k = Attention(KernelContext(device, opset, options={"paths": path, **options}))
    k.requested_outputs = requested
    return k


def host_path(device, path) -> bool:
    """Whether a plain call takes the host specialisation."""
    return device == "cpu" and path == "auto"


@pytest.fixture
def small_blocks(tuning):
    """Blocks of a few KiB and 5 causal rows: many head and row blocks on small inputs."""
    tuning({"attention.host_block_bytes": 4096, "attention.host_causal_rows": 5})


@pytest.fixture
def shifted_blocks(monkeypatch):
    """Counts the host path's blocks redone with the max shift."""
    counts = []
    shifted = attention_mod._HostAttention._shifted_block

    def counted(self, *args):
        counts.append(1)
        return shifted(self, *args)

    monkeypatch.setattr(attention_mod._HostAttention, "_shifted_block", counted)
    return counts


@pytest.mark.parametrize("block_bytes", [1 << 20, 3000, 700])
@pytest.mark.parametrize("hq,hkv", [(4, 4), (6, 2), (4, 1)])
@pytest.mark.parametrize("causal,rows", [(0, 0), (1, 3), (1, 4)])
@pytest.mark.parametrize("sq,skv", [(11, 11), (9, 17), (16, 5)])
def test_host_deferred_normalisation(device, path, rng, tuning, sites_taken, shifted_blocks, block_bytes, hq, hkv,
                                     causal, rows, sq, skv):
    """Blocks of whole and partial heads and rows (strided views of Y and of the row sums)."""
    tuning({"attention.host_block_bytes": block_bytes})
    if rows:
        tuning({"attention.host_causal_rows": rows})
    Q, K, V = rand(rng, 2, hq, sq, 8), rand(rng, 2, hkv, skv, 8), rand(rng, 2, hkv, skv, 5)
    with sites_taken() as taken:
        got = host_kernel(device, path)(Q, K, V, is_causal=causal).Y.numpy()
    assert ("Attention.blocks" in taken) == host_path(device, path) and not shifted_blocks
    np.testing.assert_allclose(got, attention_heads(Q, K, V, causal=causal), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("blocks", ["default", "small"])
@pytest.mark.parametrize("hq,hkv", [(4, 4), (6, 2), (3, 1)])
@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("sq,skv,past", [(13, 13, 0), (1, 1, 9), (3, 5, 4), (17, 11, 0), (7, 23, 0), (12, 4, 6)])
def test_host_blocks_4d(device, path, rng, request, sites_taken, blocks, hq, hkv, causal, sq, skv, past):
    if blocks == "small":
        request.getfixturevalue("small_blocks")
    Q, K, V = rand(rng, 2, hq, sq, 12), rand(rng, 2, hkv, skv, 12), rand(rng, 2, hkv, skv, 7)
    pk = pv = None
    if past:
        pk, pv = rand(rng, 2, hkv, past, 12), rand(rng, 2, hkv, past, 7)
    with sites_taken() as taken:
        res = host_kernel(device, path, requested=(True, True, True, False))(Q, K, V, None, pk, pv, is_causal=causal)
    assert ("Attention.blocks" in taken) == host_path(device, path)
    np.testing.assert_allclose(res.Y.numpy(), naive(Q, K, V, None, pk, pv, causal=causal)[0], rtol=1e-5, atol=1e-5)
    assert res.qk_matmul_output is None
    if past:
        np.testing.assert_array_equal(res.present_key.numpy(), np.concatenate([pk, K], 2))


@pytest.mark.parametrize("causal", [0, 1])
def test_host_3d_strided_q(device, path, rng, small_blocks, sites_taken, causal):
    """3-D inputs: the 4-D views of Q are strided (heads interleaved with positions)."""
    hq, hkv = 4, 2
    Q, K, V = rand(rng, 2, 9, hq * 8), rand(rng, 2, 9, hkv * 8), rand(rng, 2, 9, hkv * 5)
    with sites_taken() as taken:
        res = host_kernel(device, path)(Q, K, V, q_num_heads=hq, kv_num_heads=hkv, is_causal=causal, scale=0.3)
    assert ("Attention.blocks" in taken) == host_path(device, path)
    np.testing.assert_allclose(res.Y.numpy(), naive(Q, K, V, causal=causal, scale=0.3, hq=hq, hkv=hkv)[0],
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("magnitude", ["huge", "very_negative", "mixed"])
@pytest.mark.parametrize("causal", [0, 1])
def test_host_shift_fallback(device, path, rng, small_blocks, sites_taken, magnitude, causal):
    """Scores whose unshifted 2**s overflows or underflows take the shifted softmax."""
    Q, K, V = rand(rng, 1, 2, 11, 8), rand(rng, 1, 2, 11, 8), rand(rng, 1, 2, 11, 4)
    if magnitude == "huge":
        Q = Q * 60  # scores of several hundred: 2**s overflows float32
    elif magnitude == "very_negative":
        K = -np.abs(K)
        Q = np.abs(Q) * 60  # every score far below zero: 2**s underflows to 0
    else:
        Q[:, :, ::2] *= 80  # some rows overflow, some do not
    with sites_taken() as taken:
        got = host_kernel(device, path)(Q, K, V, is_causal=causal).Y.numpy()
    assert ("Attention.blocks" in taken) == host_path(device, path)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, naive(Q, K, V, causal=causal)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("causal", [0, 1])
def test_host_only_failing_blocks_redone(device, path, rng, tuning, shifted_blocks, causal):
    """One block's 2**s overflows: that block alone is redone with the shift, the others
    keep their unshifted sums, and all rows are normalised."""
    tuning({"attention.host_block_bytes": 2 * 4 * 12 * 4,  # 2 heads x 4 rows x 12 keys
            "attention.host_causal_rows": 4})
    Q, K, V = rand(rng, 1, 6, 12, 8), rand(rng, 1, 3, 12, 8), rand(rng, 1, 3, 12, 4)
    Q[0, 3, 4:8] *= 80  # KV head 1, second row block
    got = host_kernel(device, path)(Q, K, V, is_causal=causal).Y.numpy()
    assert len(shifted_blocks) == (1 if host_path(device, path) else 0)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, attention_heads(Q, K, V, causal=causal), rtol=1e-4, atol=1e-5)


def test_host_underflow_and_large_v_blocks(device, path, rng, shifted_blocks, tuning):
    """Row sums that underflow (scores far below 0) and E @ V that overflows (huge V), each
    in its own batch entry: both redone, the rest kept (default block size; few_rows below
    the 7 rows, so that the batches are not folded into one block)."""
    tuning({"attention.few_rows": 4})
    Q, K, V = rand(rng, 3, 2, 7, 4), rand(rng, 3, 2, 7, 4), rand(rng, 3, 2, 7, 3)
    K[0] = -np.abs(K[0])
    Q[0] = np.abs(Q[0]) * 70
    Q[2] *= 3  # 2**s up to about 2**9: E @ V of V ~ 1e36 overflows, the shifted one does not
    V[2] *= np.float32(1e36)
    got = host_kernel(device, path)(Q, K, V).Y.numpy()
    assert len(shifted_blocks) == (2 if host_path(device, path) else 0)
    np.testing.assert_allclose(got, attention_heads(Q, K, V), rtol=1e-4, atol=1e-6)


def test_host_large_v(device, path, rng, sites_taken):
    """E @ V of unnormalised 2**s would overflow for huge V: redone with the shift."""
    Q, K = rand(rng, 1, 1, 6, 4) * 8, rand(rng, 1, 1, 6, 4) * 8
    V = rand(rng, 1, 1, 6, 3) * np.float32(1e30)
    with sites_taken() as taken:
        got = host_kernel(device, path)(Q, K, V).Y.numpy()
    assert ("Attention.blocks" in taken) == host_path(device, path)
    np.testing.assert_allclose(got, naive(Q, K, V)[0], rtol=1e-4)


def test_host_block_option(device, path, rng, sites_taken):
    """The attention_block_bytes option bounds the host path's blocks too."""
    Q, K, V = rand(rng, 2, 4, 21, 8), rand(rng, 2, 2, 21, 8), rand(rng, 2, 2, 21, 5)
    with sites_taken() as taken:
        got = host_kernel(device, path, attention_block_bytes=512)(Q, K, V, is_causal=1).Y.numpy()
    assert ("Attention.blocks" in taken) == host_path(device, path)
    np.testing.assert_allclose(got, naive(Q, K, V, causal=1)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("causal", [0, 1])
def test_host_default_blocks(device, path, rng, sites_taken, causal):
    """Default block sizes with several head and row blocks sharing the score workspace,
    one block (of a middle head, second row block) redone with the shift."""
    Hkv, G, Sq, T = 3, 2, 300, 600
    Q, K, V = rand(rng, 1, Hkv * G, Sq, 16), rand(rng, 1, Hkv, T, 16), rand(rng, 1, Hkv, T, 8)
    Q[0, 2, 250:] *= 60  # KV head 1, rows 250+: 2**s overflows float32
    p = dict(B=1, q_heads=Hkv * G, kv_heads=Hkv, Sq=Sq, T=T, D=16, Dv=8, is_causal=causal, P=0, scale=0.25)
    block_bytes = tuning_table.value("attention.host_block_bytes")
    n, hb = attention_mod._HostAttention(p, np.dtype(np.float32), block_bytes)._blocks()
    assert n < Sq and hb < Hkv  # the case covers several blocks of each kind
    with sites_taken() as taken:
        got = host_kernel(device, path)(Q, K, V, is_causal=causal).Y.numpy()
    assert ("Attention.blocks" in taken) == host_path(device, path)
    np.testing.assert_allclose(got, attention_heads(Q, K, V, causal=causal), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("hq,hkv,sq", [(8, 2, 1), (8, 1, 1), (4, 2, 2), (9, 3, 3)])
@pytest.mark.parametrize("block_bytes", [1 << 20, 600])
def test_host_decode_rows(device, path, rng, tuning, sites_taken, hq, hkv, sq, block_bytes):
    """Few query rows per KV head (K @ q^T) with a past cache, one or several head blocks."""
    tuning({"attention.host_block_bytes": block_bytes})
    P = 13
    Q, K, V = rand(rng, 2, hq, sq, 16), rand(rng, 2, hkv, sq, 16), rand(rng, 2, hkv, sq, 6)
    pk, pv = rand(rng, 2, hkv, P, 16), rand(rng, 2, hkv, P, 6)
    with sites_taken() as taken:
        got = host_kernel(device, path)(Q, K, V, None, pk, pv, is_causal=1).Y.numpy()
    assert ("Attention.blocks" in taken) == host_path(device, path)
    np.testing.assert_allclose(got, attention_heads(Q, K, V, pk, pv, causal=1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float16, 2e-3), (ml_dtypes.bfloat16, 2e-2)])
def test_host_dtypes(device, path, rng, small_blocks, sites_taken, dtype, tol):
    Q, K, V = (rand(rng, 1, 4, 9, 8).astype(dtype) for _ in range(3))
    with sites_taken() as taken:
        res = host_kernel(device, path)(Q, K, V, is_causal=1)
    assert res.Y.numpy().dtype == np.dtype(dtype)
    ref = naive(Q.astype(np.float64), K.astype(np.float64), V.astype(np.float64), causal=1)[0]
    np.testing.assert_allclose(res.Y.numpy().astype(np.float64), ref, rtol=tol, atol=tol)
    if dtype == np.float64:
        assert ("Attention.blocks" in taken) == host_path(device, path)


def test_host_float64_blocks(device, path, rng, tuning, sites_taken):
    tuning({"attention.host_block_bytes": 2000})
    Q, K, V = (rng.standard_normal((2, 4, 10, 6)) for _ in range(3))
    with sites_taken() as taken:
        got = host_kernel(device, path)(Q, K, V, is_causal=1).Y.numpy()
    assert got.dtype == np.float64 and ("Attention.blocks" in taken) == host_path(device, path)
    np.testing.assert_allclose(got, attention_heads(Q, K, V, causal=1), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("rows", ["one", "several"])
def test_host_nan_rows(device, path, rng, sites_taken, rows):
    """A NaN in one query row gives NaN in that row only, as the stable softmax does."""
    if rows == "one":
        Q, K, V = rand(rng, 1, 2, 5, 4), rand(rng, 1, 2, 5, 4), rand(rng, 1, 2, 5, 3)
        h, i = 1, 2
    else:
        Q, K, V = rand(rng, 1, 3, 6, 4), rand(rng, 1, 3, 6, 4), rand(rng, 1, 3, 6, 2)
        h, i = 2, 4
    Q[0, h, i, 1] = np.nan
    with sites_taken() as taken:
        got = host_kernel(device, path)(Q, K, V).Y.numpy()
    assert ("Attention.blocks" in taken) == host_path(device, path)
    assert np.all(np.isnan(got[0, h, i]))
    mask = np.ones(got.shape, bool)
    mask[0, h, i] = False
    np.testing.assert_allclose(got[mask], attention_heads(Q, K, V)[mask], rtol=1e-5, atol=1e-5)


def test_host_matches_general_path(device, rng):
    """The host path (one output wanted) and the general path (qk output wanted) agree."""
    Q, K, V = rand(rng, 2, 4, 37, 16), rand(rng, 2, 2, 37, 16), rand(rng, 2, 2, 37, 16)
    fast = host_kernel(device, "auto")(Q, K, V, is_causal=1).Y.numpy()
    general = Attention(KernelContext(device, 23))(Q, K, V, is_causal=1)
    assert general.qk_matmul_output is not None
    np.testing.assert_allclose(fast, general.Y.numpy(), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("kwargs", [dict(softcap=2.0), dict(softmax_precision=int(10)),
                                    dict(softmax_precision=int(11))])
def test_host_path_not_taken(device, rng, sites_taken, kwargs):
    """softcap and a softmax in another precision stay on the general path."""
    Q, K, V = rand(rng, 1, 2, 4, 8), rand(rng, 1, 2, 4, 8), rand(rng, 1, 2, 4, 8)
    with sites_taken() as taken:
        host_kernel(device, "auto")(Q, K, V, **kwargs)
    assert "Attention.blocks" not in taken


def test_host_path_taken_with_mask(device, rng, sites_taken):
    """attn_mask stays on the host path (on the host; tests/test_transformer_speedups.py
    covers its forms), nonpad_kv_seqlen does not."""
    Q, K, V = rand(rng, 1, 2, 4, 8), rand(rng, 1, 2, 4, 8), rand(rng, 1, 2, 4, 8)
    mask = rng.random((4, 4)) > 0.3
    mask[:, 0] = True
    with sites_taken() as taken:
        got = host_kernel(device, "auto")(Q, K, V, mask).Y.numpy()
    assert ("Attention.blocks" in taken) == host_path(device, "auto")
    np.testing.assert_allclose(got, naive(Q, K, V, mask)[0], rtol=1e-5, atol=1e-5)
    with sites_taken() as taken:
        host_kernel(device, "auto", opset=24)(Q, K, V, nonpad_kv_seqlen=np.array([3], np.int64))
    assert "Attention.blocks" not in taken


def test_host_empty(device, path, rng):
    Q, K, V = rand(rng, 1, 2, 0, 8), rand(rng, 1, 2, 3, 8), rand(rng, 1, 2, 3, 5)
    assert host_kernel(device, path)(Q, K, V).Y.shape == (1, 2, 0, 5)
    Q, K, V = rand(rng, 1, 2, 3, 8), rand(rng, 1, 2, 0, 8), rand(rng, 1, 2, 0, 5)
    y = host_kernel(device, path)(Q, K, V).Y.numpy()
    assert y.shape == (1, 2, 3, 5) and np.all(y == 0)
