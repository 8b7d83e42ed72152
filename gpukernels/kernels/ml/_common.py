"""Shared helpers of the ai.onnx.ml kernels.

Value conventions (ONNX types NumPy has no direct counterpart for):

* an ONNX ``map(K, V)`` is a Python ``dict`` (keys int or str, values numbers or str);
* an ONNX ``seq(map(K, V))`` is a Python ``list`` of such dicts (ZipMap's output; CastMap
  and DictVectorizer also accept one, giving one output row per map);
* STRING tensors are host object arrays of ``str`` (bytes are decoded as UTF-8).

Operators that consume or produce strings or maps run on the host (there is no string
type on a GPU); their numeric outputs are moved to the kernel's device afterwards.
"""

from __future__ import annotations

import numpy as np

from ...dtypes import DataType
from ...tensor import Tensor

POST_TRANSFORMS = ("NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT")


def to_str(value) -> str:
    return value.decode("utf-8") if isinstance(value, (bytes, bytearray)) else str(value)


def str_list(values) -> list[str]:
    return [to_str(v) for v in values]


def str_array(values) -> np.ndarray:
    """A host object array of str (bytes decoded)."""
    arr = np.asarray(values, dtype=object)
    if arr.size and any(isinstance(v, (bytes, bytearray)) for v in arr.reshape(-1)[:1]):
        flat = [to_str(v) for v in arr.reshape(-1)]
        arr = np.array(flat, dtype=object).reshape(arr.shape)
    return arr


def attr_array(value, dtype=None):
    """A host array from an attribute value (list, Tensor or None)."""
    if value is None:
        return None
    if isinstance(value, Tensor):
        arr = value.numpy()
        if value.data_type == DataType.STRING:
            return str_array(arr)
    else:
        arr = np.asarray(value)
    return arr if dtype is None else arr.astype(dtype)


def given(value) -> bool:
    """True when an optional list/tensor attribute is set (and not empty)."""
    if value is None:
        return False
    if isinstance(value, Tensor):
        return not value.is_absent
    if isinstance(value, (str, bytes)):
        return True
    return len(value) > 0


def parse_post_transform(kernel, value) -> str:
    """post_transform as a name; TreeEnsemble (opset 5) gives it as an int."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        if not 0 <= int(value) < len(POST_TRANSFORMS):
            raise kernel.error(f"post_transform {int(value)} is not one of 0..4")
        return POST_TRANSFORMS[int(value)]
    name = to_str(value).upper()
    if name not in POST_TRANSFORMS:
        raise kernel.error(f"post_transform {name!r} is not one of {', '.join(POST_TRANSFORMS)}")
    return name


# ------------------------------------------------------------------ transforms


def logistic(xp, x):
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + xp.exp(-x))


def softmax_rows(xp, x):
    m = xp.max(x, axis=-1, keepdims=True)
    e = xp.exp(x - m)
    return e / xp.sum(e, axis=-1, keepdims=True)


def softmax_zero_rows(xp, x):
    """Softmax in which entries equal to zero stay zero (they are excluded from the sum);
    a row of zeros stays zeros."""
    nz = x != 0
    m = xp.max(xp.where(nz, x, -xp.inf), axis=-1, keepdims=True)
    m = xp.where(xp.isfinite(m), m, 0)
    e = xp.where(nz, xp.exp(x - m), 0)
    s = xp.sum(e, axis=-1, keepdims=True)
    return e / xp.where(s == 0, 1, s)


# Acklam's rational approximation of the standard normal quantile (relative error
# below 1.2e-9 over (0, 1)), vectorised.
_A = (-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02,
      1.383577518672690e+02, -3.066479806614716e+01, 2.506628277459239e+00)
_B = (-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
      6.680131188771972e+01, -1.328068155288572e+01)
_C = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
      -2.549732539343734e+00, 4.374664141464968e+00, 2.938163982698783e+00)
_D = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
      3.754408661907416e+00)


def _poly(coefs, x):
    r = coefs[0]
    for c in coefs[1:]:
        r = r * x + c
    return r


def probit(xp, p):
    """The standard normal quantile, sqrt(2) * erfinv(2p - 1), computed in float64;
    p == 0 gives -inf, p == 1 +inf, p outside [0, 1] and NaN give NaN."""
    dtype = p.dtype
    p = p.astype(np.float64)
    plow = 0.02425
    with np.errstate(divide="ignore", invalid="ignore"):
        q_low = xp.sqrt(-2.0 * xp.log(xp.clip(p, 1e-300, 1.0)))
        low = _poly(_C, q_low) / (_poly(_D, q_low) * q_low + 1.0)
        q_high = xp.sqrt(-2.0 * xp.log(xp.clip(1.0 - p, 1e-300, 1.0)))
        high = -_poly(_C, q_high) / (_poly(_D, q_high) * q_high + 1.0)
        q = p - 0.5
        r = q * q
        central = _poly(_A, r) * q / (_poly(_B, r) * r + 1.0)
    out = xp.where(p < plow, low, xp.where(p > 1.0 - plow, high, central))
    out = xp.where(p == 0, -xp.inf, xp.where(p == 1, xp.inf, out))
    out = xp.where((p < 0) | (p > 1) | xp.isnan(p), xp.nan, out)
    return out.astype(dtype)


def apply_post_transform(xp, scores, mode: str):
    """Apply post_transform along the last axis of scores ([N, C])."""
    if mode == "NONE":
        return scores
    if mode == "LOGISTIC":
        return logistic(xp, scores)
    if mode == "PROBIT":
        return probit(xp, scores)
    if scores.shape[-1] == 0 or scores.size == 0:
        return scores
    if mode == "SOFTMAX":
        return softmax_rows(xp, scores)
    return softmax_zero_rows(xp, scores)


# ------------------------------------------------------------------ lookups


def numeric_index(xp, keys: np.ndarray, x):
    """For each element of x (an xp array) the index i with keys[i] == x (the last such
    i when keys repeat; a NaN key matches NaN), or -1.  keys is a host 1-D array."""
    keys = np.asarray(keys).reshape(-1)
    n = keys.size
    if n == 0 or x.size == 0:
        return xp.full(x.shape, -1, dtype=np.int64)
    rev = keys[::-1]
    uniq, first_in_rev = np.unique(rev, return_index=True)
    last_index = (n - 1 - first_in_rev).astype(np.int64)
    nan_index = None
    if keys.dtype.kind == "f":
        nan_mask = np.isnan(uniq)
        if nan_mask.any():
            nan_index = int(last_index[nan_mask].max())
            uniq = uniq[~nan_mask]
            last_index = last_index[~nan_mask]
    out = xp.full(x.shape, -1, dtype=np.int64)
    if uniq.size:
        ku = xp.asarray(uniq)
        pos = xp.minimum(xp.searchsorted(ku, x), ku.size - 1)
        out = xp.where(ku[pos] == x, xp.asarray(last_index)[pos], out)
    if nan_index is not None:
        out = xp.where(xp.isnan(x), nan_index, out)
    return out


def string_index(keys, x: np.ndarray, first: bool = False) -> np.ndarray:
    """Host version of numeric_index for str keys (the first match when first=True),
    vectorised over a sorted unicode key array."""
    keys = str_list(keys)
    n = len(keys)
    if n == 0 or x.size == 0:
        return np.full(x.shape, -1, dtype=np.int64)
    karr = np.array(keys, dtype=str)
    if first:
        uniq, idx = np.unique(karr, return_index=True)
        pick = idx.astype(np.int64)
    else:
        uniq, first_in_rev = np.unique(karr[::-1], return_index=True)
        pick = (n - 1 - first_in_rev).astype(np.int64)
    xs = np.array([to_str(v) for v in x.reshape(-1)], dtype=str).reshape(x.shape)
    pos = np.minimum(np.searchsorted(uniq, xs), uniq.size - 1)
    return np.where(uniq[pos] == xs, pick[pos], -1)


def pick_values(xp, index, values, default):
    """values[index] where index >= 0, default elsewhere (values an xp or host array)."""
    if values.dtype == object:
        index = np.asarray(index.get() if hasattr(index, "get") else index)
        out = np.empty(index.shape, dtype=object)
        out[...] = default
        hit = index >= 0
        out[hit] = values[index[hit]]
        return out
    values = xp.asarray(values)
    if values.size == 0:
        return xp.full(index.shape, default, dtype=values.dtype)
    picked = values[xp.maximum(index, 0)]
    return xp.where(index >= 0, picked, xp.asarray(default, dtype=values.dtype))


def host_strings(t: Tensor) -> np.ndarray:
    return str_array(t.numpy())


def label_output(kernel, labels, index, using_strings: bool) -> Tensor:
    """Class labels picked by index (an xp int array): a host STRING tensor or an int64
    tensor on the kernel's device."""
    xp = kernel.xp
    if using_strings:
        idx = np.asarray(index.get() if hasattr(index, "get") else index)
        lab = np.asarray(str_list(labels) if not isinstance(labels, np.ndarray) else labels, dtype=object)
        return Tensor.wrap(lab[idx] if lab.size else np.empty(idx.shape, dtype=object), DataType.STRING)
    lab = xp.asarray(np.asarray(labels, dtype=np.int64))
    return Tensor.wrap(lab[index] if lab.size else xp.zeros(index.shape, xp.int64), DataType.INT64)
