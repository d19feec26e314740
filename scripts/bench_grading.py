"""Throughput of grading a class: nbgrader's sequential ``autograde`` against the parallel
``python -m autograde grade``, on the same submissions, in seconds per submission.

    python scripts/bench_grading.py [--students 16] [--workers N] [--lab lab01_the_spec]
                                    [--out results/grading_throughput.json]

For each class measured, the script builds a throw-away course, runs ``nbgrader autograde``
on one copy and the parallel command on another, checks that both gave every student the
same score, and writes the timings with their provenance.  Classes:

- ``fixture``: the test course's lab ``labfx`` (tests/fixtures/course), N students cycling
  through a correct, a partly wrong and an empty submission;
- ``--lab NAME`` (a lab of this repository): N students cycling through the source notebook
  (full marks) and the untouched release (zero).

``--compare-with CHECKOUT`` times only the parallel command on the fixture class, with the
code of an earlier checkout and of this one, alternately and back to back, and keeps the
result beside the other runs (key ``isolation_before_after``).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _env():
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


def _run(args, cwd, check=True):
    proc = subprocess.run([str(a) for a in args], cwd=cwd, env=_env(), capture_output=True,
                          text=True)
    if check and proc.returncode != 0:
        raise SystemExit(f"{args} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def _scores(course, assignment):
    sys.path.insert(0, str(REPO))
    from autograde.runner.cli import report_rows
    return {r["student_id"]: (r.get("score"), r["status"])
            for r in report_rows(str(course), assignment)}


def _fixture_class(base, students):
    course = base / "course"
    shutil.copytree(REPO / "tests" / "fixtures" / "course", course)
    _run([BIN / "nbgrader", "generate_assignment", "labfx"], course)
    sys.path.insert(0, str(REPO / "scripts"))
    import make_synthetic_class as gen
    cases = gen.build(str(course), 9)
    kinds = ["correct", "partly_wrong", "empty"]
    for i in range(students):
        kind = kinds[i % len(kinds)]
        folder = course / "submitted" / f"s{i:03d}_{kind}" / "labfx"
        folder.mkdir(parents=True)
        import nbformat
        nbformat.write(cases[kind], folder / "labfx.ipynb")
        (folder / "timestamp.txt").write_text(gen.TIMESTAMP)
    return course, "labfx"


def _lab_class(base, lab, students):
    course = base / "course"
    course.mkdir()
    shutil.copy(REPO / "nbgrader_config.py", course / "nbgrader_config.py")
    shutil.copytree(REPO / "assignments" / lab, course / "assignments" / lab)
    _run([BIN / "nbgrader", "generate_assignment", lab], course)
    for i in range(students):
        kind = "solution" if i % 2 == 0 else "untouched"
        folder = course / "submitted" / f"s{i:03d}_{kind}" / lab
        folder.mkdir(parents=True)
        src = course / ("assignments" if kind == "solution" else "release") / lab / f"{lab}.ipynb"
        shutil.copy(src, folder / f"{lab}.ipynb")
    return course, lab


def measure(name, build, students, workers):
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-grading-") as tmp:
        base = Path(tmp)
        course, assignment = build(base, students)
        twin = base / "twin"
        shutil.copytree(course, twin)
        started = time.monotonic()
        _run([BIN / "nbgrader", "autograde", assignment], course, check=False)
        sequential = time.monotonic() - started
        started = time.monotonic()
        cmd = [BIN / "python", "-m", "autograde", "grade", assignment, "--no-progress"]
        if workers:
            cmd += ["--workers", str(workers)]
        _run(cmd + ["--json", base / "summary.json"], twin)
        parallel = time.monotonic() - started
        summary = json.loads((base / "summary.json").read_text())
        seq_scores, par_scores = _scores(course, assignment), _scores(twin, assignment)
        return {
            "class": name, "assignment": assignment, "submissions": students,
            "sequential": {"command": f"nbgrader autograde {assignment}",
                           "seconds": round(sequential, 2),
                           "seconds_per_submission": round(sequential / students, 3)},
            "parallel": {"command": "python " + " ".join(str(c) for c in cmd[1:]),
                         "workers": summary["workers"], "seconds": round(parallel, 2),
                         "seconds_per_submission": round(parallel / students, 3)},
            "speedup": round(sequential / parallel, 2),
            "load_average_1min": {"before": round(load_before, 2),
                                  "after": round(os.getloadavg()[0], 2)},
            "same_scores": seq_scores == par_scores,
            "scores": {s: v[0] for s, v in sorted(seq_scores.items())},
        }


def provenance(argv):
    """The course's provenance block (source_kernels.provenance), the CPU's side of the
    machine and nbgrader's version."""
    import nbgrader

    from source_kernels.provenance import host, provenance as block
    return {**block("python scripts/bench_grading.py " + " ".join(argv)), "host": host(),
            "nbgrader": nbgrader.__version__,
            "note": "wall-clock seconds; each submission starts its own sandboxed kernel, "
                    "which imports torch and triton; the machine may be shared (see each "
                    "run's load average)"}


def _commit(checkout):
    proc = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True,
                          text=True)
    dirty = subprocess.run(["git", "-C", str(checkout), "status", "--porcelain",
                            "--untracked-files=no"], capture_output=True, text=True).stdout
    return proc.stdout.strip() + ("+uncommitted" if dirty.strip() else "")


def grade_with(checkout, students, workers):
    """Seconds of ``python -m autograde grade`` over the fixture class, with the grader and
    the grading kernels importing the course packages from ``checkout`` (the kernel through
    ``extra_python_paths``, the same way for every checkout); returns (seconds, scores)."""
    checkout = Path(checkout).resolve()
    with tempfile.TemporaryDirectory(prefix="bench-grading-") as tmp:
        course, assignment = _fixture_class(Path(tmp), students)
        with open(course / "nbgrader_config.py", "a") as fh:
            fh.write("\nc.AutogradeSettings.extra_python_paths = "
                     f"list(c.AutogradeSettings.extra_python_paths) + [{str(checkout)!r}]\n")
        env = _env()
        env["PYTHONPATH"] = str(checkout)
        cmd = [BIN / "python", "-m", "autograde", "grade", assignment, "--no-progress",
               "--workers", str(workers)]
        started = time.monotonic()
        proc = subprocess.run([str(c) for c in cmd], cwd=course, env=env, capture_output=True,
                              text=True)
        seconds = time.monotonic() - started
        if proc.returncode != 0:
            raise SystemExit(f"{cmd} failed:\n{proc.stderr[-3000:]}")
        scores = {}
        for line in proc.stdout.splitlines():
            parts = line.split()
            if parts and parts[0].startswith("s0"):
                scores[parts[0]] = parts[1]
        return seconds, scores


def compare(before, students, workers, repeats, argv, out):
    """The parallel command over the fixture class with the code of ``before`` (an earlier
    checkout) and of this checkout, alternately, ``repeats`` times each, back to back."""
    rows = {"before": [], "after": []}
    scores = {}
    for _ in range(repeats):
        for label, checkout in (("before", before), ("after", REPO)):
            load = os.getloadavg()[0]
            seconds, got = grade_with(checkout, students, workers)
            scores.setdefault(label, got)
            rows[label].append({"seconds": round(seconds, 2),
                                "seconds_per_submission": round(seconds / students, 3),
                                "load_average_1min_before": round(load, 2)})
            print(f"{label}: {seconds / students:.3f} s/submission (load {load:.2f})")
    summary = {}
    for label, runs in rows.items():
        per = sorted(r["seconds_per_submission"] for r in runs)
        summary[label] = {"checkout_commit": _commit(before if label == "before" else REPO),
                          "runs": runs, "median_seconds_per_submission": per[len(per) // 2]}
    ratio = summary["after"]["median_seconds_per_submission"] / \
        summary["before"]["median_seconds_per_submission"]
    pairs = sorted(round(a["seconds"] / b["seconds"], 3)
                   for b, a in zip(rows["before"], rows["after"]))
    result = {"provenance": dict(provenance(argv), note="wall-clock seconds of the parallel command over the "
                                      "fixture class; before and after measured back to back, "
                                      "alternately, on the same shared machine (see the load "
                                      "averages)"),
              "class": {"assignment": "labfx", "submissions": students, "workers": workers,
                        "kinds": "correct, partly_wrong, empty in turn"},
              "command": f"python -m autograde grade labfx --no-progress --workers {workers}",
              "before": summary["before"], "after": summary["after"],
              "after_over_before": round(ratio, 3),
              "after_over_before_by_pair": pairs,
              "median_of_pair_ratios": pairs[len(pairs) // 2],
              "same_scores": scores.get("before") == scores.get("after"),
              "scores": scores.get("after")}
    path = Path(out)
    data = json.loads(path.read_text()) if path.exists() else {}
    data["isolation_before_after"] = result
    path.write_text(json.dumps(data, indent=1) + "\n")
    print(f"after/before: {ratio:.3f} (medians), by pair {pairs}; same scores: "
          f"{result['same_scores']}")
    return 0


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=16)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--lab", action="append", default=[],
                        help="also measure a lab of the repository (repeatable)")
    parser.add_argument("--out", default=str(REPO / "results" / "grading_throughput.json"))
    parser.add_argument("--compare-with", metavar="CHECKOUT", help=(
        "only time the parallel command over the fixture class, with the code of CHECKOUT "
        "(an earlier commit's worktree) and of this checkout, alternately; the result goes "
        "to the key isolation_before_after of --out"))
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    if args.compare_with:
        return compare(args.compare_with, args.students, args.workers or 2, args.repeats, argv,
                       args.out)
    runs = [measure("fixture", _fixture_class, args.students, args.workers)]
    for lab in args.lab:
        runs.append(measure(lab, lambda base, n, lab=lab: _lab_class(base, lab, n),
                            args.students, args.workers))
    result = {"provenance": provenance(argv), "runs": runs}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    for run in runs:
        print(f"{run['class']}: {run['submissions']} submissions; sequential "
              f"{run['sequential']['seconds_per_submission']} s/submission, parallel "
              f"({run['parallel']['workers']} workers) "
              f"{run['parallel']['seconds_per_submission']} s/submission; same scores: "
              f"{run['same_scores']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
