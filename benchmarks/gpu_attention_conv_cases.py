"""Attention and Conv cases for the GPU check (benchmarks/bench_gpu.py).

    from gpu_attention_conv_cases import PARITY as AC_PARITY, BENCHES as AC_BENCHES
    PARITY += AC_PARITY; BENCHES += AC_BENCHES

parity_attention / parity_conv (env, rng, quick): the CUDA kernel vs the class's array path
vs a float64 NumPy reference on fresh random inputs (small shapes on the emulator).
bench_attention / bench_conv (env, rng, torch): kernel times (CUDA events around the
prepared launches and as a CUDA graph, bench_gpu.time_prepared; outputs not poisoned) and
the host time per run() call, against PyTorch -- for float32 both IEEE float32 (TF32 off:
the CUDA-core baseline our float32 kernels compare with) and TF32 -- with achieved TFLOP/s
and the fraction of the H200 roofline (benchmarks/ROOFLINE_attention_conv.md).

    python benchmarks/gpu_attention_conv_cases.py --roofline   # prints the roofline table

``record``/``_time_gpu``/``_compare3``/``time_prepared``/``time_left``/``torch_fp32`` are
taken from bench_gpu (the running script).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import ml_dtypes  # noqa: E402

from gpukernels.dtypes import DataType  # noqa: E402

DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
DATA_TYPES = {"float32": DataType.FLOAT, "float16": DataType.FLOAT16, "bfloat16": DataType.BFLOAT16}

# H200 (SXM) limits used for the roofline
PEAK_FP32 = 67e12  # non-tensor FP32 FLOP/s
PEAK_TC16 = 990e12  # dense FP16/BF16 tensor-core FLOP/s
PEAK_BW = 4.8e12  # HBM3e bytes/s


# ------------------------------------------------------------------ helpers from bench_gpu
def _bg():
    for name in ("bench_gpu", "__main__"):
        mod = sys.modules.get(name)
        if mod is not None and hasattr(mod, "record"):
            return mod
    import importlib

    sys.path.insert(0, str(REPO / "benchmarks"))
    return importlib.import_module("bench_gpu")


def record(*args, **kwargs):
    return _bg().record(*args, **kwargs)


def _compare3(*args, **kwargs):
    return _bg()._compare3(*args, **kwargs)


def _time_gpu(*args, **kwargs):
    return _bg()._time_gpu(*args, **kwargs)


def _time_left(section, case) -> bool:
    bg = _bg()
    return bg.time_left(section, case) if hasattr(bg, "time_left") else True


# ------------------------------------------------------------------ roofline
ATTENTION_BENCH = [
    # (label, dtype, B, Hq, Hkv, Sq, T, D, causal)
    ("prefill", "float32", 1, 32, 32, 4096, 4096, 128, False),
    ("prefill causal", "float32", 1, 32, 32, 4096, 4096, 128, True),
    ("prefill", "float16", 1, 32, 32, 4096, 4096, 128, False),
    ("prefill causal", "float16", 1, 32, 32, 4096, 4096, 128, True),
    ("prefill", "bfloat16", 1, 32, 32, 4096, 4096, 128, False),
    ("prefill causal", "bfloat16", 1, 32, 32, 4096, 4096, 128, True),
    ("decode GQA", "float16", 1, 32, 8, 1, 8192, 128, False),
    ("decode GQA", "bfloat16", 1, 32, 8, 1, 8192, 128, False),
    ("decode GQA", "float32", 1, 32, 8, 1, 8192, 128, False),
]

# ResNet-50 (torchvision v1.5) convolutions, batch 32: (label, Cin, H, Cout, k, stride, pad)
RESNET50 = [
    ("conv1 7x7/2", 3, 224, 64, 7, 2, 3),
    ("layer1 1x1 64->64", 64, 56, 64, 1, 1, 0),
    ("layer1 3x3 64", 64, 56, 64, 3, 1, 1),
    ("layer1 1x1 64->256", 64, 56, 256, 1, 1, 0),
    ("layer2 3x3/2 128", 128, 56, 128, 3, 2, 1),
    ("layer2 1x1 512->128", 512, 28, 128, 1, 1, 0),
    ("layer3 3x3 256", 256, 14, 256, 3, 1, 1),
    ("layer3 1x1 256->1024", 256, 14, 1024, 1, 1, 0),
    ("layer4 3x3 512", 512, 7, 512, 3, 1, 1),
    ("layer4 1x1 512->2048", 512, 7, 2048, 1, 1, 0),
]
CONV_BATCH = 32


def attention_cost(dtype, B, Hq, Hkv, Sq, T, D, causal):
    """(FLOPs, minimum HBM bytes) of one attention call: 2 matmuls of 2*Sq*T*D FLOPs per
    head (halved, approximately, when causal with Sq == T); Q, K, V read and Y written once."""
    size = np.dtype(DTYPES[dtype]).itemsize
    pairs = Sq * T
    if causal and Sq == T:
        pairs = Sq * (Sq + 1) / 2
    flops = 4.0 * B * Hq * pairs * D
    nbytes = size * (B * Hq * Sq * D * 2 + B * Hkv * T * D * 2)
    return flops, nbytes


def conv_cost(dtype, N, Cin, H, Cout, k, stride, pad):
    size = np.dtype(DTYPES[dtype]).itemsize
    Ho = (H + 2 * pad - k) // stride + 1
    flops = 2.0 * N * Cout * Ho * Ho * Cin * k * k
    nbytes = size * (N * Cin * H * H + Cout * Cin * k * k + N * Cout * Ho * Ho)
    return flops, nbytes


def roofline_time(dtype, flops, nbytes):
    peak = PEAK_FP32 if dtype == "float32" else PEAK_TC16
    return max(flops / peak, nbytes / PEAK_BW), ("compute" if flops / peak >= nbytes / PEAK_BW else "memory")


def roofline_table() -> str:
    lines = ["| case | dtype | GFLOP | MB moved (min) | FLOP/byte | bound | roofline time |",
             "|---|---|---:|---:|---:|---|---:|"]
    for label, dtype, B, Hq, Hkv, Sq, T, D, causal in ATTENTION_BENCH:
        f, b = attention_cost(dtype, B, Hq, Hkv, Sq, T, D, causal)
        t, bound = roofline_time(dtype, f, b)
        lines.append(f"| Attention {label} B{B} Hq{Hq} Hkv{Hkv} Sq{Sq} T{T} D{D} | {dtype} | {f / 1e9:.1f} | "
                     f"{b / 1e6:.1f} | {f / b:.0f} | {bound} | {t * 1e6:.1f} us |")
    for dtype in ("float32", "float16"):
        for label, cin, h, cout, k, s, p in RESNET50:
            f, b = conv_cost(dtype, CONV_BATCH, cin, h, cout, k, s, p)
            t, bound = roofline_time(dtype, f, b)
            lines.append(f"| Conv ResNet-50 {label} N{CONV_BATCH} {h}x{h} | {dtype} | {f / 1e9:.1f} | "
                         f"{b / 1e6:.1f} | {f / b:.0f} | {bound} | {t * 1e6:.1f} us |")
    return "\n".join(lines)


# ------------------------------------------------------------------ float64 references
def attention_reference(q4, k4, v4, mask=None, causal=0, offset=None, kvlen=None, scale=None, softcap=0.0):
    """Y (B, Hq, Sq, Dv) in float64; k4/v4 hold every key (past included); mask as the user
    gave it (bool or numeric, rank <= 4); offset/kvlen per batch (defaults 0 / T)."""
    q, k, v = (np.asarray(a).astype(np.float64) for a in (q4, k4, v4))
    B, Hq, Sq, D = q.shape
    Hkv, T = k.shape[1], k.shape[2]
    G = Hq // Hkv
    scale = 1 / math.sqrt(D) if scale is None else scale
    bias = np.zeros((B, Hq, Sq, T))
    if mask is not None:
        m = np.asarray(mask)
        m = np.where(m, 0.0, -np.inf) if m.dtype == np.bool_ else m.astype(np.float32).astype(np.float64)
        if m.ndim and m.shape[-1] < T:
            m = np.concatenate([m, np.full(m.shape[:-1] + (T - m.shape[-1],), -np.inf)], -1)
        bias = bias + m.reshape((1,) * (4 - m.ndim) + m.shape)
    off = np.zeros(B, np.int64) if offset is None else np.asarray(offset)
    n = np.full(B, T) if kvlen is None else np.asarray(kvlen)
    i = np.arange(Sq)[:, None]
    j = np.arange(T)[None, :]
    y = np.zeros((B, Hq, Sq, v.shape[3]))
    for b in range(B):
        ok = j < n[b]
        if causal:
            ok = ok & (j <= i + off[b])
        bb = bias[b] + np.where(ok, 0.0, -np.inf)[None]
        kk = np.repeat(k[b], G, axis=0)
        vv = np.repeat(v[b], G, axis=0)
        s = scale * np.einsum("hid,hjd->hij", q[b], kk)
        if softcap > 0:
            s = softcap * np.tanh(s / softcap)
        s = s + bb
        dead = np.all(np.isneginf(bb), axis=-1, keepdims=True)
        mx = np.where(dead, 0.0, s.max(-1, keepdims=True))
        p = np.exp(s - mx)
        p = p / np.where(dead, 1.0, p.sum(-1, keepdims=True))
        y[b] = np.where(dead, 0.0, np.einsum("hij,hjd->hid", p, vv))
    return y


def conv_reference(x, w, b, strides, pads, dilations, group):
    """float64 convolution through a sliding-window view (independent of the kernels)."""
    x = np.asarray(x).astype(np.float64)
    w = np.asarray(w).astype(np.float64)
    n_sp = x.ndim - 2
    N, C = x.shape[:2]
    M, Cg = w.shape[:2]
    K = w.shape[2:]
    Mg = M // group
    xp_ = np.pad(x, [(0, 0), (0, 0)] + [(pads[i], pads[i + n_sp]) for i in range(n_sp)])
    span = tuple(dilations[i] * (K[i] - 1) + 1 for i in range(n_sp))
    win = np.lib.stride_tricks.sliding_window_view(xp_, span, axis=tuple(range(2, 2 + n_sp)))
    win = win[(Ellipsis,) + tuple(slice(None, None, d) for d in dilations)]  # taps
    win = win[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in strides)]  # strides
    out = []
    letters = "defg"[:n_sp]
    taps = "uvw"[:n_sp]
    for g in range(group):
        xg = win[:, g * Cg:(g + 1) * Cg]
        wg = w[g * Mg:(g + 1) * Mg]
        out.append(np.einsum(f"nc{letters}{taps},mc{taps}->nm{letters}", xg, wg, optimize=True))
    y = np.concatenate(out, axis=1)
    if b is not None:
        y = y + np.asarray(b).astype(np.float64).reshape((1, M) + (1,) * n_sp)
    return y


# ------------------------------------------------------------------ parity
def _attention_case(env, rng, case, dtype, *, B, Hq, Hkv, Sq, Skv, D, P=0, causal=0, mask=None, rank=4,
                    softcap=0.0, nonpad=None):
    from gpukernels.kernels.nn.attention import Attention

    if not _time_left("parity", case):
        return
    t = DTYPES[dtype]
    q = rng.standard_normal((B, Hq, Sq, D)).astype(t)
    k = rng.standard_normal((B, Hkv, Skv, D)).astype(t)
    v = rng.standard_normal((B, Hkv, Skv, D)).astype(t)
    pk = rng.standard_normal((B, Hkv, P, D)).astype(t) if P else None
    pv = rng.standard_normal((B, Hkv, P, D)).astype(t) if P else None
    T = P + Skv
    if mask == "bool":
        mask = rng.random((Sq, T)) < 0.8
    elif mask == "float":
        mask = rng.standard_normal((B, 1, Sq, T - 3)).astype(np.float32)

    def to3(a):
        return np.ascontiguousarray(a.transpose(0, 2, 1, 3).reshape(a.shape[0], a.shape[2], -1))

    inputs = dict(Q=q, K=k, V=v, attn_mask=mask, past_key=pk, past_value=pv, nonpad_kv_seqlen=nonpad)
    attrs = dict(is_causal=causal, softcap=softcap)
    if rank == 3:
        inputs.update(Q=to3(q), K=to3(k), V=to3(v))
        attrs.update(q_num_heads=Hq, kv_num_heads=Hkv)
    kf = k if pk is None else np.concatenate([pk, k], 2)
    vf = v if pv is None else np.concatenate([pv, v], 2)
    off = [P] * B if nonpad is None else list(np.asarray(nonpad) - Sq)
    ref = attention_reference(q, kf, vf, mask, causal, off, nonpad, softcap=softcap)
    try:
        cuda_k = env.kernel(Attention, True)
        cuda_k.requested_outputs = (True, True, True, False)
        array_k = env.kernel(Attention, False)
        array_k.requested_outputs = (True, True, True, False)
        n0 = env.launches("Attention")
        got = cuda_k(**inputs, **attrs)
        if env.launches("Attention") != n0 + 1:
            raise RuntimeError("the CUDA kernel did not run")
        want = array_k(**inputs, **attrs)
        y, ya = got.Y.numpy(), want.Y.numpy()
        if rank == 3:
            y = y.reshape(B, Sq, Hq, D).transpose(0, 2, 1, 3)
            ya = ya.reshape(B, Sq, Hq, D).transpose(0, 2, 1, 3)
        ok = _compare3("parity", case, y, ya, ref, DATA_TYPES[dtype])
        if ok and P:
            same = np.array_equal(np.asarray(got.present_key.numpy()).view(np.uint8),
                                  np.ascontiguousarray(want.present_key.numpy()).view(np.uint8))
            if not same:
                record("parity", case + " present_key", False, "present_key differs from the array path")
    except Exception as exc:
        record("parity", case, False, repr(exc)[:160])


def parity_attention(env, rng, quick: bool):
    small = env.name == "emulator"
    S = 37 if small else 333
    P = 150 if small else 3000
    D = 32 if small else 128
    for dtype in DTYPES:
        _attention_case(env, rng, f"Attention {dtype} GQA causal S={S} D={D}", dtype, B=2, Hq=8, Hkv=2, Sq=S,
                        Skv=S, D=D, causal=1)
        _attention_case(env, rng, f"Attention {dtype} decode split-KV past={P} D={D}", dtype, B=2, Hq=8, Hkv=2,
                        Sq=1, Skv=1, D=D, P=P, causal=1)
        if quick:
            continue
        _attention_case(env, rng, f"Attention {dtype} rank3 bool mask + past softcap", dtype, B=2, Hq=4, Hkv=4,
                        Sq=S // 3 + 1, Skv=S // 3 + 1, D=64 if not small else 16, P=S // 2, mask="bool",
                        rank=3, softcap=20.0)
        _attention_case(env, rng, f"Attention {dtype} float mask (short, broadcast) D=80", dtype, B=2, Hq=2, Hkv=1,
                        Sq=S, Skv=S + 5, D=80 if not small else 24, mask="float")
        _attention_case(env, rng, f"Attention {dtype} nonpad_kv_seqlen causal", dtype, B=3, Hq=4, Hkv=2, Sq=4,
                        Skv=S, D=D, causal=1, nonpad=np.array([S, S // 2, 1], np.int64))
        _attention_case(env, rng, f"Attention {dtype} D=256", dtype, B=1, Hq=2, Hkv=1, Sq=S, Skv=S, D=256,
                        causal=1)


def _conv_case(env, rng, case, dtype, xs, ws, group=1, bias=True, **attrs):
    from gpukernels.gpu import conv as gpu_conv
    from gpukernels.kernels.nn.conv import Conv, conv_attributes
    from gpukernels.tensor import Tensor

    if not _time_left("parity", case):
        return
    t = DTYPES[dtype]
    x = rng.standard_normal(xs).astype(t)
    w = (rng.standard_normal(ws) / math.sqrt(np.prod(ws[1:]))).astype(t)
    b = rng.standard_normal(ws[0]).astype(t) if bias else None
    n_sp = len(xs) - 2
    strides = attrs.get("strides", [1] * n_sp)
    pads = attrs.get("pads", [0] * 2 * n_sp)
    dil = attrs.get("dilations", [1] * n_sp)
    try:
        array_k = env.kernel(Conv, False)
        ya = array_k(x, w, b, group=group, **attrs).numpy()
        ref = conv_reference(x, w, b, strides, pads, dil, group)
        if env.name == "emulator":  # the class only takes its CUDA branch on a GPU
            kk = Conv(array_k.ctx)
            st, pd, dl, _ = conv_attributes(kk, Tensor(x), Tensor(w), None, strides, dil, pads, "NOTSET", group)
            out = env.emulator.run_op(gpu_conv.run, env.backend, X=Tensor(x), W=Tensor(w),
                                  B=None if b is None else Tensor(b), strides=st, pads=pd,
                                  dilations=dl, group=group)
            if out is None:
                raise RuntimeError("the CUDA kernel does not cover this case")
            y = out.numpy()
        else:
            cuda_k = env.kernel(Conv, True)
            n0 = env.launches("Conv")
            y = cuda_k(x, w, b, group=group, **attrs).numpy()
            if env.launches("Conv") != n0 + 1:
                raise RuntimeError("the CUDA kernel did not run")
        _compare3("parity", case, y, ya, ref, DATA_TYPES[dtype])
    except Exception as exc:
        record("parity", case, False, repr(exc)[:160])


def parity_conv(env, rng, quick: bool):
    small = env.name == "emulator"
    n, s = (2, 9) if small else (4, 30)
    c = 8 if small else 64
    for dtype in DTYPES:
        _conv_case(env, rng, f"Conv {dtype} 2-D 3x3 pad1 C={c}", dtype, (n, c, s, s), (c + 8, c, 3, 3),
                   pads=[1, 1, 1, 1])
        _conv_case(env, rng, f"Conv {dtype} depthwise 3x3/2", dtype, (n, c, s, s), (c, 1, 3, 3), group=c,
                   strides=[2, 2], pads=[1, 1, 1, 1])
        if quick:
            continue
        _conv_case(env, rng, f"Conv {dtype} 1-D stride2 dil2", dtype, (n, 6, 4 * s), (10, 6, 5), strides=[2],
                   dilations=[2], pads=[3, 1])
        _conv_case(env, rng, f"Conv {dtype} 3-D", dtype, (n, 4, 6, s // 2, s // 2), (8, 4, 3, 3, 3),
                   pads=[1, 1, 1, 1, 1, 1], bias=False)
        _conv_case(env, rng, f"Conv {dtype} groups=4 1x1 wide", dtype, (n, 4 * c, s // 2, s // 2),
                   (4 * 72, c, 1, 1), group=4)
        _conv_case(env, rng, f"Conv {dtype} 7x7/2 C=3", dtype, (n, 3, 2 * s, 2 * s), (16, 3, 7, 7),
                   strides=[2, 2], pads=[3, 3, 3, 3])


# ------------------------------------------------------------------ benchmarks
def _torch_dtype(torch, dtype):
    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]


def _torch_both(cp, torch, dtype, fn):
    """PyTorch's time for fn: (ieee seconds, tf32 seconds or None).  float32 runs twice --
    IEEE float32 (CUDA cores, our float32 kernels' baseline) and TF32; other types once."""
    bg = _bg()
    bg.torch_fp32(torch, "ieee")
    t_ieee = _time_gpu(cp, fn, min_time=0.2, repeat=5)
    t_tf32 = None
    if dtype == "float32":
        bg.torch_fp32(torch, "tf32")
        t_tf32 = _time_gpu(cp, fn, min_time=0.2, repeat=5)
        bg.torch_fp32(torch, "ieee")
    return t_ieee, t_tf32


def _torch_text(label, t_k, t_ieee, t_tf32) -> str:
    if t_tf32 is None:
        return f" | torch {label} {t_ieee * 1e3:.3f} ms ({t_ieee / t_k:4.2f}x)"
    return (f" | torch {label} ieee {t_ieee * 1e3:.3f} ms ({t_ieee / t_k:4.2f}x), "
            f"tf32 {t_tf32 * 1e3:.3f} ms ({t_tf32 / t_k:4.2f}x)")


def bench_attention(env, rng, torch):
    from gpukernels.gpu import attention as ga
    from gpukernels.tensor import Tensor

    cp = env.cp
    for label, dtype, B, Hq, Hkv, Sq, T, D, causal in ATTENTION_BENCH:
        name = f"Attention {dtype} {label} B{B} Hq{Hq} Hkv{Hkv} Sq{Sq} T{T} D{D}"
        if not _time_left("bench", name):
            continue
        try:
            t = DTYPES[dtype]
            # decode: K/V are the whole cache (the opset-24 external-cache form: no copy)
            q = Tensor(rng.standard_normal((B, Hq, Sq, D)).astype(t), device="cuda")
            k = Tensor(rng.standard_normal((B, Hkv, T, D)).astype(t), device="cuda")
            v = Tensor(rng.standard_normal((B, Hkv, T, D)).astype(t), device="cuda")
            args = dict(Q=q, K=k, V=v, is_causal=int(causal), q_num_heads=Hq, kv_num_heads=Hkv,
                        scale=1 / math.sqrt(D), wants=(True, False, False, False))
            tk = _bg().time_prepared(env, lambda be: ga.run(be, **args))
            t_k = tk.best
            flops, nbytes = attention_cost(dtype, B, Hq, Hkv, Sq, T, D, causal)
            t_roof, bound = roofline_time(dtype, flops, nbytes)
            detail = (f"{tk.text()} {flops / t_k / 1e12:5.1f} TFLOP/s {nbytes / t_k / 1e9:5.0f} GB/s "
                      f"({t_roof / t_k * 100:3.0f}% of {bound} roofline)")
            if torch is not None:
                tt = _torch_dtype(torch, dtype)
                tq = torch.randn((B, Hq, Sq, D), device="cuda", dtype=tt)
                tk_ = torch.randn((B, Hkv, T, D), device="cuda", dtype=tt)
                tv = torch.randn((B, Hkv, T, D), device="cuda", dtype=tt)
                sdpa = torch.nn.functional.scaled_dot_product_attention

                def torch_attn():
                    kk, vv = tk_, tv
                    if Hkv != Hq:
                        kk = tk_.repeat_interleave(Hq // Hkv, 1)
                        vv = tv.repeat_interleave(Hq // Hkv, 1)
                    return sdpa(tq, kk, vv, is_causal=bool(causal) and Sq > 1)

                def torch_attn_gqa():
                    return sdpa(tq, tk_, tv, is_causal=bool(causal) and Sq > 1, enable_gqa=True)

                fn = torch_attn
                if Hkv != Hq:
                    try:
                        torch_attn_gqa()
                        fn = torch_attn_gqa
                    except TypeError:
                        pass
                detail += _torch_text("sdpa", t_k, *_torch_both(cp, torch, dtype, fn))
            record("bench", name, "-", detail)
        except Exception as exc:
            record("bench", name, False, repr(exc)[:160])


def bench_conv(env, rng, torch):
    from gpukernels.gpu import conv as gc
    from gpukernels.tensor import Tensor

    cp = env.cp
    if torch is not None:
        torch.backends.cudnn.benchmark = True
    for dtype in ("float32", "float16"):
        for label, cin, h, cout, k, s, p in RESNET50:
            name = f"Conv ResNet-50 {label} N{CONV_BATCH} {h}x{h} {dtype}"
            if not _time_left("bench", name):
                continue
            try:
                t = DTYPES[dtype]
                x = Tensor(rng.standard_normal((CONV_BATCH, cin, h, h)).astype(t), device="cuda")
                w = Tensor((rng.standard_normal((cout, cin, k, k)) * 0.05).astype(t), device="cuda")
                bias = Tensor(rng.standard_normal(cout).astype(t), device="cuda")
                args = dict(X=x, W=w, B=bias, strides=[s, s], pads=[p] * 4, dilations=[1, 1], group=1)
                tk = _bg().time_prepared(env, lambda be: gc.run(be, **args))
                t_k = tk.best
                flops, nbytes = conv_cost(dtype, CONV_BATCH, cin, h, cout, k, s, p)
                t_roof, bound = roofline_time(dtype, flops, nbytes)
                detail = (f"{tk.text()} {flops / t_k / 1e12:5.1f} TFLOP/s "
                          f"({t_roof / t_k * 100:3.0f}% of {bound} roofline)")
                if torch is not None:
                    tt = _torch_dtype(torch, dtype)
                    tx = torch.randn((CONV_BATCH, cin, h, h), device="cuda", dtype=tt)
                    tw = torch.randn((cout, cin, k, k), device="cuda", dtype=tt) * 0.05
                    tb = torch.randn((cout,), device="cuda", dtype=tt)
                    conv = torch.nn.functional.conv2d
                    detail += _torch_text("cudnn", t_k, *_torch_both(
                        cp, torch, dtype, lambda: conv(tx, tw, tb, stride=s, padding=p)))
                record("bench", name, "-", detail)
            except Exception as exc:
                record("bench", name, False, repr(exc)[:160])


PARITY = [parity_attention, parity_conv]
BENCHES = [bench_attention, bench_conv]


if __name__ == "__main__":
    if "--roofline" in sys.argv:
        print(roofline_table())
    else:
        print(__doc__)
