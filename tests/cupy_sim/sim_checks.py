"""Checks that the simulated CuPy behaves like real CuPy where GPU-only bugs hide, and
that gpukernels' CuPy-specific helpers work on it.  Run by tests/test_cupy_simulation.py
in a subprocess with GPUKERNELS_SIMULATE_CUDA=1 (the simulation must never be imported
into an ordinary test process: it would make CUDA look available there)."""

from __future__ import annotations

import os
import sys
import warnings

import ml_dtypes
import numpy as np
import pytest

pytestmark = pytest.mark.skipif(os.environ.get("GPUKERNELS_SIMULATE_CUDA") != "1",
                                reason="run with GPUKERNELS_SIMULATE_CUDA=1")

if os.environ.get("GPUKERNELS_SIMULATE_CUDA") == "1":
    import cupy
    import cupyx
    import cupyx.scipy.special
    from cupy._sim import API, SimulationUnsupportedError


@pytest.fixture
def x():
    return cupy.arange(6, dtype=cupy.float32).reshape(2, 3)


# ------------------------------------------------------------------ identity
def test_it_is_the_simulation():
    assert cupy.__gpukernels_simulated__ is True
    assert cupy.__file__.replace("\\", "/").endswith("tests/cupy_sim/cupy/__init__.py")
    assert cupy.__version__ == API["version"] == "14.2.0"
    assert cupy.ndarray.__module__ == "cupy"


def test_public_names_are_exactly_real_cupys():
    import importlib

    for modname, entries in API["modules"].items():
        mod = importlib.import_module(modname)
        public = {n for n in entries if not n.startswith("_")}
        have = {n for n in dir(mod) if not n.startswith("_")}
        submodules = {n for n in have - public if type(getattr(mod, n)).__name__ == "module"
                      and getattr(mod, n).__name__ == f"{modname}.{n}"}
        assert have - submodules == public, (modname, sorted(have ^ public))
    for name in ("object_", "str_", "longdouble", "frompyfunc", "float128", "bfloat16"):
        assert not hasattr(cupy, name), name
    assert hasattr(cupy, "add") and hasattr(cupy, "vectorize")


def test_ndarray_methods_are_exactly_real_cupys(x):
    real = set(API["classes"]["ndarray"])
    for name in ("itemset", "resize", "tostring", "ctypes", "__array_interface__", "__index__",
                 "setflags", "getfield"):
        assert name not in real
        assert not hasattr(x, name), name
    for name in ("get", "set", "scatter_add", "astype", "view", "take", "nonzero", "sum"):
        assert hasattr(x, name)


# ------------------------------------------------------- host/device boundary
def test_no_implicit_conversion_to_numpy(x):
    with pytest.raises(TypeError, match="Implicit conversion"):
        np.asarray(x)
    with pytest.raises(TypeError, match="Implicit conversion"):
        np.array([x[0, 0], x[0, 1]])
    with pytest.raises(TypeError):
        np.float32(x[0])
    assert isinstance(x.get(), np.ndarray)
    assert isinstance(cupy.asnumpy(x), np.ndarray)
    assert float(x[1, 1]) == 4.0 and int(x.sum()) == 15 and bool(x[0, 1])


def test_numpy_functions_dispatch_to_cupy_or_fail(x):
    assert type(np.exp(x)) is cupy.ndarray
    assert type(np.concatenate([x, x])) is cupy.ndarray
    assert type(np.sum(x)) is cupy.ndarray
    with pytest.raises(TypeError):
        np.vectorize(lambda v: v)(x)
    with pytest.raises(NotImplementedError):
        np.maximum.accumulate(x)
    with pytest.raises(NotImplementedError):
        np.multiply.at(x, cupy.array([0]), 2.0)
    with pytest.raises(NotImplementedError):
        np.logical_or.reduce(x > 1)
    y = x.copy()
    np.add.at(y, (cupy.array([0, 0]), cupy.array([1, 1])), 1.0)
    assert float(y[0, 1]) == 3.0


def test_host_arrays_are_refused_where_cupy_refuses_them(x):
    host = np.ones(3, np.float32)
    with pytest.raises(TypeError, match="Unsupported type"):
        x + host
    with pytest.raises(TypeError, match="Unsupported type"):
        host + x
    with pytest.raises(TypeError, match="Unsupported type"):
        x * [1, 2, 3]
    with pytest.raises(TypeError):
        cupy.concatenate([x[0], host])
    with pytest.raises(TypeError):
        cupy.where(x[0] > 1, host, 0)
    with pytest.raises(ValueError, match="non-scalar numpy.ndarray"):
        x[0] = host
    y = x.copy()
    y[cupy.array([0, 1]), 0] = np.array([7, 8], np.float32)  # advanced indexing copies it
    assert y.get()[:, 0].tolist() == [7, 8]
    assert type(cupy.asarray(host)) is cupy.ndarray
    with pytest.raises(TypeError, match="incorrect type"):
        cupy.ascontiguousarray(host)  # a typed (device array) argument in CuPy
    with pytest.raises(TypeError, match="incorrect type"):
        cupy.asfortranarray(host)
    assert type(cupy.ascontiguousarray(x.T)) is cupy.ndarray
    assert cupy.asarray([cupy.array(1), cupy.array(2)]).get().tolist() == [1, 2]
    with pytest.raises(TypeError):
        cupy.asarray([cupy.array(1), 2])
    assert x[np.array([True, False])].shape == (1, 3)  # host index arrays are fine
    assert x[[1, 0]].shape == (2, 3)


def test_numpy_only_keywords_are_refused(x):
    with pytest.raises(TypeError):
        x.max(initial=0)
    with pytest.raises(TypeError):
        cupy.add(x, x, where=x > 1)
    with pytest.raises(TypeError):
        x.sum(where=x > 1)


def test_dtypes_cupy_lacks_are_refused(x):
    for bad in (np.array(["a"]), np.array([1], object), np.zeros(2, ml_dtypes.bfloat16),
                np.zeros(2, ml_dtypes.float8_e4m3fn), np.zeros(2, ml_dtypes.int4),
                np.zeros(2, np.longdouble)):
        with pytest.raises((TypeError, ValueError)):
            cupy.asarray(bad)
    with pytest.raises(TypeError):
        x.astype(ml_dtypes.bfloat16)
    with pytest.raises(TypeError):
        x.view(ml_dtypes.bfloat16)
    with pytest.raises(TypeError):
        cupy.zeros(3, dtype=object)


# ------------------------------------------------------------ GPU semantics
def test_scalars_are_zero_dim_device_arrays(x):
    s = x.sum()
    assert type(s) is cupy.ndarray and s.ndim == 0
    assert type(x[0, 0]) is cupy.ndarray
    assert all(type(v) is cupy.ndarray for v in x[0])
    with pytest.raises(TypeError):
        range(x[0, 1].astype(cupy.int32))  # no __index__ on device arrays


def test_fancy_indices_wrap_instead_of_raising():
    a = cupy.arange(3)
    assert a[cupy.array([3, -4, 5])].get().tolist() == [0, 2, 2]
    assert cupy.take(a, cupy.array([4])).get().tolist() == [1]
    with pytest.raises(IndexError):
        a[3]  # plain integers are still checked


def test_repeated_index_assignment_is_not_last_wins():
    a = cupy.zeros(3)
    a[cupy.array([1, 1, 1])] = cupy.array([1.0, 2.0, 3.0])
    assert float(a[1]) != 3.0


def test_empty_is_garbage():
    assert bool(cupy.isnan(cupy.empty(4)).all())
    assert bool(cupy.isnan(cupy.empty_like(cupy.ones(2))).all())


def test_float_to_int_conversion_saturates_like_cuda():
    v = cupy.array([np.nan, -1.5, 300.0, 1e30, -1e30, 2.9], dtype=cupy.float32)
    assert v.astype(cupy.uint8).get().tolist() == [0, 0, 255, 255, 0, 2]
    assert v.astype(cupy.int32).get().tolist() == [0, -1, 300, 2**31 - 1, -2**31, 2]


def test_scatter_dtype_limits_of_cuda_atomics():
    idx = cupy.array([0, 0, 1])
    for dt in ("int64", "int8", "float16", "bool"):
        with pytest.raises(TypeError, match="only supports"):
            cupyx.scatter_max(cupy.zeros(3, dt), idx, cupy.ones(3, dt))
    for dt in ("int64", "int8", "uint16"):
        with pytest.raises(TypeError, match="only supports"):
            cupy.add.at(cupy.zeros(3, dt), idx, cupy.ones(3, dt))
    a = cupy.zeros(3, cupy.int32)
    cupyx.scatter_add(a, idx, cupy.ones(3, cupy.int32))
    assert a.get().tolist() == [2, 1, 0]
    m = cupy.zeros(3, cupy.int64)
    cupyx.scatter_max(m, cupy.array([True, False, True]), cupy.array([4, 5], cupy.int64))
    assert m.get().tolist() == [4, 0, 5]  # mask scatter has no dtype limit


def test_cuda_surface():
    assert cupy.cuda.runtime.getDeviceCount() == 1
    with cupy.cuda.Device(0) as d:
        assert d.id == 0
    cupy.cuda.get_current_stream().synchronize()
    with pytest.raises(cupy.cuda.runtime.CUDARuntimeError):
        cupy.cuda.Device(1)
    with pytest.raises(SimulationUnsupportedError):
        cupy.RawModule(code="extern \"C\" __global__ void k() {}")
    assert float(cupyx.scipy.special.erf(cupy.array(0.5))) == pytest.approx(0.5204998778)
    r = cupy.random.RandomState(1).uniform(size=(2, 2), dtype=cupy.float32)
    assert type(r) is cupy.ndarray and r.dtype == np.float32
    assert type(cupy.from_dlpack(r)) is cupy.ndarray


# ------------------------------------------------------- gpukernels on top
def test_gpukernels_sees_a_simulated_gpu_without_cuda_kernels():
    from gpukernels.gpu import accelerated
    from gpukernels.xp import Device, cuda_status, is_cupy_array, namespace

    assert cuda_status().available
    assert namespace("cuda") is cupy
    assert is_cupy_array(cupy.zeros(1))
    ok, why = accelerated.kernels_supported(Device("cuda", 0))
    assert not ok and "NVRTC" in why  # the simulation cannot compile: the array code runs


def test_cupy_backend_refuses_host_arrays_and_selftests_upload_theirs():
    # CupyBackend.device_array is cupy.ascontiguousarray: the selftests used to hand it
    # host arrays, which real CuPy refuses; they now upload them first
    from gpukernels.gpu import selftest
    from gpukernels.gpu.launch import CupyBackend
    from gpukernels.xp import Device

    be = CupyBackend(Device("cuda"))
    host = np.ones(8, np.float32)
    with pytest.raises(TypeError, match="host"):
        be.device_array(host)
    d = be.upload(host)
    assert type(d) is cupy.ndarray and be.device_array(d) is d
    assert type(be.to_host(d)) is np.ndarray
    launched = []

    def launch(fn, grid, block, args, shared_mem=0, what=""):
        for a in args:
            assert not isinstance(a, np.ndarray), f"{what}: a host array reached the kernel"
        launched.append(what)

    be.function = lambda source, expr, options=(): expr  # RawModule is not simulated
    be.launch = launch
    rng = np.random.default_rng(0)
    selftest.run_warp(be, rng.standard_normal(64).astype(np.float32))
    selftest.run_block(be, rng.standard_normal(200).astype(np.float32))
    for kind in ("f16", "bf16", "tf32"):
        A, B, C, _ = selftest.mma_case(rng, kind)
        selftest.run_mma(be, kind, A, B, C)
    assert len(launched) == 5


SCATTER_DTYPES = ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64",
                  "uint64", "float16", "float32", "float64")


@pytest.mark.parametrize("reduction", ["add", "mul", "max", "min"])
@pytest.mark.parametrize("dtype", SCATTER_DTYPES)
def test_xp_scatter_reduce_on_every_dtype(reduction, dtype):
    from gpukernels.xp import scatter_reduce

    rng = np.random.default_rng(0)
    if dtype == "bool":
        target = rng.integers(0, 2, 10).astype(bool)
        values = rng.integers(0, 2, 40).astype(bool)
    elif np.dtype(dtype).kind == "f":
        target = rng.standard_normal(10).astype(dtype)
        values = rng.standard_normal(40).astype(dtype)
    else:
        info = np.iinfo(dtype)
        lo, hi = max(info.min, -2**40), min(info.max, 2**40)
        target = rng.integers(lo, hi, 10, endpoint=True).astype(dtype)
        values = rng.integers(lo, hi, 40, endpoint=True).astype(dtype)
    index = rng.integers(0, 10, 40)
    want = target.copy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scatter_reduce(np, want, index, values, reduction)
        got = cupy.asarray(target)
        scatter_reduce(cupy, got, cupy.asarray(index), cupy.asarray(values), reduction)
    np.testing.assert_array_equal(got.get(), want)


@pytest.mark.parametrize("dtype", ["int8", "int64", "float16", "float32", "uint64"])
def test_xp_scatter_assign_last_wins(dtype):
    from gpukernels.xp import scatter_assign_last_wins

    rng = np.random.default_rng(1)
    index = rng.integers(0, 7, 50)
    values = np.arange(50).astype(dtype)
    want = np.zeros(7, dtype)
    scatter_assign_last_wins(np, want, index, values)
    got = cupy.zeros(7, dtype)
    scatter_assign_last_wins(cupy, got, cupy.asarray(index), cupy.asarray(values))
    np.testing.assert_array_equal(got.get(), want)


@pytest.mark.parametrize("dt", ["INT4", "INT2", "UINT4", "FLOAT8E4M3FN", "BFLOAT16"])
def test_sub_byte_and_exotic_tensors_keep_their_values_on_the_gpu(dt):
    from gpukernels.dtypes import info
    from gpukernels.kernels.base import KernelBase, KernelContext
    from gpukernels.tensor import Tensor

    i = info(dt)
    vals = np.array({"INT4": [-8, -5, -1, 0, 1, 3, 7], "INT2": [-2, -1, 0, 1],
                     "UINT4": [0, 1, 3, 7, 15]}.get(dt, [-2.5, -1, 0, 0.5, 3]), np.float64)
    host = Tensor(vals.astype(i.numpy), i.data_type)
    dev = host.to("cuda")
    assert type(dev.array) is cupy.ndarray and dev.array.dtype == i.storage
    np.testing.assert_array_equal(dev.numpy().astype(np.float64), vals)
    k = KernelBase(KernelContext("cuda"), version=1)
    np.testing.assert_array_equal(k.to_compute(dev).get().astype(np.float64), vals)


# ------------------------------------------------------------------ transfers
def _transfers(fn) -> list:
    from cupy._sim import count_transfers

    with count_transfers() as log:
        fn()
    return [kind for kind, _, _ in log.events]


@pytest.mark.parametrize("name, reads", [
    ("get", lambda a: a.get()),
    ("asnumpy", lambda a: cupy.asnumpy(a)),
    ("item", lambda a: a[0, 0].item()),
    ("tolist", lambda a: a.tolist()),
    ("tobytes", lambda a: a.tobytes()),
    ("int", lambda a: int(a[0, 1])),
    ("float", lambda a: float(a.sum())),
    ("complex", lambda a: complex(a[0, 0])),
    ("bool", lambda a: bool(a.max() > 2)),
    ("if", lambda a: 1 if (a > 1).any() else 0),
    ("repr", lambda a: repr(a)),
    ("str", lambda a: str(a)),
    ("format", lambda a: f"{a[0, 0]:.3f}"),
    ("pickle", lambda a: __import__("pickle").dumps(a)),
    ("dlpack to host", lambda a: np.from_dlpack(a, device="cpu")),
    ("mask index", lambda a: a[a > 2]),
    ("mask assign", lambda a: a.__setitem__(a > 2, 0)),
    ("nonzero", lambda a: cupy.nonzero(a)),
    ("nonzero method", lambda a: a.nonzero()),
    ("numpy nonzero", lambda a: np.nonzero(a)),
    ("argwhere", lambda a: cupy.argwhere(a)),
    ("flatnonzero", lambda a: cupy.flatnonzero(a)),
    ("where one argument", lambda a: cupy.where(a > 1)),
    ("unique", lambda a: cupy.unique(a)),
    ("compress", lambda a: cupy.compress(cupy.asarray([True, False]), a, axis=0)),
    ("extract", lambda a: cupy.extract(a > 1, a)),
    ("bincount", lambda a: cupy.bincount(a.astype(cupy.int64).ravel())),
    ("stream synchronize", lambda a: cupy.cuda.get_current_stream().synchronize()),
    ("device synchronize", lambda a: cupy.cuda.Device(0).synchronize()),
    ("runtime synchronize", lambda a: cupy.cuda.runtime.deviceSynchronize()),
])
def test_every_device_to_host_path_is_counted_once(name, reads, x):
    kinds = _transfers(lambda: reads(x))
    assert len(kinds) == 1, (name, kinds)


def test_device_only_work_counts_no_transfer(x):
    def work():
        y = cupy.empty_like(x)
        cupy.multiply(x, 2, out=y)
        z = (y + x).sum(axis=1) * cupy.float32(0.5)
        i = cupy.argmax(z)
        w = x[:, [2, 0, 1]] + x[0] + x[..., 1, None]
        cupy.take(x, cupy.asarray([1, 0]), axis=0)
        cupy.where(x > 1, x, 0)
        cupy.cumsum(w, axis=0)
        cupy.concatenate([x, y]).reshape(3, 4).T.copy()
        x[0] = cupy.float32(1)
        x[1, :2] = w[0, :2]
        cupy.count_nonzero(x)
        cupy.allclose(x, y)  # a 0-d device array: no read until it is converted
        len(x), x.shape, x.dtype, x.data.ptr, i.ndim
        cupy.asarray(np.arange(3))  # host to device
    assert _transfers(work) == []


def test_transfer_log_says_where_and_nests(x):
    from cupy._sim import count_transfers

    with count_transfers() as outer:
        x.get()
        with count_transfers() as inner:
            float(x[0, 0])
    assert outer.count == 2 and inner.count == 1
    kind, what, where = inner.events[0]
    assert kind == "float()" and what == "float32[]"
    assert where.startswith(__file__) and "test_transfer_log_says_where_and_nests" in where
    assert outer.kinds() == {"get": 1, "float()": 1}


def test_compute_capability_can_be_lowered_for_tests():
    from cupy._sim import set_compute_capability

    try:
        set_compute_capability("75")
        assert cupy.cuda.Device(0).compute_capability == "75"
        assert cupy.cuda.runtime.getDeviceProperties(0)["major"] == 7
        assert cupy.cuda.Device(0).attributes["ComputeCapabilityMinor"] == 5
    finally:
        set_compute_capability("90")
    assert cupy.cuda.Device(0).compute_capability == "90"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
