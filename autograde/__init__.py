"""Grading the course: hidden-check code (``autograde.checks``), the grading environment (CPU
interpreter or GPU), the sandboxed kernel, the out-of-kernel verdicts, parallel autograde and
its reports.  ``nbgrader_config.py`` wires it into nbgrader (``autograde.runner.nbgrader_setup``);
``python -m autograde`` adds the instructor's commands.

Importing this package is cheap on purpose: the grading kernel imports
``autograde.trust.recording`` before the first cell.
"""
