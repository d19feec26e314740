"""The feedback a student gets back: what the grader decided, no hidden tests, no network.

``nbgrader generate_feedback`` runs, in the course's configuration (``nbgrader_setup``):

- ``GetGrades`` (nbgrader's): every graded cell's score from the gradebook;
- ``MarkPending``: a graded cell that nobody has scored yet (a written answer or a coding
  free-response before the instructor grades it by hand, a check that only a GPU host can
  run) is marked *pending*, so that the page says so instead of showing the gradebook's
  stand-in score of 0; the points pending are left out of the total "so far";
- ``HideHiddenTests``: replaces the hidden part of every cell with one comment line and cuts
  every error in a graded test cell down to its type and message: the student sees which
  test failed and why (the checks' messages name the element, the expected and the actual
  value), not how it is checked;

and ``CourseFeedbackExporter`` writes the page with the course's template
(``autograde/pipeline/templates/course_feedback``).  nbgrader's ``release_feedback`` and
``fetch_feedback`` move single ``.html`` files, so anything beside them would be left behind,
and a page that loads MathJax from a CDN shows raw TeX on a closed network: the page's maths
is written as MathML, which the browser lays out itself, and only the stylesheet rules the page
uses are kept (:mod:`autograde.pipeline.page_size`), so a page is a few hundred KB and runs no script.
"""
from __future__ import annotations

import copy
import re
from pathlib import Path

from nbconvert.exporters import HTMLExporter
from nbgrader import utils as nbutils
from nbgrader.api import Gradebook
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Unicode, default

from . import page_size
from ..trust.recording import MIME
from .verify import NOT_GRADABLE

_WARNING = re.compile(r"^\[stderr\] \S.*?:\d+: (\w*Warning: .*)$", re.S)

TEMPLATES = Path(__file__).resolve().parent / "templates"
TEMPLATE_NAME = "course_feedback"
# why a graded cell has no score yet: the words the page shows, and the total's wording
BY_HAND = "graded by hand"
ON_A_GPU = "graded on a GPU host"
PENDING_TOTAL = {BY_HAND: "hand-grading", ON_A_GPU: "a GPU host"}

__all__ = ["CourseFeedbackExporter", "HideHiddenTests", "MarkPending", "pending_reason"]


def _manually_graded(cell) -> bool:
    """A written answer, a coding free-response or a task: nbgrader leaves its score to a
    person (a test cell's score comes from running it)."""
    return nbutils.is_task(cell) or (nbutils.is_grade(cell) and (
        cell.cell_type == "markdown" or nbutils.is_solution(cell)))


def pending_reason(cell, grade) -> str | None:
    """Why ``grade`` (the gradebook's Grade of a graded ``cell``) has no score yet, or None
    when it has one.

    A score exists once the instructor set a manual score, or once autograding set an
    automatic one (nbgrader gives an unanswered written answer an automatic 0, and the
    course's grader gives a check it could not confirm a 0 to review: both are scores).
    What is left has no score at all: a written answer or free-response waiting for the
    instructor, or a check that needs a GPU host (``autograde.pipeline.grades``)."""
    if grade.manual_score is not None or grade.auto_score is not None:
        return None
    if _manually_graded(cell):
        return BY_HAND
    verdict = cell.metadata.get("autograde", {}).get("verdict", {}).get("verdict")
    return ON_A_GPU if verdict == NOT_GRADABLE else BY_HAND


class MarkPending(NbGraderPreprocessor):
    """After ``GetGrades``: mark the graded cells that have no score yet.

    Sets ``cell.metadata.nbgrader.pending`` to the reason (``pending_reason``) on each such
    cell, and ``resources["nbgrader"]["pending"]`` to ``[(reason, points), ...]`` (points
    summed by reason, in the order the notebook first shows them) and
    ``resources["nbgrader"]["pending_points"]`` to their sum, for the template's total."""

    def preprocess(self, nb, resources):
        info = resources["nbgrader"]
        pending: dict[str, float] = {}
        with Gradebook(info["db_url"]) as gradebook:
            for cell in nb.cells:
                meta = cell.get("metadata", {}).get("nbgrader", {})
                meta.pop("pending", None)
                if not (nbutils.is_grade(cell) or nbutils.is_task(cell)):
                    continue
                grade = gradebook.find_grade(meta["grade_id"], info["notebook"],
                                             info["assignment"], info["student"])
                reason = pending_reason(cell, grade)
                if reason is not None:
                    meta["pending"] = reason
                    pending[reason] = pending.get(reason, 0.0) + float(grade.max_score)
        info["pending"] = [(reason, points) for reason, points in pending.items()]
        info["pending_points"] = sum(pending.values())
        info["pending_words"] = PENDING_TOTAL
        return nb, resources


class CourseFeedbackExporter(HTMLExporter):
    """nbconvert's HTML exporter with the course's feedback template, maths as MathML.

    The page makes no request of its own and runs no script: the lab template's CSS is
    inlined as nbconvert always does it (cut to the rules the page uses), require.js, Mermaid
    and MathJax (which it would load from a CDN) are left out, and every formula of a markdown
    cell is MathML (:mod:`autograde.pipeline.page_size`)."""

    @default("template_name")
    def _course_template_name(self):
        return TEMPLATE_NAME

    @default("extra_template_basedirs")
    def _course_template_dirs(self):
        return [str(TEMPLATES)]

    def from_notebook_node(self, nb, resources=None, **kw):
        nb = copy.deepcopy(nb)
        formulas = {}
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                cell.source = page_size.math_to_tokens(cell.source, formulas)
        output, resources = super().from_notebook_node(nb, resources, **kw)
        output = page_size.put_back_math(output, formulas)
        stylesheet = page_size.lab_stylesheet(self.template_paths)
        if stylesheet:
            output = page_size.prune_css(output, stylesheet)
        return output, resources


class HideHiddenTests(NbGraderPreprocessor):
    begin = Unicode("### BEGIN HIDDEN TESTS").tag(config=True)
    end = Unicode("### END HIDDEN TESTS").tag(config=True)
    placeholder = Unicode("# (hidden tests: not shown)").tag(config=True)

    def preprocess_cell(self, cell, resources, index):
        hidden = False
        if self.begin in cell.get("source", ""):
            lines, inside, placed = [], False, False
            for line in cell.source.splitlines():
                if line.strip().startswith(self.begin):
                    inside = True
                    hidden = True
                    if not placed:
                        indent = line[:len(line) - len(line.lstrip())]
                        lines.append(indent + self.placeholder)
                        placed = True
                    continue
                if inside and line.strip().startswith(self.end):
                    inside = False
                    continue
                if not inside:
                    lines.append(line)
            cell.source = "\n".join(lines)
        if cell.cell_type == "code":
            graded_test = nbutils.is_grade(cell) and not nbutils.is_solution(cell)
            outputs = []
            for out in cell.get("outputs", []):
                if out.get("output_type") == "display_data" and MIME in out.get("data", {}):
                    continue
                if out.get("output_type") == "error" and (graded_test or hidden):
                    out["traceback"] = [f"{out.get('ename', 'Error')}: {out.get('evalue', '')}"]
                if out.get("output_type") == "stream" and (graded_test or hidden):
                    # a warning names the file and line of the check, then quotes that line
                    out["text"] = "".join(
                        _WARNING.sub(r"[stderr] \1", line)
                        for line in out.get("text", "").splitlines(keepends=True)
                        if not line.startswith("[stderr]   "))
                outputs.append(out)
            cell["outputs"] = outputs
        return cell, resources
