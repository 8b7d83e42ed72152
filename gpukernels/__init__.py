"""gpukernels: ONNX operator kernels on GPU (CuPy + hand-written CUDA) and CPU (NumPy).

    >>> from gpukernels import KernelContext, Tensor
    >>> from gpukernels.kernels import Gemm
    >>> Gemm(KernelContext("cpu"))(a, b, c, alpha=0.5, transB=1)

Importing gpukernels never imports CuPy; CUDA is probed on first use.
"""

from __future__ import annotations

__version__ = "0.1.0"

from . import dtypes, errors
from . import runtime  # noqa: F401 -- installs the SubgraphRunner that kernels run subgraphs with
from .dtypes import DataType
from .kernels.base import KernelBase, KernelContext
from .tensor import Optional, Sequence, Tensor
from .xp import Device, available_devices, cuda_status

__all__ = ["Tensor", "Sequence", "Optional", "KernelContext", "KernelBase", "Device", "DataType",
           "available_devices", "cuda_status", "dtypes", "errors", "__version__"]


def profile(*args, **kwargs):
    """Per-node timing of a model (see gpukernels.profiling.profile)."""
    from .profiling import profile as _profile

    return _profile(*args, **kwargs)


def evaluate(*args, **kwargs):
    """Run a model over a dataset on Dask (see gpukernels.evaluation.evaluate; needs the
    'dist' extra)."""
    from .evaluation import evaluate as _evaluate

    return _evaluate(*args, **kwargs)
