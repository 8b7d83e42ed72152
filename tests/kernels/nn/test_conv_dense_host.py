"""The group-1 2-D host convolution paths of _conv_host (conv2d_windows in each of its
layouts, conv2d, conv2d_taps, and dense_2d's choice among them) called
directly, against the float64 reference on random inputs: strides 1 to 4, dilations,
asymmetric pads and pads larger than the kernel, one-row images, batches of 1, 2 and 5,
odd sizes, float32 and float64, with and without a bias; and with an epilogue, which
must give exactly the bits of the activation applied to the path's own result."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from gpukernels.kernels.base import KernelContext
from gpukernels.kernels.nn import _conv_host as conv_host
from gpukernels.kernels.nn.conv import Conv, conv_function

from tests.reference import conv as ref_conv

# these tests check the host specialisations themselves (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("default_paths")

CASES = [
    # x shape, w shape, strides, pads (top, left, bottom, right), dilations
    ((2, 5, 9, 11), (6, 5, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    ((1, 4, 13, 10), (5, 4, 3, 3), (2, 2), (1, 0, 2, 1), (1, 1)),     # asymmetric pads
    ((5, 3, 11, 12), (4, 3, 3, 2), (3, 2), (0, 1, 2, 0), (1, 2)),     # 5 images, stride 3
    ((2, 3, 17, 15), (4, 3, 5, 5), (4, 4), (2, 2, 2, 2), (1, 1)),     # stride 4
    ((2, 6, 12, 12), (7, 6, 3, 3), (1, 1), (4, 4, 4, 4), (2, 3)),     # dilations
    ((1, 3, 4, 5), (2, 3, 3, 3), (1, 2), (5, 4, 3, 6), (1, 1)),       # pads larger than the kernel
    ((3, 4, 1, 9), (5, 4, 1, 3), (1, 1), (0, 1, 0, 1), (1, 1)),       # one-row image
    ((2, 4, 1, 7), (3, 4, 3, 3), (2, 1), (1, 1, 1, 1), (1, 1)),       # one row, 3x3 kernel
    ((2, 3, 23, 21), (8, 3, 7, 7), (2, 2), (3, 3, 3, 3), (1, 1)),     # a ResNet-like stem
    ((2, 2, 6, 7), (3, 2, 2, 2), (2, 2), (0, 0, 0, 0), (1, 1)),       # no padding
    ((1, 3, 7, 9), (4, 3, 3, 3), (2, 3), (2, 1, 0, 2), (2, 1)),       # strided and dilated
    ((2, 3, 32, 32), (8, 3, 16, 16), (16, 16), (0, 0, 0, 0), (1, 1)),  # ViT's patch embedding
    ((2, 4, 17, 19), (6, 4, 4, 4), (4, 4), (0, 0, 0, 0), (1, 1)),      # the input's last rows unread
    ((3, 2, 9, 10), (3, 2, 2, 3), (5, 3), (4, 1, 0, 2), (1, 1)),       # pads past the first window
]

DTYPES = [np.float32, np.float64]


def _tol(dtype):
    return {"rtol": 1e-5, "atol": 1e-4} if dtype == np.float32 else {"rtol": 1e-12, "atol": 1e-12}


def _out_shape(xs, ws, strides, pads, dil):
    return tuple((xs[2 + i] + pads[i] + pads[i + 2] - (ws[2 + i] - 1) * dil[i] - 1) // strides[i] + 1
                 for i in range(2))


def _relu(src, out):
    np.maximum(src, src.dtype.type(0), out=out)


def _clip(src, out):
    np.clip(src, src.dtype.type(-0.5), src.dtype.type(0.7), out=out)


def _inputs(case, dtype, rng):
    xs, ws, strides, pads, dil = case
    x = rng.standard_normal(xs).astype(dtype)
    w = rng.standard_normal(ws).astype(dtype)
    b = rng.standard_normal(ws[0]).astype(dtype)
    return x, w, b, strides, pads, dil, _out_shape(xs, ws, strides, pads, dil)


def _check_path(path, case, dtype, rng):
    """path(x, w, b, epilogue) against the reference, with and without a bias; with each
    epilogue, bit for bit the activation applied to the path's plain result."""
    x, w, b, strides, pads, dil, O = _inputs(case, dtype, rng)
    for bias in (b, None):
        plain = path(x, w, bias, strides, pads, dil, O, None)
        want = ref_conv(x, w, bias, strides, pads, dil)
        assert plain.shape == want.shape and plain.dtype == dtype
        np.testing.assert_allclose(plain, want, **_tol(dtype))
        for epilogue in (_relu, _clip):
            fused = path(x, w, bias, strides, pads, dil, O, epilogue)
            expected = plain.copy()
            epilogue(expected, expected)
            np.testing.assert_array_equal(fused, expected)


LAYOUTS = [{}] + [{"wide": wide, "phases": phases, "fold": fold}
                      for wide in (True, False) for phases in (True, False) for fold in (True, False)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda d: "-".join(f"{k}={v}" for k, v in d.items()) or "auto")
@pytest.mark.parametrize("case", CASES)
def test_windows_matches_reference(case, layout, dtype, rng):
    """conv2d_windows in every layout (wide rows only apply at unit strides or with phase
    images; the path falls back to exact rows elsewhere)."""
    _check_path(lambda x, w, b, s, p, d, O, e: conv_host.conv2d_windows(x, w, b, s, p, d, O, e, **layout),
                case, dtype, rng)


@pytest.mark.parametrize("fold", [True, False])
@pytest.mark.parametrize("case", [CASES[2], CASES[0], CASES[8]])
def test_windows_image_chunks(case, fold, rng, tuning):
    """A column budget of about two images: full and partial chunks of images, each
    rewriting the interior of the kept scratch."""
    xs, ws, strides, pads, dil = case
    O = _out_shape(xs, ws, strides, pads, dil)
    Wq = O[1] + (ws[3] - 1) * dil[1] // strides[1] + 1
    tuning({"conv.host_cols_bytes": 2 * 8 * (xs[1] * ws[2] * ws[3] + 1 + ws[0]) * O[0] * Wq})
    _check_path(lambda x, w, b, s, p, d, O, e: conv_host.conv2d_windows(x, w, b, s, p, d, O, e, fold=fold),
                case, np.float64, rng)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("budget", [None, 1])
@pytest.mark.parametrize("case", CASES)
def test_conv2d_matches_reference(case, budget, dtype, rng, tuning):
    """The phase-split columns in row blocks (budget 1: one output row per block)."""
    if budget is not None:
        tuning({"conv.host_cols_bytes": budget})
    _check_path(lambda x, w, b, s, p, d, O, e: conv_host.conv2d(x, w, b, s, p, d, O, e), case, dtype, rng)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", [c for c in CASES if c[2] == (1, 1)])
def test_taps_matches_reference(case, dtype, rng):
    _check_path(lambda x, w, b, s, p, d, O, e: conv_host.conv2d_taps(x, w, b, p, d, O, e), case, dtype, rng)


@pytest.mark.parametrize("budget", [None, 1])
@pytest.mark.parametrize("case", CASES)
def test_dense_2d_matches_reference(case, budget, rng, tuning):
    """dense_2d's own choice (budget 1: no path with columns of whole images fits)."""
    if budget is not None:
        tuning({"conv.host_cols_bytes": budget})
    _check_path(conv_host.dense_2d, case, np.float32, rng)


@pytest.mark.parametrize("case", [CASES[0], CASES[1], CASES[8]])
def test_conv_function_epilogue_is_bitwise_the_activation_after(case, rng):
    """Through conv_function (what a compiled graph calls): the fused activation gives the
    bits of the unfused convolution followed by the activation."""
    x, w, b, strides, pads, dil, O = _inputs(case, np.float32, rng)
    kernel = Conv(KernelContext("cpu"))
    plain = conv_function(np, x, w, list(strides), list(pads), list(dil), 1, list(O), kernel)(x, w, b)
    for epilogue in (_relu, _clip):
        fused = conv_function(np, x, w, list(strides), list(pads), list(dil), 1, list(O), kernel,
                              epilogue=epilogue)(x, w, b)
        expected = plain.copy()
        epilogue(expected, expected)
        np.testing.assert_array_equal(fused, expected)


def test_windows_scratch_is_not_stale(rng):
    """The kept zero-bordered scratch: calls of other geometries in between, new data in
    the same geometry, large values first (a stale interior or border would show)."""
    a = ((3, 4, 8, 9), (5, 4, 3, 3), (2, 2), (1, 2, 1, 0), (1, 1))
    c = ((2, 4, 6, 6), (3, 4, 3, 3), (1, 1), (2, 2, 2, 2), (2, 2))
    for case, scale in ((a, 1e3), (c, 1e3), (a, 1.0), (c, 1.0), (a, -5.0)):
        x, w, b, strides, pads, dil, O = _inputs(case, np.float64, rng)
        x *= scale
        y = conv_host.conv2d_windows(x, w, b, strides, pads, dil, O)
        np.testing.assert_allclose(y, ref_conv(x, w, b, strides, pads, dil), rtol=1e-12, atol=1e-9)
        y2 = conv_host.conv2d_windows(x[:1], w, b, strides, pads, dil, O)  # a smaller batch
        np.testing.assert_allclose(y2, y[:1], rtol=1e-12, atol=1e-9)


def test_windows_non_contiguous_input(rng):
    x = rng.standard_normal((2, 10, 11, 18))[:, ::2, :, ::-2]  # float64, strided and reversed
    w = rng.standard_normal((4, 5, 3, 3))
    b = rng.standard_normal(4)
    for strides in ((1, 1), (2, 2)):
        O = _out_shape(x.shape, w.shape, strides, (1, 0, 2, 1), (1, 1))
        y = conv_host.conv2d_windows(x, w, b, strides, (1, 0, 2, 1), (1, 1), O)
        np.testing.assert_allclose(y, ref_conv(x, w, b, strides, (1, 0, 2, 1), (1, 1)), rtol=1e-12, atol=1e-12)


def test_windows_threads_keep_their_own_scratch(rng):
    """Two threads convolving at once (each its own scratch), same and other geometries."""
    cases = [CASES[0], CASES[1], CASES[0], CASES[8]]
    data = [_inputs(case, np.float64, np.random.default_rng(i)) for i, case in enumerate(cases)]
    want = [ref_conv(x, w, b, s, p, d) for x, w, b, s, p, d, _ in data]
    errors = []

    def worker(k):
        try:
            for _ in range(30):
                for i in range(k, len(data), 2):
                    x, w, b, s, p, d, O = data[i]
                    np.testing.assert_allclose(conv_host.conv2d_windows(x, w, b, s, p, d, O), want[i],
                                               rtol=1e-12, atol=1e-12)
        except AssertionError as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_windows_scratch_stays_within_the_budget(rng, tuning):
    """The kept phase-image scratch of a thread never exceeds conv.host_cols_bytes."""
    budget = 64 << 10
    tuning({"conv.host_cols_bytes": budget})
    w = rng.standard_normal((3, 4, 3, 3)).astype(np.float32)
    for size in range(5, 40, 3):
        x = rng.standard_normal((2, 4, size, size)).astype(np.float32)
        conv_host.conv2d_windows(x, w, None, (1, 1), (1, 1, 1, 1), (1, 1), (size, size))
        held = sum(a.nbytes for a in conv_host._SCRATCH.planes.values())
        assert held <= budget
