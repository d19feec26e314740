"""autograde.pipeline.page_size: formulas become MathML, code and prices stay as they are, and the
stylesheet keeps exactly the rules a page can use."""
from __future__ import annotations

import pytest

from autograde.pipeline.page_size import math_to_tokens, prune_css, put_back_math


@pytest.mark.parametrize("source, formulas", [
    ("the pixel is $x W - 0.5$ here", ["x W - 0.5"]),
    ("a formula over\ntwo lines: $g \\in\n\\mathbb{R}^D$.", ["g \\in\n\\mathbb{R}^D"]),
    ("$$\\sum_k a_k$$ and \\(b\\) and \\[c\\]", ["\\sum_k a_k", "b", "c"]),
    ("it costs $5 and $6 to print", []),                    # prices, not maths
    ("escaped \\$ sign, then $w$", ["w"]),
    ("not in `code $x$` nor\n```\n$y$\n```\nbut $z$", ["z"]),
    ("a paragraph $a\n\nb$ break", []),                       # never across paragraphs
])
def test_formulas_are_found_where_mathjax_would_find_them(source, formulas):
    table = {}
    tokenised = math_to_tokens(source, table)
    alttexts = [markup.split('alttext="', 1)[1].split('"', 1)[0] for markup in table.values()]
    assert alttexts == formulas
    for formula in formulas:                          # gone from the text it was in
        assert formula not in tokenised
    page = put_back_math(tokenised, table)
    assert page.count("<math") == len(formulas)


def test_unreadable_tex_is_shown_as_its_source():
    table = {}
    math_to_tokens("bad $\\frac{1}{$ here $\\unknownmacro{x}$", table)
    for markup in table.values():
        assert markup.startswith(("<math", '<code class="ag-tex">'))
        assert "<script" not in markup


def test_tex_cannot_inject_markup():
    table = {}
    math_to_tokens('$a < b" onload="x$', table)
    (markup,) = table.values()
    assert "onload=\"x" not in markup and "<b" not in markup


def test_the_stylesheet_keeps_the_rules_the_page_uses():
    css = (":root { --jp-x: 1px; }\n.jp-Used { color: red; }\n.jp-Unused { color: blue; }\n"
           ".jp-Used .jp-Unused, .jp-Used > p { margin: 0; }\n"
           "@media print { .jp-Used { display: block; } .jp-Gone { display: none; } }\n"
           "@keyframes spin { from { opacity: 0; } to { opacity: 1; } }\n")
    page = f'<style>{css}</style><div class="jp-Used other"><p>x</p></div>'
    pruned = prune_css(page, css)
    assert ".jp-Unused { color: blue" not in pruned and ".jp-Gone" not in pruned
    for kept in (":root", ".jp-Used{color: red;}", ".jp-Used > p", "@media print",
                 "@keyframes spin"):
        assert kept.replace(" ", "") in pruned.replace(" ", ""), kept
