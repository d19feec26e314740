"""The grading kernel's view of the course packages: a staged copy per lab.

The kernel runs student code, so whatever it can import or read, a submission can copy (a
function rebuilt with ``types.FunctionType(code, globals)`` from a module found in
``sys.modules``, or a source file opened by path).  The reference, the operator's kernels
and wrapper and the chips of the lab being graded must therefore not be in it.  The sandbox
binds this staged copy instead of the ``source_kernels`` and ``autograde`` packages, built
from the table in :mod:`autograde.labs` (``kernel_view``):

- ``"*"``: the module's file, copied as it is (its imports of the course packages must be in
  the view too);
- a tuple of names: only those top-level definitions, with the definitions, constants and
  imports they need; a name a module imports from a course module outside the view is copied
  in (a chip that re-exports the reference gets the few reference functions it re-exports,
  never the reference module);
- ``"switch"`` (``source_kernels`` itself): only the package's interpreter switch (and the
  interpreter's shortcuts of ``source_kernels.triton_compat``, which the view always holds).

Only ``.py`` files are written (no ``__pycache__``; the kernel runs with
``PYTHONDONTWRITEBYTECODE``).  ``stage(assignment, dest)`` returns the folder to put first on
the kernel's ``PYTHONPATH``.  In the sandbox it is the only copy of the packages the kernel
can reach (an install inside the bound virtual environment is hidden under an empty tmpfs);
in the ``none`` mode it only comes first on the path, and the packages stay readable.
"""
from __future__ import annotations

import ast
import importlib.util
import os

from .. import labs

__all__ = ["stage", "ViewError", "module_file", "PACKAGES"]

PACKAGES = ("source_kernels", "autograde")

SWITCH = '''"""Multi-scale deformable attention in Triton (the grading kernel's view of the package).

Importing it picks Triton's CPU interpreter when no CUDA GPU is visible, before any kernel
is defined, and then spares the interpreter work that changes no result, as the package
itself does.
"""
import os as _os

import torch as _torch

if "TRITON_INTERPRET" not in _os.environ and not _torch.cuda.is_available():
    _os.environ["TRITON_INTERPRET"] = "1"
if _os.environ.get("TRITON_INTERPRET") == "1":
    from .triton_compat import interpreter_shortcuts as _shortcuts
    _shortcuts()
'''


class ViewError(RuntimeError):
    """A view that cannot be built as declared (a name missing, a module import needed)."""


def _package_root(top):
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        raise ViewError(f"the package {top} cannot be found")
    return list(spec.submodule_search_locations)[0]


def module_file(dotted):
    """The source file of a course module (without importing it)."""
    top, *rest = dotted.split(".")
    base = os.path.join(_package_root(top), *rest)
    for path in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.isfile(path):
            return path
    raise ViewError(f"no source file for {dotted}")


def _is_package(dotted):
    return module_file(dotted).endswith("__init__.py")


def _in_course(name):
    return name.split(".")[0] in PACKAGES


def _absolute(module, level, name, package):
    """The absolute name of ``from <level dots><name> import ...`` inside ``package``."""
    if not level:
        return name
    parts = package.split(".")
    base = parts[:len(parts) - (level - 1)]
    return ".".join(base + ([name] if name else []))


class _Module:
    """A parsed course module: its top-level statements, what each binds and uses."""

    def __init__(self, dotted):
        self.name = dotted
        self.path = module_file(dotted)
        with open(self.path) as fh:
            self.source = fh.read()
        self.lines = self.source.splitlines()
        self.package = dotted if _is_package(dotted) else dotted.rsplit(".", 1)[0]
        self.tree = ast.parse(self.source)
        self.units = []                      # (stmt, bound names, used names)
        body = self.tree.body
        self.docstring = None
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            self.docstring = body[0]
            body = body[1:]
        for stmt in body:
            if isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__":
                continue
            if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__"
                                                    for t in stmt.targets):
                continue
            self.units.append((stmt, _bound(stmt), _used(stmt)))

    def segment(self, stmt):
        first = min([stmt.lineno] + [d.lineno for d in getattr(stmt, "decorator_list", [])])
        return "\n".join(self.lines[first - 1:stmt.end_lineno])


def _bound(stmt):
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {stmt.name}
    if isinstance(stmt, ast.Import):
        return {a.asname or a.name.split(".")[0] for a in stmt.names}
    if isinstance(stmt, ast.ImportFrom):
        return {a.asname or a.name for a in stmt.names}
    names = set()
    for node in ast.walk(stmt):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
    return names


def _used(stmt):
    return {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and
            isinstance(n.ctx, ast.Load)}


class _LocalImports(ast.NodeTransformer):
    """Relative imports inside functions, made absolute (the staged module may live in
    another package than the file it was cut from)."""

    def __init__(self, package):
        self.package = package

    def visit_ImportFrom(self, node):
        if node.level:
            node = ast.ImportFrom(module=_absolute(None, node.level, node.module, self.package),
                                  names=node.names, level=0)
        return node


def _extract(dotted, names, view, stack=()):
    """(imports, body chunks) of a staged module that defines ``names`` of ``dotted``."""
    if dotted in stack:
        raise ViewError(f"circular copy of {dotted}")
    mod = _Module(dotted)
    wanted = set(names)
    defined = {}
    for index, (_, bound, _) in enumerate(mod.units):
        for name in bound:
            defined.setdefault(name, []).append(index)
    missing = wanted - set(defined)
    if missing:
        raise ViewError(f"{dotted} defines no {', '.join(sorted(missing))}")
    keep, queue = set(), list(wanted)
    seen = set()
    while queue:
        name = queue.pop()
        if name in seen or name not in defined:
            continue
        seen.add(name)
        for index in defined[name]:
            stmt, _, used = mod.units[index]
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                keep.add((index, name))
                continue
            if (index, None) not in keep:
                keep.add((index, None))
                queue.extend(used)
    imports, inlined, body = [], [], []
    for index, (stmt, _, _) in enumerate(mod.units):
        picked = {n for i, n in keep if i == index}
        if not picked:
            continue
        if isinstance(stmt, ast.ImportFrom):
            source = _absolute(None, stmt.level, stmt.module, mod.package)
            aliases = [a for a in stmt.names if (a.asname or a.name) in picked]
            if not _in_course(source):
                imports.append(ast.unparse(ast.ImportFrom(module=source, names=aliases, level=0)))
                continue
            for alias in aliases:
                local = alias.asname or alias.name
                sub = f"{source}.{alias.name}"
                if _is_module(sub):
                    if sub not in view:
                        raise ViewError(f"{dotted} needs the module {sub}, which is not in "
                                        "the view")
                    imports.append(f"from {source} import {alias.name}" +
                                   (f" as {alias.asname}" if alias.asname else ""))
                elif source in view and (view[source] in ("*",) or
                                         (isinstance(view[source], tuple)
                                          and alias.name in view[source])):
                    imports.append(f"from {source} import {alias.name}" +
                                   (f" as {alias.asname}" if alias.asname else ""))
                else:               # copied in from a module the kernel must not see
                    inlined.append((source, alias.name))
                    if local != alias.name:
                        body.append(f"{local} = {alias.name}")
        elif isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if (alias.asname or alias.name.split(".")[0]) not in picked:
                    continue
                if _in_course(alias.name) and alias.name not in view:
                    raise ViewError(f"{dotted} needs the module {alias.name}, which is not in "
                                    "the view")
                imports.append(f"import {alias.name}" +
                               (f" as {alias.asname}" if alias.asname else ""))
        else:
            text = mod.segment(stmt)
            if any(isinstance(n, ast.ImportFrom) and n.level for n in ast.walk(stmt)):
                fixed = _LocalImports(mod.package).visit(ast.parse(text))
                text = ast.unparse(fixed)
            body.append(text)
    # side-effect imports of the course package (the interpreter switch) stay
    for stmt, _, _ in mod.units:
        if isinstance(stmt, ast.Import) and any(a.name in view and a.name == "source_kernels"
                                                for a in stmt.names):
            imports.insert(0, "import source_kernels  # noqa: F401  (the interpreter switch)")
            break
    chunks = []
    by_source = {}
    for source, name in inlined:
        by_source.setdefault(source, []).append(name)
    for source, wanted_names in by_source.items():
        sub_imports, sub_chunks = _extract(source, wanted_names, view, stack + (dotted,))
        imports = sub_imports + imports
        chunks.extend(sub_chunks)
    chunks.extend(body)
    return _dedupe(imports), chunks


def _is_module(dotted):
    try:
        module_file(dotted)
        return True
    except ViewError:
        return False


def _dedupe(items):
    out = []
    for item in items:
        if item not in out:
            out.append(item)
    return out


def _staged_source(dotted, what, view):
    if what == "switch":
        return SWITCH
    if what == "*":
        with open(module_file(dotted)) as fh:
            return fh.read()
    mod = _Module(dotted)
    imports, chunks = _extract(dotted, tuple(what), view)
    bound = {}
    for chunk in chunks:
        for stmt in ast.parse(chunk).body:
            for name in _bound(stmt):
                if name in bound and bound[name] != chunk:
                    raise ViewError(f"staging {dotted}: two definitions of {name}")
                bound[name] = chunk
    doc = ast.get_source_segment(mod.source, mod.docstring) if mod.docstring else \
        f'"""{dotted}, as the grading kernel sees it."""'
    parts = [doc, "# The grading kernel's copy: only " + ", ".join(what) +
             " and what they need.", "from __future__ import annotations", ""]
    parts += [i for i in imports if not i.startswith("import source_kernels")]
    if any(i.startswith("import source_kernels") for i in imports):
        parts.append("import source_kernels  # noqa: F401,E402  (the interpreter switch)")
    parts.append("")
    parts += [c + "\n" for c in chunks]
    parts.append(f"__all__ = {list(what)!r}")
    return "\n".join(parts) + "\n"


def stage(assignment, dest):
    """Write the kernel's view of the course packages for ``assignment`` under ``dest``;
    returns ``dest`` (the folder for the kernel's ``PYTHONPATH``)."""
    view = labs.kernel_view(assignment)
    for dotted, what in sorted(view.items()):
        parts = dotted.split(".")
        if _is_package(dotted):
            target = os.path.join(dest, *parts, "__init__.py")
        else:
            target = os.path.join(dest, *parts) + ".py"
        os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
        for i in range(1, len(parts)):
            if ".".join(parts[:i]) not in view:
                raise ViewError(f"{dotted} is in the view of {assignment}, its package "
                                f"{'.'.join(parts[:i])} is not")
        with open(target, "w") as fh:
            fh.write(_staged_source(dotted, what, view))
        os.chmod(target, 0o644)
    for root, dirs, _ in os.walk(dest):
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o755)
    os.chmod(dest, 0o755)
    return dest
