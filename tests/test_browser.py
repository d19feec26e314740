"""The built book in a real browser: headless Chromium, offline, every page of the toc.

The site in ``_build/html`` is served by a plain ``http.server`` on 127.0.0.1 (started and
stopped here) and opened in Debian's Chromium driven by Playwright.  Every page is opened in
a fresh browser context (empty storage and cache, like a reader's first visit), with every
request that is not for the local server aborted and recorded.  Then:

- no page logs a console error or throws an uncaught exception, and no request fails;
- nothing tries to leave the machine;
- every page with math has it typeset by MathJax (each math element holds an
  ``mjx-container`` and no MathJax error);
- every image has loaded (``naturalWidth > 0``);
- every notebook cell that has outputs in the executed notebook (from the build's execution
  cache) shows them on its page;
- the sidebar of the home page links every page of the toc, and following the "next"
  buttons from the home page visits them all, in order;
- screenshots of a few key pages go to ``_build/screenshots/`` for review.

The book is built with the literal ``jupyter-book build book`` when ``_build/html`` is
missing or older than its sources (``tests/test_book.py`` builds it first in a full run).
"""
from __future__ import annotations

import functools
import http.server
import os
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import pytest
import yaml

from support.browser_helpers import Offline, chromium, require_chromium, screenshot_dir

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "_build" / "html"
CACHE = ROOT / "_build" / ".jupyter_cache"
BIN = Path(sys.executable).parent
BUILD_TIMEOUT_S = 900
VIEWPORT = {"width": 1280, "height": 900}
PAGE_TIMEOUT_MS = 30_000

# the chromium's own automatic request; a page that does not name a favicon is not at fault
IMPLICIT_REQUESTS = ("/favicon.ico",)

# screenshots for review: (file name, page, what to scroll to or None for the top)
SCREENSHOTS = [
    ("index.png", "index", None),
    ("ch01_top.png", "chapters/ch01_the_operator", None),
    ("ch01_first_figure.png", "chapters/ch01_the_operator", ".cell_output img"),
    ("ch04_first_equation.png", "chapters/ch04_the_forward_kernel", "div.math"),
    ("labs.png", "labs", None),
]


# ---------------------------------------------------------------------------- the site
def toc_pages() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    pages = [toc["root"]]
    for part in toc.get("parts", []):
        pages += [entry["file"] for entry in part["chapters"]]
    pages += [entry["file"] for entry in toc.get("chapters", [])]
    return pages


def _source(page: str) -> Path | None:
    for suffix in (".ipynb", ".md"):
        path = ROOT / "book" / f"{page}{suffix}"
        if path.exists():
            return path
    return None


def stale_pages() -> list[str]:
    """Toc pages whose HTML is missing or older than their source or the book config."""
    config_time = max((ROOT / name).stat().st_mtime for name in ("_config.yml", "_toc.yml"))
    stale = []
    for page in toc_pages():
        built, source = HTML / f"{page}.html", _source(page)
        newest = max(config_time, source.stat().st_mtime if source else 0)
        if not built.exists() or built.stat().st_mtime < newest:
            stale.append(page)
    return stale


def build_book_if_needed() -> None:
    stale = stale_pages()
    if not stale:
        return
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    env.setdefault("MPLBACKEND", "agg")
    exe = BIN / "jupyter-book"
    result = subprocess.run([str(exe) if exe.exists() else "jupyter-book", "build", "book"],
                            cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=BUILD_TIMEOUT_S)
    assert result.returncode == 0, (
        f"`jupyter-book build book` (needed for {stale}) failed with status "
        f"{result.returncode}:\n" + (result.stdout + result.stderr)[-6000:])


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def site():
    """Base URL of the built book served on 127.0.0.1 (a free port)."""
    require_chromium()
    build_book_if_needed()
    handler = functools.partial(_QuietHandler, directory=str(HTML))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def browser(site):
    with chromium() as launched:
        yield launched


# ---------------------------------------------------------------------------- one visit
@dataclass
class Visit:
    page: str
    console_errors: list = field(default_factory=list)
    page_errors: list = field(default_factory=list)
    failed_requests: list = field(default_factory=list)
    blocked: list = field(default_factory=list)
    facts: dict = field(default_factory=dict)


_FACTS_JS = """() => {
  const maths = [...document.querySelectorAll('.math')];
  const outputs = [...document.querySelectorAll('div.cell div.cell_output')];
  return {
    title: document.title,
    math: maths.length,
    math_untypeset: maths.filter(e => !e.querySelector('mjx-container'))
                         .map(e => e.textContent.slice(0, 80)),
    mjx: document.querySelectorAll('mjx-container').length,
    mjx_errors: [...document.querySelectorAll('mjx-merror')].map(e => e.textContent),
    images: [...document.images].map(i => ({src: i.getAttribute('src'),
                                          complete: i.complete, width: i.naturalWidth})),
    cells: document.querySelectorAll('div.cell').length,
    cells_with_output: outputs.length,
    empty_outputs: outputs.filter(o => !o.innerText.trim() &&
                                       !o.querySelector('img, svg, canvas, table'))
                          .map(o => o.closest('div.cell').id || '?'),
    sidebar: [...document.querySelectorAll('nav.bd-docs-nav a.reference.internal')]
                 .map(a => a.href),
    next: (document.querySelector('a.right-next') || {}).href || null,
  };
}"""

_WAIT_FOR_MATH_JS = """async () => {
  if (!document.querySelector('.math')) return true;
  for (let i = 0; i < 300 && !(window.MathJax && MathJax.startup &&
                                MathJax.startup.promise); i++)
    await new Promise(r => setTimeout(r, 50));
  await MathJax.startup.promise;
  return true;
}"""

_WAIT_FOR_IMAGES_JS = """() => Promise.all([...document.images].map(img => img.complete ? null :
  new Promise(done => { img.addEventListener('load', done);
                        img.addEventListener('error', done); })))"""


def visit(browser, site: str, page: str, *, screenshots=()) -> Visit:
    """Open ``page`` in a fresh context; collect what went wrong and what it shows."""
    result = Visit(page)
    context = browser.new_context(viewport=VIEWPORT, service_workers="block")
    offline = Offline(context, site)
    tab = context.new_page()
    tab.set_default_timeout(PAGE_TIMEOUT_MS)

    def on_console(message):
        if message.type != "error":
            return
        where = message.location.get("url", "") if message.location else ""
        if message.text.startswith("Failed to load resource") and \
                urlsplit(where).path in IMPLICIT_REQUESTS:
            return
        result.console_errors.append(f"{message.text} ({where})")

    def on_response(response):
        if response.status >= 400 and urlsplit(response.url).path not in IMPLICIT_REQUESTS:
            result.failed_requests.append(f"{response.status} {response.url}")

    tab.on("console", on_console)
    tab.on("pageerror", lambda error: result.page_errors.append(str(error)))
    tab.on("requestfailed", lambda request: result.failed_requests.append(
        f"{request.failure} {request.url}") if request.url.startswith(site) else None)
    tab.on("response", on_response)
    try:
        tab.goto(urljoin(site, f"{page}.html"), wait_until="load")
        tab.evaluate(_WAIT_FOR_MATH_JS)
        tab.evaluate(_WAIT_FOR_IMAGES_JS)
        tab.wait_for_load_state("networkidle")
        result.facts = tab.evaluate(_FACTS_JS)
        for name, selector in screenshots:
            if selector is None:
                tab.evaluate("window.scrollTo(0, 0)")
            else:
                target = tab.locator(selector).first
                if target.count() == 0:
                    continue
                target.scroll_into_view_if_needed()
                tab.wait_for_timeout(200)
            tab.screenshot(path=str(screenshot_dir(ROOT) / name))
    finally:
        result.blocked = list(offline.blocked)
        context.close()
    return result


@pytest.fixture(scope="module")
def visits(browser, site) -> dict[str, Visit]:
    wanted = {}
    for name, page, selector in SCREENSHOTS:
        wanted.setdefault(page, []).append((name, selector))
        (screenshot_dir(ROOT) / name).unlink(missing_ok=True)     # no stale review images
    return {page: visit(browser, site, page, screenshots=wanted.get(page, ()))
            for page in toc_pages()}


# ---------------------------------------------------------------------------- the checks
def test_every_page_loads_without_errors(visits):
    problems = []
    for page, seen in visits.items():
        problems += [f"{page}: console error: {e}" for e in seen.console_errors]
        problems += [f"{page}: uncaught exception: {e}" for e in seen.page_errors]
        problems += [f"{page}: failed request: {e}" for e in seen.failed_requests]
        if not seen.facts.get("title"):
            problems.append(f"{page}: no title: the page did not render")
    assert not problems, "\n".join(problems)


def test_nothing_leaves_the_machine(visits):
    blocked = [f"{page}: {url}" for page, seen in visits.items() for url in seen.blocked]
    assert not blocked, "requests to other hosts (blocked):\n" + "\n".join(blocked)


def test_math_is_typeset(visits):
    with_math = {page: seen.facts for page, seen in visits.items() if seen.facts["math"]}
    assert with_math, "no page has math, but the chapters are full of it"
    problems = []
    for page, facts in with_math.items():
        if facts["math_untypeset"]:
            problems.append(f"{page}: {len(facts['math_untypeset'])} of {facts['math']} math "
                            f"elements not typeset, e.g. {facts['math_untypeset'][:3]}")
        if facts["mjx_errors"]:
            problems.append(f"{page}: MathJax errors {facts['mjx_errors'][:5]}")
        if facts["mjx"] < facts["math"]:
            problems.append(f"{page}: {facts['mjx']} mjx-container for {facts['math']} math")
    assert not problems, "\n".join(problems)


def test_every_image_loads(visits):
    images = [(page, image) for page, seen in visits.items() for image in seen.facts["images"]]
    assert images, "the book shows no image at all, but its chapters have figures"
    broken = [f"{page}: {image['src']} (complete={image['complete']}, "
              f"naturalWidth={image['width']})"
              for page, image in images if not image["complete"] or image["width"] <= 0]
    assert not broken, "images that did not load:\n" + "\n".join(broken)


def _expected_outputs(page: str) -> int:
    """Code cells of ``page``'s notebook that have an output to show, in the executed copy
    the build used (the book executes through jupyter-cache, see _config.yml): outputs of
    cells tagged remove-output/remove-cell and glued values (shown elsewhere) excluded."""
    import nbformat
    from jupyter_cache import get_cache

    notebook = nbformat.read(_source(page), as_version=4)
    cache = get_cache(str(CACHE))
    try:
        record = cache.match_cache_notebook(notebook)
    except KeyError as error:
        raise LookupError(f"{page}: not in the execution cache ({error})") from None
    executed = cache.get_cache_bundle(record.pk).nb
    count = 0
    for cell in executed.cells:
        tags = set(cell.get("metadata", {}).get("tags", []))
        shown = [o for o in cell.get("outputs", [])
                 if not o.get("metadata", {}).get("scrapbook")]
        if cell.cell_type == "code" and shown and not tags & {"remove-output", "remove-cell"}:
            count += 1
    return count


def test_code_cells_show_their_outputs(visits):
    notebooks = {page for page in visits if _source(page) and _source(page).suffix == ".ipynb"}
    assert notebooks, "no notebook page in the toc"
    problems, shown = [], 0
    for page in sorted(notebooks):
        facts = visits[page].facts
        try:
            expected = _expected_outputs(page)
        except LookupError as error:
            problems.append(str(error))
            continue
        if facts["cells_with_output"] != expected:
            problems.append(f"{page}: {facts['cells_with_output']} cells show an output, the "
                            f"executed notebook has {expected} cells with outputs")
        if facts["empty_outputs"]:
            problems.append(f"{page}: empty output areas in cells {facts['empty_outputs']}")
        shown += facts["cells_with_output"]
    assert not problems, "\n".join(problems)
    assert shown > 0, "no code cell output on any page"


def test_sidebar_links_every_page(visits, site):
    linked = {urlsplit(href).path for href in visits[toc_pages()[0]].facts["sidebar"]}
    expected = {urlsplit(urljoin(site, f"{page}.html")).path for page in toc_pages()[1:]}
    missing = sorted(expected - linked)
    assert not missing, f"the home page's sidebar does not link {missing}"


def test_next_buttons_walk_the_whole_book(browser, site):
    """Click "next" from the home page to the end: every toc page, in toc order."""
    context = browser.new_context(viewport=VIEWPORT)
    offline = Offline(context, site)
    tab = context.new_page()
    tab.set_default_timeout(PAGE_TIMEOUT_MS)
    try:
        tab.goto(urljoin(site, f"{toc_pages()[0]}.html"))
        walked = [urlsplit(tab.url).path]
        for _ in range(len(toc_pages()) + 2):
            nxt = tab.locator("a.right-next")
            if nxt.count() == 0:
                break
            with tab.expect_navigation():
                nxt.first.click()
            walked.append(urlsplit(tab.url).path)
    finally:
        context.close()
    expected = [urlsplit(urljoin(site, f"{page}.html")).path for page in toc_pages()]
    assert walked == expected
    assert not offline.blocked, offline.blocked


def test_screenshots_for_review(visits):
    folder = screenshot_dir(ROOT)
    missing, tiny = [], []
    for name, page, selector in SCREENSHOTS:
        if page not in visits:
            continue
        path = folder / name
        if not path.exists():
            # only a screenshot of an element the page does not have may be absent
            if selector is None:
                missing.append(name)
            continue
        if path.stat().st_size < 5_000:
            tiny.append(f"{name} ({path.stat().st_size} bytes)")
    assert not missing and not tiny, f"missing {missing}, suspiciously small {tiny}"
    assert (folder / "index.png").exists()
