"""The kernels a lab asks for are the submission's own: a static look at the answer cells
(see ``check_kernels``), after every cell has its verdict."""
from __future__ import annotations

import ast

from nbgrader import utils as nbutils

from .calls import check_calls
from .outputs import error
from .source import DYNAMIC, is_jit, names_used, parse_quiet, top_level_names_of

__all__ = ["check_kernels"]


def check_kernels(nb, released, verdicts, check_packages):
    """A Triton kernel the lab asks for must be the submission's own ``@triton.jit``
    function.  Launch counts and records come from the kernel, so an object standing in
    for the kernel (its ``__getitem__`` filling the output on the host and launching a
    kernel that does nothing) passes them; its source does not pass this: the last
    binding of every kernel name the release defines with ``@triton.jit`` must be a
    ``@triton.jit`` def, nothing may assign to its attributes or to ``triton``'s, and
    no answer cell may rebind names at run time (``exec``, ``globals()``, ``setattr``,
    ``sys.modules``...).  A graded cell whose checked functions reach such a kernel
    (through the notebook's functions, a given launcher included) needs review."""
    if released is None:
        return
    kernels = set()
    for cell in released.cells:
        if cell.cell_type == "code" and nbutils.is_solution(cell):
            tree = parse_quiet(cell.source)
            for node in (tree.body if tree else []):
                if isinstance(node, ast.FunctionDef) and is_jit(node):
                    kernels.add(node.name)
    if not kernels:
        return
    last, dynamic, touched = {}, [], set()
    uses = {}
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        tree = parse_quiet(cell.source)
        if tree is None:
            continue
        student = not nbutils.is_locked(cell)
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                uses[node.name] = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            if student:
                for name in top_level_names_of(node) & kernels:
                    last[name] = node
        if not student:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id in DYNAMIC:
                dynamic.append(node.id)
            elif isinstance(node, ast.Attribute) and (
                    node.attr in ("__dict__", "__class__", "__globals__") or
                    (node.attr == "modules" and isinstance(node.value, ast.Name) and
                     node.value.id == "sys")):
                dynamic.append(node.attr)
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
                targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) \
                    else [node.target]
                for target in targets:
                    if isinstance(target, (ast.Attribute, ast.Subscript)):
                        root = target
                        while isinstance(root, (ast.Attribute, ast.Subscript)):
                            root = root.value
                        if isinstance(root, ast.Name) and \
                                root.id in kernels | {"triton", "tl"}:
                            touched.add(root.id)
    bad = {}
    for name in sorted(kernels):
        node = last.get(name)
        if node is not None and not (isinstance(node, ast.FunctionDef) and is_jit(node)):
            bad[name] = f"{name} is not a @triton.jit function of the submission"
        elif name in touched:
            bad[name] = f"{name}'s attributes are assigned"
    if touched & {"triton", "tl"}:
        for name in kernels:
            bad.setdefault(name, "triton's own attributes are assigned")
    if dynamic:
        for name in kernels:
            bad.setdefault(name, f"the answers rebind names at run time ({dynamic[0]})")
    if not bad:
        return
    for cell in nb.cells:
        verdict = cell.get("metadata", {}).get("autograde", {}).get("verdict")
        if not verdict or verdict["verdict"] != "pass":
            continue
        reached, queue = set(), []
        for _, _, args, kwargs in check_calls(cell.source, check_packages):
            queue += [spec[1].split(".")[0] for spec in list(args or []) +
                      list((kwargs or {}).values()) if spec[0] in ("name", "attr")]
        queue += list(names_used(cell.source) & set(uses))
        while queue:
            name = queue.pop()
            if name in reached:
                continue
            reached.add(name)
            queue.extend(uses.get(name, ()))
        hit = sorted(reached & set(bad))
        if not hit:
            continue
        message = (bad[hit[0]] + ": the grader cannot tell that the kernel computed what "
                   "the check received")
        verdict.update(verdict="needs_review", ename="VerificationFailed", message=message)
        verdict.pop("partial", None)
        cell.outputs = [o for o in cell.outputs             # nbgrader reads the first
                        if o.get("output_type") != "execute_result"]   # of result/error
        cell.outputs.append(error("VerificationFailed", message))
        verdicts[cell.metadata.nbgrader.get("grade_id")] = verdict
