"""The host buffer arena: large host arrays handed out again from run to run, one arena
per Session (as onnxruntime keeps one per session).

Why: the first touch of a fresh large array costs page faults and the kernel's zeroing
(1,565 faults and 15% of squeezenet's time; a fresh 200 MB array costs about as much as
a softmax over it).  Memory that the arena hands out again is already mapped.

Who gets a buffer.  ``host_empty(shape, dtype, min_bytes=None)`` (a kernel's output or
scratch) takes one from the *current run's* arena when the array has ``min_bytes`` or
more (default 4 MB); otherwise, and outside a run, it returns a plain ``np.empty``.  It
hands out views of its buffers, never a buffer itself, so an array that owns its memory
(``.base is None``: most results) never uses one, a short test the runtime relies on.  A
run is current while the runtime executes a Session's graph (``HostArena.run()`` sets a
``contextvars.ContextVar``, as ``KernelBase.in_scope`` does for scopes; the host threads
see it too).  Not in a run: a kernel called directly, ``run_graph``, a Session run with
an observer (parity ``--all-nodes``, profile, ``run --dump``: an observer may keep any
intermediate), and the preparation of a graph (``suspended()``: initializers, folded
constants and compiled programs outlive every run).  ``GPUKERNELS_HOST_POOL_MB=0``
turns the arena off.

When a buffer comes back.  Reuse is decided by what the runtime knows, never by
reference counts:

* At the end of a run, every buffer the run took goes back to the arena except those
  whose memory the returned values reach (their root arrays, ``.base`` followed, are
  compared with the buffers by identity, and their byte ranges by overlap, which also
  catches views made through memoryviews or ``as_strided``).  A run that raises gives
  back nothing (its traceback may hold its values): its buffers are left to Python.
* Inside a run, at the runtime's release points.  The runtime counts, per buffer, the
  values bound to names whose memory it is (in every scope and in the slots of compiled
  programs, Sequences and Optionals walked): ``bind`` when a node's outputs are stored,
  ``unbind`` when the release plan drops a value.  When the count falls to zero, no
  value the runtime holds uses the buffer, and it goes back at once (so a run's peak is
  its live set, as with the old pool).  Kernels hand values to the runtime only as a
  graph's inputs and as their results, and values they hold where the runtime does not
  look never reach zero this way: a graph's inputs given by a kernel (a Loop's carried
  values, a Scan's slices) *pin* their buffers until the run ends; a graph's outputs are
  uncounted when it hands them to its caller (``forget``), and counted again only where
  the caller passes them on (as inputs: pinned) or returns them (bound); scratch a
  kernel never returns is never counted.  All of these wait for the end of the run.
* Bound: what one run holds of the arena's buffers at a time (``held``: taken and not
  yet back) is capped at the arena's limit; past it ``host_empty`` returns plain arrays,
  which Python frees as usual.  So a Loop of 10,000 iterations with 8 MB temporaries
  reuses the same few buffers, and one whose 8 MB values stay pinned holds at most the
  limit, never 80 GB.

Idle memory is bounded by the same limit, ``GPUKERNELS_HOST_POOL_MB`` (default 1024):
past it the buffers returned longest ago are dropped.  A Session that is
garbage-collected frees its arena.  One Session serves many threads: the free list is
locked, and every run tracks its own buffers.

What makes this safe: kernels keep only planning caches, never arrays of a call; the
runtime keeps no value of a run after it (records of a run being compiled are copies or
stand-ins); outputs leave the run through its return value only.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import os
import threading

import numpy as np

from ..tensor import Optional, Sequence, Tensor

# arrays from this size on come from the arena by default (host_empty's min_bytes)
_MIN_BYTES = 4 << 20

_CURRENT: contextvars.ContextVar = contextvars.ContextVar("gpukernels_host_run", default=None)


def pool_limit() -> int:
    """GPUKERNELS_HOST_POOL_MB in bytes (default 1024 MB; 0: the arena is off)."""
    try:
        return max(0, int(os.environ.get("GPUKERNELS_HOST_POOL_MB", "1024"))) << 20
    except ValueError:
        return 1 << 30


def root_of(array: np.ndarray) -> np.ndarray:
    """The array owning array's memory: ``.base`` followed through arrays, memoryviews
    (``.obj``) and wrappers with an array ``.base`` (NumPy's ``as_strided``)."""
    while True:
        base = array.base
        if base is None:
            return array
        if not isinstance(base, np.ndarray):
            base = base.obj if isinstance(base, memoryview) else getattr(base, "base", None)
            if not isinstance(base, np.ndarray):
                return array
        array = base


_LISTS = (list, tuple)


def host_arrays(value, out: list) -> list:
    """The host arrays in a runtime value (Tensor, Sequence, Optional, array, or a list
    or tuple of them), appended to out."""
    if isinstance(value, Tensor):
        value = value.array
    if isinstance(value, np.ndarray):
        out.append(value)
    elif isinstance(value, Sequence):
        for t in value.tensors:
            host_arrays(t, out)
    elif isinstance(value, Optional):
        if value.value is not None:
            host_arrays(value.value, out)
    elif isinstance(value, _LISTS):
        for v in value:
            host_arrays(v, out)
    return out


try:
    from numpy.lib.array_utils import byte_bounds as _byte_bounds  # NumPy 2
except ImportError:  # NumPy 1.x
    _byte_bounds = np.byte_bounds


class _Entry:
    """A buffer a run took: how many bound values use it, whether it is pinned."""

    __slots__ = ("buf", "count", "pinned", "start", "end")

    def __init__(self, buf: np.ndarray, start: int):
        self.buf = buf
        self.count = 0
        self.pinned = False
        self.start = start
        self.end = start + buf.nbytes


class HostArena:
    """Free host buffers of one Session (see the module docstring).

    max_bytes: idle memory kept, and what one run may hold at a time (default
    GPUKERNELS_HOST_POOL_MB; 0 turns the arena off).  min_bytes: host_empty's default
    floor.  ``poison`` (for tests) fills every buffer that comes back with 0xFF bytes,
    so a holder that should not exist reads NaNs."""

    def __init__(self, max_bytes: int | None = None, min_bytes: int = _MIN_BYTES):
        self.max_bytes = pool_limit() if max_bytes is None else max(0, int(max_bytes))
        self.min_bytes = min_bytes
        self.poison = False
        self._free: list = []  # (nbytes, buffer, address), returned longest ago first
        self._free_bytes = 0
        self._lock = threading.Lock()

    @property
    def idle_bytes(self) -> int:
        return self._free_bytes

    def idle_buffers(self) -> list:
        """The free buffers (1-D uint8 arrays), returned longest ago first."""
        with self._lock:
            return [b for _, b, _ in self._free]

    def run(self) -> "_RunBlock":
        """Make a new HostRun current for a with-block and yield it (None when the arena
        is off: host_empty then returns plain arrays).  The block hands what the run
        returns to ``HostRun.finish``; a block that raises gives nothing back.  (A small
        class rather than a generator context manager: every Session run pays it.)"""
        return _RunBlock(HostRun(self) if self.max_bytes > 0 else None)

    def _take(self, nbytes: int):
        """(buffer, address) of exactly nbytes: a free one, else a new one."""
        with self._lock:
            free = self._free
            for i in range(len(free) - 1, -1, -1):  # the most recently returned first
                if free[i][0] == nbytes:
                    _, buf, addr = free.pop(i)
                    self._free_bytes -= nbytes
                    return buf, addr
        buf = np.empty(nbytes, np.uint8)
        return buf, buf.__array_interface__["data"][0]

    def _give(self, entries) -> None:
        """Buffers back to the free list; past max_bytes the oldest are dropped."""
        if self.poison:
            for e in entries:
                e.buf.fill(0xFF)
        with self._lock:
            for e in entries:
                self._free.append((e.buf.nbytes, e.buf, e.start))
                self._free_bytes += e.buf.nbytes
            while self._free_bytes > self.max_bytes:
                self._free_bytes -= self._free.pop(0)[0]


class _RunBlock:
    """HostArena.run()'s with-block: its HostRun (or None) current inside it."""

    __slots__ = ("live", "token")

    def __init__(self, live):
        self.live = live
        self.token = None

    def __enter__(self):
        self.token = _CURRENT.set(self.live)
        return self.live

    def __exit__(self, *exc) -> None:
        _CURRENT.reset(self.token)
        if self.live is not None:
            self.live.close()


class HostRun:
    """The buffers one run took from its arena, and the runtime's counts of the values
    bound to each (see the module docstring).  ``taken`` is empty until the run takes a
    buffer: callers skip bind/unbind while it is."""

    __slots__ = ("arena", "taken", "held", "cap", "_lock")

    def __init__(self, arena: HostArena):
        self.arena = arena
        self.taken: dict = {}  # id(buffer) -> _Entry
        self.held = 0          # bytes of the buffers in taken
        self.cap = arena.max_bytes
        self._lock = threading.Lock()

    def empty(self, shape, dtype: np.dtype, min_bytes: int | None) -> np.ndarray:
        # plain Python arithmetic: np.ndim/np.prod cost ~10 us a call, paid by every output
        if shape.__class__ is tuple or shape.__class__ is list:
            shape = tuple(int(d) for d in shape)
        else:
            shape = (int(shape),) if np.ndim(shape) == 0 else tuple(int(d) for d in shape)
        nbytes = math.prod(shape) * dtype.itemsize
        floor = self.arena.min_bytes if min_bytes is None else min_bytes
        if nbytes < floor or nbytes <= 0 or dtype.hasobject:
            return np.empty(shape, dtype)
        with self._lock:
            if self.held + nbytes > self.cap:
                return np.empty(shape, dtype)
            self.held += nbytes
        buf, addr = self.arena._take(nbytes)
        with self._lock:
            self.taken[id(buf)] = _Entry(buf, addr)
        return buf.view(dtype).reshape(shape)

    def _entries(self, value) -> list:
        """The taken buffers that value's host arrays use (value: a runtime value, or a
        list or tuple of them)."""
        taken = self.taken
        found = []
        for v in (value if value.__class__ in _LISTS else (value,)):
            if v.__class__ is Tensor:
                v = v.array
            if v.__class__ is np.ndarray:  # the common case, kept short
                e = taken.get(id(v if v.base is None else root_of(v)))
                if e is not None:
                    found.append(e)
            elif v is not None:
                for a in host_arrays(v, []):
                    e = taken.get(id(root_of(a)))
                    if e is not None:
                        found.append(e)
        return found

    def bind(self, value) -> None:
        """value (a runtime value, or a list of them) was bound to a name."""
        found = self._entries(value)
        if found:
            with self._lock:
                for e in found:
                    e.count += 1

    def unbind(self, value) -> None:
        """The runtime dropped value: buffers no bound value uses any more go back."""
        found = self._entries(value)
        if not found:
            return
        back = []
        with self._lock:
            for e in found:
                e.count -= 1
                if e.count <= 0 and not e.pinned and self.taken.pop(id(e.buf), None) is e:
                    self.held -= e.buf.nbytes
                    back.append(e)
        if back:
            self.arena._give(back)

    def forget(self, value) -> None:
        """Like unbind, but nothing goes back now: value was handed on, to be bound again
        by whoever receives it (a graph's outputs to its caller)."""
        found = self._entries(value)
        if found:
            with self._lock:
                for e in found:
                    e.count -= 1

    def pin(self, value) -> None:
        """value is held where the runtime does not look: its buffers stay this run's."""
        found = self._entries(value)
        if found:
            with self._lock:
                for e in found:
                    e.pinned = True

    def finish(self, outputs) -> None:
        """The run returns outputs: every buffer not reachable from them goes back."""
        if not self.taken:  # the run took no buffer (small models): nothing to walk
            return
        arrays = host_arrays(outputs, [])
        roots = {id(root_of(a)) for a in arrays}
        spans = [_byte_bounds(a) for a in arrays if a.size]
        with self._lock:
            entries = list(self.taken.values())
            self.taken.clear()
            self.held = 0
        back = [e for e in entries if id(e.buf) not in roots
                and not any(lo < e.end and e.start < hi for lo, hi in spans)]
        if back:
            self.arena._give(back)

    def close(self) -> None:
        """Forget what finish did not give back (a run that raised)."""
        with self._lock:
            self.taken.clear()
            self.held = 0


# current_run() -> HostRun | None: the run whose arena host_empty uses now (the context
# variable's own get: the compiled loops ask once per iteration)
current_run = _CURRENT.get


@contextlib.contextmanager
def suspended():
    """No arena inside the block: arrays made there may outlive the current run
    (preparing a graph: initializers, folded constants, compiled programs)."""
    if _CURRENT.get() is None:
        yield
        return
    token = _CURRENT.set(None)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def host_empty(shape, dtype, min_bytes: int | None = None) -> np.ndarray:
    """An uninitialised host array for a kernel's output or scratch: from the current
    run's arena when it has min_bytes or more (default 4 MB), else np.empty."""
    live = _CURRENT.get()
    if live is None:
        return np.empty(shape, dtype)
    return live.empty(shape, np.dtype(dtype), min_bytes)


def pooled_empty(xp, shape, dtype, min_bytes: int | None = None):
    """An uninitialised array in namespace xp for a kernel's output or scratch: on the
    host through host_empty (min_bytes as there), on a GPU from CuPy's memory pool."""
    if xp is np:
        return host_empty(shape, dtype, min_bytes)
    return xp.empty(shape, dtype=dtype)
