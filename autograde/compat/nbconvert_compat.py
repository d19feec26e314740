"""nbconvert internals the engine uses, written against nbconvert 7.17.2 (pinned in
requirements.txt).

- ``ExecutePreprocessor.preprocess`` begins with three steps (the client's own ``__init__``
  on the notebook, ``reset_execution_trackers`` and the private ``_check_assign_resources``);
  :class:`autograde.pipeline.execute.SandboxedExecute` runs its own loop and takes those three steps
  from :func:`begin_run`.
- The markdown rendering of nbconvert's ``markdown2html`` filter (``IPythonRenderer`` and
  ``MarkdownWithMath`` of ``nbconvert.filters.markdown_mistune``), which the instructor's
  views reuse before cleaning the HTML: :func:`render_markdown`.
"""
from __future__ import annotations

__all__ = ["begin_run", "render_markdown"]


def begin_run(preprocessor, nb, km, resources) -> None:
    """What ``ExecutePreprocessor.preprocess`` does before it runs the first cell."""
    from nbclient import NotebookClient
    NotebookClient.__init__(preprocessor, nb, km)
    preprocessor.reset_execution_trackers()
    preprocessor._check_assign_resources(resources)


def render_markdown(source: str, attachments: dict, path: str) -> str:
    """nbconvert's markdown to HTML, maths kept for MathJax, ``attachments`` inlined."""
    from nbconvert.filters.markdown_mistune import IPythonRenderer, MarkdownWithMath
    renderer = IPythonRenderer(escape=False, attachments=attachments, path=path)
    return MarkdownWithMath(renderer=renderer).render(source)
