"""Specialisations: faster variants of a reference step, registered in one place.

Every kernel has one reference implementation written against the array namespace
``xp``; it is what runs on both devices unless a *specialisation* applies.  A
specialisation is a faster variant of one named step of the reference (a *site*, named
``"Operator.step"``) for one device, with the condition under which it applies::

    @specialize("Softmax.along", device="cpu", ops=("Softmax",),
                when=lambda x, axis: _inner(x, axis) == 1 and x.size >= tuning.value(...))
    def _softmax_last_axis_host(x, axis):
        ...

The reference asks for it at that step, through the kernel (the base class decides, never
a branch on the namespace inside the algorithm)::

    fast = kernel.specialized("Softmax.along", x, axis)
    if fast is not None:
        return fast(x, axis)
    ...  # the reference step

``kernel.specialized(site, *args)`` returns the function of the first specialisation
registered for ``site`` whose device is the kernel's device ("cpu" or "cuda") and whose
``when(*args)`` holds, or None -- always None when the context pins the reference path.
A specialisation must agree with the reference step: ``agreement`` states how ("exact":
the same values; otherwise the tolerance, checked by tests/test_paths.py, which runs every
registered site through both paths).

The rule for elementwise and row-wise float steps (normalisations, softmax, activations):
"exact", to the bit.  The specialisation performs the reference's operations in the
reference's order and differs only in how it splits rows or blocks, which threads run
them and which buffers it reuses; where the faster algorithm is another formula (float32
erf's rational form, Pow's products), that formula becomes the reference on both devices.
A one-ulp difference before a quantizer becomes a different integer (DynamicQuantizeLinear:
a different scale for the whole tensor), so quantized models agree across devices only if
these steps do.  Products and convolutions (BLAS orders differ) state a tolerance; in
quantized models the graph pass ``dequantized`` makes them exact instead.

The option ``paths`` ('auto', the default, or 'reference') of a KernelContext or Session,
else the environment variable ``GPUKERNELS_PATHS``, else 'auto', chooses.  'reference'
also turns off the hand-written CUDA kernels (``KernelBase.cuda_path``, gpu/accelerated.py),
which are listed here as the sites ``"<Operator>.cuda_kernel"``.
"""

from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass
from typing import Callable

from ..errors import OptionError
from ._loader import load_all

PATHS = ("auto", "reference")
ENV_VAR = "GPUKERNELS_PATHS"
OPTION = "paths"
DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class Specialization:
    """One registered faster variant of a reference step."""

    site: str  # "Operator.step": the reference step it replaces
    device: str  # "cpu" | "cuda"
    fn: Callable  # the step's function (arguments as the site documents)
    when: Callable | None  # (*args given to KernelBase.specialized) -> bool; None: always
    ops: tuple[str, ...]  # the operators whose reference reaches the site
    agreement: str  # "exact", or the tolerance against the reference
    name: str  # the function's qualified name (for listings)


_SITES: dict[str, tuple[Specialization, ...]] = {}
_recording: list | None = None  # see recording()


def specialize(site: str, *, device: str = "cpu", ops: tuple[str, ...] | None = None, when=None,
               agreement: str = "exact"):
    """Register the decorated function as a specialisation of ``site`` on ``device``;
    specialisations of one site are tried in registration order."""
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
    if "." not in site:
        raise ValueError(f"a site is named 'Operator.step', got {site!r}")

    def decorate(fn):
        spec = Specialization(site, device, fn, when, tuple(ops or (site.split(".", 1)[0],)), agreement,
                              getattr(fn, "__qualname__", repr(fn)))
        _SITES[site] = _SITES.get(site, ()) + (spec,)
        return fn

    return decorate


def resolve_paths(options: dict) -> str:
    """The paths setting of a context's options: the option 'paths', else the environment
    variable GPUKERNELS_PATHS, else 'auto'.  OptionError for any other value."""
    if OPTION in options:
        value, source = options[OPTION], f"option {OPTION!r}"
    else:
        value, source = os.environ.get(ENV_VAR), f"environment variable {ENV_VAR}"
        if value is None or value == "":
            return "auto"
    if not isinstance(value, str) or value.strip().lower() not in PATHS:
        raise OptionError(f"{source} must be one of {', '.join(map(repr, PATHS))}, got {value!r}")
    return value.strip().lower()


def find(site: str, device: str, paths: str, args: tuple):
    """The function of the first specialisation of site for device whose condition holds
    for args, or None (always None when paths is 'reference')."""
    if paths == "reference":
        return None
    for spec in _SITES.get(site, ()):
        if spec.device == device and (spec.when is None or spec.when(*args)):
            note_chosen(spec)
            return spec.fn
    return None


def registry() -> list[Specialization]:
    """Every registered specialisation (kernel modules loaded first), the hand-written
    CUDA kernels included as '<Operator>.cuda_kernel' sites, sorted by site."""
    load_all()
    from ..gpu import accelerated

    specs = [s for group in _SITES.values() for s in group]
    specs.extend(cuda_kernel(op) for op in accelerated.operators())
    return sorted(specs, key=lambda s: (s.site, s.device))


@functools.lru_cache(maxsize=None)
def cuda_kernel(op_type: str) -> Specialization:
    """The entry that stands for op_type's hand-written CUDA kernel (site
    '<Operator>.cuda_kernel'; KernelBase.cuda_path chooses it, gpu/accelerated.py runs it)."""
    return Specialization(f"{op_type}.cuda_kernel", "cuda", None, None, (op_type,),
                          "see tests/gpu (CUDA kernels against the array path)",
                          f"gpukernels.gpu.accelerated[{op_type!r}]")


def note_chosen(spec: Specialization) -> None:
    """Tell an open recording() that spec ran (find() does it for registered sites)."""
    if _recording is not None:
        _recording.append(spec)


def sites() -> list[str]:
    """The names of the sites with a registered specialisation."""
    return sorted({s.site for s in registry()})


@contextlib.contextmanager
def recording():
    """Within the block, the list yielded collects every Specialization chosen, the CUDA
    kernels that ran included (tests and benchmarks use it to prove that a case took the
    path it means to measure or compare).  One recording at a time per process."""
    global _recording
    previous, _recording = _recording, []
    try:
        yield _recording
    finally:
        _recording = previous
