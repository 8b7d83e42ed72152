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


CASES = {
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
}


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
    tensors = [kernel.tensor(x) for x in inputs]
    with np.errstate(all="ignore"):  # NaN and infinities are among the inputs
        want = kernel(*tensors, **attrs)
    want = (want if isinstance(want, Tensor) else want[0]).array
    fn = kernel.array_function(tensors, dict(attrs))
    if fn is None:
        return False
    where = (f"{kernel.op_type}-{kernel.since_version} on {kernel.device}, inputs "
             f"{[f'{t.array.dtype}{list(t.shape)}' for t in tensors]}, attributes {attrs}")
    try:
        with np.errstate(all="ignore"):  # IEEE events: the runtime redoes such calls (base.py)
            got = fn(*[t.array for t in tensors])
    except Exception as exc:  # noqa: BLE001 -- named in the failure
        pytest.fail(f"{where}: the array function raised {type(exc).__name__}: {exc} "
                    f"where the kernel succeeded")
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
    assert {"Add", "Div", "Relu", "Sqrt", "Tanh", "MatMul", "Gemm", "Clip", "Conv"} <= ops
