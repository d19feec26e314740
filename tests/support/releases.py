"""Each lab's release generated once per test run, then copied into the courses that need it.

``nbgrader generate_assignment`` writes two things into a course: ``release/<lab>/`` and the
lab's entries in ``gradebook.db`` (the graded cells autograde compares a submission with).
Every test course is a copy of one of two origins: the repository (its nbgrader_config.py and
assignments/) or the fixture course (tests/fixtures/course).  The first test that asks for a
release of an origin's lab generates all of that origin's labs with one nbgrader call, into a
cache folder that every test module and both pytest-xdist workers share (a file lock keeps a
second process waiting until the first has finished); each course then gets its own copy of
its labs' release folders and of the gradebook, with the other labs removed from it.

The cache is keyed by a hash of the origin's config and labs, of autograde/'s code (the steps
``configure`` swaps into nbgrader) and of nbgrader's version, so an edit makes a new one.  The
copy stands for nbgrader's run only where the course would have given nbgrader the same input:
its lab folders are the origin's, byte for byte; its config is the origin's with lines added
at the end (the lines the tests add set grading and its surroundings alone: the sandbox, the
uid pool, limits, the similarity check, the exchange, the course root, none of which
generate_assignment reads); it has no
gradebook and no release of those labs yet.  Anywhere else (and outside a pytest run, where
``CACHE_ROOT`` is unset) ``generate`` runs nbgrader itself.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import shutil
import sqlite3
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURE_COURSE = REPO_ROOT / "tests" / "fixtures" / "course"
ORIGINS = {"repository": REPO_ROOT, "fixture": FIXTURE_COURSE}
# what make_course and nbgrader leave out of a copy of a lab folder
SKIPPED = (".ipynb_checkpoints", "__pycache__")

CACHE_ROOT: Path | None = None     # set for the run by tests/conftest.py
BUILDS: list = []                  # (origin, seconds) of every build this process made


@contextlib.contextmanager
def cache_for_run(root):
    """``CACHE_ROOT`` set to ``root`` while the block runs, unless a run that encloses this
    one set it already (a pytest session started inside a test keeps the outer run's cache);
    what it was is put back afterwards."""
    global CACHE_ROOT
    before = CACHE_ROOT
    if before is None:
        CACHE_ROOT = Path(root)
    try:
        yield CACHE_ROOT
    finally:
        CACHE_ROOT = before


def _files(folder: Path) -> list:
    return sorted(p for p in folder.rglob("*")
                  if p.is_file() and not set(SKIPPED).intersection(p.parts)
                  and p.suffix != ".pyc")


def tree_digest(folder) -> str:
    """A hash of the names and bytes of the files under ``folder`` (those a copy keeps)."""
    folder = Path(folder)
    digest = hashlib.sha256()
    for path in _files(folder):
        digest.update(str(path.relative_to(folder)).encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def origin_labs(origin: Path) -> list:
    return sorted(p.name for p in (origin / "assignments").iterdir() if p.is_dir()
                  and p.name not in SKIPPED)


def origin_of(lab: str) -> str | None:
    """The name of the origin whose assignments/ holds ``lab``."""
    for name, origin in ORIGINS.items():
        if (origin / "assignments" / lab).is_dir():
            return name
    return None


def cache_key(name: str) -> str:
    import nbgrader

    origin = ORIGINS[name]
    digest = hashlib.sha256(nbgrader.__version__.encode() + b"\0")
    digest.update((origin / "nbgrader_config.py").read_bytes())
    for lab in origin_labs(origin):
        digest.update(f"{lab}\0{tree_digest(origin / 'assignments' / lab)}\0".encode())
    digest.update(tree_digest(REPO_ROOT / "autograde").encode())
    return digest.hexdigest()[:20]


def cached_course(name: str) -> Path:
    """The cache's course of origin ``name``: every lab of it generated, built on first use
    (by whichever process takes the lock first)."""
    import time

    from support.nbgrader_helpers import run_nbgrader

    if CACHE_ROOT is None:
        raise RuntimeError("the release cache is set up by tests/conftest.py for a pytest run")
    origin = ORIGINS[name]
    folder = Path(CACHE_ROOT) / f"releases-{name}-{cache_key(name)}"
    with open(Path(CACHE_ROOT) / "releases.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not folder.is_dir():
                start = time.perf_counter()
                building = folder.with_name(folder.name + ".building")
                shutil.rmtree(building, ignore_errors=True)
                building.mkdir(parents=True)
                shutil.copy(origin / "nbgrader_config.py", building / "nbgrader_config.py")
                for lab in origin_labs(origin):
                    shutil.copytree(origin / "assignments" / lab, building / "assignments" / lab,
                                    ignore=shutil.ignore_patterns(*SKIPPED, "*.pyc"))
                run_nbgrader(building, "generate_assignment", "*", "--force")
                building.rename(folder)
                BUILDS.append((name, time.perf_counter() - start))
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return folder


def refusal(course, labs) -> str | None:
    """Why the cached releases cannot stand for nbgrader's run in ``course`` (a sentence), or
    None when they can."""
    course = Path(course)
    names = {origin_of(lab) for lab in labs}
    if CACHE_ROOT is None:
        return "no cache: outside a pytest run"
    if len(names) != 1 or None in names:
        return f"the labs come from {sorted(map(str, names))}, not from one origin"
    origin = ORIGINS[names.pop()]
    config = course / "nbgrader_config.py"
    if (course / "gradebook.db").exists():
        return "the course has a gradebook already"
    if not config.is_file() or \
            not config.read_text().startswith((origin / "nbgrader_config.py").read_text()):
        return "its nbgrader_config.py does not start with the origin's"
    for lab in labs:
        if (course / "release" / lab).exists():
            return f"{lab} is released in it already"
        if not (course / "assignments" / lab).is_dir():
            return f"it has no assignments/{lab}"
        ours, theirs = course / "assignments" / lab, origin / "assignments" / lab
        if tree_digest(ours) != tree_digest(theirs):
            mine = {str(f.relative_to(ours)) for f in _files(ours)}
            origin_files = {str(f.relative_to(theirs)) for f in _files(theirs)}
            return (f"assignments/{lab} differs from the origin's (files on one side only: "
                    f"{sorted(mine ^ origin_files)}; else a file's bytes)")
    return None


def _copyable(course: Path, labs: list) -> str | None:
    """The origin whose cached releases can stand for nbgrader's run in ``course``, or None."""
    return None if refusal(course, labs) else origin_of(labs[0])


def copy_releases(course, labs) -> bool:
    """Give ``course`` the releases of ``labs`` and their gradebook entries from the cache,
    where they stand for nbgrader's run (see the module's docstring); False where they do not,
    with nothing written."""
    from nbgrader.api import Gradebook

    course = Path(course)
    labs = [labs] if isinstance(labs, str) else list(labs)
    name = _copyable(course, labs)
    if name is None:
        return False
    cached = cached_course(name)
    for lab in labs:
        shutil.copytree(cached / "release" / lab, course / "release" / lab)
    shutil.copy(cached / "gradebook.db", course / "gradebook.db")
    with sqlite3.connect(course / "gradebook.db") as db:
        (course_id,), = db.execute("SELECT DISTINCT course_id FROM assignment").fetchall()
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}", course_id) as gradebook:
        for assignment in [a.name for a in gradebook.assignments]:
            if assignment not in labs:
                gradebook.remove_assignment(assignment)
    return True


def generate(course, labs) -> None:
    """``nbgrader generate_assignment`` of ``labs`` in ``course``: copied from the cache where
    that stands for the run, else run."""
    from support.nbgrader_helpers import run_nbgrader

    labs = [labs] if isinstance(labs, str) else list(labs)
    if not copy_releases(course, labs):
        run_nbgrader(course, "generate_assignment", labs[0] if len(labs) == 1 else "*",
                     "--force")
