"""Normalization fusions of onnxruntime: SkipLayerNormalization,
SkipSimplifiedLayerNormalization, EmbedLayerNormalization (com.microsoft), and
SimplifiedLayerNormalization and the opset-1 LayerNormalization, which onnxruntime
defines in the ONNX domain (models below opset 17 use them).

The sums (input + skip + bias, the embeddings) are formed in the compute type (float32
for half types) and normalised without rounding; the normalisation is the ONNX
LayerNormalization / RMSNormalization kernel.  The float outputs are rounded once into
the output type; mean and inv_std_var are float32 with the normalised axes kept as 1
(as onnxruntime gives them).  SkipSimplifiedLayerNormalization has no mean: its mean
output is zeros.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ...dtypes import DataType
from ...tensor import Tensor
from ..base import register
from ..nn.norm import LayerNormalization as _OnnxLayerNormalization
from ..nn.norm import RMSNormalization as _OnnxRMSNormalization
from ._common import DOMAIN, FLOATS, FLOATS_DOUBLE, ContribKernel, compute_dtype


class _SkipResult(NamedTuple):
    output: Tensor
    mean: Tensor | None = None
    inv_std_var: Tensor | None = None
    input_skip_bias_sum: Tensor | None = None


class _SkipNorm(ContribKernel):
    """input + skip (+ bias), normalised over the last axis."""

    Result = _SkipResult

    def _sum(self, x, skip, gamma, others, bias):
        """Checks shapes; returns the sum as a compute array and the hidden size."""
        shapes = dict(input=x, skip=skip, gamma=gamma, bias=bias, **others)
        if x.ndim not in (2, 3):
            raise self.error(f"input must be 2-D (tokens, hidden) or 3-D (batch, seq, hidden), got rank {x.ndim}",
                             **shapes)
        hidden = x.shape[-1]
        if not (2 <= skip.ndim <= x.ndim and skip.shape[-1] == hidden
                and all(d in (1, xd) for d, xd in zip(reversed(skip.shape[:-1]), reversed(x.shape[:-1])))):
            raise self.error(f"skip must have input's shape {list(x.shape)} or broadcast to it along the "
                             f"leading axes ((1, seq, hidden) or (seq, hidden)), got {list(skip.shape)}", **shapes)
        self.vector(gamma, "gamma", hidden, input=x)
        for name, t in (("bias", bias), *others.items()):
            if not t.is_absent:
                self.vector(t, name, hidden, input=x)
        total = self.to_compute(x) + self.to_compute(skip)
        if not bias.is_absent:
            total += self.to_compute(bias)
        return total, hidden

    def _outputs(self, x, y, mean, inv, total) -> _SkipResult:
        out = self.from_compute(y, x.data_type)
        mean_t = self.from_compute(mean, DataType.FLOAT) if self.wants_output(1) else None
        inv_t = self.from_compute(inv, DataType.FLOAT) if self.wants_output(2) else None
        sum_t = self.from_compute(total, x.data_type) if self.wants_output(3) else None
        return _SkipResult(out, mean_t, inv_t, sum_t)


@register(domain=DOMAIN, versions=(1,))
class SkipLayerNormalization(_SkipNorm):
    """output = LayerNorm(input + skip + bias) * gamma + beta over the last axis.
    input is (batch, seq, hidden) or (tokens, hidden); skip has input's shape or
    (1, seq, hidden) / (seq, hidden); gamma, beta and bias are (hidden,).  Outputs: output,
    mean, inv_std_var ((..., 1) float32) and input_skip_bias_sum (input's type)."""

    max_inputs = 5

    def __call__(self, input, skip, gamma, beta=None, bias=None, *more, epsilon=1e-12, **unknown):
        self.check_signature(more, unknown)
        x = self.tensor(input, "input")
        s = self.tensor(skip, "skip")
        g = self.tensor(gamma, "gamma")
        b = self.tensor(beta, "beta", optional=True)
        bi = self.tensor(bias, "bias", optional=True)
        self.floats(FLOATS, input=x, skip=s, gamma=g, beta=b, bias=bi)
        total, _ = self._sum(x, s, g, {"beta": b}, bi)
        ln = self.sub(_OnnxLayerNormalization, 17)(
            Tensor.wrap(total, DataType.FLOAT), self.compute_tensor(g),
            None if b.is_absent else self.compute_tensor(b), axis=-1, epsilon=float(epsilon))
        return self._outputs(x, ln.Y.array, ln.Mean.array, ln.InvStdDev.array, total)


@register(domain=DOMAIN, versions=(1,))
class SkipSimplifiedLayerNormalization(_SkipNorm):
    """output = RMSNorm(input + skip + bias) * gamma over the last axis (no mean is
    subtracted; the mean output is zeros).  Shapes as SkipLayerNormalization."""

    max_inputs = 4

    def __call__(self, input, skip, gamma, bias=None, *more, epsilon=1e-12, **unknown):
        self.check_signature(more, unknown)
        x = self.tensor(input, "input")
        s = self.tensor(skip, "skip")
        g = self.tensor(gamma, "gamma")
        bi = self.tensor(bias, "bias", optional=True)
        self.floats(FLOATS, input=x, skip=s, gamma=g, bias=bi)
        total, _ = self._sum(x, s, g, {}, bi)
        y = self.sub(_OnnxRMSNormalization, 23)(Tensor.wrap(total, DataType.FLOAT), self.compute_tensor(g),
                                                 axis=-1, epsilon=float(epsilon)).array
        xp = self.xp
        stat_shape = x.shape[:-1] + (1,)
        inv = mean = None
        if self.wants_output(2):
            inv = 1.0 / xp.sqrt(xp.mean(total * total, axis=-1, keepdims=True) + np.float32(epsilon))
        if self.wants_output(1):
            mean = xp.zeros(stat_shape, dtype=np.float32)
        return self._outputs(x, y, mean, inv, total)


def _check_axis(kernel, axis, ndim, **tensors) -> int:
    axis = int(axis)
    if not -ndim <= axis < ndim:
        raise kernel.error(f"axis {axis} is out of range for rank {ndim}", **tensors)
    return axis % ndim


def _stash(kernel, stash_type, cdt, **tensors):
    st = int(stash_type)
    if st not in (int(DataType.FLOAT), int(DataType.DOUBLE)):
        raise kernel.error(f"stash_type must be 1 (float) or 11 (double), got {stash_type}", **tensors)
    # double inputs are normalised in double whatever stash_type says (as onnxruntime does)
    return DataType.DOUBLE if st == int(DataType.DOUBLE) or cdt == np.float64 else DataType.FLOAT


@register("SimplifiedLayerNormalization", domain="", versions=(1,))
class SimplifiedLayerNormalization(ContribKernel):
    """onnxruntime's RMS normalisation in the ONNX domain: Y = X / sqrt(mean(X^2 over
    [axis, rank)) + epsilon) * scale.  Y has scale's element type; inv_std_var (float32,
    float64 for double) has X's shape with the normalised axes set to 1."""

    max_inputs = 2

    class Result(NamedTuple):
        Y: Tensor
        inv_std_var: Tensor | None = None

    def __call__(self, X, scale, *more, axis=-1, epsilon=1e-5, stash_type=1, **unknown):
        self.check_signature(more, unknown)
        x = self.tensor(X, "X")
        s = self.tensor(scale, "scale")
        self.check_type("X", x, FLOATS_DOUBLE)
        self.check_type("scale", s, FLOATS_DOUBLE)
        if x.ndim < 1:
            raise self.error("X must have rank >= 1", X=x, scale=s)
        ax = _check_axis(self, axis, x.ndim, X=x, scale=s)
        cdt = compute_dtype(x, s)
        stash = _stash(self, stash_type, cdt, X=x)
        xc = self.compute_tensor(x, cdt)
        y = self.sub(_OnnxRMSNormalization, 23)(xc, self.compute_tensor(s, cdt), axis=ax, epsilon=float(epsilon),
                                                 stash_type=int(stash))
        inv_t = None
        if self.wants_output(1):
            xp = self.xp
            sdt = np.float64 if stash == DataType.DOUBLE else np.float32
            xs = xc.array.astype(sdt, copy=False)
            axes = tuple(range(ax, x.ndim))
            inv = 1.0 / xp.sqrt(xp.mean(xs * xs, axis=axes, keepdims=True) + sdt(epsilon))
            inv_t = self.from_compute(inv, stash)
        return self.Result(self.from_compute(y.array, s.data_type), inv_t)


@register("LayerNormalization", domain="", versions=(1,))
class LayerNormalization(ContribKernel):
    """onnxruntime's LayerNormalization for models below opset 17 (ONNX's own starts at
    17): as ONNX LayerNormalization, except that Y has Scale's element type (X and Scale
    may differ) and double inputs are normalised in double."""

    max_inputs = 3

    class Result(NamedTuple):
        Y: Tensor
        Mean: Tensor | None = None
        InvStdDev: Tensor | None = None

    def __call__(self, X, Scale, B=None, *more, axis=-1, epsilon=1e-5, stash_type=1, **unknown):
        self.check_signature(more, unknown)
        x = self.tensor(X, "X")
        s = self.tensor(Scale, "Scale")
        b = self.tensor(B, "B", optional=True)
        self.check_type("X", x, FLOATS_DOUBLE)
        self.floats(FLOATS_DOUBLE, Scale=s, B=b)
        if x.ndim < 1:
            raise self.error("X must have rank >= 1", X=x, Scale=s)
        ax = _check_axis(self, axis, x.ndim, X=x, Scale=s)
        cdt = compute_dtype(x, s, b)
        stash = _stash(self, stash_type, cdt, X=x)
        r = self.sub(_OnnxLayerNormalization, 17)(
            self.compute_tensor(x, cdt), self.compute_tensor(s, cdt), None if b.is_absent else self.compute_tensor(b, cdt),
            axis=ax, epsilon=float(epsilon), stash_type=int(stash))
        mean = self.from_compute(r.Mean.array, stash) if self.wants_output(1) else None
        inv = self.from_compute(r.InvStdDev.array, stash) if self.wants_output(2) else None
        return self.Result(self.from_compute(r.Y.array, s.data_type), mean, inv)


@register(domain=DOMAIN, versions=(1,))
class EmbedLayerNormalization(ContribKernel):
    """BERT's embedding layer: LayerNorm(word_embedding[input_ids] +
    position_embedding[position_ids] + segment_embedding[segment_ids]) * gamma + beta.

    input_ids, segment_ids, mask, position_ids are int32 (batch, seq); position_ids may
    be (1, seq) and defaults to 0..seq-1.  Outputs: output (batch, seq, hidden),
    mask_index (batch,) int32 = the number of non-zero mask entries of each row (zeros
    without a mask), embedding_sum (the sum before normalisation).  Every id must index
    its table (a KernelInputError otherwise)."""

    max_inputs = 9

    class Result(NamedTuple):
        output: Tensor
        mask_index: Tensor | None = None
        embedding_sum: Tensor | None = None

    def __call__(self, input_ids, segment_ids, word_embedding, position_embedding, segment_embedding=None,
                 gamma=None, beta=None, mask=None, position_ids=None, *more, epsilon=1e-12, mask_index_type=1,
                 **unknown):
        self.check_signature(more, unknown)
        ids = self.tensor(input_ids, "input_ids")
        seg = self.tensor(segment_ids, "segment_ids", optional=True)
        we = self.tensor(word_embedding, "word_embedding")
        pe = self.tensor(position_embedding, "position_embedding")
        se = self.tensor(segment_embedding, "segment_embedding", optional=True)
        g = self.tensor(gamma, "gamma")
        b = self.tensor(beta, "beta")
        m = self.tensor(mask, "mask", optional=True)
        pid = self.tensor(position_ids, "position_ids", optional=True)
        shapes = dict(input_ids=ids, segment_ids=seg, word_embedding=we, position_embedding=pe,
                      segment_embedding=se, gamma=g, beta=b, mask=m, position_ids=pid)
        for name, t in (("input_ids", ids), ("segment_ids", seg), ("mask", m), ("position_ids", pid)):
            if not t.is_absent:
                self.check_type(name, t, {DataType.INT32})
        self.floats({DataType.FLOAT, DataType.FLOAT16}, word_embedding=we, position_embedding=pe,
                    segment_embedding=se, gamma=g, beta=b)
        if ids.ndim != 2:
            raise self.error("input_ids must be 2-D (batch, seq)", **shapes)
        B, S = ids.shape
        if we.ndim != 2 or pe.ndim != 2 or pe.shape[1] != we.shape[1]:
            raise self.error("word_embedding and position_embedding must be 2-D with one hidden size", **shapes)
        hidden = we.shape[1]
        if seg.is_absent != se.is_absent:
            raise self.error("segment_ids and segment_embedding must be given together", **shapes)
        if not se.is_absent and (se.ndim != 2 or se.shape[1] != hidden):
            raise self.error(f"segment_embedding must be 2-D (segments, {hidden})", **shapes)
        for name, t in (("segment_ids", seg), ("mask", m)):
            if not t.is_absent and t.shape != (B, S):
                raise self.error(f"{name} must have input_ids' shape ({B}, {S})", **shapes)
        if not pid.is_absent and pid.shape not in ((B, S), (1, S)):
            raise self.error(f"position_ids must have shape ({B}, {S}) or (1, {S})", **shapes)
        self.vector(g, "gamma", hidden, word_embedding=we)
        self.vector(b, "beta", hidden, word_embedding=we)
        xp = self.xp
        positions = pid.array.astype(np.int64) if not pid.is_absent else xp.arange(S, dtype=np.int64)[None, :]
        for name, index, table in (("input_ids", ids.array, we), ("position_ids", positions, pe),
                                   ("segment_ids", None if seg.is_absent else seg.array, se)):
            if index is None or index.size == 0:
                continue
            lo, hi = int(xp.min(index)), int(xp.max(index))
            if lo < 0 or hi >= table.shape[0]:
                what = name if name != "position_ids" or not pid.is_absent else "the sequence length"
                raise self.error(f"{what} must index a table of {table.shape[0]} rows, got values in "
                                 f"[{lo}, {hi}]", **shapes)
        cdt = np.float32
        total = xp.take(self.to_compute(we, cdt), ids.array.astype(np.int64), axis=0)
        total += xp.take(self.to_compute(pe, cdt), positions, axis=0)
        if not seg.is_absent:
            total += xp.take(self.to_compute(se, cdt), seg.array.astype(np.int64), axis=0)
        ln = self.sub(_OnnxLayerNormalization, 17)(Tensor.wrap(total, DataType.FLOAT), self.compute_tensor(g, cdt),
                                                  self.compute_tensor(b, cdt), axis=-1, epsilon=float(epsilon))
        out = self.from_compute(ln.Y.array, we.data_type)
        mask_index = None
        if self.wants_output(1):
            counts = (m.array != 0).sum(axis=1) if not m.is_absent else xp.zeros((B,), dtype=np.int64)
            mask_index = self.result(counts.astype(np.int32), DataType.INT32)
        emb = self.from_compute(total, we.data_type) if self.wants_output(2) else None
        return self.Result(out, mask_index, emb)


__all__ = ["SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "SimplifiedLayerNormalization",
           "LayerNormalization", "EmbedLayerNormalization"]
