"""Local Sphinx extension of the course book: strict builds and an offline site.

Loaded through ``sphinx: local_extensions`` in the root ``_config.yml``, so the plain
command ``jupyter-book build book`` gets all of this:

* strict: every warning makes the build exit non-zero (``-W --keep-going`` semantics: all
  warnings are reported, then the build fails), without any command-line flag, and the
  next build fails again until the cause is fixed;
* offline: the vendored MathJax under ``book/_vendor`` is published as a static folder at
  ``builder-inited`` (a ``book/_static`` folder would make Jupyter Book add a ``<script>``
  tag for every ``.js`` file of MathJax), and after the build every page is scanned for
  a ``<script src>`` or ``<link href>`` that points off the site: any such tag is a warning,
  so the build fails.
"""
from __future__ import annotations

import re
from pathlib import Path

from sphinx.application import Sphinx
from sphinx.util import logging

logger = logging.getLogger(__name__)

VENDOR_DIR = "_vendor"
_REMOTE_ASSET = re.compile(
    r"<(?:script|link)\b[^>]*\b(?:src|href)\s*=\s*[\"']((?:https?:)?//[^\"']+)[\"'][^>]*>",
    re.IGNORECASE,
)


def remote_assets(html: str) -> list[str]:
    """URLs of scripts and stylesheets/preloads in ``html`` that would be fetched off-site.

    ``<link>`` tags that only name a page (rel canonical, alternate) are not fetched by a
    browser and are ignored; ordinary ``<a href>`` hyperlinks are never matched.
    """
    found = []
    for match in _REMOTE_ASSET.finditer(html):
        tag = match.group(0).lower()
        if tag.startswith("<link") and not re.search(
                r"rel\s*=\s*[\"'][^\"']*(stylesheet|preload|modulepreload|icon|manifest)",
                tag):
            continue
        found.append(match.group(1))
    return found


def _make_strict(app: Sphinx) -> None:
    # Sphinx counts every warning; with keep_going set, a build with warnings ends with
    # status 1 after reporting all of them (what `sphinx-build -W --keep-going` does).
    app.keep_going = True


def _publish_vendor(app: Sphinx) -> None:
    vendor = Path(app.srcdir) / VENDOR_DIR
    if vendor.is_dir() and str(vendor) not in app.config.html_static_path:
        app.config.html_static_path = [*app.config.html_static_path, str(vendor)]


def _check_offline(app: Sphinx, exception: Exception | None) -> None:
    if exception is not None or app.builder.format != "html":
        return
    outdir = Path(app.outdir)
    for page in sorted(outdir.rglob("*.html")):
        if "_static" in page.relative_to(outdir).parts:
            continue
        for url in remote_assets(page.read_text(encoding="utf-8", errors="replace")):
            logger.warning("page loads an off-site asset (the book must work offline): %s",
                           url, location=str(page.relative_to(outdir)))


def _forget_after_warnings(app: Sphinx, exception: Exception | None) -> None:
    # Sphinx saves its environment even after a build with warnings, and the next build
    # re-reads only changed pages: their warnings would not be raised again and that build
    # would pass.  Dropping the saved environment makes the next build re-read every page
    # (executed notebooks still come from the execution cache) and fail the same way.
    if app._warncount:
        (Path(app.doctreedir) / "environment.pickle").unlink(missing_ok=True)


def setup(app: Sphinx) -> dict:
    _make_strict(app)
    app.connect("builder-inited", _publish_vendor)
    app.connect("build-finished", _check_offline)
    app.connect("build-finished", _forget_after_warnings, priority=900)  # after the check
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
