"""Mutation testing of the labs' visible checks: how many small mistakes, made in a lab's own
solution, its checks catch, locate and name, and whether a hint ever names the wrong mistake.

Usage (one command regenerates every results file; a few minutes per lab on 2 cores)::

    python scripts/mutate_labs.py                 # every lab, results/mutants/labNN.json
    python scripts/mutate_labs.py --labs lab05    # one lab
    python scripts/mutate_labs.py --list lab01    # print the mutants, run nothing
    python scripts/mutate_labs.py --reclassify    # the recorded messages against LOCATING

Mutants.  A small AST mutator works on the code between ``### BEGIN SOLUTION`` and ``### END
SOLUTION`` of each answer cell (what a student writes): an arithmetic or comparison operator
swapped, an integer constant moved by one or a float by a half, two call arguments or two
tuple elements (indices, axes, shapes) swapped, one term of a mask (``a & b``) or one factor
of a product dropped, a ``mask=`` / ``other=`` argument dropped, a dtype changed, a statement
deleted.  Each is a text edit at the node's position (the rest of the cell stays as written).
All mutants of a lab are enumerated, then a seeded sample is drawn when there are more than
the lab's budget (``BUDGET``).

Running one.  Each mutant runs in a process of its own, forked from this one (torch and Triton
already imported), with a time limit: the lab's source notebook plays from the top as a
student runs it with the hidden tests removed (``tests/support/lab_cells.py`` executes the cells), the
mutated answer cell in place, every demonstration cell after it, and every visible check from
the mutated cell on (the checks before it do not depend on it).  Figures, GPU sections and
timing cells are left out (``LEFT_OUT``).  What is recorded:

- ``killed``: a visible check failed (AssertionError);
- ``named``: the first failing check's message holds a ``Hint:``;
- ``located``: the message locates the wrong term by isolating it (``LOCATING``: "only batch 1
  is wrong", "with all attention on level 0, point 1", "the ... term", ...); a message that
  only gives a wrong value and where it sits is neither located nor named (``vague``);
- ``wrongly_hinted`` (goal 0): a hint whose mistake, applied to the reference, does not
  reproduce the mutant's output on the check's inputs.  Decided by running: the catalogue is
  the injected-mistake tables (``tests/test_mistakes_*.py``), whose rows are a text edit of
  the reference and the words of the hint naming it; every row of the same check whose words
  the message holds is applied to the reference and run through the check in recording mode
  (``autograde.trust.recording``: what the student's functions returned, on the inputs the check
  built from its seed), beside the mutant; the hint is confirmed when one row's outputs equal
  the mutant's (``torch.allclose``, NaN equal to NaN), wrong when none does, and
  ``hint_unverified`` when no row of the tables holds its words;
- ``death`` (goal 0): the process died (a signal: the heap corrupted, a segfault) or an
  exception other than an AssertionError escaped a cell that is not the mutated answer itself
  (a demonstration cell, or a check that let a student's exception through);
- ``timeout``: the process ran past the limit (the lab's checks take seconds);
- ``invalid``: the mutated answer cell itself raised while it was defined (a student sees
  their own traceback at once; left out of the rates);
- ``equivalent``: no check failed and the mutant returns what the reference returns on every
  check's inputs, visible and hidden, the hidden ones with ``--equiv-seeds`` random seeds
  (recording mode again); a surviving mutant that is not equivalent is ``survived``.

Results: ``results/mutants/labNN.json`` (provenance: command, commit, date, seed; totals; one
entry per mutant) and ``results/mutants/summary.json`` / ``summary.md`` (all labs).
``tests/test_mutants.py`` re-runs a fixed sample and holds the totals.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
os.environ.setdefault("MPLBACKEND", "Agg")

import source_kernels  # noqa: E402,F401  (the interpreter switch, before any kernel is defined)
from source_kernels.provenance import date as provenance_date  # noqa: E402
from support import lab_cells  # noqa: E402

RESULTS = REPO / "results" / "mutants"
BEGIN_SOLUTION, END_SOLUTION = "### BEGIN SOLUTION", "### END SOLUTION"
LABS = [f"lab{n:02d}" for n in range(11)]
# mutants per lab at most (a seeded sample beyond), sized to each lab's checks' CPU time so
# that the whole run stays within about 15 minutes on 2 cores
BUDGET = {"lab00": 24, "lab01": 30, "lab02": 30, "lab03": 24, "lab04": 24, "lab05": 20,
          "lab06": 10, "lab07": 24, "lab08": 12, "lab09": 20, "lab10": 12}
TIME_LIMIT = {"lab05": 150, "lab06": 150, "lab08": 150, "lab10": 150}
DEFAULT_TIME_LIMIT = 90
# ungraded cells a student's run here leaves out: figures, GPU sections, timings, compilations
# for a GPU target and the operator's whole test suite (none of them is a check)
LEFT_OUT = ("fig_", "gpu_", "paper_gpu", "compile_sm", "compiled_", "cas_loop", "preset_costs",
            "interpreter_cost", "sweep", "tune_here", "suite", "race", "cost_numbers")
# phrases by which a message locates the wrong term (an isolation probe's result)
LOCATING = [
    r"\bonly (?:in )?(?:batch|head|level|point|channel|query|corner|row|column|program)s? \d",
    r"\bwith (?:all )?(?:the )?attention (?:all )?on\b",
    r"\bthe [\w ()*+-]{1,40} term\b", r"\bterm of\b",
    r"\bfirst (?:goes|went) wrong\b", r"\bignores the (?:point|level|head|batch|channel|query)\b",
    r"\bequals what [\w ,()]+ should give\b",
    r"\bwhat this probe adds\b", r"\bthe term that goes wrong\b",
    r"\bthe simplest sample is wrong\b",
]
# a hint that says no mistake of the catalogue matches names none
NOT_NAMING = [r"\bnone of the usual mistakes\b", r"\bno usual mistake\b"]
DTYPES = {"float32": ("float16", "float64"), "float16": ("float32",), "bfloat16": ("float32",),
          "float64": ("float32",), "int64": ("int32",), "int32": ("int64", "int16")}
OPS = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult,
       ast.FloorDiv: ast.Div, ast.Mod: ast.FloorDiv, ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd}
CMPS = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
        ast.NotEq: ast.Eq}
SYMBOL = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//",
          ast.Mod: "%", ast.BitAnd: "&", ast.BitOr: "|", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">",
          ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=", ast.Pow: "**", ast.RShift: ">>",
          ast.LShift: "<<"}


# ------------------------------------------------------------------ making mutants
@dataclass(frozen=True)
class Mutant:
    lab: str            # labNN_name
    cell: str           # grade id of the answer cell
    kind: str           # operator | compare | constant | swap | drop-term | drop-factor |
    #                     drop-keyword | dtype | delete
    line: int           # line in the cell (1-based)
    before: str         # the source text replaced
    after: str          # what replaces it
    start: int          # character offsets in the cell's source
    end: int

    copy: int = 0       # the how-manyth mutant with the same id text (0: the first)

    @property
    def id(self) -> str:
        text = f"{self.cell}:{self.line}:{self.kind}:{self.start}:{_short(self.after, 24)}"
        return f"{text}#{self.copy + 1}" if self.copy else text

    def source(self, original: str) -> str:
        return original[:self.start] + self.after + original[self.end:]


def _short(text, n=60):
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n - 3] + "..."


def _offsets(source):
    """Character offset of the start of each line (1-based line numbers)."""
    starts, total = [0, 0], 0
    for line in source.splitlines(True):
        total += len(line)
        starts.append(total)
    return starts


def _solution_lines(source):
    """Line numbers (1-based) strictly between the solution markers."""
    inside, found = False, set()
    for number, line in enumerate(source.splitlines(), 1):
        if BEGIN_SOLUTION in line:
            inside = True
        elif END_SOLUTION in line:
            inside = False
        elif inside:
            found.add(number)
    return found


def mutants_of(lab: str, c) -> list:
    """Every mutant of one answer cell."""
    source = c.source
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    inside = _solution_lines(source)
    starts = _offsets(source)
    found = []

    def span(node):
        return starts[node.lineno] + node.col_offset, starts[node.end_lineno] + node.end_col_offset

    def text(node):
        a, b = span(node)
        return source[a:b]

    def add(kind, node, after, where=None):
        if node.lineno not in inside or node.end_lineno not in inside:
            return
        a, b = where or span(node)
        before = source[a:b]
        if before == after:
            return
        mutated = source[:a] + after + source[b:]
        try:
            ast.parse(mutated)
        except SyntaxError:
            return
        found.append(Mutant(lab, c.grade_id, kind, node.lineno, before, after, a, b))

    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp):
            left, right = text(node.left), text(node.right)
            if type(node.op) in OPS:
                add("operator", node, f"({left}) {SYMBOL[OPS[type(node.op)]]} ({right})")
            if isinstance(node.op, ast.Mult):
                add("drop-factor", node, f"({left})")
                add("drop-factor", node, f"({right})")
            if isinstance(node.op, ast.BitAnd):
                add("drop-term", node, f"({left})")
                add("drop-term", node, f"({right})")
            if isinstance(node.op, (ast.Add, ast.Sub)) and isinstance(node.right, ast.Constant):
                add("drop-term", node, f"({left})")
        elif isinstance(node, ast.BoolOp) and isinstance(node.op, ast.And):
            for i in range(len(node.values)):
                rest = [text(v) for j, v in enumerate(node.values) if j != i]
                add("drop-term", node, "(" + " and ".join(rest) + ")")
        elif isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in CMPS:
            op = SYMBOL[CMPS[type(node.ops[0])]]
            add("compare", node, f"{text(node.left)} {op} {text(node.comparators[0])}")
        elif isinstance(node, ast.Constant) and type(node.value) in (int, float) \
                and not isinstance(node.value, bool):
            step = 1 if isinstance(node.value, int) else 0.5
            for value in (node.value + step, node.value - step):
                add("constant", node, repr(value))
        elif isinstance(node, ast.Call):
            args = [a for a in node.args if not isinstance(a, ast.Starred)]
            for i in range(len(args) - 1):
                a0, b0 = span(args[i])
                a1, b1 = span(args[i + 1])
                after = text(node)
                offset = span(node)[0]
                after = (after[:a0 - offset] + source[a1:b1] + source[b0:a1] + source[a0:b0]
                         + after[b1 - offset:])
                add("swap", node, after)
            for kw in node.keywords:
                if kw.arg in ("mask", "other"):
                    rest = [text(a) for a in node.args] + \
                        [f"{k.arg}={text(k.value)}" if k.arg else f"**{text(k.value)}"
                         for k in node.keywords if k is not kw]
                    add("drop-keyword", node, f"{text(node.func)}({', '.join(rest)})")
        elif isinstance(node, ast.Tuple) and len(node.elts) >= 2 and \
                not isinstance(node.ctx, ast.Store):
            for i in range(len(node.elts) - 1):
                a0, b0 = span(node.elts[i])
                a1, b1 = span(node.elts[i + 1])
                whole_a, whole_b = span(node)
                after = (source[whole_a:a0] + source[a1:b1] + source[b0:a1] + source[a0:b0]
                         + source[b1:whole_b])
                add("swap", node, after)
        elif isinstance(node, ast.Attribute) and node.attr in DTYPES and \
                isinstance(node.ctx, ast.Load):
            for other in DTYPES[node.attr]:
                add("dtype", node, f"{text(node.value)}.{other}")
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.Return)) \
                and not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):
            add("delete", node, "pass")
    return found


def all_mutants(lab: str) -> list:
    import dataclasses

    lab = lab_cells.lab_name(lab)
    found, seen = [], {}
    for c in lab_cells.cells(lab):
        if c.answer:
            for m in mutants_of(lab, c):
                copies = seen.get(m.id, 0)
                seen[m.id] = copies + 1
                found.append(dataclasses.replace(m, copy=copies) if copies else m)
    return found


def sample(mutants, budget, seed):
    """A seeded sample of ``budget`` mutants (all when there are fewer), in cell order."""
    if len(mutants) <= budget:
        return list(mutants)
    rng = random.Random(seed)
    chosen = set(rng.sample(range(len(mutants)), budget))
    return [m for i, m in enumerate(mutants) if i in chosen]


# ------------------------------------------------------------------ playing a notebook
def _playable(c) -> bool:
    return c.kind == "code" and not c.hidden and not c.stem().startswith(LEFT_OUT)


def play(lab: str, changed: str | None = None, source: str | None = None,
         until: str | None = None, on_check=None) -> dict:
    """Run the notebook as a student would, the answer cell ``changed`` holding ``source``;
    visible checks before ``changed`` are left out, and nothing after the cell ``until``.
    Returns what each cell did."""
    import types

    lab = lab_cells.lab_name(lab)
    module = types.ModuleType(f"{lab}_student")
    sys.modules[module.__name__] = module
    scope = module.__dict__
    reached = changed is None
    outcome = {"checks": [], "death": None, "invalid": None}
    for c in lab_cells.cells(lab):
        if outcome["checks"] and outcome["checks"][-1]["cell"] == until:
            break
        if not _playable(c):
            continue
        if c.grade_id == changed:
            reached = True
        if c.visible_check and not reached:
            continue
        text = source if (c.grade_id == changed and source is not None) else c.source
        try:
            lab_cells.execute(text, f"<{lab} cell {c.index}>", scope, quiet=True)
        except AssertionError as exc:
            if c.visible_check:
                outcome["checks"].append({"cell": c.grade_id, "passed": False,
                                          "message": str(exc)[:4000]})
                if on_check:
                    on_check(outcome["checks"][-1])
                continue
            what = "invalid" if c.grade_id == changed else "death"
            outcome[what] = outcome[what] or _exception(c, exc)
        except Exception as exc:                            # noqa: BLE001
            what = "invalid" if c.grade_id == changed else "death"
            outcome[what] = outcome[what] or _exception(c, exc)
            if what == "invalid":
                return outcome
        else:
            if c.visible_check:
                outcome["checks"].append({"cell": c.grade_id, "passed": True})
                if on_check:
                    on_check(outcome["checks"][-1])
    outcome["scope"] = scope
    return outcome


def _exception(c, exc):
    tb = traceback.extract_tb(exc.__traceback__)
    return {"cell": c.grade_id, "type": type(exc).__name__, "message": str(exc)[:500],
            "where": f"{tb[-1].name} line {tb[-1].lineno}" if tb else ""}


def record_checks(lab: str, scope: dict, check_ids, seeds) -> dict:
    """{"cell@seed": events} of each check cell run in recording mode: what the student's
    functions returned and which tensors they changed, on the inputs the check builds from its
    seed (a visible check's own; a hidden check's derived from ``seed`` and the cell)."""
    import contextlib
    import io

    from autograde.trust import recording

    found = {}
    for check_id in check_ids:
        c = lab_cells.cell(lab, check_id)
        for seed in (seeds if c.hidden else seeds[:1]):
            recording._mode, recording._base_seed, recording._counter = \
                "record", f"{seed}:{check_id}", 0
            recording._events = []
            error = None
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    lab_cells.execute(c.source, f"<{lab} {check_id} recorded>", scope)
            except BaseException as exc:                    # noqa: BLE001
                error = type(exc).__name__
            finally:
                events, recording._events, recording._mode = recording._events, [], None
            calls = [{k: e.get(k) for k in ("s", "slot", "result", "mut", "exc")}
                     for e in events if e.get("e") == "call"]
            for call in calls:
                if call.get("exc"):
                    call["exc"] = call["exc"].get("type")
            found[f"{check_id}@{seed}"] = {"calls": calls, "error": error}
    return found


def same_records(a, b, atol=1e-5, rtol=1e-4) -> bool:
    """The two recordings hold the same calls with the same outputs (within tolerance)."""
    from autograde.trust import codec

    if a.keys() != b.keys():
        return False
    for key in a:
        ra, rb = a[key], b[key]
        if ra["error"] != rb["error"] or len(ra["calls"]) != len(rb["calls"]):
            return False
        for ca, cb in zip(ra["calls"], rb["calls"]):
            if ca.get("exc") != cb.get("exc"):
                return False
            try:
                if not _same(codec.decode(ca.get("result")), codec.decode(cb.get("result")),
                             atol, rtol):
                    return False
                ma = [(w, codec.decode(v)) for w, v in ca.get("mut") or []]
                mb = [(w, codec.decode(v)) for w, v in cb.get("mut") or []]
            except Exception:                              # noqa: BLE001
                return False
            if [w for w, _ in ma] != [w for w, _ in mb]:
                return False
            if not all(_same(x, y, atol, rtol) for (_, x), (_, y) in zip(ma, mb)):
                return False
    return True


def _same(x, y, atol, rtol) -> bool:
    import torch

    if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
        if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
            return False
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        if x.is_floating_point() or x.is_complex():
            return bool(torch.allclose(x.double(), y.double(), atol=atol, rtol=rtol,
                                       equal_nan=True))
        return bool(torch.equal(x, y))
    if isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)):
        return type(x) is type(y) and len(x) == len(y) and \
            all(_same(p, q, atol, rtol) for p, q in zip(x, y))
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(_same(x[k], y[k], atol, rtol) for k in x)
    if isinstance(x, float) and isinstance(y, float):
        return (x != x and y != y) or abs(x - y) <= atol + rtol * abs(y)
    if type(x).__name__ == "Opaque" and type(y).__name__ == "Opaque":
        return x.type_name == y.type_name
    return type(x) is type(y) and x == y


# ------------------------------------------------------------------ the catalogue
def catalogue(lab: str) -> list:
    """The injected-mistake rows of the lab: [(cell, edits, check cell, matcher)]."""
    lab = lab_cells.lab_name(lab)
    short = lab[:5]
    rows = []
    import test_mistakes_backward as backward
    import test_mistakes_forward as forward
    import test_mistakes_rest as rest

    for _, row_lab, cell, edits, check, words in forward.MISTAKES:
        if row_lab == lab:
            rows.append((cell, list(edits), check, _words(words)))
    for row_lab, _, cell, edits, check, words in backward.MISTAKES:
        if row_lab == lab:
            rows.append((cell, list(edits), check, _words(words)))
    for row_lab, cell, edits, check, pattern, _ in rest.MISTAKES:
        if row_lab == short:
            rows.append((f"{short}_{cell}", list(edits), f"{short}_{check}", _pattern(pattern)))
    return rows


def _words(words):
    return lambda message: all(w in message for w in words)


def _pattern(pattern):
    def matches(message):
        hint = message.split("\nHint: ", 1)[1] if "\nHint: " in message else ""
        return bool(re.search(pattern, hint))
    return matches


def hint_of(message: str) -> str:
    """The hint of a message, its numbers and spacing made uniform: two messages with the same
    hint name the same mistake."""
    if "Hint:" not in message:
        return ""
    hint = message.split("Hint:", 1)[1]
    return " ".join(re.sub(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?", "#", hint).split())


def classify_message(message: str) -> dict:
    hint = message.split("Hint:", 1)[1] if "Hint:" in message else None
    return {"named": hint is not None and not any(re.search(p, hint) for p in NOT_NAMING),
            "located": any(re.search(p, message) for p in LOCATING)}


# ------------------------------------------------------------------ one mutant, in a child
def _child(task, write, note=None):
    """Run in the forked process: play the notebook, then record what the verdict needs;
    ``note`` gets each visible check's outcome as it happens (kept if the process dies)."""
    import torch

    torch.set_num_threads(1)
    lab, cell, source, mode, extra = task
    if mode == "reference-record":
        outcome = play(lab)
        scope = outcome.pop("scope")
        write({"records": record_checks(lab, scope, extra["checks"], extra["seeds"]),
               "checks": outcome["checks"], "death": outcome["death"]})
        return
    if mode == "variant-record":           # a catalogue row applied to the reference
        outcome = play(lab, cell, source, until=extra["checks"][0])
        scope = outcome.pop("scope", None)
        failed = [c for c in outcome["checks"] if not c["passed"]]
        if scope is None or not failed or failed[-1]["cell"] != extra["checks"][0]:
            write({"records": None})
            return
        write({"records": record_checks(lab, scope, extra["checks"], extra["seeds"][:1]),
               "hint": hint_of(failed[-1]["message"])})
        return
    outcome = play(lab, cell, source, on_check=note)
    scope = outcome.pop("scope", None)
    result = dict(outcome)
    if scope is not None and not outcome["invalid"]:
        failed = [c for c in outcome["checks"] if not c["passed"]]
        if outcome["death"] and not failed:
            pass
        elif failed:
            if "Hint:" in failed[0]["message"]:
                result["records"] = record_checks(lab, scope, [failed[0]["cell"]],
                                                  extra["seeds"][:1])
        else:
            result["records"] = record_checks(lab, scope, extra["checks_after"](cell),
                                              extra["seeds"])
    write(result)


class Child:
    """One forked process running ``task`` (see :func:`_child`), with a time limit."""

    def __init__(self, task, limit):
        import pickle

        self.pickle = pickle
        read_fd, write_fd = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:                                        # the child
            os.close(read_fd)
            code = 0
            try:
                def frame(kind, obj):
                    data = pickle.dumps((kind, obj))
                    os.write(write_fd, len(data).to_bytes(8, "little"))
                    view = memoryview(data)
                    while view:
                        view = view[os.write(write_fd, view):]

                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, 1)
                os.dup2(devnull, 2)
                _child(task, lambda obj: frame("result", obj), lambda c: frame("check", c))
                os.close(write_fd)
            except BaseException:                           # noqa: BLE001
                code = 3
            os._exit(code)
        os.close(write_fd)
        self.pid, self.fd, self.chunks = pid, read_fd, []
        self.deadline = time.monotonic() + limit
        self.result = None
        self.checks = []

    def poll(self, wait=0.0):
        """None while running; else (status, result)."""
        import select

        if self.result is not None:
            return self.result
        left = self.deadline - time.monotonic()
        if left <= 0:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
            os.close(self.fd)
            self.result = ("timeout", None)
            return self.result
        ready, _, _ = select.select([self.fd], [], [], max(0.0, min(left, wait)))
        if not ready:
            return None
        chunk = os.read(self.fd, 1 << 20)
        if chunk:
            self.chunks.append(chunk)
            return None
        os.close(self.fd)
        _, wait_status = os.waitpid(self.pid, 0)
        frames, data = [], b"".join(self.chunks)
        while len(data) >= 8:
            size = int.from_bytes(data[:8], "little")
            if len(data) < 8 + size:
                break
            frames.append(self.pickle.loads(data[8:8 + size]))
            data = data[8 + size:]
        self.checks = [obj for kind, obj in frames if kind == "check"]
        results = [obj for kind, obj in frames if kind == "result"]
        if os.WIFSIGNALED(wait_status):
            self.result = (f"signal {signal.Signals(os.WTERMSIG(wait_status)).name}", None)
        elif os.WEXITSTATUS(wait_status) != 0 or not results:
            self.result = (f"exit {os.WEXITSTATUS(wait_status)}", None)
        else:
            self.result = ("ok", results[-1])
        return self.result

    def wait(self):
        while True:
            done = self.poll(wait=1.0)
            if done is not None:
                return done


def run_forked(task, limit):
    """Run ``task`` in a forked process and wait: (status, result)."""
    return Child(task, limit).wait()


# ------------------------------------------------------------------ a lab
def check_cells(lab):
    return [c.grade_id for c in lab_cells.cells(lab)
            if c.kind == "code" and c.graded and not c.solution]


def checks_after(lab):
    order = [c.grade_id for c in lab_cells.cells(lab)]
    checks = check_cells(lab)

    def after(cell):
        start = order.index(cell)
        return [g for g in checks if order.index(g) > start]
    return after


def verdict(result, status, reference, rows_records, mutant, lab, rows, checks_seen=None):
    """The entry of one mutant in the results file."""
    entry = {"id": mutant.id, "cell": mutant.cell, "kind": mutant.kind, "line": mutant.line,
             "before": _short(mutant.before, 80), "after": _short(mutant.after, 80)}
    if status == "timeout":
        entry["outcome"] = "timeout"
        return entry
    if status != "ok":
        # the visible checks that ran before the process died
        result = {"checks": list(checks_seen or []), "death": f"the process died ({status})",
                  "invalid": None}
    if result["invalid"]:
        entry.update(outcome="invalid", error=result["invalid"])
        return entry
    failed = [c for c in result["checks"] if not c["passed"]]
    if failed:
        first = failed[0]
        entry.update(killed=True, check=first["cell"], message=first["message"][:1500],
                     **classify_message(first["message"]))
        if "Hint:" in first["message"]:
            # the catalogue rows that name this mistake: same check, the row's words in the
            # message, and the row's own message carries the same hint
            hint = hint_of(first["message"])
            mine = result.get("records") or {}
            matching = []
            for i, (_, _, check, matches) in enumerate(rows):
                if check == first["cell"] and matches(first["message"]):
                    theirs = rows_records(i)
                    if theirs is not None and theirs["hint"] == hint:
                        matching.append(theirs["records"])
            if not matching or not mine:
                entry["hint"] = "unverified"
            else:
                confirmed = any(same_records(mine, {k: theirs[k] for k in mine})
                                for theirs in matching if set(mine) <= set(theirs))
                entry["hint"] = "confirmed" if confirmed else "wrong"
                if not confirmed:
                    entry["hinted_rows"] = [rows[i][0] for i, (_, _, check, matches)
                                            in enumerate(rows) if check == first["cell"]
                                            and matches(first["message"])]
    if result["death"]:
        entry.update(outcome="death", death=result["death"])
        return entry
    if failed:
        entry["outcome"] = "killed"
        return entry
    mine = result.get("records") or {}
    theirs = {k: v for k, v in reference.items() if k in mine}
    entry["outcome"] = "equivalent" if mine and same_records(mine, theirs) else "survived"
    return entry


def run_lab(lab, seed, equiv_seeds, budget=None, only=None, log=print, jobs=2):
    lab = lab_cells.lab_name(lab)
    short = lab[:5]
    seeds = [seed * 1000 + i for i in range(equiv_seeds)]
    checks = check_cells(lab)
    limit = TIME_LIMIT.get(short, DEFAULT_TIME_LIMIT)
    t0 = time.perf_counter()
    status, ref = run_forked((lab, None, None, "reference-record",
                              {"checks": checks, "seeds": seeds}), limit * 3)
    if status != "ok":
        raise RuntimeError(f"{lab}: the reference did not run ({status})")
    bad = [c["cell"] for c in ref["checks"] if not c["passed"]]
    if bad or ref["death"]:
        raise RuntimeError(f"{lab}: the reference fails {bad} / {ref['death']}")
    everything = all_mutants(lab)
    chosen = sample(everything, budget or BUDGET.get(short, 30), seed)
    if only is not None:
        chosen = [m for m in everything if m.id in only]
    rows = catalogue(lab)
    cell_sources = {c.grade_id: c.source for c in lab_cells.cells(lab)}
    cache = {}

    def rows_records(i):
        if i not in cache:
            cell, edits, check, _ = rows[i]
            try:
                source = lab_cells.substitute(cell_sources[cell], edits)
            except AssertionError:
                cache[i] = None
                return None
            st, res = run_forked((lab, cell, source, "variant-record",
                                  {"checks": [check], "seeds": seeds}), limit)
            cache[i] = res if st == "ok" and res and res.get("records") else None
        return cache[i]

    after = checks_after(lab)
    entries = [None] * len(chosen)
    running = {}                      # index -> (Child, start time)
    pending = list(range(len(chosen)))
    done = 0
    while pending or running:
        while pending and len(running) < jobs:
            i = pending.pop(0)
            mutant = chosen[i]
            task = (lab, mutant.cell, mutant.source(cell_sources[mutant.cell]), "mutant",
                    {"seeds": seeds, "checks_after": after})
            running[i] = (Child(task, limit), time.perf_counter())
        for i, (child, started) in list(running.items()):
            finished = child.poll(wait=0.2)
            if finished is None:
                continue
            del running[i]
            status, result = finished
            mutant = chosen[i]
            entry = verdict(result, status, ref["records"], rows_records, mutant, lab, rows,
                            child.checks)
            entry["seconds"] = round(time.perf_counter() - started, 1)
            entries[i] = entry
            done += 1
            log(f"{short} {done}/{len(chosen)} {entry['outcome']:<10} "
                f"{entry.get('hint', ''):<10} {entry['seconds']:>5}s {mutant.id}")
    return {"lab": lab, "mutants_total": len(everything), "mutants_run": len(chosen),
            "totals": totals(entries), "mutants": entries,
            "seconds": round(time.perf_counter() - t0, 1)}


def rerun(lab, mutant_id, seed=24, equiv_seeds=2):
    """The entry of one mutant, run again as ``run_lab`` ran it (``tests/test_mutants.py``):
    the reference and the catalogue rows run only when its verdict needs them."""
    lab = lab_cells.lab_name(lab)
    seeds = [seed * 1000 + i for i in range(equiv_seeds)]
    limit = TIME_LIMIT.get(lab[:5], DEFAULT_TIME_LIMIT)
    found = [m for m in all_mutants(lab) if m.id == mutant_id]
    if not found:
        raise KeyError(f"{lab}: no mutant {mutant_id} (the solution changed since the results "
                       "were made: run scripts/mutate_labs.py again)")
    mutant = found[0]
    sources = {c.grade_id: c.source for c in lab_cells.cells(lab)}
    rows = catalogue(lab)
    cache = {}

    def rows_records(i):
        if i not in cache:
            cell, edits, check, _ = rows[i]
            try:
                source = lab_cells.substitute(sources[cell], edits)
            except AssertionError:
                cache[i] = None
                return None
            st, res = run_forked((lab, cell, source, "variant-record",
                                  {"checks": [check], "seeds": seeds}), limit)
            cache[i] = res if st == "ok" and res and res.get("records") else None
        return cache[i]

    child = Child((lab, mutant.cell, mutant.source(sources[mutant.cell]), "mutant",
                   {"seeds": seeds, "checks_after": checks_after(lab)}), limit)
    status, result = child.wait()
    reference = {}
    if status == "ok" and result and not result["death"] and not result["invalid"] and \
            all(c["passed"] for c in result["checks"]):
        st, ref = run_forked((lab, None, None, "reference-record",
                              {"checks": check_cells(lab), "seeds": seeds}), limit * 3)
        reference = ref["records"] if st == "ok" else {}
    return verdict(result, status, reference, rows_records, mutant, lab, rows, child.checks)


def totals(entries) -> dict:
    """Counts over the entries.  ``killed``: a visible check failed (whatever happened after);
    ``located``, ``named``, ``vague`` and the hint verdicts are about the first failing check's
    message of the killed ones; ``deaths``: the process died (``deaths_process``) or an
    exception escaped a cell (``deaths_exception``), killed or not."""
    count = {k: 0 for k in ("run", "invalid", "killed", "located", "named", "vague",
                            "hint_confirmed", "wrongly_hinted", "hint_unverified", "deaths",
                            "deaths_process", "deaths_exception", "timeouts", "equivalent",
                            "survived")}
    for e in entries:
        count["run"] += 1
        outcome = e["outcome"]
        if outcome == "invalid":
            count["invalid"] += 1
        elif outcome == "timeout":
            count["timeouts"] += 1
        elif outcome in ("equivalent", "survived"):
            count[outcome] += 1
        if outcome == "death":
            count["deaths"] += 1
            process = isinstance(e["death"], str)
            count["deaths_process" if process else "deaths_exception"] += 1
        if e.get("killed"):
            count["killed"] += 1
            count["located"] += bool(e.get("located"))
            count["named"] += bool(e.get("named"))
            count["vague"] += not (e.get("located") or e.get("named"))
            hint = e.get("hint")
            if hint:
                count[{"confirmed": "hint_confirmed", "wrong": "wrongly_hinted",
                       "unverified": "hint_unverified"}[hint]] += 1
    return count


def provenance(argv, seed, equiv_seeds=2) -> dict:
    """The course's provenance block (source_kernels.provenance), the CPU's side of the
    machine, the run's seeds, whether the labs' code (assignments, autograde, source_kernels)
    had uncommitted changes and whether kernels ran in Triton's interpreter."""
    from source_kernels.provenance import host, provenance as block
    try:
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--", "assignments",
                                     "autograde", "source_kernels"], cwd=REPO,
                                    capture_output=True, text=True).stdout.strip())
    except OSError:
        dirty = None
    return {**block("python scripts/mutate_labs.py " + " ".join(argv)), "host": host(),
            "uncommitted_changes_in_labs": dirty, "seed": seed, "equiv_seeds": equiv_seeds,
            "interpreter": os.environ.get("TRITON_INTERPRET") == "1"}


def commit_of(provenance: dict):
    """The commit a results file was made at: ``repository_commit`` in the course's block,
    ``commit`` in the files written before the tool used it."""
    return provenance.get("repository_commit") or provenance.get("commit")


def reclassify(path: Path, argv) -> None:
    """Classify the recorded first messages of a lab file's killed mutants again with today's
    ``LOCATING`` (a pattern added since the run), and recompute its totals.  A message is
    recorded cut at 1,500 characters, so a flag the run set on the whole message is kept: only
    a pattern that matches the recorded text can add one.  The file's provenance gains the
    command and date of the reclassification; the mutants' outcomes are the run's."""
    data = json.loads(path.read_text())
    for entry in data["mutants"]:
        if entry.get("killed"):
            entry["located"] = bool(entry.get("located")) or \
                classify_message(entry["message"])["located"]
    data["totals"] = totals(data["mutants"])
    data["provenance"]["reclassified"] = {
        "command": "python scripts/mutate_labs.py " + " ".join(argv),
        "date": provenance_date()}
    path.write_text(json.dumps(data, indent=1) + "\n")


def write_summary(out: Path) -> dict:
    labs = {}
    for path in sorted(out.glob("lab[0-9][0-9].json")):
        data = json.loads(path.read_text())
        labs[path.stem] = dict(data["totals"], mutants_total=data["mutants_total"],
                               commit=commit_of(data["provenance"]),
                               date=data["provenance"]["date"])
    keys = ["run", "killed", "located", "named", "vague", "wrongly_hinted", "hint_confirmed",
            "hint_unverified", "deaths", "deaths_process", "deaths_exception", "timeouts",
            "equivalent", "survived", "invalid"]
    all_ = {k: sum(v[k] for v in labs.values()) for k in keys}
    summary = {"labs": labs, "all": all_, "goal": {"wrongly_hinted": 0, "deaths": 0}}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    lines = ["# Mutation testing of the labs' visible checks", "",
             "Regenerate with `python scripts/mutate_labs.py` (see its docstring for what each "
             "column counts); goal: 0 wrongly hinted, 0 deaths.", "",
             "| lab | mutants | run | killed | located | named | vague | wrongly hinted | "
             "hint confirmed | hint unverified | deaths | process died | exception escaped | "
             "timeouts | equivalent | survived | invalid |",
             "|" + " --- |" * 17]
    for name, v in labs.items():
        lines.append(f"| {name} | {v['mutants_total']} | " +
                     " | ".join(str(v[k]) for k in keys) + " |")
    lines.append("| all | | " + " | ".join(str(all_[k]) for k in keys) + " |")
    lines += ["", "Where the notebooks died (the cell, and what escaped it or how the process "
              "ended), and which hints were wrong:", ""]
    for path in sorted(out.glob("lab[0-9][0-9].json")):
        entries = json.loads(path.read_text())["mutants"]
        deaths = {}
        for e in entries:
            if e["outcome"] == "death":
                d = e["death"]
                where = d if isinstance(d, str) else f"{d['cell']}: {d['type']}"
                deaths[where] = deaths.get(where, 0) + 1
        wrong = [f"`{e['id']}` in {e['check']}" for e in entries if e.get("hint") == "wrong"]
        if deaths or wrong:
            parts = [f"{n} x {w}" for w, n in sorted(deaths.items(), key=lambda kv: -kv[1])]
            lines.append(f"- {path.stem}: deaths: {'; '.join(parts) or 'none'}; wrongly "
                         f"hinted: {', '.join(wrong) or 'none'}")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    return summary


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--labs", nargs="*", default=LABS)
    parser.add_argument("--seed", type=int, default=24)
    parser.add_argument("--equiv-seeds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--jobs", type=int, default=2, help="mutants run at once")
    parser.add_argument("--list", metavar="LAB")
    parser.add_argument("--summary-only", action="store_true",
                        help="rewrite summary.json and summary.md from the lab files")
    parser.add_argument("--reclassify", action="store_true",
                        help="classify the recorded messages again (LOCATING changed), "
                             "then rewrite the summary; no mutant runs")
    args = parser.parse_args(argv)
    if args.reclassify:
        for path in sorted(args.out.glob("lab[0-9][0-9].json")):
            reclassify(path, argv)
        print(json.dumps(write_summary(args.out)["all"]))
        return 0
    if args.summary_only:
        print(json.dumps(write_summary(args.out)["all"]))
        return 0
    if args.list:
        for m in all_mutants(args.list):
            print(f"{m.id}  {_short(m.before, 50)!r} -> {_short(m.after, 50)!r}")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    started = provenance(argv, args.seed, args.equiv_seeds)      # the code the run runs
    for lab in args.labs:
        data = run_lab(lab, args.seed, args.equiv_seeds, jobs=args.jobs)
        data = {"provenance": dict(started, finished=provenance(argv, args.seed)["date"]),
                **data}
        path = args.out / f"{lab[:5]}.json"
        path.write_text(json.dumps(data, indent=1) + "\n")
        shown = path.resolve().relative_to(REPO) if path.resolve().is_relative_to(REPO) \
            else path.name
        print(f"{lab}: {data['totals']} ({data['seconds']} s) -> {shown}")
    summary = write_summary(args.out)
    print(json.dumps(summary["all"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
