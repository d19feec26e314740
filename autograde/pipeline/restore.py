"""Put a submission back into the shape of the released notebook before it runs.

nbgrader's OverwriteCells restores the *source* of locked cells it finds, and their points
and lock flag.  It does not put a moved cell back in place, re-add a deleted cell (unless
configured), or undo other metadata edits (``"grade": false`` on a test cell, a
``skip-execution`` tag, ``"solution": true`` on a locked cell).  This preprocessor runs after
it and rebuilds the notebook from the released one:

- every cell of the release, in the release's order, with the release's metadata (the
  gradebook's checksum kept): locked cells from the gradebook's copy, the student's answer in
  each solution cell, a deleted cell taken back from the gradebook;
- every cell the student added, with its nbgrader metadata and tags removed, kept right after
  the released cell that preceded it in the submission.
"""
from __future__ import annotations

import copy
import os

import nbformat
from nbformat.notebooknode import NotebookNode
from nbgrader.api import Gradebook
from nbgrader.preprocessors import NbGraderPreprocessor

__all__ = ["RestoreStructure", "released_notebook"]


def released_notebook(root, config, assignment, notebook):
    """The released notebook (``release/``), else the source one: trusted order and tags."""
    from nbgrader.coursedir import CourseDirectory
    cd = CourseDirectory(config=config)
    cd.root = root
    for folder in (cd.release_directory, cd.source_directory):
        path = os.path.join(cd.format_path(folder, ".", assignment), f"{notebook}.ipynb")
        if os.path.exists(path):
            return nbformat.read(path, as_version=4), folder
    return None, None


def _gid(cell):
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


class RestoreStructure(NbGraderPreprocessor):
    """See the module docstring."""

    def preprocess(self, nb, resources):
        nbg = resources["nbgrader"]
        root = os.getcwd()
        reference, folder = released_notebook(root, self.config, nbg["assignment"],
                                              nbg["notebook"])
        if reference is None:
            self.log.warning("no released notebook to restore the structure from")
            return nb, resources
        with Gradebook(nbg["db_url"]) as gb:
            source = {c.name: (c.cell_type, c.source, c.checksum, c.locked)
                      for c in gb.find_notebook(nbg["notebook"], nbg["assignment"]).source_cells}
        ref_cells = [c for c in reference.cells if _gid(c)]
        ref_ids = [_gid(c) for c in ref_cells]
        ref_by_id = {_gid(c): c for c in ref_cells}
        known, extras, anchor = {}, {None: []}, None
        changes = []
        for position, cell in enumerate(nb.cells):
            gid = _gid(cell)
            if gid in ref_by_id and gid not in known:
                known[gid] = (position, cell)
                anchor = gid
                extras.setdefault(gid, [])
                continue
            if gid is not None or cell.get("metadata", {}).get("tags"):
                changes.append(f"cell {position}: nbgrader metadata/tags of an added cell removed")
            cell.metadata.pop("nbgrader", None)
            cell.metadata.pop("tags", None)
            extras[anchor].append(cell)
        order = [known[g][0] for g in ref_ids if g in known]
        if order != sorted(order):
            changes.append("released cells were reordered; original order restored")
        cells = list(extras[None])
        for gid in ref_ids:
            ref = ref_by_id[gid]
            if gid in known:
                cell = known[gid][1]
            else:
                cell = self._from_gradebook(ref, source.get(gid))
                changes.append(f"cell {gid} was missing; restored from the gradebook")
            meta = copy.deepcopy(ref.get("metadata", {}))
            if gid in source:
                cell_type, src, checksum, locked = source[gid]
                if cell.cell_type != cell_type:
                    cell = self._retype(cell, cell_type)
                    changes.append(f"cell {gid}: type restored to {cell_type}")
                if locked and cell.source != src:
                    if cell.source != ref.get("source") and gid in known:
                        changes.append(f"cell {gid}: edited locked cell restored")
                    cell.source = src
                if checksum is not None:
                    meta.setdefault("nbgrader", {})["checksum"] = checksum
            if gid in known and (
                    _flags(cell) != _flags(NotebookNode(metadata=meta)) or
                    set(cell.get("metadata", {}).get("tags", [])) != set(meta.get("tags", []))):
                changes.append(f"cell {gid}: metadata restored")
            cell.metadata = NotebookNode(meta)
            cells.append(cell)
            cells.extend(extras.get(gid, []))
        seen = set()
        for cell in cells:                      # nbformat 4.5 cell ids must stay unique
            if "id" in cell:
                if cell.id in seen:
                    cell.id = nbformat.v4.new_markdown_cell().id
                seen.add(cell.id)
        nb.cells = cells
        for change in changes:
            self.log.warning("%s/%s: %s", nbg["student"], nbg["notebook"], change)
        # the autograde pass reads this back (the sanitize pass's resources do not reach it)
        nb.metadata.setdefault("autograde", {})["restored"] = changes
        return nb, resources

    @staticmethod
    def _from_gradebook(ref, entry):
        if entry is None:
            return copy.deepcopy(ref)
        cell_type, src, _, _ = entry
        if cell_type == "code":
            return nbformat.v4.new_code_cell(source=src)
        return nbformat.v4.new_markdown_cell(source=src)

    @staticmethod
    def _retype(cell, cell_type):
        new = nbformat.v4.new_code_cell(source=cell.source) if cell_type == "code" else \
            nbformat.v4.new_markdown_cell(source=cell.source)
        if "id" in cell:
            new.id = cell.id
        return new


def _flags(cell):
    nbg = cell.get("metadata", {}).get("nbgrader", {})
    return {k: nbg.get(k) for k in ("grade", "solution", "locked", "points", "task", "grade_id")}
