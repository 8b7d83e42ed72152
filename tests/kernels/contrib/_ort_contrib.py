"""Run one com.microsoft (or ONNX-domain contrib) node through onnxruntime and through a
gpukernels Session: the reference for the contrib kernels' tests."""

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
    np.dtype(np.uint8): TensorProto.UINT8,
    np.dtype(np.int8): TensorProto.INT8,
    np.dtype(bool): TensorProto.BOOL,
}


def elem_type(arr) -> int:
    import ml_dtypes

    arr = np.asarray(arr)
    if arr.dtype == ml_dtypes.bfloat16:
        return TensorProto.BFLOAT16
    return _NP_TO_ONNX[arr.dtype]


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
    graph_inputs = {i.name for i in model.graph.input}
    return {n: a for n, a in inputs if a is not None and n in graph_inputs}


def run_ort(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def run_gk(model, feeds, device="cpu", **options):
    sess = Session(model, device=device, **({"options": options} if options else {}))
    return sess.run(None, feeds)


def compare(op_type, inputs, attrs=None, n_outputs=1, device="cpu", rtol=1e-5, atol=1e-5, domain="com.microsoft",
            opset=17, initializers=(), skip_outputs=()):
    """Run the node on both runtimes and assert the outputs agree; returns both lists."""
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
