"""Write requirements.lock: every package requirements.txt installs, at one exact version, with
the sha256 of each of its files on PyPI (`make lock`; `make setup` installs from it with pip's
--require-hashes).

The resolution is uv's (``uv pip compile --universal --generate-hashes``), for Python 3.11 and
newer on every platform, from requirements.txt as it stands.  Three kinds of requirement are
resolved but left out of the file:

- the course itself (``-e .``): an editable install has no file to hash; `make setup` installs
  it afterwards with --no-deps;
- torch: its CPU build (PyTorch's own index, `make setup TORCH_INDEX=...`) and PyPI's CUDA build
  carry the same version but different files, so no one hash fits both; `make setup` installs
  torch first, by requirements.txt's exact pin;
- what only torch's CUDA build brings (the nvidia-* and cuda-* packages): installed with PyPI's
  torch, never with the CPU build.  A package is left out as CUDA-only when everything that
  requires it is torch or another package left out; anything else that requires it keeps it.

Usage: python scripts/lock.py [--uv UV] [--output requirements.lock]
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROJECT = "msda-triton-course"
# the packages only torch's CUDA build requires, by name
CUDA_ONLY = re.compile(r"^(nvidia-|cuda-)")
HEADER = """\
# requirements.lock: every package of requirements.txt at one exact version, with its hashes.
# Made by `make lock` (scripts/lock.py, from requirements.txt and pyproject.toml); do not edit.
# `make setup` installs torch first (requirements.txt's pin; from TORCH_INDEX where given), then
# this file with pip's --require-hashes, then the course itself (-e ., --no-deps).  Left out:
# the course itself, torch and what only torch's CUDA build requires ({left_out}).
"""


def _entries(text: str) -> list[tuple[str, str, list[str]]]:
    """The resolved file's entries: (name, the entry's lines, the names in its "via")."""
    entries = []
    for block in re.split(r"\n(?=\S)", text):
        first = block.split("\n", 1)[0]
        match = re.match(r"([A-Za-z0-9][\w.-]*)==", first)
        if not match:
            continue
        notes = re.findall(r"^\s*#\s*(.*?)\s*$", block, re.M)
        via = [note.removeprefix("via").strip() for note in notes]
        via = [name.lower() for name in via if name]
        entries.append((match.group(1).lower(), block.rstrip("\n"), via))
    return entries


def left_out(entries: list[tuple[str, str, list[str]]]) -> set[str]:
    """torch and the packages that only torch's CUDA build needs (see the module's doc)."""
    dropped = {"torch"}
    candidates = {name for name, _, _ in entries if CUDA_ONLY.match(name)}
    vias = {name: set(via) for name, _, via in entries}
    changed = True
    while changed:
        changed = False
        for name in sorted(candidates - dropped):
            if vias[name] and vias[name] <= dropped:
                dropped.add(name)
                changed = True
    kept = candidates - dropped
    if kept:
        raise SystemExit(f"lock: {sorted(kept)} look CUDA-only but something else requires "
                         "them; check scripts/lock.py's CUDA_ONLY")
    return dropped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--uv", default=shutil.which("uv") or "uv",
                        help="the uv program (pip install uv)")
    parser.add_argument("--output", type=Path, default=REPO / "requirements.lock")
    args = parser.parse_args(argv)
    if not shutil.which(args.uv):
        print(f"lock: {args.uv} not found; install uv (pip install uv) or pass --uv",
              file=sys.stderr)
        return 2
    command = [args.uv, "pip", "compile", "requirements.txt", "--universal",
               "--python-version", "3.11", "--generate-hashes", "--no-header",
               "--annotation-style", "split"]
    resolved = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if resolved.returncode != 0:
        print(resolved.stderr, file=sys.stderr)
        return resolved.returncode
    entries = _entries(resolved.stdout)
    dropped = left_out(entries)
    names = ", ".join(sorted(dropped - {"torch"})) or "none"
    kept = [block for name, block, _ in entries if name not in dropped and name != PROJECT]
    header = HEADER.format(left_out=names)
    header = "\n".join(textwrap.fill(line, 96, subsequent_indent="# ", break_on_hyphens=False)
                       for line in header.splitlines())
    text = header + "\n\n" + "\n".join(kept) + "\n"
    args.output.write_text(text)
    print(f"lock: {args.output.name}: {len(kept)} packages; left out: torch, {names}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
