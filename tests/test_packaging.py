"""What the course installs is declared, and the files that declare it agree.

- Every module the course's code imports is the standard library's, the course's own, or a
  distribution named in IMPORTS below; each layer's third-party imports (parsed with ``ast``
  from its modules, and from the code cells of its notebooks) are declared by the
  ``[project]`` dependencies and extras of pyproject.toml that cover that layer: the operator
  by ``dependencies`` alone, autograde/ by ``grading``, the book by ``book``, the labs by
  ``lab``, the hub's scripts by ``hub``, the test suite by ``course`` (every extra).
- requirements.txt pins torch and Triton exactly, inside pyproject.toml's ranges, and installs
  the course itself with every extra (``-e .[course]``), so that ``pip install -r
  requirements.txt`` makes ``source_kernels`` and ``autograde`` importable.
- requirements.lock (``make lock``) pins every package at the version requirements.txt pins,
  satisfies every requirement of pyproject.toml, hashes every entry, and leaves out torch and
  the CUDA build's own packages; ``make setup`` installs from it with ``--require-hashes``.
"""
from __future__ import annotations

import ast
import functools
import importlib.metadata
import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
NAME = canonicalize_name(PROJECT["name"])
MAKE = shutil.which("make")

# The import name of every third-party module the course imports, and its distribution.
IMPORTS = {
    "torch": "torch",
    "triton": "triton",
    "numpy": "numpy",
    "IPython": "ipython",
    "bleach": "bleach",
    "jinja2": "jinja2",
    "jupyter_client": "jupyter-client",
    "latex2mathml": "latex2mathml",
    "nbclient": "nbclient",
    "nbconvert": "nbconvert",
    "nbformat": "nbformat",
    "nbgrader": "nbgrader",
    "tornado": "tornado",
    "traitlets": "traitlets",
    "matplotlib": "matplotlib",
    "matplotlib_inline": "matplotlib-inline",
    "myst_nb": "myst-nb",
    "sphinx": "sphinx",
    "jupyterhub": "jupyterhub",
    "jupyter_cache": "jupyter-cache",
    "pytest": "pytest",
    "xdist": "pytest-xdist",
    "playwright": "playwright",
    "requests": "requests",
    "jsonschema": "jsonschema",
    "yaml": "pyyaml",
    "packaging": "packaging",
}

# Each layer of the repository (glob patterns) and the extras that must declare its imports;
# ``dependencies`` count for every layer.
LAYERS = {
    "the operator": (["source_kernels/**/*.py"], []),
    "grading": (["autograde/**/*.py", "nbgrader_config.py"], ["grading"]),
    "the book": (["book/*.py", "book/_ext/*.py", "book/chapters/*.ipynb"], ["book"]),
    "the labs": (["assignments/*/*.ipynb"], ["lab"]),
    "the course's scripts": (["scripts/*.py"], ["grading"]),
    "the hub": (["scripts/hub/*.py"], ["hub"]),
    "the GPU host's scripts": (["scripts/gpu/*.py"], ["grading", "test"]),
    "the tests": (["tests/*.py", "tests/fixtures/course/**/*.py"], ["course"]),
}
# Modules a test writes for itself before importing them, and the test that writes each.
WRITTEN_BY_TESTS = {"fake_peer": "tests/test_launch.py"}
SKIPPED_FOLDERS = {".venv", "_build", "node_modules", ".git", "release", "submitted",
                   "autograded", "feedback"}


def _repository_files(pattern: str) -> list[Path]:
    return sorted(path for path in REPO.glob(pattern)
                  if not SKIPPED_FOLDERS & set(path.relative_to(REPO).parts))


@functools.cache
def _first_party() -> frozenset[str]:
    """The course's own top-level modules: every module file and package in the repository
    (the suite, scripts/ and book/ import theirs by name; pyproject.toml's pythonpath), and
    the modules tests write for themselves."""
    names = set(WRITTEN_BY_TESTS)
    for path in _repository_files("**/*.py"):
        names.add(path.stem)
        if path.name == "__init__.py":
            names.add(path.parent.name)
    return frozenset(names)


def _sources(path: Path) -> list[str]:
    if path.suffix != ".ipynb":
        return [path.read_text()]
    cells = json.loads(path.read_text())["cells"]
    sources = []
    for cell in cells:
        if cell["cell_type"] != "code":
            continue
        text = "".join(cell["source"])
        # IPython's magics and shell escapes are not Python
        sources.append("\n".join(line for line in text.splitlines()
                                 if not line.lstrip().startswith(("%", "!"))))
    return sources


def _imports(path: Path) -> set[str]:
    """The top-level names of the absolute imports in a module or a notebook's code cells."""
    names = set()
    for source in _sources(path):
        for node in ast.walk(ast.parse(source, str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names


def _third_party(paths: list[Path]) -> dict[str, list[str]]:
    """Third-party import name -> the files importing it."""
    ours = _first_party()
    found: dict[str, list[str]] = {}
    for path in paths:
        for name in _imports(path) - ours - set(sys.stdlib_module_names):
            found.setdefault(name, []).append(str(path.relative_to(REPO)))
    return found


def _declared(extras: list[str]) -> set[str]:
    """The distributions that ``dependencies`` and these extras (and the extras they name,
    ``msda-triton-course[...]``) declare."""
    requirements = [Requirement(text) for text in PROJECT["dependencies"]]
    seen: set[str] = set()
    todo = list(extras)
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for text in PROJECT["optional-dependencies"][extra]:
            requirement = Requirement(text)
            if canonicalize_name(requirement.name) == NAME:
                todo.extend(requirement.extras)
            else:
                requirements.append(requirement)
    return {canonicalize_name(requirement.name) for requirement in requirements}


def _requirements_txt() -> list[str]:
    lines = []
    for line in (REPO / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            lines.append(line)
    return lines


def _pins() -> dict[str, str]:
    """requirements.txt's exact pins: distribution -> version."""
    pins = {}
    for line in _requirements_txt():
        if line.startswith("-"):
            continue
        requirement = Requirement(line)
        (specifier,) = requirement.specifier
        assert specifier.operator == "==", f"requirements.txt pins exactly or not at all: {line}"
        pins[canonicalize_name(requirement.name)] = specifier.version
    return pins


def _lock() -> dict[str, list[tuple[str, str, str]]]:
    """requirements.lock: distribution -> [(version, marker, the entry's text)]."""
    text = (REPO / "requirements.lock").read_text()
    entries: dict[str, list[tuple[str, str, str]]] = {}
    for block in re.split(r"\n(?=\S)", text):
        if block.startswith("#") or not block.strip():
            continue
        match = re.match(r"([A-Za-z0-9][\w.-]*)==(\S+?)(?: ; ([^\\\n]+?))? \\\n", block)
        assert match, f"requirements.lock has an entry that is not name==version: {block[:80]}"
        name, version, marker = match.groups()
        entries.setdefault(canonicalize_name(name), []).append((version, marker or "", block))
    return entries


def test_every_third_party_import_is_known():
    """An import that is neither the standard library's nor the course's is named in IMPORTS
    (and so must be declared: the next test)."""
    paths = [path for patterns, _ in LAYERS.values() for pattern in patterns
             for path in _repository_files(pattern)]
    assert len(paths) > 100, len(paths)
    unknown = {name: files[:3] for name, files in _third_party(paths).items()
               if name not in IMPORTS}
    assert not unknown, ("modules imported that tests/test_packaging.py does not map to a "
                         f"distribution (add them to IMPORTS and to pyproject.toml): {unknown}")


def test_the_modules_tests_write_are_written_there():
    for module, writer in WRITTEN_BY_TESTS.items():
        text = (REPO / writer).read_text()
        assert f'"{module}.py"' in text and f"import {module}" in text, (module, writer)


@pytest.mark.parametrize("layer", LAYERS)
def test_each_layer_imports_only_what_its_extras_declare(layer):
    patterns, extras = LAYERS[layer]
    paths = [path for pattern in patterns for path in _repository_files(pattern)]
    assert paths, f"{layer}: no file matches {patterns}"
    declared = _declared(extras)
    imported = _third_party(paths)
    missing = {name: files[:3] for name, files in imported.items()
               if name in IMPORTS and canonicalize_name(IMPORTS[name]) not in declared}
    assert not missing, (f"{layer} imports what pyproject.toml does not declare in "
                         f"{extras or 'dependencies'}: {missing}")


def test_the_operator_depends_on_torch_and_triton_only():
    imported = set(_third_party(_repository_files("source_kernels/**/*.py")))
    assert imported == {"torch", "triton"}, imported
    assert _declared([]) == {"torch", "triton"}, PROJECT["dependencies"]


@pytest.mark.parametrize("torch, triton", [("2.11.0", "3.6.0"), ("2.13.0", "3.7.1")],
                         ids=["the-gpu-figures-pair", "requirements-txt-pair"])
def test_the_dependency_ranges_admit_both_stacks(torch, triton):
    ranges = {canonicalize_name(Requirement(text).name): Requirement(text).specifier
              for text in PROJECT["dependencies"]}
    assert ranges["torch"].contains(torch) and ranges["triton"].contains(triton), ranges
    # PyTorch's CPU build carries a local version label
    assert ranges["torch"].contains(f"{torch}+cpu"), ranges


def test_the_course_extra_holds_every_other_extra():
    extras = PROJECT["optional-dependencies"]
    (course,) = extras["course"]
    requirement = Requirement(course)
    assert canonicalize_name(requirement.name) == NAME
    assert requirement.extras == set(extras) - {"course"}, requirement.extras


def test_the_imports_table_matches_the_installed_distributions():
    """IMPORTS agrees with what the installed distributions provide, where they are installed."""
    provided = importlib.metadata.packages_distributions()
    checked = 0
    for module, distribution in IMPORTS.items():
        if module in provided:
            assert canonicalize_name(distribution) in \
                {canonicalize_name(name) for name in provided[module]}, (module, provided[module])
            checked += 1
    assert checked >= len(IMPORTS) // 2, "too few of IMPORTS are installed to check the table"


def test_requirements_txt_installs_the_course_itself():
    lines = _requirements_txt()
    editable = [line for line in lines if line.startswith("-e")]
    assert editable == ["-e .[course]"], editable
    pins = _pins()
    assert {"torch", "triton"} <= set(pins), pins
    ranges = {canonicalize_name(Requirement(text).name): Requirement(text).specifier
              for text in PROJECT["dependencies"]}
    for name, specifier in ranges.items():
        assert specifier.contains(pins[name]), (name, pins[name], specifier)


def test_requirements_txt_pins_fall_inside_pyprojects_ranges():
    """A pin outside the range an extra declares would make pip's resolution fail."""
    pins = _pins()
    for text in [requirement for extra in PROJECT["optional-dependencies"].values()
                 for requirement in extra]:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        if name in pins:
            assert requirement.specifier.contains(pins[name]), (text, pins[name])


def test_the_lock_holds_requirements_txts_pins():
    lock = _lock()
    for name, version in _pins().items():
        if name == "torch":
            continue
        assert name in lock, f"requirements.lock lacks {name} (make lock)"
        versions = {entry[0] for entry in lock[name]}
        assert versions == {version}, \
            f"requirements.txt pins {name}=={version}, requirements.lock has {versions} (make lock)"


def test_the_lock_satisfies_pyproject():
    lock = _lock()
    requirements = list(PROJECT["dependencies"]) + [
        text for extra in PROJECT["optional-dependencies"].values() for text in extra]
    for text in requirements:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        if name in (NAME, "torch"):
            continue
        assert name in lock, f"requirements.lock lacks {name}, which pyproject.toml declares"
        for version, _, _ in lock[name]:
            assert requirement.specifier.contains(Version(version), prereleases=True), \
                f"requirements.lock has {name}=={version}, pyproject.toml asks {text} (make lock)"


def test_the_lock_hashes_everything_but_leaves_out_torchs_builds():
    lock = _lock()
    assert len(lock) > 100, len(lock)
    for name, entries in lock.items():
        for version, _, block in entries:
            assert re.search(r"--hash=sha256:[0-9a-f]{64}", block), f"{name}=={version}"
    assert "torch" not in lock and NAME not in lock
    cuda = sorted(name for name in lock if name.startswith(("nvidia-", "cuda-")))
    assert not cuda, f"requirements.lock holds the CUDA build's packages: {cuda}"
    assert not re.search(r"^-e", (REPO / "requirements.lock").read_text(), re.M), \
        "an editable line cannot be installed with --require-hashes"


def test_the_lock_leaves_out_only_what_torch_alone_requires():
    import lock

    def entry(name, *via):
        return (name, f"{name}==1.0", list(via))

    entries = [entry("torch", "-r requirements.txt"), entry("nvidia-a", "torch"),
               entry("nvidia-b", "nvidia-a"), entry("cuda-c", "torch", "nvidia-b"),
               entry("sympy", "torch")]
    assert lock.left_out(entries) == {"torch", "nvidia-a", "nvidia-b", "cuda-c"}
    entries.append(entry("nvidia-d", "torch", "matplotlib"))
    with pytest.raises(SystemExit, match="nvidia-d"):
        lock.left_out(entries)


@pytest.mark.skipif(MAKE is None, reason="needs make (sudo apt-get install make)")
def test_setup_installs_the_lock_with_hashes():
    result = subprocess.run([MAKE, "-n", "-B", "setup"], cwd=REPO, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()

    def first(fragment):
        return next(i for i, line in enumerate(lines) if fragment in line)

    torch = first('"torch==')
    locked = first("-r requirements.lock")
    project = first("-e .")
    assert torch < locked < project < first("pip check"), lines
    assert "--require-hashes" in lines[locked], lines[locked]
    assert "--no-deps" in lines[project], lines[project]
    assert not any("-r requirements.txt" in line for line in lines), lines
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^\$\(STAMP\):.*requirements\.lock", makefile, re.M)
    assert re.search(r"^lock:\n\t.*scripts/lock\.py", makefile, re.M)
