"""Loading every kernel module, so that each registers its classes.

It imports no gpukernels module by name: it walks this package's folder, so the
registry (base.lookup and friends), the specialisation table and the package itself
can all load the kernels without importing one another."""

from __future__ import annotations

import importlib
import os
import pkgutil

_PACKAGE = __name__.rpartition(".")[0]
_PATH = [os.path.dirname(os.path.abspath(__file__))]
_loaded = False


def load_all() -> None:
    """Import every kernel module (idempotent; a module importing while this runs sees
    it as done, which is what a registration-time lookup needs)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for mod in pkgutil.walk_packages(_PATH, prefix=_PACKAGE + "."):
        if mod.name.rsplit(".", 1)[-1].startswith("_") or mod.name.endswith(".base"):
            continue
        importlib.import_module(mod.name)
