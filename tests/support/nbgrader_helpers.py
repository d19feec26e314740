"""Shared utilities for the tests of the nbgrader labs (assignments/labNN_*).

Every lab test does the same four things in a throw-away copy of the course directory, so
that the repository never gets a gradebook, release/ or autograded/ folder:

1. ``nbgrader generate_assignment`` (``generate_release`` / ``generate_releases``; copied
   from the run's cache of releases, support/releases.py, where that stands for the run);
2. execute the source notebook and the untouched release top to bottom
   (``execute_notebook`` / ``execute_notebooks``, nbclient with the python3 kernel);
3. ``nbgrader autograde`` the source notebook and the untouched release as two students'
   submissions and read the scores from the gradebook (``autograde_scores`` /
   ``autograde_many``);
4. inspect cells: which graded test cells raised (``cell_errors``), whether a release leaks
   solution or hidden-test lines (``leaked_lines``).

``run_labs`` does all of it for several labs at once: one generate call, one autograde call
(run while the notebooks execute, so two cores are both busy).
"""
from __future__ import annotations

import concurrent.futures as _futures
import functools
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from support import releases

REPO_ROOT = Path(__file__).resolve().parents[2]
ASSIGNMENTS = REPO_ROOT / "assignments"
VENV_BIN = Path(sys.executable).parent          # the interpreter running the tests
SOLUTION_STUDENT = "solution"                   # submits the source notebook
UNTOUCHED_STUDENT = "untouched"                 # submits the release as handed out

BEGIN_SOLUTION, END_SOLUTION = "### BEGIN SOLUTION", "### END SOLUTION"
BEGIN_HIDDEN, END_HIDDEN = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"


# ---------------------------------------------------------------------------- environment
def nbgrader_env() -> dict:
    """The environment for nbgrader subprocesses: the venv's bin first on PATH (nbgrader
    runs the ``alembic`` executable when it creates the gradebook)."""
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("MPLBACKEND", "Agg")
    return env


@functools.lru_cache(maxsize=None)
def grading_sandbox() -> tuple:
    """``(True, "")`` where grading kernels can be sandboxed on this host (root and bubblewrap),
    else ``(False, why)``: ``autograde.isolation.sandbox.sandbox_available``, asked once per run."""
    from autograde.isolation.sandbox import sandbox_available

    return sandbox_available()


def unsandboxed_grading_config() -> str:
    """The config line that lets a test course grade without the sandbox where the sandbox
    cannot run (an ordinary user, or no bubblewrap), else ``""``.

    The course's own config requires the sandbox on Linux (``AutogradeSettings.require_sandbox``
    unset), so an ordinary user's ``make test`` would stop every lab test in its set-up.  The
    lab and feedback tests check what the labs teach and score, not the isolation (the sandbox
    has tests of its own, tests/test_grading*.py, which skip without it): graded without the
    sandbox they still run, on notebooks the course itself wrote.  In CI as root the sandbox
    must be there (`make test` installs bubblewrap), so no line is added and a missing sandbox
    fails loudly instead."""
    available, why = grading_sandbox()
    if available or (os.environ.get("CI") and os.geteuid() == 0):
        return ""
    return ("# the grading sandbox is unavailable here (" + why.replace("\n", " ") + "):\n"
            "# the course's own notebooks are graded without it\n"
            "c.AutogradeSettings.sandbox = 'none'\n")


def run_checked(args, cwd, *, env=None, timeout=600, check=True) -> subprocess.CompletedProcess:
    """Run ``args`` in ``cwd``; with ``check``, raise with the output's tail when it fails."""
    proc = subprocess.run([str(a) for a in args], cwd=cwd, env=env or nbgrader_env(),
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{args} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n"
                             f"{proc.stderr[-4000:]}")
    return proc


def synthetic_class_generator():
    """``scripts/make_synthetic_class.py`` as a module (it is a script, not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "make_synthetic_class", Path(__file__).resolve().parents[2] / "scripts"
        / "make_synthetic_class.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def source_notebook(lab: str) -> Path:
    """assignments/<lab>/<lab>.ipynb in the repository."""
    return ASSIGNMENTS / lab / f"{lab}.ipynb"


# ---------------------------------------------------------------------------- course dir
def make_course(course_dir, labs) -> Path:
    """Copy nbgrader_config.py and assignments/<lab> for each lab into ``course_dir``.

    The repository's config sets ``CourseDirectory.root`` to the folder the config file sits
    in, so the copy makes ``course_dir`` the course root; a config line pinning the root is
    appended anyway so that this stays true if the config changes."""
    course_dir = Path(course_dir)
    course_dir.mkdir(parents=True, exist_ok=True)
    config = (REPO_ROOT / "nbgrader_config.py").read_text()
    config += f"\n# added by tests/support/nbgrader_helpers.py\nc.CourseDirectory.root = {str(course_dir)!r}\n"
    config += unsandboxed_grading_config()
    (course_dir / "nbgrader_config.py").write_text(config)
    for lab in ([labs] if isinstance(labs, str) else labs):
        target = course_dir / "assignments" / lab
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(ASSIGNMENTS / lab, target,
                        ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    return course_dir


def run_nbgrader(course_dir, *args, timeout=600) -> subprocess.CompletedProcess:
    """Run ``nbgrader <args>`` in ``course_dir``; raise with the log tail when it fails."""
    command = [str(VENV_BIN / "nbgrader"), *map(str, args)]
    proc = subprocess.run(command, cwd=course_dir, env=nbgrader_env(), capture_output=True,
                          text=True, timeout=timeout)
    log = proc.stdout + proc.stderr
    if proc.returncode != 0 or "[ERROR]" in log or "| ERROR]" in log:
        raise RuntimeError(f"`nbgrader {' '.join(map(str, args))}` failed "
                           f"(exit {proc.returncode}):\n{log[-6000:]}")
    return proc


def release_path(course_dir, lab: str) -> Path:
    return Path(course_dir) / "release" / lab / f"{lab}.ipynb"


def generate_releases(labs, course_dir) -> dict:
    """Copy the labs into ``course_dir`` (if not there yet) and generate all their releases
    (``releases.generate``: copied from this run's cache, or one ``nbgrader
    generate_assignment`` call); returns {lab: released notebook path}."""
    labs = [labs] if isinstance(labs, str) else list(labs)
    course_dir = Path(course_dir)
    missing = [lab for lab in labs if not (course_dir / "assignments" / lab).exists()]
    if missing or not (course_dir / "nbgrader_config.py").exists():
        make_course(course_dir, missing)
    releases.generate(course_dir, labs)           # the run's cached releases, or nbgrader's
    paths = {lab: release_path(course_dir, lab) for lab in labs}
    for lab, path in paths.items():
        if not path.exists():
            raise RuntimeError(f"nbgrader generate_assignment wrote no {path}")
    return paths


def generate_release(lab: str, course_dir) -> Path:
    """Generate one lab's release in ``course_dir``; returns the released notebook path."""
    return generate_releases([lab], course_dir)[lab]


# ---------------------------------------------------------------------------- execution
def execute_notebook(path, timeout=120, *, kernel_name="python3", save_to=None):
    """Execute a notebook top to bottom with nbclient, going on past errors, in the
    notebook's own folder.  Returns the executed notebook (nbformat node); its error
    outputs are read with ``cell_errors``.  ``timeout`` is per cell, in seconds."""
    from nbclient import NotebookClient

    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    env_backend = os.environ.get("MPLBACKEND")
    os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    try:
        client = NotebookClient(nb, timeout=timeout, kernel_name=kernel_name,
                                allow_errors=True,
                                resources={"metadata": {"path": str(path.parent)}})
        client.execute()
    finally:
        if env_backend is None:
            os.environ.pop("MPLBACKEND", None)
        else:
            os.environ["MPLBACKEND"] = env_backend
    if save_to is not None:
        nbformat.write(nb, save_to)
    return nb


def _execute_to_file(args):
    path, timeout, out = args
    start = time.perf_counter()
    execute_notebook(path, timeout, save_to=out)
    return time.perf_counter() - start


def execute_notebooks(paths, timeout=120, workers=1) -> dict:
    """Execute several notebooks, ``workers`` at a time, each in its own process.
    Returns {path: (executed notebook, seconds)}."""
    paths = [Path(p) for p in paths]
    jobs = [(p, timeout, p.with_name(p.stem + ".executed.ipynb")) for p in paths]
    results = {}
    # spawn, not fork: run_labs calls this while another thread runs nbgrader
    context = multiprocessing.get_context("spawn")
    with _futures.ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        for (path, _, out), seconds in zip(jobs, pool.map(_execute_to_file, jobs)):
            results[path] = (nbformat.read(out, as_version=4), seconds)
            out.unlink()
    return results


# ---------------------------------------------------------------------------- cells
def solution_sources(lab: str) -> dict:
    """{grade_id: the source notebook's answer, marker lines dropped}."""
    source = nbformat.read(source_notebook(lab), as_version=4)
    return {c.metadata.nbgrader["grade_id"]: "\n".join(
        line for line in c.source.splitlines()
        if line.strip() not in (BEGIN_SOLUTION, END_SOLUTION))
        for c in source.cells if c.metadata.get("nbgrader", {}).get("solution")}


def solved_release(release_nb, lab: str):
    """A copy of the released notebook with every answer cell taken from the source notebook:
    what a student who got everything right hands in."""
    answers = solution_sources(lab)
    nb = nbformat.reads(nbformat.writes(release_nb), as_version=4)
    filled = 0
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if cell.metadata.get("nbgrader", {}).get("solution") and gid in answers:
            cell.source = answers[gid]
            filled += 1
    assert filled == len(answers) > 0, (filled, sorted(answers))
    return nb


def nbgrader_meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def graded_test_cells(nb) -> list:
    """Code cells that carry points (nbgrader ``grade: true`` and not ``solution``)."""
    return [c for c in nb.cells if c.cell_type == "code" and nbgrader_meta(c).get("grade")
            and not nbgrader_meta(c).get("solution")]


def cell_errors(nb) -> dict:
    """{grade_id or 'cell <index>': 'ename: evalue'} for every code cell that raised."""
    errors = {}
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                name = nbgrader_meta(cell).get("grade_id") or f"cell {index}"
                errors[name] = f"{output.get('ename')}: {output.get('evalue')}"
    return errors


def stderr_cells(nb) -> dict:
    """{grade_id or 'cell <index>': text} for code cells that wrote to stderr (nbgrader gives
    a test cell with stderr output zero points)."""
    found = {}
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        text = "".join(o.get("text", "") for o in cell.get("outputs", [])
                       if o.get("output_type") == "stream" and o.get("name") == "stderr")
        if text:
            found[nbgrader_meta(cell).get("grade_id") or f"cell {index}"] = text
    return found


def _regions(source: str, begin: str, end: str) -> list:
    lines, inside, out = source.splitlines(), False, []
    for line in lines:
        if line.strip() == begin:
            inside = True
        elif line.strip() == end:
            inside = False
        elif inside and line.strip():
            out.append(line.strip())
    return out


def _public_lines(source: str) -> set:
    """Stripped lines of a cell outside its solution and hidden-test regions."""
    public, inside = set(), False
    for line in source.splitlines():
        if line.strip() in (BEGIN_SOLUTION, BEGIN_HIDDEN):
            inside = True
        elif line.strip() in (END_SOLUTION, END_HIDDEN):
            inside = False
        elif not inside:
            public.add(line.strip())
    return public


def leaked_lines(source_nb, release_nb) -> list:
    """Lines of solution regions and hidden-test regions of the source notebook (and the
    region markers themselves) that appear in the release.  A line that the source notebook
    also shows outside those regions (say ``for m in range(M):`` in a figure cell) and
    trivial lines (a bare ``return``) are not counted."""
    release_text = "\n".join(c.source for c in release_nb.cells)
    release_lines = {line.strip() for line in release_text.splitlines()}
    leaks = [m for m in (BEGIN_SOLUTION, END_SOLUTION, BEGIN_HIDDEN, END_HIDDEN)
             if m in release_text]
    public = set()
    for cell in source_nb.cells:
        public |= _public_lines(cell.source)
    for cell in source_nb.cells:
        secret = _regions(cell.source, BEGIN_SOLUTION, END_SOLUTION)
        secret += _regions(cell.source, BEGIN_HIDDEN, END_HIDDEN)
        leaks += [s for s in secret if s in release_lines and s not in public and len(s) > 12]
    return leaks


# ---------------------------------------------------------------------------- autograde
def submit(course_dir, lab: str, student: str, notebook_path) -> Path:
    """Place ``notebook_path`` as ``student``'s submission of ``lab``."""
    target = Path(course_dir) / "submitted" / student / lab / f"{lab}.ipynb"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(notebook_path, target)
    return target


def read_scores(course_dir, lab: str, student: str) -> dict:
    """Scores from the gradebook: {'total': (score, max), grade_id: (score, max), ...}."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{Path(course_dir) / 'gradebook.db'}") as gradebook:
        notebook = gradebook.find_submission_notebook(lab, lab, student)
        scores = {"total": (float(notebook.score), float(notebook.max_score))}
        for grade in notebook.grades:
            scores[grade.name] = (float(grade.score), float(grade.max_score))
    return scores


def autograded_path(course_dir, lab: str, student: str) -> Path:
    return Path(course_dir) / "autograded" / student / lab / f"{lab}.ipynb"


def autograde_many(course_dir, submissions: dict) -> dict:
    """``submissions``: {(lab, student): notebook path}.  Submits them all, runs one
    ``nbgrader autograde`` over every lab, and returns {(lab, student): scores}."""
    labs = sorted({lab for lab, _ in submissions})
    for (lab, student), path in submissions.items():
        submit(course_dir, lab, student, path)
    pattern = labs[0] if len(labs) == 1 else "*"
    run_nbgrader(course_dir, "autograde", pattern, "--force")
    return {key: read_scores(course_dir, *key) for key in submissions}


def autograde_scores(lab: str, notebook_path, course_dir, student=SOLUTION_STUDENT) -> dict:
    """Autograde ``notebook_path`` as ``student``'s submission of ``lab`` (its release must
    have been generated in ``course_dir``); returns ``read_scores``'s dict."""
    return autograde_many(course_dir, {(lab, student): notebook_path})[(lab, student)]


# ---------------------------------------------------------------------------- kernel uids
# A grading kernel runs as a uid of the host-wide pool (autograde/isolation/uids.py), which every grading
# command on the host shares: a test checks the uids and processes of its own run only.
POOL_BASE = 64123      # AutogradeSettings.kernel_uid's default
POOL_COUNT = 256       # AutogradeSettings.kernel_uid_count's default


def in_uid_pool(uid, base=POOL_BASE, count=POOL_COUNT) -> bool:
    return base <= int(uid) < base + count


def pool_processes(base=POOL_BASE, count=POOL_COUNT) -> list:
    """A snapshot of the host's processes whose real uid is in the kernel uid pool, whoever
    started them: [(uid, pid, started, command line)], ``started`` in seconds since the epoch
    (from /proc/PID/stat, to a clock tick)."""
    ticks = os.sysconf("SC_CLK_TCK")
    boot = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as fh:
                uid = next(int(line.split()[1]) for line in fh if line.startswith("Uid:"))
            if not in_uid_pool(uid, base, count):
                continue
            with open(f"/proc/{name}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                args = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, ValueError, StopIteration, IndexError):
            continue                                   # gone meanwhile
        found.append((uid, int(name), boot + int(fields[19]) / ticks, args))
    return found


def ledger_kernels(course_dir, assignment) -> list:
    """[(uid, start, end)] of every grading kernel the course's ledgers record
    (autograde_status/<assignment>/<student>.json); a kernel with no end yet ends now."""
    folder = Path(course_dir) / "autograde_status" / assignment
    kernels = []
    for path in sorted(folder.glob("*.json")):
        entry = json.loads(path.read_text())
        for notebook in (entry.get("notebooks") or {}).values():
            for kernel in notebook.get("kernels", []):
                kernels.append((kernel["uid"], kernel["start"], kernel.get("end", time.time())))
    return kernels


def own_processes(snapshot, kernels) -> list:
    """The processes of ``snapshot`` (``pool_processes``) that one of ``kernels``
    (``ledger_kernels``) left: the same uid, started while that kernel held it.  A uid is one
    kernel's from its lease to its release, so a process of the uid started in that time is
    that kernel's; another command's kernel of the same uid, before or after, is not counted.
    (A start time is floored to a clock tick: 20 ms of slack at the start.)"""
    return [proc for proc in snapshot
            if any(proc[0] == uid and start - 0.02 <= proc[2] <= end
                   for uid, start, end in kernels)]


# ---------------------------------------------------------------------------- all at once
@dataclass
class LabRuns:
    """Everything the lab tests look at, for several labs."""
    course_dir: Path
    releases: dict = field(default_factory=dict)           # lab -> release path
    source_runs: dict = field(default_factory=dict)        # lab -> executed source nb
    release_runs: dict = field(default_factory=dict)       # lab -> executed release nb
    seconds: dict = field(default_factory=dict)            # (lab, 'source'|'release') -> s
    scores: dict = field(default_factory=dict)             # (lab, student) -> scores
    autograde_seconds: float = 0.0
    generate_seconds: float = 0.0


def run_labs(labs, course_dir, *, timeout=120, exec_workers=1) -> LabRuns:
    """Generate the releases of ``labs`` in ``course_dir``, then, at the same time:
    autograde the source notebook (student ``solution``) and the untouched release
    (student ``untouched``) in one nbgrader call, and execute the source notebooks and the
    releases with nbclient, ``exec_workers`` at a time."""
    labs = list(labs)
    course_dir = make_course(course_dir, labs)
    runs = LabRuns(course_dir=course_dir)
    start = time.perf_counter()
    runs.releases = generate_releases(labs, course_dir)
    runs.generate_seconds = time.perf_counter() - start

    # private copies to execute, so that nbclient's outputs never land in assignments/
    exec_dir = course_dir / "executed"
    to_run = {}
    for lab in labs:
        for kind, path in (("source", course_dir / "assignments" / lab / f"{lab}.ipynb"),
                           ("release", runs.releases[lab])):
            target = exec_dir / kind / lab
            shutil.copytree(path.parent, target, dirs_exist_ok=True)
            to_run[(lab, kind)] = target / f"{lab}.ipynb"
    submissions = {}
    for lab in labs:
        submissions[(lab, SOLUTION_STUDENT)] = course_dir / "assignments" / lab / f"{lab}.ipynb"
        submissions[(lab, UNTOUCHED_STUDENT)] = runs.releases[lab]

    def grade():
        t0 = time.perf_counter()
        scores = autograde_many(course_dir, submissions)
        return scores, time.perf_counter() - t0

    with _futures.ThreadPoolExecutor(max_workers=1) as pool:
        graded = pool.submit(grade)
        executed = execute_notebooks(list(to_run.values()), timeout=timeout,
                                     workers=exec_workers)
        runs.scores, runs.autograde_seconds = graded.result()
    for (lab, kind), path in to_run.items():
        nb, seconds = executed[path]
        (runs.source_runs if kind == "source" else runs.release_runs)[lab] = nb
        runs.seconds[(lab, kind)] = seconds
    return runs
