"""Independent float64 references shared by the kernel tests (one per operator family).

Written for clarity, not speed: loops over batch entries, heads, windows or boxes, in
float64 (NonMaxSuppression's IoU test in float32, as the spec's results depend on it).
Import as ``from tests.reference import softmax`` (tests/conftest.py puts the repository
root on sys.path); the tree ensembles' evaluator and generators as
``from tests.reference.trees import evaluate, random_forest``."""

from .attention import attention, attention_heads
from .conv import conv
from .detection import nms
from .grid import grid_sample
from .ml import post_transform
from .norm import batch_norm, batch_norm_training, group_norm, layer_norm, log_softmax, softmax
from .pool import pool, pool_out_size, same_pads
from .recurrent import recurrent
from .rotary import rotary
from .scatter import scatter_nd

__all__ = ["attention", "attention_heads", "batch_norm", "conv", "batch_norm_training", "grid_sample", "group_norm",
           "layer_norm", "log_softmax", "nms", "pool", "pool_out_size", "post_transform", "recurrent", "rotary",
           "same_pads", "scatter_nd", "softmax"]
