"""How ``make test`` spreads the suite over its workers (tests/conftest.py): which tests
share a unit of work (one worker, module-scoped fixtures built once) and which start first."""
from __future__ import annotations

import types

import conftest

CORPUS_TEST = "tests/test_similarity.py::test_every_corpus_answer_passes_the_labs_checks"
RANK = {name: i for i, name in enumerate(conftest.LONGEST_FIRST)}


def test_a_module_is_one_unit():
    assert conftest.unit_of_work("tests/test_grading.py::test_a[x]") == "tests/test_grading.py"


def test_the_book_modules_share_one_unit_and_the_hub_modules_another():
    units = {name: conftest.unit_of_work(f"tests/{name}::test_x")
             for name in conftest.SHARED_UNITS}
    assert {n for n, unit in units.items() if unit == "book"} == \
        {"test_book.py", "test_browser.py", "test_book_results.py"}
    assert {n for n, unit in units.items() if unit == "hub"} == \
        {"test_hub.py", "test_hub_attacks.py", "test_hub_bad_input.py"}


def test_similarity_splits_by_lab_and_its_corpus_answers_by_answer():
    by_lab = conftest.unit_of_work("tests/test_similarity.py::test_listed[lab05_forward_correct]")
    assert by_lab == "tests/test_similarity.py[lab05_forward_correct]"
    answers = [f"{CORPUS_TEST}[lab08_concurrent_writes/lab08_backward_kernel/{n}]"
               for n in ("honest_helpers", "copy_shared_a")]
    assert [conftest.unit_of_work(a) for a in answers] == answers


def test_the_hub_unit_starts_first_and_lab08s_corpus_answers_before_the_other_labs():
    lab08 = conftest._rank(f"{CORPUS_TEST}[lab08_concurrent_writes/g/a]", RANK)
    lab05 = conftest._rank(f"{CORPUS_TEST}[lab05_forward_correct/g/a]", RANK)
    assert lab05 == conftest._rank("tests/test_similarity.py::test_x", RANK) > lab08
    assert conftest._rank("tests/test_hub.py::test_x", RANK) == 0
    assert conftest._rank("tests/test_book.py::test_x", RANK) < \
        conftest._rank("tests/test_grading.py::test_x", RANK)
    assert conftest._rank("tests/test_unlisted.py::test_x", RANK) == len(RANK)


class _Worker:
    """What the scheduler uses of a pytest-xdist worker: the tests it is sent."""

    def __init__(self, name):
        self.gateway = types.SimpleNamespace(id=name)
        self.shutting_down = False
        self.sent = []

    def send_runtest_some(self, indexes):
        self.sent.append(list(indexes))

    def shutdown(self):
        self.shutting_down = True


def test_the_scheduler_starts_the_units_in_longest_first_order():
    """xdist's own reordering (by number of tests, its default) is off: the first unit each
    worker is sent is the first of LONGEST_FIRST, then the next."""
    collection = ["tests/test_many.py::test_" + str(i) for i in range(50)] + \
        ["tests/test_hub.py::test_class", "tests/test_hub_attacks.py::test_attacks",
         "tests/test_book.py::test_build", "tests/test_grading.py::test_scores"]
    rank = {name: i for i, name in enumerate(conftest.LONGEST_FIRST)}
    collection.sort(key=lambda nodeid: conftest._rank(nodeid, rank))
    option = types.SimpleNamespace(loadscopereorder=True, dist="loadscope", numprocesses=2,
                                   tx=["2*popen"], maxworkerrestart=None)
    config = types.SimpleNamespace(option=option, getvalue=lambda name: getattr(option, name),
                                   getoption=lambda name: getattr(option, name))
    scheduler = conftest.pytest_xdist_make_scheduler(config, None)
    workers = [_Worker("gw0"), _Worker("gw1")]
    for worker in workers:
        scheduler.add_node(worker)
    for worker in workers:
        scheduler.add_node_collection(worker, collection)
    scheduler.schedule()
    first = [[collection[i] for i in worker.sent[0]] for worker in workers]
    assert first[0] == ["tests/test_hub.py::test_class", "tests/test_hub_attacks.py::test_attacks"]
    assert first[1] == ["tests/test_book.py::test_build"]
