import os
import re

import pytest
import torch

import source_kernels  # noqa: F401  (sets TRITON_INTERPRET before any kernel is defined)
from support import releases

# What the end-to-end modules do besides unit testing, as markers (pyproject.toml lists them):
#   book     builds the Jupyter Book (or a small book) with jupyter-book
#   browser  drives Debian's Chromium (Playwright)
#   grading  runs the real grading commands (nbgrader autograde, python -m autograde grade,
#            the course hub) on whole notebooks
# `make test-fast` deselects these, `slow` and `gpu`: what is left are the unit tests, which
# need no browser, no grading run and no book build.  A module of end-to-end tests names
# itself here (or sets ``pytestmark``); a new module of unit tests needs nothing.
END_TO_END = {
    "test_book.py": ("book",),
    "test_book_results.py": ("book",),        # executes the measuring chapters
    "test_browser.py": ("book", "browser"),
    "test_cheats.py": ("grading",),
    "test_feedback.py": ("grading", "browser"),
    "test_grading.py": ("grading",),
    "test_grading_isolation.py": ("grading",),
    "test_hub.py": ("grading", "browser"),
    "test_hub_attacks.py": ("grading",),
    "test_hub_bad_input.py": ("grading",),
    "test_integrity_grading.py": ("grading",),
    "test_jupyterlab.py": ("browser", "grading"),
    "test_labs_00_04.py": ("grading",),
    "test_labs_05_10.py": ("grading",),
    "test_release_cache.py": ("grading",),    # runs nbgrader generate_assignment
    "test_as_a_user.py": ("grading",),
}

# Tests of the unit modules that take seconds each on 2 cores (each row's own time, from
# `make test-fast --durations=0`): a lab 08 kernel run in Triton's interpreter per mistake,
# the book's exercise commands, a training run.  They are marked ``slow``: `make test` runs
# them, `make test-fast` leaves them out.
SLOW_UNIT_TESTS = re.compile("|".join((
    r"test_mistakes_backward\.py::test_visible_check_names_the_mistake\[lab08: kernel",   # 3.5 s
    r"test_mistakes_backward\.py::test_solution_passes_the_visible_checks\[lab08",        # 12 s
    r"test_mistakes_backward\.py::test_hidden_check_catches_int32_offsets",                # 4 s
    r"test_mistakes_rest\.py::test_(visible_checks_replay_out_of_the_kernel|"
    r"every_visible_check_passes_on_the_solution)\[lab10\]",                               # 7 s
    r"test_exercises\.py::test_command\[python",                                          # 3.3 s
    r"test_model\.py::test_training_parity_triton_vs_grid_sample",                         # 19 s
)))

# `make test` spreads the modules over the workers (pytest-xdist, ``--dist loadscope``), with
# the scheduler below: each module is one unit of work, so its module-scoped fixtures (a
# release, a graded class) are built once, on one worker; the modules that build or read the
# book's ``_build/html`` form one unit, so that no two of them build it at the same time; the
# three modules that run a hub form one unit too: they spend most of their time waiting on
# servers and a browser, so they run one after another while the other workers (`make test`
# starts three on two cores) keep the cores busy; the tests of tests/test_similarity.py, which
# has no module-scoped fixture, are split by lab, and its corpus answers one unit per answer,
# so that every worker takes them.
# (xdist's own ``loadgroup`` reads ``xdist_group`` marks by rewriting node ids, which pytest 9
# no longer lets a plugin do.)  The units start in the order of LONGEST_FIRST (from the suite's
# timeline on 2 cores, each unit's first and last test): the waiting hub unit first, then the
# longest of the rest, so that the run ends soon after the longest unit does.  xdist would
# otherwise reorder the units by their number of tests (``--loadscope-reorder``, its default),
# which starts a hundred one-second tests before the four-minute ones: the scheduler turns
# that off.
SHARED_UNITS = {"test_book.py": "book", "test_browser.py": "book",
                "test_book_results.py": "book",
                "test_hub.py": "hub", "test_hub_attacks.py": "hub",
                "test_hub_bad_input.py": "hub"}
SPLIT_BY_LAB = {"test_similarity.py"}
SPLIT_BY_TEST = "test_every_corpus_answer_passes_the_labs_checks"
LONGEST_FIRST = ("test_hub.py", "test_hub_attacks.py", "test_hub_bad_input.py",
                 "test_book.py", "test_browser.py", "test_book_results.py", "test_grading.py",
                 "test_labs_05_10.py", "test_cheats.py", "test_grading_isolation.py",
                 "test_labs_00_04.py", "test_mistakes_backward.py", "test_exercises.py",
                 "test_integrity_grading.py", "test_jupyterlab.py", "test_as_a_user.py",
                 "test_similarity.py::test_every_corpus_answer_passes_the_labs_checks[lab08",
                 "test_mistakes_rest.py", "test_feedback.py", "test_similarity.py",
                 "test_operator.py", "test_model.py", "test_results_schemas.py",
                 "test_mistakes_forward.py")
_LAB_PARAMETER = re.compile(r"\[(lab\d\d_[a-z0-9_]+)")


def unit_of_work(nodeid: str) -> str:
    """The unit of work a test belongs to, from its node id."""
    module = nodeid.split("::", 1)[0]
    name = module.rsplit("/", 1)[-1]
    if name in SHARED_UNITS:
        return SHARED_UNITS[name]
    if name in SPLIT_BY_LAB and "::" + SPLIT_BY_TEST in nodeid:
        return nodeid
    lab = _LAB_PARAMETER.search(nodeid) if name in SPLIT_BY_LAB else None
    return f"{module}[{lab.group(1)}]" if lab else module


def _rank(nodeid: str, rank: dict) -> int:
    """The place of a test in LONGEST_FIRST: its module's, or a longer prefix's of its id."""
    module, _, rest = nodeid.partition("::")
    short = module.rsplit("/", 1)[-1] + (f"::{rest}" if rest else "")
    places = [i for prefix, i in rank.items()
              if short.startswith(prefix if "::" in prefix else prefix + "::")
              or short == prefix]
    return min(places, default=len(rank))


def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class CourseUnits(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return unit_of_work(nodeid)

    config.option.loadscopereorder = False          # keep LONGEST_FIRST's order
    return CourseUnits(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        for name in END_TO_END.get(item.path.name, ()):
            item.add_marker(getattr(pytest.mark, name))
        if SLOW_UNIT_TESTS.search(item.nodeid):
            item.add_marker(pytest.mark.slow)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: _rank(item.nodeid, rank))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; this machine has none (the Triton "
                                   "interpreter covers correctness in the CPU tests)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _book_builds_keep_their_temporary_files(request, tmp_path_factory, monkeypatch):
    """A book build that is meant to fail (tests/test_book.py) makes Sphinx save its traceback
    to a ``sphinx-err-*.log`` in the temporary folder: for the tests that build books, that
    folder is one of pytest's (kept for the last few runs, like tmp_path), not the host's /tmp."""
    if request.node.get_closest_marker("book") is not None:
        monkeypatch.setenv("TMPDIR", str(tmp_path_factory.mktemp("tmpdir")))


@pytest.fixture(scope="session", autouse=True)
def _release_cache(tmp_path_factory):
    """Where this run keeps the labs' generated releases (tests/support/releases.py): a folder
    of the run's temporary tree that both pytest-xdist workers see (their own base folders
    sit side by side in it), so a lab's release is generated once per run, by one worker.
    A session run inside a test (tests/operator_suite.py runs pytest in the same process)
    keeps the run's folder and leaves it set when it ends."""
    base = tmp_path_factory.getbasetemp()
    own = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    with releases.cache_for_run(own) as root:
        yield root
