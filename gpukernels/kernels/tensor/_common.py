"""Helpers shared by the tensor-family kernels (shape, indexing, casting, resampling)."""

from __future__ import annotations

import functools

import numpy as np
import onnx

from ... import dtypes
from ...dtypes import DataType
from ...host import tuning
from ...tensor import Tensor
from ...xp import in_namespace, is_cupy_array, to_host
from ...host import host_empty, parallel_ranges
from ..specialize import specialize


def host_ints(kernel, t: Tensor, name: str) -> list[int]:
    """The values of a small integer tensor (shape, axes, pads...) as Python ints."""
    if t.is_absent:
        return []
    info = dtypes.info(t.data_type)
    if not info.is_integer:
        raise kernel.type_error(f"input '{name}' must be an integer tensor", **{name: t})
    return [int(v) for v in np.asarray(to_host(t.array)).reshape(-1)]


def host_floats(kernel, t: Tensor, name: str) -> list[float]:
    if t.is_absent:
        return []
    arr = t.numpy()
    return [float(v) for v in np.asarray(arr, dtype=np.float64).reshape(-1)]


def norm_axis(kernel, axis: int, rank: int, what: str = "axis", **inputs) -> int:
    """axis in [-rank, rank) -> [0, rank); raises naming the op otherwise."""
    axis = int(axis)
    if not -rank <= axis < rank:
        raise kernel.error(f"{what} {axis} is out of range for rank {rank}", **inputs)
    return axis + rank if axis < 0 else axis


def norm_axes(kernel, axes, rank: int, what: str = "axes", **inputs) -> list[int]:
    out = [norm_axis(kernel, a, rank, what, **inputs) for a in axes]
    if len(set(out)) != len(out):
        raise kernel.error(f"{what} {list(axes)} repeat an axis", **inputs)
    return out


def xp_for(kernel, t: Tensor):
    """numpy for STRING tensors (host only), the kernel's namespace otherwise."""
    return np if t.data_type == DataType.STRING else kernel.xp


def wrap_like(kernel, array, t: Tensor) -> Tensor:
    """Wrap an array holding elements of t's type (storage dtype) as a Tensor."""
    return Tensor.wrap(array, t.data_type)


def deliver(kernel, result: Tensor, out) -> Tensor:
    """Copy result into a caller's buffer ``out`` (a Tensor or an array of the output's
    storage dtype and shape) and return it as a Tensor; result itself when out is None."""
    if out is None:
        return result
    target = out.array if isinstance(out, Tensor) else out
    if isinstance(out, Tensor) and out.data_type != result.data_type:
        raise kernel.type_error(f"out= has element type {dtypes.describe(out.data_type)}, the result is "
                                f"{dtypes.describe(result.data_type)}", out=out)
    if tuple(target.shape) != tuple(result.shape):
        raise kernel.error(f"out= has shape {list(target.shape)}, the result has {list(result.shape)}",
                           out=out)
    if is_cupy_array(target) != is_cupy_array(result.array):
        raise kernel.error("out= lives on another device than the kernel", out=out)
    src = result.array
    if target.dtype != src.dtype:
        if target.dtype.itemsize == src.dtype.itemsize and result.data_type != DataType.STRING:
            src = src.view(target.dtype)
        else:
            raise kernel.type_error(f"out= has dtype {target.dtype}, the result needs {src.dtype}", out=out)
    xp = kernel.xp if is_cupy_array(target) else np
    xp.copyto(target, src)
    return out if isinstance(out, Tensor) else Tensor.wrap(target, result.data_type)


@functools.lru_cache(maxsize=None)
def schema_type_param(op_type: str, version: int, param: str) -> frozenset:
    """DataTypes a schema's type parameter allows (for output-type attributes like
    Cast's 'to')."""
    schema = onnx.defs.get_schema(op_type, version, "")
    for c in schema.type_constraints:
        if c.type_param_str == param:
            out = set()
            for s in c.allowed_type_strs:
                try:
                    out.add(dtypes.info(s).data_type)
                except TypeError:
                    pass
            return frozenset(out)
    return frozenset()


def product(shape) -> int:
    p = 1
    for d in shape:
        p *= int(d)
    return p


def on(xp, array):
    """array in namespace xp (host copy for numpy, device copy for cupy)."""
    return in_namespace(xp, array)


def permuted_copy(kernel, xp, view):
    """A C-contiguous copy of ``view`` (typically a transposed view) in namespace xp."""
    fast = kernel.specialized("Transpose.copy", view)
    if fast is not None:
        return fast(view)
    return xp.ascontiguousarray(view)


def permuted_copier(kernel, xp, shape, dtype, perm):
    """data -> permuted_copy(kernel, xp, data.transpose(perm)) for inputs of this shape and
    dtype (array functions).  Where no specialisation applies to a C-contiguous input of
    the shape (the usual small transposes), the plain copy is bound once instead of
    looked up on every call: a planned choice, which keeps the tuning values it was
    planned with (an input of other strides still gets a correct copy)."""
    dtype = np.dtype(dtype)
    strides, step = [], dtype.itemsize
    for d in reversed(shape):
        strides.append(step)
        step *= max(1, int(d))
    # a C-contiguous stand-in of the shape, never read (recorded inputs may be stand-ins
    # without real strides)
    probe = np.lib.stride_tricks.as_strided(np.empty(1, dtype), tuple(shape), tuple(reversed(strides)),
                                            writeable=False)
    if kernel.specialized("Transpose.copy", probe.transpose(perm)) is None:
        return lambda data: xp.ascontiguousarray(data.transpose(perm))
    return lambda data: permuted_copy(kernel, xp, data.transpose(perm))


def _tiles_pay(view) -> bool:
    return (view.ndim >= 2 and not view.flags.c_contiguous and abs(view.strides[-1]) >= 128
            and view.shape[-1] >= 2 * tuning.value("transpose.tile")
            and view.size >= tuning.value("transpose.tiled_min_elems"))


@specialize("Transpose.copy", device="cpu", ops=("Transpose", "GridSample"), when=_tiles_pay)
def _permuted_copy_host(view):
    """permuted_copy on the host when the output's last axis reads the input with a large
    stride: the copy runs in slices of transpose.tile (host/tuning.py) along that axis,
    so that each pass reuses the input cache lines it touches for the next output rows
    instead of evicting them (several times faster for big 2-D-like transposes), over the
    host threads."""
    n = view.shape[-1]
    out = host_empty(view.shape, view.dtype)
    tile = tuning.value("transpose.tile")

    def rows(lo, hi):  # output rows [lo, hi) of axis 0, tile by tile
        for a in range(0, n, tile):
            np.copyto(out[lo:hi, ..., a:a + tile], view[lo:hi, ..., a:a + tile])

    # several host threads when each gets enough elements (a copy of a few ms)
    parallel_ranges(view.shape[0], -(-tuning.value("transpose.thread_elems") // max(1, view[0].size)), rows)
    return out
