"""The README's quick start, read from README.md: the command that builds the book, the fast
check (the unit tests) and the command that runs the whole suite, in that order, in the first
```bash block under "## Quick start".

CI (.ci/run) runs the test command from here and tests/test_book.py builds the book with the
book command, so both run exactly as the README writes them.  From a shell:

    python3 scripts/quickstart.py test     # prints the README's test command
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
HEADING = "## Quick start"
ROLES = ("book", "test-fast", "test")


def commands(readme: Path = README) -> dict[str, str]:
    """{"book": ..., "test-fast": ..., "test": ...}: the quick start's commands, comments
    stripped."""
    text = readme.read_text(encoding="utf-8")
    if HEADING not in text:
        raise ValueError(f"{readme.name} has no '{HEADING}' section")
    section = text.split(HEADING, 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    if block is None:
        raise ValueError(f"the '{HEADING}' section of {readme.name} has no ```bash block")
    lines = [line.split("#", 1)[0].strip() for line in block.group(1).splitlines()]
    lines = [line for line in lines if line]
    if len(lines) != len(ROLES):
        raise ValueError(f"the quick start should hold {len(ROLES)} commands ({', '.join(ROLES)}"
                         f"), it holds {len(lines)}: {lines}")
    return dict(zip(ROLES, lines))


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in ROLES:
        sys.exit(f"usage: python3 {Path(__file__).name} {{{'|'.join(ROLES)}}}")
    print(commands()[sys.argv[1]])
