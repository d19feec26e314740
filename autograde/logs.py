"""Log lines safe for the instructor's terminal.

nbgrader's own log lines name what a submission controls (a student's folder, a notebook's
path, the message of an exception raised while grading it), and so may the course's; written
as they are, a folder named with terminal escapes would move the cursor, redraw lines above
or set the window title of whoever runs ``nbgrader autograde``.  ``escape_log_records()``
makes every log record of the process carry its message (and the text of its exception)
already escaped by :func:`autograde.pipeline.status.printable`, newlines kept; it is installed by
``autograde.runner.nbgrader_setup.configure`` (so in every nbgrader command of the course) and by
``python -m autograde``.
"""
from __future__ import annotations

import logging

__all__ = ["escape_log_records", "escaped"]

_LIMIT = 200_000


def escaped(text, limit=_LIMIT, newlines=True) -> str:
    """``text`` safe to print on a terminal, write into a CSV or show in a page: control and
    format characters (terminal escapes, carriage returns, bidirectional overrides) are
    written out as ``\\xNN`` / ``\\uNNNN``, so that nothing a submission sent (a record, an
    exception message, a folder name) can move the cursor, redraw another row, set a window
    title or reach the clipboard; tabs become spaces, newlines too unless ``newlines``; at
    most ``limit`` characters.  The standard library only, so that the sandbox's launcher can
    use it without importing the grader's modules (a kernel that died is seen dead only once
    its launcher has exited); :func:`autograde.pipeline.status.printable` is this rule."""
    import unicodedata
    out = []
    for ch in str(text):
        if ch == "\n" and newlines:
            out.append(ch)
        elif ch in "\n\t":
            out.append(" ")
        elif unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"):
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
                       if code < 0x10000 else f"\\U{code:08x}")
        else:
            out.append(ch)
    clean = "".join(out)
    return clean if len(clean) <= limit else clean[:limit] + "..."


def escape_log_records():
    """Install (once per process) a log record factory whose records are escaped."""
    previous = logging.getLogRecordFactory()
    if getattr(previous, "_autograde_escaped", False):
        return

    def factory(*args, **kwargs):
        record = previous(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:                               # noqa: BLE001  (a bad format string)
            message = f"{record.msg!r} {record.args!r}"
        record.msg, record.args = escaped(message), ()
        if record.exc_info and not record.exc_text:
            record.exc_text = escaped(logging.Formatter().formatException(record.exc_info))
        if record.stack_info:
            record.stack_info = escaped(record.stack_info)
        return record
    factory._autograde_escaped = True
    logging.setLogRecordFactory(factory)
