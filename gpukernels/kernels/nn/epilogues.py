"""Activations fused into a producer's output write: epilogues.

An epilogue is a callable ``epilogue(src, out)`` writing act(src) into ``out`` (``out``
may be ``src``; any other overlap is not allowed), with the array namespace's ufuncs.
``conv_function(..., epilogue=)`` (conv.py) applies it where the convolution writes its
output; the graph pass ``conv_activation`` (runtime/optimize/inplace.py) builds one for
the activation after a Conv.

Values: exactly the bits of the activation's own kernel on that device.  Each epilogue
runs the kernel's own steps: Relu ``maximum(x, 0)``; Clip the kernel's choice of path
(``Clip.bounds``: NumPy's one-pass clip on the host, called as the ndarray method, else
maximum then minimum) with the bounds converted as the kernel converts them; Tanh the
kernel's ufunc; LeakyRelu the product ``x * alpha`` where ``x < 0``; Sigmoid,
HardSigmoid, HardSwish, Swish and Mish the kernel's in-place chain (activations.py
``_LOGISTIC_CHAINS``).

Every step is elementwise, so the layout and blocking change no value.  On the host,
Relu and the chains of several steps (LeakyRelu, the logistic family) run on flat views
in memory order when the output's elements fill one block of memory (in any order of its
axes: a Conv path may hand over a transposed product), a large source laid out otherwise
first copied into the output; large arrays go in blocks of ``logistic.block_elems``
elements (the chain's temporaries in cache): the chains over the host threads as their
kernels do (unless the caller is one of those threads: they never wait on each other),
Relu in the calling thread.  Clip and Tanh are one call.  Chains that read x after
writing their output (Swish, HardSwish, Mish) need a temporary when out is src: Swish
and HardSwish keep their intermediate there and write out last (activations.py
``_WRITES_OUT_LAST``), Mish runs into it and is copied.
IEEE events are silenced where the kernel silences them (the MathUnary activations and
the logistic family), not for Relu and Clip.

Not built (the pass leaves these nodes alone): Gelu (its kernel returns a new array from
a float32 rational form with its own blocking: no write into out to share), Elu, Selu,
Celu, Softplus, ThresholdedRelu; types other than float32 and float64 (half types are
computed in float32 and rounded once per node, which a fused step would not repeat).
"""

from __future__ import annotations

import threading

import numpy as np

from ...host import host_blocks, on_host_thread, pooled_empty, tuning
from ..math._mathcommon import scalar_value
from ..math.activations import _LOGISTIC_CHAINS, _WRITES_OUT_LAST, clip_host
from ..math.clip_pow import _bound, _clip_host, _clip_reference
from ..math.unary import host_bound

# a source laid out unlike the output is copied into it first (then every step runs on
# contiguous memory) from this many elements on; below, the steps read it as it is (the
# copy and the calls cost more than the strided reads: 2x64x6x6 from a transposed
# product, Relu, 10.6 us either way)
_COPY_FIRST = 1 << 14

# operators an epilogue is built for (the pass matches these)
ACTIVATIONS = ("Relu", "Clip", "LeakyRelu", "Tanh", *_LOGISTIC_CHAINS)
# chains that read src after writing out: in place only through a temporary
_READS_SRC_LATE = {"Swish", "HardSwish", "Mish"}
_QUIET = {"Tanh", "LeakyRelu", *_LOGISTIC_CHAINS}  # kernels that silence IEEE events


class Epilogue:
    """act(src) into out, see the module docstring.  op: the activation's operator;
    step(xp, src, out, tmp, scratch): the activation of equally shaped arrays into out
    (tmp: an array like src when out is src and the chain reads src late, else None;
    scratch: an array like src for the chains that need one).  late: apply() writes
    into a new array on a GPU (the step needs a temporary, or computes one anyway)."""

    __slots__ = ("blocked", "late", "needs_tmp", "op", "quiet", "scratch", "step", "xp")

    def __init__(self, op: str, xp, step, scratch: bool = False, late: bool = False, blocked: str = "threads"):
        self.op = op
        self.xp = xp
        self.step = step
        self.blocked = blocked  # host blocks: "threads" (over the host threads), "serial", or "" (none)
        self.needs_tmp = op in _READS_SRC_LATE
        self.late = late or self.needs_tmp
        self.scratch = scratch
        self.quiet = op in _QUIET

    def __call__(self, src, out) -> None:
        if self.quiet:
            with np.errstate(all="ignore"):
                self._run(src, out)
        else:
            self._run(src, out)

    def apply(self, y):
        """act(y): written into y itself where that costs no extra pass (always on the
        host), else into a new array."""
        if self.late and self.xp is not np:
            out = pooled_empty(self.xp, y.shape, y.dtype)
            self(y, out)
            return out
        self(y, y)
        return y

    def _run(self, src, out) -> None:
        if self.blocked and self.xp is np:
            flat_out = _flat(out)
            if flat_out is not None:
                if src is out:
                    self._flat_step(flat_out, flat_out, True)
                    return
                same = _same(src, out)
                flat_src = _flat(src) if src.strides == out.strides else None
                if flat_src is not None:
                    self._flat_step(flat_src, flat_out, same)
                    return
                if not same and src.size > _COPY_FIRST:
                    out[...] = src  # the source's layout into the output's, then in place
                    self._flat_step(flat_out, flat_out, True)
                    return
        xp = self.xp
        tmp = xp.empty_like(src) if self.needs_tmp and _same(src, out) else None
        scratch = xp.empty_like(src) if self.scratch else None
        self.step(xp, src, out, tmp, scratch)

    def _flat_step(self, src, out, same: bool) -> None:
        """The step on 1-D host views (out is src when same), by blocks when large."""
        block = tuning.value("logistic.block_elems")
        if src.size > block:
            self._blocks(src, out, same, block)
            return
        tmp = np.empty_like(src) if self.needs_tmp and same else None
        scratch = np.empty_like(src) if self.scratch else None
        self.step(np, src, out, tmp, scratch)

    def _blocks(self, src, out, same: bool, block: int) -> None:
        """The step over blocks of block elements (host), temporaries per thread."""
        local = threading.local()
        step, need_scratch = self.step, self.scratch
        need_tmp = self.needs_tmp and same

        def one(lo, hi):
            tmp = scratch = None
            if need_tmp or need_scratch:
                bufs = getattr(local, "bufs", None)
                if bufs is None:
                    bufs = local.bufs = np.empty((2, block), src.dtype)
                tmp = bufs[0, :hi - lo] if need_tmp else None
                scratch = bufs[1, :hi - lo] if need_scratch else None
            s = src[lo:hi]
            step(np, s, s if same else out[lo:hi], tmp, scratch)

        if self.blocked == "serial" or on_host_thread():
            for lo in range(0, src.size, block):
                one(lo, min(src.size, lo + block))
        else:
            # the threads take the caller's error state
            host_blocks(src.size, block, one, min_per_thread=tuning.value("elementwise.thread_min_elems"))


def _flat(a):
    """A 1-D view of host array a's elements in memory order, when they fill one block of
    memory (C order, or any order of the axes: a Conv path may return a transposed
    product); else None."""
    if a.flags.c_contiguous:
        return a.reshape(-1)
    st = a.strides
    if a.ndim < 2 or min(st) <= 0:
        return None
    t = a.transpose(sorted(range(a.ndim), key=st.__getitem__, reverse=True))
    return t.reshape(-1) if t.flags.c_contiguous else None


def _same(src, out) -> bool:
    """Whether out is src (or another view of the same memory: the contract allows no
    other overlap)."""
    if out is src:
        return True
    if src.__class__ is np.ndarray:
        return np.may_share_memory(src, out)
    return src.data.ptr == out.data.ptr


# --------------------------------------------------------------------------- builders


def build_epilogue(kernel, attrs: dict, dtype, bounds=None):
    """The epilogue of the activation kernel ``kernel`` (a registered kernel instance:
    its device, its paths) with the node's bound attributes ``attrs``, for arrays of
    ``dtype`` (float32 or float64); None when there is none (see the module docstring).
    bounds: for Clip from opset 11, the (min, max) Tensors (None where absent), already
    checked to be constants of the input's type."""
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        return None
    op, xp = kernel.op_type, kernel.xp
    if op == "Relu":
        return _relu(xp, dtype)
    if op == "Clip":
        return _clip(kernel, attrs, dtype, bounds)
    if op == "Tanh":
        ufunc = kernel.array_op(xp, dtype)
        return Epilogue(op, xp, lambda xp, s, o, tmp, scratch: ufunc(s, out=o), blocked="")
    if op == "LeakyRelu":
        return _leaky_relu(kernel, attrs, dtype)
    if op in _LOGISTIC_CHAINS:
        chain, needs_scratch = _LOGISTIC_CHAINS[op]
        writes_out_last = op in _WRITES_OUT_LAST
        params = {k: float(attrs[k] if attrs.get(k) is not None else v) for k, v in kernel._params}

        def logistic(xp, s, o, tmp, scratch):
            if tmp is not None and writes_out_last:  # in place: tmp holds the chain's
                chain(xp, s, o, tmp, **params)  # intermediate, no copy (the same steps)
                return
            dst = o if tmp is None else tmp
            chain(xp, s, dst, scratch, **params)
            if tmp is not None:
                o[...] = tmp

        return Epilogue(op, xp, logistic, scratch=needs_scratch)
    return None


def _relu(xp, dtype):
    """Relu: the kernel's maximum(x, 0), on the host through the kernel's host_bound
    (against a kept block of zeros: the same bits), block by block in the calling
    thread."""
    zero = dtype.type(0)
    if xp is not np:
        return Epilogue("Relu", xp, lambda xp, s, o, tmp, scratch: xp.maximum(s, zero, out=o), blocked="")
    return Epilogue("Relu", xp, lambda xp, s, o, tmp, scratch: host_bound(np.maximum, s, zero, o),
                    blocked="serial")


def _clip(kernel, attrs, dtype, bounds):
    """Clip: the bounds as the kernel reads them (attributes before opset 11, else the
    one-element inputs), converted to x's type by the kernel's _bound; the kernel's path."""
    if kernel.since_version < 11:
        lo, hi = kernel._attribute_bounds(attrs.get("min"), attrs.get("max"))
    else:
        tmin, tmax = bounds if bounds is not None else (None, None)
        lo = None if tmin is None else scalar_value(kernel, tmin, "min")
        hi = None if tmax is None else scalar_value(kernel, tmax, "max")
    lo = None if lo is None else _bound(dtype, lo)
    hi = None if hi is None else _bound(dtype, hi)
    if kernel.specialized("Clip.bounds", np.empty(0, dtype)) is _clip_host:
        # _clip_host's one NumPy call, the type's infinities standing in for an absent
        # bound; the bounds as 0-d arrays of x's type, as Clip.array_function passes them
        # (the same values; NumPy's clip takes 2 us less per call than with scalars),
        # through clip_host (the same loop without numpy.clip's dispatch)
        lo_h = np.array(-np.inf if lo is None else lo, dtype)
        hi_h = np.array(np.inf if hi is None else hi, dtype)
        return Epilogue("Clip", kernel.xp, lambda xp, s, o, tmp, scratch: clip_host(s, lo_h, hi_h, o),
                        blocked="")

    return Epilogue("Clip", kernel.xp, lambda xp, s, o, tmp, scratch: _clip_reference(xp, s, lo, hi, out=o),
                    blocked="")


def _leaky_relu(kernel, attrs, dtype):
    """LeakyRelu: the kernel's where(x < 0, x * alpha, x); on the host the product is
    written only where x < 0 (the same products)."""
    alpha = attrs.get("alpha")
    alpha = 0.01 if alpha is None else alpha
    a = dtype.type(alpha)
    compute = kernel.compute

    def leaky(xp, s, o, tmp, scratch):
        if xp is not np:
            o[...] = compute(xp, s, alpha)
            return
        mask = s < 0  # before o (which may be s) is written
        if o is not s:
            o[...] = s
        np.multiply(s, a, out=o, where=mask)

    return Epilogue("LeakyRelu", kernel.xp, leaky, late=True)  # a GPU computes a new array anyway
