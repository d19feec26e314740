"""Saving scores: nbgrader's SaveAutoGrades, told about the grader's verdicts.

A cell the grader could not decide (``needs_review``: the kernel's pass was not confirmed by
the replay; ``not_gradable_here``: it needs a GPU host) is marked *needs manual grade* in the
gradebook, so nbgrader's formgrader lists it; a not-gradable cell gets no automatic score at
all (None), instead of a zero that would look like a wrong answer.
"""
from __future__ import annotations

from ..compat.nbgrader_compat import SaveAutoGradesBase

__all__ = ["SaveVerifiedGrades"]


class SaveVerifiedGrades(SaveAutoGradesBase):

    def add_score(self, cell, resources):
        verdict = cell.metadata.get("autograde", {}).get("verdict", {}).get("verdict")
        if verdict not in ("needs_review", "not_gradable_here"):
            return super().add_score(cell, resources)
        grade = self.gradebook.find_grade(cell.metadata["nbgrader"]["grade_id"],
                                          self.notebook_id, self.assignment_id, self.student_id)
        grade.auto_score = 0.0 if verdict == "needs_review" else None
        grade.needs_manual_grade = True
        self.gradebook.db.commit()
