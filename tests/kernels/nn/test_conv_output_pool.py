"""2-D Conv outputs of the host paths come from the reusable host pool (xp.host_empty) from
_conv_host.OUTPUT_POOL_BYTES up: a result the caller still holds is never handed out
again, a released one is reused, and results stay correct across reuse."""

from __future__ import annotations

import numpy as np

from gpukernels import xp as xp_mod
from gpukernels.kernels.base import KernelContext
from gpukernels.kernels.nn import _conv_host as conv_host
from gpukernels.kernels.nn.conv import Conv

from test_conv_pool_fastpaths import ref_conv


def _pooled(a) -> bool:
    """Whether a's memory is one of the host pool's buffers."""
    root = a
    while root.base is not None and isinstance(root.base, np.ndarray):
        root = root.base
    return any(root is b for b in xp_mod._HOST_OUTPUTS._bufs)


def test_held_results_are_kept_and_released_ones_reused(rng):
    k = Conv(KernelContext("cpu"))
    w = rng.standard_normal((32, 8, 3, 3)).astype(np.float32)
    xs = [rng.standard_normal((1, 8, 48, 48)).astype(np.float32) for _ in range(3)]
    on = xp_mod._HOST_OUTPUTS.max_bytes > 0  # GPUKERNELS_HOST_POOL_MB=0 turns the pool off
    first = k(xs[0], w, pads=[1, 1, 1, 1]).numpy()
    assert first.nbytes >= conv_host.OUTPUT_POOL_BYTES and _pooled(first) == on
    keep = first.copy()
    second = k(xs[1], w, pads=[1, 1, 1, 1]).numpy()
    assert not np.shares_memory(first, second)  # first is still held
    np.testing.assert_array_equal(first, keep)
    del second
    count = len(xp_mod._HOST_OUTPUTS._bufs)
    third = k(xs[2], w, pads=[1, 1, 1, 1]).numpy()
    assert _pooled(third) == on and len(xp_mod._HOST_OUTPUTS._bufs) == count  # an idle buffer came back
    for x, y in ((xs[0], first), (xs[2], third)):
        np.testing.assert_allclose(y, ref_conv(x, w, None, (1, 1), (1, 1, 1, 1), (1, 1)), rtol=1e-4, atol=1e-4)


def test_depthwise_and_tap_paths_pool_too(rng):
    k = Conv(KernelContext("cpu"))
    on = xp_mod._HOST_OUTPUTS.max_bytes > 0
    x = rng.standard_normal((1, 64, 48, 48)).astype(np.float32)  # both outputs >= 256 KiB
    for w, group in ((rng.standard_normal((64, 1, 3, 3)).astype(np.float32), 64),  # depthwise
                     (rng.standard_normal((32, 64, 3, 3)).astype(np.float32), 1)):  # tap products
        a = k(x, w, group=group, pads=[1, 1, 1, 1]).numpy()
        assert _pooled(a) == on
        ref = ref_conv(x, w, None, (1, 1), (1, 1, 1, 1), (1, 1), group=group)
        del a
        count = len(xp_mod._HOST_OUTPUTS._bufs)
        b = k(x, w, group=group, pads=[1, 1, 1, 1]).numpy()
        assert _pooled(b) == on and len(xp_mod._HOST_OUTPUTS._bufs) == count
        np.testing.assert_allclose(b, ref, rtol=1e-4, atol=1e-4)
