"""Unit tests of the grading engine's modules that the end-to-end grading tests reach only
through whole grading runs: the limit a kernel ran into (autograde/limits.py), the gradebook
lock (autograde/dblock.py), the restored notebook structure (autograde/restore.py), the export
rows with their status (autograde/export.py) and the sandbox's command line and reports
(autograde/sandbox.py).  Each runs on small inputs built here, in-process."""
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbgrader.api import Gradebook
from traitlets.config import Config

from autograde.pipeline import dblock
from autograde.runner import export
from autograde.isolation import limits
from autograde.pipeline import restore
from autograde.isolation import sandbox
from autograde.pipeline import status
from autograde.config import AutogradeSettings

EMPTY_GRADEBOOK = None            # a copy of an empty gradebook: the new_gradebooks fixture
SETTINGS = AutogradeSettings(memory_mb=512, processes=32, cpu_seconds=60, file_mb=8, tmp_mb=16,
                             tmp_inodes=100)


# ---------------------------------------------------------------------------- limits
@pytest.mark.parametrize("ename, evalue, limit, words", [
    ("MemoryError", "", "memory limit", "512 MiB address-space limit"),
    ("RuntimeError", "CUDA out of memory while allocating", "memory limit", "512 MiB"),
    ("BlockingIOError", "[Errno 11] Resource temporarily unavailable", "process limit",
     "at most 32 processes and threads"),
    ("RuntimeError", "can't start new thread", "process limit", "at most 32"),
    ("OSError", "[Errno 27] File too large", "file-size limit", "past 8 MiB"),
    ("OSError", "[Errno 28] No space left on device", "folder limit",
     "16 MiB and 100 files"),
])
def test_a_cell_error_names_the_limit_that_caused_it(ename, evalue, limit, words):
    found, text = limits.from_error(ename, evalue, SETTINGS)
    assert found == limit and found in limits.LIMITS
    assert text.startswith(limit + ":") and words in text


def test_a_cell_error_of_the_students_own_is_no_limit():
    assert limits.from_error("ValueError", "shapes do not match", SETTINGS) is None
    assert limits.from_error("AssertionError", None, SETTINGS) is None


def test_without_a_memory_limit_the_text_says_what_ran_out():
    _, text = limits.from_error("MemoryError", "", AutogradeSettings(memory_mb=0))
    assert "the memory available to the kernel" in text


@pytest.mark.parametrize("report, limit", [
    ({"status": -signal.SIGKILL, "cpu_seconds": 59.2}, "CPU-time limit"),
    ({"status": 128 + signal.SIGXCPU, "cpu_seconds": 60.0}, "CPU-time limit"),
    ({"status": -signal.SIGXFSZ, "cpu_seconds": 1.0}, "file-size limit"),
    ({"status": 1, "tail": "terminate called after throwing 'std::bad_alloc'"}, "memory limit"),
    ({"status": 134, "head": "pthread_create failed: Resource temporarily unavailable"},
     "process limit"),
])
def test_a_kernel_that_died_names_the_limit_from_its_exit_report(report, limit):
    found, text = limits.from_exit(report, SETTINGS)
    assert found == limit and text.startswith(limit + ":")


def test_a_kernel_that_died_otherwise_is_no_limit():
    assert limits.from_exit(None, SETTINGS) is None
    assert limits.from_exit({}, SETTINGS) is None
    # killed well before its CPU seconds were used: another cause, not the CPU-time limit
    assert limits.from_exit({"status": -signal.SIGKILL, "cpu_seconds": 3.0}, SETTINGS) is None
    assert limits.from_exit({"status": 1, "tail": "Segmentation fault"}, SETTINGS) is None


# ---------------------------------------------------------------------------- dblock
HOLDS = ("import fcntl, sys\n"
         "fh = open(sys.argv[1], 'a+')\n"
         "try:\n"
         "    fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
         "except BlockingIOError:\n"
         "    print('held')\n"
         "else:\n"
         "    print('free')\n")


def _other_process_sees(path):
    return subprocess.run([sys.executable, "-c", HOLDS, str(path)], capture_output=True,
                          text=True, check=True).stdout.strip()


@pytest.fixture
def fresh_dblock(monkeypatch):
    monkeypatch.setattr(dblock, "_state", {"fh": None, "held": False})
    yield dblock
    if dblock._state["fh"] is not None:
        dblock._state["fh"].close()


def test_without_the_variable_the_gradebook_lock_is_a_no_op(fresh_dblock, monkeypatch):
    monkeypatch.delenv("AUTOGRADE_DB_LOCK", raising=False)
    dblock.acquire()
    assert not dblock.held() and dblock._state["fh"] is None
    dblock.release()
    assert not dblock.held()


def test_the_gradebook_lock_keeps_another_process_out_until_released(fresh_dblock, tmp_path,
                                                                      monkeypatch):
    path = tmp_path / "gradebook.lock"
    monkeypatch.setenv("AUTOGRADE_DB_LOCK", str(path))
    dblock.acquire()
    dblock.acquire()                                  # a second acquire is a no-op, no deadlock
    assert dblock.held() and _other_process_sees(path) == "held"
    dblock.release()
    assert not dblock.held() and _other_process_sees(path) == "free"
    dblock.acquire()                                  # the same file, taken again
    assert _other_process_sees(path) == "held"
    dblock.release()


# ---------------------------------------------------------------------------- restore
def _cell(kind, grade_id, source, **flags):
    cell = (nbformat.v4.new_code_cell if kind == "code" else nbformat.v4.new_markdown_cell)(
        source)
    meta = {"grade_id": grade_id, "grade": False, "solution": False, "locked": False,
            "schema_version": 3}
    meta.update(flags)
    cell.metadata["nbgrader"] = meta
    return cell


@pytest.fixture(scope="module")
def empty_gradebook(tmp_path_factory):
    """An empty gradebook, made once: a new one runs the environment's ``alembic`` executable
    (found on PATH), which takes seconds; each test copies this one."""
    path = tmp_path_factory.mktemp("gradebook") / "gradebook.db"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
        with Gradebook(f"sqlite:///{path}"):
            pass
    return path


@pytest.fixture
def new_gradebooks(empty_gradebook, monkeypatch):
    """New gradebooks start as a copy of ``empty_gradebook``."""
    monkeypatch.setattr(sys.modules[__name__], "EMPTY_GRADEBOOK", empty_gradebook)


def _released(course):
    """A course with lab ``labx`` released (release/labx/labx.ipynb and its gradebook): an
    intro, an answer, a graded check."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [_cell("markdown", "intro", "# The lab", locked=True),
                _cell("code", "answer", "def f(x):\n    raise NotImplementedError",
                      solution=True),
                _cell("code", "check", "assert f(2) == 4", grade=True, locked=True, points=1)]
    nb.cells[2].metadata["tags"] = ["graded"]
    folder = course / "release" / "labx"
    folder.mkdir(parents=True)
    nbformat.write(nb, folder / "labx.ipynb")
    shutil.copy(EMPTY_GRADEBOOK, course / "gradebook.db")
    db = f"sqlite:///{course / 'gradebook.db'}"
    with Gradebook(db) as gb:
        gb.update_or_create_assignment("labx")
        gb.update_or_create_notebook("labx", "labx")
        for cell in nb.cells:
            gb.update_or_create_source_cell(
                cell.metadata.nbgrader["grade_id"], "labx", "labx", cell_type=cell.cell_type,
                source=cell.source, checksum=f"sum-{cell.metadata.nbgrader['grade_id']}",
                locked=cell.metadata.nbgrader["locked"])
    return nb, db


def _restore(course, submission, db, monkeypatch):
    monkeypatch.chdir(course)
    resources = {"nbgrader": {"assignment": "labx", "notebook": "labx", "db_url": db,
                              "student": "ada"}}
    nb, _ = restore.RestoreStructure(config=Config()).preprocess(submission, resources)
    return nb


def test_restore_puts_the_released_structure_back_and_keeps_the_answer(new_gradebooks, tmp_path, monkeypatch):
    release, db = _released(tmp_path)
    check = nbformat.from_dict(json.loads(json.dumps(release.cells[2])))
    check.metadata["nbgrader"]["grade"] = False          # the check made ungraded
    check.metadata["tags"] = ["skip-execution"]
    check.source = "pass"                                # and emptied
    answer = nbformat.from_dict(json.loads(json.dumps(release.cells[1])))
    answer.source = "def f(x):\n    return 2 * x"
    added = nbformat.v4.new_code_cell("print(f(3))")
    added.metadata["nbgrader"] = {"grade_id": "sneaky", "grade": True, "points": 99}
    added.metadata["tags"] = ["raises-exception"]
    submission = nbformat.v4.new_notebook()
    submission.cells = [check, answer, added]             # reordered, the intro deleted

    nb = _restore(tmp_path, submission, db, monkeypatch)

    ids = [c.metadata.get("nbgrader", {}).get("grade_id") for c in nb.cells]
    assert ids == ["intro", "answer", None, "check"]      # the added cell after the answer
    assert nb.cells[0].source == "# The lab"              # taken back from the gradebook
    assert nb.cells[1].source == "def f(x):\n    return 2 * x"
    assert nb.cells[2].source == "print(f(3))" and "tags" not in nb.cells[2].metadata
    assert nb.cells[3].source == "assert f(2) == 4"
    assert nb.cells[3].metadata.nbgrader["grade"] is True
    assert nb.cells[3].metadata.nbgrader["checksum"] == "sum-check"
    assert nb.cells[3].metadata["tags"] == ["graded"]
    changes = nb.metadata["autograde"]["restored"]
    for expected in ("released cells were reordered; original order restored",
                     "cell intro was missing; restored from the gradebook",
                     "cell check: edited locked cell restored",
                     "cell check: metadata restored",
                     "cell 2: nbgrader metadata/tags of an added cell removed"):
        assert expected in changes, changes
    assert len({c.id for c in nb.cells}) == len(nb.cells)


def test_restore_leaves_a_faithful_submission_as_it_is(new_gradebooks, tmp_path, monkeypatch):
    release, db = _released(tmp_path)
    submission = nbformat.from_dict(json.loads(json.dumps(release)))
    submission.cells[1].source = "def f(x):\n    return x + x"
    nb = _restore(tmp_path, submission, db, monkeypatch)
    assert [c.source for c in nb.cells] == ["# The lab", "def f(x):\n    return x + x",
                                            "assert f(2) == 4"]
    assert nb.metadata["autograde"]["restored"] == []


def test_restore_without_a_release_changes_nothing(new_gradebooks, tmp_path, monkeypatch):
    submission = nbformat.v4.new_notebook()
    submission.cells = [nbformat.v4.new_code_cell("x = 1")]
    nb = _restore(tmp_path, submission, f"sqlite:///{tmp_path / 'gradebook.db'}", monkeypatch)
    assert [c.source for c in nb.cells] == ["x = 1"] and "autograde" not in nb.metadata


# ---------------------------------------------------------------------------- export
def _graded_course(course):
    """labx with one graded check (2 points): ada submitted and scored 2 (late by a penalty
    of 0.5), bob submitted and his grading failed, cleo never submitted; dan's folder has no
    notebook, so the gradebook never saw him."""
    _released(course)
    db = f"sqlite:///{course / 'gradebook.db'}"
    with Gradebook(db) as gb:
        gb.update_or_create_grade_cell("check", "labx", "labx", max_score=2, cell_type="code")
        for student in ("ada", "bob", "cleo"):
            gb.update_or_create_student(student, first_name=student.title())
        for student in ("ada", "bob"):
            gb.add_submission("labx", student)
        ada = gb.find_submission("labx", "ada")
        ada.notebooks[0].grades[0].auto_score = 2.0
        ada.notebooks[0].late_submission_penalty = 0.5
        gb.db.commit()
    status.write(status.ledger_path(str(course), SETTINGS, "labx", "ada"),
                 {"state": "done", "notebooks": {}})
    status.write(status.ledger_path(str(course), SETTINGS, "labx", "bob"),
                 {"state": "done", "failures": ["the kernel could not start"]})
    (course / "submitted" / "dan" / "labx").mkdir(parents=True)
    (course / "submitted" / "dan" / "labx" / "notes.txt").write_text("no notebook\n")
    return db


def test_export_rows_carry_the_status_and_leave_an_ungradable_score_empty(new_gradebooks, tmp_path):
    db = _graded_course(tmp_path)
    with Gradebook(db) as gb:
        rows = {r["student_id"]: r for r in export.rows(gb, str(tmp_path), SETTINGS)}
    assert set(rows) == {"ada", "bob", "cleo"}
    assert rows["ada"]["status"] == "graded" and rows["ada"]["raw_score"] == 2.0
    assert rows["ada"]["score"] == 1.5 and rows["ada"]["max_score"] == 2.0
    assert rows["bob"]["status"] == "ungradable" and rows["bob"]["score"] == ""
    assert rows["bob"]["reasons"] == "the kernel could not start"
    assert rows["cleo"]["status"] == "not_submitted" and rows["cleo"]["score"] == ""
    with Gradebook(db) as gb:
        only = export.rows(gb, str(tmp_path), SETTINGS, students=["bob"])
    assert [r["student_id"] for r in only] == ["bob"]


def test_export_lists_a_submission_folder_the_gradebook_never_saw(new_gradebooks, tmp_path):
    _graded_course(tmp_path)
    from nbgrader.coursedir import CourseDirectory

    coursedir = CourseDirectory(root=str(tmp_path))
    extra = export.ungraded_submissions(str(tmp_path), SETTINGS, coursedir, "labx",
                                        seen={"ada", "bob"})
    assert [(r["student_id"], r["status"], r["reasons"], r["score"]) for r in extra] == [
        ("dan", "ungradable", "no notebook in the submission", "")]
    assert set(extra[0]) == set(export.COLUMNS)


# ---------------------------------------------------------------------------- sandbox
def _spec(tmp_path):
    sock = tmp_path / "sock"
    sock.mkdir()
    view = tmp_path / "view"
    view.mkdir()
    return {"uid": 64999, "tmp_mb": 16, "sock_dir": str(sock), "ro_paths": [sys.prefix],
            "binds": [(str(view), "/opt/course")], "masks": [],
            "env": {"PYTHONPATH": "/opt/course", "HOME": "/submission"},
            "python": sys.executable, "kernel_args": ["--quiet"],
            "limits": {"memory_mb": 512, "processes": 32, "cpu_seconds": 60, "file_mb": 8}}


def test_the_sandbox_command_isolates_drops_the_uid_and_limits(tmp_path, monkeypatch):
    monkeypatch.setattr(sandbox, "bwrap_path", lambda: "/usr/bin/bwrap")
    spec = _spec(tmp_path)
    args = sandbox.build_command(spec, 7, 8)
    assert args[0] == "/usr/bin/bwrap"
    for flag in ("--die-with-parent", "--unshare-net", "--unshare-pid", "--unshare-ipc",
                 "--clearenv"):
        assert flag in args
    joined = " ".join(args)
    assert f"--file 7 {sandbox.CONNECTION_PATH}" in joined and "--file 8 /etc/passwd" in joined
    assert f"--ro-bind {sys.prefix} {sys.prefix}" in joined
    assert f"--ro-bind {tmp_path / 'view'} /opt/course" in joined
    assert f"--bind {spec['sock_dir']} {spec['sock_dir']}" in joined
    assert f"--chdir {sandbox.KERNEL_CWD}" in joined
    assert "--setenv PYTHONPATH /opt/course" in joined
    # of the test's folder only the socket folder and the view are bound, not the folder whole
    bound = [args[i + 1] for i, a in enumerate(args) if a in ("--bind", "--ro-bind")]
    assert sorted(b for b in bound if b.startswith(str(tmp_path))) == [
        spec["sock_dir"], str(tmp_path / "view")]
    setpriv = args.index("--", args.index("--clearenv")) + 1
    assert args[setpriv].endswith("setpriv")
    assert "--reuid=64999" in args and "--no-new-privs" in args and "--inh-caps=-all" in args
    for limit in (f"--as={512 * 2 ** 20}", "--nproc=32", "--cpu=60", f"--fsize={8 * 2 ** 20}",
                  "--nofile=1024", "--core=0"):
        assert limit in args
    assert args[-4:] == ["ipykernel_launcher", "-f", sandbox.CONNECTION_PATH, "--quiet"]
    assert args[args.index(sys.executable) + 1:args.index(sys.executable) + 3] == ["-P", "-m"]


def test_the_unsandboxed_mode_applies_no_process_limit_of_its_own():
    assert sandbox._prlimit_args({"processes": 32, "memory_mb": 0}, nproc=False) == [
        "--nofile=1024", "--core=0"]


def test_the_exit_report_and_message_escape_what_the_submission_printed(tmp_path):
    spec_path = tmp_path / "spec.json"
    sandbox._write_exit_report(str(spec_path), -9, b"first\x1b[2Jline", b"last", 12.5)
    report = json.loads((tmp_path / "exit.json").read_text())
    assert report == {"status": -9, "cpu_seconds": 12.5, "head": "first\x1b[2Jline",
                      "tail": "last"}
    assert limits.from_exit(report, SETTINGS) is None        # 12.5 of 60 CPU seconds
    message = sandbox.exit_message(-9, b"\x1b[2Jcleared\x07")
    assert message.startswith("[autograde sandbox] kernel exited with status -9")
    assert "\x1b" not in message and "\x07" not in message and "cleared" in message


def test_the_sandbox_starts_where_bubblewrap_and_root_are_there():
    if os.geteuid() != 0 or sandbox.bwrap_path() is None:
        pytest.skip("the sandbox needs root and bubblewrap (to run this test: sudo apt-get "
                    "install bubblewrap, then run the tests as root)")
    assert sandbox.sandbox_available() == (True, "")


def test_the_sandbox_says_why_without_bubblewrap(monkeypatch):
    monkeypatch.setattr(sandbox, "bwrap_path", lambda: None)
    available, why = sandbox.sandbox_available()
    assert not available and "apt-get install bubblewrap" in why

