"""Per-user limits of the course hub (scripts/hub/hub_limits.py), without a hub.

A process started the way ``LimitedSpawner`` starts a user's server (join the user's
cgroups, set the rlimits, drop to the account) as ``nobody``, with small limits, then made to
exceed each: more threads than its task limit, more memory than its memory limit, a file
larger than its file limit, a busy loop against its CPU quota.  Each limit holds.  The
cgroup part runs where root can create cgroups here (it is skipped, with the reason,
elsewhere); the rlimits are checked everywhere.
"""
from __future__ import annotations

import os
import pwd
import subprocess
import tempfile
import time

import pytest

from hub import hub_limits      # scripts/hub/hub_limits.py (scripts/ is on pythonpath)

# the child runs as nobody, who may not enter the folder of the course's environment
SYSTEM_PYTHON = "/usr/bin/python3"

CHILD = r"""
import os, sys, threading, time
what = sys.argv[1]
if what == "threads":
    started = 0
    stop = threading.Event()
    try:
        for _ in range(400):
            threading.Thread(target=stop.wait, daemon=True).start()
            started += 1
    except RuntimeError:
        pass
    print(started)
    stop.set()
elif what == "memory":
    blocks = []
    try:
        for _ in range(400):
            blocks.append(bytearray(1 << 20))      # touched: counted by the memory group
        print("allocated", len(blocks))
    except MemoryError:
        print("MemoryError", len(blocks))
elif what == "file":
    try:
        with open(sys.argv[2], "wb") as fh:
            fh.write(b"x" * (3 << 20))
        print("wrote")
    except OSError as exc:
        print("OSError", exc.errno)
elif what == "cpu":
    end = time.monotonic() + 2.0
    while time.monotonic() < end:
        pass
    print(os.times().user + os.times().system)
"""


def _run(what, groups, limits, *args):
    nobody = pwd.getpwnam("nobody")

    def drop():
        os.setgroups([])
        os.setgid(nobody.pw_gid)
        os.setuid(nobody.pw_uid)

    return subprocess.run([SYSTEM_PYTHON, "-c", CHILD, what, *args], capture_output=True,
                          text=True, timeout=60, cwd="/",
                          preexec_fn=hub_limits.limiting(groups, limits, drop))


@pytest.fixture
def groups():
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"no {SYSTEM_PYTHON} for the limited child")
    if os.geteuid() != 0:
        pytest.skip("cgroups and rlimits for another account need root")
    if hub_limits.cgroup_version() is None:
        pytest.skip("root cannot create cgroups on this host (no writable /sys/fs/cgroup): "
                    "the hub falls back to rlimits, tested by test_rlimits_hold")
    name = f"msda-hub-test{os.getpid()}"
    made = hub_limits.make_groups(name, "nobody", 64 << 20, 0.25, 40)
    yield made
    hub_limits.remove_groups(made)
    for parent in {g.parent for g in made}:
        hub_limits.remove_groups([parent])


def test_cgroup_limits_hold(groups):
    # tasks: the interpreter's own thread plus 39 at most
    started = _run("threads", groups, [])
    assert started.returncode == 0, started.stderr
    assert 0 < int(started.stdout) < 40, started.stdout

    # memory: 64 MiB; the 400 MiB allocation ends in the group's OOM kill (or MemoryError)
    memory = _run("memory", groups, [])
    assert memory.returncode != 0 or "MemoryError" in memory.stdout, \
        (memory.returncode, memory.stdout)
    assert "allocated 400" not in memory.stdout

    # CPU: a quarter of a core; 2 s of busy loop get about 0.5 s of CPU time
    start = time.monotonic()
    cpu = _run("cpu", groups, [])
    assert cpu.returncode == 0, cpu.stderr
    assert float(cpu.stdout) < 1.0, (cpu.stdout, time.monotonic() - start)

    # the process was in the user's groups
    probe = subprocess.run(["cat", "/proc/self/cgroup"], capture_output=True, text=True,
                           preexec_fn=hub_limits.limiting(groups, []))
    for group in groups:
        assert f"{group.parent.name}/{group.name}" in probe.stdout, probe.stdout


def test_rlimits_hold():
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"no {SYSTEM_PYTHON} for the limited child")
    if os.geteuid() != 0:
        pytest.skip("rlimits for another account need root")
    limits = hub_limits.rlimits(256 << 20, 0, 1 << 20, with_memory=True)
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o777)
        wrote = _run("file", [], limits, os.path.join(tmp, "big"))
        assert wrote.stdout.strip() == "OSError 27", wrote.stdout + wrote.stderr
        assert os.path.getsize(os.path.join(tmp, "big")) <= 1 << 20
    memory = _run("memory", [], limits)
    assert "MemoryError" in memory.stdout, (memory.returncode, memory.stdout, memory.stderr)
