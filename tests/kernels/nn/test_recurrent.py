"""RNN, GRU and LSTM vs the float64 reference of tests/reference (each batch entry on its
own), and LSTM's host path on both paths: sizes large enough for the blocked step
product (4H * H * N above 2**18 multiply-adds) and, with 16+ steps, for the input
projection computed chunk by chunk in single-threaded products (_ChunkedProjection: by a
helper thread alongside a one-direction recurrence, or by each direction of a
bidirectional layer in two threads; step-major chunks with the bias added, the first
ones ramping up 1, 2, 3, 4, 6, ... steps).  Also: row padding of the blocked product,
partial last chunks, sequence lengths, the fused sigmoid/tanh gate path and the general
one, one host thread, and errors raised inside the recurrence or the helper."""

from __future__ import annotations

import threading

import ml_dtypes
import numpy as np
import pytest

from gpukernels.errors import KernelInputError, KernelTypeError
from gpukernels.kernels import KernelContext
from gpukernels.kernels.nn import _lstm_host, recurrent
from gpukernels.kernels.nn.recurrent import GRU, LSTM, RNN
from tests.reference import recurrent as naive


def weights(rng, kind, D, I, H, bias=True, peep=False):
    G = {"rnn": 1, "gru": 3, "lstm": 4}[kind]
    W = (rng.standard_normal((D, G * H, I)) * 0.5).astype(np.float32)
    R = (rng.standard_normal((D, G * H, H)) * 0.5).astype(np.float32)
    B = (rng.standard_normal((D, 2 * G * H)) * 0.5).astype(np.float32) if bias else None
    P = (rng.standard_normal((D, 3 * H)) * 0.5).astype(np.float32) if peep else None
    return W, R, B, P


CLASSES = {"rnn": RNN, "gru": GRU, "lstm": LSTM}


def call(device, kind, X, W, R, B=None, lens=None, h0=None, c0=None, P=None, opset=None, **attrs):
    K = CLASSES[kind](KernelContext(device, opset))
    if kind == "lstm":
        return K(X, W, R, B, lens, h0, c0, P, **attrs)
    return K(X, W, R, B, lens, h0, **attrs)


def compare(res, ref, kind, tol=1e-5):
    np.testing.assert_allclose(res.Y.numpy(), ref[0], rtol=tol, atol=tol)
    np.testing.assert_allclose(res.Y_h.numpy(), ref[1], rtol=tol, atol=tol)
    if kind == "lstm":
        np.testing.assert_allclose(res.Y_c.numpy(), ref[2], rtol=tol, atol=tol)


@pytest.mark.parametrize("kind", ["rnn", "gru", "lstm"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("with_lens", [False, True])
@pytest.mark.parametrize("layout", [0, 1])
def test_directions_lengths_layouts(device, rng, kind, direction, with_lens, layout):
    S, N, I, H = 6, 4, 3, 5
    D = 2 if direction == "bidirectional" else 1
    X = rng.standard_normal((S, N, I) if layout == 0 else (N, S, I)).astype(np.float32)
    W, R, B, P = weights(rng, kind, D, I, H, peep=kind == "lstm")
    lens = np.array([6, 3, 1, 0], np.int32) if with_lens else None
    st = (D, N, H) if layout == 0 else (N, D, H)
    h0 = rng.standard_normal(st).astype(np.float32)
    c0 = rng.standard_normal(st).astype(np.float32) if kind == "lstm" else None
    res = call(device, kind, X, W, R, B, lens, h0, c0, P, direction=direction, hidden_size=H, layout=layout)
    ref = naive(kind, X, W, R, B, lens, h0, c0, P, direction=direction, layout=layout)
    compare(res, ref, kind)
    if with_lens:  # outputs past a sequence's end are zero
        Y = res.Y.numpy() if layout == 0 else res.Y.numpy().transpose(1, 2, 0, 3)
        assert np.all(Y[3:, :, 1] == 0) and np.all(Y[:, :, 3] == 0)


@pytest.mark.parametrize("kind", ["rnn", "gru", "lstm"])
@pytest.mark.parametrize("act", ["Relu", "Tanh", "Sigmoid", "Affine", "LeakyRelu", "ThresholdedRelu", "ScaledTanh",
                                 "HardSigmoid", "Elu", "Softsign", "Softplus"])
def test_every_activation(device, rng, kind, act):
    S, N, I, H = 4, 2, 3, 4
    per = {"rnn": 1, "gru": 2, "lstm": 3}[kind]
    default = {"rnn": ["Tanh"], "gru": ["Sigmoid", "Tanh"], "lstm": ["Sigmoid", "Tanh", "Tanh"]}[kind]
    # put the activation under test in each slot of the backward direction; forward keeps defaults
    for slot in range(per):
        names = default + [act if i == slot else default[i] for i in range(per)]
        alphas, betas = [0.7, 0.3], [0.4, 0.2]
        X = rng.standard_normal((S, N, I)).astype(np.float32)
        W, R, B, P = weights(rng, kind, 2, I, H)
        res = call(device, kind, X, W, R, B, direction="bidirectional", activations=names, activation_alpha=alphas,
                   activation_beta=betas, hidden_size=H)
        ref = naive(kind, X, W, R, B, direction="bidirectional", acts=names, alphas=alphas, betas=betas)
        compare(res, ref, kind)


@pytest.mark.parametrize("kind", ["rnn", "gru", "lstm"])
def test_default_alpha_beta(device, rng, kind):
    per = {"rnn": 1, "gru": 2, "lstm": 3}[kind]
    names = ["HardSigmoid", "LeakyRelu", "Elu"][:per]
    X = rng.standard_normal((3, 2, 3)).astype(np.float32)
    W, R, B, P = weights(rng, kind, 1, 3, 4)
    res = call(device, kind, X, W, R, B, activations=names)
    compare(res, naive(kind, X, W, R, B, acts=names), kind)


@pytest.mark.parametrize("kind", ["rnn", "gru", "lstm"])
def test_clip(device, rng, kind):
    X = (rng.standard_normal((5, 3, 4)) * 4).astype(np.float32)
    W, R, B, P = weights(rng, kind, 1, 4, 3, peep=kind == "lstm")
    res = call(device, kind, X, W, R, B, P=P, clip=0.4)
    compare(res, naive(kind, X, W, R, B, P=P, clip=0.4), kind)


@pytest.mark.parametrize("lbr", [0, 1])
def test_gru_linear_before_reset(device, rng, lbr):
    X = rng.standard_normal((5, 3, 4)).astype(np.float32)
    W, R, B, _ = weights(rng, "gru", 2, 4, 3)
    lens = np.array([5, 2, 4], np.int32)
    res = call(device, "gru", X, W, R, B, lens, direction="bidirectional", linear_before_reset=lbr)
    compare(res, naive("gru", X, W, R, B, lens, direction="bidirectional", lbr=lbr), "gru")


def test_lstm_input_forget_and_peepholes(device, rng):
    X = rng.standard_normal((5, 3, 4)).astype(np.float32)
    W, R, B, P = weights(rng, "lstm", 2, 4, 3, peep=True)
    lens = np.array([5, 2, 4], np.int32)
    res = call(device, "lstm", X, W, R, B, lens, P=P, direction="bidirectional", input_forget=1)
    compare(res, naive("lstm", X, W, R, B, lens, P=P, direction="bidirectional", input_forget=1), "lstm")


@pytest.mark.parametrize("kind", ["rnn", "gru", "lstm"])
@pytest.mark.parametrize("dtype,tol", [(np.float16, 3e-3), (ml_dtypes.bfloat16, 3e-2), (np.float64, 1e-12)])
def test_dtypes(device, rng, kind, dtype, tol):
    X = rng.standard_normal((4, 2, 3)).astype(dtype)
    W, R, B, P = (a.astype(dtype) if a is not None else None for a in weights(rng, kind, 2, 3, 4))
    opset = 22 if dtype == ml_dtypes.bfloat16 else None
    res = call(device, kind, X, W, R, B, direction="bidirectional", opset=opset)
    assert res.Y.numpy().dtype == np.dtype(dtype)
    ref = naive(kind, X.astype(np.float64), W.astype(np.float64), R.astype(np.float64), B.astype(np.float64),
                direction="bidirectional")
    compare(res, ref, kind, tol)


@pytest.mark.parametrize("kind", ["rnn", "gru", "lstm"])
def test_optional_outputs(device, rng, kind):
    X = rng.standard_normal((4, 2, 3)).astype(np.float32)
    W, R, B, P = weights(rng, kind, 1, 3, 4)
    K = CLASSES[kind](KernelContext(device))
    K.requested_outputs = (False, True, False)
    res = K(X, W, R, B)
    assert res.Y is None and res.Y_h is not None
    ref = naive(kind, X, W, R, B)
    np.testing.assert_allclose(res.Y_h.numpy(), ref[1], rtol=1e-5, atol=1e-5)
    if kind == "lstm":
        assert res.Y_c is None


def test_old_opsets(device, rng):
    X = rng.standard_normal((4, 2, 3)).astype(np.float32)
    W, R, B, _ = weights(rng, "gru", 1, 3, 4)
    # GRU-1 spells its default direction 'foward'
    res = GRU(KernelContext(device, 1))(X, W, R, B, direction="foward", output_sequence=1)
    compare(res, naive("gru", X, W, R, B), "gru")
    with pytest.raises(KernelInputError, match="layout"):
        GRU(KernelContext(device, 7))(X, W, R, B, layout=1)


def test_inputs_not_modified(device, rng):
    X = rng.standard_normal((4, 2, 3)).astype(np.float32)
    W, R, B, P = weights(rng, "lstm", 2, 3, 4, peep=True)
    h0 = rng.standard_normal((2, 2, 4)).astype(np.float32)
    c0 = rng.standard_normal((2, 2, 4)).astype(np.float32)
    lens = np.array([4, 2], np.int32)
    arrs = [X, W, R, B, lens, h0, c0, P]
    copies = [a.copy() for a in arrs]
    LSTM(KernelContext(device))(*arrs, direction="bidirectional")
    for a, c in zip(arrs, copies):
        np.testing.assert_array_equal(a, c)


def test_empty_batch(device, rng):
    X = np.zeros((3, 0, 2), np.float32)
    W, R, B, _ = weights(rng, "rnn", 1, 2, 4)
    res = RNN(KernelContext(device))(X, W, R, B)
    assert res.Y.shape == (3, 1, 0, 4) and res.Y_h.shape == (1, 0, 4)


def test_bad_inputs(device, rng):
    X = rng.standard_normal((4, 2, 3)).astype(np.float32)
    W, R, B, P = weights(rng, "lstm", 1, 3, 4)
    K = LSTM(KernelContext(device))
    with pytest.raises(KernelInputError, match="LSTM: unknown activation 'Gelu'"):
        K(X, W, R, activations=["Sigmoid", "Gelu", "Tanh"])
    with pytest.raises(KernelInputError, match="activation"):
        K(X, W, R, activations=["Sigmoid", "Tanh"])
    with pytest.raises(KernelInputError, match="direction"):
        K(X, W, R, direction="sideways")
    with pytest.raises(KernelInputError, match="W must have shape"):
        K(X, W[:, :7], R)
    with pytest.raises(KernelInputError, match="W must have shape"):
        K(X, W, R, hidden_size=5)
    with pytest.raises(KernelInputError, match="R must have shape"):
        K(X, W, R[:, :, :3])
    with pytest.raises(KernelInputError, match="B must have shape"):
        K(X, W, R, B[:, :4])
    with pytest.raises(KernelInputError, match="sequence_lens values"):
        K(X, W, R, B, np.array([5, 1], np.int32))
    with pytest.raises(KernelInputError, match="initial_h"):
        K(X, W, R, B, None, np.zeros((2, 2, 4), np.float32))
    with pytest.raises(KernelInputError, match="P must have shape"):
        K(X, W, R, B, None, None, None, np.zeros((1, 4), np.float32))
    with pytest.raises(KernelInputError, match="X must be 3-D"):
        K(X[0], W, R)
    with pytest.raises(KernelInputError, match="clip"):
        K(X, W, R, clip=-1.0)
    with pytest.raises(KernelTypeError, match="LSTM"):
        K(X, W, R, B, np.array([4, 1], np.int64))


# ---------------------------------------------------------------------------- LSTM host path


def ctx(device, path):
    return KernelContext(device, options={"paths": path})


def reference(X, W, R, B=None, h0=None, c0=None, P=None, *, direction="forward", layout=0, clip=None,
              input_forget=0, acts=None):
    """The float64 LSTM of tests/reference, no sequence lengths."""
    return naive("lstm", X, W, R, B, None, h0, c0, P, direction=direction, layout=layout, clip=clip,
                 input_forget=input_forget, acts=acts)


def rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


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
def test_chunked_projection(device, path, rng, direction, layout, S, monkeypatch):
    used = []
    original = recurrent._ChunkedProjection.produce
    monkeypatch.setattr(recurrent._ChunkedProjection, "produce", lambda self: used.append(1) or original(self))
    X, W, R, B, h0, c0, _ = make(rng, S, 32, 24, HID, 1, layout)
    res = LSTM(ctx(device, path))(X, W, R, B, None, h0, c0, direction=direction, hidden_size=HID,
                                      layout=layout)
    check(res, reference(X, W, R, B, h0, c0, direction=direction, layout=layout), 2e-5)
    assert used == ([1] if device == "cpu" and path == "auto" else [])


def test_padded_blocks_no_bias_no_states(device, path, rng):
    X, W, R, _, _, _, _ = make(rng, 17, 64, 9, 67, 1, bias=False, states=False)
    res = LSTM(ctx(device, path))(X, W, R, hidden_size=67)
    check(res, reference(X, W, R), 2e-5)


@pytest.mark.parametrize("layout", [0, 1])
def test_bidirectional_threads(device, path, rng, layout):
    X, W, R, B, h0, c0, _ = make(rng, 18, 32, 16, HID, 2, layout)
    res = LSTM(ctx(device, path))(X, W, R, B, None, h0, c0, direction="bidirectional", hidden_size=HID,
                                      layout=layout)
    check(res, reference(X, W, R, B, h0, c0, direction="bidirectional", layout=layout), 2e-5)


def test_bidirectional_lengths(device, path, rng):
    X, W, R, B, h0, c0, _ = make(rng, 16, 32, 8, HID, 2)
    lens = rng.integers(0, 17, 32).astype(np.int32)
    lens[0] = 16
    res = LSTM(ctx(device, path))(X, W, R, B, lens, h0, c0, direction="bidirectional", hidden_size=HID)
    Y, Yh, Yc = res.Y.numpy(), res.Y_h.numpy(), res.Y_c.numpy()
    for n in range(32):
        L = int(lens[n])
        ref = reference(X[:L, n:n + 1], W, R, B, h0[:, n:n + 1], c0[:, n:n + 1], direction="bidirectional")
        np.testing.assert_allclose(Y[:L, :, n:n + 1], ref[0], rtol=2e-5, atol=2e-5)
        assert np.all(Y[L:, :, n] == 0)
        np.testing.assert_allclose(Yh[:, n:n + 1], ref[1] if L else h0[:, n:n + 1], rtol=2e-5, atol=2e-5)
        np.testing.assert_allclose(Yc[:, n:n + 1], ref[2] if L else c0[:, n:n + 1], rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("direction", ["forward", "reverse"])
def test_lengths_one_direction(device, path, rng, direction):
    N = 32
    X, W, R, B, h0, c0, _ = make(rng, 17, N, 8, HID, 1)
    lens = rng.integers(0, 18, N).astype(np.int32)
    lens[0] = 17
    res = LSTM(ctx(device, path))(X, W, R, B, lens, h0, c0, direction=direction, hidden_size=HID)
    Y, Yh, Yc = res.Y.numpy(), res.Y_h.numpy(), res.Y_c.numpy()
    for n in range(N):
        L = int(lens[n])
        ref = reference(X[:L, n:n + 1], W, R, B, h0[:, n:n + 1], c0[:, n:n + 1], direction=direction)
        np.testing.assert_allclose(Y[:L, :, n:n + 1], ref[0], rtol=2e-5, atol=2e-5)
        assert np.all(Y[L:, :, n] == 0)
        np.testing.assert_allclose(Yh[:, n:n + 1], ref[1] if L else h0[:, n:n + 1], rtol=2e-5, atol=2e-5)
        np.testing.assert_allclose(Yc[:, n:n + 1], ref[2] if L else c0[:, n:n + 1], rtol=2e-5, atol=2e-5)


def test_general_gates_chunked(device, path, rng):
    """clip, peepholes and input_forget take the general gate path on the fast layout."""
    X, W, R, B, h0, c0, P = make(rng, 16, 32, 8, HID, 1, peep=True)
    res = LSTM(ctx(device, path))(X, W, R, B, None, h0, c0, P, clip=1.5, input_forget=1, hidden_size=HID)
    check(res, reference(X, W, R, B, h0, c0, P, clip=1.5, input_forget=1), 2e-5)


def test_other_activations_chunked(device, path, rng):
    X, W, R, B, h0, c0, _ = make(rng, 16, 32, 8, HID, 1)
    res = LSTM(ctx(device, path))(X, W, R, B, None, h0, c0, activations=["HardSigmoid", "Tanh", "Softsign"],
                                      hidden_size=HID)

    ref = reference(X, W, R, B, h0, c0, acts=["HardSigmoid", "Tanh", "Softsign"])
    check(res, ref, 2e-5)


def test_float64_and_optional_outputs(device, path, rng):
    X, W, R, B, h0, c0, _ = make(rng, 16, 32, 8, HID, 1, dtype=np.float64)
    ref = reference(X, W, R, B, h0, c0)
    K = LSTM(ctx(device, path))
    check(K(X, W, R, B, None, h0, c0, hidden_size=HID), ref, 1e-12)
    K.requested_outputs = [False, True, True]
    res = K(X, W, R, B, None, h0, c0, hidden_size=HID)
    assert res.Y is None
    np.testing.assert_allclose(res.Y_h.numpy(), ref[1], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(res.Y_c.numpy(), ref[2], rtol=1e-12, atol=1e-12)


def test_float16(device, path, rng):
    X, W, R, B, h0, c0, _ = make(rng, 16, 32, 8, HID, 1, dtype=np.float16)
    res = LSTM(ctx(device, path))(X, W, R, B, None, h0, c0, hidden_size=HID)
    assert res.Y.numpy().dtype == np.float16
    check(res, reference(X, W, R, B, h0, c0), 3e-3)


def test_inputs_not_modified(device, path, rng):
    X, W, R, B, h0, c0, _ = make(rng, 16, 32, 8, HID, 2)
    copies = [a.copy() for a in (X, W, R, B, h0, c0)]
    LSTM(ctx(device, path))(X, W, R, B, None, h0, c0, direction="bidirectional", hidden_size=HID)
    for a, b in zip((X, W, R, B, h0, c0), copies):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("N,H", [(32, HID), (4, 200)])
def test_one_host_thread(rng, monkeypatch, N, H):  # (4, 200): a blocked product too
    monkeypatch.setenv("GPUKERNELS_CPU_THREADS", "1")
    X, W, R, B, h0, c0, _ = make(rng, 40, N, 8, H, 1)
    res = LSTM(ctx("cpu", "auto"))(X, W, R, B, None, h0, c0, direction="reverse", hidden_size=H)
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
            LSTM(ctx("cpu", "auto"))(X, W, R, B, None, h0, c0, hidden_size=H)
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
        result["res"] = LSTM(ctx("cpu", "auto"))(X, W, R, B, None, h0, c0, hidden_size=200)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive()
    check(result["res"], reference(X, W, R, B, h0, c0), 2e-5)


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_zero_steps(device, path, rng, direction):
    D = 2 if direction == "bidirectional" else 1
    X, W, R, B, h0, c0, _ = make(rng, 0, 32, 8, HID, D)
    res = LSTM(ctx(device, path))(X, W, R, B, None, h0, c0, direction=direction, hidden_size=HID)
    assert res.Y.shape == (0, D, 32, HID)
    np.testing.assert_array_equal(res.Y_h.numpy(), h0)
    np.testing.assert_array_equal(res.Y_c.numpy(), c0)


@pytest.mark.parametrize("S,T", [(1, 4), (2, 4), (3, 4), (7, 4), (8, 4), (16, 4), (21, 4), (40, 8), (5, 1)])
@pytest.mark.parametrize("reverse", [False, True])
def test_chunk_bounds(S, T, reverse):
    bounds = _lstm_host._chunk_bounds(S, T, reverse)
    sizes = [b - a for a, b in bounds]
    assert all(0 < n <= T for n in sizes) and sum(sizes) == S
    ramp, size = [], 1
    for _ in sizes:
        ramp.append(min(T, size))
        size += max(1, size // 2)
    assert ramp[:4] == [min(T, n) for n in (1, 2, 3, 4)][:len(ramp)]
    assert sizes[:-1] == ramp[:-1] and sizes[-1] <= ramp[-1]
    steps = [t for a, b in bounds for t in (range(b - 1, a - 1, -1) if reverse else range(a, b))]
    assert steps == (list(range(S - 1, -1, -1)) if reverse else list(range(S)))


@pytest.mark.parametrize("S", [8, 9, 15, 16, 23])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("bias", [True, False])
def test_lstm_chunked_projection(device, path, rng, monkeypatch, S, direction, bias):
    chunks = []
    project = _lstm_host._ChunkedProjection._project

    def counted(self, k):
        out = project(self, k)
        t0, t1 = self.bounds[k]
        assert out.shape == (t1 - t0, self.M, self.N) and out.flags.c_contiguous
        chunks.append(k)
        return out

    monkeypatch.setattr(_lstm_host._ChunkedProjection, "_project", counted)
    N, I, D = 32, 20, 2 if direction == "bidirectional" else 1
    X = rand(rng, S, N, I)
    W, R = rand(rng, D, 4 * HID, I) * 0.3, rand(rng, D, 4 * HID, HID) * 0.3
    B = rand(rng, D, 8 * HID) * 0.3 if bias else None
    h0, c0 = rand(rng, D, N, HID), rand(rng, D, N, HID)
    res = LSTM(ctx(device, path))(X, W, R, B, None, h0, c0, direction=direction, hidden_size=HID)
    assert bool(chunks) == (device == "cpu" and path == "auto")  # the chunked path ran
    check(res, reference(X, W, R, B, h0, c0, direction=direction), 2e-5)


def test_lstm_padded_rows_layout1(device, path, rng):
    """A hidden size whose blocked product pads rows; layout 1; only Y_h wanted."""
    S, N, I, H = 19, 64, 9, 67
    X = rand(rng, N, S, I)
    W, R, B = rand(rng, 1, 4 * H, I) * 0.3, rand(rng, 1, 4 * H, H) * 0.3, rand(rng, 1, 8 * H) * 0.3
    assert recurrent._StepProduct(np, R[0], N).blocks is not None
    k = LSTM(ctx(device, path))
    k.requested_outputs = (False, True, False)
    res = k(X, W, R, B, hidden_size=H, layout=1)
    np.testing.assert_allclose(res.Y_h.numpy(), reference(X, W, R, B, layout=1)[1], rtol=2e-5, atol=2e-5)


def test_lstm_sequence_lens_full_projection(device, path, rng):
    """Sequence lengths take the one-chunk projection (_FullProjection bounds)."""
    S, N, I = 12, 32, 10
    X = rand(rng, S, N, I)
    W, R, B = rand(rng, 1, 4 * HID, I) * 0.3, rand(rng, 1, 4 * HID, HID) * 0.3, rand(rng, 1, 8 * HID) * 0.3
    lens = rng.integers(1, S + 1, N).astype(np.int32)
    res = LSTM(ctx(device, path))(X, W, R, B, lens, hidden_size=HID)
    check(res, naive("lstm", X, W, R, B, lens), 2e-5)  # zeros past each length
