"""RotaryEmbedding's CUDA kernel (cuda/rotary_embedding.cu + gpukernels/gpu/rotary_embedding.py)
run in the CPU emulator against the kernel class's array path and a float64 reference."""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest

import emulator
from gpukernels.gpu import parity
from gpukernels.gpu import rotary_embedding as gpu_rotary
from gpukernels.kernels.nn.rotary import RotaryEmbedding
from gpukernels.tensor import Tensor
from tests.gpu.emu_harness import check_op, emulated

DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def reference(x, cos, sin, pos, interleaved, num_heads, rd):
    """float64, straight from the operator's definition."""
    x = x.astype(np.float64)
    cos = cos.astype(np.float64)
    sin = sin.astype(np.float64)
    if x.ndim == 4:
        x4 = x.transpose(0, 2, 1, 3)  # (B, S, H, D)
    else:
        B, S, hidden = x.shape
        x4 = x.reshape(B, S, num_heads, hidden // num_heads)
    D = x4.shape[-1]
    rd = rd or D
    if pos is not None:
        cos, sin = cos[pos], sin[pos]
    out = x4.copy()
    B, S, H, _ = x4.shape
    for b in range(B):
        for s in range(S):
            for i in range(rd // 2):
                i1, i2 = (2 * i, 2 * i + 1) if interleaved else (i, i + rd // 2)
                a, c_ = x4[b, s, :, i1], x4[b, s, :, i2]
                out[b, s, :, i1] = cos[b, s, i] * a - sin[b, s, i] * c_
                out[b, s, :, i2] = sin[b, s, i] * a + cos[b, s, i] * c_
    return out.transpose(0, 2, 1, 3) if x.ndim == 4 else out.reshape(x.shape)


def make_case(rng, rank, dtype, interleaved, rd, with_pos, B=2, S=5, H=3, D=16, max_pos=11):
    t = DTYPES[dtype]
    shape = (B, H, S, D) if rank == 4 else (B, S, H * D)
    x = rng.standard_normal(shape).astype(t)
    half = (rd or D) // 2
    if with_pos:
        angles = rng.uniform(-3, 3, (max_pos, half))
        pos = rng.integers(0, max_pos, (B, S)).astype(np.int64)
    else:
        angles = rng.uniform(-3, 3, (B, S, half))
        pos = None
    return x, np.cos(angles).astype(t), np.sin(angles).astype(t), pos


CASES = list(itertools.product([3, 4], ["float32", "float16", "bfloat16"], [0, 1], [0, 8], [True, False]))


@pytest.mark.parametrize("rank,dtype,interleaved,rd,with_pos", CASES)
def test_rotary_emulated(emu, rng, rank, dtype, interleaved, rd, with_pos):
    x, cos, sin, pos = make_case(rng, rank, dtype, interleaved, rd, with_pos)
    attrs = dict(interleaved=interleaved, rotary_embedding_dim=rd)
    if rank == 3:
        attrs["num_heads"] = 3
    got, _ = check_op(RotaryEmbedding, emu, (x, cos, sin, pos), attrs,
                      tags=(f"rank{rank}", dtype, "interleaved" if interleaved else "halves",
                            "partial" if rd else "full", "position_ids" if with_pos else "3-D caches"))
    want = reference(x, cos, sin, pos, interleaved, 3, rd)
    dt = got[0].data_type
    msg = parity.compare(got[0].numpy(), want, dt, what="vs float64 reference")
    assert msg is None, msg


@pytest.mark.parametrize("D,rd,dtype", [(6, 0, "float32"), (10, 6, "float16"), (12, 4, "bfloat16"),
                                         (64, 0, "float16"), (64, 32, "float32"), (2, 0, "float32")])
@pytest.mark.parametrize("interleaved", [0, 1])
def test_rotary_emulated_vector_widths(emu, rng, D, rd, dtype, interleaved):
    # odd half widths force narrow vectors; 64-wide heads take the widest ones
    x, cos, sin, pos = make_case(rng, 4, dtype, interleaved, rd, True, B=1, S=3, H=2, D=D)
    check_op(RotaryEmbedding, emu, (x, cos, sin, pos), dict(interleaved=interleaved, rotary_embedding_dim=rd),
             tags=("vector widths", f"D={D} rd={rd or D}", dtype))


def test_rotary_emulated_empty(emu, rng):
    x, cos, sin, pos = make_case(rng, 4, "float32", 0, 0, True, B=2, S=0, H=2, D=8)
    pos = np.zeros((2, 0), np.int64)
    got, _ = check_op(RotaryEmbedding, emu, (x, cos, sin, pos), dict(), tags=("empty",))
    assert got[0].shape == (2, 2, 0, 8)


def test_rotary_kernel_bad_position_is_memory_safe(emu, rng):
    # Bypass the class' validation: the kernel must not read outside the cache.
    x, cos, sin, pos = make_case(rng, 4, "float32", 0, 0, True, B=1, S=3, H=2, D=8, max_pos=4)
    pos[0, 1] = 1000
    pos[0, 2] = -5
    out = emulator.run_op(gpu_rotary.run, emu, X=Tensor(x), cos_cache=Tensor(cos), sin_cache=Tensor(sin),
                         position_ids=Tensor(pos), interleaved=0, num_heads=2, rotary_embedding_dim=8)
    y = out.numpy()
    assert np.isnan(y[0, :, 1:, :]).all()
    assert np.isfinite(y[0, :, 0, :]).all()


def test_rotary_class_rejects_out_of_range_positions_before_launch(emu, rng):
    x, cos, sin, pos = make_case(rng, 4, "float32", 0, 0, True, B=1, S=3, H=2, D=8, max_pos=4)
    pos[0, 0] = 4
    k = emulated(RotaryEmbedding, emu)
    with pytest.raises(ValueError, match="RotaryEmbedding"):
        k(x, cos, sin, pos)
    assert not k.cuda_calls


def _launched_since(before: dict) -> set:
    return {e for (src, e), n in emulator.LAUNCHES.items() if n != before.get((src, e), 0)}


@pytest.mark.parametrize("expr", gpu_rotary.expressions())
def test_rotary_every_instantiation_runs(emu, rng, expr):
    # head sizes for which exactly this access width W is the widest that qualifies:
    # halves D = 6W (rd/2 = 3W); interleaved D = 3W (rd/2 = 3W/2 pairs of W/2), and for
    # W = 1 an odd head size (D = 7, rd = 6) that rules out 2-element accesses
    ctype, width, inter, pos = [p.strip() for p in expr[expr.index("<") + 1:-1].split(",")]
    width, inter, with_pos = int(width), inter == "true", pos == "true"
    dtype = {"float": "float32", "__half": "float16", "__nv_bfloat16": "bfloat16"}[ctype]
    D, rd = (6 * width, 0) if not inter else ((3 * width, 0) if width > 1 else (7, 6))
    x, cos, sin, p = make_case(rng, 3, dtype, int(inter), rd, with_pos, B=2, S=3, H=2, D=D)
    k = emulated(RotaryEmbedding, emu)
    before = dict(emulator.LAUNCHES)
    got = k(x, cos, sin, p, interleaved=int(inter), num_heads=2, rotary_embedding_dim=rd)
    assert _launched_since(before) == {expr}
    want = reference(x, cos, sin, p, int(inter), 2, rd)
    assert parity.compare(got.numpy(), want, got.data_type) is None


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("shape,rd", [((1, 1, 1, 3), 2), ((1, 2, 3, 5), 2), ((2, 1, 2, 9), 4), ((1, 2, 2, 7), 6)])
def test_rotary_odd_head_size_writes_every_feature(emu, rng, shape, rd, interleaved):
    # odd head sizes: no 2-element access fits; the last pass-through feature of each head
    # used to stay unwritten (interleaved: copy units of 2 elements), and 2-element loads
    # were misaligned from the second row on
    B, H, S, D = shape
    x, cos, sin, pos = make_case(rng, 4, "float32", interleaved, rd, True, B=B, S=S, H=H, D=D)
    got, _ = check_op(RotaryEmbedding, emu, (x, cos, sin, pos), dict(interleaved=interleaved, rotary_embedding_dim=rd),
                      tags=("odd head size", "interleaved" if interleaved else "halves"))
    want = reference(x, cos, sin, pos, interleaved, H, rd)
    assert parity.compare(got[0].numpy(), want, got[0].data_type, what="vs float64 reference") is None


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("interleaved", [0, 1])
def test_rotary_view_one_element_off_alignment(emu, rng, dtype, interleaved):
    # X a view one element into a larger buffer (as CuPy views are): the device copy keeps
    # the offset, so every vector access wider than one element would be misaligned (the
    # emulator's alignment check turns that into an error, as the GPU faults)
    x, cos, sin, pos = make_case(rng, 4, dtype, interleaved, 0, True, B=1, S=3, H=2, D=16)
    buf = np.empty(x.size + 1, x.dtype)
    xm = buf[1:].reshape(x.shape)
    xm[...] = x
    before = dict(emulator.LAUNCHES)
    got, _ = check_op(RotaryEmbedding, emu, (xm, cos, sin, pos), dict(interleaved=interleaved),
                      tags=("misaligned X view", dtype))
    launched = _launched_since(before)
    assert len(launched) == 1 and ", 1, " in next(iter(launched)), launched
    want = reference(x, cos, sin, pos, interleaved, 2, 0)
    assert parity.compare(got[0].numpy(), want, got[0].data_type, what="vs float64 reference") is None
