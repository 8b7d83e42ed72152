"""The allocation limit: ``max_tensor_bytes``.

A model may come from anyone, and many operators allocate what the model *asks for*
rather than what it *holds*: ConstantOfShape, Expand, Tile, Resize, Pad, OneHot,
ConvTranspose, the window and random generators, Range, TfIdfVectorizer, sequence and
Loop/Scan growth, sparse initializers.  Each of them calls :func:`check_allocation`
(or :func:`check_bytes`) with the shape it is about to allocate, before allocating, so
a request such as ConstantOfShape([2**20, 2**20]) fails at once with a clear error
instead of exhausting the machine.

The limit, in bytes, for one tensor (or one Loop/Scan's accumulated outputs) comes from,
in order:

1. the context option ``max_tensor_bytes`` (``KernelContext(options={...})``,
   ``Session(..., options={...})``),
2. the environment variable ``GPUKERNELS_MAX_TENSOR_BYTES``,
3. :data:`DEFAULT_MAX_TENSOR_BYTES`, 4 GiB.

A value is a non-negative integer number of bytes, or a string holding one, optionally
with a unit (``"512MiB"``, ``"8GiB"``, ``"2GB"``: K/M/G/T are powers of 1000, Ki/Mi/Gi/Ti
powers of 1024).  ``0``, ``"0"``, ``"none"`` and ``"unlimited"`` mean no limit.

Why 4 GiB: it is far above any single activation of the models gpukernels is meant for
(a 224x224 ResNet's largest activation is ~13 MB, a 7B-parameter LLM's largest weight
matrix in float32 ~2 GB, and weights are initializers, which exist in the file anyway),
yet small enough that the few live copies an operator may hold at once (its output, a
broadcast or up-cast temporary, the next node's output) stay well inside a 16-24 GiB
laptop.  Users with more memory, or a GPU such as an 80-141 GiB data-centre part, raise
it through the option or the environment variable.

Values a kernel *holds* rather than allocates in one piece -- the per-iteration scan
values a Loop or Scan keeps until it stacks them, the elements of a sequence -- count
their bytes plus :data:`ELEMENT_OVERHEAD` each (the Python array/Tensor objects and list
slot that hold them), so that a million empty elements are not free either.

The check costs a few integer multiplications: byte counts use Python integers, so a
shape such as [2**40, 2**40] cannot overflow into a small number.
"""

from __future__ import annotations

import functools
import os
import re

import numpy as np

from .errors import OptionError, ResourceLimitError

DEFAULT_MAX_TENSOR_BYTES = 4 * 1024 ** 3
ENV_VAR = "GPUKERNELS_MAX_TENSOR_BYTES"
OPTION = "max_tensor_bytes"

# Bytes of bookkeeping counted per held element (a NumPy array object is ~112 bytes, a
# Tensor wrapper and a list slot more): a lower bound, so no legitimate case is refused.
ELEMENT_OVERHEAD = 128

_UNITS = {"": 1, "b": 1, "k": 10 ** 3, "m": 10 ** 6, "g": 10 ** 9, "t": 10 ** 12,
          "ki": 2 ** 10, "mi": 2 ** 20, "gi": 2 ** 30, "ti": 2 ** 40}
_SIZE = re.compile(r"\s*(\d+)\s*([kmgt]i?)?b?\s*", re.IGNORECASE)


def parse_limit(value, source: str = OPTION) -> int | None:
    """A limit value (int, or a string with an optional unit) as bytes; None means no
    limit.  Raises OptionError naming source for anything else."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise OptionError(f"{source} must be a number of bytes, got {value!r}")
    if isinstance(value, int) or (hasattr(value, "__index__") and not isinstance(value, str)):
        n = int(value.__index__()) if not isinstance(value, int) else value
    elif isinstance(value, float) and value.is_integer():
        n = int(value)
    elif isinstance(value, str):
        return _parse_text(value, source)
    else:
        raise OptionError(f"{source} must be a number of bytes, got {value!r}")
    if n < 0:
        raise OptionError(f"{source} must be >= 0 (0 means no limit), got {n}")
    return n or None


@functools.lru_cache(maxsize=32)
def _parse_text(text: str, source: str) -> int | None:
    if text.strip().lower() in ("none", "unlimited", "off"):
        return None
    m = _SIZE.fullmatch(text)
    if m is None:
        raise OptionError(f"{source} must be a number of bytes, optionally with a unit "
                          f"(e.g. 8GiB, 500MB), or 'none'; got {text!r}")
    n = int(m.group(1)) * _UNITS[(m.group(2) or "").lower()]
    return n or None


def max_tensor_bytes(ctx=None) -> int | None:
    """The allocation limit in bytes for ctx (a KernelContext or None): the option, then
    the environment variable, then the default.  None means unlimited.

    A context resolves its limit once (KernelContext.tensor_byte_limit: the environment
    variable is read when it first checks an allocation)."""
    if ctx is None:
        return _from_env()
    return getattr(ctx, "ctx", ctx).tensor_byte_limit  # a Session's context, or the context


def resolve_limit(value) -> int | None:
    """The limit for an option value: parsed when given, else from the environment."""
    return parse_limit(value, f"option {OPTION!r}") if value is not None else _from_env()


def _from_env() -> int | None:
    env = os.environ.get(ENV_VAR)
    if env is not None and env.strip():
        return _parse_text(env, ENV_VAR)
    return DEFAULT_MAX_TENSOR_BYTES


def element_count(shape) -> int:
    """The number of elements of shape, as an exact Python int."""
    n = 1
    for d in shape:
        n *= int(d)
    return n


def held_bytes(values) -> int:
    """Bytes held by values (Tensors or arrays; anything else counts only its overhead),
    plus ELEMENT_OVERHEAD each."""
    total = 0
    for v in values:
        a = getattr(v, "array", v)
        total += getattr(a, "nbytes", 0) + ELEMENT_OVERHEAD
    return total


def _itemsize(dtype_or_itemsize) -> int:
    if dtype_or_itemsize.__class__ is int:
        return dtype_or_itemsize
    dt = dtype_or_itemsize if isinstance(dtype_or_itemsize, np.dtype) else np.dtype(dtype_or_itemsize)
    return dt.itemsize if dt.kind != "O" else 8  # a STRING element: at least its pointer


def _human(n: int) -> str:
    for unit, size in (("TiB", 2 ** 40), ("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} B"


def _who(kernel) -> str:
    if kernel is None:
        return ""
    if isinstance(kernel, str):
        return kernel
    return getattr(kernel, "op_type", None) or ""


def _context(kernel):
    ctx = getattr(kernel, "ctx", None)  # a kernel's context
    if ctx is not None:
        return ctx
    return kernel if hasattr(kernel, "option") else None  # a context, or None / a name


def limit_error(kernel, nbytes: int, limit: int, what: str, shape=None) -> ResourceLimitError:
    """The ResourceLimitError for a request of nbytes (for the tensor `what` of shape)."""
    who = _who(kernel)
    shown = ""
    if shape is not None:
        dims = [int(d) for d in shape]
        shown = f" of shape {dims}" if len(dims) <= 32 else f" of shape {dims[:32]}... (rank {len(dims)})"
    prefix = f"{who}: " if who else ""
    return ResourceLimitError(
        f"{prefix}{what}{shown} needs {nbytes:,} bytes ({_human(nbytes)}), more than the limit "
        f"max_tensor_bytes={limit:,} ({_human(limit)}); raise it with "
        f"options={{'{OPTION}': N}} or {ENV_VAR}=N (0 or 'none' for no limit)",
        nbytes=nbytes, limit=limit, shape=shape, op_type=who)


def check_allocation(kernel, shape, dtype_or_itemsize, what: str = "output") -> int:
    """Raise ResourceLimitError before allocating a tensor of shape and element type
    (a dtype or an itemsize in bytes) past the limit of kernel's context.  kernel is a
    KernelBase (its op_type names the operator), a KernelContext, a name or None.
    Returns the byte count."""
    n = 1
    for d in shape:
        n *= int(d)
    nbytes = n * _itemsize(dtype_or_itemsize)
    limit = max_tensor_bytes(_context(kernel))
    if limit is not None and nbytes > limit:
        raise limit_error(kernel, nbytes, limit, what, shape)
    return nbytes


def check_bytes(kernel, nbytes: int, what: str, shape=None) -> int:
    """As check_allocation for an already computed byte count (a running total, such as
    a Loop's accumulated scan outputs)."""
    limit = max_tensor_bytes(_context(kernel))
    if limit is not None and nbytes > limit:
        raise limit_error(kernel, int(nbytes), limit, what, shape)
    return nbytes
