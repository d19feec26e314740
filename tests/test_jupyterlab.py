"""A released lab in JupyterLab, as a student gets it: nbgrader's extension, validate, run.

Set-up (in a temporary folder, never in the repository): the instructor's course directory
generates and releases ``lab01_the_spec`` to a private nbgrader exchange; a student folder
holds only an ``nbgrader_config.py`` naming that exchange and the course.  JupyterLab, from
the project's own environment, is started on 127.0.0.1 with a token in the student folder
(its config, data and runtime folders are temporary too, so only what the environment
installs counts), and stopped at the end.

Checks:
- nbgrader's lab extension is installed and enabled (``jupyter labextension list``), the
  server hands it to the browser, and its server side answers (version handshake);
- in headless Chromium: the Nbgrader menu opens the assignment list, which shows the
  released lab; "Fetch" downloads it; the notebook opens with nbgrader's "Validate" button,
  and pressing it on the untouched notebook reports the failing cells;
- over the REST API: the server serves the fetched notebook (``/api/contents``), and
  nbgrader's validate endpoint passes a copy filled in with the solutions (saved through
  the contents API, as JupyterLab saves) and fails the untouched one, naming its cells;
- the solved copy runs top to bottom in JupyterLab (Run All Cells in the browser): every
  code cell executes, nothing is written to stderr, the figure is drawn;
- ``nbgrader validate`` on the command line: success on the solved copy, failures reported
  on the untouched release.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import nbformat
import pytest

from support import nbgrader_helpers as nbh
from support.browser_helpers import Offline, chromium, screenshot_dir

LAB = "lab01_the_spec"
COURSE_ID = "msda-triton"
ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TOKEN = "course-test-token"
START_TIMEOUT_S = 90
VALIDATE_TIMEOUT_S = 180


# ---------------------------------------------------------------------------- set-up
def _env(home: Path) -> dict:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    for name in ("config", "data", "runtime"):
        env[f"JUPYTER_{name.upper()}_DIR"] = str(home / f"jupyter_{name}")
    env["IPYTHONDIR"] = str(home / "ipython")
    env.pop("MPLBACKEND", None)          # let the kernels use the inline backend
    env.pop("JUPYTER_PATH", None)
    return env


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """A running ``jupyter lab`` and a small REST client for it."""

    def __init__(self, folder: Path, env: dict, log: Path):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        command = [str(BIN / "jupyter"), "lab", "--no-browser", "--ip=127.0.0.1",
                   f"--port={self.port}", "--ServerApp.port_retries=0",
                   f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={folder}"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            command.append("--allow-root")          # CI runs as root
        self.log = log
        self._log_file = open(log, "w")
        self.process = subprocess.Popen(command, cwd=folder, env=env, stdout=self._log_file,
                                        stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_until_up()

    def _wait_until_up(self):
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {self.process.returncode}:\n"
                                   + self.log.read_text()[-4000:])
            try:
                if self.request("GET", "api/status")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError("jupyter lab did not answer within "
                           f"{START_TIMEOUT_S} s:\n" + self.log.read_text()[-4000:])

    def request(self, method, path, params=None, body=None, timeout=30):
        """(status, body text) of a request with the token."""
        url = self.url + path
        if params:
            url += "?" + urllib.parse.urlencode(params)
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method,
                                     headers={"Authorization": f"token {TOKEN}",
                                              "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    def json(self, method, path, params=None, body=None, timeout=30):
        status, text = self.request(method, path, params, body, timeout)
        assert status < 300, f"{method} {path}: HTTP {status}: {text[:2000]}"
        return json.loads(text)

    def stop(self):
        if self.process.poll() is None:
            os.killpg(self.process.pid, 15)        # the server shuts its kernels down
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, 9)
                self.process.wait(timeout=10)
        self._log_file.close()


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """Instructor side: lab released to a private exchange.  Student side: an empty
    folder with the exchange in its nbgrader config, and a solved copy of the release."""
    base = tmp_path_factory.mktemp("jupyterlab")
    exchange = base / "exchange"
    exchange.mkdir(mode=0o777)
    exchange.chmod(0o777)                  # what nbgrader's exchange wants (no warning)
    instructor = base / "instructor"
    release = nbh.generate_release(LAB, instructor)
    nbh.run_nbgrader(instructor, "release_assignment", LAB, f"--Exchange.root={exchange}")
    student = base / "student"
    student.mkdir()
    (student / "nbgrader_config.py").write_text(
        "c = get_config()  # noqa: F821\n"
        f"c.Exchange.root = {str(exchange)!r}\n"
        f"c.CourseDirectory.course_id = {COURSE_ID!r}\n")
    solved = nbh.solved_release(nbformat.read(release, as_version=4), LAB)
    return {"base": base, "student": student, "release": release, "solved": solved,
            "env": _env(base)}


@pytest.fixture(scope="module")
def server(course):
    running = Server(course["student"], course["env"], course["base"] / "jupyterlab.log")
    try:
        yield running
    finally:
        running.stop()
    assert running.process.returncode is not None


def _assignments(server) -> dict:
    listing = server.json("GET", "assignments", {"course_id": COURSE_ID})
    assert listing["success"], listing
    return {a["assignment_id"]: a for a in listing["value"]}


@pytest.fixture(scope="module")
def fetched(server, course) -> str:
    """Path (relative to the student folder) of the fetched notebook; fetched through the
    REST API unless the browser test has already clicked "Fetch"."""
    if _assignments(server)[LAB]["status"] == "released":
        server.json("POST", "assignments/fetch",
                    {"course_id": COURSE_ID, "assignment_id": LAB})
    entry = _assignments(server)[LAB]
    assert entry["status"] == "fetched", entry
    return entry["notebooks"][0]["path"]


@pytest.fixture(scope="module")
def solved_path(server, course) -> str:
    """The solved copy, saved through the contents API at solved/<lab>.ipynb."""
    server.json("PUT", "api/contents/solved", body={"type": "directory"})
    path = f"solved/{LAB}.ipynb"
    server.json("PUT", f"api/contents/{path}",
                body={"type": "notebook", "format": "json",
                      "content": json.loads(nbformat.writes(course["solved"]))})
    return path


def _wait_for_idle_kernel(server, path: str, tab, timeout: float = START_TIMEOUT_S) -> None:
    """Until the server has a session for ``path`` whose kernel is idle.  Waits with the
    page's own timer: Playwright's sync API routes the page's requests (``Offline``) only
    while Python is inside one of its calls, so a plain ``time.sleep`` would stall them."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for session in server.json("GET", "api/sessions"):
            if session.get("path") == path and \
                    session.get("kernel", {}).get("execution_state") == "idle":
                return
        tab.wait_for_timeout(500)
    raise AssertionError(f"no idle kernel for {path} after {timeout} s: "
                         f"{server.json('GET', 'api/sessions')}")


def _as_notebook(content: dict):
    """A notebook node (string sources) from the contents API's JSON."""
    return nbformat.reads(json.dumps(content), as_version=4)


def _graded_visible_checks() -> set[str]:
    """grade_ids of the graded test cells a student sees (not only hidden tests)."""
    source = nbformat.read(nbh.source_notebook(LAB), as_version=4)
    return {c.metadata.nbgrader["grade_id"] for c in nbh.graded_test_cells(source)
            if nbh.BEGIN_HIDDEN not in c.source}


# ---------------------------------------------------------------------------- the checks
def test_nbgrader_lab_extension_installed_and_enabled(server, course):
    listing = subprocess.run([str(BIN / "jupyter"), "labextension", "list"],
                             env=course["env"], capture_output=True, text=True, timeout=120)
    text = re.sub(r"\x1b\[[0-9;]*m", "", listing.stdout + listing.stderr)
    line = next((ln for ln in text.splitlines() if "@jupyter/nbgrader" in ln), None)
    assert line is not None, f"@jupyter/nbgrader not installed:\n{text}"
    assert "enabled" in line and "OK" in line, line

    # the server hands the extension to the browser...
    status, page = server.request("GET", "lab")
    assert status == 200
    config = json.loads(re.search(r'<script id="jupyter-config-data" type="application/json">'
                                  r"(.*?)</script>", page, re.S).group(1))
    federated = {ext["name"]: ext for ext in config["federated_extensions"]}
    assert "@jupyter/nbgrader" in federated, sorted(federated)
    assert not any(d.startswith("@jupyter/nbgrader") for d in config.get("disabledExtensions",
                                                                         []))
    entry = f"lab/extensions/@jupyter/nbgrader/{federated['@jupyter/nbgrader']['load']}"
    status, script = server.request("GET", entry)
    assert status == 200 and len(script) > 1000, (status, entry)
    # ...and its server side answers the version handshake the extension makes
    from nbgrader import __version__ as nbgrader_version
    assert server.json("GET", "nbgrader_version", {"version": nbgrader_version})["success"]


def test_assignment_list_fetch_and_validate_button_in_the_browser(server, course):
    with chromium() as browser:
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        offline = Offline(context, server.url)
        tab = context.new_page()
        tab.set_default_timeout(60_000)
        errors = []
        tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        tab.on("pageerror", lambda e: errors.append(str(e)))
        try:
            tab.goto(f"{server.url}lab/workspaces/fetch-validate?token={TOKEN}")
            tab.locator(".lm-MenuBar-itemLabel", has_text="Nbgrader").click()
            tab.locator(".lm-Menu-itemLabel", has_text="Assignment List").click()
            panel = tab.locator(".lm-DockPanel-widget:visible", has_text="Released assignments")
            panel.wait_for()
            if _assignments(server)[LAB]["status"] == "released":
                released = panel.locator("#released_assignments_list")
                released.get_by_text(LAB).wait_for()
                tab.screenshot(path=str(screenshot_dir(ROOT) / "jupyterlab_released.png"))
                released.get_by_role("button", name="Fetch").click()
            downloaded = panel.locator("#fetched_assignments_list")
            downloaded.get_by_text(LAB).first.wait_for()
            tab.screenshot(path=str(screenshot_dir(ROOT) / "jupyterlab_assignment_list.png"))

            tab.goto(f"{server.url}lab/workspaces/fetch-validate/tree/{LAB}/{LAB}.ipynb?"
                     f"token={TOKEN}")
            notebook = tab.locator(".jp-NotebookPanel:visible")
            notebook.locator(".jp-Notebook-cell").first.wait_for()
            validate = notebook.locator(".jp-NotebookPanel-toolbar "
                                        "[title='Validate Assignment']")
            # the extension adds its button to the toolbar after the panel draws its cells (a
            # loaded host can show the cells first): wait for it rather than count at once
            from playwright.sync_api import TimeoutError as PlaywrightTimeout
            try:
                validate.first.wait_for(timeout=30_000)
            except PlaywrightTimeout:
                pass
            assert validate.count() == 1, "nbgrader's Validate button is not in the toolbar"
            validate.first.click()
            dialog = tab.locator(".jp-Dialog")
            dialog.wait_for(timeout=VALIDATE_TIMEOUT_S * 1000)
            dialog.get_by_text("Validation Results").wait_for()
            report = dialog.inner_text()
            tab.screenshot(path=str(screenshot_dir(ROOT) / "jupyterlab_validate.png"))
        finally:
            context.close()
    assert "failed" in report and "NotImplementedError" in report, report[:2000]
    assert _assignments(server)[LAB]["status"] == "fetched"
    assert not errors, errors
    assert not offline.blocked, offline.blocked


def test_server_serves_the_released_notebook(server, course, fetched):
    model = server.json("GET", f"api/contents/{fetched}", {"content": "1"})
    assert model["type"] == "notebook" and model["name"] == f"{LAB}.ipynb"
    served = _as_notebook(model["content"])
    released = nbformat.read(course["release"], as_version=4)
    assert [c.source for c in served.cells] == [c.source for c in released.cells]
    grade_ids = [c.metadata.get("nbgrader", {}).get("grade_id") for c in served.cells]
    assert all(grade_ids) and len(set(grade_ids)) == len(grade_ids)
    assert "raise NotImplementedError()" in "\n".join(c.source for c in served.cells)
    assert model["content"]["metadata"]["kernelspec"]["name"] == "python3"


def test_validate_endpoint(server, fetched, solved_path):
    untouched = server.json("POST", "assignments/validate", {"path": fetched},
                            timeout=VALIDATE_TIMEOUT_S)
    assert untouched["success"], untouched
    failed = untouched["value"].get("failed", [])
    assert len(failed) >= len(_graded_visible_checks()) > 0, untouched["value"]
    assert all("NotImplementedError" in f["error"] for f in failed), failed

    solved = server.json("POST", "assignments/validate", {"path": solved_path},
                         timeout=VALIDATE_TIMEOUT_S)
    assert solved["success"], solved
    assert solved["value"] == {}, solved["value"]      # nothing failed, nothing changed


def test_solved_lab_runs_in_jupyterlab(server, course, solved_path):
    """Run All Cells in the browser, save, and read the saved notebook back."""
    code_cells = [c for c in course["solved"].cells if c.cell_type == "code"]
    to_run = sum(1 for c in code_cells if c.source.strip())     # JupyterLab skips empty ones
    with chromium() as browser:
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        offline = Offline(context, server.url)
        tab = context.new_page()
        tab.set_default_timeout(60_000)
        try:
            # a workspace of its own, so nothing opened by another test is restored
            tab.goto(f"{server.url}lab/workspaces/run-all/tree/{solved_path}?token={TOKEN}")
            notebook = tab.locator(".jp-NotebookPanel:visible")
            notebook.locator(".jp-Notebook-cell").first.wait_for()
            # run only once the kernel is up and the page is connected to it
            _wait_for_idle_kernel(server, solved_path, tab)
            tab.locator(".jp-StatusBar-TextItem", has_text=re.compile(r"\| Idle")).wait_for()
            tab.locator(".lm-MenuBar-itemLabel", has_text="Run").click()
            tab.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
            tab.wait_for_function(
                """(expected) => {
                  const prompts = [...document.querySelectorAll(
                      '.jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell .jp-InputPrompt')]
                      .map(p => p.textContent);
                  return !prompts.some(p => p.includes('*')) &&
                         prompts.filter(p => /\\[\\d+\\]/.test(p)).length === expected;
                }""", arg=to_run, timeout=VALIDATE_TIMEOUT_S * 1000)
            tab.screenshot(path=str(screenshot_dir(ROOT) / "jupyterlab_solved_run.png"))
            # Save, clicked again every 15 s while the server still holds the unrun notebook
            # (on two busy cores a click made while the toolbar redraws can be lost); a
            # dialog that stops the save is named in the failure
            save = notebook.locator(".jp-NotebookPanel-toolbar [title^='Save']").first
            deadline, clicked = time.monotonic() + 60, 0.0
            while True:
                if time.monotonic() - clicked > 15:
                    save.click()
                    clicked = time.monotonic()
                saved = _as_notebook(server.json(
                    "GET", f"api/contents/{solved_path}", {"content": "1"})["content"])
                counts = [c.execution_count for c in saved.cells
                          if c.cell_type == "code" and c.source.strip()]
                if all(counts) or time.monotonic() > deadline:
                    break
                tab.wait_for_timeout(500)
            dialogs = tab.locator(".jp-Dialog:visible")
            dialog = dialogs.first.inner_text() if dialogs.count() else "none"
        except Exception:
            tab.screenshot(path=str(screenshot_dir(ROOT) / "jupyterlab_run_failed.png"))
            raise
        finally:
            context.close()
    assert all(counts) and len(counts) == to_run, \
        f"not every cell ran, or the run was not saved: {counts} (dialog: {dialog})"
    problems, figures = [], 0
    for cell in saved.cells:
        for output in cell.get("outputs", []):
            if output["output_type"] == "error":
                problems.append(f"{cell.metadata.nbgrader['grade_id']}: {output['ename']}")
            elif output["output_type"] == "stream" and output["name"] == "stderr":
                problems.append(f"{cell.metadata.nbgrader['grade_id']}: stderr "
                                f"{output['text'][:200]!r}")
            elif "image/png" in output.get("data", {}):
                figures += 1
    assert not problems, problems
    assert figures >= 1, "the lab's figure was not drawn"
    assert not offline.blocked, offline.blocked


def test_nbgrader_validate_command(server, course, tmp_path):
    # the command a student runs in a terminal: on copies, so the server's files stay as
    # they are
    untouched = tmp_path / "untouched" / f"{LAB}.ipynb"
    solved = tmp_path / "solved" / f"{LAB}.ipynb"
    untouched.parent.mkdir()
    solved.parent.mkdir()
    shutil.copy(course["release"], untouched)
    nbformat.write(course["solved"], solved)

    def validate(path):
        return subprocess.run([str(BIN / "nbgrader"), "validate", str(path)],
                              cwd=course["student"], env=course["env"], capture_output=True,
                              text=True, timeout=VALIDATE_TIMEOUT_S)

    ok = validate(solved)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "Success! Your notebook passes all the tests." in ok.stdout, ok.stdout[-3000:]

    bad = validate(untouched)
    match = re.search(r"VALIDATION FAILED ON (\d+) CELL\(S\)", bad.stdout)
    assert match, bad.stdout[-3000:] + bad.stderr[-2000:]
    assert int(match.group(1)) >= len(_graded_visible_checks())
    assert "NotImplementedError" in bad.stdout
