"""The grading pipeline: nbgrader's preprocessors and hooks, one submission at a time.

In the order nbgrader runs them: the submission restored to the released notebook's shape
(``restore``), the notebook run in a sandboxed kernel (``execute``), every graded cell decided
outside the kernel (``verify``, with the static scan of ``scan``), the scores saved
(``grades``), the per-submission status written (``status``, under the gradebook's lock
``dblock``), and the feedback page (``feedback``, ``page_size``).  The runner's
``nbgrader_setup.configure`` wires them into a course's nbgrader configuration.
"""
