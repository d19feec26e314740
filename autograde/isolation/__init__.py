"""Isolation: where a submission's code runs and what it can reach.

The sandbox (``sandbox``: bubblewrap, the namespaces, the launcher), the grading kernel it
starts (``kernel``), the pool of uids a kernel runs as (``uids``), the GPUs it may see
(``gpus``), the resource limits and how their breaches are named (``limits``) and the per-lab
view of the course packages bound into it (``view``).  Nothing here knows about notebooks,
checks or scores.
"""
