"""Hidden checks of the labs: ``autograde.checks.labNN.check_<stage>(student_function)``.

The hidden test cells of a lab hold only an import of its module and one call, so that
neither the released notebook nor the feedback shows how a stage is checked.  Every check
draws fresh random inputs, compares against ``source_kernels`` and runs the student's
function inside ``common.forbid_references()``.
"""


def call_rule(lab):
    """The course's rule of what a graded function of lab ``lab`` (a number, or None for an
    assignment that is not a lab) may call besides its own code: (the chips of earlier labs
    it may call, as dotted names; the rule in words).  The grading engine asks each of its
    check packages (``AutogradeSettings.check_packages``) for this rule."""
    from .common import chip_rule, chips_allowed
    return tuple(chips_allowed(lab)), chip_rule(lab)
