"""CUDA path of Conv (cuda/conv.cu).

Called as ``run(backend, X=, W=, B=, strides=, pads=, dilations=, group=)`` with the kernel
class's validated Tensors (B None when absent) and resolved attributes (pads the full
begin..end list, auto_pad already applied).

Covered: X, W (and B) all float32, float16 or bfloat16, 1-D, 2-D and 3-D convolutions with
any strides, pads, dilations and groups.  Depthwise convolutions (one input channel per
group) run a direct kernel; everything else an implicit GEMM that gathers the im2col tile
of each block straight from X (no im2col buffer): exact float32 FMAs for float32 by default,
tensor cores with float32 accumulation for float16/bfloat16 -- and for float32 when the
context option ``allow_tf32`` is set (``backend.allow_tf32``): TF32 products, inputs rounded
to 10 mantissa bits (to nearest), so about 1e-3 relative error for long reductions.
Results are rounded once to the output type.  Not covered (returns None; the class runs its array code on the GPU):
double, more than 3 spatial dims, more than 65535 (group x channel tiles).
"""

from __future__ import annotations

import threading

import numpy as np

from ..dtypes import DataType
from ..errors import CudaKernelError
from ..tensor import Tensor
from . import accelerated
from .launch import CudaSource, Lazy, backend_for, ceil_div, describe_arrays, i32, i64

SOURCE = "conv.cu"
CTYPES = {DataType.FLOAT: "float", DataType.FLOAT16: "__half", DataType.BFLOAT16: "__nv_bfloat16"}
BN = 128  # output pixels per block of the GEMM kernels


def expressions() -> list[str]:
    out = [f"gk_conv_simt<{bm}>" for bm in (64, 128)]
    out += [f"gk_conv_tc<{ct}, {bm}, {pw}>" for ct in ("__half", "__nv_bfloat16", "float")  # float: TF32
            for bm in (64, 128) for pw in ("false", "true")]
    out += [f"gk_conv_direct<{ct}>" for ct in CTYPES.values()]
    return out


CUDA_SOURCES = [CudaSource(SOURCE, expressions, no_spill=("gk_conv_",))]

_tables: dict = {}
_tables_lock = threading.Lock()


def reduction_table(Cg: int, K: tuple, dil: tuple) -> np.ndarray:
    """(Kg, 4) int32: for each reduction index kk = ((c * KD + kd) * KH + kh) * KW + kw,
    (c, kd * dil_d, kh * dil_h, kw * dil_w)."""
    KD, KH, KW = K
    c, kd, kh, kw = np.meshgrid(np.arange(Cg), np.arange(KD), np.arange(KH), np.arange(KW), indexing="ij")
    tab = np.stack([c, kd * dil[0], kh * dil[1], kw * dil[2]], axis=-1).reshape(-1, 4)
    return np.ascontiguousarray(tab.astype(np.int32))


def _device_table(backend, Cg, K, dil):
    key = (id(backend), getattr(backend, "device", None), Cg, K, dil)
    with _tables_lock:
        tab = _tables.get(key)
        if tab is None:
            host = reduction_table(Cg, K, dil)
            tab = backend.upload(host)
            if len(_tables) > 256:
                _tables.clear()
            _tables[key] = tab
    return tab


def _pad3(values, fill, n_sp):
    return (fill,) * (3 - n_sp) + tuple(int(v) for v in values)


def run(backend, *, X: Tensor, W: Tensor, B=None, strides, pads, dilations, group=1):
    dt = DataType(int(X.data_type))
    if dt not in CTYPES or W.data_type != dt:
        return None
    has_bias = B is not None and not (isinstance(B, Tensor) and B.is_absent)
    if has_bias and B.data_type != dt:
        return None
    n_sp = X.ndim - 2
    if n_sp < 1 or n_sp > 3 or W.ndim != X.ndim:
        return None
    N, C = int(X.shape[0]), int(X.shape[1])
    M, Cg = int(W.shape[0]), int(W.shape[1])
    group = int(group)
    if group < 1 or Cg * group != C or M % group:
        raise CudaKernelError(f"Conv: channels do not match groups ({describe_arrays(X=X.array, W=W.array)}, "
                              f"group={group})")
    Mg = M // group
    if has_bias and tuple(B.shape) != (M,):
        raise CudaKernelError(f"Conv: B must have shape ({M},), got {list(B.shape)}")
    if len(strides) != n_sp or len(dilations) != n_sp or len(pads) != 2 * n_sp or \
            min(list(strides) + list(dilations)) < 1 or min(pads) < 0:
        raise CudaKernelError(f"Conv: bad strides {list(strides)} / dilations {list(dilations)} / pads {list(pads)} "
                              f"for {n_sp} spatial dims")
    S = _pad3(X.shape[2:], 1, n_sp)
    K = _pad3(W.shape[2:], 1, n_sp)
    st = _pad3(strides, 1, n_sp)
    dil = _pad3(dilations, 1, n_sp)
    pb = _pad3(pads[:n_sp], 0, n_sp)
    pe = _pad3(pads[n_sp:], 0, n_sp)
    O = tuple((S[i] + pb[i] + pe[i] - dil[i] * (K[i] - 1) - 1) // st[i] + 1 for i in range(3))
    if min(O) < 0:
        raise CudaKernelError(f"Conv: negative output size {O[3 - n_sp:]}")
    out_shape = (N, M) + O[3 - n_sp:]
    storage = backend.dtype_for(dt)
    y = backend.empty(out_shape, storage)
    what = Lazy(lambda: f"Conv ({describe_arrays(X=X.array, W=W.array)}, strides={list(strides)}, "
                        f"pads={list(pads)}, dilations={list(dilations)}, group={group})")
    opix = O[0] * O[1] * O[2]
    npix = N * opix
    if npix == 0 or M == 0:
        return Tensor.wrap(y, dt)
    Kg = Cg * K[0] * K[1] * K[2]
    for name, val in (("channels", C), ("output channels", M), ("reduction length", Kg),
                      *(("input size", s) for s in S), *(("output size", o) for o in O),
                      ("output plane", O[1] * O[2])):
        if val >= 2**31:
            raise CudaKernelError(f"{what}: {name} {val} exceeds the kernel's 32-bit range")
    x = backend.device_array(X.array)
    w = backend.device_array(W.array)
    b = backend.device_array(B.array) if has_bias else None
    if Kg == 0:  # no input channels: the output is the bias (or zero)
        y[...] = 0
        if has_bias:
            y[...] = b.reshape((1, M) + (1,) * n_sp)
        return Tensor.wrap(y, dt)

    if Cg == 1 and group > 1:
        fn = backend.function(SOURCE, f"gk_conv_direct<{CTYPES[dt]}>")
        total = y.size
        grid = min(ceil_div(total, 256), 65536 * 4)
        backend.launch(fn, (grid,), (256,),
                       (x, w, b, y, i32(C), *(i32(s) for s in S), i32(M), i32(Mg), *(i32(o) for o in O),
                        *(i32(k) for k in K), *(i32(s) for s in st), *(i32(p) for p in pb), *(i32(d) for d in dil),
                        i64(total)), 0, what=what)
        return Tensor.wrap(y, dt)

    bm = 64 if Mg <= 64 else 128
    mtiles = ceil_div(Mg, bm)
    grid = (ceil_div(npix, BN), group * mtiles)
    if grid[1] > 65535 or grid[0] >= 2**31:
        return None
    tab = _device_table(backend, Cg, K, dil)
    scalars = (i32(C), *(i32(s) for s in S), i32(M), i32(Mg), i32(Cg), i32(Kg), *(i32(o) for o in O),
               *(i32(s) for s in st), *(i32(p) for p in pb), i64(npix), i32(mtiles))
    if dt == DataType.FLOAT and not backend.allow_tf32:  # exact float32 unless TF32 is allowed
        fn = backend.function(SOURCE, f"gk_conv_simt<{bm}>")
        args = (x, w, b, tab, y) + scalars
    else:
        chunk = 16 // np.dtype(storage).itemsize  # elements per 16-byte load
        vec_ok = int(Kg % chunk == 0 and backend.pointer(w) % 16 == 0)
        pointwise = K == (1, 1, 1) and st == (1, 1, 1) and pb == (0, 0, 0) and pe == (0, 0, 0) and \
            opix % chunk == 0 and backend.pointer(x) % 16 == 0
        fn = backend.function(SOURCE, f"gk_conv_tc<{CTYPES[dt]}, {bm}, {'true' if pointwise else 'false'}>")
        args = (x, w, b, tab, y) + scalars + (i32(vec_ok),)
    backend.launch(fn, grid, (256,), args, 0, what=what)
    return Tensor.wrap(y, dt)


@accelerated.register("Conv")
def conv_cuda(kernel, **arguments):
    return run(backend_for(kernel), **arguments)
