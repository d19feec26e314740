"""The helpers the test modules share (tests/ is on pytest's ``pythonpath``, so a module
imports them as ``from support import nbgrader_helpers`` or
``from support.system import require_grading_sandbox``):

- ``system``: the system packages and the grading sandbox some tests need (skip or fail);
- ``nbgrader_helpers``: throw-away course directories, nbgrader runs, gradebook reads;
- ``releases``: each lab's release generated once per test run, copied into a course;
- ``lab_cells``: the labs' cells executed in-process;
- ``hub_helpers``: a course hub started for a test;
- ``browser_helpers``: Debian's Chromium driven by Playwright.
"""
