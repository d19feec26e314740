#!/usr/bin/env bash
# Everything this repository measures on a GPU, in one run (about 9 minutes on an H200):
#   1. the operator's test suite in GPU mode;
#   2. the benchmark: launch-configuration sweep, plan, then every preset, distribution and
#      dtype, side by side with the grid_sample reference -> results/bench_h200.json;
#   3. the course's other GPU scripts (scripts/gpu/*.py), each writing results/<name>.json;
#   4. Nsight Compute counters of the main cases -> results/ncu_h200.csv.
# Usage: OUT=dir bash scripts/gpu/run_all.sh   ->  $OUT/gpu_run.tgz holding results/ and logs/
# The steps run under one overall time limit (BUDGET seconds, default 560), so the archive is
# always written, with whatever finished.
set -u
OUT=${OUT:-/tmp/gpu_out}
STAGE=$(mktemp -d); mkdir -p "$STAGE/results" "$STAGE/logs" "$OUT"
if [ "${1:-}" != "--inner" ]; then
  timeout "${BUDGET:-560}" env OUT="$OUT" STAGE_DIR="$STAGE" bash "$0" --inner
  echo "steps ended with exit $?"
  tar -czf "$OUT/gpu_run.tgz" -C "$STAGE" results logs && ls -la "$OUT"
  exit 0
fi
STAGE=$STAGE_DIR; OUT=$STAGE
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
step() { echo "== $(date +%T) $*"; }

step versions
{ nvidia-smi; python3 -c "import torch, triton, sys; print(sys.version); print('torch', torch.__version__, 'triton', triton.__version__)"; } > "$OUT/logs/versions.txt" 2>&1

step tests
timeout 80 python3 -m pytest tests/test_operator.py tests/test_spec.py -q -p no:cacheprovider -n 12 \
  > "$OUT/logs/gpu_tests.log" 2>&1; echo "exit $?" >> "$OUT/logs/gpu_tests.log"; tail -3 "$OUT/logs/gpu_tests.log"

step bench
timeout 250 python3 -m source_kernels.bench --sweep --out "$OUT/results/bench_h200.json" \
  > "$OUT/logs/bench.log" 2>&1; echo "exit $?" >> "$OUT/logs/bench.log"; grep -E "plan|dispatch|exit|wrote" "$OUT/logs/bench.log"
# The scripts after this run the plan the sweep chose, as the committed code will.
python3 -m source_kernels.bench --write-plan "$OUT/results/bench_h200.json" > "$OUT/logs/plan.log" 2>&1

for script in scripts/gpu/*.py; do
  name=$(basename "$script" .py)
  case "$name" in _*|ncu_cases) continue;; esac
  step "$name"
  extra=""; [ "$name" = model_training ] && extra="--quick"
  timeout 28 python3 "$script" "$OUT/results" $extra > "$OUT/logs/$name.log" 2>&1; echo "exit $?" >> "$OUT/logs/$name.log"; tail -2 "$OUT/logs/$name.log"
done

step ncu
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 60 "$NCU" --clock-control none --csv -k regex:_msda \
  --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,lts__t_sectors_op_read.sum,lts__t_sectors_op_atom.sum,lts__t_sectors_op_red.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,launch__registers_per_thread,launch__occupancy_limit_registers \
  python3 scripts/gpu/ncu_cases.py > "$OUT/results/ncu_h200.csv" 2> "$OUT/logs/ncu.err"; echo "ncu exit $?"; tail -3 "$OUT/logs/ncu.err"
step done
