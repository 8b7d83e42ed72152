"""ai.onnx.preview.training Adagrad, Adam and Momentum.

Each takes R (learning rate, scalar), T (update count, int64 scalar) and then, for n
optimized tensors, the variadic inputs laid out as in the spec:
Adagrad [X_1..X_n, G_1..G_n, H_1..H_n] -> [X_new_1..n, H_new_1..n];
Momentum [X.., G.., V..] -> [X_new.., V_new..];
Adam [X.., G.., V.., H..] -> [X_new.., V_new.., H_new..].
Each group's tensors broadcast elementwise (numpy rules) against X, and X_i's element
type is kept.  Arithmetic is done in float64 for float inputs (float32 values are
rounded once at the end).
"""

from __future__ import annotations

import numpy as np

from ...tensor import Tensor
from ..base import KernelBase, register


class _Optimizer(KernelBase):
    groups = 0  # tensors per optimized variable in the input list
    names = ()

    def _unpack(self, R, T, inputs):
        r = self.tensor(R, "R")
        t = self.tensor(T, "T")
        ts = [self.tensor(v, f"inputs[{i}]") for i, v in enumerate(inputs)]
        self.check_inputs(r, t, *ts)
        if r.size != 1:
            raise self.error("R must hold one value", R=r)
        if t.size != 1:
            raise self.error("T must hold one value", T=t)
        if not ts or len(ts) % self.groups:
            raise self.error(f"expected {self.groups} * n inputs after R and T ({'/'.join(self.names)} for "
                             f"each optimized tensor), got {len(ts)}")
        n = len(ts) // self.groups
        grouped = [ts[i * n:(i + 1) * n] for i in range(self.groups)]
        for i in range(n):
            x = grouped[0][i]
            for name, g in zip(self.names[1:], [grp[i] for grp in grouped[1:]]):
                try:
                    ok = np.broadcast_shapes(x.shape, g.shape) == x.shape
                except ValueError:
                    ok = False
                if not ok:
                    raise self.error(f"{name}_{i} {list(g.shape)} does not broadcast to X_{i} {list(x.shape)}",
                                     **{f"X_{i}": x, f"{name}_{i}": g})
        rv = float(np.asarray(r.numpy()).reshape(-1)[0])
        tv = int(np.asarray(t.numpy()).reshape(-1)[0])
        return rv, tv, grouped

    def _arr(self, t: Tensor):
        return t.array.astype(np.float64)

    def _out(self, arr, like: Tensor):
        return self.result(arr.astype(like.array.dtype), like.data_type)


@register(domain="ai.onnx.preview.training")
class Adagrad(_Optimizer):
    """r = R / (1 + T * decay_factor); G' = norm_coefficient * X + G; H_new = H + G'^2;
    X_new = X - r * G' / (sqrt(H_new) + epsilon).  Returns [X_new.., H_new..]."""

    groups = 3
    names = ("X", "G", "H")

    def __call__(self, R, T, *inputs, decay_factor=0.0, epsilon=1e-6, norm_coefficient=0.0):
        r, t, (xs, gs, hs) = self._unpack(R, T, inputs)
        rate = r / (1.0 + t * float(decay_factor))
        new_x, new_h = [], []
        for x, g, h in zip(xs, gs, hs):
            xa = self._arr(x)
            greg = float(norm_coefficient) * xa + self._arr(g)
            hn = self._arr(h) + greg * greg
            xn = xa - rate * greg / (self.xp.sqrt(hn) + float(epsilon))
            new_x.append(self._out(xn, x))
            new_h.append(self._out(self.xp.broadcast_to(hn, xa.shape), h))
        return tuple(new_x + new_h)


@register(domain="ai.onnx.preview.training")
class Momentum(_Optimizer):
    """G' = norm_coefficient * X + G; beta' = beta if T > 0 else 1;
    V_new = alpha * V + beta' * G'; standard: X_new = X - R * V_new; nesterov:
    X_new = X - R * (G' + alpha * V_new).  Returns [X_new.., V_new..]."""

    groups = 3
    names = ("X", "G", "V")

    def __call__(self, R, T, *inputs, alpha=None, beta=None, mode=None, norm_coefficient=None):
        missing = [k for k, v in (("alpha", alpha), ("beta", beta), ("mode", mode),
                                  ("norm_coefficient", norm_coefficient)) if v is None]
        if missing:
            raise self.error(f"required attribute(s) {missing} missing")
        mode = mode.decode() if isinstance(mode, bytes) else str(mode)
        if mode not in ("standard", "nesterov"):
            raise self.error(f"mode must be 'standard' or 'nesterov', got {mode!r}")
        r, t, (xs, gs, vs) = self._unpack(R, T, inputs)
        beta_adj = float(beta) if t > 0 else 1.0
        new_x, new_v = [], []
        for x, g, v in zip(xs, gs, vs):
            xa = self._arr(x)
            greg = float(norm_coefficient) * xa + self._arr(g)
            vn = float(alpha) * self._arr(v) + beta_adj * greg
            if mode == "standard":
                xn = xa - r * vn
            else:
                xn = xa - r * (greg + float(alpha) * vn)
            new_x.append(self._out(xn, x))
            new_v.append(self._out(self.xp.broadcast_to(vn, xa.shape), v))
        return tuple(new_x + new_v)


@register(domain="ai.onnx.preview.training")
class Adam(_Optimizer):
    """G' = norm_coefficient * X + G; V_new = alpha V + (1 - alpha) G';
    H_new = beta H + (1 - beta) G'^2; R' = R sqrt(1 - beta^T) / (1 - alpha^T) when
    T > 0, else R; X_new = (1 - norm_coefficient_post) (X - R' V_new / (sqrt(H_new) +
    epsilon)).  Returns [X_new.., V_new.., H_new..]."""

    groups = 4
    names = ("X", "G", "V", "H")

    def __call__(self, R, T, *inputs, alpha=0.9, beta=0.999, epsilon=1e-6, norm_coefficient=0.0,
                 norm_coefficient_post=0.0):
        r, t, (xs, gs, vs, hs) = self._unpack(R, T, inputs)
        a, b = float(alpha), float(beta)
        rate = r * np.sqrt(1.0 - b ** t) / (1.0 - a ** t) if t > 0 else r
        new_x, new_v, new_h = [], [], []
        xp = self.xp
        for x, g, v, h in zip(xs, gs, vs, hs):
            xa = self._arr(x)
            greg = float(norm_coefficient) * xa + self._arr(g)
            vn = a * self._arr(v) + (1.0 - a) * greg
            hn = b * self._arr(h) + (1.0 - b) * greg * greg
            xn = (1.0 - float(norm_coefficient_post)) * (xa - rate * vn / (xp.sqrt(hn) + float(epsilon)))
            new_x.append(self._out(xn, x))
            new_v.append(self._out(xp.broadcast_to(vn, xa.shape), v))
            new_h.append(self._out(xp.broadcast_to(hn, xa.shape), h))
        return tuple(new_x + new_v + new_h)
