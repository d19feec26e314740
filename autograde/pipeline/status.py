"""The grading status of every submission, kept beside the gradebook.

nbgrader's gradebook holds scores only: a notebook that is not valid JSON, a missing
notebook, a kernel that died or a cell that ran out of time all end as plain zeros there.  The
status ledger keeps what happened, one JSON file per submission under
``<course>/autograde_status/<assignment>/<student>.json``:

- ``state``: ``running`` (grading started; if its process is gone, it was interrupted),
  ``done`` (nbgrader finished this submission);
- ``problems``: why the submission could not be graded (invalid notebook, missing notebook,
  kernel that failed to start);
- ``notebooks``: per notebook, the grading environment, the incidents (timeouts, kernel
  restarts, dropped output, each limit the kernel ran into, named), the verdict of every
  graded cell, and every kernel it ran (uid, host, start and end times).

:func:`summarize` turns an entry into one status for reports and exports:

- ``graded``: every graded cell was graded here, nothing unusual;
- ``graded_with_incidents``: graded, but a cell timed out, the kernel was restarted, output
  was dropped, or a graded function used something it must not (each listed);
- ``needs_gpu``: graded, except cells that need a GPU host ("not gradable here"; they have
  no automatic score yet and are flagged for manual grading in nbgrader);
- ``needs_review``: a cell's verdict needs a person (the kernel said pass and the grader's
  replay said fail, or the replay could not run);
- ``ungradable``: no score can be trusted (invalid or missing notebook, grading failed or was
  interrupted); exports leave the score empty instead of writing 0;
- ``not_graded``: submitted, not graded yet.
"""
from __future__ import annotations

import json
import os
import socket
import tempfile
import time

import nbformat

from . import dblock

__all__ = ["ledger_path", "read", "write", "pre_convert_hook", "post_convert_hook",
           "note_failure", "summarize", "STATUSES", "printable"]

STATUSES = ("graded", "graded_with_incidents", "needs_gpu", "needs_review", "ungradable",
            "not_graded")


def _settings(config):
    from ..config import AutogradeSettings
    return AutogradeSettings(config=config)


def ledger_path(root, settings, assignment, student):
    return os.path.join(root, settings.status_directory, assignment, f"{student}.json")


def read(path):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def write(path, entry):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
    with os.fdopen(fd, "w") as fh:
        json.dump(entry, fh, indent=1, sort_keys=True)
    os.replace(tmp, path)


def _coursedir(config, root):
    from nbgrader.coursedir import CourseDirectory
    cd = CourseDirectory(config=config)
    cd.root = root
    return cd


def _expected_notebooks(config, root, assignment):
    cd = _coursedir(config, root)
    for folder in (cd.release_directory, cd.source_directory):
        path = cd.format_path(folder, ".", assignment)
        if os.path.isdir(path):
            names = sorted(os.path.splitext(f)[0] for f in os.listdir(path)
                           if f.endswith(".ipynb"))
            if names:
                return names
    return []


def _check_notebook(path, limit_mb=32):
    """None if ``path`` is a readable, valid notebook no larger than ``limit_mb``, else why
    not."""
    try:
        size = os.path.getsize(path)
        if limit_mb and size > limit_mb * 2 ** 20:
            return (f"{os.path.basename(path)} is {size / 2 ** 20:.1f} MiB, over the "
                    f"submission size limit of {limit_mb} MiB (not run)")
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        return f"cannot read {os.path.basename(path)}: {exc}"
    try:
        raw = json.loads(text)
    except ValueError as exc:
        return f"{os.path.basename(path)} is not valid JSON ({exc})"
    try:
        nb = nbformat.reads(json.dumps(raw), as_version=4)
        nbformat.validate(nb)
    except Exception as exc:                          # noqa: BLE001
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"{os.path.basename(path)} is not a valid notebook ({first[:200]})"
    return None


def _student_of(notebooks, student, root):
    """nbgrader passes its student *filter* ("*" for a whole class) to the hooks: the
    student is read from the submitted notebooks' path (submitted/<student>/<assignment>/)."""
    for path in notebooks or ():
        parts = os.path.relpath(os.path.abspath(path), root).split(os.sep)
        if len(parts) >= 4:
            return parts[-3]
    return student


def pre_convert_hook(assignment, student, notebooks, config=None, root=None, **_):
    """nbgrader's pre-convert hook: lock the gradebook, check the notebooks, start an entry."""
    dblock.acquire()
    root = root or os.getcwd()
    student = _student_of(notebooks, student, root)
    settings = _settings(config)
    problems = []
    found = {os.path.splitext(os.path.basename(n))[0]: n for n in notebooks}
    for name in _expected_notebooks(config, root, assignment):
        if name not in found:
            problems.append(f"missing notebook {name}.ipynb")
    for name, path in sorted(found.items()):
        why = _check_notebook(path, settings.submission_limit_mb)
        if why:
            problems.append(why)
    path = ledger_path(root, settings, assignment, student)
    submitted = _submission_stamp(config, root, assignment, student)
    write(path, {"assignment": assignment, "student": student, "state": "running",
                 "started": time.time(), "host": socket.gethostname(), "pid": os.getpid(),
                 "problems": problems, "failures": [], "notebooks": {},
                 "submission": submitted})


def _submission_stamp(config, root, assignment, student):
    """The submission's timestamp.txt (or the newest file time) to notice resubmissions."""
    cd = _coursedir(config, root)
    folder = cd.format_path(cd.submitted_directory, student, assignment)
    stamp = os.path.join(folder, "timestamp.txt")
    try:
        with open(stamp) as fh:
            return fh.read().strip()
    except OSError:
        pass
    newest = 0.0
    for dirpath, _, files in os.walk(folder):
        for f in files:
            try:
                newest = max(newest, os.path.getmtime(os.path.join(dirpath, f)))
            except OSError:
                pass
    return str(newest)


def post_convert_hook(assignment, student, notebooks, config=None, root=None, **_):
    """nbgrader's post-convert hook: the submission is finished."""
    root = root or os.getcwd()
    student = _student_of(notebooks, student, root)
    settings = _settings(config)
    path = ledger_path(root, settings, assignment, student)
    entry = read(path) or {"assignment": assignment, "student": student, "problems": [],
                           "failures": [], "notebooks": {}}
    entry["state"] = "done"
    entry["finished"] = time.time()
    status, reasons = summarize(entry)
    entry["status"], entry["reasons"] = status, reasons
    write(path, entry)
    dblock.release()


def note_notebook(root, settings, assignment, student, notebook, data):
    path = ledger_path(root, settings, assignment, student)
    entry = read(path) or {"assignment": assignment, "student": student, "state": "running",
                           "problems": [], "failures": [], "notebooks": {}}
    entry.setdefault("notebooks", {})[notebook] = data
    write(path, entry)


def note_failure(root, settings, assignment, student, reason):
    path = ledger_path(root, settings, assignment, student)
    entry = read(path) or {"assignment": assignment, "student": student, "state": "running",
                           "problems": [], "failures": [], "notebooks": {}}
    entry.setdefault("failures", []).append(reason)
    write(path, entry)


def printable(text, limit=4000, newlines=False) -> str:
    """``text`` safe to print on a terminal, write into a CSV or show in a page
    (:func:`autograde.logs.escaped`): newlines become spaces unless ``newlines``; at most
    ``limit`` characters."""
    from ..logs import escaped
    return escaped(text, limit, newlines)


def _alive(entry):
    if entry.get("host") != socket.gethostname():
        return True                       # another machine's worker: cannot tell, assume so
    try:
        os.kill(int(entry.get("pid", -1)), 0)
    except (OSError, ValueError):
        return False
    return True


def summarize(entry):
    """(status, [reasons]) of a ledger entry (None: not graded)."""
    if entry is None:
        return "not_graded", []
    status, reasons = _summarize(entry)
    return status, [printable(r) for r in reasons]


def _summarize(entry):
    reasons = list(entry.get("problems", [])) + list(entry.get("failures", []))
    if entry.get("problems") or entry.get("failures"):
        return "ungradable", reasons
    if entry.get("state") != "done":
        if _alive(entry):
            return "not_graded", ["grading in progress"]
        return "ungradable", ["grading was interrupted; run the grade command again"]
    review, gpu, incidents = [], [], []
    for name, nb in sorted(entry.get("notebooks", {}).items()):
        for inc in nb.get("incidents", []):
            where = inc.get("grade_id") or (f"cell {inc['cell']}" if inc.get("cell") is not None
                                            else None)
            incidents.append(f"{name}/{where}: {inc.get('what')}" if where else
                             f"{name}: {inc.get('what')}")
        for gid, verdict in sorted(nb.get("verdicts", {}).items()):
            kind = verdict.get("verdict")
            if kind == "not_gradable_here":
                gpu.append(f"{name}/{gid}: not gradable here ({verdict.get('message')})")
            elif kind == "needs_review":
                review.append(f"{name}/{gid}: needs review ({verdict.get('message')})")
            elif kind in ("forbidden", "tied"):
                incidents.append(f"{name}/{gid}: {verdict.get('message')}")
    if review:
        return "needs_review", review + gpu + incidents
    if gpu:
        return "needs_gpu", gpu + incidents
    if incidents:
        return "graded_with_incidents", incidents
    return "graded", []


def _record_status_class():
    from nbgrader.preprocessors import NbGraderPreprocessor

    class RecordStatus(NbGraderPreprocessor):
        """Last autograde preprocessor: write this notebook's outcome into the ledger."""

        def preprocess(self, nb, resources):
            from ..config import AutogradeSettings
            settings = AutogradeSettings(parent=self)
            nbg = resources["nbgrader"]
            info = resources.get("autograde", {})
            incidents = list(info.get("incidents", []))
            for change in nb.metadata.get("autograde", {}).get("restored", []):
                incidents.append({"cell": None, "grade_id": None,
                                  "what": f"submission edited: {change}"})
            data = {"environment": info.get("environment"), "sandbox": info.get("sandbox"),
                    "timeout": info.get("timeout"), "incidents": incidents,
                    "verdicts": info.get("verdicts", {}),
                    "kernels": info.get("kernels", []),
                    "cells": info.get("cells", {})}
            note_notebook(os.getcwd(), settings, nbg["assignment"], nbg["student"],
                          nbg["notebook"], data)
            return nb, resources

    return RecordStatus


RecordStatus = _record_status_class()
