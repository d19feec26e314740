"""`make gpu-check` (scripts/gpu/check.py) on a CPU: what can be checked without a GPU.

The check itself needs a CUDA host; here its pieces are held to what they claim: the lab
executor runs a source notebook and reports a failing cell by its grade id, the wheels it
installs on a GPU host are the versions this course pins, and the Makefile target calls it.
The runner of every GPU measurement (scripts/gpu/run.py) lists its parts, refuses an unknown
one and, on a machine without a GPU, skips the GPU parts with the reason and still writes its
archive.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[1]
CHECK = REPO / "scripts" / "gpu" / "check.py"


def _check_module():
    sys.path.insert(0, str(CHECK.parent))
    try:
        spec = importlib.util.spec_from_file_location("gpu_check", CHECK)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(CHECK.parent))


def test_makefile_target_runs_the_check():
    makefile = (REPO / "Makefile").read_text()
    target = re.search(r"^gpu-check:\n\t(.+)$", makefile, re.M)
    assert target and "scripts/gpu/check.py" in target.group(1)


def test_wheels_are_the_pinned_versions():
    pins = dict(line.split("==") for line in (REPO / "scripts/gpu/wheels.txt").read_text()
                .splitlines() if line and not line.startswith("#"))
    required = (REPO / "requirements.txt").read_text()
    assert "nbgrader==" + pins["nbgrader"] in required
    for name in ("nbclient", "ipykernel", "jupyter_client", "nbformat", "pyzmq"):
        assert name in pins, name


@pytest.mark.slow
def test_lab_executor_names_the_failing_cell(tmp_path, monkeypatch):
    """A lab notebook with one solution cell broken: the executor reports that cell, and the
    untouched notebook passes."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    check = _check_module()
    source = REPO / "assignments" / "lab01_the_spec" / "lab01_the_spec.ipynb"
    good = check._execute_lab(source, 300)
    assert good["ok"] and not good["errors"], good
    nb = nbformat.read(source, as_version=4)
    solution = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution")
                    and c.cell_type == "code")
    solution.source += "\nraise RuntimeError('broken on purpose')\n"
    broken = tmp_path / "lab01_the_spec" / "lab01_the_spec.ipynb"
    broken.parent.mkdir()
    nbformat.write(nb, broken)
    result = check._execute_lab(broken, 300)
    assert not result["ok"]
    assert result["errors"][0]["cell"] == solution.metadata["nbgrader"]["grade_id"]
    assert "broken on purpose" in result["errors"][0]["error"]
    json.dumps(result)                                  # what the results file keeps


RUNNER = REPO / "scripts" / "gpu" / "run.py"


def test_runner_lists_its_parts():
    done = subprocess.run([sys.executable, str(RUNNER), "--list"], cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    listed = [line.split()[0] for line in done.stdout.splitlines()]
    assert listed == ["tests", "sweep", "scripts", "bench", "model", "limits", "labs", "ncu",
                      "grading", "refill"]
    assert "(not in all)" in done.stdout.splitlines()[-1]


def test_runner_skips_a_gpu_part_without_a_gpu_and_still_writes_its_archive(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the part would start measuring")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, str(RUNNER), "sweep", "labs", "--out",
                           str(tmp_path / "out"), "--state", str(tmp_path / "state"),
                           "--budget-s", "120"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "sweep: skipped, this machine has no CUDA GPU" in done.stdout
    assert "skipped: sweep, labs" in done.stdout
    with tarfile.open(tmp_path / "out" / "gpu_run_sweep_labs.tgz") as archive:
        names = archive.getnames()
    assert "logs/versions.txt" in names and "results" in names
    versions = (tmp_path / "state" / "logs" / "versions.txt").read_text()
    assert "gpus 0" in versions


def test_runner_refuses_an_unknown_part():
    done = subprocess.run([sys.executable, str(RUNNER), "benchmark"], cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2 and "unknown part(s) benchmark" in done.stderr
