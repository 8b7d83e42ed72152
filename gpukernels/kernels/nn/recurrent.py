"""RNN, GRU and LSTM (opsets 1/3/7/14/22).

One layer, forward / reverse / bidirectional.  The input projection of every time step
(and both directions) is one matrix product; the recurrence is a loop over time steps
with one (batch, hidden) x (hidden, gates*hidden) product per step and direction.  LSTM
has a host specialisation (a transposed layout, single-threaded blocked step products,
the projection computed by a helper thread alongside the recurrence): see _lstm_host.

Choices where the spec leaves room:

* sequence_lens: each batch entry b runs over its first sequence_lens[b] steps (the
  reverse direction starts at step sequence_lens[b] - 1); Y is zero past an entry's
  length and Y_h (Y_c) hold the state after its last valid step -- the initial state
  for a length of 0.  Lengths must lie in [0, seq_length].
* clip bounds the inputs of the gate activations (f and g), not the input of h(C_t),
  matching onnxruntime.
* LSTM input_forget=1 couples the gates as f_t = 1 - i_t (onnxruntime's convention).
* Activation names match case-insensitively.  activation_alpha/activation_beta are
  consumed in activation order, each activation taking as many values as it has
  parameters (Affine, ScaledTanh, HardSigmoid take alpha and beta; LeakyRelu,
  ThresholdedRelu, Elu take alpha); missing values take the ONNX operators' defaults.
  A bidirectional node given only one direction's activations uses them for both; a
  one-direction node given more (RNN's schema default lists two) uses the first ones.
* Opset 1 output_sequence is accepted and ignored: Y is produced whenever it is wanted.
* Half types compute in float32 and round once.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ...tensor import Tensor
from ..base import KernelBase, register
from ._lstm_host import _ChunkedProjection, _FullProjection, _LSTMDirection, _StepProduct, _clip  # noqa: F401


def _sigmoid(xp, x, a, b):
    with np.errstate(over="ignore"):
        return 1 / (1 + xp.exp(-x))


def _hard_sigmoid(xp, x, a, b):
    return xp.clip(a * x + b, 0, 1)


def _elu(xp, x, a, b):
    with np.errstate(over="ignore", invalid="ignore"):
        return xp.where(x >= 0, x, a * (xp.exp(xp.minimum(x, 0)) - 1))


def _softplus(xp, x, a, b):
    # log(1 + e^x), stable for large |x|
    return xp.maximum(x, 0) + xp.log1p(xp.exp(-xp.abs(x)))


# name -> (function(xp, x, alpha, beta), default alpha or None, default beta or None)
ACTIVATIONS = {
    "relu": (lambda xp, x, a, b: xp.maximum(x, 0), None, None),
    "tanh": (lambda xp, x, a, b: xp.tanh(x), None, None),
    "sigmoid": (_sigmoid, None, None),
    "affine": (lambda xp, x, a, b: a * x + b, 1.0, 0.0),
    "leakyrelu": (lambda xp, x, a, b: xp.where(x >= 0, x, a * x), 0.01, None),
    "thresholdedrelu": (lambda xp, x, a, b: xp.where(x >= a, x, 0), 1.0, None),
    "scaledtanh": (lambda xp, x, a, b: a * xp.tanh(b * x), 1.0, 1.0),
    "hardsigmoid": (_hard_sigmoid, 0.2, 0.5),
    "elu": (_elu, 1.0, None),
    "softsign": (lambda xp, x, a, b: x / (1 + xp.abs(x)), None, None),
    "softplus": (_softplus, None, None),
}


class _Activation:
    __slots__ = ("name", "fn", "alpha", "beta")

    def __init__(self, name, fn, alpha, beta):
        self.name, self.fn, self.alpha, self.beta = name, fn, alpha, beta

    def __call__(self, xp, x):
        dt = x.dtype.type
        a = dt(self.alpha) if self.alpha is not None else None
        b = dt(self.beta) if self.beta is not None else None
        return self.fn(xp, x, a, b)

    def inplace(self, xp, x):
        """Apply to x in place (x is a writable compute array or a view of one)."""
        if self.fn is _sigmoid:
            xp.negative(x, out=x)
            with np.errstate(over="ignore"):
                xp.exp(x, out=x)
            x += 1
            xp.reciprocal(x, out=x)
        elif self.name.lower() == "tanh":
            xp.tanh(x, out=x)
        else:
            x[...] = self(xp, x)
        return x


def _step(xp, valid, s, hn, h):
    """(output, state) after step s: past an entry's sequence length its output is 0 and
    its state is kept (valid[s] marks the entries still running; None: all are)."""
    if valid is None:
        return hn, hn
    return xp.where(valid[s], hn, 0), xp.where(valid[s], hn, h)


class _RecurrentBase(KernelBase):
    """Shared validation, layout handling and sequence bookkeeping."""

    n_gates = 1
    n_activations = 1
    default_activations: tuple[str, ...] = ("Tanh",)

    # ------------------------------------------------------------ attributes
    def _directions(self, direction) -> list[bool]:
        """List of 'reverse?' flags, one per direction."""
        d = direction.decode() if isinstance(direction, bytes) else str(direction)
        if d in ("forward", "foward"):  # opset-1 GRU's schema default is spelled 'foward'
            return [False]
        if d == "reverse":
            return [True]
        if d == "bidirectional":
            return [False, True]
        raise self.error(f"direction must be 'forward', 'reverse' or 'bidirectional', got {d!r}")

    def _activations(self, activations, alpha, beta, num_dirs) -> list[list[_Activation]]:
        per = self.n_activations
        names = list(activations) if activations else list(self.default_activations)
        names = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
        alphas = list(alpha or [])
        betas = list(beta or [])
        acts = []
        for n in names:
            key = n.lower()
            if key not in ACTIVATIONS:
                raise self.error(f"unknown activation {n!r}; known: " + ", ".join(
                    ["Relu", "Tanh", "Sigmoid", "Affine", "LeakyRelu", "ThresholdedRelu", "ScaledTanh",
                     "HardSigmoid", "Elu", "Softsign", "Softplus"]))
            fn, da, db = ACTIVATIONS[key]
            a = (alphas.pop(0) if alphas else da) if da is not None else None
            b = (betas.pop(0) if betas else db) if db is not None else None
            acts.append(_Activation(n, fn, a, b))
        if len(acts) == per * num_dirs:
            return [acts[i * per:(i + 1) * per] for i in range(num_dirs)]
        if len(acts) == per:
            return [acts] * num_dirs
        if num_dirs == 1 and len(acts) > per:
            return [acts[:per]]
        raise self.error(f"expected {per} activation(s) per direction ({per * num_dirs} in all), "
                         f"got {len(acts)}: {names}")

    # ------------------------------------------------------------ inputs
    def _common_inputs(self, X, W, R, B, sequence_lens, initial_h, hidden_size, layout, direction, extra=()):
        x = self.tensor(X, "X")
        w = self.tensor(W, "W")
        r = self.tensor(R, "R")
        b = self.tensor(B, "B", optional=True)
        sl = self.tensor(sequence_lens, "sequence_lens", optional=True)
        h0 = self.tensor(initial_h, "initial_h", optional=True)
        extras = [self.tensor(v, n, optional=True) for n, v in extra]
        self.check_inputs(x, w, r, b, sl, h0, *extras)
        shapes = dict(X=x, W=w, R=r)
        layout = int(layout or 0)
        if layout not in (0, 1):
            raise self.error(f"layout must be 0 or 1, got {layout}")
        if self.since_version < 14 and layout != 0:
            raise self.error("the layout attribute needs opset 14 or later")
        dirs = self._directions(direction)
        D = len(dirs)
        if x.ndim != 3:
            raise self.error("X must be 3-D", **shapes)
        if layout == 0:
            S, N, I = x.shape
        else:
            N, S, I = x.shape
        if w.ndim != 3 or r.ndim != 3:
            raise self.error("W and R must be 3-D", **shapes)
        G = self.n_gates
        H = int(hidden_size) if hidden_size is not None else w.shape[1] // G
        if H < 0:
            raise self.error(f"hidden_size must be non-negative, got {H}", **shapes)
        if w.shape != (D, G * H, I):
            raise self.error(f"W must have shape (num_directions, {G}*hidden_size, input_size) = "
                             f"({D}, {G * H}, {I})", **shapes)
        if r.shape != (D, G * H, H):
            raise self.error(f"R must have shape ({D}, {G * H}, {H})", **shapes)
        if not b.is_absent and b.shape != (D, 2 * G * H):
            raise self.error(f"B must have shape ({D}, {2 * G * H})", B=b, **shapes)
        state_shape = (D, N, H) if layout == 0 else (N, D, H)
        if not h0.is_absent and h0.shape != state_shape:
            raise self.error(f"initial_h must have shape {state_shape}", initial_h=h0, **shapes)
        lens = None
        if not sl.is_absent:
            if sl.shape != (N,):
                raise self.error(f"sequence_lens must have shape ({N},)", sequence_lens=sl, **shapes)
            lens = np.asarray(sl.numpy(), dtype=np.int64)
            if lens.size and (lens.min() < 0 or lens.max() > S):
                raise self.error(f"sequence_lens values must lie in [0, {S}], got {lens.tolist()}",
                                 sequence_lens=sl, **shapes)
            if lens.size and lens.min() == S:
                lens = None  # every sequence is full length
        return dict(x=x, w=w, r=r, b=b, h0=h0, extras=extras, layout=layout, dirs=dirs, D=D, S=S, N=N,
                    I=I, H=H, lens=lens, state_shape=state_shape)

    def _state(self, t: Tensor, p, cdt):
        """An initial state tensor as (D, N, H) compute array (zeros when absent)."""
        xp = self.xp
        if t.is_absent:
            return xp.zeros((p["D"], p["N"], p["H"]), dtype=cdt)
        a = self.to_compute(t, cdt)
        return a if p["layout"] == 0 else a.transpose(1, 0, 2)

    def _projection(self, p, cdt):
        """X @ W^T for every step and direction: (D, S, N, G*H) compute array."""
        xp = self.xp
        xc = self.to_compute(p["x"], cdt)
        if p["layout"] == 1:
            xc = xc.transpose(1, 0, 2)
        S, N, I, D, GH = p["S"], p["N"], p["I"], p["D"], self.n_gates * p["H"]
        w = self.to_compute(p["w"], cdt).reshape(D * GH, I)
        proj = xp.matmul(xc.reshape(S * N, I), w.T)  # (S*N, D*GH)
        return proj.reshape(S, N, D, GH).transpose(2, 0, 1, 3)

    def _step_order(self, p, reverse: bool):
        """For one direction: idx (S, N) mapping step s -> time index, and valid (S, N, 1) mask
        (None when all sequences are full)."""
        xp = self.xp
        S, N, lens = p["S"], p["N"], p["lens"]
        if lens is None:
            return None, None
        s = np.arange(S).reshape(S, 1)
        valid = s < lens.reshape(1, N)
        idx = np.where(valid, lens.reshape(1, N) - 1 - s, s) if reverse else np.broadcast_to(s, (S, N))
        return xp.asarray(idx), xp.asarray(valid[..., None])

    def _gather_steps(self, arr, idx, reverse):
        """arr (S, N, F) reordered into step order."""
        if idx is None:
            return arr[::-1] if reverse else arr
        if not reverse:
            return arr
        xp = self.xp
        return arr[idx, xp.arange(arr.shape[1])[None, :]]

    def _outputs(self, p, Ys, finals, data_type):
        """Y (from per-direction (S, N, H) step-ordered outputs) and final states, in layout."""
        xp = self.xp
        results = []
        if Ys is not None:
            per_dir = []
            for d, reverse in enumerate(p["dirs"]):
                idx, _ = self._step_order(p, reverse)
                per_dir.append(self._gather_steps(Ys[d], idx, reverse))  # the reversal is an involution
            Y = xp.stack(per_dir, axis=1)  # (S, D, N, H)
            if p["layout"] == 1:
                Y = Y.transpose(2, 0, 1, 3)  # (N, S, D, H)
            results.append(self.from_compute(xp.ascontiguousarray(Y), data_type))
        else:
            results.append(None)
        for f in finals:
            if f is None:
                results.append(None)
                continue
            st = xp.stack(f, axis=0)  # (D, N, H)
            if p["layout"] == 1:
                st = st.transpose(1, 0, 2)
            results.append(self.from_compute(xp.ascontiguousarray(st), data_type))
        return results

    _clip = staticmethod(_clip)

    def _clip_value(self, clip):
        if clip is None:
            return None
        c = float(clip)
        if not c > 0:
            raise self.error(f"clip must be positive, got {c}")
        return c


@register()
class RNN(_RecurrentBase):
    """H_t = f(X_t W^T + H_{t-1} R^T + Wb + Rb); default f = Tanh."""

    n_gates = 1
    n_activations = 1
    default_activations = ("Tanh",)

    class Result(NamedTuple):
        Y: Tensor | None
        Y_h: Tensor | None

    def __call__(self, X, W, R, B=None, sequence_lens=None, initial_h=None, activation_alpha=None,
                 activation_beta=None, activations=None, clip=None, direction="forward", hidden_size=None,
                 layout=0, output_sequence=0):
        p = self._common_inputs(X, W, R, B, sequence_lens, initial_h, hidden_size, layout, direction)
        acts = self._activations(activations, activation_alpha, activation_beta, p["D"])
        clip = self._clip_value(clip)
        xp = self.xp
        cdt = self.to_compute(p["x"]).dtype
        H, D = p["H"], p["D"]
        proj = self._projection(p, cdt)
        if not p["b"].is_absent:
            bias = self.to_compute(p["b"], cdt)
            proj = proj + (bias[:, :H] + bias[:, H:])[:, None, None, :]
        R_ = self.to_compute(p["r"], cdt)
        h0 = self._state(p["h0"], p, cdt)
        want_y = self.wants_output(0)
        Ys, finals = [], []
        for d, reverse in enumerate(p["dirs"]):
            idx, valid = self._step_order(p, reverse)
            xs = self._gather_steps(proj[d], idx, reverse)
            f = acts[d][0]
            Rt = xp.ascontiguousarray(R_[d].T)
            h = h0[d]
            out = xp.zeros((p["S"], p["N"], H), dtype=cdt) if want_y else None
            for s in range(p["S"]):
                hn = xp.matmul(h, Rt)
                hn += xs[s]
                hn = f.inplace(xp, self._clip(xp, hn, clip))
                hn, h = _step(xp, valid, s, hn, h)
                if want_y:
                    out[s] = hn
            Ys.append(out)
            finals.append(h)
        y, yh = self._outputs(p, Ys if want_y else None, [finals if self.wants_output(1) else None],
                              p["x"].data_type)
        return self.Result(y, yh)


@register()
class GRU(_RecurrentBase):
    """z = f(X Wz + H Rz + b), r = f(X Wr + H Rr + b), h~ = g(X Wh + (r*H) Rh + Rbh + Wbh)
    (linear_before_reset=0) or g(X Wh + r*(H Rh + Rbh) + Wbh) (=1); H = (1-z)*h~ + z*H.
    Defaults f = Sigmoid, g = Tanh."""

    n_gates = 3
    n_activations = 2
    default_activations = ("Sigmoid", "Tanh")

    class Result(NamedTuple):
        Y: Tensor | None
        Y_h: Tensor | None

    def __call__(self, X, W, R, B=None, sequence_lens=None, initial_h=None, activation_alpha=None,
                 activation_beta=None, activations=None, clip=None, direction="forward", hidden_size=None,
                 layout=0, linear_before_reset=0, output_sequence=0):
        p = self._common_inputs(X, W, R, B, sequence_lens, initial_h, hidden_size, layout, direction)
        acts = self._activations(activations, activation_alpha, activation_beta, p["D"])
        clip = self._clip_value(clip)
        lbr = int(linear_before_reset or 0)
        xp = self.xp
        cdt = self.to_compute(p["x"]).dtype
        H = p["H"]
        proj = self._projection(p, cdt)
        rb = None
        if not p["b"].is_absent:
            bias = self.to_compute(p["b"], cdt)
            wb, rb = bias[:, :3 * H], bias[:, 3 * H:]
            add = wb.copy()
            add[:, :2 * H] += rb[:, :2 * H]
            if not lbr:
                add[:, 2 * H:] += rb[:, 2 * H:]
            proj = proj + add[:, None, None, :]
        R_ = self.to_compute(p["r"], cdt)
        h0 = self._state(p["h0"], p, cdt)
        want_y = self.wants_output(0)
        Ys, finals = [], []
        for d, reverse in enumerate(p["dirs"]):
            idx, valid = self._step_order(p, reverse)
            xs = self._gather_steps(proj[d], idx, reverse)
            f, g = acts[d]
            Rt = xp.ascontiguousarray(R_[d].T)  # (H, 3H)
            Rzr, Rh = xp.ascontiguousarray(Rt[:, :2 * H]), xp.ascontiguousarray(Rt[:, 2 * H:])
            rbh = rb[d, 2 * H:] if (rb is not None and lbr) else None
            h = h0[d]
            out = xp.zeros((p["S"], p["N"], H), dtype=cdt) if want_y else None
            for s in range(p["S"]):
                xt = xs[s]
                if lbr:
                    hr = xp.matmul(h, Rt)
                    zr = hr[:, :2 * H]
                    zr += xt[:, :2 * H]
                    zr = f.inplace(xp, self._clip(xp, zr, clip))
                    z, r = zr[:, :H], zr[:, H:]
                    hh = hr[:, 2 * H:]
                    if rbh is not None:
                        hh += rbh
                    hh *= r
                    hh += xt[:, 2 * H:]
                    cand = g.inplace(xp, self._clip(xp, hh, clip))
                else:
                    zr = xp.matmul(h, Rzr)
                    zr += xt[:, :2 * H]
                    zr = f.inplace(xp, self._clip(xp, zr, clip))
                    z, r = zr[:, :H], zr[:, H:]
                    cand = xp.matmul(r * h, Rh)
                    cand += xt[:, 2 * H:]
                    cand = g.inplace(xp, self._clip(xp, cand, clip))
                # (1 - z) * cand + z * h = cand + z * (h - cand)
                hn = h - cand
                hn *= z
                hn += cand
                hn, h = _step(xp, valid, s, hn, h)
                if want_y:
                    out[s] = hn
            Ys.append(out)
            finals.append(h)
        y, yh = self._outputs(p, Ys if want_y else None, [finals if self.wants_output(1) else None],
                              p["x"].data_type)
        return self.Result(y, yh)


@register()
class LSTM(_RecurrentBase):
    """Gates in W/R/B order i, o, f, c; peepholes P in order i, o, f.  Defaults f = Sigmoid,
    g = Tanh, h = Tanh.  input_forget=1 sets f_t = 1 - i_t.

    The reference runs the recurrence as RNN and GRU do: per step and direction one
    (N, H) x (H, 4H) product h @ R^T plus the step's row of the input projection, then the
    cell.  On the host the specialisation "LSTM.layer" (_lstm_host.lstm_host) runs it in a
    transposed layout with fused gates, blocked single-threaded step products and the
    input projection computed by a helper thread alongside the recurrence."""

    n_gates = 4
    n_activations = 3
    default_activations = ("Sigmoid", "Tanh", "Tanh")

    class Result(NamedTuple):
        Y: Tensor | None
        Y_h: Tensor | None
        Y_c: Tensor | None

    def __call__(self, X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None,
                 activation_alpha=None, activation_beta=None, activations=None, clip=None, direction="forward",
                 hidden_size=None, input_forget=0, layout=0, output_sequence=0):
        p = self._common_inputs(X, W, R, B, sequence_lens, initial_h, hidden_size, layout, direction,
                                extra=(("initial_c", initial_c), ("P", P)))
        c0_t, p_t = p["extras"]
        H, D = p["H"], p["D"]
        if not c0_t.is_absent and c0_t.shape != p["state_shape"]:
            raise self.error(f"initial_c must have shape {p['state_shape']}", initial_c=c0_t, X=p["x"])
        if not p_t.is_absent and p_t.shape != (D, 3 * H):
            raise self.error(f"P must have shape ({D}, {3 * H})", P=p_t, X=p["x"])
        acts = self._activations(activations, activation_alpha, activation_beta, D)
        clip = self._clip_value(clip)
        coupled = bool(int(input_forget or 0))
        run = self.specialized("LSTM.layer", self, p) or _lstm_reference
        Y, final_h, final_c = run(self, p, acts, clip, coupled)
        xp = self.xp
        results = [self.from_compute(Y, p["x"].data_type) if Y is not None else None]
        for k, finals in ((1, final_h), (2, final_c)):
            if not self.wants_output(k):
                results.append(None)
                continue
            st = xp.stack(finals, axis=0)  # (D, N, H)
            if p["layout"] == 1:
                st = st.transpose(1, 0, 2)
            results.append(self.from_compute(xp.ascontiguousarray(st), p["x"].data_type))
        return self.Result(*results)


def _lstm_reference(kernel, p, acts, clip, coupled):
    """The LSTM layer with xp: Y (compute array in the output layout, None when not
    wanted) and the final h and c of each direction, (N, H) each."""
    xp = kernel.xp
    cdt = kernel.to_compute(p["x"]).dtype
    S, N, H, D = p["S"], p["N"], p["H"], p["D"]
    c0_t, p_t = p["extras"]
    proj = kernel._projection(p, cdt)  # (D, S, N, 4H)
    if not p["b"].is_absent:
        b = kernel.to_compute(p["b"], cdt)
        proj = proj + (b[:, :4 * H] + b[:, 4 * H:])[:, None, None, :]
    R_ = kernel.to_compute(p["r"], cdt)
    peep = kernel.to_compute(p_t, cdt) if not p_t.is_absent else None
    h0 = kernel._state(p["h0"], p, cdt)
    c0 = kernel._state(c0_t, p, cdt)
    want_y = kernel.wants_output(0)
    clipped = kernel._clip
    Ys, final_h, final_c = [], [], []
    for d, reverse in enumerate(p["dirs"]):
        idx, valid = kernel._step_order(p, reverse)
        xs = kernel._gather_steps(proj[d], idx, reverse)
        f, g, hf = acts[d]
        Rt = xp.ascontiguousarray(R_[d].T)  # (H, 4H)
        if peep is not None:
            pi, po, pf = peep[d, :H], peep[d, H:2 * H], peep[d, 2 * H:]
        h, c = h0[d], c0[d]
        out = xp.zeros((S, N, H), dtype=cdt) if want_y else None
        for s in range(S):
            gates = xp.matmul(h, Rt)
            gates += xs[s]
            gi, go, gf, gc = gates[:, :H], gates[:, H:2 * H], gates[:, 2 * H:3 * H], gates[:, 3 * H:]
            if peep is not None:
                gi += pi * c
                gf += pf * c
            i = f.inplace(xp, clipped(xp, gi, clip))
            fg = 1 - i if coupled else f.inplace(xp, clipped(xp, gf, clip))
            cand = g.inplace(xp, clipped(xp, gc, clip))
            cn = fg * c
            cn += i * cand
            if peep is not None:
                go += po * cn
            o = f.inplace(xp, clipped(xp, go, clip))
            hn = hf(xp, cn)
            hn *= o
            if valid is not None:
                cn = xp.where(valid[s], cn, c)
            hn, h = _step(xp, valid, s, hn, h)
            c = cn
            if want_y:
                out[s] = hn
        Ys.append(out)
        final_h.append(h)
        final_c.append(c)
    Y = None
    if want_y:
        per_dir = [kernel._gather_steps(Ys[d], kernel._step_order(p, rev)[0], rev)
                   for d, rev in enumerate(p["dirs"])]
        Y = xp.stack(per_dir, axis=1)  # (S, D, N, H)
        if p["layout"] == 1:
            Y = Y.transpose(2, 0, 1, 3)  # (N, S, D, H)
        Y = xp.ascontiguousarray(Y)
    return Y, final_h, final_c
