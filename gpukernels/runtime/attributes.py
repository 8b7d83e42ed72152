"""Binding node attributes: AttributeProto -> Python values, schema defaults, checks."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import AttributeProto

from ..errors import ModelError
from ..tensor import Tensor, array_from_proto

A = AttributeProto


def sparse_to_dense(sparse: onnx.SparseTensorProto, base_dir: str | None = None, ctx=None) -> Tensor:
    """A dense Tensor from a SparseTensorProto (linear or coordinate indices).

    The dims are the model's word, not data it holds, so the dense size is checked
    against max_tensor_bytes (ctx's option, else GPUKERNELS_MAX_TENSOR_BYTES, else the
    default; see gpukernels.limits) before anything is allocated, and every index must
    lie inside dims (NumPy would otherwise wrap -1 to the last element).  Errors name
    the tensor: ModelError for a malformed one, ResourceLimitError for one too large."""
    from ..limits import check_allocation

    name = sparse.values.name or "<unnamed>"
    label = f"sparse tensor {name!r}"
    dims = [int(d) for d in sparse.dims]
    if any(d < 0 for d in dims):
        raise ModelError(f"{label}: negative dimension in dims {dims}")
    values = array_from_proto(sparse.values, base_dir).reshape(-1)
    check_allocation(ctx, dims, values.dtype, f"the dense value of {label}")
    indices = array_from_proto(sparse.indices, base_dir)
    if indices.dtype.kind not in "iu":
        raise ModelError(f"{label}: indices must be integers, got {indices.dtype}")
    indices = indices.astype(np.int64)
    nnz = values.size
    rank = len(dims)
    if indices.ndim == 2 and indices.shape == (nnz, rank):
        bound = np.asarray(dims, np.int64).reshape(1, rank) if rank else np.zeros((1, 0), np.int64)
        bad = (indices < 0) | (indices >= bound)
        if bad.any():
            row, col = (int(v) for v in np.argwhere(bad)[0])
            raise ModelError(f"{label}: index {indices[row].tolist()} (entry {row}) lies outside dims "
                             f"{dims} (axis {col} has size {dims[col]})")
        flat = np.ravel_multi_index(tuple(indices.T), dims) if nnz else np.zeros(0, np.int64)
    elif indices.ndim == 1 and indices.size == nnz:
        total = 1
        for d in dims:
            total *= d
        flat = indices
        bad = (flat < 0) | (flat >= total)
        if bad.any():
            row = int(np.argmax(bad))
            raise ModelError(f"{label}: linear index {int(flat[row])} (entry {row}) lies outside "
                             f"[0, {total}) for dims {dims}")
    else:
        raise ModelError(f"{label}: indices of shape {list(indices.shape)} do not fit {nnz} values of "
                         f"a rank-{rank} tensor (need [{nnz}] linear or [{nnz}, {rank}] coordinates)")
    if values.dtype == object:
        dense = np.full(dims, "", dtype=object)
    else:
        dense = np.zeros(dims, dtype=values.dtype)
    dense.reshape(-1)[flat] = values
    return Tensor(dense, sparse.values.data_type)


def attribute_value(attr: AttributeProto, base_dir: str | None = None, ctx=None):
    """The Python value of one attribute: int, float, str, Tensor, GraphProto, TypeProto
    or a list of those.  ctx (a KernelContext or None) sets the max_tensor_bytes that
    sparse tensors are densified under."""
    t = attr.type
    if t == A.INT:
        return int(attr.i)
    if t == A.FLOAT:
        return float(attr.f)
    if t == A.STRING:
        return _text(attr.s)
    if t == A.TENSOR:
        return Tensor.from_proto(attr.t, base_dir)
    if t == A.GRAPH:
        return attr.g
    if t == A.SPARSE_TENSOR:
        return sparse_to_dense(attr.sparse_tensor, base_dir, ctx)
    if t == A.TYPE_PROTO:
        return attr.tp
    if t == A.INTS:
        return [int(v) for v in attr.ints]
    if t == A.FLOATS:
        return [float(v) for v in attr.floats]
    if t == A.STRINGS:
        return [_text(v) for v in attr.strings]
    if t == A.TENSORS:
        return [Tensor.from_proto(v, base_dir) for v in attr.tensors]
    if t == A.GRAPHS:
        return list(attr.graphs)
    if t == A.SPARSE_TENSORS:
        return [sparse_to_dense(v, base_dir, ctx) for v in attr.sparse_tensors]
    if t == A.TYPE_PROTOS:
        return list(attr.type_protos)
    raise ModelError(f"attribute {attr.name!r} has undefined type")


def _text(raw: bytes):
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw


def _bound_value(attr: AttributeProto, base_dir, ctx, label: str):
    """attribute_value, with a malformed tensor named by its node and attribute (a tensor
    attribute's own name is usually empty)."""
    try:
        return attribute_value(attr, base_dir, ctx)
    except ModelError as exc:
        raise ModelError(f"{label}: attribute {attr.name!r}: {exc}") from exc


def bind_attributes(node: onnx.NodeProto, schema, base_dir: str | None = None,
                    where: str = "", ctx=None) -> dict:
    """Keyword arguments for a kernel: the node's attributes, checked against the schema
    (unknown names and wrong types raise, required ones must be present) with the
    schema's defaults filled in.  ctx: see attribute_value."""
    bound = {}
    label = where or f"node '{node.name or node.op_type}' ({node.op_type})"
    declared = schema.attributes if schema is not None else {}
    for attr in node.attribute:
        if attr.ref_attr_name:
            raise ModelError(f"{label}: attribute {attr.name!r} refers to function attribute "
                             f"{attr.ref_attr_name!r} outside a function body")
        if schema is not None:
            spec = declared.get(attr.name)
            if spec is None:
                raise ModelError(f"{label}: unknown attribute {attr.name!r}; the opset-{schema.since_version} "
                                 f"schema defines {sorted(declared) or 'none'}")
            if int(spec.type) != int(attr.type) and attr.type != A.UNDEFINED:
                raise ModelError(f"{label}: attribute {attr.name!r} has type "
                                 f"{A.AttributeType.Name(attr.type)}, the schema wants "
                                 f"{A.AttributeType.Name(int(spec.type))}")
        bound[attr.name] = _bound_value(attr, base_dir, ctx, label)
    for name, spec in declared.items():
        if name in bound:
            continue
        if spec.required:
            raise ModelError(f"{label}: required attribute {name!r} is missing")
        default = spec.default_value
        if default is not None and default.type != A.UNDEFINED and default.name:
            bound[name] = attribute_value(default, base_dir, ctx)
    return bound
