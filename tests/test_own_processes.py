"""The grading tests count only their own kernels' processes (tests/support/nbgrader_helpers.py):
another grading command on the host runs kernels of the same uid pool, before, during and
after, and its processes are not this run's leftovers."""
import json
import os
import subprocess
import time

from support.nbgrader_helpers import (POOL_BASE, POOL_COUNT, in_uid_pool, ledger_kernels,
                              own_processes, pool_processes)


def test_only_processes_started_during_a_kernels_lease_are_its_own():
    uid = POOL_BASE
    kernels = [(uid, 100.0, 110.0), (uid + 1, 105.0, 120.0)]
    snapshot = [
        (uid, 1, 99.0, "another run's kernel, before this one took the uid"),
        (uid, 2, 100.01, "left by this run's kernel"),          # within the tick's slack
        (uid, 3, 109.5, "left by this run's kernel, late"),
        (uid, 4, 110.5, "another run's kernel, after this one gave the uid back"),
        (uid + 1, 5, 104.0, "another run's, before"),
        (uid + 1, 6, 119.0, "left by this run's second kernel"),
        (uid + 2, 7, 106.0, "a uid this run never had"),
    ]
    assert [p[1] for p in own_processes(snapshot, kernels)] == [2, 3, 6]
    assert own_processes(snapshot, []) == []


def test_the_pool_bounds_and_the_ledgers_are_read_as_the_grader_writes_them(tmp_path):
    assert in_uid_pool(POOL_BASE) and in_uid_pool(POOL_BASE + POOL_COUNT - 1)
    assert not in_uid_pool(POOL_BASE - 1) and not in_uid_pool(POOL_BASE + POOL_COUNT)
    ledger = tmp_path / "autograde_status" / "labx"
    ledger.mkdir(parents=True)
    (ledger / "ada.json").write_text(json.dumps({"notebooks": {"labx": {"kernels": [
        {"incarnation": 1, "uid": POOL_BASE + 3, "start": 1.0, "end": 2.0},
        {"incarnation": 2, "uid": POOL_BASE + 4, "start": 3.0}]}}}))
    (ledger / "bob.json").write_text(json.dumps({"problems": ["no notebook"]}))
    before = time.time()
    kernels = ledger_kernels(tmp_path, "labx")
    assert kernels[0] == (POOL_BASE + 3, 1.0, 2.0)
    assert kernels[1][:2] == (POOL_BASE + 4, 3.0) and kernels[1][2] >= before   # still running


def test_a_snapshot_dates_processes_to_the_clock_tick():
    """pool_processes over a one-uid "pool" of this process's own uid finds a child started
    now, dated to within a second, with its command line."""
    started = time.time()
    child = subprocess.Popen(["sleep", "7"])
    try:
        time.sleep(0.2)
        mine = {p[1]: p for p in pool_processes(base=os.getuid(), count=1)}
        assert child.pid in mine, sorted(mine)[:20]
        uid, _, when, args = mine[child.pid]
        assert uid == os.getuid() and args == "sleep 7"
        assert abs(when - started) < 1.0, when - started
    finally:
        child.kill()
        child.wait()
