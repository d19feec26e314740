"""nbgrader configuration of the course: the repository root is the course directory.

The nbgrader commands are nbgrader's own (generate_assignment, release_assignment, collect,
autograde, generate_feedback, export); ``autograde.runner.nbgrader_setup.configure`` swaps in the
course's grading steps: a sandboxed kernel, hidden checks decided outside it, reports that
keep ungradable submissions apart.  ``python -m autograde grade LAB`` grades a class in
parallel.  The instructors' guide, book/instructors.md, explains every setting below.
"""
import os

from autograde.runner.nbgrader_setup import configure

c = get_config()  # noqa: F821  (provided by nbgrader)

c.CourseDirectory.root = os.path.dirname(os.path.abspath(__file__))
c.CourseDirectory.course_id = "msda-triton"
c.CourseDirectory.source_directory = "assignments"
configure(c)

# Where hidden tests run: "cpu" (Triton interpreter), "gpu", or "auto" (the GPU if the
# grading host has one).  The choice is printed in the autograde log.
c.AutogradeSettings.environment = "auto"
# "bwrap" (bubblewrap sandbox, needs root), "none" (no isolation) or "auto" (bwrap if it works).
c.AutogradeSettings.sandbox = "auto"
# Seconds per cell by lab; the defaults (autograde/labs.py) fit the CPU interpreter.
# c.AutogradeSettings.lab_timeouts = {"lab05_forward_correct": 300}

# Several graders sharing one gradebook: a PostgreSQL database instead of gradebook.db.
# c.CourseDirectory.db_url = "postgresql://grader:PASSWORD@db.example.org/msda_triton"
# JupyterHub with nbgrader's exchange (release/fetch/submit/collect):
# c.Exchange.root = "/srv/nbgrader/exchange"
