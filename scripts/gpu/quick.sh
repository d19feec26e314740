#!/usr/bin/env bash
# A short check of the harness on the GPU: one bench case and a bf16 uniform sweep.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 100 python3 -m source_kernels.bench --out "$OUT/bench_quick.json" --presets decoder --distributions uniform --dtypes bf16 2>&1 | tail -8
timeout 240 python3 -m source_kernels.bench --out "$OUT/sweep_quick.json" --sweep --no-bench --sweep-dtypes bf16 --sweep-distributions uniform > "$OUT/sweep.log" 2>&1
grep -c sweep "$OUT/sweep.log"; tail -3 "$OUT/sweep.log"
