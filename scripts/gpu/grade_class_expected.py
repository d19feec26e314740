"""What grading the synthetic class of the fixture lab ``labfx`` should give, by grading
environment: the table of the grading part of scripts/gpu/run.py, with tests/test_grading.py's
``EXPECTED`` as its one source.

- ``cpu``: ``EXPECTED`` as it stands.
- ``gpu``: ``EXPECTED`` with the changes below, derived from the fixture's cells
  (tests/fixtures/course/assignments/labfx), its checks (fixture_checks/labfx.py) and the
  submissions (scripts/make_synthetic_class.py).

The lab's graded cells: lerp_visible 1 point, lerp_hidden 2, corner_weights_hidden 3,
scale_hidden 2 and scale_gpu_hidden 1 (tagged ``gpu``, its check ``@requires_gpu``).  On a GPU
host the grading kernel runs Triton compiled for the device (no interpreter), which changes
one cell and nothing else:

scale_gpu_hidden becomes gradable.  ``check_scale_on_gpu`` puts its input on the GPU and
compares ``scale(x, 3.0)`` with ``3 * x``; it counts no kernel launches, so a ``scale``
written with torch (``alpha * x``) passes it as well as the Triton one.  +1 for every
submission whose ``scale`` computes ``alpha * x`` (``SCALE`` "kernel" or "torch"), 0 for
the released stub (it raises NotImplementedError).
(scale_hidden keeps its points: ``check_scale`` puts its inputs on ``kernel_device()``, the
GPU there, as the course's own checks do.)

Statuses: "needs_gpu" came from scale_gpu_hidden alone, so it goes; what is left is
"graded_with_incidents" where EXPECTED lists an incident (a reason other than the GPU cell's:
EXPECTED lists every incident of these submissions, which the CPU run of that part
confirms) and "graded" otherwise.  "needs_review" and "ungradable" stay.  No reason may say
"not gradable here" any more.

Two submissions break the sandbox's limits rather than a check, and what that leaves behind
decides whether the GPU cell can still run; ``ALTERNATIVES_GPU`` lists the outcomes that are
the sandbox working as designed (the first in the tuple is the one in ``EXPECTED_GPU``):

- spawn_processes fills its uid's process limit with ``sleep 600`` children that outlive the
  cell.  On a CPU host nothing after that needs a new thread or process, but on a GPU host
  compiling the kernel (``ptxas``, the C compiler for Triton's driver module) and creating the
  CUDA context do, so scale_hidden and scale_gpu_hidden fail there ("CUDA-capable device(s)
  is/are busy or unavailable" on the H200): expected 3; 5 or 6 where the context still starts.
- memory_hog allocates 1 GiB blocks without bound; the GPU environment sets no address-space
  limit (CUDA reserves far more than it uses), so the loop ends when the process's address
  space is full or at the 5 s timeout, and the blocks live on in the cell's traceback: the
  CUDA context of a later cell may find no room.  Expected 4 ("graded"); 3, or
  "graded_with_incidents" when the loop was stopped by the timeout, are the same sandbox
  working.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

__all__ = ["EXPECTED", "EXPECTED_GPU", "ALTERNATIVES_GPU", "SCALE", "POINTS", "MAX_SCORE",
           "expected_for", "compare"]


def _load_expected():
    """``EXPECTED`` from tests/test_grading.py (importing it starts nothing: the course is
    built by a pytest fixture, run only by pytest)."""
    path = REPO / "tests" / "test_grading.py"
    if str(path.parent) not in sys.path:           # it imports its conftest's helpers
        sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location("_grading_tests_for_expected", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.EXPECTED


EXPECTED = _load_expected()

POINTS = {"lerp_visible": 1, "lerp_hidden": 2, "corner_weights_hidden": 3, "scale_hidden": 2,
          "scale_gpu_hidden": 1}
MAX_SCORE = sum(POINTS.values())
GPU_REASON = "not gradable here"

# What each submission's ``scale`` is (scripts/make_synthetic_class.py): the Triton kernel of
# the source notebook ("kernel"), TORCH_SCALE's ``alpha * x`` with an empty kernel ("torch"),
# or the released stub that raises NotImplementedError ("stub").  None: never graded.
SCALE = {
    "correct": "kernel", "partly_wrong": "kernel", "empty": "stub",
    "cheat_patch_compare": "kernel", "cheat_patch_check": "torch",
    "cheat_edit_tests": "torch", "cheat_delete_tests": "torch", "cheat_reorder": "kernel",
    "cheat_metadata": "kernel", "cheat_reference": "kernel", "cheat_chip": "kernel",
    "cheat_hardcode": "kernel", "infinite_loop": "kernel", "ignore_sigint": "kernel",
    "memory_hog": "kernel", "spawn_processes": "kernel", "huge_output": "kernel",
    "read_secrets": "kernel", "crash_kernel": "kernel",
    "corrupt_json": None, "missing_notebook": None,
}
# submissions whose GPU cells (scale_hidden, which then needs a CUDA context, and
# scale_gpu_hidden) are expected to fail although their scale is right
GPU_CELL_FAILS = {"spawn_processes": "the uid's process limit is full: no compiler, no CUDA "
                                     "context"}


# submissions with an incident that the CPU host's "needs_gpu" status outranks (the report
# shows the highest status): on a GPU host the incident is the status
INCIDENT_BEHIND_NEEDS_GPU = {"spawn_processes": "process limit",
                             "cheat_chip": "a chip the graded function must not use"}


def _gpu_row(student, row):
    score, status, reasons = row
    if score is None:
        return row
    kind = SCALE[student]
    # an answer whose scale_hidden goes to review (names rebound at run time) sends its GPU
    # cell, which calls the same function, to review too: no point for it
    reviewed = any(r.startswith("scale_hidden: needs review") and "rebind names" in r
                   for r in reasons)
    gpu_cell = kind in ("kernel", "torch") and student not in GPU_CELL_FAILS and not reviewed
    score = score + (POINTS["scale_gpu_hidden"] if gpu_cell else 0)
    if student in GPU_CELL_FAILS and kind == "kernel":
        score -= POINTS["scale_hidden"]         # passed in the interpreter, needs CUDA here
    kept = [r for r in reasons if GPU_REASON not in r]
    if status == "needs_gpu":
        incident = student in INCIDENT_BEHIND_NEEDS_GPU
        status = "graded_with_incidents" if kept or incident else "graded"
    return score, status, kept


def _derive_gpu():
    missing = sorted(set(EXPECTED) ^ set(SCALE))
    if missing:
        raise RuntimeError(f"EXPECTED and SCALE name different students: {missing}; "
                           "describe the new submissions in scripts/gpu/grade_class_expected.py")
    return {student: _gpu_row(student, row) for student, row in EXPECTED.items()}


EXPECTED_GPU = _derive_gpu()

# (score, status) pairs that are also the sandbox working as designed on a GPU host
ALTERNATIVES_GPU = {
    "spawn_processes": [(EXPECTED_GPU["spawn_processes"][0] + 2, "graded_with_incidents"),
                        (EXPECTED_GPU["spawn_processes"][0] + 3, "graded_with_incidents")],
    "memory_hog": [(EXPECTED_GPU["memory_hog"][0] - 1, "graded"),
                   (EXPECTED_GPU["memory_hog"][0], "graded_with_incidents"),
                   (EXPECTED_GPU["memory_hog"][0] - 1, "graded_with_incidents")],
}


def expected_for(environment):
    """(table, alternatives) for the grading environment actually used ("cpu" or "gpu")."""
    if environment == "gpu":
        return EXPECTED_GPU, ALTERNATIVES_GPU
    if environment == "cpu":
        return EXPECTED, {}
    raise ValueError(f"no expected table for the grading environment {environment!r}")


def _score(value):
    return None if value in ("", None) else float(value)


def compare(rows, environment):
    """Compare report rows ({student: {"score", "max_score", "status", "reasons"}}) with the
    table of ``environment``.  Returns {"students": {student: {...}}, "all_as_expected": bool,
    "matched_an_alternative": [...], "problems": [...]}."""
    table, alternatives = expected_for(environment)
    out, problems, alternative_hits = {}, [], []
    for student in sorted(set(table) | set(rows)):
        row = rows.get(student)
        if student not in table:
            problems.append(f"{student}: graded but not in the expected table")
            out[student] = {"as_expected": False, "why": "not in the expected table"}
            continue
        score, status, reasons = table[student]
        entry = {"expected": {"score": score, "status": status, "reasons": reasons}}
        if row is None:
            entry.update(as_expected=False, why="no row in the report")
            problems.append(f"{student}: no row in the report")
            out[student] = entry
            continue
        got_score, got_status, got_reasons = _score(row.get("score")), row.get("status"), \
            row.get("reasons") or ""
        why = []
        missing = [r for r in reasons if r not in got_reasons]
        if missing:
            why.append(f"reasons lack {missing}")
        if environment == "gpu" and GPU_REASON in got_reasons:
            why.append("a cell is still 'not gradable here'")
        if got_score is not None and row.get("max_score") not in ("", None) and \
                float(row["max_score"]) != MAX_SCORE:
            why.append(f"max score {row['max_score']}, expected {MAX_SCORE}")
        matched = None
        if (got_score, got_status) == (score, status):
            matched = "expected"
        elif (got_score, got_status) in [(float(s), st) for s, st in alternatives.get(student, [])]:
            matched = "alternative"
            alternative_hits.append(student)
        else:
            why.append(f"got {got_score} {got_status}, expected {score} {status}")
        entry.update(as_expected=matched is not None and not why, matched=matched,
                     alternatives=[{"score": s, "status": st}
                                   for s, st in alternatives.get(student, [])] or None)
        if why:
            entry["why"] = "; ".join(why)
            problems.append(f"{student}: {entry['why']}")
        out[student] = entry
    return {"students": out, "all_as_expected": not problems,
            "matched_an_alternative": alternative_hits, "problems": problems}


if __name__ == "__main__":
    env = sys.argv[1] if len(sys.argv) > 1 else "gpu"
    table, alternatives = expected_for(env)
    for student, (score, status, reasons) in table.items():
        alt = "".join(f"  or {s} {st}" for s, st in alternatives.get(student, []))
        print(f"{student:22} {'-' if score is None else score:>3}  {status}{alt}")
