"""Every kernel's array function against the kernel itself (KernelBase.array_function).

The kernel classes that define an array function are found in the registry, so a new
one is covered without being listed here.  For each registered version, each element
type its schema allows for the first input (from a fixed list of storage types), and a
few input sets and attributes (with and without the schema's defaults filled in, as the
runtime binds them), ``f(*arrays)`` must give the kernel's own result to the bit: the
same array class, storage dtype, shape and bytes.  An array function may decline (None:
half types, legacy broadcasting, the GPU for Conv), but on the host each kernel must give
one for some case, so that the comparison is never empty.  Inputs are random, non-zero,
and for the elementwise kernels include NaN, infinities and signed zeros.

A kernel whose inputs do not fit the default (same-shaped, broadcasting elementwise
operands) needs an entry in CASES; without one its test fails with the kernel's error.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from gpukernels import dtypes
from gpukernels.dtypes import DataType
from gpukernels.kernels.base import (
    KernelBase,
    KernelContext,
    lookup,
    registered,
    schema_input_types,
)
from gpukernels.kernels.tensor._common import schema_type_param
from gpukernels.runtime.attributes import attribute_value
from gpukernels.tensor import Tensor

# storage types tried, where the schema allows them for the first input
TYPES = (DataType.FLOAT, DataType.DOUBLE, DataType.FLOAT16, DataType.BFLOAT16, DataType.INT8,
         DataType.INT32, DataType.INT64, DataType.UINT8, DataType.UINT64, DataType.BOOL)


def _with_array_functions() -> list:
    """(domain, op_type) of every registered kernel class defining array_function, as
    pytest parameters."""
    found = []
    for (domain, op), versions in sorted(registered().items()):
        if any(lookup(op, domain, v)[0].array_function is not KernelBase.array_function for v in versions):
            found.append(pytest.param(domain, op, id=f"{domain}.{op}" if domain else op))
    return found


# ---------------------------------------------------------------- inputs per operator


def _values(rng, shape, data_type, special=False):
    """Random non-zero values of data_type (an integer never 0: a divisor stays valid);
    special: floats include NaN, +-inf and +-0 at the start."""
    info = dtypes.info(data_type)
    if info.kind == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    if info.kind in ("int", "uint"):
        v = rng.integers(1, 10, shape)
        if info.kind == "int":
            v = v * rng.choice([-1, 1], shape)
        return v.astype(info.numpy)
    v = rng.standard_normal(shape) * 2
    if special and v.size >= 5:
        v.reshape(-1)[:5] = [np.nan, np.inf, -np.inf, 0.0, -0.0]
    return v.astype(info.numpy)


def _elementwise(rng, version, dt, n_inputs):
    """Same-shaped operands and, where NumPy broadcasting applies (opset 7+), a
    broadcasting second operand and 0-d operands."""
    shapes = [[(2, 3, 4)] * n_inputs]
    if n_inputs == 2 and version >= 7:
        shapes += [[(2, 3, 4), (3, 1)], [(), ()]]
    elif n_inputs == 1:
        shapes.append([()])
    return [([_values(rng, s, dt, special=True) for s in ss], {}) for ss in shapes]


def _matmul(rng, version, dt, n_inputs):
    shapes = [((3, 4), (4, 5)), ((2, 3, 4), (4,)), ((4,), (4, 5)), ((2, 1, 3, 4), (5, 4, 2)),
              ((2, 3, 4), (4, 5)), ((2, 1, 3, 4), (4, 5)), ((2, 0, 4), (4, 5))]
    return [([_values(rng, a, dt), _values(rng, b, dt)], {}) for a, b in shapes]


def _gemm(rng, version, dt, n_inputs):
    cases = []
    for attrs in ({}, {"alpha": 0.5, "beta": 2.0}, {"transA": 1, "alpha": 3.0}, {"transB": 1, "beta": -1.5},
                  {"transA": 1, "transB": 1, "alpha": 0.25, "beta": 0.75}):
        a = _values(rng, (4, 3) if attrs.get("transA") else (3, 4), dt)
        b = _values(rng, (5, 4) if attrs.get("transB") else (4, 5), dt)
        for c in ((3, 5), (5,), (3, 1), None):
            if c is None and version < 11:
                continue
            cases.append(([a, b] + ([] if c is None else [_values(rng, c, dt)]), attrs))
    return cases


def _clip(rng, version, dt, n_inputs):
    x = _values(rng, (2, 3, 4), dt, special=True)
    if version < 11:
        return [([x], {}), ([x], {"min": -0.5, "max": 1.5}), ([x], {"max": 0.25})]
    lo, hi = np.sort(_values(rng, (2,), dt))
    return [([x], {}), ([x, np.asarray(lo)], {}), ([x, np.asarray(lo), np.asarray(hi)], {}),
            ([x, np.asarray(hi), np.asarray(lo)], {})]


def _conv(rng, version, dt, n_inputs):
    cases = [((1, 4, 6, 5), (6, 4, 3, 3), {"pads": [1, 1, 1, 1]}),
             ((2, 4, 6, 5), (4, 1, 3, 3), {"group": 4, "strides": [2, 1], "pads": [1, 0, 1, 1]}),
             ((1, 3, 7), (2, 3, 1), {}),
             ((1, 2, 6, 6), (4, 2, 2, 2), {"auto_pad": "SAME_UPPER", "dilations": [2, 1]})]
    out = []
    for xs, ws, attrs in cases:
        x, w, b = _values(rng, xs, dt), _values(rng, ws, dt), _values(rng, (ws[0],), dt)
        out += [([x, w], attrs), ([x, w, b], attrs)]
    return out


def _with_attrs(*attr_sets):
    """The elementwise inputs under each of the given attribute sets."""
    def cases(rng, version, dt, n_inputs):
        base = _elementwise(rng, version, dt, n_inputs)
        return [(inputs, attrs) for inputs, _ in base for attrs in attr_sets]
    return cases


# --- rows, shapes and layout (issue 15, session 5: compiled graphs call these as arrays)


def _rows(rng, version, dt, n_inputs):
    """Softmax-family inputs at several axes (negative included), NaN/inf among them."""
    x = _values(rng, (2, 3, 4), dt, special=True)
    return [([x], {"axis": a}) for a in (0, 1, -1, 2)] + [([x[0]], {})]


def _norms(bias: bool):
    """LayerNormalization (bias: with and without B) / RMSNormalization inputs:
    parameters over the last one or two axes, with leading 1s, broadcast, and stash_type
    1 or X's own type."""
    def cases(rng, version, dt, n_inputs):
        x = _values(rng, (2, 3, 4), dt)
        own = {} if dt != DataType.DOUBLE else {"stash_type": int(DataType.DOUBLE)}
        out = []
        for axis, shape in ((-1, (4,)), (1, (3, 4)), (-1, (1, 1, 4)), (1, (3, 1)), (-2, (1,))):
            params = [_values(rng, shape, dt) for _ in range(2 if bias else 1)]
            for n in range(1, len(params) + 1):
                out.append(([x, *params[:n]], {"axis": axis, "epsilon": 1e-3, **own}))
        return out
    return cases


def _reshape(rng, version, dt, n_inputs):
    x = _values(rng, (2, 3, 4), dt)
    return [([x, np.array(s, np.int64)], a) for s, a in (([4, -1], {}), ([0, 12], {}), ([2, 0, 4], {}),
                                                             ([24], {}), ([2, 3, 4, 1], {"allowzero": 1}))
            if version >= 14 or not a]


def _transpose(rng, version, dt, n_inputs):
    x = _values(rng, (2, 3, 4), dt)
    return [([x], {}), ([x], {"perm": [0, 2, 1]}), ([x], {"perm": [-1, 0, 1]})]


def _concat(rng, version, dt, n_inputs):
    parts = [_values(rng, (2, k, 4), dt) for k in (1, 3, 2)]
    return [(parts, {"axis": 1}), (parts[:1], {"axis": -2}), ([parts[0], parts[0]], {"axis": 0})]


# --- indexing, shapes, casts and variadic ops (issue 15, session 6: per-node cost of the
# unrolled state-space exports)


def _indices(rng, shape, size, dtype=np.int64):
    """Random indices in [-size, size), negatives included."""
    return rng.integers(-size, size, shape).astype(dtype)


def _gather(rng, version, dt, n_inputs):
    x = _values(rng, (3, 4, 5), dt)
    return [([x, _indices(rng, (), 4)], {"axis": 1}), ([x, _indices(rng, (2, 3), 3)], {}),
            ([x, _indices(rng, (6,), 5, np.int32)], {"axis": -1}), ([x, np.array([-1], np.int64)], {"axis": 1}),
            ([x, np.zeros((0,), np.int64)], {"axis": 2})]


def _gather_elements(rng, version, dt, n_inputs):
    """Indices as large as data, smaller along the other axes (a window of data),
    negative ones, int32 indices, the last axis."""
    x = _values(rng, (3, 4, 5), dt)
    return [([x, _indices(rng, (3, 4, 5), 3)], {}),
            ([x, _indices(rng, (2, 6, 3), 4)], {"axis": 1}),
            ([x, -_indices(rng, (3, 2, 5), 5, np.int32) - 1], {"axis": -1}),
            ([x, _indices(rng, (1, 1, 7), 5)], {"axis": 2})]


def _arg_reduce(rng, version, dt, n_inputs):
    """Each axis (negative too), keepdims 0, ties (repeated values: the first or, from
    opset 12, the last index), a 1-D input."""
    x = _values(rng, (3, 4, 5), dt)
    ties = np.repeat(_values(rng, (3, 1, 5), dt), 4, axis=1)
    cases = [([x], {}), ([x], {"axis": 2}), ([x], {"axis": -2, "keepdims": 0}),
             ([ties], {"axis": 1}), ([_values(rng, (7,), dt)], {"keepdims": 0})]
    if version >= 12:
        cases += [([ties], {"axis": 1, "select_last_index": 1}), ([x], {"axis": 0, "select_last_index": 1})]
    return cases


def _topk(rng, version, dt, n_inputs):
    """K as a 1-D tensor (opset 10+), each axis, smallest, k of 0 and of the whole axis,
    ties (repeated values); opset 1 (k an attribute) has none."""
    if version < 10 or dtypes.info(dt).kind == "bool":
        return []
    x = _values(rng, (3, 4, 5), dt)
    ties = np.repeat(_values(rng, (3, 1, 5), dt), 4, axis=1)
    k = lambda v: np.array([v], np.int64)  # noqa: E731
    cases = [([x, k(2)], {}), ([x, k(3)], {"axis": 1}), ([x, k(0)], {"axis": 0}), ([x, k(5)], {"axis": -1}),
             ([ties, k(3)], {"axis": 1}), ([_values(rng, (9,), dt), k(4)], {})]
    if version >= 11:
        cases += [([x, k(2)], {"largest": 0}), ([ties, k(2)], {"axis": 1, "largest": 0, "sorted": 0})]
    return cases


def _gather_nd(rng, version, dt, n_inputs):
    x = _values(rng, (3, 4, 5), dt)
    cases = [([x, np.stack([_indices(rng, (2, 6), 3), _indices(rng, (2, 6), 4)], -1)], {}),
             ([x, _indices(rng, (4, 1), 3)], {})]
    if version >= 12:
        cases.append(([x, _indices(rng, (3, 2, 1), 4)], {"batch_dims": 1}))
    return cases


def _squeeze(rng, version, dt, n_inputs):
    x = _values(rng, (1, 3, 1, 4), dt)
    axes = ([0], [-2], [0, 2])
    if version >= 13:
        return [([x, np.array(a, np.int64)], {}) for a in axes] + [([x], {})]
    return [([x], {"axes": a}) for a in axes] + [([x], {})]


def _unsqueeze(rng, version, dt, n_inputs):
    x = _values(rng, (3, 4), dt)
    axes = ([0], [-1], [1, 3], [2, 0])
    if version >= 13:
        return [([x, np.array(a, np.int64)], {}) for a in axes]
    return [([x], {"axes": a}) for a in axes]


def _expand(rng, version, dt, n_inputs):
    x = _values(rng, (3, 1), dt)
    return [([x, np.array(s, np.int64)], {}) for s in ([3, 4], [2, 1, 5], [1], [1, 1])]


def _cast(to_types):
    """Cast to each of to_types the opset allows; floats scaled so that some overflow
    the small and integer targets."""
    def cases(rng, version, dt, n_inputs):
        x = _values(rng, (2, 3, 4), dt, special=True)
        if dtypes.info(dt).kind == "float":
            x = (x.astype(np.float32) * 100).astype(x.dtype)
        allowed = schema_type_param("Cast", version, "T2")
        return [([x], {"to": int(to)}) for to in to_types if to in allowed]
    return cases


def _cast_like(rng, version, dt, n_inputs):
    x = _values(rng, (2, 3, 4), dt, special=True)
    return [([x, _values(rng, (2,), to)], {}) for to in (DataType.FLOAT, DataType.INT8, DataType.FLOAT16,
                                                          DataType.BOOL, DataType.UINT64)]


def _scatter_elements(rng, version, dt, n_inputs):
    x = _values(rng, (3, 4, 5), dt)
    reductions = ["none"] + (["add", "mul"] if version >= 16 else []) + (["max", "min"] if version >= 18 else [])
    out = []
    for axis, ishape in ((1, (3, 1, 5)), (0, (2, 4, 3)), (-1, (3, 4, 2))):
        idx = _indices(rng, ishape, x.shape[axis])
        u = _values(rng, ishape, dt)
        for red in reductions if version >= 16 else [None]:
            out.append(([x, idx, u], {"axis": axis} if red is None else {"axis": axis, "reduction": red}))
    return out


def _scatter_nd(rng, version, dt, n_inputs):
    x = _values(rng, (3, 4, 5), dt)
    reductions = ["none"] + (["add", "mul"] if version >= 16 else []) + (["max", "min"] if version >= 18 else [])
    out = []
    for ishape in ((2, 1), (3, 2), (2, 3)):
        idx = np.stack([_indices(rng, ishape[:-1], x.shape[j]) for j in range(ishape[-1])], axis=-1)
        u = _values(rng, ishape[:-1] + x.shape[ishape[-1]:], dt)
        out += [([x, idx, u], {} if red == "none" else {"reduction": red}) for red in reductions]
    return out


def _where(rng, version, dt, n_inputs):
    x, y = _values(rng, (2, 3, 4), dt, special=True), _values(rng, (3, 1), dt)
    cond = rng.integers(0, 2, (2, 1, 4)).astype(bool)
    return [([cond, x, y], {}), ([cond[0, 0], y, x[0]], {}), ([np.array(True), x, x], {})]


def _slice(rng, version, dt, n_inputs):
    x = _values(rng, (4, 5, 6), dt)
    specs = [([1], [3], None, None), ([0, -1], [4, 2], [1, 0], None), ([-1, 5], [-100, 0], [2, 1], [-2, -1]),
             ([2**62], [-2**62], [0], [-1]), ([1, 0], [2**62, 6], [-1, 0], [2, 3])]
    out = []
    for st, en, ax, sp in specs:
        if version < 10:
            if sp is None:
                out.append(([x], {"starts": st, "ends": en, **({"axes": ax} if ax else {})}))
            continue
        args = [np.array(st, np.int64), np.array(en, np.int64)]
        if ax is not None:
            args.append(np.array(ax, np.int64))
            if sp is not None:
                args.append(np.array(sp, np.int64))
        out.append(([x, *args], {}))
    return out


def _split(rng, version, dt, n_inputs):
    x = _values(rng, (4, 6, 3), dt)
    cases = [([x], {"axis": 1, "num_outputs": 3} if version >= 18 else {"axis": 1, "split": [2, 2, 2]}),
             ([x], {"axis": 0, "num_outputs": 3} if version >= 18 else {"axis": 0, "split": [1, 3]})]
    if version >= 13:
        cases.append(([x, np.array([1, 4, 1], np.int64)], {"axis": -2}))
    elif version < 2:
        cases.append(([x], {"axis": -2, "split": [5, 1]}))
    else:
        cases.append(([x], {"axis": -1, "split": [1, 2]}))
    return cases


def _pad(rng, version, dt, n_inputs):
    """Opset 11+ (pads an input): each mode, negative pads, a constant value, axes."""
    x = _values(rng, (2, 3, 4), dt)
    modes = ["constant", "reflect", "edge"] + (["wrap"] if version >= 19 else [])
    pads = np.array([0, 1, 2, 1, -1, 3], np.int64)
    out = [([x, pads], {"mode": m}) for m in modes]
    out.append(([x, pads, _values(rng, (), dt)], {"mode": "constant"}))
    if version >= 18:
        out.append(([x, np.array([2, 0, 1, 3], np.int64), _values(rng, (), dt), np.array([-1, 0], np.int64)],
                    {"mode": "reflect"}))
    return out if version >= 11 else []


def _global_pool(rng, version, dt, n_inputs):
    """N x C x D1 ... inputs (rank 3 to 5)."""
    return [([_values(rng, shape, dt, special=True)], {}) for shape in ((2, 3, 4, 5), (1, 2, 7), (1, 2, 2, 3, 2))]


def _variadic(rng, version, dt, n_inputs):
    shapes = [[(2, 3, 4)], [(2, 3, 4)] * 3]
    if version >= 8:
        shapes += [[(2, 3, 4), (3, 1)], [(4,), (2, 1, 1), (3, 1)], [(), ()]]
    return [([_values(rng, s, dt, special=True) for s in ss], {}) for ss in shapes]


# --- reductions, Softplus and InstanceNormalization (issue 15, session 6b: kernels still
# called whole in the CNN heads and transformer exports)


def _reduce(axes_input_since: int):
    """Axes as an attribute or, from axes_input_since, an input; negative ones, none,
    keepdims 0/1, noop_with_empty_axes where the opset has it, an empty reduction;
    NaN/inf among the values."""
    def cases(rng, version, dt, n_inputs):
        x = _values(rng, (2, 3, 4), dt, special=True)
        as_input = version >= axes_input_since
        out = []
        for axes in ([1], [-1], [0, 2], [], None):
            for keep in (0, 1):
                if axes is None:
                    out.append(([x], {"keepdims": keep}))
                elif as_input:
                    out.append(([x, np.array(axes, np.int64)], {"keepdims": keep}))
                else:
                    out.append(([x], {"keepdims": keep, **({"axes": axes} if axes else {})}))
        if as_input:
            out += [([x, np.zeros((0,), np.int64)], {"noop_with_empty_axes": 1}),
                    ([x], {"noop_with_empty_axes": 1}), ([x[:, :0], np.array([1], np.int64)], {})]
        return out
    return cases


def _pow(rng, version, dt, n_inputs):
    """The elementwise operands, then one-element exponents: the product ones (0, 1, 2,
    3, 4, -1, 0.5), another, an integer one and one of higher rank (broadcast)."""
    x = _values(rng, (2, 3, 4), dt, special=True)
    etype = x.dtype if version < 12 else np.float32  # T1 is T before opset 12 (no bfloat16 in T1 at 12-14)
    cases = [([a, b.astype(etype)], attrs) for (a, b), attrs in _elementwise(rng, version, dt, 2)]
    if version < 7:
        return cases
    floats = dtypes.info(dt).kind == "float"
    exps = (2.0, 3.0, 4.0, 0.5, -1.0, 0.0, 1.0, 1.7) if floats else (2, 3, 0, 1)
    cases += [([x, np.asarray(e).astype(etype)], {}) for e in exps]
    if version >= 12:
        cases += [([x, np.array([2], np.int64)], {}), ([x[0], np.full((1, 1, 1), 2.0)], {})]
    return cases


def _instance_norm(rng, version, dt, n_inputs):
    """Ranks 2 to 5 (rank 2 normalises single values), with and without an epsilon."""
    out = []
    for shape in ((2, 3), (2, 3, 5), (1, 4, 3, 2), (1, 2, 2, 3, 2)):
        x, s, b = _values(rng, shape, dt), _values(rng, (shape[1],), dt), _values(rng, (shape[1],), dt)
        out += [([x, s, b], {}), ([x, s, b], {"epsilon": 1e-2})]
    return out


def _flatten(rng, version, dt, n_inputs):
    """Every axis of a rank-3 input, negative ones from opset 11."""
    x = _values(rng, (2, 3, 4), dt)
    return [([x], {"axis": a}) for a in range(-3 if version >= 11 else 0, 4)] + [([x], {})]


def _quantize(rng, version, dt, n_inputs):
    """QuantizeLinear of a float x (NaN/inf among its values) to uint8 and int8, per tensor
    and (opset 13+) per axis, with and without a zero point."""
    if dtypes.info(dt).kind != "float":
        return []
    x = _values(rng, (2, 3, 4), dt, special=True)
    stype = x.dtype if version >= 19 else np.float32
    out = []
    for zt in (np.uint8, np.int8):
        z = np.array(7, zt)
        s = np.array(0.05, stype)
        out += [([x, s, z], {}), ([x, s], {})]
        if version >= 13:
            zs, ss = np.array([3, 0, 9], zt), np.array([0.05, 0.2, 0.01], stype)
            out.append(([x, ss, zs], {"axis": 1}))
    return out


def _dequantize(rng, version, dt, n_inputs):
    """DequantizeLinear of an integer x, per tensor and (opset 13+) per axis."""
    if dtypes.info(dt).kind not in ("int", "uint"):
        return []
    x = _values(rng, (2, 3, 4), dt)
    zero = 0 if dt == DataType.INT32 else 5
    out = [([x, np.array(0.05, np.float32), np.array(zero, x.dtype)], {}), ([x, np.array(0.05, np.float32)], {})]
    if version >= 13:
        out.append(([x, np.array([0.05, 0.2, 0.01], np.float32), np.full(3, zero, x.dtype)], {"axis": 1}))
    return out


def _attention(rng, version, dt, n_inputs):
    """Attention (one output): 4-D heads, 3-D with head counts (grouped), a boolean and a
    float mask, causal, a scale, past key/value."""
    if dtypes.info(dt).kind != "float":
        return []
    q, k, v = (_values(rng, s, dt) for s in ((2, 2, 3, 4), (2, 2, 5, 4), (2, 2, 5, 4)))
    q3, k3, v3 = (_values(rng, s, dt) for s in ((2, 3, 8), (2, 5, 4), (2, 5, 4)))
    past_k, past_v = _values(rng, (2, 2, 1, 4), dt), _values(rng, (2, 2, 1, 4), dt)
    return [([q, k, v], {}),
            ([q, k, v], {"is_causal": 1, "scale": 0.3}),
            ([q, k, v, rng.integers(0, 2, (3, 5)).astype(bool)], {}),
            ([q, k, v, _values(rng, (2, 1, 3, 5), dt)], {}),
            ([q3, k3, v3], {"q_num_heads": 2, "kv_num_heads": 1}),
            ([q, k, v, _values(rng, (3, 6), dt), past_k, past_v], {})]


# --- MaxPool / AveragePool (issue 15, session 8: geometry checked once per compiled node)


def _pool(op):
    """Windows with padding, strides (the resnet stem's k3 s2 p1), ceil_mode, dilations,
    SAME padding, count_include_pad and a 1-D and 3-D input; NaN and infinities among
    the values (max propagates NaN)."""
    return lambda rng, version, dt, n_inputs: _pool_cases(op, rng, version, dt)


def _pool_cases(op, rng, version, dt):
    x2 = _values(rng, (2, 3, 9, 8), dt, special=True)
    cases = [([x2], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
             ([x2], {"kernel_shape": [2, 2], "strides": [2, 2]}),
             ([x2], {"kernel_shape": [3, 2], "auto_pad": "SAME_UPPER", "strides": [2, 1]}),
             ([x2], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
             ([_values(rng, (2, 2, 7), dt)], {"kernel_shape": [3], "strides": [2], "pads": [0, 1]}),
             ([_values(rng, (1, 2, 4, 5, 6), dt)], {"kernel_shape": [2, 2, 2], "strides": [2, 2, 2]})]
    if version >= 10:
        cases.append(([x2], {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}))
    if version >= 11:
        cases.append(([x2], {"kernel_shape": [3, 3], "strides": [2, 2], "dilations": [2, 1], "pads": [1, 0, 2, 1]}))
    if op == "AveragePool":
        cases.append(([x2], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}))
    return cases


def _resize(rng, version, dt, n_inputs):
    """Resize by scales and by sizes (roi and scales omitted as None, as the runtime passes
    Resize(X, '', '', sizes)), nearest and linear and cubic modes, axes, a policy, and
    tf_crop_and_resize with a roi; opset 10 (Resize(X, scales)) has none."""
    if version < 11 or dtypes.info(dt).kind == "bool":
        return []
    x = _values(rng, (2, 3, 4, 5), dt)
    scales = np.array([1, 1, 2, 1.5], np.float32)
    sizes = np.array([2, 3, 7, 3], np.int64)
    cases = [([x, None, scales], {}),
             ([x, None, None, sizes], {}),
             ([x, np.array([], np.float32), scales], {"mode": "nearest", "nearest_mode": "floor"})]
    if dtypes.info(dt).kind == "float":
        cases += [([x, None, None, sizes], {"mode": "linear", "coordinate_transformation_mode": "align_corners"}),
                  ([x, None, scales], {"mode": "cubic"}),
                  ([x, np.array([0, 0, 0.1, 0.2, 1, 1, 0.9, 0.7], np.float32), None, sizes],
                   {"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize",
                    "extrapolation_value": 2.5})]
        if version >= 18:
            cases += [([x, None, None, np.array([6, 4], np.int64)],
                       {"mode": "linear", "axes": [2, 3], "keep_aspect_ratio_policy": "not_larger"})]
    return cases


CASES = {
    "Resize": _resize,
    "Attention": _attention,
    "QuantizeLinear": _quantize,
    "DequantizeLinear": _dequantize,
    "Flatten": _flatten,
    "GlobalAveragePool": _global_pool,
    "GlobalMaxPool": _global_pool,
    "GlobalLpPool": _global_pool,
    "Pad": _pad,
    "Where": _where,
    "Slice": _slice,
    "Split": _split,
    "Gather": _gather,
    "GatherND": _gather_nd,
    "GatherElements": _gather_elements,
    "TopK": _topk,
    "ArgMax": _arg_reduce,
    "ArgMin": _arg_reduce,
    "Squeeze": _squeeze,
    "Unsqueeze": _unsqueeze,
    "Expand": _expand,
    "Cast": _cast((DataType.FLOAT, DataType.DOUBLE, DataType.FLOAT16, DataType.BFLOAT16, DataType.INT8,
                   DataType.INT32, DataType.INT64, DataType.UINT8, DataType.BOOL, DataType.FLOAT8E4M3FN)),
    "CastLike": _cast_like,
    "ScatterElements": _scatter_elements,
    "Scatter": _scatter_elements,
    "ScatterND": _scatter_nd,
    "Max": _variadic,
    "Min": _variadic,
    "Sum": _variadic,
    "Mean": _variadic,
    "Softmax": _rows,
    "LogSoftmax": _rows,
    "Hardmax": _rows,
    "LayerNormalization": _norms(bias=True),
    "RMSNormalization": _norms(bias=False),
    "Reshape": _reshape,
    "Transpose": _transpose,
    "Concat": _concat,
    "MatMul": _matmul,
    "Gemm": _gemm,
    "Clip": _clip,
    "Conv": _conv,
    "HardSigmoid": _with_attrs({}, {"alpha": 0.3, "beta": 0.4}),
    "Swish": _with_attrs({}, {"alpha": 1.5}),
    "Gelu": _with_attrs({}, {"approximate": "tanh"}, {"approximate": "none"}),
    "InstanceNormalization": _instance_norm,
    "ReduceSum": _reduce(13),
    **{op: _reduce(18) for op in ("ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
                              "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp")},
    "MaxPool": _pool("MaxPool"),
    "AveragePool": _pool("AveragePool"),
    "Pow": _pow,
}


# operators whose array function serves nodes that ask for the first output only
FIRST_OUTPUT_ONLY = {"Attention"}
# operators whose array function returns every output (a tuple)
SEVERAL_OUTPUTS = {"Split", "TopK"}


def _schema_defaults(op, domain, version) -> dict:
    """The schema's attribute defaults as the runtime binds them."""
    schema = onnx.defs.get_schema(op, version, domain)
    out = {}
    for name, spec in schema.attributes.items():
        default = spec.default_value
        if default is not None and default.type != onnx.AttributeProto.UNDEFINED and default.name:
            out[name] = attribute_value(default)
    return out


# ---------------------------------------------------------------------------- the test


def _host(array):
    return array.get() if hasattr(array, "get") else np.asarray(array)


def _check_same(kernel, inputs, attrs) -> bool:
    """Whether kernel.array_function gave a function; if so, that it equals the kernel."""
    tensors = [None if x is None else kernel.tensor(x) for x in inputs]  # None: an omitted input
    with np.errstate(all="ignore"):  # NaN and infinities are among the inputs
        want = kernel(*tensors, **attrs)
    several = not isinstance(want, Tensor) and kernel.op_type in SEVERAL_OUTPUTS  # a tuple, one per output
    wants = [t.array for t in want] if several else [(want if isinstance(want, Tensor) else want[0]).array]
    fn = kernel.array_function(tensors, dict(attrs))
    if fn is None:
        return False
    where = (f"{kernel.op_type}-{kernel.since_version} on {kernel.device}, inputs "
             f"{[None if t is None else f'{t.array.dtype}{list(t.shape)}' for t in tensors]}, attributes {attrs}")
    try:
        with np.errstate(all="ignore"):  # IEEE events: the runtime redoes such calls (base.py)
            got = fn(*[None if t is None else t.array for t in tensors])
    except Exception as exc:  # noqa: BLE001 -- named in the failure
        pytest.fail(f"{where}: the array function raised {type(exc).__name__}: {exc} "
                    f"where the kernel succeeded")
    if several:
        assert got.__class__ is tuple and len(got) == len(wants), \
            f"{where}: {type(got).__name__} of {len(got)} for {len(wants)} outputs"
    gots = got if several else (got,)
    for got, want in zip(gots, wants):
        assert got.__class__ is want.__class__, f"{where}: array class {got.__class__} != {want.__class__}"
        assert got.dtype == want.dtype and got.shape == want.shape, \
            f"{where}: {got.dtype}{list(got.shape)} != the kernel's {want.dtype}{list(want.shape)}"
        g, w = _host(got), _host(want)
        assert g.tobytes() == w.tobytes(), f"{where}: values differ from the kernel's\n{g}\n{w}"
    return True


@pytest.mark.parametrize("domain, op", _with_array_functions())
def test_array_function_equals_kernel(domain, op, device):
    rng = np.random.default_rng(2024)
    build = CASES.get(op)
    given = 0
    for version in registered()[(domain, op)]:
        cls, _ = lookup(op, domain, version)
        if cls.array_function is KernelBase.array_function:
            continue
        kernel = cls(KernelContext(device), version)
        if op in FIRST_OUTPUT_ONLY:
            kernel.requested_outputs = (True,)  # as the runtime binds a node with one output
        formals = schema_input_types(op, domain, version)
        allowed = formals[0][2] if formals else None
        required = onnx.defs.get_schema(op, version, domain).min_input
        for dt in TYPES:
            if allowed is not None and dt not in allowed:
                continue
            cases = build(rng, version, dt, required) if build else _elementwise(rng, version, dt, required)
            for inputs, attrs in cases:
                for bound in (attrs, {**_schema_defaults(op, domain, version), **attrs}):
                    given += _check_same(kernel, inputs, bound)
    if device == "cpu":
        assert given, f"{op}: array_function gave no function for any case; add a case to CASES"


def test_the_registry_has_array_functions():
    """The introspection finds the kernels known to define one (it is not empty)."""
    ops = {p.values[1] for p in _with_array_functions()}
    assert {"Add", "Div", "Relu", "Sqrt", "Tanh", "MatMul", "Gemm", "Clip", "Conv", "Gather", "Cast",
            "Unsqueeze", "Squeeze", "Expand", "ScatterElements", "ScatterND", "Max", "Slice", "Split",
            "Where", "Equal", "Greater", "IsNaN", "Pad", "GatherND", "And", "Not"} <= ops


# ------------------------------------------ values the recorded call did not have


def _kernel(op, version):
    return lookup(op, "", version)[0](KernelContext("cpu"), version)


def _tensors(*arrays):
    return [Tensor.wrap(a, dtypes.from_numpy(a.dtype).data_type) for a in arrays]


def test_array_functions_raise_where_the_kernel_would_differ_or_refuse():
    """An index out of range, or shape-like values other than the recorded call's, raise
    (the runtime then redoes the node through the kernel), never a wrong result."""
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    gather = _kernel("Gather", 13).array_function(_tensors(x, np.int64(1)), {"axis": 1})
    for bad in (np.int64(3), np.int64(-4)):
        with pytest.raises(Exception, match="out of range"):
            gather(x, bad)
    assert gather(x, np.int64(-1)).tolist() == x[:, 2].tolist()
    idx, upd = np.zeros((2, 1, 4), np.int64), np.ones((2, 1, 4), np.float32)
    scatter = _kernel("ScatterElements", 18).array_function(_tensors(x, idx, upd), {"axis": 1})
    with pytest.raises(Exception, match="out of range"):
        scatter(x, idx + 3, upd)
    guarded = [("Reshape", 14, [x, np.int64([4, -1])], {}, [np.int64([-1, 4])]),
               ("Unsqueeze", 13, [x, np.int64([0])], {}, [np.int64([1])]),
               ("Squeeze", 13, [x[:1], np.int64([0])], {}, [np.int64([-3])]),
               ("Expand", 13, [x, np.int64([2, 1, 1])], {}, [np.int64([1, 1, 1])]),
               ("Slice", 13, [x, np.int64([0]), np.int64([2])], {}, [np.int64([1]), np.int64([2])]),
               ("Split", 18, [x, np.int64([1, 2])], {"axis": 1}, [np.int64([2, 1])]),
               ("Pad", 18, [x, np.int64([0, 1, 1, 0]), np.float32(2), np.int64([0, 2])], {},
                [np.int64([1, 0, 1, 0]), np.float32(2), np.int64([0, 2])])]
    for op, version, inputs, attrs, other in guarded:
        fn = _kernel(op, version).array_function(_tensors(*inputs), attrs)
        fn(*inputs)
        with pytest.raises(ValueError, match=f"{op}: .* (is|are) not the compiled"):
            fn(inputs[0], *other)


def test_compiled_graphs_run_these_nodes_as_arrays():
    """A Session's compiled plan runs Gather, Split (several outputs, one omitted),
    Unsqueeze, Slice, Where, Cast, Max, Greater, ScatterElements, Pad (a trailing omitted
    input) and And as array functions,
    bitwise equal to the general path; an index out of range at run time still raises
    the kernel's error."""
    from onnx import TensorProto as TP
    from onnx import helper as oh

    from gpukernels.errors import GpuKernelsError
    from gpukernels.runtime import Session
    from tests.graphs import init, model_of, vi

    nodes = [
        oh.make_node("Gather", ["x", "t"], ["row"], axis=1),                     # [2, 6]
        oh.make_node("Split", ["row", "sizes"], ["a", "", "c"], axis=1),         # [2,1], -, [2,3]
        oh.make_node("Unsqueeze", ["c", "ax1"], ["c3"]),                         # [2, 1, 3]
        oh.make_node("Slice", ["x", "st", "en", "ax"], ["xs"]),                  # [1, 5, 6]
        oh.make_node("Greater", ["a", "zero"], ["pos"]),
        oh.make_node("Where", ["pos", "c", "a"], ["w"]),
        oh.make_node("Cast", ["w"], ["w64"], to=TP.DOUBLE),
        oh.make_node("Max", ["w", "c"], ["m"]),
        oh.make_node("ScatterElements", ["x", "si", "c3"], ["sc"], axis=1),
        oh.make_node("Pad", ["sc", "pads", ""], ["padded"]),                     # trailing omitted input
        oh.make_node("And", ["pos", "pos"], ["both"]),
        oh.make_node("Cast", ["both"], ["both_f"], to=TP.FLOAT),
    ]
    model = model_of(
        nodes, [vi("x", TP.FLOAT, [2, 5, 6]), vi("t", TP.INT64, [])],
        [vi(n, TP.FLOAT, None) for n in ("c3", "xs", "m", "padded", "both_f")] + [vi("w64", TP.DOUBLE, None)],
        [init("sizes", np.int64([1, 2, 3])), init("ax", np.int64([0])), init("ax1", np.int64([1])),
         init("st", np.int64([1])),
         init("en", np.int64([9])), init("zero", np.float32(0)), init("si", np.int64([[[4, 0, 2]], [[1, 1, 3]]])),
         init("pads", np.int64([0, 1, 0, 0, 0, 2]))])
    rng = np.random.default_rng(15)
    compiled, general = Session(model), Session(model, options={"compile_graph": False})
    for step in range(4):
        feeds = {"x": rng.standard_normal((2, 5, 6)).astype(np.float32), "t": np.int64(step - 2)}
        for got, want in zip(compiled.run(None, feeds), general.run(None, feeds)):
            assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
    (program,) = [p for p in compiled._compiled.programs.values() if p is not None]
    codes = [op[0] for op in program.ops]
    assert 0 not in codes and 5 in codes, codes  # no kernel calls; Split's several outputs
    with pytest.raises(GpuKernelsError, match="Gather.*out of range"):
        compiled.run(None, {"x": feeds["x"], "t": np.int64(5)})


def test_compiled_graphs_pass_inputs_omitted_in_the_middle_as_none():
    """Resize(X, '', '', sizes) and Resize(X, '', scales) run as array functions in a
    compiled plan (the omitted roi and scales as None), bitwise equal to the general path;
    sizes that change between runs (a graph input) are redone through the kernel and give
    the new shape; a kernel that does not take None keeps its kernel call."""
    from onnx import TensorProto as TP
    from onnx import helper as oh

    from gpukernels.runtime import Session
    from tests.graphs import init, model_of, vi

    nodes = [
        oh.make_node("Resize", ["x", "", "", "sizes"], ["by_sizes"], mode="linear"),
        oh.make_node("Resize", ["x", "", "scales"], ["by_scales"], mode="nearest"),
        oh.make_node("Resize", ["x", "", "", "fed"], ["by_fed"]),
        oh.make_node("Pad", ["x", "pads", "", "axes"], ["padded"]),  # no None for Pad: a kernel call
    ]
    model = model_of(
        nodes, [vi("x", TP.FLOAT, [1, 2, 3, 4]), vi("fed", TP.INT64, [4])],
        [vi(n, TP.FLOAT, None) for n in ("by_sizes", "by_scales", "by_fed", "padded")],
        [init("sizes", np.int64([1, 2, 5, 7])), init("scales", np.float32([1, 1, 2, 1.5])),
         init("pads", np.int64([1, 0, 2, 1])), init("axes", np.int64([2, 3]))], opset=19)
    rng = np.random.default_rng(3)
    compiled, general = Session(model), Session(model, options={"compile_graph": False})
    fed = np.int64([1, 2, 6, 6])
    for step in range(3):
        feeds = {"x": rng.standard_normal((1, 2, 3, 4)).astype(np.float32), "fed": fed}
        for got, want in zip(compiled.run(None, feeds), general.run(None, feeds)):
            assert got.shape == want.shape and got.tobytes() == want.tobytes()
    (program,) = [p for p in compiled._compiled.programs.values() if p is not None]
    assert [op[0] for op in program.ops if op[0] != 4] == [3, 3, 3, 0], program.ops  # Resize's as arrays
    feeds["fed"] = np.int64([1, 2, 2, 9])  # other sizes: the node is redone through the kernel
    got = compiled.run(None, feeds)
    want = general.run(None, feeds)
    assert got[2].shape == (1, 2, 2, 9)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.tobytes() == w.tobytes()


def test_compiled_graphs_run_arg_reductions_and_gather_elements_as_arrays():
    """ArgMax, ArgMin, GatherElements and TopK (tiny_yolo's detection head: the best
    class, its score, the top boxes) run as array functions in a compiled plan, bitwise
    equal to the general path; an index out of range at run time still raises
    GatherElements' error."""
    from onnx import TensorProto as TP
    from onnx import helper as oh

    from gpukernels.errors import GpuKernelsError
    from gpukernels.runtime import Session
    from tests.graphs import init, model_of, vi

    nodes = [
        oh.make_node("ArgMax", ["x"], ["best"], axis=1, keepdims=1),                        # [2, 1, 6]
        oh.make_node("ArgMin", ["x"], ["worst"], axis=-1, keepdims=0, select_last_index=1),  # [2, 5]
        oh.make_node("GatherElements", ["x", "best"], ["score"], axis=1),                    # [2, 1, 6]
        oh.make_node("GatherElements", ["x", "picks"], ["picked"], axis=2),                 # [2, 5, 3]
        oh.make_node("TopK", ["x", "k"], ["top", "top_at"], axis=2),                         # [2, 5, 3] x 2
        oh.make_node("TopK", ["x", "k"], ["low", "low_at"], axis=1, largest=0),              # low: not an output
    ]
    model = model_of(
        nodes, [vi("x", TP.FLOAT, [2, 5, 6]), vi("picks", TP.INT64, [2, 5, 3])],
        [vi("best", TP.INT64, None), vi("worst", TP.INT64, None), vi("score", TP.FLOAT, None),
         vi("picked", TP.FLOAT, None), vi("top", TP.FLOAT, None), vi("top_at", TP.INT64, None),
         vi("low_at", TP.INT64, None)], [init("k", np.int64([3]))], opset=13)
    rng = np.random.default_rng(21)
    compiled, general = Session(model), Session(model, options={"compile_graph": False})
    for step in range(3):
        feeds = {"x": rng.standard_normal((2, 5, 6)).astype(np.float32),
                 "picks": rng.integers(-6, 6, (2, 5, 3)).astype(np.int64)}
        for got, want in zip(compiled.run(None, feeds), general.run(None, feeds)):
            assert got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes()
    (program,) = [p for p in compiled._compiled.programs.values() if p is not None]
    assert 0 not in [op[0] for op in program.ops], program.ops
    feeds["picks"] = np.full((2, 5, 3), 6, np.int64)
    with pytest.raises(GpuKernelsError, match="GatherElements.*out of range"):
        compiled.run(None, feeds)
