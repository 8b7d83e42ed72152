"""Dropout.

Mode per opset: 1/6 -- training unless the is_test attribute is set (the spec's
default, is_test=0, is training); 7/10 -- always inference (those versions have no way
to ask for training); 12/13/22 -- training when the optional training_mode input is
true, with the ratio input (default 0.5).

Inference: output = data (the input buffer is shared, never written), mask all ones.
Training with ratio r in [0, 1): keep = u >= r, output = data * keep / (1 - r).
r = 0 keeps everything.

Random generator: u = numpy.random.RandomState(seed % 2**32).uniform(0, 1, data.shape)
(Mersenne Twister MT19937, float64) drawn on the host, so a given seed gives the same
mask on CPU and GPU and from run to run; it is also the generator the ONNX node tests
use, so the seeded training cases reproduce exactly.  seed is the node's seed
attribute, else the context option 'seed', else fresh OS entropy on each call.

Mask type: bool from opset 10; the data type (1.0 = kept) before.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ...dtypes import DataType
from ...tensor import Tensor
from ..base import KernelBase, register


def dropout_keep_mask(shape, ratio: float, seed) -> np.ndarray:
    """The host bool keep-mask for a seed (None: fresh entropy)."""
    rng = np.random.RandomState(None if seed is None else int(seed) % (1 << 32))
    return rng.uniform(0.0, 1.0, shape) >= ratio


@register()
class Dropout(KernelBase):
    foldable = False  # training mode draws a new mask every run
    class Result(NamedTuple):
        output: Tensor
        mask: Tensor | None = None

    def __call__(self, data, ratio=None, training_mode=None, seed=None, is_test=0,
                 consumed_inputs=None):
        x = self.tensor(data, "data")
        v = self.since_version
        if v >= 12:
            r_t = self.tensor(ratio, "ratio", optional=True)
            tm_t = self.tensor(training_mode, "training_mode", optional=True)
            self.check_inputs(x, r_t, tm_t)
            if not r_t.is_absent and r_t.size != 1:
                raise self.error("ratio must be a scalar", data=x, ratio=r_t)
            if not tm_t.is_absent and tm_t.size != 1:
                raise self.error("training_mode must be a scalar", data=x, training_mode=tm_t)
            r = 0.5 if r_t.is_absent else float(np.asarray(r_t.numpy(), dtype=np.float64).reshape(()))
            training = False if tm_t.is_absent else bool(np.asarray(tm_t.numpy()).reshape(()))
        else:
            self.check_inputs(x)
            if isinstance(ratio, Tensor):
                raise self.error("opset < 12 Dropout takes ratio as an attribute", data=x)
            r = 0.5 if ratio is None else float(ratio)
            training = v < 7 and not is_test
        if training and not 0.0 <= r < 1.0:
            raise self.error(f"ratio must lie in [0, 1), got {r}", data=x)
        want_mask = self.wants_output(1)
        mask_type = DataType.BOOL if v >= 10 else x.data_type
        xp = self.xp
        if not training or r == 0.0:
            mask = None
            if want_mask:
                if mask_type == DataType.BOOL:
                    mask = self.result(xp.ones(x.shape, dtype=bool), DataType.BOOL)
                else:
                    mask = self.from_compute(xp.ones(x.shape, dtype=np.float32), mask_type)
            return self.Result(x, mask)
        if seed is None:
            seed = self.ctx.option("seed")
        keep_host = dropout_keep_mask(x.shape, r, None if seed is None else int(seed))
        keep = xp.asarray(keep_host)
        xc = self.to_compute(x)
        scale = xc.dtype.type(1.0 / (1.0 - r))
        y = xp.where(keep, xc * scale, xc.dtype.type(0))
        out = self.from_compute(y, x.data_type)
        mask = None
        if want_mask:
            if mask_type == DataType.BOOL:
                mask = self.result(keep, DataType.BOOL)
            else:
                mask = self.from_compute(keep.astype(np.float32), mask_type)
        return self.Result(out, mask)
