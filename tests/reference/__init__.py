"""Independent float64 references shared by the kernel tests (one per operator family).

Written for clarity, not speed: loops over batch entries, heads, windows or boxes, in
float64 (NonMaxSuppression's IoU test in float32, as the spec's results depend on it).
Import as ``from tests.reference import softmax`` (tests/conftest.py puts the repository
root on sys.path)."""

from .attention import attention, attention_heads
from .detection import nms
from .grid import grid_sample
from .norm import batch_norm, batch_norm_training, group_norm, layer_norm, log_softmax, softmax
from .pool import pool, pool_out_size, same_pads
from .recurrent import recurrent
from .rotary import rotary
from .scatter import scatter_nd

__all__ = ["attention", "attention_heads", "batch_norm", "batch_norm_training", "grid_sample", "group_norm",
           "layer_norm", "log_softmax", "nms", "pool", "pool_out_size", "recurrent", "rotary", "same_pads",
           "scatter_nd", "softmax"]
