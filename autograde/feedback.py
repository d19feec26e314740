"""Feedback without the hidden tests.

nbgrader's feedback shows every cell of the autograded notebook, hidden tests included, and an
error's traceback quotes the lines of hidden code it passed through.  This preprocessor (in
``GenerateFeedback``) replaces the hidden part of every cell with one comment line and cuts
every error in a graded test cell down to its type and message: the student sees which test
failed and why (the checks' messages name the element, the expected and the actual value),
not how it is checked.
"""
from __future__ import annotations

import re

from nbgrader import utils as nbutils
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Unicode

from .recording import MIME

_WARNING = re.compile(r"^\[stderr\] \S.*?:\d+: (\w*Warning: .*)$", re.S)

__all__ = ["HideHiddenTests"]


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
