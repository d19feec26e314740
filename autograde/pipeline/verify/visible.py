"""Tying visible checks to hidden ones: a visible test cell (its inputs shown to the
student) keeps its points only if the hidden checks of the functions it uses passed the
grader's replay (``AutogradeSettings.visible_points = "tied"``)."""
from __future__ import annotations

from nbgrader import utils as nbutils

from .calls import check_calls
from .cell import NOT_GRADABLE
from .outputs import error, note
from .source import names_used, top_level_names

__all__ = ["is_visible", "tie_visible_cells"]


def is_visible(cell, released, check_packages):
    """A graded test cell the student saw whole: its released source is the same (a
    hidden cell's hidden block is not in the release); without the release, a cell
    whose check calls all pass a shown seed (or that calls no check)."""
    gid = cell.metadata.nbgrader.get("grade_id")
    if released is not None and gid in released:
        return released[gid].strip() == cell.source.strip()
    calls = check_calls(cell.source, check_packages)
    return not calls or all(kwargs and kwargs.get("seed", ("", None))[0] == "const"
                            for _, _, _, kwargs in calls)


def tie_visible_cells(nb, verdicts, released, check_packages):
    """A visible check never scores on its own: its inputs are shown, so a replaced
    comparison (scored in the kernel) or outputs hard-coded for them (which its own
    replay accepts) would pass it.  A passing visible cell keeps its points only if the
    hidden checks of the student functions it uses exist and passed the grader's
    replay; a hidden check left for a GPU host takes the visible cell with it."""
    defined = set()
    for cell in nb.cells:
        if cell.cell_type == "code" and not nbutils.is_locked(cell):
            defined |= top_level_names(cell.source)
    hidden = {}                     # function name -> [(grade_id, verdict)]
    visible = []
    for cell in nb.cells:
        verdict = cell.get("metadata", {}).get("autograde", {}).get("verdict")
        if not verdict:
            continue
        if is_visible(cell, released, check_packages):
            visible.append((cell, verdict))
            continue
        for _, _, args, kwargs in check_calls(cell.source, check_packages):
            for spec in list(args or []) + list((kwargs or {}).values()):
                if spec[0] in ("name", "attr"):
                    hidden.setdefault(spec[1].split(".")[0], []).append(
                        (cell.metadata.nbgrader.get("grade_id"), verdict))
    for cell, verdict in visible:
        if verdict["verdict"] != "pass":
            continue
        gid = cell.metadata.nbgrader.get("grade_id")
        # what it checks: the functions handed to a check (a locked launcher that runs
        # the student's kernel included) and the student's own functions it uses
        used = set(names_used(cell.source)) & (defined | set(hidden))
        for _, _, args, kwargs in check_calls(cell.source, check_packages):
            used |= {spec[1].split(".")[0] for spec in list(args or []) +
                     list((kwargs or {}).values()) if spec[0] in ("name", "attr")}
        names = sorted(n for n in used if n in hidden)
        message, outcome = None, "tied"
        if not names:
            message = ("no hidden check of the functions this visible check uses was "
                       "replayed by the grader, so its points do not count")
        for name in names:
            failed = [g for g, v in hidden[name] if v["verdict"] not in ("pass", NOT_GRADABLE)]
            if failed:
                message = (f"{name} did not pass its hidden check ({', '.join(failed)}), "
                           "so this visible check's points do not count")
                break
        if message is None and not any(v["verdict"] == "pass" for name in names
                                       for _, v in hidden[name]):
            outcome = NOT_GRADABLE
            message = "its hidden checks need a CUDA GPU"
        if message is None:
            continue
        verdict.update(verdict=outcome, message=message)
        if outcome == NOT_GRADABLE:
            cell.outputs.append(note(f"\n[autograde: not gradable here: {message}; this "
                                      "cell will be graded on a GPU host]\n"))
        else:
            cell.outputs.append(error("HiddenCheckFailed", message))
        verdicts[gid] = verdict
