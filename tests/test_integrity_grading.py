"""Grading integrity through the instructor's command, sandbox on, on the fixture course.

One class of labfx submissions is graded with ``python -m autograde grade`` while busy
processes keep every core of the host loaded:

- honest full and honest partial answers keep their exact scores, and no cell of theirs is
  reported as timed out (under load, nbgrader's 5-second wait for a cell's output used to
  fail correct cells as a course timeout);
- a submission is its notebook: a ``helper.py`` or an ``ipykernel_launcher.py`` handed in
  beside it is not importable, and the kernel's sys.path starts with the course's view;
- code run from a string earns nothing and is reported (needs_review, with the cell);
- output past the whole notebook's cap is dropped and named, and so is a flood of empty files
  at a folder's inode limit;
- the report escapes what a submission controls (a folder name with terminal escapes).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from support import releases
from support.system import require_grading_sandbox
from support.nbgrader_helpers import synthetic_class_generator

REPO = Path(__file__).resolve().parents[1]
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "course"
VENV_BIN = Path(sys.executable).parent
ASSIGNMENT = "labfx"
FULL = 8.0                      # labfx out of 9; the GPU-only check waits for a GPU host
LERP_POINTS = 3.0               # lerp's visible and hidden cells

# a student folder named with terminal escapes: clear the screen, set the title, go up a line
ESCAPED_ID = "mallory\x1b[2J\x1b]0;owned\x07\x1b[1A"

WRONG_LERP = "def lerp(a, b, t):\n    return a + t * (a - b)\n"
EXEC_LERP = 'exec("def lerp(a, b, t):\\n    return a + t * (b - a)\\n")\n'
HELPER_LERP = "from helper import lerp\n"
LAUNCHER_LERP = "lerp = lerp\n"      # bound only where the shadow launcher put it in builtins
SYS_PATH = '''
import sys
first = [p for p in sys.path if p][:1]
print("SYS_PATH_FIRST", first)
assert not any(p in ("", ".", "/submission") for p in sys.path), sys.path
def lerp(a, b, t):
    return a + t * (b - a)
'''
INODES = '''
def lerp(a, b, t):
    return a + t * (b - a)
for _i in range(3000):                   # empty files: the folder's inode limit is 2000
    open(f"/tmp/empty_{_i}", "w").close()
'''
FLOOD = '''
def lerp(a, b, t):
    return a + t * (b - a)
for _ in range(300):
    print("x" * 1000)
'''


def _env():
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


def _hogs(n):
    """n processes that keep a core busy each, for as long as they live."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    require_grading_sandbox()
    base = tmp_path_factory.mktemp("integrity")
    course = base / "course"
    shutil.copytree(FIXTURE, course)
    releases.generate(course, ASSIGNMENT)
    builder = synthetic_class_generator().Builder(str(course))
    with open(course / "nbgrader_config.py", "a") as fh:
        fh.write("\nc.AutogradeSettings.lab_timeouts = {'labfx': 120}\n"
                 "c.AutogradeSettings.notebook_output_limit_kb = 64\n"
                 "c.AutogradeSettings.tmp_inodes = 2000\n"
                 # statuses of the grader alone: the students hand in the solution's text,
                 # which the similarity check would list (tested in test_grading_isolation)
                 "c.AutogradeSettings.similarity_threshold = 0\n"
                 # uids of this test's own, away from the default pool
                 "c.AutogradeSettings.kernel_uid = 64700\n")

    def answered(source):
        nb = builder.all_correct(builder.fresh())
        builder.answer(nb, "lerp_solution", source)
        return nb

    students = {
        "honest_full": (builder.all_correct(builder.fresh()), {}),
        "honest_partial": (answered(WRONG_LERP), {}),
        "sys_path": (answered(SYS_PATH), {}),
        "exec_lerp": (answered(EXEC_LERP), {}),
        "helper_file": (answered(HELPER_LERP),
                        {"helper.py": "def lerp(a, b, t):\n    return a + t * (b - a)\n"}),
        "launcher_file": (answered(LAUNCHER_LERP), {"ipykernel_launcher.py": (
            "import builtins, runpy, sys\n"
            "builtins.lerp = lambda a, b, t: a + t * (b - a)\n"
            "sys.path = [p for p in sys.path if p not in ('', '.', '/submission')]\n"
            "sys.modules.pop('ipykernel_launcher', None)\n"
            "runpy.run_module('ipykernel_launcher', run_name='__main__')\n")}),
        "flood": (answered(FLOOD), {}),
        "inodes": (answered(INODES), {}),
        ESCAPED_ID: (builder.all_correct(builder.fresh()), {}),
    }
    for student, (nb, files) in students.items():
        folder = course / "submitted" / student / ASSIGNMENT
        folder.mkdir(parents=True)
        (folder / "timestamp.txt").write_text("2026-11-20 12:00:00.000000 UTC")
        nbformat.write(nb, folder / f"{ASSIGNMENT}.ipynb")
        for name, text in files.items():
            (folder / name).write_text(text)
    hogs = _hogs(os.cpu_count() or 2)
    started = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-m", "autograde", "grade", ASSIGNMENT,
                               "--workers", "2", "--no-progress"], cwd=course, env=_env(),
                              capture_output=True, text=True, timeout=1500)
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    from autograde.runner.cli import report_rows
    rows = {r["student_id"]: r for r in report_rows(str(course), ASSIGNMENT)}
    ledgers = {p.stem: json.loads(p.read_text())
               for p in (course / "autograde_status" / ASSIGNMENT).glob("*.json")
               if p.stem != "similarity"}
    return {"course": course, "rows": rows, "stdout": proc.stdout, "ledgers": ledgers,
            "seconds": time.monotonic() - started}


def _cell_text(course, student, gid):
    nb = nbformat.read(course / "autograded" / student / ASSIGNMENT / f"{ASSIGNMENT}.ipynb",
                       as_version=4)
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == gid)
    return "".join(o.get("text", "") + o.get("evalue", "") for o in cell.outputs)


def test_honest_students_keep_their_exact_scores_beside_a_cpu_hog(graded):
    rows = graded["rows"]
    assert float(rows["honest_full"]["score"]) == FULL, rows["honest_full"]
    assert float(rows["honest_partial"]["score"]) == FULL - LERP_POINTS, rows["honest_partial"]
    for student in ("honest_full", "honest_partial"):
        assert rows[student]["status"] == "needs_gpu", rows[student]
        assert "timed out" not in rows[student]["reasons"], rows[student]
        cells = graded["ledgers"][student]["notebooks"][ASSIGNMENT]["cells"]
        assert not any(c.get("timeout") or c.get("output_stalled") for c in cells.values())


def test_the_kernel_path_starts_with_the_view_and_no_submission_file_is_there(graded):
    rows, course = graded["rows"], graded["course"]
    assert float(rows["sys_path"]["score"]) == FULL, rows["sys_path"]
    first = _cell_text(course, "sys_path", "lerp_solution")
    assert "SYS_PATH_FIRST ['/" in first and "/submission" not in first, first
    # helper.py beside the notebook: not importable, lerp's cells earn nothing
    assert float(rows["helper_file"]["score"]) == FULL - LERP_POINTS, rows["helper_file"]
    assert "No module named 'helper'" in _cell_text(course, "helper_file", "lerp_solution")
    # a launcher of the student's never ran: the kernel is ipykernel's own
    assert float(rows["launcher_file"]["score"]) == FULL - LERP_POINTS, rows["launcher_file"]
    assert "NameError" in _cell_text(course, "launcher_file", "lerp_solution") or \
        "name 'lerp' is not defined" in _cell_text(course, "launcher_file", "lerp_solution")


def test_code_run_from_a_string_earns_nothing_and_is_reported(graded):
    row = graded["rows"]["exec_lerp"]
    assert float(row["score"]) <= FULL - LERP_POINTS, row
    assert row["status"] == "needs_review", row
    assert "exec in cell lerp_solution, line 1" in row["reasons"], row["reasons"]
    assert "did not come from the notebook's own cells" in row["reasons"]


def test_output_past_the_notebooks_cap_is_dropped_and_named(graded):
    row = graded["rows"]["flood"]
    assert float(row["score"]) == FULL, row
    assert "output limit" in row["reasons"] and "64 KiB for the whole notebook" in \
        row["reasons"], row["reasons"]
    nb = graded["course"] / "autograded" / "flood" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
    assert nb.stat().st_size < 200 * 1024


def test_a_flood_of_empty_files_stops_at_the_folders_inode_limit_and_is_named(graded):
    row = graded["rows"]["inodes"]
    assert float(row["score"]) == FULL, row
    assert "lerp_solution: folder limit: a writable folder of the kernel is full" in \
        row["reasons"] and "2000 files" in row["reasons"], row["reasons"]
    assert "No space left on device" in _cell_text(graded["course"], "inodes", "lerp_solution")


def test_the_report_escapes_what_a_submission_controls(graded):
    assert "\x1b" not in graded["stdout"] and "\x07" not in graded["stdout"]
    assert "mallory\\x1b[2J" in graded["stdout"], graded["stdout"][-2000:]
    proc = subprocess.run([sys.executable, "-m", "autograde", "report", ASSIGNMENT],
                          cwd=graded["course"], env=_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "\x1b" not in proc.stdout and "\x07" not in proc.stdout
    assert "\\x1b]0;owned\\x07" in proc.stdout, proc.stdout


# what a submission can make the grader print: an exception whose message carries escapes
# (clear the screen, a clipboard write, a carriage return and backspaces), and a kernel that
# writes escapes on its own stderr and exits, which the sandbox's launcher reports
RAISE_ESCAPES = ('raise ValueError("bad\\x1b[2J\\x1b]52;c;b3duZWQ=\\x07\\r\\x08\\x08\\x9b31m")'
                 "\n")
EXIT_ESCAPES = ('import os\nos.write(2, b"\\x1b]0;owned\\x07\\x1b[1A\\r\\x9b2J")\n'
                "os._exit(3)\n")
CONTROL = [chr(c) for c in range(0x20) if chr(c) != "\n"] + ["\x7f"] + \
    [chr(c) for c in range(0x80, 0xa0)]


def test_plain_nbgrader_autograde_prints_nothing_a_submission_controls_raw(tmp_path):
    """``nbgrader autograde`` (nbgrader's own log lines, which name the student's folder and
    the exceptions of a submission, and the sandbox launcher's report of a kernel that exited):
    no control character a submission chose reaches the terminal; the escaped text does."""
    require_grading_sandbox()
    course = tmp_path / "course"
    shutil.copytree(FIXTURE, course)
    releases.generate(course, ASSIGNMENT)
    with open(course / "nbgrader_config.py", "a") as fh:
        fh.write("\nc.AutogradeSettings.lab_timeouts = {'labfx': 120}\n"
                 "c.AutogradeSettings.similarity_threshold = 0\n"
                 "c.AutogradeSettings.max_restarts = 1\n"
                 "c.AutogradeSettings.kernel_uid = 64720\n")
    builder = synthetic_class_generator().Builder(str(course))
    students = {}
    for student, source in ((ESCAPED_ID, RAISE_ESCAPES), ("exits\x1b[2Jloud", EXIT_ESCAPES)):
        nb = builder.all_correct(builder.fresh())
        builder.answer(nb, "lerp_solution", source)
        students[student] = nb
    for student, nb in students.items():
        folder = course / "submitted" / student / ASSIGNMENT
        folder.mkdir(parents=True)
        (folder / "timestamp.txt").write_text("2026-11-20 12:00:00.000000 UTC")
        nbformat.write(nb, folder / f"{ASSIGNMENT}.ipynb")
    proc = subprocess.run([VENV_BIN / "nbgrader", "autograde", ASSIGNMENT], cwd=course,
                          env=_env(), capture_output=True, text=True, timeout=900)
    printed = proc.stdout + proc.stderr
    assert proc.returncode == 0, printed[-4000:]
    assert not [c for c in CONTROL if c in printed], \
        sorted({repr(c) for c in CONTROL if c in printed})
    assert "mallory\\x1b[2J" in printed, printed[-3000:]        # the folder, escaped
    assert "exits\\x1b[2Jloud" in printed, printed[-3000:]
    assert "kernel exited with status" in printed and "\\x1b]0;owned\\x07" in printed, \
        printed[-3000:]
