"""``python -m autograde``: the instructor's commands beside nbgrader's.

  grade ASSIGNMENT [--workers N] [--force] [--student ID ...] [--shard i/n]
                   [--status STATUS ...] [--no-progress]
        autograde every submission in parallel (resumable; same scores as nbgrader's
        sequential ``nbgrader autograde``), then print the report
  report ASSIGNMENT [--csv FILE] [--json FILE]
        score and grading status of every submission, ungradable ones with their reasons,
        answers the similarity check matched as needs_review (autograde/runner/similarity.py)
  probe
        start one grading kernel and show what it can reach (uid, network, course files,
        limits): a check of the sandbox on this host
  env
        the grading environment this host would use

Every command takes ``--root DIR`` (default: the current folder), the course directory with
its ``nbgrader_config.py``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

__all__ = ["main", "report_rows"]


def _settings(root):
    from ..config import AutogradeSettings
    from .parallel import _load_config
    config = _load_config(root)
    return config, AutogradeSettings(config=config)


def report_rows(root, assignment):
    """Rows of the report: every student with a submission or a gradebook entry."""
    from nbgrader.api import Gradebook

    from . import export
    from .parallel import _coursedir
    config, settings = _settings(root)
    cd = _coursedir(config, root)
    with Gradebook(cd.db_url, cd.course_id) as gb:
        rows = export.rows(gb, root, settings, [assignment])
        try:
            gb.find_assignment(assignment)
        except Exception:                               # noqa: BLE001
            rows = []
    seen = {r["student_id"] for r in rows if r.get("status") != "not_submitted"}
    extra = export.ungraded_submissions(root, settings, cd, assignment, seen)
    known = {r["student_id"] for r in extra}
    rows = [r for r in rows if r["student_id"] not in known] + extra
    rows = [r for r in rows if r.get("status") != "not_submitted"]
    export.apply_similarity(rows, root, settings, cd, assignment)
    return sorted(rows, key=lambda r: r["student_id"])


def _print_report(rows, out=sys.stdout):
    """One line per submission; every field escaped (``status.printable``): a student's folder
    name or a reason carrying terminal escapes cannot redraw another row."""
    from ..pipeline.status import printable
    if not rows:
        out.write("no submissions\n")
        return
    names = [printable(r["student_id"], limit=100) for r in rows]
    width = max(len(n) for n in names)
    out.write(f"{'student':<{width}}  {'score':>8}  status\n")
    for name, r in zip(names, rows):
        score = r.get("score", "")
        try:
            score = f"{float(score):g}/{float(r['max_score']):g}" if score != "" else "-"
        except (TypeError, ValueError):
            score = printable(score, limit=20)
        out.write(f"{name:<{width}}  {score:>8}  {printable(r['status'], limit=40)}")
        if r.get("reasons"):
            out.write(f"  ({printable(r['reasons'], limit=20000)})")
        out.write("\n")


def cmd_grade(args):
    from .parallel import grade_class
    shard = None
    if args.shard:
        index, count = (int(v) for v in args.shard.split("/"))
        if not 0 <= index < count:
            raise SystemExit("--shard i/n needs 0 <= i < n")
        shard = (index, count)
    summary = grade_class(args.root, args.assignment, workers=args.workers, force=args.force,
                          students=args.student or None, progress=not args.no_progress,
                          shard=shard, statuses=set(args.status) if args.status else None)
    sys.stderr.write(f"graded {len(summary['graded'])} submission(s) with "
                     f"{summary['workers']} worker(s) in {summary['seconds']:.1f} s; "
                     f"skipped {len(summary['skipped'])}\n")
    _print_report(report_rows(os.path.abspath(args.root), args.assignment))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(summary, fh, indent=1)
    return 0


def cmd_report(args):
    rows = report_rows(os.path.abspath(args.root), args.assignment)
    _print_report(rows)
    if any("similarity check:" in r.get("reasons", "") for r in rows):
        _, settings = _settings(os.path.abspath(args.root))
        page = os.path.join(os.path.abspath(args.root), settings.status_directory,
                            args.assignment, "similarity.html")
        if os.path.isfile(page):
            print(f"similarity check: the listed pairs, ranked, with their overlapping lines "
                  f"highlighted: {page}")
    if args.csv:
        import csv

        from .export import COLUMNS
        with open(args.csv, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=COLUMNS, extrasaction="ignore")
            writer.writeheader()
            for r in rows:
                writer.writerow({k: r.get(k, "") for k in COLUMNS})
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1, default=str)
    return 0


def cmd_env(args):
    from ..config import describe, resolve_environment
    from ..pipeline.execute import resolve_sandbox
    _, settings = _settings(os.path.abspath(args.root))
    env = resolve_environment(settings)
    try:
        mode = resolve_sandbox(settings)
    except RuntimeError as exc:
        print(f"autograde: {exc}", file=sys.stderr)
        return 1
    print(describe(env, mode, settings, settings.timeout_for(args.assignment or ""),
                   settings.kernel_uid))
    return 0


def cmd_probe(args):
    from .probe import probe
    root = os.path.abspath(args.root)
    _, settings = _settings(root)
    from ..pipeline.status import printable
    result = probe(root, settings)
    # the keys are the probe's own names, printed whole: scripts/gpu/grade_class_report.py
    # reads them back by name (a cut "torch.cuda.is_available(..." matched nothing)
    width = max(len(key) for key in result)
    for key, value in result.items():
        print(f"{printable(key, limit=80):>{width}}: {printable(value)}")
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m autograde", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("grade", help="autograde a class in parallel")
    p.add_argument("assignment")
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--force", action="store_true", help="regrade finished submissions too")
    p.add_argument("--student", action="append", help="only this student (repeatable)")
    p.add_argument("--shard", help="i/n: grade every n-th student from the i-th (several hosts)")
    p.add_argument("--status", action="append",
                   help="regrade only submissions with this status, e.g. needs_gpu (repeatable)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--json", help="write a summary of the run here")
    p.set_defaults(func=cmd_grade)
    p = sub.add_parser("report", help="scores and grading status")
    p.add_argument("assignment")
    p.add_argument("--csv")
    p.add_argument("--json")
    p.set_defaults(func=cmd_report)
    p = sub.add_parser("env", help="the grading environment of this host")
    p.add_argument("assignment", nargs="?", default="")
    p.set_defaults(func=cmd_env)
    p = sub.add_parser("probe", help="what a grading kernel can reach here")
    p.set_defaults(func=cmd_probe)
    for p in sub.choices.values():
        p.add_argument("--root", default=".", help="the course directory")
    args = parser.parse_args(argv)
    from ..logs import escape_log_records
    escape_log_records()
    try:
        return args.func(args)
    except KeyboardInterrupt:
        sys.stderr.write("\ninterrupted: the finished submissions are kept; run the same "
                         "command again to grade the rest\n")
        return 130
