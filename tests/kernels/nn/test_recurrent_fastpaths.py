"""LSTM host fast paths against a float64 per-entry reference.

The sizes here are large enough for the host's blocked step product (4H * H * N above
2**18 multiply-adds) and, with 16+ steps, for the input projection computed chunk by chunk
in single-threaded products: by a helper thread alongside a one-direction recurrence, or
by each direction of a bidirectional layer, the two running in two threads.  Also: row
padding of the blocked product, partial last chunks, sequence lengths, the fused
sigmoid/tanh gate path and the general one, one host thread, and errors raised inside the
recurrence or the helper."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from gpukernels.kernels import KernelContext
from gpukernels.kernels.nn import recurrent
from gpukernels.kernels.nn.recurrent import LSTM

# these tests check the host specialisations themselves
pytestmark = pytest.mark.usefixtures("default_paths")


def _sig(x):
    return 1 / (1 + np.exp(-x))


def reference(X, W, R, B=None, h0=None, c0=None, P=None, *, direction="forward", layout=0, clip=None,
              input_forget=0, acts=(_sig, np.tanh, np.tanh)):
    """Y, Y_h, Y_c of a one-layer LSTM, each batch entry and direction on its own, float64."""
    X = np.asarray(X, np.float64)
    if layout:
        X = X.transpose(1, 0, 2)
        h0 = None if h0 is None else h0.transpose(1, 0, 2)
        c0 = None if c0 is None else c0.transpose(1, 0, 2)
    S, N, _ = X.shape
    D, G, H = R.shape[0], R.shape[1], R.shape[2]
    f, g, hf = acts
    cl = (lambda v: np.clip(v, -clip, clip)) if clip else (lambda v: v)
    Y, Yh, Yc = np.zeros((S, D, N, H)), np.zeros((D, N, H)), np.zeros((D, N, H))
    for d in range(D):
        rev = direction == "reverse" or d == 1
        Wd, Rd = W[d].astype(np.float64), R[d].astype(np.float64)
        bias = np.zeros(G) if B is None else B[d, :G].astype(np.float64) + B[d, G:].astype(np.float64)
        p = np.zeros(3 * H) if P is None else P[d].astype(np.float64)
        for n in range(N):
            h = np.zeros(H) if h0 is None else h0[d, n].astype(np.float64)
            c = np.zeros(H) if c0 is None else c0[d, n].astype(np.float64)
            for t in (range(S - 1, -1, -1) if rev else range(S)):
                a = Wd @ X[t, n] + Rd @ h + bias
                i = f(cl(a[:H] + p[:H] * c))
                fg = 1 - i if input_forget else f(cl(a[2 * H:3 * H] + p[2 * H:] * c))
                c = fg * c + i * g(cl(a[3 * H:]))
                o = f(cl(a[H:2 * H] + p[H:2 * H] * c))
                h = o * hf(c)
                Y[t, d, n] = h
            Yh[d, n], Yc[d, n] = h, c
    if layout:
        return Y.transpose(2, 0, 1, 3), Yh.transpose(1, 0, 2), Yc.transpose(1, 0, 2)
    return Y, Yh, Yc


def make(rng, S, N, I, H, D, layout=0, dtype=np.float32, bias=True, states=True, peep=False):
    X = rng.standard_normal((S, N, I) if layout == 0 else (N, S, I)).astype(dtype)
    W = (rng.standard_normal((D, 4 * H, I)) * 0.3).astype(dtype)
    R = (rng.standard_normal((D, 4 * H, H)) * 0.3).astype(dtype)
    B = (rng.standard_normal((D, 8 * H)) * 0.3).astype(dtype) if bias else None
    st = (D, N, H) if layout == 0 else (N, D, H)
    h0 = rng.standard_normal(st).astype(dtype) if states else None
    c0 = rng.standard_normal(st).astype(dtype) if states else None
    P = (rng.standard_normal((D, 3 * H)) * 0.3).astype(dtype) if peep else None
    return X, W, R, B, h0, c0, P


def check(res, ref, tol):
    np.testing.assert_allclose(res.Y.numpy(), ref[0], rtol=tol, atol=tol)
    np.testing.assert_allclose(res.Y_h.numpy(), ref[1], rtol=tol, atol=tol)
    np.testing.assert_allclose(res.Y_c.numpy(), ref[2], rtol=tol, atol=tol)


HID = 96  # with a batch of 32: a blocked step product


def test_sizes_reach_the_fast_paths():
    # keep the sizes below in step with the kernel's thresholds
    assert recurrent._StepProduct(np, np.zeros((4 * HID, HID), np.float32), 32).blocks is not None
    p = recurrent._StepProduct(np, np.zeros((4 * 67, 67), np.float32), 64)
    nb, rows = p.blocks
    assert nb * rows > 4 * 67  # padded
    assert recurrent._StepProduct(np, np.zeros((4 * 200, 200), np.float32), 4).blocks is not None
    assert recurrent._StepProduct(np, np.zeros((4 * 8, 8), np.float32), 4).blocks is None
    assert recurrent._ChunkedProjection.steps_per_chunk(32) <= 8
    assert recurrent._ChunkedProjection.steps_per_chunk(4) <= 16


@pytest.mark.parametrize("direction", ["forward", "reverse"])
@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("S", [16, 21])
def test_chunked_projection(device, rng, direction, layout, S, monkeypatch):
    used = []
    original = recurrent._ChunkedProjection.produce
    monkeypatch.setattr(recurrent._ChunkedProjection, "produce", lambda self: used.append(1) or original(self))
    X, W, R, B, h0, c0, _ = make(rng, S, 32, 24, HID, 1, layout)
    res = LSTM(KernelContext(device))(X, W, R, B, None, h0, c0, direction=direction, hidden_size=HID,
                                      layout=layout)
    check(res, reference(X, W, R, B, h0, c0, direction=direction, layout=layout), 2e-5)
    assert used == ([1] if device == "cpu" else [])


def test_padded_blocks_no_bias_no_states(device, rng):
    X, W, R, _, _, _, _ = make(rng, 17, 64, 9, 67, 1, bias=False, states=False)
    res = LSTM(KernelContext(device))(X, W, R, hidden_size=67)
    check(res, reference(X, W, R), 2e-5)


@pytest.mark.parametrize("layout", [0, 1])
def test_bidirectional_threads(device, rng, layout):
    X, W, R, B, h0, c0, _ = make(rng, 18, 32, 16, HID, 2, layout)
    res = LSTM(KernelContext(device))(X, W, R, B, None, h0, c0, direction="bidirectional", hidden_size=HID,
                                      layout=layout)
    check(res, reference(X, W, R, B, h0, c0, direction="bidirectional", layout=layout), 2e-5)


def test_bidirectional_lengths(device, rng):
    X, W, R, B, h0, c0, _ = make(rng, 16, 32, 8, HID, 2)
    lens = rng.integers(0, 17, 32).astype(np.int32)
    lens[0] = 16
    res = LSTM(KernelContext(device))(X, W, R, B, lens, h0, c0, direction="bidirectional", hidden_size=HID)
    Y, Yh, Yc = res.Y.numpy(), res.Y_h.numpy(), res.Y_c.numpy()
    for n in range(32):
        L = int(lens[n])
        ref = reference(X[:L, n:n + 1], W, R, B, h0[:, n:n + 1], c0[:, n:n + 1], direction="bidirectional")
        np.testing.assert_allclose(Y[:L, :, n:n + 1], ref[0], rtol=2e-5, atol=2e-5)
        assert np.all(Y[L:, :, n] == 0)
        np.testing.assert_allclose(Yh[:, n:n + 1], ref[1] if L else h0[:, n:n + 1], rtol=2e-5, atol=2e-5)
        np.testing.assert_allclose(Yc[:, n:n + 1], ref[2] if L else c0[:, n:n + 1], rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("direction", ["forward", "reverse"])
def test_lengths_one_direction(device, rng, direction):
    N = 32
    X, W, R, B, h0, c0, _ = make(rng, 17, N, 8, HID, 1)
    lens = rng.integers(0, 18, N).astype(np.int32)
    lens[0] = 17
    res = LSTM(KernelContext(device))(X, W, R, B, lens, h0, c0, direction=direction, hidden_size=HID)
    Y, Yh, Yc = res.Y.numpy(), res.Y_h.numpy(), res.Y_c.numpy()
    for n in range(N):
        L = int(lens[n])
        ref = reference(X[:L, n:n + 1], W, R, B, h0[:, n:n + 1], c0[:, n:n + 1], direction=direction)
        np.testing.assert_allclose(Y[:L, :, n:n + 1], ref[0], rtol=2e-5, atol=2e-5)
        assert np.all(Y[L:, :, n] == 0)
        np.testing.assert_allclose(Yh[:, n:n + 1], ref[1] if L else h0[:, n:n + 1], rtol=2e-5, atol=2e-5)
        np.testing.assert_allclose(Yc[:, n:n + 1], ref[2] if L else c0[:, n:n + 1], rtol=2e-5, atol=2e-5)


def test_general_gates_chunked(device, rng):
    """clip, peepholes and input_forget take the general gate path on the fast layout."""
    X, W, R, B, h0, c0, P = make(rng, 16, 32, 8, HID, 1, peep=True)
    res = LSTM(KernelContext(device))(X, W, R, B, None, h0, c0, P, clip=1.5, input_forget=1, hidden_size=HID)
    check(res, reference(X, W, R, B, h0, c0, P, clip=1.5, input_forget=1), 2e-5)


def test_other_activations_chunked(device, rng):
    X, W, R, B, h0, c0, _ = make(rng, 16, 32, 8, HID, 1)
    res = LSTM(KernelContext(device))(X, W, R, B, None, h0, c0, activations=["HardSigmoid", "Tanh", "Softsign"],
                                      hidden_size=HID)

    def hs(x):
        return np.clip(0.2 * x + 0.5, 0, 1)

    ref = reference(X, W, R, B, h0, c0, acts=(hs, np.tanh, lambda x: x / (1 + np.abs(x))))
    check(res, ref, 2e-5)


def test_float64_and_optional_outputs(device, rng):
    X, W, R, B, h0, c0, _ = make(rng, 16, 32, 8, HID, 1, dtype=np.float64)
    ref = reference(X, W, R, B, h0, c0)
    K = LSTM(KernelContext(device))
    check(K(X, W, R, B, None, h0, c0, hidden_size=HID), ref, 1e-12)
    K.requested_outputs = [False, True, True]
    res = K(X, W, R, B, None, h0, c0, hidden_size=HID)
    assert res.Y is None
    np.testing.assert_allclose(res.Y_h.numpy(), ref[1], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(res.Y_c.numpy(), ref[2], rtol=1e-12, atol=1e-12)


def test_float16(device, rng):
    X, W, R, B, h0, c0, _ = make(rng, 16, 32, 8, HID, 1, dtype=np.float16)
    res = LSTM(KernelContext(device))(X, W, R, B, None, h0, c0, hidden_size=HID)
    assert res.Y.numpy().dtype == np.float16
    check(res, reference(X, W, R, B, h0, c0), 3e-3)


def test_inputs_not_modified(device, rng):
    X, W, R, B, h0, c0, _ = make(rng, 16, 32, 8, HID, 2)
    copies = [a.copy() for a in (X, W, R, B, h0, c0)]
    LSTM(KernelContext(device))(X, W, R, B, None, h0, c0, direction="bidirectional", hidden_size=HID)
    for a, b in zip((X, W, R, B, h0, c0), copies):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("N,H", [(32, HID), (4, 200)])
def test_one_host_thread(rng, monkeypatch, N, H):  # (4, 200): a blocked product too
    monkeypatch.setenv("GPUKERNELS_CPU_THREADS", "1")
    X, W, R, B, h0, c0, _ = make(rng, 40, N, 8, H, 1)
    res = LSTM(KernelContext("cpu"))(X, W, R, B, None, h0, c0, direction="reverse", hidden_size=H)
    check(res, reference(X, W, R, B, h0, c0, direction="reverse"), 2e-5)


@pytest.mark.parametrize("N,H", [(32, HID), (4, 200)])
def test_error_in_recurrence_stops_the_helper(rng, monkeypatch, N, H):
    """An exception in the recurrence propagates (no hang) and the helper thread ends."""
    X, W, R, B, h0, c0, _ = make(rng, 40, N, 8, H, 1)
    calls = {"n": 0}
    original = recurrent._LSTMDirection._cell_fn

    def failing(self, *args):
        cell = original(self, *args)

        def wrapped(out):
            calls["n"] += 1
            if calls["n"] == 12:
                raise FloatingPointError("boom")
            cell(out)

        return wrapped

    monkeypatch.setattr(recurrent._LSTMDirection, "_cell_fn", failing)
    result = {}

    def target():
        try:
            LSTM(KernelContext("cpu"))(X, W, R, B, None, h0, c0, hidden_size=H)
        except FloatingPointError as e:
            result["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive()
    assert "error" in result


def test_helper_failure_is_recovered(rng, monkeypatch):
    """A projection chunk that fails in the helper thread is computed by the recurrence."""
    X, W, R, B, h0, c0, _ = make(rng, 32, 4, 8, 200, 1)
    original = recurrent._ChunkedProjection._project
    main = threading.get_ident()

    def flaky(self, k):
        if threading.get_ident() != main:
            raise MemoryError("helper")
        return original(self, k)

    monkeypatch.setattr(recurrent._ChunkedProjection, "_project", flaky)
    result = {}

    def target():
        nonlocal main
        main = threading.get_ident()
        result["res"] = LSTM(KernelContext("cpu"))(X, W, R, B, None, h0, c0, hidden_size=200)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive()
    check(result["res"], reference(X, W, R, B, h0, c0), 2e-5)


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_zero_steps(device, rng, direction):
    D = 2 if direction == "bidirectional" else 1
    X, W, R, B, h0, c0, _ = make(rng, 0, 32, 8, HID, D)
    res = LSTM(KernelContext(device))(X, W, R, B, None, h0, c0, direction=direction, hidden_size=HID)
    assert res.Y.shape == (0, D, 32, HID)
    np.testing.assert_array_equal(res.Y_h.numpy(), h0)
    np.testing.assert_array_equal(res.Y_c.numpy(), c0)
