"""The student's JupyterLab (``make lab``) leaves out the instructor's nbgrader tools and the
news popup; the instructor's (``make lab-instructor``) keeps them.

- ``make -n lab`` puts scripts/jupyter/student first on ``JUPYTER_CONFIG_PATH``;
  ``make -n lab-instructor`` does not;
- a JupyterLab server started with that path serves a page whose configuration disables
  nbgrader's "Create Assignment" and "Courses" panels and JupyterLab's announcements (the
  "Jupyter news" question), and has no ``/formgrader``; started without it, nothing is
  disabled and ``/formgrader`` answers.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
STUDENT = REPO / "scripts" / "jupyter" / "student"
MAKE = shutil.which("make")
TOKEN = "course-lab-settings-test"
HIDDEN = {"@jupyter/nbgrader:create-assignment", "@jupyter/nbgrader:course-list",
          "@jupyterlab/apputils-extension:announcements"}


def _dry_run(target):
    result = subprocess.run([MAKE, "-n", "-o", ".venv/.installed", target], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.skipif(MAKE is None, reason="needs make (sudo apt-get install make)")
def test_make_lab_is_the_students_and_lab_instructor_the_instructors():
    assert f'JUPYTER_CONFIG_PATH="{STUDENT}' in _dry_run("lab")
    assert "JUPYTER_CONFIG_PATH" not in _dry_run("lab-instructor")
    page = json.loads((STUDENT / "labconfig" / "page_config.json").read_text())
    assert set(page["disabledExtensions"]) == HIDDEN


def _get(url):
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, ""


class _Lab:
    """A JupyterLab server on a free port, with or without the student's settings."""

    def __init__(self, tmp_path, student):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER")}
        env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
                   HOME=str(tmp_path), JUPYTER_CONFIG_DIR=str(tmp_path / "config"),
                   JUPYTER_DATA_DIR=str(tmp_path / "data"),
                   JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"))
        if student:
            env["JUPYTER_CONFIG_PATH"] = str(STUDENT)
        args = [Path(sys.executable).parent / "jupyter", "lab", "--no-browser",
                f"--port={self.port}", "--ServerApp.port_retries=0", "--ip=127.0.0.1",
                f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={tmp_path}"]
        if os.geteuid() == 0:
            args.append("--allow-root")
        self.log = open(tmp_path / "lab.log", "w")
        self.proc = subprocess.Popen([str(a) for a in args], cwd=tmp_path, env=env,
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (tmp_path / "lab.log").read_text()[-3000:]
            try:
                if _get(self.url("/api"))[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise AssertionError("JupyterLab did not start:\n" + (tmp_path / "lab.log").read_text())

    def url(self, path):
        return f"http://127.0.0.1:{self.port}{path}?token={TOKEN}"

    def disabled(self):
        status, html = _get(self.url("/lab"))
        assert status == 200, status
        found = re.search(r'<script id="jupyter-config-data" type="application/json">(.*?)'
                          r'</script>', html, re.S)
        assert found, html[:2000]
        return set(json.loads(found.group(1)).get("disabledExtensions", []))

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.mark.parametrize("student", [True, False], ids=["make-lab", "make-lab-instructor"])
def test_the_students_lab_has_no_instructor_tools_and_no_news(tmp_path, student):
    lab = _Lab(tmp_path, student)
    try:
        disabled = lab.disabled()
        formgrader = _get(lab.url("/formgrader"))[0]
    finally:
        lab.close()
    if student:
        assert HIDDEN <= disabled, disabled
        assert formgrader == 404, formgrader
    else:
        assert not HIDDEN & disabled, disabled
        assert formgrader != 404, formgrader
