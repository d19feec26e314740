"""Decide every graded test cell outside the kernel, after the notebook ran.

For each autograded test cell (its source restored from the gradebook, so trusted):

1. stderr never decides a score: stderr text (a Triton or torch warning) is kept in the
   output, marked, as stdout; an exception raised by the cell still gives it 0;
2. a cell that needs a GPU (a tag in ``AutogradeSettings.gpu_cell_tags`` in the released
   notebook, or a check whose function carries ``requires_gpu = True``) is marked "not
   gradable here" on a CPU host: it gets no automatic score and is flagged for a GPU grading
   run, never silently 0;
3. every call of a check function from a check package (``autograde.checks`` by default) is
   replayed in this process with the kernel's record (:mod:`autograde.trust.recording`): the
   expected values and the comparison are the grader's own.  A cell passes only if the
   kernel raised nothing *and* every replay passed; a kernel pass that the replay rejects
   (or a missing record) scores 0 and is flagged for review, with the replay's message;
4. a checked function that the static scan (:mod:`autograde.pipeline.scan`) finds reaching a
   forbidden module scores 0;
5. the records and any result value the kernel left in the cell are removed (a number there
   would be read by nbgrader as partial credit).

The steps, one module each: what a test cell calls (``calls``), the verdict of one cell
(``cell``), the outputs written and cleaned (``outputs``), the kernels a lab asks for
(``kernels``), code that did not come from the notebook (``foreign``), visible checks tied to
hidden ones (``visible``); what they read of cell sources is ``source``.  This module runs
them in order as nbgrader's preprocessor.
"""
from __future__ import annotations

import os
import sys

from nbformat.notebooknode import NotebookNode
from nbgrader import utils as nbutils
from nbgrader.preprocessors import NbGraderPreprocessor

from ... import labs
from .. import scan
from ...config import AutogradeSettings
from ..restore import released_notebook
from ..status import printable
from .calls import call_rule, check_calls
from .cell import NOT_GRADABLE, verify_cell
from .foreign import foreign_verdict
from .kernels import check_kernels
from .outputs import error, has_error, note, stderr_to_stdout, strip_records
from .source import cell_label
from .visible import tie_visible_cells

__all__ = ["NOT_GRADABLE", "VerifyChecks", "call_rule", "check_calls"]


class VerifyChecks(NbGraderPreprocessor):
    """See the module docstring."""

    def preprocess(self, nb, resources):
        settings = AutogradeSettings(parent=self)
        info = resources.setdefault("autograde", {})
        environment = info.get("environment", "cpu")
        nbg = resources["nbgrader"]
        for path in settings.extra_python_paths:
            if os.path.isdir(path) and path not in sys.path:
                sys.path.insert(0, path)
        reference, _ = released_notebook(os.getcwd(), self.config, nbg["assignment"],
                                         nbg["notebook"])
        tags = {}
        released = {}
        if reference is not None:
            for c in reference.cells:
                gid = c.get("metadata", {}).get("nbgrader", {}).get("grade_id")
                if gid:
                    tags[gid] = set(c.get("metadata", {}).get("tags", []))
                    released[gid] = c.get("source", "")
        released = released if reference is not None else None
        forbidden, allowed = labs.forbidden_names(
            nbg["assignment"], settings.forbidden_extra.get(nbg["assignment"], ()))
        # what else this lab's graded code may call, and the rule in words: the course's
        # own rule, given by its check packages
        extra, rule = call_rule(settings.check_packages,
                                           labs.lab_number(nbg["assignment"]))
        allowed = tuple(allowed) + extra
        student_cells = [(c.source, not nbutils.is_locked(c)) for c in nb.cells
                         if c.cell_type == "code"]
        code_cells = [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
        position = {i: p for p, (i, _) in enumerate(code_cells)}
        foreign = scan.foreign_code(
            [(c.source, not nbutils.is_locked(c), cell_label(c, i)) for i, c in code_cells],
            by_hand=labs.by_hand(nbg["assignment"]))
        cache = {}

        def tainted(extra_allowed=()):
            key = frozenset(extra_allowed)
            if key not in cache:
                cache[key] = scan.tainted_names(student_cells, forbidden,
                                                tuple(allowed) + tuple(sorted(key)))
            return cache[key]
        verdicts = info.setdefault("verdicts", {})
        cells_info = info.get("cells", {})
        seeds = info.get("seeds", {})
        for index, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            stderr_to_stdout(cell)
            if not (nbutils.is_grade(cell) and not nbutils.is_solution(cell)):
                strip_records(cell, results=False)
                continue
            gid = cell.metadata.nbgrader.get("grade_id")
            verdict = verify_cell(cell, check_calls(cell.source, settings.check_packages),
                                  tags.get(gid, set()), environment,
                                  cells_info.get(str(index), {}), seeds, tainted, rule,
                                  settings.gpu_cell_tags)
            # the message may quote what the kernel sent (an exception's text): no control
            # character of it reaches the notebook, the ledger, a terminal or a page
            verdict["message"] = printable(verdict.get("message", ""), limit=3000,
                                           newlines=True)
            verdicts[gid] = verdict
            cell.metadata.setdefault("autograde", {})["verdict"] = verdict
            strip_records(cell)
            if verdict["verdict"] == "pass" and verdict.get("partial") is not None:
                cell.outputs.append(NotebookNode(
                    output_type="execute_result", execution_count=cell.get("execution_count"),
                    metadata={}, data={"text/plain": repr(verdict["partial"])}))
            if verdict["verdict"] != "pass" and verdict["verdict"] != NOT_GRADABLE and \
                    (not has_error(cell) or verdict["verdict"] == "forbidden"):
                cell.outputs.append(error(verdict.get("ename", "HiddenCheckFailed"),
                                          verdict["message"]))
            if verdict["verdict"] == NOT_GRADABLE:
                cell.outputs.append(note(
                    f"\n[autograde: not gradable here: {verdict['message']}; this cell "
                    "will be graded on a GPU host]\n"))
        check_kernels(nb, reference, verdicts, settings.check_packages)
        for index, cell in enumerate(nb.cells):
            verdict = cell.get("metadata", {}).get("autograde", {}).get("verdict")
            if not verdict or verdict["verdict"] != "pass":
                continue
            found = foreign_verdict(cell, position[index], foreign, settings.check_packages)
            if found is not None:
                verdict.clear()
                verdict.update(found)
                cell.outputs = [o for o in cell.outputs             # no partial credit left
                                if o.get("output_type") != "execute_result"]
                cell.outputs.append(error(found["ename"], found["message"]))
                verdicts[cell.metadata.nbgrader.get("grade_id")] = verdict
        if settings.visible_points == "tied":
            tie_visible_cells(nb, verdicts, released, settings.check_packages)
        return nb, resources
