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
# The crossings ARCHITECTURE.md names, (file, module): nothing else may join them.
KNOWN = {("autograde/verify.py", "autograde.checks.common")}


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
    if (rel, name) in KNOWN:
        return False
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


def test_the_known_crossings_still_exist():
    """A crossing that was removed comes off the list (and off ARCHITECTURE.md)."""
    for rel, name in KNOWN:
        assert any(n == name for _, n in _imports(REPO / rel)), (rel, name)
    text = (REPO / "ARCHITECTURE.md").read_text(encoding="utf-8")
    for rel, name in KNOWN:
        assert Path(rel).name in text and name in text, (rel, name)


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
