"""Exception types.  Every error gpukernels raises on purpose is a GpuKernelsError and
also a ValueError, TypeError or RuntimeError, so callers can catch either family."""

from __future__ import annotations


class GpuKernelsError(Exception):
    """Base of every gpukernels error."""


class KernelInputError(GpuKernelsError, ValueError):
    """An operator got inputs or attributes the ONNX spec does not allow (shapes,
    values, indices out of range, unknown modes)."""


class KernelTypeError(GpuKernelsError, TypeError):
    """An operator got an element type its schema does not allow."""


class UnsupportedOperatorError(GpuKernelsError, ValueError):
    """No kernel exists for (domain, op_type) at the requested opset."""


class DeviceError(GpuKernelsError, RuntimeError):
    """A device was asked for that is not usable (no CuPy, no GPU, no driver)."""


class CudaKernelError(GpuKernelsError, RuntimeError):
    """A hand-written CUDA kernel failed to compile or launch."""


class InputError(GpuKernelsError, ValueError):
    """A value fed to a model does not match what the model declares for that input
    (element type, rank, a fixed dimension)."""


class ModelError(GpuKernelsError, ValueError):
    """A model or graph is malformed (missing values, bad attributes, bad subgraph)."""


class ResourceLimitError(GpuKernelsError, ValueError):
    """An operator, a graph or a model asked for more memory than the allocation limit
    (option ``max_tensor_bytes`` / ``GPUKERNELS_MAX_TENSOR_BYTES``, see gpukernels.limits)
    allows.  Raised before allocating.  Attributes: nbytes (the request), limit, shape
    (or None) and op_type (or '')."""

    def __init__(self, message: str, nbytes: int = 0, limit: int = 0, shape=None, op_type: str = ""):
        super().__init__(message)
        self.nbytes = nbytes
        self.limit = limit
        self.shape = None if shape is None else tuple(int(d) for d in shape)
        self.op_type = op_type


class OptionError(GpuKernelsError, ValueError):
    """An option (KernelContext/Session options, or its GPUKERNELS_* environment
    variable) that gpukernels does not know, or a value it cannot take."""


class NodeError(GpuKernelsError):
    """A kernel failed inside a graph.  The message names the node, its op type and
    the shapes and dtypes of its inputs; the original error is chained as __cause__."""

    def __init__(self, message: str, node_name: str = "", op_type: str = ""):
        super().__init__(message)
        self.node_name = node_name
        self.op_type = op_type


class NodeValueError(NodeError, ValueError):
    pass


class NodeTypeError(NodeError, TypeError):
    pass


class NodeRuntimeError(NodeError, RuntimeError):
    pass


def node_error_for(original: BaseException, message: str, node_name: str, op_type: str) -> NodeError:
    """A NodeError of the same family (ValueError, TypeError, other) as original."""
    if isinstance(original, TypeError):
        cls = NodeTypeError
    elif isinstance(original, ValueError):
        cls = NodeValueError
    else:
        cls = NodeRuntimeError
    return cls(message, node_name=node_name, op_type=op_type)
