"""Run a lab's source notebook cell by cell in this process, with a mistake in a solution cell.

The tests of the injected-mistake tables (``test_mistakes_forward.py``,
``test_mistakes_backward.py``, ``test_mistakes_rest.py``) and the mutation harness
(``scripts/mutate_labs.py``, ``test_mutants.py``) share this runner: a lab's setup, given and
solution cells run in a module of their own (not through nbgrader, to stay fast), one solution
cell with its text changed, then one visible check cell, whose AssertionError message is what
the student reads.

Each cell's source goes into ``linecache`` under a name of its own, because Triton reads a
kernel's source when the kernel is defined.  Nothing here needs more than torch, Triton and
the JSON of the notebook, so that a GPU script can run the same rows compiled.
"""
from __future__ import annotations

import ast
import contextlib
import io
import json
import linecache
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

ASSIGNMENTS = Path(__file__).resolve().parents[2] / "assignments"
BEGIN_HIDDEN = "### BEGIN HIDDEN TESTS"

__all__ = ["ASSIGNMENTS", "BEGIN_HIDDEN", "Cell", "lab_name", "cells", "visible_checks",
           "defines", "substitute", "execute", "namespace", "with_cell", "run_check"]


@dataclass(frozen=True)
class Cell:
    index: int
    grade_id: str
    kind: str                     # "code" | "markdown"
    source: str
    meta: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def graded(self) -> bool:
        return bool(self.meta.get("grade"))

    @property
    def solution(self) -> bool:
        return bool(self.meta.get("solution"))

    @property
    def hidden(self) -> bool:
        return BEGIN_HIDDEN in self.source

    @property
    def visible_check(self) -> bool:
        return self.kind == "code" and self.graded and not self.solution and not self.hidden

    @property
    def answer(self) -> bool:
        """A code cell the student writes."""
        return self.kind == "code" and self.solution

    def stem(self) -> str:
        """The grade id without its ``labNN_`` prefix."""
        return self.grade_id.split("_", 1)[1] if "_" in self.grade_id else self.grade_id


def lab_name(lab: str) -> str:
    """``lab05`` or ``lab05_forward_correct`` -> ``lab05_forward_correct``."""
    if (ASSIGNMENTS / lab).is_dir():
        return lab
    found = sorted(p.name for p in ASSIGNMENTS.glob(f"{lab}_*") if p.is_dir())
    if len(found) != 1:
        raise KeyError(f"no single lab folder for {lab!r}: {found}")
    return found[0]


_CELLS = {}


def cells(lab: str) -> list:
    """The cells of the lab's source notebook, in order."""
    lab = lab_name(lab)
    if lab not in _CELLS:
        nb = json.loads((ASSIGNMENTS / lab / f"{lab}.ipynb").read_text())
        found = []
        for index, cell in enumerate(nb["cells"]):
            meta = cell.get("metadata", {}).get("nbgrader", {})
            source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
            found.append(Cell(index, meta.get("grade_id", ""), cell["cell_type"], source, meta))
        _CELLS[lab] = found
    return _CELLS[lab]


def cell(lab: str, grade_id: str) -> Cell:
    return next(c for c in cells(lab) if c.grade_id == grade_id)


def visible_checks(lab: str) -> list:
    """Grade ids of the visible check cells."""
    return [c.grade_id for c in cells(lab) if c.visible_check]


def defines(source: str) -> bool:
    """A cell that defines a function or a class (a given helper, a launcher)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    return any(isinstance(node, (ast.FunctionDef, ast.ClassDef)) for node in tree.body)


def substitute(source: str, edits) -> str:
    """``source`` with each ``(old, new)`` or ``(old, new, count)`` replaced; ``old`` must
    occur exactly ``count`` times (1 unless given)."""
    for edit in edits:
        old, new, count = edit if len(edit) == 3 else (*edit, 1)
        assert source.count(old) == count, f"{old!r} occurs {source.count(old)} times, not {count}"
        source = source.replace(old, new)
    return source


def execute(source: str, name: str, scope: dict, quiet: bool = False) -> None:
    """Run one cell's ``source`` in ``scope`` (its lines go into linecache under ``name``)."""
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    code = compile(source, name, "exec")
    if quiet:
        with contextlib.redirect_stdout(io.StringIO()):
            exec(code, scope)                                   # noqa: S102
    else:
        exec(code, scope)                                       # noqa: S102


def definitions_only(c: Cell) -> bool:
    """The default choice of cells to run: the setup, the answers and the given cells that
    define functions (no figure, demonstration or timing)."""
    return c.grade_id.endswith("_setup") or c.solution or defines(c.source)


def skipping(prefixes):
    """A choice of cells: every ungraded code cell but those whose stem starts with one of
    ``prefixes`` (figures, GPU sections, demonstrations)."""
    prefixes = tuple(prefixes)
    return lambda c: not c.stem().startswith(prefixes) if prefixes else True


def namespace(lab: str, changes=None, *, upto: str | None = None, select=definitions_only,
              quiet: bool = False) -> dict:
    """The dict of a fresh module in which the lab's ungraded code cells chosen by ``select``
    ran in order (up to the cell ``upto``, a grade id, when given); ``changes`` maps a
    grade id to its new source (a string) or to the edits :func:`substitute` makes."""
    lab = lab_name(lab)
    changes = dict(changes or {})
    module = types.ModuleType(f"{lab}_notebook")
    sys.modules[module.__name__] = module
    for c in cells(lab):
        if c.grade_id == upto and upto is not None:
            break
        if c.kind != "code" or c.graded or c.hidden or not select(c):
            continue
        source = c.source
        if c.grade_id in changes:
            change = changes.pop(c.grade_id)
            source = change if isinstance(change, str) else substitute(source, change)
        execute(source, f"<{lab} cell {c.index}>", module.__dict__, quiet=quiet)
    assert not changes, f"{lab}: the cells {sorted(changes)} were not run"
    return module.__dict__


def with_cell(base: dict, lab: str, grade_id: str, source: str) -> dict:
    """A copy of the namespace ``base`` in which the cell ``grade_id`` ran again with
    ``source`` (a module of its own, so that its functions' globals are not the base's)."""
    module = types.ModuleType(f"{lab_name(lab)}_{grade_id}_variant")
    module.__dict__.update({k: v for k, v in base.items() if k != "__name__"})
    execute(source, f"<{lab_name(lab)} {grade_id} with a mistake>", module.__dict__)
    return module.__dict__


def run_check(scope: dict, lab: str, check_id: str, quiet: bool = False):
    """Run the visible check cell ``check_id`` in ``scope``: its AssertionError message, or
    None when it passed."""
    lab = lab_name(lab)
    try:
        execute(cell(lab, check_id).source, f"<{lab} {check_id}>", scope, quiet=quiet)
    except AssertionError as exc:
        return str(exc)
    return None
