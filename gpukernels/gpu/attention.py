"""CUDA path of Attention (cuda/attention.cu).

Called as ``run(backend, Q=, K=, V=, attn_mask=, past_key=, past_value=,
nonpad_kv_seqlen=, is_causal=, kv_num_heads=, q_num_heads=, qk_matmul_output_mode=,
scale=, softcap=, softmax_precision=, left_window_size=, right_window_size=)`` with the
kernel class's validated Tensors (optional ones absent) and resolved attributes (scale
already 1/sqrt(head_size) when the attribute was absent, head counts resolved).
``wants`` = (Y, present_key, present_value, qk_matmul_output) says which outputs the
caller uses (all but qk when not given).

Covered: Q, K, V (and caches) all float32, float16 or bfloat16, 3-D or 4-D; head sizes up to
256; every mask form (bool or any numeric type; rank 0-4 broadcast; padded with -inf when
shorter than the total kv length), causal (offset by the past length or nonpad - q_len),
the opset-25 window, softcap, grouped/multi-query heads, past_key/past_value (present
outputs written by a copy kernel), nonpad_kv_seqlen; softmax_precision absent or FLOAT.
float32 runs exact float32 FMAs by default; with the context option ``allow_tf32``
(``backend.allow_tf32``) it runs the tensor-core kernel instead, Q K^T and P V as TF32 products
(inputs and the probabilities rounded to 10 mantissa bits, to nearest; float32 accumulation
and softmax): about 1e-3 relative error on the scores of long heads instead of float32
rounding.  float16/bfloat16 run on tensor cores with float32 accumulation and softmax
(for P @ V, bfloat16 rounds the probabilities to bfloat16, as flash-attention kernels do;
float16 keeps them as a hi + lo pair of float16 values, two MMAs, because one float16
rounding of P puts outputs 2 ulps from the official cases' expected values, beyond their
rtol=1e-3).  When few blocks would run (decoding: one or a few query
tokens against a long cache) the keys are split among several blocks per row and a combine
kernel merges the partial softmaxes.

Not covered (returns None; the class then runs its array code on the GPU): a requested
qk_matmul_output, softmax_precision FLOAT16/BFLOAT16/DOUBLE, double inputs, mixed input
types, head sizes above 256, zero-size heads.
"""

from __future__ import annotations

import numpy as np

from ..dtypes import DataType
from ..errors import CudaKernelError
from ..host import tuning
from ..tensor import Tensor
from . import accelerated
from .launch import CudaSource, Lazy, backend_for, ceil_div, describe_arrays, f32, i32, i64

SOURCE = "attention.cu"
CTYPES = {DataType.FLOAT: "float", DataType.FLOAT16: "__half", DataType.BFLOAT16: "__nv_bfloat16"}
DMAXES = (64, 128, 256)
# mask element type -> kind understood by the kernel (others are converted to float32 first)
MASK_KINDS = {DataType.BOOL: 1, DataType.FLOAT: 2, DataType.FLOAT16: 3, DataType.BFLOAT16: 4}


def _simt_bms(dmax: int) -> tuple[int, int]:
    """(prefill, decode) rows per block of the float32 kernel."""
    return (32 if dmax == 256 else 64), 16


def _bn(dmax: int) -> int:
    """Keys per tile of the float32 SIMT kernel."""
    return 32 if dmax == 256 else 64


def tc_tile(ct: str, dmax: int) -> tuple[int, int, int]:
    """(keys per tile, Q/K row stride, V row stride) of gk_attn_tc<ct, dmax, *> (TcTile in
    attention.cu): float (TF32) takes 4096 / dmax keys so that its tiles fit an sm_80 block."""
    if ct == "float":
        return 4096 // dmax, dmax + 4, dmax + 8
    return (32 if dmax == 256 else 64), dmax + 8, dmax + 8


def expressions() -> list[str]:
    out = []
    for dmax in DMAXES:
        for bm in _simt_bms(dmax):
            out.append(f"gk_attn_simt<{dmax}, {bm}>")
    for ct in ("__half", "__nv_bfloat16", "float"):  # float: TF32 (allow_tf32)
        for dmax in DMAXES:
            for nw in (4, 1):
                out.append(f"gk_attn_tc<{ct}, {dmax}, {nw}>")
    out += [f"gk_attn_combine<{ct}>" for ct in CTYPES.values()]
    out += ["gk_attn_present<unsigned int>", "gk_attn_present<unsigned short>"]
    return out


CUDA_SOURCES = [CudaSource(SOURCE, expressions, no_spill=("gk_attn_simt", "gk_attn_tc"))]


def simt_shared_bytes(dmax: int, bm: int) -> int:
    bn = _bn(dmax)
    return 4 * (dmax * (bm + 4) + dmax * (bn + 4) + bn * (dmax + 4))


def tc_shared_bytes(dmax: int, nw: int, ct: str = "__half") -> int:
    bn, ldk, ldv = tc_tile(ct, dmax)
    size = 4 if ct == "float" else 2
    return size * (16 * nw * ldk + 2 * bn * ldk + 2 * bn * ldv)


def _absent(t) -> bool:
    return t is None or (isinstance(t, Tensor) and t.is_absent)


def _result_type():
    from ..kernels.nn.attention import Attention

    return Attention.Result


def _strides(rank: int, heads: int, seq: int, width: int) -> tuple[int, int, int]:
    """Element strides (batch, head, position) of a 4-D (B, H, S, W) or 3-D (B, S, H*W) array."""
    if rank == 4:
        return heads * seq * width, seq * width, width
    return seq * heads * width, width, heads * width


def _mask_layout(shape: tuple, B: int, Hq: int, Sq: int, T: int) -> tuple:
    """(Lm, sMb, sMh, sMq, sMk) of a mask broadcast right-aligned to (B, Hq, Sq, T)."""
    if len(shape) == 0:
        return T, 0, 0, 0, 0  # a scalar applies to every key
    full = (1,) * (4 - len(shape)) + tuple(int(s) for s in shape)
    contiguous = [1, 1, 1, 1]
    for ax in range(2, -1, -1):
        contiguous[ax] = contiguous[ax + 1] * full[ax + 1]
    target = (B, Hq, Sq)
    st = []
    for ax in range(3):
        st.append(0 if full[ax] == 1 else contiguous[ax])
        if full[ax] not in (1, target[ax]):
            raise CudaKernelError(f"Attention: attn_mask shape {list(shape)} does not broadcast to "
                                  f"{(B, Hq, Sq, T)}")
    Lm = full[3]
    if Lm > T:
        raise CudaKernelError(f"Attention: attn_mask's last dimension {Lm} exceeds the total kv length {T}")
    return Lm, st[0], st[1], st[2], 1


def _mask_array(backend, mask: Tensor):
    """(device array, kind) for the kernel."""
    dt = DataType(int(mask.data_type))
    if dt in MASK_KINDS:
        return backend.device_array(mask.array), MASK_KINDS[dt]
    return backend.device_array(mask.array.astype(np.float32)), 2


def _choose_splits(backend, blocks: int, ntiles: int) -> int:
    """Key splits per block so that about two waves of blocks run; 1 when enough blocks exist."""
    target = 2 * int(backend.sm_count)
    if blocks >= target or ntiles < 4:
        return 1
    s = min(ceil_div(target, blocks), ntiles // 2, tuning.value("attention.cuda_max_splits"))
    return max(1, s)


def run(backend, *, Q: Tensor, K: Tensor, V: Tensor, attn_mask=None, past_key=None, past_value=None,
        nonpad_kv_seqlen=None, is_causal=0, kv_num_heads=None, q_num_heads=None, qk_matmul_output_mode=0,
        scale=None, softcap=0.0, softmax_precision=None, left_window_size=-1, right_window_size=-1, wants=None,
        splits=None):
    wants = tuple(wants) if wants is not None else (True, True, True, False)
    if len(wants) > 3 and wants[3]:
        return None  # the qk output: the array path writes it
    dt = DataType(int(Q.data_type))
    if dt not in CTYPES or K.data_type != dt or V.data_type != dt:
        return None
    if softmax_precision is not None and int(softmax_precision) != int(DataType.FLOAT):
        return None
    has_past = not _absent(past_key)
    if has_past and (past_key.data_type != dt or past_value.data_type != dt):
        return None
    rank = Q.ndim
    B = int(Q.shape[0])
    if rank == 4:
        _, Hq, Sq, D = (int(s) for s in Q.shape)
        _, Hkv, Skv, Dk = (int(s) for s in K.shape)
        Dv = int(V.shape[3])
    elif rank == 3:
        Hq, Hkv = int(q_num_heads), int(kv_num_heads)
        Sq, Skv = int(Q.shape[1]), int(K.shape[1])
        D, Dk, Dv = int(Q.shape[2]) // Hq, int(K.shape[2]) // Hkv, int(V.shape[2]) // Hkv
    else:
        raise CudaKernelError(f"Attention: Q must be 3-D or 4-D, got {list(Q.shape)}")
    P = int(past_key.shape[2]) if has_past else 0
    _check_shapes(Q, K, V, past_key if has_past else None, past_value if has_past else None,
                  rank, B, Hq, Hkv, Sq, Skv, D, Dk, Dv, P)
    if D == 0 or Dv == 0 or max(D, Dv) > DMAXES[-1]:
        return None
    if scale is None:
        scale = 1.0 / np.sqrt(D)
    T = P + Skv
    G = Hq // Hkv
    M = G * Sq
    for name, val in (("total kv length", T), ("query rows per kv head", M), ("B * kv heads", B * Hkv)):
        if val >= 2**31:
            raise CudaKernelError(f"Attention: {name} {val} exceeds the kernel's 32-bit range")
    storage = backend.dtype_for(dt)
    what = Lazy(lambda: f"Attention ({describe_arrays(Q=Q.array, K=K.array, V=V.array)}, past={P}, "
                        f"causal={int(is_causal)})")

    # present_key / present_value
    present_k = present_v = None
    if wants[1] or wants[2]:
        if has_past:
            present_k = _present(backend, past_key, K, rank, B, Hkv, P, Skv, D, storage, what) if wants[1] else None
            present_v = _present(backend, past_value, V, rank, B, Hkv, P, Skv, Dv, storage, what) \
                if wants[2] else None
        else:
            def view(t, w):
                a = t.array
                return a if rank == 4 else a.reshape(B, Skv, Hkv, w).transpose(0, 2, 1, 3)
            present_k = view(K, D) if wants[1] else None
            present_v = view(V, Dv) if wants[2] else None

    y_shape = (B, Hq, Sq, Dv) if rank == 4 else (B, Sq, Hq * Dv)
    y = backend.empty(y_shape, storage)
    result = _result_type()
    pk_t = Tensor.wrap(present_k, dt) if present_k is not None else None
    pv_t = Tensor.wrap(present_v, dt) if present_v is not None else None
    if B * Hq * Sq == 0:
        return result(Tensor.wrap(y, dt), pk_t, pv_t, None)

    q = backend.device_array(Q.array)
    k = backend.device_array(K.array)
    v = backend.device_array(V.array)
    pk = backend.device_array(past_key.array) if has_past else None
    pv = backend.device_array(past_value.array) if has_past else None
    mask_arr, mask_kind = None, 0
    Lm, sMb, sMh, sMq, sMk = T, 0, 0, 0, 0
    if not _absent(attn_mask):
        mask_arr, mask_kind = _mask_array(backend, attn_mask)
        Lm, sMb, sMh, sMq, sMk = _mask_layout(tuple(attn_mask.shape), B, Hq, Sq, T)
    nonpad = None
    if not _absent(nonpad_kv_seqlen):
        if tuple(nonpad_kv_seqlen.shape) != (B,) or nonpad_kv_seqlen.data_type != DataType.INT64:
            raise CudaKernelError(f"Attention: nonpad_kv_seqlen must be int64 ({B},)")
        nonpad = backend.device_array(nonpad_kv_seqlen.array)

    dmax = next(d for d in DMAXES if d >= max(D, Dv))
    ct = CTYPES[dt]
    if dt == DataType.FLOAT and not backend.allow_tf32:  # exact float32 unless TF32 is allowed
        bn = _bn(dmax)
        bm_pre, bm_dec = _simt_bms(dmax)
        bm = bm_pre if M > 16 else bm_dec
        expr = f"gk_attn_simt<{dmax}, {bm}>"
        threads = 256
        smem = simt_shared_bytes(dmax, bm)
        arrays = [k, v] + ([pk, pv] if has_past else [])
        vec_ok = int(D % 4 == 0 and Dv % 4 == 0 and all(backend.pointer(x) % 16 == 0 for x in arrays))
    else:
        nw = 4 if M > 16 else 1
        bm = 16 * nw
        bn = tc_tile(ct, dmax)[0]
        expr = f"gk_attn_tc<{ct}, {dmax}, {nw}>"
        threads = 32 * nw
        smem = tc_shared_bytes(dmax, nw, ct)
        arrays = [q, k, v] + ([pk, pv] if has_past else [])
        chunk = 16 // np.dtype(storage).itemsize  # elements per 16-byte copy
        vec_ok = int(D % chunk == 0 and Dv % chunk == 0 and all(backend.pointer(x) % 16 == 0 for x in arrays))
    row_blocks = ceil_div(M, bm)
    BH = B * Hkv
    blocks = row_blocks * BH
    if blocks >= 2**31:
        raise CudaKernelError(f"{what}: {blocks} blocks exceed the grid limit")
    ntiles = ceil_div(T, bn)
    n_split = int(splits) if splits is not None else _choose_splits(backend, blocks, ntiles)
    n_split = max(1, min(n_split, tuning.value("attention.cuda_max_splits")))
    part = backend.empty((n_split * BH * M * (Dv + 2),), np.float32) if n_split > 1 else None

    sQ = _strides(rank, Hq, Sq, D)
    sK = _strides(rank, Hkv, Skv, D)
    sV = _strides(rank, Hkv, Skv, Dv)
    sY = _strides(rank, Hq, Sq, Dv)
    sc = float(scale)
    cap = float(softcap or 0.0)
    inv_cap = np.float32(1) / np.float32(cap) if cap > 0 else np.float32(0)
    scalars = (i32(Hq), i32(Hkv), i32(Sq), i32(Skv), i32(P), i32(D), i32(Dv),
               *(i64(s) for s in sQ + sK + sV + sY),
               i32(mask_kind), i32(Lm), i64(sMb), i64(sMh), i64(sMq), i64(sMk),
               i32(1 if is_causal else 0), i32(left_window_size, "left_window_size"),
               i32(right_window_size, "right_window_size"), f32(sc), f32(cap), f32(inv_cap),
               i32(row_blocks), i32(BH), i32(vec_ok))
    fn = backend.function(SOURCE, expr)
    backend.launch(fn, (blocks, n_split), (threads,),
                   (q, k, v, pk, pv, mask_arr, nonpad, y, part) + scalars, smem, what=what)
    if n_split > 1:
        comb = backend.function(SOURCE, f"gk_attn_combine<{CTYPES[dt]}>")
        backend.launch(comb, (BH * M,), (128,),
                       (part, y, i32(n_split), i32(BH), i32(M), i32(Hkv), i32(G), i32(Dv),
                        *(i64(s) for s in sY)), 0, what=what + " combine")
    return result(Tensor.wrap(y, dt), pk_t, pv_t, None)


def _check_shapes(Q, K, V, pk, pv, rank, B, Hq, Hkv, Sq, Skv, D, Dk, Dv, P):
    """The shapes the kernels index by (the class validated them; checked again because the
    launch relies on them)."""
    if rank == 4:
        want = {"K": (B, Hkv, Skv, D), "V": (B, Hkv, Skv, Dv)}
    else:
        want = {"Q": (B, Sq, Hq * D), "K": (B, Skv, Hkv * D), "V": (B, Skv, Hkv * Dv)}
    got = {"Q": tuple(Q.shape), "K": tuple(K.shape), "V": tuple(V.shape)}
    if pk is not None:
        want.update(past_key=(B, Hkv, P, D), past_value=(B, Hkv, P, Dv))
        got.update(past_key=tuple(pk.shape), past_value=tuple(pv.shape))
    bad = [n for n, s in want.items() if got[n] != s]
    if Hkv <= 0 or Hq % Hkv or Dk != D or bad:
        arrays = {n: t.array for n, t in (("Q", Q), ("K", K), ("V", V), ("past_key", pk), ("past_value", pv))
                  if t is not None}
        raise CudaKernelError(f"Attention: inconsistent shapes ({describe_arrays(**arrays)}; q_num_heads={Hq}, "
                              f"kv_num_heads={Hkv})")


def _present(backend, past: Tensor, cur: Tensor, rank, B, Hkv, P, S, width, storage, what):
    """concat(past, cur as 4-D) along the sequence axis by the copy kernel."""
    out = backend.empty((B, Hkv, P + S, width), storage)
    total = out.size
    if total == 0:
        return out
    itemsize = np.dtype(storage).itemsize
    ct = "unsigned int" if itemsize == 4 else "unsigned short"
    fn = backend.function(SOURCE, f"gk_attn_present<{ct}>")
    p = backend.device_array(past.array)
    c = backend.device_array(cur.array)
    sb, sh, ss = _strides(rank, Hkv, S, width)
    grid = min(ceil_div(total, 256), 65536)
    backend.launch(fn, (grid,), (256,), (p, c, out, i32(Hkv), i32(P), i32(S), i32(width), i64(sb), i64(sh),
                                         i64(ss), i64(total)), 0, what=what + " present")
    return out


def run_options(kernel) -> dict:
    """The keyword arguments of run() that come from the kernel instance rather than from
    its cuda_path call: which outputs the caller uses."""
    return {"wants": tuple(kernel.wants_output(i) for i in range(4))}


@accelerated.register("Attention")
def attention_cuda(kernel, **arguments):
    return run(backend_for(kernel), **arguments, **run_options(kernel))
