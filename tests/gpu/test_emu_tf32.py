"""TF32 tensor-core variants of the float32 Conv and Attention CUDA kernels (context option
``allow_tf32``; issue 16), run in the CPU emulator against float64 references.

The emulator's mma layer computes exactly what the tensor core is specified to: inputs taken
with 10 mantissa bits (gk::to_tf32 rounds to nearest first), exact products, float32 sums.

Tolerances (derived, not fitted).  u = 2^-11 is TF32's unit roundoff: a rounded input is
x (1 + d) with |d| <= u, so a product of two is off by at most 2u + u^2 relative; float32
accumulation of n terms adds at most n 2^-24 relative to the sum of |terms| (2^-22 is used,
leaving room for a tensor core's own accumulation order).

* Conv, y = sum_k w_k x_k + b:  |y - y64| <= (2u + u^2 + (Kg + 2) 2^-22) * sum_k |w_k| |x_k| + |b|
  (the sum of absolute values is the float64 convolution of |x|, |w|, |b|).
* Attention: a score s_j = scale q.k_j is off by at most E = (2u + u^2 + (D + 4) 2^-22)
  scale max_j sum_d |q_d| |k_jd|; softmax weights then change by a factor within
  [e^-2E, e^2E]; P and V are rounded to TF32 for P V (2u) and summed in float32, and
  __expf adds a few ulps (2^-17 is ample), so
  |y - y64| <= (e^2E - 1 + e^2E (2u + 2^-17 + (T + 8) 2^-22)) * sum_j p_j |v_j|
  (the float64 attention of the same Q, K, masks and |V|).

A second, sharper check compares with float64 on TF32-rounded inputs (rounded to nearest as
cuBLAS/cuDNN and cvt.rna do): only the float32 sums (and, for attention, the rounding of P:
u instead of 2u) remain, which proves that every input went through the TF32 rounding and
nothing else was lost.  Every case also runs the exact float32 kernels (allow_tf32 off, the
default): they launch the SIMT kernels and give a different result.

Cases are small (the emulator runs every thread on the CPU) but cross tile boundaries: partial
k tiles, several pixel / key tiles, odd head sizes (scalar copies, zero padding), BM = 128,
pointwise, grouped, decode with split-KV, and every head-size bound.
"""

from __future__ import annotations

import emulator
import numpy as np
import pytest

from gpukernels.gpu import launch
from gpukernels.kernels.base import KernelContext
from gpukernels.kernels.nn.attention import Attention
from gpukernels.kernels.nn.conv import Conv
from tests.gpu.emu_harness import emulated
from tests.reference.attention import attention_4d as attention_reference
from tests.reference.attention import full_kv, make_qkv, to3d
from tests.reference.conv import conv

U = 2.0 ** -11  # TF32 unit roundoff (10 explicit mantissa bits, round to nearest)
ACC = 2.0 ** -22  # float32 accumulation, per term


@pytest.fixture(scope="module")
def emu_tf32(emu):
    """An emulator backend with TF32 allowed (emu: the default, exact float32)."""
    return emulator.EmuBackend(allow_tf32=True)


def tf32(a: np.ndarray) -> np.ndarray:
    """float32 rounded to TF32 (10 mantissa bits, to nearest, ties away from zero), as float32."""
    u = np.ascontiguousarray(a, np.float32).view(np.uint32).astype(np.uint64)
    finite = (u & 0x7F800000) != 0x7F800000
    r = np.where(finite, (u + 0x1000) & 0xFFFFE000, u)
    return r.astype(np.uint32).view(np.float32)


def launched(fn) -> tuple[object, list[str]]:
    """fn()'s result and the kernels it launched in the emulator."""
    before = emulator.LAUNCHES.copy()
    out = fn()
    return out, [expr for (_, expr), n in (emulator.LAUNCHES - before).items() if n]


def run_class(kernel_cls, backend, inputs, attrs, tf32_on: bool):
    """The kernel class with its CUDA path on backend, the context option set as a user would."""
    k = emulated(kernel_cls, backend, {"allow_tf32": tf32_on})
    result = k(*inputs, **attrs) if isinstance(inputs, tuple) else k(**inputs, **attrs)
    assert k.cuda_calls and k.cuda_calls[-1][1] is not None, "the CUDA path did not cover the case"
    return result


def assert_within(got, want, tol, what):
    err = np.abs(np.asarray(got, np.float64) - want)
    bad = err > tol
    assert not bad.any(), (f"{what}: {int(bad.sum())} of {err.size} elements beyond the TF32 bound; worst "
                           f"{err.max():.3e} (bound there {tol.flat[int(np.argmax(err))]:.3e})")


def check_tf32_and_exact(exact, fast, exact_kernels, fast_kernels, tc_prefix, simt_prefix):
    assert fast_kernels and all(e.startswith(tc_prefix + "<float,") for e in fast_kernels if "combine" not in e), \
        fast_kernels
    assert exact_kernels and all(e.startswith(simt_prefix) for e in exact_kernels if "combine" not in e), \
        exact_kernels
    assert np.any(np.asarray(exact) != np.asarray(fast)), "TF32 gave the exact float32 result: TF32 did not run"


# ---------------------------------------------------------------------- Conv
def conv_case(emu, emu_tf32, rng, xs, ws, *, group=1, bias=True, **attrs):
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32) if bias else None
    n_sp = len(xs) - 2
    strides = attrs.get("strides", [1] * n_sp)
    pads = attrs.get("pads", [0] * (2 * n_sp))
    dil = attrs.get("dilations", [1] * n_sp)
    Kg = int(np.prod(ws[1:]))
    fast, fk = launched(lambda: run_class(Conv, emu_tf32, (x, w, b), dict(group=group, **attrs), True))
    exact, ek = launched(lambda: run_class(Conv, emu, (x, w, b), dict(group=group, **attrs), False))
    got = fast.numpy()
    assert got.dtype == np.float32
    check_tf32_and_exact(exact.numpy(), got, ek, fk, "gk_conv_tc", "gk_conv_simt")

    def ref(xx, ww, bb):
        return conv(xx, ww, bb, strides=strides, pads=pads, dilations=dil, group=group)

    babs = np.abs(b) if bias else None
    tol = (2 * U + U * U + (Kg + 2) * ACC) * ref(np.abs(x), np.abs(w), babs)
    assert_within(got, ref(x, w, b), tol, f"Conv TF32 {xs} {ws} vs float64")
    xr, wr = tf32(x), tf32(w)
    tol_r = (Kg + 2) * ACC * ref(np.abs(xr), np.abs(wr), babs)
    assert_within(got, ref(xr, wr, b), tol_r, f"Conv TF32 {xs} {ws} vs float64 of TF32-rounded inputs")
    emulator.tag("Conv", "float32 TF32", *fk)
    return got


def test_conv2d_partial_tiles(emu, emu_tf32, rng):
    # 180 pixels (two pixel tiles), Kg = 54 (three full k tiles of 16 and a partial one)
    conv_case(emu, emu_tf32, rng, (2, 6, 9, 10), (10, 6, 3, 3), pads=[1, 1, 1, 1])


def test_conv1d_odd_reduction(emu, emu_tf32, rng):
    # Kg = 15 (odd: scalar weight loads), strides, dilations, asymmetric pads, no bias
    conv_case(emu, emu_tf32, rng, (2, 5, 40), (7, 5, 3), bias=False, strides=[2], pads=[1, 2], dilations=[2])


def test_conv_bm128_vector_weights_long_reduction(emu, emu_tf32, rng):
    # Mg = 72 > 64 (BM = 128, rows past Mg), Kg = 288 (16-byte weight loads, 18 k tiles)
    conv_case(emu, emu_tf32, rng, (1, 32, 6, 5), (72, 32, 3, 3), strides=[2, 2], pads=[1, 1, 1, 1])


def test_conv_pointwise(emu, emu_tf32, rng):
    # 1x1, stride 1, output plane 96 (a multiple of 4): X read 4 pixels at a time; Kg = 20
    conv_case(emu, emu_tf32, rng, (2, 20, 8, 12), (72, 20, 1, 1))
    # plane 18: not a multiple of 4, the gather path
    conv_case(emu, emu_tf32, rng, (1, 12, 18), (9, 12, 1))


def test_conv_groups_3d(emu, emu_tf32, rng):
    conv_case(emu, emu_tf32, rng, (2, 6, 7, 6), (9, 2, 3, 3), group=3, pads=[1, 1, 1, 1])
    conv_case(emu, emu_tf32, rng, (1, 3, 5, 6, 5), (4, 3, 3, 2, 2), strides=[1, 2, 1], pads=[1, 0, 1, 1, 0, 0],
              dilations=[1, 1, 2])


# ---------------------------------------------------------------------- Attention
def attention_case(emu, emu_tf32, rng, *, B=1, Hq=2, Hkv=1, Sq=5, Skv=40, D=16, Dv=None, P=0, rank=4,
                   mask=None, causal=0, nonpad=None, opset=None):
    q, k, v, pk, pv = make_qkv(rng, np.float32, B=B, Hq=Hq, Hkv=Hkv, Sq=Sq, Skv=Skv, D=D, Dv=Dv, P=P)
    inputs = {"Q": q, "K": k, "V": v, "past_key": pk, "past_value": pv, "attn_mask": mask, "nonpad_kv_seqlen": nonpad}
    attrs = {"is_causal": causal}
    if rank == 3:
        inputs.update(Q=to3d(q), K=to3d(k), V=to3d(v))
        attrs.update(q_num_heads=Hq, kv_num_heads=Hkv)
    inputs = {n: a for n, a in inputs.items() if a is not None}

    def run(backend, on):
        k_ = emulated(Attention, backend, {"allow_tf32": on}, opset=opset, requested=(True, False, False, False))
        y = k_(**inputs, **attrs)[0].numpy()
        assert k_.cuda_calls and k_.cuda_calls[-1][1] is not None, "the CUDA path did not cover the case"
        if y.ndim == 3:
            y = y.reshape(B, Sq, Hq, -1).transpose(0, 2, 1, 3)
        return y

    fast, fk = launched(lambda: run(emu_tf32, True))
    exact, ek = launched(lambda: run(emu, False))
    check_tf32_and_exact(exact, fast, ek, fk, "gk_attn_tc", "gk_attn_simt")

    K4, V4 = full_kv(k, pk), full_kv(v, pv)
    T = K4.shape[2]
    offset = None if nonpad is None else nonpad - Sq
    if offset is None and P:
        offset = [P] * B

    def ref(qq, kk, vv):
        return attention_reference(qq, kk, vv, mask=mask, causal=causal, offset=offset, kvlen=nonpad)

    scale = 1 / np.sqrt(D)
    G = Hq // Hkv

    def score_bound(qq, kk, per_term):
        # per (b, h, i): per_term * scale * max_j sum_d |q_d| |k_jd|, broadcast over dv
        qk = np.abs(qq.astype(np.float64)) @ np.abs(np.repeat(kk, G, axis=1).astype(np.float64)).transpose(0, 1, 3, 2)
        return per_term * scale * qk.max(axis=-1, keepdims=True)

    E = score_bound(q, K4, 2 * U + U * U + (D + 4) * ACC)
    grow = np.exp(2 * E)
    tol = (grow - 1 + grow * (2 * U + 2.0 ** -17 + (T + 8) * ACC)) * ref(q, K4, np.abs(V4))
    assert_within(fast, ref(q, K4, V4), tol, f"Attention TF32 vs float64 ({fk})")
    qr, kr, vr = tf32(q), tf32(K4), tf32(V4)
    Er = score_bound(qr, kr, (D + 4) * ACC)
    grow = np.exp(2 * Er)
    tol_r = (grow - 1 + grow * (U + 2.0 ** -17 + (T + 8) * ACC)) * ref(qr, kr, np.abs(vr))
    assert_within(fast, ref(qr, kr, vr), tol_r, f"Attention TF32 vs float64 of TF32-rounded inputs ({fk})")
    emulator.tag("Attention", "float32 TF32", *fk)
    return fast


@pytest.mark.parametrize("rank", [4, 3])
def test_attention_gqa_prefill(emu, emu_tf32, rng, rank):
    # 38 rows per kv head (NW = 4, a partial row block), 70 keys (two key tiles, the last partial)
    attention_case(emu, emu_tf32, rng, B=2, Hq=4, Hkv=2, Sq=19, Skv=70, D=16, rank=rank)


def test_attention_odd_head_sizes(emu, emu_tf32, rng):
    # D = 10, Dv = 18: not multiples of 4 (element-wise copies), K padded to 16, V to 32
    attention_case(emu, emu_tf32, rng, Hq=3, Hkv=3, Sq=9, Skv=33, D=10, Dv=18)
    # D = 20, Dv = 12: multiples of 4 (16-byte copies) but not of 8 / 16
    attention_case(emu, emu_tf32, rng, Hq=2, Hkv=1, Sq=7, Skv=21, D=20, Dv=12, causal=1)


def test_attention_causal_past_bool_mask(emu, emu_tf32, rng):
    # decode-sized rows (NW = 1), past keys, a bool mask with a fully masked row (zeros)
    T = 6 + 60
    mask = rng.random((2, 2, 6, T)) < 0.8
    mask[1, 0, 2, :] = False
    y = attention_case(emu, emu_tf32, rng, B=2, Hq=2, Hkv=1, Sq=6, Skv=6, D=24, P=60, mask=mask, causal=1)
    assert np.all(y[1, 0, 2] == 0)


def test_attention_decode_split_kv(emu, emu_tf32, rng):
    # one query token against 301 keys: the launcher splits the keys (combine kernel)
    attention_case(emu, emu_tf32, rng, B=2, Hq=4, Hkv=1, Sq=1, Skv=1, D=32, P=300, causal=1)


def test_attention_nonpad(emu, emu_tf32, rng):
    attention_case(emu, emu_tf32, rng, B=3, Hq=2, Hkv=1, Sq=4, Skv=50, D=16, causal=1,
                   nonpad=np.array([50, 17, 2], dtype=np.int64), opset=24)


@pytest.mark.parametrize("D,Sq", [(128, 17), (96, 1), (256, 17), (200, 1)])
def test_attention_large_heads(emu, emu_tf32, rng, D, Sq):
    # DMAX 128 (32-key tiles) and 256 (16-key tiles), prefill and decode
    attention_case(emu, emu_tf32, rng, Sq=Sq, Skv=40, D=D, Hq=1, Hkv=1, causal=int(Sq > 1))


# ---------------------------------------------------------------------- the option
def test_context_option_reaches_the_backend(monkeypatch):
    """KernelContext(options={"allow_tf32": True}) is what selects the TF32 kernels on a GPU:
    backend_for hands it to the CuPy backend, whose allow_tf32 the launchers read."""
    seen = []
    monkeypatch.setattr(launch, "_cupy_backend", lambda device, allow_tf32, sync: seen.append(allow_tf32))
    for on in (False, True):
        kernel = Conv(KernelContext("cpu", options={"allow_tf32": on}))
        launch.backend_for(kernel)
    kernel = Attention(KernelContext("cpu"))
    launch.backend_for(kernel)
    assert seen == [False, True, False]
