"""Shared by the scripts in scripts/gpu/: where a measurement was made, and where it goes.

Every results file written by these scripts starts with a ``provenance`` block, written by
``source_kernels.provenance`` (GPU, driver, CUDA, torch, triton, Python, date, command,
repository commit), so that a number in the book can always be traced to the machine and the
code that produced it.

The scripts run as ``python3 scripts/gpu/<name>.py`` from the repository root, on a host
where the course is not installed: Python puts scripts/gpu/ on ``sys.path`` (so ``import
_provenance`` works) and importing this module puts the repository there too (so ``import
source_kernels`` works): the one place scripts/gpu/ touches ``sys.path``.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


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


def provenance(script: str, dry: bool = False) -> dict:
    """The provenance block of a results file made by ``scripts/gpu/<script>`` with this
    process's arguments; ``dry``: a code-path check on the CPU (its file is never a result)."""
    # imported here, not above: importing source_kernels defines its kernels, which must
    # come after a dry run has chosen Triton's interpreter
    from source_kernels.provenance import provenance as block

    return block(portable_command(script), dry=dry)


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
    otherwise insists on a GPU.  Returns
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


def results_saver(outdir: str, stem: str, payload: dict):
    """(path, save): ``save()`` writes ``<outdir>/<stem>.json`` from ``payload`` as it stands.
    Called after every measurement, so a run stopped by a time limit keeps its rows."""
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{stem}.json"

    def save():
        path.write_text(json.dumps(payload, indent=1) + "\n")

    return path, save
