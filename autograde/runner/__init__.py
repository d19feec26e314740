"""Running a class: what the instructor and the hub start.

The command line (``cli``), grading many submissions in parallel (``parallel``), the
exchange between students and the course (``exchange``), exports (``export``), the
instructor's views (``instructor_view``), the similarity report (``similarity``), the probe
of what a grading kernel can reach (``probe``), and the course's nbgrader configuration
(``nbgrader_setup``: the pipeline's preprocessors and the runner's export).
"""
