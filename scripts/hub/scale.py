"""A class of N students on the course hub's exchange on this host, measured.

    sudo python scripts/hub/scale.py --students 100 [--lab lab01_the_spec] [--workers W]
                                     [--out results/hub_scale_<host>.json] [--keep]

What runs, in a throw-away hub state folder (``hub.py setup``: N+1 system accounts, the course
folder, the exchange; the hub itself need not run, the exchange is a folder):

1. the instructor's account generates and releases the lab (``nbgrader generate_assignment``,
   ``release_assignment``);
2. every student, as their own uid, fetches the lab and submits through the hub's exchange
   (autograde/runner/exchange.py's ``FetchAssignment`` and ``Submit``, on nbgrader's, the calls
   behind the Assignment List's Fetch and Submit buttons), ``--submitters`` at a time; the
   answers cycle through the source notebook's solutions (10/10), lab 01's typical (y, x)
   mistake (6/10) and the untouched release (0/10), built as tests/support/hub_helpers.py builds
   them;
3. the instructor's account collects (``nbgrader collect``);
4. ``hub.py grade`` grades as root in the sandbox (``python -m autograde grade``);
5. every score is checked against its case, and the timings go to the results file with the
   host, its load, the command and the commit.
"""
from __future__ import annotations

import argparse
import json
import os
import pwd
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "tests"))

import hub as course_hub  # noqa: E402

CASES = (("solution", 10.0), ("mistake", 6.0), ("untouched", 0.0))


def _load():
    return [round(v, 2) for v in os.getloadavg()]


def _as(user: str, command: list, cwd: Path, timeout=3600) -> subprocess.CompletedProcess:
    entry = pwd.getpwnam(user)
    env = {"PATH": f"{course_hub.VENV_BIN}:/usr/bin:/bin", "HOME": entry.pw_dir,
           "USER": user, "LANG": "C.UTF-8"}
    proc = subprocess.run([str(c) for c in command], cwd=cwd, env=env, user=entry.pw_uid,
                          group=entry.pw_gid,
                          extra_groups=os.getgrouplist(user, entry.pw_gid),
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise SystemExit(f"{command} as {user} failed:\n{proc.stdout[-3000:]}\n"
                         f"{proc.stderr[-3000:]}")
    return proc


from nbgrader.auth import Authenticator  # noqa: E402  (imported once, before the forks)
from nbgrader.coursedir import CourseDirectory  # noqa: E402
from nbgrader.exchange import ExchangeFactory  # noqa: E402
from traitlets.config import Config  # noqa: E402

from autograde.runner.exchange import CLASSES as EXCHANGE_CLASSES  # noqa: E402
from source_kernels.provenance import host, provenance  # noqa: E402


def _submit_as(user: str, exchange: str, lab: str, notebook_text: str):
    """In a forked child: become ``user``, fetch and submit through nbgrader's exchange."""
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        entry = pwd.getpwnam(user)
        os.setgroups(os.getgrouplist(user, entry.pw_gid))
        os.setgid(entry.pw_gid)
        os.setuid(entry.pw_uid)
        os.environ.update(HOME=entry.pw_dir, USER=user, LOGNAME=user)
        os.chdir(entry.pw_dir)
        config = Config()
        config.Exchange.root = exchange
        config.CourseDirectory.course_id = course_hub.COURSE_ID
        config.CourseDirectory.assignment_id = lab
        config.CourseDirectory.root = entry.pw_dir
        for name, cls in EXCHANGE_CLASSES.items():       # the hub's exchange (owned folders)
            setattr(config.ExchangeFactory, name, cls)
        factory = ExchangeFactory(config=config)
        for step in (factory.FetchAssignment, None, factory.Submit):
            if step is None:
                Path(entry.pw_dir, lab, f"{lab}.ipynb").write_text(notebook_text)
                continue
            step(coursedir=CourseDirectory(config=config),
                 authenticator=Authenticator(config=config), config=config).start()
        code = 0
    except BaseException as exc:                     # noqa: BLE001
        sys.stderr.write(f"{user}: {type(exc).__name__}: {exc}\n")
    finally:
        os._exit(code)


class CpuMeter:
    """CPU seconds of everything this process starts while the meter runs: a cgroup-v1
    ``cpuacct`` group that this process joins (its children inherit it, the sandboxed kernels
    included, however they are reaped).  Without one, ``getrusage(RUSAGE_CHILDREN)``, which
    misses processes their parents never wait for."""

    BASE = Path("/sys/fs/cgroup/cpuacct")

    def __enter__(self):
        self.group = None
        self.rusage = resource.getrusage(resource.RUSAGE_CHILDREN)
        if (self.BASE / "tasks").exists():
            try:
                group = self.BASE / f"msda-scale-{os.getpid()}"
                group.mkdir(exist_ok=True)
                (group / "tasks").write_text(str(os.getpid()))
                self.group = group
            except OSError:
                self.group = None
        self.method = "cgroup v1 cpuacct.usage" if self.group else "getrusage(RUSAGE_CHILDREN)"
        return self

    def __exit__(self, *exc):
        if self.group is not None:
            self.seconds = int((self.group / "cpuacct.usage").read_text()) / 1e9
            (self.BASE / "tasks").write_text(str(os.getpid()))
            try:
                self.group.rmdir()
            except OSError:
                pass
        else:
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            self.seconds = (after.ru_utime - self.rusage.ru_utime) + \
                (after.ru_stime - self.rusage.ru_stime)
        return False


def run_provenance(argv, loads: dict) -> dict:
    """The course's provenance block (source_kernels.provenance), the CPU's side of the
    machine and the load averages through the run."""
    return {**provenance("sudo python scripts/hub/scale.py " + " ".join(argv)), "host": host(),
            "load_average_1_5_15min": loads,
            "note": "wall-clock seconds on a host shared with other work (see the load "
                    "averages); grading: python -m autograde grade in the bubblewrap sandbox, "
                    "Triton's CPU interpreter, one kernel per submission"}


def run(students: int, lab: str, workers, submitters: int, keep: bool, argv) -> dict:
    import nbformat

    from support import hub_helpers as hh

    course_hub.require_root()
    base = Path(tempfile.mkdtemp(prefix="msda-scale-", dir="/tmp"))
    base.chmod(0o755)
    state = base / "state"
    instructor = "msdascale-instr"
    names = [f"msdascale-{i:04d}" for i in range(students)]
    phases, loads = {}, {"start": _load()}
    result = {}
    try:
        t0 = time.monotonic()
        course_hub.setup(state, instructor, names, labs=[lab], logins=False,
                         group="msdascale", kernel_uid=66000)
        phases["accounts_and_course"] = time.monotonic() - t0
        course = state / "course"

        t0 = time.monotonic()
        _as(instructor, [course_hub.VENV_BIN / "nbgrader", "generate_assignment", lab],
            course)
        _as(instructor, [course_hub.VENV_BIN / "nbgrader", "release_assignment", lab], course)
        phases["generate_and_release"] = time.monotonic() - t0

        release = nbformat.read(course / "release" / lab / f"{lab}.ipynb", as_version=4)
        texts = {"solution": nbformat.writes(hh.solved(release, lab)),
                 "mistake": nbformat.writes(hh.with_mistake(release, lab)),
                 "untouched": nbformat.writes(release)}
        case_of = {name: CASES[i % len(CASES)] for i, name in enumerate(names)}

        # every student fetches and submits, as their own uid, `submitters` at a time
        loads["before_submit"] = _load()
        t0 = time.monotonic()
        running, failed = {}, []
        queue = list(names)
        while queue or running:
            while queue and len(running) < submitters:
                name = queue.pop(0)
                running[_submit_as(name, str(state / "exchange"), lab,
                                   texts[case_of[name][0]])] = name
            pid, status = os.wait()
            name = running.pop(pid, None)
            if name and status != 0:
                failed.append(name)
        phases["submit"] = time.monotonic() - t0
        if failed:
            raise SystemExit(f"{len(failed)} submission(s) failed: {failed[:5]}")
        inbound = list((state / "exchange" / course_hub.COURSE_ID / "inbound").glob(
            f"*/*+{lab}+*"))
        assert len(inbound) == students, (len(inbound), students)

        t0 = time.monotonic()
        _as(instructor, [course_hub.VENV_BIN / "nbgrader", "collect", lab], course)
        phases["collect"] = time.monotonic() - t0

        loads["before_grade"] = _load()
        extra = ["--workers", str(workers)] if workers else []
        with CpuMeter() as meter:
            t0 = time.monotonic()
            code = course_hub.grade(state, lab, extra)
            phases["grade"] = time.monotonic() - t0
        loads["after_grade"] = _load()
        if code != 0:
            raise SystemExit(f"grading failed with exit code {code}")
        cpu = meter.seconds

        env = dict(os.environ)
        env.pop("PYTHONPATH", None)
        out = base / "report.json"
        subprocess.run([sys.executable, "-m", "autograde", "report", lab, "--root",
                        str(course), "--json", str(out)], cwd=course, env=env, check=True,
                       capture_output=True, timeout=600)
        rows = {r["student_id"]: r for r in json.loads(out.read_text())}
        wrong = [(n, rows.get(n, {}).get("score"), case_of[n]) for n in names
                 if n not in rows or rows[n]["score"] in ("", None)
                 or float(rows[n]["score"]) != case_of[n][1]]
        statuses = {}
        for row in rows.values():
            statuses[row["status"]] = statuses.get(row["status"], 0) + 1

        per_sub_cpu = cpu / students
        result = {
            "provenance": run_provenance(argv, loads),
            "lab": lab, "students": students,
            "cases": {c: sum(1 for n in names if case_of[n][0] == c) for c, _ in CASES},
            "grading_workers": workers or "default (cores)",
            "submitters_at_once": submitters,
            "seconds": {k: round(v, 1) for k, v in phases.items()},
            "submissions_per_minute": {
                "submit": round(students / phases["submit"] * 60, 1),
                "collect": round(students / phases["collect"] * 60, 1),
                "grade": round(students / phases["grade"] * 60, 1),
                "submit_collect_grade": round(students / (phases["submit"] + phases["collect"]
                                                          + phases["grade"]) * 60, 1),
            },
            "grade_cpu_seconds": round(cpu, 1),
            "grade_cpu_measured_by": meter.method,
            "grade_cpu_seconds_per_submission": round(per_sub_cpu, 2),
            "statuses": statuses,
            "scores_as_expected": not wrong,
            "unexpected_scores": wrong[:20],
        }
        return result
    finally:
        if not keep:
            try:
                course_hub.remove_users(state)
            finally:
                shutil.rmtree(base, ignore_errors=True)
        else:
            print(f"kept {base}", file=sys.stderr)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=100)
    parser.add_argument("--lab", default="lab01_the_spec")
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--submitters", type=int, default=None,
                        help="students submitting at once (default: the cores)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--keep", action="store_true", help="keep the state and accounts")
    args = parser.parse_args(argv)
    submitters = args.submitters or len(os.sched_getaffinity(0))
    result = run(args.students, args.lab, args.workers, submitters, args.keep, argv)
    out = Path(args.out or REPO / "results" / f"hub_scale_{socket.gethostname()}.json")
    runs = []
    if out.exists():
        try:
            runs = json.loads(out.read_text()).get("runs", [])
        except ValueError:
            runs = []
    runs = [r for r in runs if r.get("students") != args.students] + [result]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"runs": sorted(runs, key=lambda r: r["students"])}, indent=1)
                   + "\n")
    print(json.dumps({k: result[k] for k in ("students", "seconds", "submissions_per_minute",
                                             "grade_cpu_seconds_per_submission", "statuses",
                                             "scores_as_expected")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
