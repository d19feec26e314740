"""The guard for a notebook's demonstration cells: the cells that run the student's kernels
outside a check (to print, draw or compare) run them as a check does, so that nothing in them
can kill the notebook's kernel.

``guarded(what, hints)`` -- a context manager around the cell's code::

    with check.guarded("your kernel beside lab 07's chips", hints):
        mine = msda_backward(grad_output, *args.values())
        ...

Every Triton kernel launched inside the block runs in the guard's checked interpreter
(``guard.watch``): a read or a write outside a tensor is not executed, and when the block
ends it is reported with the kernel line that made it (``hints``: the advice for each kernel
parameter, as the lab's checks give it).  An exception raised in the block (the student's
kernel or Python code) is reported as what the cell was doing when it happened, with the
exception and the line of the notebook it came from.  Either way the cell fails with an
AssertionError and the notebook goes on.  On a GPU (compiled kernels) the guard cannot
check accesses: the block runs as it is.
"""
from __future__ import annotations

import contextlib
import linecache
import traceback

from . import guard

__all__ = ["guarded", "where", "unwritten"]


def _library(filename):
    return any(part in filename for part in ("site-packages", "/autograde/", "/source_kernels/",
                                             "/lib/python"))


def where(exc):
    """" (in <function>, at `<line>`)": the innermost line of notebook code (not of a library)
    in the tracebacks of ``exc`` and the exceptions that caused it (Triton's interpreter
    raises its own error from the one the kernel's line raised), or ""."""
    frames, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        inner = [f for f in traceback.extract_tb(exc.__traceback__) if not _library(f.filename)]
        frames = inner or frames
        exc = exc.__cause__ or exc.__context__
    if not frames:
        return ""
    frame = frames[-1]
    line = (frame.line or linecache.getline(frame.filename, frame.lineno)).strip()
    return f" (in {frame.name}, at `{line}`)" if line else f" (in {frame.name})"


def unwritten(exc):
    """True when ``exc`` (or an exception that caused it: Triton's interpreter wraps the
    kernel's) is the NotImplementedError of a cell not written yet."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, NotImplementedError):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


@contextlib.contextmanager
def guarded(what, hints=None):
    """Run the block with every kernel access checked; fail with an explanation instead of
    crashing (see the module's docstring).  ``hints``: {kernel parameter: advice, None: the
    advice for any other}."""
    hints = hints or {}
    with guard.watch() as report:
        try:
            yield report
        except AssertionError:
            raise
        except Exception as exc:                  # noqa: BLE001  (explained, as a failure)
            if unwritten(exc):
                raise AssertionError(f"{what}: a function or kernel this cell runs is not "
                                     f"written yet (it raises NotImplementedError"
                                     f"{where(exc)}): write it first") from None
            text = str(exc).strip().splitlines()
            short = "\n".join(text[:3] + (["..."] + text[-6:] if len(text) > 9 else text[3:]))
            raise AssertionError(
                f"{what}: your code raised {type(exc).__name__}{where(exc)}: {short}\nHint: "
                "the cell stopped there and the notebook goes on. Run the visible checks of "
                "this section: they launch your kernel on small inputs and say what goes "
                "wrong") from None
    if report.violations:
        tensor = report.violations[0].tensor
        report.check(what + " (this cell ran your kernel with every access checked)",
                     hints.get(tensor, hints.get(None)))


# ---------------------------------------------------------------------- labs 01 and 02
NAME_ERROR = "a name is used before any line assigns it (a line missing, or a misspelt name)"


def raised(what, name, got):
    """The AssertionError a check raises when the student's ``name`` raised (``got``: a
    ``common.Raised``): the exception, the notebook line it came from, and for a NameError
    what that means.  A function not written yet is said to be so, first (whatever the input:
    ``nbgrader validate`` shows a message's first 70-odd characters)."""
    exc = got.exc
    if unwritten(exc):
        return AssertionError(f"{name} is not written yet (it raises NotImplementedError"
                              f"{where(exc)}): replace the raise with your code")
    text = str(exc).strip().splitlines()[-1] if str(exc).strip() else ""
    hint = f"\nHint: {NAME_ERROR}" if isinstance(exc, NameError) else ""
    return AssertionError(f"{what}: your {name} raised {type(exc).__name__}{where(exc)}: {text}"
                          + hint)


def is_output(result, shape, dtype, name):
    """For a demonstration cell: True when ``result`` (what ``guard.guarded`` returned) is a
    tensor of ``shape`` and ``dtype``; else print why the cell shows nothing and return False."""
    import torch

    after = " (the check cell of this step says more; this cell shows nothing until it passes)"
    if result is None:
        print(f"{name} gave no result (None){after}")
        return False
    if not isinstance(result, torch.Tensor):
        print(f"{name} returned {type(result).__name__}, not a tensor of shape "
              f"{tuple(shape)}{after}")
        return False
    if tuple(result.shape) != tuple(shape) or result.dtype != dtype:
        print(f"{name} returned a tensor of shape {tuple(result.shape)} and dtype "
              f"{result.dtype}, expected shape {tuple(shape)} and dtype {dtype}{after}")
        return False
    return True
