"""Tolerances and comparison shared by the emulator tests (tests/gpu) and the GPU check
(scripts/gpu_check.sh): a CUDA kernel must agree with the array-namespace path of the same
kernel class within these bounds, on the emulator and on a GPU alike.

Half types: both paths compute in float32 and round once, so they may differ by one unit
in the last place of the output type (plus float32 reassociation noise).
"""

from __future__ import annotations

import numpy as np

from ..dtypes import DataType

# data type -> (rtol, atol)
TOLERANCES = {
    DataType.FLOAT: (2e-5, 2e-5),
    DataType.FLOAT16: (2e-3, 2e-3),
    DataType.BFLOAT16: (1.6e-2, 1.6e-2),
    DataType.DOUBLE: (1e-12, 1e-12),
}


def tolerance(data_type, rtol=None, atol=None) -> tuple[float, float]:
    r, a = TOLERANCES.get(DataType(int(data_type)), (0.0, 0.0))
    return (r if rtol is None else rtol), (a if atol is None else atol)


def compare(actual: np.ndarray, expected: np.ndarray, data_type, rtol=None, atol=None, what: str = "output"):
    """None when actual matches expected within the tolerance of data_type, else a message."""
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    if actual.shape != expected.shape:
        return f"{what}: shape {actual.shape} != expected {expected.shape}"
    if actual.size == 0:
        return None
    r, a = tolerance(data_type, rtol, atol)
    x = actual.astype(np.float64)
    y = expected.astype(np.float64)
    nan_mismatch = np.isnan(x) != np.isnan(y)
    err = np.abs(x - y)
    bad = (err > a + r * np.abs(y)) & ~(np.isnan(x) & np.isnan(y))
    bad |= nan_mismatch
    if not bad.any():
        return None
    idx = np.unravel_index(int(np.argmax(np.where(bad, np.nan_to_num(err, nan=np.inf), -1))), x.shape)
    return (f"{what}: {int(bad.sum())} of {x.size} elements differ beyond rtol={r}, atol={a}; worst at {idx}: "
            f"{x[idx]!r} vs expected {y[idx]!r}")
