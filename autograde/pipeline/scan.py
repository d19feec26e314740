"""A static look at the student's code, outside the kernel: which graded functions reach
something they must not (the operator package's references and chips, the grading package).

The in-kernel ``forbid_references`` catches a graded function that calls a reference while
the check runs; it cannot catch a copy made beforehand (``types.FunctionType(ref.__code__,
...)``, an alias bound before the check, a module reached by ``__import__``).  This scan reads
the submitted source instead: it follows imports and aliases through the notebook, then every
function and class the student defined, and marks those that mention a forbidden module or
name, directly, through an alias, through a string naming it, or through another marked
function of theirs.
"""
from __future__ import annotations

import ast
import re

__all__ = ["tainted_names", "foreign_code"]

_MAGIC = re.compile(r"^\s*[%!]")


def _parse(source):
    lines = [("pass  # " + line) if _MAGIC.match(line) else line
             for line in source.splitlines()]
    try:
        return ast.parse("\n".join(lines))
    except SyntaxError:
        return None


def _dotted(node, aliases):
    """'a.b.c' for a Name/Attribute chain, with the root resolved through ``aliases``."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    root = aliases.get(node.id, node.id)
    return ".".join([root] + parts[::-1])


def _under(name, prefix):
    return name == prefix or name.startswith(prefix + ".")


_DEFINED = {}


def _package_dir(root):
    """The folder of top-level package ``root`` (found, never imported), or None."""
    import importlib.util
    try:
        spec = importlib.util.find_spec(root)
    except (ImportError, ValueError):
        return None
    locations = list(getattr(spec, "submodule_search_locations", None) or []) if spec else []
    return locations[0] if locations else None


def _module_file(module):
    """The source file of dotted ``module`` inside its package's folder, or None."""
    import os
    parts = module.split(".")
    if not all(p.isidentifier() for p in parts):
        return None
    base = _package_dir(parts[0])
    if base is None:
        return None
    path = os.path.join(base, *parts[1:])
    for candidate in (path + ".py", os.path.join(path, "__init__.py")):
        if os.path.isfile(candidate):
            return candidate
    return None


def _module_tree(module):
    path = _module_file(module)
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            return ast.parse(fh.read())
    except (OSError, SyntaxError, ValueError):
        return None


def _defining_module(dotted, depth=0):
    """The module that defines what ``dotted`` names (``source_kernels.chips.lab05.msda_forward``
    -> ``source_kernels.forward``, a chip re-exporting a kernel), or None.  Read from the
    packages' source files: nothing a student's string names is ever imported."""
    if dotted in _DEFINED:
        return _DEFINED[dotted]
    found = None
    parts = dotted.split(".")
    if depth < 8 and all(p.isidentifier() for p in parts):
        if _module_file(dotted) is not None:
            found = dotted
        else:
            for cut in range(len(parts) - 1, 0, -1):
                module = ".".join(parts[:cut])
                tree = _module_tree(module)
                if tree is None:
                    continue
                found = _binding_origin(tree, module, parts[cut], depth)
                break
    _DEFINED[dotted] = found
    return found


def _binding_origin(tree, module, name, depth):
    """Where top-level ``name`` of ``module`` (parsed as ``tree``) comes from."""
    origin = None
    package = module if _module_file(module).endswith("__init__.py") else \
        module.rpartition(".")[0]
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and \
                node.name == name:
            origin = module
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                origin = module
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) != name:
                    continue
                source = node.module or ""
                if node.level:
                    base = package.split(".")
                    base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
                    source = ".".join(base + ([source] if source else []))
                origin = _defining_module(f"{source}.{alias.name}", depth + 1) or source
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname == name:
                    origin = alias.name
    return origin


def _matches(name, forbidden, allowed):
    if any(_under(name, a) for a in allowed):
        return False
    if not any(_under(name, f) for f in forbidden):
        return False
    if allowed:                       # a re-export of something allowed is allowed too
        module = _defining_module(name)
        if module and any(_under(module, a) for a in allowed):
            return False
    return True


def _import_bindings(node, explicit_only=False):
    """(bound name, dotted target) for an import statement.  A bare ``import a.b`` binds
    ``a`` to itself: what it reaches is judged by the attribute chains that use it."""
    out = []
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.asname:
                out.append((alias.asname, alias.name))
            elif not explicit_only:
                top = alias.name.split(".")[0]
                out.append((top, top))
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
        for alias in node.names:
            if alias.name != "*":
                out.append((alias.asname or alias.name, f"{node.module}.{alias.name}"))
    return out


def _local_names(node):
    """Arguments and assigned names of a function (they shadow the notebook's aliases)."""
    names = set()
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        a = node.args
        for arg in a.posonlyargs + a.args + a.kwonlyargs + [a.vararg, a.kwarg]:
            if arg is not None:
                names.add(arg.arg)
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
            names.add(sub.id)
    return names


def _mentions(tree, aliases, forbidden, allowed, names_of_interest):
    """(forbidden dotted names mentioned, names of interest used) inside ``tree``."""
    found, used = set(), set()
    local = dict(aliases)
    if isinstance(tree, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        for name in _local_names(tree):
            local.pop(name, None)
    for node in ast.walk(tree):
        for name, target in _import_bindings(node):
            local[name] = target
        for name, target in _import_bindings(node, explicit_only=True):
            if _matches(target, forbidden, allowed):
                found.add(target)
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Attribute, ast.Name)):
            dotted = _dotted(node, local) if id(node) not in inner else None
            if dotted and _matches(dotted, forbidden, allowed):
                found.add(dotted)
            if isinstance(node, ast.Name) and node.id in names_of_interest:
                used.add(node.id)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value.strip()
            if len(text) < 200 and _matches(text, forbidden, allowed):
                found.add(text)
    return found, used


def tainted_names(cells, forbidden, allowed=()):
    """``cells``: [(source, written_by_student)] in notebook order.  Returns {name: reason}
    for every top-level function, class or variable of the student's that reaches a forbidden
    module or name."""
    aliases = {}
    definitions = {}            # name -> list of AST nodes (student's)
    for source, by_student in cells:
        tree = _parse(source)
        if tree is None:
            continue
        for node in tree.body:
            for name, target in _import_bindings(node):
                aliases[name] = target
            if not by_student:
                continue
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                definitions.setdefault(node.name, []).append(node)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for sub in ast.walk(target):
                        if isinstance(sub, ast.Name):
                            definitions.setdefault(sub.id, []).append(node)
                            aliases.pop(sub.id, None)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for name, _ in _import_bindings(node, explicit_only=True):
                    definitions.setdefault(name, []).append(node)
    names = set(definitions)
    direct, uses = {}, {}
    for name, nodes in definitions.items():
        found, used = set(), set()
        for node in nodes:
            f, u = _mentions(node, aliases, forbidden, allowed, names)
            found |= f
            used |= u
        if found:
            direct[name] = f"uses {sorted(found)[0]}"
        uses[name] = used - {name}
    tainted = dict(direct)
    changed = True
    while changed:
        changed = False
        for name, used in uses.items():
            if name in tainted:
                continue
            for other in sorted(used):
                if other in tainted:
                    tainted[name] = f"calls {other}, which {tainted[other]}"
                    changed = True
                    break
    return tainted


# ------------------------------------------------------------------ code not from the cells
# What brings in code that is not the notebook's own cells, or reads the grader's state: the
# grader cannot tell what such code computes, so a stage that depends on it earns nothing and
# goes to review.
_CODE_CALLS = {"exec", "eval", "compile", "__import__", "globals", "locals", "vars"}
_CODE_MODULES = {"marshal", "pickle", "_pickle", "dill", "cloudpickle", "copyreg", "runpy",
                 "imp", "zipimport", "ctypes", "code", "codeop", "importlib", "inspect",
                 "types", "gc", "threading", "_thread", "multiprocessing", "concurrent",
                 "subprocess", "builtins"}
_TYPES_ALLOWED = {"SimpleNamespace", "MappingProxyType", "ModuleType"}
# modules that run work elsewhere rather than bring code in: they count where a graded
# function uses them, not in a top-level statement of their own
_PROCESS_MODULES = {"subprocess", "multiprocessing", "threading", "_thread", "concurrent", "gc",
                    "inspect"}
_CODE_ATTRIBUTES = {"__code__", "__globals__", "__closure__", "__builtins__", "__dict__",
                    "__class__", "__subclasses__", "__bases__", "__mro__", "__getattribute__",
                    "_getframe", "f_back", "f_locals", "f_globals", "f_builtins", "gi_frame",
                    "tb_frame", "co_code", "co_consts", "__loader__", "__spec__"}
_BY_HAND = {"autograd", "backward", "requires_grad_", "grad_fn", "functorch", "func",
            "enable_grad", "set_grad_enabled", "jacobian", "vjp", "jvp", "gradcheck"}


def _constructs(node, modules, by_hand):
    """(what, line) for each construct under ``node`` that brings in code from elsewhere."""
    found = []
    for sub in ast.walk(node):
        line = getattr(sub, "lineno", 0)
        if isinstance(sub, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in sub.names] if isinstance(sub, ast.Import) else \
                [sub.module or ""]
            for name in names:
                top = name.split(".")[0]
                if top in _CODE_MODULES and not (
                        top == "types" and isinstance(sub, ast.ImportFrom) and
                        all(a.name in _TYPES_ALLOWED for a in sub.names)):
                    found.append((f"import of {name}", line))
                if by_hand and (top == "functorch" or name.startswith("torch.autograd") or
                                name.startswith("torch.func")):
                    found.append((f"import of {name} (the gradient must be written by hand)",
                                  line))
            if isinstance(sub, ast.ImportFrom) and sub.level:
                found.append(("a relative import (a file beside the notebook)", line))
        elif isinstance(sub, ast.Name):
            if sub.id in _CODE_CALLS or sub.id in ("__builtins__", "__loader__", "__spec__"):
                found.append((f"{sub.id}", line))
            elif sub.id in modules and modules[sub.id] in _CODE_MODULES and not (
                    modules[sub.id] == "types"):
                found.append((f"{modules[sub.id]}", line))
        elif isinstance(sub, ast.Attribute):
            root = sub.value
            if sub.attr in _CODE_ATTRIBUTES:
                found.append((f".{sub.attr}", line))
            elif sub.attr == "modules" and isinstance(root, ast.Name) and \
                    modules.get(root.id) == "sys":
                found.append(("sys.modules", line))
            if isinstance(root, ast.Name) and modules.get(root.id) == "types" and \
                    sub.attr not in _TYPES_ALLOWED:
                found.append((f"types.{sub.attr}", line))
            if by_hand and sub.attr in _BY_HAND:
                found.append((f".{sub.attr} (the gradient must be written by hand)", line))
        elif isinstance(sub, ast.Call):
            func = sub.func
            if isinstance(func, ast.Call) and isinstance(func.func, ast.Name) and \
                    func.func.id == "type":
                found.append(("type(...)(...), an object built from another's type", line))
            if isinstance(func, ast.Name) and func.id in ("getattr", "setattr", "delattr"):
                name = sub.args[1] if len(sub.args) > 1 else None
                if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
                    found.append((f"{func.id} with a name computed at run time", line))
            if by_hand:
                for kw in sub.keywords:
                    if kw.arg == "requires_grad" and not (
                            isinstance(kw.value, ast.Constant) and kw.value.value is False):
                        found.append(("requires_grad= (the gradient must be written by hand)",
                                      line))
    return found


def foreign_code(cells, by_hand=False):
    """Where a notebook's answers bring in code that is not their own cells.

    ``cells``: [(source, written_by_student, label)] in notebook order (label: how a message
    names the cell).  ``by_hand``: the lab's gradients must be written by hand (autograd is
    code from elsewhere too).  Returns ``(names, from_cell)``: {top-level name: reason} for
    every name of the student's whose definition uses such a construct or uses another such
    name; and, for a construct in a statement that binds no name (a bare ``exec(...)``),
    ``(position in cells, reason)`` of the first one (everything after it is suspect), else
    None."""
    modules = {}
    definitions = {}
    direct = {}
    from_cell = None
    for position, (source, by_student, label) in enumerate(cells):
        tree = _parse(source)
        if tree is None:
            continue
        for node in tree.body:
            for name, target in _import_bindings(node):
                modules[name] = target.split(".")[0] if "." not in name else target
            if isinstance(node, ast.Import):
                for alias in node.names:
                    modules[alias.asname or alias.name.split(".")[0]] = \
                        alias.name if alias.asname else alias.name.split(".")[0]
            if not by_student:
                continue
            bound = set()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bound = {node.name}
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                bound = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            elif isinstance(node, ast.Import):
                bound = {name for name, _ in _import_bindings(node)}
            elif isinstance(node, ast.ImportFrom):
                bound = {a.asname or a.name for a in node.names if a.name != "*"}
            for name in bound:
                definitions.setdefault(name, []).append(node)
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                # one import statement binds several names: each is judged on its own module
                for alias in node.names:
                    one = (ast.Import(names=[alias]) if isinstance(node, ast.Import) else
                           ast.ImportFrom(module=node.module, names=[alias], level=node.level))
                    ast.copy_location(one, node)
                    hit = _constructs(one, modules, by_hand)
                    if hit:
                        name = alias.asname or (alias.name.split(".")[0]
                                                if isinstance(node, ast.Import) else alias.name)
                        direct.setdefault(name, f"{hit[0][0]} in {label}, line {hit[0][1]}")
                continue
            found = _constructs(node, modules, by_hand)
            if not bound:
                # a statement that binds no name: only what brings in code counts there (a
                # process or thread started at top level is judged by the limits, not here)
                found = [(w, n) for w, n in found if w.split(" ")[-1].split(".")[0]
                         not in _PROCESS_MODULES and not any(
                             w.startswith(f"import of {m}") for m in _PROCESS_MODULES)]
            if not found:
                continue
            what, line = found[0]
            reason = f"{what} in {label}, line {line}"
            if bound:
                for name in sorted(bound):
                    direct.setdefault(name, reason)
            elif from_cell is None:
                from_cell = (position, reason)
    names = dict(direct)
    uses = {name: {n.id for node in nodes for n in ast.walk(node)
                   if isinstance(n, ast.Name) and n.id != name}
            for name, nodes in definitions.items()}
    changed = True
    while changed:
        changed = False
        for name, used in sorted(uses.items()):
            if name in names:
                continue
            for other in sorted(used):
                if other in names:
                    names[name] = f"uses {other}: {names[other]}"
                    changed = True
                    break
    return names, from_cell
