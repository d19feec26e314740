"""The grading kernel: a jupyter_client kernel manager whose kernel starts in the sandbox."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import tempfile
import threading

from jupyter_client.kernelspec import KernelSpec
from jupyter_client.manager import AsyncKernelManager

from . import gpus, uids, view
from ..config import cores

__all__ = ["SandboxKernelManager", "KernelSetup", "VIEW_PATH", "socket_dir_problems"]

# where the kernel finds its view of the course packages (autograde.isolation.view), first on its path
VIEW_PATH = "/course"


def _package_dirs(names):
    dirs = []
    for name in names:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.submodule_search_locations:
            dirs.extend(os.path.realpath(p) for p in spec.submodule_search_locations)
    return dirs


def _libcuda_dir():
    """The folder of libcuda.so.1, found here the way Triton finds it (TRITON_LIBCUDA_PATH,
    else ``ldconfig -p``), for kernels in the sandbox; None where there is none."""
    if os.environ.get("TRITON_LIBCUDA_PATH"):
        return os.environ["TRITON_LIBCUDA_PATH"]
    try:
        from ..compat.triton_compat import libcuda_dirs
        dirs = libcuda_dirs()
    except Exception:                      # noqa: BLE001  (no CUDA driver on this host)
        return None
    return os.path.realpath(dirs[0]) if dirs else None


def _remove_stale():
    """Folders of graders that were killed before they could clean up (their pid is gone)."""
    base = tempfile.gettempdir()
    try:
        names = os.listdir(base)
    except OSError:
        return
    for name in names:
        parts = name.split("-")
        if not (name.startswith(("autograde-", "ag-ipc-")) and len(parts) >= 3 and
                parts[-2].isdigit()):
            continue
        pid = int(parts[-2])
        try:
            os.kill(pid, 0)
            continue                                   # still running
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        shutil.rmtree(os.path.join(base, name), ignore_errors=True)


class KernelSetup:
    """Everything one grading kernel needs on the host: a uid of its own from the host's pool
    (:mod:`autograde.isolation.uids`, held until :meth:`cleanup`), a private folder (spec and connection
    file, root only), a socket folder (the kernel's uid while it starts, then closed)."""

    def __init__(self, *, mode, environment, settings, seed, worker=0, workers=1,
                 assignment=None, course_root=None):
        self.mode = mode
        self.assignment = assignment or ""
        self.environment = environment
        self.settings = settings
        self.seed = seed
        self.lease = None
        if mode == "bwrap":
            fallback = os.path.join(course_root or os.getcwd(), settings.status_directory,
                                    ".uids")
            self.lease = uids.acquire(settings.kernel_uid, settings.kernel_uid_count,
                                      uids.pool_directory(fallback), prefer=worker)
            self.uid = self.lease.uid
            self.slot = self.uid - settings.kernel_uid
        else:
            self.uid = os.getuid()
            self.slot = worker
        _remove_stale()
        self.private = tempfile.mkdtemp(prefix=f"autograde-{os.getpid()}-")
        self.sock_dir = tempfile.mkdtemp(prefix=f"ag-ipc-{os.getpid()}-")
        if mode == "bwrap":
            os.chown(self.sock_dir, self.uid, self.uid)
            os.chmod(self.sock_dir, 0o700)
        threads = settings.threads or max(1, cores() // max(1, workers))
        self.threads = threads
        self.spec_path = os.path.join(self.private, "sandbox.json")
        # the course packages as this lab's kernel may see them (never the whole packages)
        self.view = view.stage(self.assignment, os.path.join(self.private, "view"))
        self.gpu = None
        self._write_spec(threads)

    def _write_spec(self, threads):
        s = self.settings
        env = {
            "PATH": f"{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin",
            "HOME": "/tmp/home", "USER": "student", "LOGNAME": "student",
            "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TMPDIR": "/tmp",
            "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0",
            "PYTHONSAFEPATH": "1",
            "MPLBACKEND": "Agg", "MPLCONFIGDIR": "/tmp/matplotlib",
            "TRITON_CACHE_DIR": "/tmp/triton", "IPYTHONDIR": "/tmp/ipython",
            "JUPYTER_RUNTIME_DIR": "/tmp/jupyter", "XDG_CACHE_HOME": "/tmp/cache",
            "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
            "OPENBLAS_NUM_THREADS": str(threads),
            "NBGRADER_EXECUTION": "autograde", "AUTOGRADE_SEED": self.seed,
            "AUTOGRADE_ENVIRONMENT": self.environment,
        }
        if self.environment == "cpu":
            env["TRITON_INTERPRET"] = "1"
            env["CUDA_VISIBLE_DEVICES"] = ""
        else:
            visible = gpus.for_kernel(self.slot, gpus.host_gpus(s.gpu_devices),
                                      s.gpu_per_kernel)
            if visible:
                env["CUDA_VISIBLE_DEVICES"] = visible
            for key in ("CUDA_HOME", "LD_LIBRARY_PATH", "TRITON_PTXAS_PATH"):
                if os.environ.get(key):
                    env[key] = os.environ[key]
            libcuda = _libcuda_dir()
            if libcuda:
                # Triton looks libcuda up with `ldconfig -p`, which cannot run in the sandbox
                env["TRITON_LIBCUDA_PATH"] = libcuda
        extra = [os.path.realpath(p) for p in s.extra_python_paths if os.path.isdir(p)]
        inside_view = VIEW_PATH if self.mode == "bwrap" else self.view
        env["PYTHONPATH"] = ":".join([inside_view] + extra)
        if self.mode == "none":
            env["HOME"] = self.private
            for key in ("MPLCONFIGDIR", "TRITON_CACHE_DIR", "IPYTHONDIR", "JUPYTER_RUNTIME_DIR",
                        "XDG_CACHE_HOME"):
                env[key] = os.path.join(self.private, key.lower())
            env.pop("TMPDIR")
        ro = [os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix)] + extra
        ro += [p for p in s.extra_ro_paths if os.path.exists(p)]
        # the packages themselves, where a bound folder holds them (an install into the
        # virtual environment), are hidden under an empty tmpfs: the kernel imports the view
        masks = [d for d in _package_dirs(view.PACKAGES)
                 if any(d == r or d.startswith(r.rstrip("/") + "/")
                        for r in map(os.path.realpath, ro))]
        if env.get("TRITON_LIBCUDA_PATH"):
            ro.append(env["TRITON_LIBCUDA_PATH"])
        if self.environment == "gpu":
            self.gpu = env.get("CUDA_VISIBLE_DEVICES")
        limits = {"memory_mb": s.memory_mb if self.environment == "cpu" else 0,
                  "processes": s.processes, "cpu_seconds": s.cpu_seconds,
                  "file_mb": s.file_mb, "open_files": s.open_files}
        spec = {"mode": self.mode, "uid": self.uid, "python": sys.executable, "ro_paths": ro,
                "binds": [[self.view, VIEW_PATH]], "masks": masks,
                "cwd": None, "sock_dir": self.sock_dir, "env": env, "limits": limits,
                "tmp_mb": s.tmp_mb, "tmp_inodes": s.tmp_inodes,
                "gpu": self.environment == "gpu",
                "kernel_args": [
                    "--IPKernelApp.exec_lines=import autograde.trust.recording as _autograde_rec; "
                    "_autograde_rec.install_in_kernel(); del _autograde_rec"]}
        with open(self.spec_path, "w") as fh:
            json.dump(spec, fh)

    def kernel_manager(self, **kwargs):
        km = SandboxKernelManager(transport="ipc", ip=os.path.join(self.sock_dir, "k"),
                                  connection_file=os.path.join(self.private, "connection.json"),
                                  **kwargs)
        km._kernel_spec = KernelSpec(
            argv=[sys.executable, "-m", "autograde.isolation.sandbox", "launch", self.spec_path,
                  "{connection_file}"],
            display_name="Python 3 (autograde sandbox)", language="python",
            interrupt_mode="signal", env={}, metadata={})
        return km

    def close_socket_dir(self):
        """Once the kernel has bound its sockets, take the folder back from its uid (root's,
        0700: the kernel can no longer enter it, list it or create anything in it), then make
        sure that nothing of the kernel's can still write there: no process of its uid holds
        a descriptor, a working folder or a mapping inside it, and it holds nothing but the
        kernel's sockets.  The folder is on the host's disk, outside the sandbox's size-limited
        folders, so a descriptor kept from before would write there without a bound but the
        per-file limit.  Only the course's startup code has run when the folder is closed (no
        cell has been sent), so this is a proof, not a race.  Returns what was found (empty
        when the folder is closed)."""
        if self.mode != "bwrap":
            return []
        os.chown(self.sock_dir, 0, 0)
        os.chmod(self.sock_dir, 0o700)
        return socket_dir_problems(self.sock_dir, self.uid)

    def exit_report(self):
        """What the launcher wrote when the kernel exited (status, signal, its first and last
        output), or None while it runs."""
        try:
            with open(os.path.join(self.private, "exit.json")) as fh:
                return json.load(fh)
        except (OSError, ValueError):
            return None

    def cleanup(self, wait=False):
        """Remove the folders; scrub the uid (processes, keyrings, files) and give it back.
        The scrub runs beside the grader's next steps (the uid stays held until it is done;
        if the grader exits first, whoever takes the uid next scrubs it before use)."""
        shutil.rmtree(self.private, ignore_errors=True)
        shutil.rmtree(self.sock_dir, ignore_errors=True)
        lease, self.lease = self.lease, None
        if lease is None:
            return

        def scrub_and_release():
            try:
                uids.scrub(lease.uid)
            finally:
                lease.release()
        if wait:
            scrub_and_release()
        else:
            threading.Thread(target=scrub_and_release, daemon=True).start()


def _inside_folder(path, folder):
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def socket_dir_problems(folder, uid, limit=20):
    """What could still write into the kernel's socket folder ``folder``: each process of
    ``uid`` with an open file, a working or root folder or a mapped file inside it, and each
    entry of the folder that is not a socket (with its size).  Empty when there is none."""
    import stat as stat_module
    folder = os.path.realpath(folder)
    found = []
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        pids = []
    for pid in pids:
        base = f"/proc/{pid}"
        try:
            if os.stat(base).st_uid != uid:
                continue
        except OSError:
            continue
        held = set()
        links = [os.path.join(base, "cwd"), os.path.join(base, "root")]
        try:
            links += [os.path.join(base, "fd", fd) for fd in os.listdir(os.path.join(base, "fd"))]
        except OSError:
            pass
        for link in links:
            try:
                target = os.readlink(link)
            except OSError:
                continue
            if _inside_folder(target, folder):
                held.add(target)
        try:
            with open(os.path.join(base, "maps")) as fh:
                for line in fh:
                    parts = line.split(None, 5)
                    if len(parts) == 6 and _inside_folder(parts[5].strip(), folder):
                        held.add(parts[5].strip())
        except OSError:
            pass
        for target in sorted(held):
            found.append(f"process {pid} of the kernel's uid holds {target}")
    try:
        entries = sorted(os.listdir(folder))
    except OSError:
        entries = []
    for name in entries:
        path = os.path.join(folder, name)
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if not stat_module.S_ISSOCK(info.st_mode):
            found.append(f"a file that is not a socket: {path} ({info.st_size} bytes)")
    return found[:limit]


class SandboxKernelManager(AsyncKernelManager):
    """A kernel manager that never looks up a kernelspec: its spec is set by KernelSetup."""

    @property
    def kernel_spec(self):
        return self._kernel_spec

    @property
    def ipykernel(self) -> bool:
        return True
