#!/usr/bin/env bash
# Everything this repository measures on a GPU, as parts (about 20 minutes in all on an H200
# host whose CPU compiles a loop kernel in 10-20 s):
#   tests:   the GPU tests (operator, spec, launch path, model; the two-GPU tests where two
#            GPUs are visible);
#   sweep:   the launch-configuration sweep -> results/sweep_h200.json, and the plan it
#            chooses written into source_kernels/ for the parts after it;
#   scripts: PTX/SASS and atomics (hardware.py), the grader's replay on a GPU;
#   bench:   every preset, distribution and dtype beside the grid_sample reference
#            -> results/bench_h200.json;
#   model:   the model's training parity, step time, dispatch, compile and CUDA graph;
#   limits:  what bounds a decoder forward (an empty kernel, the bare corner-row gather) and
#            where the host time of one eager call goes;
#   grading: the synthetic class graded on this GPU (scripts/gpu/grade_class.sh; nbgrader
#            travels as wheels in .whl);
#   labs:    the labs' GPU scripts (tiling, the bf16 cliff);
#   ncu:     Nsight Compute counters of the main cases -> results/ncu_h200.csv.
# One more part, not in the default list: refill re-measures what the committed results files
# lack (under 5 minutes on an H200): the determinism and missing accumulation rows of
# results/hardware_h200.json (hardware.py --fill-missing keeps the rest of that file), and
# results/pitfalls_h200.json whole, from a git checkout so that its commit is recorded.
# Usage: OUT=dir bash scripts/gpu/run_all.sh [PART ...]   (no argument: all, in this order)
#   -> $OUT/gpu_run_<parts>.tgz holding results/ and logs/.  Each step has its own time
#   limit and the whole call one (BUDGET seconds, default 570), so the archive is always
#   written.  Results and the Triton cache are kept in .gpu_state/ (ignored by git), so a
#   later call on the same machine finds them.
set -u
OUT=${OUT:-/tmp/gpu_out}
STATE=$PWD/.gpu_state
mkdir -p "$STATE/results" "$STATE/logs" "$OUT"
export TRITON_CACHE_DIR=$STATE/triton_cache PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
if [ "${1:-}" != "--inner" ]; then
  [ $# -eq 0 ] && set -- tests sweep scripts bench model limits labs ncu grading
  timeout "${BUDGET:-570}" bash "$0" --inner "$@"
  echo "steps ended with exit $?"
  tar -czf "$OUT/gpu_run_$(echo "$@" | tr ' ' '_').tgz" -C "$STATE" results logs && ls -la "$OUT"
  exit 0
fi
shift
R=$STATE/results L=$STATE/logs
step() { echo "== $(date +%T) $*"; }
# run NAME SECONDS COMMAND...: the command's output goes to logs/NAME.log, with its exit.
run() {
  local name=$1 limit=$2; shift 2
  step "$name"
  timeout "$limit" "$@" > "$L/$name.log" 2>&1; echo "exit $?" >> "$L/$name.log"
  tail -3 "$L/$name.log"
}
apply_plan() {
  [ -f "$R/sweep_h200.json" ] && python3 -m source_kernels.bench --write-plan "$R/sweep_h200.json" \
    > "$L/plan.log" 2>&1 && echo "plan of $R/sweep_h200.json applied"
}

{ nvidia-smi; python3 -c "import torch, triton, sys; print(sys.version); print('torch', torch.__version__, 'triton', triton.__version__, 'gpus', torch.cuda.device_count())"; } > "$L/versions.txt" 2>&1

for part in "$@"; do
  case "$part" in
  tests)
    run gpu_tests 230 python3 -m pytest tests/test_operator.py tests/test_spec.py \
      tests/test_launch.py tests/test_model.py -p no:cacheprovider -n "${TEST_WORKERS:-8}" \
      -v --tb=short -rfs --timeout 170
    ;;
  sweep)
    run sweep 260 python3 -m source_kernels.bench --sweep --no-bench --out "$R/sweep_h200.json"
    apply_plan
    ;;
  scripts)
    run hardware 130 python3 scripts/gpu/hardware.py "$R" --budget-s 100
    run grading_replay 40 python3 scripts/gpu/grading_replay.py "$R"
    ;;
  bench)
    apply_plan
    run bench 330 python3 -m source_kernels.bench --fast --out "$R/bench_h200.json"
    ;;
  model)
    run model_training 200 python3 scripts/gpu/model_training.py "$R"
    ;;
  limits)
    run decoder_limits 60 python3 scripts/gpu/decoder_limits.py "$R"
    run dispatch_profile 60 python3 scripts/gpu/dispatch_profile.py "$R"
    ;;
  grading)
    # needs nbgrader: carry .whl (see scripts/gpu/grade_class.sh)
    step grading
    OUT=$R BUDGET_S=200 timeout 240 bash scripts/gpu/grade_class.sh > "$L/grading.log" 2>&1
    echo "exit $?" >> "$L/grading.log"; tail -3 "$L/grading.log"
    ;;
  labs)
    for name in lab06_tiling lab09_cliff; do
      run "$name" 45 python3 "scripts/gpu/$name.py" "$R" --budget-s 30
    done
    ;;
  ncu)
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    step ncu
    timeout 60 "$NCU" --clock-control none --csv -k regex:_msda \
      --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,lts__t_sectors_op_read.sum,lts__t_sectors_op_atom.sum,lts__t_sectors_op_red.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,launch__registers_per_thread,launch__occupancy_limit_registers \
      python3 scripts/gpu/ncu_cases.py > "$R/ncu_h200.csv" 2> "$L/ncu.err"; echo "ncu exit $?"; tail -3 "$L/ncu.err"
    # its provenance: the stack and the date beside the counters, the commit from the caller
    python3 -c "import datetime, torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name(), datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M:%S'))" > "$R/ncu_versions.txt"
    python3 scripts/summarize_ncu.py "$R/ncu_h200.csv" "$R/ncu_h200.json" "$R/ncu_versions.txt" "${COURSE_COMMIT:-unknown}"
    ;;
  refill)
    run hardware_fill 200 python3 scripts/gpu/hardware.py "$R" \
      --fill-missing results/hardware_h200.json --budget-s 150
    run pitfalls 90 python3 scripts/gpu/pitfalls.py "$R" --budget-s 60
    ;;
  *) echo "unknown part $part"; exit 2 ;;
  esac
done
step done
