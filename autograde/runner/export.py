"""``nbgrader export`` with the grading status: the CSV gets ``status`` and ``reasons``
columns, a submission that could not be graded has an empty score, not 0, a submission
folder the gradebook never saw (no notebook in it) has a row too, and answers the similarity
check matched (:mod:`autograde.runner.similarity`) are listed as ``needs_review`` with the match."""
from __future__ import annotations

import csv
import os

from nbgrader.api import MissingEntry
from nbgrader.plugins import ExportPlugin

from ..pipeline import status as _status

__all__ = ["StatusCsvExport", "rows", "ungraded_submissions", "apply_similarity"]

COLUMNS = ["assignment", "duedate", "timestamp", "student_id", "last_name", "first_name",
           "email", "raw_score", "late_submission_penalty", "score", "max_score", "status",
           "reasons"]


def rows(gradebook, root, settings, assignments=(), students=()):
    """One dict per (assignment, student) in the gradebook, with status and reasons."""
    out = []
    for assignment in gradebook.assignments:
        if assignments and assignment.name not in assignments:
            continue
        for student in gradebook.students:
            if students and student.id not in students:
                continue
            entry = _status.read(_status.ledger_path(root, settings, assignment.name,
                                                     student.id))
            row = {"assignment": assignment.name, "duedate": assignment.duedate or "",
                   "student_id": student.id, "last_name": student.last_name or "",
                   "first_name": student.first_name or "", "email": student.email or "",
                   "max_score": assignment.max_score}
            try:
                submission = gradebook.find_submission(assignment.name, student.id)
            except MissingEntry:
                submission = None
            if submission is None:
                row.update(timestamp="", raw_score="", late_submission_penalty="", score="",
                           status="not_submitted", reasons="")
            else:
                state, reasons = _status.summarize(entry)
                decided = set()
                for nb in (entry or {}).get("notebooks", {}).values():
                    decided |= set(nb.get("verdicts", {}))
                by_hand = sorted(g.name for nb in submission.notebooks for g in nb.grades
                                 if g.needs_manual_grade and g.name not in decided)
                if by_hand and state not in ("ungradable", "not_graded"):
                    reasons = reasons + ["pending hand-grading (not in the score yet): "
                                         + ", ".join(by_hand)]
                penalty = submission.late_submission_penalty or 0.0
                raw = submission.score
                row.update(timestamp=submission.timestamp or "",
                           late_submission_penalty=penalty, status=state,
                           reasons="; ".join(reasons))
                if state in ("ungradable", "not_graded"):
                    row.update(raw_score="", score="")
                else:
                    row.update(raw_score=raw, score=max(0.0, raw - penalty))
            out.append(row)
    return out


def apply_similarity(data, root, settings, coursedir, assignment, save=True):
    """Mark the rows of ``assignment`` whose answers the similarity check matched
    (:mod:`autograde.runner.similarity`): status ``needs_review`` (a submission that is graded; an
    ungraded or ungradable one keeps its status), the matches first among the reasons.  The
    score is left as it is."""
    from . import similarity
    flags, record = similarity.class_flags(root, settings, coursedir, assignment)
    if save and (flags or record):
        try:
            similarity.write_report(root, settings, assignment, flags, record)
        except OSError:
            pass
    for row in data:
        found = flags.get(row["student_id"]) if row["assignment"] == assignment else None
        if not found:
            continue
        if row["status"] in ("graded", "graded_with_incidents", "needs_gpu", "needs_review"):
            row["status"] = "needs_review"
        reasons = "; ".join(f"similarity check: {f}" for f in found)
        row["reasons"] = reasons + ("; " + row["reasons"] if row.get("reasons") else "")
    return data


def ungraded_submissions(root, settings, coursedir, assignment, seen=()):
    """Rows for submission folders of ``assignment`` that the gradebook does not know (a
    folder without a notebook never reaches nbgrader's gradebook): empty score, their
    status from the ledger, or ``ungradable`` when the folder holds no notebook."""
    out = []
    submitted = coursedir.format_path(coursedir.submitted_directory, ".", ".")
    if not os.path.isdir(submitted):
        return out
    for student in sorted(os.listdir(submitted)):
        folder = coursedir.format_path(coursedir.submitted_directory, student, assignment)
        if student in seen or not os.path.isdir(folder):
            continue
        entry = _status.read(_status.ledger_path(root, settings, assignment, student))
        state, reasons = _status.summarize(entry)
        notebooks = [f for f in os.listdir(folder) if f.endswith(".ipynb")]
        if not notebooks:
            state, reasons = "ungradable", ["no notebook in the submission"]
        out.append({"assignment": assignment, "duedate": "", "timestamp": "",
                    "student_id": student, "last_name": "", "first_name": "", "email": "",
                    "raw_score": "", "late_submission_penalty": "", "score": "",
                    "max_score": "", "status": state, "reasons": "; ".join(reasons)})
    return out


class StatusCsvExport(ExportPlugin):
    """CSV export with a status column (``nbgrader export``)."""

    def export(self, gradebook):
        from ..config import AutogradeSettings
        dest = self.to or "grades.csv"
        settings = AutogradeSettings(config=self.config)
        from nbgrader.coursedir import CourseDirectory
        assignments = [str(a) for a in self.assignment]
        students = [str(s) for s in self.student]
        root = os.getcwd()
        data = rows(gradebook, root, settings, assignments, students)
        coursedir = CourseDirectory(config=self.config)
        names = assignments or [a.name for a in gradebook.assignments]
        for name in names:
            seen = {r["student_id"] for r in data if r["assignment"] == name and
                    r["status"] != "not_submitted"}
            extra = ungraded_submissions(root, settings, coursedir, name, seen)
            extra = [r for r in extra if not students or r["student_id"] in students]
            known = {(r["assignment"], r["student_id"]) for r in extra}
            data = [r for r in data if (r["assignment"], r["student_id"]) not in known] + extra
            apply_similarity(data, root, settings, coursedir, name)
        self.log.info("Exporting grades with their grading status to %s", dest)
        with open(dest, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=COLUMNS)
            writer.writeheader()
            for row in data:
                writer.writerow(row)
