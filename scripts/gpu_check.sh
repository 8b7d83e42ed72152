#!/usr/bin/env bash
# One call on a GPU machine (under 8 minutes on an H200):
#   1. the GPU tests: the official Conv/Attention/LinearAttention/RotaryEmbedding cases on
#      cuda through the CUDA kernels (launches counted) and the nn kernel tests on cuda;
#   2. CUDA selftests, parity of every hand-written kernel against the array path and a
#      float64 reference (fresh random inputs, outputs poisoned before each run);
#   3. benchmarks against PyTorch; a short table is printed last.
#
#   scripts/gpu_check.sh [--quick] [--no-bench] [--seed N]
#   scripts/gpu_check.sh --emulator --quick      # steps 2-3's parity on the CPU emulator
#
# Needs CuPy on the GPU machine (the H200 image has cupy-cuda13x, numpy, onnx, ml-dtypes,
# PyTorch); runs from the checkout (PYTHONPATH=.), no install.  PYTHON selects the
# interpreter (default: python3).
set -u
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export GPUKERNELS_CUDA_POISON=1
case " $* " in
  *" --emulator "*) ;;
  *)
    echo "== GPU tests (pytest -m gpu, at most 150 s)"
    timeout --signal=INT 150 "$PY" -m pytest -q -p no:cacheprovider -m gpu \
        tests/gpu/test_official_cases_use_cuda_kernels.py tests/kernels/nn 2>&1 | tail -25
    echo "pytest exit status: ${PIPESTATUS[0]}"
    ;;
esac
export GPUKERNELS_BENCH_BUDGET=250
exec timeout --signal=INT 300 "$PY" benchmarks/bench_gpu.py "$@"
