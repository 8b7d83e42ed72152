"""Conv, ConvTranspose, ConvInteger, DeformConv, Col2Im against naive float64 loops."""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest

from gpukernels.errors import KernelInputError, KernelTypeError
from gpukernels.kernels.base import KernelContext
from gpukernels.kernels.nn.conv import Conv
from gpukernels.kernels.nn.conv_transpose import ConvTranspose
from gpukernels.kernels.nn.conv_variants import Col2Im, ConvInteger, DeformConv
from gpukernels.tensor import Tensor
from tests.reference import conv

# ---------------------------------------------------------------- references

ref_conv = conv  # tests/reference/conv.py


def ref_conv_transpose(x, w, b=None, strides=None, pads=None, dilations=None, group=1,
                       output_padding=None, out_shape=None):
    """Scatter form: every input pixel adds w * x into the full output, then crop."""
    x = np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    N, C = x.shape[:2]
    Mg = w.shape[1]
    M = Mg * group
    K = w.shape[2:]
    S = x.shape[2:]
    n = len(K)
    strides = strides or [1] * n
    dilations = dilations or [1] * n
    pads = pads or [0] * (2 * n)
    op = output_padding or [0] * n
    full = [strides[i] * (S[i] - 1) + (K[i] - 1) * dilations[i] + 1 + op[i] for i in range(n)]
    if out_shape is None:
        out_shape = [full[i] - pads[i] - pads[i + n] for i in range(n)]
    size = [max(full[i], pads[i] + out_shape[i]) for i in range(n)]
    buf = np.zeros((N, M, *size))
    Cg = C // group
    for nn in range(N):
        for c in range(C):
            g = c // Cg
            for i in itertools.product(*[range(v) for v in S]):
                for m in range(Mg):
                    for k in itertools.product(*[range(v) for v in K]):
                        pos = tuple(i[d] * strides[d] + k[d] * dilations[d] for d in range(n))
                        buf[(nn, g * Mg + m) + pos] += x[(nn, c) + i] * w[(c, m) + k]
    y = buf[(slice(None), slice(None)) + tuple(slice(pads[d], pads[d] + out_shape[d]) for d in range(n))]
    if b is not None:
        y = y + np.asarray(b, np.float64).reshape((1, M) + (1,) * n)
    return y


def close(got, want, rtol=1e-5, atol=1e-5):
    got = np.asarray(got, np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def rnd(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


# ---------------------------------------------------------------- Conv

CONV_CASES = [
    # (x shape, w shape, attrs)
    ((2, 3, 11), (4, 3, 3), dict()),
    ((1, 4, 10), (6, 2, 4), dict(group=2, strides=[3], pads=[2, 1], dilations=[2])),
    ((2, 3, 7, 8), (5, 3, 3, 3), dict(pads=[1, 1, 1, 1])),
    ((2, 4, 7, 8), (6, 2, 3, 2), dict(group=2, strides=[2, 1], pads=[1, 0, 2, 1], dilations=[1, 2])),
    ((1, 3, 9, 9), (4, 3, 1, 1), dict()),
    ((2, 6, 5, 7), (4, 6, 1, 1), dict(strides=[2, 3])),
    ((2, 6, 5, 7), (4, 3, 1, 1), dict(group=2, pads=[1, 0, 0, 1])),
    ((2, 6, 8, 7), (6, 1, 3, 3), dict(group=6, pads=[1, 1, 1, 1])),  # depthwise
    ((2, 6, 8, 7), (12, 1, 3, 2), dict(group=6, strides=[2, 2], dilations=[2, 1], pads=[2, 0, 1, 1])),
    ((1, 4, 9), (8, 1, 3), dict(group=4, pads=[1, 2], dilations=[2])),  # 1-D depthwise
    ((1, 2, 5, 6, 4), (3, 2, 2, 3, 2), dict(pads=[1, 0, 1, 0, 1, 1], strides=[1, 2, 1])),
    ((2, 4, 5, 5, 4), (4, 1, 3, 3, 3), dict(group=4, pads=[1] * 6)),  # 3-D depthwise
    ((1, 2, 4, 4, 3, 3), (2, 2, 2, 2, 2, 2), dict()),  # 4-D
]


@pytest.mark.parametrize("xs,ws,attrs", CONV_CASES)
def test_conv_matches_reference(device, rng, xs, ws, attrs):
    x, w, b = rnd(rng, xs), rnd(rng, ws), rnd(rng, ws[:1])
    x0, w0 = x.copy(), w.copy()
    y = Conv(KernelContext(device))(x, w, b, **attrs).numpy()
    assert y.dtype == np.float32
    close(y, ref_conv(x, w, b, attrs.get("strides"), attrs.get("pads"), attrs.get("dilations"),
                      attrs.get("group", 1)), rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(w, w0)


@pytest.mark.parametrize("mode", ["SAME_UPPER", "SAME_LOWER", "VALID", "NOTSET"])
@pytest.mark.parametrize("stride", [1, 2, 3])
def test_conv_auto_pad(device, rng, mode, stride):
    x, w = rnd(rng, (1, 2, 7, 6)), rnd(rng, (3, 2, 3, 4))
    y = Conv(KernelContext(device))(x, w, auto_pad=mode, strides=[stride, stride]).numpy()
    if mode in ("SAME_UPPER", "SAME_LOWER"):
        pads = []
        for size, k in zip((7, 6), (3, 4)):
            out = -(-size // stride)
            total = max(0, (out - 1) * stride + k - size)
            small = total // 2
            pads.append((small, total - small) if mode == "SAME_UPPER" else (total - small, small))
        flat = [pads[0][0], pads[1][0], pads[0][1], pads[1][1]]
        assert y.shape[2:] == (-(-7 // stride), -(-6 // stride))
    else:
        flat = [0, 0, 0, 0]
    close(y, ref_conv(x, w, None, [stride, stride], flat), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype,tol", [(np.float16, 2e-2), (ml_dtypes.bfloat16, 6e-2), (np.float64, 1e-12)])
def test_conv_dtypes(device, rng, dtype, tol):
    x, w, b = rnd(rng, (2, 4, 6, 6)), rnd(rng, (4, 2, 3, 3)), rnd(rng, (4,))
    xs, ws, bs = x.astype(dtype), w.astype(dtype), b.astype(dtype)
    y = Conv(KernelContext(device))(xs, ws, bs, group=2, pads=[1, 1, 1, 1]).numpy()
    assert y.dtype == np.dtype(dtype)
    want = ref_conv(xs.astype(np.float64), ws.astype(np.float64), bs.astype(np.float64),
                    pads=[1, 1, 1, 1], group=2)
    close(y.astype(np.float64), want, rtol=tol, atol=tol)


def test_conv_bfloat16_needs_opset_22(rng):
    x = rnd(rng, (1, 1, 3, 3)).astype(ml_dtypes.bfloat16)
    with pytest.raises(KernelTypeError, match="Conv"):
        Conv(KernelContext("cpu", opset=11))(x, x)


def test_conv_chunked_workspace(device, rng, tuning):
    """Tiny workspace: the im2col path must chunk over batch and rows and agree."""
    tuning({"spatial.workspace_bytes": 2048, "spatial.host_chunk_bytes": 2048})
    x, w, b = rnd(rng, (3, 3, 9, 8)), rnd(rng, (4, 3, 3, 3)), rnd(rng, (4,))
    y = Conv(KernelContext(device))(x, w, b, pads=[1, 2, 0, 1], strides=[2, 1]).numpy()
    close(y, ref_conv(x, w, b, [2, 1], [1, 2, 0, 1]), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("group", [1, 2])
def test_conv_chunked_over_batch(device, rng, tuning, group):
    """Workspace for two images: the im2col path runs whole-image chunks (2, 2, 1)."""
    tuning({"spatial.workspace_bytes": 12000, "spatial.host_chunk_bytes": 12000})
    x, w, b = rnd(rng, (5, 4, 6, 6)), rnd(rng, (6, 4 // group, 3, 3)), rnd(rng, (6,))
    y = Conv(KernelContext(device))(x, w, b, pads=[1, 1, 1, 1], group=group).numpy()
    close(y, ref_conv(x, w, b, [1, 1], [1, 1, 1, 1], group=group), rtol=1e-4, atol=1e-4)


def test_conv_empty_batch(device, rng):
    y = Conv(KernelContext(device))(np.zeros((0, 2, 5, 5), np.float32), rnd(rng, (3, 2, 3, 3))).numpy()
    assert y.shape == (0, 3, 3, 3)


@pytest.mark.parametrize("xs,ws,group", [((2, 0, 5, 5), (3, 0, 3, 3), 1), ((1, 0, 6), (4, 0, 2), 1),
                                         ((1, 0, 3, 4, 4), (2, 0, 1, 2, 2), 1), ((1, 0, 4, 4), (4, 0, 1, 1), 2)])
@pytest.mark.parametrize("bias", [True, False])
def test_conv_zero_input_channels(device, rng, xs, ws, group, bias):
    # an empty reduction: the output is the bias (or zeros); used to divide by zero
    b = rnd(rng, (ws[0],)) if bias else None
    y = Conv(KernelContext(device))(np.zeros(xs, np.float32), np.zeros(ws, np.float32), b, group=group).numpy()
    out_sp = tuple(s - k + 1 for s, k in zip(xs[2:], ws[2:]))
    want = np.zeros((xs[0], ws[0]) + out_sp, np.float32)
    if bias:
        want += b.reshape((1, -1) + (1,) * len(out_sp))
    np.testing.assert_array_equal(y, want)


def test_conv_kernel_shape_attribute(device, rng):
    x, w = rnd(rng, (1, 1, 5, 5)), rnd(rng, (1, 1, 3, 3))
    k = Conv(KernelContext(device))
    close(k(x, w, kernel_shape=[3, 3]).numpy(), ref_conv(x, w), rtol=1e-4, atol=1e-4)
    with pytest.raises(KernelInputError, match="kernel_shape"):
        k(x, w, kernel_shape=[2, 2])


@pytest.mark.parametrize("xs,ws,attrs,match", [
    ((1, 4, 5, 5), (2, 3, 3, 3), {}, "channel mismatch"),
    ((1, 4, 5, 5), (3, 2, 3, 3), dict(group=2), "multiple of group"),
    ((1, 2, 2, 2), (1, 2, 3, 3), {}, "larger than the padded input"),
    ((1, 2, 5, 5), (1, 2, 3, 3), dict(pads=[1, 1]), "pads"),
    ((1, 2, 5, 5), (1, 2, 3, 3), dict(auto_pad="SAME"), "auto_pad"),
    ((1, 2, 5, 5), (1, 2, 3, 3), dict(strides=[0, 1]), "strides"),
    ((1, 2, 5, 5), (1, 2, 3), {}, "rank"),
    ((2, 5), (1, 2), {}, "rank"),
])
def test_conv_bad_inputs(rng, xs, ws, attrs, match):
    with pytest.raises(KernelInputError, match=match) as info:
        Conv()(rnd(rng, xs), rnd(rng, ws), **attrs)
    assert "Conv" in str(info.value) and "float32" in str(info.value)


def test_conv_bad_bias(rng):
    with pytest.raises(KernelInputError, match="B must have shape"):
        Conv()(rnd(rng, (1, 2, 4, 4)), rnd(rng, (3, 2, 3, 3)), rnd(rng, (2,)))


def test_conv_calls_cuda_path_with_resolved_pads(rng, monkeypatch):
    """On a GPU, Conv hands the CUDA path the resolved begin..end pads first."""
    seen = {}

    def fake(self, **kw):
        seen.update(kw)
        return "fast"

    monkeypatch.setattr(Conv, "on_gpu", property(lambda self: True))
    monkeypatch.setattr(Conv, "cuda_path", fake)
    out = Conv()(rnd(rng, (1, 2, 5, 5)), rnd(rng, (4, 1, 2, 2)), auto_pad="SAME_LOWER", group=2)
    assert out == "fast"
    assert seen["pads"] == [1, 1, 0, 0] and seen["strides"] == [1, 1] and seen["group"] == 2
    assert seen["dilations"] == [1, 1] and seen["B"] is None


# ---------------------------------------------------------------- ConvTranspose

CT_CASES = [
    ((2, 3, 5), (3, 2, 3), dict(strides=[2])),
    ((1, 2, 4, 3), (2, 3, 3, 2), dict(strides=[2, 1], pads=[1, 0, 0, 1], dilations=[1, 2])),
    ((2, 4, 3, 3), (4, 2, 2, 2), dict(group=2, strides=[2, 2])),
    ((1, 2, 3, 4), (2, 2, 3, 3), dict(strides=[3, 2], output_padding=[1, 1])),
    ((1, 2, 3, 2, 2), (2, 1, 2, 2, 3), dict(strides=[1, 2, 1], pads=[0, 1, 1, 1, 0, 0])),
    ((1, 4, 3, 3), (4, 1, 3, 3), dict(group=4, pads=[1, 1, 1, 1])),
]


@pytest.mark.parametrize("xs,ws,attrs", CT_CASES)
def test_conv_transpose_matches_reference(device, rng, xs, ws, attrs):
    x, w = rnd(rng, xs), rnd(rng, ws)
    b = rnd(rng, (ws[1] * attrs.get("group", 1),))
    y = ConvTranspose(KernelContext(device))(x, w, b, **attrs).numpy()
    want = ref_conv_transpose(x, w, b, attrs.get("strides"), attrs.get("pads"), attrs.get("dilations"),
                              attrs.get("group", 1), attrs.get("output_padding"))
    close(y, want, rtol=1e-4, atol=1e-4)


def test_conv_transpose_output_shape(device, rng):
    x, w, b = rnd(rng, (1, 1, 3, 3)), rnd(rng, (1, 2, 3, 3)), rnd(rng, (2,))
    k = ConvTranspose(KernelContext(device))
    # total padding 1 along axis 0 (9 -> 8): the larger half goes first unless SAME_UPPER
    y = k(x, w, b, strides=[3, 2], output_shape=[8, 7]).numpy()
    close(y, ref_conv_transpose(x, w, b, [3, 2], [1, 0, 0, 0], out_shape=[8, 7]), rtol=1e-4, atol=1e-4)
    y = k(x, w, b, strides=[3, 2], output_shape=[8, 7], auto_pad="SAME_UPPER").numpy()
    close(y, ref_conv_transpose(x, w, b, [3, 2], [0, 0, 1, 0], out_shape=[8, 7]), rtol=1e-4, atol=1e-4)
    # larger than the full result: the extra positions hold only the bias
    y = k(x, w, b, strides=[3, 2], output_shape=[1, 2, 10, 8]).numpy()
    close(y, ref_conv_transpose(x, w, b, [3, 2], [0, 0, 0, 0], out_shape=[10, 8]), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode", ["SAME_UPPER", "SAME_LOWER"])
def test_conv_transpose_auto_pad(device, rng, mode):
    x, w = rnd(rng, (1, 2, 3, 4)), rnd(rng, (2, 1, 3, 2))
    y = ConvTranspose(KernelContext(device))(x, w, auto_pad=mode, strides=[2, 2]).numpy()
    assert y.shape == (1, 1, 6, 8)
    pads = []
    for size, k in ((3, 3), (4, 2)):
        total = 2 * (size - 1) + k - 2 * size
        total = max(total, 0)
        pads.append((total // 2, total - total // 2) if mode == "SAME_UPPER" else (total - total // 2, total // 2))
    flat = [pads[0][0], pads[1][0], pads[0][1], pads[1][1]]
    close(y, ref_conv_transpose(x, w, None, [2, 2], flat, out_shape=[6, 8]), rtol=1e-4, atol=1e-4)


def test_conv_transpose_chunked(device, rng, tuning):
    tuning({"spatial.workspace_bytes": 1024, "spatial.host_chunk_bytes": 1024})
    x, w = rnd(rng, (3, 2, 6, 5)), rnd(rng, (2, 3, 3, 3))
    y = ConvTranspose(KernelContext(device))(x, w, strides=[2, 1], pads=[1, 0, 1, 1]).numpy()
    close(y, ref_conv_transpose(x, w, None, [2, 1], [1, 0, 1, 1]), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype,tol", [(np.float16, 3e-2), (ml_dtypes.bfloat16, 8e-2), (np.float64, 1e-12)])
def test_conv_transpose_dtypes(device, rng, dtype, tol):
    x, w = rnd(rng, (1, 2, 3, 3)).astype(dtype), rnd(rng, (2, 2, 2, 2)).astype(dtype)
    y = ConvTranspose(KernelContext(device))(x, w, strides=[2, 2]).numpy()
    assert y.dtype == np.dtype(dtype)
    close(y.astype(np.float64), ref_conv_transpose(x.astype(np.float64), w.astype(np.float64), None, [2, 2]),
          rtol=tol, atol=tol)


def test_conv_transpose_errors(rng):
    k = ConvTranspose()
    with pytest.raises(KernelInputError, match="channel mismatch"):
        k(rnd(rng, (1, 3, 3, 3)), rnd(rng, (2, 1, 2, 2)))
    with pytest.raises(KernelInputError, match="output_padding"):
        k(rnd(rng, (1, 2, 3, 3)), rnd(rng, (2, 1, 2, 2)), output_padding=[2, 0], strides=[2, 2])
    with pytest.raises(KernelInputError, match="pads"):
        k(rnd(rng, (1, 2, 3, 3)), rnd(rng, (2, 1, 2, 2)), pads=[1, 1])
    with pytest.raises(KernelInputError, match="auto_pad"):
        k(rnd(rng, (1, 2, 3, 3)), rnd(rng, (2, 1, 2, 2)), auto_pad="FOO")


# ---------------------------------------------------------------- ConvInteger


@pytest.mark.parametrize("xt,wt", [(np.uint8, np.uint8), (np.int8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)])
def test_conv_integer(device, rng, xt, wt):
    def draw(t, shape):
        info = np.iinfo(t)
        return rng.integers(info.min, info.max + 1, size=shape).astype(t)

    x, w = draw(xt, (2, 4, 5, 6)), draw(wt, (6, 2, 3, 3))
    xz = draw(xt, ())
    wz = draw(wt, (6,))
    k = ConvInteger(KernelContext(device))
    y = k(x, w, xz, wz, group=2, pads=[1, 0, 1, 2]).numpy()
    assert y.dtype == np.int32
    want = ref_conv(x.astype(np.float64) - float(xz), w.astype(np.float64) - wz.reshape(6, 1, 1, 1).astype(np.float64),
                    pads=[1, 0, 1, 2], group=2)
    np.testing.assert_array_equal(y, want.astype(np.int64))
    # scalar w zero point, no x zero point
    y = k(x, w, None, draw(wt, ()), group=2).numpy()
    assert y.shape == (2, 6, 3, 4)
    # auto_pad
    y = k(x, w, xz, None, group=2, auto_pad="SAME_UPPER").numpy()
    assert y.shape == (2, 6, 5, 6)


def test_conv_integer_bad_zero_point(rng):
    x = np.ones((1, 1, 3, 3), np.uint8)
    with pytest.raises(KernelInputError, match="w_zero_point"):
        ConvInteger()(x, np.ones((2, 1, 2, 2), np.uint8), None, np.ones(3, np.uint8))
    with pytest.raises(KernelTypeError):
        ConvInteger()(x.astype(np.float32), np.ones((2, 1, 2, 2), np.uint8))


# ---------------------------------------------------------------- DeformConv


def ref_deform_conv(x, w, offset, b=None, mask=None, strides=None, pads=None, dilations=None, group=1,
                    offset_group=1):
    x = np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    N, C, H, W = x.shape
    M, _, KH, KW = w.shape
    sh, sw = strides or [1, 1]
    dh, dw = dilations or [1, 1]
    pt, pl, pb_, pr = pads or [0, 0, 0, 0]
    OH = (H + pt + pb_ - (KH - 1) * dh - 1) // sh + 1
    OW = (W + pl + pr - (KW - 1) * dw - 1) // sw + 1
    off = np.asarray(offset, np.float64).reshape(N, offset_group, KH, KW, 2, OH, OW)
    mk = None if mask is None else np.asarray(mask, np.float64).reshape(N, offset_group, KH, KW, OH, OW)

    def sample(n, c, py, px):
        y0, x0 = int(np.floor(py)), int(np.floor(px))
        total = 0.0
        for yy in (y0, y0 + 1):
            for xx in (x0, x0 + 1):
                if 0 <= yy < H and 0 <= xx < W:
                    total += (1 - abs(py - yy)) * (1 - abs(px - xx)) * x[n, c, yy, xx]
        return total

    y = np.zeros((N, M, OH, OW))
    Cg, Mg, Cog = C // group, M // group, C // offset_group
    for n in range(N):
        for m in range(M):
            g = m // Mg
            for oh in range(OH):
                for ow in range(OW):
                    acc = 0.0
                    for ci in range(Cg):
                        c = g * Cg + ci
                        og = c // Cog
                        for kh in range(KH):
                            for kw in range(KW):
                                py = oh * sh - pt + kh * dh + off[n, og, kh, kw, 0, oh, ow]
                                px = ow * sw - pl + kw * dw + off[n, og, kh, kw, 1, oh, ow]
                                v = sample(n, c, py, px)
                                if mk is not None:
                                    v *= mk[n, og, kh, kw, oh, ow]
                                acc += v * w[m, ci, kh, kw]
                    y[n, m, oh, ow] = acc
    if b is not None:
        y += np.asarray(b, np.float64).reshape(1, M, 1, 1)
    return y


def test_deform_conv_matches_reference(device, rng):
    x, w, b = rnd(rng, (2, 4, 5, 6)), rnd(rng, (6, 2, 2, 3)), rnd(rng, (6,))
    attrs = dict(strides=[1, 2], pads=[1, 1, 0, 1], dilations=[2, 1], group=2, offset_group=2)
    OH, OW = (5 + 1 - 2 - 1) // 1 + 1, (6 + 2 - 2 - 1) // 2 + 1
    offset = (rng.standard_normal((2, 2 * 6 * 2, OH, OW)) * 1.5).astype(np.float32)
    mask = rng.random((2, 2 * 6, OH, OW)).astype(np.float32)
    y = DeformConv(KernelContext(device))(x, w, offset, b, mask, **attrs).numpy()
    close(y, ref_deform_conv(x, w, offset, b, mask, **attrs), rtol=1e-4, atol=1e-4)
    y = DeformConv(KernelContext(device))(x, w, offset, None, None, **attrs).numpy()
    close(y, ref_deform_conv(x, w, offset, **attrs), rtol=1e-4, atol=1e-4)


def test_deform_conv_zero_offset_is_conv(device, rng):
    x, w = rnd(rng, (1, 2, 4, 4, 3)), rnd(rng, (3, 2, 2, 2, 2))
    offset = np.zeros((1, 8 * 3, 4, 4, 3), np.float32)
    y = DeformConv(KernelContext(device))(x, w, offset, pads=[1, 1, 0, 0, 0, 1]).numpy()
    close(y, ref_conv(x, w, pads=[1, 1, 0, 0, 0, 1]), rtol=1e-4, atol=1e-4)


def test_deform_conv_errors(rng):
    x, w = rnd(rng, (1, 2, 4, 4)), rnd(rng, (3, 2, 2, 2))
    with pytest.raises(KernelInputError, match="offset must have shape"):
        DeformConv()(x, w, np.zeros((1, 7, 3, 3), np.float32))
    with pytest.raises(KernelInputError, match="offset_group"):
        DeformConv()(x, w, np.zeros((1, 8, 3, 3), np.float32), offset_group=3)


# ---------------------------------------------------------------- Col2Im


def ref_col2im(cols, image, block, strides, pads, dilations):
    N, CK, L = cols.shape
    n = len(image)
    kk = int(np.prod(block))
    C = CK // kk
    padded = [image[i] + pads[i] + pads[i + n] for i in range(n)]
    counts = [(padded[i] - (block[i] - 1) * dilations[i] - 1) // strides[i] + 1 for i in range(n)]
    out = np.zeros((N, C, *padded))
    c6 = cols.astype(np.float64).reshape(N, C, *block, *counts)
    for nn in range(N):
        for c in range(C):
            for k in itertools.product(*[range(v) for v in block]):
                for o in itertools.product(*[range(v) for v in counts]):
                    pos = tuple(o[i] * strides[i] + k[i] * dilations[i] for i in range(n))
                    out[(nn, c) + pos] += c6[(nn, c) + k + o]
    return out[(slice(None), slice(None)) + tuple(slice(pads[i], pads[i] + image[i]) for i in range(n))]


@pytest.mark.parametrize("image,block,strides,pads,dilations", [
    ([5, 5], [2, 2], [1, 1], [0, 0, 0, 0], [1, 1]),
    ([6, 7], [3, 2], [2, 1], [1, 0, 1, 2], [1, 2]),
    ([4, 3, 5], [2, 1, 2], [1, 1, 2], [0, 1, 0, 1, 0, 1], [1, 1, 1]),
])
def test_col2im(device, rng, image, block, strides, pads, dilations):
    n = len(image)
    padded = [image[i] + pads[i] + pads[i + n] for i in range(n)]
    counts = [(padded[i] - (block[i] - 1) * dilations[i] - 1) // strides[i] + 1 for i in range(n)]
    cols = rnd(rng, (2, 3 * int(np.prod(block)), int(np.prod(counts))))
    y = Col2Im(KernelContext(device))(cols, np.array(image), np.array(block), strides=strides, pads=pads,
                                      dilations=dilations).numpy()
    close(y, ref_col2im(cols, image, block, strides, pads, dilations), rtol=1e-5, atol=1e-5)


def test_col2im_other_types(device):
    cols = np.arange(2 * 4 * 4, dtype=np.int32).reshape(2, 4, 4)
    y = Col2Im(KernelContext(device))(cols, np.array([3, 3]), np.array([2, 2])).numpy()
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, ref_col2im(cols, [3, 3], [2, 2], [1, 1], [0] * 4, [1, 1]).astype(np.int32))
    b = Col2Im(KernelContext(device))(cols % 3 == 0, np.array([3, 3]), np.array([2, 2])).numpy()
    np.testing.assert_array_equal(b, ref_col2im((cols % 3 == 0).astype(np.float64), [3, 3], [2, 2], [1, 1],
                                                [0] * 4, [1, 1]) > 0)
    s = np.array([["a", "b"], ["c", "d"]], dtype=object).reshape(1, 2, 2)
    st = Col2Im(KernelContext(device))(Tensor(s), np.array([1, 3]), np.array([1, 2])).numpy()
    assert st.tolist() == [[[["a", "bc", "d"]]]]


def test_col2im_errors(rng):
    with pytest.raises(KernelInputError, match="blocks"):
        Col2Im()(rnd(rng, (1, 4, 5)), np.array([3, 3]), np.array([2, 2]))
    with pytest.raises(KernelInputError, match="multiple of prod"):
        Col2Im()(rnd(rng, (1, 5, 4)), np.array([3, 3]), np.array([2, 2]))


@pytest.mark.parametrize("strides", [[1, 2 ** 31], [2 ** 31, 1], [2 ** 31, 2 ** 31], [2, 3]])
def test_conv_huge_strides_read_one_window(device, strides):
    """A stride past the input leaves one output position on that axis: the result is its
    first window (no loop or scratch sized by the stride; found by the model fuzzer)."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 2, 6, 6)).astype(np.float32)
    w = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    y = Conv(KernelContext(device))(x, w, strides=strides).numpy()
    sh, sw = strides
    ho, wo = (6 - 3) // sh + 1, (6 - 3) // sw + 1
    ref = np.zeros((1, 3, ho, wo))
    for i in range(ho):
        for j in range(wo):
            win = x[0, :, i * sh:i * sh + 3, j * sw:j * sw + 3].astype(np.float64)
            ref[0, :, i, j] = np.einsum("chw,mchw->m", win, w.astype(np.float64))
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
