"""RandomNormal, RandomNormalLike, RandomUniform, RandomUniformLike, Bernoulli, Multinomial.

Generators (reproducible for a given seed on a given device, not across devices):
  * CPU: numpy.random.Generator(PCG64(seed)); GPU: cupy.random.RandomState(seed).
  * With a ``seed`` attribute (a float in ONNX): the seed is int(seed) when it is a
    non-negative whole number, else the float64 bit pattern.  Each kernel instance keeps
    its own generator, created on first use, and advances it call after call (as
    onnxruntime does): a fresh instance with the same seed repeats the same sequence.
  * Without one: the context option 'seed' (an int) seeds one generator shared by every
    random kernel of that KernelContext, so a whole run is reproducible given the seed
    and the order of calls; without that option, fresh OS entropy for every call.

Half types (float16, bfloat16) are drawn in float32 and rounded once.  Uniform values
are low + (high - low) * u with u in [0, 1); normal values mean + scale * z.
Bernoulli gives 1 where u < p (so p <= 0 never, p >= 1 always, NaN never).  Multinomial
treats each input row as unnormalised log-probabilities (softmax in float64), then
inverts the cumulative distribution by a vectorised binary search.
"""

from __future__ import annotations

import weakref

import numpy as np

from ... import dtypes
from ...dtypes import DataType
from ...limits import check_allocation
from ...xp import RandomDraws
from ..base import KernelBase, register

_FLOATS_1 = (DataType.FLOAT16, DataType.FLOAT, DataType.DOUBLE)
_FLOATS_22 = _FLOATS_1 + (DataType.BFLOAT16,)

_shared: dict[int, tuple] = {}  # id(KernelContext) -> (weakref to it, generator)


def _seed_key(seed) -> int:
    s = float(seed)
    if s.is_integer() and 0 <= s < 2.0 ** 63:
        return int(s)
    return int(np.array(s, dtype=np.float64).view(np.uint64))


_Draws = RandomDraws  # one seeded generator per device kind (gpukernels.xp)


class _Random(KernelBase):
    foldable = False  # every run draws anew
    def draws(self, seed) -> _Draws:
        xp = self.xp
        if seed is not None:
            d = getattr(self, "_draws", None)
            if d is None or self._draws_seed != seed:
                d = _Draws(xp, _seed_key(seed))
                self._draws, self._draws_seed = d, seed
            return d
        ctx_seed = self.ctx.option("seed")
        if ctx_seed is None:
            return _Draws(xp, None)
        key = id(self.ctx)
        entry = _shared.get(key)
        if entry is None or entry[0]() is not self.ctx or entry[2] != (ctx_seed, str(self.device)):
            ref = weakref.ref(self.ctx, lambda _r, k=key: _shared.pop(k, None))
            entry = (ref, _Draws(xp, int(ctx_seed)), (ctx_seed, str(self.device)))
            _shared[key] = entry
        return entry[1]

    def float_type(self, dtype, default, **inputs):
        allowed = _FLOATS_22 if self.since_version >= 22 else _FLOATS_1
        dt = DataType(int(dtype)) if dtype is not None else default
        if dt not in allowed:
            raise self.type_error(f"output type {dtypes.describe(dt)} is not allowed (allowed: "
                                  f"{', '.join(dtypes.describe(a) for a in allowed)})", **inputs)
        return dt

    @staticmethod
    def shape_of(kernel, shape):
        if shape is None:
            raise kernel.error("attribute 'shape' is required")
        dims = [int(d) for d in shape]
        if any(d < 0 for d in dims):
            raise kernel.error(f"negative dimension in shape {dims}")
        return tuple(dims)

    def uniform_tensor(self, shape, out_type, low, high, seed):
        ctype = dtypes.info(out_type).compute
        check_allocation(self, shape, ctype)
        u = self.draws(seed).uniform(shape, ctype)
        u *= ctype.type(high - low)
        u += ctype.type(low)
        return self.from_compute(u, out_type)

    def normal_tensor(self, shape, out_type, mean, scale, seed):
        ctype = dtypes.info(out_type).compute
        check_allocation(self, shape, ctype)
        z = self.draws(seed).normal(shape, ctype)
        z *= ctype.type(scale)
        z += ctype.type(mean)
        return self.from_compute(z, out_type)


@register()
class RandomUniform(_Random):
    def __call__(self, dtype=1, high=1.0, low=0.0, seed=None, shape=None):
        out_type = self.float_type(dtype, DataType.FLOAT)
        return self.uniform_tensor(self.shape_of(self, shape), out_type, low, high, seed)


@register()
class RandomNormal(_Random):
    def __call__(self, dtype=1, mean=0.0, scale=1.0, seed=None, shape=None):
        out_type = self.float_type(dtype, DataType.FLOAT)
        return self.normal_tensor(self.shape_of(self, shape), out_type, mean, scale, seed)


@register()
class RandomUniformLike(_Random):
    def __call__(self, input, dtype=None, high=1.0, low=0.0, seed=None):
        x = self.tensor(input, "input")
        self.check_inputs(x)
        out_type = self.float_type(dtype, x.data_type, input=x)
        return self.uniform_tensor(x.shape, out_type, low, high, seed)


@register()
class RandomNormalLike(_Random):
    def __call__(self, input, dtype=None, mean=0.0, scale=1.0, seed=None):
        x = self.tensor(input, "input")
        self.check_inputs(x)
        out_type = self.float_type(dtype, x.data_type, input=x)
        return self.normal_tensor(x.shape, out_type, mean, scale, seed)


_BERNOULLI_OUT = frozenset({
    DataType.FLOAT16, DataType.FLOAT, DataType.DOUBLE, DataType.BFLOAT16, DataType.UINT8,
    DataType.UINT16, DataType.UINT32, DataType.UINT64, DataType.INT8, DataType.INT16,
    DataType.INT32, DataType.INT64, DataType.BOOL})


@register()
class Bernoulli(_Random):
    def __call__(self, input, dtype=None, seed=None):
        p = self.tensor(input, "input")
        self.check_inputs(p)
        out_type = DataType(int(dtype)) if dtype is not None else p.data_type
        if out_type not in _BERNOULLI_OUT:
            raise self.type_error(f"output type {dtypes.describe(out_type)} is not allowed", input=p)
        pc = self.to_compute(p)
        u = self.draws(seed).uniform(p.shape, np.float64 if pc.dtype == np.float64 else np.float32)
        hit = u < pc
        info = dtypes.info(out_type)
        return self.from_compute(hit.astype(info.compute), out_type)


@register()
class Multinomial(_Random):
    def __call__(self, input, dtype=6, sample_size=1, seed=None):
        x = self.tensor(input, "input")
        self.check_inputs(x)
        if x.ndim != 2:
            raise self.error("input must be 2-D [batch_size, class_size]", input=x)
        out_type = DataType(int(dtype))
        if out_type not in (DataType.INT32, DataType.INT64):
            raise self.type_error(f"dtype must be int32 or int64, got {dtypes.describe(out_type)}",
                                  input=x)
        if int(sample_size) < 0:
            raise self.error(f"sample_size must be non-negative, got {sample_size}", input=x)
        batch, classes = x.shape
        xp = self.xp
        samples = int(sample_size)
        # the draws and the search bounds are (batch, sample_size) float64/int64 arrays
        check_allocation(self, (batch, samples), 8)
        if batch == 0 or samples == 0:
            return self.result(xp.zeros((batch, samples), dtype=dtypes.info(out_type).numpy), out_type)
        if classes == 0:
            raise self.error("class_size must be positive", input=x)
        logits = self.to_compute(x).astype(np.float64)
        with np.errstate(all="ignore"):
            m = xp.max(logits, axis=1, keepdims=True)
            w = xp.exp(logits - m)
            cdf = xp.cumsum(w, axis=1)
            total = cdf[:, -1:]
            if not bool(xp.all(xp.isfinite(total) & (total > 0))):
                raise self.error("every row needs a finite, non-empty distribution "
                                 "(finite log-probabilities, not all -inf)", input=x)
            cdf = cdf / total
        u = self.draws(seed).uniform((batch, samples), np.float64)
        # vectorised binary search: count of cdf entries <= u in each row
        lo = xp.zeros((batch, samples), dtype=np.int64)
        hi = xp.full((batch, samples), classes, dtype=np.int64)
        for _ in range(int(classes).bit_length() + 1):
            active = lo < hi
            mid = (lo + hi) // 2
            midc = xp.minimum(mid, classes - 1)
            go = xp.take_along_axis(cdf, midc, axis=1) <= u
            lo = xp.where(active & go, mid + 1, lo)
            hi = xp.where(active & ~go, mid, hi)
        idx = xp.minimum(lo, classes - 1)
        return self.result(idx.astype(dtypes.info(out_type).numpy), out_type)
