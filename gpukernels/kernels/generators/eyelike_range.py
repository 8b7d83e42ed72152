"""EyeLike and Range.

EyeLike: a 2-D tensor of the input's shape with ones on diagonal k (k > 0 above the
main diagonal, k < 0 below); type ``dtype`` or the input's.

Range: max(ceil((limit - start) / delta), 0) elements start + i * delta.  The count and
values are computed in the input type (integers exactly; float32/float64 in their own
precision); float16/bfloat16 (opset 27) in float32 when stash_type=1 (default), in the
type itself when stash_type=0.  delta = 0 raises, as does a non-scalar input.
"""

from __future__ import annotations

import math

import numpy as np

from ... import dtypes
from ...dtypes import DataType
from ...limits import check_allocation
from ...tensor import Tensor
from ..base import KernelBase, register

_EYE_TYPES = frozenset({
    DataType.UINT8, DataType.UINT16, DataType.UINT32, DataType.UINT64, DataType.INT8,
    DataType.INT16, DataType.INT32, DataType.INT64, DataType.FLOAT16, DataType.FLOAT,
    DataType.DOUBLE, DataType.BOOL})


@register()
class EyeLike(KernelBase):
    def __call__(self, input, dtype=None, k=0):
        x = self.tensor(input, "input")
        self.check_inputs(x)
        if x.ndim != 2:
            raise self.error("input must be 2-D", input=x)
        out_type = DataType(int(dtype)) if dtype is not None else x.data_type
        allowed = set(_EYE_TYPES) | ({DataType.BFLOAT16} if self.since_version >= 22 else set())
        if out_type not in allowed:
            raise self.type_error(f"output type {dtypes.describe(out_type)} is not allowed", input=x)
        info = dtypes.info(out_type)
        rows, cols = x.shape
        check_allocation(self, (rows, cols), info.compute)
        eye = self.xp.eye(rows, cols, k=int(k), dtype=info.compute)
        return self.from_compute(eye, out_type)


@register()
class Range(KernelBase):
    def __call__(self, start, limit, delta, stash_type=1):
        ts = [self.tensor(v, n) for v, n in ((start, "start"), (limit, "limit"), (delta, "delta"))]
        self.check_inputs(*ts)
        named = dict(zip(("start", "limit", "delta"), ts))
        for name, t in named.items():
            if t.size != 1 or t.ndim > 1:
                raise self.error(f"input '{name}' must be a scalar", **named)
        data_type = ts[0].data_type
        info = dtypes.info(data_type)
        if info.kind == "float" and info.bits < 32:
            ctype = np.dtype(np.float32) if stash_type == 1 else info.numpy
        else:
            ctype = info.numpy
        s, l, d = (np.asarray(t.numpy()).reshape(-1)[0].astype(ctype) for t in ts)
        if d == 0:
            raise self.error("delta must not be zero", **named)
        if info.kind == "float":
            with np.errstate(all="ignore"):
                q = (l - s) / d
            if not np.isfinite(q):
                raise self.error("the range has no finite length", **named)
            n = max(int(math.ceil(float(q))), 0)
        else:
            si, li, di = int(s), int(l), int(d)
            n = max(-((si - li) // di), 0)  # ceil((l - s) / d) exactly
        # the element count the inputs ask for; integer and stash_type=0 exotic ranges
        # are built from an int64 arange
        check_allocation(self, (n,), ctype.itemsize if info.kind == "float" and not
                         (ctype != np.float32 and info.is_exotic) else max(8, ctype.itemsize))
        xp = self.xp
        if info.kind == "float" and ctype != np.float32 and info.is_exotic:
            # stash_type=0 on bfloat16: arithmetic in the type itself, on the host
            i = np.arange(n).astype(ctype)
            out = i * ctype.type(d) + ctype.type(s)
            return Tensor(np.asarray(out, dtype=ctype), data_type).to(self.device)
        if info.kind == "float":
            i = xp.arange(n, dtype=ctype)
            out = (i * ctype.type(d) + ctype.type(s)) if n else xp.zeros(0, dtype=ctype)
            out = out.astype(ctype, copy=False)
            return self.from_compute(out, data_type)
        out = xp.arange(n, dtype=np.int64) * np.int64(int(d)) + np.int64(int(s))
        return self.result(out.astype(info.numpy), data_type)
