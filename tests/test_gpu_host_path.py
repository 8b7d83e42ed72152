"""The GPU host path under the CuPy simulation (tests/cupy_sim).

* Device-to-host transfers per kernel call, counted by the simulation (every ``get``/
  ``asnumpy``/``item``/``int``/``float``/``bool`` of a device array, data-dependent-size
  functions such as ``nonzero``, and explicit synchronisations count one each).  A float
  kernel with static attributes must make none: a transfer stalls the host until the GPU
  has finished everything queued, which serialises launches.  Validation that needs data
  goes through ``gpukernels.gpu.device_checks`` (read once per graph run).
* The launch layer's host work per call (``gpukernels.gpu.launch`` with a stub
  ``RawModule``): options and functions cached, no transfer in any operator's ``run()``.
* Compute capability: below sm_80 the hand-written kernels step aside for the array code,
  and ``gpukernels info`` says so.

Runs under the simulation (``GPUKERNELS_SIMULATE_CUDA=1``); in an ordinary run the one
test below starts it in a subprocess (the simulated ``cupy`` must never be imported into
an ordinary test process).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

SIMULATED = os.environ.get("GPUKERNELS_SIMULATE_CUDA") == "1"
ROOT = Path(__file__).resolve().parents[1]


if not SIMULATED:

    def test_gpu_host_path_under_the_cupy_simulation():
        env = dict(os.environ, GPUKERNELS_SIMULATE_CUDA="1")
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
             "--strict-markers", "-rs", str(Path(__file__).relative_to(ROOT))],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
        assert " passed" in run.stdout and " skipped" not in run.stdout, run.stdout[-3000:]

else:
    from gpukernels.gpu import device_checks
    from gpukernels.kernels import KernelContext, kernel_class
    from gpukernels.tensor import Tensor

    def _f32(rng, *shape, positive=False):
        a = rng.standard_normal(shape).astype(np.float32)
        return np.abs(a) + 0.5 if positive else a

    def _cases():
        """(op, inputs (host arrays; int64 shape inputs stay on the host, as constants
        do), attributes)."""
        r = np.random.default_rng(7)
        x4 = _f32(r, 2, 4, 8, 8)
        a, b = _f32(r, 2, 3, 4), _f32(r, 3, 4)
        cos, sin = np.cos(_f32(r, 1, 4, 4)), np.sin(_f32(r, 1, 4, 4))
        return [
            ("Conv", [x4, _f32(r, 6, 4, 3, 3), _f32(r, 6)], dict(pads=[1, 1, 1, 1])),
            ("Conv", [x4, _f32(r, 4, 1, 3, 3)], dict(group=4, strides=[2, 2])),
            ("MatMul", [a, _f32(r, 4, 5)], {}),
            ("Gemm", [_f32(r, 3, 4), _f32(r, 5, 4), _f32(r, 5)], dict(transB=1, alpha=0.5, beta=2.0)),
            ("Add", [a, b], {}),
            ("Sub", [a, b], {}),
            ("Mul", [a, b], {}),
            ("Div", [a, _f32(r, 3, 4, positive=True)], {}),
            ("Relu", [a], {}),
            ("Sigmoid", [a], {}),
            ("Tanh", [a], {}),
            ("Gelu", [a], {}),
            ("Gelu", [a], dict(approximate="tanh")),
            ("Softmax", [a], dict(axis=-1)),
            ("LayerNormalization", [a, _f32(r, 4), _f32(r, 4)], dict(axis=-1, epsilon=1e-5)),
            ("BatchNormalization", [x4, _f32(r, 4), _f32(r, 4), _f32(r, 4), _f32(r, 4, positive=True)],
             dict(epsilon=1e-5)),
            ("RotaryEmbedding", [_f32(r, 1, 2, 4, 8), cos, sin], {}),
            ("Transpose", [a], dict(perm=[2, 0, 1])),
            ("Concat", [a, _f32(r, 2, 5, 4)], dict(axis=1)),
            ("Reshape", [a, np.array([6, -1], np.int64)], {}),
            ("MaxPool", [x4], dict(kernel_shape=[2, 2], strides=[2, 2])),
            ("AveragePool", [x4], dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1])),
            ("GlobalAveragePool", [x4], {}),
        ]

    def _outputs(result) -> list:
        if isinstance(result, Tensor):
            return [result]
        return [r for r in result if isinstance(r, Tensor) and not r.is_absent]

    def _on_device(arrays):
        return [Tensor(v).to("cuda") if v.dtype != np.int64 else v for v in arrays]

    CASES = _cases()

    def _id(i, case):
        op = case.values[0] if hasattr(case, "values") else case[0]
        return f"{op}-{i}"

    @pytest.mark.parametrize("op, inputs, attrs", CASES, ids=[_id(i, c) for i, c in enumerate(CASES)])
    def test_float_kernel_with_static_attributes_makes_no_transfer(op, inputs, attrs, count_transfers):
        cls = kernel_class(op)
        want = _outputs(cls(KernelContext("cpu"))(*inputs, **attrs))
        kernel = cls(KernelContext("cuda"))
        args = _on_device(inputs)
        kernel(*args, **attrs)  # a first call may build and cache plans
        with count_transfers() as log:
            got = _outputs(kernel(*args, **attrs))
        assert log.count == 0, f"{op}: {log.count} device-to-host transfer(s): {log.report()}"
        assert len(got) == len(want)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=2e-5, atol=2e-5)

    def _rotary_inputs(rng, pos):
        x = Tensor(_f32(rng, 2, 3, 5, 8)).to("cuda")
        ang = rng.uniform(-3, 3, (9, 4))
        cos = Tensor(np.cos(ang).astype(np.float32)).to("cuda")
        sin = Tensor(np.sin(ang).astype(np.float32)).to("cuda")
        return x, cos, sin, Tensor(np.asarray(pos, np.int64)).to("cuda")

    def test_rotary_position_ids_are_checked_on_the_device_once_per_run(count_transfers, rng):
        RotaryEmbedding = kernel_class("RotaryEmbedding")
        k = RotaryEmbedding(KernelContext("cuda"))
        x, cos, sin, pos = _rotary_inputs(rng, rng.integers(0, 9, (2, 5)))
        k(x, cos, sin, pos)
        # outside a run: the range test is read at once, the one synchronisation of the call
        with count_transfers() as log:
            k(x, cos, sin, pos)
        assert log.count == 1, log.report()
        # inside a run (device_checks.deferred, as a graph run opens it): none per call,
        # one read for all the run's checks when it ends
        with count_transfers() as log:
            with device_checks.deferred():
                for _ in range(3):
                    k(x, cos, sin, pos)
                assert log.count == 0, log.report()
                assert device_checks.pending_count() == 3
        assert log.count == 1, log.report()

    @pytest.mark.parametrize("bad", [9, -1])
    def test_rotary_bad_position_ids_still_raise(bad, rng):
        from gpukernels.errors import KernelInputError

        k = kernel_class("RotaryEmbedding")(KernelContext("cuda"))
        ids = rng.integers(0, 9, (2, 5))
        ids[1, 3] = bad
        x, cos, sin, pos = _rotary_inputs(rng, ids)
        with pytest.raises(KernelInputError, match=r"position_ids must lie in \[0, 9\).*" + str(bad)):
            k(x, cos, sin, pos)
        with pytest.raises(KernelInputError, match=r"position_ids must lie in \[0, 9\)"):
            with device_checks.deferred():
                y = k(x, cos, sin, pos)  # runs (memory-safe), fails when the run's checks are read
                assert y.shape == x.shape

    def test_deferred_checks_join_the_outer_block_and_drop_on_error():
        import cupy

        calls = []
        with device_checks.deferred():
            with device_checks.deferred():
                device_checks.require(cupy.asarray(False), lambda: calls.append("inner"))
            assert device_checks.pending_count() == 1  # the outer block reads it
        assert calls == []
        with pytest.raises(ZeroDivisionError):
            with device_checks.deferred():
                device_checks.require(cupy.asarray(True), lambda: ValueError("not raised"))
                1 / 0
        assert device_checks.pending_count() == 0
        with pytest.raises(ValueError, match="first"):
            with device_checks.deferred():
                device_checks.require(cupy.asarray(False), lambda: ValueError("ok"))
                device_checks.require(cupy.asarray(True), lambda: ValueError("first"))
                device_checks.require(cupy.asarray(True), lambda: ValueError("second"))
        device_checks.require(np.bool_(False), lambda: ValueError("host"))
        with pytest.raises(ValueError, match="host"):
            device_checks.require(True, lambda: ValueError("host"))


    # ------------------------------------------------------------ launch layer
    class _StubFunction:
        def __init__(self, name):
            self.name = name
            self.calls = []
            self.smem_sets = []

        def __setattr__(self, key, value):
            if key == "max_dynamic_shared_size_bytes":
                self.smem_sets.append(value)
            object.__setattr__(self, key, value)

        def __call__(self, grid, block, args, shared_mem=0):
            self.calls.append((grid, block, len(args), shared_mem))

    @pytest.fixture
    def stub_backend(monkeypatch):
        """A CupyBackend on the simulated GPU whose RawModule compiles nothing (counts)."""
        import cupy

        from gpukernels.gpu import launch
        from gpukernels.xp import Device

        compiled = []

        class StubModule:
            def __init__(self, code=None, options=(), name_expressions=(), backend="nvrtc", **kw):
                compiled.append((tuple(name_expressions), tuple(options)))

            def get_function(self, name):
                return _StubFunction(name)

        monkeypatch.setattr(cupy, "RawModule", StubModule)
        monkeypatch.setattr(launch, "_modules", {})
        be = launch.CupyBackend(Device("cuda", 0))
        be.compiled = compiled
        return be

    def test_compile_options_are_computed_once(monkeypatch):
        from gpukernels.gpu import launch

        first = launch.compile_options()
        monkeypatch.setattr(launch, "cuda_include_dirs", lambda: pytest.fail("probed the file system again"))
        assert launch.compile_options() is first
        assert launch.compile_options(()) is first

    def test_function_hits_need_no_option_list_and_launches_set_shared_memory_once(stub_backend, monkeypatch):
        from gpukernels.gpu import launch

        be = stub_backend
        fn = be.function("rotary_embedding.cu", "gk_rotary<float, 4, false, true>")
        assert len(be.compiled) == 1
        monkeypatch.setattr(launch, "compile_options", lambda *a: pytest.fail("options rebuilt on a hit"))
        assert be.function("rotary_embedding.cu", "gk_rotary<float, 4, false, true>") is fn
        out = be.empty((4,), np.float32)
        for _ in range(3):
            be.launch(fn, (1,), (32,), (out, None), 64 * 1024, what="probe")
        assert fn.smem_sets == [64 * 1024] and len(fn.calls) == 3
        be.launch(fn, (1,), (32,), (out, None), 100 * 1024, what="probe")
        assert fn.smem_sets == [64 * 1024, 100 * 1024]

    def test_launch_descriptions_are_made_only_for_errors(stub_backend):
        from gpukernels.errors import CudaKernelError
        from gpukernels.gpu.launch import Lazy

        made = []

        def describe():
            made.append(1)
            return "MyOp (X: float32[3])"

        be = stub_backend
        fn = be.function("selftest.cu", "gk_selftest_warp")
        out = be.empty((4,), np.float32)
        be.launch(fn, (1,), (32,), (out,), 0, what=Lazy(describe))
        assert made == []
        with pytest.raises(CudaKernelError, match=r"MyOp \(X: float32\[3\]\) combine: block"):
            be.launch(fn, (1,), (2048,), (out,), 0, what=Lazy(describe) + " combine")
        assert made == [1]
        assert f"{Lazy(lambda: 'a')}-" == "a-"
        assert str("x" + Lazy(lambda: "y")) == "xy" and str(Lazy(lambda: "y") + "z") == "yz"

    def _launch_cases(rng):
        from gpukernels.tensor import Tensor

        def dev(a):
            return Tensor(a).to("cuda")

        f16 = np.float16
        x = dev(rng.standard_normal((1, 2, 8, 64)).astype(f16))
        ang = rng.uniform(-3, 3, (8, 32))
        yield "rotary_embedding", dict(X=x, cos_cache=dev(np.cos(ang).astype(f16)), sin_cache=dev(np.sin(ang).astype(f16)),
                                       position_ids=dev(np.tile(np.arange(8, dtype=np.int64), (1, 1))),
                                       interleaved=0, num_heads=2, rotary_embedding_dim=64)
        q = dev(rng.standard_normal((1, 2, 8, 64)).astype(f16))
        yield "attention", dict(Q=q, K=q, V=q, is_causal=1, q_num_heads=2, kv_num_heads=2, scale=0.125)
        q1 = dev(rng.standard_normal((1, 2, 1, 64)).astype(np.float32))
        kv = dev(rng.standard_normal((1, 1, 300, 64)).astype(np.float32))
        yield "attention", dict(Q=q1, K=kv, V=kv, q_num_heads=2, kv_num_heads=1, scale=0.125,
                                wants=(True, False, False, False))
        yield "conv", dict(X=dev(rng.standard_normal((1, 16, 8, 8)).astype(f16)),
                           W=dev(rng.standard_normal((16, 16, 3, 3)).astype(f16)), B=None, strides=[1, 1],
                           pads=[1, 1, 1, 1], dilations=[1, 1], group=1)
        yield "conv", dict(X=dev(rng.standard_normal((1, 4, 8, 8)).astype(np.float32)),
                           W=dev(rng.standard_normal((4, 1, 3, 3)).astype(np.float32)), B=None, strides=[2, 2],
                           pads=[1, 1, 1, 1], dilations=[1, 1], group=4)
        ql = dev(rng.standard_normal((2, 3, 4 * 16)).astype(np.float32))
        yield "linear_attention", dict(query=ql, key=ql, value=ql, kv_num_heads=4, q_num_heads=4, update_rule="linear")
        yield "linear_attention", dict(query=ql, key=ql, value=ql, kv_num_heads=4, q_num_heads=4, update_rule="linear",
                                       mode="chunked")

    def test_launch_code_makes_no_transfer(stub_backend, count_transfers, rng):
        import importlib

        for module, args in _launch_cases(rng):
            run = importlib.import_module(f"gpukernels.gpu.{module}").run
            run(stub_backend, **args)  # compiles (stub) and caches
            with count_transfers() as log:
                out = run(stub_backend, **args)
            assert out is not None, module
            assert log.count == 0, f"{module}.run: {log.report()}"

    # ------------------------------------------------------------ compute capability
    @pytest.fixture
    def gpu_with_capability(monkeypatch):
        """set(cc): the simulated GPU reports compute capability cc, and gpukernels treats it
        as a real GPU (its compiler probe answers yes)."""
        from cupy._sim import set_compute_capability

        from gpukernels import xp
        from gpukernels.gpu import accelerated

        def clear():
            xp.compute_capability.cache_clear()
            accelerated.kernels_supported.cache_clear()

        def set_cc(cc):
            set_compute_capability(cc)
            clear()

        # the simulation cannot compile CUDA code: pretend it can, so the gate looks at cc
        monkeypatch.setattr(accelerated, "compiler_status", lambda: (True, ""))
        yield set_cc
        set_compute_capability("90")
        monkeypatch.undo()
        clear()

    def test_kernels_step_aside_below_sm80(gpu_with_capability, monkeypatch):
        from gpukernels.errors import CudaKernelError
        from gpukernels.gpu import accelerated
        from gpukernels.kernels.nn.rotary import RotaryEmbedding
        from gpukernels.xp import Device

        cuda0 = Device("cuda", 0)
        ran = []
        import gpukernels.gpu.rotary_embedding as gr

        monkeypatch.setattr(gr, "run", lambda backend, **a: ran.append(1) or "kernel result")
        monkeypatch.setattr(gr, "backend_for", lambda kernel: None)
        entry = accelerated.get("RotaryEmbedding")
        k = RotaryEmbedding(KernelContext("cuda"))
        k_always = RotaryEmbedding(KernelContext("cuda", options={"cuda_kernels": "always"}))

        gpu_with_capability("90")
        assert accelerated.kernels_supported(cuda0) == (True, "")
        assert entry(k) == "kernel result" and ran == [1]
        gpu_with_capability("80")
        assert accelerated.kernels_supported(cuda0)[0]
        gpu_with_capability("75")
        ok, why = accelerated.kernels_supported(cuda0)
        assert not ok and "sm_80" in why and "sm_75" in why
        assert entry(k) is None and ran == [1]  # the class then runs its array code
        with pytest.raises(CudaKernelError, match="RotaryEmbedding: .*sm_75.*cuda_kernels='always'"):
            entry(k_always)
        assert "CuPy array code only" in accelerated.paths(cuda0)

    @pytest.mark.parametrize("cc, kernels", [("75", False), ("90", True)])
    def test_info_reports_compute_capability_and_paths(cc, kernels, gpu_with_capability, capsys):
        import json

        from gpukernels.cli import main

        gpu_with_capability(cc)
        assert main(["info", "--json"]) == 0
        info = json.loads(capsys.readouterr().out)
        (dev,) = info["cuda_devices"]
        assert dev["device"] == "cuda:0" and dev["compute_capability"] == f"{cc[0]}.{cc[1]}"
        assert dev["cuda_kernels"] is kernels
        assert ("hand-written CUDA kernels for Attention, Conv" in dev["paths"]) is kernels
        assert info["cuda_extra"] in ("cuda12", "cuda13")
        assert main(["info"]) == 0
        text = capsys.readouterr().out
        assert f"compute capability {cc[0]}.{cc[1]} (sm_{cc})" in text
        if not kernels:
            assert "CuPy array code only (the hand-written CUDA kernels need compute capability 8.0" in text


def _static_cnn_model():
    """Conv -> BatchNormalization -> Relu -> MaxPool -> Reshape (constant shape) -> Gemm ->
    Softmax, static shapes: the shape of a typical CNN export's head."""
    from onnx import TensorProto, helper, numpy_helper

    r = np.random.default_rng(3)
    inits = [numpy_helper.from_array(r.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(r.standard_normal(4).astype(np.float32), "b"),
             numpy_helper.from_array(r.uniform(0.5, 1.5, 4).astype(np.float32), "scale"),
             numpy_helper.from_array(r.standard_normal(4).astype(np.float32), "shift"),
             numpy_helper.from_array(r.standard_normal(4).astype(np.float32), "mean"),
             numpy_helper.from_array(r.uniform(0.5, 1.5, 4).astype(np.float32), "var"),
             numpy_helper.from_array(np.array([1, -1], np.int64), "flat"),
             numpy_helper.from_array(r.standard_normal((64, 10)).astype(np.float32), "fc_w"),
             numpy_helper.from_array(r.standard_normal(10).astype(np.float32), "fc_b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "scale", "shift", "mean", "var"], ["n"]),
             helper.make_node("Relu", ["n"], ["a"]),
             helper.make_node("MaxPool", ["a"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Reshape", ["p", "flat"], ["f"]),
             helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["g"]),
             helper.make_node("Softmax", ["g"], ["y"], axis=-1)]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("compile_graph", [True, False])
def test_static_shape_model_runs_without_device_to_host_transfers(compile_graph, count_transfers):
    """Small integer constants (the Reshape target) stay on the host, so a run of a
    static-shape model never waits for the GPU (issue 15.6)."""
    from gpukernels.runtime import Session

    model = _static_cnn_model()
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    want = Session(model, device="cpu").run(None, {"x": x})[0]
    session = Session(model, device="cuda", options={"compile_graph": compile_graph})
    session.run_values({"x": x})  # the first run compiles and caches plans
    with count_transfers() as log:
        (y,) = session.run_values({"x": x})
    assert log.count == 0, log.report()
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("compile_graph", [True, False])
def test_constant_exponents_and_bounds_are_read_on_the_host(compile_graph, count_transfers):
    """Pow's exponent and Clip's bounds (KernelBase.host_inputs) stay on the host when
    nothing else reads them, so the kernels choose their formula without a transfer;
    a constant also read as data stays on the device (and reading it costs one)."""
    from onnx import TensorProto, helper, numpy_helper

    from gpukernels.runtime import Session

    inits = [numpy_helper.from_array(np.array(v, np.float32), n)
             for n, v in (("three", 3.0), ("half", 2.5), ("lo", 0.0), ("hi", 6.0), ("two", 2.0))]
    nodes = [helper.make_node("Pow", ["x", "three"], ["cube"]),
             helper.make_node("Pow", ["x", "half"], ["p"]),          # not a product exponent: uploaded
             helper.make_node("Clip", ["cube", "lo", "hi"], ["c"]),
             helper.make_node("Add", ["c", "p"], ["s"]),
             helper.make_node("Pow", ["s", "two"], ["sq"]),
             helper.make_node("Mul", ["sq", "two"], ["y"])]         # 'two' also read as data
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 5])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.random.default_rng(1).random((4, 5)).astype(np.float32) * 3
    want = Session(model, device="cpu").run(None, {"x": x})[0]
    session = Session(model, device="cuda", options={"compile_graph": compile_graph})
    on_host = {n for n, t in session.graph.constants.items() if t.array.__class__ is np.ndarray}
    assert on_host == {"three", "half", "lo", "hi"}
    session.run_values({"x": x})
    with count_transfers() as log:
        (y,) = session.run_values({"x": x})
    assert log.count == 1, log.report()  # the exponent 'two', read where it also is data
    assert np.array_equal(y.numpy().view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("compile_graph", [True, False])
def test_qdq_model_runs_without_device_to_host_transfers(compile_graph, count_transfers):
    """A QDQ convolution (QuantizeLinear -> DequantizeLinear -> Conv with dequantized
    weights -> QuantizeLinear): the zero points stay on the host, where QuantizeLinear
    checks them, and the exact product (pass 'dequantized') reads nothing back."""
    from onnx import TensorProto, helper, numpy_helper

    from gpukernels.runtime import Session

    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(v, n) for n, v in (
        ("sx", np.array(0.02, np.float32)), ("zx", np.array(120, np.uint8)),
        ("wq", rng.integers(-127, 128, (8, 3, 3, 3)).astype(np.int8)),
        ("sw", (rng.random(8) * 0.01 + 0.001).astype(np.float32)), ("zw", np.zeros(8, np.int8)),
        ("sy", np.array(0.05, np.float32)), ("zy", np.array(3, np.uint8)))]
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["w"], axis=0),
             helper.make_node("Conv", ["xd", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("QuantizeLinear", ["c", "sy", "zy"], ["y"])]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, [1, 8, 8, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    want = Session(model, device="cpu").run(None, {"x": x})[0]
    session = Session(model, device="cuda", options={"compile_graph": compile_graph})
    assert session.graph.optimized.get("dequantized") == 1
    session.run_values({"x": x})
    with count_transfers() as log:
        (y,) = session.run_values({"x": x})
    assert log.count == 0, log.report()
    assert np.array_equal(y.numpy(), want)
