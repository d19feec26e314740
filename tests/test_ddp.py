"""The DistributedDataParallel parity script, on the CPU: one process, gloo, torchrun.

``scripts/gpu/ddp_parity.py`` is meant for two GPUs (NCCL, one process per GPU); here it runs
the same code path (process group, DDP wrapper, the batch split by rank, the loss averaged
over ranks, the reference run on the global batch, the results file) with a world of one
at toy sizes in Triton's interpreter. With one rank, DDP must reproduce the single-device
run exactly: the same data, the same kernels, nothing to average.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from test_results_schemas import schema_for

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_ddp_parity_script_world_of_one_on_cpu(tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    steps = 2
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
         str(REPO / "scripts/gpu/ddp_parity.py"), str(tmp_path), "--cpu",
         "--steps", str(steps), "--timed-steps", "1", "--precisions", "fp32"],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "ddp_parity_cpu.json").read_text())
    assert result["world_size"] == 1 and result["backend"] == "gloo"
    assert result["provenance"]["gpu"].startswith("none")
    jsonschema.validate(result, schema_for("ddp_parity_cpu.json")[1])
    fp32 = result["precisions"]["fp32"]
    assert len(fp32["reference_losses"]) == len(fp32["ddp_losses"]) == steps
    assert all(math.isfinite(v) and v > 0 for v in fp32["ddp_losses"])
    # SGD moves the loss: the run really trained
    assert fp32["ddp_losses"][1] != fp32["ddp_losses"][0]
    # a world of one: the DDP run is the single-device run, step for step
    assert fp32["ddp_losses"] == fp32["reference_losses"]
    assert fp32["parity_ok"] and fp32["max_rel_gap"] == 0.0
    assert fp32["step_ms_one_device_per_rank_batch"] > 0
    assert len(fp32["step_ms_ddp_per_rank"]) == 1
