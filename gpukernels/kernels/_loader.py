"""Loading every kernel module, so that each registers its classes.

It imports no gpukernels module by name: it walks this package's folder, so the
registry (base.lookup and friends), the specialisation table and the package itself
can all load the kernels without importing one another."""

from __future__ import annotations

import importlib
import os
import pkgutil
import threading

_PACKAGE = __name__.rpartition(".")[0]
_PATH = [os.path.dirname(os.path.abspath(__file__))]
_loaded = False            # set only once every module imported
_local = threading.local()  # .loading: this thread is inside load_all


def load_all() -> None:
    """Import every kernel module (idempotent).

    A call made while this thread is already loading (a module's registration-time
    lookup) returns at once.  Other threads never see a half-filled registry: until the
    first load has finished, each caller walks the modules itself (importlib makes it
    wait for a module another thread is importing).  A failed import raises here and
    again at the next call, instead of leaving a registry with kernels missing."""
    global _loaded
    if _loaded or getattr(_local, "loading", False):
        return
    _local.loading = True
    try:
        for mod in pkgutil.walk_packages(_PATH, prefix=_PACKAGE + "."):
            if mod.name.rsplit(".", 1)[-1].startswith("_") or mod.name.endswith(".base"):
                continue
            importlib.import_module(mod.name)
    finally:
        _local.loading = False
    _loaded = True
