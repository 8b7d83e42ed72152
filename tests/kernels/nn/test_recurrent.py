"""RNN, GRU and LSTM vs a float64 reference that runs each batch entry on its own."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from gpukernels.errors import KernelInputError, KernelTypeError
from gpukernels.kernels import KernelContext
from gpukernels.kernels.nn.recurrent import GRU, LSTM, RNN

ACTS = {
    "relu": lambda x, a, b: np.maximum(x, 0),
    "tanh": lambda x, a, b: np.tanh(x),
    "sigmoid": lambda x, a, b: 1 / (1 + np.exp(-x)),
    "affine": lambda x, a, b: a * x + b,
    "leakyrelu": lambda x, a, b: np.where(x >= 0, x, a * x),
    "thresholdedrelu": lambda x, a, b: np.where(x >= a, x, 0),
    "scaledtanh": lambda x, a, b: a * np.tanh(b * x),
    "hardsigmoid": lambda x, a, b: np.minimum(np.maximum(a * x + b, 0), 1),
    "elu": lambda x, a, b: np.where(x >= 0, x, a * (np.exp(x) - 1)),
    "softsign": lambda x, a, b: x / (1 + np.abs(x)),
    "softplus": lambda x, a, b: np.log(1 + np.exp(x)),
}
# (number of alpha values, number of beta values, default alpha, default beta)
PARAMS = {"affine": (1, 1, 1.0, 0.0), "leakyrelu": (1, 0, 0.01, None), "thresholdedrelu": (1, 0, 1.0, None),
          "scaledtanh": (1, 1, 1.0, 1.0), "hardsigmoid": (1, 1, 0.2, 0.5), "elu": (1, 0, 1.0, None)}


def make_acts(names, alphas, betas):
    alphas, betas = list(alphas or []), list(betas or [])
    out = []
    for n in names:
        na, nb, da, db = PARAMS.get(n.lower(), (0, 0, None, None))
        a = (alphas.pop(0) if alphas else da) if na else None
        b = (betas.pop(0) if betas else db) if nb else None
        out.append(lambda x, f=ACTS[n.lower()], a=a, b=b: f(x, a, b))
    return out


def naive(kind, X, W, R, B=None, lens=None, h0=None, c0=None, P=None, *, direction="forward", acts=None,
          alphas=None, betas=None, clip=None, lbr=0, input_forget=0, layout=0):
    X = np.asarray(X, np.float64)
    if layout:
        X = X.transpose(1, 0, 2)
        h0 = None if h0 is None else np.asarray(h0).transpose(1, 0, 2)
        c0 = None if c0 is None else np.asarray(c0).transpose(1, 0, 2)
    S, N, _ = X.shape
    D = 2 if direction == "bidirectional" else 1
    H = R.shape[2]
    G = {"rnn": 1, "gru": 3, "lstm": 4}[kind]
    per = {"rnn": 1, "gru": 2, "lstm": 3}[kind]
    default = {"rnn": ["Tanh"], "gru": ["Sigmoid", "Tanh"], "lstm": ["Sigmoid", "Tanh", "Tanh"]}[kind]
    names = acts or default * D
    if len(names) == per:
        names = names * D
    fns = make_acts(names, alphas, betas)
    cl = (lambda v: np.clip(v, -clip, clip)) if clip else (lambda v: v)
    lens = np.full(N, S) if lens is None else np.asarray(lens)
    Y = np.zeros((S, D, N, H))
    Yh = np.zeros((D, N, H))
    Yc = np.zeros((D, N, H))
    for d in range(D):
        rev = direction == "reverse" or d == 1
        f = fns[d * per:(d + 1) * per]
        Wd, Rd = np.asarray(W[d], np.float64), np.asarray(R[d], np.float64)
        Bd = np.zeros(2 * G * H) if B is None else np.asarray(B[d], np.float64)
        wb, rb = Bd[:G * H], Bd[G * H:]
        for n in range(N):
            h = np.zeros(H) if h0 is None else np.asarray(h0[d, n], np.float64)
            c = np.zeros(H) if c0 is None else np.asarray(c0[d, n], np.float64)
            steps = range(lens[n] - 1, -1, -1) if rev else range(lens[n])
            for t in steps:
                x = X[t, n]
                if kind == "rnn":
                    h = f[0](cl(Wd @ x + Rd @ h + wb + rb))
                elif kind == "gru":
                    gx = Wd @ x + wb
                    z = f[0](cl(gx[:H] + Rd[:H] @ h + rb[:H]))
                    r = f[0](cl(gx[H:2 * H] + Rd[H:2 * H] @ h + rb[H:2 * H]))
                    if lbr:
                        hh = f[1](cl(gx[2 * H:] + r * (Rd[2 * H:] @ h + rb[2 * H:])))
                    else:
                        hh = f[1](cl(gx[2 * H:] + Rd[2 * H:] @ (r * h) + rb[2 * H:]))
                    h = (1 - z) * hh + z * h
                else:
                    g = Wd @ x + Rd @ h + wb + rb
                    p = np.zeros(3 * H) if P is None else np.asarray(P[d], np.float64)
                    i = f[0](cl(g[:H] + p[:H] * c))
                    fg = 1 - i if input_forget else f[0](cl(g[2 * H:3 * H] + p[2 * H:] * c))
                    cc = f[1](cl(g[3 * H:]))
                    c = fg * c + i * cc
                    o = f[0](cl(g[H:2 * H] + p[H:2 * H] * c))
                    h = o * f[2](c)
                Y[t, d, n] = h
            Yh[d, n], Yc[d, n] = h, c
    if layout:
        return Y.transpose(2, 0, 1, 3), Yh.transpose(1, 0, 2), Yc.transpose(1, 0, 2)
    return Y, Yh, Yc


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
