"""Seeded fuzz of every hand-written CUDA kernel against the array path of its kernel class,
on the CPU emulator.

Each case draws an operator's inputs and attributes from a fixed seed: odd and tiny sizes,
sizes around the kernels' tile boundaries (16/32/64/128 rows, keys, pixels, head sizes),
every supported dtype, empty inputs (a zero batch, sequence or channel count), and inputs
that are views one element into a larger buffer -- which stay misaligned on the emulated
device (``emulator.upload`` keeps a view's address modulo 256), where the kernels are built
with ``-fsanitize=alignment``, so a vector access the host launch code should not have
chosen faults as it would on a GPU.  Outputs start poisoned (NaN), so an element a kernel
never writes shows up as a mismatch; ``test_an_unwritten_element_is_caught`` checks that
it does, for every operator.

The case list is the same on every run (seed ``SEED``); ``GK_FUZZ_CASES=n`` multiplies the
number of cases per operator by n and ``GK_FUZZ_SEED`` picks another seed, for longer runs
by hand.  A failure message names the case (operator, index, shapes, attributes): rerun it
alone with ``-k "<op>-<index>"``.
"""

from __future__ import annotations

import os
import zlib

import ml_dtypes
import numpy as np
import pytest

import emulator
from gpukernels.dtypes import DataType
from gpukernels.kernels.nn.attention import Attention
from gpukernels.kernels.nn.conv import Conv
from gpukernels.kernels.nn.linear_attention import LinearAttention
from gpukernels.kernels.nn.rotary import RotaryEmbedding
from tests.gpu.emu_harness import check_op

SEED = int(os.environ.get("GK_FUZZ_SEED", "20250611"))
SCALE = max(1, int(os.environ.get("GK_FUZZ_CASES", "1")))
DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
# cases per operator (the whole file takes about 15 s on one core)
COUNTS = {"RotaryEmbedding": 300, "Conv": 180, "Attention": 180, "LinearAttention": 150}


def _rng(op: str, index: int) -> np.random.Generator:
    return np.random.default_rng([SEED, zlib.crc32(op.encode()), index])


def _pick(rng, options):
    return options[int(rng.integers(len(options)))]


def _layout(rng, a: np.ndarray | None, p_misaligned=0.3, p_strided=0.1):
    """a itself, or the same values as a view one element into a larger buffer (misaligned
    for every access wider than one element), or as a non-contiguous view."""
    if a is None or a.ndim == 0:
        return a
    u = rng.random()
    if u < p_misaligned:
        buf = np.empty(a.size + 1, a.dtype)
        view = buf[1:].reshape(a.shape)
        view[...] = a
        return view
    if u < p_misaligned + p_strided and a.ndim >= 2:
        return np.asfortranarray(a)
    return a


def _desc(**items) -> str:
    parts = []
    for k, v in items.items():
        if isinstance(v, np.ndarray):
            off = " off" if v.ctypes.data % 16 and v.size else ""
            parts.append(f"{k}={v.dtype}{list(v.shape)}{off}")
        elif v is not None:
            parts.append(f"{k}={v}")
    return " ".join(parts)


# ------------------------------------------------------------------ RotaryEmbedding
def gen_rotary(rng):
    dtype = _pick(rng, list(DTYPES))
    t = DTYPES[dtype]
    rank = _pick(rng, [3, 4])
    B, H = _pick(rng, [0, 1, 1, 2, 3]), _pick(rng, [1, 1, 2, 3, 5])
    S = _pick(rng, [0, 1, 1, 2, 3, 7])
    D = _pick(rng, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 15, 16, 18, 24, 31, 32, 33, 64])
    if D == 1 or rng.random() < 0.4 or D % 2:
        rd = int(rng.integers(1, D // 2 + 1)) * 2 if D >= 2 else 0
    else:
        rd = 0  # the whole head
    if D == 1:
        D = 3
        rd = 2
    half = (rd or D) // 2
    with_pos = rng.random() < 0.6
    interleaved = int(rng.random() < 0.5)
    x = rng.standard_normal((B, H, S, D) if rank == 4 else (B, S, H * D)).astype(t)
    if with_pos:
        max_pos = _pick(rng, [1, 3, 11])
        angles = rng.uniform(-3, 3, (max_pos, half))
        pos = rng.integers(0, max_pos, (B, S)).astype(np.int64)
    else:
        angles = rng.uniform(-3, 3, (B, S, half))
        pos = None
    cos, sin = np.cos(angles).astype(t), np.sin(angles).astype(t)
    x, cos, sin = _layout(rng, x), _layout(rng, cos, 0.2), _layout(rng, sin, 0.2)
    attrs = dict(interleaved=interleaved, rotary_embedding_dim=rd)
    if rank == 3:
        attrs["num_heads"] = H
    return dict(inputs=(x, cos, sin, pos), attrs=attrs, desc=_desc(X=x, cos=cos, pos=pos, **attrs),
                tags=(dtype, f"rank{rank}", "interleaved" if interleaved else "halves"))


# ------------------------------------------------------------------ Conv
def gen_conv(rng):
    dtype = _pick(rng, list(DTYPES))
    t = DTYPES[dtype]
    n_sp = _pick(rng, [1, 2, 2, 2, 3])
    N = _pick(rng, [0, 1, 1, 2])
    kind = _pick(rng, ["dense", "dense", "dense", "grouped", "depthwise", "pointwise", "no channels"])
    if kind == "depthwise":
        group = C = _pick(rng, [2, 3, 5, 8])
        Cg, M = 1, C * _pick(rng, [1, 2])
    else:
        group = _pick(rng, [2, 3]) if kind == "grouped" else 1
        Cg = 0 if kind == "no channels" else _pick(rng, [1, 2, 3, 5, 8, 17])
        C = Cg * group
        M = group * _pick(rng, [1, 2, 3, 7, 8, 63, 64, 65, 127, 128, 129])
    if kind == "pointwise":
        K, st, dil, pb, pe = [1] * n_sp, [1] * n_sp, [1] * n_sp, [0] * n_sp, [0] * n_sp
    else:
        K = [_pick(rng, [1, 2, 3]) for _ in range(n_sp)]
        st = [_pick(rng, [1, 1, 2, 3]) for _ in range(n_sp)]
        dil = [_pick(rng, [1, 1, 2]) for _ in range(n_sp)]
        pb = [_pick(rng, [0, 0, 1, 2]) for _ in range(n_sp)]
        pe = [_pick(rng, [0, 0, 1, 2]) for _ in range(n_sp)]
    S = []
    for i in range(n_sp):
        need = max(1, dil[i] * (K[i] - 1) + 1 - pb[i] - pe[i])
        S.append(need + int(rng.integers(0, 9 if n_sp < 3 else 4)))
    # pixels around the 128-pixel tile for the 2-D dense cases, kept small otherwise
    if n_sp == 2 and kind == "dense" and rng.random() < 0.3:
        S = [_pick(rng, [8, 11, 16]), _pick(rng, [8, 12, 16, 17])]
        K, st, dil, pb, pe = [1, 1], [1, 1], [1, 1], [0, 0], [0, 0]
    x = rng.standard_normal((N, C, *S)).astype(t)
    w = (rng.standard_normal((M, Cg, *K)) / np.sqrt(max(1, Cg * int(np.prod(K))))).astype(t)
    b = rng.standard_normal(M).astype(t) if rng.random() < 0.6 else None
    x, w, b = _layout(rng, x), _layout(rng, w), _layout(rng, b, 0.2, 0)
    attrs = dict(group=group, strides=st, dilations=dil, pads=pb + pe)
    return dict(inputs=(x, w, b), attrs=attrs, desc=_desc(X=x, W=w, B=b, kind=kind, **attrs),
                tags=(dtype, f"{n_sp}-D", kind))


# ------------------------------------------------------------------ Attention
def gen_attention(rng):
    dtype = _pick(rng, list(DTYPES))
    t = DTYPES[dtype]
    rank = _pick(rng, [3, 4, 4])
    B = _pick(rng, [1, 1, 2, 3])
    Hkv, G = _pick(rng, [1, 1, 2, 3]), _pick(rng, [1, 1, 2, 3])
    Hq = Hkv * G
    D = _pick(rng, [1, 3, 8, 16, 17, 32, 63, 64, 65, 100, 128, 129, 200, 256])
    Dv = D if rng.random() < 0.6 else _pick(rng, [1, 5, 8, 24, 64, 65, 128])
    Sq = _pick(rng, [1, 1, 2, 3, 5, 8, 15, 16, 17, 33])
    Skv = _pick(rng, [0, 1, 2, 5, 16, 31, 63, 64, 65, 70])
    if rng.random() < 0.15:  # decoding against a long cache: the keys are split among blocks
        Sq, D, Skv = _pick(rng, [1, 2, 4]), _pick(rng, [8, 32, 64, 128]), _pick(rng, [255, 256, 257, 300])
        Dv = D
    P = _pick(rng, [0, 0, 0, 1, 3, 17, 64]) if rng.random() < 0.35 else 0
    # keep the emulated work bounded: (rows x keys x head size) per case
    while B * Hq * Sq * (P + Skv) * max(D, Dv) > 600_000 and Sq > 1:
        Sq //= 2
    while B * Hq * Sq * (P + Skv) * max(D, Dv) > 600_000 and Skv > 1:
        Skv //= 2
    T = P + Skv
    opset = _pick(rng, [23, 24, 25])

    def arr(shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(t)

    q4, k4, v4 = arr((B, Hq, Sq, D)), arr((B, Hkv, Skv, D)), arr((B, Hkv, Skv, Dv))
    attrs: dict = {}
    if rank == 3:
        q = q4.transpose(0, 2, 1, 3).reshape(B, Sq, Hq * D)
        k = k4.transpose(0, 2, 1, 3).reshape(B, Skv, Hkv * D)
        v = v4.transpose(0, 2, 1, 3).reshape(B, Skv, Hkv * Dv)
        attrs.update(q_num_heads=Hq, kv_num_heads=Hkv)
    else:
        q, k, v = q4, k4, v4
    pk = pv = None
    if P:
        pk, pv = arr((B, Hkv, P, D)), arr((B, Hkv, P, Dv))
    mask = None
    form = _pick(rng, ["none", "none", "bool", "float"]) if T else "none"
    if form != "none":
        mrank = _pick(rng, [0, 1, 2, 3, 4])
        Lm = T if rng.random() < 0.7 else int(rng.integers(1, T + 1))
        full = [B, Hq, Sq, Lm]
        shape = tuple(full[4 - mrank:][i] if rng.random() < 0.6 or i == mrank - 1 else 1 for i in range(mrank))
        if mrank == 0:
            shape = ()
        if form == "bool":
            mask = rng.random(shape) < 0.8
        else:
            mask = (rng.standard_normal(shape) * 2).astype(_pick(rng, [t, np.float32]))
    nonpad = None
    if opset >= 24 and not P and T and rng.random() < 0.25:
        nonpad = rng.integers(1, T + 1, B).astype(np.int64)
    if rng.random() < 0.35:
        attrs["is_causal"] = 1
    if rng.random() < 0.25:
        attrs["softcap"] = float(_pick(rng, [1.5, 4.0, 20.0]))
    if rng.random() < 0.3:
        attrs["scale"] = float(rng.uniform(0.05, 0.8))
    if opset >= 25 and rng.random() < 0.3:
        attrs["left_window_size"] = int(_pick(rng, [-1, 0, 1, 5, 40]))
        attrs["right_window_size"] = int(_pick(rng, [-1, 0, 2, 30]))
    if rng.random() < 0.15:
        attrs["softmax_precision"] = int(DataType.FLOAT)
    q, k, v = _layout(rng, q), _layout(rng, k), _layout(rng, v)
    pk, pv = _layout(rng, pk), _layout(rng, pv)
    mask = _layout(rng, mask, 0.2)
    want_present = rng.random() < 0.5
    requested = (True, want_present, want_present, False)
    return dict(inputs=(q, k, v, mask, pk, pv, nonpad), attrs=attrs, opset=opset, requested=requested,
                desc=_desc(Q=q, K=k, V=v, mask=mask, past=pk, nonpad=nonpad, opset=opset, **attrs),
                tags=(dtype, f"rank{rank}", f"mask {form}", "past" if P else "no past"))


# ------------------------------------------------------------------ LinearAttention
def gen_linear_attention(rng):
    dtype = _pick(rng, list(DTYPES))
    t = DTYPES[dtype]
    rule = _pick(rng, ["linear", "gated", "delta", "gated_delta"])
    B = _pick(rng, [0, 1, 1, 2])
    T = _pick(rng, [0, 1, 2, 5, 16, 31, 32, 33, 63, 64, 65, 70])
    Hkv, G = _pick(rng, [1, 2, 3]), _pick(rng, [1, 1, 2])
    Hq = Hkv * G
    dk = _pick(rng, [1, 2, 5, 8, 16, 31, 32, 33, 64, 100, 128])
    dv = _pick(rng, [1, 3, 8, 12, 31, 32, 33, 40])
    while B * Hkv * T * dk * dv > 150_000 and T > 1:
        T //= 2
    mode = _pick(rng, ["auto", "recurrent", "chunked"])
    q = (rng.standard_normal((B, T, Hq * dk)) * 0.5).astype(t)
    kk = rng.standard_normal((B, T, Hkv, dk))
    kk /= np.maximum(np.linalg.norm(kk, axis=-1, keepdims=True), 1e-6)
    k = kk.reshape(B, T, Hkv * dk).astype(t)
    v = rng.standard_normal((B, T, Hkv * dv)).astype(t)
    state_t = DTYPES[_pick(rng, [dtype, dtype, "float32", "bfloat16"])]
    s0 = (rng.standard_normal((B, Hkv, dk, dv)) * 0.3).astype(state_t) if rng.random() < 0.6 else None
    decay = beta = None
    per_key = rng.random() < 0.5
    if rule in ("gated", "gated_delta"):
        decay = rng.uniform(-0.5, -0.01, (B, T, Hkv * dk if per_key else Hkv)).astype(t)
    if rule in ("delta", "gated_delta"):
        beta = rng.uniform(0.1, 0.9, (B, T, 1 if rng.random() < 0.3 else Hkv)).astype(t)
    q, k, v = _layout(rng, q), _layout(rng, k), _layout(rng, v)
    s0, decay, beta = _layout(rng, s0), _layout(rng, decay), _layout(rng, beta)
    attrs = dict(update_rule=rule, q_num_heads=Hq, kv_num_heads=Hkv)
    if rng.random() < 0.3:
        attrs["scale"] = float(rng.uniform(0.1, 1.0))
    return dict(inputs=(q, k, v, s0, decay, beta), attrs=attrs, options={"linear_attention_mode": mode},
                desc=_desc(q=q, k=k, v=v, past=s0, decay=decay, beta=beta, mode=mode, **attrs),
                tags=(dtype, rule, mode))


OPS = {"RotaryEmbedding": (RotaryEmbedding, gen_rotary), "Conv": (Conv, gen_conv),
       "Attention": (Attention, gen_attention), "LinearAttention": (LinearAttention, gen_linear_attention)}
# the kernels and the array path sum in different orders; float32 state recurrences drift
# by a few ulps of the running state (the same bound as tests/gpu/test_linear_attention_emulated.py)
RTOL = {"LinearAttention": {DataType.FLOAT: 1e-4}}


def make_case(op: str, index: int) -> dict:
    return OPS[op][1](_rng(op, index))


def run_case(backend, op: str, case: dict):
    cls = OPS[op][0]
    r = RTOL.get(op)
    return check_op(cls, backend, case["inputs"], case["attrs"], rtol=r, atol=r, options=case.get("options"),
                    opset=case.get("opset"), requested=case.get("requested"), tags=("fuzz",) + case["tags"])


def _params():
    out = []
    for op, n in COUNTS.items():
        for i in range(n * SCALE):
            out.append(pytest.param(op, i, id=f"{op}-{i}"))
    return out


def test_the_emulator_checks_alignment():
    if os.environ.get("GK_EMU_ALIGNMENT") == "0":
        pytest.skip("GK_EMU_ALIGNMENT=0 turns the alignment check off")
    assert all(f in emulator.CXXFLAGS for f in emulator.ALIGNMENT_FLAGS)


@pytest.mark.parametrize("op,index", _params())
def test_fuzz(emu, op, index):
    case = make_case(op, index)
    try:
        run_case(emu, op, case)
    except Exception as exc:
        raise AssertionError(f"fuzz case {op}-{index} (seed {SEED}): {case['desc']}\n{exc}") from exc


# ------------------------------------------------------------------ the fuzz catches holes
class _DropLastBlock:
    """A backend that runs launches as given except one, from which it drops the last block
    (the whole launch when it has a single block): whatever that block writes stays
    poisoned."""

    def __init__(self, inner, target: int):
        self.inner, self.target, self.count = inner, target, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def launch(self, fn, grid, block, args, shared_mem=0, what="kernel"):
        self.count += 1
        if self.count == self.target:
            g = list((tuple(grid) + (1, 1, 1))[:3])
            axis = next((i for i in range(3) if g[i] > 1), None)
            if axis is None:
                return  # a single block: skip the launch
            g[axis] -= 1
            grid = tuple(g)
        return self.inner.launch(fn, grid, block, args, shared_mem, what)


class _Count:
    def __init__(self, inner):
        self.inner, self.count = inner, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def launch(self, *args, **kwargs):
        self.count += 1
        return self.inner.launch(*args, **kwargs)


@pytest.mark.parametrize("op", list(OPS))
def test_an_unwritten_element_is_caught(emu, op):
    # the first fuzz cases of op with a non-empty output: dropping the last block of the
    # last launch must make the comparison fail (outputs are poisoned before the launch)
    tried = 0
    for index in range(COUNTS[op]):
        case = make_case(op, index)
        counter = _Count(emu)
        got, _ = run_case(counter, op, case)
        if counter.count == 0 or got[0].size == 0:
            continue
        with pytest.raises(AssertionError, match="differ"):
            run_case(_DropLastBlock(emu, counter.count), op, case)
        tried += 1
        if tried == 3:
            break
    assert tried == 3, f"{op}: too few fuzz cases with a launch"
