"""`make gpu-check` (scripts/gpu/check.py) on a CPU: what can be checked without a GPU.

The check itself needs a CUDA host; here its pieces are held to what they claim: the lab
executor runs a source notebook and reports a failing cell by its grade id, the wheels it
installs on a GPU host are the versions this course pins, and the Makefile target calls it.
"""
from __future__ import annotations

import importlib.util
import json
import re
import sys
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
