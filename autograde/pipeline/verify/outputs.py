"""What the verification writes into a graded cell's outputs, and what it reads of them:
the error and note it adds, stderr kept as marked stdout (stderr never decides a score), the
kernel's records and result values removed (nbgrader would read a number as partial
credit), and the records themselves."""
from __future__ import annotations

from nbformat.notebooknode import NotebookNode

from ...trust.recording import MIME

__all__ = ["error", "has_error", "note", "records", "stderr_to_stdout", "strip_records"]


def error(ename, evalue):
    return NotebookNode(output_type="error", ename=ename, evalue=evalue,
                        traceback=[f"{ename}: {evalue}"])


def note(text):
    return NotebookNode(output_type="stream", name="stdout", text=text)


def records(cell):
    """(list of event lists, overflow flag) from the cell's record outputs."""
    events, overflow = [], False
    for out in cell.get("outputs", []):
        if out.get("output_type") == "display_data" and MIME in out.get("data", {}):
            rec = out["data"][MIME]
            if isinstance(rec, dict) and rec.get("overflow"):
                overflow = True
            elif isinstance(rec, dict) and isinstance(rec.get("events"), list):
                events.extend(rec["events"])
    return events, overflow


def has_error(cell):
    return any(o.get("output_type") == "error" for o in cell.get("outputs", []))


def stderr_to_stdout(cell):
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream" and out.get("name") == "stderr":
            out["name"] = "stdout"
            text = out.get("text", "")
            out["text"] = "".join(f"[stderr] {line}" for line in
                                  text.splitlines(keepends=True))


def strip_records(cell, results=True):
    outs = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "display_data" and MIME in out.get("data", {}):
            continue
        if out.get("output_type") == "execute_result" and results:
            continue
        outs.append(out)
    cell["outputs"] = outs
