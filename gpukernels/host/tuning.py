"""Host and GPU tuning constants: one table, each entry with its unit, what it trades off
and where it was measured.

A tuning constant changes speed or memory, never results beyond float rounding: block
and chunk sizes, thread thresholds, cost-model weights, workspace sizes.  Not here: spec
constants (polynomial coefficients), accuracy bounds (Softmax's ``_DOT_SUM_MAX``,
LinearAttention's ``_FACTOR_LIMIT``), safety limits (``max_tensor_bytes``) and option
defaults (``attention_block_bytes``): those stay with their code.  Nor are tile sizes
that must equal a constant of a CUDA source (gpu/conv.py ``BN`` is conv.cu's ``BN``,
gpu/linear_attention.py ``CHUNK`` is linear_attention.cu's ``C``).

Kernels read an entry where they choose a path or a block size, ``tuning.value(name)``
(one dict lookup), so that ``override`` takes effect on the next call.  A kernel that
caches a plan keeps the value it planned with.

``override`` is a test hook, and not thread-safe by design: it changes the process-wide
table for the duration of a ``with`` block (tests/conftest.py's ``tuning`` fixture wraps
it).  Nothing in gpukernels calls it.
"""

from __future__ import annotations

import difflib
import numbers
from contextlib import contextmanager
from dataclasses import dataclass, replace

from ..errors import OptionError

# Where the measured entries were measured (benchmarks/RESULTS.md, session 3).
DEV = "dev machine (2 vCPUs of an Intel Sapphire Rapids host, AVX-512), 2026-11-29"
_CHOSEN = f"chosen on the {DEV}; no figures kept"
_DEFAULT = "not measured: a safe default"


# A second machine, for entries measured later (noisier: other jobs ran beside).
SHARED_VM = "2-vCPU AMD EPYC VM shared with other jobs, 2026-12-02"


def _on_dev(figures: str) -> str:
    return f"{DEV}: {figures}"


def _on_vm(figures: str) -> str:
    return f"{SHARED_VM}: {figures}"


@dataclass(frozen=True)
class Entry:
    """One tuning constant: ``name`` is "<kernel>.<what>", ``value`` an int or float."""

    name: str
    value: int | float
    unit: str
    trade: str
    measured: str


_KiB, _MiB = 1 << 10, 1 << 20

_ENTRIES = (
    # ------------------------------------------------------------ nn/attention.py
    Entry("attention.host_block_bytes", _MiB, "bytes",
          "score bytes per block of the host path (capped by the option attention_block_bytes): "
          "bigger blocks mean fewer BLAS calls, smaller keep exp2 and the row sums in cache",
          _CHOSEN),
    Entry("attention.host_causal_rows", 128, "query rows",
          "rows per causal block: smaller blocks skip more masked keys, but call BLAS more often", _CHOSEN),
    Entry("attention.few_rows", 8, "query rows per KV head",
          "up to this many rows, scores are K @ q^T (decoding, a matrix-vector-like product) "
          "instead of Q @ K^T", _CHOSEN),
    # ------------------------------------------------------------ nn/norm.py
    Entry("batch_norm.host_block_bytes", _MiB, "bytes",
          "block of the host scale-and-shift: the add reads the product while it is in cache, "
          "against per-block call overhead", _CHOSEN),
    Entry("norm.host_row_block_bytes", 4 * _MiB, "bytes",
          "row block of host LayerNormalization/RMSNormalization: ~10 NumPy calls per block "
          "against cache size",
          _on_dev("4 MiB blocks 15-20% faster than 1 MiB on LayerNormalization 32x512x768")),
    # ------------------------------------------------------------ nn/conv_transpose.py
    Entry("conv_transpose.phase_scatter_cost", 60, "GEMM multiply-adds",
          "cost of one strided col2im add (stride > 1) in the host cost model that picks the "
          "phase-split GEMM over scatter-adds", _on_dev("float32")),
    Entry("conv_transpose.phase_scatter_cost_s1", 35, "GEMM multiply-adds",
          "the same with every stride 1 (contiguous adds)", _on_dev("float32")),
    Entry("conv_transpose.phase_weight_cost", 150, "GEMM multiply-adds",
          "one element of the phase weight matrix, built on every call", _on_dev("float32")),
    Entry("conv_transpose.pooled_scratch_bytes", 256 * _KiB, "bytes",
          "scratch this big or bigger comes from the host buffer pool: page faults of fresh "
          "arrays against the pool's bookkeeping", _DEFAULT),
    # ------------------------------------------------------------ nn/_pool_host.py, nn/pool.py
    Entry("pool.host_block_bytes", _MiB, "bytes",
          "block of the host strided-taps pooling with its scratch copies: cache against "
          "per-block overhead", _on_dev("best at 0.5-1 MiB")),
    Entry("pool.host_thread_bytes", 32 * _MiB, "input bytes per thread",
          "before the host pooling splits over threads: a thread pays only for work of "
          "several ms (an idle vCPU wakes 0.2-1.8 ms late)", _CHOSEN),
    Entry("pool.pooled_bytes", 64 * _KiB, "bytes",
          "host pooling outputs and scratch this big or bigger come from the buffer pool",
          _DEFAULT),
    Entry("pool.host_window_block_bytes", 512 * _KiB, "bytes",
          "padded input per block of the window (reference) path on the host; the GPU takes "
          "the whole workspace", _CHOSEN),
    # ------------------------------------------------------------ nn/_lstm_host.py
    Entry("lstm.small_product", 1 << 19, "multiply-adds",
          "largest step product OpenBLAS runs in the calling thread; bigger ones are split "
          "into row blocks under it (its thread pool stalls on a busy core)", _CHOSEN),
    Entry("lstm.min_block_rows", 16, "rows",
          "fewest rows of one block of a split step product", _CHOSEN),
    Entry("lstm.projection_cols", 128, "columns (steps x batch)",
          "one chunk of the input projection run alongside the recurrence", _CHOSEN),
    Entry("lstm.sub_cols", 32, "columns",
          "one product inside a projection chunk",
          _on_dev("32 columns 15-20% faster than 128 (256 inputs)")),
    Entry("lstm.pooled_scratch_bytes", 64 * _KiB, "bytes",
          "host scratch and outputs this big or bigger come from the buffer pool", _DEFAULT),
    # ------------------------------------------------------------ nn/rotary.py
    Entry("rotary.host_block_elems", 1 << 16, "elements of X",
          "block of the host rotation: the passes over a block run in cache", _CHOSEN),
    # ------------------------------------------------------------ nn/linear_attention.py
    Entry("linear_attention.recurrent_max_t", 16, "steps",
          "mode 'auto': sequences up to this long run the step recurrence, longer ones the "
          "chunked form", _DEFAULT),
    # ------------------------------------------------------------ gpu/linear_attention.py
    Entry("linear_attention.cuda_recurrent_max_t", 64, "steps",
          "CUDA mode 'auto': sequences up to this long run the recurrent kernel (one launch, "
          "T dependent steps), longer ones the chunked kernels (parallel within a chunk)",
          _DEFAULT),
    Entry("linear_attention.cuda_workspace_bytes", 64 * _MiB, "bytes",
          "chunk-local workspace of one launch pair of the chunked CUDA kernels: more chunks "
          "per launch (fewer launches) against GPU memory", _DEFAULT),
    # ------------------------------------------------------------ gpu/attention.py
    Entry("attention.cuda_max_splits", 64, "key splits",
          "most blocks one query row's keys are split over when few blocks would run "
          "(decoding): parallelism against the partial-result workspace and the combine "
          "kernel", _DEFAULT),
    # ------------------------------------------------------------ signal/dft.py
    Entry("dft.thread_items", 1 << 16, "signal elements per thread",
          "before a host DFT splits its signals over threads", _CHOSEN),
    # ------------------------------------------------------------ math/reductions.py
    Entry("reduce.thread_items", 1 << 19, "input elements per thread",
          "before a host reduction splits over threads",
          _on_vm("a 2-vCPU AVX-512 EPYC VM (a hand-off to a pool thread 64-300 us), ReduceSum "
                 "medians 2 threads against 1: 512 Ki elements 1.4x slower over the last axis "
                 "(225 vs 159 us), 2.5x over a middle one (243 vs 98); 1 Mi and 2 Mi even; "
                 "4 Mi 1.8x faster")),
    Entry("arg_reduce.thread_items", 1 << 20, "input elements per thread",
          "before a host ArgMax/ArgMin splits over threads", _CHOSEN),
    # ------------------------------------------------------------ math/_mathcommon.py
    Entry("elementwise.block_elems", 1 << 16, "elements",
          "block of the host blockwise evaluation of a long elementwise chain (Erf, Mish...): "
          "the chain's temporaries in L2 against per-block call overhead",
          _on_dev("Mish on 8M elements 1.7x faster than with 1 << 14")),
    # ---------------------------------------- nn/conv.py, _conv_host.py, _depthwise_host.py, _spatial.py
    Entry("spatial.workspace_bytes", 256 * _MiB, "bytes",
          "largest im2col-like work buffer of one chunk (Conv, ConvTranspose, pooling windows, "
          "MaxRoiPool): memory held against the number of chunks", _DEFAULT),
    Entry("spatial.host_chunk_bytes", 8 * _MiB, "bytes",
          "the same on the host: the column copy and the product that reads it stay in cache",
          _on_dev("4-16 MiB best on a 2-core x86")),
    Entry("conv.host_cols_bytes", 8 * _MiB, "bytes",
          "column buffer of the host 2-D Conv (im2col by phase images; conv2d_windows: columns "
          "and product, and separately its kept zero-bordered scratch per thread): images per "
          "product against cache",
          _on_dev("2-core AVX-512 host") + "; " +
          _on_vm("8 MiB beat 2 MiB, 1 MiB and 512 KiB by 5-25% on UNet's 2x16x96x96 to "
                 "2x64x16x16 3x3 convolutions (1 thread)")),
    Entry("conv.depthwise_plane_bytes", 16 * _MiB, "bytes",
          "host depthwise Conv: largest per-node set of (inputs x outputs) plane matrices "
          "(depthwise_plane_products) or row Toeplitz matrices (depthwise_row_toeplitz), "
          "kept per constant weight: memory against the tap paths",
          "chosen: mobilenet/efficientnet/convnext-sized planes up to a 1152-channel 7x7 one "
          "(11 MiB) fit; larger ones use the tap paths"),
    Entry("conv.host_fold_pixels", 2304, "output pixels per image",
          "host 2-D Conv: images this small share one product (the batch folded into the "
          "columns, the weights packed once, Y written by a transposing copy)",
          _on_vm("conv2d_windows, 2 BLAS threads: 2x32x24x24 by 32x32x3x3 516 -> 483 us, "
                 "2x16x48x48 by 32x16x3x3 920 -> 824 us; 1 thread within 3% up to 48x48; "
                 "2x16x96x96 2556 -> 2680 us")),
    Entry("conv.host_wide_cost", 512, "multiply-adds per kernel tap and output row",
          "host 2-D Conv (conv2d_windows): wide rows (one copy run per window, M * (Wq - Wo) "
          "extra multiply-adds) up to this and when the extra columns are at most half the "
          "row, else exact rows (Ho copy runs per window)",
          _on_vm("2 BLAS threads: 2x128x8x8 by 128x128x3x3 797 -> 582 us, 2x64x12x12 by "
                 "128x64x3x3 864 -> 683 us (1 thread: 1-4% slower); 2x128x12x12 dilation 4 "
                 "(M * 8 = 1024) exact 1576 vs wide 2525 us")),
    Entry("conv.host_phase_pixels", 0, "output pixels per image",
          "host 2-D Conv (conv2d_windows) with strides of up to 4 phases: phase images "
          "(contiguous copy runs, one more copy per phase) above this, else windows read with "
          "the strides",
          _on_vm("2 BLAS threads: phase images always faster (2x32x24x24 by 64x32x3x3 stride 2 "
                 "336 -> 218 us, 2x64x16x16 by 128x64x3x3 493 -> 348 us); 1 thread: within "
                 "10% either way below 256 pixels")),
    Entry("conv.arena_min_bytes", 256 * _KiB, "bytes",
          "host Conv outputs from this size on come from the Session's arena (fresh arrays of a "
          "few MB are page-faulted in again on every call inside a model)", _CHOSEN),
    Entry("depthwise.thread_items", 1 << 22, "output elements",
          "host depthwise Conv: output elements per thread before a second thread is woken "
          "(waking one costs more than it saves for calls of a few ms)",
          _on_dev("2-core VM") + "; " + _on_vm("load 3.7: two threads 1.4-1.75x slower on every "
                                               "mobile-network shape (2x72x24x24 3x3 282 -> 440 us)")),
    Entry("depthwise.taps_block_bytes", 4 * _MiB, "bytes",
          "host depthwise Conv: tap copies of one channel block (every image's): fewer, "
          "bigger blocks against cache",
          _on_vm("1 thread, CPU time: 2x16x48x48 3x3 375 -> 205 us from 256 KiB to 4 MiB, "
                 "2x72x24x24 3x3 355 -> 275 (512 KiB), 2x32x16x16 7x7 355 -> 260; no gain past 4 MiB "
                 "(warm caches; with the caches evicted before each call 1 MiB was 0-15% faster, "
                 "inside mobilenet_v2 within noise)")),
    Entry("depthwise.cache_block_bytes", 256 * _KiB, "bytes",
          "depthwise Conv of other ranks: channels per block so the block stays in cache", _CHOSEN),
    # ------------------------------------------------------------ host/threads.py
    Entry("copy.thread_min_bytes", 4 * _MiB, "bytes",
          "host copies (copy_array) from this size on are split over the host threads", _CHOSEN),
    Entry("copy.thread_bytes", _MiB, "bytes", "bytes per thread of a split host copy", _CHOSEN),
    Entry("elementwise.thread_min_elems", 1 << 18, "elements",
          "each host thread's least share of an elementwise chain (Gelu, the logistic family, "
          "their Conv epilogues) split over the threads",
          _on_vm("Gelu's 18-call chain, 2 threads against 1: 64 Ki elements each 1.15x faster, "
                 "128 Ki 1.6x, 600 Ki 2x; 32 Ki each 0.8x (the GIL changes hands at every call); "
                 "on a 2-vCPU AVX-512 EPYC VM whose hand-off to a pool thread costs 64 us at "
                 "best, 300 us median, medians 2 threads against 1: Gelu 128 Ki elements each "
                 "0.88x, 256 Ki 1.17x; Sigmoid 64 Ki 0.70x, 128 Ki 0.93x, 256 Ki 1.15x")),
    # ------------------------------------------------------------ math/activations.py
    Entry("logistic.block_elems", 1 << 16, "elements",
          "block of the host Sigmoid/Swish/HardSigmoid/HardSwish/Mish pass: the block and its "
          "scratch (256 KiB each in float32) in L2 against per-block call overhead",
          _on_dev("best of 2^14..2^18 on 1x96x112x112 and 8M elements")),
    Entry("gelu.block_elems", 1 << 17, "elements",
          "block of the host float32 Gelu (x, out and two scratch blocks: 2 MiB together)",
          _on_dev("twice the L2-sized block measured 15% faster (18 calls' fixed cost per block)")),
    # ------------------------------------------------------------ math/matmul.py
    Entry("matmul.host_vector_rows", 4, "rows of A (batch axes included)",
          "up to this many rows, a host MatMul/Gemm with a 2-D B runs one vector-matrix "
          "product (BLAS gemv) per row instead of one GEMM: no packing of B on every call, "
          "no split over BLAS threads; the GEMM wins from about 6 rows",
          _on_vm("one thread: (2,256)@(256,768) 40 vs 78 us, (2,256)@(256,2000) 77 vs 172 us, "
                 "6 rows equal")),
    Entry("matmul.host_vector_min_bytes", 2 * _MiB, "bytes of B",
          "2 to matmul.host_vector_rows rows take the per-row gemv only from this size of B "
          "on: a smaller B is packed once by the GEMM (in cache), where each gemv reads all of it",
          _on_vm("2 BLAS threads, 2 rows, GEMM against 2 gemv: B 1024x256 17 vs 26 us, 512x768 "
                 "25-33 vs 44-47, 256x1536 28-31 vs 39-45; 768x768 89-97 vs 42-55, 768x2304 390 vs "
                 "199, 256x2000 61 vs 31")),
    # ------------------------------------------------------------ math/softmax.py
    Entry("softmax.host_block_elems", 1 << 16, "elements",
          "block of whole slices along a non-last axis: every pass runs in cache", _CHOSEN),
    Entry("softmax.row_block_elems", 1 << 20, "elements",
          "row block of the host row path: a few NumPy calls per block against cache size",
          _on_dev("1 << 20 15-20% faster than 1 << 17 on Softmax 32x512x3072")),
    # ------------------------------------------------------------ tensor/
    Entry("transpose.tile", 64, "elements",
          "of the output's last axis copied per pass of a tiled host transpose", _CHOSEN),
    Entry("transpose.tiled_min_elems", _MiB, "elements",
          "smallest strided copy that takes the tiled host transpose", _CHOSEN),
    Entry("transpose.thread_elems", _MiB, "elements per thread",
          "before the tiled host transpose splits over threads (a copy of a few ms)", _CHOSEN),
    Entry("gather.thread_bytes", _MiB, "output bytes per thread",
          "before a host Gather splits over threads", _CHOSEN),
    Entry("grid_sample.gather_chunk_elems", _MiB, "elements",
          "gathered taps held at once by the reference path (a workspace bound)", _DEFAULT),
    Entry("grid_sample.host_block_elems", 1 << 19, "elements",
          "one (channels, taps, points) gather buffer of the host path",
          _on_dev("8-10% faster than 1 << 17 with two threads")),
    Entry("grid_sample.taps_points", 1 << 13, "grid points",
          "whose taps the host computes at once (cache-sized)", _CHOSEN),
    Entry("grid_sample.thread_work", _MiB, "gathered tap elements per thread",
          "about 1 ms of work per extra host thread", _CHOSEN),
    Entry("resize.band_block", 16, "outputs",
          "per block of the banded-matmul resize", _CHOSEN),
    Entry("resize.band_min_rows", 64, "rows",
          "fewest interpolated rows per block for the banded matmul; fewer take the taps",
          _CHOSEN),
    Entry("scatter.parallel_assign", _MiB, "update elements per thread",
          "before a host ScatterND row assignment splits over threads", _CHOSEN),
    # ------------------------------------------------------------ detection.py
    Entry("nms.block", 128, "candidates",
          "per block of NonMaxSuppression's vectorised (reference) path", _DEFAULT),
    Entry("nms.host_pairs", 1 << 30, "(batch, class) pairs",
          "up to this many live pairs the host runs one pair at a time (the loop), else the "
          "vectorised blocks", _on_dev("the loop 2-3x faster than the blocks even for 80 classes")),
    Entry("nms.pair_budget", 1 << 21, "candidate pairs",
          "most pairs one host sweep lists (a few int64 workspaces of this size); a pair "
          "needing more goes through the blocks", _DEFAULT),
    Entry("nms.greedy_loop_edges", 4096, "edges",
          "up to this many suppression edges are resolved by a Python loop, more by arrays",
          _CHOSEN),
    # ------------------------------------------------------------ ml/tree.py
    Entry("tree.chunk_pairs_cpu", 1 << 16, "(sample, tree) pairs",
          "per evaluation chunk of a tree ensemble on the host: a chunk's gathers in cache",
          _on_vm("flat from 1 << 14 to 1 << 20 (best times within 10%; TreeEnsembleRegressor, "
                 "100 trees of depth 8, 20000 rows)")),
    Entry("tree.chunk_pairs_cuda", 1 << 22, "(sample, tree) pairs",
          "per evaluation chunk on a GPU: few, large launches against workspace", _DEFAULT),
    Entry("tree.dense_max_entries", 1 << 21, "table entries",
          "largest [node, target] table of leaf values (16 MiB of float64) reduced by one "
          "gather; bigger ensembles scatter per contribution slot",
          _DEFAULT),
    # ------------------------------------------------------------ codec.py
    Entry("codec.encode_chunk_cpu", 1 << 16, "elements",
          "per pass of the float32 encode to bfloat16/float8 on the host: the temporaries "
          "stay in cache",
          _on_vm("8M elements to float8e4m3fn / bfloat16: 1 << 16 and 1 << 18 within 10%, "
                 "1 << 14 1.4-2.3x and 1 << 20 1.5-1.6x slower")),
    Entry("codec.encode_chunk_cuda", 1 << 24, "elements",
          "per pass of the float32 encode on a GPU: bounds the workspace", _DEFAULT),
    # ------------------------------------------------------------ evaluation/api.py
    Entry("evaluation.batch_bytes", 4 * _MiB, "input bytes",
          "default batch of gpukernels eval (no --batch): task overhead against worker "
          "memory", _DEFAULT),
    Entry("evaluation.max_batch", 256, "samples",
          "most samples of a default batch", _DEFAULT),
)

# Not here: the arena's floor and size (host/arena.py: GPUKERNELS_HOST_POOL_MB), the host
# thread count (host/threads.py: GPUKERNELS_CPU_THREADS), both settings of their own, and
# runtime/body.py's _FREE_BYTES / _STAND_IN_BYTES (1 << 15, 1 << 12: when a compiled body
# frees an intermediate, what a recording copies), runtime bookkeeping rather than kernel tuning.

_TABLE = {e.name: e for e in _ENTRIES}
_VALUES = {e.name: e.value for e in _ENTRIES}  # what value() returns; override() edits it


def value(name: str) -> int | float:
    """The current value of the entry ``name`` (OptionError when unknown)."""
    try:
        return _VALUES[name]
    except KeyError:
        raise _unknown(name) from None


def table() -> tuple[Entry, ...]:
    """Every entry, with its current value."""
    return tuple(replace(e, value=_VALUES[e.name]) for e in _ENTRIES)


@contextmanager
def override(**values):
    """Test hook: ``with override(**{"attention.host_block_bytes": 4096}): ...`` sets
    entries for the block and restores them after.  Changes the process-wide table: not
    for use while other threads run kernels."""
    for name, new in values.items():
        _check(name, new)
    saved = {name: _VALUES[name] for name in values}
    _VALUES.update(values)
    try:
        yield
    finally:
        _VALUES.update(saved)


def _check(name, new):
    entry = _TABLE.get(name)
    if entry is None:
        raise _unknown(name)
    kind = numbers.Integral if isinstance(entry.value, int) else numbers.Real
    if isinstance(new, bool) or not isinstance(new, kind):
        raise OptionError(f"tuning entry {name!r} takes {'an int' if kind is numbers.Integral else 'a number'} "
                          f"({entry.unit}), got {new!r} ({type(new).__name__})")


def _unknown(name) -> OptionError:
    close = difflib.get_close_matches(str(name), _TABLE, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return OptionError(f"unknown tuning entry {name!r}{hint}")
