"""What a hidden test cell calls, read from its source (the calls of a check package's
functions, with their arguments as the replay needs them), and what the course allows a
graded function to call besides its own code (``call_rule``, from the check packages)."""
from __future__ import annotations

import ast
import importlib
import importlib.util

__all__ = ["call_rule", "check_calls"]


def check_calls(source, packages):
    """The check calls in a hidden test cell: [(module, function, [arg specs], {kw: spec})],
    where a spec is ("name", identifier), ("attr", "a.b") or ("const", value); or None for a
    call whose arguments cannot be replayed."""
    lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]
    try:
        tree = ast.parse("\n".join(lines))
    except SyntaxError:
        return []
    modules, functions = {}, {}

    def in_packages(name):
        return any(name == p or name.startswith(p + ".") for p in packages)

    def is_module(name):
        try:
            return importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            return False

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    modules[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    modules[top] = top
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if in_packages(node.module) and not is_module(full):
                    functions[alias.asname or alias.name] = (node.module, alias.name)
                elif in_packages(full):
                    modules[alias.asname or alias.name] = full
    calls = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        target = None
        f = node.func
        if isinstance(f, ast.Attribute):
            chain, base = [], f
            while isinstance(base, ast.Attribute):
                chain.append(base.attr)
                base = base.value
            if isinstance(base, ast.Name) and base.id in modules:
                path = modules[base.id].split(".") + chain[::-1]
                if in_packages(".".join(path[:-1])):
                    target = (".".join(path[:-1]), path[-1])
        elif isinstance(f, ast.Name) and f.id in functions:
            target = functions[f.id]
        if target is None:
            continue
        args = [_spec(a) for a in node.args]
        kwargs = {k.arg: _spec(k.value) for k in node.keywords if k.arg}
        where = (node.lineno, node.col_offset)
        if any(a is None for a in args) or any(v is None for v in kwargs.values()) or \
                any(k.arg is None for k in node.keywords):
            calls.append((where, (target[0], target[1], None, None)))
        else:
            calls.append((where, (target[0], target[1], args, kwargs)))
    return [call for _, call in sorted(calls, key=lambda c: c[0])]


def _spec(node):
    if isinstance(node, ast.Name):
        return ("name", node.id)
    if isinstance(node, ast.Attribute):
        parts, base = [], node
        while isinstance(base, ast.Attribute):
            parts.append(base.attr)
            base = base.value
        if isinstance(base, ast.Name):
            return ("attr", ".".join([base.id] + parts[::-1]))
        return None
    try:
        return ("const", ast.literal_eval(node))
    except (ValueError, SyntaxError):
        return None


def call_rule(check_packages, lab):
    """(dotted names a graded function of ``lab`` may call besides its own code, the rule in
    words or None), from the check packages: a package that has a rule defines
    ``call_rule(lab) -> (names, words)`` at its top (``autograde.checks`` does: the chips of
    earlier labs); the names of all of them are allowed, their words joined."""
    allowed, words = [], []
    for package in check_packages:
        rule = getattr(importlib.import_module(package), "call_rule", None)
        if rule is None:
            continue
        names, text = rule(lab)
        allowed.extend(names)
        if text:
            words.append(text)
    return tuple(allowed), "; ".join(words) or None

