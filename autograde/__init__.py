"""Grading the course: hidden-check code (``autograde.checks``), the grading environment (CPU
interpreter or GPU), the sandboxed kernel, the out-of-kernel verdicts, parallel autograde and
its reports.  ``nbgrader_config.py`` wires it into nbgrader (``autograde.runner.nbgrader_setup``);
``python -m autograde`` adds the instructor's commands.

Importing this package is cheap on purpose: the grading kernel imports
``autograde.trust.recording`` before the first cell.
"""

# The operator's modules every lab's graded code may call (input makers, comparison helpers,
# Triton shims: no answer in any of them).  One statement of the rule for the grader's static
# scan (``labs.forbidden_names``) and the checks' runtime trap (``forbid_references``, through
# ``check_api``): this module is in every grading kernel's view, ``autograde.labs`` is not.
ALWAYS_ALLOWED = ("source_kernels.inputs", "source_kernels.testing",
                  "source_kernels.triton_compat")
