"""Shared helpers of the convolution and pooling kernels.

Attribute normalisation (kernel_shape, strides, dilations, pads, auto_pad), output-size
arithmetic, zero/constant padding of a sub-window, strided window views that work on
NumPy and CuPy alike, and the workspace budget.

Workspace: every im2col-like buffer is built per chunk so that no chunk exceeds the
tuning entry ``spatial.workspace_bytes`` (256 MiB; cache-sized ``spatial.host_chunk_bytes``
on the host, see gpukernels/host/tuning.py).  Chunks run over the batch first and, when a single image
is too large, over the first output spatial axis (rows).
"""

from __future__ import annotations

import math

import numpy as np

from ...host import tuning
from ...xp import is_host_namespace


def workspace_bytes() -> int:
    """The largest im2col-like work buffer of one chunk (tuning: spatial.workspace_bytes)."""
    return tuning.value("spatial.workspace_bytes")


def chunk_target(xp) -> int:
    """Bytes per im2col-like work chunk in namespace xp: cache-sized on the host (the copy
    and the product that reads it stay in cache), the whole workspace on a GPU."""
    if is_host_namespace(xp):
        return min(workspace_bytes(), tuning.value("spatial.host_chunk_bytes"))
    return workspace_bytes()


AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


def as_strided(xp, a, shape, strides):
    """A strided view of a (numpy.lib.stride_tricks.as_strided / cupy's twin)."""
    return xp.lib.stride_tricks.as_strided(a, shape=tuple(shape), strides=tuple(strides))


def prod(values) -> int:
    return int(math.prod(int(v) for v in values))


def auto_pad_name(kernel, auto_pad, **tensors) -> str:
    if isinstance(auto_pad, bytes):
        auto_pad = auto_pad.decode()
    name = str(auto_pad or "NOTSET").upper()
    if name not in AUTO_PADS:
        raise kernel.error(f"unknown auto_pad {auto_pad!r}; expected one of {', '.join(AUTO_PADS)}",
                           **tensors)
    return name


def int_list(kernel, name, value, n, default, minimum=None, **tensors):
    """value (a list of n ints) or [default]*n; checks length and lower bound."""
    if value is None or (isinstance(value, (list, tuple)) and len(value) == 0 and n > 0):
        return [default] * n
    try:
        out = [int(v) for v in value]
    except TypeError:
        raise kernel.error(f"attribute '{name}' must be a list of ints, got {value!r}", **tensors) from None
    if len(out) != n:
        raise kernel.error(f"attribute '{name}' has {len(out)} values; {n} expected "
                           f"for {n} spatial axes", **tensors)
    if minimum is not None and any(v < minimum for v in out):
        raise kernel.error(f"attribute '{name}' values must be >= {minimum}, got {out}", **tensors)
    return out


def explicit_pads(kernel, pads, n, **tensors):
    """[begin..., end...] from the pads attribute (zeros when absent)."""
    if pads is None or (isinstance(pads, (list, tuple)) and len(pads) == 0):
        return [0] * (2 * n)
    out = [int(p) for p in pads]
    if len(out) != 2 * n:
        raise kernel.error(f"attribute 'pads' has {len(out)} values; {2 * n} expected "
                           f"(begin and end for {n} spatial axes)", **tensors)
    if any(p < 0 for p in out):
        raise kernel.error(f"attribute 'pads' values must be >= 0, got {out}", **tensors)
    return out


def resolve_pads(kernel, auto_pad, pads, in_shape, kernel_shape, strides, dilations, **tensors):
    """Begin..end pads after auto_pad resolution (Conv and pooling rules).

    SAME_*: the output size is ceil(in / stride) and the total padding
    max(0, (out - 1) * stride + (k - 1) * dilation + 1 - in) is split evenly; the odd
    pixel goes to the end (SAME_UPPER) or the beginning (SAME_LOWER).  VALID: no padding.
    Explicit pads together with an auto_pad other than NOTSET are an error unless all
    zero (some exporters write both)."""
    n = len(in_shape)
    mode = auto_pad_name(kernel, auto_pad, **tensors)
    given = explicit_pads(kernel, pads, n, **tensors)
    if mode == "NOTSET":
        return given
    if any(given):
        raise kernel.error(f"attribute 'pads' {given} cannot be combined with auto_pad={mode}", **tensors)
    if mode == "VALID":
        return [0] * (2 * n)
    begin, end = [], []
    for size, k, s, d in zip(in_shape, kernel_shape, strides, dilations):
        out = -(-size // s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
        small = total // 2
        if mode == "SAME_UPPER":
            begin.append(small)
            end.append(total - small)
        else:
            begin.append(total - small)
            end.append(small)
    return begin + end


def conv_output_shape(kernel, in_shape, kernel_shape, strides, dilations, pads, **tensors):
    n = len(in_shape)
    out = []
    for i in range(n):
        ek = (kernel_shape[i] - 1) * dilations[i] + 1
        padded = in_shape[i] + pads[i] + pads[i + n]
        if padded < ek:
            raise kernel.error(
                f"the kernel (extent {ek} with dilation {dilations[i]}) is larger than the padded "
                f"input ({padded}) along spatial axis {i}", **tensors)
        out.append((padded - ek) // strides[i] + 1)
    _check_conv_sizes(kernel, in_shape, pads, out, tensors)
    return out


def _check_conv_sizes(kernel, in_shape, pads, out, tensors) -> None:
    """max_tensor_bytes for a Conv-style output (N, M, *out) and padded input
    (N, C, *in + pads), when the tensors passed name X and the weight (W or w): pads
    and strides are attributes, so a model can ask for any size."""
    from ...limits import check_allocation

    x = tensors.get("X")
    if x is None or getattr(x, "array", None) is None or x.ndim < 2:
        return
    n = len(in_shape)
    itemsize = max(x.array.dtype.itemsize, 4)  # computed in float32 or wider
    check_allocation(kernel, list(x.shape[:2]) + [in_shape[i] + pads[i] + pads[i + n] for i in range(n)],
                     itemsize, "padded input")
    w = next((v for k, v in tensors.items() if k in ("W", "w") and getattr(v, "ndim", 0) >= 1), None)
    if w is not None:
        check_allocation(kernel, [x.shape[0], w.shape[0]] + list(out), itemsize)


def padded_block(xp, x, lo, hi, value=0):
    """x[..., lo:hi] over the trailing len(lo) axes, where lo/hi may reach outside the
    array: the outside is filled with value.  Returns a view when nothing lies outside."""
    n = len(lo)
    lead = x.ndim - n
    spatial = x.shape[lead:]
    if all(0 <= a and b <= s for a, b, s in zip(lo, hi, spatial)):
        return x[(slice(None),) * lead + tuple(slice(a, b) for a, b in zip(lo, hi))]
    shape = x.shape[:lead] + tuple(b - a for a, b in zip(lo, hi))
    src, dst = [], []
    for a, b, s in zip(lo, hi, spatial):
        s0, s1 = max(a, 0), min(b, s)
        if s1 <= s0:
            return xp.full(shape, value, dtype=x.dtype) if value != 0 else xp.zeros(shape, dtype=x.dtype)
        src.append(slice(s0, s1))
        dst.append(slice(s0 - a, s1 - a))
    # fill only the border slabs, copy the interior once
    out = xp.empty(shape, dtype=x.dtype)
    out[(slice(None),) * lead + tuple(dst)] = x[(slice(None),) * lead + tuple(src)]
    for i in range(n):
        before = (slice(None),) * (lead + i)
        if dst[i].start > 0:
            out[before + (slice(0, dst[i].start),)] = value
        if dst[i].stop < shape[lead + i]:
            out[before + (slice(dst[i].stop, None),)] = value
    return out


def tap_slices(offsets, strides, counts):
    """Slices that pick, along each axis, counts[i] elements from offsets[i] with step
    strides[i]."""
    return tuple(slice(o, o + s * (c - 1) + 1, s) for o, s, c in zip(offsets, strides, counts))


def taps(kernel_shape):
    """Every kernel tap as an index tuple, row-major."""
    return list(np.ndindex(*[int(k) for k in kernel_shape]))


def row_chunks(total_rows: int, bytes_per_row: int, budget: int | None = None):
    """[(r0, r1), ...] covering total_rows with at most budget bytes (default: the
    workspace) per chunk (>= 1 row)."""
    step = max(1, (workspace_bytes() if budget is None else budget) // max(1, bytes_per_row))
    return [(r, min(r + step, total_rows)) for r in range(0, total_rows, step)]
