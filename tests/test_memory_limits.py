"""max_tensor_bytes (gpukernels.limits): every shape-driven allocation is checked before
it happens, so a model asking for a huge tensor fails at once with a ResourceLimitError
naming the operator, the shape, the bytes and the limit -- never by exhausting memory.

Each huge request here would need terabytes; the tests pass because the check comes
before the allocation (a regression would hit MemoryError or the OOM killer instead)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper as oh

from gpukernels import KernelContext, Sequence, Tensor, limits
from gpukernels.errors import GpuKernelsError, ModelError, NodeError, OptionError, ResourceLimitError
from gpukernels.kernels import (STFT, AffineGrid, BlackmanWindow, CenterCropPad, Col2Im, ConcatFromSequence,
                                ConstantOfShape, Conv, ConvTranspose, DFT, EyeLike, Expand, HammingWindow,
                                HannWindow, ImageDecoder, Loop, MaxPool, MaxRoiPool, MaxUnpool,
                                MelWeightMatrix, Multinomial, OneHot, Pad, RandomNormal, RandomNormalLike,
                                RandomUniform, RandomUniformLike, Range, Resize, RoiAlign, Scan, SequenceInsert,
                                SequenceMap, SplitToSequence, StringSplit, TfIdfVectorizer, Tile, Upsample)
from gpukernels.runtime import Session
from gpukernels.runtime.attributes import sparse_to_dense

GiB = 1024 ** 3
BIG = 10 ** 12  # elements: terabytes whatever the type


@pytest.fixture(autouse=True)
def _no_env_limit(monkeypatch):
    monkeypatch.delenv(limits.ENV_VAR, raising=False)


def ctx(device="cpu", **options):
    return KernelContext(device, options=options)


def i64(*values):
    return np.array(values, np.int64)


def f32(shape):
    return np.ones(shape, np.float32)


# ------------------------------------------------------------------ the limit itself


def test_default_limit_and_resolution_order(monkeypatch):
    assert limits.DEFAULT_MAX_TENSOR_BYTES == 4 * GiB
    assert limits.max_tensor_bytes(ctx()) == 4 * GiB
    assert limits.max_tensor_bytes(None) == 4 * GiB
    monkeypatch.setenv(limits.ENV_VAR, "1MiB")
    assert limits.max_tensor_bytes(ctx()) == 2 ** 20
    # the option wins over the environment
    assert limits.max_tensor_bytes(ctx(max_tensor_bytes=123)) == 123
    assert limits.max_tensor_bytes(ctx(max_tensor_bytes="none")) is None
    monkeypatch.setenv(limits.ENV_VAR, "0")
    assert limits.max_tensor_bytes(ctx()) is None
    monkeypatch.setenv(limits.ENV_VAR, "  ")
    assert limits.max_tensor_bytes(ctx()) == 4 * GiB


@pytest.mark.parametrize("value, expected", [
    (0, None), ("0", None), ("none", None), ("Unlimited", None), (np.int64(5), 5), (7.0, 7),
    (1000, 1000), ("1000", 1000), ("2KB", 2000), ("2k", 2000), ("2KiB", 2048), ("3 MiB", 3 * 2 ** 20),
    ("8GiB", 8 * GiB), ("1G", 10 ** 9), ("1TiB", 2 ** 40), ("512b", 512),
])
def test_parse_limit(value, expected):
    assert limits.parse_limit(value) == expected


@pytest.mark.parametrize("value", [-1, "-5", "5 apples", "1.5GiB", 2.5, True, [1], "GiB"])
def test_bad_limit_values_raise(value, monkeypatch):
    with pytest.raises(OptionError, match="max_tensor_bytes"):
        limits.max_tensor_bytes(ctx(max_tensor_bytes=value))
    if isinstance(value, str):
        monkeypatch.setenv(limits.ENV_VAR, value)
        with pytest.raises(OptionError, match=limits.ENV_VAR):
            limits.max_tensor_bytes(ctx())


def test_check_allocation_counts_exactly_and_says_how_to_raise():
    k = ConstantOfShape(ctx())
    # [2**40, 2**40] float32 is 2**82 bytes: Python ints, no int64 wrap-around to something small
    with pytest.raises(ResourceLimitError) as info:
        limits.check_allocation(k, [2 ** 40, 2 ** 40], np.float32)
    e = info.value
    assert e.nbytes == 2 ** 82 and e.limit == 4 * GiB and e.shape == (2 ** 40, 2 ** 40)
    assert e.op_type == "ConstantOfShape"
    text = str(e)
    assert text.startswith("ConstantOfShape: output of shape [1099511627776, 1099511627776]")
    assert f"{2 ** 82:,} bytes" in text and "max_tensor_bytes=4,294,967,296 (4 GiB)" in text
    assert "options={'max_tensor_bytes': N}" in text and limits.ENV_VAR in text
    assert isinstance(e, ValueError) and isinstance(e, GpuKernelsError)
    # int64 products that wrap to a small or negative number must still be caught
    with pytest.raises(ResourceLimitError):
        limits.check_allocation(k, [2 ** 32, 2 ** 32], 1)
    assert limits.check_allocation(k, [2, 3], np.float64) == 48
    assert limits.check_allocation(k, [], np.float32) == 4
    assert limits.check_allocation(k, [0, 2 ** 62], np.float32) == 0
    assert limits.check_allocation(ctx(max_tensor_bytes=48), [2, 3], np.float64) == 48
    with pytest.raises(ResourceLimitError, match=r"^output of shape \[7\] needs 56 bytes"):
        limits.check_allocation(ctx(max_tensor_bytes=48), [7], np.float64)


# ------------------------------------------------------------------ every operator


def _seq(*arrays):
    return Sequence([Tensor(a) for a in arrays])


def _png(width, height):
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (width, height), (10, 20, 30)).save(buf, format="PNG")
    return np.frombuffer(buf.getvalue(), np.uint8).copy()


def _scan_body():
    # state s -> s; scan output: a [1000] float32 constant per step
    big = oh.make_tensor("c", TP.FLOAT, [1000], np.zeros(1000, np.float32))
    return oh.make_graph(
        [oh.make_node("Identity", ["s_in"], ["s_out"]), oh.make_node("Constant", [], ["y"], value=big)],
        "body", [oh.make_tensor_value_info("s_in", TP.FLOAT, [1]),
                 oh.make_tensor_value_info("x", TP.FLOAT, [])],
        [oh.make_tensor_value_info("s_out", TP.FLOAT, [1]), oh.make_tensor_value_info("y", TP.FLOAT, [1000])])


def _map_body():
    big = oh.make_tensor("c", TP.FLOAT, [1000], np.zeros(1000, np.float32))
    return oh.make_graph([oh.make_node("Constant", [], ["y"], value=big)], "body",
                         [oh.make_tensor_value_info("x", TP.FLOAT, [1])],
                         [oh.make_tensor_value_info("y", TP.FLOAT, [1000])])


# (name, call(ctx) -> anything, options): each asks for far more than the limit
HUGE = [
    ("ConstantOfShape", lambda c: ConstantOfShape(c)(i64(2 ** 20, 2 ** 20), value=np.zeros(1, np.float32)), {}),
    ("ConstantOfShape-2**40", lambda c: ConstantOfShape(c)(i64(2 ** 40, 2 ** 40)), {}),
    ("Expand", lambda c: Expand(c)(f32((1, 1)), i64(10 ** 6, 10 ** 6)), {}),
    ("Expand-bidirectional", lambda c: Expand(c)(f32((10 ** 6, 1)), i64(1, 10 ** 6)), {}),
    ("Tile", lambda c: Tile(c)(f32((2, 3)), i64(10 ** 9, 10 ** 9)), {}),
    ("Resize-scales", lambda c: Resize(c)(f32((1, 1, 2, 2)), None, np.array([1, 1, 1e6, 1e6], np.float32)), {}),
    ("Resize-sizes", lambda c: Resize(c)(f32((1, 1, 2, 2)), None, None, i64(1, 1, 10 ** 6, 10 ** 6),
                                         mode="linear"), {}),
    ("Upsample", lambda c: Upsample(c)(f32((1, 1, 2, 2)), np.array([1, 1, 1e6, 1e6], np.float32)), {}),
    ("Pad", lambda c: Pad(c)(f32((2, 2)), i64(0, 0, 10 ** 6, 10 ** 6)), {}),
    ("Pad-reflect", lambda c: Pad(c)(f32((2, 2)), i64(10 ** 6, 10 ** 6, 10 ** 6, 10 ** 6), mode="edge"), {}),
    ("CenterCropPad", lambda c: CenterCropPad(c)(f32((2, 2)), i64(10 ** 6, 10 ** 6)), {}),
    ("OneHot", lambda c: OneHot(c)(i64(1, 2, 3), np.array(BIG, np.int64), np.array([0, 1], np.float32)), {}),
    ("ConvTranspose-output_shape", lambda c: ConvTranspose(c)(f32((1, 1, 2, 2)), f32((1, 1, 2, 2)),
                                                             output_shape=[10 ** 6, 10 ** 6]), {}),
    ("ConvTranspose-strides", lambda c: ConvTranspose(c)(f32((1, 1, 2, 2)), f32((1, 1, 2, 2)),
                                                        strides=[10 ** 7, 10 ** 7]), {}),
    ("Conv-pads", lambda c: Conv(c)(f32((1, 1, 2, 2)), f32((1, 1, 1, 1)), pads=[0, 0, 10 ** 6, 10 ** 6]), {}),
    ("MaxPool-pads", lambda c: MaxPool(c)(f32((1, 1, 2, 2)), kernel_shape=[1, 1],
                                          pads=[0, 0, 10 ** 6, 10 ** 6]), {}),
    ("MaxUnpool-strides", lambda c: MaxUnpool(c)(f32((1, 1, 2, 2)), np.zeros((1, 1, 2, 2), np.int64),
                                                 kernel_shape=[2, 2], strides=[10 ** 7, 10 ** 7]), {}),
    ("MaxUnpool-output_shape", lambda c: MaxUnpool(c)(f32((1, 1, 2, 2)), np.zeros((1, 1, 2, 2), np.int64),
                                                      i64(1, 1, 10 ** 6, 10 ** 6), kernel_shape=[2, 2],
                                                      strides=[2, 2]), {}),
    ("MaxRoiPool", lambda c: MaxRoiPool(c)(f32((1, 1, 4, 4)), np.zeros((1, 5), np.float32),
                                           pooled_shape=[10 ** 6, 10 ** 6]), {}),
    ("RoiAlign-output", lambda c: RoiAlign(c)(f32((1, 1, 4, 4)), np.zeros((1, 4), np.float32), i64(0),
                                             output_height=10 ** 6, output_width=10 ** 6), {}),
    ("RoiAlign-samples", lambda c: RoiAlign(c)(f32((1, 8, 4, 4)), np.array([[0, 0, 1e12, 1]], np.float32),
                                              i64(0), output_height=2, output_width=2), {}),
    ("Col2Im-pads", lambda c: Col2Im(c)(f32((1, 1, 1)), i64(1, 1), i64(1, 1),
                                        pads=[0, 0, 10 ** 7, 10 ** 7], strides=[10 ** 8, 10 ** 8]), {}),
    ("AffineGrid", lambda c: AffineGrid(c)(np.zeros((1, 2, 3), np.float32), i64(1, 1, 10 ** 6, 10 ** 6)), {}),
    ("HannWindow", lambda c: HannWindow(c)(np.array(BIG, np.int64)), {}),
    ("HammingWindow", lambda c: HammingWindow(c)(np.array(BIG, np.int64)), {}),
    ("BlackmanWindow", lambda c: BlackmanWindow(c)(np.array(BIG, np.int64)), {}),
    ("MelWeightMatrix", lambda c: MelWeightMatrix(c)(np.array(10 ** 6, np.int64), np.array(10 ** 7, np.int64),
                                                     np.array(16000, np.int64), np.array(0.0, np.float32),
                                                     np.array(8000.0, np.float32)), {}),
    ("DFT-dft_length", lambda c: DFT(c)(f32((1, 4, 1)), np.array(BIG, np.int64)), {}),
    ("STFT-frames", lambda c: STFT(c)(f32((1, 100_000, 1)), np.array(1, np.int64), None,
                                      np.array(50_000, np.int64)), {}),
    ("RandomUniform", lambda c: RandomUniform(c)(shape=[10 ** 6, 10 ** 6]), {}),
    ("RandomNormal", lambda c: RandomNormal(c)(shape=[10 ** 6, 10 ** 6], dtype=int(TP.DOUBLE)), {}),
    ("RandomUniformLike", lambda c: RandomUniformLike(c)(f32((1000,)), dtype=int(TP.DOUBLE)),
     {"max_tensor_bytes": 4000}),
    ("RandomNormalLike", lambda c: RandomNormalLike(c)(f32((1000,))), {"max_tensor_bytes": 3999}),
    ("Multinomial", lambda c: Multinomial(c)(f32((2, 3)), sample_size=BIG), {}),
    ("Range", lambda c: Range(c)(np.array(0, np.int64), np.array(BIG, np.int64), np.array(1, np.int64)), {}),
    ("Range-float", lambda c: Range(c)(np.array(0, np.float32), np.array(1e12, np.float32),
                                       np.array(1, np.float32)), {}),
    ("EyeLike", lambda c: EyeLike(c)(np.zeros((100, 100), np.uint8), dtype=int(TP.DOUBLE)),
     {"max_tensor_bytes": 79_999}),
    ("TfIdfVectorizer", lambda c: TfIdfVectorizer(c)(i64(1, 2, 3), max_gram_length=1, max_skip_count=0,
                                                     min_gram_length=1, mode="TF", ngram_counts=[0],
                                                     ngram_indexes=[BIG], pool_int64s=[1]), {}),
    ("StringSplit", lambda c: StringSplit(c)(np.array(["a " * 1000] + ["a"] * 999, dtype=object)),
     {"max_tensor_bytes": 1_000_000}),
    ("ImageDecoder", lambda c: ImageDecoder(c)(_png(100, 100)), {"max_tensor_bytes": 29_999}),
    ("SequenceInsert", lambda c: SequenceInsert(c)(_seq(f32(1000), f32(1000)), Tensor(f32(1000))),
     {"max_tensor_bytes": 12_000}),
    ("ConcatFromSequence", lambda c: ConcatFromSequence(c)(_seq(*[f32((1, 1000))] * 3), axis=0),
     {"max_tensor_bytes": 11_999}),
    ("ConcatFromSequence-new_axis", lambda c: ConcatFromSequence(c)(_seq(*[f32(1000)] * 3), axis=0,
                                                                    new_axis=1), {"max_tensor_bytes": 11_999}),
    ("SplitToSequence-empty-parts", lambda c: SplitToSequence(c)(np.zeros((10 ** 9, 0), np.float32)), {}),
    ("SplitToSequence-scalar", lambda c: SplitToSequence(c)(np.zeros((10 ** 9, 0), np.float32),
                                                            np.array(1, np.int64)), {}),
    ("SequenceMap", lambda c: SequenceMap(c)(_seq(*[f32(1)] * 10), body=_map_body()),
     {"max_tensor_bytes": 20_000}),
    ("Scan", lambda c: Scan(c)(f32(1), f32(100), body=_scan_body(), num_scan_inputs=1),
     {"max_tensor_bytes": 100_000}),
    ("Scan-opset8", lambda c: Scan(KernelContext(c.device, 8, c.options))(
        None, f32((2, 1)), f32((2, 100)), body=_scan_body(), num_scan_inputs=1),
     {"max_tensor_bytes": 100_000}),
]


@pytest.mark.parametrize("name, call, options", HUGE, ids=[h[0] for h in HUGE])
def test_huge_requests_raise_before_allocating(device, name, call, options):
    op = name.split("-")[0]
    with pytest.raises(ResourceLimitError, match=rf"^{op}: .*needs [\d,]+ bytes .*more than the limit "
                                                  r"max_tensor_bytes=") as info:
        call(ctx(device, **options))
    assert info.value.nbytes > info.value.limit


# The same operators within the limit still work (and give right answers).
def test_normal_sizes_still_work(device):
    c = ctx(device)
    y = ConstantOfShape(c)(i64(2, 3), value=np.array([7], np.int32))
    np.testing.assert_array_equal(y.numpy(), np.full((2, 3), 7, np.int32))
    np.testing.assert_array_equal(Expand(c)(f32((1, 2)), i64(3, 1)).numpy(), np.ones((3, 2), np.float32))
    np.testing.assert_array_equal(Tile(c)(np.arange(2, dtype=np.float32), i64(3)).numpy(),
                                  np.tile(np.arange(2, dtype=np.float32), 3))
    assert Pad(c)(f32((2, 2)), i64(1, 1, 1, 1)).shape == (4, 4)
    assert OneHot(c)(i64(0, 2), np.array(3, np.int64), np.array([0, 1], np.float32)).shape == (2, 3)
    assert Range(c)(np.array(0, np.int64), np.array(5, np.int64), np.array(2, np.int64)).numpy().tolist() == [0, 2, 4]
    assert HannWindow(c)(np.array(8, np.int64)).shape == (8,)
    assert RandomUniform(c)(shape=[3, 4], seed=1.0).shape == (3, 4)
    seq = SplitToSequence(c)(np.arange(6, dtype=np.float32).reshape(3, 2))
    assert len(seq) == 3 and ConcatFromSequence(c)(seq, axis=0).shape == (3, 2)
    scan_out = Scan(c)(f32(1), f32(5), body=_scan_body(), num_scan_inputs=1)
    assert scan_out[1].shape == (5, 1000)


def test_limit_boundary_is_inclusive():
    # exactly the limit passes, one byte more fails
    c = ctx(max_tensor_bytes=4000)
    assert ConstantOfShape(c)(i64(1000)).shape == (1000,)
    with pytest.raises(ResourceLimitError, match=r"needs 4,004 bytes"):
        ConstantOfShape(c)(i64(1001))


def test_option_and_environment_variable(monkeypatch):
    shape = i64(1000, 1000)  # 4 MB of float32
    assert ConstantOfShape(ctx())(shape).shape == (1000, 1000)
    with pytest.raises(ResourceLimitError, match="max_tensor_bytes=1,048,576"):
        ConstantOfShape(ctx(max_tensor_bytes="1MiB"))(shape)
    monkeypatch.setenv(limits.ENV_VAR, "1MiB")
    with pytest.raises(ResourceLimitError, match=r"max_tensor_bytes=1,048,576 \(1 MiB\)"):
        ConstantOfShape(ctx())(shape)
    # the option overrides the environment, either way
    assert ConstantOfShape(ctx(max_tensor_bytes=8 * 10 ** 6))(shape).shape == (1000, 1000)
    assert ConstantOfShape(ctx(max_tensor_bytes=0))(shape).shape == (1000, 1000)
    monkeypatch.setenv(limits.ENV_VAR, "none")
    assert ConstantOfShape(ctx())(shape).shape == (1000, 1000)
    with pytest.raises(ResourceLimitError):
        ConstantOfShape(ctx(max_tensor_bytes=1000))(shape)


# ------------------------------------------------------------------ Loop


def _loop_model(passthrough=True, scan_elems=1000):
    """Loop(M, cond) whose body emits a [scan_elems] float32 constant as a scan output;
    the body's cond_out is its cond_in (passthrough) or a computed And(cond, true)."""
    big = oh.make_tensor("c", TP.FLOAT, [scan_elems], np.zeros(scan_elems, np.float32))
    nodes = [oh.make_node("Constant", [], ["y"], value=big)]
    if passthrough:
        nodes.append(oh.make_node("Identity", ["cond_in"], ["cond_out"]))
    else:
        nodes += [oh.make_node("Constant", [], ["t"], value=oh.make_tensor("tv", TP.BOOL, [], [True])),
                  oh.make_node("And", ["cond_in", "t"], ["cond_out"])]
    body = oh.make_graph(nodes, "body",
                         [oh.make_tensor_value_info("i", TP.INT64, []),
                          oh.make_tensor_value_info("cond_in", TP.BOOL, [])],
                         [oh.make_tensor_value_info("cond_out", TP.BOOL, []),
                          oh.make_tensor_value_info("y", TP.FLOAT, [scan_elems])])
    graph = oh.make_graph([oh.make_node("Loop", ["M", "cond"], ["ys"], body=body, name="the_loop")], "g",
                          [oh.make_tensor_value_info("M", TP.INT64, []),
                           oh.make_tensor_value_info("cond", TP.BOOL, [])],
                          [oh.make_tensor_value_info("ys", TP.FLOAT, None)])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


def _feeds(m):
    return {"M": np.array(m, np.int64), "cond": np.array(True)}


def test_loop_trip_count_times_scan_bytes_fails_up_front(device):
    # 10**9 trips x 4 KB: refused after the first iteration, not after 4 GiB of them
    sess = Session(_loop_model(), device=device)
    with pytest.raises(NodeError) as info:
        sess.run(None, _feeds(10 ** 9))
    e = info.value
    assert isinstance(e, ValueError) and isinstance(e.__cause__, ResourceLimitError)
    assert "the_loop" in str(e) and "Loop" in str(e)
    assert "scan outputs of 1,000,000,000 iterations (the trip count M" in str(e)
    assert e.__cause__.nbytes > 4 * 10 ** 12


def test_loop_running_total_is_checked(device):
    # a computed condition: the trip count cannot be trusted, the running total is checked
    sess = Session(_loop_model(passthrough=False, scan_elems=250), device=device,
                   options={"max_tensor_bytes": 100_000})  # ~87 iterations of 1,128 bytes
    assert sess.run(None, _feeds(50))[0].shape == (50, 250)
    with pytest.raises(NodeError) as info:
        sess.run(None, _feeds(10 ** 9))
    cause = info.value.__cause__
    assert isinstance(cause, ResourceLimitError)
    assert 100_000 < cause.nbytes <= 100_000 + 1128
    assert f"scan outputs of {cause.nbytes // 1128:,} iterations" in str(cause)


def test_loop_within_limit_and_without_compiled_bodies(device):
    for compile_bodies in (True, False):
        opts = {"compile_bodies": compile_bodies, "max_tensor_bytes": 1_000_000}
        out = Session(_loop_model(), device=device, options=opts).run(None, _feeds(20))[0]
        assert out.shape == (20, 1000)
        with pytest.raises(NodeError, match="max_tensor_bytes=1,000,000"):
            Session(_loop_model(passthrough=False), device=device, options=opts).run(None, _feeds(10 ** 6))


def test_loop_callback_form_checks_the_running_total():
    k = Loop(ctx(max_tensor_bytes=50_000))

    def body(it, cond, state):
        return [cond, Tensor(np.zeros(1000, np.float32))]

    with pytest.raises(ResourceLimitError, match=r"^Loop: the scan outputs of 13 iterations"):
        k.run_callback(np.array(10 ** 9, np.int64), None, (), body=body)


# ------------------------------------------------------------------ through a Session


def _constant_of_shape_model(shape_as_initializer: bool):
    nodes = [oh.make_node("ConstantOfShape", ["shape"], ["y"], name="make_it_big",
                          value=oh.make_tensor("v", TP.FLOAT, [1], [1.0]))]
    inputs, inits = [], []
    if shape_as_initializer:
        inits.append(oh.make_tensor("shape", TP.INT64, [2], [2 ** 20, 2 ** 20]))
        nodes.append(oh.make_node("Identity", ["y"], ["out"]))
        out = "out"
    else:
        inputs.append(oh.make_tensor_value_info("shape", TP.INT64, [2]))
        out = "y"
    graph = oh.make_graph(nodes, "g", inputs, [oh.make_tensor_value_info(out, TP.FLOAT, None)], inits)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 20)])


def test_session_error_names_node_operator_shape_and_bytes():
    sess = Session(_constant_of_shape_model(False), device="cpu")
    with pytest.raises(NodeError) as info:
        sess.run(None, {"shape": i64(2 ** 20, 2 ** 20)})
    text = str(info.value)
    assert isinstance(info.value, ValueError)
    assert "make_it_big" in text and "ConstantOfShape" in text
    assert "[1048576, 1048576]" in text and f"{4 * 2 ** 40:,} bytes" in text
    assert isinstance(info.value.__cause__, ResourceLimitError)
    assert sess.run(None, {"shape": i64(2, 2)})[0].shape == (2, 2)


def test_session_option_and_constant_folding():
    # a constant shape: folding at Session() must not allocate it either; the error
    # comes when the node runs
    sess = Session(_constant_of_shape_model(True), device="cpu")
    with pytest.raises(NodeError, match="make_it_big"):
        sess.run(None, {})
    ok = Session(_constant_of_shape_model(False), device="cpu", options={"max_tensor_bytes": 100})
    assert ok.run(None, {"shape": i64(5, 5)})[0].shape == (5, 5)
    with pytest.raises(NodeError, match=r"max_tensor_bytes=100 \(100 B\)"):
        ok.run(None, {"shape": i64(6, 5)})


# ------------------------------------------------------------------ sparse tensors


def _sparse(dims, values, indices, name="sp"):
    vals = oh.make_tensor(name, TP.FLOAT, [len(values)], values)
    idx = np.asarray(indices, np.int64)
    ind = oh.make_tensor("idx", TP.INT64, list(idx.shape), idx.reshape(-1).tolist())
    return oh.make_sparse_tensor(vals, ind, dims)


def test_sparse_to_dense_checks_size_and_indices():
    np.testing.assert_array_equal(sparse_to_dense(_sparse([2, 3], [1.0, 2.0], [1, 5])).numpy(),
                                  [[0, 1, 0], [0, 0, 2]])
    np.testing.assert_array_equal(sparse_to_dense(_sparse([2, 3], [1.0, 2.0], [[0, 1], [1, 2]])).numpy(),
                                  [[0, 1, 0], [0, 0, 2]])
    assert sparse_to_dense(_sparse([0, 3], [], [])).shape == (0, 3)
    with pytest.raises(ResourceLimitError, match=r"sparse tensor 'sp' of shape \[1099511627776\]"):
        sparse_to_dense(_sparse([2 ** 40], [1.0], [0]))
    with pytest.raises(ResourceLimitError, match="max_tensor_bytes=16"):
        sparse_to_dense(_sparse([5], [1.0], [0]), ctx=ctx(max_tensor_bytes=16))
    # -1 must not wrap to the last element; past-the-end must not be clipped or crash
    with pytest.raises(ModelError, match=r"sparse tensor 'sp': linear index -1 \(entry 0\) lies outside \[0, 6\)"):
        sparse_to_dense(_sparse([2, 3], [1.0], [-1]))
    with pytest.raises(ModelError, match=r"linear index 6 \(entry 1\)"):
        sparse_to_dense(_sparse([2, 3], [1.0, 2.0], [0, 6]))
    with pytest.raises(ModelError, match=r"index \[0, -1\] \(entry 0\) lies outside dims \[2, 3\] \(axis 1"):
        sparse_to_dense(_sparse([2, 3], [1.0], [[0, -1]]))
    with pytest.raises(ModelError, match=r"index \[2, 0\] \(entry 0\) lies outside dims \[2, 3\] \(axis 0"):
        sparse_to_dense(_sparse([2, 3], [1.0], [[2, 0]]))
    with pytest.raises(ModelError, match="negative dimension"):
        sparse_to_dense(_sparse([-2, 3], [1.0], [0]))
    with pytest.raises(ModelError, match="do not fit 2 values"):
        sparse_to_dense(_sparse([2, 3], [1.0, 2.0], [0]))


def _sparse_model(sparse):
    graph = oh.make_graph([oh.make_node("Identity", ["sp"], ["y"])], "g", [],
                          [oh.make_tensor_value_info("y", TP.FLOAT, None)])
    graph.sparse_initializer.append(sparse)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


def _sparse_constant_model(sparse):
    graph = oh.make_graph([oh.make_node("Constant", [], ["y"], sparse_value=sparse)], "g", [],
                          [oh.make_tensor_value_info("y", TP.FLOAT, None)])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


@pytest.mark.parametrize("make", [_sparse_model, _sparse_constant_model], ids=["initializer", "attribute"])
def test_sparse_in_a_model(make):
    out = Session(make(_sparse([2, 3], [1.0, 2.0], [1, 5])), device="cpu").run(None, {})[0]
    np.testing.assert_array_equal(out, [[0, 1, 0], [0, 0, 2]])
    with pytest.raises(ResourceLimitError, match=r"sparse tensor 'sp' of shape \[1099511627776, 1024\]"):
        Session(make(_sparse([2 ** 40, 1024], [1.0], [0])), device="cpu")
    with pytest.raises(GpuKernelsError, match=r"sparse tensor 'sp': linear index -1"):
        Session(make(_sparse([2, 3], [1.0], [-1])), device="cpu")


def test_sequence_insert_growth_counts_every_element():
    # a sequence grown one insert at a time (as in a Loop) is limited by its total
    k = SequenceInsert(ctx(max_tensor_bytes=10 * (4000 + limits.ELEMENT_OVERHEAD)))
    t = Tensor(f32(1000))
    seq = Sequence([], TP.FLOAT)
    for _ in range(10):
        seq = k(seq, t)
    assert len(seq) == 10 and seq.held_bytes == 10 * (4000 + limits.ELEMENT_OVERHEAD)
    with pytest.raises(ResourceLimitError, match=r"^SequenceInsert: the output sequence of 11 elements"):
        k(seq, t)
    # a sequence built elsewhere (no running total kept) is summed
    with pytest.raises(ResourceLimitError):
        k(Sequence([t] * 10), t, np.array(0, np.int64))
    assert len(k(Sequence([t] * 9), t, np.array(0, np.int64))) == 10
