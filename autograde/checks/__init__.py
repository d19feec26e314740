"""Hidden checks of the labs: ``autograde.checks.labNN.check_<stage>(student_function)``.

The hidden test cells of a lab hold only an import of its module and one call, so that
neither the released notebook nor the feedback shows how a stage is checked.  Every check
draws fresh random inputs, compares against ``source_kernels`` and runs the student's
function inside ``common.forbid_references()``.
"""
