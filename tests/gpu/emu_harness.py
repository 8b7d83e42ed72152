"""Running an operator's CUDA launch code on the CPU emulator and comparing it with the
array-namespace path of the same kernel class.

    from tests.gpu.emu_harness import check_op
    check_op(RotaryEmbedding, emu, (X, cos, sin, pos), dict(interleaved=1), tags=("rank4",))

``emulated(kernel_cls, backend)`` gives a CPU kernel instance whose ``cuda_path`` runs
``gpukernels.gpu.<op module>.run(backend, **arguments)`` -- the very arguments the kernel
class passes on a GPU (plus ``module.run_options(kernel)`` where defined), with every
Tensor's array first copied to emulated device memory as it would be on a GPU
(``emulator.run_op``: host arrays are refused where CuPy refuses them; a misaligned view
stays misaligned) -- so the kernel's validation, the launch code and the .cu file are all
exercised.  ``check_op`` runs both paths, insists that the CUDA path covered the case
(unless ``expect_cuda=False``) and compares every output with ``gpukernels.gpu.parity``.
"""

from __future__ import annotations

import importlib

import emulator
from gpukernels.gpu import accelerated, parity
from gpukernels.kernels.base import KernelContext
from gpukernels.tensor import Tensor


def emulated(kernel_cls, backend, options=None, *, opset=None, requested=None):
    kernel = kernel_cls(KernelContext("cpu", opset=opset, options=dict(options or {})))
    kernel.requested_outputs = requested
    module = importlib.import_module(accelerated._MODULES[kernel.op_type])
    kernel.cuda_calls = []

    def cuda_path(**arguments):
        extra = module.run_options(kernel) if hasattr(module, "run_options") else {}
        result = emulator.run_op(module.run, backend, **arguments, **extra)
        kernel.cuda_calls.append((arguments, result))
        return result

    kernel.cuda_path = cuda_path
    return kernel


def outputs(result) -> list:
    if isinstance(result, Tensor):
        return [result]
    return list(result)


def check_op(kernel_cls, backend, inputs: tuple, attrs: dict | None = None, *, expect_cuda: bool = True,
             rtol=None, atol=None, tags: tuple = (), options=None, opset=None, requested=None):
    """Run kernel_cls on inputs through the emulated CUDA path and the array path; compare.
    requested: which outputs the caller uses (kernel.requested_outputs; None = all).
    rtol/atol: None (parity's tolerance of each output's type), a number, or a dict
    {DataType: tolerance} (types missing from it keep parity's)."""
    attrs = dict(attrs or {})
    cpu = kernel_cls(KernelContext("cpu", opset=opset, options=dict(options or {})))
    cpu.requested_outputs = requested
    want = outputs(cpu(*inputs, **attrs))
    k = emulated(kernel_cls, backend, options, opset=opset, requested=requested)
    got = outputs(k(*inputs, **attrs))
    covered = bool(k.cuda_calls) and k.cuda_calls[-1][1] is not None
    if expect_cuda:
        assert covered, f"{kernel_cls.__name__}: the CUDA path did not cover this case ({attrs})"
    if covered:
        emulator.tag(kernel_cls.__name__, *tags)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        if w is None or (isinstance(w, Tensor) and w.is_absent):
            continue
        assert g.data_type == w.data_type, f"output {i}: {g.data_type!r} != {w.data_type!r}"
        r = rtol.get(w.data_type) if isinstance(rtol, dict) else rtol
        a = atol.get(w.data_type) if isinstance(atol, dict) else atol
        msg = parity.compare(g.numpy(), w.numpy(), w.data_type, r, a, what=f"output {i}")
        assert msg is None, f"{kernel_cls.__name__} {attrs}: {msg}"
    return got, want
