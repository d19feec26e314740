#!/usr/bin/env bash
# First look on the GPU: versions, the operator tests in GPU mode, PTX of the shipped kernels
# under the GPU machine's Triton, the launch-configuration sweep, and a small bench.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/r"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
{
  nvidia-smi --query-gpu=name,driver_version --format=csv
  python3 -c "import torch, triton, sys; print(sys.version); print(torch.__version__, triton.__version__, torch.cuda.get_device_name(0))"
} > "$OUT/r/versions.txt" 2>&1
timeout 200 python3 -m pytest tests/test_operator.py tests/test_spec.py -q -x -p no:cacheprovider > "$OUT/r/gpu_tests.log" 2>&1; echo "tests rc=$?" >> "$OUT/r/gpu_tests.log"
timeout 120 env TRITON_INTERPRET=0 python3 -c "
from source_kernels.ptx import compile_ptx, atomic_summary
import torch, triton
print('triton', triton.__version__)
for bq, w in [(16,4),(32,4),(16,2)]:
    for dt, acc in [(torch.bfloat16, False), (torch.float32, False), (torch.bfloat16, True)]:
        for arch in (80, 90):
            print(arch, bq, w, dt, acc, atomic_summary(compile_ptx('backward', arch, dt, acc, block_q=bq, num_warps=w)), flush=True)
" > "$OUT/r/ptx.log" 2>&1
timeout 330 python3 -m source_kernels.bench --out "$OUT/r/sweep.json" --sweep --no-bench > "$OUT/r/sweep.log" 2>&1
tar -czf "$OUT/explore.tgz" -C "$OUT" r
cat "$OUT/r/versions.txt" "$OUT/r/gpu_tests.log" | tail -40; tail -30 "$OUT/r/ptx.log"; grep "sweep" "$OUT/r/sweep.log"
