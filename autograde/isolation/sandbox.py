"""The grading kernel's sandbox: bubblewrap, an unprivileged uid and resource limits.

No Docker: the kernel runs inside ``bwrap`` (Debian's ``bubblewrap``) with its own network,
pid, ipc and uts namespaces, so it has no network at all (not even loopback to the host), sees
no process of the host, and is killed with everything it spawned when it ends.  Its file
system is built from read-only binds of what Python needs (``/usr``, the Python install, the
virtual environment, and the lab's staged view of the course's ``source_kernels`` and
``autograde`` packages, :mod:`autograde.isolation.view`, never the packages themselves) plus an empty,
size-limited working folder and private ``/tmp``: a submission is its notebook, whose cells
arrive over the kernel's socket, and no other file of it is there; the course directory, the
gradebook, the source notebooks and the other students' folders are simply not there.  Inside,
``setpriv`` drops to a uid that no other running kernel on the host has (taken from the host's
pool, :mod:`autograde.isolation.uids`, so that the process limit and the keyrings are this kernel's
only) with no capabilities and ``no_new_privs``, and ``prlimit`` caps address space,
processes, CPU seconds, file size and open files.  The launcher joins a fresh session keyring
before it starts bwrap, so a key the kernel adds there dies with it; when the kernel ends the
grader scrubs its uid (processes, user keyrings, files in the host's /tmp and /dev/shm) before
the uid goes back to the pool.  The launcher writes how the kernel ended (exit status, the
first and last few kB of its output) to ``exit.json`` in the grader's private folder, from
which the grader names a limit the kernel ran into.

The kernel talks to the grader over ZeroMQ ``ipc`` sockets in a directory that the grader
creates and closes once the kernel is up.  The kernel spec's command is ``python -m
autograde.isolation.sandbox launch SPEC CONNECTION_FILE``: this launcher (run as the grader's user)
builds the ``bwrap`` command, starts it with SIGINT ignored (jupyter_client interrupts by
signalling the whole process group; the kernel inside re-enables SIGINT while it runs a
cell), keeps the first few kB of the kernel's stdout/stderr for the log and drops the rest.

Modes: ``bwrap`` (the above; needs root, the normal case on a grading host or in CI) and
``none`` (a plain kernel with the same environment and the per-process limits, no isolation:
for a laptop; the log says so in capitals).
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import threading

__all__ = ["build_command", "sandbox_available", "main", "KERNEL_CWD", "CONNECTION_PATH",
           "PYTHON_FLAGS", "exit_message"]

KERNEL_CWD = "/submission"
CONNECTION_PATH = "/run/autograde/connection.json"
_KEEP_OUTPUT = 8192
# -P (safe_path): ``-m`` puts no working folder in front of sys.path, which then starts with
# PYTHONPATH, the course's view (IPython adds none either when the flag is set)
PYTHON_FLAGS = ("-P",)


def bwrap_path():
    return shutil.which("bwrap")


def sandbox_available():
    """(True, "") when a bubblewrap sandbox with a uid switch can start here, else
    (False, why)."""
    if os.name != "posix":
        return False, "not a POSIX system"
    if bwrap_path() is None:
        return False, "bwrap (bubblewrap) is not installed: apt-get install bubblewrap"
    if shutil.which("setpriv") is None or shutil.which("prlimit") is None:
        return False, "setpriv/prlimit (util-linux) are missing"
    if os.geteuid() != 0:
        return False, "the grader does not run as root, so it cannot switch the kernel to an " \
                      "unprivileged uid"
    try:
        proc = subprocess.run(
            [bwrap_path(), "--ro-bind", "/", "/", "--unshare-net", "--unshare-pid",
             "--unshare-ipc", "--die-with-parent", "--", "true"],
            capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"bwrap failed to start: {exc}"
    if proc.returncode != 0:
        return False, "bwrap cannot create namespaces here: " + \
            proc.stderr.decode(errors="replace").strip()[:300]
    return True, ""


def _root_layout():
    """Binds that recreate /usr, /bin, /lib... as on the host (links stay links)."""
    args = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = "/" + name
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for path in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime",
                 "/etc/fonts", "/etc/hosts", "/etc/nsswitch.conf", "/etc/alternatives"):
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    return args


def _inside(path, roots):
    path = os.path.realpath(path)
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def build_command(spec, connection_fd, passwd_fd):
    """The bwrap command line for ``spec`` (see ``autograde.isolation.kernel.sandbox_spec``)."""
    uid = int(spec["uid"])
    limits = spec["limits"]
    args = [bwrap_path(), "--die-with-parent", "--unshare-net", "--unshare-pid", "--unshare-ipc",
            "--unshare-uts", "--unshare-cgroup-try", "--hostname", "grading", "--clearenv"]
    args += _root_layout()
    tmp_bytes = str(int(spec["tmp_mb"]) * 2 ** 20)
    folders = spec.get("folders") or {}     # tmpfs of their own (size and inodes), see launch
    args += ["--proc", "/proc", "--dev", "/dev"]
    for inside in ("/tmp", "/dev/shm"):
        if inside in folders:
            args += ["--bind", folders[inside], inside]
        else:
            args += ["--size", tmp_bytes, "--perms", "1777", "--tmpfs", inside]
    if spec.get("gpu"):
        for dev in sorted(glob.glob("/dev/nvidia*")) + sorted(glob.glob("/dev/dri/*")):
            args += ["--dev-bind", dev, dev]
        if os.path.isdir("/sys"):
            args += ["--ro-bind", "/sys", "/sys"]
    bound = ["/usr"]
    made = {"/", "/tmp", "/dev", "/dev/shm", "/proc", "/run", KERNEL_CWD}
    paths = [spec["sock_dir"]] + [p for p in spec["ro_paths"] if os.path.exists(p)]
    for path in paths:                 # parents bwrap would otherwise create as 0700
        parent = os.path.dirname(os.path.realpath(path))
        chain = []
        while parent not in made and parent != "/":
            chain.append(parent)
            parent = os.path.dirname(parent)
        for folder in reversed(chain):
            if not _inside(folder, ["/usr"]):
                args += ["--perms", "0755", "--dir", folder]
            made.add(folder)
    for path in spec["ro_paths"]:
        if os.path.exists(path) and not _inside(path, bound):
            args += ["--ro-bind", path, path]
            bound.append(os.path.realpath(path))
    for host, inside in spec.get("binds", []):          # the view, at a path of its own
        args += ["--ro-bind", host, inside]
    for path in spec.get("masks", []):                  # course packages inside a bound folder
        args += ["--tmpfs", path, "--remount-ro", path]
    if KERNEL_CWD in folders:
        args += ["--bind", folders[KERNEL_CWD], KERNEL_CWD]
    else:
        args += ["--size", tmp_bytes, "--perms", "1777", "--tmpfs", KERNEL_CWD]
    args += ["--dir", "/run/autograde",
             "--perms", "0444", "--file", str(connection_fd), CONNECTION_PATH,
             "--perms", "0444", "--file", str(passwd_fd), "/etc/passwd"]
    # the submission is its notebook, which arrives cell by cell: no file handed in beside it
    # is bound (a helper.py or an ipykernel_launcher.py of the student's is not there to
    # import), and the kernel's working folder starts empty
    sock_dir = spec["sock_dir"]
    args += ["--bind", sock_dir, sock_dir, "--chdir", KERNEL_CWD]
    for key, value in sorted(spec["env"].items()):
        args += ["--setenv", key, str(value)]
    args += ["--", shutil.which("setpriv") or "/usr/bin/setpriv",
             f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs",
             "--inh-caps=-all", "--bounding-set=-all",
             "--", shutil.which("prlimit") or "/usr/bin/prlimit"]
    args += _prlimit_args(limits, nproc=True)
    args += ["--", spec["python"], *PYTHON_FLAGS, "-m", "ipykernel_launcher", "-f",
             CONNECTION_PATH]
    args += list(spec.get("kernel_args", []))
    return args


def _prlimit_args(limits, nproc):
    out = []
    if limits.get("memory_mb"):
        out.append(f"--as={int(limits['memory_mb']) * 2 ** 20}")
    if nproc and limits.get("processes"):
        out.append(f"--nproc={int(limits['processes'])}")
    if limits.get("cpu_seconds"):
        out.append(f"--cpu={int(limits['cpu_seconds'])}")
    if limits.get("file_mb"):
        out.append(f"--fsize={int(limits['file_mb']) * 2 ** 20}")
    out.append(f"--nofile={int(limits.get('open_files', 1024))}")
    out.append("--core=0")
    return out


def _set_rlimits(limits):
    """The ``none`` mode's limits, applied to the launcher itself before it execs the kernel."""
    import resource
    pairs = [(resource.RLIMIT_CPU, limits.get("cpu_seconds")),
             (resource.RLIMIT_FSIZE, (limits.get("file_mb") or 0) * 2 ** 20),
             (resource.RLIMIT_AS, (limits.get("memory_mb") or 0) * 2 ** 20),
             (resource.RLIMIT_CORE, 0)]
    for which, value in pairs:
        if value is None or (value == 0 and which != resource.RLIMIT_CORE):
            continue
        try:
            resource.setrlimit(which, (int(value), int(value)))
        except (ValueError, OSError):
            pass


def _die_with_parent():
    """If the grader dies without stopping this kernel, the kernel goes too (Linux)."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)           # PR_SET_PDEATHSIG
        if os.getppid() == 1:
            os._exit(1)
    except (OSError, AttributeError):
        pass


def _drain(stream, keep, sink, tail=None):
    """Read ``stream`` to its end, keeping the first ``keep`` bytes in ``sink`` and the last
    ``keep`` bytes in ``tail`` (a one-element list)."""
    kept = 0
    last = b""
    while True:
        chunk = stream.read(65536)
        if not chunk:
            break
        if kept < keep:
            sink.append(chunk[:keep - kept])
            kept += len(chunk[:keep - kept])
        if tail is not None:
            last = (last + chunk)[-keep:]
    if tail is not None:
        tail.append(last)


def _watch_cpu(uid, stop, seen, every=0.5):
    """Keep in ``seen[0]`` the most CPU seconds any process of ``uid`` has used (the uid is
    this kernel's alone, so that is the kernel's; RLIMIT_CPU counts per process)."""
    tick = os.sysconf("SC_CLK_TCK")
    while not stop.wait(every):
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                if os.stat(f"/proc/{name}").st_uid != uid:
                    continue
                with open(f"/proc/{name}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
                seen[0] = max(seen[0], (int(fields[11]) + int(fields[12])) / tick)
            except (OSError, ValueError, IndexError):
                continue


def _write_exit_report(spec_path, code, head, tail, cpu_seconds=None):
    """exit.json beside the spec (the grader's private folder): how the kernel ended, read by
    autograde.pipeline.execute to name a limit the kernel ran into."""
    report = {"status": code, "cpu_seconds": cpu_seconds, "head": head.decode(errors="replace"),
              "tail": tail.decode(errors="replace")}
    try:
        path = os.path.join(os.path.dirname(os.path.abspath(spec_path)), "exit.json")
        with open(path + ".tmp", "w") as fh:
            json.dump(report, fh)
        os.replace(path + ".tmp", path)
    except OSError:
        pass


def _with_own_folders(spec, spec_path, build):
    """A builder of the command that gives the kernel's writable folders (/tmp, /dev/shm,
    the working folder) a tmpfs each with a size *and* an inode limit (bwrap's own --tmpfs
    takes only a size, so a flood of empty files could pin gigabytes of kernel memory).  The
    tmpfs are mounted by ``unshare`` in a mount namespace of this launch only, so they vanish
    with the kernel, whatever ends it; without ``unshare`` the kernel gets bwrap's."""
    unshare, mount = shutil.which("unshare"), shutil.which("mount")
    if not (unshare and mount and spec.get("tmp_inodes")):
        return lambda conn, pw: build(spec, conn, pw)
    base = os.path.dirname(os.path.abspath(spec_path))
    folders = {}
    for inside, name in (("/tmp", "fs-tmp"), ("/dev/shm", "fs-shm"), (KERNEL_CWD, "fs-work")):
        path = os.path.join(base, name)
        os.makedirs(path, exist_ok=True)
        folders[inside] = path
    options = (f"size={int(spec['tmp_mb']) * 2 ** 20},nr_inodes={int(spec['tmp_inodes'])},"
               "mode=1777")
    script = " && ".join(f'{mount} -t tmpfs -o {options} autograde "{p}"'
                         for p in folders.values()) + ' && exec "$@"'

    def command(conn, pw):
        inner = build(dict(spec, folders=folders), conn, pw)
        return [unshare, "--mount", "--propagation", "private", "--", "/bin/sh", "-c", script,
                "autograde-sandbox"] + inner
    return command


def launch(spec_path, connection_file, extra_args):
    with open(spec_path) as fh:
        spec = json.load(fh)
    args = list(spec.get("kernel_args", []))
    for arg in extra_args:                     # traitlets refuses an option given twice
        if arg.split("=", 1)[0] not in {a.split("=", 1)[0] for a in args}:
            args.append(arg)
    spec["kernel_args"] = args
    signal.signal(signal.SIGINT, signal.SIG_IGN)       # an interrupt is for the kernel only
    _die_with_parent()
    if not spec.get("cwd"):
        spec["cwd"] = os.getcwd()          # jupyter_client starts us in the submission folder
    if spec["mode"] == "none":
        return _launch_unsandboxed(spec, connection_file)
    with open(connection_file, "rb") as fh:
        connection = fh.read()
    uid = int(spec["uid"])
    passwd = (f"root:x:0:0:root:/root:/bin/false\n"
              f"student:x:{uid}:{uid}:student:/tmp/home:/bin/false\n").encode()
    conn_r, conn_w = os.pipe()
    pw_r, pw_w = os.pipe()
    os.write(conn_w, connection)
    os.close(conn_w)
    os.write(pw_w, passwd)
    os.close(pw_w)
    command = _with_own_folders(spec, spec_path, build_command)(conn_r, pw_r)
    from .uids import new_session_keyring
    new_session_keyring()          # the kernel's session keyring is new, and dies with it
    proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, pass_fds=(conn_r, pw_r))
    os.close(conn_r)
    os.close(pw_r)

    def forward_term(signum, _frame):
        try:
            proc.send_signal(signal.SIGKILL)
        finally:
            os._exit(128 + signum)
    signal.signal(signal.SIGTERM, forward_term)
    kept, tail = [], []
    reader = threading.Thread(target=_drain, args=(proc.stdout, _KEEP_OUTPUT, kept, tail),
                              daemon=True)
    reader.start()
    stop, cpu = threading.Event(), [0.0]
    watcher = threading.Thread(target=_watch_cpu, args=(uid, stop, cpu), daemon=True)
    watcher.start()
    code = proc.wait()
    stop.set()
    reader.join(timeout=2)
    _write_exit_report(spec_path, code, b"".join(kept), tail[0] if tail else b"",
                       round(cpu[0], 2))
    if code != 0:
        sys.stderr.write(exit_message(code, b"".join(kept)))
    return code


def exit_message(code, output):
    """The launcher's line on the grader's stderr (the instructor's terminal under nbgrader
    autograde) for a kernel that exited with ``code``: the kernel's first output, which the
    submission controls, escaped (no terminal control character reaches the terminal)."""
    from ..logs import escaped                    # the standard library only: see there
    text = escaped(output.decode(errors="replace").strip(), limit=_KEEP_OUTPUT)
    return (f"[autograde sandbox] kernel exited with status {code}"
            + (f"; its first output:\n{text}\n" if text else "\n"))


def _launch_unsandboxed(spec, connection_file):
    env = dict(spec["env"])
    cwd = spec["cwd"] if spec["cwd"] and os.path.isdir(spec["cwd"]) else None
    _set_rlimits(spec["limits"])
    argv = [spec["python"], *PYTHON_FLAGS, "-m", "ipykernel_launcher", "-f", connection_file]
    argv += spec["kernel_args"]
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)                 # the kernel's own prints are not the grader's log
    if cwd:
        os.chdir(cwd)
    os.execve(spec["python"], argv, env)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) >= 3 and argv[0] == "launch":
        sys.exit(launch(argv[1], argv[2], argv[3:]))
    if argv[:1] == ["check"]:
        ok, why = sandbox_available()
        print("bubblewrap sandbox: " + ("available" if ok else f"NOT available ({why})"))
        sys.exit(0 if ok else 1)
    sys.stderr.write("usage: python -m autograde.isolation.sandbox launch SPEC CONNECTION_FILE [ARGS]\n"
                     "       python -m autograde.isolation.sandbox check\n")
    sys.exit(2)


if __name__ == "__main__":
    main()
