"""QLinearMatMul and QLinearConv.

Integer inputs: the zero points are subtracted and the products accumulated exactly
(float64 matmuls, exact for 8-bit operands: no overflow, unlike int32 accumulation which
the spec allows to wrap).  The accumulator (plus the int32 bias for QLinearConv) is then
requantized as onnxruntime does: ``float32(acc) * float32(a_scale * b_scale / y_scale)``,
rounded half to even, plus the output zero point, saturated.

Float8 inputs (QLinearMatMul opset 21): the operands are dequantized to float32, multiplied
in float32, divided by y_scale, the zero point added and the result rounded to the float8
output type with saturation.

QLinearConv computes the convolution one kernel tap at a time (a strided view of the
zero-padded input per tap, one batched matmul each): an implicit im2col whose workspace
is one input-sized array.
"""

from __future__ import annotations

import itertools

import numpy as np

from ..base import KernelBase, register
from ._common import FLOAT8_TYPES, quantize_values

def _per_tensor(t) -> bool:
    return t.size == 1 and t.ndim <= 1


@register()
class QLinearMatMul(KernelBase):
    """Scales and zero points: per tensor (one element), per row of a ((M,) or
    (..., M, 1)), per column of b ((N,) or (..., 1, N)); y's may be anything that
    broadcasts to the output."""

    def __call__(self, a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point):
        ts = [self.tensor(v, n) for v, n in zip(
            (a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point),
            ("a", "a_scale", "a_zero_point", "b", "b_scale", "b_zero_point", "y_scale", "y_zero_point"))]
        self.check_inputs(*ts)
        at, ast, azt, bt, bst, bzt, yst, yzt = ts
        named = dict(a=at, a_scale=ast, a_zero_point=azt, b=bt, b_scale=bst, b_zero_point=bzt,
                     y_scale=yst, y_zero_point=yzt)
        for x, z, nm in ((at, azt, "a"), (bt, bzt, "b")):
            if z.data_type != x.data_type:
                raise self.type_error(f"{nm}_zero_point must have {nm}'s element type", **named)
        if at.ndim == 0 or bt.ndim == 0:
            raise self.error("operands must have at least one dimension", **named)
        ka = at.shape[-1]
        kb = bt.shape[-2] if bt.ndim > 1 else bt.shape[0]
        if ka != kb:
            raise self.error(f"inner dimensions differ ({ka} vs {kb})", **named)
        try:
            out_shape = np.broadcast_shapes(at.shape[:-2], bt.shape[:-2])
        except ValueError:
            raise self.error("batch dimensions do not broadcast", **named) from None
        m = at.shape[-2] if at.ndim > 1 else None
        n = bt.shape[-1] if bt.ndim > 1 else None
        out_shape = tuple(out_shape) + ((m,) if m is not None else ()) + ((n,) if n is not None else ())
        xp = self.xp
        a_s = self._param(ast, azt, at, "row", named)
        b_s = self._param(bst, bzt, bt, "col", named)
        y_s = self._out_param(yst, yzt, out_shape, named)
        float8 = at.data_type in FLOAT8_TYPES or bt.data_type in FLOAT8_TYPES
        if float8:
            af = (self.to_compute(at, np.float32) - self._c(azt, a_s, np.float32)) * self._c(ast, a_s, np.float32)
            bf = (self.to_compute(bt, np.float32) - self._c(bzt, b_s, np.float32)) * self._c(bst, b_s, np.float32)
            y = xp.matmul(af, bf)
            y = y / self._c(yst, y_s, np.float32)
            y = y.astype(np.float32, copy=False)
            zp = self._c(yzt, y_s, np.float32)
            return quantize_values(self, y, yzt.data_type, zp, True)
        af = self.to_compute(at, np.float64) - self._c(azt, a_s, np.float64)
        bf = self.to_compute(bt, np.float64) - self._c(bzt, b_s, np.float64)
        acc = xp.matmul(af, bf)
        mult = (self._c(ast, a_s, np.float32) * self._c(bst, b_s, np.float32)).astype(np.float32)
        mult = (mult / self._c(yst, y_s, np.float32)).astype(np.float32)
        q = acc.astype(np.float32) * mult
        q = q.astype(np.float32, copy=False)
        return quantize_values(self, q, yzt.data_type, self._c(yzt, y_s, np.float32), True)

    def _param(self, s, z, x, kind, named):
        if s.shape != z.shape and not (_per_tensor(s) and _per_tensor(z)):
            raise self.error(f"scale shape {list(s.shape)} and zero point shape {list(z.shape)} differ",
                             **named)
        if _per_tensor(s):
            return ()
        if x.ndim < 2:
            raise self.error("per-row/per-column quantization needs a 2-D or higher operand", **named)
        rows, cols = x.shape[-2], x.shape[-1]
        if kind == "row":
            if s.ndim == 1:
                if s.shape[0] != rows:
                    raise self.error(f"per-row scale of a has {s.shape[0]} elements, a has {rows} rows",
                                     **named)
                return (rows, 1)
            ok = s.shape[-1] == 1 and s.shape[-2] in (1, rows) and s.ndim <= x.ndim
        else:
            if s.ndim == 1:
                if s.shape[0] != cols:
                    raise self.error(f"per-column scale of b has {s.shape[0]} elements, b has {cols} "
                                     "columns", **named)
                return (1, cols)
            ok = s.shape[-2] == 1 and s.shape[-1] in (1, cols) and s.ndim <= x.ndim
        if ok:
            try:
                np.broadcast_shapes(s.shape, x.shape)
            except ValueError:
                ok = False
        if not ok:
            which = "a: (M,) or (..., M, 1)" if kind == "row" else "b: (N,) or (..., 1, N)"
            raise self.error(f"scale shape {list(s.shape)} is neither per tensor nor per "
                             f"{kind} of {which}", **named)
        return tuple(s.shape)

    def _out_param(self, s, z, out_shape, named):
        if s.shape != z.shape and not (_per_tensor(s) and _per_tensor(z)):
            raise self.error(f"y_scale shape {list(s.shape)} and y_zero_point shape {list(z.shape)} "
                             "differ", **named)
        if _per_tensor(s):
            return ()
        try:
            if np.broadcast_shapes(s.shape, out_shape) != tuple(out_shape):
                raise ValueError
        except ValueError:
            raise self.error(f"y_scale shape {list(s.shape)} does not broadcast to the output shape "
                             f"{list(out_shape)}", **named) from None
        return tuple(s.shape)

    def _c(self, t, shape, dtype):
        return self.to_compute(t, dtype).reshape(shape)


@register()
class QLinearConv(KernelBase):
    """x_scale, x_zero_point, y_scale, y_zero_point per tensor; w_scale and w_zero_point
    per tensor or per output channel (M,).  auto_pad SAME_* pads so that
    out = ceil(in / stride), the odd pixel at the end (SAME_UPPER) or start (SAME_LOWER)."""

    def __call__(self, x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point,
                 B=None, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None,
                 strides=None):
        names = ("x", "x_scale", "x_zero_point", "w", "w_scale", "w_zero_point", "y_scale",
                 "y_zero_point")
        ts = [self.tensor(v, n) for v, n in zip(
            (x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point), names)]
        bt = self.tensor(B, "B", optional=True)
        self.check_inputs(*ts, bt)
        xt, xst, xzt, wt, wst, wzt, yst, yzt = ts
        named = dict(zip(names, ts), B=bt)
        for a, z, nm in ((xt, xzt, "x"), (wt, wzt, "w")):
            if z.data_type != a.data_type:
                raise self.type_error(f"{nm}_zero_point must have {nm}'s element type", **named)
        if xt.ndim < 3:
            raise self.error("x must be (N, C, D1, ...) with at least one spatial axis", **named)
        if wt.ndim != xt.ndim:
            raise self.error(f"w must have x's rank {xt.ndim}", **named)
        nsp = xt.ndim - 2
        n_batch, c_in = xt.shape[:2]
        m_out = wt.shape[0]
        group = int(group)
        if group < 1 or c_in % group or m_out % group or wt.shape[1] * group != c_in:
            raise self.error(f"channels do not fit group={group}: x has {c_in} channels, w is "
                             f"{list(wt.shape)} (needs w.shape[1] * group == C and M % group == 0)",
                             **named)
        kshape = tuple(wt.shape[2:])
        if kernel_shape is not None and tuple(kernel_shape) != kshape:
            raise self.error(f"kernel_shape {list(kernel_shape)} differs from w's spatial shape "
                             f"{list(kshape)}", **named)
        strides = list(strides) if strides is not None else [1] * nsp
        dilations = list(dilations) if dilations is not None else [1] * nsp
        if len(strides) != nsp or len(dilations) != nsp or min(strides + dilations, default=1) < 1:
            raise self.error(f"strides {strides} and dilations {dilations} need {nsp} positive values",
                             **named)
        for t, nm in ((xst, "x_scale"), (xzt, "x_zero_point"), (yst, "y_scale"), (yzt, "y_zero_point")):
            if not _per_tensor(t):
                raise self.error(f"{nm} must be a scalar (per tensor)", **named)
        for t, nm in ((wst, "w_scale"), (wzt, "w_zero_point")):
            if not _per_tensor(t) and not (t.ndim == 1 and t.shape[0] == m_out):
                raise self.error(f"{nm} must be a scalar or have M={m_out} elements", **named)
        if not bt.is_absent and bt.shape != (m_out,):
            raise self.error(f"B must have shape [{m_out}]", **named)
        in_sp = xt.shape[2:]
        eff = [(k - 1) * d + 1 for k, d in zip(kshape, dilations)]
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            out_sp = [-(-i // s) for i, s in zip(in_sp, strides)]
            begin, end = [], []
            for i, o, s, e in zip(in_sp, out_sp, strides, eff):
                total = max(0, (o - 1) * s + e - i)
                small = total // 2
                b = small if auto_pad == "SAME_UPPER" else total - small
                begin.append(b)
                end.append(total - b)
        elif auto_pad == "VALID":
            begin = [0] * nsp
            end = [0] * nsp
            out_sp = [(i - e) // s + 1 for i, e, s in zip(in_sp, eff, strides)]
        elif auto_pad == "NOTSET":
            p = list(pads) if pads is not None else [0] * (2 * nsp)
            if len(p) != 2 * nsp or min(p, default=0) < 0:
                raise self.error(f"pads {p} need {2 * nsp} non-negative values", **named)
            begin, end = p[:nsp], p[nsp:]
            out_sp = [(i + b + e2 - e) // s + 1 for i, b, e2, e, s in zip(in_sp, begin, end, eff, strides)]
        else:
            raise self.error(f"unknown auto_pad {auto_pad!r}", **named)
        if any(o < 0 for o in out_sp) or any(o == 0 for o in out_sp) and xt.size:
            raise self.error(f"the kernel (dilated {eff}) does not fit the padded input; output "
                             f"spatial shape would be {out_sp}", **named)
        out_sp = [max(o, 0) for o in out_sp]
        xp = self.xp
        xs = self.to_compute(xt, np.float64) - self.to_compute(xzt, np.float64).reshape(())
        if any(begin) or any(end):
            xpad = xp.zeros((n_batch, c_in) + tuple(i + b + e for i, b, e in zip(in_sp, begin, end)),
                            np.float64)
            xpad[(slice(None), slice(None)) + tuple(slice(b, b + i) for b, i in zip(begin, in_sp))] = xs
        else:
            xpad = xs
        wz = self.to_compute(wzt, np.float64).reshape((m_out,) if wzt.size > 1 else ())
        wz = wz.reshape((-1,) + (1,) * (nsp + 1)) if wzt.size > 1 else wz
        wf = self.to_compute(wt, np.float64) - wz
        g = group
        cg, mg = c_in // g, m_out // g
        length = int(np.prod(out_sp, dtype=np.int64))
        acc = xp.zeros((n_batch, g, mg, length), np.float64)
        wg = wf.reshape((g, mg, cg) + kshape)
        for tap in itertools.product(*[range(k) for k in kshape]):
            sl = tuple(slice(t * d, t * d + (o - 1) * s + 1, s) if o > 0 else slice(0, 0)
                       for t, d, o, s in zip(tap, dilations, out_sp, strides))
            patch = xpad[(slice(None), slice(None)) + sl].reshape(n_batch, g, cg, length)
            acc += xp.matmul(wg[(Ellipsis,) + tap], patch)
        acc = acc.reshape((n_batch, m_out, length))
        if not bt.is_absent:
            acc += self.to_compute(bt, np.float64).reshape(m_out, 1)
        w_s = self.to_compute(wst, np.float32).reshape((m_out, 1) if wst.size > 1 else ())
        mult = ((self.to_compute(xst, np.float32).reshape(()) * w_s).astype(np.float32)
                / self.to_compute(yst, np.float32).reshape(())).astype(np.float32)
        q = (acc.astype(np.float32) * mult).astype(np.float32, copy=False)
        y = quantize_values(self, q, yzt.data_type, self.to_compute(yzt, np.float32).reshape(()), True)
        y.array = y.array.reshape((n_batch, m_out) + tuple(out_sp))
        return y


__all__ = ["QLinearMatMul", "QLinearConv"]
