"""CUDA path of LinearAttention (cuda/linear_attention.cu).

Called as ``run(backend, query=, key=, value=, past_state=, decay=, beta=, chunk_size=,
kv_num_heads=, q_num_heads=, scale=, update_rule=)`` with the kernel class's validated
Tensors (past_state/decay/beta possibly absent) and resolved attributes (scale already
1/sqrt(d_k) when the attribute was 0; update_rule a str).  Returns
``LinearAttention.Result(output, present_state)``.

Algorithm choice: the recurrent kernel (state on chip) for T up to
linear_attention.cuda_recurrent_max_t (host/tuning.py), the chunked kernels beyond; the
context option 'linear_attention_mode' ('recurrent' / 'chunked') forces one.  d_k up to
128 is covered (the recurrent kernel keeps d_k/4 state rows per thread in registers);
larger d_k returns None (the class' array code then runs on the GPU).  The state is
float32 inside; a half-typed past_state is converted on the way in and present_state
rounded once on the way out.
"""

from __future__ import annotations

import math

import numpy as np

from ..codec import from_float32, to_float32
from ..dtypes import DataType
from ..errors import CudaKernelError
from ..host import tuning
from ..tensor import Tensor
from . import accelerated
from .launch import CudaSource, Lazy, backend_for, ceil_div, describe_arrays, f32, i32

SOURCE = "linear_attention.cu"
CTYPES = {DataType.FLOAT: "float", DataType.FLOAT16: "__half", DataType.BFLOAT16: "__nv_bfloat16"}
ROWS = (1, 2, 4, 8, 16, 32)  # R: state rows per thread; d_k <= 4 R
MAX_DK = 4 * ROWS[-1]
CHUNK = 32  # tokens per chunk: the constexpr C of linear_attention.cu (not a tuning knob)
_RULES = {"linear": (False, False), "gated": (True, False), "delta": (False, True), "gated_delta": (True, True)}


def expressions() -> list[str]:
    out = [f"gk_la_recurrent<{ct}, {r}>" for ct in CTYPES.values() for r in ROWS]
    out += [f"gk_la_chunk_prep<{ct}>" for ct in CTYPES.values()]
    out += [f"gk_la_chunk_state<{ct}>" for ct in CTYPES.values()]
    return out


CUDA_SOURCES = [CudaSource(SOURCE, expressions, no_spill=("gk_la_",))]


def _absent(t) -> bool:
    return t is None or (isinstance(t, Tensor) and t.is_absent)


def _result_type():
    from ..kernels.nn.linear_attention import LinearAttention

    return LinearAttention.Result


def run(backend, *, query: Tensor, key: Tensor, value: Tensor, past_state=None, decay=None, beta=None,
        chunk_size=64, kv_num_heads=None, q_num_heads=None, scale=0.0, update_rule="gated_delta", mode=None):
    xp = backend.xp
    dt = DataType(int(query.data_type))
    if dt not in CTYPES or key.data_type != dt or value.data_type != dt:
        return None
    rule = update_rule.decode() if isinstance(update_rule, bytes) else str(update_rule)
    if rule not in _RULES:
        raise CudaKernelError(f"LinearAttention: unknown update_rule {rule!r}")
    gated, delta = _RULES[rule]
    Hq, Hkv = int(q_num_heads), int(kv_num_heads)
    if query.ndim != 3 or key.ndim != 3 or value.ndim != 3 or Hq <= 0 or Hkv <= 0 or Hq % Hkv:
        raise CudaKernelError("LinearAttention: bad shapes or head counts")
    B, T, qw = query.shape
    dk = qw // Hq
    dv = value.shape[2] // Hkv
    if qw != Hq * dk or tuple(key.shape) != (B, T, Hkv * dk) or tuple(value.shape) != (B, T, Hkv * dv):
        raise CudaKernelError(f"LinearAttention: inconsistent shapes "
                              f"({describe_arrays(query=query.array, key=key.array, value=value.array)})")
    if dk > MAX_DK or dk == 0 or B > 65535 or Hkv > 65535:
        return None
    decay_width = 0
    if gated:
        if _absent(decay) or decay.data_type != dt:
            return None
        if tuple(decay.shape) == (B, T, Hkv * dk):
            decay_width = dk
        elif tuple(decay.shape) == (B, T, Hkv):
            decay_width = 1
        else:
            raise CudaKernelError(f"LinearAttention: decay shape {decay.shape}")
    beta_heads = 0
    if delta:
        if _absent(beta) or beta.data_type != dt:
            return None
        if tuple(beta.shape) == (B, T, Hkv):
            beta_heads = Hkv
        elif tuple(beta.shape) == (B, T, 1):
            beta_heads = 1
        else:
            raise CudaKernelError(f"LinearAttention: beta shape {beta.shape}")
    state_type = dt if _absent(past_state) else DataType(int(past_state.data_type))
    if state_type not in CTYPES:
        return None
    if not _absent(past_state) and tuple(past_state.shape) != (B, Hkv, dk, dv):
        raise CudaKernelError(f"LinearAttention: past_state must be ({B}, {Hkv}, {dk}, {dv})")
    sc = float(scale) if scale else 1.0 / math.sqrt(dk)

    out = backend.empty((B, T, Hq * dv), backend.dtype_for(dt))
    state_out = backend.empty((B, Hkv, dk, dv), np.float32)
    Result = _result_type()
    if B * Hkv * dv == 0:
        return Result(Tensor.wrap(out, dt), _present(backend, state_out, state_type))

    q = backend.device_array(query.array)
    k = backend.device_array(key.array)
    v = backend.device_array(value.array)
    dcy = backend.device_array(decay.array) if decay_width else None
    bt = backend.device_array(beta.array) if beta_heads else None
    s_in = None
    if not _absent(past_state):
        # bfloat16 is held as its bit pattern on CuPy, as ml_dtypes on the emulator
        s_in = backend.device_array(to_float32(xp, past_state.array, state_type))

    if T == 0:
        # no token: present_state is past_state (or zeros); no kernel runs, so state_out is
        # written here (the chunked path would otherwise return it uninitialised)
        if s_in is None:
            state_out[...] = 0
        else:
            state_out[...] = s_in
        return Result(Tensor.wrap(out, dt), _present(backend, state_out, state_type))

    what = Lazy(lambda: f"LinearAttention {rule} ({describe_arrays(query=q, key=k, value=v, decay=dcy, beta=bt)}, "
                        f"q_num_heads={Hq}, kv_num_heads={Hkv})")
    mode = mode or "auto"
    use_chunked = (mode == "chunked"
                   or (mode == "auto" and T > tuning.value("linear_attention.cuda_recurrent_max_t")))
    if use_chunked:
        _run_chunked(backend, dt, q, k, v, s_in, dcy, bt, out, state_out, B, T, Hq, Hkv, dk, dv, decay_width,
                     beta_heads, sc, what)
    else:
        _run_recurrent(backend, dt, q, k, v, s_in, dcy, bt, out, state_out, B, T, Hq, Hkv, dk, dv, decay_width,
                       beta_heads, sc, what)
    return Result(Tensor.wrap(out, dt), _present(backend, state_out, state_type))


def _present(backend, state_f32, state_type: DataType) -> Tensor:
    if state_type == DataType.FLOAT:
        return Tensor.wrap(state_f32, DataType.FLOAT)
    # rounded once into the backend's storage of the type (bfloat16: bit pattern on CuPy)
    return Tensor.wrap(from_float32(backend.xp, state_f32, state_type, backend.dtype_for(state_type)), state_type)


def _run_recurrent(backend, dt, q, k, v, s_in, dcy, bt, out, state_out, B, T, Hq, Hkv, dk, dv, decay_width,
                   beta_heads, sc, what):
    R = next(r for r in ROWS if 4 * r >= dk)
    col_tiles = ceil_div(dv, 8)
    # warps per block: as many as fit (<= 4) while keeping >= 2 blocks per SM when possible
    warps = 4
    while warps > 1 and ceil_div(col_tiles, warps) * Hkv * B < 2 * backend.sm_count:
        warps //= 2
    grid = (ceil_div(col_tiles, warps), Hkv, B)
    fn = backend.function(SOURCE, f"gk_la_recurrent<{CTYPES[dt]}, {R}>")
    backend.launch(fn, grid, (32, warps), (q, k, v, s_in, dcy, bt, out, state_out, i32(T), i32(Hq), i32(Hkv),
                                           i32(dk), i32(dv), i32(decay_width), i32(beta_heads), f32(sc)),
                   0, what=what)


def _run_chunked(backend, dt, q, k, v, s_in, dcy, bt, out, state_out, B, T, Hq, Hkv, dk, dv, decay_width,
                 beta_heads, sc, what):
    C = CHUNK
    G = Hq // Hkv
    dg = decay_width
    delta = beta_heads > 0
    n_chunks = ceil_div(T, C)
    per_chunk = B * Hkv * C * (dg + (dk + dv if delta else 0) + G * C) * 4
    # chunks per launch pair: their chunk-local workspace within linear_attention.cuda_workspace_bytes
    seg = max(1, min(n_chunks, tuning.value("linear_attention.cuda_workspace_bytes") // max(per_chunk, 1)))
    gam = backend.empty((B * Hkv * seg * C * dg,), np.float32) if dg else None
    wm = backend.empty((B * Hkv * seg * C * dk,), np.float32) if delta else None
    u0 = backend.empty((B * Hkv * seg * C * dv,), np.float32) if delta else None
    mqk = backend.empty((B * Hkv * seg * G * C * C,), np.float32)
    ct = CTYPES[dt]
    prep = backend.function(SOURCE, f"gk_la_chunk_prep<{ct}>")
    state = backend.function(SOURCE, f"gk_la_chunk_state<{ct}>")
    prep_smem = (2 * C * dk + C * dg + C * C + C + C * 256) * 4
    state_smem = (dk * 32 + 3 * C * dk + C * dg + C * 32) * 4
    s_cur = s_in
    for c0 in range(0, n_chunks, seg):
        nch = min(seg, n_chunks - c0)
        backend.launch(prep, (nch, Hkv, B), (256,),
                       (q, k, v, dcy, bt, gam, wm, u0, mqk, i32(c0), i32(nch), i32(T), i32(Hq), i32(Hkv), i32(dk),
                        i32(dv), i32(dg), i32(beta_heads)), prep_smem, what=what + " [chunk prep]")
        backend.launch(state, (ceil_div(dv, 32), Hkv, B), (256,),
                       (q, k, v, gam, wm, u0, mqk, s_cur, out, state_out, i32(c0), i32(nch), i32(T), i32(Hq),
                        i32(Hkv), i32(dk), i32(dv), i32(dg), i32(1 if delta else 0), f32(sc)),
                       state_smem, what=what + " [chunk state]")
        s_cur = state_out


def run_options(kernel) -> dict:
    """Extra run() arguments taken from the kernel's context options."""
    return {"mode": kernel.ctx.option("linear_attention_mode", "auto")}


@accelerated.register("LinearAttention")
def linear_attention_cuda(kernel, **arguments):
    return run(backend_for(kernel), **arguments, **run_options(kernel))
