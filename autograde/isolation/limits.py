"""Naming the limit a grading kernel ran into.

A limit of the sandbox shows up in three ways: as an error in a cell (``MemoryError`` from the
address-space limit, ``BlockingIOError: Resource temporarily unavailable`` from the process
limit when the cell forks or starts a thread, ``OSError: [Errno 27] File too large`` from the
file-size limit: Python ignores ``SIGXFSZ``), as a kernel that dies (the CPU-time limit kills
it; a process limit reached by the kernel's own threads or a failed allocation in C++ ends it
with a message on its stderr), or as a cell that runs past its timeout.  The grader reports
each as an incident whose text starts with the limit's name, so that the report and the
export say "memory limit", "process limit", "file-size limit", "CPU-time limit" or
"time limit" rather than a plain failure.
"""
from __future__ import annotations

import signal

__all__ = ["from_error", "from_exit", "LIMITS", "limit_grader_memory", "memory_reason"]

LIMITS = ("memory limit", "process limit", "file-size limit", "CPU-time limit", "time limit",
          "output limit", "folder limit")

_MEMORY = ("can't allocate memory", "cannot allocate memory", "out of memory",
           "std::bad_alloc", "memoryerror", "not enough memory")
_PROCESSES = ("resource temporarily unavailable", "can't start new thread",
              "pthread_create", "fork: retry", "errno 11]")
_FILE_SIZE = ("file too large", "errno 27]")
_FOLDER = ("no space left on device", "errno 28]")


def _has(text, needles):
    text = (text or "").lower()
    return any(n in text for n in needles)


def _memory(settings):
    if settings.memory_mb:
        return f"the {settings.memory_mb} MiB address-space limit"
    return "the memory available to the kernel"


def from_error(ename, evalue, settings):
    """(limit, text) for a cell's error that a limit caused, else None."""
    both = f"{ename}: {evalue}"
    if ename == "MemoryError" or _has(evalue, _MEMORY):
        return "memory limit", f"memory limit: {ename} under {_memory(settings)}"
    if ename == "BlockingIOError" or _has(both, _PROCESSES):
        return "process limit", (f"process limit: {both[:120]} (at most {settings.processes} "
                                 f"processes and threads per kernel)")
    if ename == "FileTooLarge" or _has(both, _FILE_SIZE):
        return "file-size limit", (f"file-size limit: a file grew past {settings.file_mb} MiB "
                                   f"({both[:120]})")
    if _has(both, _FOLDER):
        return "folder limit", (f"folder limit: a writable folder of the kernel is full (at "
                                f"most {settings.tmp_mb} MiB and {settings.tmp_inodes} files "
                                f"each in /tmp, /dev/shm and the working folder; "
                                f"{both[:120]})")
    return None


def from_exit(report, settings):
    """(limit, text) for a kernel that died, from the launcher's exit report, else None."""
    if not report:
        return None
    text = f"{report.get('head', '')}\n{report.get('tail', '')}"
    code = report.get("status")
    cpu = report.get("cpu_seconds")
    killed = code in (-signal.SIGKILL, 128 + signal.SIGKILL, -signal.SIGXCPU,
                      128 + signal.SIGXCPU)
    if killed and settings.cpu_seconds and cpu is not None and \
            cpu >= settings.cpu_seconds - 1.5:
        return "CPU-time limit", (f"CPU-time limit: the kernel used its {settings.cpu_seconds} "
                                 f"CPU seconds and was stopped")
    if code in (-signal.SIGXFSZ, 128 + signal.SIGXFSZ) or _has(text, _FILE_SIZE):
        return "file-size limit", f"file-size limit: a file grew past {settings.file_mb} MiB"
    if _has(text, _MEMORY):
        return "memory limit", f"memory limit: the kernel ran out of {_memory(settings)}"
    if _has(text, _PROCESSES):
        return "process limit", (f"process limit: the kernel could not start a process or "
                                 f"thread (at most {settings.processes} per kernel)")
    return None


def limit_grader_memory(megabytes):
    """Bound this process's memory to ``megabytes`` MiB (RLIMIT_DATA: heap and private
    writable mappings, which a GPU driver's address-space reservations are not); a later call
    never loosens an earlier one.  Set in each worker of ``python -m autograde grade`` and,
    under plain ``nbgrader autograde``, once in its process by the preprocessor that runs the
    notebooks.  Returns the limit now in force (bytes), None when there is none."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if megabytes:
        size = int(megabytes) * 2 ** 20
        for current in (soft, hard):
            if current != resource.RLIM_INFINITY:
                size = min(size, current)
        resource.setrlimit(resource.RLIMIT_DATA, (size, size))
        soft = size
    return None if soft == resource.RLIM_INFINITY else soft


def memory_reason(megabytes):
    """What the ledger says of a submission whose grading ran out of memory in the grader
    (``megabytes``: the grader's limit in force, 0 or None when there was none)."""
    if not megabytes:
        return ("grader memory: the grader ran out of memory grading this submission (no "
                "limit is set: AutogradeSettings.grader_memory_mb = 0)")
    return (f"grader memory limit: grading this submission needed more than the grader's "
            f"{megabytes} MiB (AutogradeSettings.grader_memory_mb)")
