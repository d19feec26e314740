"""The code passes ruff with the rules of pyproject.toml ([tool.ruff]).

The rules are few on purpose: pyflakes' undefined and unused names, pycodestyle's errors, a
blind ``except Exception`` and ``exec``, and a ``noqa`` that no longer suppresses anything.
Each deliberate blind ``except`` or ``exec`` says why beside its ``noqa``."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _ruff() -> list[str]:
    beside = Path(sys.executable).with_name("ruff")
    if beside.exists():
        return [str(beside)]
    if shutil.which("ruff"):
        return [shutil.which("ruff")]
    pytest.fail("ruff is not installed: requirements.txt pins it (pip install -r requirements.txt)")


def test_ruff_finds_nothing():
    done = subprocess.run([*_ruff(), "check", "--no-cache", "--output-format", "concise", "."],
                          cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_reads_the_projects_rules(tmp_path):
    """The configuration is the one in effect: an unused import and a blind ``except`` are
    found under it (a rule set that selected nothing would pass every file)."""
    probe = tmp_path / "probe.py"
    probe.write_text("import os\n\ntry:\n    pass\nexcept Exception:\n    pass\n")
    done = subprocess.run([*_ruff(), "check", "--no-cache", "--output-format", "concise",
                           "--config", str(REPO / "pyproject.toml"), str(probe)],
                          cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "F401" in done.stdout and "BLE001" in done.stdout, done.stdout
