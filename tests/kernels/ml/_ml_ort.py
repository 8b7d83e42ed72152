"""Run one ai.onnx.ml node through onnxruntime: the independent reference for the ml
kernels' tests (onnxruntime implements every ai.onnx.ml operator natively)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

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
    np.dtype(object): TensorProto.STRING,
}


def _type_of(value):
    if isinstance(value, dict):
        k = next(iter(value))
        v = next(iter(value.values()))
        kt = TensorProto.STRING if isinstance(k, str) else TensorProto.INT64
        vt = TensorProto.STRING if isinstance(v, str) else (
            TensorProto.INT64 if isinstance(v, (int, np.int64)) else
            TensorProto.DOUBLE if isinstance(v, np.float64) else TensorProto.FLOAT)
        return helper.make_map_type_proto(kt, helper.make_tensor_type_proto(vt, None))
    arr = np.asarray(value)
    return helper.make_tensor_type_proto(_NP_TO_ONNX[arr.dtype], None)


def run_ort(op_type, inputs, attrs, n_outputs=1, output_types=None, opset_ml=None, opset=19):
    """Outputs of onnxruntime for one ai.onnx.ml node (inputs: list of arrays/dicts)."""
    names = [f"in{i}" for i in range(len(inputs))]
    outs = [f"out{i}" for i in range(n_outputs)]
    node = helper.make_node(op_type, names, outs, domain="ai.onnx.ml", **attrs)
    vin = [helper.make_value_info(n, _type_of(v)) for n, v in zip(names, inputs)]
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
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {n: v for n, v in zip(names, inputs)}
    return sess.run(None, feeds)


def run_ort_if_implemented(*args, **kwargs):
    """run_ort, or None when onnxruntime has no kernel for this type combination (the
    caller's own float64 reference still checks the result)."""
    try:
        return run_ort(*args, **kwargs)
    except Exception as exc:  # onnxruntime's NotImplemented has no importable base class
        if "NOT_IMPLEMENTED" in str(exc) or "Could not find an implementation" in str(exc):
            return None
        raise
