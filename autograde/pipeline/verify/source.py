"""What the verification reads of a cell's source without running it: its top-level
names, the names it uses, ``@triton.jit`` definitions, and how a message names a cell."""
from __future__ import annotations

import ast

__all__ = ["DYNAMIC", "cell_label", "is_jit", "names_used", "parse_quiet", "top_level_names",
           "top_level_names_of"]

# names through which an answer cell can rebind names at run time
DYNAMIC = {"exec", "eval", "compile", "globals", "locals", "vars", "setattr", "delattr",
            "__import__", "__builtins__", "__main__"}


def cell_label(cell, index):
    """How a message names a notebook cell: its grade id when that is a plain id, else its
    position."""
    gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
    if isinstance(gid, str) and 0 < len(gid) <= 64 and \
            all(ch.isalnum() or ch in "_-" for ch in gid):
        return f"cell {gid}"
    return f"cell {index + 1}"


def is_jit(node):
    for deco in node.decorator_list:
        target = deco.func if isinstance(deco, ast.Call) else deco
        if (isinstance(target, ast.Attribute) and target.attr == "jit") or \
                (isinstance(target, ast.Name) and target.id == "jit"):
            return True
    return False


def top_level_names_of(node):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and
            isinstance(n.ctx, ast.Store)}


def parse_quiet(source):
    lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]
    try:
        return ast.parse("\n".join(lines))
    except SyntaxError:
        return None


def top_level_names(source):
    tree = parse_quiet(source)
    names = set()
    if tree is None:
        return names
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    return names


def names_used(source):
    tree = parse_quiet(source)
    if tree is None:
        return set()
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def first_lines(exc, n=3):
    text = str(exc).strip()
    lines = text.splitlines()
    return " ".join(lines[:n])[:1500] if lines else type(exc).__name__
