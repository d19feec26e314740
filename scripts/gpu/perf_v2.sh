#!/usr/bin/env bash
# Issue 17 in one GPU call of at most 9 minutes on an H200 host (16 cores):
#   1. tests:  the operator's GPU tests (operator, spec, launch path, model), in parallel
#              with the compilation of every launch candidate of the sweep on the other
#              cores (scripts/gpu/warm_kernels.py; nothing is timed while they run);
#   2. sweep:  every candidate checked against the fp64 loop kernel, then timed by device
#              time (profiler, L2 flushed); the plan is the fastest correct one per regime
#              and element size, written into forward.py/backward.py of this copy
#              (plan.diff keeps it) and used by every step after it;
#   3. bench:  the operator as users call it, per case: device time, do_bench
#              (host-inclusive), eager dispatch (forward and forward+backward), CUDA-graph
#              replay, peak memory; on the decoder cases also torch.compile default and
#              reduce-overhead;
#   4. limits: decoder_limits.py and dispatch_profile.py with that plan;
#   5. model:  whole training steps (scripts/gpu/model_steps.py), eager and compiled.
# Every step writes its JSON as it goes and stops starting new measurements at its own
# budget; the whole run ends its last step by BUDGET seconds (default 525).  What does not
# fit (usually the training steps) is for a second call:
#   OUT=dir PARTS="limits model" PLAN=results/sweep_h200.json bash scripts/gpu/perf_v2.sh
# (PLAN: a sweep's results file whose plan is written into this copy first; PARTS: any of
# tests sweep bench limits model, run in that order.)
# Usage, from the repository root:  OUT=dir bash scripts/gpu/perf_v2.sh
# Writes under $OUT: gpu_tests.json (+ logs), warm_kernels.json, sweep_h200.json,
# plan.diff, decoder_limits_h200.json, dispatch_profile_h200.json, bench_h200.json,
# model_steps_h200.json, logs/, summary.txt.
set -u
OUT=${OUT:?set OUT to the folder for the results}
BUDGET=${BUDGET:-525}
PARTS=" ${PARTS:-tests sweep bench limits model} "
want() { [[ "$PARTS" == *" $1 "* ]]; }
START=$(date +%s)
LOGS=$OUT/logs
mkdir -p "$LOGS" "$OUT/tests"
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$PWD/.gpu_state/triton_cache}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p "$TRITON_CACHE_DIR"

elapsed() { echo $(( $(date +%s) - START )); }
# seconds left until the run must end, less a reserve
left() { local r=$(( BUDGET - $(elapsed) - ${1:-0} )); [ "$r" -lt 5 ] && r=5; echo "$r"; }
note() { echo "== [$(elapsed)s] $*" | tee -a "$OUT/summary.txt"; }
# run NAME LIMIT COMMAND...: output to logs/NAME.log, exit status noted
run() {
  local name=$1 limit=$2; shift 2
  note "$name (limit ${limit}s)"
  timeout --kill-after=5 "$limit" "$@" > "$LOGS/$name.log" 2>&1
  local code=$?
  echo "exit $code" >> "$LOGS/$name.log"
  tail -n 4 "$LOGS/$name.log" | tee -a "$OUT/summary.txt"
}

{ nvidia-smi; python3 -c "import sys, torch, triton; print(sys.version); print('torch', torch.__version__, 'triton', triton.__version__, 'gpus', torch.cuda.device_count())"; python3 -c "import xdist; print('xdist', xdist.__version__)"; nproc; git rev-parse HEAD; git status --short; } > "$LOGS/versions.txt" 2>&1
note "start: $(head -c 300 "$LOGS/versions.txt" | tr '\n' ' ')"

write_plan() {
  if [ -f "$1" ] && python3 -m source_kernels.bench --write-plan "$1" > "$LOGS/plan.log" 2>&1; then
    git diff -- source_kernels/forward.py source_kernels/backward.py > "$OUT/plan.diff" 2>/dev/null
    note "plan of $1 written into this copy:"; cat "$LOGS/plan.log" | tee -a "$OUT/summary.txt"
  else
    note "no plan written from $1 (see logs/plan.log)"
  fi
}
[ -n "${PLAN:-}" ] && write_plan "$PLAN"

# 1. tests, with the sweep's kernels compiling beside them
if want tests; then
CORES=$(nproc)
WARM_WORKERS=$(( CORES > 12 ? CORES - 7 : CORES / 2 ))
[ "$WARM_WORKERS" -lt 1 ] && WARM_WORKERS=1
note "warm_kernels ($WARM_WORKERS workers, in the background)"
timeout --kill-after=5 200 python3 scripts/gpu/warm_kernels.py --workers "$WARM_WORKERS" \
  --budget-s 150 --json "$OUT/warm_kernels.json" > "$LOGS/warm_kernels.log" 2>&1 &
WARM_PID=$!
run gpu_tests 185 python3 scripts/gpu/gpu_tests.py "$OUT/tests" --workers 6 --timeout-s 175
wait "$WARM_PID"
tail -n 2 "$LOGS/warm_kernels.log" | tee -a "$OUT/summary.txt"
fi

# 2. the sweep, most important (preset, dtype) first; then the plan it chose
if want sweep; then
SWEEP_S=$(( $(left 160) < 150 ? $(left 160) : 150 ))
run sweep $(( SWEEP_S + 35 )) python3 -m source_kernels.bench --sweep --no-bench --no-dispatch \
  --sweep-local-encoder --budget-s "$SWEEP_S" --out "$OUT/sweep_h200.json" --sweep-cases \
  decoder/bf16 encoder/bf16 decoder/fp32 encoder/fp32 decoder/fp64 decoder-b32/bf16 \
  decoder-b32/fp32 encoder/fp64 decoder-b32/fp64
write_plan "$OUT/sweep_h200.json"
fi

# 3. the operator as users call it: the decoder cases eagerly and compiled, then the rest
if want bench; then
BENCH_S=$(( $(left 40) < 125 ? $(left 40) : 125 ))
run bench $(( BENCH_S + 30 )) python3 -m source_kernels.bench --fast --impls triton \
  --compile --budget-s "$BENCH_S" --out "$OUT/bench_h200.json" --cases \
  decoder/uniform/bf16 decoder/uniform/fp32 encoder/uniform/bf16 encoder/local/bf16 \
  encoder/uniform/fp16 encoder/uniform/fp32 decoder/uniform/fp64 encoder/local/fp32 \
  decoder-b32/uniform/bf16 decoder-b32/uniform/fp32 encoder/uniform/fp64 \
  decoder-b32/uniform/fp64 decoder/local/bf16 decoder/uniform/fp16 encoder/local/fp16 \
  --compile-cases decoder/uniform/bf16 decoder/uniform/fp32
fi

# 4. what bounds the decoder, where the host time goes, with the new plan
if want limits && [ "$(left 0)" -gt 45 ]; then
run decoder_limits 30 python3 scripts/gpu/decoder_limits.py "$OUT"
run dispatch_profile 30 python3 scripts/gpu/dispatch_profile.py "$OUT" --calls 500
elif want limits; then
  note "limits skipped: $(left 0)s left"
fi

# 5. training steps, as long as the budget allows
MODEL_S=$(( $(left 15) - 40 ))
if ! want model; then
  :
elif [ "$MODEL_S" -gt 20 ]; then
  run model_steps $(( MODEL_S + 35 )) python3 scripts/gpu/model_steps.py "$OUT" --budget-s "$MODEL_S"
else
  note "model_steps skipped: ${MODEL_S}s left"
fi

note "done in $(elapsed)s"
ls -la "$OUT" >> "$OUT/summary.txt"
exit 0
