"""The run's cache of generated releases (tests/support/releases.py): a course gets from it
what ``nbgrader generate_assignment`` would have written (the release folders, byte for byte,
and the same gradebook entries, for its labs only); two processes asking at once build it
once; a course nbgrader would have seen differently is left to nbgrader."""
import shutil
import sqlite3
import threading

import nbformat
import pytest

from support import releases
from support.nbgrader_helpers import make_course, run_nbgrader

FIXTURE = releases.FIXTURE_COURSE
LAB = "labfx"
# what generate_assignment puts in the gradebook (ids are random, so rows are named instead)
QUERIES = {
    "assignments": "SELECT name, duedate, course_id FROM assignment",
    "notebooks": "SELECT n.name, a.name, n.kernelspec FROM notebook n "
                 "JOIN assignment a ON n.assignment_id = a.id",
    "grade cells": "SELECT b.name, b.type, g.max_score, g.cell_type FROM grade_cells g "
                   "JOIN base_cell b ON g.id = b.id",
    "solution cells": "SELECT b.name FROM solution_cells s JOIN base_cell b ON s.id = b.id",
    "task cells": "SELECT b.name, t.max_score FROM task_cells t JOIN base_cell b ON t.id = b.id",
    "source cells": "SELECT name, cell_type, locked, source, checksum FROM source_cell",
}


def _files(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def _gradebook(course):
    with sqlite3.connect(course / "gradebook.db") as db:
        return {what: sorted(map(repr, db.execute(query).fetchall()))
                for what, query in QUERIES.items()}


def test_a_copied_release_is_what_nbgrader_writes_and_two_askers_build_it_once(
        tmp_path, monkeypatch):
    monkeypatch.setattr(releases, "CACHE_ROOT", tmp_path / "cache")
    (tmp_path / "cache").mkdir()
    before = len(releases.BUILDS)
    folders = []
    askers = [threading.Thread(target=lambda: folders.append(releases.cached_course("fixture")))
              for _ in range(2)]
    for asker in askers:
        asker.start()
    for asker in askers:
        asker.join()
    assert len(folders) == 2 and folders[0] == folders[1]
    assert [name for name, _ in releases.BUILDS[before:]] == ["fixture"]

    copied, generated = tmp_path / "copied", tmp_path / "generated"
    for course in (copied, generated):
        shutil.copytree(FIXTURE, course)
    assert releases.copy_releases(copied, [LAB])
    assert len(releases.BUILDS) == before + 1                   # the cache, not a new build
    run_nbgrader(generated, "generate_assignment", LAB, "--force")
    assert _files(copied / "release") == _files(generated / "release")
    assert _gradebook(copied) == _gradebook(generated)
    assert _gradebook(copied)["grade cells"]                    # the comparison saw the cells


def test_a_course_gets_its_own_labs_only_and_its_own_copy(tmp_path):
    labs = ["lab00_the_idea", "lab03_the_machine"]
    first = make_course(tmp_path / "first", labs)
    second = make_course(tmp_path / "second", labs[:1])
    assert releases.refusal(first, labs) is None, releases.refusal(first, labs)
    assert releases.copy_releases(first, labs)
    assert releases.copy_releases(second, labs[:1])
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{first / 'gradebook.db'}", "msda-triton") as gradebook:
        assert sorted(a.name for a in gradebook.assignments) == labs
    with Gradebook(f"sqlite:///{second / 'gradebook.db'}", "msda-triton") as gradebook:
        assert [a.name for a in gradebook.assignments] == labs[:1]
    assert sorted(p.name for p in (first / "release").iterdir()) == labs
    # a course that changes its copy changes nobody else's
    released = first / "release" / labs[0] / f"{labs[0]}.ipynb"
    nb = nbformat.read(released, as_version=4)
    nb.cells.append(nbformat.v4.new_markdown_cell("changed"))
    nbformat.write(nb, released)
    other = nbformat.read(second / "release" / labs[0] / f"{labs[0]}.ipynb", as_version=4)
    assert other.cells[-1].source != "changed"


@pytest.mark.parametrize("change", ["lab", "config", "gradebook", "outside a run"])
def test_a_course_nbgrader_would_see_differently_is_left_to_it(tmp_path, monkeypatch, change):
    course = tmp_path / "course"
    shutil.copytree(FIXTURE, course)
    if change == "lab":
        (course / "assignments" / LAB / "notes.txt").write_text("a file the origin lacks\n")
    elif change == "config":
        config = course / "nbgrader_config.py"
        config.write_text("c = get_config()  # noqa: F821\n" + config.read_text())
    elif change == "gradebook":
        (course / "gradebook.db").write_bytes(b"")
    else:
        monkeypatch.setattr(releases, "CACHE_ROOT", None)
    assert not releases.copy_releases(course, [LAB])
    assert not (course / "release").exists()


def test_a_session_run_inside_a_test_keeps_the_runs_cache(tmp_path, monkeypatch):
    """tests/operator_suite.py runs pytest inside a test (lab 10's suite): its session sets
    up and tears down the cache as the run's own does, and must leave the run's cache set
    (it set it to None, and a later test of the same worker found no cache)."""
    monkeypatch.setattr(releases, "CACHE_ROOT", None)
    outer, inner = tmp_path / "run", tmp_path / "nested"
    with releases.cache_for_run(outer) as root:
        assert root == releases.CACHE_ROOT == outer
        with releases.cache_for_run(inner) as nested:
            assert nested == outer
        assert releases.CACHE_ROOT == outer
    assert releases.CACHE_ROOT is None
