"""SkipLayerNormalization, SkipSimplifiedLayerNormalization, SimplifiedLayerNormalization,
LayerNormalization (onnxruntime's opset-1 one) and EmbedLayerNormalization against
onnxruntime on random inputs, and their input checks."""

from __future__ import annotations

import numpy as np
import pytest

from gpukernels.errors import GpuKernelsError, KernelInputError, KernelTypeError
from gpukernels.kernels import KernelContext, load_all
from gpukernels.kernels.contrib.normalization import (EmbedLayerNormalization, SimplifiedLayerNormalization,
                                                      SkipLayerNormalization, SkipSimplifiedLayerNormalization)

from tests.ort_reference import compare, run_gk, single_node_model

load_all()


def f32(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def tol(dtype):
    return dict(rtol=2e-3, atol=2e-3) if dtype == np.float16 else dict(rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------ SkipLayerNormalization


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["float32", "float16"])
@pytest.mark.parametrize("skip_shape", ["full", "1SH", "SH"])
@pytest.mark.parametrize("with_beta_bias", [True, False])
def test_skip_layer_norm_vs_ort(device, rng, dtype, skip_shape, with_beta_bias):
    B, S, H = 2, 5, 32
    x = f32(rng, B, S, H, scale=2.0).astype(dtype) + dtype(1)
    skip = {"full": f32(rng, B, S, H), "1SH": f32(rng, 1, S, H), "SH": f32(rng, S, H)}[skip_shape].astype(dtype)
    g, b, bias = (f32(rng, H).astype(dtype) for _ in range(3))
    inputs = [("x", x), ("skip", skip), ("gamma", g), ("beta", b if with_beta_bias else None),
              ("bias", bias if with_beta_bias else None)]
    compare("SkipLayerNormalization", inputs, {"epsilon": 1e-5}, n_outputs=4, device=device, **tol(dtype))


def test_skip_layer_norm_2d_and_default_epsilon(device, rng):
    x, skip = f32(rng, 7, 16), f32(rng, 7, 16)
    g = f32(rng, 16)
    compare("SkipLayerNormalization", [("x", x), ("skip", skip), ("gamma", g)], n_outputs=1, device=device)


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["float32", "float16"])
def test_skip_simplified_layer_norm_vs_ort(device, rng, dtype):
    B, S, H = 2, 4, 24
    x, skip = f32(rng, B, S, H).astype(dtype), f32(rng, B, S, H).astype(dtype)
    g, bias = f32(rng, H).astype(dtype), f32(rng, H).astype(dtype)
    # output 1 (mean) is not defined for an RMS norm: ours is zeros, onnxruntime leaves it
    compare("SkipSimplifiedLayerNormalization", [("x", x), ("skip", skip), ("gamma", g), ("bias", bias)],
            {"epsilon": 1e-6}, n_outputs=4, device=device, skip_outputs=(1,), **tol(dtype))
    compare("SkipSimplifiedLayerNormalization", [("x", x[0]), ("skip", skip[0]), ("gamma", g)],
            n_outputs=1, device=device, **tol(dtype))


def test_skip_norm_direct_call_outputs(device, rng):
    x, skip, g = f32(rng, 2, 3, 8), f32(rng, 2, 3, 8), f32(rng, 8)
    r = SkipSimplifiedLayerNormalization(KernelContext(device))(x, skip, g)
    assert r.mean.shape == (2, 3, 1) and not r.mean.numpy().any()
    s = (x + skip).astype(np.float64)
    inv = 1 / np.sqrt((s * s).mean(-1, keepdims=True) + 1e-12)
    np.testing.assert_allclose(r.inv_std_var.numpy(), inv, rtol=1e-5)
    np.testing.assert_allclose(r.output.numpy(), s * inv * g, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(r.input_skip_bias_sum.numpy(), x + skip)


def test_skip_norm_errors(device, rng):
    k = SkipLayerNormalization(KernelContext(device))
    x, g = f32(rng, 2, 3, 8), f32(rng, 8)
    with pytest.raises(KernelInputError, match="SkipLayerNormalization: skip must"):
        k(x, f32(rng, 2, 3, 4), g)
    with pytest.raises(KernelInputError, match="SkipLayerNormalization: skip must"):
        k(x, f32(rng, 8), g)
    with pytest.raises(KernelInputError, match="'gamma' must be 1-D of size 8"):
        k(x, x, f32(rng, 4))
    with pytest.raises(KernelInputError, match="'beta' must be 1-D"):
        k(x, x, g, f32(rng, 2, 8))
    with pytest.raises(KernelInputError, match="rank"):
        k(f32(rng, 8), f32(rng, 8), g)
    with pytest.raises(KernelTypeError, match="one element type"):
        k(x, x.astype(np.float16), g)
    with pytest.raises(KernelTypeError, match="element type"):
        k(x.astype(np.float64), x.astype(np.float64), g.astype(np.float64))
    with pytest.raises(KernelInputError, match="unknown attribute"):
        k(x, x, g, epsilon=1e-5, axis=1)
    with pytest.raises(KernelInputError, match="at most 5 inputs"):
        k(x, x, g, g, g, g)


def test_skip_norm_unknown_attribute_in_a_model(rng):
    x, g = f32(rng, 2, 3, 8), f32(rng, 8)
    model = single_node_model("SkipLayerNormalization", [("x", x), ("s", x), ("g", g)],
                              {"epsilon": 1e-5, "bogus": 3})
    with pytest.raises(GpuKernelsError, match="unknown attribute.*bogus"):
        run_gk(model, {"x": x, "s": x, "g": g})


# ------------------------------------------------- SimplifiedLayerNormalization ('' domain)


@pytest.mark.parametrize("xtype,stype", [(np.float32, np.float32), (np.float16, np.float16),
                                         (np.float16, np.float32)], ids=["f32", "f16", "f16-f32"])
def test_simplified_layer_norm_vs_ort(device, rng, xtype, stype):
    x = f32(rng, 2, 3, 40, scale=3.0).astype(xtype)
    g = f32(rng, 40).astype(stype)
    compare("SimplifiedLayerNormalization", [("x", x), ("g", g)], {"epsilon": 1e-6}, n_outputs=2, device=device,
            domain="", **tol(np.float16 if np.float16 in (xtype, stype) else np.float32))


def test_simplified_layer_norm_axis(device, rng):
    x, g = f32(rng, 2, 3, 8), f32(rng, 3, 8)
    got, want = compare("SimplifiedLayerNormalization", [("x", x), ("g", g)], {"axis": 1}, n_outputs=2,
                        device=device, domain="")
    assert got[1].shape == (2, 1, 1)


def test_simplified_layer_norm_errors(device, rng):
    k = SimplifiedLayerNormalization(KernelContext(device))
    with pytest.raises(KernelInputError, match="axis 3 is out of range"):
        k(f32(rng, 2, 3, 8), f32(rng, 8), axis=3)
    with pytest.raises(KernelInputError, match="stash_type"):
        k(f32(rng, 2, 3, 8), f32(rng, 8), stash_type=10)
    with pytest.raises(KernelTypeError, match="element type"):
        k(np.ones((2, 3), np.int32), f32(rng, 3))


# ---------------------------------------------------------- LayerNormalization opset 1


@pytest.mark.parametrize("xtype,stype", [(np.float32, np.float32), (np.float16, np.float16),
                                         (np.float16, np.float32)], ids=["f32", "f16", "f16-f32"])
def test_layer_norm_opset1_vs_ort(device, rng, xtype, stype):
    x = (f32(rng, 2, 5, 24, scale=2.0) + 1).astype(xtype)
    g, b = f32(rng, 24).astype(stype), f32(rng, 24).astype(stype)
    compare("LayerNormalization", [("x", x), ("g", g), ("b", b)], {"epsilon": 1e-5}, n_outputs=3, device=device,
            domain="", opset=13, **tol(np.float16 if np.float16 in (xtype, stype) else np.float32))


def test_layer_norm_opset1_chosen_below_17_only():
    from gpukernels.kernels.base import lookup
    from gpukernels.kernels.contrib.normalization import LayerNormalization as Contrib
    from gpukernels.kernels.nn.norm import LayerNormalization as Onnx

    assert lookup("LayerNormalization", "", 13) == (Contrib, 1)
    assert lookup("LayerNormalization", "", 17) == (Onnx, 17)
    assert lookup("LayerNormalization", "", None) == (Onnx, 17)


# ------------------------------------------------------------- EmbedLayerNormalization


def _embed_inputs(rng, B=2, S=5, H=16, V=30, P=12, segments=True, dtype=np.float32):
    ids = rng.integers(0, V, (B, S)).astype(np.int32)
    seg = rng.integers(0, 2, (B, S)).astype(np.int32)
    mask = (rng.random((B, S)) > 0.3).astype(np.int32)
    tables = [f32(rng, V, H).astype(dtype), f32(rng, P, H).astype(dtype), f32(rng, 2, H).astype(dtype),
              f32(rng, H).astype(dtype), f32(rng, H).astype(dtype)]
    return [("ids", ids), ("seg", seg if segments else None), ("we", tables[0]), ("pe", tables[1]),
            ("se", tables[2] if segments else None), ("g", tables[3]), ("b", tables[4]), ("mask", mask)]


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["float32", "float16"])
@pytest.mark.parametrize("segments", [True, False])
def test_embed_layer_norm_vs_ort(device, rng, dtype, segments):
    inputs = _embed_inputs(rng, segments=segments, dtype=dtype)
    compare("EmbedLayerNormalization", inputs, {"epsilon": 1e-5}, n_outputs=3, device=device, **tol(dtype))
    compare("EmbedLayerNormalization", inputs[:7], n_outputs=2, device=device, **tol(dtype))  # no mask: zeros


def test_embed_layer_norm_position_ids(device, rng):
    inputs = _embed_inputs(rng)
    pid = rng.integers(0, 12, (2, 5)).astype(np.int32)
    compare("EmbedLayerNormalization", inputs + [("pid", pid)], n_outputs=3, device=device)
    k = EmbedLayerNormalization(KernelContext(device))
    args = [a for _, a in inputs]
    full = k(*args, np.repeat(pid[:1], 2, axis=0)).output.numpy()
    np.testing.assert_array_equal(k(*args, pid[:1]).output.numpy(), full)


def test_embed_layer_norm_errors(device, rng):
    k = EmbedLayerNormalization(KernelContext(device))
    args = [a for _, a in _embed_inputs(rng)]
    bad = list(args)
    bad[0] = args[0].copy()
    bad[0][1, 2] = 30
    with pytest.raises(KernelInputError, match=r"input_ids must index a table of 30 rows, got values in \[\d+, 30\]"):
        k(*bad)
    bad = list(args)
    bad[3] = args[3][:3]
    with pytest.raises(KernelInputError, match="the sequence length must index a table of 3 rows"):
        k(*bad)
    bad = list(args)
    bad[1] = args[1][:, :2]
    with pytest.raises(KernelInputError, match="segment_ids must have input_ids' shape"):
        k(*bad)
    bad = list(args)
    bad[4] = None
    with pytest.raises(KernelInputError, match="given together"):
        k(*bad)
    bad = list(args)
    bad[0] = args[0].astype(np.int64)
    with pytest.raises(KernelTypeError, match="input_ids"):
        k(*bad)
