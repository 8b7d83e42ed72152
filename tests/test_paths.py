"""The option ``paths`` and the registry of specialisations (gpukernels.kernels.specialize).

* 'auto' / 'reference' from the context option or GPUKERNELS_PATHS (the option wins), an
  OptionError for anything else, and the hand-written CUDA kernels off under 'reference';
* every registered specialisation has a parity case below: the operator runs on the same
  random inputs through the specialisation (paths='auto', which must choose it) and
  through the reference (paths='reference', which must choose nothing); the two agree
  within the stated tolerance and, for float32 cases, both agree with the reference path
  run in float64.  A new specialisation without a case here fails
  test_every_specialisation_has_a_parity_case.
"""

from __future__ import annotations

import zlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from gpukernels.errors import OptionError
from gpukernels.kernels import KernelContext, specialize
from gpukernels.kernels.base import KernelBase, lookup
from gpukernels.tensor import Tensor

AUTO = {"paths": "auto"}
REFERENCE = {"paths": "reference"}


# ------------------------------------------------------------------ option and env


def test_default_is_auto(monkeypatch):
    monkeypatch.delenv("GPUKERNELS_PATHS", raising=False)
    assert KernelContext().paths == "auto"


@pytest.mark.parametrize("value", ["auto", "reference", "Reference", " auto "])
def test_option(monkeypatch, value):
    monkeypatch.delenv("GPUKERNELS_PATHS", raising=False)
    assert KernelContext(options={"paths": value}).paths == value.strip().lower()


def test_environment_and_option_precedence(monkeypatch):
    monkeypatch.setenv("GPUKERNELS_PATHS", "reference")
    assert KernelContext().paths == "reference"
    assert KernelContext(options=AUTO).paths == "auto"  # the option wins
    monkeypatch.setenv("GPUKERNELS_PATHS", "")
    assert KernelContext().paths == "auto"


@pytest.mark.parametrize("value", ["fast", 1, None, True, ""])
def test_bad_option_value(monkeypatch, value):
    monkeypatch.delenv("GPUKERNELS_PATHS", raising=False)
    with pytest.raises(OptionError, match="option 'paths' must be one of 'auto', 'reference'"):
        KernelContext(options={"paths": value})


def test_bad_environment_value(monkeypatch):
    monkeypatch.setenv("GPUKERNELS_PATHS", "fastest")
    with pytest.raises(OptionError, match="GPUKERNELS_PATHS must be one of"):
        KernelContext()
    assert KernelContext(options=REFERENCE).paths == "reference"  # not read when the option is given


def test_option_is_listed():
    from gpukernels.kernels.base import OPTIONS

    assert "GPUKERNELS_PATHS" in OPTIONS["paths"]


def test_session_option(monkeypatch):
    from gpukernels.runtime.session import Session

    monkeypatch.delenv("GPUKERNELS_PATHS", raising=False)
    node = helper.make_node("Softmax", ["x"], ["y"], axis=-1)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 1100])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 1100])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    x = np.random.default_rng(0).standard_normal((64, 1100)).astype(np.float32)
    results = {}
    for paths in ("auto", "reference"):
        with specialize.recording() as chosen:
            results[paths] = Session(model, options={"paths": paths}).run(None, {"x": x})[0]
        assert bool(chosen) == (paths == "auto")
    np.testing.assert_allclose(results["auto"], results["reference"], rtol=1e-6, atol=1e-7)
    with pytest.raises(OptionError):
        Session(model, options={"paths": "none"})


class _FakeCuda(KernelBase):
    op_type = "Conv"
    versions = (22,)


@pytest.mark.parametrize("paths,cuda_kernels,expect", [
    ("auto", "auto", "ran"), ("reference", "auto", None), ("reference", "never", None),
    ("auto", "never", None), ("reference", "always", OptionError)])
def test_cuda_kernels_follow_paths(monkeypatch, paths, cuda_kernels, expect):
    """paths='reference' turns the hand-written CUDA kernels off, as cuda_kernels='never'
    does; with cuda_kernels='always' the two options contradict each other."""
    from gpukernels.gpu import accelerated

    monkeypatch.setattr(accelerated, "get", lambda op: (lambda kernel, **kw: "ran"))
    kernel = _FakeCuda(KernelContext("cuda", options={"paths": paths, "cuda_kernels": cuda_kernels}))
    if expect is OptionError:
        with pytest.raises(OptionError, match="contradict"):
            kernel.cuda_path(X=None)
    else:
        assert kernel.cuda_path(X=None) == expect


def test_specialized_needs_matching_device_and_condition(monkeypatch):
    site = "_TestOp.step"
    monkeypatch.setitem(specialize._SITES, site, ())
    specialize.specialize(site, device="cuda", when=lambda n: n > 1)(lambda n: "cuda")
    specialize.specialize(site, device="cpu", when=lambda n: n > 1)(lambda n: "cpu")
    k = KernelBase.__new__(KernelBase)
    k.ctx = KernelContext("cpu", options=AUTO)
    assert k.specialized(site, 2)(2) == "cpu"
    assert k.specialized(site, 1) is None
    k.ctx = KernelContext("cpu", options=REFERENCE)
    assert k.specialized(site, 2) is None
    k.ctx = KernelContext("cuda", options=AUTO)
    assert k.specialized(site, 2)(2) == "cuda"
    with pytest.raises(ValueError):
        specialize.specialize("nodot", device="cpu")
    with pytest.raises(ValueError):
        specialize.specialize("A.b", device="tpu")


# ------------------------------------------------------------------ parity cases


def _f32(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _run(op, options, inputs, attrs, opset=None, requested=None):
    cls, version = lookup(op, "", opset)
    kernel = cls(KernelContext("cpu", opset=opset, options=options))
    kernel.requested_outputs = requested
    return kernel(*inputs, **attrs)


def _arrays(result):
    if isinstance(result, Tensor):
        return [result.numpy()]
    return [None if t is None else t.numpy() for t in result]


def _as64(value):
    if isinstance(value, np.ndarray) and value.dtype == np.float32:
        return value.astype(np.float64)
    return value


class Case:
    """An operator call that reaches one specialisation on the cpu.  rtol/atol: how the
    two paths agree (0: exactly); tol64: how each float32 result agrees with the
    reference path in float64 (None: no float64 comparison); requested: the outputs a
    node would declare (None: all); wide: as below."""

    def __init__(self, op, make, attrs=None, rtol=0.0, atol=0.0, tol64=None, opset=None, requested=None,
                 wide=None):
        self.op, self.make, self.attrs = op, make, attrs or {}
        self.rtol, self.atol, self.tol64, self.opset = rtol, atol, tol64, opset
        self.requested = requested
        self.wide = wide  # the inputs given in float64 for the float64 run (None: every float32 one)


def _lstm_inputs(rng, S=20, N=4, I=24, H=40, D=1):
    return [_f32(rng, S, N, I), _f32(rng, D, 4 * H, I, scale=0.3), _f32(rng, D, 4 * H, H, scale=0.3),
            _f32(rng, D, 8 * H, scale=0.1), None, _f32(rng, D, N, H), _f32(rng, D, N, H)]


def _int64(values):
    return np.asarray(values, np.int64)


_NO_QK = (True, True, True, False)  # a node that does not declare qk_matmul_output

CASES = {
    "RotaryEmbedding.rotate:_rotate_host": [
        Case("RotaryEmbedding", lambda r: [_f32(r, 2, 4, 6, 16), _f32(r, 10, 8), _f32(r, 10, 8),
                                           _int64(r.integers(0, 10, (2, 6)))],
             {}, 1e-6, 1e-6, None, opset=23),  # float64 X: not a RotaryEmbedding type
        Case("RotaryEmbedding", lambda r: [_f32(r, 2, 4, 6, 16), _f32(r, 10, 8), _f32(r, 10, 8),
                                           _int64(r.integers(0, 10, (2, 6)))],
             {"interleaved": 1}, 1e-6, 1e-6, None, opset=23),
        Case("RotaryEmbedding", lambda r: [_f32(r, 2, 5, 3 * 12), _f32(r, 2, 5, 4), _f32(r, 2, 5, 4)],
             {"num_heads": 3, "rotary_embedding_dim": 8}, 1e-6, 1e-6, None, opset=23),
    ],
    "Conv.depthwise:_depthwise_2d_host": [
        Case("Conv", lambda r: [_f32(r, 2, 24, 15, 17), _f32(r, 24, 1, 3, 3), _f32(r, 24)],
             {"group": 24, "pads": [1, 1, 1, 1]}, 1e-5, 1e-5, (1e-5, 1e-5)),
        Case("Conv", lambda r: [_f32(r, 1, 16, 20, 20), _f32(r, 32, 1, 5, 5)],
             {"group": 16, "strides": [2, 2], "pads": [2, 1, 2, 1]}, 1e-5, 1e-5, (1e-5, 1e-5)),
    ],
    "Conv.dense:_dense_2d_host": [
        Case("Conv", lambda r: [_f32(r, 2, 16, 14, 14), _f32(r, 32, 16, 3, 3), _f32(r, 32)],
             {"pads": [1, 1, 1, 1]}, 1e-5, 1e-5, (1e-5, 1e-5)),
        Case("Conv", lambda r: [_f32(r, 1, 64, 12, 12), _f32(r, 8, 64, 3, 3)],
             {"pads": [1, 1, 1, 1]}, 1e-5, 1e-5, (1e-5, 1e-5)),
        Case("Conv", lambda r: [_f32(r, 1, 8, 23, 19), _f32(r, 12, 8, 3, 2)],
             {"strides": [2, 3], "dilations": [2, 1], "pads": [2, 0, 1, 1]}, 1e-5, 1e-5, (1e-5, 1e-5)),
    ],
    "Softmax.along:_softmax_last_axis_host": [  # bitwise: see also test_host_rows_are_bitwise_equal
        Case("Softmax", lambda r: [_f32(r, 64, 1100, scale=3.0)], {"axis": -1}, 0, 0, (1e-5, 1e-8)),
        Case("Softmax", lambda r: [_f32(r, 16, 8, 700, scale=40.0)], {"axis": -1}, 0, 0, (1e-5, 1e-8)),
    ],
    "Softmax.along:_softmax_slices_host": [
        Case("Softmax", lambda r: [_f32(r, 300, 40, 8, scale=3.0)], {"axis": 1}, 0, 0, (1e-5, 1e-8)),
    ],
    "LogSoftmax.along:_log_softmax_last_axis_host": [
        Case("LogSoftmax", lambda r: [_f32(r, 64, 1100, scale=3.0)], {"axis": -1}, 0, 0, (1e-5, 1e-5)),
    ],
    "Reduce.rows:_reduce_rows_host": [
        Case("ReduceSum", lambda r: [_f32(r, 64, 8192), _int64([1])], {"keepdims": 0}, 0, 0, (1e-4, 1e-4)),
        Case("ReduceMax", lambda r: [_f32(r, 32, 64, 256), _int64([1, 2])], {}, 0, 0, (0, 0)),
        Case("ReduceLogSumExp", lambda r: [_f32(r, 256, 4096), _int64([1])], {}, 0, 0, (1e-5, 1e-5)),
    ],
    "ArgMax.pick:_host_pick": [
        Case("ArgMax", lambda r: [_f32(r, 512, 4096)], {"axis": 1}, 0, 0),
        Case("ArgMin", lambda r: [_f32(r, 512, 4096)], {"axis": 0}, 0, 0),
    ],
    "LSTM.layer:lstm_host": [
        Case("LSTM", lambda r: _lstm_inputs(r), {"hidden_size": 40}, 2e-5, 2e-6, (1e-4, 1e-5)),
        Case("LSTM", lambda r: _lstm_inputs(r, S=40, N=2, H=64, D=2),
             {"hidden_size": 64, "direction": "bidirectional"}, 2e-5, 2e-6, (1e-4, 1e-5)),
        Case("LSTM", lambda r: _lstm_inputs(r, S=9, N=5, H=8, D=2)[:4] + [np.array([9, 3, 0, 7, 9], np.int32)]
             + _lstm_inputs(r, S=9, N=5, H=8, D=2)[5:],
             {"hidden_size": 8, "direction": "bidirectional", "clip": 1.5, "layout": 0}, 2e-5, 2e-6,
             (1e-4, 1e-5)),
        Case("LSTM", lambda r: _lstm_inputs(r, S=6, N=3, H=8) + [_f32(r, 1, 24, scale=0.3)],
             {"hidden_size": 8, "input_forget": 1, "activations": ["HardSigmoid", "Tanh", "Softsign"]},
             2e-5, 2e-6, (1e-4, 1e-5)),
    ],
    "Attention.blocks:_host_attention": [
        Case("Attention", lambda r: [_f32(r, 2, 4, 33, 16), _f32(r, 2, 2, 45, 16), _f32(r, 2, 2, 45, 8)],
             {}, 1e-5, 1e-6, (1e-4, 1e-5), requested=_NO_QK),
        Case("Attention", lambda r: [_f32(r, 1, 4, 200, 32), _f32(r, 1, 4, 200, 32), _f32(r, 1, 4, 200, 32)],
             {"is_causal": 1}, 1e-5, 1e-6, (1e-4, 1e-5), requested=_NO_QK),
        # large scores: blocks redone with the max shift
        Case("Attention", lambda r: [_f32(r, 1, 2, 17, 8, scale=30.0), _f32(r, 1, 2, 17, 8, scale=30.0),
                                     _f32(r, 1, 2, 17, 8)], {}, 1e-5, 1e-5, (1e-4, 1e-4), requested=_NO_QK),
    ],
    "BatchNormalization.affine:_scale_shift_host": [
        Case("BatchNormalization", lambda r: [_f32(r, 4, 16, 30, 30), _f32(r, 16), _f32(r, 16), _f32(r, 16),
                                              np.abs(_f32(r, 16)) + 0.5], {}, 0, 0, (1e-5, 1e-5)),
    ],
    "LayerNormalization.rows:_normalize_rows_host": [
        Case("LayerNormalization", lambda r: [_f32(r, 8, 50, 96, scale=2.0) + 3, _f32(r, 96), _f32(r, 96)],
             {"axis": -1}, 0, 0, (1e-4, 1e-4)),
        Case("RMSNormalization", lambda r: [_f32(r, 8, 50, 96, scale=2.0), _f32(r, 96)], {"axis": -1},
             0, 0, (1e-4, 1e-4), opset=23),
        Case("InstanceNormalization", lambda r: [_f32(r, 2, 24, 300, scale=2.0) + 3, _f32(r, 24), _f32(r, 24)],
             {"epsilon": 1e-3}, 0, 0, (1e-4, 1e-4)),
    ],
    "Pool.windows:pool_windows": [
        Case("MaxPool", lambda r: [_f32(r, 2, 8, 29, 31)], {"kernel_shape": [3, 3], "strides": [2, 2],
                                                            "pads": [1, 1, 1, 1]}, 0, 0, (0, 0)),
        Case("AveragePool", lambda r: [_f32(r, 2, 8, 29, 31)],
             {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 1, 1], "count_include_pad": 0},
             1e-6, 1e-6, (1e-5, 1e-6)),
    ],
    "ConvTranspose.forward:_host_phase_forward": [
        Case("ConvTranspose", lambda r: [_f32(r, 1, 32, 14, 14), _f32(r, 32, 16, 4, 4, scale=0.2), _f32(r, 16)],
             {"strides": [2, 2], "pads": [1, 1, 1, 1]}, 1e-5, 1e-5, (1e-4, 1e-4)),
        Case("ConvTranspose", lambda r: [_f32(r, 2, 16, 40), _f32(r, 16, 8, 4, scale=0.2)],
             {"strides": [2], "pads": [1, 1]}, 1e-5, 1e-5, (1e-4, 1e-4)),
    ],
    "DFT.transform:_host_split": [
        Case("DFT", lambda r: [_f32(r, 64, 1024, 1), None, _int64(1)], {}, 0, 0, (1e-4, 1e-3)),
    ],
    "Gather.take:_host_take": [
        Case("Gather", lambda r: [_f32(r, 4096, 256), r.integers(-4096, 4096, (3000,))], {"axis": 0}, 0, 0),
        Case("Gather", lambda r: [_f32(r, 64, 512, 64), r.integers(0, 512, (400,))], {"axis": 1}, 0, 0),
    ],
    "ScatterND.assign_rows:_assign_rows_host": [
        Case("ScatterND", lambda r: [_f32(r, 4096, 1024), r.permutation(4096)[:2500].reshape(-1, 1),
                                     _f32(r, 2500, 1024)], {}, 0, 0),
    ],
    "Transpose.copy:_permuted_copy_host": [
        Case("Transpose", lambda r: [_f32(r, 2048, 1024)], {"perm": [1, 0]}, 0, 0),
        Case("Transpose", lambda r: [_f32(r, 8, 300, 600)], {"perm": [0, 2, 1]}, 0, 0),
    ],
    "GridSample.sample:_sample_host": [
        Case("GridSample", lambda r: [_f32(r, 2, 5, 20, 24), r.uniform(-1.1, 1.1, (2, 16, 18, 2)).astype(np.float32)],
             {"mode": "linear", "padding_mode": "zeros"}, 1e-5, 1e-6, (1e-4, 1e-5)),
        Case("GridSample", lambda r: [_f32(r, 1, 3, 12, 13), r.uniform(-1.1, 1.1, (1, 9, 7, 2)).astype(np.float32)],
             {"mode": "cubic", "padding_mode": "reflection", "align_corners": 1}, 1e-5, 1e-5, (1e-4, 1e-4)),
    ],
    "NonMaxSuppression.select:_nms_host": [
        Case("NonMaxSuppression",
             lambda r: [np.sort(r.uniform(0, 60, (2, 300, 4)), axis=-1).astype(np.float32)[..., [0, 1, 2, 3]],
                        r.random((2, 3, 300)).astype(np.float32), _int64([40]), np.array([0.4], np.float32),
                        np.array([0.2], np.float32)], {}, 0, 0),
    ],
    # erf (math/_mathcommon.py): the rational float32 approximation on both paths, within
    # 6e-7 of scipy.special.erf in float64
    "Elementwise.blocks:_blockwise_host": [  # exact for the blocks: see test_blockwise_blocks_are_exact
        Case("Erf", lambda r: [_f32(r, 3, 512, 301, scale=2.0)], {}, 0, 0, (6e-7, 1e-37)),
    ],
}

# the logistic family and float32 Gelu block by block on the host threads: the same
# elementwise steps as the whole-array reference, so the same values
CASES.update({
    "Logistic.blocks:_logistic_pass_host_blocked": [
        Case("Sigmoid", lambda r: [_f32(r, 3, 400, 101, scale=4.0)]),
        Case("Mish", lambda r: [_f32(r, 2, 300, 211, scale=4.0)]),
        Case("HardSwish", lambda r: [_f32(r, 5, 70001, scale=4.0)]),
        Case("HardSigmoid", lambda r: [_f32(r, 140000, scale=4.0)], {"alpha": 0.3, "beta": 0.4}),
        Case("Swish", lambda r: [_f32(r, 2, 70000, scale=4.0)], {"alpha": 1.5}, opset=24),
    ],
    "Gelu.blocks:_gelu_erf_f32_host_blocked": [
        Case("Gelu", lambda r: [_f32(r, 3, 500, 301, scale=3.0)], {}, 0, 0, (1e-6, 1e-6)),
    ],
})

# Conv and Clip host paths (issue 15, CNN speed): 1x1 products with the bias inside, im2col
# products written into the output, depthwise blocks of other ranks on the host threads,
# NumPy's one-pass clip, and the channels-last depthwise taps for tiny planes
_CLIP_BOUNDS = [np.array(0, np.float32), np.array(6, np.float32)]
CASES.update({
    "Conv.pointwise:_pointwise_host": [
        Case("Conv", lambda r: [_f32(r, 2, 8, 13, 11), _f32(r, 24, 8, 1, 1), _f32(r, 24)], {},
             1e-5, 1e-5, (1e-5, 1e-5)),  # fewer input than output channels: the bias in the product
        Case("Conv", lambda r: [_f32(r, 1, 32, 10, 9), _f32(r, 16, 32, 1, 1), _f32(r, 16)],
             {"strides": [2, 3]}, 1e-5, 1e-5, (1e-5, 1e-5)),
        Case("Conv", lambda r: [_f32(r, 2, 6, 7, 7), _f32(r, 5, 6, 1, 1)], {}, 1e-5, 1e-5, (1e-5, 1e-5)),
    ],
    "Conv.product:_product_host": [  # grouped: two chunks of one whole image each
        Case("Conv", lambda r: [_f32(r, 2, 64, 48, 48), _f32(r, 32, 32, 3, 3, scale=0.2), _f32(r, 32)],
             {"group": 2, "pads": [1, 1, 1, 1]}, 0, 0, (1e-5, 1e-5)),
    ],
    "Conv.depthwise:_depthwise_nd_host": [
        Case("Conv", lambda r: [_f32(r, 2, 12, 50), _f32(r, 24, 1, 5), _f32(r, 24)],
             {"group": 12, "pads": [2, 1], "strides": [2]}, 0, 0, (1e-5, 1e-5)),
        Case("Conv", lambda r: [_f32(r, 1, 6, 5, 6, 7), _f32(r, 6, 1, 3, 3, 3)],
             {"group": 6, "pads": [1, 1, 1, 1, 1, 1], "dilations": [1, 2, 1]}, 0, 0, (1e-5, 1e-5)),
    ],
    "Clip.bounds:_clip_host": [
        Case("Clip", lambda r: [_f32(r, 64, 1000, scale=4.0)] + _CLIP_BOUNDS, {}, 0, 0, (0, 0)),
        Case("Clip", lambda r: [_f32(r, 3, 70, scale=4.0), None, _CLIP_BOUNDS[1]], {}, 0, 0, (0, 0)),
        Case("Clip", lambda r: [r.integers(-100, 100, (40, 30)).astype(np.int32), np.array(-7, np.int32),
                                np.array(50, np.int32)], {}, 0, 0),
        Case("Clip", lambda r: [_f32(r, 5, 40)], {"min": -0.5, "max": 0.5}, 0, 0, (0, 0), opset=6),
    ],
})
CASES["Conv.depthwise:_depthwise_2d_host"] += [  # tiny planes: channels-last taps
    Case("Conv", lambda r: [_f32(r, 2, 160, 3, 3), _f32(r, 160, 1, 3, 3), _f32(r, 160)],
         {"group": 160, "pads": [1, 1, 1, 1]}, 1e-5, 1e-5, (1e-5, 1e-5)),
    Case("Conv", lambda r: [_f32(r, 2, 200, 6, 6), _f32(r, 200, 1, 5, 5)],
         {"group": 200, "pads": [2, 2, 2, 2], "strides": [2, 2]}, 1e-5, 1e-5, (1e-5, 1e-5)),
]
CASES["Conv.depthwise:_depthwise_2d_host"] += [  # a plane no larger than the kernel: products
    Case("Conv", lambda r: [_f32(r, 2, 16, 2, 2), _f32(r, 16, 1, 7, 7), _f32(r, 16)],
         {"group": 16, "pads": [3, 3, 3, 3]}, 1e-5, 1e-5, (1e-5, 1e-5)),
]
CASES["Conv.dense:_dense_2d_host"] += [
    # large stride: the columns in one strided copy ("patchify")
    Case("Conv", lambda r: [_f32(r, 2, 3, 32, 32), _f32(r, 8, 3, 8, 8), _f32(r, 8)],
         {"strides": [8, 8]}, 1e-5, 1e-5, (1e-5, 1e-5)),
    # dilation 12 on a 12x12 plane: every tap but the centre reads padding only
    Case("Conv", lambda r: [_f32(r, 2, 16, 12, 12), _f32(r, 8, 16, 3, 3), _f32(r, 8)],
         {"pads": [12] * 4, "dilations": [12, 12]}, 1e-5, 1e-5, (1e-5, 1e-5)),
    # small images: the batch folded into one product
    Case("Conv", lambda r: [_f32(r, 2, 32, 3, 3), _f32(r, 48, 32, 3, 3, scale=0.3), _f32(r, 48)],
         {"pads": [1] * 4}, 1e-5, 1e-5, (1e-5, 1e-5)),
]

# MatMul/Gemm with a few rows (a decoding step) as vector-matrix products (issue 15,
# transformer speed)
CASES["MatMul.product:_vector_rows_host"] = [
    # more than one row takes it only with a B of matmul.host_vector_min_bytes (2 MiB) or more
    Case("MatMul", lambda r: [_f32(r, 2, 1, 256), _f32(r, 256, 2048)], {}, 1e-5, 1e-5, (1e-5, 1e-5)),
    Case("MatMul", lambda r: [_f32(r, 3, 64), _f32(r, 64, 8192)], {}, 1e-5, 1e-5, (1e-5, 1e-5)),
    Case("MatMul", lambda r: [_f32(r, 1, 300), _f32(r, 7, 300).T], {}, 1e-5, 1e-5, (1e-5, 1e-5)),  # B a view
    Case("MatMul", lambda r: [_f32(r, 4, 1, 32).astype(np.float64), _f32(r, 32, 8192).astype(np.float64)], {},
         1e-12, 1e-12),
    Case("MatMul", lambda r: [_f32(r, 1, 1, 32).astype(np.float64), _f32(r, 32, 9).astype(np.float64)], {},
         1e-12, 1e-12),
    Case("Gemm", lambda r: [_f32(r, 2, 256), _f32(r, 2100, 256), _f32(r, 2100)],
         {"transB": 1, "alpha": 0.5, "beta": 2.0}, 1e-5, 1e-5, (1e-5, 1e-5)),
    Case("Gemm", lambda r: [_f32(r, 40, 4), _f32(r, 40, 14000), _f32(r, 4, 1)], {"transA": 1}, 1e-5, 1e-5,
         (1e-5, 1e-5)),
]

# the hand-written CUDA kernels: compared with the array path by tests/gpu
CUDA_KERNEL_SITES = {"Attention.cuda_kernel", "Conv.cuda_kernel", "LinearAttention.cuda_kernel",
                     "RotaryEmbedding.cuda_kernel"}


def _key(spec) -> str:
    return f"{spec.site}:{spec.name}"


def test_every_specialisation_has_a_parity_case():
    registered = {_key(s) for s in specialize.registry() if s.site not in CUDA_KERNEL_SITES}
    assert registered == set(CASES), (
        f"specialisations without a parity case: {sorted(registered - set(CASES))}; "
        f"cases without a specialisation: {sorted(set(CASES) - registered)}")
    assert {s.site for s in specialize.registry() if s.device == "cuda"} == CUDA_KERNEL_SITES


def test_registry_entries_are_described():
    for spec in specialize.registry():
        assert spec.device in ("cpu", "cuda") and spec.ops and spec.agreement, spec
        for op in spec.ops:
            assert lookup(op, "")[0] is not None


def _widen(arrays):
    return [None if a is None else a.astype(np.float64) if a.dtype.kind == "f" else a for a in arrays]


def _compare(got, want, rtol, atol, what):
    assert len(got) == len(want), what
    for g, w in zip(got, want):
        if g is None or w is None:
            assert g is None and w is None, what
            continue
        assert g.shape == w.shape and g.dtype == w.dtype, what
        if rtol == 0 and atol == 0:
            np.testing.assert_array_equal(g, w, err_msg=what)
        else:
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=what)


@pytest.mark.parametrize("key,index", [(k, i) for k, cases in CASES.items() for i in range(len(cases))])
def test_parity(key, index):
    case = CASES[key][index]
    inputs = case.make(np.random.default_rng(1000 + index))
    with specialize.recording() as chosen:
        fast = _arrays(_run(case.op, AUTO, inputs, case.attrs, case.opset, case.requested))
    assert key in {_key(s) for s in chosen}, f"{case.op} did not take {key}: {[_key(s) for s in chosen]}"
    with specialize.recording() as chosen:
        ref = _arrays(_run(case.op, REFERENCE, inputs, case.attrs, case.opset, case.requested))
    assert not chosen
    _compare(fast, ref, case.rtol, case.atol, f"{key}: auto vs reference")
    if case.tol64 is not None:
        wide = [_as64(v) if case.wide is None or i in case.wide else v for i, v in enumerate(inputs)]
        ref64 = _widen(_arrays(_run(case.op, REFERENCE, wide, case.attrs, case.opset, case.requested)))
        for name, got in (("auto", fast), ("reference", ref)):
            _compare(_widen(got), ref64, *case.tol64, f"{key}: {name} float32 vs reference float64")


def test_parity_compares_paths_on_one_device():
    from gpukernels.parity import compare

    nodes = [helper.make_node("Softmax", ["x"], ["s"], axis=-1),
             helper.make_node("LayerNormalization", ["s", "g", "b"], ["y"], axis=-1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 1100])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 1100])],
                              [onnx.numpy_helper.from_array(np.ones(1100, np.float32), "g"),
                               onnx.numpy_helper.from_array(np.zeros(1100, np.float32), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    report = compare(model, devices=("cpu",), paths=("reference", "auto"), all_nodes=True, rtol=1e-4, atol=1e-5)
    assert report.baseline == "cpu[reference]" and [r.label for r in report.sides] == ["cpu[auto]"]
    assert report.passed


def test_blockwise_blocks_are_exact():
    """'Elementwise.blocks' gives the reference's values exactly (the same elementwise
    chain on blocks), for several blocks, a ragged last one, a second operand and another
    output dtype."""
    from gpukernels.host import tuning
    from gpukernels.kernels.math import _mathcommon

    rng = np.random.default_rng(5)
    x = _f32(rng, 5 * tuning.value("elementwise.block_elems") + 17, 1)
    y = _f32(rng, x.size, 1)
    chain = [lambda a: np.tanh(a * np.float32(1.5)) * a + np.float32(0.25),
             lambda a, b: np.hypot(a, b) * np.exp(-a * b)]
    for fn, others, out_dtype in ((chain[0], (), None), (chain[1], (y,), None),
                                  (lambda a: (a > 0.1).astype(np.float64), (), np.float64)):
        got = {}
        for paths in ("auto", "reference"):
            kernel = KernelBase.__new__(KernelBase)
            kernel.ctx = KernelContext("cpu", options={"paths": paths})
            with specialize.recording() as chosen:
                got[paths] = _mathcommon.blockwise(np, fn, x, out_dtype, *others, kernel=kernel)
            assert [s.site for s in chosen] == (["Elementwise.blocks"] if paths == "auto" else [])
        assert got["auto"].dtype == got["reference"].dtype and got["auto"].shape == (x.size, 1)
        np.testing.assert_array_equal(got["auto"], got["reference"])


@pytest.mark.parametrize("shape,dtype,want", [((40, 52), np.float32, []), ((40, 51), np.float64, []),
                                              ((2047,), np.float32, []),
                                              ((600, 600), np.float32, ["Elementwise.blocks"])])
def test_erf_paths(shape, dtype, want):
    """Which erf a host Erf takes: the rational approximation for float32 from 2048
    elements (the reference on both devices, blocked above 4 blocks), scipy.special.erf
    otherwise; both within 6e-7 of the float64 erf (scipy, independent of the kernel)."""
    from scipy.special import erf as erf64

    x = (np.random.default_rng(3).standard_normal(shape) * 2).astype(dtype)
    with specialize.recording() as chosen:
        got = _arrays(_run("Erf", AUTO, [x], {}))[0]
    assert [s.site for s in chosen] == want
    assert got.dtype == dtype
    np.testing.assert_allclose(got, erf64(x.astype(np.float64)), rtol=6e-7 if dtype == np.float32 else 1e-15,
                               atol=1e-37)


# ------------------------------------------- host specialisations bitwise equal to the reference

# A host specialisation of an elementwise or row-wise float operation computes the same
# operations in the same order as the reference, so that on the host it is bitwise equal to
# it (and to the CuPy simulation, which runs the reference on NumPy); it may differ only in
# blocking over rows/blocks, threads and buffer reuse.  Small tuning blocks make the host
# paths split the rows/elements over several blocks and threads.
_SMALL_BLOCKS = {"norm.host_row_block_bytes": 4096, "softmax.row_block_elems": 3000,
                 "softmax.host_block_elems": 2048, "elementwise.block_elems": 1024}


def _bits(a):
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def _ln_case(r, shape, op):
    x = _f32(r, *shape, scale=2.0) + 3
    s, b = _f32(r, shape[-1]), _f32(r, shape[-1])
    return (op, [x, s, b] if op == "LayerNormalization" else [x, s], {"axis": -1}, 23)


def _softmax_x(r, shape, scale):
    x = _f32(r, *shape, scale=scale)
    if x.ndim >= 2 and x.shape[-2] > 4:  # rows that need the max shift, mixed with safe ones
        x[..., 1, :] -= 200.0  # sum of exp < 1
        x[..., 3, :] += 95.0  # exp overflows
        x[..., 4, 0] = np.nan
    return x


_BITWISE = [
    # (site, op, shapes): rows of 1..9000 columns (BLAS dots, pairwise sums past 8192)
    *[("LayerNormalization.rows", op, shape) for op in ("LayerNormalization", "RMSNormalization")
      for shape in ((3, 5), (8, 50, 96), (700, 257), (2, 65, 768), (9, 9000))],
    *[("LayerNormalization.rows", "InstanceNormalization", shape)
      for shape in ((2, 3), (2, 5, 7), (3, 40, 257), (2, 64, 3199), (1, 3, 9000))],
    *[("LayerNormalization.rows", op, shape) for op in ("GroupNormalization-18", "GroupNormalization-21")
      for shape in ((2, 8, 5), (2, 32, 24, 24), (1, 4, 9000))],
    *[("Softmax.along", op, shape) for op in ("Softmax", "LogSoftmax")
      for shape in ((2, 8, 64, 64), (50, 1100), (300, 7), (4, 9000))],
    *[("Elementwise.blocks", op, shape) for op in ("Erf",) for shape in ((5, 900), (5, 4099))],
]


@pytest.mark.parametrize("scale", [1.0, 30.0])
@pytest.mark.parametrize("site,op,shape", _BITWISE, ids=[f"{op}-{'x'.join(map(str, sh))}" for _, op, sh in _BITWISE])
def test_host_rows_are_bitwise_equal(site, op, shape, scale):
    """Each host specialisation made bitwise gives the reference's bits (paths='auto' takes
    the specialisation, 'reference' none), on several shapes and with small blocks (several
    blocks over the host threads)."""
    from gpukernels.host import tuning

    rng = np.random.default_rng(zlib.crc32(f"{op}{shape}{scale}".encode()))
    if op in ("Softmax", "LogSoftmax"):
        inputs, attrs, opset = [_softmax_x(rng, shape, scale)], {"axis": -1}, None
    elif op == "Erf":
        inputs, attrs, opset = [_f32(rng, *shape, scale=scale / 10)], {}, None
    elif op == "InstanceNormalization":
        inputs = [_f32(rng, *shape, scale=2.0 * scale) + 3, _f32(rng, shape[1]), _f32(rng, shape[1])]
        attrs, opset = {}, None
    elif op.startswith("GroupNormalization"):  # 4 groups; opset 18 scales per group, 21 per channel
        op, opset = "GroupNormalization", int(op.rsplit("-", 1)[1])
        n = 4 if opset == 18 else shape[1]
        inputs = [_f32(rng, *shape, scale=2.0 * scale) + 3, _f32(rng, n), _f32(rng, n)]
        attrs = {"num_groups": 4}
    else:
        _, inputs, attrs, opset = _ln_case(rng, shape, op)
        inputs[0] *= np.float32(scale)
    site = "LogSoftmax.along" if op == "LogSoftmax" else site
    with tuning.override(**_SMALL_BLOCKS):
        with specialize.recording() as chosen:
            fast = _arrays(_run(op, AUTO, inputs, attrs, opset))
        assert site in {s.site for s in chosen}, (op, shape, [s.site for s in chosen])
        with specialize.recording() as chosen:
            ref = _arrays(_run(op, REFERENCE, inputs, attrs, opset))
        assert not chosen
    for f, w in zip(fast, ref):
        assert f.dtype == w.dtype == np.float32 and f.shape == w.shape
        assert np.array_equal(_bits(f), _bits(w)), (
            f"{op} {shape}: {int(np.sum(_bits(f) != _bits(w)))} values differ from the reference")


@pytest.mark.parametrize("R,n", [(1, 1), (7, 13), (130, 256), (33, 8192)])
def test_row_dots_reach_the_same_blas_dot(R, n):
    """softmax._dots: NumPy's vecdot and the matmul form a namespace without vecdot (CuPy)
    runs give the same bits on NumPy (the same BLAS dot per row), for a row of ones too."""
    from gpukernels.kernels.math import softmax

    class NoVecdot:  # NumPy without vecdot, as CuPy 14's namespace
        matmul = staticmethod(np.matmul)

    rng = np.random.default_rng(R * n)
    a, b = _f32(rng, R, n), _f32(rng, R, n)
    for other in (b, np.ones(n, np.float32)):
        want = np.vecdot(a, other)
        got = softmax._dots(NoVecdot, a, other)
        assert got.shape == (R,) and np.array_equal(_bits(got), _bits(want))


def _resize_x(r, shape):
    x = _f32(r, *shape)
    if x.size > 100:
        x.reshape(-1)[[7, 50]] = [np.nan, np.inf]  # non-finite values stay local: taps there
    return x


_DEVICE_CASES = [
    ("LayerNormalization", lambda r: [_f32(r, 2, 65, 768, scale=2.0) + 3, _f32(r, 768), _f32(r, 768)], {}, None),
    ("RMSNormalization", lambda r: [_f32(r, 700, 257), _f32(r, 257)], {}, 23),
    ("Softmax", lambda r: [_softmax_x(r, (2, 8, 64, 64), 3.0)], {"axis": -1}, None),
    ("Softmax", lambda r: [_softmax_x(r, (300, 7), 30.0)], {"axis": -1}, None),
    ("LogSoftmax", lambda r: [_f32(r, 50, 1100, scale=3.0)], {"axis": -1}, None),
    ("Erf", lambda r: [_f32(r, 2, 65, 1024, scale=2.0)], {}, None),
    ("Pow", lambda r: [_f32(r, 2, 64, 1024, scale=3.0), np.array(3.0, np.float32)], {}, None),
    ("Pow", lambda r: [_f32(r, 2, 64, 1024, scale=3.0), np.array(4, np.int64)], {}, None),
    ("Resize", lambda r: [_f32(r, 2, 64, 1, 1), None, None, _int64([2, 64, 24, 24])], {"mode": "linear"}, None),
    ("Resize", lambda r: [_resize_x(r, (2, 16, 24, 24)), None, None, _int64([2, 16, 96, 96])], {"mode": "linear"},
     None),
    ("Resize", lambda r: [_f32(r, 1, 3, 64, 64), None, None, _int64([1, 3, 30, 100])],
     {"mode": "cubic", "antialias": 1}, None),
]


@pytest.mark.parametrize("index", range(len(_DEVICE_CASES)),
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(_DEVICE_CASES)])
def test_devices_give_the_same_bits(device, index, monkeypatch):
    """The host (default paths, its specialisations) and the device's reference give the
    same bits: on the CuPy simulation (GPUKERNELS_SIMULATE_CUDA=1), which runs the
    reference on NumPy, this is the parity of quantized models (a one-ulp difference
    upstream of a quantizer changes its integers)."""
    monkeypatch.delenv("GPUKERNELS_PATHS", raising=False)
    op, make, attrs, opset = _DEVICE_CASES[index]
    inputs = make(np.random.default_rng(77 + index))
    cls, _ = lookup(op, "", opset)
    want = _arrays(cls(KernelContext("cpu", opset=opset))(*inputs, **attrs))
    on_device = [None if v is None else Tensor(v).to(device) for v in inputs]
    got = _arrays(cls(KernelContext(device, opset=opset))(*on_device, **attrs))
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert np.array_equal(_bits(g), _bits(w)), f"{op}: {int(np.sum(_bits(g) != _bits(w)))} values differ"
