"""The exporters' spelled-out forms mapped onto one kernel each.

Every matcher starts from a candidate root node and walks up through producers; every
node of a match except the root must be read by the match only (no other node, graph
output or subgraph reads it), constants must equal the form's values up to the rounding
of their type (rewrite.close_to), scalar constants must not broadcast x to a higher rank,
and x must be of a float type the fused operator accepts.  Products and sums are matched
in any order and association (``_flatten``: a chain of two-input Mul or Add nodes, each
read only by the next), which covers both torch exporters' spellings:

layernorm  (TorchScript before opset 17; hand-written LayerNorms; TF/Keras exports)
    m = ReduceMean(x, axes, keepdims=1); d = Sub(x, m); v = ReduceMean(Pow(d, 2) or
    Mul(d, d), axes); n = Div(d, Sqrt(Add(v, eps))) or Mul(d, Reciprocal(Sqrt(...)));
    then optionally Mul(n, gamma) and Add(., beta) with constant gamma/beta over the
    normalised axes
    -> LayerNormalization-17(x, gamma or 1, beta, axis=-k, epsilon=eps, stash_type=1,
       11 for double x).  axes must be the k trailing axes.
rmsnorm    (T5/LLaMA RMSNorm as both exporters write torch.rsqrt and .pow(2).mean())
    v = ReduceMean(Pow(x, 2) or Mul(x, x), trailing axes, keepdims=1); r = Sqrt(Add(v,
    eps)); n = Mul(x, Reciprocal(r)) or Mul(x, Div(1, r)) or Div(x, r); then optionally
    Mul(gamma, n), also across a Cast to n's own type (a no-op ``.to(dtype)``)
    -> RMSNormalization-23(x, gamma or 1, axis=-k, epsilon=eps, stash_type as above).
gelu       erf form: x * 0.5 * (1 + Erf(x / sqrt(2))) (Div by sqrt 2 or Mul by 1/sqrt 2)
           -> Gelu-20(x);  tanh form: x * 0.5 * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 *
           x^3))), x^3 as Pow(x, 3) or x*x*x -> Gelu-20(x, approximate='tanh').
silu       x * Sigmoid(x) -> Swish-24(x);  x * Sigmoid(a * x) (QuickGelu, a = 1.702) ->
           Swish-24(x, alpha=a).
attention  (TorchScript and dynamo scaled_dot_product_attention; eager attention)
    S = MatMul(Q [* c1], Transpose(K, perm=[0,1,3,2]) [* c2]) [* c3 or / c3]
    [+ M]; Y = MatMul(Softmax(S, axis=-1), V)
    -> Attention-23(Q, K, V, M, scale=c1*c2*c3).  Q, K, V rank 4 with static shapes
    and equal batch and head counts (no broadcasting); M a constant float mask of S's
    type broadcasting to S without growing it (a last dimension of 1 is materialised,
    since Attention pads short masks), with no NaN or +inf and no row entirely -inf
    (Attention gives 0 there where Softmax gives NaN); scale positive and, for double
    inputs, exactly representable as the float attribute.  Masks computed at run time
    (from an attention_mask input) are not mapped: a fully masked row would change
    from NaN to 0.
    Without static shapes the rewrite waits for a per-signature specialisation.

All fused kernels compute half types in float32 and round once (the spelled-out forms
round after every node), so results agree to the rounding of the type, not to the bit.
"""

from __future__ import annotations

import math

import numpy as np

from ...dtypes import DataType
from .rewrite import FLOATS, View, close_to

_SQRT2 = math.sqrt(2.0)
_SQRT_2_PI = math.sqrt(2.0 / math.pi)


# ------------------------------------------------------------------ helpers


def _flatten(view: View, root, op: str):
    """Leaves (value names) and nodes of the chain of two-input `op` nodes under root
    (root included); inner nodes must be read by the chain only."""
    leaves, nodes = [], [root]
    stack = list(reversed(root.inputs))
    while stack:
        name = stack.pop()
        q = view.node(name, op)
        if q is not None and len(q.inputs) == 2 and all(q.inputs) and view.sole(name) and len(nodes) < 64:
            nodes.append(q)
            stack.extend(reversed(q.inputs))
        else:
            leaves.append(name)
    return leaves, nodes


def _scalar_ok(view: View, name: str, x: str) -> bool:
    """A one-element constant that does not raise x's rank when broadcast."""
    a = view.const(name)
    if a is None or a.size != 1:
        return False
    if a.ndim == 0:
        return True
    r = view.rank(x)
    return r is not None and a.ndim <= r


def _const_is(view: View, name: str, exact: float, x: str) -> bool:
    return _scalar_ok(view, name, x) and close_to(view.scalar(name), exact, view.const_type(name))


def _float_x(view: View, x: str) -> int:
    dt = view.dtype(x)
    return dt if dt in FLOATS else 0


def _two(p):
    return len(p.inputs) == 2 and all(p.inputs)


def _other(p, name):
    """The other input of a two-input node p, one of whose inputs is name."""
    a, b = p.inputs
    return b if a == name else a if b == name else None


def _reduce_axes(view: View, p):
    """The axes of a ReduceMean node that keeps dims (None when not a plain reduction)."""
    if p is None or p.op_type != "ReduceMean":
        return None
    if int(view.attr(p, "keepdims", 1)) != 1:
        return None
    if p.since_version >= 18:
        if int(view.attr(p, "noop_with_empty_axes", 0)) != 0:
            return None
        if len(p.inputs) < 2 or not p.inputs[1]:
            return None
        a = view.const(p.inputs[1])
        if a is None or a.dtype.kind not in "iu" or a.ndim != 1 or a.size == 0:
            return None
        return [int(v) for v in a]
    axes = p.attrs.get("axes")
    if not axes or len(p.inputs) != 1:
        return None
    return [int(v) for v in axes]


def _trailing(axes, rank):
    """k when axes are the k trailing axes of a rank-`rank` tensor (rank may be None when
    every axis is negative), else None."""
    if rank is not None:
        norm = sorted(a + rank if a < 0 else a for a in axes)
        k = len(norm)
        if len(set(norm)) != k or norm != list(range(rank - k, rank)) or any(a < 0 or a >= rank for a in norm):
            return None
        return k
    if any(a >= 0 for a in axes):
        return None
    norm = sorted(axes)
    k = len(norm)
    return k if norm == list(range(-k, 0)) else None


def _param_ok(view: View, name: str, x: str, k: int) -> bool:
    """A constant scale/bias that broadcasts into the k normalised axes of x without
    growing x (each of its dimensions 1 or x's); a dimension of x not known statically
    makes the rewrite wait for static shapes (view.deferred)."""
    a = view.const(name)
    if a is None or a.ndim > k or a.size < 1:
        return False
    if a.size == 1:
        return True
    dims = view.info.dims(x) if view.info is not None else None
    if dims is None or len(dims) < a.ndim:
        view.deferred = True
        return False
    for d, xd in zip(reversed(a.shape), reversed(dims)):
        if d == 1:
            continue
        if xd is None:
            view.deferred = True
            return False
        if d != xd:
            return False
    return True


def _stash(dt: int) -> int:
    return int(DataType.DOUBLE) if dt == int(DataType.DOUBLE) else int(DataType.FLOAT)


def _ones(view: View, hint: str, dt: int):
    from ... import dtypes

    return view.add_constant(hint, np.ones((1,), dtypes.info(dt).numpy), dt)


def _sqrt_of_eps(view: View, s_name: str, x: str):
    """For s = Sqrt(Add(v, eps)) (s read once): (v, eps, [Sqrt, Add]) or None."""
    sq = view.node(s_name, "Sqrt")
    if sq is None or not view.sole(s_name):
        return None
    add = view.node(sq.inputs[0], "Add")
    if add is None or not _two(add) or not view.sole(sq.inputs[0]):
        return None
    for v, e in (add.inputs, reversed(add.inputs)):
        if _scalar_ok(view, e, x) and view.const(v) is None:
            eps = view.scalar(e)
            if eps is not None and eps >= 0:
                return v, eps, [sq, add]
    return None


def _inverse_of(view: View, n, d: str, x: str):
    """n = Div(d, s) / Mul(d, Reciprocal(s)) / Mul(d, Div(1, s)): (s, nodes) or None."""
    if n.op_type == "Div" and _two(n) and n.inputs[0] == d:
        return n.inputs[1], [n]
    if n.op_type == "Mul" and _two(n) and d in n.inputs and n.inputs[0] != n.inputs[1]:
        r = _other(n, d)
        rec = view.node(r, "Reciprocal", "Div")
        if rec is None or not view.sole(r):
            return None
        if rec.op_type == "Reciprocal":
            return rec.inputs[0], [n, rec]
        if _two(rec) and _const_is(view, rec.inputs[0], 1.0, x):
            return rec.inputs[1], [n, rec]
    return None


def _square_of(view: View, name: str, x: str):
    """name = Pow(x, 2) or Mul(x, x), read once: the node, or None."""
    q = view.node(name, "Pow", "Mul")
    if q is None or not view.sole(name) or not _two(q):
        return None
    if q.op_type == "Pow" and q.inputs[0] == x and _const_is(view, q.inputs[1], 2.0, x):
        return q
    if q.op_type == "Mul" and q.inputs[0] == x and q.inputs[1] == x:
        return q
    return None


def _fuse_each(view: View, op_types: tuple, attempt) -> int:
    """attempt(view, node) on every default-domain node of op_types with two inputs that no
    earlier match claimed (the node that ends a pattern); then commit what matched."""
    for p in list(view.plan.nodes):
        if p.op_type in op_types and p.domain == "" and id(p) not in view.claimed and _two(p):
            attempt(view, p)
    return view.commit()


# ------------------------------------------------------------------ LayerNorm


def fuse_layernorm(view: View) -> int:
    return _fuse_each(view, ("Div", "Mul"), _try_layernorm)


def _try_layernorm(view: View, n) -> bool:
    if not _two(n):
        return False
    for d in dict.fromkeys(n.inputs):
        sub = view.node(d, "Sub")
        if sub is None or not _two(sub):
            continue
        x, m = sub.inputs
        mean = view.node(m, "ReduceMean")
        if mean is None or not view.sole(m) or mean.inputs[0] != x:
            continue
        inv = _inverse_of(view, n, d, x)
        if inv is None:
            continue
        s, inv_nodes = inv
        se = _sqrt_of_eps(view, s, x)
        if se is None:
            continue
        v, eps, se_nodes = se
        var = view.node(v, "ReduceMean")
        if var is None or not view.sole(v):
            continue
        sq = _square_of(view, var.inputs[0], d)
        if sq is None:
            continue
        # d is read by the square (once or twice) and n only
        if view.uses_of(d) != (3 if sq.op_type == "Mul" else 2):
            continue
        axes, axes2 = _reduce_axes(view, mean), _reduce_axes(view, var)
        if axes is None or axes2 is None or sorted(axes) != sorted(axes2):
            continue
        dt = _float_x(view, x)
        k = _trailing(axes, view.rank(x))
        if not dt or k is None:
            continue
        nodes = [mean, sub, sq, var] + se_nodes + inv_nodes
        if not view.free(nodes):
            continue
        out = n.outputs[0]
        gamma = beta = None
        mul = view.consumer(out)
        if mul is not None and mul.op_type == "Mul" and _two(mul) and _other(mul, out) is not None \
                and _other(mul, out) != out and _param_ok(view, _other(mul, out), x, k) \
                and view.dtype(_other(mul, out)) == dt:
            gamma = _other(mul, out)
            nodes.append(mul)
            out = mul.outputs[0]
            add = view.consumer(out)
            if add is not None and add.op_type == "Add" and _two(add) and _other(add, out) != out \
                    and _param_ok(view, _other(add, out), x, k) and view.dtype(_other(add, out)) == dt:
                beta = _other(add, out)
                nodes.append(add)
                out = add.outputs[0]
        if gamma is None:
            gamma = _ones(view, f"{out}__layernorm_scale", dt)
        inputs = [x, gamma] + ([beta] if beta is not None else [])
        new = view.make("LayerNormalization", inputs, [out], 17, name=f"{n.name}/LayerNormalization",
                        axis=-k, epsilon=float(eps), stash_type=_stash(dt))
        view.replace(nodes, new)
        return True
    return False


# ------------------------------------------------------------------ RMSNorm


def fuse_rmsnorm(view: View) -> int:
    return _fuse_each(view, ("Div", "Mul"), _try_rmsnorm)


def _try_rmsnorm(view: View, n) -> bool:
    if not _two(n):
        return False
    for x in dict.fromkeys(n.inputs):
        if view.const(x) is not None:
            continue
        inv = _inverse_of(view, n, x, x)
        if inv is None:
            continue
        s, inv_nodes = inv
        se = _sqrt_of_eps(view, s, x)
        if se is None:
            continue
        v, eps, se_nodes = se
        ms = view.node(v, "ReduceMean")
        if ms is None or not view.sole(v):
            continue
        sq = _square_of(view, ms.inputs[0], x)
        if sq is None:
            continue
        axes = _reduce_axes(view, ms)
        dt = _float_x(view, x)
        k = _trailing(axes, view.rank(x)) if axes is not None else None
        if not dt or k is None:
            continue
        nodes = [sq, ms] + se_nodes + inv_nodes
        if not view.free(nodes):
            continue
        out = n.outputs[0]
        gamma = None
        nxt = view.consumer(out)
        cast = None
        if nxt is not None and nxt.op_type == "Cast" and int(view.attr(nxt, "to", 0)) == dt \
                and len(nxt.inputs) == 1 and view.dtype(out) == dt:
            cast = nxt  # .to(dtype) of a value already of that type: no change
            nxt = view.consumer(cast.outputs[0])
        mid = cast.outputs[0] if cast is not None else out
        if nxt is not None and nxt.op_type == "Mul" and _two(nxt) and _other(nxt, mid) is not None \
                and _other(nxt, mid) != mid and _param_ok(view, _other(nxt, mid), x, k) \
                and view.dtype(_other(nxt, mid)) == dt:
            gamma = _other(nxt, mid)
            nodes += ([cast] if cast is not None else []) + [nxt]
            out = nxt.outputs[0]
        if gamma is None:
            gamma = _ones(view, f"{out}__rmsnorm_scale", dt)
        new = view.make("RMSNormalization", [x, gamma], [out], 23, name=f"{n.name}/RMSNormalization",
                        axis=-k, epsilon=float(eps), stash_type=_stash(dt))
        view.replace(nodes, new)
        return True
    return False


# ------------------------------------------------------------------ GELU


def fuse_gelu(view: View) -> int:
    return _fuse_each(view, ("Mul",), _try_gelu)


def _try_gelu(view: View, root) -> bool:
    leaves, nodes = _flatten(view, root, "Mul")
    if len(leaves) != 3:
        return False
    for i, a in enumerate(leaves):
        add = view.node(a, "Add")
        if add is None or not view.sole(a) or not _two(add):
            continue
        rest = leaves[:i] + leaves[i + 1:]
        for x, half in (rest, reversed(rest)):
            dt = _float_x(view, x)
            if not dt or view.const(x) is not None or not _const_is(view, half, 0.5, x):
                continue
            terms, add_nodes = _flatten(view, add, "Add")
            if len(terms) != 2:
                continue
            for one, t in (terms, reversed(terms)):
                if not _const_is(view, one, 1.0, x):
                    continue
                found = _gelu_core(view, t, x)
                if found is None:
                    continue
                approximate, core = found
                matched = nodes + add_nodes + core
                if not view.free(matched) or len({id(q) for q in matched}) != len(matched):
                    continue
                attrs = {"approximate": "tanh"} if approximate else {}
                new = view.make("Gelu", [x], [root.outputs[0]], 20, name=f"{root.name}/Gelu", **attrs)
                view.replace(matched, new)
                return True
    return False


def _gelu_core(view: View, t: str, x: str):
    """Erf(x / sqrt 2) -> (False, nodes); Tanh(sqrt(2/pi) (x + 0.044715 x^3)) -> (True,
    nodes); else None."""
    f = view.node(t, "Erf", "Tanh")
    if f is None or not view.sole(t):
        return None
    u = f.inputs[0]
    if f.op_type == "Erf":
        q = view.node(u, "Div", "Mul")
        if q is None or not view.sole(u) or not _two(q) or x not in q.inputs:
            return None
        if q.op_type == "Div" and q.inputs[0] == x and _const_is(view, q.inputs[1], _SQRT2, x):
            return False, [f, q]
        if q.op_type == "Mul" and _const_is(view, _other(q, x), 1.0 / _SQRT2, x):
            return False, [f, q]
        return None
    mul = view.node(u, "Mul")
    if mul is None or not view.sole(u) or not _two(mul):
        return None
    factors, mul_nodes = _flatten(view, mul, "Mul")
    if len(factors) != 2:
        return None
    for c, s in (factors, reversed(factors)):
        if not _const_is(view, c, _SQRT_2_PI, x):
            continue
        add = view.node(s, "Add")
        if add is None or not view.sole(s) or not _two(add):
            continue
        terms, add_nodes = _flatten(view, add, "Add")
        if len(terms) != 2 or x not in terms:
            continue
        w = terms[1] if terms[0] == x else terms[0]
        wm = view.node(w, "Mul")
        if wm is None or not view.sole(w) or not _two(wm):
            continue
        cube, cube_nodes = _flatten(view, wm, "Mul")
        kappa = [c2 for c2 in cube if _const_is(view, c2, 0.044715, x)]
        if len(kappa) != 1:
            continue
        cube = [v for v in cube if v != kappa[0]]
        extra = []
        if cube == [x, x, x]:
            pass
        elif len(cube) == 1:
            pw = view.node(cube[0], "Pow")
            if pw is None or not view.sole(cube[0]) or not _two(pw) or pw.inputs[0] != x \
                    or not _const_is(view, pw.inputs[1], 3.0, x):
                continue
            extra = [pw]
        else:
            continue
        return True, [f] + mul_nodes + add_nodes + cube_nodes + extra
    return None


# ------------------------------------------------------------------ SiLU


def fuse_silu(view: View) -> int:
    return _fuse_each(view, ("Mul",), _try_silu)


def _try_silu(view: View, root) -> bool:
    for x, s in (root.inputs, reversed(root.inputs)):
        sig = view.node(s, "Sigmoid")
        if sig is None or not view.sole(s) or x == s:
            continue
        dt = _float_x(view, x)
        if not dt or view.const(x) is not None:
            continue
        alpha, nodes = 1.0, [root, sig]
        if sig.inputs[0] != x:
            q = view.node(sig.inputs[0], "Mul")
            if q is None or not view.sole(sig.inputs[0]) or not _two(q) or x not in q.inputs:
                continue
            c = _other(q, x)
            if c == x or not _scalar_ok(view, c, x):
                continue
            alpha = view.scalar(c)
            # the attribute is a float32: its rounding must be within the constant's own
            if alpha is None or not math.isfinite(alpha) \
                    or not close_to(float(np.float32(alpha)), alpha, view.const_type(c)):
                continue
            nodes.append(q)
        if not view.free(nodes):
            continue
        attrs = {"alpha": float(alpha)} if alpha != 1.0 else {}
        new = view.make("Swish", [x], [root.outputs[0]], 24, name=f"{root.name}/Swish", **attrs)
        view.replace(nodes, new)
        return True
    return False


# ------------------------------------------------------------------ attention


def fuse_attention(view: View) -> int:
    return _fuse_each(view, ("MatMul",), _try_attention)


def _scaled(view: View, name: str, ref: str):
    """name = Mul(v, c) with c a scalar constant (name read once): (v, c, [Mul]); else
    (name, 1.0, [])."""
    q = view.node(name, "Mul")
    if q is not None and view.sole(name) and _two(q):
        for v, c in (q.inputs, reversed(q.inputs)):
            if view.const(v) is None and _scalar_ok(view, c, ref):
                value = view.scalar(c)
                if value is not None:
                    return v, value, [q]
    return name, 1.0, []


def _try_attention(view: View, root) -> bool:
    p_name, v_name = root.inputs
    sm = view.node(p_name, "Softmax")
    if sm is None or not view.sole(p_name):
        return False
    s_name = sm.inputs[0]
    nodes = [root, sm]
    mask = None
    add = view.node(s_name, "Add")
    if add is not None and view.sole(s_name) and _two(add):
        for qk, m in (add.inputs, reversed(add.inputs)):
            if view.node(qk, "MatMul", "Mul", "Div") is not None and view.const(m) is not None:
                mask, s_name = m, qk
                nodes.append(add)
                break
        else:
            return False
    scale = 1.0
    q3 = view.node(s_name, "Mul", "Div")
    if q3 is not None and view.sole(s_name) and _two(q3):
        c = q3.inputs[1] if q3.op_type == "Div" else (
            q3.inputs[1] if view.const(q3.inputs[1]) is not None else q3.inputs[0])
        value = view.scalar(c) if _scalar_ok(view, c, s_name) else None
        if value is None or value == 0 or not math.isfinite(value):
            return False
        scale = 1.0 / value if q3.op_type == "Div" else value
        s_name = _other(q3, c) if q3.op_type == "Mul" else q3.inputs[0]
        nodes.append(q3)
    mm = view.node(s_name, "MatMul")
    if mm is None or not view.sole(s_name) or not _two(mm):
        return False
    nodes.append(mm)
    q_name, c1, n1 = _scaled(view, mm.inputs[0], mm.inputs[0])
    kt_name, c2, n2 = _scaled(view, mm.inputs[1], mm.inputs[1])
    tr = view.node(kt_name, "Transpose")
    if tr is None or not view.sole(kt_name) or list(tr.attrs.get("perm") or []) != [0, 1, 3, 2]:
        return False
    k_name = tr.inputs[0]
    nodes += n1 + n2 + [tr]
    scale *= c1 * c2
    dt = _float_x(view, q_name)
    if not dt or view.dtype(k_name) != dt or view.dtype(v_name) != dt:
        return False
    # Softmax over the last axis (every version agrees for axis=3 of a rank-4 input)
    axis = sm.attrs.get("axis")
    if axis is None:
        axis = -1 if sm.since_version >= 13 else 1
    if int(axis) not in (-1, 3):
        return False
    qs, ks, vs = view.shape(q_name), view.shape(k_name), view.shape(v_name)
    if qs is None or ks is None or vs is None:
        if all(view.rank(n) in (None, 4) for n in (q_name, k_name, v_name)):
            view.deferred = True  # static shapes (a specialisation) may allow it
        return False
    if len(qs) != 4 or len(ks) != 4 or len(vs) != 4:
        return False
    B, H, L, E = qs
    if ks[0] != B or vs[0] != B or ks[1] != H or vs[1] != H or ks[3] != E or vs[2] != ks[2] or E == 0:
        return False
    S = ks[2]
    if dt == int(DataType.DOUBLE) and float(np.float32(scale)) != scale:
        return False
    if not math.isfinite(scale) or scale <= 0:
        return False  # (a scale of 0 would read as "the default" in some runtimes)
    inputs = [q_name, k_name, v_name]
    if mask is not None:
        m = view.const(mask)
        if view.const_type(mask) != dt or m.ndim > 4:
            return False
        target = (B, H, L, S)
        mshape = (1,) * (4 - m.ndim) + tuple(m.shape)
        if any(d not in (1, t) for d, t in zip(mshape, target)):
            return False
        full = np.broadcast_to(m.reshape(mshape), mshape[:3] + (S,))
        f64 = np.asarray(full, dtype=np.float64)
        if np.isnan(f64).any() or np.isposinf(f64).any():
            return False  # NaN/+inf biases: Softmax gives NaN rows, leave them to it
        if S and np.isneginf(f64).all(axis=-1).any():
            return False  # a fully masked row: Attention gives 0, Softmax NaN
        if m.ndim == 0 or m.shape[-1] != S:
            mask = view.add_constant(f"{root.outputs[0]}__attention_mask", np.ascontiguousarray(full), dt)
        inputs.append(mask)
    if not view.free(nodes):
        return False
    new = view.make("Attention", inputs, [root.outputs[0]], 23, name=f"{root.name}/Attention",
                    scale=float(scale))
    view.replace(nodes, new)
    return True
