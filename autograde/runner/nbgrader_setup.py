"""Wire the course's grading pipeline into nbgrader: ``configure(c)`` in nbgrader_config.py.

The nbgrader commands stay the ones nbgrader documents (``generate_assignment``,
``release_assignment``, ``collect``, ``autograde``, ``generate_feedback``, ``export``); this
replaces some of their preprocessors:

sanitize (before running):  ClearOutput, DeduplicateIds, OverwriteKernelspec,
    **RestoreStructure** (cell order, deleted cells, metadata), OverwriteCells,
    CheckCellMetadata
autograde:  **SandboxedExecute** (sandbox, per-lab timeouts, output cap, restarts),
    **VerifyChecks** (replay of hidden checks out of the kernel's reach, stderr, GPU-only
    cells, static scan), LimitOutput, **SaveVerifiedGrades**, AssignLatePenalties,
    CheckCellMetadata, **RecordStatus**
feedback:  GetGrades, **MarkPending** (scores nobody has given yet), **HideHiddenTests**,
    CSSHTMLHeaderPreprocessor; written by **CourseFeedbackExporter** (the course's template,
    maths as MathML and the stylesheet pruned: no network, no script, a few hundred KB)
export:  **StatusCsvExport** (status and reasons columns; empty score when ungradable)
"""
from __future__ import annotations

import functools

__all__ = ["configure"]


def configure(c):
    from ..logs import escape_log_records
    escape_log_records()          # what a submission names reaches the terminal escaped
    from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor
    from nbgrader.preprocessors import (AssignLatePenalties, CheckCellMetadata, ClearOutput,
                                        DeduplicateIds, GetGrades, LimitOutput, OverwriteCells,
                                        OverwriteKernelspec)

    from ..pipeline import status
    from ..pipeline.execute import SandboxedExecute
    from ..pipeline.feedback import TEMPLATE_NAME, TEMPLATES, CourseFeedbackExporter, \
        HideHiddenTests, MarkPending
    from ..pipeline.grades import SaveVerifiedGrades
    from ..pipeline.restore import RestoreStructure
    from ..pipeline.verify import VerifyChecks
    from .export import StatusCsvExport

    c.Autograde.sanitize_preprocessors = [ClearOutput, DeduplicateIds, OverwriteKernelspec,
                                          RestoreStructure, OverwriteCells, CheckCellMetadata]
    c.Autograde.autograde_preprocessors = [SandboxedExecute, VerifyChecks, LimitOutput,
                                           SaveVerifiedGrades, AssignLatePenalties,
                                           CheckCellMetadata, status.RecordStatus]
    c.Autograde.pre_convert_hook = functools.partial(status.pre_convert_hook, config=c)
    c.Autograde.post_convert_hook = functools.partial(status.post_convert_hook, config=c)
    c.GenerateFeedback.preprocessors = [GetGrades, MarkPending, HideHiddenTests,
                                        CSSHTMLHeaderPreprocessor]
    c.GenerateFeedback.exporter_class = CourseFeedbackExporter
    # nbgrader sets HTMLExporter.template_name to its own "feedback" template (the formgrader
    # even does it on every call): a setting on the subclass takes precedence over both
    c.CourseFeedbackExporter.template_name = TEMPLATE_NAME
    c.CourseFeedbackExporter.extra_template_basedirs = [str(TEMPLATES)]
    c.ExportApp.plugin_class = f"{StatusCsvExport.__module__}.{StatusCsvExport.__name__}"
    return c
