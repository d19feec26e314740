"""Shared by the scripts in scripts/gpu/: where a measurement was made, and where it goes.

Every results file written by these scripts starts with a ``provenance`` block (GPU, driver,
CUDA, torch, triton, Python, date, command, repository commit) so that a number in the book
can always be traced to the machine and the code that produced it.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def repo_on_path() -> None:
    """Make ``import source_kernels`` work when a script runs as scripts/gpu/<name>.py."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))


def _run(cmd) -> str | None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else None


def portable(text: str) -> str:
    """A path or argument as a results file keeps it: relative to the repository inside it,
    ``OUTDIR`` for an absolute path outside it (a folder of the machine that ran it)."""
    if not text.startswith("/"):
        return text
    repo = str(REPO) + "/"
    return text[len(repo):] if text.startswith(repo) else "OUTDIR"


def portable_command(script: str, argv=None) -> str:
    """The command line that ran ``script``, with no path of the machine it ran on."""
    args = sys.argv[1:] if argv is None else argv
    return " ".join(["python3", f"scripts/gpu/{script}", *map(portable, args)])


def provenance(script: str) -> dict:
    """The machine, the software and the command, as a JSON-ready dict."""
    import torch
    import triton

    device = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(device)
    driver = _run(["nvidia-smi", f"--id={device}", "--query-gpu=driver_version",
                   "--format=csv,noheader"])
    commit = _run(["git", "-C", str(REPO), "rev-parse", "HEAD"])
    dirty = _run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"])
    extra = {}
    if os.environ.get("COURSE_COMMIT"):
        # the caller names the commit whose tree was copied to this host: the copy's own git
        # folder (if any) may be older than its working tree
        extra["commit_from"] = "COURSE_COMMIT, the commit the caller copied to this host"
        if commit and not commit.startswith(os.environ["COURSE_COMMIT"]):
            extra["host_git_head"] = commit
        commit = os.environ["COURSE_COMMIT"]
    return {
        "gpu": torch.cuda.get_device_name(device),
        "compute_capability": f"{props.major}.{props.minor}",
        "gpu_memory_bytes": int(props.total_memory),
        "sm_count": int(props.multi_processor_count),
        "driver": driver,
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": portable_command(script),
        "repository_commit": commit,
        "uncommitted_changes_to_tracked_files": bool(dirty),
        **extra,
    }


def gpu_slug(name: str) -> str:
    """'NVIDIA H200' -> 'h200'; the results files of the course are named after the GPU."""
    if "H200" in name.upper():
        return "h200"
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower().replace("nvidia", "")).strip("-")
    return slug or "gpu"


def require_gpu(script: str) -> None:
    """Exit with a clear message (status 2) on a machine without a CUDA GPU."""
    import torch

    if not torch.cuda.is_available():
        sys.stderr.write(f"{script} measures a CUDA GPU and this machine has none: run it on a "
                         "GPU host (everything else in the course runs on a CPU).\n")
        raise SystemExit(2)


def write_results(outdir: str, stem: str, payload: dict) -> Path:
    """Write ``<outdir>/<stem>_<gpu>.json`` and return its path."""
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{stem}_{gpu_slug(payload['provenance']['gpu'])}.json"
    path.write_text(json.dumps(payload, indent=1) + "\n")
    return path


def lab_script_args(doc: str, script: str, argv=None):
    """The command line shared by the labs' GPU scripts: OUTDIR, ``--budget-s`` (no new
    measurement starts after it) and the hidden ``--dry-run-cpu`` (every code path on tiny
    inputs in Triton's interpreter, never a result).  Picks the interpreter for a dry run and
    otherwise insists on a GPU, then puts the repository on sys.path.  Returns
    (args, dry, start time)."""
    import argparse
    import os
    import time

    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("outdir")
    parser.add_argument("--budget-s", type=float, default=20.0)
    parser.add_argument("--dry-run-cpu", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.dry_run_cpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    else:
        require_gpu(script)
    repo_on_path()
    return args, args.dry_run_cpu, time.perf_counter()


def make_bench(dry: bool):
    """bench(fn) -> microseconds: a ``triton.testing.do_bench`` median (L2 flushed between
    runs) on a GPU; in a dry run, one call timed by the host clock (checks the code path)."""
    import time

    def bench(fn):
        if dry:
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e6
        from triton.testing import do_bench
        return do_bench(fn, warmup=10, rep=40, return_mode="median") * 1e3

    return bench


def run_provenance(script: str, dry: bool) -> dict:
    """``provenance(script)`` on a GPU; in a dry run, only what the CPU can say (the file
    it produces is marked as a dry run and is never a result)."""
    if not dry:
        return provenance(script)
    import torch
    import triton

    return {"gpu": "none (dry run in Triton's interpreter)", "torch": torch.__version__,
            "triton": triton.__version__,
            "command": portable_command(script)}


def results_saver(outdir: str, stem: str, payload: dict):
    """(path, save): ``save()`` writes ``<outdir>/<stem>.json`` from ``payload`` as it stands.
    Called after every measurement, so a run stopped by a time limit keeps its rows."""
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{stem}.json"

    def save():
        path.write_text(json.dumps(payload, indent=1) + "\n")

    return path, save
