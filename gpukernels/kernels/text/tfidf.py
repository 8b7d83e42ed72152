"""TfIdfVectorizer.

Tokens are mapped to ids of the pool's vocabulary, then for every n in
[min_gram_length, max_gram_length] and every skip s in [0, max_skip_count] the n-grams
X[i], X[i + s + 1], ..., X[i + (n - 1)(s + 1)] are matched against the pool's n-grams (all
rows of a batch at once; unigrams are counted once, not once per skip, as onnxruntime
does).  TF gives counts, IDF min(count, 1) * weight, TFIDF count * weight.  The matching
runs on the host with NumPy (it is integer/str bookkeeping; string inputs live on the
host anyway); the float32 output is moved to the context's device.
"""

from __future__ import annotations

import numpy as np

from ...dtypes import DataType
from ...limits import check_allocation
from ..base import KernelBase, register

D = DataType


def _match(win, pool, base):
    """Pool row matching each window (-1 when none).  win (..., n) token ids (-1 =
    unknown), pool (G, n) token ids; ids < base."""
    g, n = pool.shape
    valid = np.all(win >= 0, axis=-1)
    pw = np.zeros(win.shape[:-1], np.int64)
    pp = np.zeros(g, np.int64)
    uniq = np.zeros(1, np.int64)
    inv = np.zeros(g, np.int64)
    for j in range(n):
        cp = pp * base + pool[:, j]
        uniq, inv = np.unique(cp, return_inverse=True)
        cw = pw * base + np.maximum(win[..., j], 0)
        pos = np.minimum(np.searchsorted(uniq, cw), uniq.size - 1)
        valid &= uniq[pos] == cw
        pp, pw = inv.reshape(-1), pos
    first = np.full(uniq.size, -1, np.int64)
    first[inv[::-1]] = np.arange(g)[::-1]
    return np.where(valid, first[pw], -1)


@register()
class TfIdfVectorizer(KernelBase):
    def __call__(self, X, max_gram_length=None, max_skip_count=None, min_gram_length=None, mode=None,
                 ngram_counts=None, ngram_indexes=None, pool_int64s=None, pool_strings=None, weights=None):
        xt = self.tensor(X, "X")
        self.check_inputs(xt)
        named = dict(X=xt)
        for name, v in (("max_gram_length", max_gram_length), ("max_skip_count", max_skip_count),
                        ("min_gram_length", min_gram_length), ("mode", mode),
                        ("ngram_counts", ngram_counts), ("ngram_indexes", ngram_indexes)):
            if v is None:
                raise self.error(f"attribute '{name}' is required", **named)
        if mode not in ("TF", "IDF", "TFIDF"):
            raise self.error(f"mode must be TF, IDF or TFIDF, got {mode!r}", **named)
        if (pool_int64s is None) == (pool_strings is None):
            raise self.error("exactly one of pool_int64s and pool_strings must be set", **named)
        lo, hi, skip = int(min_gram_length), int(max_gram_length), int(max_skip_count)
        if lo < 1 or hi < lo or skip < 0:
            raise self.error(f"need 1 <= min_gram_length ({lo}) <= max_gram_length ({hi}) and "
                             f"max_skip_count ({skip}) >= 0", **named)
        strings = pool_strings is not None
        if strings != (xt.data_type == D.STRING):
            raise self.type_error("a string pool needs string input and an int64 pool integer input",
                                  **named)
        if xt.ndim not in (1, 2):
            raise self.error("X must be 1-D [C] or 2-D [N, C]", **named)
        pool = list(pool_strings) if strings else np.asarray(pool_int64s, np.int64)
        starts = [int(c) for c in ngram_counts]
        indexes = np.asarray(ngram_indexes, np.int64)
        groups = []  # (n, first global n-gram number, pool slice)
        total = 0
        for i, s in enumerate(starts):
            e = starts[i + 1] if i + 1 < len(starts) else len(pool)
            n = i + 1
            if s < 0 or e < s or e > len(pool) or (e - s) % n:
                raise self.error(f"ngram_counts {starts} do not split a pool of {len(pool)} items into "
                                 "whole n-grams", **named)
            groups.append((n, total, s, e))
            total += (e - s) // n
        if indexes.size != total:
            raise self.error(f"ngram_indexes has {indexes.size} entries, the pool holds {total} n-grams",
                             **named)
        if indexes.size and indexes.min() < 0:
            raise self.error("ngram_indexes must be non-negative", **named)
        w = np.ones(total) if weights is None else np.asarray(weights, np.float64)
        if w.size != total:
            raise self.error(f"weights has {w.size} entries, expected {total}", **named)
        width = int(indexes.max()) + 1 if indexes.size else 0
        # the output width is the largest ngram_index + 1, whatever the pool's size
        nrows = xt.shape[0] if xt.ndim == 2 else 1
        check_allocation(self, (nrows, width), np.float32)
        check_allocation(self, (nrows, total), np.float64, what="count table")
        # token ids
        x = xt.numpy()
        rows = x.reshape(1, -1) if x.ndim == 1 else x
        if strings:
            vocab = {}
            for tok in pool:
                vocab.setdefault(tok, len(vocab))
            pool_ids = np.array([vocab[t] for t in pool], np.int64)
            ids = np.fromiter((vocab.get(str(t), -1) for t in rows.ravel()), np.int64,
                              count=rows.size).reshape(rows.shape)
            base = len(vocab) + 1
        else:
            uniq = np.unique(pool)
            pool_ids = np.searchsorted(uniq, pool).astype(np.int64)
            flat = rows.astype(np.int64)
            pos = np.minimum(np.searchsorted(uniq, flat), max(uniq.size - 1, 0))
            ids = np.where(uniq[pos] == flat, pos, -1) if uniq.size else np.full(flat.shape, -1)
            base = uniq.size + 1
        nrows, ncols = ids.shape
        counts = np.zeros((nrows, total), np.float64)
        for n, first, s, e in groups:
            if n < lo or n > hi or e == s:
                continue
            pool_n = pool_ids[s:e].reshape(-1, n)
            for sk in range(skip + 1 if n > 1 else 1):
                span = (n - 1) * (sk + 1)
                nwin = ncols - span
                if nwin <= 0:
                    break
                cols = np.arange(nwin)[:, None] + np.arange(n)[None, :] * (sk + 1)
                win = ids[:, cols]  # (rows, nwin, n)
                hit = _match(win, pool_n, base)
                r, c = np.nonzero(hit >= 0)
                if r.size:
                    np.add.at(counts, (r, first + hit[r, c]), 1.0)
        if mode == "IDF":
            counts = np.minimum(counts, 1.0) * w
        elif mode == "TFIDF":
            counts = counts * w
        out = np.zeros((nrows, width), np.float32)
        out[:, indexes] = counts
        if x.ndim == 1:
            out = out.reshape(width)
        return self.result(self.xp.asarray(out), D.FLOAT)
