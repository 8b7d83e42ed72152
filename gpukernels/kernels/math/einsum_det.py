"""Einsum and Det.

Einsum: the equation is validated on the host (one term per input, letters a-z/A-Z,
one ellipsis per term at most, ranks and dimension sizes consistent) and rewritten
without ellipses.  Two-operand contractions without repeated letters in a term run as
one batched matrix product (transpose + reshape + matmul), anything else through the
array library's einsum.  Implicit output: the letters used once, in ASCII order (upper
case first), after the ellipsis dimensions.  Half types are computed in float32 and
rounded once; integers wrap around on overflow.

Det: determinants of [..., M, M] matrices via LU (numpy/cupy linalg.det); float16 and
bfloat16 in float32.  M = 0 gives 1; an empty batch gives an empty result.
"""

from __future__ import annotations

import string

import numpy as np

from ...host import pooled_empty
from ..base import KernelBase, register
from ._mathcommon import contiguous

_LETTERS = set(string.ascii_letters)


def _parse(kernel, equation: str, shapes: list, named: dict):
    """-> (input terms without ellipses, output term, {letter: size})."""
    eq = equation.replace(" ", "")
    if eq.count("->") > 1:
        raise kernel.error(f"equation {equation!r} has more than one '->'", **named)
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        raise kernel.error(f"equation {equation!r} has {len(terms)} input terms for "
                           f"{len(shapes)} inputs", **named)
    parsed = []
    ell_ndim = 0
    for i, (term, shape) in enumerate(zip(terms, shapes)):
        if term.count("...") > 1 or term.replace("...", "").count(".") or \
                any(ch not in _LETTERS for ch in term.replace("...", "")):
            raise kernel.error(f"bad term {term!r} in equation {equation!r}", **named)
        letters = term.replace("...", "")
        if "..." in term:
            n = len(shape) - len(letters)
            if n < 0:
                raise kernel.error(f"term {term!r} has more letters than input {i} has dimensions",
                                   **named)
            ell_ndim = max(ell_ndim, n)
        elif len(letters) != len(shape):
            raise kernel.error(f"term {term!r} has {len(letters)} letters but input {i} has rank "
                               f"{len(shape)}", **named)
        parsed.append(term)
    used = set("".join(parsed))
    pool = [ch for ch in string.ascii_letters if ch not in used]
    ell_letters = "".join(pool[:ell_ndim])
    new_terms = []
    sizes: dict = {}
    for i, (term, shape) in enumerate(zip(parsed, shapes)):
        if "..." in term:
            n = len(shape) - (len(term) - 3)
            term = term.replace("...", ell_letters[ell_ndim - n:] if n else "")
        for ch, d in zip(term, shape):
            prev = sizes.get(ch)
            if prev is None or prev == 1:
                sizes[ch] = d
            elif d != prev and not (d == 1 and ch in ell_letters):
                raise kernel.error(f"letter {ch!r} stands for sizes {prev} and {d}", **named)
        new_terms.append(term)
    if arrow:
        if rhs.count("...") > 1 or any(ch not in _LETTERS for ch in rhs.replace("...", "")):
            raise kernel.error(f"bad output term {rhs!r}", **named)
        if ell_ndim and "..." not in rhs:
            # numpy semantics: ellipsis dimensions not in the output are summed over
            out = rhs
        else:
            out = rhs.replace("...", ell_letters)
        if len(set(out)) != len(out):
            raise kernel.error(f"output term {rhs!r} repeats a letter", **named)
        missing = [ch for ch in out if ch not in sizes]
        if missing:
            raise kernel.error(f"output letters {missing} appear in no input term", **named)
    else:
        counts: dict = {}
        for t in parsed:
            for ch in t.replace("...", ""):
                counts[ch] = counts.get(ch, 0) + 1
        out = ell_letters + "".join(sorted(ch for ch, c in counts.items() if c == 1))
    return new_terms, out, sizes


def _matmul_einsum(xp, ta, tb, out, a, b, sizes):
    """Two-operand einsum as one batched matmul, or None when not applicable."""
    if len(set(ta)) != len(ta) or len(set(tb)) != len(tb):
        return None
    for ch in set(ta) & set(tb):
        if a.shape[ta.index(ch)] != b.shape[tb.index(ch)]:
            return None
    # sum away letters that appear in one operand only and not in the output
    a_sum = [i for i, ch in enumerate(ta) if ch not in tb and ch not in out]
    if a_sum:
        a = a.sum(axis=tuple(a_sum))
        ta = "".join(ch for ch in ta if ch in tb or ch in out)
    b_sum = [i for i, ch in enumerate(tb) if ch not in ta and ch not in out]
    if b_sum:
        b = b.sum(axis=tuple(b_sum))
        tb = "".join(ch for ch in tb if ch in ta or ch in out)
    batch = [ch for ch in out if ch in ta and ch in tb]
    contract = [ch for ch in ta if ch in tb and ch not in out]
    m = [ch for ch in ta if ch not in tb]
    n = [ch for ch in tb if ch not in ta]
    size = lambda chs: int(np.prod([sizes_of[ch] for ch in chs], dtype=np.int64))  # noqa: E731
    sizes_of = {ch: a.shape[i] for i, ch in enumerate(ta)}
    sizes_of.update({ch: b.shape[i] for i, ch in enumerate(tb)})
    am = xp.transpose(a, [ta.index(ch) for ch in batch + m + contract])
    am = am.reshape(size(batch), size(m), size(contract))
    bm = xp.transpose(b, [tb.index(ch) for ch in batch + contract + n])
    bm = bm.reshape(size(batch), size(contract), size(n))
    # large host products land in a reusable buffer (no page faults)
    y = xp.matmul(am, bm, out=pooled_empty(xp, (am.shape[0], am.shape[1], bm.shape[2]),
                                           np.result_type(am.dtype, bm.dtype)))
    order = batch + m + n
    y = y.reshape([sizes_of[ch] for ch in order])
    return xp.transpose(y, [order.index(ch) for ch in out])


def _canonical(eq: str) -> str:
    """The equation with its letters renamed to a, b, c... in order of appearance (when at
    most 26 are used), so array libraries that only take lower case accept it."""
    seen: dict = {}
    for ch in eq:
        if ch in _LETTERS and ch not in seen:
            seen[ch] = None
    if len(seen) > 26:
        return eq
    table = {ch: string.ascii_lowercase[i] for i, ch in enumerate(seen)}
    return "".join(table.get(ch, ch) for ch in eq)


@register()
class Einsum(KernelBase):
    def __call__(self, *Inputs, equation=None):
        if equation is None:
            raise self.error("attribute 'equation' is required")
        if isinstance(equation, bytes):
            equation = equation.decode()
        if not Inputs:
            raise self.error("needs at least one input")
        ts = [self.tensor(v, f"Inputs_{i}") for i, v in enumerate(Inputs)]
        self.check_inputs(*ts)
        named = {f"Inputs_{i}": t for i, t in enumerate(ts)}
        terms, out, sizes = _parse(self, equation, [t.shape for t in ts], named)
        xp = self.xp
        arrays = [self.to_compute(t) for t in ts]
        y = None
        if len(arrays) == 2 and all(s > 0 for s in sizes.values()):
            y = _matmul_einsum(xp, terms[0], terms[1], out, arrays[0], arrays[1], sizes)
        if y is None:
            eq = _canonical(",".join(terms) + "->" + out)
            if len(arrays) > 2:
                y = xp.einsum(eq, *arrays, optimize=True)
            else:
                y = xp.einsum(eq, *arrays)
        y = contiguous(xp, y)
        if y.dtype != arrays[0].dtype:
            y = y.astype(arrays[0].dtype)
        return self.from_compute(y, ts[0].data_type)


@register()
class Det(KernelBase):
    def __call__(self, X):
        x = self.tensor(X, "X")
        self.check_inputs(x)
        if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
            raise self.error("input must have shape [..., M, M]", X=x)
        xp = self.xp
        xc = self.to_compute(x)
        batch = x.shape[:-2]
        if x.shape[-1] == 0:
            y = xp.ones(batch, dtype=xc.dtype)
        elif int(np.prod(batch, dtype=np.int64)) == 0:
            y = xp.zeros(batch, dtype=xc.dtype)
        else:
            y = xp.linalg.det(xc)
        return self.from_compute(xp.asarray(y, dtype=xc.dtype), x.data_type)
