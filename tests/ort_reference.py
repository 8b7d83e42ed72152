"""onnxruntime as the independent reference of the ai.onnx.ml and com.microsoft kernels'
tests (it implements both domains natively): one node in a model, run through
onnxruntime's CPU provider and through a gpukernels Session.

Import as ``from tests.ort_reference import compare`` (tests/conftest.py puts the
repository root on sys.path)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from gpukernels.runtime import Session

try:
    import onnxruntime as ort
except ImportError:  # pragma: no cover
    ort = None

_NP_TO_ONNX = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float64): TensorProto.DOUBLE,
    np.dtype(np.float16): TensorProto.FLOAT16,
    np.dtype(np.int64): TensorProto.INT64,
    np.dtype(np.int32): TensorProto.INT32,
    np.dtype(np.int16): TensorProto.INT16,
    np.dtype(np.uint8): TensorProto.UINT8,
    np.dtype(np.int8): TensorProto.INT8,
    np.dtype(bool): TensorProto.BOOL,
    np.dtype(object): TensorProto.STRING,
}


def elem_type(arr) -> int:
    """The TensorProto element type of an array (bfloat16 through ml_dtypes, strings as
    object arrays)."""
    import ml_dtypes

    arr = np.asarray(arr)
    if arr.dtype == ml_dtypes.bfloat16:
        return TensorProto.BFLOAT16
    return _NP_TO_ONNX[arr.dtype]


def run_ort(model, feeds):
    """The outputs of onnxruntime (CPU provider) for model on feeds ({name: array})."""
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def run_gk(model, feeds, device="cpu", **options):
    """The outputs of a gpukernels Session for model on feeds, with the given options."""
    sess = Session(model, device=device, **({"options": options} if options else {}))
    return sess.run(None, feeds)


# --------------------------------------------------------------- com.microsoft nodes


def single_node_model(op_type, inputs, attrs=None, n_outputs=1, domain="com.microsoft", opset=17,
                      initializers=()):
    """A model with one node; inputs is a list of (name, array) or None (omitted optional
    input); names in initializers become initializers instead of graph inputs."""
    names = [n if a is not None else "" for n, a in inputs]
    outs = [f"out{i}" for i in range(n_outputs)]
    node = helper.make_node(op_type, names, outs, domain=domain, **(attrs or {}))
    vin, inits = [], []
    for n, a in inputs:
        if a is None:
            continue
        if n in initializers:
            inits.append(onnx.numpy_helper.from_array(np.asarray(a), n))
        else:
            vin.append(helper.make_tensor_value_info(n, elem_type(a), list(np.shape(a))))
    vout = [helper.make_value_info(o, onnx.TypeProto()) for o in outs]
    graph = helper.make_graph([node], "g", vin, vout, initializer=inits)
    opsets = [helper.make_opsetid("", opset)]
    if domain not in ("", "ai.onnx"):
        opsets.append(helper.make_opsetid(domain, 1))
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 9
    return model


def feeds_of(model, inputs):
    """The feeds of single_node_model's graph inputs (initializers and omitted inputs left out)."""
    graph_inputs = {i.name for i in model.graph.input}
    return {n: a for n, a in inputs if a is not None and n in graph_inputs}


def compare(op_type, inputs, attrs=None, n_outputs=1, device="cpu", rtol=1e-5, atol=1e-5, domain="com.microsoft",
            opset=17, initializers=(), skip_outputs=()):
    """Run the node on both runtimes and assert the outputs agree (integers exactly, same
    shapes and dtypes); returns both lists."""
    model = single_node_model(op_type, inputs, attrs, n_outputs, domain, opset, initializers)
    feeds = feeds_of(model, inputs)
    want = run_ort(model, feeds)
    got = run_gk(model, feeds, device)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        if i in skip_outputs:
            continue
        g = np.asarray(g)
        assert g.shape == w.shape, (i, g.shape, w.shape)
        assert g.dtype == w.dtype, (i, g.dtype, w.dtype)
        if w.dtype.kind in "iub":
            np.testing.assert_array_equal(g, w, err_msg=f"output {i}")
        else:
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=atol,
                                       err_msg=f"output {i}")
    return got, want


# ------------------------------------------------------------------- ai.onnx.ml nodes


def _ml_type(value):
    """The TypeProto of an ai.onnx.ml input: a map for a dict (keys string or int64), else
    a tensor of unknown shape."""
    if isinstance(value, dict):
        k = next(iter(value))
        v = next(iter(value.values()))
        kt = TensorProto.STRING if isinstance(k, str) else TensorProto.INT64
        vt = TensorProto.STRING if isinstance(v, str) else (
            TensorProto.INT64 if isinstance(v, (int, np.int64)) else
            TensorProto.DOUBLE if isinstance(v, np.float64) else TensorProto.FLOAT)
        return helper.make_map_type_proto(kt, helper.make_tensor_type_proto(vt, None))
    return helper.make_tensor_type_proto(elem_type(value), None)


def run_ml_node(op_type, inputs, attrs, n_outputs=1, output_types=None, opset_ml=None, opset=19):
    """Outputs of onnxruntime for one ai.onnx.ml node (inputs: list of arrays/dicts);
    opset_ml defaults to the operator's newest non-deprecated version."""
    names = [f"in{i}" for i in range(len(inputs))]
    outs = [f"out{i}" for i in range(n_outputs)]
    node = helper.make_node(op_type, names, outs, domain="ai.onnx.ml", **attrs)
    vin = [helper.make_value_info(n, _ml_type(v)) for n, v in zip(names, inputs)]
    if output_types is None:
        vout = [helper.make_value_info(o, onnx.TypeProto()) for o in outs]
    else:
        vout = [helper.make_value_info(o, t) for o, t in zip(outs, output_types)]
    graph = helper.make_graph([node], "g", vin, vout)
    if opset_ml is None:
        opset_ml = max(s.since_version for s in onnx.defs.get_all_schemas_with_history()
                       if s.domain == "ai.onnx.ml" and s.name == op_type and not s.deprecated)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                    helper.make_opsetid("ai.onnx.ml", opset_ml)])
    model.ir_version = 8 if opset_ml < 4 else 10
    return run_ort(model, dict(zip(names, inputs)))


def run_ml_node_if_implemented(*args, **kwargs):
    """run_ml_node, or None when onnxruntime has no kernel for this type combination (the
    caller's own float64 reference still checks the result)."""
    try:
        return run_ml_node(*args, **kwargs)
    except Exception as exc:  # onnxruntime's NotImplemented has no importable base class
        if "NOT_IMPLEMENTED" in str(exc) or "Could not find an implementation" in str(exc):
            return None
        raise
