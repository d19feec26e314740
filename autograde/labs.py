"""What differs from lab to lab when grading: the time a cell may take, and what a graded
function must not use.

Timeouts are per cell, in seconds, sized for the Triton interpreter on a CPU (a gather-heavy
kernel costs about 40 ms per program there, so the hidden checks keep their grids tiny); the
GPU environment uses the same numbers, which it never comes near.  ``nbgrader_config.py`` can
override any of them with ``c.AutogradeSettings.lab_timeouts = {"lab05_forward_correct":
300}``.
"""
from __future__ import annotations

import re

__all__ = ["lab_number", "default_timeout", "forbidden_names"]

# seconds per cell, by lab number; labs not listed get DEFAULT_TIMEOUT
TIMEOUTS = {0: 60, 1: 60, 2: 60, 3: 60, 4: 120, 5: 240, 6: 240, 7: 180, 8: 240, 9: 180, 10: 300}
DEFAULT_TIMEOUT = 120

# Whatever a graded function must not reach (dotted prefixes), on top of the in-kernel
# ``forbid_references``: the operator package except its input makers and comparison helpers,
# its registered operator, and the grading package itself.
FORBIDDEN = ("source_kernels", "torch.ops.source_kernels", "autograde")
ALLOWED = ("source_kernels.inputs", "source_kernels.testing")


def lab_number(assignment_id: str):
    """``lab05_forward_correct`` -> 5; None for an assignment that is not ``labNN_...``."""
    match = re.match(r"lab(\d+)", assignment_id or "")
    return int(match.group(1)) if match else None


def default_timeout(assignment_id: str) -> int:
    number = lab_number(assignment_id)
    return TIMEOUTS.get(number, DEFAULT_TIMEOUT) if number is not None else DEFAULT_TIMEOUT


def forbidden_names(assignment_id: str, extra=(), allowed=()):
    """(forbidden prefixes, allowed prefixes) for the static scan of a lab's submissions."""
    return tuple(FORBIDDEN) + tuple(extra), tuple(ALLOWED) + tuple(allowed)
