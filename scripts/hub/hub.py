"""The course on a JupyterHub on one machine: set up, run, stop.

    sudo python scripts/hub/hub.py setup [--state DIR] [--instructor NAME] [--students a,b,c]
    sudo python scripts/hub/hub.py start [--state DIR]      # foreground; Ctrl-C stops it
    sudo python scripts/hub/hub.py stop  [--state DIR]      # from another terminal
    sudo python scripts/hub/hub.py grade LAB [--state DIR] # the sandboxed grading step
    sudo python scripts/hub/hub.py remove-users [--state DIR]

``make hub`` runs setup then start; ``make hub-stop`` runs stop.  The state folder (default
/srv/msda-hub, or $MSDA_HUB_STATE) holds:

  settings.json    ports, accounts, paths, per-user limits (what jupyterhub_config.py reads)
  secrets.json     cookie secret and proxy token (0600, root)
  accounts.json    the accounts' password hashes (0600, root)
  passwords.txt    the generated passwords, to hand out (0600, root)
  course/          the course directory: root's, shared with the instructor's group (3770,
                   sticky); its nbgrader_config.py root's (0644), the rest the instructor's
  exchange/        nbgrader's exchange with owners (autograde/runner/exchange.py: root's root, the
                   instructor's course folders, one inbound folder per student)
  config/student/  nbgrader and JupyterLab settings of the students' servers
  config/instructor/  the same for the instructor's server (sanitised formgrader pages,
                   the script policy of autograde/runner/instructor_view.py)
  data/instructor/ nbconvert's MathJax macro for the formgrader (MathJax served locally)
  hub/             JupyterHub's database, pid files and log

Every account is a system account (``useradd``), locked and without a shell; the hub starts
each user's JupyterLab as that account (``LocalProcessSpawner`` with the limits of
hub_limits.py) in a home folder of mode 0700.  This needs root; so does grading, whose
sandbox gives each grading kernel a uid of its own.  Root runs nothing an account can write:
``grade`` checks that the course's config is still root's, keeps the course folder off
Python's path, makes the folder root's alone while it grades and refuses links in it; ``chown_tree`` follows no link (book/hub.md: "Who is
trusted with what").
"""
from __future__ import annotations

import argparse
import grp
import importlib
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
VENV_BIN = Path(sys.executable).parent
DEFAULT_STATE = Path(os.environ.get("MSDA_HUB_STATE", "/srv/msda-hub"))
COURSE_ID = "msda-triton"
CHP = HERE / "node_modules" / ".bin" / "configurable-http-proxy"

sys.path.insert(0, str(HERE))
from hub_auth import hash_password  # noqa: E402
from hub_limits import remove_groups, slice_for  # noqa: E402

# each user's server and everything it starts (hub_limits.py; settings.json "limits")
DEFAULT_LIMITS = {"memory_mb": 4096, "cpus": 1.0, "processes": 512, "file_mb": 2048}


# ---------------------------------------------------------------------------- helpers
def require_root():
    if os.geteuid() != 0:
        raise SystemExit("the course hub runs each user's server as that user's own system "
                         "account and grades in a sandbox: run it as root (sudo make hub)")


def install_proxy() -> Path:
    """configurable-http-proxy from npm, into scripts/hub/node_modules (once)."""
    if not CHP.exists():
        if shutil.which("npm") is None:
            raise SystemExit("npm is not installed (Node 20 or later: apt-get install nodejs "
                             "npm); JupyterHub needs it for configurable-http-proxy")
        subprocess.run(["npm", "ci" if (HERE / "package-lock.json").exists() else "install",
                        "--no-audit", "--no-fund"], cwd=HERE, check=True)
    return CHP


def _write_private(path: Path, text: str):
    """Write a file that only root may read (0600 from the start)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(path, 0o600)


def user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def group_exists(name: str) -> bool:
    try:
        grp.getgrnam(name)
        return True
    except KeyError:
        return False


def create_account(name: str, group: str):
    """A locked system account without a shell, with a 0700 home folder, in ``group``."""
    if not user_exists(name):
        subprocess.run(["useradd", "--create-home", "--user-group", "--groups", group,
                        "--shell", "/usr/sbin/nologin", name], check=True)
    elif name not in grp.getgrnam(group).gr_mem:
        subprocess.run(["usermod", "--append", "--groups", group, name], check=True)
    home = Path(pwd.getpwnam(name).pw_dir)
    home.mkdir(exist_ok=True)
    os.chown(home, pwd.getpwnam(name).pw_uid, pwd.getpwnam(name).pw_gid)
    home.chmod(0o700)


def _blocked_ancestors(path: Path) -> list[Path]:
    """Folders above ``path`` that an account outside their owner and group cannot enter."""
    blocked = []
    for folder in reversed(path.parents):
        if not os.stat(folder).st_mode & 0o001:
            blocked.append(folder)
    return blocked


def software_paths() -> list[Path]:
    """What every user's server runs: the venv, the interpreter it points at, the course."""
    return [VENV_BIN, Path(os.path.realpath(VENV_BIN / "python")).parent, REPO, HERE]


def grant_traversal(group: str) -> list[str]:
    """Let the hub's accounts (members of ``group``) enter, not list, the folders above the
    Python environment that others may not enter: one POSIX ACL entry ``g:GROUP:--x`` per
    folder.  An environment installed where everyone can read it (/opt, /usr/local) needs
    none; one under root's home (a pyenv build, say) does."""
    folders = sorted({str(f) for p in software_paths() for f in _blocked_ancestors(p)})
    if folders and shutil.which("setfacl") is None:
        raise SystemExit(f"the Python environment lies under {folders[0]}, which the hub's "
                         "accounts cannot enter: install the acl package "
                         "(apt-get install acl) or the environment under /opt")
    for folder in folders:
        subprocess.run(["setfacl", "-m", f"g:{group}:--x", folder], check=True)
    return folders


def revoke_traversal(group: str, folders: list[str]):
    for folder in folders:
        subprocess.run(["setfacl", "-x", f"g:{group}", folder], check=False,
                       stderr=subprocess.DEVNULL)


def chown_tree(path: Path, user: str, keep=(), log=sys.stderr) -> list[str]:
    """Give everything under ``path`` (not ``path`` itself, not the paths in ``keep``) to
    ``user``; returns what it refused.  No link is followed or changed (a link the account
    made to a root-only file stays what it was), nor a file with several hard links that is
    not the account's already (it may be another name of a file outside the tree)."""
    entry = pwd.getpwnam(user)
    keep = {os.path.abspath(k) for k in keep}
    refused = []
    for folder, dirs, files in os.walk(path):          # os.walk never descends into links
        for name in dirs + files:
            target = os.path.join(folder, name)
            if target in keep:
                continue
            info = os.lstat(target)
            if stat.S_ISLNK(info.st_mode):
                refused.append(f"{target}: a link, left as it is")
                continue
            if info.st_uid == entry.pw_uid and info.st_gid == entry.pw_gid:
                continue
            if not stat.S_ISDIR(info.st_mode) and info.st_nlink > 1:
                refused.append(f"{target}: {info.st_nlink} hard links, left as it is")
                continue
            os.chown(target, entry.pw_uid, entry.pw_gid, follow_symlinks=False)
    for line in refused:
        log.write(f"chown: {line}\n")
    return refused


def settings(state: Path) -> dict:
    return json.loads((state / "settings.json").read_text())


# ---------------------------------------------------------------------------- setup
CONFIG_NAME = "nbgrader_config.py"


def write_course_config(course: Path, text: str, instructor: str):
    """The course folder and its nbgrader_config.py, which ``hub.py grade`` runs as root:
    the folder is root's, shared with the instructor's group (mode 3770: the instructor
    creates and changes her files in it; the sticky bit keeps her from renaming or
    deleting root's), the config root's, mode 0644 (she reads it, only root changes it)."""
    group = pwd.getpwnam(instructor).pw_gid
    fd = os.open(course, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        os.fchown(fd, 0, group)
        os.fchmod(fd, COURSE_MODE)
    finally:
        os.close(fd)
    path = course / CONFIG_NAME
    tmp = course / f".{CONFIG_NAME}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)                  # a link or a file of hers there is replaced


def course_config_problem(course: Path) -> str | None:
    """Why root must not run ``course``'s nbgrader_config.py (None: root wrote it and
    nobody else can have changed it)."""
    folder = os.lstat(course)
    if not stat.S_ISDIR(folder.st_mode) or folder.st_uid != 0 or \
            not folder.st_mode & stat.S_ISVTX or folder.st_mode & 0o002:
        return (f"{course} is not root's sticky folder (owner {folder.st_uid}, mode "
                f"{folder.st_mode & 0o7777:o}): run `sudo python scripts/hub/hub.py setup` again")
    info = os.lstat(course / CONFIG_NAME)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != 0 or info.st_mode & 0o022 or \
            info.st_nlink != 1:
        return (f"{course / CONFIG_NAME} is not a root-owned file that only root can write "
                f"(owner {info.st_uid}, mode {info.st_mode & 0o7777:o}, {info.st_nlink} "
                "links): run `sudo python scripts/hub/hub.py setup` again to rewrite it")
    return None


# a class, function or module of the course named in a written configuration
COURSE_NAME = re.compile(r"(?<![\w.-])autograde(?:\.[A-Za-z_][A-Za-z0-9_]*)+")


def _resolves(dotted: str) -> bool:
    """Whether ``dotted`` names a module of the course, or an attribute of one."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for part in parts[cut:]:
                found = getattr(found, part)
        except AttributeError:
            return False
        return True
    return False


def stale_names(state: Path) -> list[str]:
    """The names of the course in the configurations ``setup`` wrote (the course's and each
    role's nbgrader_config.py, each role's jupyter_server_config.json) that this version of
    the course no longer has: "FILE: NAME" each.  A hub set up before the course moved a
    class would otherwise start, and fail at the first fetch or grade."""
    files = [Path(settings(state)["course"]) / CONFIG_NAME,
             *sorted((state / "config").glob("*/nbgrader_config.py")),
             *sorted((state / "config").glob("*/jupyter_server_config.json"))]
    return [f"{path}: {name}" for path in files if path.is_file()
            for name in sorted(set(COURSE_NAME.findall(path.read_text())))
            if not _resolves(name)]


def _refuse_stale(state: Path, command: str, log) -> bool:
    stale = stale_names(state)
    if stale:
        log.write(f"hub.py {command}: the hub's configuration names what this version of the "
                  "course no longer has (written by an older version):\n" +
                  "".join(f"  {line}\n" for line in stale) +
                  "run `sudo python scripts/hub/hub.py setup` again with the same --state, "
                  "--instructor and --students (it keeps their passwords) to write it anew\n")
    return bool(stale)


def course_config(state: Path, kernel_uid: int) -> str:
    """The course's nbgrader_config.py with the hub's paths: the repository's config, then
    the course root, the exchange, and a grading step that refuses to run unsandboxed."""
    text = (REPO / "nbgrader_config.py").read_text()
    return text + f"""
# ---- the course hub (scripts/hub/hub.py setup)
c.CourseDirectory.root = {str(state / 'course')!r}
c.Exchange.root = {str(state / 'exchange')!r}
# grading runs as root (scripts/hub/hub.py grade): each kernel gets a uid of its own; the
# formgrader's Autograde button, run as the instructor's account, refuses instead of
# grading without the sandbox
c.AutogradeSettings.require_sandbox = True
# where the grading kernels' uids start, apart from other courses graded on this host
c.AutogradeSettings.kernel_uid = {kernel_uid}
# a submission after the due date scores 0 (nbgrader's late penalties: "none" keeps the
# score; a LateSubmissionPlugin subclass can take off points per hour instead)
c.LateSubmissionPlugin.penalty_method = "zero"
# the exchange's folders have owners (autograde/runner/exchange.py: per-student inbound folders,
# Collect takes regular files of the student's own, refuses and reports the rest)
""" + "\n".join(exchange_lines()) + "\n"


def exchange_lines() -> list[str]:
    from autograde.runner.exchange import config_lines
    return config_lines()


# The formgrader shows a student's submission as a page of the instructor's server:
# nbconvert's sanitiser on, with the course's allowlist (autograde/runner/instructor_view.py)
SANITISED_VIEW = [
    "c.HTMLExporter.sanitize_html = True",
    "c.HTMLExporter.filters = {'clean_html': 'autograde.runner.instructor_view.clean_html',",
    "                          'markdown2html': 'autograde.runner.instructor_view.markdown2html'}",
]
MATHJAX = REPO / "book" / "_vendor" / "mathjax"


def mathjax_macro(base_url: str) -> str:
    """nbconvert's ``mathjax`` macro (templates/base/mathjax.html.j2) for the instructor's
    server: MathJax 3 from the server's own /static/ (book/_vendor/mathjax), its ``safe``
    extension on (no \\href to javascript:, no \\style), and the two calls of MathJax 2's API
    that the formgrader's page makes (``MathJax.Hub.Startup.signal.Interest``, ``Queue``)."""
    src = f"{base_url}static/mathjax/es5/tex-svg-full.js"
    return """{%- macro mathjax(url="") -%}
<script>
window.MathJax = {
  loader: {load: ['ui/safe']},
  tex: {inlineMath: [['$', '$'], ['\\\\(', '\\\\)']],
        displayMath: [['$$', '$$'], ['\\\\[', '\\\\]']],
        processEscapes: true, processEnvironments: true, tags: 'ams'},
  options: {enableMenu: false}
};
</script>
<script src="SRC"></script>
<script>
(function () {
  var started = function () {
    return (window.MathJax.startup && window.MathJax.startup.promise) || Promise.resolve();
  };
  window.MathJax.Hub = {
    Startup: {signal: {Interest: function (fn) { started().then(function () { fn('End'); }); }}},
    Queue: function () { started().then(function () { window.MathJax.typesetPromise(); }); }
  };
})();
</script>
{%- endmacro %}
""".replace("SRC", src)


def role_config(state: Path, role: str, instructor: str):
    folder = state / "config" / role
    (folder / "labconfig").mkdir(parents=True, exist_ok=True)
    lines = ["c = get_config()  # noqa: F821",
             f"c.CourseDirectory.course_id = {COURSE_ID!r}",
             f"c.Exchange.root = {str(state / 'exchange')!r}"]
    lines += exchange_lines()
    disabled = {}
    server_ext = {}
    server = {}
    if role == "instructor":
        lines.append(f"c.CourseDirectory.root = {str(state / 'course')!r}")
        lines += SANITISED_VIEW
        # every page of the instructor's server: a script policy (autograde/runner/instructor_view.py)
        server_ext = {"autograde.runner.instructor_view": True}
        server["extra_static_paths"] = [str(MATHJAX.parent)]
        macro = state / "data" / role / "nbconvert" / "templates" / "base" / "mathjax.html.j2"
        macro.parent.mkdir(parents=True, exist_ok=True)
        macro.write_text(mathjax_macro(f"/user/{instructor}/"))
        for path in [state / "data", *(state / "data").rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
    else:
        # students see the assignment list and the Validate button, not the instructor's tools
        disabled = {f"@jupyter/nbgrader:{p}": True
                    for p in ("formgrader", "course-list", "create-assignment")}
        server_ext = {"nbgrader.server_extensions.formgrader": False,
                      "nbgrader.server_extensions.course_list": False}
    # no server asks the internet for news or updates
    disabled["@jupyterlab/apputils-extension:announcements"] = True
    (folder / "nbgrader_config.py").write_text("\n".join(lines) + "\n")
    (folder / "labconfig" / "page_config.json").write_text(
        json.dumps({"disabledExtensions": disabled}, indent=1) + "\n")
    (folder / "jupyter_server_config.json").write_text(json.dumps(
        {"ServerApp": {"jpserver_extensions": server_ext, **server},
         "LabApp": {"news_url": None,
                    "check_for_updates_class": "jupyterlab.NeverCheckForUpdate"}},
        indent=1) + "\n")
    for path in [folder, *folder.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)


def setup(state: Path, instructor: str, students: list[str], port=8000, hub_port=8081,
          proxy_api_port=8001, labs=None, passwords: dict | None = None,
          logins: bool = True, group: str = "msda-hub", kernel_uid: int = 64300,
          limits: dict | None = None) -> dict:
    """Create (or refresh) everything the hub needs; returns {user: password} for accounts
    whose password was generated or given now.  ``logins=False`` gives no account a
    password (a class that only uses the exchange, as scripts/hub/scale.py does)."""
    require_root()
    install_proxy()
    state.mkdir(parents=True, exist_ok=True)
    state.chmod(0o755)
    (state / "hub").mkdir(exist_ok=True)
    (state / "hub").chmod(0o700)

    accounts = [instructor, *students]
    known = settings(state) if (state / "settings.json").exists() else {}
    created = list(known.get("created_accounts", []))
    group = known.get("group") or group
    if not group_exists(group):
        subprocess.run(["groupadd", group], check=True)
        created_group = True
    else:
        created_group = known.get("created_group", False)
    for name in accounts:
        if not user_exists(name):
            created.append(name)
        create_account(name, group)
    granted = sorted(set(known.get("acl_folders", [])) | set(grant_traversal(group)))

    conf = {"instructor": instructor, "students": students, "port": port,
            "hub_port": hub_port, "proxy_api_port": proxy_api_port,
            "course": str(state / "course"), "exchange": str(state / "exchange"),
            "repo": str(REPO), "venv_bin": str(VENV_BIN), "course_id": COURSE_ID,
            "created_accounts": sorted(set(created)), "acl_folders": granted,
            "group": group, "created_group": created_group,
            "limits": {**DEFAULT_LIMITS, **known.get("limits", {}), **(limits or {})},
            "cgroup_slice": slice_for(state)}
    (state / "settings.json").write_text(json.dumps(conf, indent=1) + "\n")

    if not (state / "secrets.json").exists():
        _write_private(state / "secrets.json", json.dumps(
            {"cookie_secret": secrets.token_hex(32), "proxy_token": secrets.token_hex(32)}))
    hashes = json.loads((state / "accounts.json").read_text()) \
        if (state / "accounts.json").exists() else {}
    new = {}
    for name in (accounts if logins else []):
        if passwords and name in passwords:
            new[name] = passwords[name]
        elif name not in hashes:
            new[name] = secrets.token_urlsafe(12)
    hashes.update({name: hash_password(pw) for name, pw in new.items()})
    hashes = {name: h for name, h in hashes.items() if name in accounts and logins}
    _write_private(state / "accounts.json", json.dumps(hashes, indent=1))
    if new:
        old = (state / "passwords.txt").read_text() if (state / "passwords.txt").exists() else ""
        keep = [ln for ln in old.splitlines() if ln.split(" ", 1)[0] not in new]
        _write_private(state / "passwords.txt", "\n".join(
            keep + [f"{n} {p}" for n, p in new.items()]) + "\n")

    # the exchange: root's folder, the course's folders the instructor's, one inbound
    # folder per student that only she writes (autograde/runner/exchange.py says why)
    from autograde.runner.exchange import layout
    layout(str(state / "exchange"), COURSE_ID, instructor, students)
    course = state / "course"
    course.mkdir(exist_ok=True)
    (course / "assignments").mkdir(exist_ok=True)
    for lab in labs or sorted(p.name for p in (REPO / "assignments").iterdir() if p.is_dir()):
        target = course / "assignments" / lab
        if not target.exists():
            shutil.copytree(REPO / "assignments" / lab, target,
                            ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    chown_tree(course, instructor, keep=[course / CONFIG_NAME])
    write_course_config(course, course_config(state, kernel_uid), instructor)
    for role in ("student", "instructor"):
        role_config(state, role, instructor)
    return new


# ---------------------------------------------------------------------------- run / stop
def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _read_pid(path: Path):
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def leftovers(state: Path) -> list[tuple[int, str]]:
    """Processes the hub leaves if it did not stop cleanly: the proxy, and anything running
    as one of the hub's accounts (their servers and kernels)."""
    found = []
    pid = _read_pid(state / "hub" / "proxy.pid")
    if pid and _alive(pid):
        found.append((pid, "configurable-http-proxy"))
    conf = settings(state)
    uids = {pwd.getpwnam(n).pw_uid for n in [conf["instructor"], *conf["students"]]
            if user_exists(n)}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid in uids:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:80]
                found.append((int(entry.name), cmd))
        except OSError:
            pass
    return found


def clean_up(state: Path, log=sys.stderr) -> list:
    """Stop what ``leftovers`` finds, by process id (TERM, then KILL)."""
    found = leftovers(state)
    for pid, what in found:
        log.write(f"stopping a leftover process {pid} ({what})\n")
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(pid) for pid, _ in found):
        time.sleep(0.2)
    for pid, _ in found:
        if _alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    # the users' cgroups (empty once their processes are gone), then the hub's own
    slice_name = settings(state).get("cgroup_slice")
    if slice_name:
        parents = [p for p in Path("/sys/fs/cgroup").glob(f"*/{slice_name}") if p.is_dir()]
        parents += [Path("/sys/fs/cgroup") / slice_name] \
            if (Path("/sys/fs/cgroup") / slice_name).is_dir() else []
        for parent in parents:
            remove_groups([g for g in parent.iterdir() if g.is_dir()] + [parent])
    return found


def hub_command(state: Path) -> tuple[list, dict]:
    env = dict(os.environ)
    env["MSDA_HUB_STATE"] = str(state)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env.pop("JUPYTER_CONFIG_DIR", None)
    env.pop("PYTHONPATH", None)      # the servers use the environment's install of the course
    return [str(VENV_BIN / "jupyterhub"), "-f", str(HERE / "jupyterhub_config.py")], env


def start(state: Path, log_file=None):
    """Run the hub in the foreground until SIGINT/SIGTERM, then stop it and check that
    nothing of it is left."""
    require_root()
    if _refuse_stale(state, "start", sys.stderr):
        return 2
    conf = settings(state)
    command, env = hub_command(state)
    (state / "hub" / "run.pid").write_text(f"{os.getpid()}\n")
    out = open(log_file, "a") if log_file else None
    hub = subprocess.Popen(command, cwd=state / "hub", env=env, stdout=out,
                           stderr=subprocess.STDOUT if out else None, start_new_session=True)
    stopping = {"signal": None}

    def _stop(signum, frame):
        stopping["signal"] = signum
        if hub.poll() is None:
            hub.send_signal(signal.SIGTERM)    # the hub stops the servers and the proxy

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    sys.stderr.write(f"course hub on http://127.0.0.1:{conf['port']}/ (passwords: "
                     f"{state / 'passwords.txt'}); Ctrl-C or `make hub-stop` stops it\n")
    try:
        while hub.poll() is None:
            try:
                hub.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass
    finally:
        if hub.poll() is None:
            hub.send_signal(signal.SIGTERM)
            try:
                hub.wait(timeout=60)
            except subprocess.TimeoutExpired:
                hub.kill()
                hub.wait()
        found = clean_up(state)
        sys.stderr.write("hub stopped" + (f"; {len(found)} leftover process(es) stopped\n"
                                          if found else "; nothing left running\n"))
        (state / "hub" / "run.pid").unlink(missing_ok=True)
        if out:
            out.close()
    return 0 if stopping["signal"] else hub.returncode


def stop(state: Path, timeout=90) -> int:
    require_root()
    pid = _read_pid(state / "hub" / "run.pid")
    if pid and _alive(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.2)
    found = clean_up(state)
    left = leftovers(state)
    print("hub stopped; " + (f"{len(found)} leftover process(es) stopped" if found
                             else "nothing left running"))
    return 1 if left else 0


# ---------------------------------------------------------------------------- grading
def links_in(path: Path) -> list[str]:
    """Every symbolic link under ``path`` (none is followed)."""
    found = []
    for folder, dirs, files in os.walk(path):
        found += [os.path.join(folder, n) for n in dirs + files
                  if os.path.islink(os.path.join(folder, n))]
    return sorted(found)


COURSE_MODE, FROZEN_MODE = 0o3770, 0o3750


def freeze(course: Path):
    """While root grades in it, the course folder is root's alone: the folder loses its
    group's write bit, and everything under it, top down, becomes root's (``lchown``; no
    link is followed) and loses the others' write bit.  The instructor's account can then
    read everything (the formgrader's pages work, read-only) but add, rename or swap
    nothing, so no link appears where root reads or writes.  ``chown_tree`` gives it all
    back afterwards."""
    fd = os.open(course, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        os.fchmod(fd, FROZEN_MODE)
    finally:
        os.close(fd)
    for folder, dirs, files in os.walk(course):   # a folder is frozen before it is read
        for name in dirs + files:
            path = os.path.join(folder, name)
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                continue                             # links_in reports it
            os.chown(path, 0, 0, follow_symlinks=False)
            if info.st_mode & 0o002:
                os.chmod(path, stat.S_IMODE(info.st_mode) & ~0o002)


def thaw(course: Path, instructor: str, log=sys.stderr):
    """The course folder back to the instructor (``freeze`` undone)."""
    fd = os.open(course, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        os.fchmod(fd, COURSE_MODE)
    finally:
        os.close(fd)
    chown_tree(course, instructor, keep=[course / CONFIG_NAME], log=log)


def grade(state: Path, lab: str, extra=(), log=sys.stderr) -> int:
    """``python -m autograde grade LAB`` on the course folder, as root (the sandbox gives
    every kernel its own uid), then hand the outputs back to the instructor's account so
    that the formgrader and feedback work from the instructor's server.

    Root runs no file that the instructor's account can write, and writes through none of
    her links: the course's nbgrader_config.py must be root's own
    (``course_config_problem``), Python does not put the course folder on its import path
    (``-P``, PYTHONSAFEPATH), the course folder is root's alone while grading runs
    (``freeze``), and grading refuses to start while it holds a link."""
    require_root()
    conf = settings(state)
    course = Path(conf["course"])
    problem = course_config_problem(course)
    if problem:
        log.write(f"hub.py grade: not grading: {problem}\n")
        return 2
    if _refuse_stale(state, "grade", log):
        return 2
    freeze(course)
    try:
        links = links_in(course)
        if links:
            log.write("hub.py grade: not grading: the course folder holds links, which the "
                      "grading step (root) would read or write through:\n" +
                      "".join(f"  {link} -> {os.readlink(link)}\n" for link in links) +
                      "remove them (they are not the course's) and grade again\n")
            return 2
        refused = course / "refused" / lab / "report.txt"
        if refused.is_file():
            log.write(f"hub.py grade: Collect refused submissions of {lab}; see {refused}\n")
        env = dict(os.environ)
        env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
        # the course's packages from the environment's install, as in every user's server:
        # the sandbox shows a kernel the folders the grader imported them from, nothing else
        env.pop("PYTHONPATH", None)
        env["PYTHONSAFEPATH"] = "1"          # and never a module from the course folder
        proc = subprocess.run([str(VENV_BIN / "python"), "-P", "-m", "autograde", "grade",
                               lab, "--root", conf["course"], "--no-progress", *extra],
                              cwd=conf["course"], env=env)
        return proc.returncode
    finally:
        thaw(course, conf["instructor"], log=log)


def remove_users(state: Path):
    """Delete the system accounts that setup created (and their home folders)."""
    require_root()
    conf = settings(state)
    if conf.get("group"):
        revoke_traversal(conf["group"], conf.get("acl_folders", []))
    for name in conf.get("created_accounts", []):
        if user_exists(name):
            subprocess.run(["userdel", "--remove", name], check=False,
                           stderr=subprocess.DEVNULL)
    if conf.get("created_group") and group_exists(conf["group"]):
        subprocess.run(["groupdel", conf["group"]], check=False, stderr=subprocess.DEVNULL)
    conf["created_accounts"] = []
    conf["created_group"] = False
    (state / "settings.json").write_text(json.dumps(conf, indent=1) + "\n")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["setup", "start", "stop", "grade", "remove-users"])
    parser.add_argument("lab", nargs="?")
    parser.add_argument("--state", type=Path, default=DEFAULT_STATE)
    parser.add_argument("--instructor", default="msda-instructor")
    parser.add_argument("--students", default="msda-alice,msda-bob,msda-carol")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--log")
    args = parser.parse_args(argv)
    state = args.state.resolve()
    if args.command == "setup":
        new = setup(state, args.instructor, args.students.split(","), port=args.port,
                    hub_port=args.port + 81, proxy_api_port=args.port + 1)
        for name in new:
            print(f"account {name}: new password in {state / 'passwords.txt'}")
        return 0
    if args.command == "start":
        return start(state, args.log)
    if args.command == "stop":
        return stop(state)
    if args.command == "grade":
        if not args.lab:
            parser.error("grade needs the lab, e.g. lab01_the_spec")
        return grade(state, args.lab)
    remove_users(state)
    return 0


if __name__ == "__main__":
    sys.exit(main())
