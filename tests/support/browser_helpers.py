"""Headless Chromium for the tests: Debian's browser, driven by Playwright, kept offline.

- The browser is the system's ``/usr/bin/chromium`` (Debian's ``chromium`` package, which
  ``.ci/run`` installs).  Playwright only drives it: nothing here downloads a browser.
- ``require_chromium()`` skips a test, with the reason, where that browser is absent (say a
  laptop without it) but fails it on CI (``CI`` set), where ``make test`` must have installed
  it (``require_system_package`` in conftest.py).
- ``Offline`` guards a browser context: every request that does not go to the given loopback
  origin (or to ``data:``/``blob:`` URLs) is aborted and recorded, so a test can assert that
  nothing tried to leave the machine.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

import pytest
from support.system import require_system_package

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


def _missing(what: str, how: str):
    message = f"{what} is not available ({how})"
    if os.environ.get("CI"):
        pytest.fail(f"{message}; CI must provide it (its `make test` installs it)")
    pytest.skip(message)


def require_chromium() -> Path:
    """The Chromium executable; skip (fail on CI) without it or without Playwright."""
    require_system_package("chromium")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        _missing("the Python package playwright", "pip install -r requirements.txt")
    return CHROMIUM


@contextmanager
def chromium():
    """A launched headless Chromium (Playwright ``Browser``), closed on exit."""
    from playwright.sync_api import sync_playwright

    executable = require_chromium()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(executable), headless=True,
                                             args=CHROMIUM_FLAGS)
        try:
            yield browser
        finally:
            browser.close()


class Offline:
    """Route every request of a Playwright context: loopback ``origin`` passes, anything
    else is aborted and remembered in ``blocked``."""

    ALLOWED_SCHEMES = ("data:", "blob:", "about:")

    def __init__(self, context, origin: str):
        self.origin = origin.rstrip("/") + "/"
        self.blocked: list[str] = []
        context.route("**/*", self._route)

    def _route(self, route):
        url = route.request.url
        if url.startswith(self.origin) or url.startswith(self.ALLOWED_SCHEMES):
            route.continue_()
        else:
            self.blocked.append(url)
            route.abort()


def screenshot_dir(root: Path) -> Path:
    """``root/_build/screenshots`` (created if needed): where screenshots for review go."""
    folder = root / "_build" / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    return folder
