"""The course book: built once with the literal command, then every page is checked.

A fixture shared by all tests runs the README's quick-start book command (``make book``, which
runs ``jupyter-book build book`` from the repository root), which writes ``_build/html``; on a
fresh clone that is a cold build with every chapter executed. The checks then read the built site:

- every page of the table of contents exists, and chapters 1-4, 6 and 7 have their figures;
- every figure a chapter draws reads at the book's width: no two text labels overlap, and
  its smallest text is at least 7 pt as drawn in the page's column (book/_figures.py
  measures each figure as the build draws it);
- every <img> names a file that exists and is not empty;
- no page shows an error: no traceback, no stderr output, no error output cell;
- no page shows the solution of a graded lab cell (see ``_shown`` for what counts);
- no page loads a script, stylesheet or font from another site (ordinary links are fine);
- every relative link points at a file of the site;
- the labs page names notebooks that exist.

Two tiny extra builds check that the configuration itself makes the literal command strict
(a broken reference, a failing cell), and a rebuild with no change checks the execution cache.
"""
from __future__ import annotations

import html
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "_build" / "html"
BIN = Path(sys.executable).parent
BUILD_TIMEOUT_S = 900

# (page, minimum number of figures)
FIGURES = {
    "chapters/ch01_the_operator.html": 4,
    "chapters/ch02_the_machine.html": 2,
    "chapters/ch03_triton.html": 0,
    "chapters/ch04_the_forward_kernel.html": 2,
    "chapters/ch06_measuring.html": 5,
    "chapters/ch07_shipping.html": 1,
}


def _env() -> dict:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


def _jupyter_book(cwd: Path, *options: str) -> subprocess.CompletedProcess:
    """The literal build command (plus ``options``), run in ``cwd``."""
    exe = BIN / "jupyter-book"
    command = [str(exe) if exe.exists() else "jupyter-book", "build", *options, "book"]
    return subprocess.run(command, cwd=cwd, env=_env(), capture_output=True, text=True,
                          timeout=BUILD_TIMEOUT_S)


def _toc_pages() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    pages = [toc["root"]]
    for part in toc.get("parts", []):
        pages += [entry["file"] for entry in part["chapters"]]
    return pages


def _readme_book_command() -> list[str]:
    """The README's quick-start command that builds the book (scripts/quickstart.py), as
    written.  Where the tests run from a virtual environment other than the .venv that
    `make` creates, `make` is pointed at the running one and told not to set it up."""
    import quickstart                       # scripts/quickstart.py
    command = shlex.split(quickstart.commands()["book"])
    prefix = Path(sys.prefix)
    if command[0] == "make" and prefix != ROOT / ".venv":
        command += [f"VENV={prefix}", "-o", str(prefix / ".installed")]
    return command


@pytest.fixture(scope="session")
def built_book():
    command = _readme_book_command()
    started = time.perf_counter()
    result = subprocess.run(command, cwd=ROOT, env=_env(), capture_output=True, text=True,
                            timeout=BUILD_TIMEOUT_S)
    seconds = time.perf_counter() - started
    output = result.stdout + result.stderr
    assert result.returncode == 0, (
        f"`{' '.join(command)}` failed with status {result.returncode}:\n"
        + output[-6000:])
    return {"output": output, "seconds": seconds}


@pytest.fixture(scope="session")
def pages(built_book) -> dict[str, str]:
    """Every built page except Sphinx's own (search, genindex), by relative path."""
    found = {}
    for path in sorted(HTML.rglob("*.html")):
        rel = path.relative_to(HTML).as_posix()
        if rel.startswith(("_static/", "_sources/")) or rel in ("search.html",
                                                                  "genindex.html"):
            continue
        found[rel] = path.read_text(encoding="utf-8")
    return found


class _Tags(HTMLParser):
    """Collects (tag, attributes) of every start tag."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, {k: (v or "") for k, v in attrs}))


def _tags(page_html: str) -> list[tuple[str, dict]]:
    parser = _Tags()
    parser.feed(page_html)
    return parser.tags


def _text(page_html: str) -> str:
    """The visible text of a page, whitespace collapsed (code blocks keep their tokens)."""
    page_html = re.sub(r"(?is)<(script|style)\b.*?</\1>", " ", page_html)
    text = html.unescape(re.sub(r"(?s)<[^>]+>", "", page_html))
    return " ".join(text.split())


def _is_remote(url: str) -> bool:
    return url.startswith(("http://", "https://", "//"))


# ---------------------------------------------------------------------------------------
# the main build


def test_every_toc_page_is_built(built_book):
    missing = [page for page in _toc_pages() if not (HTML / f"{page}.html").is_file()]
    assert not missing, f"pages of _toc.yml missing from _build/html: {missing}"


def test_chapters_have_their_figures(pages):
    for page, minimum in FIGURES.items():
        images = [a for tag, a in _tags(pages[page]) if tag == "img"]
        assert len(images) >= minimum, (
            f"{page}: {len(images)} <img> found, expected at least {minimum}")


def test_every_image_exists_and_is_not_empty(pages):
    problems = []
    for rel, page_html in pages.items():
        for tag, attrs in _tags(page_html):
            if tag != "img":
                continue
            src = attrs.get("src", "")
            if _is_remote(src) or src.startswith("data:"):
                problems.append(f"{rel}: image not served by the site: {src[:80]}")
                continue
            target = (HTML / rel).parent / unquote(urlsplit(src).path)
            if not target.is_file() or target.stat().st_size == 0:
                problems.append(f"{rel}: missing or empty image {src}")
    assert not problems, "\n".join(problems)


def test_no_page_shows_an_error(pages):
    problems = []
    for rel, page_html in pages.items():
        for marker in ("Traceback (most recent call last)", 'class="output traceback"',
                       'class="output stderr"', "output_error", "Executing notebook failed"):
            if marker in page_html:
                problems.append(f"{rel}: contains {marker!r}")
        for tag, attrs in _tags(page_html):
            classes = attrs.get("class", "").split()
            if tag == "div" and "output" in classes and (
                    "stderr" in classes or "traceback" in classes or "error" in classes):
                problems.append(f"{rel}: an error/stderr output cell ({attrs['class']})")
    assert not problems, "\n".join(problems)


def _solution_regions() -> list[tuple[str, list[str]]]:
    """(where, non-trivial lines) of every solution region of every lab code cell: the lines
    between ``### BEGIN SOLUTION`` and ``### END SOLUTION``, whitespace collapsed."""
    regions = []
    for notebook in sorted((ROOT / "assignments").glob("**/*.ipynb")):
        if ".ipynb_checkpoints" in notebook.parts:
            continue
        cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
        for number, cell in enumerate(cells):
            if cell.get("cell_type") != "code":
                continue
            source = cell["source"]
            source = "".join(source) if isinstance(source, list) else source
            grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id", number)
            where = f"{notebook.relative_to(ROOT).as_posix()} cell {grade_id}"
            lines, inside = [], False
            for line in source.splitlines():
                marker = line.strip()
                if marker.startswith("### BEGIN SOLUTION"):
                    inside, lines = True, []
                elif marker.startswith("### END SOLUTION"):
                    inside = False
                    if lines:
                        regions.append((where, lines))
                elif inside and _non_trivial(line):
                    lines.append(" ".join(line.split()))
    return regions


# Lines any kernel or spec of this operator starts with: unpacking a shape, naming the
# program id or an index block.  They are vocabulary, not a solution.
_BOILERPLATE = (
    re.compile(r"^[\w\s,]+=\s*[\w.]+\.shape$"),                   # b, q, m = x.shape
    re.compile(r"^\w+\s*=\s*tl\.(arange|program_id)\([^()]*\)$"),  # offs = tl.arange(0, N)
)


def _non_trivial(line: str) -> bool:
    """A solution line worth hiding: code of at least 24 non-blank characters that is not a
    comment, an import, a docstring delimiter or boilerplate (see _BOILERPLATE)."""
    stripped = line.strip()
    if not stripped or stripped.startswith(("#", "import ", "from ", '"""', "'''")):
        return False
    code = stripped.split("  #")[0].strip()
    if any(pattern.match(code) for pattern in _BOILERPLATE):
        return False
    return len("".join(code.split())) >= 24


def _shown(lines: list[str], text: str) -> str | None:
    """Why ``text`` shows this solution region, or None.

    A short region (three non-trivial lines or fewer) is the whole answer: any one of its
    lines counts.  A longer one counts as shown when three of its consecutive lines appear
    together, in order, or when a third or more of its lines appear anywhere.  The looser
    rule for long regions is deliberate: chapter 4 prints the course's own forward kernel,
    and a kernel written in a lab shares single scaffolding lines with it (the loop headers
    over levels and points, the accumulator, the final store) without being shown.
    """
    hits = [line for line in lines if line in text]
    if len(lines) <= 3:
        return f"line {hits[0]!r}" if hits else None
    for i in range(len(lines) - 2):
        if " ".join(lines[i:i + 3]) in text:
            return f"three consecutive lines from {lines[i]!r}"
    if 3 * len(hits) >= len(lines):
        return f"{len(hits)} of its {len(lines)} lines, such as {hits[0]!r}"
    return None


def test_no_page_contains_a_lab_solution(pages):
    regions = _solution_regions()
    assert regions, "no solution regions found under assignments/: nothing was checked"
    texts = {rel: _text(page_html) for rel, page_html in pages.items()}
    leaks = []
    for where, lines in regions:
        for rel, text in texts.items():
            reason = _shown(lines, text)
            if reason:
                leaks.append(f"{rel} shows the solution of {where}: {reason}")
    assert not leaks, "\n".join(leaks)


def test_the_solution_check_catches_a_printed_solution():
    # the check above must fail a page that prints any region, so try it on every one
    regions = _solution_regions()
    assert regions
    for where, lines in regions:
        page = "<pre>" + html.escape("\n".join(lines)) + "</pre>"
        assert _shown(lines, _text(page)), f"a printed copy of {where} is not detected"


def test_no_page_loads_anything_from_another_site(pages):
    problems = []
    fetched = {"script": "src", "img": "src", "iframe": "src", "source": "src",
               "audio": "src", "video": "src", "embed": "src", "object": "data"}
    for rel, page_html in pages.items():
        for tag, attrs in _tags(page_html):
            url = attrs.get(fetched.get(tag, ""), "")
            if tag == "link":
                rel_attr = attrs.get("rel", "").lower()
                if any(k in rel_attr for k in ("stylesheet", "preload", "icon", "manifest",
                                                "modulepreload")):
                    url = attrs.get("href", "")
            if url and _is_remote(url):
                problems.append(f"{rel}: <{tag}> fetches {url}")
    for css in HTML.glob("_static/**/*.css"):
        for url in re.findall(r"url\(\s*['\"]?((?:https?:)?//[^'\")]+)",
                              css.read_text(encoding="utf-8", errors="replace")):
            problems.append(f"{css.relative_to(HTML)}: fetches {url}")
    assert not problems, "\n".join(problems)


def test_math_is_served_by_the_site(pages):
    mathjax = [attrs["src"] for rel, page_html in pages.items()
               for tag, attrs in _tags(page_html)
               if tag == "script" and "mathjax" in attrs.get("src", "").lower()]
    assert mathjax, "no page loads MathJax, but the chapters have math"
    for src in set(mathjax):
        assert not _is_remote(src), src
    script = HTML / "_static" / "mathjax" / "es5" / "tex-mml-chtml.js"
    fonts = list((HTML / "_static" / "mathjax" / "es5" / "output" / "chtml" / "fonts" /
                  "woff-v2").glob("*.woff"))
    assert script.stat().st_size > 100_000 and len(fonts) > 10


def test_relative_links_resolve(pages):
    broken = []
    for rel, page_html in pages.items():
        for tag, attrs in _tags(page_html):
            if tag != "a" or "href" not in attrs:
                continue
            href = attrs["href"]
            if not href or href.startswith(("#", "mailto:", "javascript:")) or \
                    _is_remote(href):
                continue
            target = (HTML / rel).parent / unquote(urlsplit(href).path)
            if not target.exists():
                broken.append(f"{rel}: {href}")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_labs_page_names_existing_notebooks(pages):
    # the page names each lab's folder; its notebook is assignments/<folder>/<folder>.ipynb
    # (names of results files, such as lab06_tiling.json, are not folders)
    folders = sorted(set(re.findall(r"\blab\d\d_[a-z_]*[a-z]\b(?!\.json)",
                                    _text(pages["labs.html"]))))
    assert len(folders) == 11, f"expected the 11 labs on the labs page, found {folders}"
    named = [f"assignments/{folder}/{folder}.ipynb" for folder in folders]
    missing = [path for path in named if not (ROOT / path).is_file()]
    assert not missing, f"the labs page names notebooks that do not exist: {missing}"


def test_labs_page_states_the_points_each_lab_grades():
    # a row of book/labs.md that says "N points" must say what the notebook's graded cells sum
    # to, and its visible and hidden shares (needs no build: it reads the page's source)
    import nbformat

    stated = 0
    for line in (ROOT / "book" / "labs.md").read_text().splitlines():
        folder = re.search(r"`(lab\d\d_[a-z_]+)`", line)
        points = re.search(r"(\d+) points \((\d+) visible checks of 1 point, (\d+) points of "
                           r"hidden ones\)", line)
        if not (folder and points):
            continue
        name = folder.group(1)
        notebook = nbformat.read(ROOT / "assignments" / name / f"{name}.ipynb", as_version=4)
        graded = [c for c in notebook.cells if c.metadata.get("nbgrader", {}).get("grade")]
        hidden = [c for c in graded if "### BEGIN HIDDEN TESTS" in c.source]
        visible = [c for c in graded if c not in hidden]
        assert all(c.metadata["nbgrader"]["points"] == 1 for c in visible), name
        total = sum(c.metadata["nbgrader"]["points"] for c in graded)
        assert (int(points.group(1)), int(points.group(2)), int(points.group(3))) == (
            total, len(visible), sum(c.metadata["nbgrader"]["points"] for c in hidden)), name
        stated += 1
    assert stated >= 1, "no lab row of book/labs.md states its points"


def test_a_rebuild_with_no_change_executes_nothing(built_book):
    # --all re-reads every page, so every notebook must come from the execution cache
    result = _jupyter_book(ROOT, "--all")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "Executing notebook" not in output, (
        "a rebuild with no change executed a notebook again: the cache is not used")
    assert "Using cached notebook" in output


# ---------------------------------------------------------------------------------------
# figures: every figure a chapter draws reads at the book's width

CACHE = ROOT / "_build" / ".jupyter_cache"   # the build's execution cache (execute: cache)
COLUMN_PX = 688          # width of a figure in the page's column, 1280 x 900 window (Chromium)
PX_PER_INCH = {"image/svg+xml": 96, "image/png": 100}   # SVG in pt at CSS's 96 px per inch
MIN_FONT_PT = 7.0        # the smallest text of a figure, as drawn in that column
AUDIT_KEY = "course_figure"                        # book/_figures.py writes it

# Figures known not to read at the book's width, (page, first title) -> what is wrong with
# them.  The test fails when one of them is fixed (then remove it here) or is gone.
KNOWN_UNREADABLE: dict[tuple[str, str], str] = {}


def _figure_outputs():
    """(page, code cell number, mime type, audit record or None) of every figure output of
    the chapters, as the build executed them (read from its execution cache)."""
    import nbformat
    from jupyter_cache import get_cache

    cache = get_cache(str(CACHE))
    for page in _toc_pages():
        source = ROOT / "book" / f"{page}.ipynb"
        if not source.is_file():
            continue
        record = cache.match_cache_notebook(nbformat.read(source, as_version=4))
        executed = cache.get_cache_bundle(record.pk).nb
        for number, cell in enumerate(executed.cells):
            for output in cell.get("outputs", []):
                for mime in PX_PER_INCH:
                    if mime in output.get("data", {}):
                        audit = output.get("metadata", {}).get(mime, {}).get(AUDIT_KEY)
                        yield page, number, mime, audit


def _unreadable(mime: str, audit: dict) -> list[str]:
    """What keeps a figure from reading at the book's width (nothing when it reads)."""
    if "error" in audit:
        return [f"its audit failed: {audit['error']}"]
    problems = [f"labels overlap: {a!r} and {b!r}" for a, b in audit["overlaps"]]
    drawn_px = audit["width_in"] * PX_PER_INCH[mime]
    shown_pt = (audit["min_font_pt"] or MIN_FONT_PT) * min(1.0, COLUMN_PX / drawn_px)
    if shown_pt < MIN_FONT_PT - 0.05:
        problems.append(f"{audit['width_in']:.1f} in wide, so its {audit['min_font_pt']} pt "
                        f"text is drawn at {shown_pt:.1f} pt in the {COLUMN_PX} px column")
    return problems


def test_every_figure_reads_at_the_books_width(built_book):
    figures = list(_figure_outputs())
    assert len(figures) >= sum(FIGURES.values()), f"only {len(figures)} figures found"
    problems, known_seen = [], set()
    for page, number, mime, audit in figures:
        where = f"{page} code cell {number}"
        if audit is None:
            problems.append(f"{where}: drawn without the course's figure style "
                            "(book/_figures.use_course_style), so it was not measured")
            continue
        title = (audit.get("titles") or [""])[0]
        found = _unreadable(mime, audit)
        if (page, title) in KNOWN_UNREADABLE:
            known_seen.add((page, title))
            if not found:
                problems.append(f"{where} ({title!r}) reads well now: remove it from "
                                "KNOWN_UNREADABLE")
            continue
        problems += [f"{where} ({title!r}): {problem}" for problem in found]
    problems += [f"{page}: no figure titled {title!r} any more: remove it from "
                 "KNOWN_UNREADABLE" for page, title in set(KNOWN_UNREADABLE) - known_seen]
    assert not problems, "\n".join(problems)


def test_the_figure_check_finds_overlaps_and_small_text():
    crowded = {"titles": ["t"], "width_in": 7.0, "height_in": 3.0, "min_font_pt": 9.0,
               "labels": 4, "overlaps": [["decoder-b32", "encoder"]]}
    wide = {**crowded, "width_in": 10.0, "overlaps": []}
    fine = {**crowded, "overlaps": []}
    assert "overlap" in _unreadable("image/svg+xml", crowded)[0]
    assert "6.5 pt" in _unreadable("image/svg+xml", wide)[0]
    assert _unreadable("image/svg+xml", fine) == []


def test_the_figure_audit_sees_what_it_should():
    # the audit itself, on figures drawn here: crowded tick labels, and a clean plot
    import matplotlib
    matplotlib.use("agg")
    import matplotlib.pyplot as plt
    import _figures                         # book/_figures.py
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.set_xticks(range(6), [f"decoder-b32, bf16 {i}" for i in range(6)])
    crowded = _figures.audit_figure(fig)
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([1, 2])
    ax.set_title("clean")
    clean = _figures.audit_figure(fig)
    plt.close("all")
    assert crowded["overlaps"] and not clean["overlaps"]
    assert clean["titles"] == ["clean"] and 2.5 <= clean["width_in"] <= 3.5


# ---------------------------------------------------------------------------------------
# the configuration makes the literal command strict (two tiny books, same _config.yml)


def _tiny_book(tmp_path: Path, page_name: str, page_text: str) -> Path:
    (tmp_path / "book").mkdir()
    shutil.copy(ROOT / "_config.yml", tmp_path / "_config.yml")
    shutil.copytree(ROOT / "book" / "_ext", tmp_path / "book" / "_ext")
    (tmp_path / "book" / "_vendor").symlink_to(ROOT / "book" / "_vendor")
    shutil.copy(ROOT / "book" / "references.bib", tmp_path / "book" / "references.bib")
    (tmp_path / "book" / "_toc.yml").write_text(
        f"format: jb-book\nroot: index\nchapters:\n  - file: {page_name.split('.')[0]}\n")
    (tmp_path / "book" / "index.md").write_text("# Tiny\n\nA page.\n")
    (tmp_path / "book" / page_name).write_text(page_text)
    return tmp_path


def test_a_broken_reference_fails_the_plain_build(tmp_path):
    book = _tiny_book(tmp_path, "page.md",
                      "# Page\n\nSee {ref}`a-label-that-does-not-exist`.\n")
    result = _jupyter_book(book)
    output = result.stdout + result.stderr
    assert result.returncode != 0, "a broken reference did not fail the build:\n" + output
    assert "a-label-that-does-not-exist" in output
    # and the same build run again, with nothing changed, must not pass either
    again = _jupyter_book(book)
    assert again.returncode != 0, "the second build after a failed one passed:\n" + (
        again.stdout + again.stderr)[-3000:]


def test_a_failing_cell_fails_the_plain_build(tmp_path):
    notebook = {
        "cells": [
            {"cell_type": "markdown", "id": "title", "metadata": {}, "source": "# Page"},
            {"cell_type": "code", "id": "boom", "metadata": {}, "execution_count": None,
             "outputs": [], "source": "raise ValueError('this cell fails on purpose')"},
        ],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                    "language": "python"}},
        "nbformat": 4, "nbformat_minor": 5,
    }
    book = _tiny_book(tmp_path, "page.ipynb", json.dumps(notebook))
    result = _jupyter_book(book)
    output = result.stdout + result.stderr
    assert result.returncode != 0, "a failing cell did not fail the build:\n" + output
    assert "this cell fails on purpose" in output or "ExecutionError" in output
