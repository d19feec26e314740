"""``nbgrader export`` with the grading status: the CSV gets ``status`` and ``reasons``
columns, and a submission that could not be graded has an empty score, not 0."""
from __future__ import annotations

import csv
import os

from nbgrader.api import MissingEntry
from nbgrader.plugins import ExportPlugin

from . import status as _status

__all__ = ["StatusCsvExport", "rows"]

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
                    reasons = reasons + [f"to grade by hand: {', '.join(by_hand)}"]
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


class StatusCsvExport(ExportPlugin):
    """CSV export with a status column (``nbgrader export``)."""

    def export(self, gradebook):
        from .config import AutogradeSettings
        dest = self.to or "grades.csv"
        settings = AutogradeSettings(config=self.config)
        data = rows(gradebook, os.getcwd(), settings, [str(a) for a in self.assignment],
                    [str(s) for s in self.student])
        self.log.info("Exporting grades with their grading status to %s", dest)
        with open(dest, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=COLUMNS)
            writer.writeheader()
            for row in data:
                writer.writerow(row)
