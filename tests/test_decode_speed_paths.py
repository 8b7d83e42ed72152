"""Decoding-step host paths (issue 15, gpt2_kv exports): a few rows times a large weight
(one gemv per row), the planned Attention host path, Softmax's row check and
MatMulInteger's kept weights.  Each against an independent float64 reference on random
inputs, through the kernels."""

from __future__ import annotations

import numpy as np
import pytest

from gpukernels.kernels import KernelContext
from gpukernels.kernels.math.matmul import Gemm, MatMul


def _rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _rows(rng, *shape):
    """Rows of A scaled by 1/sqrt(K): products of order 1, so that atol 1e-5 is a float32
    bound for every K."""
    return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)


@pytest.fixture
def shifted_blocks(monkeypatch):
    """Counts the Attention host path's blocks redone with the max shift."""
    from gpukernels.kernels.nn import attention as attention_mod

    counts = []
    shifted = attention_mod._HostAttention._shifted_block

    def counted(self, *args):
        counts.append(1)
        return shifted(self, *args)

    monkeypatch.setattr(attention_mod._HostAttention, "_shifted_block", counted)
    return counts


@pytest.mark.parametrize("k,n", [(256, 2000), (257, 1801), (1000, 1000), (3, 153601)])
@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("lead", [(2, 1), (1,), (4,), (3, 1)])
def test_few_rows_large_weight(rng, k, n, order, lead):
    """A C-ordered weight and an F-ordered one (a transposed view); rows 1-4, batch axes
    kept."""
    a = _rows(rng, *lead, k)
    b = _rand(rng, k, n) if order == "C" else _rand(rng, n, k).T
    got = MatMul(KernelContext("cpu", 13))(a, b).numpy()
    want = a.astype(np.float64) @ b.astype(np.float64)
    assert got.shape == lead + (n,) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows,k,n,gemv", [(1, 256, 768, True), (2, 256, 768, False), (4, 1024, 256, False),
                                            (2, 256, 2048, True), (4, 768, 2304, True), (5, 768, 2304, False)])
def test_few_rows_take_gemv_only_for_large_weights(rng, rows, k, n, gemv):
    """One row always takes the per-row gemv; 2-4 rows only with a B of
    matmul.host_vector_min_bytes or more (a smaller one is packed once by the GEMM)."""
    from gpukernels.kernels import specialize

    a, b = _rows(rng, rows, k), _rand(rng, k, n)
    with specialize.recording() as chosen:
        got = MatMul(KernelContext("cpu", 13))(a, b).numpy()
    assert ("_vector_rows_host" in {s.name for s in chosen}) == gemv
    np.testing.assert_allclose(got, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-5, atol=1e-5)


def test_strided_weight(rng):
    """A weight neither C- nor F-contiguous (every other column)."""
    a, b = _rows(rng, 2, 256), _rand(rng, 256, 4000)[:, ::2]
    got = MatMul(KernelContext("cpu", 13))(a, b).numpy()
    np.testing.assert_allclose(got, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-5, atol=1e-5)


def test_gemm_few_rows(rng):
    """Gemm (transB, alpha, beta and C) on a few-row product; float64 too."""
    for dt, tol in ((np.float32, 1e-5), (np.float64, 1e-12)):
        a, b, c = _rows(rng, 2, 256).astype(dt), _rand(rng, 2000, 256).astype(dt), _rand(rng, 2000).astype(dt)
        got = Gemm(KernelContext("cpu", 13))(a, b, c, alpha=0.5, beta=2.0, transB=1).numpy()
        want = 0.5 * (a.astype(np.float64) @ b.astype(np.float64).T) + 2.0 * c
        assert got.dtype == dt
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


# ------------------------------------------------------------------ Attention's planned host path


def _attention_cases():
    """(name, Q, K, V, mask or None, attributes) of the host cases array_function plans."""
    return [
        ("decode", (2, 4, 1, 64), (2, 4, 33, 64), (2, 4, 33, 64), ("float", (2, 1, 1, 33)), {"scale": 0.125}),
        ("decode-bool-per-head", (2, 4, 1, 16), (2, 4, 9, 16), (2, 4, 9, 8), ("bool", (2, 4, 1, 9)), {}),
        ("decode-grouped", (3, 4, 1, 8), (3, 2, 7, 8), (3, 2, 7, 5), ("bool", (1, 1, 1, 5)), {}),
        ("decode-no-mask", (2, 2, 1, 8), (2, 2, 6, 8), (2, 2, 6, 8), None, {}),
        ("prefill-causal", (2, 4, 9, 8), (2, 2, 9, 8), (2, 2, 9, 3), None, {"is_causal": 1}),
        ("prefill-mask-rows", (1, 2, 5, 8), (1, 2, 5, 8), (1, 2, 5, 8), ("float", (5, 5)), {}),
        ("3d", (2, 1, 32), (2, 6, 16), (2, 6, 12), ("bool", (2, 1, 1, 6)), {"q_num_heads": 4, "kv_num_heads": 2}),
    ]


def _mask(rng, spec):
    if spec is None:
        return None
    kind, shape = spec
    if kind == "bool":
        m = rng.random(shape) > 0.3
        m[..., 0] = True
        return m
    return (rng.standard_normal(shape) * 2).astype(np.float32)


@pytest.mark.parametrize("case", [c[0] for c in _attention_cases()])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_attention_planned_host(rng, case, dtype):
    """array_function plans the host blocks once (attention_y_host): Y equal to the
    kernel's, and to the float64 reference, over three calls with new values."""
    from gpukernels.kernels.nn.attention import Attention
    from gpukernels.tensor import Tensor
    from tests.reference import attention as naive

    _, qs, ks, vs, mspec, attrs = next(c for c in _attention_cases() if c[0] == case)
    for trial in range(3):
        Q, K, V = (_rand(rng, *s).astype(dtype) for s in (qs, ks, vs))
        mask = _mask(rng, mspec)
        args = [Q, K, V] + ([] if mask is None else [mask])
        kernel = Attention(KernelContext("cpu", 23))
        kernel.requested_outputs = (True,)
        fn = kernel.array_function([Tensor(a) for a in args], dict(attrs))
        assert fn.__name__ == "attention_y_host"
        got = fn(*args)
        want = kernel(*args, **attrs).Y.numpy()
        assert got.dtype == dtype
        np.testing.assert_array_equal(got, want)
        ref = naive(Q, K, V, mask, causal=attrs.get("is_causal", 0), hq=attrs.get("q_num_heads"),
                    hkv=attrs.get("kv_num_heads"), scale=attrs.get("scale"))[0]
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("why", ["float16", "mixed", "softcap", "reference", "cache"])
def test_attention_not_planned(rng, why):
    """Half types, a float/double mix, a softcap, paths='reference' and a cache keep the
    general array function."""
    from gpukernels.kernels.nn.attention import Attention
    from gpukernels.tensor import Tensor

    Q, K, V = _rand(rng, 2, 2, 1, 8), _rand(rng, 2, 2, 4, 8), _rand(rng, 2, 2, 4, 8)
    args, attrs, options = [Q, K, V], {}, {}
    if why == "float16":
        args = [a.astype(np.float16) for a in args]
    elif why == "mixed":
        args[2] = V.astype(np.float64)
    elif why == "softcap":
        attrs = {"softcap": 3.0}
    elif why == "reference":
        options = {"paths": "reference"}
    else:
        args += [np.ones((2, 1, 1, 7), bool), _rand(rng, 2, 2, 3, 8), _rand(rng, 2, 2, 3, 8)]
    kernel = Attention(KernelContext("cpu", 23, options=options))
    kernel.requested_outputs = (True,)
    fn = kernel.array_function([Tensor(a) for a in args], attrs)
    assert fn.__name__ == "attention_y"
    np.testing.assert_array_equal(fn(*args), kernel(*args, **attrs).Y.numpy())


@pytest.mark.parametrize("hq,hkv,mshape", [(4, 4, (3, 4, 1, 9)), (4, 2, (3, 1, 1, 9)), (4, 4, None)])
def test_attention_folded_shifted_and_dead_rows(rng, shifted_blocks, hq, hkv, mshape):
    """A folded decoding step (batches merged into the heads, the bias added to the
    (B, Hq, n, T) view of the scores) whose unshifted sums overflow (one batch's query
    scaled up) or whose rows the mask hides entirely: the shifted redo, zero rows where
    the mask hides every key, the rest as the float64 reference."""
    from gpukernels.kernels import specialize
    from gpukernels.kernels.nn.attention import Attention
    from tests.reference import attention as naive

    Q, K, V = _rand(rng, 3, hq, 1, 8), _rand(rng, 3, hkv, 9, 8), _rand(rng, 3, hkv, 9, 8)
    Q[1] *= 60  # exp of the unshifted scores overflows in batch 1
    mask = None
    if mshape is not None:
        mask = rng.random(mshape) > 0.3
        mask[..., 0] = True
        mask[2, 0] = False  # batch 2: every key hidden (from head 0, or all heads)
    args = [Q, K, V] + ([] if mask is None else [mask])
    kernel = Attention(KernelContext("cpu", 23))
    kernel.requested_outputs = (True, True, True, False)
    with specialize.recording() as chosen:
        got = kernel(*args).Y.numpy()
    assert any("_host_attention" in str(s) for s in chosen)
    assert len(shifted_blocks) == 1  # the one folded block, redone
    ref = naive(Q, K, V, mask)[0]
    if mask is not None:
        dead = ~mask.any(axis=-1)  # (3, 1|Hq, 1)
        assert np.all(np.broadcast_to(dead[..., None], got.shape) <= (got == 0))
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------ Softmax rows on the host


@pytest.mark.parametrize("kinds", [("plain",), ("plain", "large", "negative", "nan", "ninf"), ("large",)])
def test_softmax_rows_redo_check(rng, kinds):
    """The host's test for rows that need the shifted form (the sums' min and max first,
    the rows only when one is out of range): the same bits as the GPU form, which redoes
    every row, and the float64 softmax on the finite rows."""
    from gpukernels.kernels.math.softmax import row_ones, softmax_rows

    rows = []
    for kind in kinds * 3:
        r = rng.standard_normal(33)
        r = {"plain": r, "large": r * 40 + 60, "negative": r - 120, "nan": np.where(r > 1, np.nan, r),
             "ninf": np.full(33, -np.inf)}[kind]
        rows.append(r)
    x = np.asarray(rows, dtype=np.float32)
    ones = row_ones(np, 33, np.float32)
    host, gpu = np.empty_like(x), np.empty_like(x)
    with np.errstate(all="ignore"):
        softmax_rows(np, x, host, ones, wait=True)
        softmax_rows(np, x, gpu, ones, wait=False)
        x64 = x.astype(np.float64)
        want = np.exp(x64 - x64.max(axis=1, keepdims=True))
        want /= want.sum(axis=1, keepdims=True)
    np.testing.assert_array_equal(host, gpu)
    finite = np.isfinite(x).all(axis=1)
    np.testing.assert_allclose(host[finite], want[finite], rtol=1e-5, atol=1e-7)
    assert not ones.flags.writeable and row_ones(np, 33, np.float32) is ones


# --------------------------------------------------- MatMulInteger with constant weights

def _frozen(array):
    array = np.array(array)
    array.flags.writeable = False
    return array


@pytest.mark.parametrize("rows", [1, 2, 7])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("b_zero", ["absent", "scalar", "per_column"])
@pytest.mark.parametrize("k", [200, 300])  # float32 sums (K * 255**2 < 2**24), float64
def test_matmul_integer_kept_weight(rng, rows, dtype, b_zero, k):
    """A frozen B (a constant) is converted once per node and reused while the same
    arrays come back; another B or zero point of the same shape is converted again.
    Every result is the exact integer product (an int64 reference)."""
    from gpukernels.kernels.math.matmul_integer import MatMulInteger

    info = np.iinfo(dtype)
    kernel = MatMulInteger(KernelContext(), 10)
    n = 40
    a_zero = np.array(3, dtype)

    def operand(*shape):
        return rng.integers(info.min, info.max + 1, shape).astype(dtype)

    def zero_point():
        if b_zero == "absent":
            return None
        return _frozen(operand(*(() if b_zero == "scalar" else (n,))))

    def expected(a, b, bz):
        shift_b = 0 if bz is None else bz.astype(np.int64)
        return (a.astype(np.int64) - a_zero) @ (b.astype(np.int64) - shift_b)

    b1, z1 = _frozen(operand(k, n)), zero_point()
    b2, z2 = _frozen(operand(k, n)), zero_point()
    for b, bz in ((b1, z1), (b1, z1), (b2, z2), (b1, z1), (b1, z2 if z2 is not None else None)):
        a = operand(rows, k)
        args = (a, b, a_zero) + (() if bz is None else (bz,))
        got = kernel(*args).numpy()
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, expected(a, b, bz))
    assert kernel._kept_b[0] is b1  # the last frozen weight is the one kept

    writable = operand(k, n)  # a fed (writable) weight is never kept
    a = operand(rows, k)
    np.testing.assert_array_equal(kernel(a, writable, a_zero).numpy(), expected(a, writable, None))
    writable[...] = operand(k, n)
    np.testing.assert_array_equal(kernel(a, writable, a_zero).numpy(), expected(a, writable, None))
