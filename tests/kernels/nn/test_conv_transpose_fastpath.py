"""ConvTranspose host phase (sub-pixel) path against a float64 tap-by-tap reference."""

import numpy as np
import pytest

from gpukernels.kernels.base import KernelContext
from gpukernels.kernels.nn import conv_transpose as ct
from gpukernels.kernels.nn.conv_transpose import ConvTranspose


def reference(x, w, b, group, strides, dilations, pads, out_shape):
    """Full transposed convolution in float64 (one strided add per tap and group), then
    the window [pads_begin, pads_begin + out) of it, zeros beyond the full result."""
    x = x.astype(np.float64)
    w = w.astype(np.float64)
    n_sp = x.ndim - 2
    N, C = x.shape[:2]
    Mg = w.shape[1]
    Cg = C // group
    K, S = w.shape[2:], x.shape[2:]
    full = [strides[i] * (S[i] - 1) + (K[i] - 1) * dilations[i] + 1 for i in range(n_sp)]
    size = [max(full[i], pads[i] + out_shape[i]) for i in range(n_sp)]
    y = np.zeros((N, Mg * group) + tuple(size))
    for g in range(group):
        xs = x[:, g * Cg:(g + 1) * Cg]
        for tap in np.ndindex(*K):
            contrib = np.einsum("nc...,cm->nm...", xs, w[g * Cg:(g + 1) * Cg, :, *tap])
            sl = tuple(slice(tap[i] * dilations[i], tap[i] * dilations[i] + strides[i] * (S[i] - 1) + 1,
                             strides[i]) for i in range(n_sp))
            y[(slice(None), slice(g * Mg, (g + 1) * Mg)) + sl] += contrib
    y = y[(slice(None), slice(None)) + tuple(slice(pads[i], pads[i] + out_shape[i]) for i in range(n_sp))]
    if b is not None:
        y = y + b.reshape((1, -1) + (1,) * n_sp)
    return y


def out_size(S, K, strides, dilations, pads, out_pad):
    n = len(S)
    return [strides[i] * (S[i] - 1) + out_pad[i] + (K[i] - 1) * dilations[i] + 1 - pads[i] - pads[i + n]
            for i in range(n)]


# (x shape, C -> M, kernel, group, strides, dilations, pads, output_padding)
CASES_2D = [
    ((1, 64, 28, 28), 32, (4, 4), 1, (2, 2), (1, 1), (1, 1, 1, 1), (0, 0)),  # the benchmark shape
    ((2, 6, 7, 5), 4, (3, 3), 1, (2, 2), (1, 1), (0, 0, 0, 0), (1, 1)),
    ((2, 6, 7, 5), 6, (3, 2), 2, (3, 1), (1, 2), (2, 0, 1, 1), (2, 0)),
    ((1, 3, 5, 9), 5, (2, 3), 1, (1, 3), (2, 1), (0, 2, 1, 0), (1, 2)),
    ((3, 4, 6, 6), 8, (5, 5), 4, (2, 3), (2, 2), (3, 1, 0, 4), (1, 0)),
    ((1, 2, 1, 1), 3, (4, 3), 1, (3, 2), (1, 1), (0, 0, 0, 0), (0, 1)),
    ((2, 5, 4, 3), 2, (1, 1), 1, (2, 3), (1, 1), (0, 1, 0, 0), (1, 2)),  # phases without taps
    ((1, 4, 6, 7), 4, (3, 3), 1, (1, 1), (3, 2), (1, 2, 2, 1), (0, 0)),  # stride 1, dilated
    ((1, 4, 5, 6), 6, (4, 2), 2, (2, 2), (3, 3), (4, 0, 0, 3), (2, 1)),  # dilation > stride
    ((2, 3, 8, 1), 2, (3, 1), 1, (2, 1), (1, 1), (1, 0, 1, 0), (0, 0)),  # width 1
]


def run_case(device, rng, xs, M, K, group, strides, dilations, pads, out_pad, bias, transposed=False):
    C = xs[1]
    x = rng.standard_normal(xs).astype(np.float32)
    if transposed:  # a non-contiguous input (the kernel never sees a copy made by the test)
        x = np.ascontiguousarray(x.swapaxes(-1, -2)).swapaxes(-1, -2)
    w = rng.standard_normal((C, M // group) + tuple(K)).astype(np.float32)
    b = rng.standard_normal(M).astype(np.float32) if bias else None
    y = ConvTranspose(KernelContext(device))(x, w, b, group=group, strides=list(strides),
                                             dilations=list(dilations), pads=list(pads),
                                             output_padding=list(out_pad)).numpy()
    out = out_size(xs[2:], K, strides, dilations, pads, out_pad)
    n = len(K)
    # output_padding only adds positions at the end: the reference window covers them
    want = reference(x, w, b, group, strides, dilations, list(pads[:n]), out)
    assert y.shape == want.shape
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4 * np.sqrt(C * np.prod(K)))


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("case", CASES_2D)
def test_phase_path_2d(device, rng, case, bias):
    run_case(device, rng, *case, bias=bias)


@pytest.mark.parametrize("case", CASES_2D[:5])
def test_phase_path_non_contiguous(device, rng, case):
    run_case(device, rng, *case, bias=True, transposed=True)


@pytest.mark.parametrize("case", [
    ((2, 6, 11), 4, (3,), 1, (2,), (1,), (1, 0), (1,)),
    ((1, 4, 7), 8, (4,), 2, (3,), (2,), (0, 3), (2,)),
    ((3, 5, 1), 5, (2,), 1, (1,), (1,), (0, 0), (0,)),
])
@pytest.mark.parametrize("bias", [True, False])
def test_phase_path_1d(device, rng, case, bias):
    run_case(device, rng, *case, bias=bias)


@pytest.mark.parametrize("case", CASES_2D + [((2, 6, 11), 4, (3,), 1, (2,), (1,), (1, 0), (1,))])
def test_phase_forward_direct(rng, case):
    """The host function itself, also on shapes where the cost rule would pick the old path,
    and float64 inputs."""
    xs, M, K, group, strides, dilations, pads, out_pad = case
    x = rng.standard_normal(xs)
    w = rng.standard_normal((xs[1], M // group) + tuple(K))
    b = rng.standard_normal(M)
    out = out_size(xs[2:], K, strides, dilations, pads, out_pad)
    y = ct._host_phase_forward(x, w, b, group, list(strides), list(dilations), list(pads), out)
    want = reference(x, w, b, group, strides, dilations, list(pads[:len(K)]), out)
    np.testing.assert_allclose(y, want, rtol=1e-10, atol=1e-10)


def test_phase_path_chosen_for_benchmark_shape():
    x = np.zeros((1, 64, 28, 28), np.float32)
    w = np.zeros((64, 32, 4, 4), np.float32)
    assert ct._phase_applies(x, w, None, 1, [2, 2], [1, 1], [1, 1, 1, 1], [56, 56])
    assert not ct._phase_applies(x.astype(np.float16), w, None, 1, [2, 2], [1, 1], [1, 1, 1, 1], [56, 56])


def test_phase_path_row_chunks(device, rng, monkeypatch):
    """Images larger than the host budget run in row blocks."""
    monkeypatch.setattr(ct.sp, "chunk_target", lambda xp: 4096)
    run_case(device, rng, (2, 5, 13, 9), 6, (3, 4), 1, (2, 3), (1, 1), (1, 2, 0, 1), (1, 2), bias=True)
    run_case(device, rng, (3, 4, 6, 6), 8, (5, 5), 4, (2, 3), (2, 2), (3, 1, 0, 4), (1, 0), bias=False)


@pytest.mark.parametrize("mode", ["SAME_UPPER", "SAME_LOWER"])
def test_phase_path_output_shape(device, rng, mode):
    """output_shape, including one larger than the full result (bias only beyond it)."""
    x = rng.standard_normal((2, 4, 5, 6)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 4)).astype(np.float32)
    b = rng.standard_normal(3).astype(np.float32)
    k = ConvTranspose(KernelContext(device))
    for out in ([10, 13], [9, 11], [14, 16]):
        y = k(x, w, b, strides=[2, 2], output_shape=out, auto_pad=mode).numpy()
        full = [2 * 4 + 3, 2 * 5 + 4]
        pads = []
        for i in range(2):
            total = max(0, full[i] - out[i])
            pads.append(total // 2 if mode == "SAME_UPPER" else total - total // 2)
        want = reference(x, w, b, 1, [2, 2], [1, 1], pads, out)
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)


def test_phase_path_empty_batch(device):
    x = np.zeros((0, 4, 5, 5), np.float32)
    w = np.ones((4, 2, 3, 3), np.float32)
    y = ConvTranspose(KernelContext(device))(x, w, strides=[2, 2]).numpy()
    assert y.shape == (0, 2, 11, 11)
