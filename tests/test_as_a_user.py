"""``make test`` as an ordinary user ends in passes and skips, never in errors.

CI runs as root, where the grading sandbox works; a newcomer often does not.  This test runs a
part of the suite as the unprivileged ``nobody`` (``setpriv``), from a copy of the repository
that the user owns (the tests write beside it, for example screenshots under ``_build/``):

- the whole suite is collected without an error;
- tests/test_feedback.py's module set-up grades a real lab (lab 07) with the course's own
  configuration, which requires the sandbox on Linux: as an ordinary user the test course
  grades without it (``nbgrader_helpers.unsandboxed_grading_config``) and the test passes;
  tests/test_labs_00_04.py and tests/test_labs_05_10.py build their courses the same way;
- the tests that need the sandbox (tests/test_grading.py, tests/test_cheats.py) skip, each
  with a one-line reason naming the command that runs them.

Where the course's Python lies under a folder other accounts cannot enter (CI's pyenv build
under root's home), the user is let in by an ACL entry for the length of the test.
"""
from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
USER = "nobody"
# what the copy leaves out: the environment, outputs of the course's commands, caches
NOT_COPIED = (".git", ".venv", "_build", "release", "submitted", "autograded", "feedback",
              "autograde_status", "__pycache__", ".pytest_cache", "*.egg-info", "node_modules")
GRADES_A_LAB = "test_report_lists_pending_answers_before_they_are_graded"
SANDBOX_REASON = "the grading sandbox switches the kernel to another uid, which needs root " \
                 "(to run this test: sudo make test)"


@contextmanager
def _traversal(account):
    """Let ``account`` enter (not list) the folders above the course's Python and checkout that
    others may not enter, as the hub does for its accounts (``hub.py``'s grant_traversal): one
    POSIX ACL entry ``u:ACCOUNT:--x`` each, taken away afterwards.  CI's interpreter is a pyenv
    build under root's 0700 home, so without this the test could only skip there.  Yields the
    folders it opened; a folder that has an entry for the account already is left as it is."""
    from support.hub_helpers import hub_module

    blocked_ancestors = hub_module()._blocked_ancestors      # the hub's own rule
    paths = (Path(sys.executable).parent, Path(os.path.realpath(sys.executable)).parent, REPO)
    folders = sorted({str(f) for p in paths for f in blocked_ancestors(p)})
    if folders and shutil.which("setfacl") is None:
        pytest.skip(f"the course's Python lies under {folders[0]}, which {account.pw_name} "
                    "cannot enter, and setfacl is missing to let it in (apt-get install acl)")
    granted = []
    try:
        for folder in folders:
            listing = subprocess.run(["getfacl", "--omit-header", "--numeric", folder],
                                     capture_output=True, text=True).stdout
            if f"user:{account.pw_uid}:" in listing:
                continue
            subprocess.run(["setfacl", "-m", f"u:{account.pw_uid}:--x", folder], check=True)
            granted.append(folder)
        yield folders
    finally:
        for folder in granted:
            subprocess.run(["setfacl", "-x", f"u:{account.pw_uid}", folder], check=False,
                           stderr=subprocess.DEVNULL)


def _as_user(account, args, cwd, home, timeout):
    env = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}/usr/bin{os.pathsep}/bin",
           "HOME": str(home), "LANG": "C.UTF-8"}
    if os.environ.get("LD_LIBRARY_PATH"):       # an interpreter that needs it (pyenv, conda)
        env["LD_LIBRARY_PATH"] = os.environ["LD_LIBRARY_PATH"]
    command = ["setpriv", f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}",
               "--clear-groups", *map(str, args)]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def user_copy():
    """(account, a copy of the repository the user owns, its HOME)."""
    if os.geteuid() != 0:
        pytest.skip("runs part of the suite as another user, which needs root; this run is "
                    "an ordinary user's already")
    if shutil.which("setpriv") is None:
        pytest.skip("needs setpriv (util-linux) to run the tests as another user")
    try:
        account = pwd.getpwnam(USER)
    except KeyError:
        pytest.skip(f"this machine has no account {USER!r} to run the tests as")
    base = Path(tempfile.mkdtemp(prefix="course-as-a-user-"))
    try:
        with _traversal(account) as opened:
            base.chmod(0o755)
            copy, home = base / "course", base / "home"
            shutil.copytree(REPO, copy, symlinks=True,
                            ignore=shutil.ignore_patterns(*NOT_COPIED))
            home.mkdir()
            for path in (base, copy, home, *copy.rglob("*"), *home.rglob("*")):
                os.lchown(path, account.pw_uid, account.pw_gid)
            # as the tests will: programs of the environment through their #! lines, from PATH
            probe = _as_user(account, ["sh", "-c", "nbgrader --version && python -c 'import "
                                       "autograde, torch'"], copy, home, 300)
            assert probe.returncode == 0, (
                f"the course's Python ({sys.executable}) cannot be run by {USER}, although "
                f"it may enter {opened or 'every folder above it'}: "
                f"{(probe.stderr.strip().splitlines() or ['?'])[-1][:300]}")
            yield account, copy, home
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_the_suite_as_an_ordinary_user_skips_what_needs_root(user_copy):
    account, copy, home = user_copy
    collected = _as_user(account, [sys.executable, "-m", "pytest", "--collect-only", "-q",
                                   "-p", "no:cacheprovider", "tests"], copy, home, 600)
    assert collected.returncode == 0, collected.stdout[-3000:] + collected.stderr[-3000:]
    assert re.search(r"^\d+ tests collected", collected.stdout, re.M), collected.stdout[-2000:]

    proc = _as_user(account, [
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rsfEp",
        f"tests/test_feedback.py::{GRADES_A_LAB}", "tests/test_grading.py",
        "tests/test_cheats.py"], copy, home, 1200)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    summary = proc.stdout.strip().splitlines()[-1]
    assert "error" not in summary and "failed" not in summary, summary
    assert re.search(r"\b\d+ passed", summary) and re.search(r"\b\d+ skipped", summary), summary
    # the lab graded in the module set-up, as the user, and the test on its report passed
    assert f"PASSED tests/test_feedback.py::{GRADES_A_LAB}" in out, out[-5000:]
    # the sandbox tests of both modules skip, each with the one-line reason
    report = proc.stdout.split("short test summary info", 1)[1].strip().splitlines()[1:-1]
    assert all(line.startswith(("SKIPPED", "PASSED")) for line in report), report
    skips = [line for line in report if line.startswith("SKIPPED")]
    for module in ("tests/test_grading.py", "tests/test_cheats.py"):
        assert any(module in line and line.endswith(SANDBOX_REASON) for line in skips), skips
