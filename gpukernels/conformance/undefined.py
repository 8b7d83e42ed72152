"""Where the ONNX spec leaves an official case's expected values undefined.

The official expected outputs are computed when onnx generates the cases, with whatever
the installed NumPy and ml_dtypes give -- also for values the spec says are undefined.
Those elements are not compared; every other element is, with the case's tolerances.

Rules (each one names the spec text it rests on):

* Cast / CastLike from a floating-point type to an integer type: "the behavior is
  undefined if the value is out of range of the target type" (Cast's doc; NaN and
  infinities likewise).  Elements whose truncated input lies outside the target's range
  are not compared.  ml_dtypes 0.5-0.6 wrapped such values into int4/uint4/int2/uint2,
  0.7 gives 0; gpukernels wraps (see kernels/tensor/cast.py) on CPU and GPU alike.
"""

from __future__ import annotations

import numpy as np
import onnx

from .. import dtypes


def defined_elements(model: onnx.ModelProto, inputs: list, expected: list):
    """For each expected output, a boolean mask of the elements the spec defines, or None
    when all of them are defined."""
    nodes = model.graph.node
    if len(nodes) != 1 or nodes[0].op_type not in ("Cast", "CastLike") or not inputs:
        return [None] * len(expected)
    x = inputs[0]
    if not isinstance(x, np.ndarray) or not _is_float(x):
        return [None] * len(expected)
    target = _target_type(nodes[0], model, inputs)
    if target is None:
        return [None] * len(expected)
    info = dtypes.info(target)
    if not info.is_integer or target == dtypes.DataType.BOOL:
        return [None] * len(expected)
    bits = info.bits
    lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if info.kind == "int" else (0, 2 ** bits - 1)
    with np.errstate(invalid="ignore"):
        t = np.trunc(x.astype(np.float64))
        mask = np.isfinite(t) & (t >= lo) & (t <= hi)
    return [mask if i == 0 and mask.shape == np.shape(e) else None for i, e in enumerate(expected)]


def _is_float(x: np.ndarray) -> bool:
    try:
        return dtypes.from_numpy(x.dtype).is_float
    except (TypeError, KeyError, ValueError):
        return False


def _target_type(node, model, inputs):
    if node.op_type == "Cast":
        for a in node.attribute:
            if a.name == "to":
                return int(a.i)
        return None
    if len(inputs) > 1 and isinstance(inputs[1], np.ndarray):
        try:
            return dtypes.from_numpy(inputs[1].dtype).data_type
        except (TypeError, KeyError, ValueError):
            return None
    return None


def mask_undefined(expected: list, outputs: list, masks: list) -> tuple[list, list]:
    """expected and outputs with the undefined elements set equal (to the expected value)."""
    exp, out = list(expected), list(outputs)
    for i, mask in enumerate(masks):
        if mask is None or mask.all() or i >= len(out):
            continue
        got = np.array(out[i], copy=True)
        if got.shape == mask.shape:
            got[~mask] = np.asarray(exp[i])[~mask]
            out[i] = got
    return exp, out
