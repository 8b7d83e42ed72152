"""Parity over a dataset: per-sample errors and their summary per output.

For an output y (the evaluated device) and r (the --against side), element errors are
``|y - r|`` (absolute) and ``|y - r| / |r|`` (relative; infinite where r is 0 and y is
not); NaN against NaN and equal infinities count as equal, any other NaN or infinity
mismatch as an infinite error.  An element is outside tolerance when
``|y - r| > atol + rtol * |r|``.  Each sample gets its largest absolute and relative
element error and whether any of its elements is outside tolerance.  Over all samples an
output reports the maximum and the 99th percentile (numpy.percentile, linear) of those
per-sample errors, the share of samples outside tolerance and the worst samples (those that
differ at all: largest absolute error first, then by index).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

WORST = 10


def sample_errors(y, r, rtol: float, atol: float) -> "tuple[np.ndarray, np.ndarray, np.ndarray]":
    """(max_abs, max_rel, outside) per sample (first axis) of y against reference r."""
    y, r = np.asarray(y), np.asarray(r)
    n = r.shape[0] if r.ndim else 1
    if y.shape != r.shape:
        inf = np.full(n, np.inf)
        return inf, inf.copy(), np.ones(n, bool)
    if y.dtype.kind in "OUSV" or r.dtype.kind in "OUSV":
        same = (y == r).reshape(n, -1).all(axis=1) if y.size else np.ones(n, bool)
        err = np.where(same, 0.0, np.inf)
        return err, err.copy(), ~same
    kind = np.complex128 if "c" in (y.dtype.kind, r.dtype.kind) else np.float64
    yf = y.astype(kind).reshape(n, -1)
    rf = r.astype(kind).reshape(n, -1)
    if yf.shape[1] == 0:
        zero = np.zeros(n)
        return zero, zero.copy(), np.zeros(n, bool)
    nan_y, nan_r = np.isnan(yf), np.isnan(rf)
    inf_y, inf_r = np.isinf(yf), np.isinf(rf)
    same_special = (nan_y & nan_r) | (inf_y & inf_r & (yf == rf))
    with np.errstate(all="ignore"):
        err = np.abs(yf - rf)
        err = np.where(same_special, 0.0, err)
        err = np.where((nan_y ^ nan_r) | ((inf_y | inf_r) & ~same_special), np.inf, err)
        mag = np.abs(rf)
        rel = np.where(err == 0, 0.0, err / np.where(mag == 0, 1.0, mag))
        rel = np.where((err > 0) & (mag == 0), np.inf, rel)
        outside = err > atol + rtol * mag
    return err.max(axis=1), rel.max(axis=1), outside.any(axis=1)


@dataclass
class OutputParity:
    name: str
    samples: int
    max_abs: float
    p99_abs: float
    max_rel: float
    p99_rel: float
    outside: int                 # samples with an element outside tolerance
    outside_share: float
    worst: list = field(default_factory=list)   # [{"sample", "max_abs", "max_rel", "outside"}], differing only

    @property
    def passed(self) -> bool:
        return self.outside == 0


@dataclass
class ParitySummary:
    against: str
    device: str
    rtol: float
    atol: float
    samples: int
    outputs: list
    report: "str | None" = None      # the Markdown file, when written
    histogram: "str | None" = None   # the PNG beside it

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["passed"] = self.passed
        for o, od in zip(self.outputs, d["outputs"]):
            od["passed"] = o.passed
        return d


def _percentile(x: np.ndarray, q: float) -> float:
    if not x.size:
        return 0.0
    with np.errstate(invalid="ignore"):
        p = float(np.percentile(x, q))
    return float("inf") if np.isnan(p) else p


def summarize(name: str, max_abs: np.ndarray, max_rel: np.ndarray, outside: np.ndarray,
              worst: int = WORST) -> OutputParity:
    """OutputParity from the per-sample vectors of one output (index = sample number)."""
    n = int(max_abs.size)
    order = [i for i in np.lexsort((np.arange(n), -max_abs)) if max_abs[i] > 0 or outside[i]][:worst]
    return OutputParity(
        name, n, float(max_abs.max()) if n else 0.0, _percentile(max_abs, 99),
        float(max_rel.max()) if n else 0.0, _percentile(max_rel, 99),
        int(outside.sum()), float(outside.mean()) if n else 0.0,
        [{"sample": int(i), "max_abs": float(max_abs[i]), "max_rel": float(max_rel[i]),
          "outside": bool(outside[i])} for i in order])
