"""com.microsoft Tokenizer: the string splitter scikit-learn's text vectorizers are
exported with (skl2onnx: StringNormalizer -> Tokenizer -> TfIdfVectorizer).  Host-side,
on Python strings, with RE2 (google-re2) for the separators and the token expression.

What onnxruntime's contrib definition leaves open, and what we chose (each checked
against onnxruntime 1.32's CPU kernel, tests/kernels/contrib/test_contrib_text.py):

* Matching is RE2's leftmost-longest ("as long as possible"), for separators too.
* Separators are applied one after the other, in the order given: the string is split
  at every match of the first one, each piece at every match of the second, and so on
  (so ["b", "ab"] splits "xaby" into "xa", "y").  Empty pieces are dropped.
* A token expression yields its non-empty, non-overlapping matches from left to right.
* Tokens with fewer than ``mincharnum`` characters (Unicode code points) are dropped.
* Character mode (``separators=[""]`` or ``tokenexp="."``): every code point, a newline
  included, is a token; ``mincharnum`` must then be 1.
* With ``mark``, each string's tokens are framed by "\\x02" and "\\x03" and the padding
  comes after the frame; when no string has a token the output has no column at all
  ([C, 0] / [N, C, 0], no frame), and an empty input keeps its own shape.
* Both attributes set (the definition asks for exactly one): the separators, as
  onnxruntime does.
* Refused with a clear error (onnxruntime refuses the same, or for the separators that
  match the empty string returns no token at all): neither attribute, mincharnum below
  1, an invalid pattern, a separator other than a lone "" that can match the empty
  string, inputs of rank 0 or above 2.
"""

from __future__ import annotations

import numpy as np

from ...dtypes import DataType
from ...errors import UnsupportedOperatorError
from ...limits import check_allocation, max_tensor_bytes
from ..base import register
from ..text.strings import compile_re2, re2, re2_message
from ._common import DOMAIN, ContribKernel

_START, _END = "\x02", "\x03"


def _text(value) -> str:
    """An attribute's or element's text (bytes that are not UTF-8 with replacements)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _pieces(text: str, rx):
    """The non-empty pieces of text between the matches of rx, left to right (lazily)."""
    at = 0
    for m in rx.finditer(text):
        start, end = m.span()
        if end > start:
            if start > at:
                yield text[at:start]
            at = end
    if at < len(text):
        yield text[at:]


def _split_all(text: str, compiled: list):
    """The non-empty pieces of text split at the matches of compiled[0], each split at the
    matches of compiled[1], and so on, left to right (lazily, depth first with an explicit
    stack: only the final tokens are ever held, and any number of separators is fine)."""
    stack = [_pieces(text, compiled[0])]
    while stack:
        piece = next(stack[-1], None)
        if piece is None:
            stack.pop()
        elif len(stack) == len(compiled):
            yield piece
        else:
            stack.append(_pieces(piece, compiled[len(stack)]))


def _matches(text: str, rx):
    """The non-empty matches of rx in text, left to right (lazily)."""
    return (m.group(0) for m in rx.finditer(text) if m.end() > m.start())


@register(domain=DOMAIN, versions=(1,))
class Tokenizer(ContribKernel):
    """Y: X's strings split into tokens along a new last axis, padded with pad_value
    (see the module docstring for the choices)."""

    max_inputs = 1

    def __call__(self, X, *more, mark=None, mincharnum=None, pad_value=None, separators=None, tokenexp=None,
                 **unknown):
        self.check_signature(more, unknown)
        x = self.tensor(X, "X")
        if x.data_type != DataType.STRING:
            raise self.type_error("input 'X' must be a string tensor", X=x)
        for name, value, kind in (("mark", mark, int), ("mincharnum", mincharnum, int),
                                  ("pad_value", pad_value, (str, bytes))):
            if value is None:
                raise self.error(f"attribute '{name}' is required", X=x)
            if not isinstance(value, kind) or isinstance(value, bool):
                raise self.error(f"attribute '{name}' must be {'an int' if kind is int else 'a string'}, "
                                 f"got {value!r:.200}", X=x)
        if mincharnum < 1:
            raise self.error(f"mincharnum must be at least 1, got {mincharnum}", X=x)
        if x.ndim not in (1, 2):
            raise self.error(f"X must be [C] or [N, C], got rank {x.ndim}", X=x)
        split = self._splitter(x, separators, tokenexp, mincharnum)
        arr = x.array if x.array.dtype == object else x.array.astype(object)
        if arr.size == 0:
            return self.result(np.empty(arr.shape, dtype=object), DataType.STRING)
        framed = 2 if mark else 0
        # the most tokens one string may give before the output passes max_tensor_bytes:
        # counted as they come, so that no string's token list grows past the limit
        limit = max_tensor_bytes(self.ctx)
        cap = None if limit is None else max(0, limit // (8 * arr.size) - framed)
        rows = []
        for s in arr.ravel():
            row = []
            for t in split(_text(s)):
                if len(t) >= mincharnum:
                    row.append(t)
                    if cap is not None and len(row) > cap:
                        check_allocation(self, arr.shape + (len(row) + framed,), object)
            rows.append(row)
        width = max(len(r) for r in rows)
        pad = _text(pad_value)
        if width and mark:
            rows = [[_START, *r, _END] for r in rows]
            width += 2
        check_allocation(self, arr.shape + (width,), object)
        out = np.full((arr.size, width), pad, dtype=object)
        for i, r in enumerate(rows):
            out[i, :len(r)] = r
        return self.result(out.reshape(arr.shape + (width,)), DataType.STRING)

    def _splitter(self, x, separators, tokenexp, mincharnum):
        """text -> its tokens (before the mincharnum filter), for the attributes given."""
        if re2 is None:  # pragma: no cover - google-re2 is a declared dependency
            raise UnsupportedOperatorError("com.microsoft Tokenizer needs the 'google-re2' package")
        if separators is not None and (isinstance(separators, (str, bytes)) or not isinstance(separators, list)
                                       or not all(isinstance(p, (str, bytes)) for p in separators)):
            raise self.error(f"attribute 'separators' must be a list of strings, got {separators!r:.200}", X=x)
        if tokenexp is not None and not isinstance(tokenexp, (str, bytes)):
            raise self.error(f"attribute 'tokenexp' must be a string, got {tokenexp!r:.200}", X=x)
        seps = None if separators is None else [_text(p) for p in separators]
        if tokenexp is not None:
            tokenexp = _text(tokenexp)
        if not seps and not tokenexp:
            raise self.error("one of the attributes 'separators' and 'tokenexp' must be set", X=x)
        char_mode = seps == [""] if seps else tokenexp == "."
        if char_mode:
            if mincharnum > 1:
                raise self.error(f"mincharnum {mincharnum} drops every token of character mode "
                                 "(separators [''] or tokenexp '.'): it must be 1", X=x)
            return iter  # each code point, one at a time
        patterns = seps if seps else [tokenexp]
        compiled = []
        for p in patterns:
            try:
                rx = compile_re2(p, longest=True)
            except re2.error as exc:
                what = "separator" if seps else "tokenexp"
                raise self.error(f"invalid RE2 {what} {p[:200]!r}: {re2_message(exc)}", X=x) from None
            if seps and rx.fullmatch("") is not None:
                raise self.error(f"separator {p[:200]!r} matches the empty string (only a lone '', "
                                 "character mode, may)", X=x)
            compiled.append(rx)
        if not seps:
            rx = compiled[0]
            return lambda text: _matches(text, rx)
        return lambda text: _split_all(text, compiled)
