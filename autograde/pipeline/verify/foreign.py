"""Code that did not come from the notebook's own cells: a passing cell that relies on it
earns nothing until the instructor has read it (the findings are :func:`autograde.pipeline.scan.foreign_code`'s)."""
from __future__ import annotations

from .calls import check_calls
from .source import names_used

__all__ = ["foreign_verdict"]


def foreign_verdict(cell, position, foreign, check_packages):
    """A passing cell whose checked functions (or the names it uses) rely on code that
    did not come from the notebook's own cells, or that runs after a cell which ran such
    code without binding a name: it earns nothing and goes to the instructor."""
    names, from_cell = foreign
    roots = set(names_used(cell.source))
    for _, _, args, kwargs in check_calls(cell.source, check_packages):
        roots |= {spec[1].split(".")[0] for spec in list(args or []) +
                  list((kwargs or {}).values()) if spec[0] in ("name", "attr")}
    hit = sorted(roots & set(names))
    if hit:
        where = f"{hit[0]} {names[hit[0]]}"
    elif from_cell is not None and from_cell[0] < position:
        where = f"the answers run {from_cell[1]}"
    else:
        return None
    return {"verdict": "needs_review", "ename": "ForeignCode",
            "message": f"{where}: code that did not come from the notebook's own cells "
                       "(run from a string, rebuilt from data, imported from a file, "
                       "looked up by a computed name, or autograd where the lab asks for "
                       "the gradient by hand) earns nothing until the instructor has read "
                       "it"}
