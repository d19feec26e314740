"""Which GPU a grading kernel gets, in the GPU environment.

Every kernel sees one of the host's GPUs (``CUDA_VISIBLE_DEVICES`` set to one device), so
that a class graded with several workers, or by several grading commands at once, spreads
over the GPUs instead of piling onto the first.  The GPU follows the kernel's slot in the
host's uid pool (:mod:`autograde.isolation.uids`): slot ``s`` gets device ``s mod n``.  Slots are handed
out lowest-free-first to every running kernel on the host, so kernels running together
take GPUs in turn, whatever command started them.  ``AutogradeSettings.gpu_per_kernel =
False`` gives every kernel all of them, as before; on a CPU host nothing of this applies.
"""
from __future__ import annotations

import os
import shutil
import subprocess

__all__ = ["host_gpus", "for_kernel"]


def host_gpus(configured="", environ=None):
    """The device ids grading kernels may use: ``configured`` (``gpu_devices``) if set, else
    the grader's own ``CUDA_VISIBLE_DEVICES``, else every GPU ``nvidia-smi -L`` lists."""
    environ = os.environ if environ is None else environ
    for text in (configured, environ.get("CUDA_VISIBLE_DEVICES", "")):
        devices = [d.strip() for d in (text or "").split(",") if d.strip()]
        if devices:
            return devices
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                                 timeout=20).stdout
        except (OSError, subprocess.TimeoutExpired):
            out = ""
        count = sum(1 for line in out.splitlines() if line.startswith("GPU "))
        if count:
            return [str(i) for i in range(count)]
    return []


def for_kernel(slot, devices, per_kernel=True):
    """``CUDA_VISIBLE_DEVICES`` for the kernel in pool slot ``slot``."""
    if not devices:
        return ""
    if not per_kernel:
        return ",".join(devices)
    return devices[int(slot) % len(devices)]
