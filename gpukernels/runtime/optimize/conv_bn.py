"""BatchNormalization and per-channel affine steps folded into the Conv before them
(pass ``conv_bn``).  Three rewrites, in this order (so Conv -> BN -> Mul -> Add ends as
one Conv):

1. an inference BatchNormalization followed by Mul and/or Add with per-channel constants
   (Caffe2/TF-style "scale" layers) -> one BatchNormalization:
   scale' = scale * s, bias' = bias * s + t;
2. Conv followed by an inference BatchNormalization -> one Conv:
       a = scale / sqrt(var + epsilon)        (per output channel m)
       W'[m] = W[m] * a[m],   B' = (B - mean) * a + bias;
3. Conv followed by Mul and/or Add with per-channel constants -> one Conv:
   W'[m] = W[m] * s[m], B' = B * s + t.

New parameters are computed in float64 from the constants and rounded once to the
parameter's own type.

Conditions (all checked): the BatchNormalization runs in inference mode (training_mode
0 at opset 14+, only Y declared at opsets 7-9, is_test=1 before 7; spatial at opsets
before 9) and declares only Y; its scale, bias, mean and var are constants of shape
(C,); W (and B when given) are constants of one float type with C = W.shape[0]; a
per-channel constant has X's element type and varies along the channel axis (1) only,
so it broadcasts without growing the value (the value's rank must be known: from W or
static shapes); every folded value is read by the next step only (no other node, no
graph output, no subgraph).  The new node keeps the first node's attributes and writes
the last step's output name.
"""

from __future__ import annotations

import numpy as np

from .rewrite import FLOATS, View


def fold_conv_bn(plan, info) -> int:
    n = 0
    for step in (_bn_affine, _conv_bn, _conv_affine):
        view = View(plan, info)
        for p in list(plan.nodes):
            if p.domain == "" and p.kernel is not None and id(p) not in view.claimed:
                step(view, p)
        n += view.commit()
    return n


def _inference_mode(bn) -> bool:
    v = bn.since_version
    outputs = [o for o in bn.outputs[1:] if o]
    if outputs or not bn.outputs or not bn.outputs[0]:
        return False
    if v >= 14:
        return int(bn.attrs.get("training_mode", 0) or 0) == 0
    if v < 7:
        return int(bn.attrs.get("is_test", 0) or 0) == 1
    return True


def _bn_params(view: View, bn):
    """(channels, [scale, bias, mean, var] as float64, their element types) of an
    inference BatchNormalization with constant parameters, else None."""
    if bn.op_type != "BatchNormalization" or len(bn.inputs) != 5 or not all(bn.inputs) \
            or not _inference_mode(bn):
        return None
    if bn.since_version < 9 and int(bn.attrs.get("spatial", 1) if bn.attrs.get("spatial") is not None else 1) != 1:
        return None
    params, types = [], []
    for name in bn.inputs[1:]:
        a = view.const(name)
        if a is None or view.const_type(name) not in FLOATS or a.ndim != 1:
            return None
        params.append(np.asarray(a, dtype=np.float64))
        types.append(view.const_type(name))
    c = params[0].shape[0]
    if any(p.shape != (c,) for p in params):
        return None
    return c, params, types


def _conv_params(view: View, conv):
    """(W, B or None, W's element type) of a Conv with constant weights, else None."""
    if conv.op_type != "Conv" or len(conv.inputs) < 2 or not conv.inputs[1] or len(conv.outputs) != 1:
        return None
    w = view.const(conv.inputs[1])
    wtype = view.const_type(conv.inputs[1])
    if w is None or wtype not in FLOATS or w.ndim < 3:
        return None
    b = None
    if len(conv.inputs) > 2 and conv.inputs[2]:
        b = view.const(conv.inputs[2])
        if b is None or b.shape != (w.shape[0],) or view.const_type(conv.inputs[2]) != wtype:
            return None
    return w, b, wtype


def _per_channel(view: View, name: str, channels: int, rank, data_type: int):
    """A constant of data_type varying along axis 1 of a rank-`rank` value only, as a
    float64 (channels,) vector; None otherwise."""
    a = view.const(name)
    if a is None or rank is None or view.const_type(name) != data_type or a.ndim > rank:
        return None
    shape = (1,) * (rank - a.ndim) + tuple(a.shape)
    if rank < 2 or any(d != 1 for i, d in enumerate(shape) if i != 1) or shape[1] not in (1, channels):
        return None
    return np.broadcast_to(np.asarray(a, dtype=np.float64).reshape(-1), (channels,)).copy()


def _affine_chain(view: View, value: str, channels: int, rank, data_type: int):
    """Mul and/or Add by per-channel constants reading value (each step read only by the
    next): (s, t, nodes, output name), or None when there is none."""
    s, t, nodes, out = np.ones(channels), np.zeros(channels), [], value
    mul = view.consumer(out)
    if mul is not None and mul.op_type == "Mul" and len(mul.inputs) == 2 and mul.inputs[0] != mul.inputs[1]:
        other = mul.inputs[1] if mul.inputs[0] == out else mul.inputs[0]
        v = _per_channel(view, other, channels, rank, data_type)
        if v is not None:
            s, nodes, out = v, [mul], mul.outputs[0]
    add = view.consumer(out)
    if add is not None and add.op_type == "Add" and len(add.inputs) == 2 and add.inputs[0] != add.inputs[1]:
        other = add.inputs[1] if add.inputs[0] == out else add.inputs[0]
        v = _per_channel(view, other, channels, rank, data_type)
        if v is not None:
            t, nodes, out = v, nodes + [add], add.outputs[0]
    if not nodes:
        return None
    return s, t, nodes, out


def _bn_affine(view: View, bn) -> bool:
    found = _bn_params(view, bn)
    if found is None:
        return False
    c, (scale, bias, mean, var), types = found
    x = bn.inputs[0]
    rank = view.rank(x)
    dt = view.dtype(x)
    chain = _affine_chain(view, bn.outputs[0], c, rank, dt) if dt in FLOATS else None
    if chain is None:
        return False
    s, t, nodes, out = chain
    host = [view.const(n).dtype for n in bn.inputs[1:3]]
    new_scale = view.add_constant(f"{out}__bn_scale", (scale * s).astype(host[0]), types[0])
    new_bias = view.add_constant(f"{out}__bn_bias", (bias * s + t).astype(host[1]), types[1])
    new = view.make("BatchNormalization", [x, new_scale, new_bias, bn.inputs[3], bn.inputs[4]], [out],
                    bn.since_version, name=f"{bn.name}+affine", attributes=bn.node.attribute)
    view.replace([bn] + nodes, new)
    return True


def _new_conv(view: View, conv, w2, b2, wtype, host, out, nodes, tag) -> None:
    w_name = view.add_constant(f"{out}__{tag}_W", w2.astype(host), wtype)
    b_name = view.add_constant(f"{out}__{tag}_B", b2.astype(host), wtype)
    new = view.make("Conv", [conv.inputs[0], w_name, b_name], [out], conv.since_version,
                    name=f"{conv.name}+{tag}", attributes=conv.node.attribute)
    view.replace([conv] + nodes, new)


def _conv_bn(view: View, bn) -> bool:
    found = _bn_params(view, bn)
    if found is None:
        return False
    c, (scale, bias, mean, var), _ = found
    conv = view.node(bn.inputs[0], "Conv")
    if conv is None or not view.sole(bn.inputs[0]):
        return False
    cp = _conv_params(view, conv)
    if cp is None or cp[0].shape[0] != c:
        return False
    w, b, wtype = cp
    eps = float(bn.attrs.get("epsilon", 1e-5))
    with np.errstate(all="ignore"):
        a = scale / np.sqrt(var + eps)
        w2 = np.asarray(w, dtype=np.float64) * a.reshape((c,) + (1,) * (w.ndim - 1))
        b0 = np.asarray(b, dtype=np.float64) if b is not None else np.zeros(c)
        b2 = (b0 - mean) * a + bias
    _new_conv(view, conv, w2, b2, wtype, w.dtype, bn.outputs[0], [bn], "conv_bn")
    return True


def _conv_affine(view: View, conv) -> bool:
    cp = _conv_params(view, conv)
    if cp is None:
        return False
    w, b, wtype = cp
    c = w.shape[0]
    chain = _affine_chain(view, conv.outputs[0], c, w.ndim, wtype)
    if chain is None:
        return False
    s, t, nodes, out = chain
    with np.errstate(all="ignore"):
        w2 = np.asarray(w, dtype=np.float64) * s.reshape((c,) + (1,) * (w.ndim - 1))
        b0 = np.asarray(b, dtype=np.float64) if b is not None else np.zeros(c)
        b2 = b0 * s + t
    _new_conv(view, conv, w2, b2, wtype, w.dtype, out, nodes, "conv_affine")
    return True
