"""CausalConvWithState vs a float64 loop reference."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from gpukernels.errors import KernelInputError, KernelTypeError
from gpukernels.kernels import KernelContext
from gpukernels.kernels.nn.causal_conv import CausalConvWithState


def naive(x, w, b=None, past=None, act="none"):
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    B, C, L = x.shape
    k = w.shape[2]
    past = np.zeros((B, C, k - 1)) if past is None else np.asarray(past, np.float64)
    full = np.concatenate([past, x], 2)
    y = np.zeros((B, C, L))
    for bb in range(B):
        for c in range(C):
            for t in range(L):
                acc = 0.0 if b is None else float(b[c])
                for j in range(k):
                    acc += w[c, 0, j] * full[bb, c, t + j]
                y[bb, c, t] = acc / (1 + np.exp(-acc)) if act in ("silu", "swish") else acc
    return y, full[:, :, full.shape[2] - (k - 1):]


@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("L", [1, 2, 9])
@pytest.mark.parametrize("bias,past", [(False, False), (True, True), (True, False), (False, True)])
@pytest.mark.parametrize("act", ["none", "silu", "swish", "SiLU"])
def test_vs_naive(device, rng, k, L, bias, past, act):
    B, C = 2, 3
    x = rng.standard_normal((B, C, L)).astype(np.float32)
    w = rng.standard_normal((C, 1, k)).astype(np.float32)
    b = rng.standard_normal(C).astype(np.float32) if bias else None
    ps = rng.standard_normal((B, C, k - 1)).astype(np.float32) if past else None
    res = CausalConvWithState(KernelContext(device))(x, w, b, ps, activation=act)
    ref_y, ref_s = naive(x, w, b, ps, act.lower())
    np.testing.assert_allclose(res.output.numpy(), ref_y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(res.present_state.numpy(), ref_s, rtol=0, atol=0)
    assert res.present_state.shape == (B, C, k - 1)


def test_streaming_equals_one_shot(device, rng):
    x = rng.standard_normal((1, 4, 12)).astype(np.float32)
    w = rng.standard_normal((4, 1, 3)).astype(np.float32)
    K = CausalConvWithState(KernelContext(device))
    full = K(x, w).output.numpy()
    state, parts = None, []
    for t in range(12):
        r = K(x[:, :, t:t + 1], w, None, state)
        parts.append(r.output.numpy())
        state = r.present_state
    np.testing.assert_allclose(np.concatenate(parts, 2), full, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype,tol", [(np.float16, 3e-3), (ml_dtypes.bfloat16, 2e-2)])
def test_half_types(device, rng, dtype, tol):
    x = rng.standard_normal((2, 3, 7)).astype(dtype)
    w = rng.standard_normal((3, 1, 4)).astype(dtype)
    b = rng.standard_normal(3).astype(dtype)
    res = CausalConvWithState(KernelContext(device))(x, w, b, activation="silu")
    assert res.output.numpy().dtype == np.dtype(dtype)
    ref, st = naive(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64), None, "silu")
    np.testing.assert_allclose(res.output.numpy().astype(np.float64), ref, rtol=tol, atol=tol)
    np.testing.assert_array_equal(res.present_state.numpy().astype(np.float64), st)


def test_inputs_not_modified(device, rng):
    arrs = [rng.standard_normal(s).astype(np.float32) for s in ((1, 2, 5), (2, 1, 3), (2,), (1, 2, 2))]
    copies = [a.copy() for a in arrs]
    CausalConvWithState(KernelContext(device))(*arrs, activation="silu")
    for a, c in zip(arrs, copies):
        np.testing.assert_array_equal(a, c)


def test_bad_inputs(device, rng):
    K = CausalConvWithState(KernelContext(device))
    x = rng.standard_normal((1, 2, 5)).astype(np.float32)
    w = rng.standard_normal((2, 1, 3)).astype(np.float32)
    with pytest.raises(KernelInputError, match="CausalConvWithState.*past_state"):
        K(x, w, None, np.zeros((1, 2, 3), np.float32))
    with pytest.raises(KernelInputError, match="activation"):
        K(x, w, activation="gelu")
    with pytest.raises(KernelInputError, match="weight"):
        K(x, w[:1])
    with pytest.raises(KernelInputError, match="bias"):
        K(x, w, np.zeros(3, np.float32))
    with pytest.raises(KernelInputError, match="3-D"):
        K(x[0], w)
    with pytest.raises(KernelTypeError, match="CausalConvWithState"):
        K(x.astype(np.float64), w)
