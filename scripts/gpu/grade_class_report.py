"""The JSON record of the grading part of scripts/gpu/run.py: provenance, every student's score, status and
reasons from the parallel run, the comparison with scripts/gpu/grade_class_expected.py, the
sequential run beside it, the feedback and the export.

    python3 scripts/gpu/grade_class_report.py WORK OUTFILE

WORK is the run's folder (par/ and seq/ course copies, logs/, steps.tsv, settings.json).
"""
from __future__ import annotations

import csv
import glob
import importlib.metadata
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

from grade_class_expected import compare
from source_kernels.provenance import provenance

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
ASSIGNMENT = "labfx"


def _run(cmd, timeout=30):
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, str(exc)
    return done.returncode, (done.stdout + done.stderr).strip()


def _version(name):
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _ledger(course):
    folder = Path(course) / "autograde_status" / ASSIGNMENT
    return {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}


def _rows(course):
    from autograde.runner.cli import report_rows
    return {r["student_id"]: {k: r.get(k) for k in ("score", "max_score", "status", "reasons")}
            for r in report_rows(str(course), ASSIGNMENT)}


def _score(value):
    return None if value in ("", None) else float(value)


def _environment_lines(course):
    """The 'grading environment: ...' lines of the nbgrader logs, with the student names cut."""
    lines = set()
    for path in glob.glob(str(Path(course) / "autograde_status" / ASSIGNMENT / "logs" / "*.log")):
        with open(path, errors="replace") as fh:
            for line in fh:
                match = re.search(r"(grading environment: .*)$", line.strip())
                if match:
                    lines.add(re.sub(r"as uid \d+", "as uid N", match.group(1)))
    return sorted(lines)


def _cell_errors(course, student, gids):
    """The error each not-passed graded cell shows in the autograded notebook."""
    path = Path(course) / "autograded" / student / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
    if not gids or not path.exists():
        return {}
    try:
        cells = json.loads(path.read_text())["cells"]
    except (OSError, ValueError, KeyError):
        return {}
    out = {}
    for cell in cells:
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if gid in gids:
            shown = [f"{o.get('ename')}: {o.get('evalue')}"[:300] for o in cell.get("outputs", [])
                     if o.get("output_type") == "error"]
            if shown:
                out[gid] = shown
    return out


def _students(course, rows):
    from autograde.pipeline.status import summarize
    ledger = _ledger(course)
    out = {}
    for student, row in rows.items():
        entry = ledger.get(student, {})
        nb = entry.get("notebooks", {}).get(ASSIGNMENT, {})
        # the report joins the reasons with "; ", which some reasons hold too: the ledger's list
        reasons = summarize(entry)[1] if entry else [r for r in [row["reasons"]] if r]
        cells = {gid: v.get("verdict") + (f" ({v.get('message')})" if v.get("verdict") != "pass"
                                          else "")
                 for gid, v in sorted(nb.get("verdicts", {}).items())}
        errors = _cell_errors(course, student, [gid for gid, v in nb.get("verdicts", {}).items()
                                                if v.get("verdict") != "pass"])
        out[student] = {"score": _score(row["score"]), "max_score": _score(row["max_score"]),
                        "status": row["status"],
                        "reasons": reasons,
                        "cells": cells, "cell_errors": errors,
                        "environment": nb.get("environment"), "sandbox": nb.get("sandbox")}
    return out


def _probe(work):
    """``python -m autograde probe``'s findings ("key: value" lines), or None."""
    path = Path(work) / "logs" / "probe.log"
    if not path.exists():
        return None
    found = {}
    for line in path.read_text(errors="replace").splitlines():
        key, sep, value = line.partition(": ")
        if sep and key.strip() and not key.lstrip().startswith(("[", "Traceback", "File")):
            found[key.strip()] = value.strip()
    return found or None


def _steps(work):
    steps = []
    path = Path(work) / "steps.tsv"
    if path.exists():
        for line in path.read_text().splitlines():
            name, code, ms, command = (line.split("\t") + ["", "", "", ""])[:4]
            steps.append({"step": name, "exit": int(code), "seconds": round(int(ms) / 1000, 1),
                          "command": command})
    return steps


def _feedback(course):
    """The test suite's feedback checks, on partly_wrong's page."""
    page = Path(course) / "feedback" / "partly_wrong" / ASSIGNMENT / f"{ASSIGNMENT}.html"
    pages = sorted(p.parts[-3] for p in (Path(course) / "feedback").glob(f"*/{ASSIGNMENT}/*.html"))
    if not page.exists():
        return {"pages": pages, "ok": False, "why": "no feedback page for partly_wrong"}
    html = page.read_text()
    leaked = [h for h in ("fixture_checks", "check_corner_weights", "BEGIN HIDDEN TESTS",
                          "warnings.warn") if h in html]
    shown = {"hidden tests: not shown": "hidden tests: not shown" in html,
             "AssertionError: corner 1 of": "AssertionError: corner 1 of" in html}
    return {"pages": pages, "hidden_code_shown": leaked, "shown": shown,
            "ok": not leaked and all(shown.values())}


def _export(path, report):
    if not Path(path).exists():
        return {"ok": False, "why": "no grades.csv"}
    with open(path) as fh:
        rows = {r["student_id"]: r for r in csv.DictReader(fh)}
    mismatch = [s for s, r in report.items() if s in rows and
                (_score(rows[s]["score"]), rows[s]["status"]) != (r["score"], r["status"])]
    missing = sorted(set(report) - set(rows))
    ungradable_blank = all(rows[s]["score"] == "" for s in ("corrupt_json", "missing_notebook")
                           if s in rows)
    return {"rows": len(rows), "differs_from_report": mismatch, "missing": missing,
            "ungradable_scores_blank": ungradable_blank,
            "ok": not mismatch and not missing and ungradable_blank}


def _sequential(work, settings, parallel):
    course = Path(work) / "seq"
    if settings.get("sequential") in ("0", "", None) or not (course / "gradebook.db").exists():
        return {"ran": False}
    rc_file = Path(work) / "sequential.rc"
    code = int(rc_file.read_text().strip()) if rc_file.exists() else None
    try:
        rows = _rows(course)
    except Exception as exc:                               # noqa: BLE001
        return {"ran": True, "exit": code, "error": f"report failed: {exc}"}
    ledger = _ledger(course)
    done = sorted(s for s, e in ledger.items() if e.get("state") == "done")
    # the two broken submissions never reach 'done' in nbgrader's own run
    finished = [s for s in rows if s in done or rows[s]["status"] == "ungradable"
                and ledger.get(s, {}).get("problems")]
    students = _students(course, {s: rows[s] for s in finished})
    differs = {s: {"sequential": (students[s]["score"], students[s]["status"]),
                   "parallel": (parallel[s]["score"], parallel[s]["status"])}
               for s in finished if s in parallel and
               (students[s]["score"], students[s]["status"]) !=
               (parallel[s]["score"], parallel[s]["status"])}
    failed = set()
    log = Path(work) / "logs" / "sequential.log"
    if log.exists():
        failed = {line.split("for student '")[1].split("'")[0]
                  for line in log.read_text(errors="replace").splitlines()
                  if "for student '" in line}
    return {"ran": True, "mode": settings.get("sequential"), "exit": code,
            "timed_out": code in (124, 137),
            "finished": len(finished), "of": len(rows), "not_finished":
                sorted(set(rows) - set(finished)),
            "nbgrader_failed_for": sorted(failed),
            "differs_from_parallel": differs, "students": students}


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    work, outfile = Path(argv[0]), Path(argv[1])
    settings = json.loads((work / "settings.json").read_text())
    par = work / "par"
    rows = _rows(par)
    students = _students(par, rows)
    used = sorted({s["environment"] for s in students.values() if s["environment"]})
    sandboxes = sorted({s["sandbox"] for s in students.values() if s["sandbox"]})
    environment = used[0] if len(used) == 1 else None
    comparison = compare(rows, environment) if environment else \
        {"all_as_expected": False, "problems": [f"grading environments used: {used}"]}
    code, smi = _run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"])
    smi = smi if code == 0 else ""
    gpu_rows = [line for line in (smi or "").splitlines() if line and "," in line]
    _, sandbox_check = _run([sys.executable, "-m", "autograde.isolation.sandbox", "check"])
    canary_file = work / "canary.txt"
    canary = [c for c in canary_file.read_text().splitlines() if c] if canary_file.exists() \
        else None
    sequential = _sequential(work, settings, students)
    for student, entry in comparison.get("students", {}).items():
        if student in students:
            students[student]["comparison"] = entry
    seq_comparison = None
    if sequential.get("students") and environment:
        seq_rows = {s: {"score": v["score"], "max_score": v["max_score"], "status": v["status"],
                        "reasons": "; ".join(v["reasons"])}
                    for s, v in sequential["students"].items()}
        seq_comparison = compare(seq_rows, environment)
        seq_comparison["problems"] = [p for p in seq_comparison["problems"]
                                      if p.split(":")[0] in seq_rows]
        seq_comparison["all_as_expected"] = not seq_comparison["problems"]
        seq_comparison.pop("students")
    summary_path = work / "par_summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    steps = _steps(work)
    feedback, export = _feedback(par), _export(work / "grades.csv", students)
    probe = _probe(work) or {}
    checks = {
        "kernel_sees_a_gpu_exactly_in_the_gpu_environment":
            probe.get("torch.cuda.is_available()") == str(environment == "gpu"),
        "feedback": feedback["ok"], "export": export["ok"],
        "nothing_reached_the_grader": canary == [],
        "sequential_gives_the_parallel_scores": not sequential.get("differs_from_parallel"),
        "no_step_timed_out": not [s for s in steps if s["exit"] in (124, 137)
                                  and s["step"] != "sequential"],
    }
    record = {
        # the course's provenance block, then what a grading run adds to it
        "provenance": {
            **provenance(settings["command"]),
            "gpus": [r.split(",")[0].strip() for r in gpu_rows] or None,
            "host": socket.gethostname(), "cores": len(os.sched_getaffinity(0)),
            "python_executable": sys.executable,
            "nbgrader": _version("nbgrader"), "ipykernel": _version("ipykernel"),
            "settings": {k: settings[k] for k in ("grading_env", "sandbox", "sequential",
                                                   "workers", "budget_s")},
            "wheels_installed": settings.get("wheels_installed"),
            "bwrap": settings.get("bwrap"),
            "sandbox_check": sandbox_check,
            "sandbox_used": sandboxes,
            "kernel_probe": probe or None,
            "grading_environment_used": used,
            "grading_environment_lines": _environment_lines(par),
        },
        "all_as_expected": bool(comparison["all_as_expected"] and
                                (seq_comparison is None or seq_comparison["all_as_expected"])),
        "all_checks_passed": all(checks.values()),
        "checks": checks,
        "parallel": {"workers": summary.get("workers"), "seconds": summary.get("seconds"),
                     "all_as_expected": comparison["all_as_expected"],
                     "matched_an_alternative": comparison.get("matched_an_alternative", []),
                     "problems": comparison["problems"]},
        "students": students,
        "sequential": {k: v for k, v in sequential.items() if k != "students"},
        "sequential_comparison": seq_comparison,
        "feedback": feedback,
        "export": export,
        "canary_contacts": canary,
        "steps": steps,
        "seconds_before_this_report": round(float(os.environ.get("GRADE_CLASS_ELAPSED_S", 0)), 1),
    }
    outfile.write_text(json.dumps(record, indent=1) + "\n")
    print(f"{'student':22} {'score':>7}  status")
    for student, s in students.items():
        mark = "" if s.get("comparison", {}).get("as_expected") else \
            f"   <-- {s.get('comparison', {}).get('why', 'not compared')}"
        score = "-" if s["score"] is None else f"{s['score']:g}/{s['max_score']:g}"
        print(f"{student:22} {score:>7}  {s['status']}{mark}")
    print(f"environment {used}, sandbox {sandboxes}; all as expected: "
          f"{record['all_as_expected']}; checks: {checks}")
    if sequential.get("ran"):
        print(f"sequential: {sequential.get('finished')} of {sequential.get('of')} finished, "
              f"differs from parallel: {sorted(sequential.get('differs_from_parallel', {}))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
