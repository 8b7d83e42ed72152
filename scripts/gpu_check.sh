#!/usr/bin/env bash
# gpukernels device check: the hand-written CUDA kernels on a real GPU, in one command that
# ends by itself (about 9 minutes at most) and always prints its summary table last, also
# when a step runs out of time.
#
# Usage (from anywhere; it runs in the repository root, with PYTHONPATH=., installs nothing):
#   bash scripts/gpu_check.sh                    # every step (GPU machine)
#   bash scripts/gpu_check.sh --quick            # fewer parity cases
#   bash scripts/gpu_check.sh --steps probe,warmup,tests,parity  # a subset (STEPS below): 370 s
#   bash scripts/gpu_check.sh --steps warmup,bench  # then this as a second command: 250 s (the
#                     warm-up finds CuPy's cache filled when the machine is still warm)
#   bash scripts/gpu_check.sh --emulator --quick # no GPU: the same steps on the CPU emulator
#   options: --seed N (parity/benchmark inputs; default random, printed), --no-bench,
#            --budget-scale F (multiply every step budget by F), --jobs N (default: cores)
#
# On a lent GPU machine (device tool `run`: repository root, $OUT comes back):
#   run(command="bash scripts/gpu_check.sh", timeout_s=600)
#
# STEPS and their wall-clock budgets in seconds (GPU / emulator); a step is stopped at its
# budget (SIGINT, then SIGKILL 10 s later) and the check goes on with the next one:
#   probe    30 /  60  nvidia-smi, versions, `gpukernels info` (compute capability, paths)
#   warmup  100 / 300  scripts/gpu_warmup.py: every CUDA instantiation compiled into CuPy's
#                      cache (CUPY_CACHE_DIR=build/cupy_cache), one process per core
#                      (emulator: the emulator's libraries)
#   tests   160 / 180  pytest -m gpu (GPU: the official Conv/Attention/LinearAttention/
#                      RotaryEmbedding cases through the CUDA kernels, tests/kernels/nn on
#                      cuda; emulator: selftests + official rotary cases), -n <cores> with
#                      pytest-xdist and --timeout 60 per test with pytest-timeout when they
#                      are importable, else serial under the step budget
#   parity   80 / 150  benchmarks/bench_gpu.py --parity-only: selftests, CUDA kernel vs
#                      array path vs float64 on fresh random inputs, outputs poisoned
#   bench   150 /  60  benchmarks/bench_gpu.py --bench-only: CUDA events around prepared
#                      launches and CUDA graphs, host time per run(), PyTorch (IEEE and TF32
#                      float32) -- emulator: scripts/launch_overhead.py (host time per launch)
#   perf      - / 240  emulator only: scripts/emu_perf_report.py --summary, shared-memory bank
#                      conflicts and global-memory sectors per request of the hot kernels
#   total   520 / 990  plus the summary; Python steps also stop themselves 10-15 s before
#                      their budget, so their own summaries are printed.
#
# Logs: every step's full output goes to $OUT/gpu_check_<step>.log (build/gpu_check/ when OUT
# is unset) and the final table to gpu_check_summary.txt there.  Exit status: 0 when every
# step passed, 1 otherwise.  PYTHON selects the interpreter (default: python3).
set -u
cd "$(dirname "$0")/.."
REPO="$PWD"
PY="${PYTHON:-python3}"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export CUPY_CACHE_DIR="${CUPY_CACHE_DIR:-$REPO/build/cupy_cache}"
# tests and parity: the CUDA kernels' outputs start as NaN bytes, so an element a kernel
# leaves unwritten cannot pass by luck (the benchmarks time on an unpoisoned backend)
export GPUKERNELS_CUDA_POISON=1

EMULATOR=0 QUICK="" NO_BENCH=0 SEED="" STEPS="probe,warmup,tests,parity,bench,perf" SCALE=1
JOBS="$(nproc 2>/dev/null || echo 4)"
while [ $# -gt 0 ]; do
  case "$1" in
    --emulator) EMULATOR=1 ;;
    --quick) QUICK="--quick" ;;
    --no-bench) NO_BENCH=1 ;;
    --seed) SEED="$2"; shift ;;
    --steps) STEPS="$2"; shift ;;
    --budget-scale) SCALE="$2"; shift ;;
    --jobs) JOBS="$2"; shift ;;
    -h|--help) awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$SEED" ] || SEED=$(( (RANDOM << 15) | RANDOM ))
[ "$NO_BENCH" = 1 ] && STEPS="${STEPS//bench/}"
LOGDIR="${OUT:-$REPO/build/gpu_check}"
mkdir -p "$LOGDIR" "$CUPY_CACHE_DIR"
rm -f "$LOGDIR"/gpu_check_*.log "$LOGDIR"/gpu_check_*.txt
if [ "$EMULATOR" = 1 ]; then
  declare -A BUDGET=([probe]=60 [warmup]=300 [tests]=180 [parity]=150 [bench]=60 [perf]=240)
  MODE=emulator
else
  declare -A BUDGET=([probe]=30 [warmup]=100 [tests]=160 [parity]=80 [bench]=150)
  MODE=gpu
fi
for k in "${!BUDGET[@]}"; do BUDGET[$k]=$(awk -v b="${BUDGET[$k]}" -v s="$SCALE" 'BEGIN{v = int(b*s); printf "%d", (v < 1 ? 1 : v)}'); done
has_module() { "$PY" -c "import $1" >/dev/null 2>&1; }
# deadline STEP MARGIN: seconds a step's own tool may start new cases: its budget less
# the margin its summary needs, at least 1 (a tool's deadline is never negative)
deadline() { local d=$((BUDGET[$1] - $2)); echo $((d < 1 ? 1 : d)); }
T_START=$SECONDS
ROWS=()
FAILED=0

# run_step NAME "KEY LINE REGEX" COMMAND... : runs under the step budget, output to the
# terminal and the step log; records status, seconds and the log's last matching line
run_step() {
  local name=$1 pattern=$2; shift 2
  local budget=${BUDGET[$name]} log="$LOGDIR/gpu_check_$name.log" t0=$SECONDS rc status key
  echo
  echo "==== [$name] budget ${budget}s: $*"
  timeout --signal=INT --kill-after=10 "$budget" "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  case $rc in
    0) status=ok ;;
    124|137) status=TIMEOUT ;;
    *) status="FAIL($rc)" ;;
  esac
  [ "$status" = ok ] || FAILED=1
  key=$(grep -E "$pattern" "$log" 2>/dev/null | tail -1 | tr -s ' ' | cut -c1-110)
  ROWS+=("$(printf '%-7s %-9s %4ss/%-4s %s' "$name" "$status" "$((SECONDS - t0))" "$budget" "$key")")
}
skip_step() { ROWS+=("$(printf '%-7s %-9s %4s/%-4s %s' "$1" skipped - "${BUDGET[$1]}" "$2")"); }
want() { case ",$STEPS," in *",$1,"*) return 0 ;; esac; return 1; }

# pytest with Python's SIGINT handler installed even when the caller ignores SIGINT, so that
# the step budget's SIGINT ends it with its summary
PYTEST=("$PY" -c "import signal, sys, pytest; signal.signal(signal.SIGINT, signal.default_int_handler); sys.exit(pytest.main(sys.argv[1:]))")
PYTEST_OPTS=(-q -p no:cacheprovider -rfE -o addopts= --strict-markers)
XDIST=no TIMEOUT_PLUGIN=no
if has_module xdist && [ "$JOBS" -gt 1 ]; then XDIST=yes; PYTEST_OPTS+=(-n "$JOBS"); fi
if has_module pytest_timeout; then TIMEOUT_PLUGIN=yes; PYTEST_OPTS+=(--timeout 60); fi

echo "gpukernels device check ($MODE): steps $STEPS, seed $SEED, $JOBS jobs, pytest-xdist $XDIST, " \
     "pytest-timeout $TIMEOUT_PLUGIN, logs in $LOGDIR"

GPU_OK=1
if want probe; then
  if [ "$MODE" = gpu ]; then
    run_step probe "^cuda:[0-9]|cuda_reason" bash -c \
      "nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv 2>&1 | head -3;
       '$PY' -c 'import sys, numpy, cupy; print(\"python\", sys.version.split()[0], \"numpy\", numpy.__version__, \"cupy\", cupy.__version__)' 2>&1;
       '$PY' -c 'import torch; print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda)' 2>&1 | tail -1;
       '$PY' -m gpukernels.cli info"
    grep -q "^cuda_available *True" "$LOGDIR/gpu_check_probe.log" || { GPU_OK=0; FAILED=1; }
  else
    run_step probe "^cuda_reason|^gpukernels " bash -c \
      "'${CXX:-g++}' --version | head -1; '$PY' -m gpukernels.cli info"
  fi
fi
if [ "$GPU_OK" = 0 ]; then
  for s in warmup tests parity bench; do want $s && skip_step $s "no usable GPU (probe log)"; done
else
  if want warmup; then
    run_step warmup "^warm-up summary" "$PY" scripts/gpu_warmup.py --jobs "$JOBS" \
      --deadline "$(deadline warmup 10)" $([ "$MODE" = emulator ] && echo --emulator)
  fi
  if want tests; then
    if [ "$MODE" = gpu ]; then
      run_step tests " passed| failed| error|no tests ran" "${PYTEST[@]}" "${PYTEST_OPTS[@]}" -m gpu \
        tests/gpu/test_official_cases_use_cuda_kernels.py tests/kernels/nn
    else
      run_step tests " passed| failed| error|no tests ran" "${PYTEST[@]}" "${PYTEST_OPTS[@]}" -m "not gpu" \
        tests/gpu/test_emulator.py tests/gpu/test_official_cases_use_cuda_kernels.py -k "emulator or rotary"
    fi
  fi
  if want parity; then
    run_step parity "^SUMMARY" "$PY" benchmarks/bench_gpu.py --parity-only $QUICK --seed "$SEED" \
      --deadline "$(deadline parity 15)" --summary "$LOGDIR/gpu_check_parity_summary.txt" \
      $([ "$MODE" = emulator ] && echo --emulator)
  fi
  if want bench; then
    if [ "$MODE" = gpu ]; then
      run_step bench "^SUMMARY" "$PY" benchmarks/bench_gpu.py --bench-only --seed "$SEED" \
        --deadline "$(deadline bench 15)" --summary "$LOGDIR/gpu_check_bench_summary.txt"
    else
      run_step bench "RotaryEmbedding run" "$PY" scripts/launch_overhead.py --repeat 100
    fi
  fi
  # shared-memory bank conflicts and global-memory sectors of the hot kernels (emulator)
  if [ "$MODE" = emulator ] && want perf; then
    run_step perf "^gk_la_chunk_prep" "$PY" scripts/emu_perf_report.py --summary
  fi
fi

{
  echo
  for part in parity bench; do
    f="$LOGDIR/gpu_check_${part}_summary.txt"
    [ -s "$f" ] && { echo "---- $part"; cat "$f"; }
  done
  if [ "$MODE" = emulator ] && [ -s "$LOGDIR/gpu_check_bench.log" ]; then
    echo "---- host time per call (scripts/launch_overhead.py)"; grep -E "^  " "$LOGDIR/gpu_check_bench.log"
  fi
  if [ "$MODE" = emulator ] && [ -s "$LOGDIR/gpu_check_perf.log" ]; then
    echo "---- emulator performance counters"; sed -n '/^kernel /,/^$/p' "$LOGDIR/gpu_check_perf.log"
  fi
  echo "==== gpukernels device check ($MODE, seed $SEED): $((SECONDS - T_START)) s, logs in $LOGDIR"
  printf '%-7s %-9s %9s %s\n' step status "time/budget" "key line"
  for r in "${ROWS[@]}"; do echo "$r"; done
  [ "$FAILED" = 0 ] && echo "ALL STEPS OK" || echo "SOME STEPS FAILED OR TIMED OUT (see the logs)"
} | tee "$LOGDIR/gpu_check_summary.txt"
exit "$FAILED"
