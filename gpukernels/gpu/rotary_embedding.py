"""CUDA path of RotaryEmbedding (cuda/rotary_embedding.cu).

Called as ``run(backend, X=, cos_cache=, sin_cache=, position_ids=, interleaved=,
num_heads=, rotary_embedding_dim=)`` with the kernel class's validated Tensors
(position_ids possibly absent) and resolved attributes: num_heads is the head count H
(also for rank-4 X) and rotary_embedding_dim the rotated width rd (head size when the
attribute was 0).  Covers every case the operator allows; returns the output Tensor.
"""

from __future__ import annotations

import numpy as np

from .. import dtypes
from ..dtypes import DataType
from ..errors import CudaKernelError
from ..tensor import Tensor
from . import accelerated
from .launch import CudaSource, Lazy, backend_for, ceil_div, describe_arrays, i32, i64

SOURCE = "rotary_embedding.cu"
CTYPES = {DataType.FLOAT: "float", DataType.FLOAT16: "__half", DataType.BFLOAT16: "__nv_bfloat16"}


def _widths(itemsize: int) -> list[int]:
    """Elements per X/Y access W: one access is at most 16 bytes."""
    return [w for w in (1, 2, 4, 8) if w * itemsize <= 16]


def _pairs(width: int, interleaved: bool) -> int:
    """Pairs of one rotation unit (and cache elements per cache access) for width W."""
    return max(1, width // 2) if interleaved else width


def expressions() -> list[str]:
    out = []
    for dt, ct in CTYPES.items():
        size = dtypes.info(dt).numpy.itemsize
        for inter in (False, True):
            for w in _widths(size):
                for pos in (False, True):
                    out.append(f"gk_rotary<{ct}, {w}, {str(inter).lower()}, {str(pos).lower()}>")
    return out


CUDA_SOURCES = [CudaSource(SOURCE, expressions, no_spill=("gk_rotary",))]


def pick_width(backend, itemsize: int, interleaved: bool, half: int, D: int, xy: list, caches: list) -> int:
    """The widest access W the kernel may use: D a multiple of W, rd/2 a multiple of the
    unit's pairs, X and Y aligned to W elements, the caches to the unit's pairs.  W = 1
    (scalar accesses) always qualifies."""
    for w in sorted(_widths(itemsize), reverse=True):
        pairs = _pairs(w, interleaved)
        if D % w or half % pairs:
            continue
        if all(backend.pointer(a) % (w * itemsize) == 0 for a in xy) and \
                all(backend.pointer(a) % (pairs * itemsize) == 0 for a in caches):
            return w
    return 1


def run(backend, *, X: Tensor, cos_cache: Tensor, sin_cache: Tensor, position_ids=None, interleaved=0,
        num_heads=None, rotary_embedding_dim=0):
    dt = DataType(int(X.data_type))
    if dt not in CTYPES:
        return None
    if cos_cache.data_type != dt or sin_cache.data_type != dt:
        return None
    has_pos = position_ids is not None and not (isinstance(position_ids, Tensor) and position_ids.is_absent)
    xs = tuple(X.shape)
    if len(xs) == 4:
        B, H, S, D = xs
        s_div = 1
    elif len(xs) == 3:
        B, S, hidden = xs
        H = int(num_heads or 0)
        if H <= 0 or hidden % H:
            raise CudaKernelError(f"RotaryEmbedding: hidden size {hidden} is not a multiple of num_heads={H}")
        D = hidden // H
        s_div = H
    else:
        raise CudaKernelError(f"RotaryEmbedding: X must be rank 3 or 4, got {xs}")
    rd = int(rotary_embedding_dim or 0) or D
    if rd < 0 or rd > D or rd % 2:
        raise CudaKernelError(f"RotaryEmbedding: rotary_embedding_dim={rd} with head size {D}")
    half = rd // 2
    # the shapes the kernel indexes by: checked again here, the launch relies on them
    if has_pos:
        if tuple(position_ids.shape) != (B, S) or position_ids.data_type != DataType.INT64:
            raise CudaKernelError(f"RotaryEmbedding: position_ids must be int64 ({B}, {S}), got "
                                  f"{describe_arrays(position_ids=position_ids.array)}")
        if cos_cache.ndim != 2 or tuple(cos_cache.shape)[1] != half:
            raise CudaKernelError(f"RotaryEmbedding: caches must be (max_position, {half})")
        max_pos = cos_cache.shape[0]
    else:
        if tuple(cos_cache.shape) != (B, S, half):
            raise CudaKernelError(f"RotaryEmbedding: caches must be ({B}, {S}, {half})")
        max_pos = B * S
    if tuple(sin_cache.shape) != tuple(cos_cache.shape):
        raise CudaKernelError("RotaryEmbedding: cos_cache and sin_cache shapes differ")

    out = backend.empty(xs, backend.dtype_for(dt))
    rows = B * H * S
    if rows == 0 or D == 0:
        return Tensor.wrap(out, dt)
    x = backend.device_array(X.array)
    c = backend.device_array(cos_cache.array)
    s = backend.device_array(sin_cache.array)
    if has_pos:
        p = backend.device_array(position_ids.array)
    else:
        p = None
    itemsize = np.dtype(x.dtype).itemsize
    width = pick_width(backend, itemsize, bool(interleaved), half, D, [x, out], [c, s])
    units = half // _pairs(width, bool(interleaved)) + (D - rd) // width
    tx = 1
    while tx < min(units, 32):
        tx *= 2
    ty = max(1, 256 // tx)
    grid = (ceil_div(rows, ty),)
    expr = f"gk_rotary<{CTYPES[dt]}, {width}, {str(bool(interleaved)).lower()}, {str(has_pos).lower()}>"
    fn = backend.function(SOURCE, expr)
    what = Lazy(lambda: f"RotaryEmbedding ({describe_arrays(X=x, cos_cache=c, position_ids=p)}, rd={rd}, "
                        f"interleaved={int(bool(interleaved))})")
    backend.launch(fn, grid, (tx, ty), (x, c, s, p, out, i64(rows), i32(D), i32(rd), i32(H), i32(S), i32(s_div),
                                        i64(max_pos)), 0, what=what)
    return Tensor.wrap(out, dt)


@accelerated.register("RotaryEmbedding")
def rotary_embedding_cuda(kernel, **arguments):
    return run(backend_for(kernel), **arguments)
