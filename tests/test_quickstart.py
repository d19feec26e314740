"""The README's quick start is what CI and the book test run, and the README holds nothing stale.

- The quick start (read by scripts/quickstart.py) is two commands: one builds the book, one
  runs the tests; each is a Makefile target whose recipe does that (``make -n``).
- ``.ci/run`` runs the README's test command exactly as written (run here with a stand-in
  ``make`` that records its arguments), and tests/test_book.py builds the book with the
  README's book command.
- Every ``make`` target the README names exists; every repository path the README and the
  book's reference pages name exists; no placeholder text is left in them.
- ``make system-packages`` (run by ``make test``) never fails for a missing system package:
  without root or apt-get it says what to install, and the tests that need the package skip
  with a reason naming the command (support.system.require_system_package); as root it waits for
  apt-get's lock and reports what is installed afterwards.
- ``make setup TORCH_INDEX=...`` takes torch (only) from that index, before requirements.lock,
  and a CPU build of torch satisfies requirements.txt; ``make test-fast`` deselects the
  end-to-end markers.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
MAKE = shutil.which("make")
# the pages the README sends each reader to
PAGES = [REPO / "book" / name for name in ("labs.md", "instructors.md", "operator.md",
                                           "measurements.md")]

import quickstart  # noqa: E402  (scripts/, on pytest's pythonpath: pyproject.toml)

needs_make = pytest.mark.skipif(MAKE is None, reason="needs make (sudo apt-get install make)")


def _make_dry_run(*args: str) -> str:
    """``make -n`` of ``args`` in the repository, with the virtual environment's setup left
    out (it is not what these checks are about)."""
    result = subprocess.run([MAKE, "-n", "-o", ".venv/.installed", *args], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _makefile_targets() -> set[str]:
    text = (REPO / "Makefile").read_text()
    rules = re.findall(r"^([A-Za-z][\w-]*(?: +[A-Za-z][\w-]*)*)\s*:(?!=)", text, re.M)
    return {target for rule in rules for target in rule.split()}


def test_the_quick_start_is_three_make_commands():
    commands = quickstart.commands()
    assert shlex.split(commands["book"])[:2] == ["make", "book"], commands
    assert shlex.split(commands["test-fast"])[:2] == ["make", "test-fast"], commands
    assert shlex.split(commands["test"])[:2] == ["make", "test"], commands


@needs_make
def test_the_quick_start_targets_build_the_book_and_run_the_tests():
    commands = quickstart.commands()
    book = _make_dry_run(*shlex.split(commands["book"])[1:])
    assert "jupyter-book build book" in book, book
    test = _make_dry_run(*shlex.split(commands["test"])[1:])
    assert "-m pytest" in test and " -m \"" not in test, test
    assert "apt-get" in test and "install" in test, \
        "make test should install the system packages it can"
    fast = _make_dry_run(*shlex.split(commands["test-fast"])[1:])
    assert "apt-get" not in fast, "make test-fast needs no system package"
    expression = re.search(r'-m pytest -m "([^"]+)"', fast)
    assert expression, fast
    assert set(re.findall(r"not (\w+)", expression.group(1))) == \
        {"slow", "gpu", "book", "browser", "grading"}, expression.group(1)


def test_the_fast_markers_are_declared_and_leave_unit_tests():
    """The markers test-fast deselects are registered (pyproject.toml) and set on the
    end-to-end modules (tests/conftest.py); what is left still holds real tests."""
    import conftest

    config = (REPO / "pyproject.toml").read_text()
    for marker in ("slow", "gpu", "book", "browser", "grading"):
        assert f'"{marker}: ' in config, marker
    for module, markers in conftest.END_TO_END.items():
        assert set(markers) <= {"book", "browser", "grading"}, (module, markers)
        assert (REPO / "tests" / module).exists(), module
    unit = sorted(p.name for p in (REPO / "tests").glob("test_*.py")
                  if p.name not in conftest.END_TO_END)
    assert {"test_operator.py", "test_spec.py", "test_quickstart.py"} <= set(unit), unit


def test_ci_runs_the_readme_test_command_as_written(tmp_path):
    """.ci/run, run for real, with a stand-in `make` that records what it was asked."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "make-args"
    stand_in = bin_dir / "make"
    stand_in.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {shlex.quote(str(record))}\n')
    stand_in.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    result = subprocess.run(["bash", str(REPO / ".ci" / "run")], env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    ran = ["make", *record.read_text().split()]
    assert ran == shlex.split(quickstart.commands()["test"]), ran


def test_the_book_test_builds_with_the_readme_book_command():
    import test_book
    written = shlex.split(quickstart.commands()["book"])
    assert test_book._readme_book_command()[:len(written)] == written


def test_every_make_target_the_readme_names_exists():
    text = README.read_text()
    code = re.findall(r"```.*?```", text, re.S) + re.findall(r"`[^`\n]+`", text)
    named = {target for chunk in code for target in re.findall(r"\bmake ([a-z][\w-]*)", chunk)}
    assert {"book", "test", "lab"} <= named, named
    missing = named - _makefile_targets()
    assert not missing, f"README.md names make targets the Makefile lacks: {missing}"


@needs_make
def test_make_lab_starts_jupyterlab_for_root_and_others():
    recipe = _make_dry_run("lab", "LAB=lab00_the_idea")
    assert "nbgrader generate_assignment lab00_the_idea" in recipe
    assert "jupyter lab" in recipe and "release/lab00_the_idea/lab00_the_idea.ipynb" in recipe
    assert f'--ServerApp.root_dir="{REPO}"' in recipe, "nbgrader needs the course inside the root"
    assert '[ "$(id -u)" = 0 ] && echo --allow-root' in recipe


def _links_and_paths(text: str) -> set[str]:
    """Relative link targets, and backticked tokens that look like repository paths."""
    links = {target.split("#", 1)[0] for target in re.findall(r"\]\(([^)\s]+)\)", text)
             if not re.match(r"[a-z]+:", target)}
    paths = {token for token in re.findall(r"`([\w.-]+/[\w./-]*)`", text)
             if "*" not in token}
    return {item for item in links | paths if item}


@pytest.mark.parametrize("document", [README, *PAGES], ids=lambda p: p.name)
def test_every_path_named_exists(document):
    tracked_tops = {p.name for p in REPO.iterdir()} - {"_build", "release", ".venv"}
    missing = []
    for item in sorted(_links_and_paths(document.read_text())):
        linked = (document.parent / item) if document != README else (REPO / item)
        if linked.exists():
            continue
        top = item.split("/", 1)[0]
        # a path under a folder the repository tracks must exist; outputs (release/, _build/,
        # submitted/<student>/...) are made by the commands the text describes
        if top in tracked_tops and "<" not in item and not (REPO / item).exists():
            missing.append(item)
    assert not missing, f"{document.name} names paths that do not exist: {missing}"


def _prose(text: str) -> str:
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return re.sub(r"`[^`]*`", "", text)


@pytest.mark.parametrize("document", [README, *PAGES], ids=lambda p: p.name)
def test_no_placeholder_or_note_to_self_is_left(document):
    prose = _prose(document.read_text())
    placeholders = re.findall(r"\b[A-Z]{2,}(?:_[A-Z0-9]+)+\b", prose)
    assert not placeholders, f"{document.name}: unfilled placeholders {placeholders}"
    for phrase in ("TODO", "TBD", "FIXME", "XXX", "has not been timed", "not been measured yet",
                   "lorem ipsum"):
        assert phrase.lower() not in prose.lower(), f"{document.name}: {phrase!r}"


def test_the_readme_stays_a_front_door():
    lines = README.read_text().splitlines()
    assert len(lines) < 200, f"README.md has {len(lines)} lines"
    text = README.read_text()
    for package in ("bubblewrap", "chromium", "acl", "npm", "python3-venv"):
        assert package in text, f"README.md should say what {package} is for"
    # every system package the Makefile installs is named in the README
    makefile = (REPO / "Makefile").read_text()
    packages = re.search(r"^SYSTEM_PACKAGES := (.*)$", makefile, re.M).group(1).split()
    for entry in packages:
        assert f"`{entry.split(':')[0]}`" in text, entry


def test_the_toc_holds_the_reference_pages():
    toc = (REPO / "_toc.yml").read_text()
    for page in PAGES:
        assert f"file: {page.stem}\n" in toc, f"{page.name} is not in _toc.yml"


def test_a_missing_system_package_skips_naming_the_command(monkeypatch):
    from support import system

    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setitem(system.SYSTEM_PACKAGES, "bubblewrap",
                        ("no-such-program-here", "the grading sandbox"))
    with pytest.raises(pytest.skip.Exception, match="sudo apt-get install bubblewrap"):
        system.require_system_package("bubblewrap")


@needs_make
@pytest.mark.parametrize("uid, apt_get", [(1000, None), (0, None), (0, 100), (0, "meanwhile")],
                         ids=["not-root", "root-without-apt-get", "root-apt-get-fails",
                              "root-apt-get-fails-but-another-installs-it"])
def test_make_system_packages_never_fails(tmp_path, uid, apt_get):
    """``make system-packages`` where no package is installed: as another user, as root
    without apt-get, as root where apt-get fails, and as root where apt-get fails (say, on
    the lock) while another process installs the package.  It succeeds, passes apt-get a lock
    timeout, and reports what is installed afterwards, not what apt-get said."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "apt-get-calls"
    (bin_dir / "id").write_text(f"#!/bin/sh\necho {uid}\n")
    if apt_get == "meanwhile":
        # the program appears (another apt-get installed it) and this apt-get gives up
        (bin_dir / "apt-get").write_text(
            f'#!/bin/sh\necho "$@" >> {calls}\n'
            f'for last; do :; done\n'
            f'case "$last" in bubblewrap) p=bwrap;; chromium) p=chromium;; acl) p=setfacl;; '
            f'*) exit 100;; esac\n'
            f'printf "#!/bin/sh\\n" > {bin_dir}/$p; chmod 755 {bin_dir}/$p\nexit 100\n')
    elif apt_get is not None:
        (bin_dir / "apt-get").write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexit {apt_get}\n')
    for stand_in in bin_dir.iterdir():
        stand_in.chmod(0o755)
    for tool in ("mktemp", "tail", "rm", "sh", "printf", "chmod"):   # the helpers, nothing else
        if shutil.which(tool) and not (bin_dir / tool).exists():
            (bin_dir / tool).symlink_to(shutil.which(tool))
    result = subprocess.run([MAKE, "-s", "system-packages"], cwd=REPO,
                            env={"PATH": str(bin_dir), "HOME": str(tmp_path)},
                            capture_output=True, text=True, timeout=60)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    for package in ("bubblewrap", "chromium", "acl"):
        if apt_get is None:
            assert f"sudo apt-get install {package}" in output, output
        elif apt_get == "meanwhile":
            assert f"make: {package} is installed" in output, output
        else:
            assert f"make: {package} is not installed (apt-get exit {apt_get})" in output, output
    if apt_get is not None:
        assert all("-o DPkg::Lock::Timeout=" in line for line in calls.read_text().splitlines()), \
            calls.read_text()


@needs_make
def test_setup_takes_torch_from_the_index_it_is_given():
    """``make setup TORCH_INDEX=...`` (README, CPU-only machines): torch alone, at the pinned
    version, from that index, before requirements.lock (which holds no torch); without it,
    torch at the same pin from the usual index, and no other index."""
    index = "https://download.pytorch.org/whl/cpu"
    pin = re.search(r"^torch==\S+", (REPO / "requirements.txt").read_text(), re.M).group(0)

    def recipe(*args):
        result = subprocess.run([MAKE, "-n", "-B", "setup", *args], cwd=REPO,
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        return result.stdout.splitlines()

    lines = recipe(f"TORCH_INDEX={index}")
    torch_line = next(i for i, line in enumerate(lines) if f"--index-url {index}" in line)
    assert f'"{pin}"' in lines[torch_line] and "--no-deps" in lines[torch_line], lines
    requirements = next(i for i, line in enumerate(lines) if "-r requirements.lock" in line)
    assert torch_line < requirements, lines
    assert "--progress-bar on" in lines[requirements] and "--quiet" not in lines[requirements]
    plain = recipe()
    assert not any("--index-url" in line for line in plain), plain
    plain_torch = next(i for i, line in enumerate(plain) if f'"{pin}"' in line)
    assert plain_torch < next(i for i, line in enumerate(plain) if "-r requirements.lock" in line)
    assert 'PYTHONWARNINGS="ignore:Editable installation"' in \
        next(line for line in lines if "-e ." in line), lines


def test_a_cpu_torch_satisfies_requirements_txt(tmp_path):
    """With PyTorch's CPU build installed (as ``make setup TORCH_INDEX=...`` installs it),
    ``pip install -r requirements.txt`` has nothing left to install: the pin accepts the
    ``+cpu`` build, so the CUDA build is never pulled in after it.  The course's own line
    (``-e .[course]``, always reinstalled) is left out of the check; its extras' packages are
    the other lines' and pyproject.toml's, which the environment holds."""
    import torch

    if "+cpu" not in torch.__version__:
        pytest.skip(f"this environment's torch is {torch.__version__}, not PyTorch's CPU build")
    lines = (REPO / "requirements.txt").read_text().splitlines()
    assert "-e .[course]" in lines
    pins = tmp_path / "requirements-pins.txt"
    pins.write_text("\n".join(line for line in lines if not line.startswith("-e")) + "\n")
    result = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index",
                             "--quiet", "--report", "-", "-r", str(pins)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    report = __import__("json").loads(result.stdout)
    assert report["install"] == [], [item["metadata"]["name"] for item in report["install"]]
