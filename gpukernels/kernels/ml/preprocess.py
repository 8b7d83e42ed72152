"""ai.onnx.ml feature preprocessing: ArrayFeatureExtractor, Binarizer, FeatureVectorizer,
Imputer, Normalizer, Scaler.

All run with the kernel's array namespace except ArrayFeatureExtractor on STRING
tensors (host).  Outputs documented as tensor(float) are computed in float64 and
rounded once to float32.
"""

from __future__ import annotations

import numpy as np

from ...dtypes import DataType
from ...tensor import Tensor
from ..base import KernelBase, register
from ._common import given


def _rows(kernel, x: Tensor, **named):
    """(N, F) view of an input treated as a batch: 1-D [F] is one row, 2-D [N, F] as is;
    higher ranks keep the first axis and flatten the rest."""
    if x.ndim == 0:
        raise kernel.error("input must have at least one dimension", **named)
    if x.ndim == 1:
        return 1, x.shape[0]
    n = x.shape[0]
    f = int(np.prod(x.shape[1:], dtype=np.int64))
    return n, f


@register(domain="ai.onnx.ml")
class ArrayFeatureExtractor(KernelBase):
    """Z = X[..., Y] with Y's indices (flattened) applied to the last axis.  A 1-D X
    gives shape [1, len(Y)] (as onnxruntime); otherwise X.shape[:-1] + [len(Y)].
    Indices must lie in [0, X.shape[-1]) (negative indices are rejected)."""

    def __call__(self, X, Y):
        x = self.tensor(X, "X")
        y = self.tensor(Y, "Y")
        self.check_inputs(x, y)
        if x.ndim == 0:
            raise self.error("X must have at least one dimension", X=x, Y=y)
        last = x.shape[-1]
        idx_host = np.asarray(y.numpy()).reshape(-1).astype(np.int64)
        if idx_host.size and (idx_host.min() < 0 or idx_host.max() >= last):
            raise self.error(f"indices must lie in [0, {last}); got range "
                             f"[{int(idx_host.min())}, {int(idx_host.max())}]", X=x, Y=y)
        out_shape = (1, idx_host.size) if x.ndim == 1 else x.shape[:-1] + (idx_host.size,)
        if x.data_type == DataType.STRING:
            z = np.take(x.numpy(), idx_host, axis=-1).reshape(out_shape)
            return Tensor.wrap(z, DataType.STRING)
        xp = self.xp
        z = xp.take(x.array, xp.asarray(idx_host), axis=-1).reshape(out_shape)
        return self.result(z, x.data_type)


@register(domain="ai.onnx.ml")
class Binarizer(KernelBase):
    """Y = 1 where X > threshold, else 0, in X's type.  NaN compares false and gives 0."""

    def __call__(self, X, threshold=0.0):
        x = self.tensor(X, "X")
        self.check_inputs(x)
        xp = self.xp
        a = x.array
        y = (a > float(threshold)) if a.dtype.kind == "f" else (a.astype(np.float64) > float(threshold))
        return self.result(y.astype(a.dtype), x.data_type)


@register(domain="ai.onnx.ml")
class FeatureVectorizer(KernelBase):
    """Concatenates the inputs along the second axis as float32.  Input i is read as
    [N, C_i] (1-D is [1, C]; higher ranks flatten after the first axis) and contributes
    inputdimensions[i] columns: truncated when C_i is larger, zero-padded when smaller.
    Without inputdimensions each input contributes its own C_i.  All inputs must have
    the same N."""

    def __call__(self, *X, inputdimensions=None):
        if not X:
            raise self.error("at least one input is required")
        xs = [self.tensor(v, f"X[{i}]") for i, v in enumerate(X)]
        self.check_inputs(*xs)
        named = {f"X{i}": t for i, t in enumerate(xs)}
        shapes = [_rows(self, t, **named) for t in xs]
        dims = list(inputdimensions) if given(inputdimensions) else [c for _, c in shapes]
        if len(dims) != len(xs):
            raise self.error(f"inputdimensions has {len(dims)} entries for {len(xs)} inputs", **named)
        if any(d < 0 for d in dims):
            raise self.error(f"inputdimensions must be non-negative, got {dims}", **named)
        n = shapes[0][0]
        if any(s[0] != n for s in shapes):
            raise self.error(f"inputs have different batch sizes {[s[0] for s in shapes]}", **named)
        xp = self.xp
        out = xp.zeros((n, int(sum(dims))), dtype=np.float32)
        col = 0
        for t, (_, c), d in zip(xs, shapes, dims):
            take = min(c, d)
            if take:
                out[:, col:col + take] = t.array.reshape(n, c)[:, :take].astype(np.float32)
            col += d
        return self.result(out, DataType.FLOAT)


@register(domain="ai.onnx.ml")
class Imputer(KernelBase):
    """Replaces elements equal to the replaced value (NaN matches NaN) by the imputed
    value: floats use replaced_value_float / imputed_value_floats, integers the *_int64
    pair.  The imputed list has 1 entry or one per element of the last axis."""

    def __call__(self, X, imputed_value_floats=None, imputed_value_int64s=None,
                 replaced_value_float=0.0, replaced_value_int64=0):
        x = self.tensor(X, "X")
        self.check_inputs(x)
        xp = self.xp
        is_float = x.data_type in (DataType.FLOAT, DataType.DOUBLE)
        values = imputed_value_floats if is_float else imputed_value_int64s
        other = imputed_value_int64s if is_float else imputed_value_floats
        if not given(values):
            which = "imputed_value_floats" if is_float else "imputed_value_int64s"
            if given(other):
                raise self.error(f"{which} must be set for {'float' if is_float else 'integer'} input "
                                 "(the other imputed_value attribute was given)", X=x)
            raise self.error(f"{which} must be set", X=x)
        vals = np.asarray(list(values), dtype=np.float64 if is_float else np.int64)
        last = x.shape[-1] if x.ndim else 1
        if vals.size != 1 and vals.size != last:
            raise self.error(f"imputed values have {vals.size} entries; expected 1 or {last} "
                             "(the last dimension)", X=x)
        a = x.array
        if is_float:
            rep = float(replaced_value_float)
            mask = xp.isnan(a) if np.isnan(rep) else (a == rep)
        else:
            info = np.iinfo(a.dtype)
            if vals.min() < info.min or vals.max() > info.max:
                raise self.error(f"imputed values {vals.tolist()} do not fit {a.dtype}", X=x)
            rep = int(replaced_value_int64)
            mask = a == rep if info.min <= rep <= info.max else xp.zeros(a.shape, bool)
        fill = xp.asarray(vals.astype(a.dtype))
        if vals.size == 1:
            fill = fill.reshape(())
        y = xp.where(mask, fill, a)
        return self.result(y.astype(a.dtype, copy=False), x.data_type)


@register(domain="ai.onnx.ml")
class Normalizer(KernelBase):
    """Row-wise normalisation of a [N, C] (or [C]) input to float32: MAX divides by the
    row maximum, L1 by the sum of absolute values, L2 by the Euclidean norm (the sign is
    kept).  A zero divisor leaves the row unchanged."""

    def __call__(self, X, norm="MAX"):
        x = self.tensor(X, "X")
        self.check_inputs(x)
        norm = norm.decode() if isinstance(norm, bytes) else str(norm)
        if norm not in ("MAX", "L1", "L2"):
            raise self.error(f"norm must be 'MAX', 'L1' or 'L2', got {norm!r}", X=x)
        if x.ndim not in (1, 2):
            raise self.error("X must be 1-D or 2-D", X=x)
        xp = self.xp
        a = x.array.astype(np.float64)
        if a.size == 0:
            return self.result(a.astype(np.float32), DataType.FLOAT)
        if norm == "MAX":
            d = xp.max(a, axis=-1, keepdims=True)
        elif norm == "L1":
            d = xp.sum(xp.abs(a), axis=-1, keepdims=True)
        else:
            d = xp.sqrt(xp.sum(a * a, axis=-1, keepdims=True))
        y = xp.where(d == 0, a, a / xp.where(d == 0, 1.0, d))
        return self.result(y.astype(np.float32), DataType.FLOAT)


@register(domain="ai.onnx.ml")
class Scaler(KernelBase):
    """Y = (X - offset) * scale along the last axis, as float32.  offset and scale have
    1 entry or one per element of the last axis; a missing offset is 0, a missing scale
    1."""

    def __call__(self, X, offset=None, scale=None):
        x = self.tensor(X, "X")
        self.check_inputs(x)
        xp = self.xp
        last = x.shape[-1] if x.ndim else 1
        off = np.asarray(list(offset) if given(offset) else [0.0], dtype=np.float32).astype(np.float64)
        sc = np.asarray(list(scale) if given(scale) else [1.0], dtype=np.float32).astype(np.float64)
        for name, v in (("offset", off), ("scale", sc)):
            if v.size not in (1, last):
                raise self.error(f"{name} has {v.size} entries; expected 1 or {last} (the last dimension)", X=x)
        a = x.array.astype(np.float64)
        y = (a - xp.asarray(off if off.size > 1 else off[0])) * xp.asarray(sc if sc.size > 1 else sc[0])
        return self.result(xp.asarray(y).astype(np.float32), DataType.FLOAT)


