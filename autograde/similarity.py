"""Similarity of students' answers to the course's code and to each other.

The chips and the reference are public by design, so nothing stops a student from pasting
their source into an answer cell; the solutions might leak; two students might hand in one
answer.  None of that changes a score: the report lists it, with status ``needs_review``, for
a person to look at.

What is compared: for every answer cell (an nbgrader ``solution`` cell, by ``grade_id``) only
what the student wrote, that is the cell minus what the released template cell already held.
It is compared with

- the same cell of the lab's source notebook (the solution), minus the template;
- every module of the course's packages (``AutogradeSettings.similarity_packages``: the
  chips, the reference, the operator's modules), one source file at a time;
- the same cell of every other submission of the lab (minus the template).

How: the code is parsed and normalised so that renaming, reordering and comments do not hide
a copy: docstrings and comments go, every identifier the student can choose (variables,
arguments, functions, classes, import aliases) becomes ``V`` or ``F``, string literals become
``S``; attribute names, keywords and numbers stay.  The normalised code is cut into tokens
and the tokens of every statement into overlapping k-grams (``similarity_kgram`` tokens;
grams never span two statements, so reordering statements changes none); the similarity of
an answer to a source is the share of the answer's k-grams found in the source (of the
smaller one, between two students).
What the student wrote is the answer's normalised statements minus those of the released
cell (a multiset difference), so code the template gives counts for no one.  Answers with
fewer than ``similarity_min_statements`` statements of the student's own are not compared:
short answers to small tasks (a three-line formula) are written alike by everyone.  A match at or above
``similarity_threshold`` is reported.
"""
from __future__ import annotations

import ast
import glob
import importlib.util
import io
import json
import os
import tokenize
import zlib

import nbformat

__all__ = ["normalise", "kgrams", "answer_cells", "class_flags", "write_report"]


class _Normaliser(ast.NodeTransformer):
    def _drop_docstrings(self, body):
        kept = [s for s in body if not (isinstance(s, ast.Expr) and
                                         isinstance(s.value, ast.Constant) and
                                         isinstance(s.value.value, str))]
        return kept or [ast.Pass()]

    def generic_visit(self, node):
        node = super().generic_visit(node)
        if hasattr(node, "body") and isinstance(getattr(node, "body"), list):
            node.body = self._drop_docstrings(node.body)
        return node

    def visit_Name(self, node):
        return ast.copy_location(ast.Name(id="V", ctx=node.ctx), node)

    def visit_arg(self, node):
        node = self.generic_visit(node)
        node.arg = "V"
        return node

    def visit_FunctionDef(self, node):
        node = self.generic_visit(node)
        node.name = "F"
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
        return node

    def visit_JoinedStr(self, node):
        return ast.copy_location(ast.Constant(value="S"), node)


def _without_magics(source):
    out = []
    for line in source.splitlines():
        stripped = line.lstrip()
        out.append("" if stripped.startswith(("%", "!")) else line)
    return "\n".join(out)


_SKIP = {tokenize.COMMENT, tokenize.NL, tokenize.ENCODING, tokenize.ENDMARKER}


def _tokens(text):
    try:
        return [t.string if t.type not in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
                else {tokenize.NEWLINE: ";", tokenize.INDENT: "{",
                      tokenize.DEDENT: "}"}[t.type]
                for t in tokenize.generate_tokens(io.StringIO(text).readline)
                if t.type not in _SKIP]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return text.split()


def normalise(source):
    """The normalised token list of a piece of Python (see the module docstring)."""
    text = _without_magics(source)
    try:
        tree = _Normaliser().visit(ast.parse(text))
        return _tokens(ast.unparse(tree))
    except (SyntaxError, ValueError, RecursionError):
        pass
    out = []
    for tok in _tokens(text):                     # code that does not parse: tokens only
        if tok.isidentifier() and tok not in _KEYWORDS:
            out.append("V")
        else:
            out.append(tok)
    return out


_KEYWORDS = set(__import__("keyword").kwlist)


def statements(tokens):
    """The normalised statements of a token list (a compound statement's header is one),
    each a tuple of tokens; statements of fewer than 4 tokens (``return V``, ``pass``) are
    left out."""
    out, segment = [], []
    for tok in list(tokens) + [";"]:
        if tok not in (";", "{", "}"):
            segment.append(tok)
            continue
        if len(segment) >= 4:
            out.append(tuple(segment))
        segment = []
    return out


def own_statements(source, template=None):
    """The statements of ``source`` that the template (the released cell) does not hold:
    what the student wrote."""
    mine = statements(normalise(source))
    if not template:
        return mine
    given = {}
    for st in statements(normalise(template)):
        given[st] = given.get(st, 0) + 1
    out = []
    for st in mine:
        if given.get(st):
            given[st] -= 1
        else:
            out.append(st)
    return out


def kgrams(stmts, k):
    """The set of hashed k-grams of a list of statements, taken inside each statement, so
    that reordering statements changes none; a statement of at most ``k`` tokens is one
    gram."""
    grams = set()
    for segment in stmts:
        if len(segment) <= k:
            grams.add(zlib.crc32("\x1f".join(segment).encode()))
        else:
            grams.update(zlib.crc32("\x1f".join(segment[i:i + k]).encode())
                         for i in range(len(segment) - k + 1))
    return grams


def _gid(cell):
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def answer_cells(nb):
    """{grade_id: source} of a notebook's answer (nbgrader solution) code cells."""
    out = {}
    for cell in nb.get("cells", []):
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.get("cell_type") == "code" and meta.get("solution") and meta.get("grade_id"):
            out[meta["grade_id"]] = cell.get("source", "")
    return out


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


def _units(text):
    """[(name, source)] of a module's top-level functions and classes (for naming what an
    answer matched)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    lines = text.splitlines()
    out = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            out.append((node.name, "\n".join(lines[start - 1:node.end_lineno])))
    return out


_MEMO = {}


def _load_cache(path):
    """k-grams of the course's modules, by file and modification time (in this process, and
    in ``path`` between commands)."""
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


class _Sources:
    """The course's side: k-grams of the packages' modules and of the lab's solutions."""

    def __init__(self, settings, source_notebooks, release_notebooks, packages=None,
                 cache=None):
        k = settings.similarity_kgram
        self.k = k
        packages = list(settings.similarity_packages if packages is None else packages)
        self.modules = []                   # (label, grams, [(unit, grams)])
        stored = _load_cache(cache)
        fresh = {}
        for path in _package_files(packages):
            try:
                info = os.stat(path)
            except OSError:
                continue
            key = f"{os.path.realpath(path)}:{info.st_mtime_ns}:{info.st_size}:{k}"
            if key not in stored:
                try:
                    with open(path, encoding="utf-8") as fh:
                        text = fh.read()
                except OSError:
                    continue
                stored[key] = [sorted(kgrams(statements(normalise(text)), k)),
                               [(name, sorted(kgrams(statements(normalise(src)), k)))
                                for name, src in _units(text)]]
            fresh[key] = stored[key]
            grams, units = stored[key]
            if grams:
                self.modules.append((_course_label(path, packages), set(grams),
                                     [(name, set(u)) for name, u in units]))
        _save_cache(cache, fresh)
        self.templates = {}                 # (notebook, gid) -> the released cell's source
        for name, nb in release_notebooks.items():
            self.templates.update({(name, gid): src for gid, src in answer_cells(nb).items()})
        self.solutions = {}                 # (notebook, gid) -> grams the solution adds
        for name, nb in source_notebooks.items():
            for gid, src in answer_cells(nb).items():
                self.solutions[(name, gid)] = kgrams(
                    own_statements(src, self.templates.get((name, gid))), k)


def _percent(x):
    return f"{100 * x:.0f} %"


def compare(settings, sources, submissions):
    """``submissions``: {student: {notebook: nb}}.  Returns ({student: [reasons]},
    [all comparisons above half the threshold, for the record])."""
    threshold = settings.similarity_threshold
    least = settings.similarity_min_statements
    k = sources.k
    written = {}                       # (notebook, gid) -> {student: grams}
    for student, notebooks in submissions.items():
        for name, nb in notebooks.items():
            for gid, src in answer_cells(nb).items():
                own = own_statements(src, sources.templates.get((name, gid)))
                grams = kgrams(own, k)
                if len(own) >= least and grams:
                    written.setdefault((name, gid), {})[student] = grams
    flags, record = {}, []

    def note(student, text):
        flags.setdefault(student, []).append(text)

    for (name, gid), answers in sorted(written.items()):
        solution = sources.solutions.get((name, gid), set())
        for student, grams in sorted(answers.items()):
            if solution:
                score = len(grams & solution) / len(grams)
                if score >= threshold / 2:
                    record.append({"student": student, "cell": f"{name}/{gid}",
                                   "source": "solution", "similarity": round(score, 3)})
                if score >= threshold:
                    note(student, f"{name}/{gid}: similarity {_percent(score)} to the lab's "
                                  f"solution (assignments/.../{name}.ipynb, cell {gid})")
            for label, module, units in sources.modules:
                shared = grams & module
                score = len(shared) / len(grams)
                if score >= threshold / 2:
                    record.append({"student": student, "cell": f"{name}/{gid}",
                                   "source": label, "similarity": round(score, 3)})
                if score >= threshold:
                    best = sorted(((len(shared & u), n) for n, u in units if shared & u),
                                  reverse=True)[:3]
                    what = ", ".join(n for _, n in best)
                    note(student, f"{name}/{gid}: similarity {_percent(score)} to {label}"
                                  + (f" ({what})" if what else ""))
        students = sorted(answers)
        for i, a in enumerate(students):
            for b in students[i + 1:]:
                ga, gb = answers[a], answers[b]
                score = len(ga & gb) / min(len(ga), len(gb))
                if score >= threshold / 2:
                    record.append({"student": a, "cell": f"{name}/{gid}", "source": b,
                                   "similarity": round(score, 3)})
                if score >= threshold:
                    note(a, f"{name}/{gid}: similarity {_percent(score)} to student {b}'s "
                            f"answer")
                    note(b, f"{name}/{gid}: similarity {_percent(score)} to student {a}'s "
                            f"answer")
    return flags, record


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


def write_report(root, settings, assignment, flags, record):
    """Keep the last check's result beside the ledger (similarity.json)."""
    path = os.path.join(root, settings.status_directory, assignment, "similarity.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as fh:
        json.dump({"threshold": settings.similarity_threshold,
                   "kgram": settings.similarity_kgram,
                   "min_statements": settings.similarity_min_statements,
                   "flags": flags, "comparisons": record}, fh, indent=1, sort_keys=True)
    os.replace(path + ".tmp", path)
    return path
