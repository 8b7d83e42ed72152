"""StringConcat, StringSplit, StringNormalizer and RegexFullMatch (host-side).

Strings are Python str in NumPy object arrays.  Case changes use Python's str.lower /
str.upper (full Unicode case mapping, independent of installed locales); the 'locale'
attribute of StringNormalizer is accepted and ignored.  RegexFullMatch uses Python's
``re.fullmatch``: the common RE2 syntax (classes, groups, alternation, repetition,
anchors, \\b, \\w, \\d, \\s, named groups (?P<name>...)) behaves the same; RE2-only
constructs such as \\pL or \\C raise a clear error.
"""

from __future__ import annotations

import functools
import re
from typing import NamedTuple

import numpy as np

from ...dtypes import DataType
from ...tensor import Tensor
from ..base import KernelBase, register

D = DataType


def _strings(kernel, value, name):
    t = kernel.tensor(value, name)
    if t.data_type != D.STRING:
        raise kernel.type_error(f"input '{name}' must be a string tensor", **{name: t})
    arr = t.array
    if arr.dtype != object:
        arr = arr.astype(object)
    return t, arr


def _str_array(items, shape):
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out.reshape(shape)


@register()
class StringConcat(KernelBase):
    def __call__(self, X, Y):
        xt, x = _strings(self, X, "X")
        yt, y = _strings(self, Y, "Y")
        try:
            shape = np.broadcast_shapes(x.shape, y.shape)
        except ValueError:
            raise self.error("shapes do not broadcast", X=xt, Y=yt) from None
        if not int(np.prod(shape)):
            return self.result(np.empty(shape, dtype=object), D.STRING)
        z = np.add(x, y, dtype=object)  # elementwise str + str, broadcasting
        return self.result(np.asarray(z, dtype=object).reshape(shape), D.STRING)


@register()
class StringSplit(KernelBase):
    """Y: X.shape + [max substrings], padded with ''; Z: substring counts (int64).  An
    empty string splits into [] on whitespace and into [''] on a delimiter."""

    class Result(NamedTuple):
        Y: Tensor
        Z: Tensor

    def __call__(self, X, delimiter=None, maxsplit=None):
        xt, x = _strings(self, X, "X")
        if maxsplit is not None and int(maxsplit) < 0:
            raise self.error(f"maxsplit must be non-negative, got {maxsplit}", X=xt)
        limit = -1 if maxsplit is None else int(maxsplit)
        sep = delimiter if delimiter else None
        parts = [str(s).split(sep, limit) for s in x.ravel()]
        counts = np.array([len(p) for p in parts], np.int64).reshape(x.shape)
        width = int(counts.max()) if counts.size else 0
        y = np.full(x.size * width, "", dtype=object)
        flat = [piece for p in parts for piece in p + [""] * (width - len(p))]
        y[:] = flat if flat else y[:0]
        return self.Result(self.result(y.reshape(x.shape + (width,)), D.STRING),
                           self.result(self.xp.asarray(counts), D.INT64))


@register()
class StringNormalizer(KernelBase):
    """X is [C] or [1, C].  Stop words are removed first (compared case-insensitively via
    str.lower unless is_case_sensitive), then the case is changed.  When every element is
    removed the output is [''] with shape [1] or [1, 1]."""

    def __call__(self, X, case_change_action="NONE", is_case_sensitive=0, locale=None, stopwords=None):
        xt, x = _strings(self, X, "X")
        if case_change_action not in ("NONE", "LOWER", "UPPER"):
            raise self.error(f"case_change_action must be NONE, LOWER or UPPER, got {case_change_action!r}",
                             X=xt)
        if not (x.ndim == 1 or (x.ndim == 2 and x.shape[0] == 1)):
            raise self.error("X must be [C] or [1, C]", X=xt)
        items = [str(s) for s in x.ravel()]
        if stopwords:
            if is_case_sensitive:
                stop = set(stopwords)
                items = [s for s in items if s not in stop]
            else:
                stop = {w.lower() for w in stopwords}
                items = [s for s in items if s.lower() not in stop]
        if case_change_action == "LOWER":
            items = [s.lower() for s in items]
        elif case_change_action == "UPPER":
            items = [s.upper() for s in items]
        if not items:
            items = [""]
        shape = (len(items),) if x.ndim == 1 else (1, len(items))
        return self.result(_str_array(items, shape), D.STRING)


_RE2_ONLY = re.compile(r"\\[pPC]|\\Q|\\E|\(\?[imsU-]*:|\[\[:")


@functools.lru_cache(maxsize=256)
def _compile(pattern: str):
    return re.compile(pattern)


@register()
class RegexFullMatch(KernelBase):
    def __call__(self, X, pattern=None):
        xt, x = _strings(self, X, "X")
        if pattern is None:
            raise self.error("attribute 'pattern' is required", X=xt)
        try:
            rx = _compile(pattern)
        except re.error as exc:
            hint = " (RE2-only syntax is not supported)" if _RE2_ONLY.search(pattern) else ""
            raise self.error(f"invalid pattern {pattern!r}: {exc}{hint}", X=xt) from None
        out = np.fromiter((rx.fullmatch(str(s)) is not None for s in x.ravel()), dtype=bool, count=x.size)
        return self.result(self.xp.asarray(out.reshape(x.shape)), D.BOOL)
