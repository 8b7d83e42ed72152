"""``gpukernels eval``: run a model over a whole dataset on Dask, and compare runtimes on it.

    >>> import gpukernels
    >>> r = gpukernels.evaluate("model.onnx", "val/", "out.zarr", against="onnxruntime")
    >>> r.samples_per_second, r.parity.passed

The driver (this process) scans the dataset (gpukernels.evaluation.data), opens the
output (gpukernels.evaluation.store), connects to a cluster (gpukernels.evaluation.cluster)
and submits one task per batch; each worker builds its Session once
(gpukernels.evaluation.worker) and returns the batch's outputs and, with ``against``,
its per-sample errors (gpukernels.evaluation.stats); the driver writes each batch once,
as it arrives, and at the end the parity report (gpukernels.evaluation.report).  Tasks
of a worker that dies run on the others (Dask reschedules them); a batch is written
only by the driver and only once.

Needs the ``dist`` extra (dask[distributed], zarr, matplotlib); importing this package
does not import them, and nothing else in gpukernels does.
"""

from __future__ import annotations

from .api import AGAINST, EvalResult, default_batch, evaluate
from .spec import EvalArgumentError, EvalError, MissingExtraError
from .stats import OutputParity, ParitySummary


def read_outputs(path) -> dict:
    """{output name: array over all samples} from an eval output (see store.read_outputs)."""
    from .store import read_outputs as _read

    return _read(path)


__all__ = ["evaluate", "EvalResult", "read_outputs", "ParitySummary", "OutputParity", "EvalError",
           "EvalArgumentError", "MissingExtraError", "AGAINST", "default_batch"]
