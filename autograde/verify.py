"""Decide every graded test cell outside the kernel, after the notebook ran.

For each autograded test cell (its source restored from the gradebook, so trusted):

1. stderr never decides a score: stderr text (a Triton or torch warning) is kept in the
   output, marked, as stdout; an exception raised by the cell still gives it 0;
2. a cell that needs a GPU (a tag in ``AutogradeSettings.gpu_cell_tags`` in the released
   notebook, or a check whose function carries ``requires_gpu = True``) is marked "not
   gradable here" on a CPU host: it gets no automatic score and is flagged for a GPU grading
   run, never silently 0;
3. every call of a check function from a check package (``autograde.checks`` by default) is
   replayed in this process with the kernel's record (:mod:`autograde.recording`): the
   expected values and the comparison are the grader's own.  A cell passes only if the
   kernel raised nothing *and* every replay passed; a kernel pass that the replay rejects
   (or a missing record) scores 0 and is flagged for review, with the replay's message;
4. a checked function that the static scan (:mod:`autograde.scan`) finds reaching a
   forbidden module scores 0;
5. the records and any result value the kernel left in the cell are removed (a number there
   would be read by nbgrader as partial credit).
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import sys

from nbformat.notebooknode import NotebookNode
from nbgrader import utils as nbutils
from nbgrader.preprocessors import NbGraderPreprocessor

from . import labs, recording, scan
from .config import AutogradeSettings, gpu_visible
from .recording import MIME
from .restore import released_notebook
from .status import printable

__all__ = ["VerifyChecks", "check_calls"]

NOT_GRADABLE = "not_gradable_here"


def _error(ename, evalue):
    return NotebookNode(output_type="error", ename=ename, evalue=evalue,
                        traceback=[f"{ename}: {evalue}"])


def _note(text):
    return NotebookNode(output_type="stream", name="stdout", text=text)


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


def _records(cell):
    """(list of event lists, overflow flag) from the cell's record outputs."""
    events, overflow = [], False
    for out in cell.get("outputs", []):
        if out.get("output_type") == "display_data" and MIME in out.get("data", {}):
            rec = out["data"][MIME]
            if isinstance(rec, dict) and rec.get("overflow"):
                overflow = True
            elif isinstance(rec, dict) and isinstance(rec.get("events"), list):
                events.extend(rec["events"])
    return events, overflow


def _device_map(kind):
    return "cuda" if kind == "cuda" and gpu_visible() else "cpu"


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


class VerifyChecks(NbGraderPreprocessor):
    """See the module docstring."""

    def preprocess(self, nb, resources):
        settings = AutogradeSettings(parent=self)
        self.settings = settings
        info = resources.setdefault("autograde", {})
        environment = info.get("environment", "cpu")
        nbg = resources["nbgrader"]
        for path in settings.extra_python_paths:
            if os.path.isdir(path) and path not in sys.path:
                sys.path.insert(0, path)
        reference, _ = released_notebook(os.getcwd(), self.config, nbg["assignment"],
                                         nbg["notebook"])
        tags = {}
        released = {}
        if reference is not None:
            for c in reference.cells:
                gid = c.get("metadata", {}).get("nbgrader", {}).get("grade_id")
                if gid:
                    tags[gid] = set(c.get("metadata", {}).get("tags", []))
                    released[gid] = c.get("source", "")
        self._released = released if reference is not None else None
        forbidden, allowed = labs.forbidden_names(
            nbg["assignment"], settings.forbidden_extra.get(nbg["assignment"], ()))
        # what else this lab's graded code may call, and the rule in words: the course's
        # own rule, given by its check packages
        extra, self._chip_rule = call_rule(settings.check_packages,
                                           labs.lab_number(nbg["assignment"]))
        allowed = tuple(allowed) + extra
        student_cells = [(c.source, not nbutils.is_locked(c)) for c in nb.cells
                         if c.cell_type == "code"]
        code_cells = [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
        position = {i: p for p, (i, _) in enumerate(code_cells)}
        self._foreign = scan.foreign_code(
            [(c.source, not nbutils.is_locked(c), _cell_label(c, i)) for i, c in code_cells],
            by_hand=labs.by_hand(nbg["assignment"]))
        cache = {}

        def tainted(extra_allowed=()):
            key = frozenset(extra_allowed)
            if key not in cache:
                cache[key] = scan.tainted_names(student_cells, forbidden,
                                                tuple(allowed) + tuple(sorted(key)))
            return cache[key]
        verdicts = info.setdefault("verdicts", {})
        cells_info = info.get("cells", {})
        seeds = info.get("seeds", {})
        for index, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            self._stderr_to_stdout(cell)
            if not (nbutils.is_grade(cell) and not nbutils.is_solution(cell)):
                self._strip_records(cell, results=False)
                continue
            gid = cell.metadata.nbgrader.get("grade_id")
            verdict = self._verify_cell(cell, gid, tags.get(gid, set()), environment,
                                        cells_info.get(str(index), {}), seeds, tainted)
            # the message may quote what the kernel sent (an exception's text): no control
            # character of it reaches the notebook, the ledger, a terminal or a page
            verdict["message"] = printable(verdict.get("message", ""), limit=3000,
                                           newlines=True)
            verdicts[gid] = verdict
            cell.metadata.setdefault("autograde", {})["verdict"] = verdict
            self._strip_records(cell)
            if verdict["verdict"] == "pass" and verdict.get("partial") is not None:
                cell.outputs.append(NotebookNode(
                    output_type="execute_result", execution_count=cell.get("execution_count"),
                    metadata={}, data={"text/plain": repr(verdict["partial"])}))
            if verdict["verdict"] != "pass" and verdict["verdict"] != NOT_GRADABLE and \
                    (not self._has_error(cell) or verdict["verdict"] == "forbidden"):
                cell.outputs.append(_error(verdict.get("ename", "HiddenCheckFailed"),
                                           verdict["message"]))
            if verdict["verdict"] == NOT_GRADABLE:
                cell.outputs.append(_note(
                    f"\n[autograde: not gradable here: {verdict['message']}; this cell "
                    "will be graded on a GPU host]\n"))
        self._check_kernels(nb, reference, verdicts)
        for index, cell in enumerate(nb.cells):
            verdict = cell.get("metadata", {}).get("autograde", {}).get("verdict")
            if not verdict or verdict["verdict"] != "pass":
                continue
            foreign = self._foreign_verdict(cell, position[index])
            if foreign is not None:
                verdict.clear()
                verdict.update(foreign)
                cell.outputs = [o for o in cell.outputs             # no partial credit left
                                if o.get("output_type") != "execute_result"]
                cell.outputs.append(_error(foreign["ename"], foreign["message"]))
                verdicts[cell.metadata.nbgrader.get("grade_id")] = verdict
        if settings.visible_points == "tied":
            self._tie_visible_cells(nb, verdicts)
        return nb, resources

    # ------------------------------------------------------------------ foreign code
    def _foreign_verdict(self, cell, position):
        """A passing cell whose checked functions (or the names it uses) rely on code that
        did not come from the notebook's own cells, or that runs after a cell which ran such
        code without binding a name: it earns nothing and goes to the instructor."""
        names, from_cell = self._foreign
        roots = set(_names_used(cell.source))
        for _, _, args, kwargs in check_calls(cell.source, self.settings.check_packages):
            roots |= {spec[1].split(".")[0] for spec in list(args or []) +
                      list((kwargs or {}).values()) if spec[0] in ("name", "attr")}
        hit = sorted(roots & set(names))
        if hit:
            where = f"{hit[0]} {names[hit[0]]}"
        elif from_cell is not None and from_cell[0] < position:
            where = f"the answers run {from_cell[1]}"
        else:
            return None
        return {"verdict": "needs_review", "ename": "ForeignCode",
                "message": f"{where}: code that did not come from the notebook's own cells "
                           "(run from a string, rebuilt from data, imported from a file, "
                           "looked up by a computed name, or autograd where the lab asks for "
                           "the gradient by hand) earns nothing until the instructor has read "
                           "it"}

    # ------------------------------------------------------------------ kernels
    def _check_kernels(self, nb, released, verdicts):
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
                tree = _parse_quiet(cell.source)
                for node in (tree.body if tree else []):
                    if isinstance(node, ast.FunctionDef) and _is_jit(node):
                        kernels.add(node.name)
        if not kernels:
            return
        last, dynamic, touched = {}, [], set()
        uses = {}
        for cell in nb.cells:
            if cell.cell_type != "code":
                continue
            tree = _parse_quiet(cell.source)
            if tree is None:
                continue
            student = not nbutils.is_locked(cell)
            for node in tree.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    uses[node.name] = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
                if student:
                    for name in _top_level_names_of(node) & kernels:
                        last[name] = node
            if not student:
                continue
            for node in ast.walk(tree):
                if isinstance(node, ast.Name) and node.id in _DYNAMIC:
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
            if node is not None and not (isinstance(node, ast.FunctionDef) and _is_jit(node)):
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
            for _, _, args, kwargs in check_calls(cell.source, self.settings.check_packages):
                queue += [spec[1].split(".")[0] for spec in list(args or []) +
                          list((kwargs or {}).values()) if spec[0] in ("name", "attr")]
            queue += list(_names_used(cell.source) & set(uses))
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
            cell.outputs.append(_error("VerificationFailed", message))
            verdicts[cell.metadata.nbgrader.get("grade_id")] = verdict

    # ------------------------------------------------------------------ visible checks
    def _is_visible(self, cell):
        """A graded test cell the student saw whole: its released source is the same (a
        hidden cell's hidden block is not in the release); without the release, a cell
        whose check calls all pass a shown seed (or that calls no check)."""
        gid = cell.metadata.nbgrader.get("grade_id")
        if self._released is not None and gid in self._released:
            return self._released[gid].strip() == cell.source.strip()
        calls = check_calls(cell.source, self.settings.check_packages)
        return not calls or all(kwargs and kwargs.get("seed", ("", None))[0] == "const"
                                for _, _, _, kwargs in calls)

    def _tie_visible_cells(self, nb, verdicts):
        """A visible check never scores on its own: its inputs are shown, so a replaced
        comparison (scored in the kernel) or outputs hard-coded for them (which its own
        replay accepts) would pass it.  A passing visible cell keeps its points only if the
        hidden checks of the student functions it uses exist and passed the grader's
        replay; a hidden check left for a GPU host takes the visible cell with it."""
        defined = set()
        for cell in nb.cells:
            if cell.cell_type == "code" and not nbutils.is_locked(cell):
                defined |= _top_level_names(cell.source)
        hidden = {}                     # function name -> [(grade_id, verdict)]
        visible = []
        for cell in nb.cells:
            verdict = cell.get("metadata", {}).get("autograde", {}).get("verdict")
            if not verdict:
                continue
            if self._is_visible(cell):
                visible.append((cell, verdict))
                continue
            for _, _, args, kwargs in check_calls(cell.source, self.settings.check_packages):
                for spec in list(args or []) + list((kwargs or {}).values()):
                    if spec[0] in ("name", "attr"):
                        hidden.setdefault(spec[1].split(".")[0], []).append(
                            (cell.metadata.nbgrader.get("grade_id"), verdict))
        for cell, verdict in visible:
            if verdict["verdict"] != "pass":
                continue
            gid = cell.metadata.nbgrader.get("grade_id")
            # what it checks: the functions handed to a check (a locked launcher that runs
            # the student's kernel included) and the student's own functions it uses
            used = set(_names_used(cell.source)) & (defined | set(hidden))
            for _, _, args, kwargs in check_calls(cell.source, self.settings.check_packages):
                used |= {spec[1].split(".")[0] for spec in list(args or []) +
                         list((kwargs or {}).values()) if spec[0] in ("name", "attr")}
            names = sorted(n for n in used if n in hidden)
            message, outcome = None, "tied"
            if not names:
                message = ("no hidden check of the functions this visible check uses was "
                           "replayed by the grader, so its points do not count")
            for name in names:
                failed = [g for g, v in hidden[name] if v["verdict"] not in ("pass", NOT_GRADABLE)]
                if failed:
                    message = (f"{name} did not pass its hidden check ({', '.join(failed)}), "
                               "so this visible check's points do not count")
                    break
            if message is None and not any(v["verdict"] == "pass" for name in names
                                           for _, v in hidden[name]):
                outcome = NOT_GRADABLE
                message = "its hidden checks need a CUDA GPU"
            if message is None:
                continue
            verdict.update(verdict=outcome, message=message)
            if outcome == NOT_GRADABLE:
                cell.outputs.append(_note(f"\n[autograde: not gradable here: {message}; this "
                                          "cell will be graded on a GPU host]\n"))
            else:
                cell.outputs.append(_error("HiddenCheckFailed", message))
            verdicts[gid] = verdict

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _has_error(cell):
        return any(o.get("output_type") == "error" for o in cell.get("outputs", []))

    @staticmethod
    def _stderr_to_stdout(cell):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream" and out.get("name") == "stderr":
                out["name"] = "stdout"
                text = out.get("text", "")
                out["text"] = "".join(f"[stderr] {line}" for line in
                                      text.splitlines(keepends=True))

    @staticmethod
    def _strip_records(cell, results=True):
        outs = []
        for out in cell.get("outputs", []):
            if out.get("output_type") == "display_data" and MIME in out.get("data", {}):
                continue
            if out.get("output_type") == "execute_result" and results:
                continue
            outs.append(out)
        cell["outputs"] = outs

    def _needs_gpu(self, cell_tags, calls):
        if cell_tags & set(self.settings.gpu_cell_tags):
            return True
        for module, function, _, _ in calls:
            fn = self._resolve(module, function)
            if fn is not None and getattr(fn, "requires_gpu", False):
                return True
        return False

    @staticmethod
    def _resolve(module, function):
        try:
            return getattr(importlib.import_module(module), function)
        except Exception:                          # noqa: BLE001
            return None

    @staticmethod
    def _scan_verdict(calls, tainted, rule=None):
        for module, function, args, kwargs in calls:
            for spec in list(args or []) + list((kwargs or {}).values()):
                if spec[0] in ("name", "attr"):
                    root = spec[1].split(".")[0]
                    if root in tainted:
                        why = f" ({rule})" if rule else ""
                        return {"verdict": "forbidden", "ename": "ForbiddenReference",
                                "message": f"{root} {tainted[root]}, which a graded function "
                                           f"must not use{why}"}
        return None

    def _verify_cell(self, cell, gid, cell_tags, environment, run_info, seeds, tainted):
        calls = check_calls(cell.source, self.settings.check_packages)
        in_kernel_error = self._has_error(cell)
        if self._needs_gpu(cell_tags, calls) and environment != "gpu":
            return {"verdict": NOT_GRADABLE, "message": "needs a CUDA GPU"}
        if run_info.get("not_run"):
            return {"verdict": "fail", "message": f"not run: {run_info['not_run']}"}
        if run_info.get("timeout"):
            return {"verdict": "fail", "message": "timed out", "ename": "CellTimeoutError"}
        if run_info.get("died"):
            return {"verdict": "fail", "message": "the kernel died in this cell"}
        rule = getattr(self, "_chip_rule", None)
        if in_kernel_error:
            # a graded function that reached what its lab forbids (a chip of this lab, which
            # the grading kernel does not hold, or the reference) says so; the grader's own
            # scan of the submitted source decides it, not the kernel's error text
            return self._scan_verdict(calls, tainted(), rule) or \
                {"verdict": "fail", "message": "the cell raised an error in the kernel"}
        if not calls:
            return self._scan_verdict(calls, tainted(), rule) or \
                {"verdict": "pass", "message": "scored in the kernel (no check to replay)",
                 "replayed": False}
        events, overflow = _records(cell)
        if overflow:
            return {"verdict": "needs_review", "ename": "VerificationFailed",
                    "message": "the record of this check was too large to verify"}
        if not events:
            return {"verdict": "needs_review", "ename": "VerificationFailed",
                    "message": "the kernel reported a pass but sent no record of the hidden "
                               "check (was the check replaced or silenced?)"}
        seed = seeds.get(str(run_info.get("incarnation", 1)))
        if seed is None:
            return {"verdict": "needs_review", "ename": "VerificationFailed",
                    "message": "no grading seed for this cell"}
        try:
            context = recording.ReplayContext(events, seed, _device_map)
        except recording.ReplayError as exc:
            return {"verdict": "needs_review", "ename": "VerificationFailed",
                    "message": f"the record cannot be read: {exc}"}
        result = None
        for module, function, args, kwargs in calls:
            if args is None:
                return {"verdict": "needs_review", "ename": "VerificationFailed",
                        "message": f"{module}.{function} is called with arguments the grader "
                                   "cannot replay"}
            fn = self._resolve(module, function)
            if fn is None:
                return {"verdict": "needs_review", "ename": "VerificationFailed",
                        "message": f"the grader cannot import {module}.{function}"}
            proxies = {}

            def value(spec):
                if spec[0] == "const":
                    return spec[1]
                root, *rest = spec[1].split(".")
                obj = proxies.setdefault(root, recording.Proxy(context, root))
                for part in rest:
                    obj = getattr(obj, part)
                return obj
            try:
                result = recording.replay_check(fn, [value(a) for a in args],
                                                {k: value(v) for k, v in kwargs.items()},
                                                context)
            except recording.ReplayError as exc:
                return {"verdict": "needs_review", "ename": "VerificationFailed",
                        "message": f"the grader could not replay {function}: {exc}"}
            except AssertionError as exc:
                if context.judged_only_here:
                    # the check compares only here: this is its verdict on a wrong answer,
                    # with the check's own diagnosis as the message the student reads
                    return {"verdict": "fail", "ename": "AssertionError",
                            "message": "\n".join(str(exc).strip().splitlines()[:20])[:3000]
                            or "the check failed"}
                return {"verdict": "needs_review", "ename": "VerificationFailed",
                        "message": "the kernel reported a pass, the grader's replay failed: "
                                   + _first_lines(exc)}
            except Exception as exc:                    # noqa: BLE001
                return {"verdict": "needs_review", "ename": "VerificationFailed",
                        "message": f"the grader's replay of {function} raised "
                                   f"{type(exc).__name__}: {_first_lines(exc)}"}
        if recording.unused_calls(context):
            return {"verdict": "needs_review", "ename": "VerificationFailed",
                    "message": "the record holds calls the check never made"}
        forbidden = self._scan_verdict(calls, tainted(context.allowed), rule)
        if forbidden:
            return forbidden
        verdict = {"verdict": "pass", "message": "verified by the grader's replay",
                   "replayed": True}
        if isinstance(result, (int, float)) and not isinstance(result, bool):
            verdict["partial"] = float(result)
        return verdict


_DYNAMIC = {"exec", "eval", "compile", "globals", "locals", "vars", "setattr", "delattr",
            "__import__", "__builtins__", "__main__"}


def _cell_label(cell, index):
    """How a message names a notebook cell: its grade id when that is a plain id, else its
    position."""
    gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
    if isinstance(gid, str) and 0 < len(gid) <= 64 and \
            all(ch.isalnum() or ch in "_-" for ch in gid):
        return f"cell {gid}"
    return f"cell {index + 1}"


def _is_jit(node):
    for deco in node.decorator_list:
        target = deco.func if isinstance(deco, ast.Call) else deco
        if (isinstance(target, ast.Attribute) and target.attr == "jit") or \
                (isinstance(target, ast.Name) and target.id == "jit"):
            return True
    return False


def _top_level_names_of(node):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and
            isinstance(n.ctx, ast.Store)}


def _parse_quiet(source):
    lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]
    try:
        return ast.parse("\n".join(lines))
    except SyntaxError:
        return None


def _top_level_names(source):
    tree = _parse_quiet(source)
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


def _names_used(source):
    tree = _parse_quiet(source)
    if tree is None:
        return set()
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _first_lines(exc, n=3):
    text = str(exc).strip()
    lines = text.splitlines()
    return " ".join(lines[:n])[:1500] if lines else type(exc).__name__
