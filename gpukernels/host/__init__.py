"""Host execution: the worker threads of large host kernels (``threads``) and the
buffer arena a Session's runs take large host arrays from (``arena``).  Host tuning
constants live in ``tuning``.

Nothing here imports kernels/ or runtime/: kernels call ``host_empty`` and
``parallel_ranges``; the runtime makes a Session's arena current for a run."""

from __future__ import annotations

from .arena import HostArena, HostRun, current_run, host_empty, pooled_empty, root_of, suspended
from .threads import copy_array, host_blocks, host_threads, on_host_thread, parallel_ranges, set_cpu_threads

__all__ = ["HostArena", "HostRun", "current_run", "host_empty", "pooled_empty", "root_of",
           "suspended", "copy_array", "host_blocks", "host_threads", "on_host_thread", "parallel_ranges",
           "set_cpu_threads"]
