"""The optional dependencies eval needs, and the message when one is missing.

Nothing outside gpukernels.evaluation imports dask, distributed, zarr or matplotlib."""

from __future__ import annotations

import importlib

from .spec import MissingExtraError

_EXTRA = {"dask": "dist", "distributed": "dist", "zarr": "dist", "matplotlib": "dist", "dask_cuda": "dist-cuda"}


def missing(module: str, what: str) -> MissingExtraError:
    extra = _EXTRA.get(module, "dist")
    return MissingExtraError(f"{what} needs {module}, which is not installed: install the {extra!r} extra "
                             f"(pip install 'gpukernels[{extra}]')")


def require(module: str, what: str):
    """The imported module, or MissingExtraError naming the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise missing(module, what) from None
