"""How ``make test`` spreads the suite over two workers (tests/conftest.py): which tests
share a unit of work (one worker, module-scoped fixtures built once) and which start first."""
from __future__ import annotations

import conftest

CORPUS_TEST = "tests/test_similarity.py::test_every_corpus_answer_passes_the_labs_checks"
RANK = {name: i for i, name in enumerate(conftest.LONGEST_FIRST)}


def test_a_module_is_one_unit():
    assert conftest.unit_of_work("tests/test_grading.py::test_a[x]") == "tests/test_grading.py"


def test_the_book_modules_share_one_unit():
    units = {conftest.unit_of_work(f"tests/{name}::test_x") for name in conftest.SHARED_UNITS}
    assert units == {"book"}


def test_similarity_splits_by_lab_and_its_corpus_answers_by_answer():
    by_lab = conftest.unit_of_work("tests/test_similarity.py::test_listed[lab05_forward_correct]")
    assert by_lab == "tests/test_similarity.py[lab05_forward_correct]"
    answers = [f"{CORPUS_TEST}[lab08_concurrent_writes/lab08_backward_kernel/{n}]"
               for n in ("honest_helpers", "copy_shared_a")]
    assert [conftest.unit_of_work(a) for a in answers] == answers


def test_lab08s_corpus_answers_start_before_the_short_modules():
    lab08 = conftest._rank(f"{CORPUS_TEST}[lab08_concurrent_writes/g/a]", RANK)
    lab05 = conftest._rank(f"{CORPUS_TEST}[lab05_forward_correct/g/a]", RANK)
    assert lab08 < conftest._rank("tests/test_cheats.py::test_x", RANK)
    assert lab05 == conftest._rank("tests/test_similarity.py::test_x", RANK) > lab08
    assert conftest._rank("tests/test_book.py::test_x", RANK) == 0
    assert conftest._rank("tests/test_unlisted.py::test_x", RANK) == len(RANK)
