"""Chapter 8's exercises name commands, files and code of this repository: check every one.

The chapter (book/chapters/ch08_exercises.ipynb) keeps a structured list of its shell
commands in its notebook metadata (``exercises.commands``), each with the way it is checked:

- ``run``: executed as written from the repository root (``python`` is this interpreter);
  it must exit 0 and print every string in ``expect``;
- ``collect``: a pytest command, collected only: it must select at least one test;
- ``help``: the command with ``--help`` appended must exit 0 and list every flag it uses;
- ``gpu-module``: a GPU harness (``python -m <module> ...``): the module must exist and its
  ``--help`` list every flag the command uses;
- ``gpu-script``: a script under scripts/gpu: on a machine without a GPU, running the
  command as written must stop with a message that it needs a GPU;
- ``make`` / ``shell``: a Makefile target, or the virtual environment that ``make setup``
  creates.

The tests also check that the list and the chapter's fenced ``bash`` blocks agree, that every
repository path the chapter names exists, and that the code the exercises point at
(``exercises.names``) is still there.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = ROOT / "book" / "chapters" / "ch08_exercises.ipynb"
NOTEBOOK = json.loads(CHAPTER.read_text())
SPEC = NOTEBOOK["metadata"]["exercises"]
COMMANDS = SPEC["commands"]
MARKDOWN = "\n\n".join("".join(cell["source"]) for cell in NOTEBOOK["cells"]
                       if cell["cell_type"] == "markdown")
TIMEOUT_S = 900
CHECKS = {"run", "collect", "help", "gpu-module", "gpu-script", "make", "shell"}


def fenced_commands(markdown: str) -> list[str]:
    """Every line of every ```bash block."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", markdown, re.DOTALL):
        commands += [line.strip() for line in block.splitlines() if line.strip()]
    return commands


def argv_of(command: str) -> list[str]:
    """The command as an argument list, with `python` replaced by this interpreter."""
    argv = shlex.split(command)
    if argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    return argv


def execute(argv: list[str], timeout: int = TIMEOUT_S) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def flags_of(command: str) -> list[str]:
    return [token for token in shlex.split(command) if token.startswith("--")]


def _param(entry):
    marks = [pytest.mark.slow] if entry.get("slow") else []
    return pytest.param(entry, id=entry["command"][:70], marks=marks)


# ----------------------------------------------------------------------- the list itself

def test_the_list_matches_the_chapter():
    listed = [entry["command"] for entry in COMMANDS]
    in_text = fenced_commands(MARKDOWN)
    assert len(listed) == len(set(listed)), "a command is listed twice"
    assert set(in_text) == set(listed), (
        f"in the chapter but not listed: {sorted(set(in_text) - set(listed))}; "
        f"listed but not in the chapter: {sorted(set(listed) - set(in_text))}")
    for entry in COMMANDS:
        assert entry["check"] in CHECKS, entry


def test_every_named_path_exists():
    named = set(re.findall(
        r"`((?:source_kernels|tests|scripts|results|book|assignments|autograde)/[\w./-]+"
        r"|Makefile|requirements\.txt)`", MARKDOWN))
    assert named, "the chapter names no file: the pattern above is out of date"
    missing = sorted(path for path in named if not (ROOT / path).exists())
    assert not missing, f"the exercises name files that do not exist: {missing}"


@pytest.mark.parametrize("entry", SPEC["names"], ids=lambda e: e["file"])
def test_named_code_is_still_there(entry):
    text = (ROOT / entry["file"]).read_text()
    missing = [snippet for snippet in entry["contains"] if snippet not in text]
    assert not missing, f"{entry['file']} no longer contains {missing}"


# ----------------------------------------------------------------------- each command

@pytest.mark.parametrize("entry", [_param(e) for e in COMMANDS])
def test_command(entry):
    command, check = entry["command"], entry["check"]
    argv = argv_of(command)

    if check == "make":
        target = argv[1]
        assert re.search(rf"^{re.escape(target)}:", (ROOT / "Makefile").read_text(),
                         re.MULTILINE), f"no `{target}` target in the Makefile"

    elif check == "shell":
        # `source .venv/bin/activate`: the environment `make setup` creates.
        assert argv[:1] == ["source"] and argv[1] == ".venv/bin/activate", command
        makefile = (ROOT / "Makefile").read_text()
        assert re.search(r"^VENV\s*:?=\s*\.venv\s*$", makefile, re.MULTILINE)
        assert "-m venv $(VENV)" in makefile

    elif check == "run":
        done = execute(argv)
        assert done.returncode == 0, f"{command}\nexit {done.returncode}\n{done.stderr[-3000:]}"
        for expected in entry.get("expect", []):
            assert expected in done.stdout, f"{command}: {expected!r} not in\n{done.stdout}"

    elif check == "collect":
        assert argv[1:3] == ["-m", "pytest"], command
        done = execute(argv + ["--collect-only", "-q", "-p", "no:cacheprovider"])
        assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-2000:]}"
        counts = re.findall(r"(\d+)(?:/\d+)? tests? collected", done.stdout)
        assert counts and int(counts[-1]) >= 1, f"{command} selects no test:\n{done.stdout}"

    elif check == "help":
        done = execute(argv + ["--help"], timeout=300)
        assert done.returncode == 0, f"{command} --help\n{done.stderr[-2000:]}"
        for flag in flags_of(command):
            assert flag in done.stdout, f"{command}: {flag} is not an option\n{done.stdout}"

    elif check == "gpu-module":
        assert argv[1] == "-m", command
        module = argv[2]
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not in this checkout")
        done = execute(argv[:3] + ["--help"], timeout=300)
        assert done.returncode == 0, f"{module} --help\n{done.stderr[-2000:]}"
        for flag in flags_of(command):
            assert flag in done.stdout, f"{command}: {flag} is not an option\n{done.stdout}"

    elif check == "gpu-script":
        script = ROOT / argv[1]
        assert script.is_file() and script.parent == ROOT / "scripts" / "gpu", command
        if torch.cuda.is_available():
            pytest.skip("this machine has a GPU: the script would run its measurements; "
                        "its start-up is checked on machines without one")
        done = execute(argv, timeout=300)
        message = done.stdout + done.stderr
        assert done.returncode != 0 and "GPU" in message, (
            f"{command} should stop at once without a GPU, and say so:\n{message[-2000:]}")
