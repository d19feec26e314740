"""A host-wide pool of kernel uids, and scrubbing what a uid leaves behind.

Every running grading kernel on a host has a uid of its own, whatever started it: one
``nbgrader autograde``, several ``python -m autograde grade`` commands at once, ``--workers``,
``--shard`` or ``python -m autograde probe``.  The pool is a folder of lock files, one per uid
(``uid-64123.lock`` ...): a grader takes a uid by holding an exclusive ``flock`` on its file
for as long as the kernel runs, and gives it back by closing the file.  The kernel of a grader
that crashes or is killed dies with it (``--die-with-parent``), and the kernel of that grader
closes with its process, so its lock goes too: nothing to clean up by hand.  The folder is
``/run/autograde-uids`` (root's, mode 0700) when the grader is root, as it is when it can
switch uids at all; otherwise a folder under the course's status directory.

Before a uid is handed out and after its kernel stops, :func:`scrub` removes what the uid may
have left on the host: its processes (``kill(-1, SIGKILL)`` run *as* the uid, so that a
fork bomb cannot outrun a list of pids), the keys of its user and user-session keyrings (the
kernel itself runs in a fresh anonymous session keyring, :func:`new_session_keyring`), and
its files in the host's ``/dev/shm``, ``/tmp`` and ``/var/tmp``.  The processes and keys are
removed by a helper that runs as the uid, started only when ``/proc`` shows a process of
the uid or ``/proc/key-users`` a key it owns.  Inside the sandbox ``/tmp``
and ``/dev/shm`` are private tmpfs folders that vanish with the kernel; the host's folders
are scrubbed as well in case a kernel ever ran without them (``sandbox = 'none'`` runs under
the grader's own uid and is not scrubbed).
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import platform
import shutil
import signal
import stat
import subprocess
import sys
import time

__all__ = ["UidLease", "acquire", "pool_directory", "scrub", "new_session_keyring",
           "processes_of", "owns_keys"]

ROOT_POOL = "/run/autograde-uids"
SCRUBBED_FOLDERS = ("/dev/shm", "/tmp", "/var/tmp")
# how long a kernel waits for a uid when the whole pool is in use (the previous kernel's scrub
# takes a moment; other grading commands on the host hold theirs for a kernel's life)
ACQUIRE_WAIT_S = 120.0

# keyctl(2) numbers
_SYSCALLS = {"x86_64": {"keyctl": 250}, "aarch64": {"keyctl": 219}, "arm64": {"keyctl": 219}}
KEYCTL_GET_KEYRING_ID = 0
KEYCTL_JOIN_SESSION_KEYRING = 1
KEYCTL_CLEAR = 7
KEY_SPEC_USER_KEYRING = -4
KEY_SPEC_USER_SESSION_KEYRING = -5


def pool_directory(fallback):
    """The lock folder: ``/run/autograde-uids`` for a root grader, else ``fallback``."""
    path = ROOT_POOL if os.geteuid() == 0 else fallback
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


class UidLease:
    """One uid, held (by an open, flocked file) until :meth:`release`."""

    def __init__(self, uid, fd, path):
        self.uid, self._fd, self.path = uid, fd, path

    @property
    def held(self):
        return self._fd is not None

    def release(self):
        if self._fd is not None:
            os.close(self._fd)           # closing the file drops the flock
            self._fd = None

    def __repr__(self):
        return f"UidLease(uid={self.uid}, held={self.held})"


def acquire(base, count, directory, prefer=0, scrub_first=True, wait_s=ACQUIRE_WAIT_S):
    """Lock the first free uid of ``base .. base + count - 1``, trying from ``base + prefer``
    (so that parallel workers rarely knock on the same lock first).  When every uid is in use
    (other kernels, or the scrub of one that just ended), try again until ``wait_s`` seconds
    have passed, then raise RuntimeError."""
    count = max(1, int(count))
    start = int(prefer) % count
    deadline = time.monotonic() + wait_s
    while True:
        for step in range(count):
            uid = base + (start + step) % count
            path = os.path.join(directory, f"uid-{uid}.lock")
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    continue
                raise
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            lease = UidLease(uid, fd, path)
            if scrub_first:
                scrub(uid)
            return lease
        if time.monotonic() >= deadline:
            raise RuntimeError(f"all {count} kernel uids from {base} are in use on this host "
                               f"(AutogradeSettings.kernel_uid_count), still after {wait_s:g} "
                               f"s; see {directory}")
        time.sleep(0.1)


def _keyctl_number():
    return _SYSCALLS.get(platform.machine(), {}).get("keyctl")


def new_session_keyring():
    """Join a fresh anonymous session keyring (inherited by the kernel started next): keys a
    kernel adds to its session keyring die with it.  False where keyctl is unavailable."""
    number = _keyctl_number()
    if number is None:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.syscall(number, KEYCTL_JOIN_SESSION_KEYRING, None) >= 0


def processes_of(uid):
    """Pids of the host whose real uid is ``uid``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as fh:
                for line in fh:
                    if line.startswith("Uid:"):
                        if int(line.split()[1]) == uid:
                            found.append(int(name))
                        break
        except (OSError, ValueError, IndexError):
            continue
    return found


# Run as the uid (setpriv): kill everything of the uid, then empty its keyrings.  kill(-1)
# from an unprivileged process reaches exactly that uid's processes and never the caller.
_AS_UID = r"""
import ctypes, os, signal, sys
for _ in range(50):
    try:
        os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:
        break
libc = ctypes.CDLL(None, use_errno=True)
nr = int(sys.argv[1])
if nr:
    for spec in (-4, -5):
        key = libc.syscall(nr, 0, ctypes.c_long(spec), 0)
        if key >= 0:
            libc.syscall(nr, 7, ctypes.c_long(key))
"""


def _remove_files_of(uid, folders=SCRUBBED_FOLDERS):
    removed = []
    for folder in folders:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if info.st_uid != uid:
                continue
            try:
                if stat.S_ISDIR(info.st_mode):
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)
                removed.append(entry.path)
            except OSError:
                pass
    return removed


def owns_keys(uid):
    """Whether ``uid`` owns keys besides its user and user-session keyrings (the kernel
    creates both at once, on first use, and ``/proc/key-users`` counts them); True when that
    cannot be read."""
    try:
        with open("/proc/key-users") as fh:
            for line in fh:
                owner, _, rest = line.partition(":")
                if owner.strip() == str(uid):
                    return int(rest.split()[1].split("/")[0]) > 2
    except (OSError, ValueError, IndexError):
        return True
    return False


def scrub(uid, keyrings=True):
    """Remove what ``uid`` may have left on this host (see the module docstring); returns a
    dict of what was found.  Needs root; does nothing for uid 0 or the grader's own uid."""
    if uid in (0, os.getuid()) or os.geteuid() != 0:
        return {}
    found = {}
    pids = processes_of(uid)
    keys = keyrings and owns_keys(uid)
    if keys:
        found["keys"] = True
    if pids or keys:
        setpriv = shutil.which("setpriv") or "/usr/bin/setpriv"
        subprocess.run([setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--",
                        sys.executable, "-I", "-S", "-c", _AS_UID, str(_keyctl_number() or 0)],
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=60, check=False)
    if pids:
        found["processes"] = len(pids)
        for pid in processes_of(uid):    # whatever was caught between fork and kill
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    files = _remove_files_of(uid)
    if files:
        found["files"] = files
    return found
