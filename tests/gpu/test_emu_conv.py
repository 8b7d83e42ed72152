"""Conv's CUDA kernels (cuda/conv.cu + gpukernels/gpu/conv.py) run in the CPU emulator,
compared with the kernel class's array path and with a float64 reference, with the
tolerances of gpukernels.gpu.parity (the same as on a GPU).

The class only tries its CUDA path on a GPU, so the tests use a subclass that claims to be
on one and whose cuda_path runs ``gpukernels.gpu.conv.run`` on the emulator: the class's
own validation and argument resolution (auto_pad, defaults) are exercised too."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import emulator
from gpukernels.gpu import conv as gpu_conv
from gpukernels.gpu import parity
from gpukernels.kernels.base import KernelContext
from gpukernels.kernels.nn.conv import Conv
from tests.reference.conv import conv

DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


class _EmulatedConv(Conv):
    on_gpu = True  # take the class's GPU branch; cuda_path is replaced per instance


def emulated(emu):
    kernel = _EmulatedConv(KernelContext("cpu"))
    kernel.cuda_calls = []

    def cuda_path(**arguments):
        result = emulator.run_op(gpu_conv.run, emu, **arguments)
        kernel.cuda_calls.append(result)
        return result

    kernel.cuda_path = cuda_path
    return kernel


def check(emu, rng, dtype, xs, ws, *, group=1, bias=True, tags=(), expect_cuda=True, **attrs):
    t = DTYPES[dtype]
    x = rng.standard_normal(xs).astype(t)
    w = rng.standard_normal(ws).astype(t)
    b = rng.standard_normal(ws[0]).astype(t) if bias else None
    want = Conv(KernelContext("cpu"))(x, w, b, group=group, **attrs)
    k = emulated(emu)
    got = k(x, w, b, group=group, **attrs)
    covered = bool(k.cuda_calls) and k.cuda_calls[-1] is not None
    assert covered == expect_cuda
    if not covered:
        return got
    emulator.tag("Conv", dtype, *tags)
    assert got.data_type == want.data_type and got.shape == want.shape
    msg = parity.compare(got.numpy(), want.numpy(), want.data_type, what="vs array path")
    assert msg is None, f"{xs} {ws} {attrs} group={group}: {msg}"
    n_sp = len(xs) - 2
    pads = attrs.get("pads") or [0] * (2 * n_sp)
    if attrs.get("auto_pad", "NOTSET") == "NOTSET":
        ref = conv(x, w, b, strides=attrs.get("strides") or [1] * n_sp, pads=pads,
                   dilations=attrs.get("dilations") or [1] * n_sp, group=group)
        msg = parity.compare(got.numpy(), ref, want.data_type, what="vs float64 reference")
        assert msg is None, f"{xs} {ws} {attrs} group={group}: {msg}"
    return got


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_conv1d(emu, rng, dtype):
    check(emu, rng, dtype, (2, 5, 40), (7, 5, 3), strides=[2], pads=[1, 2], dilations=[2], tags=("1-D",))


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("bias", [True, False])
def test_conv2d(emu, rng, dtype, bias):
    # several pixel tiles (2*9*10 = 180 > 128) and reduction tiles (Kg = 6*9 = 54)
    check(emu, rng, dtype, (2, 6, 9, 10), (10, 6, 3, 3), bias=bias, pads=[1, 1, 1, 1],
          tags=("2-D", "bias" if bias else "no bias"))


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_conv2d_strides_dilations_asym_pads(emu, rng, dtype):
    check(emu, rng, dtype, (1, 4, 11, 13), (6, 4, 3, 2), strides=[2, 3], dilations=[2, 1], pads=[2, 0, 1, 3],
          tags=("2-D", "strides", "dilations", "asymmetric pads"))


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_conv3d(emu, rng, dtype):
    check(emu, rng, dtype, (1, 3, 5, 6, 5), (4, 3, 3, 2, 2), strides=[1, 2, 1], pads=[1, 0, 1, 1, 0, 0],
          dilations=[1, 1, 2], tags=("3-D", "strides", "dilations"))


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_groups(emu, rng, dtype):
    check(emu, rng, dtype, (2, 6, 7, 6), (9, 2, 3, 3), group=3, pads=[1, 1, 1, 1], tags=("2-D", "groups"))


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_wide_channels_vector_weights(emu, rng, dtype):
    # Mg > 64 (BM = 128 tile, two channel tiles) and Kg % 8 == 0 (16-byte weight loads)
    check(emu, rng, dtype, (1, 16, 5, 5), (130, 16, 1, 1), tags=("2-D", "1x1", "BM=128"))
    check(emu, rng, dtype, (1, 8, 6, 5), (72, 8, 3, 3), strides=[2, 2], pads=[1, 1, 1, 1],
          tags=("2-D", "BM=128", "k-tiles"))


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_pointwise(emu, rng, dtype):
    # 1x1, stride 1, no pad, output plane a multiple of 8: X read 8 pixels at a time (half types);
    # 192 pixels = one full and one partial pixel tile; Kg = 20 (a partial reduction tile)
    check(emu, rng, dtype, (2, 20, 8, 12), (72, 20, 1, 1), tags=("2-D", "pointwise", "BM=128"))
    check(emu, rng, dtype, (3, 40, 16), (24, 40, 1), tags=("1-D", "pointwise"))
    check(emu, rng, dtype, (1, 12, 2, 2, 4), (16, 6, 1, 1, 1), group=2, tags=("3-D", "pointwise", "groups"))


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("rank", [1, 2, 3])
def test_depthwise(emu, rng, dtype, rank):
    S = {1: (17,), 2: (7, 8), 3: (4, 5, 4)}[rank]
    K = {1: (5,), 2: (3, 3), 3: (3, 2, 3)}[rank]
    pads = {1: [2, 1], 2: [1, 1, 1, 1], 3: [1, 0, 1, 1, 1, 0]}[rank]
    strides = {1: [2], 2: [1, 2], 3: [1, 1, 2]}[rank]
    # channel multiplier 2: 12 outputs from 6 input channels
    check(emu, rng, dtype, (2, 6) + S, (12, 1) + K, group=6, pads=pads, strides=strides,
          tags=(f"{rank}-D", "depthwise"))


def test_auto_pad_same(emu, rng):
    check(emu, rng, "float32", (1, 3, 7, 8), (4, 3, 3, 3), auto_pad="SAME_UPPER", strides=[2, 2],
          tags=("2-D", "auto_pad"))


def test_not_covered(emu, rng):
    check(emu, rng, "float32", (1, 2, 3, 3, 3, 3), (2, 2, 2, 2, 2, 2), expect_cuda=False)  # 4 spatial dims
    x = rng.standard_normal((1, 2, 5)).astype(np.float64)
    w = rng.standard_normal((3, 2, 2)).astype(np.float64)
    k = emulated(emu)
    k(x, w)
    assert k.cuda_calls == [None]


def test_reduction_table():
    tab = gpu_conv.reduction_table(2, (1, 2, 3), (1, 2, 3))
    assert tab.shape == (12, 4) and tab.dtype == np.int32
    kk = ((1 * 1 + 0) * 2 + 1) * 3 + 2  # c=1, kd=0, kh=1, kw=2
    assert tab[kk].tolist() == [1, 0, 2, 6]


def test_host_validation(emu, rng):
    from gpukernels.errors import CudaKernelError
    from gpukernels.tensor import Tensor

    x = Tensor(rng.standard_normal((1, 4, 5, 5)).astype(np.float32))
    w = Tensor(rng.standard_normal((6, 2, 3, 3)).astype(np.float32))
    args = dict(strides=[1, 1], pads=[0, 0, 0, 0], dilations=[1, 1])
    with pytest.raises(CudaKernelError, match="channels"):
        emulator.run_op(gpu_conv.run, emu, X=x, W=w, group=1, **args)
    with pytest.raises(CudaKernelError, match="B must have shape"):
        emulator.run_op(gpu_conv.run, emu, X=x, W=w, B=Tensor(np.zeros(5, np.float32)), group=2, **args)
    with pytest.raises(CudaKernelError, match="bad strides"):
        emulator.run_op(gpu_conv.run, emu, X=x, W=w, group=2, strides=[1], pads=[0, 0, 0, 0], dilations=[1, 1])
