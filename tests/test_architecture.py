"""The layers of ARCHITECTURE.md, held against every import of the code.

Each module of ``source_kernels``, ``autograde`` (the engine), ``autograde.checks`` and the
book's helpers is parsed (nothing is imported); every ``import`` and ``from ... import`` in it,
at any depth (inside functions too), is resolved to an absolute module name and judged by its
layer's rule.  A crossing the page does not draw fails with the file, the line and the rule.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
COURSE = ("source_kernels", "autograde", "book", "scripts", "tests")
# the book's helper modules, imported by name from the chapters and from each other
BOOK_HELPERS = tuple(sorted(p.stem for p in (REPO / "book").glob("_*.py")))

# layer -> (files, what of the course it may import: exact names or prefixes ending in ".")
LAYERS = {
    "source_kernels": (sorted((REPO / "source_kernels").rglob("*.py")),
                       ("source_kernels.", "source_kernels")),
    "autograde engine": ([p for p in sorted((REPO / "autograde").rglob("*.py"))
                          if "checks" not in p.relative_to(REPO / "autograde").parts],
                         ("autograde", "autograde.")),
    "autograde.checks": (sorted((REPO / "autograde" / "checks").rglob("*.py")),
                         ("autograde.checks", "autograde.checks.", "autograde.recording",
                          "autograde.labs", "source_kernels", "source_kernels.")),
    "book": (sorted((REPO / "book").glob("*.py")),
             ("source_kernels", "source_kernels.", *BOOK_HELPERS)),
}
NEVER = {"autograde engine": ("source_kernels", "autograde.checks")}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path):
    """(line, absolute module name) of every import in the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = _module_name(path)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                # "from autograde.checks import common" imports the module
                # autograde.checks.common; "from autograde.labs import KERNEL_VIEW", a name
                # of autograde.labs
                yield node.lineno, _resolve(module, alias.name)


def _resolve(module: str, name: str) -> str:
    folder = REPO.joinpath(*module.split("."))
    if (folder / name).is_dir() or (folder / f"{name}.py").is_file():
        return f"{module}.{name}" if module else name
    return module


def _allowed(name: str, rule) -> bool:
    return any(name == r or (r.endswith(".") and name.startswith(r)) for r in rule)


def _crosses(layer: str, rel: str, name: str) -> bool:
    """Whether ``rel`` (a file of ``layer``) importing ``name`` crosses a line."""
    top = name.split(".")[0]
    if top not in COURSE and not (layer == "book" and top in BOOK_HELPERS):
        return False                          # a library: not this test's business
    never = NEVER.get(layer, ())
    return not _allowed(name, LAYERS[layer][1]) or any(
        name == n or name.startswith(n + ".") for n in never)


def _crossings(layer: str):
    return [f"{path.relative_to(REPO).as_posix()}:{line} imports {name}"
            for path in LAYERS[layer][0] for line, name in _imports(path)
            if _crosses(layer, path.relative_to(REPO).as_posix(), name)]


@pytest.mark.parametrize("layer", list(LAYERS))
def test_no_import_crosses_a_line_the_architecture_does_not_draw(layer):
    assert LAYERS[layer][0], f"{layer}: no files found"
    assert _crossings(layer) == [], f"{layer} (ARCHITECTURE.md, 'Rules the import test holds')"


def test_the_engine_takes_the_call_rule_from_its_check_packages(tmp_path, monkeypatch):
    """What a graded function may call besides its own code is the course's rule: the engine
    asks each check package for it (``call_rule(lab)``) instead of importing the checks, joins
    what they allow, and has no rule where none gives one."""
    from autograde.verify import call_rule
    for name, body in (("rule_a", "def call_rule(lab):\n    return (f'pkg.chips.lab{lab}.f',), "
                                  "f'rule A of lab {lab}'\n"),
                       ("rule_b", "def call_rule(lab):\n    return ('pkg.g',), 'rule B'\n"),
                       ("no_rule", "")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert call_rule(["rule_a", "no_rule", "rule_b"], 3) == (
        ("pkg.chips.lab3.f", "pkg.g"), "rule A of lab 3; rule B")
    assert call_rule(["no_rule"], 3) == ((), None)
    from autograde.checks.common import chip_rule, chips_allowed
    assert call_rule(["autograde.checks"], 5) == (tuple(chips_allowed(5)), chip_rule(5))


def test_the_rule_sees_a_crossing(tmp_path, monkeypatch):
    """An engine module importing the operator inside a function, or the course's checks
    relatively, is a crossing; the same imports in a check module are not."""
    package = tmp_path / "autograde"
    (package / "checks").mkdir(parents=True)
    (tmp_path / "source_kernels").mkdir()
    for module in ("autograde/__init__", "autograde/checks/__init__", "autograde/checks/lab01",
                   "source_kernels/__init__", "source_kernels/forward"):
        (tmp_path / f"{module}.py").write_text("")
    source = "def f():\n    from source_kernels import forward\nfrom . import lab01\n"
    (package / "bad.py").write_text(source.replace("from . import", "from .checks import"))
    (package / "checks" / "fine.py").write_text(source)
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    bad = [n for _, n in _imports(package / "bad.py") if _crosses("autograde engine",
                                                                  "autograde/bad.py", n)]
    assert sorted(bad) == ["autograde.checks.lab01", "source_kernels.forward"], bad
    fine = [n for _, n in _imports(package / "checks" / "fine.py")
            if _crosses("autograde.checks", "autograde/checks/fine.py", n)]
    assert fine == [], fine


# The libraries whose private or undocumented parts the code uses, each reached through one
# compat module per layer (autograde/compat/ for the engine, source_kernels/triton_compat.py
# for the operator and the course's checks): the internal modules named here are imported
# nowhere else.
INTERNAL = ("nbclient.util", "nbconvert.filters", "nbconvert.preprocessors.execute",
            "nbgrader.exchange.default.collect", "triton.runtime", "triton.compiler",
            "triton.backends")
COMPAT = {"autograde/compat/triton_compat.py", "autograde/compat/nbclient_compat.py",
          "autograde/compat/nbconvert_compat.py", "autograde/compat/nbgrader_compat.py",
          "source_kernels/triton_compat.py"}


def _internal_uses(paths, root):
    found = []
    for path in paths:
        rel = path.relative_to(root).as_posix()
        if rel in COMPAT:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [f"{node.module}.{a.name}" for a in node.names]
            else:
                names = []
            found += [f"{rel}:{node.lineno} imports {n}" for n in names
                      if any(n == i or n.startswith(i + ".") for i in INTERNAL)]
            if isinstance(node, ast.Attribute) and node.attr in (
                    "_init_args_hst", "_get_np_dtype", "_async_cleanup_kernel",
                    "_check_assign_resources", "_path_to_record", "_sort_by_timestamp",
                    "_add_score"):
                found.append(f"{rel}:{node.lineno} uses .{node.attr}")
    return found


def test_private_library_parts_only_in_the_compat_modules():
    paths = sorted((REPO / "autograde").rglob("*.py")) + sorted(
        (REPO / "source_kernels").rglob("*.py"))
    assert _internal_uses(paths, REPO) == []
    for rel in COMPAT:
        doc = ast.get_docstring(ast.parse((REPO / rel).read_text(encoding="utf-8")))
        assert doc and "written against" in " ".join(doc.split()), rel


def test_the_compat_rule_sees_a_private_use(tmp_path):
    (tmp_path / "autograde").mkdir()
    bad = tmp_path / "autograde" / "runner.py"
    bad.write_text("def f(client):\n    from nbclient.util import run_sync\n"
                   "    return client._async_cleanup_kernel()\n")
    assert _internal_uses([bad], tmp_path) == [
        "autograde/runner.py:2 imports nbclient.util.run_sync",
        "autograde/runner.py:3 uses ._async_cleanup_kernel"]
