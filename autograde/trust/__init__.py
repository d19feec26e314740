"""Trust: how a verdict computed in the untrusted kernel is checked in the grader.

A check records, inside the kernel, what the student's functions returned (``recording``),
encoded so that nothing the kernel sends can run code in the grader (``codec``); the grader
replays the check against that record with its own expected values.  This is the part the
course's checks use, through ``autograde.check_api``.
"""
