"""The course hub in tests: a throw-away JupyterHub (scripts/hub/hub.py) and a client for it.

``running_hub(...)`` sets up a hub in a fresh state folder under /tmp (mode 0755, so that the
hub's accounts can reach their configuration), with accounts of its own whose names carry
the test's process id, starts it on free loopback ports, and at the end stops it, checks that
no process of it is left, deletes its accounts and the folder.

``HubUser`` logs one account in through the hub's log-in form (as a browser does: the form's
xsrf field, then JupyterHub's OAuth hand-off to the user's server) and calls the server's
REST API: nbgrader's assignment list (``assignments/...``), the formgrader
(``formgrader/api/...``), JupyterLab's contents API.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import nbformat
import pytest
from support.system import require_system_package

from support import nbgrader_helpers as nbh

REPO = Path(__file__).resolve().parents[2]
HUB_DIR = REPO / "scripts" / "hub"
LAB = "lab01_the_spec"
COURSE_ID = "msda-triton"
START_TIMEOUT_S = 120
# what JupyterHub logs when its proxy did not answer within its fixed 10 s
PROXY_TOO_SLOW = "Failed to start proxy"


def hub_module():
    spec = importlib.util.spec_from_file_location("course_hub", HUB_DIR / "hub.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def require_hub():
    """Skip (with the one command that would let it run) where the hub cannot run here."""
    if os.geteuid() != 0:
        pytest.skip("the course hub needs root (each user's server runs as a system account "
                    "of its own): sudo python -m pytest tests/test_hub.py")
    module = hub_module()
    if any(module._blocked_ancestors(p) for p in module.software_paths()):
        require_system_package("acl")       # the environment lies under a closed folder
    if not (HUB_DIR / "node_modules" / ".bin" / "configurable-http-proxy").exists():
        if shutil.which("npm") is None:
            pytest.skip("configurable-http-proxy needs npm: apt-get install npm")
        proc = subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=HUB_DIR,
                              capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            pytest.skip("configurable-http-proxy could not be installed: "
                        f"cd scripts/hub && npm ci ({proc.stderr[-300:]})")
    require_system_package("bubblewrap")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Hub:
    def __init__(self, state: Path, instructor: str, students: list[str], port: int):
        self.state, self.instructor, self.students, self.port = state, instructor, students, port
        self.url = f"http://127.0.0.1:{port}/"
        self.module = hub_module()
        self.passwords = dict(line.split(" ", 1) for line in
                              (state / "passwords.txt").read_text().splitlines() if line)
        self.log = state.parent / "hub.log"
        self.process = None

    @property
    def course(self) -> Path:
        return self.state / "course"

    def start(self, attempts: int = 2):
        """``hub.py start``, waiting until the hub answers.  JupyterHub gives its proxy a
        fixed 10 s to answer (jupyterhub/proxy.py, not a setting); on two busy cores Node
        can take longer to start, and the hub then exits with "Failed to start proxy": that
        one failure is tried again (``attempts`` in all), and said on stderr."""
        env = dict(os.environ)
        env.pop("JUPYTER_CONFIG_DIR", None)
        logged = self.log.read_text() if self.log.exists() else ""
        self.process = subprocess.Popen(
            [sys.executable, str(HUB_DIR / "hub.py"), "start", "--state", str(self.state),
             "--log", str(self.log)], env=env, stdout=subprocess.DEVNULL,
            stderr=open(self.state.parent / "hub-run.log", "w"), start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        import urllib.request
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                this_run = self.log.read_text()[len(logged):]
                if attempts > 1 and PROXY_TOO_SLOW in this_run:
                    sys.stderr.write("hub_helpers: the proxy did not answer within "
                                     "JupyterHub's 10 s; starting the hub again\n")
                    return self.start(attempts - 1)
                raise RuntimeError("the hub exited:\n" + self.log.read_text()[-4000:])
            try:
                with urllib.request.urlopen(self.url + "hub/api/", timeout=5) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.3)
        raise RuntimeError("the hub did not answer:\n" + self.log.read_text()[-4000:])

    def stop_with(self, how: str = "stop") -> list:
        """Stop the hub with ``make hub-stop``'s command (``stop``) or as Ctrl-C does
        (``interrupt``: SIGINT to the foreground process); returns what was left running."""
        if how == "interrupt":
            os.kill(self.process.pid, signal.SIGINT)
        else:
            subprocess.run([sys.executable, str(HUB_DIR / "hub.py"), "stop", "--state",
                            str(self.state)], check=True, capture_output=True, timeout=180)
        self.process.wait(timeout=120)
        return self.module.leftovers(self.state)

    def grade(self, lab: str = LAB, *extra) -> subprocess.CompletedProcess:
        """The instructor's grading step: ``hub.py grade`` (``python -m autograde grade``
        on the course folder, as root, in the sandbox)."""
        return subprocess.run([sys.executable, str(HUB_DIR / "hub.py"), "grade", lab,
                               "--state", str(self.state), *extra], capture_output=True,
                              text=True, timeout=900)

    def grade_started(self, lab: str = LAB, *extra) -> subprocess.Popen:
        """``grade``, started and left running (text pipes for its output)."""
        return subprocess.Popen([sys.executable, str(HUB_DIR / "hub.py"), "grade", lab,
                                 "--state", str(self.state), *extra], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def report(self, lab: str = LAB) -> dict:
        """{student: row} from ``python -m autograde report --json``."""
        out = self.state.parent / "report.json"
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)
        subprocess.run([sys.executable, "-m", "autograde", "report", lab, "--root",
                        str(self.course), "--json", str(out)], cwd=self.course, env=env,
                       check=True, capture_output=True, timeout=300)
        return {row["student_id"]: row for row in json.loads(out.read_text())}

    def ledger(self, student: str, lab: str = LAB) -> dict:
        """The grading status ledger of one submission (autograde_status/LAB/STUDENT.json)."""
        path = self.course / "autograde_status" / lab / f"{student}.json"
        return json.loads(path.read_text())

    def user(self, name: str) -> "HubUser":
        return HubUser(self, name)


class HubUser:
    """One account's session with the hub, its server started."""

    def __init__(self, hub: Hub, name: str):
        import requests
        self.hub, self.name = hub, name
        self.base = f"{hub.url}user/{name}/"
        self.session = requests.Session()
        page = self.session.get(hub.url + "hub/login", timeout=30)
        xsrf = re.search(r'name="_xsrf" value="([^"]+)"', page.text).group(1)
        self.session.post(hub.url + "hub/login?next=", timeout=60,
                          data={"username": name, "password": hub.passwords[name],
                                "_xsrf": xsrf})
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            page = self.session.get(self.base + "lab", timeout=60)
            if page.status_code == 200 and "/lab" in page.url and "jupyter-config-data" \
                    in page.text:
                return
            time.sleep(1)
        raise RuntimeError(f"{name}'s server did not start: {page.status_code} {page.url}")

    def _xsrf(self) -> dict:
        for cookie in self.session.cookies:
            if cookie.name == "_xsrf" and cookie.path.startswith(f"/user/{self.name}"):
                return {"X-XSRFToken": cookie.value}
        return {}

    def call(self, method: str, path: str, params=None, body=None, timeout=300):
        response = self.session.request(method, self.base + path, params=params,
                                        json=body, headers=self._xsrf(), timeout=timeout)
        assert response.status_code < 300, \
            f"{self.name}: {method} {path}: HTTP {response.status_code}: {response.text[:2000]}"
        return response.json() if response.text else None

    # nbgrader's assignment list, as its buttons call it
    def assignments(self) -> dict:
        listing = self.call("GET", "assignments", {"course_id": COURSE_ID})
        assert listing["success"], listing
        return {(a["assignment_id"], a["status"]): a for a in listing["value"]}

    def fetch(self, lab=LAB):
        return self.call("POST", "assignments/fetch",
                         {"course_id": COURSE_ID, "assignment_id": lab})

    def submit(self, lab=LAB):
        result = self.call("POST", "assignments/submit",
                           {"course_id": COURSE_ID, "assignment_id": lab})
        assert result["success"], result
        return result

    def fetch_feedback(self, lab=LAB):
        return self.call("POST", "assignments/fetch_feedback",
                         {"course_id": COURSE_ID, "assignment_id": lab})

    def save_notebook(self, path: str, nb):
        self.call("PUT", f"api/contents/{path}",
                  body={"type": "notebook", "format": "json",
                        "content": json.loads(nbformat.writes(nb))})

    def delete(self, path: str):
        response = self.session.delete(self.base + f"api/contents/{path}",
                                       headers=self._xsrf(), timeout=60)
        assert response.status_code == 204, response.text

    # the formgrader's buttons (the instructor)
    def formgrader(self, action: str, lab=LAB):
        result = self.call("POST", f"formgrader/api/assignment/{lab}/{action}")
        assert result["success"], result
        return result


@contextmanager
def running_hub(students=("a", "b"), tag="hub"):
    """A started hub with an instructor and ``students`` (short names; the accounts are
    ``t<pid><tag>-<name>``); yields the ``Hub``; stops it and removes everything after."""
    require_hub()
    module = hub_module()
    base = Path(tempfile.mkdtemp(prefix=f"msda-{tag}-", dir="/tmp"))
    base.chmod(0o755)
    prefix = f"t{os.getpid() % 100000}{tag[:3]}"
    instructor = f"{prefix}-instructor"
    accounts = [f"{prefix}-{s}" for s in students]
    port = free_port()
    state = base / "state"
    module.setup(state, instructor, accounts, port=port, hub_port=free_port(),
                 proxy_api_port=free_port(), labs=[LAB],
                 group=f"{prefix}-hub", kernel_uid=64400 + (os.getpid() % 250) * 4)
    hub = Hub(state, instructor, accounts, port)
    try:
        hub.start()
        yield hub
    finally:
        if hub.process is not None and hub.process.poll() is None:
            try:
                hub.stop_with("stop")
            except Exception:                        # noqa: BLE001
                module.clean_up(state)
        module.remove_users(state)
        shutil.rmtree(base, ignore_errors=True)


# ---------------------------------------------------------------------------- notebooks
def solved(release_nb, lab=LAB):
    return nbh.solved_release(release_nb, lab)


# the typical mistake of lab 01: the last axis of sampling_locations read as (y, x)
MISTAKE_CELL = "lab01_msda_naive"
MISTAKE = ("x, y = sampling_locations[b, q, m, lvl, k].tolist()",
           "y, x = sampling_locations[b, q, m, lvl, k].tolist()")


def with_mistake(release_nb, lab=LAB):
    nb = solved(release_nb, lab)
    cell = next(c for c in nb.cells
                if c.metadata.get("nbgrader", {}).get("grade_id") == MISTAKE_CELL)
    assert MISTAKE[0] in cell.source
    cell.source = cell.source.replace(*MISTAKE)
    return nb


def values_of(tree, key: str) -> list:
    """Every value stored under ``key`` anywhere in a JSON tree."""
    found = []
    if isinstance(tree, dict):
        for k, v in tree.items():
            if k == key:
                found.append(v)
            found += values_of(v, key)
    elif isinstance(tree, list):
        for v in tree:
            found += values_of(v, key)
    return found


def review_reasons(reasons: str) -> list[str]:
    """The report's reasons less the similarity check's (a synthetic student who submits the
    source notebook's solution is, rightly, 100 % similar to it and to the others)."""
    return [r for r in (reasons or "").split("; ")
            if r and not r.startswith("similarity check")]


# ---------------------------------------------------------------------------- accounts
def run_as(user: str, code: str, timeout=120) -> dict:
    """Run the Python ``code`` as the system account ``user`` (its uid, gid and groups, no
    privilege left); the code assigns a JSON-able ``result``, which is returned."""
    import pwd
    entry = pwd.getpwnam(user)
    wrapper = ("import json, os, sys\nresult = None\n" + code +
               "\nsys.stdout.write('\\n@@' + json.dumps(result))\n")
    proc = subprocess.run([sys.executable, "-P", "-c", wrapper], cwd="/", user=entry.pw_uid,
                          group=entry.pw_gid, extra_groups=os.getgrouplist(user, entry.pw_gid),
                          env={"PATH": "/usr/bin:/bin", "HOME": entry.pw_dir, "USER": user,
                               "LANG": "C.UTF-8"},
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (user, proc.stdout[-2000:], proc.stderr[-3000:])
    return json.loads(proc.stdout.rsplit("\n@@", 1)[1])


def attempt(action: str) -> str:
    """Python source that runs ``action`` (one statement) and records in ``result[...]``
    the name of what stopped it, or ``"done"``: for ``run_as`` code."""
    return (f"try:\n    {action}\n    outcome = 'done'\n"
            f"except OSError as exc:\n    outcome = type(exc).__name__\n")


# ---------------------------------------------------------------------------- browser
LOOPBACK = re.compile(r"^(https?|wss?)://(127\.0\.0\.1|localhost)(:\d+)?/")


class Loopback:
    """Every request of a browser context: loopback passes, anything else is aborted and
    kept in ``blocked``; ``seen`` counts what was seen."""

    def __init__(self, context):
        self.blocked, self.seen = [], 0
        context.route("**/*", self._route)

    def _route(self, route):
        url = route.request.url
        self.seen += 1
        if LOOPBACK.match(url) or url.startswith(("data:", "blob:", "about:")):
            route.continue_()
        else:
            self.blocked.append(url)
            route.abort()


def browser_login(tab, hub, user):
    """Log ``user`` in on the hub's page and wait for JupyterLab's Nbgrader menu."""
    tab.goto(hub.url + "hub/login")
    tab.locator("input[name=username]").fill(user)
    tab.locator("input[name=password]").fill(hub.passwords[user])
    tab.locator("input[type=submit], button[type=submit]").first.click()
    tab.wait_for_url(re.compile(rf"/user/{re.escape(user)}/lab"), timeout=180_000)
    tab.locator(".lm-MenuBar-itemLabel", has_text="Nbgrader").wait_for(timeout=120_000)
