"""What the course's checks use of the engine, and all of it.

A check module (``autograde.checks.labNN``, or a course's own check package named in
``AutogradeSettings.check_packages``) imports this module and nothing else of the engine, so
that the engine can change behind it.  It runs in two places: inside the grading kernel,
where it records what the student's functions returned, and in the grader, where the same
check is replayed against that record with the grader's own expected values
(:mod:`autograde.trust.recording` says how).

- ``recording()``, ``replaying()``: whether the check runs in the grading kernel (it
  records what the student's functions return, and judges nothing) or in the grader's
  replay;
- ``session(functions, ...)``: records the student's functions (in the kernel) or binds them
  to the record (in the replay); ``next_seed()``: the seed of an unseeded input maker, the
  grader's while grading;
- ``note_verdict_here()``: asked by ``judging()``: a check that compares only in the replay;
- ``Proxy``: a student's function as the replay sees it; ``InputChanged``: the mistake of a
  function that wrote into a tensor it was given to read;
- ``watch_kernel_launches``, ``replay_launches``: Triton launches counted in the kernel, and
  the recorded count read back in the replay;
- ``kernel_view_table()``: the per-lab table of what the grading kernel holds (raises
  ImportError inside the kernel, whose view does not hold it);
- ``ALWAYS_ALLOWED``: the operator's modules every lab's graded code may call, the one list
  the grader's static scan reads too.

A course's check package may also define ``call_rule(lab)`` at its top: what a graded
function may call besides its own code (see ``autograde/checks/__init__.py``).
"""
from __future__ import annotations

from . import ALWAYS_ALLOWED
from .trust.recording import (InputChanged, Proxy, next_seed, note_verdict_here, recording,
                              replay_launches, replaying, session, watch_kernel_launches)

__all__ = ["ALWAYS_ALLOWED", "InputChanged", "Proxy", "kernel_view_table", "next_seed",
           "note_verdict_here", "recording", "replay_launches", "replaying", "session",
           "watch_kernel_launches"]


def kernel_view_table() -> dict:
    """``autograde.labs.KERNEL_VIEW``; ImportError in the grading kernel."""
    from .labs import KERNEL_VIEW
    return KERNEL_VIEW
