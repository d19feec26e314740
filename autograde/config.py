"""Grading settings (``c.AutogradeSettings.*`` in ``nbgrader_config.py``) and the grading
environment they select."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

from traitlets import Bool, Dict, Enum, Float, Int, List, Unicode
from traitlets.config import Configurable

from . import labs

__all__ = ["AutogradeSettings", "resolve_environment", "describe"]


class AutogradeSettings(Configurable):
    """Everything the course's autograde pipeline reads from the configuration."""

    environment = Enum(["auto", "cpu", "gpu"], "auto", help=(
        "Where hidden tests run: 'cpu' (Triton's interpreter; the kernel sees no GPU even on a "
        "GPU host), 'gpu' (the GPU; fails if none is visible) or 'auto' (the GPU when the "
        "grader sees one, else the CPU).  The choice is printed in the log.")).tag(config=True)
    sandbox = Enum(["auto", "bwrap", "none"], "auto", help=(
        "'bwrap': bubblewrap sandbox and an unprivileged uid (needs root and bubblewrap); "
        "'none': a plain kernel with resource limits only; 'auto': bwrap when it works here, "
        "else none.")).tag(config=True)
    require_sandbox = Bool(None, allow_none=True, help=(
        "Refuse to grade (instead of falling back to 'none') when the sandbox is unavailable. "
        "Unset: True on Linux, where bubblewrap can be installed (apt-get install bubblewrap, "
        "grading as root), False elsewhere.  sandbox = 'none' still grades without a sandbox "
        "when asked for by name.")).tag(config=True)
    kernel_uid = Int(64123, help=(
        "First unprivileged uid of the grading kernels.  Every running kernel on the host has "
        "a uid of its own from kernel_uid .. kernel_uid + kernel_uid_count - 1, taken from a "
        "pool of lock files shared by every grading command on the host (autograde/isolation/uids.py), "
        "so that the process limit and the keyrings are one kernel's only.")).tag(config=True)
    kernel_uid_count = Int(256, help="Size of the host's pool of kernel uids (kernels that "
                                     "may run at once).").tag(config=True)
    memory_mb = Int(4096, help="Address-space limit of a grading kernel (MiB); 0: none. "
                               "Not applied in the GPU environment (CUDA reserves far more "
                               "virtual memory than it uses).").tag(config=True)
    processes = Int(64, help="Processes and threads the kernel's uid may have.").tag(config=True)
    cpu_seconds = Int(1800, help="CPU seconds a grading kernel may use in all.").tag(config=True)
    file_mb = Int(64, help="Largest file a grading kernel may write (MiB).").tag(config=True)
    open_files = Int(256, help="Open files per kernel process.").tag(config=True)
    tmp_mb = Int(512, help="Size of the kernel's private /tmp, /dev/shm and working folder "
                           "(MiB each).").tag(config=True)
    tmp_inodes = Int(65536, help=(
        "Files and folders each of the kernel's writable folders (/tmp, /dev/shm, its working "
        "folder) may hold; each is a tmpfs of tmp_mb MiB and this many inodes of its own, so "
        "that a flood of empty files stops there (named: folder limit).")).tag(config=True)
    threads = Int(0, help="Threads for torch/OpenMP in a kernel; 0: cores / parallel "
                          "workers.").tag(config=True)
    timeout = Int(0, help="Seconds per cell; 0: the lab's default (autograde/labs.py)."
                  ).tag(config=True)
    lab_timeouts = Dict(help="Seconds per cell by assignment id; overrides the default."
                        ).tag(config=True)
    setup_timeout = Int(300, help=(
        "Seconds for the locked cells before the first answer cell (the lab's setup: imports "
        "of torch and Triton can take a while on a loaded grading host).")).tag(config=True)
    interrupt_grace = Float(5.0, help="Seconds a timed-out cell gets to stop after SIGINT "
                                      "before the kernel is restarted.").tag(config=True)
    max_restarts = Int(3, help="Kernel restarts per notebook after a crash or a hang."
                       ).tag(config=True)
    output_limit_kb = Int(512, help="Output kept per cell (KiB); the rest is dropped and "
                                    "the cell says so.").tag(config=True)
    grader_memory_mb = Int(8192, help=(
        "Data-segment limit (MiB) of the grader's own process (nbgrader, the replay of the "
        "checks): each worker of `python -m autograde grade`, and the process of a plain "
        "`nbgrader autograde`, where the course's Execute preprocessor sets it once; 0: none.  "
        "A submission whose grading goes past it is reported ungradable with this limit "
        "named, and the other submissions go on.")).tag(config=True)
    notebook_output_limit_kb = Int(16384, help=(
        "Output kept per notebook (KiB, all its cells together, records excluded); past it, "
        "every further output is dropped and the incident says so.")).tag(config=True)
    notebook_record_limit_mb = Int(256, help=(
        "Check records kept per notebook (MiB, all cells together); a record past it is "
        "dropped, and its cell goes to review.")).tag(config=True)
    submission_limit_mb = Int(32, help=(
        "Largest submitted notebook (MiB): a larger one is ungradable, named as such, and "
        "never run.")).tag(config=True)
    extra_python_paths = List(Unicode(), help=(
        "More folders the kernel and the grader import from (check packages outside "
        "autograde/).")).tag(config=True)
    check_packages = List(Unicode(), ["autograde.checks"], help=(
        "Modules whose functions, called in a hidden test cell, are replayed out of the "
        "kernel's reach.")).tag(config=True)
    visible_points = Enum(["tied", "kernel"], "tied", help=(
        "Graded test cells without a hidden check (visible checks) are scored inside the "
        "kernel, where a replaced comparison or an answer hard-coded for the visible inputs "
        "passes them.  'tied': their points count only if every hidden check of the same "
        "function passed the grader's replay; 'kernel': nbgrader's rule, the kernel decides."
    )).tag(config=True)
    gpu_cell_tags = List(Unicode(), ["gpu"], help=(
        "Cell tags (in the source notebook) of graded cells that need a GPU.")).tag(config=True)
    forbidden_extra = Dict(help="Assignment id -> more dotted names a graded function must "
                                "not use (static scan).").tag(config=True)
    similarity_threshold = Float(0.7, help=(
        "Share of an answer's own normalised k-grams (what the student wrote beyond the "
        "released template) found in a chip, the reference, an operator module, the lab's "
        "solution or another student's answer, from which the submission is listed with "
        "status needs_review (autograde/runner/similarity.py); 0 turns the check off.  The score is "
        "never changed.")).tag(config=True)
    similarity_kgram = Int(8, help="Tokens per k-gram of the similarity check."
                           ).tag(config=True)
    similarity_packages = List(Unicode(), ["source_kernels"], help=(
        "Packages whose modules (the chips, the reference, the operator) answers are "
        "compared with.")).tag(config=True)
    status_directory = Unicode("autograde_status", help=(
        "Where the per-submission grading status lives, relative to the course root."
    )).tag(config=True)
    gpu_devices = Unicode("", help="The GPUs grading kernels may use, as CUDA_VISIBLE_DEVICES "
                                   "('' : the grader's, else every GPU of the host)."
                          ).tag(config=True)
    gpu_per_kernel = Bool(True, help=(
        "In the GPU environment, give every kernel one of those GPUs, in turn by its slot in "
        "the host's uid pool (autograde/isolation/gpus.py), so that a class spreads over the GPUs; "
        "False: every kernel sees all of them.")).tag(config=True)
    extra_ro_paths = List(Unicode(), help="More host folders the kernel may read (for "
                                          "example a CUDA toolkit under /opt).").tag(config=True)

    @property
    def sandbox_required(self) -> bool:
        if self.require_sandbox is None:
            return sys.platform.startswith("linux")
        return bool(self.require_sandbox)

    def timeout_for(self, assignment_id: str) -> int:
        if assignment_id in self.lab_timeouts:
            return int(self.lab_timeouts[assignment_id])
        if self.timeout:
            return int(self.timeout)
        return labs.default_timeout(assignment_id)


_GPU_CACHE = {}


def gpu_visible() -> bool:
    """Whether this process sees a CUDA GPU (asks torch once)."""
    if "v" not in _GPU_CACHE:
        try:
            import torch
            _GPU_CACHE["v"] = bool(torch.cuda.is_available())
        except Exception:                            # noqa: BLE001
            _GPU_CACHE["v"] = False
    return _GPU_CACHE["v"]


def resolve_environment(settings: AutogradeSettings) -> str:
    """'cpu' or 'gpu' for this grading host."""
    if settings.environment == "cpu":
        return "cpu"
    if settings.environment == "gpu":
        if not gpu_visible():
            raise RuntimeError("AutogradeSettings.environment = 'gpu' but no CUDA GPU is visible "
                               "to the grader")
        return "gpu"
    return "gpu" if gpu_visible() else "cpu"


def gpu_name() -> str:
    try:
        import torch
        return torch.cuda.get_device_name(0)
    except Exception:                                # noqa: BLE001
        pass
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
            return out.stdout.strip().splitlines()[0]
        except (OSError, subprocess.TimeoutExpired, IndexError):
            pass
    return "a CUDA GPU"


def describe(environment: str, sandbox: str, settings: AutogradeSettings, timeout: int,
             uid: int) -> str:
    """The one line the log shows for every graded notebook."""
    if environment == "gpu":
        env = f"GPU ({gpu_name()}; Triton compiles for the device)"
    else:
        env = "CPU (Triton interpreter, TRITON_INTERPRET=1; the kernel sees no GPU)"
    if sandbox == "bwrap":
        box = (f"bubblewrap sandbox as uid {uid} (no other running kernel has it), no network, "
               f"limits: "
               + (f"{settings.memory_mb} MiB address space, " if settings.memory_mb and
                  environment == "cpu" else "")
               + f"{settings.processes} processes, {settings.cpu_seconds} CPU s, "
                 f"{settings.file_mb} MiB per file")
    else:
        box = "NO SANDBOX (plain kernel with resource limits only: student code can read and " \
              "write what the grader can)"
    return f"grading environment: {env} | {box} | {timeout} s per cell"


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:                           # pragma: no cover
        return os.cpu_count() or 1
