"""What differs from lab to lab when grading: the time a cell may take, what a graded
function must not use, and what of the course packages the grading kernel sees.

Timeouts are per cell, in seconds, sized for the Triton interpreter on a CPU (a gather-heavy
kernel costs about 40 ms per program there, so the hidden checks keep their grids tiny); the
GPU environment uses the same numbers, which it never comes near.  ``nbgrader_config.py`` can
override any of them with ``c.AutogradeSettings.lab_timeouts = {"lab05_forward_correct":
300}``.
"""
from __future__ import annotations

import re

from . import ALWAYS_ALLOWED

__all__ = ["lab_number", "default_timeout", "forbidden_names", "kernel_view", "KERNEL_VIEW",
           "by_hand"]

# seconds per cell, by lab number; labs not listed get DEFAULT_TIMEOUT
TIMEOUTS = {0: 60, 1: 60, 2: 60, 3: 60, 4: 120, 5: 240, 6: 240, 7: 180, 8: 240, 9: 180, 10: 300}
DEFAULT_TIMEOUT = 120

# Whatever a graded function must not reach (dotted prefixes), on top of the in-kernel
# ``forbid_references``: the operator package except its input makers, comparison helpers and
# Triton shims (no answer in any of them), its registered operator, and the grading package
# itself.
FORBIDDEN = ("source_kernels", "torch.ops.source_kernels", "autograde")
ALLOWED = ALWAYS_ALLOWED


def lab_number(assignment_id: str):
    """``lab05_forward_correct`` -> 5; None for an assignment that is not ``labNN_...``."""
    match = re.match(r"lab(\d+)", assignment_id or "")
    return int(match.group(1)) if match else None


def default_timeout(assignment_id: str) -> int:
    number = lab_number(assignment_id)
    return TIMEOUTS.get(number, DEFAULT_TIMEOUT) if number is not None else DEFAULT_TIMEOUT


# labs whose gradients must be written by hand: autograd in an answer is code the student did
# not write (the grader's static look at the notebook, ``scan.foreign_code``)
BY_HAND = (7,)


def by_hand(assignment_id: str) -> bool:
    return lab_number(assignment_id) in BY_HAND


def forbidden_names(assignment_id: str, extra=(), allowed=()):
    """(forbidden prefixes, allowed prefixes) for the static scan of a lab's submissions."""
    return tuple(FORBIDDEN) + tuple(extra), tuple(ALLOWED) + tuple(allowed)


# ---------------------------------------------------------------- the grading kernel's view
# What the grading kernel of each lab may import or read of the course packages
# (``autograde.isolation.view`` stages exactly this and the sandbox binds it instead of the packages).
# "*": the whole module; a tuple: only those names and what they need (a chip that re-exports
# the reference gets the few functions it re-exports, never the reference module);
# "switch": ``source_kernels`` itself, reduced to its interpreter switch.
#
# Never in any view: ``source_kernels.reference``, ``op``, ``validate``, ``traced``,
# ``bench``, ``model``, the chips of the lab being graded, ``autograde.checks.diagnose``
# (expected values and mistake models: the grader's replay only), and the rest of
# ``autograde`` (its pipeline, isolation and runner layers: the verification, the gradebook,
# the sandbox and the report code).
KERNEL_COMMON = {
    # the interpreter switch, the input makers and the comparison helpers (the notebooks'
    # setup cells import them; they compute no answer)
    "source_kernels": "switch",
    "source_kernels.inputs": "*",
    "source_kernels.testing": "*",
    "source_kernels.chips": "*",            # its docstring only: no chip is imported by it
    # Triton's internals, each behind one module (the launch counter of autograde.trust.recording,
    # the guard of the checks and the operator's launcher reach Triton through them)
    "source_kernels.triton_compat": "*",
    # what a hidden check runs in the kernel: it runs the student's functions on inputs from
    # a seed and records what they return (``judging()`` is False there, so none of these
    # computes an expected value in the kernel)
    "autograde": "*",
    "autograde.check_api": "*",
    "autograde.trust": "*",
    "autograde.trust.codec": "*",
    "autograde.trust.recording": "*",
    "autograde.compat": "*",
    "autograde.compat.triton_compat": "*",
    "autograde.checks": "*",
    "autograde.checks.common": "*",
}

# by lab number: the earlier labs' chips the lab's notebook imports (its setup cell and its
# answers' scaffolding), then the check modules its test cells call.
KERNEL_VIEW = {
    0: {"autograde.checks.lab00": "*"},
    # lab 00's layer, built on the grid_sample version of the operator (a torch call any
    # student may write); lab 01 asks for the loops of the spec, checked on their own
    # (autograde.checks._operator: the isolation probes' inputs, which the kernel builds
    # from the check's seed as the grader does; its expected values need the reference)
    1: {"source_kernels.chips.lab00": ("MSDeformAttn",),
        "autograde.checks.lab01": "*", "autograde.checks._operator": "*"},
    # lab 01's spec, the comparison lab 02's flat-memory version is measured against
    2: {"source_kernels.chips.lab01": ("msda_naive",),
        "autograde.checks.lab02": "*", "autograde.checks._operator": "*"},
    3: {"source_kernels.chips.lab02": ("contiguous_strides", "flat_offset"),
        "autograde.checks.lab03": "*"},
    4: {"source_kernels.chips.lab01": ("bilinear_sample_naive",),
        "source_kernels.chips.lab03": ("gather_traffic",),
        "autograde.checks.lab04": "*", "autograde.checks.guard": "*"},
    # the spec in loops and lab 04's one-image kernel: the notebook compares against the
    # first and builds on the second; the graded stages are the wide forward kernel's parts,
    # which neither holds (source_kernels.forward/sampling/launch stay out)
    5: {"source_kernels.chips.lab01": ("msda_naive",),
        "source_kernels.chips.lab04": ("bilinear_sample_triton",),
        "autograde.checks.lab05": "*", "autograde.checks.guard": "*",
        "autograde.checks._operator": "*"},
    # lab 05's wide forward is the baseline lab 06 measures against; it launches the loop,
    # tiled and row-blocked kernels (all wide over channels); the graded narrow kernel and
    # the tuner (chips.lab06) are not among them
    6: {"source_kernels.chips.lab03": ("gather_traffic",),
        "source_kernels.chips.lab05": "*",
        "source_kernels.forward": "*", "source_kernels.launch": "*",
        "source_kernels.sampling": "*", "source_kernels.tiled": "*",
        "source_kernels.rows": "*",
        "autograde.checks.lab06": "*", "autograde.checks._operator": "*"},
    7: {"source_kernels.chips.lab01": ("msda_naive",),
        "autograde.checks.lab07": "*", "autograde.checks._operator": "*",
        "autograde.checks.diagnose_grad": "*"},
    # lab 07's gradients in PyTorch are what lab 08's kernels are compared with in the
    # notebook; the graded atomics and backward kernel (chips.lab08, source_kernels.backward)
    # stay out
    8: {"source_kernels.chips.lab07": ("grad_attention_weights", "grad_sampling_locations",
                                       "grad_value", "sample_corners"),
        "autograde.checks.lab08": "*", "autograde.checks.guard": "*",
        "autograde.checks._operator": "*", "autograde.checks.diagnose_grad": "*"},
    # the compiler driver, its child process (it compiles with the interpreter off) and the
    # kernels it compiles (the notebook reads their PTX); the graded listing readers
    # (ptx.atomic_instructions, atomic_summary) and the accumulation default and its buffer
    # (backward.default_fp32_grad_accum, grad_value_buffer) are cut out: only the kernels
    # and their launch constants are copied
    9: {"source_kernels.ptx": ("compile_ptx",), "source_kernels.ptx_child": "*",
        "source_kernels.forward": ("_msda_forward_kernel", "forward_config"),
        "source_kernels.backward": ("_msda_backward_kernel", "BWD_BLOCK_Q", "BWD_NUM_WARPS"),
        "source_kernels.tiled": "*", "source_kernels.sampling": "*",
        "autograde.checks.lab09": "*"},
    # the forward and backward launchers of labs 05 and 08, which the graded autograd
    # Function and operator must call to launch kernels (so the kernels and their launch
    # helpers come too); the graded wrapper, validation and registration (op.py,
    # validate.py, traced.py, chips.lab10) stay out
    10: {"source_kernels.chips.lab05": "*", "source_kernels.chips.lab08": "*",
         "source_kernels.forward": "*", "source_kernels.backward": "*",
         "source_kernels.launch": "*", "source_kernels.sampling": "*",
         "source_kernels.tiled": "*", "source_kernels.rows": "*",
         "autograde.checks.lab10": "*", "autograde.checks._operator": "*"},
}

# the guard of the cells that run the student's code outside a check
# (``autograde.checks.demo``, reached as ``check.guarded`` from labs 01, 02, 06 and 08; the
# checks of labs 04 and 07 word a student's exception with it)
for _number in (1, 2, 4, 6, 7, 8):
    KERNEL_VIEW[_number].update({"autograde.checks.demo": "*", "autograde.checks.guard": "*"})


def kernel_view(assignment_id: str) -> dict:
    """{dotted module: "*" | tuple of names | "switch"} that the grading kernel of
    ``assignment_id`` sees; an assignment that is not a course lab sees the common part."""
    view = dict(KERNEL_COMMON)
    view.update(KERNEL_VIEW.get(lab_number(assignment_id), {}))
    return view
