"""One gradebook writer at a time when several workers grade in parallel.

SQLite allows one writer, and a reader that turns writer while another process writes gets
"database is locked" at once.  ``python -m autograde grade`` sets ``AUTOGRADE_DB_LOCK`` to a
lock file; every nbgrader step that touches the gradebook runs under it (from the pre-convert
hook to the start of execution, and from the end of execution to the post-convert hook), while
the long part, running the notebook, runs in parallel.  Without the variable (nbgrader's own
sequential ``autograde``, or a PostgreSQL gradebook) these are no-ops.
"""
from __future__ import annotations

import fcntl
import os

__all__ = ["acquire", "release", "held"]

_state = {"fh": None, "held": False}


def held() -> bool:
    return _state["held"]


def acquire() -> None:
    path = os.environ.get("AUTOGRADE_DB_LOCK")
    if not path or _state["held"]:
        return
    if _state["fh"] is None:
        _state["fh"] = open(path, "a+")
    fcntl.flock(_state["fh"].fileno(), fcntl.LOCK_EX)
    _state["held"] = True


def release() -> None:
    if _state["held"] and _state["fh"] is not None:
        fcntl.flock(_state["fh"].fileno(), fcntl.LOCK_UN)
    _state["held"] = False
