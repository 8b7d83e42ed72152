"""ai.onnx.preview.training Adagrad, Adam, Momentum against float64 references."""

from __future__ import annotations

import numpy as np
import pytest

from gpukernels.errors import KernelInputError, KernelTypeError
from gpukernels.kernels import KernelContext
from gpukernels.kernels.training.optimizers import Adagrad, Adam, Momentum


def K(cls, device):
    return cls(KernelContext(device))


def _tensors(rng, shapes, dtype, k):
    return [[rng.standard_normal(s).astype(dtype) for s in shapes] for _ in range(k)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("t", [0, 3])
def test_adagrad(device, rng, dtype, t):
    shapes = [(3, 4), (5,), ()]
    xs, gs, hs = _tensors(rng, shapes, dtype, 3)
    hs = [np.abs(h) for h in hs]
    out = K(Adagrad, device)(np.float32(0.1), np.int64(t), *xs, *gs, *hs, decay_factor=0.2, epsilon=1e-5,
                             norm_coefficient=0.01)
    assert len(out) == 6
    for i, (x, g, h) in enumerate(zip(xs, gs, hs)):
        x64, g64, h64 = (a.astype(np.float64) for a in (x, g, h))
        greg = 0.01 * x64 + g64
        hn = h64 + greg * greg
        xn = x64 - np.float64(np.float32(0.1)) / (1 + t * 0.2) * greg / (np.sqrt(hn) + 1e-5)
        assert out[i].numpy().dtype == dtype and out[i].numpy().shape == x.shape
        tol = 1e-6 if dtype == np.float32 else 1e-12
        np.testing.assert_allclose(out[i].numpy(), xn, rtol=tol, atol=tol)
        np.testing.assert_allclose(out[3 + i].numpy(), hn, rtol=tol, atol=tol)


@pytest.mark.parametrize("mode", ["standard", "nesterov"])
@pytest.mark.parametrize("t", [0, 2])
def test_momentum(device, rng, mode, t):
    xs, gs, vs = _tensors(rng, [(2, 3), (4,)], np.float32, 3)
    out = K(Momentum, device)(np.float64(0.05), np.int64(t), *xs, *gs, *vs, alpha=0.9, beta=0.5, mode=mode,
                              norm_coefficient=0.1)
    a, b, nc, r = 0.9, 0.5, 0.1, 0.05
    for i, (x, g, v) in enumerate(zip(xs, gs, vs)):
        x64, g64, v64 = (q.astype(np.float64) for q in (x, g, v))
        greg = nc * x64 + g64
        vn = a * v64 + (b if t > 0 else 1.0) * greg
        xn = x64 - r * vn if mode == "standard" else x64 - r * (greg + a * vn)
        np.testing.assert_allclose(out[i].numpy(), xn, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(out[2 + i].numpy(), vn, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("t", [0, 5])
def test_adam(device, rng, t):
    xs, gs, vs, hs = _tensors(rng, [(3,), (2, 2)], np.float64, 4)
    hs = [np.abs(h) for h in hs]
    out = K(Adam, device)(np.float64(0.01), np.int64(t), *xs, *gs, *vs, *hs, alpha=0.8, beta=0.95,
                          epsilon=1e-4, norm_coefficient=0.02, norm_coefficient_post=0.05)
    a, b, eps, nc, ncp = 0.8, 0.95, 1e-4, 0.02, 0.05
    for i, (x, g, v, h) in enumerate(zip(xs, gs, vs, hs)):
        greg = nc * x + g
        vn = a * v + (1 - a) * greg
        hn = b * h + (1 - b) * greg * greg
        r = 0.01 * np.sqrt(1 - b ** t) / (1 - a ** t) if t > 0 else 0.01
        xn = (1 - ncp) * (x - r * vn / (np.sqrt(hn) + eps))
        np.testing.assert_allclose(out[i].numpy(), xn, rtol=1e-12)
        np.testing.assert_allclose(out[2 + i].numpy(), vn, rtol=1e-12)
        np.testing.assert_allclose(out[4 + i].numpy(), hn, rtol=1e-12)


def test_broadcast_gradient(device, rng):
    x = rng.standard_normal((2, 3)).astype(np.float32)
    g = np.float32(0.5)
    v = rng.standard_normal((1, 3)).astype(np.float32)
    out = K(Momentum, device)(0.1, np.int64(1), x, g, v, alpha=0.9, beta=1.0, mode="standard", norm_coefficient=0.0)
    vn = 0.9 * v.astype(np.float64) + 0.5
    np.testing.assert_allclose(out[0].numpy(), x - 0.1 * vn, rtol=1e-6)
    assert out[1].numpy().shape == (2, 3)


def test_optimizer_errors(device, rng):
    x = np.ones((2, 2), np.float32)
    with pytest.raises(KernelInputError, match="Adagrad.*3 \\* n"):
        K(Adagrad, device)(0.1, np.int64(0), x, x)
    with pytest.raises(KernelInputError, match="Adam.*does not broadcast"):
        K(Adam, device)(0.1, np.int64(0), x, np.ones((3,), np.float32), x, x)
    with pytest.raises(KernelInputError, match="Momentum.*mode"):
        K(Momentum, device)(0.1, np.int64(0), x, x, x, alpha=0.9, beta=0.1, mode="adam", norm_coefficient=0.0)
    with pytest.raises(KernelInputError, match="Momentum.*required"):
        K(Momentum, device)(0.1, np.int64(0), x, x, x)
    with pytest.raises(KernelTypeError, match="Adagrad"):
        K(Adagrad, device)(0.1, np.int32(0), x, x, x)
    with pytest.raises(KernelTypeError, match="Adagrad"):
        K(Adagrad, device)(0.1, np.int64(0), x.astype(np.float16), x.astype(np.float16), x.astype(np.float16))
    with pytest.raises(KernelInputError, match="Adam.*R must"):
        K(Adam, device)(np.ones(2, np.float32), np.int64(0), x, x, x, x)
