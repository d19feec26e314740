#!/usr/bin/env bash
# A short GPU lease: the operator tests in GPU mode, then the benchmark table with the
# committed launch plan (no sweep), fewer repetitions per figure (--fast).  Everything runs
# under one time limit (BUDGET seconds) and lands in $OUT/gpu_bench.tgz.
set -u
OUT=${OUT:-/tmp/gpu_out}; STAGE=$(mktemp -d); mkdir -p "$STAGE/results" "$STAGE/logs" "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 55 python3 -m pytest tests/test_operator.py tests/test_spec.py -q -p no:cacheprovider -n 16 \
  > "$STAGE/logs/gpu_tests.log" 2>&1; echo "exit $?" >> "$STAGE/logs/gpu_tests.log"; tail -3 "$STAGE/logs/gpu_tests.log"
timeout $(( ${BUDGET:-220} - 60 )) python3 -m source_kernels.bench --fast --out "$STAGE/results/bench_h200.json" \
  > "$STAGE/logs/bench.log" 2>&1; echo "bench exit $?"; grep -c kernel "$STAGE/logs/bench.log"
tar -czf "$OUT/gpu_bench.tgz" -C "$STAGE" results logs
