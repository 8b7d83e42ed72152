#!/usr/bin/env bash
# One call on a GPU machine (< 8 minutes on an H200): CUDA selftests, parity of every
# hand-written kernel against the array path and a float64 reference (fresh random inputs,
# outputs poisoned), and benchmarks against PyTorch; prints a short table last.
#
#   scripts/gpu_check.sh [--quick] [--no-bench] [--seed N]
#   scripts/gpu_check.sh --emulator --quick      # the same selftests/parity on the CPU emulator
#
# Needs CuPy (cupy-cuda12x) on the GPU machine; prints a clear message and exits 2 when it
# is missing.  PYTHON selects the interpreter (default: python3).
set -u
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
export GPUKERNELS_CUDA_POISON=1
# hard stop below 8 minutes so that the table of whatever ran still gets printed by the
# script's own budget checks well before this
exec timeout --signal=INT 470 "$PY" benchmarks/bench_gpu.py "$@"
