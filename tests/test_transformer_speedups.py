"""Host paths of the transformer exports' hot operators (issue 15): each against an
independent float64 reference on random inputs and against the reference path
(paths='reference'), with the edge cases the models do not reach."""

from __future__ import annotations

import numpy as np
import pytest

from gpukernels.kernels import KernelContext, specialize
from gpukernels.kernels.nn.attention import Attention
from tests.reference import attention as naive

_NO_QK = (True, True, True, False)  # a node that does not declare qk_matmul_output


def _attention(paths, opset=23):
    k = Attention(KernelContext("cpu", opset, options={"paths": paths}))
    k.requested_outputs = _NO_QK
    return k


def _rand(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _run_both(args, **attrs):
    """Y through the host path (which must be chosen) and through the reference path."""
    with specialize.recording() as chosen:
        fast = _attention("auto")(*args, **attrs).Y.numpy()
    assert any("_host_attention" in str(s) for s in chosen), chosen
    ref = _attention("reference")(*args, **attrs).Y.numpy()
    return fast, ref


# ------------------------------------------------------------------ Attention with attn_mask on the host


@pytest.mark.parametrize("mshape", [(2, 1, 9, 13), (1, 1, 1, 13), (9, 13), (2, 4, 9, 13), (13,), (2, 1, 1, 10),
                                    (9, 1)])
@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("causal", [0, 1])
def test_host_attention_masks(rng, mshape, kind, causal):
    """bool and float masks of every broadcast form (per batch, per head, per query row,
    short masks padded with -inf), with and without the causal frontier, grouped heads."""
    Q, K, V = _rand(rng, 2, 4, 9, 16), _rand(rng, 2, 2, 13, 16), _rand(rng, 2, 2, 13, 8)
    if kind == "bool":
        mask = rng.random(mshape) > 0.3
        mask[..., 0] = True  # every row sees a key (dead rows: test_host_attention_dead_rows)
    else:
        mask = _rand(rng, *mshape, scale=2.0)
    fast, ref = _run_both([Q, K, V, mask], is_causal=causal)
    want = naive(Q, K, V, mask, causal=causal)[0]
    np.testing.assert_allclose(fast, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(fast.astype(np.float64), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("T", [1, 40])
def test_host_attention_mask_decoding(rng, T):
    """One query row per head (the K @ q^T path) with a cache and a bool key mask."""
    Q, K, V = _rand(rng, 3, 4, 1, 8), _rand(rng, 3, 4, 1, 8), _rand(rng, 3, 4, 1, 8)
    pk, pv = _rand(rng, 3, 4, T - 1, 8), _rand(rng, 3, 4, T - 1, 8)
    mask = rng.random((3, 1, 1, T)) > 0.4
    mask[:, :, :, -1] = True
    with specialize.recording() as chosen:
        fast = _attention("auto")(Q, K, V, mask, pk, pv).Y.numpy()
    assert any("_host_attention" in str(s) for s in chosen)
    ref = _attention("reference")(Q, K, V, mask, pk, pv).Y.numpy()
    np.testing.assert_allclose(fast, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(fast, naive(Q, K, V, mask, pk, pv)[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("hq,hkv,mshape", [(4, 4, (3, 4, 1, 21)), (4, 2, (3, 1, 1, 21)), (6, 2, (1, 6, 2, 21)),
                                          (4, 1, None)])
def test_host_attention_folded_batches(rng, hq, hkv, mshape):
    """Decoding steps (a few query rows, several batches) run as one block with the batches
    folded into the heads: per-batch and per-head masks, grouped heads, the causal
    frontier after a cache."""
    Sq = 2 if mshape is not None and mshape[2] == 2 else 1
    Q, K, V = _rand(rng, 3, hq, Sq, 8), _rand(rng, 3, hkv, Sq, 8), _rand(rng, 3, hkv, Sq, 8)
    pk, pv = _rand(rng, 3, hkv, 21 - Sq, 8), _rand(rng, 3, hkv, 21 - Sq, 8)
    mask = None
    if mshape is not None:
        mask = rng.random(mshape) > 0.4
        mask[..., 0] = True
    args = [Q, K, V, mask, pk, pv]
    with specialize.recording() as chosen:
        fast = _attention("auto")(*args, is_causal=1).Y.numpy()
    assert any("_host_attention" in str(s) for s in chosen)
    ref = _attention("reference")(*args, is_causal=1).Y.numpy()
    np.testing.assert_allclose(fast, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(fast, naive(Q, K, V, mask, pk, pv, causal=1)[0], rtol=1e-4, atol=1e-5)


def test_host_attention_dead_rows(rng):
    """Rows the mask (or the mask with the causal frontier) hides entirely are zero rows,
    as on the reference path; the other rows are unchanged by them."""
    Q, K, V = _rand(rng, 1, 2, 5, 8), _rand(rng, 1, 2, 7, 8), _rand(rng, 1, 2, 7, 8)
    mask = np.ones((5, 7), bool)
    mask[1] = False
    mask[3, :4] = False  # with the causal frontier (row 3 sees keys 0..3): nothing left
    fmask = np.where(mask, np.float32(0.5), np.float32(-np.inf))
    for m in (mask, fmask):
        fast, ref = _run_both([Q, K, V, m], is_causal=1)
        assert np.all(np.isfinite(fast))
        assert np.all(fast[:, :, [1, 3]] == 0)
        np.testing.assert_allclose(fast, ref, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(fast, naive(Q, K, V, m, causal=1)[0], rtol=1e-4, atol=1e-5)


def test_host_attention_huge_mask_values(rng):
    """Masks as HF writes them (finfo.min for hidden keys) and large scores: base-2 scaling
    overflows to -inf, the shifted blocks take over; the result is the softmax's."""
    Q, K, V = _rand(rng, 2, 2, 6, 8, scale=6.0), _rand(rng, 2, 2, 6, 8, scale=6.0), _rand(rng, 2, 2, 6, 8)
    mask = np.zeros((2, 1, 6, 6), np.float32)
    mask[0, :, :, 4:] = np.finfo(np.float32).min
    mask[1, :, 2:, :1] = -1e30
    fast, ref = _run_both([Q, K, V, mask])
    np.testing.assert_allclose(fast, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(fast, naive(Q, K, V, mask)[0], rtol=1e-4, atol=1e-4)


def test_host_attention_mask_float64_and_nan(rng):
    """float64 inputs compute in float64; a NaN in a float mask gives NaN rows on both paths."""
    Q, K, V = (rng.standard_normal((1, 2, 4, 8)) for _ in range(3))
    mask = rng.standard_normal((4, 4))
    fast, ref = _run_both([Q, K, V, mask])
    assert fast.dtype == np.float64
    np.testing.assert_allclose(fast, naive(Q, K, V, mask)[0], rtol=1e-10, atol=1e-12)
    mask[2, 1] = np.nan
    fast, ref = _run_both([Q.astype(np.float32), K.astype(np.float32), V.astype(np.float32),
                           mask.astype(np.float32)])
    assert np.isnan(fast[:, :, 2]).all() and np.isnan(ref[:, :, 2]).all()
    assert np.isfinite(fast[:, :, [0, 1, 3]]).all()


# ------------------------------------------------------------------ Attention in compiled graphs


def _attention_model(inputs, attrs):
    from onnx import TensorProto, helper

    node = helper.make_node("Attention", [name for name, _ in inputs], ["Y"], **attrs)
    elem = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE,
            np.dtype(bool): TensorProto.BOOL}
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, elem[a.dtype], list(a.shape))
                                            for n, a in inputs],
                              [helper.make_tensor_value_info("Y", elem[inputs[0][1].dtype], None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])


@pytest.mark.parametrize("case", ["plain", "mask", "cache", "3d", "float64"])
def test_attention_array_function_in_compiled_graph(rng, case):
    """A one-output Attention node runs as an array function in a compiled graph (no
    kernel call), with the same Y as the kernel, on later runs with new values too."""
    from gpukernels.runtime import Session

    attrs = {"is_causal": 1} if case == "cache" else {}
    Q, K, V = _rand(rng, 2, 4, 5, 8), _rand(rng, 2, 2, 5, 8), _rand(rng, 2, 2, 5, 6)
    feeds = [("Q", Q), ("K", K), ("V", V)]
    if case in ("mask", "cache"):
        feeds.append(("mask", rng.random((2, 1, 5, 9 if case == "cache" else 5)) > 0.3))
        feeds[-1][1][..., 0] = True
    if case == "cache":
        feeds += [("pk", _rand(rng, 2, 2, 4, 8)), ("pv", _rand(rng, 2, 2, 4, 6))]
    if case == "3d":
        feeds = [("Q", _rand(rng, 2, 5, 32)), ("K", _rand(rng, 2, 5, 16)), ("V", _rand(rng, 2, 5, 12))]
        attrs = {"q_num_heads": 4, "kv_num_heads": 2}
    if case == "float64":
        feeds = [(n, a.astype(np.float64)) for n, a in feeds]
    sess = Session(_attention_model(feeds, attrs), device="cpu")
    for trial in range(3):
        values = {n: a for n, a in feeds}
        got = sess.run(None, values)[0]
        kernel = Attention(KernelContext("cpu", 23))
        kernel.requested_outputs = (True,)
        args = [values["Q"], values["K"], values["V"]] + [values[n] for n in ("mask", "pk", "pv") if n in values]
        want = kernel(*args, **attrs).Y.numpy()
        np.testing.assert_array_equal(got, want)
        ref = naive(*args[:3], values.get("mask"), values.get("pk"), values.get("pv"),
                    causal=attrs.get("is_causal", 0), hq=attrs.get("q_num_heads"), hkv=attrs.get("kv_num_heads"))[0]
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
        feeds = [(n, (a + rng.standard_normal(a.shape).astype(a.dtype)) if a.dtype != bool else a)
                 for n, a in feeds]
    progs = [p for p in sess._compiled.programs.values() if p is not None]
    assert progs and all(op[0] != 0 for op in progs[0].ops), "Attention ran as a kernel call"


# ------------------------------------------------------------------ Split's array function


@pytest.mark.parametrize("shape,axis,sizes,dtype", [
    ((2, 1, 768), -1, [256, 256, 256], np.float32),   # gpt2's c_attn split
    ((3, 5, 7), 1, [2, 0, 3], np.float64),            # an empty part
    ((4, 6), 0, [1, 3], np.float16),
    ((6, 2, 3), -3, None, np.int64),                  # num_outputs
    ((0, 4), 1, [1, 3], np.float32),                  # empty input
])
def test_split_array_function(rng, shape, axis, sizes, dtype):
    """The array function returns C-contiguous parts equal to np.split's, for later
    inputs of the same shape too, and raises on other split values (the runtime then
    redoes the node through the kernel)."""
    from gpukernels import Tensor
    from gpukernels.kernels.base import lookup

    kernel = lookup("Split", "", 18)[0](KernelContext("cpu", 18))
    x = (rng.standard_normal(shape) * 10).astype(dtype)
    attrs = {"axis": axis}
    inputs = [Tensor(x)]
    if sizes is None:
        attrs["num_outputs"] = 3
        cuts = [shape[axis] // 3 * i for i in (1, 2)]
    else:
        inputs.append(Tensor(np.array(sizes, np.int64)))
        cuts = np.cumsum(sizes)[:-1]
    fn = kernel.array_function(inputs, attrs)
    for _ in range(2):
        extra = [inputs[1].array] if sizes is not None else []
        got = fn(x, *extra)
        want = np.split(x, cuts, axis=axis)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.flags.c_contiguous
            np.testing.assert_array_equal(g, w)
        direct = kernel(*inputs, **attrs)
        for g, t in zip(got, direct):
            np.testing.assert_array_equal(g, t.numpy())
        x = (rng.standard_normal(shape) * 10).astype(dtype)
        inputs[0] = Tensor(x)
    if sizes is not None and len(sizes) > 1:
        with pytest.raises(ValueError, match="Split"):
            fn(x, np.array(sizes[::-1], np.int64) if sizes[::-1] != sizes else np.array([0] * len(sizes)))


@pytest.mark.parametrize("hq,hkv,sq,masked", [(4, 4, 9, True), (4, 2, 9, False), (4, 4, 1, True), (6, 2, 1, False)])
def test_host_attention_strided_views(rng, hq, hkv, sq, masked):
    """Q, K, V as the exporters pass them: (B, H, S, D) transposed views of (B, S, H, D)
    projections (read in place), and views with a non-unit last stride or negative
    strides (copied); prefill and folded decoding."""
    def view(h, s, d):
        return _rand(rng, 2, s, h, d).transpose(0, 2, 1, 3)

    T = 11
    cases = [(view(hq, sq, 8), view(hkv, T, 8), view(hkv, T, 6)),
             (_rand(rng, 2, hq, sq, 16)[..., ::2], _rand(rng, 2, hkv, T, 16)[..., ::2],
              _rand(rng, 2, hkv, T, 6)[:, :, ::-1])]
    mask = None
    if masked:
        mask = rng.random((2, 1, sq, T)) > 0.3
        mask[..., 0] = True
    for Q, K, V in cases:
        assert not K.flags.c_contiguous
        fast, ref = _run_both([Q, K, V] + ([mask] if masked else []))
        want = naive(Q, K, V, mask)[0]
        np.testing.assert_allclose(fast, ref, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(fast, want, rtol=1e-4, atol=1e-5)
