"""Per-user limits of the course hub: one student's server cannot starve the class.

``LimitedSpawner`` is JupyterHub's ``LocalProcessSpawner`` (each server as the user's own
system account) with limits on the server and everything it starts (kernels, terminals,
their children), applied in the child between fork and exec, before it drops root:

- **cgroups**, where the host lets root create them (``/sys/fs/cgroup``: version 2, or
  version 1's memory, cpu and pids hierarchies): one group per user,
  ``msda-hub-<state>/<user>``, with ``Spawner.mem_limit`` (memory, swap included where the
  kernel accounts it), ``Spawner.cpu_limit`` (CPU time per wall second, a CFS quota) and
  ``LimitedSpawner.max_processes`` (tasks).  The group is removed when the server stops.
- **rlimits**, always: ``RLIMIT_NPROC`` = ``max_processes`` (per uid, so it counts all of
  the student's processes), ``RLIMIT_FSIZE`` = ``max_file_mb`` (no single file larger),
  ``RLIMIT_CORE`` = 0; and ``RLIMIT_AS`` = ``mem_limit`` where no memory cgroup could be
  made (a cruder cap: per process, on address space).

Disk space as a whole is not limited here: that needs file-system quotas (``quota`` on a
file system mounted with ``usrquota``, or a per-user volume); book/hub.md says so.  With
systemd on the host, ``jupyterhub-systemdspawner`` gives the same limits through systemd's
resource control instead.
"""
from __future__ import annotations

import hashlib
import os
import resource
from pathlib import Path

from jupyterhub.spawner import LocalProcessSpawner
from traitlets import Integer, Unicode

CGROUP = Path("/sys/fs/cgroup")
V1_CONTROLLERS = ("memory", "cpu", "pids")


def cgroup_version(root: Path = CGROUP) -> int | None:
    """2, 1, or None where root cannot create groups here."""
    if (root / "cgroup.controllers").exists():
        wanted = {"memory", "cpu", "pids"}
        have = set((root / "cgroup.controllers").read_text().split())
        return 2 if wanted <= have and os.access(root, os.W_OK) else None
    if all((root / c).is_dir() and os.access(root / c, os.W_OK) for c in V1_CONTROLLERS):
        return 1
    return None


def _write(path: Path, value):
    path.write_text(f"{value}\n")


def make_groups(slice_name: str, user: str, memory_bytes: int, cpus: float, tasks: int,
                root: Path = CGROUP) -> list[Path]:
    """Create (or reset) the user's groups; returns the folders whose ``cgroup.procs`` a
    process joins.  [] where the host has no writable cgroups."""
    version = cgroup_version(root)
    if version is None:
        return []
    period = 100_000
    quota = int(cpus * period) if cpus else None
    if version == 2:
        parent = root / slice_name
        parent.mkdir(exist_ok=True)
        _write(parent / "cgroup.subtree_control", "+memory +cpu +pids")
        group = parent / user
        group.mkdir(exist_ok=True)
        if memory_bytes:
            _write(group / "memory.max", memory_bytes)
            if (group / "memory.swap.max").exists():
                _write(group / "memory.swap.max", 0)
        _write(group / "cpu.max", f"{quota} {period}" if quota else f"max {period}")
        _write(group / "pids.max", tasks or "max")
        return [group]
    groups = []
    for controller in V1_CONTROLLERS:
        group = root / controller / slice_name / user
        group.mkdir(parents=True, exist_ok=True)
        groups.append(group)
    memory, cpu, pids = groups
    if memory_bytes:
        _write(memory / "memory.limit_in_bytes", memory_bytes)
        if (memory / "memory.memsw.limit_in_bytes").exists():
            _write(memory / "memory.memsw.limit_in_bytes", memory_bytes)
    _write(cpu / "cpu.cfs_period_us", period)
    _write(cpu / "cpu.cfs_quota_us", quota if quota else -1)
    _write(pids / "pids.max", tasks or "max")
    return groups


def remove_groups(groups: list[Path]):
    """Remove the user's groups (once their processes are gone; a busy group stays)."""
    for group in groups:
        try:
            group.rmdir()
        except OSError:
            pass


def rlimits(memory_bytes: int, tasks: int, file_bytes: int, with_memory: bool) -> list:
    limits = [(resource.RLIMIT_CORE, 0)]
    if tasks:
        limits.append((resource.RLIMIT_NPROC, tasks))
    if file_bytes:
        limits.append((resource.RLIMIT_FSIZE, file_bytes))
    if with_memory and memory_bytes:
        limits.append((resource.RLIMIT_AS, memory_bytes))
    return limits


def limiting(groups: list[Path], limits: list, then=None):
    """A ``preexec_fn``: join ``groups``, set ``limits``, then call ``then`` (which drops
    root).  Runs in the child between fork and exec."""
    def preexec():
        pid = str(os.getpid())
        for group in groups:
            with open(group / "cgroup.procs", "w") as fh:
                fh.write(pid)
        for which, value in limits:
            resource.setrlimit(which, (value, value))
        if then is not None:
            then()
    return preexec


class LimitedSpawner(LocalProcessSpawner):
    """``LocalProcessSpawner`` with the limits of the module docstring."""

    max_processes = Integer(512, help="tasks (threads included) per user; 0: no limit"
                            ).tag(config=True)
    max_file_mb = Integer(2048, help="largest file a user's process may write, MiB; 0: none"
                          ).tag(config=True)
    slice_name = Unicode("msda-hub", help="the parent cgroup of the users' groups"
                         ).tag(config=True)

    def _groups(self) -> list[Path]:
        return make_groups(self.slice_name, self.user.name, int(self.mem_limit or 0),
                           float(self.cpu_limit or 0), self.max_processes)

    def make_preexec_fn(self, name):
        drop = super().make_preexec_fn(name)
        try:
            self._cgroups = self._groups()
        except OSError as exc:
            self.log.warning("no cgroups for %s (%s): rlimits only", name, exc)
            self._cgroups = []
        memory_group = any("memory" in str(g) or CGROUP.joinpath("cgroup.controllers")
                           .exists() for g in self._cgroups)
        limits = rlimits(int(self.mem_limit or 0), self.max_processes,
                         self.max_file_mb * 2**20, with_memory=not memory_group)
        self.log.info("limits for %s: cgroups %s, rlimits %s", name,
                      [str(g) for g in self._cgroups] or "none", limits)
        return limiting(self._cgroups, limits, drop)

    async def stop(self, now=False):
        await super().stop(now=now)
        remove_groups(getattr(self, "_cgroups", []))


def slice_for(state: Path) -> str:
    """The parent group's name for one hub (its state folder), apart from other hubs."""
    return "msda-hub-" + hashlib.sha256(str(state).encode()).hexdigest()[:10]
