"""The provenance block of every results file: where a measurement was made, by what.

Every results file the course's GPU scripts and ``python -m source_kernels.bench`` write
starts with the key ``provenance``, this block, so that a number in the book can always be
traced to the machine and the code that produced it (results/schemas/ says which keys each
kind of file must have).  The same keys everywhere:

    gpu, compute_capability, gpu_memory_bytes, sm_count, driver, cuda, torch, triton,
    python, date, command, repository_commit, uncommitted_changes_to_tracked_files

plus ``commit_from`` and ``host_git_head`` where the caller named the commit
(``COURSE_COMMIT``, for a host whose copy of the repository has no git folder or an older
one).  The tools that measure on the CPU (grading throughput, mutation runs, the hub under a
class) write the same block and add ``host``, the CPU side of the machine (:func:`host`),
and what is their own (a seed, the load averages).  In a dry run (a code path checked on the CPU, never a result) ``gpu`` says so; on a
machine without a GPU (a grading run on the CPU) it says that; the GPU's own fields are then
None.
"""
from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
KEYS = ("gpu", "compute_capability", "gpu_memory_bytes", "sm_count", "driver", "cuda",
        "torch", "triton", "python", "date", "command", "repository_commit",
        "uncommitted_changes_to_tracked_files")
DRY_GPU = "none (dry run on the CPU: a code-path check, not a result)"
NO_GPU = "none (this machine has no CUDA GPU)"


def _output(command) -> str | None:
    """stdout of ``command``, stripped; None where it fails or says nothing."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else None


def date() -> str:
    """Now, as the results files write it: '2026-07-14 09:30 UTC'."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def host() -> dict:
    """The CPU side of this machine: the processor's model, the cores this process may use
    and the memory (MiB); None where the system does not say."""
    cpu, memory = platform.processor() or None, None
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next(line.split(":", 1)[1].strip() for line in info
                       if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        with open("/proc/meminfo") as info:
            memory = int(next(line.split()[1] for line in info
                              if line.startswith("MemTotal"))) // 1024
    except (OSError, StopIteration, ValueError):
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        os.cpu_count()
    return {"cpu": cpu, "cores": cores, "memory_mib": memory}


def provenance(command: str, dry: bool = False) -> dict:
    """The provenance block of a results file made by ``command`` (a command line with no
    path of the machine it ran on).  ``dry``: a run on the CPU that checks code paths; the
    block says so in ``gpu``."""
    import torch
    import triton

    block = dict.fromkeys(KEYS)
    if dry:
        block["gpu"] = DRY_GPU
    elif not torch.cuda.is_available():
        block["gpu"] = NO_GPU
    else:
        device = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(device)
        block.update(
            gpu=torch.cuda.get_device_name(device),
            compute_capability=f"{props.major}.{props.minor}",
            gpu_memory_bytes=int(props.total_memory),
            sm_count=int(props.multi_processor_count),
            driver=_output(["nvidia-smi", f"--id={device}", "--query-gpu=driver_version",
                            "--format=csv,noheader"]))
    commit = _output(["git", "-C", str(REPO), "rev-parse", "HEAD"])
    dirty = _output(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"])
    block.update(cuda=torch.version.cuda, torch=torch.__version__, triton=triton.__version__,
                 python=platform.python_version(), date=date(), command=command,
                 repository_commit=commit, uncommitted_changes_to_tracked_files=bool(dirty))
    named = os.environ.get("COURSE_COMMIT")
    if named:
        # the caller names the commit whose tree was copied to this host: the copy's own git
        # folder (if any) may be older than its working tree
        block["commit_from"] = "COURSE_COMMIT, the commit the caller copied to this host"
        if commit and not commit.startswith(named):
            block["host_git_head"] = commit
        block["repository_commit"] = named
    return block
