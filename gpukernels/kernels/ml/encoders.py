"""ai.onnx.ml encoders: CastMap, CategoryMapper, DictVectorizer, LabelEncoder,
OneHotEncoder, ZipMap.

Maps are Python dicts and sequences of maps Python lists of dicts (see ``_common``).
Work on strings and maps is done on the host; numeric outputs land on the kernel's
device.  Numeric look-ups (LabelEncoder, OneHotEncoder) use sorted keys and a binary
search, on the device.
"""

from __future__ import annotations

import numpy as np

from ... import dtypes
from ...dtypes import DataType
from ...tensor import Tensor
from ..base import KernelBase, register
from ._common import (attr_array, given, host_strings, numeric_index, pick_values, str_list,
                      string_index, to_str)


def _maps(kernel, X, name="X"):
    """(list of dicts, whether a sequence was given)."""
    if isinstance(X, dict):
        return [X], False
    if isinstance(X, (list, tuple)) and all(isinstance(m, dict) for m in X):
        return list(X), True
    raise kernel.type_error(f"input '{name}' must be a map (a Python dict) or a sequence of maps "
                            f"(a list of dicts), got {type(X).__name__}")


def _format_float(v) -> str:
    # as onnxruntime's std::to_string: fixed notation, six decimals
    return "%f" % float(v)


@register(domain="ai.onnx.ml")
class CastMap(KernelBase):
    """Map int64 -> (string | float) to a [1, n] tensor ([len, n] for a list of maps),
    ordered by ascending key.  DENSE: n is the number of entries.  SPARSE: n = max_map
    and key k goes to column k (keys must lie in [0, max_map)); missing columns hold 0
    (or "0" for TO_STRING).  Casts: floats to strings in fixed notation with six
    decimals (as onnxruntime), strings parsed as numbers, floats to int64 truncate."""

    def __call__(self, X, cast_to="TO_FLOAT", map_form="DENSE", max_map=1):
        maps, _ = _maps(self, X)
        cast_to, map_form = to_str(cast_to), to_str(map_form)
        targets = {"TO_FLOAT": DataType.FLOAT, "TO_STRING": DataType.STRING, "TO_INT64": DataType.INT64}
        if cast_to not in targets:
            raise self.error(f"cast_to must be one of {sorted(targets)}, got {cast_to!r}")
        if map_form not in ("DENSE", "SPARSE"):
            raise self.error(f"map_form must be 'DENSE' or 'SPARSE', got {map_form!r}")
        out_type = targets[cast_to]
        if map_form == "SPARSE" and max_map < 0:
            raise self.error(f"max_map must be non-negative, got {max_map}")
        rows = []
        for m in maps:
            keys = np.array(sorted(int(k) for k in m), dtype=np.int64)
            if len(keys) != len(m) or any(isinstance(k, str) for k in m):
                raise self.type_error("CastMap needs int64 map keys")
            vals = [m[k] for k in keys.tolist()]
            rows.append((keys, self._cast(vals, out_type)))
        if map_form == "DENSE":
            widths = {len(k) for k, _ in rows}
            if len(widths) > 1:
                raise self.error(f"DENSE maps in a sequence must have the same size, got sizes {sorted(widths)}")
            width = widths.pop() if widths else 0
        else:
            width = int(max_map)
        pad = "0" if out_type == DataType.STRING else 0
        out = np.empty((len(rows), width), dtype=dtypes.to_numpy(out_type))
        out[...] = pad
        for r, (keys, vals) in enumerate(rows):
            if map_form == "DENSE":
                out[r, :len(vals)] = vals
            else:
                if keys.size and (keys.min() < 0 or keys.max() >= width):
                    raise self.error(f"SPARSE map keys must lie in [0, max_map={width}), got "
                                     f"[{int(keys.min())}, {int(keys.max())}]")
                out[r, keys] = vals
        if out_type == DataType.STRING:
            return Tensor.wrap(out, DataType.STRING)
        return self.result(self.xp.asarray(out), out_type)

    def _cast(self, vals, out_type):
        strings = any(isinstance(v, (str, bytes)) for v in vals)
        try:
            if out_type == DataType.STRING:
                return np.array([to_str(v) if strings else _format_float(v) for v in vals], dtype=object)
            if strings:
                arr = np.array([to_str(v) for v in vals], dtype=str)
                if out_type == DataType.INT64:
                    return arr.astype(np.float64).astype(np.int64) if arr.size else arr.astype(np.int64)
                return arr.astype(np.float32)
            arr = np.asarray(vals, dtype=np.float64)
            return arr.astype(np.float32) if out_type == DataType.FLOAT else np.trunc(arr).astype(np.int64)
        except ValueError as exc:
            raise self.error(f"cannot cast map values to {dtypes.describe(out_type)}: {exc}") from None


@register(domain="ai.onnx.ml")
class CategoryMapper(KernelBase):
    """Strings -> int64 (cats_strings[i] -> cats_int64s[i], else default_int64) or int64
    -> strings (the reverse, else default_string), chosen by the input's type.  When a
    key repeats the last pair wins (as onnxruntime, and as LabelEncoder specifies)."""

    def __call__(self, X, cats_int64s=None, cats_strings=None, default_int64=-1, default_string="_Unused"):
        x = self.tensor(X, "X")
        self.check_inputs(x)
        ints = [int(v) for v in (cats_int64s or [])]
        strs = str_list(cats_strings or [])
        if len(ints) != len(strs):
            raise self.error(f"cats_int64s ({len(ints)}) and cats_strings ({len(strs)}) differ in length", X=x)
        if x.data_type == DataType.STRING:
            idx = string_index(strs, host_strings(x))
            out = pick_values(np, idx, np.asarray(ints, dtype=np.int64), np.int64(default_int64))
            return self.result(self.xp.asarray(out), DataType.INT64)
        xp = self.xp
        idx = numeric_index(xp, np.asarray(ints, dtype=np.int64), x.array)
        out = pick_values(xp, idx, np.asarray(strs, dtype=object), to_str(default_string))
        return Tensor.wrap(out, DataType.STRING)


def _infer_value_type(values) -> DataType:
    if not values:
        return DataType.FLOAT
    v = values[0]
    if isinstance(v, (str, bytes)):
        return DataType.STRING
    if isinstance(v, np.generic):
        return dtypes.from_numpy(v.dtype).data_type
    if isinstance(v, (bool, int)):
        return DataType.INT64
    return DataType.FLOAT


@register(domain="ai.onnx.ml")
class DictVectorizer(KernelBase):
    """Map -> [1, V] tensor (a list of maps -> [len, V]), V = vocabulary size: column i
    holds the value of key vocabulary[i], or 0 ("" for string values).  Keys missing from
    the vocabulary are ignored (as onnxruntime and scikit-learn do).  The output type is
    the map's value type: str -> string, int -> int64, numpy scalars keep their type,
    Python floats -> float (ONNX map(*, float); pass numpy float64 values for double)."""

    def __call__(self, X, int64_vocabulary=None, string_vocabulary=None):
        maps, _ = _maps(self, X)
        if given(int64_vocabulary) == given(string_vocabulary):
            raise self.error("exactly one of int64_vocabulary and string_vocabulary must be set")
        string_keys = given(string_vocabulary)
        vocab = str_list(string_vocabulary) if string_keys else [int(v) for v in int64_vocabulary]
        first_values = [v for m in maps for v in m.values()][:1]
        out_type = _infer_value_type(first_values)
        pos = {}
        for i, k in enumerate(vocab):
            pos.setdefault(k, i)
        out = np.empty((len(maps), len(vocab)), dtype=dtypes.to_numpy(out_type))
        out[...] = "" if out_type == DataType.STRING else 0
        for r, m in enumerate(maps):
            keys = []
            vals = []
            for k, v in m.items():
                if string_keys != isinstance(k, (str, bytes)):
                    raise self.type_error(f"map key {k!r} does not match the "
                                          f"{'string' if string_keys else 'int64'} vocabulary")
                j = pos.get(to_str(k) if string_keys else int(k))
                if j is not None:
                    keys.append(j)
                    vals.append(to_str(v) if out_type == DataType.STRING else v)
            if keys:
                out[r, keys] = vals
        if out_type == DataType.STRING:
            return Tensor.wrap(out, DataType.STRING)
        return self.result(self.xp.asarray(out), out_type)


_LIST_ATTRS = {DataType.STRING: "strings", DataType.INT64: "int64s", DataType.FLOAT: "floats"}


@register(domain="ai.onnx.ml")
class LabelEncoder(KernelBase):
    """Maps each element through keys -> values.

    Opset 1: strings -> int64 by the index in classes_strings (first match, else
    default_int64), int64 -> strings by indexing classes_strings (out of range gives
    default_string).  Opset 2+: parallel keys_*/values_* lists (opset 4 also tensors,
    with int16/int32/double); the keys' type must equal the input's.  A repeated key:
    the last pair wins.  NaN keys match NaN inputs.  Missing keys give the default:
    default_tensor when set, else default_string / default_int64 / default_float by the
    values' type (-1 for int16/int32 values, -0.0 for double)."""

    def __call__(self, X, classes_strings=None, default_int64=-1, default_string="_Unused",
                 default_float=-0.0, keys_floats=None, keys_int64s=None, keys_strings=None,
                 values_floats=None, values_int64s=None, values_strings=None,
                 keys_tensor=None, values_tensor=None, default_tensor=None):
        x = self.tensor(X, "X")
        self.check_inputs(x)
        if self.since_version < 2:
            return self._v1(x, classes_strings, default_int64, default_string)
        keys, ktype = self._pick("keys", x, keys_floats, keys_int64s, keys_strings, keys_tensor)
        values, vtype = self._pick("values", x, values_floats, values_int64s, values_strings, values_tensor)
        if ktype != x.data_type:
            raise self.type_error(f"keys are {dtypes.describe(ktype)} but the input is "
                                  f"{dtypes.describe(x.data_type)}", X=x)
        if len(keys) != len(values):
            raise self.error(f"keys ({len(keys)}) and values ({len(values)}) differ in length", X=x)
        default = self._default(x, vtype, default_tensor, default_int64, default_string, default_float)
        xp = self.xp
        if ktype == DataType.STRING:
            idx = string_index(keys, host_strings(x))
            if vtype != DataType.STRING:
                idx = xp.asarray(idx)
        else:
            idx = numeric_index(xp, keys, x.array)
        out = pick_values(xp, idx, values, default)
        if vtype == DataType.STRING:
            return Tensor.wrap(np.asarray(out, dtype=object), DataType.STRING)
        return self.result(xp.asarray(out), vtype)

    def _v1(self, x, classes_strings, default_int64, default_string):
        classes = str_list(classes_strings or [])
        if x.data_type == DataType.STRING:
            idx = string_index(classes, host_strings(x), first=True)
            out = np.where(idx >= 0, idx, np.int64(default_int64)).astype(np.int64)
            return self.result(self.xp.asarray(out), DataType.INT64)
        if x.data_type != DataType.INT64:
            raise self.type_error("opset-1 LabelEncoder takes string or int64 input", X=x)
        xp = self.xp
        a = x.array
        idx = xp.where((a >= 0) & (a < len(classes)), a, -1)
        out = pick_values(xp, idx, np.asarray(classes, dtype=object), to_str(default_string))
        return Tensor.wrap(out, DataType.STRING)

    def _pick(self, what, x, floats, int64s, strings, tensor):
        found = []
        if given(floats):
            found.append((np.asarray(floats, dtype=np.float32), DataType.FLOAT))
        if given(int64s):
            found.append((np.asarray(int64s, dtype=np.int64), DataType.INT64))
        if given(strings):
            found.append((np.asarray(str_list(strings), dtype=object), DataType.STRING))
        if given(tensor):
            t = tensor if isinstance(tensor, Tensor) else Tensor(tensor)
            allowed = (DataType.STRING, DataType.INT64, DataType.FLOAT, DataType.INT32, DataType.INT16,
                       DataType.DOUBLE)
            if t.data_type not in allowed:
                raise self.type_error(f"{what}_tensor has unsupported type {dtypes.describe(t.data_type)}")
            found.append((attr_array(t).reshape(-1), t.data_type))
        if len(found) != 1:
            raise self.error(f"exactly one {what}_* attribute must be set, got {len(found)}", X=x)
        return found[0]

    def _default(self, x, vtype, default_tensor, default_int64, default_string, default_float):
        if given(default_tensor):
            t = default_tensor if isinstance(default_tensor, Tensor) else Tensor(default_tensor)
            if t.data_type != vtype:
                raise self.type_error(f"default_tensor is {dtypes.describe(t.data_type)} but the values are "
                                      f"{dtypes.describe(vtype)}", X=x)
            if t.size != 1:
                raise self.error(f"default_tensor must hold one element, got shape {list(t.shape)}", X=x)
            v = attr_array(t).reshape(-1)[0]
            return to_str(v) if vtype == DataType.STRING else v
        if vtype == DataType.STRING:
            return to_str(default_string)
        if vtype == DataType.INT64:
            return np.int64(default_int64)
        if vtype == DataType.FLOAT:
            return np.float32(default_float)
        if vtype == DataType.DOUBLE:
            return np.float64(-0.0)
        return dtypes.to_numpy(vtype).type(-1)


@register(domain="ai.onnx.ml")
class OneHotEncoder(KernelBase):
    """X (any shape) -> X.shape + [n_categories] float32 one-hot.  Numeric inputs are
    truncated to int64 and matched against cats_int64s, strings against cats_strings.
    An unknown value gives an all-zero row when zeros=1 and raises when zeros=0."""

    def __call__(self, X, cats_int64s=None, cats_strings=None, zeros=1):
        x = self.tensor(X, "X")
        self.check_inputs(x)
        if given(cats_int64s) == given(cats_strings):
            raise self.error("exactly one of cats_int64s and cats_strings must be set", X=x)
        xp = self.xp
        if x.data_type == DataType.STRING:
            if not given(cats_strings):
                raise self.type_error("string input needs cats_strings", X=x)
            cats = str_list(cats_strings)
            idx = xp.asarray(string_index(cats, host_strings(x), first=True))
        else:
            if not given(cats_int64s):
                raise self.type_error("numeric input needs cats_int64s", X=x)
            cats = [int(c) for c in cats_int64s]
            a = x.array
            if a.dtype.kind == "f":
                if a.size and not bool(xp.isfinite(a).all()):
                    raise self.error("input holds NaN or infinity, which has no integer category", X=x)
                a = xp.trunc(a).astype(np.int64)
            rev = np.asarray(cats, dtype=np.int64)[::-1]
            idx = numeric_index(xp, rev, a.astype(np.int64))
            idx = xp.where(idx >= 0, len(cats) - 1 - idx, -1)
        if not zeros and idx.size and bool((idx < 0).any()):
            raise self.error("input holds a value that is not a category (zeros=0)", X=x)
        y = (idx[..., None] == xp.arange(len(cats))).astype(np.float32)
        return self.result(y, DataType.FLOAT)


@register(domain="ai.onnx.ml")
class ZipMap(KernelBase):
    """[N, C] float tensor -> a list of N dicts {label: value} (a 1-D [C] input gives one
    dict).  C must equal the number of labels.  Runs on the host; values are Python
    floats, keys str or int."""

    def __call__(self, X, classlabels_int64s=None, classlabels_strings=None):
        x = self.tensor(X, "X")
        self.check_inputs(x)
        if given(classlabels_int64s) == given(classlabels_strings):
            raise self.error("exactly one of classlabels_int64s and classlabels_strings must be set", X=x)
        labels = str_list(classlabels_strings) if given(classlabels_strings) else \
            [int(v) for v in classlabels_int64s]
        if x.ndim not in (1, 2):
            raise self.error("X must be 1-D or 2-D", X=x)
        rows = x.numpy().reshape(1, -1) if x.ndim == 1 else x.numpy()
        if rows.shape[1] != len(labels):
            raise self.error(f"X has {rows.shape[1]} columns for {len(labels)} labels", X=x)
        return [dict(zip(labels, r)) for r in rows.tolist()]


__all__ = ["CastMap", "CategoryMapper", "DictVectorizer", "LabelEncoder", "OneHotEncoder", "ZipMap"]
