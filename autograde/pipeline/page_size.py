"""A feedback page that carries what it shows and no more: maths as MathML, CSS pruned.

nbgrader's exchange moves a single ``.html`` file per feedback, so the page must work alone,
offline.  Carrying MathJax inside every page made each one about 2.6 MB (2.3 MB of it MathJax,
240 KB of JupyterLab's stylesheet), some 14 GB for a class of 500 over eleven labs.  Instead:

- every formula of the markdown cells is turned into MathML when the page is written
  (``latex2mathml``), which current browsers lay out natively (MathML Core), so the page runs
  no script at all;
- JupyterLab's stylesheet keeps only the rules whose class names occur in the page.
"""
from __future__ import annotations

import html
import re
from pathlib import Path

from latex2mathml.converter import convert as _tex_to_mathml

__all__ = ["math_to_tokens", "put_back_math", "prune_css", "LAB_CSS"]

# JupyterLab's stylesheet as nbconvert's lab template inlines it
LAB_CSS = "static/index.css"

# fenced code, inline code (never maths), then the four math delimiters MathJax reads here
_CODE = re.compile(r"(```.*?```|~~~.*?~~~|`[^`\n]*`)", re.S)
_MATH = re.compile(
    r"\$\$(?P<dd>.+?)\$\$"                       # $$ display $$
    r"|\\\[(?P<bd>.+?)\\\]"                      # \[ display \]
    # $inline$ (one paragraph: single line breaks allowed), never "costs $5 and $6"
    r"|(?<![\\$\w])\$(?P<di>[^$\s](?:(?:[^$\n]|\n(?!\s*\n))*?[^$\s\\])?)\$(?!\w)"
    r"|\\\((?P<bi>.+?)\\\)", re.S)               # \( inline \)
_TOKEN = "agmath{:06d}x"


def _mathml(tex: str, display: bool) -> str:
    try:
        markup = _tex_to_mathml(tex.strip(), display="block" if display else "inline")
    except Exception:  # noqa: BLE001  (TeX this converter cannot read: show the source)
        return f'<code class="ag-tex">{html.escape(tex)}</code>'
    # what a reader copies, and what a screen reader can fall back on
    return markup.replace("<math ", f'<math alttext="{html.escape(tex.strip(), quote=True)}" ', 1)


def math_to_tokens(source: str, table: dict) -> str:
    """``source`` (markdown) with every formula replaced by a token that markdown leaves
    alone; ``table`` maps each token to the formula's MathML."""
    parts = _CODE.split(source)
    for i in range(0, len(parts), 2):                   # the even parts are not code
        def swap(match):
            display = match.group("dd") is not None or match.group("bd") is not None
            tex = next(g for g in match.groups() if g is not None)
            token = _TOKEN.format(len(table))
            table[token] = _mathml(tex, display)
            return token
        parts[i] = _MATH.sub(swap, parts[i])
    return "".join(parts)


def put_back_math(page: str, table: dict) -> str:
    """The written page with each token replaced by its MathML."""
    if not table:
        return page
    pattern = re.compile("|".join(re.escape(t) for t in sorted(table, key=len, reverse=True)))
    return pattern.sub(lambda m: table[m.group(0)], page)


# --------------------------------------------------------------------------- stylesheet
_CLASS_ATTR = re.compile(r'\bclass="([^"]*)"')
_SELECTOR_CLASS = re.compile(r"\.(-?[_a-zA-Z][\w-]*)")
_COMMENT = re.compile(r"/\*.*?\*/", re.S)


def _classes(page: str) -> set:
    found = set()
    for value in _CLASS_ATTR.findall(page):
        found.update(value.split())
    return found


def _rules(css: str):
    """(prelude, body) of each top-level rule; a body of an at-rule block is its inner CSS."""
    i, n = 0, len(css)
    while i < n:
        brace = css.find("{", i)
        semi = css.find(";", i)
        if brace < 0:
            return
        if 0 <= semi < brace and css[i:semi].strip().startswith("@"):     # @import, @charset
            yield css[i:semi].strip(), None
            i = semi + 1
            continue
        depth, j = 1, brace + 1
        while j < n and depth:
            depth += {"{": 1, "}": -1}.get(css[j], 0)
            j += 1
        yield css[i:brace].strip(), css[brace + 1:j - 1]
        i = j


def _keep(selector_list: str, classes: set) -> bool:
    """A rule applies here when one of its selectors names only classes the page has."""
    for selector in selector_list.split(","):
        names = _SELECTOR_CLASS.findall(selector)
        if all(name in classes for name in names):
            return True
    return False


def _prune(css: str, classes: set) -> str:
    kept = []
    for prelude, body in _rules(css):
        if body is None:
            kept.append(prelude + ";")
        elif prelude.startswith(("@media", "@supports", "@layer")):
            inner = _prune(body, classes)
            if inner.strip():
                kept.append(f"{prelude}{{{inner}}}")
        elif prelude.startswith("@"):                  # @keyframes, @font-face, @page
            kept.append(f"{prelude}{{{body}}}")
        elif _keep(prelude, classes):
            kept.append(f"{prelude}{{{body.strip()}}}")
    return "\n".join(kept)


def prune_css(page: str, stylesheet: str) -> str:
    """``page`` with the inlined ``stylesheet`` cut to the rules its classes use (a rule of
    custom properties on ``:root`` has no class and is kept)."""
    if stylesheet not in page:
        return page
    pruned = _prune(_COMMENT.sub("", stylesheet), _classes(page))
    return page.replace(stylesheet, pruned, 1)


def lab_stylesheet(template_paths) -> str | None:
    """The text of JupyterLab's stylesheet from the first template folder that has it."""
    for folder in template_paths:
        path = Path(folder) / "lab" / LAB_CSS
        if path.is_file():
            return path.read_text(encoding="utf-8")
    return None
