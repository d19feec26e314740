"""scripts/gpu/memory_parallelism.py and the results file chapter 2 reads from it.

- the script's kernels (the pointer chase and the row chains) are checked against torch in
  Triton's interpreter by its own ``--dry-run-cpu`` (tiny sizes, about 15 s on two cores);
- ``results/memory_h200.json`` has every field chapter 2 reads, and its numbers hang
  together: bytes in flight are warps x rows x 512 bytes, DRAM is slower than L2, and the
  bandwidth never exceeds the copy bandwidth recorded beside it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from test_results_schemas import schema_for

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu" / "memory_parallelism.py"
RESULTS = ROOT / "results" / "memory_h200.json"


def test_dry_run_checks_the_kernels_in_the_interpreter(tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), "--dry-run-cpu",
                           "--budget-s", "600"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    payload = json.loads((tmp_path / "memory_dry_run.json").read_text())
    assert payload["dry_run"] is True              # a dry run is never a result
    assert payload["provenance"]["gpu"].startswith("none (dry run")
    assert payload["latency"]["rows"] and payload["gather"]["rows"]
    jsonschema.validate(payload, schema_for("memory_dry_run.json")[1])


def test_without_a_gpu_the_script_says_so():
    pytest.importorskip("torch")
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the script would start measuring")
    done = subprocess.run([sys.executable, str(SCRIPT), "/tmp/unused"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 2 and "GPU" in done.stderr


def test_results_file_has_what_chapter_2_reads():
    data = json.loads(RESULTS.read_text())
    provenance = data["provenance"]
    for key in ("gpu", "date", "command", "torch", "triton", "repository_commit"):
        assert provenance[key], key
    device = data["device"]["torch_properties"]
    for key in ("multi_processor_count", "L2_cache_size", "regs_per_multiprocessor",
                "max_threads_per_multi_processor", "warp_size",
                "shared_memory_per_multiprocessor"):
        assert device[key] > 0, key
    assert data["device"]["nvidia_smi"]["clocks.max.sm"].endswith("MHz")

    latency = {(r["level"], r["buffer_bytes"]): r["median_ns"]
               for r in data["latency"]["rows"]}
    assert latency["L2", 4 * 2**20] < latency["DRAM", 2**30]

    anchors = json.loads((ROOT / "results" / "anchors_h200.json").read_text())
    copy = anchors["copy_bandwidth"]["bytes_per_s"]
    rows = data["gather"]["rows"]
    pairs = {(r["warps_per_sm"], r["chains_per_warp"]) for r in rows}
    for needed in ((8, 8), (16, 4), (32, 2), (16, 1), (32, 8)):   # chapter 2 prints them
        assert needed in pairs, needed
    for row in rows:
        assert row["bytes_in_flight_per_sm"] == \
            row["warps_per_sm"] * row["chains_per_warp"] * data["gather"]["row_bytes"]
        assert 0 < row["bytes_per_s"] < copy
