"""Similarity of students' answers to the course's code and to each other.

The chips and the reference are public by design, so nothing stops a student from pasting
their source into an answer cell; the solutions might leak; two students might hand in one
answer.  None of that changes a score: the report lists it, with status ``needs_review``, for
a person to look at.

What is compared: for every answer cell (an nbgrader ``solution`` cell, by ``grade_id``) only
what the student wrote, that is the cell minus what the released template cell already held
and minus what the notebook prescribes.  It is compared with

- the same cell of the lab's source notebook (the solution);
- every module of the course's packages (``AutogradeSettings.similarity_packages``: the
  chips, the reference, the operator's modules), one source file at a time, each with the
  ``@triton.jit`` functions it imports by name from another module of the course
  (``forward.py`` with the ``sampling.py`` helpers its kernel calls: a paste of the kernel and
  its helpers is compared with all of what it took);
- the same cell of every other submission of the lab, where both answers hold at least
  ``MIN_FINGERPRINTS`` fingerprints that no course code holds (``PAIRS_BEYOND_COURSE``): an
  answer made of little but what the solution or a module holds is compared with those, and
  is listed there if it took them; compared with its classmates as well, an honest answer
  that converges with a solution the notebook prescribes step by step would be listed as
  "similar to" the classmate who pasted that solution.

How the code is normalised (so that renaming, comments and respelling do not hide a copy):
the code is parsed; docstrings and comments go; a call through a module (``torch.floor(x)``,
``tl.floor(x)``, ``math.floor(x)``) and a method call (``x.floor()``) both become
``floor(x)``, and a few synonyms are one name (``tl.cast``/``.to``, ``reshape``/``view``);
``a += b`` becomes ``a = a + b``; every identifier the student can choose becomes ``V``
(builtins keep their names), string literals ``S``, numbers one spelling (``1`` and ``1.0``);
the operands of a chain of ``+ * & | ^`` and of ``and``/``or`` are sorted, ``==``/``!=``
operands too, and ``a > b`` becomes ``b < a``.  Each statement (a compound statement's header
is one) is a token list; statements anyone writes whatever the task (``V = V + V``,
``return V * V``) are left out.  The k-grams (``similarity_kgram`` tokens) run over the
statements one after another, as MOSS's do, so that a run of statements in the same order
counts and the same statements scattered count less; fingerprints are chosen from their
hashes by winnowing (Schleimer, Wilkerson and Aiken, SIGMOD 2003: the smallest hash of every
window of ``WINDOW`` consecutive k-grams).

What the notebook prescribes is discounted: the code of its given cells, every code fragment
of its markdown (fenced code, inline code, the formulas between ``$``, read as Python where
they can be) and of the answer cells' docstrings and comments (``((b * S + s) * M + m) * D``),
with every sub-expression of them, normalised the same way; an answer's token inside such a
run counts as prescribed, and a fingerprint whose k-gram is mostly prescribed tokens is
dropped.  What is left is "the student's own".  The similarity of an answer to a source is
the share of its own fingerprints found in the source (of the smaller side's, between two
students).  Short answers are compared too, from ``MIN_FINGERPRINTS`` own fingerprints on (a
cell whose whole answer the notebook prescribes has nothing of a student's own to compare).
A keyword in prose (``mode="bilinear"``) is read as the keyword argument it names.

Thresholds: per lab and per answer cell, calibrated on a corpus of independently written
correct answers and of copies (``tests/fixtures/similarity``; ``python -m autograde.runner.similarity
--calibrate tests/fixtures/similarity``, written to ``results/similarity_calibration.json``)
halfway between the highest honest similarity and the lowest copy's; where the two overlap,
just above the honest answers, the copies it misses named in the file.  A cell the
calibration does not hold uses its lab's highest threshold, a lab it does not hold
``similarity_threshold``.  A listed pair is ranked by how far it stands above the class's own
distribution of that cell's similarities (robust z: distance to the median in units of the
scaled median absolute deviation), and the report's page (``similarity.html`` beside
``similarity.json``) shows both sides with the overlapping lines highlighted; every text on it
is escaped and stripped of control characters.

Measured and left off (``FLOW_REACH``, ``IDIOM_MODULES``, ``CLASS_WEIGHTS``): names told
apart by how far back they were last used, fingerprints shared by several course modules
dropped as idioms, and fingerprints weighed by how few of the class hold them each lowered
the copies' scores as much as the honest answers' on the corpus, or made a threshold depend
on who else is in the class.
"""
from __future__ import annotations

import argparse
import ast
import builtins
import copy
import datetime
import glob
import html
import importlib.util
import io
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tokenize
import zlib

import nbformat

__all__ = ["normalise", "units", "own_units", "own_statements", "kgrams", "winnow",
           "fingerprints", "answer_cells", "class_flags", "write_report", "calibrate",
           "threshold_for"]

FLATTEN = True             # sort the operands of a chain a + b + c (else of each pair)
CLASS_WEIGHTS = False        # weigh fingerprints by how few of the class hold them
FLOW_REACH = 0              # statements a name's distance is told up to (0: names all V)
SPAN = True                 # k-grams across statements (MOSS); False: inside each one
WINDOW = 3                  # winnowing window, in k-grams
MIN_FINGERPRINTS = 4        # own fingerprints an answer needs to be compared at all
IDIOM_MODULES = 0           # a fingerprint in this many course modules is an idiom (0: off)
PAIRS_BEYOND_COURSE = True  # two students compared only if both hold fingerprints no course code holds
PRESCRIBED_SHARE = 0.5      # a k-gram with more than this share of prescribed tokens is dropped
CALIBRATION = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))),
                           "results", "similarity_calibration.json")

_MODULES = {"torch", "tl", "triton", "math", "np", "numpy", "F", "itertools", "functools",
            "operator", "nn"}
_BUILTINS = set(dir(builtins))
_KEYWORDS = set(__import__("keyword").kwlist)
_COMMUTATIVE = (ast.Add, ast.Mult, ast.BitAnd, ast.BitOr, ast.BitXor)
_FLIP = {ast.Gt: ast.Lt, ast.GtE: ast.LtE}
_KEEP = "\u0192"            # prefix of a name that stays (a call's function, a builtin)
_NAMED = "V\u01c2"         # prefix of a chosen name (V, then the name)


# ---------------------------------------------------------------------- normalisation
def _is_module(node):
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name) and node.id in _MODULES


_SYNONYMS = {"cast": "to", "type": "to", "reshape": "view", "flatten": "view",
             "new_zeros": "zeros", "zeros_like": "zeros", "add": "__add__", "mul": "__mul__",
             "multiply": "__mul__", "sub": "__sub__", "subtract": "__sub__"}


class _Calls(ast.NodeTransformer):
    """Module calls and method calls in one form; ``a op= b`` as ``a = a op b``; docstrings
    and bare strings out."""

    def visit_Call(self, node):
        self.generic_visit(node)
        func = node.func
        if isinstance(func, ast.Attribute):
            if not _is_module(func.value):
                node.args = [func.value] + node.args
            name = _SYNONYMS.get(func.attr, func.attr)
            node.func = ast.copy_location(ast.Name(id=_KEEP + name, ctx=ast.Load()), func)
        elif isinstance(func, ast.Name) and func.id in _BUILTINS:
            node.func = ast.copy_location(ast.Name(id=_KEEP + func.id, ctx=ast.Load()), func)
        node.keywords = sorted(node.keywords, key=lambda k: k.arg or "")
        return node

    def visit_AugAssign(self, node):
        self.generic_visit(node)
        target = copy.deepcopy(node.target)
        for sub in ast.walk(target):
            if hasattr(sub, "ctx"):
                sub.ctx = ast.Load()
        value = ast.BinOp(left=target, op=node.op, right=node.value)
        return ast.copy_location(ast.Assign(targets=[node.target], value=value), node)

    def generic_visit(self, node):
        node = super().generic_visit(node)
        for field in ("body", "orelse", "finalbody"):
            body = getattr(node, field, None)
            if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
                kept = [s for s in body if not (isinstance(s, ast.Expr) and
                                                isinstance(s.value, ast.Constant) and
                                                isinstance(s.value.value, str))]
                setattr(node, field, kept or [ast.Pass()])
        return node


class _Names(ast.NodeTransformer):
    """Every name the student chooses becomes V; strings S; numbers one spelling."""

    def visit_Name(self, node):
        if node.id.startswith(_KEEP):
            return node
        keep = node.id in _BUILTINS and node.id not in ("id", "input", "type", "len") or \
            node.id in ("True", "False", "None")
        return ast.copy_location(ast.Name(id=node.id if keep else _NAMED + node.id,
                                          ctx=node.ctx), node)

    def visit_arg(self, node):
        node = self.generic_visit(node)
        node.arg = _NAMED + node.arg
        node.annotation = None
        return node

    def visit_FunctionDef(self, node):
        node = self.generic_visit(node)
        node.name = "F"
        node.returns = None
        return node

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node):
        node = self.generic_visit(node)
        node.name = "F"
        return node

    def visit_alias(self, node):
        if node.asname:
            node.asname = "V"
        return node

    def visit_Global(self, node):
        node.names = ["V" for _ in node.names]
        return node

    visit_Nonlocal = visit_Global

    def visit_Constant(self, node):
        if isinstance(node.value, (str, bytes)):
            return ast.copy_location(ast.Constant(value="S"), node)
        if isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return ast.copy_location(ast.Constant(value=float(node.value)), node)
        return node

    def visit_JoinedStr(self, node):
        return ast.copy_location(ast.Constant(value="S"), node)


def _key(node):
    return re.sub(_NAMED + r"\w*", "V", ast.dump(node, annotate_fields=False,
                                                  include_attributes=False))


def plain(toks):
    """Tokens with every chosen name as V (the names are kept, as ``V\u01c2name``, only to
    follow which statement a name comes from, see :func:`fingerprints`)."""
    return tuple("V" if t.startswith(_NAMED) else t for t in toks)


class _Order(ast.NodeTransformer):
    """Canonical operand order (after the names are gone, so that it does not depend on
    them)."""

    def visit_BinOp(self, node):
        self.generic_visit(node)
        if isinstance(node.op, _COMMUTATIVE) and (FLATTEN or _key(node.right) < _key(node.left)):
            if not FLATTEN:
                node.left, node.right = node.right, node.left
                return node
            kind = type(node.op)
            operands = []

            def flatten(n):
                if isinstance(n, ast.BinOp) and type(n.op) is kind:
                    flatten(n.left)
                    flatten(n.right)
                else:
                    operands.append(n)
            flatten(node)
            operands.sort(key=_key)
            out = operands[0]
            for nxt in operands[1:]:
                out = ast.BinOp(left=out, op=kind(), right=nxt)
            return ast.copy_location(out, node)
        return node

    def visit_BoolOp(self, node):
        self.generic_visit(node)
        node.values = sorted(node.values, key=_key)
        return node

    def visit_Compare(self, node):
        self.generic_visit(node)
        if len(node.ops) != 1:
            return node
        op, left, right = node.ops[0], node.left, node.comparators[0]
        if type(op) in _FLIP:
            node.ops, node.left, node.comparators = [_FLIP[type(op)]()], right, [left]
        elif isinstance(op, (ast.Eq, ast.NotEq)) and _key(right) < _key(left):
            node.left, node.comparators = right, [left]
        return node


def _without_magics(source):
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line
                     for line in source.splitlines())


_SKIP = {tokenize.COMMENT, tokenize.NL, tokenize.ENCODING, tokenize.ENDMARKER,
         tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}


def _tokens(text):
    try:
        return [t.string for t in tokenize.generate_tokens(io.StringIO(text).readline)
                if t.type not in _SKIP]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return text.split()


def _tree(text):
    tree = ast.parse(text)
    for step in (_Calls(), _Names(), _Order()):
        tree = step.visit(tree)
    return ast.fix_missing_locations(tree)


def _header(node):
    """The first line of a compound statement, normalised: ``for V in range(V):``."""
    shell = copy.copy(node)
    for field in ("body", "orelse", "finalbody"):
        if isinstance(getattr(shell, field, None), list):
            setattr(shell, field, [ast.Pass()] if field == "body" else [])
    if hasattr(shell, "handlers"):
        shell.handlers = []
    if isinstance(shell, ast.Try):
        return ["try", ":"]
    text = ast.unparse(shell)
    lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("pass")]
    return _tokens("\n".join(line for line in lines if not line.startswith("@")) or text)


def _statements(body, out):
    for node in body:
        if not isinstance(node, ast.stmt):
            continue
        compound = any(isinstance(getattr(node, f, None), list) and getattr(node, f)
                       and isinstance(getattr(node, f)[0], ast.stmt)
                       for f in ("body", "orelse", "finalbody")) or hasattr(node, "handlers")
        if compound:
            toks = _header(node)
            if toks:
                out.append(((node.lineno, node.lineno), tuple(toks)))
            _statements(getattr(node, "body", []), out)
            for handler in getattr(node, "handlers", []):
                head = ast.unparse(ast.ExceptHandler(type=handler.type, name=None,
                                                     body=[ast.Pass()])).splitlines()[0]
                out.append(((handler.lineno, handler.lineno), tuple(_tokens(head))))
                _statements(handler.body, out)
            _statements(getattr(node, "orelse", []), out)
            _statements(getattr(node, "finalbody", []), out)
        else:
            toks = _tokens(ast.unparse(node))
            out.append(((node.lineno, node.end_lineno or node.lineno), tuple(toks)))
    return out


def units(source):
    """[((first line, last line), tokens)] of the normalised statements of a piece of Python
    (lines of ``source``, 1-based); statements of fewer than 3 tokens (``return V``,
    ``pass``) are left out.  Code that does not parse: one unit per line, identifiers V."""
    text = _without_magics(source)
    try:
        found = _statements(_tree(text).body, [])
    except (SyntaxError, ValueError, RecursionError, TypeError, AttributeError):
        found = []
        for i, line in enumerate(text.splitlines(), 1):
            toks = tuple(_NAMED + t if t.isidentifier() and t not in _KEYWORDS else t
                         for t in _tokens(line))
            found.append(((i, i), toks))
    return [(lines, toks) for lines, toks in found if len(toks) >= 3]


def normalise(source):
    """The normalised token list of a piece of Python, statements separated by ``;``."""
    out = []
    for _, toks in units(source):
        out += list(plain(toks)) + [";"]
    return out


def own_units(source, template=None):
    """The units of ``source`` that the template (the released cell) does not hold, as a
    multiset difference: what the student wrote."""
    mine = units(source)
    if not template:
        return mine
    given = {}
    for _, toks in units(template):
        given[plain(toks)] = given.get(plain(toks), 0) + 1
    out = []
    for lines, toks in mine:
        if given.get(plain(toks)):
            given[plain(toks)] -= 1
        else:
            out.append((lines, toks))
    return out


def own_statements(source, template=None):
    """The token tuples of :func:`own_units` (what the student wrote), without lines."""
    return [plain(toks) for _, toks in own_units(source, template)]


def kgrams(stmts, k):
    """The set of hashed k-grams of a list of statements (token tuples), all of them (no
    winnowing), never across two statements."""
    return {g[0] for g in _grams([((0, 0), tuple(s)) for s in stmts], k)}


def _hash(tokens):
    return zlib.crc32("\x1f".join(tokens).encode())


def _grams(unit_list, k):
    """[(hash, lines, start, length, statement index)] of the k-grams of every unit, in
    order; a unit of at most k tokens is one gram."""
    out = []
    for index, (lines, toks) in enumerate(unit_list):
        if len(toks) <= k:
            out.append((_hash(toks), lines, 0, len(toks), index))
        else:
            out += [(_hash(toks[i:i + k]), lines, i, k, index)
                    for i in range(len(toks) - k + 1)]
    return out


def winnow(hashes, window=WINDOW):
    """Indices chosen by robust winnowing: in every window of ``window`` consecutive hashes
    the smallest (the rightmost of equal ones), each index once; fewer hashes than a window:
    the smallest of them."""
    if not hashes:
        return []
    if window <= 1:
        return list(range(len(hashes)))
    chosen, last = [], -1
    for start in range(max(1, len(hashes) - window + 1)):
        part = hashes[start:start + window]
        low = min(part)
        pick = start + max(i for i, h in enumerate(part) if h == low)
        if pick != last:
            chosen.append(pick)
            last = pick
    return chosen


_GENERIC = {"V", "=", "+", "-", "*", "/", "//", "%", "(", ")", ",", "return", ".", "1.0",
            "0.0"}


def generic(toks):
    """A statement that anyone writes, whatever the task: a few names and operators and
    nothing else (``V = V + V``, ``return V * V``)."""
    return len(toks) <= 7 and all(t in _GENERIC for t in toks)


def _data_flow(unit_list):
    """Each chosen name as the number of statements back to where it last occurred (``V1``:
    the statement before, ``V0``: the same one, ``V*``: first use or further than
    ``FLOW_REACH``), as in Baker's parameterised matching: renaming changes nothing, but
    two statements that read the same way and use values from elsewhere no longer match.
    ``FLOW_REACH`` 0: every name is V."""
    if not FLOW_REACH:
        return [(lines, plain(toks)) for lines, toks in unit_list]
    last, out = {}, []
    for index, (lines, toks) in enumerate(unit_list):
        new = []
        for t in toks:
            if t.startswith(_NAMED):
                back = index - last[t] if t in last else None
                new.append("V*" if back is None or back > FLOW_REACH else f"V{back}")
                last[t] = index
            else:
                new.append(t)
        out.append((lines, tuple(new)))
    return out


def fingerprints(unit_list, k, prescribed=None, window=WINDOW):
    """{hash: set of (first, last) lines} of the winnowed fingerprints of ``unit_list``
    (generic statements left out), less those whose k-gram is mostly tokens of a prescribed
    run (``prescribed``: a :class:`Prescribed`).  With ``SPAN`` the k-grams run over the
    statements one after another (``;`` between two), as MOSS's do, so that a run of
    statements in the same order counts more than the same statements scattered."""
    unit_list = [u for u in unit_list if not generic(plain(u[1]))]
    covered = prescribed.cover(unit_list) if prescribed else None
    unit_list = _data_flow(unit_list)
    if not SPAN:
        grams = _grams(unit_list, k)
        marks_of = (lambda g: covered[g[4]][g[2]:g[2] + g[3]]) if covered is not None \
            else None
    else:
        toks, marks, lines_of = [], [], []
        for index, (lines, unit) in enumerate(unit_list):
            toks += list(unit) + [";"]
            unit_marks = covered[index] if covered is not None else [0] * len(unit)
            marks += list(unit_marks) + [unit_marks[-1] if unit_marks else 0]
            lines_of += [lines] * (len(unit) + 1)
        grams = []
        for i in range(max(1, len(toks) - k + 1)):
            part = toks[i:i + k]
            if not part:
                break
            first, last = lines_of[i][0], lines_of[min(i + k, len(toks)) - 1][1]
            grams.append((_hash(part), (first, max(first, last)), i, len(part), None))
        marks_of = (lambda g: marks[g[2]:g[2] + g[3]]) if covered is not None else None
    out = {}
    for i in winnow([g[0] for g in grams], window):
        gram = grams[i]
        if marks_of is not None and sum(marks_of(gram)) > PRESCRIBED_SHARE * gram[3]:
            continue
        out.setdefault(gram[0], set()).add(gram[1])
    return out


# ---------------------------------------------------------------------- what is prescribed
_OPERATOR = re.compile(r"[*+\-/%(\[<>=&|~]")
_CODE_CHARS = re.compile(r"[A-Za-z0-9_.*+\-/%()\[\], <>=&|~!]+")


def _latex_to_python(text):
    text = re.sub(r"\\(?:left|right|big|Big|,|;|!|quad)", " ", text)
    text = re.sub(r"\\lfloor(.*?)\\rfloor", r"floor(\1)", text)
    text = re.sub(r"\\lceil(.*?)\\rceil", r"ceil(\1)", text)
    text = re.sub(r"\\frac\{([^{}]*)\}\{([^{}]*)\}", r"((\1) / (\2))", text)
    text = text.replace(r"\cdot", "*").replace(r"\times", "*").replace(r"\le", "<=") \
        .replace(r"\ge", ">=").replace(r"\in", " in ")
    text = re.sub(r"_\{([^{}]*)\}", lambda m: "_" + re.sub(r"\W", "", m.group(1)), text)
    text = re.sub(r"\\(?:text|mathrm|operatorname)\{([^{}]*)\}", r"\1", text)
    text = text.replace("{", "(").replace("}", ")").replace("\\", " ")
    # implicit products: "(b S + s) M" is (b * S + s) * M
    return re.sub(r"([\w)])\s+(?=[A-Za-z_(])(?!(?:in|and|or|not|if|else|for)\b)", r"\1 * ",
                  text)


def _parses(text):
    for mode in ("exec", "eval"):
        try:
            tree = ast.parse(text, mode=mode)
        except (SyntaxError, ValueError):
            continue
        nodes = list(ast.walk(tree))
        return any(isinstance(n, (ast.BinOp, ast.Call, ast.Subscript, ast.Compare,
                                  ast.Assign, ast.AugAssign, ast.BoolOp, ast.UnaryOp))
                   for n in nodes)
    return False


def prose_fragments(text):
    """The pieces of prose that read as Python: inline code, formulas, and runs of words
    like ``((b * S + s) * M + m) * D`` inside a sentence."""
    out = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S):
        out.append(block)
    text = re.sub(r"```.*?```", " ", text, flags=re.S)
    for span in re.findall(r"`([^`\n]+)`", text):
        out.append(span)
    for formula in re.findall(r"\$\$?([^$]+)\$\$?", text):
        for part in re.split(r",|\\qquad|\\\\|&", formula):
            out.append(_latex_to_python(part))
    plain = re.sub(r"`[^`\n]*`|\$\$?[^$]*\$\$?", " ", text)
    for line in plain.splitlines():
        for segment in _CODE_CHARS.findall(line):
            words = segment.split()[:40]
            i = 0
            while i < len(words):
                for j in range(len(words), i, -1):
                    candidate = " ".join(words[i:j]).rstrip(".,")
                    if candidate and _OPERATOR.search(candidate) and _parses(candidate):
                        out.append(candidate)
                        i = j - 1
                        break
                i += 1
    return [f for f in out if f.strip()]


class Prescribed:
    """Token runs the notebook gives: a token of an answer inside one of them is not the
    student's own."""

    MIN_RUN = 3

    def __init__(self):
        self.runs = {}                  # first token -> [token runs]

    def add_text(self, text):
        for fragment in prose_fragments(text):
            self.add_code(fragment)
            self._add_keyword(fragment)

    def _add_keyword(self, fragment):
        """Prose's ``mode="bilinear"`` names a keyword argument of a call: its run is the
        keyword's (``mode = 'S'``), not an assignment's (``V = 'S'``)."""
        try:
            body = ast.parse(fragment.strip()).body
        except (SyntaxError, ValueError, RecursionError):
            return
        if len(body) == 1 and isinstance(body[0], ast.Assign) and \
                len(body[0].targets) == 1 and isinstance(body[0].targets[0], ast.Name):
            call = units(f"f({fragment.strip()})")
            if len(call) == 1:
                self._add(plain(call[0][1])[2:-1])

    def add_code(self, source):
        """A given piece of code: its statements, and every sub-expression of them (a
        prescribed ``b.to(tl.int64) * S`` covers an answer's ``b64 = b.to(tl.int64)``)."""
        for _, toks in units(source):
            self._add(plain(toks))
        try:
            tree = _tree(_without_magics(source))
        except (SyntaxError, ValueError, RecursionError, TypeError, AttributeError):
            return
        for node in ast.walk(tree):
            if isinstance(node, ast.expr) and not isinstance(node, (ast.Name, ast.Constant)):
                try:
                    self._add(plain(_tokens(ast.unparse(node))))
                except (ValueError, RecursionError):
                    pass

    def _add(self, toks):
        # a short run of names and operators (V * V) would cover any code: a run counts
        # from MIN_RUN tokens when it holds a call, an attribute or a number, else from 7
        if len(toks) >= self.MIN_RUN and (len(toks) >= 7 or
                                          not all(t in _GENERIC for t in toks)):
            self.runs.setdefault(toks[0], set()).add(tuple(toks))

    def cover(self, unit_list):
        """[[0 or 1 per token]] of each unit: 1 where a prescribed run lies."""
        out = []
        for _, toks in unit_list:
            toks = plain(toks)
            marks = [0] * len(toks)
            for i, tok in enumerate(toks):
                for run in self.runs.get(tok, ()):
                    if tuple(toks[i:i + len(run)]) == run:
                        for j in range(i, i + len(run)):
                            marks[j] = 1
            out.append(marks)
        return out


def _cell_text(cell):
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _docstrings_and_comments(source):
    out = []
    try:
        tree = ast.parse(_without_magics(source))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                out.append(node.value)
    except SyntaxError:
        pass
    out += re.findall(r"#(.*)", source)
    return "\n".join(out)


_PRESCRIBED = {}


def prescribed_by(notebook):
    """What a notebook (its source or its release) prescribes: its given code cells, the code
    fragments of its markdown, and of its answer cells' docstrings and comments."""
    if notebook is None:
        return Prescribed()
    key = zlib.crc32(json.dumps([[c.get("cell_type"), _cell_text(c)]
                                 for c in notebook.get("cells", [])]).encode())
    if key not in _PRESCRIBED:
        _PRESCRIBED[key] = _prescribed_by(notebook)
    return _PRESCRIBED[key]


def _prescribed_by(notebook):
    p = Prescribed()
    for cell in notebook.get("cells", []):
        text = _cell_text(cell)
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.get("cell_type") == "markdown":
            p.add_text(text)
        elif cell.get("cell_type") == "code" and meta.get("solution"):
            given = re.sub(r"### BEGIN SOLUTION.*?### END SOLUTION", "", text, flags=re.S)
            p.add_text(_docstrings_and_comments(given))
        elif cell.get("cell_type") == "code" and "### BEGIN HIDDEN TESTS" not in text:
            p.add_code(text)
            p.add_text(_docstrings_and_comments(text))
    return p


# ---------------------------------------------------------------------- notebooks, sources
def _gid(cell):
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def answer_cells(nb):
    """{grade_id: source} of a notebook's answer (nbgrader solution) code cells."""
    out = {}
    for cell in nb.get("cells", []):
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.get("cell_type") == "code" and meta.get("solution") and meta.get("grade_id"):
            out[meta["grade_id"]] = _cell_text(cell)
    return out


def released(source_nb):
    """A source notebook as nbgrader releases it: solutions replaced by the stub, hidden
    tests out (for the calibration, which has no release folder)."""
    nb = copy.deepcopy(source_nb)
    for cell in nb.cells:
        text = _cell_text(cell)
        text = re.sub(r"( *)### BEGIN SOLUTION.*?### END SOLUTION",
                      lambda m: f"{m.group(1)}# YOUR CODE HERE\n{m.group(1)}"
                                "raise NotImplementedError()", text, flags=re.S)
        cell.source = re.sub(r"### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS", "", text,
                             flags=re.S)
    return nb


def _read_notebook(path):
    try:
        return nbformat.read(path, as_version=4)
    except Exception:                                  # noqa: BLE001  (reported elsewhere)
        return None


def _package_files(packages):
    files = []
    for name in packages:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            continue
        if spec.submodule_search_locations:
            for folder in spec.submodule_search_locations:
                files += sorted(glob.glob(os.path.join(folder, "**", "*.py"), recursive=True))
        elif spec.origin and spec.origin.endswith(".py"):
            files.append(spec.origin)
    return files


def _course_label(path, packages):
    parts = os.path.realpath(path).split(os.sep)
    for i in range(len(parts) - 1, -1, -1):
        if parts[i] in {p.split(".")[0] for p in packages}:
            return "/".join(parts[i:])
    return os.path.basename(path)


def _top_units(text):
    """[(name, first line, last line)] of a module's top-level functions and classes."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    return [(node.name, min([node.lineno] + [d.lineno for d in node.decorator_list]),
             node.end_lineno)
            for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]


def _jitted(node):
    return any(re.search(r"\bjit\b", ast.unparse(d)) for d in node.decorator_list)


def _imported_definitions(path, text, files):
    """[(path, name, source)] of the ``@triton.jit`` functions that module ``path`` imports by
    name from another module of the course (``from .sampling import corner_tile``, ``from
    source_kernels.sampling import corner_tile``) and calls from a kernel of its own.  A
    kernel can call only jitted functions, so a kernel pasted into an answer carries the
    helpers it calls: forward.py's kernel is compared together with them, not with one half
    at a time.  (Host functions, and kernels that only host code launches, are sources of
    their own and are not repeated.)"""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    by_module = {}
    for f in files:
        parts = os.path.splitext(os.path.realpath(f))[0].split(os.sep)
        by_module.setdefault(parts[-1], []).append(f)
    called = {n.func.id for f in tree.body
              if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and _jitted(f)
              for n in ast.walk(f) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    here = os.path.dirname(os.path.realpath(path))
    out = []
    for node in tree.body:
        if not isinstance(node, ast.ImportFrom) or not node.module:
            continue
        leaf = node.module.split(".")[-1]
        candidates = [f for f in by_module.get(leaf, ())
                      if os.path.realpath(f) != os.path.realpath(path) and
                      (node.level == 0 or os.path.dirname(os.path.realpath(f)) == here)]
        if len(candidates) != 1:
            continue
        try:
            with open(candidates[0], encoding="utf-8") as fh:
                other = fh.read()
            defs = {n.name: n for n in ast.parse(other).body
                    if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and _jitted(n)}
        except (OSError, SyntaxError):
            continue
        lines = other.splitlines()
        for alias in node.names:
            d = defs.get(alias.name)
            if d is not None and (alias.asname or alias.name) in called:
                first = min([d.lineno] + [x.lineno for x in d.decorator_list])
                out.append((candidates[0], alias.name,
                            "\n".join(lines[first - 1:d.end_lineno])))
    return out


_MEMO = {}
_VERSION = 3                # of the cached fingerprints: bump when the normalisation changes


def _load_cache(path):
    stored = dict(_MEMO)
    if path:
        try:
            with open(path) as fh:
                stored.update(json.load(fh))
        except (OSError, ValueError):
            pass
    return stored


def _save_cache(path, entries):
    _MEMO.clear()
    _MEMO.update(entries)
    if not path:
        return
    try:
        with open(path) as fh:
            if json.load(fh).keys() == entries.keys():
                return
    except (OSError, ValueError):
        pass
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "w") as fh:
            json.dump(entries, fh)
        os.replace(path + ".tmp", path)
    except OSError:
        pass


class Source:
    """One thing answers are compared with: its label, its text and its fingerprints."""

    def __init__(self, label, text, prints, units_named=()):
        self.label, self.text, self.prints = label, text, prints
        self.units_named = list(units_named)        # [(name, first, last)]

    def names_of(self, hashes):
        """The top-level functions of a module that hold ``hashes`` (most first)."""
        count = {}
        for h in hashes:
            for first, last in self.prints.get(h, ()):
                for name, a, b in self.units_named:
                    if a <= first <= b:
                        count[name] = count.get(name, 0) + 1
        return [n for n, _ in sorted(count.items(), key=lambda kv: (-kv[1], kv[0]))][:3]


class _Sources:
    """The course's side: fingerprints of the packages' modules and of the lab's solutions,
    and what each notebook prescribes."""

    def __init__(self, settings, source_notebooks, release_notebooks, packages=None,
                 cache=None):
        k = settings.similarity_kgram
        self.k = k
        packages = list(settings.similarity_packages if packages is None else packages)
        self.modules = []
        stored = _load_cache(cache)
        fresh = {}
        files = _package_files(packages)
        for path in files:
            try:
                info = os.stat(path)
                with open(path, encoding="utf-8") as fh:
                    text = fh.read()
            except OSError:
                continue
            helpers = _imported_definitions(path, text, files)
            stamp = ""
            for other in sorted({h[0] for h in helpers}):
                try:
                    more = os.stat(other)
                except OSError:
                    continue
                stamp += f":{os.path.realpath(other)}:{more.st_mtime_ns}:{more.st_size}"
            for other, name, src in helpers:
                text += f"\n\n\n# {name}, from {_course_label(other, packages)}\n{src}\n"
            key = f"{_VERSION}:{os.path.realpath(path)}:{info.st_mtime_ns}:{info.st_size}:" \
                  f"{k}:{WINDOW}{stamp}"
            if key not in stored:
                stored[key] = [[h, sorted(lines)] for h, lines in
                               fingerprints(units(text), k).items()]
            fresh[key] = stored[key]
            prints = {h: {tuple(x) for x in lines} for h, lines in stored[key]}
            if prints:
                self.modules.append(Source(_course_label(path, packages), text, prints,
                                           _top_units(text)))
        _save_cache(cache, fresh)
        # the course's idioms: a fingerprint that several of its modules share is how the
        # course writes a thing everywhere (the chapters show these modules), not evidence
        # that an answer copied one of them
        seen = {}
        for module in self.modules:
            for h in module.prints:
                seen[h] = seen.get(h, 0) + 1
        self.idioms = {h for h, n in seen.items() if n >= IDIOM_MODULES} \
            if IDIOM_MODULES else set()
        self.templates = {}
        self.prescribed = {}
        for name, nb in release_notebooks.items():
            self.templates.update({(name, gid): src for gid, src in answer_cells(nb).items()})
        for name in set(source_notebooks) | set(release_notebooks):
            nb = source_notebooks.get(name) or release_notebooks.get(name)
            self.prescribed[name] = prescribed_by(
                released(nb) if name in source_notebooks else nb)
        self.solutions = {}
        for name, nb in source_notebooks.items():
            for gid, src in answer_cells(nb).items():
                own = own_units(src, self.templates.get((name, gid)))
                self.solutions[(name, gid)] = Source(
                    f"the lab's solution (assignments/.../{name}.ipynb, cell {gid})", src,
                    fingerprints(own, k))

    def own(self, name, gid, source):
        """The fingerprints of what the student wrote in cell ``gid``."""
        own = own_units(source, self.templates.get((name, gid)))
        prints = fingerprints(own, self.k, self.prescribed.get(name))
        return {h: lines for h, lines in prints.items() if h not in self.idioms}


# ---------------------------------------------------------------------- thresholds
_CALIBRATED = {}


def _calibration(path=CALIBRATION):
    if path not in _CALIBRATED:
        try:
            with open(path) as fh:
                _CALIBRATED[path] = json.load(fh)
        except (OSError, ValueError):
            _CALIBRATED[path] = {}
    return _CALIBRATED[path]


def threshold_for(settings, notebook, gid, calibration=None):
    """The threshold of cell ``gid`` of ``notebook``: the calibrated one when the calibration
    holds that cell and was made with these settings, else ``similarity_threshold``."""
    data = _calibration() if calibration is None else calibration
    measure = data.get("measure", {})
    if measure.get("kgram") == settings.similarity_kgram and \
            measure.get("window") == WINDOW and \
            measure.get("min_fingerprints") == MIN_FINGERPRINTS:
        lab = data.get("labs", {}).get(notebook, {})
        cell = lab.get("cells", {}).get(gid)
        if cell and cell.get("threshold") is not None:
            return float(cell["threshold"])
        if lab.get("lab_threshold") is not None:
            return float(lab["lab_threshold"])
    return float(settings.similarity_threshold)


def _percent(x):
    return f"{100 * x:.0f} %"


def _robust_z(score, scores):
    if len(scores) < 3:
        return None
    median = statistics.median(scores)
    spread = 1.4826 * statistics.median(abs(s - median) for s in scores)
    return (score - median) / max(spread, 0.02)


def _weights(answers, solution):
    """The weight of a fingerprint in one cell: log((N + 1) / n), n of the N documents (the
    class's answers and the solution) that hold it, as MOSS discounts what many programs
    share: what most of a class writes alike is convergence, what two share alone is
    evidence.  ``CLASS_WEIGHTS`` False: every fingerprint weighs 1."""
    if not CLASS_WEIGHTS:
        return lambda h: 1.0
    count = {}
    documents = [set(p) for _, p in answers.values()]
    if solution is not None and solution.prints:
        documents.append(set(solution.prints))
    for doc in documents:
        for h in doc:
            count[h] = count.get(h, 0) + 1
    n = len(documents)
    return lambda h: math.log((n + 1) / count.get(h, 1))


def _scores(sources, submissions):
    """({(notebook, gid): {student: (source, fingerprints)}}, [every comparison as (student,
    notebook, gid, kind, other, score, shared hashes)]), kind "solution", "module" (other: a
    :class:`Source`) or "student" (other: the other student)."""
    written = {}
    # only the lab's own answer cells: a notebook name or grade_id the course does not know
    # (the student chose it) is not compared, and never reaches a report
    known = set(sources.templates) | set(sources.solutions)
    for student, notebooks in submissions.items():
        for name, nb in notebooks.items():
            for gid, src in answer_cells(nb).items():
                if (name, gid) not in known:
                    continue
                prints = sources.own(name, gid, src)
                if len(prints) >= MIN_FINGERPRINTS:
                    written.setdefault((name, gid), {})[student] = (src, prints)
    found = []
    for (name, gid), answers in sorted(written.items()):
        solution = sources.solutions.get((name, gid))
        weight = _weights(answers, solution)
        total = {student: sum(weight(h) for h in prints)
                 for student, (_, prints) in answers.items()}
        for student, (src, prints) in sorted(answers.items()):
            mine = set(prints)
            if solution is not None and solution.prints:
                shared = mine & set(solution.prints)
                found.append((student, name, gid, "solution", solution,
                              sum(weight(h) for h in shared) / total[student], shared))
            for module in sources.modules:
                shared = mine & set(module.prints)
                if shared:
                    found.append((student, name, gid, "module", module,
                                  sum(weight(h) for h in shared) / total[student], shared))
        # two students are compared only when each of them wrote something beyond the
        # course's code (the solution and the course modules): an answer that holds almost
        # nothing else is compared with the course's code, where it is listed on its own if
        # it took it, and comparing it with classmates too would list an honest answer that
        # converges with the solution as "similar to" a classmate who pasted the solution
        course = set()
        if PAIRS_BEYOND_COURSE:
            if solution is not None:
                course |= set(solution.prints)
            for module in sources.modules:
                course |= set(module.prints)
        beyond = {student: len(set(prints) - course) for student, (_, prints) in answers.items()}
        students = sorted(answers)
        for i, a in enumerate(students):
            for b in students[i + 1:]:
                if min(beyond[a], beyond[b]) < MIN_FINGERPRINTS:
                    continue
                shared = set(answers[a][1]) & set(answers[b][1])
                found.append((a, name, gid, "student", b,
                              sum(weight(h) for h in shared) / min(total[a], total[b]),
                              shared))
    return written, found


def compare(settings, sources, submissions, calibration=None):
    """``submissions``: {student: {notebook: nb}}.  Returns ({student: [reasons], the
    farthest above the class first}, [every comparison at or above half its cell's
    threshold, listed pairs first, ranked]).  An entry carries ``listed``, the class's
    median for that cell, the pair's robust z and ``lines``, the overlapping lines of both
    sides."""
    written, found = _scores(sources, submissions)
    by_cell, best = {}, {}             # the class's own distribution of each cell
    for student, name, gid, kind, _, score, _ in found:
        if kind == "student":
            by_cell.setdefault((name, gid), []).append(score)
        else:
            key = (name, gid, student)
            best[key] = max(best.get(key, 0.0), score)
    for (name, gid, _), score in best.items():
        by_cell.setdefault((name, gid), []).append(score)
    flags, record = {}, []
    for student, name, gid, kind, other, score, shared in found:
        threshold = threshold_for(settings, name, gid, calibration)
        if not threshold or score < threshold / 2:
            continue
        scores = by_cell[(name, gid)]
        z = _robust_z(score, scores)
        src = written[(name, gid)][student][0]
        mine = written[(name, gid)][student][1]
        entry = {"student": student, "cell": f"{name}/{gid}",
                 "similarity": round(score, 3), "threshold": round(threshold, 3),
                 "class_median": round(statistics.median(scores), 3),
                 "z": None if z is None else round(z, 2), "listed": score >= threshold,
                 "lines": {"answer": _lines_of(mine, shared)}}
        if kind == "student":
            theirs = written[(name, gid)][other]
            entry["source"] = other
            entry["lines"]["other"] = _lines_of(theirs[1], shared)
            texts = (src, theirs[0])
        else:
            entry["source"] = "solution" if kind == "solution" else other.label
            entry["lines"]["other"] = _lines_of(other.prints, shared)
            texts = (src, other.text)
        entry["_texts"] = texts
        record.append(entry)
        if score < threshold:
            continue
        # a comma, not "; ": the report and the export join a submission's reasons with "; "
        rank = "" if z is None else \
            f", robust z {z:.1f} against the class (median {_percent(entry['class_median'])})"
        if kind == "solution":
            what = f"to {other.label}"
            _note(flags, student, z, f"{name}/{gid}: similarity {_percent(score)} {what}{rank}")
        elif kind == "module":
            names = other.names_of(shared)
            what = f"to {other.label}" + (f" ({', '.join(names)})" if names else "")
            _note(flags, student, z, f"{name}/{gid}: similarity {_percent(score)} {what}{rank}")
        else:
            _note(flags, student, z, f"{name}/{gid}: similarity {_percent(score)} to student "
                                     f"{clean(other)}'s answer{rank}")
            _note(flags, other, z, f"{name}/{gid}: similarity {_percent(score)} to student "
                                   f"{clean(student)}'s answer{rank}")
    record.sort(key=lambda r: (not r["listed"], -(r["z"] or 0), -r["similarity"]))
    return {s: [text for _, text in sorted(v, key=lambda zv: -zv[0])]
            for s, v in flags.items()}, record


def _note(flags, student, z, text):
    flags.setdefault(student, []).append((z if z is not None else 0.0, text))


def _lines_of(prints, hashes):
    lines = set()
    for h in hashes:
        for first, last in prints.get(h, ()):
            lines.update(range(first, last + 1))
    return sorted(lines)


# ---------------------------------------------------------------------- the class
def _notebooks_in(folder):
    out = {}
    if os.path.isdir(folder):
        for f in sorted(os.listdir(folder)):
            if f.endswith(".ipynb"):
                nb = _read_notebook(os.path.join(folder, f))
                if nb is not None:
                    out[os.path.splitext(f)[0]] = nb
    return out


def class_flags(root, settings, coursedir, assignment):
    """({student: [reasons]}, record) for every submission of ``assignment``; ({}, []) when
    the check is off (``similarity_threshold`` 0) or the lab has no release here."""
    if not settings.similarity_threshold:
        return {}, []
    release = _notebooks_in(coursedir.format_path(coursedir.release_directory, ".",
                                                  assignment))
    source = _notebooks_in(coursedir.format_path(coursedir.source_directory, ".", assignment))
    if not release and not source:
        return {}, []
    sources = _Sources(settings, source, release,
                       cache=os.path.join(root, settings.status_directory,
                                          ".similarity-modules.json"))
    submitted = coursedir.format_path(coursedir.submitted_directory, ".", ".")
    submissions = {}
    if os.path.isdir(submitted):
        for student in sorted(os.listdir(submitted)):
            folder = coursedir.format_path(coursedir.submitted_directory, student, assignment)
            notebooks = _notebooks_in(folder)
            if notebooks:
                submissions[student] = notebooks
    return compare(settings, sources, submissions)


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069]")


def clean(text):
    """Text without control characters (terminal escapes, bidirectional overrides)."""
    return _CONTROL.sub("\ufffd", str(text))


def _side(text, marked, title):
    rows = []
    for i, line in enumerate(text.splitlines(), 1):
        body = html.escape(clean(line), quote=True) or " "
        if i in marked:
            body = f"<mark>{body}</mark>"
        rows.append(f"<span class=n>{i:4d}</span> {body}")
    return (f"<div class=side><h3>{html.escape(clean(title))}</h3><pre>" + "\n".join(rows)
            + "</pre></div>")


def render_html(assignment, record):
    """The page of the listed pairs, ranked, with both sides' overlapping lines marked."""
    parts = ["<!DOCTYPE html><html><head><meta charset=utf-8>",
             "<meta http-equiv=Content-Security-Policy content=\"default-src 'none'; "
             "style-src 'unsafe-inline'\">",
             f"<title>similarity: {html.escape(clean(assignment))}</title>",
             "<style>body{font-family:sans-serif}.pair{display:flex;gap:1em}"
             ".side{flex:1;overflow:auto}pre{font-size:12px}mark{background:#fd6}"
             ".n{color:#888}</style></head><body>",
             f"<h1>Similarity check: {html.escape(clean(assignment))}</h1>",
             "<p>Listed pairs, the farthest above the class's own distribution first; the "
             "highlighted lines hold the shared fingerprints (what the notebook prescribes is "
             "not counted).</p>"]
    listed = [r for r in record if r.get("listed")]
    if not listed:
        parts.append("<p>No pair is listed.</p>")
    for r in listed:
        z = "" if r["z"] is None else f", robust z {r['z']:.1f} against the class (median " \
                                      f"{_percent(r['class_median'])})"
        head = (f"{r['cell']}: {r['student']} and {r['source']}: similarity "
                f"{_percent(r['similarity'])} (threshold {_percent(r['threshold'])}{z})")
        parts.append(f"<h2>{html.escape(clean(head))}</h2><div class=pair>")
        answer, other = r.get("_texts", ("", ""))
        parts.append(_side(answer, set(r["lines"]["answer"]), r["student"]))
        parts.append(_side(other, set(r["lines"]["other"]), r["source"]))
        parts.append("</div>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(root, settings, assignment, flags, record):
    """Keep the last check's result beside the ledger: similarity.json, and similarity.html
    (the listed pairs with their overlapping lines highlighted).  Returns the json's path."""
    folder = os.path.join(root, settings.status_directory, assignment)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "similarity.json")
    plain = [{k: v for k, v in r.items() if k != "_texts"} for r in record]
    with open(path + ".tmp", "w") as fh:
        json.dump({"threshold": settings.similarity_threshold,
                   "kgram": settings.similarity_kgram, "window": WINDOW,
                   "min_fingerprints": MIN_FINGERPRINTS,
                   "flags": flags, "comparisons": plain}, fh, indent=1, sort_keys=True)
    os.replace(path + ".tmp", path)
    page = os.path.join(folder, "similarity.html")
    with open(page + ".tmp", "w", encoding="utf-8") as fh:
        fh.write(render_html(assignment, record))
    os.replace(page + ".tmp", page)
    return path


# ---------------------------------------------------------------------- calibration
def corpus_answers(folder):
    """{grade_id: {name: (text, origin)}} of one lab's corpus folder: ``<gid>/honest_*.py``
    are independently written correct answers (origin None), ``<gid>/copy_*.py`` copies whose
    first line says what they copy: ``# copy of: solution``, ``# copy of:
    source_kernels/chips/lab05.py`` or ``# copy of: student copy_other``."""
    out = {}
    for gid in sorted(os.listdir(folder)):
        cell = os.path.join(folder, gid)
        if not os.path.isdir(cell):
            continue
        for f in sorted(os.listdir(cell)):
            if not f.endswith(".py") or not f.startswith(("honest_", "copy_")):
                continue
            with open(os.path.join(cell, f), encoding="utf-8") as fh:
                text = fh.read()
            origin = None
            if f.startswith("copy_"):
                first = text.splitlines()[0] if text else ""
                match = re.match(r"#\s*copy of:\s*(.+?)\s*$", first)
                if not match:
                    raise ValueError(f"{cell}/{f}: a copy names what it copies on its first "
                                     "line (# copy of: ...)")
                origin = match.group(1)
            out.setdefault(gid, {})[f[:-3]] = (text, origin)
    return out


def _corpus_class(source_nb, corpus):
    """{student: {notebook: nb}}: one submission per corpus answer, the release with that one
    cell answered (student ids ``<gid>:<name>``)."""
    release = released(source_nb)
    submissions = {}
    for gid, answers in corpus.items():
        for stem, (text, _) in answers.items():
            nb = copy.deepcopy(release)
            hit = [c for c in nb.cells if _gid(c) == gid and
                   c.get("metadata", {}).get("nbgrader", {}).get("solution")]
            if not hit:
                raise ValueError(f"no answer cell {gid}")
            hit[0].source = text
            submissions[f"{gid}:{stem}"] = nb
    return submissions


def lab_scores(settings, lab, source_nb, corpus):
    """{gid: {"honest": {name: best score}, "copies": {name: score against what it copies},
    "honest_pairs": [...]} of one lab's corpus under this measure."""
    release = released(source_nb)
    sources = _Sources(settings, {lab: source_nb}, {lab: release})
    submissions = {s: {lab: nb} for s, nb in _corpus_class(source_nb, corpus).items()}
    written, found = _scores(sources, submissions)
    out = {}
    for gid, answers in corpus.items():
        cell = out.setdefault(gid, {"honest": {}, "copies": {}, "compared": 0,
                                    "skipped": []})
        present = written.get((lab, gid), {})
        for stem, (_, origin) in answers.items():
            sid = f"{gid}:{stem}"
            if sid not in present:
                cell["skipped"].append(stem)
                if origin is not None:
                    cell["copies"][stem] = 0.0
                continue
            mine = [e for e in found if e[2] == gid and (e[0] == sid or
                                                          (e[3] == "student" and e[4] == sid))]
            if origin is None:
                cell["honest"][stem] = round(max([e[5] for e in mine], default=0.0), 4)
                continue
            score = 0.0
            for student, _, _, kind, other, value, _ in mine:
                if origin == "solution" and kind == "solution" or \
                        kind == "module" and other.label == origin or \
                        kind == "student" and origin.startswith("student ") and \
                        {student, other} == {sid, f"{gid}:{origin.split()[1]}"}:
                    score = max(score, value)
            cell["copies"][stem] = round(score, 4)
        cell["compared"] = len(present)
    return out


def calibrate(corpus_root, assignments, settings):
    """Per lab and cell: the honest answers' highest similarity, every copy's similarity to
    what it copies, and the threshold halfway between (None where they do not separate)."""
    labs = {}
    for lab in sorted(os.listdir(corpus_root)):
        folder = os.path.join(corpus_root, lab)
        nb_path = os.path.join(assignments, lab, f"{lab}.ipynb")
        if not os.path.isdir(folder) or not os.path.isfile(nb_path):
            continue
        scores = lab_scores(settings, lab, nbformat.read(nb_path, as_version=4),
                            corpus_answers(folder))
        cells = {}
        for gid, cell in scores.items():
            honest_max = max(cell["honest"].values(), default=0.0)
            copy_min = min(cell["copies"].values(), default=None)
            separated = copy_min is None or copy_min > honest_max
            if copy_min is None:
                threshold = None
            elif separated:
                threshold = round((honest_max + copy_min) / 2, 3)
            else:
                # no threshold lists every copy and no honest answer: list no honest one
                threshold = round(min(1.0, honest_max + 0.02), 3)
            missed = sorted(n for n, v in cell["copies"].items()
                            if threshold is None or v < threshold)
            cells[gid] = {"threshold": threshold, "separated": separated,
                          "copies_not_listed": missed,
                          "honest_max": honest_max, "copy_min": copy_min,
                          "honest": dict(sorted(cell["honest"].items())),
                          "copies": dict(sorted(cell["copies"].items())),
                          "not_compared": sorted(cell["skipped"])}
        chosen = [c["threshold"] for c in cells.values() if c["threshold"] is not None]
        labs[lab] = {"cells": cells, "lab_threshold": max(chosen) if chosen else None}
    return labs


def _git(*args):
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True,
                              cwd=os.path.dirname(os.path.dirname(CALIBRATION))).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m autograde.runner.similarity",
                                     description="Calibrate the similarity check's thresholds "
                                                 "on a corpus of honest answers and copies.")
    parser.add_argument("--calibrate", metavar="CORPUS", required=True,
                        help="the corpus folder: <lab>/<grade_id>/{honest,copy}_*.py")
    parser.add_argument("--assignments", default="assignments",
                        help="the nbgrader source folder (default: assignments)")
    parser.add_argument("--out", default=None, help="where to write the calibration "
                                                    "(default: results/similarity_calibration.json)")
    args = parser.parse_args(argv)
    from ..config import AutogradeSettings
    settings = AutogradeSettings()
    labs = calibrate(args.calibrate, args.assignments, settings)
    commit = _git("rev-parse", "HEAD")
    dirty = bool(_git("status", "--porcelain", "--", ".",
                      ":(exclude)results/similarity_calibration.json"))
    data = {"provenance": {
                "command": "python -m autograde.runner.similarity " + " ".join(
                    argv if argv is not None else sys.argv[1:]),
                "commit": commit, "uncommitted_changes": dirty,
                "date": datetime.datetime.now(datetime.timezone.utc).strftime(
                    "%Y-%m-%dT%H:%M:%SZ")},
            "measure": {"kgram": settings.similarity_kgram, "window": WINDOW,
                        "min_fingerprints": MIN_FINGERPRINTS,
                        "prescribed_share": PRESCRIBED_SHARE},
            "rule": "per cell: threshold halfway between the highest similarity of an honest "
                    "answer (to the solution, a course module or another answer) and the "
                    "lowest similarity of a copy to what it copies; where they do not "
                    "separate (separated false), just above the highest honest one, so that "
                    "no honest answer is listed, and the copies it misses are named "
                    "(copies_not_listed).  A cell without a threshold of its own uses the "
                    "lab's highest.",
            "labs": labs}
    out = args.out or CALIBRATION
    with open(out + ".tmp", "w") as fh:
        json.dump(data, fh, indent=1, sort_keys=False)
        fh.write("\n")
    os.replace(out + ".tmp", out)
    for lab, entry in labs.items():
        for gid, cell in entry["cells"].items():
            print(f"{lab}/{gid}: honest max {cell['honest_max']:.3f}, copies min "
                  f"{cell['copy_min'] if cell['copy_min'] is not None else '-'}, threshold "
                  f"{cell['threshold']} ({len(cell['honest'])} honest, {len(cell['copies'])} "
                  f"copies)")
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
