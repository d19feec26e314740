"""The two chapters a review found sprawling stay at most 60% of the prose they had then.

Chapter 4 (the forward kernel) had 5,282 words of prose and chapter 6 (measuring) 5,823, as
this test counts them (word characters in the markdown cells, glue roles included): the
reference tables went to the measurements page and repeated method notes were folded into
one. A chapter that grows back past the limit fails here, so that it is cut again or the
limit is raised on purpose.
"""
from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

CHAPTERS = Path(__file__).resolve().parents[1] / "book" / "chapters"
WORDS_AT_REVIEW = {"ch04_the_forward_kernel": 5282, "ch06_measuring": 5823}
SHARE = 0.60


def prose_words(notebook: Path) -> int:
    nb = nbformat.read(notebook, as_version=4)
    return sum(len(re.findall(r"\w+", c.source)) for c in nb.cells if c.cell_type == "markdown")


@pytest.mark.parametrize("chapter", sorted(WORDS_AT_REVIEW))
def test_chapter_prose_is_at_most_sixty_percent_of_the_reviewed_length(chapter):
    words = prose_words(CHAPTERS / f"{chapter}.ipynb")
    limit = SHARE * WORDS_AT_REVIEW[chapter]
    assert words <= limit, (f"{chapter} has {words} words of prose, over {limit:.0f} "
                            f"({SHARE:.0%} of {WORDS_AT_REVIEW[chapter]})")


def test_the_count_sees_markdown_only(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("one two, three."),
                                         nbformat.v4.new_code_cell("x = 1  # four five")])
    path = tmp_path / "c.ipynb"
    nbformat.write(nb, path)
    assert prose_words(path) == 3
