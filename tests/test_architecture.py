"""The layers of ARCHITECTURE.md, held against every import of the code.

Each module of ``source_kernels``, ``autograde`` (the engine), ``autograde.checks`` and the
book's helpers is parsed (nothing is imported); every ``import`` and ``from ... import`` in it,
at any depth (inside functions too), is resolved to an absolute module name and judged by its
layer's rule.  A crossing the page does not draw fails with the file, the line and the rule.
So is a class or function of the course named in a string (not a docstring), as an nbgrader
setting names one: nbgrader imports it, so it is an import.  And every dotted name of the
course in a string, in the engine, the scripts and the course's nbgrader_config.py, must
resolve to what it names.
"""
from __future__ import annotations

import ast
import importlib
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
COURSE = ("source_kernels", "autograde", "book", "scripts", "tests")
# the book's helper modules, imported by name from the chapters and from each other
BOOK_HELPERS = tuple(sorted(p.stem for p in (REPO / "book").glob("_*.py")))

# layer -> (files, what of the course it may import: exact names or prefixes ending in ".")
ENGINE = REPO / "autograde"


def _under(*folder):
    return sorted(ENGINE.joinpath(*folder).rglob("*.py"))


def _may(*packages):
    """Each package by its own name and everything under it."""
    return tuple(n for p in packages for n in (p, p + "."))


# settings, the lab table, log escaping and the compat modules: what every engine layer reads
SHARED = ("autograde", *_may("autograde.config", "autograde.labs", "autograde.logs",
                             "autograde.compat"))
LAYERS = {
    "source_kernels": (sorted((REPO / "source_kernels").rglob("*.py")),
                       ("source_kernels.", "source_kernels")),
    "autograde (shared)": ([ENGINE / "__init__.py", ENGINE / "config.py", ENGINE / "labs.py",
                            ENGINE / "logs.py", *_under("compat")], SHARED),
    "autograde.isolation": (_under("isolation"), SHARED + _may("autograde.isolation")),
    "autograde.trust": (_under("trust"), SHARED + _may("autograde.trust")),
    "autograde.pipeline": (_under("pipeline"), SHARED + _may("autograde.pipeline",
                                                              "autograde.isolation",
                                                              "autograde.trust")),
    "autograde.runner": (_under("runner") + [ENGINE / "__main__.py"], ("autograde", "autograde.")),
    "autograde.check_api": ([ENGINE / "check_api.py"], SHARED + _may("autograde.trust")),
    "autograde.checks": (_under("checks"), _may("autograde.checks", "autograde.check_api",
                                                "source_kernels")),
    "book": (sorted((REPO / "book").glob("*.py")),
             ("source_kernels", "source_kernels.", *BOOK_HELPERS)),
}
# the runner may import the whole engine, but never the operator nor the course's checks
NEVER = {"autograde.runner": ("source_kernels", "autograde.checks")}


def test_every_engine_module_is_in_one_layer():
    engine = {p for layer, (files, _) in LAYERS.items() if layer.startswith("autograde")
              and layer != "autograde.checks" for p in files}
    every = {p for p in ENGINE.rglob("*.py") if "checks" not in p.relative_to(ENGINE).parts}
    assert every == engine, sorted(str(p.relative_to(REPO)) for p in every ^ engine)


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


DOTTED = re.compile(r"(?<![\w.-])(?:autograde|source_kernels)(?:\.[A-Za-z_][A-Za-z0-9_]*)+")


def _docstrings(tree):
    return {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)}


def _named(path: Path):
    """(line, dotted name) of every name of the course written in a string that is not a
    docstring (prose about a module is not an import; a setting's value is)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    prose = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                id(node) not in prose:
            for match in DOTTED.finditer(node.value):
                yield node.lineno, match.group(0)


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
    return [f"{path.relative_to(REPO).as_posix()}:{line} {how} {name}"
            for path in LAYERS[layer][0]
            for how, found in (("imports", _imports(path)), ("names", _settings(path)))
            for line, name in found
            if _crosses(layer, path.relative_to(REPO).as_posix(), _as_module(name))]


def _settings(path: Path):
    """The names in strings that name a class or function of a module (what a setting
    hands to nbgrader or Jupyter to import); a module's name in a string is data (the
    kernel's view lists modules it may see) and is not judged."""
    return [(line, name) for line, name in _named(path) if _as_module(name) != name]


def _as_module(dotted: str) -> str:
    """The module part of a dotted name (``autograde.runner.export.StatusCsvExport`` ->
    ``autograde.runner.export``), found on disk."""
    parts = dotted.split(".")
    while len(parts) > 1 and not (REPO.joinpath(*parts).is_dir() or
                                  REPO.joinpath(*parts[:-1], parts[-1] + ".py").is_file()):
        parts.pop()
    return ".".join(parts)


@pytest.mark.parametrize("layer", list(LAYERS))
def test_no_import_crosses_a_line_the_architecture_does_not_draw(layer):
    assert LAYERS[layer][0], f"{layer}: no files found"
    assert _crossings(layer) == [], f"{layer} (ARCHITECTURE.md, 'Rules the import test holds')"


def test_the_engine_takes_the_call_rule_from_its_check_packages(tmp_path, monkeypatch):
    """What a graded function may call besides its own code is the course's rule: the engine
    asks each check package for it (``call_rule(lab)``) instead of importing the checks, joins
    what they allow, and has no rule where none gives one."""
    from autograde.pipeline.verify import call_rule
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
    """Crossings of each kind are seen (inside a function, relative, absolute), and the same
    kinds of import where the page draws them are not."""
    for module in ("autograde/__init__", "autograde/config", "autograde/check_api",
                   "autograde/checks/__init__", "autograde/checks/lab01",
                   "autograde/isolation/__init__", "autograde/isolation/kernel",
                   "autograde/trust/__init__", "autograde/trust/recording",
                   "autograde/pipeline/__init__", "autograde/pipeline/execute",
                   "autograde/runner/__init__", "autograde/runner/cli",
                   "source_kernels/__init__", "source_kernels/forward"):
        (tmp_path / f"{module}.py").parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f"{module}.py").write_text("")
    files = {
        # the operator inside a function, the checks relatively: never in the engine
        "autograde/runner/bad.py": ("def f():\n    from source_kernels import forward\n"
                                    "from ..checks import lab01\n"),
        # isolation under the pipeline, trust under isolation, pipeline under the runner
        "autograde/isolation/bad.py": "from ..pipeline import execute\nfrom .. import config\n",
        "autograde/trust/bad.py": "from autograde.isolation import kernel\n",
        "autograde/pipeline/bad.py": ("from ..runner import cli\nfrom ..isolation import kernel\n"
                                      "from ..trust import recording\n"),
        # a check reaching past check_api into the engine
        "autograde/checks/bad.py": ("from autograde.trust import recording\n"
                                    "from autograde import check_api\nfrom . import lab01\n"
                                    "from source_kernels import forward\n"),
    }
    for rel, source in files.items():
        (tmp_path / rel).write_text(source)
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    layer_of = {"runner": "autograde.runner", "isolation": "autograde.isolation",
                "trust": "autograde.trust", "pipeline": "autograde.pipeline",
                "checks": "autograde.checks"}
    seen = {rel: sorted(n for _, n in _imports(tmp_path / rel)
                        if _crosses(layer_of[Path(rel).parts[1]], rel, n)) for rel in files}
    assert seen == {
        "autograde/runner/bad.py": ["autograde.checks.lab01", "source_kernels.forward"],
        "autograde/isolation/bad.py": ["autograde.pipeline.execute"],
        "autograde/trust/bad.py": ["autograde.isolation.kernel"],
        "autograde/pipeline/bad.py": ["autograde.runner.cli"],
        "autograde/checks/bad.py": ["autograde.trust.recording"],
    }, seen


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
    (tmp_path / "autograde" / "runner").mkdir(parents=True)
    bad = tmp_path / "autograde" / "runner" / "grading.py"
    bad.write_text("def f(client):\n    from nbclient.util import run_sync\n"
                   "    return client._async_cleanup_kernel()\n")
    assert _internal_uses([bad], tmp_path) == [
        "autograde/runner/grading.py:2 imports nbclient.util.run_sync",
        "autograde/runner/grading.py:3 uses ._async_cleanup_kernel"]


def _lookup(dotted: str):
    """What ``dotted`` names: the module, or an attribute of the longest module prefix."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for part in parts[cut:]:
            found = getattr(found, part)
        return found
    raise ModuleNotFoundError(dotted)


def test_every_dotted_name_in_a_string_resolves():
    """A class or function named in a setting (``c.ExportApp.plugin_class = "..."``, an
    exchange class, a Jinja filter) is imported by nbgrader or Jupyter only when the setting
    is read: after a module moves, the old name fails there, not here, unless checked."""
    files = [*ENGINE.rglob("*.py"), *(REPO / "scripts").rglob("*.py"), REPO / "nbgrader_config.py"]
    names = {(f"{path.relative_to(REPO).as_posix()}:{line}", name)
             for path in files for line, name in _named(path)}
    assert any(n == "autograde.runner.instructor_view.clean_html" for _, n in names)
    broken = []
    for where, name in sorted(names):
        try:
            _lookup(name)
        except (ImportError, AttributeError) as error:
            broken.append(f"{where} names {name}: {error}")
    assert broken == [], broken


def test_a_name_in_a_setting_is_judged_as_an_import(tmp_path, monkeypatch):
    """A pipeline module whose setting names the runner's class crosses the line."""
    fake = ENGINE / "pipeline" / "_setting_probe.py"
    monkeypatch.setitem(LAYERS, "autograde.pipeline", ([fake], LAYERS["autograde.pipeline"][1]))
    text = 'PLUGIN = "autograde.runner.export.StatusCsvExport"\n'
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: text if self == fake
                        else _read_text(self, *a, **k))
    assert _crossings("autograde.pipeline") == [
        "autograde/pipeline/_setting_probe.py:1 names autograde.runner.export.StatusCsvExport"]


_read_text = Path.read_text
