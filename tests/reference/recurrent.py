"""RNN, GRU and LSTM layers in float64."""

from __future__ import annotations

import numpy as np

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


def recurrent(kind, X, W, R, B=None, lens=None, h0=None, c0=None, P=None, *, direction="forward", acts=None,
          alphas=None, betas=None, clip=None, lbr=0, input_forget=0, layout=0):
    """Y (S, D, N, H), Y_h and Y_c (D, N, H) of an RNN/GRU/LSTM layer (kind "rnn", "gru",
    "lstm"), float64, each batch entry and direction on its own; acts: ONNX activation
    names (one direction's or both)."""
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
