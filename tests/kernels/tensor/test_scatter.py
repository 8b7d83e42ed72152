"""ScatterND (gpukernels/kernels/tensor/scatter.py) against a loop reference
(tests/reference), on both paths: the host path assigns distinct rows from several
threads.  (More Scatter cases: tests/kernels/tensor/test_indexing.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from gpukernels.kernels import KernelContext
from gpukernels.kernels.tensor.scatter import ScatterND
from tests.reference import scatter_nd


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.float16, np.bool_])
def test_scatter_nd_distinct_rows_threads(device, path, rng, tuning, dtype):
    tuning({"scatter.parallel_assign": 1 << 10})
    data = (rng.standard_normal((300, 160)) * 10).astype(dtype)
    rows = rng.permutation(300)[:170].astype(np.int64)
    rows[::7] -= 300  # negative indices
    upd = (rng.standard_normal((170, 160)) * 10).astype(dtype)
    got = ScatterND(KernelContext(device, options={"paths": path}))(data, rows[:, None], upd).numpy()
    np.testing.assert_array_equal(got, scatter_nd(data, rows[:, None] % 300, upd))


def test_scatter_nd_repeated_rows_last_wins(device, path, rng, tuning):
    tuning({"scatter.parallel_assign": 1 << 10})
    data = rng.standard_normal((50, 128)).astype(np.float32)
    rows = rng.integers(0, 50, 200).astype(np.int64)  # many repeats
    upd = rng.standard_normal((200, 128)).astype(np.float32)
    got = ScatterND(KernelContext(device, options={"paths": path}))(data, rows[:, None], upd).numpy()
    np.testing.assert_array_equal(got, scatter_nd(data, rows[:, None], upd))


def test_scatter_nd_large_rows(device, path, rng):
    """Large enough for the threaded paths at their real thresholds."""
    data = rng.standard_normal((1200, 2048)).astype(np.float32)
    rows = rng.permutation(1200)[:1100].astype(np.int64)
    upd = rng.standard_normal((1100, 2048)).astype(np.float32)
    got = ScatterND(KernelContext(device, options={"paths": path}))(data, rows[:, None], upd).numpy()
    np.testing.assert_array_equal(got, scatter_nd(data, rows[:, None], upd))
    rows[-1] = rows[3]  # one repeat: the later update wins
    got = ScatterND(KernelContext(device, options={"paths": path}))(data, rows[:, None], upd).numpy()
    np.testing.assert_array_equal(got, scatter_nd(data, rows[:, None], upd))
    np.testing.assert_array_equal(got[rows[3]], upd[-1])


def test_scatter_nd_tuples_address_rows(device, path, rng, tuning):
    tuning({"scatter.parallel_assign": 1 << 8})
    data = rng.standard_normal((6, 7, 96)).astype(np.float32)
    idx = np.array([[[0, 1], [5, 6]], [[2, 3], [-1, 0]], [[4, -7], [3, 3]]], np.int64)  # (3, 2, 2)
    upd = rng.standard_normal((3, 2, 96)).astype(np.float32)
    got = ScatterND(KernelContext(device, options={"paths": path}))(data, idx, upd).numpy()
    want = scatter_nd(data, np.where(idx < 0, idx + np.array([6, 7]), idx), upd)
    np.testing.assert_array_equal(got, want)


def test_scatter_nd_input_not_modified(device, path, rng, tuning):
    tuning({"scatter.parallel_assign": 1 << 8})
    data = rng.standard_normal((40, 64)).astype(np.float32)
    keep = data.copy()
    rows = rng.permutation(40)[:30].astype(np.int64)[:, None]
    ScatterND(KernelContext(device, options={"paths": path}))(data, rows, rng.standard_normal((30, 64)).astype(np.float32))
    np.testing.assert_array_equal(data, keep)
