"""StringConcat, StringSplit, StringNormalizer and RegexFullMatch (host-side).

Strings are Python str in NumPy object arrays.  Case changes use Python's str.lower /
str.upper (full Unicode case mapping, independent of installed locales); the 'locale'
attribute of StringNormalizer is accepted and ignored.  RegexFullMatch uses RE2 (the
``google-re2`` package) with its default options, as the spec asks: RE2 syntax and
semantics (\\pL, \\p{Greek}, [[:alpha:]], \\Q...\\E, ASCII-only \\w/\\d/\\s/\\b, '.' not
matching a newline) and matching in time linear in the text, so a pattern such as
``(a+)+$`` cannot blow up as it does in a backtracking engine.  Constructs RE2 does not
have (backreferences, look-around, \\Z) raise a KernelInputError naming the pattern.
"""

from __future__ import annotations

import functools
import re
from typing import NamedTuple

import numpy as np

try:
    import re2
except ImportError:  # pragma: no cover - declared dependency; RegexFullMatch says so
    re2 = None

from ...dtypes import DataType
from ...errors import UnsupportedOperatorError
from ...limits import check_allocation, max_tensor_bytes
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
        texts = [str(s) for s in x.ravel()]
        _check_split_width(self, x.shape, texts, sep, limit)
        parts = [t.split(sep, limit) for t in texts]
        counts = np.array([len(p) for p in parts], np.int64).reshape(x.shape)
        width = int(counts.max()) if counts.size else 0
        # padded to the longest split: one long element widens every row
        check_allocation(self, x.shape + (width,), object)
        y = np.full(x.size * width, "", dtype=object)
        flat = [piece for p in parts for piece in p + [""] * (width - len(p))]
        y[:] = flat if flat else y[:0]
        return self.Result(self.result(y.reshape(x.shape + (width,)), D.STRING),
                           self.result(self.xp.asarray(counts), D.INT64))


_NON_SPACE = re.compile(r"\S+")


def _check_split_width(kernel, shape, texts, sep, limit) -> None:
    """Refuse (ResourceLimitError) a split whose padded output would pass max_tensor_bytes
    before any string is split: the pieces of each string are counted without building
    them (str.count for a delimiter; a lazy count of the runs of non-space characters
    for whitespace, only for strings long enough to matter)."""
    budget = max_tensor_bytes(kernel.ctx)
    if budget is None or not texts:
        return
    cap = budget // (8 * len(texts))
    widest = 0
    for t in texts:
        if sep is None:
            if len(t) // 2 + 1 <= cap:  # cannot have more pieces than that
                continue
            n = sum(1 for _ in _NON_SPACE.finditer(t))
        else:
            n = t.count(sep) + 1
        widest = max(widest, n if limit < 0 else min(n, limit + 1))
    check_allocation(kernel, tuple(shape) + (widest,), object)



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


@functools.lru_cache(maxsize=256)
def compile_re2(pattern: str, longest: bool = False):
    """The compiled RE2 pattern (longest: leftmost-longest matching instead of RE2's
    default leftmost-first); raises re2.error for an invalid one."""
    options = re2.Options()
    options.log_errors = False  # the message goes into our exception, not to stderr
    options.longest_match = longest
    return re2.compile(pattern, options)


def re2_message(exc) -> str:
    """The text of a re2.error (its argument may be bytes)."""
    msg = exc.args[0] if exc.args else str(exc)
    return msg.decode("utf-8", "replace") if isinstance(msg, bytes) else str(msg)


@register()
class RegexFullMatch(KernelBase):
    def __call__(self, X, pattern=None):
        xt, x = _strings(self, X, "X")
        if pattern is None:
            raise self.error("attribute 'pattern' is required", X=xt)
        if isinstance(pattern, bytes):
            try:
                pattern = pattern.decode("utf-8")
            except UnicodeDecodeError:
                raise self.error(f"pattern {pattern[:200]!r} is not UTF-8 text", X=xt) from None
        if re2 is None:  # pragma: no cover - google-re2 is a declared dependency
            raise UnsupportedOperatorError("RegexFullMatch needs the 'google-re2' package "
                                           "(pip install google-re2)")
        try:
            rx = compile_re2(pattern)
        except re2.error as exc:
            shown = repr(pattern) if len(pattern) <= 200 else repr(pattern[:200]) + "..."
            raise self.error(f"invalid RE2 pattern {shown}: {re2_message(exc)}", X=xt) from None
        try:
            out = np.fromiter((rx.fullmatch(s if isinstance(s, (str, bytes)) else str(s)) is not None
                               for s in x.ravel()), dtype=bool, count=x.size)
        except UnicodeEncodeError as exc:
            raise self.error(f"an element of X is not valid Unicode text: {exc}", X=xt) from None
        return self.result(self.xp.asarray(out.reshape(x.shape)), D.BOOL)
