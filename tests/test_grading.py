"""The instructor's side: a synthetic class graded end to end with nbgrader's own commands.

The fixture course (tests/fixtures/course) has one tiny lab, ``labfx``: a tensor function,
a pure-Python function, a Triton kernel run by the interpreter, and a GPU-only check.
``scripts/make_synthetic_class.py`` writes one submission per case (correct, partly wrong,
empty, every cheat, every resource abuse, corrupt).  The module fixture then runs:

- ``nbgrader generate_assignment``, ``release_assignment``; one student fetches, submits
  through the exchange and is collected with ``nbgrader collect``; the others are written
  straight into ``submitted/``;
- ``nbgrader autograde labfx`` (nbgrader's sequential run) on one copy of the course;
- ``python -m autograde grade labfx`` (the parallel command) on another copy, killed part way
  and run again (it must resume without regrading the finished submissions);

and the tests compare every student's exact score and status with the table below, and the
two runs with each other.  The sandbox needs root and bubblewrap (`make test` installs
bubblewrap where it can).
"""
from __future__ import annotations

import csv
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import nbformat
import pytest
from support import releases
from support.system import require_grading_sandbox
from support.nbgrader_helpers import (in_uid_pool, ledger_kernels, own_processes, pool_processes,
                              run_checked, synthetic_class_generator)

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "course"
VENV_BIN = Path(sys.executable).parent
ASSIGNMENT = "labfx"

# student: (score out of 9 or None for no score, status, substrings of the reasons)
EXPECTED = {
    "correct": (8, "needs_gpu", ["scale_gpu_hidden: not gradable here"]),
    "partly_wrong": (5, "needs_gpu", []),
    "empty": (0, "needs_gpu", []),
    "cheat_patch_compare": (2, "needs_review", [
        "lerp_hidden: needs review (the kernel reported a pass, the grader's replay failed",
        "corner_weights_hidden: needs review (the kernel reported a pass"]),
    "cheat_patch_check": (3, "needs_review", [
        "corner_weights_hidden: needs review (the kernel reported a pass, the grader's replay "
        "failed: expected 4 corners, got 0",
        "scale_hidden: needs review (the kernel reported a pass but sent no record"]),
    "cheat_edit_tests": (3, "needs_gpu", ["corner_weights_hidden: edited locked cell restored",
                                          "scale_hidden: edited locked cell restored",
                                          "lerp_visible: edited locked cell restored"]),
    "cheat_delete_tests": (3, "needs_gpu", ["cell corner_weights_hidden was missing",
                                            "cell scale_hidden was missing"]),
    "cheat_reorder": (5, "needs_gpu", ["released cells were reordered"]),
    "cheat_metadata": (5, "needs_gpu", ["cell corner_weights_hidden: metadata restored",
                                        "cell scale_hidden: metadata restored"]),
    # the reference is not in the kernel's view of the course: the import fails; the copy
    # it tried (``__globals__``) sends its kernel to review
    "cheat_reference": (3, "needs_review", [
        "scale_hidden: needs review (the answers rebind names at run time (__globals__)"]),
    "cheat_chip": (5, "needs_gpu", []),
    "cheat_hardcode": (5, "needs_gpu", [
        "lerp_visible: lerp did not pass its hidden check (lerp_hidden)"]),
    "infinite_loop": (5, "needs_gpu", ["corner_weights_hidden: timed out after 5 s (interrupted)"]),
    "ignore_sigint": (5, "needs_gpu", [
        "corner_weights_hidden: timed out after 5 s and ignored the interrupt"]),
    "memory_hog": (5, "needs_gpu", []),
    "spawn_processes": (5, "needs_gpu", []),
    "huge_output": (8, "needs_gpu", ["lerp_solution: output limit"]),
    # it would exec a solution read from the course files: its kernel goes to review
    "read_secrets": (3, "needs_review", [
        "scale_hidden: needs review (the answers rebind names at run time (exec)"]),
    "crash_kernel": (5, "needs_gpu", ["corner_weights_hidden: the kernel died while running"]),
    "corrupt_json": (None, "ungradable", ["labfx.ipynb is not valid JSON"]),
    "missing_notebook": (None, "ungradable", ["missing notebook labfx.ipynb"]),
}
# in-kernel error messages each resource abuse must end with (the grader's own words differ)
KERNEL_ERRORS = {
    "memory_hog": ("corner_weights_hidden", "memory"),
    "spawn_processes": ("corner_weights_hidden", "Resource temporarily unavailable"),
    "cheat_reference": ("corner_weights_solution", "No module named 'source_kernels.reference'"),
    "cheat_chip": ("corner_weights_solution", "No module named 'source_kernels.chips.lab01'"),
}


def _sandbox_or_skip():
    require_grading_sandbox()


def _env():
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


def _run(args, cwd, timeout=900, check=True):
    return run_checked(args, cwd, env=_env(), timeout=timeout, check=check)


def _nbgrader(*args, cwd, timeout=900, check=True):
    return _run([VENV_BIN / "nbgrader", *args], cwd, timeout, check)


def _generator():
    return synthetic_class_generator()


def _report(course):
    from autograde.runner.cli import report_rows
    rows = report_rows(str(course), ASSIGNMENT)
    return {r["student_id"]: r for r in rows}


def _left_by(snapshot, *courses):
    """The processes of a ``pool_processes`` snapshot that the kernels of ``courses`` left
    (other grading on the host runs kernels of the same uid pool, before, during and after)."""
    kernels = [k for course in courses for k in ledger_kernels(course, ASSIGNMENT)]
    assert kernels, f"no kernel recorded in the ledgers of {courses}"
    return [f"{uid} {pid} {args}" for uid, pid, _, args in own_processes(snapshot, kernels)]


class _Canary:
    """A TCP listener on the grader's loopback: nothing in a grading kernel may reach it."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.5)
        self.port = self.sock.getsockname()[1]
        self.contacts = []
        self.running = True
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while self.running:
            try:
                conn, addr = self.sock.accept()
            except OSError:
                continue
            self.contacts.append(addr)
            conn.close()

    def close(self):
        self.running = False
        self.thread.join(timeout=2)
        self.sock.close()


# This module holds the grader's scores and statuses.  The synthetic students hand in the
# solution's text, so the similarity check lists every one of them, and its needs_review would
# stand in front of every status here: it is off for this class, and tested on the same class
# in tests/test_grading_isolation.py and on a real lab in tests/test_similarity.py.
SIMILARITY_OFF = ("\n# tests/test_grading.py: the scores and statuses alone\n"
                  "c.AutogradeSettings.similarity_threshold = 0\n")


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    _sandbox_or_skip()
    base = tmp_path_factory.mktemp("grading")
    seq = base / "sequential"
    shutil.copytree(FIXTURE, seq)
    with (seq / "nbgrader_config.py").open("a") as config:
        config.write(SIMILARITY_OFF)
    (seq / "exchange").mkdir()
    releases.generate(seq, ASSIGNMENT)
    _nbgrader("release_assignment", ASSIGNMENT, cwd=seq)
    canary = _Canary()
    gen = _generator()
    # the correct student goes through the exchange: fetch, submit, collect
    home = base / "student_home"
    home.mkdir()
    exchange = [f"--Exchange.root={seq / 'exchange'}", "--CourseDirectory.course_id=fixture-course"]
    _nbgrader("fetch_assignment", ASSIGNMENT, *exchange, cwd=home)
    nbformat.write(gen.build(str(seq), canary.port)["correct"], home / ASSIGNMENT / "labfx.ipynb")
    _nbgrader("submit", ASSIGNMENT, "--student=correct", *exchange, cwd=home)
    _nbgrader("collect", ASSIGNMENT, cwd=seq)
    others = [s for s in EXPECTED if s != "correct"]
    gen.write_class(str(seq), canary.port, only=others)
    par = base / "parallel"
    shutil.copytree(seq, par)

    started = time.monotonic()
    sequential = _nbgrader("autograde", ASSIGNMENT, cwd=seq, timeout=1500, check=False)
    seq_seconds = time.monotonic() - started
    # nbgrader exits 1 when a submission failed: only the two broken ones may have
    failed = {line.split("for student '")[1].split("'")[0]
              for line in sequential.stderr.splitlines() if "for student '" in line}
    assert failed == {"corrupt_json", "missing_notebook"}, sequential.stderr[-3000:]
    pool_after_seq = pool_processes()

    # the parallel command, killed once a few submissions are done, then run again
    ledger = par / "autograde_status" / ASSIGNMENT
    cmd = [VENV_BIN / "python", "-m", "autograde", "grade", ASSIGNMENT, "--workers", "2",
           "--no-progress"]
    proc = subprocess.Popen([str(c) for c in cmd], cwd=par, env=_env(), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 900
    done_first = {}
    while time.monotonic() < deadline and proc.poll() is None:
        done_first = {p.stem: json.loads(p.read_text()).get("finished")
                      for p in ledger.glob("*.json")
                      if json.loads(p.read_text()).get("state") == "done"} \
            if ledger.is_dir() else {}
        if len(done_first) >= 5:
            break
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(1.0)
    done_first = {p.stem: json.loads(p.read_text()).get("finished") for p in ledger.glob("*.json")
                  if json.loads(p.read_text()).get("state") == "done"}
    summary_path = base / "resume.json"
    started = time.monotonic()
    _run([*cmd, "--json", summary_path], cwd=par, timeout=1500)
    resume_seconds = time.monotonic() - started
    canary.close()
    result = {
        "seq": seq, "par": par, "sequential_log": sequential.stdout + sequential.stderr,
        "seq_report": _report(seq), "par_report": _report(par), "canary": canary.contacts,
        "done_before_kill": done_first, "resume": json.loads(summary_path.read_text()),
        "par_ledger": {p.stem: json.loads(p.read_text()) for p in ledger.glob("*.json")},
        "leftover_after_seq": _left_by(pool_after_seq, seq),
        "leftover_after_par": _left_by(pool_processes(), par),
        "seconds": {"sequential": seq_seconds, "resume": resume_seconds},
    }
    print(f"\nsequential autograde: {seq_seconds:.1f} s; resumed parallel run: "
          f"{resume_seconds:.1f} s")
    return result


def _score(row):
    return None if row.get("score") in ("", None) else float(row["score"])


@pytest.mark.slow
def test_every_student_gets_the_expected_score_and_status(graded):
    report = graded["seq_report"]
    assert sorted(report) == sorted(EXPECTED)
    problems = []
    for student, (score, status, reasons) in EXPECTED.items():
        row = report[student]
        if _score(row) != score or row["status"] != status or \
                any(r not in row["reasons"] for r in reasons):
            problems.append(f"{student}: got {_score(row)} {row['status']} ({row['reasons']}); "
                            f"expected {score} {status} with {reasons}")
    assert not problems, "\n".join(problems)
    assert all(float(r["max_score"]) == 9 for r in report.values() if r.get("max_score"))


@pytest.mark.slow
def test_parallel_command_gives_the_sequential_scores_and_resumes(graded):
    seq, par = graded["seq_report"], graded["par_report"]
    assert {s: (_score(r), r["status"]) for s, r in par.items()} == \
        {s: (_score(r), r["status"]) for s, r in seq.items()}
    # the interrupted run had finished some submissions; the second run did not redo them
    done_before = graded["done_before_kill"]
    assert len(done_before) >= 5
    regraded = {g["student"] for g in graded["resume"]["graded"]}
    assert not regraded & set(done_before), regraded & set(done_before)
    assert set(done_before) | regraded == set(EXPECTED)
    for student, finished in done_before.items():
        assert graded["par_ledger"][student]["finished"] == finished


@pytest.mark.slow
def test_the_log_names_the_grading_environment(graded):
    # the uid is the first free one of the host's pool (another grading run may hold 64123)
    found = re.search(r"grading environment: CPU \(Triton interpreter, TRITON_INTERPRET=1; the "
                      r"kernel sees no GPU\) \| bubblewrap sandbox as uid (\d+)",
                      graded["sequential_log"])
    assert found and in_uid_pool(found.group(1)), graded["sequential_log"][-3000:]


def _cell(course, student, gid):
    nb = nbformat.read(course / "autograded" / student / ASSIGNMENT / "labfx.ipynb", as_version=4)
    return next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == gid)


def _text(cell):
    return "".join(o.get("text", "") + o.get("evalue", "") for o in cell.outputs)


@pytest.mark.slow
def test_untrusted_code_is_contained(graded):
    seq = graded["seq"]
    assert graded["canary"] == [], "a grading kernel reached the grader's loopback"
    assert not (seq / "PWNED").exists()
    with open(seq / "gradebook.db", "rb") as fh:
        assert not fh.read().endswith(b"pwned")
    assert sqlite3.connect(seq / "gradebook.db").execute("PRAGMA integrity_check").fetchone() \
        == ("ok",)
    assert "reached: []" in _text(_cell(seq, "read_secrets", "corner_weights_solution"))
    for student, (gid, message) in KERNEL_ERRORS.items():
        assert message in _text(_cell(seq, student, gid)), (student, _text(_cell(seq, student, gid)))
    assert graded["leftover_after_seq"] == [] and graded["leftover_after_par"] == []
    # 20 MB printed, at most the configured 64 KiB kept
    huge = _cell(seq, "huge_output", "lerp_solution")
    assert len(_text(huge)) < 70 * 1024 and "bytes of output beyond 64 KiB were dropped" in \
        _text(huge)


@pytest.mark.slow
def test_gradebook_marks_what_it_could_not_decide(graded):
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{graded['seq'] / 'gradebook.db'}", "fixture-course") as gb:
        def grade(student, gid):
            return gb.find_grade(gid, "labfx", ASSIGNMENT, student)
        gpu = grade("correct", "scale_gpu_hidden")
        assert gpu.auto_score is None and gpu.needs_manual_grade
        lerp = grade("correct", "lerp_hidden")        # a warning on stderr did not cost it
        assert lerp.auto_score == 2 and not lerp.needs_manual_grade
        forged = grade("cheat_patch_check", "scale_hidden")   # returned 100.0 in the kernel
        assert forged.auto_score == 0 and forged.needs_manual_grade
        wrong = grade("partly_wrong", "corner_weights_hidden")
        assert wrong.auto_score == 0 and not wrong.needs_manual_grade
    stderr_cell = _cell(graded["seq"], "correct", "lerp_hidden")
    assert "[stderr]" in _text(stderr_cell) and "UserWarning" in _text(stderr_cell)


@pytest.mark.slow
def test_feedback_shows_results_not_hidden_code(graded):
    seq = graded["seq"]
    _nbgrader("generate_feedback", ASSIGNMENT, "--student", "partly_wrong", cwd=seq)
    html = (seq / "feedback" / "partly_wrong" / ASSIGNMENT / "labfx.html").read_text()
    for hidden in ("fixture_checks", "check_corner_weights", "BEGIN HIDDEN TESTS",
                   "warnings.warn"):
        assert hidden not in html, hidden
    assert "hidden tests: not shown" in html
    assert "AssertionError: corner 1 of" in html     # the check's message reaches the student


@pytest.mark.slow
def test_export_lists_ungradable_submissions_without_a_score(graded):
    seq = graded["seq"]
    _nbgrader("export", "--to", seq / "grades.csv", cwd=seq)
    with open(seq / "grades.csv") as fh:
        rows = {r["student_id"]: r for r in csv.DictReader(fh)}
    assert rows["corrupt_json"]["score"] == "" and rows["corrupt_json"]["status"] == "ungradable"
    assert "not valid JSON" in rows["corrupt_json"]["reasons"]
    assert rows["missing_notebook"]["score"] == ""
    assert float(rows["correct"]["score"]) == 8.0 and rows["correct"]["status"] == "needs_gpu"
    assert float(rows["empty"]["score"]) == 0.0 and rows["empty"]["status"] == "needs_gpu"


# ---------------------------------------------------------------- a real lab
LAB01 = "lab01_the_spec"
LAB01_CHEAT_BEFORE = '''import math
_isclose, _right = math.isclose, bilinear_corner_weights
math.isclose = lambda *a, **k: True                  # every comparison in the kernel passes


def bilinear_corner_weights(x_im, y_im):              # 1 % off
    return [(r, c, w * 1.01) for r, c, w in _right(x_im, y_im)]'''
LAB01_CHEAT_AFTER = "bilinear_corner_weights, math.isclose = _right, _isclose"


@pytest.mark.slow
def test_a_real_lab_through_the_course_configuration(tmp_path):
    """lab01 with the repository's own nbgrader_config.py: the solution gets full marks under
    the sandbox and the replay (and is listed by the similarity check, being the solution),
    the release gets 0, and a student who replaces
    ``math.isclose`` to pass a wrong stage loses that stage (visible and hidden) only."""
    _sandbox_or_skip()
    course = tmp_path / "course"
    (course / "assignments").mkdir(parents=True)
    shutil.copy(REPO / "nbgrader_config.py", course / "nbgrader_config.py")
    shutil.copytree(REPO / "assignments" / LAB01, course / "assignments" / LAB01)
    releases.generate(course, LAB01)
    source = nbformat.read(course / "assignments" / LAB01 / f"{LAB01}.ipynb", as_version=4)
    release = nbformat.read(course / "release" / LAB01 / f"{LAB01}.ipynb", as_version=4)
    cheat = nbformat.read(course / "assignments" / LAB01 / f"{LAB01}.ipynb", as_version=4)
    ids = [c.metadata.get("nbgrader", {}).get("grade_id") for c in cheat.cells]
    cheat.cells.insert(ids.index("lab01_hidden_corner_weights") + 1,
                       nbformat.v4.new_code_cell(LAB01_CHEAT_AFTER))
    cheat.cells.insert(ids.index("lab01_check_corner_weights"),
                       nbformat.v4.new_code_cell(LAB01_CHEAT_BEFORE))
    for student, nb in (("solution", source), ("untouched", release), ("cheater", cheat)):
        folder = course / "submitted" / student / LAB01
        folder.mkdir(parents=True)
        nbformat.write(nb, folder / f"{LAB01}.ipynb")
    _run([VENV_BIN / "python", "-m", "autograde", "grade", LAB01, "--workers", "2",
          "--no-progress"], cwd=course, timeout=1200)
    from autograde.runner.cli import report_rows
    rows = {r["student_id"]: r for r in report_rows(str(course), LAB01)}
    # the source notebook handed in as a submission is the lab's solution: full marks, and the
    # similarity check lists it for review (autograde/runner/similarity.py)
    assert (float(rows["solution"]["score"]), rows["solution"]["status"]) == \
        (10.0, "needs_review")
    assert "similarity check: lab01_the_spec/lab01_msda_naive: similarity 100 % to the lab's " \
           "solution" in rows["solution"]["reasons"]
    assert (float(rows["untouched"]["score"]), rows["untouched"]["status"]) == (0.0, "graded")
    # the cheater's replaced math.isclose changes nothing: lab 01's checks compare only in the
    # grader's replay, which fails the wrong stage (visible and hidden) as a wrong answer;
    # the rest of the notebook is the solution, so the similarity check lists it too
    assert (float(rows["cheater"]["score"]), rows["cheater"]["status"]) == (7.0, "needs_review")
    ledger = json.loads(next((course / "autograde_status" / LAB01).glob("cheater*.json"))
                        .read_text())
    verdicts = next(iter(ledger["notebooks"].values()))["verdicts"]
    assert verdicts["lab01_hidden_corner_weights"]["verdict"] == "fail", verdicts
    assert "similarity check" in rows["cheater"]["reasons"]


# ---------------------------------------------------------------- fast tests, no kernel
def test_sandbox_probe_reports_no_network_no_course_files(tmp_path):
    _sandbox_or_skip()
    from autograde.config import AutogradeSettings
    from autograde.runner.probe import probe
    course = tmp_path / "course"
    shutil.copytree(FIXTURE, course)
    (course / "gradebook.db").write_text("x")
    result = probe(str(course), AutogradeSettings(sandbox="bwrap"), environment="cpu")
    # a uid of the host's pool, as a grading kernel gets one (the first free one: not
    # necessarily 64123 while other grading runs on the host)
    assert in_uid_pool(result["uid"]) and result["uid"] != os.getuid(), result["uid"]
    assert result["dns"].startswith("fails")
    assert result["loopback to the grader"].startswith("unreachable")
    assert not result["grader saw a connection"]
    for key in ("gradebook.db", "course folder", "source notebooks"):
        assert result[key] == "not visible"
    assert result["8 GiB allocation"].startswith("refused")
    assert result["torch.cuda.is_available()"] is False and result["TRITON_INTERPRET"] == "1"


def test_probe_command_prints_every_key_whole(monkeypatch, capsys):
    """``python -m autograde probe`` prints each finding as "key: value" with the key whole
    (the GPU grading report reads "torch.cuda.is_available()" back by name), a key or value
    with terminal escapes escaped."""
    import types

    from autograde.runner import cli, probe
    findings = {"sandbox": "bwrap", "torch.cuda.is_available()": True,
                "\x1b[2Jkey": "value\x07"}
    monkeypatch.setattr(probe, "probe", lambda root, settings: findings)
    monkeypatch.setattr(cli, "_settings", lambda root: (None, None))
    assert cli.cmd_probe(types.SimpleNamespace(root=".")) == 0
    lines = capsys.readouterr().out.splitlines()
    read_back = dict(line.strip().split(": ", 1) for line in lines)
    assert read_back["torch.cuda.is_available()"] == "True", lines
    assert not any("\x1b" in line or "\x07" in line for line in lines), lines


def test_replay_decides_out_of_the_kernel():
    """Record a check as the kernel does, replay it as the grader does: a replaced comparison
    in the 'kernel' does not survive the replay."""
    import math

    from autograde.trust import recording
    sys.path.insert(0, str(FIXTURE / "checks"))
    try:
        from fixture_checks import labfx
    finally:
        sys.path.remove(str(FIXTURE / "checks"))

    def right(x_im, y_im):
        x0, y0 = math.floor(x_im), math.floor(y_im)
        dx, dy = x_im - x0, y_im - y0
        return [(y0, x0, (1 - dy) * (1 - dx)), (y0, x0 + 1, (1 - dy) * dx),
                (y0 + 1, x0, dy * (1 - dx)), (y0 + 1, x0 + 1, dy * dx)]

    def wrong(x_im, y_im):
        return [(r, c, w * 1.01) for r, c, w in right(x_im, y_im)]

    def record(fn, patch=False):
        saved = (recording._mode, recording._base_seed, recording._counter)
        recording._mode, recording._base_seed, recording._counter = "record", "secret", 0
        recording._events.clear()
        isclose = math.isclose
        if patch:
            math.isclose = lambda *a, **k: True
        try:
            labfx.check_corner_weights(fn)
            kernel = "pass"
        except AssertionError:
            kernel = "fail"
        finally:
            math.isclose = isclose
            events = json.loads(json.dumps(recording._events))
            recording._events.clear()
            recording._mode, recording._base_seed, recording._counter = saved
        return kernel, events

    def replay(events, seed="secret"):
        context = recording.ReplayContext(events, seed)
        try:
            recording.replay_check(labfx.check_corner_weights,
                                   [recording.Proxy(context, "fn")], {}, context)
            return "pass"
        except AssertionError:
            return "fail"

    assert [record(right)[0], replay(record(right)[1])] == ["pass", "pass"]
    assert [record(wrong)[0], replay(record(wrong)[1])] == ["fail", "fail"]
    kernel, events = record(wrong, patch=True)
    assert (kernel, replay(events)) == ("pass", "fail")
    # a record replayed against another seed (inputs the kernel did not get) fails
    assert replay(record(right)[1], seed="other") == "fail"


def test_codec_round_trips_and_refuses_what_it_did_not_write():
    import torch

    from autograde.trust import codec
    value = {"t": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(2).bfloat16(),
             "l": [1, 2.5, float("nan"), None, "s", (True,)], 7: torch.tensor([True, False])}
    back = codec.decode(json.loads(json.dumps(codec.encode(value))))
    assert torch.equal(back["t"], value["t"]) and torch.equal(back["b"], value["b"])
    assert back["l"][0:2] == [1, 2.5] and math_isnan(back["l"][2]) and back["l"][3:] == [None, "s", (True,)]
    assert torch.equal(back[7], value[7])
    for bad in ({"$t": "tensor", "dtype": "float32", "shape": [10 ** 6], "b64": "AAAA"},
                {"$t": "pickle", "v": "gASV"}, {"$t": "dtype", "v": "object"}, [1, 2]):
        with pytest.raises(codec.DecodeError):
            codec.decode(bad)
    with pytest.raises(codec.DecodeError):
        codec.decode(codec.encode(torch.zeros(1000)), max_bytes=100)


def math_isnan(x):
    return x != x


def test_static_scan_follows_aliases_copies_and_strings():
    from autograde import labs
    from autograde.pipeline.scan import tainted_names
    forbidden, allowed = labs.forbidden_names("lab01_the_spec")
    cells = [
        ("import source_kernels\nfrom source_kernels import reference\nimport torch", False),
        ("def fine(x):\n    reference = x * 2\n    return reference + "
         "source_kernels.inputs.make_inputs(1)", True),
        ("import types\nfrom source_kernels.reference import msda_naive as _r\n"
         "_copy = types.FunctionType(_r.__code__, {})\ndef sneaky(*a):\n    return _copy(*a)", True),
        ("def via_helper(a):\n    return helper(a)\ndef helper(a):\n    return reference.msda_naive(a)",
         True),
        ("def dynamic():\n    return __import__('source_kernels.chips.lab01')", True),
        ("def grader():\n    import autograde.checks.common as c\n    return c", True),
    ]
    tainted = tainted_names(cells, forbidden, allowed)
    assert "fine" not in tainted
    assert {"sneaky", "via_helper", "helper", "dynamic", "grader"} <= set(tainted)
    assert "source_kernels.reference.msda_naive" in tainted["sneaky"]


def test_gpu_replay_results_if_measured():
    """scripts/gpu/grading_replay.py on a GPU host: record and replay with compiled kernels
    and CUDA tensors.  The file comes from a GPU run; without it there is nothing to check."""
    files = sorted((REPO / "results").glob("grading_replay_*.json"))
    if not files:
        pytest.skip("not yet measured: results/grading_replay_<gpu>.json comes from "
                    "scripts/gpu/grading_replay.py on a GPU host")
    for path in files:
        data = json.loads(path.read_text())
        assert data["provenance"]["gpu"]
        cases = data["cases"]
        assert cases["correct"]["kernel"] == cases["correct"]["replay"] == "pass"
        assert cases["correct"]["record_devices"] == ["cuda"]
        assert cases["wrong"]["replay"].startswith("fail")
        assert cases["torch_only"]["replay"].startswith("fail")
        assert cases["wrong_with_replaced_comparison"]["kernel"] == "pass"
        assert cases["wrong_with_replaced_comparison"]["replay"].startswith("fail")


def test_feedback_goes_back_through_the_exchange_and_zip_collect_collects(tmp_path):
    """The rest of the instructor's loop on the fixture course: one submission through the
    exchange is autograded, its feedback released and fetched by the student (the HTML only);
    and ``zip_collect`` files an archive of notebooks named <student>_<lab>.ipynb with the
    pattern the instructors' guide (book/instructors.md) gives."""
    _sandbox_or_skip()
    course = tmp_path / "course"
    shutil.copytree(FIXTURE, course)
    (course / "exchange").mkdir()
    releases.generate(course, ASSIGNMENT)
    _nbgrader("release_assignment", ASSIGNMENT, cwd=course)
    home = tmp_path / "home"
    home.mkdir()
    exchange = [f"--Exchange.root={course / 'exchange'}", "--CourseDirectory.course_id=fixture-course"]
    _nbgrader("fetch_assignment", ASSIGNMENT, *exchange, cwd=home)
    _nbgrader("submit", ASSIGNMENT, "--student=alice", *exchange, cwd=home)
    _nbgrader("collect", ASSIGNMENT, cwd=course)
    _nbgrader("autograde", ASSIGNMENT, cwd=course, timeout=600)
    _nbgrader("generate_feedback", ASSIGNMENT, cwd=course)
    _nbgrader("release_feedback", ASSIGNMENT, cwd=course)
    _nbgrader("fetch_feedback", ASSIGNMENT, "--student=alice", *exchange, cwd=home)
    fetched = list((home / ASSIGNMENT / "feedback").glob("*/*"))
    assert [p.name for p in fetched] == ["labfx.html"], fetched
    page = fetched[0].read_text()
    assert "BEGIN HIDDEN TESTS" not in page and "fixture_checks" not in page

    archive = course / "downloaded" / ASSIGNMENT / "archive"
    archive.mkdir(parents=True)
    released = course / "release" / ASSIGNMENT / "labfx.ipynb"
    import zipfile
    with zipfile.ZipFile(archive / "class.zip", "w") as bundle:
        for student in ("bob", "carol"):
            bundle.write(released, f"{student}_labfx.ipynb")
    _nbgrader("zip_collect", ASSIGNMENT, "--FileNameCollectorPlugin.named_regexp="
              r".*/(?P<student_id>[^/_]+)_(?P<file_id>labfx\.ipynb)", cwd=course)
    for student in ("bob", "carol"):
        assert (course / "submitted" / student / ASSIGNMENT / "labfx.ipynb").is_file(), student
