"""Binding node attributes: AttributeProto -> Python values, schema defaults, checks."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import AttributeProto

from ..errors import ModelError
from ..tensor import Tensor

A = AttributeProto


def sparse_to_dense(sparse: onnx.SparseTensorProto, base_dir: str | None = None) -> Tensor:
    """A dense Tensor from a SparseTensorProto (linear or coordinate indices)."""
    from .. import dtypes

    values = dtypes.array_from_proto(sparse.values, base_dir)
    indices = dtypes.array_from_proto(sparse.indices, base_dir).astype(np.int64)
    dims = tuple(sparse.dims)
    dense = np.zeros(dims, dtype=values.dtype)
    if indices.ndim == 2:
        dense[tuple(indices.T)] = values
    else:
        dense.reshape(-1)[indices] = values
    return Tensor(dense, sparse.values.data_type)


def attribute_value(attr: AttributeProto, base_dir: str | None = None):
    """The Python value of one attribute: int, float, str, Tensor, GraphProto, TypeProto
    or a list of those."""
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
        return sparse_to_dense(attr.sparse_tensor, base_dir)
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
        return [sparse_to_dense(v, base_dir) for v in attr.sparse_tensors]
    if t == A.TYPE_PROTOS:
        return list(attr.type_protos)
    raise ModelError(f"attribute {attr.name!r} has undefined type")


def _text(raw: bytes):
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw


def bind_attributes(node: onnx.NodeProto, schema, base_dir: str | None = None,
                    where: str = "") -> dict:
    """Keyword arguments for a kernel: the node's attributes, checked against the schema
    (unknown names and wrong types raise, required ones must be present) with the
    schema's defaults filled in."""
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
        bound[attr.name] = attribute_value(attr, base_dir)
    for name, spec in declared.items():
        if name in bound:
            continue
        if spec.required:
            raise ModelError(f"{label}: required attribute {name!r} is missing")
        default = spec.default_value
        if default is not None and default.type != A.UNDEFINED and default.name:
            bound[name] = attribute_value(default, base_dir)
    return bound
