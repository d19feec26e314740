"""The similarity check (autograde/runner/similarity.py) on its corpus, tests/fixtures/similarity:

- every answer of the corpus, honest or copied, is correct: it passes the lab's own visible
  and hidden checks (run in-process after the lab's setup and given cells, the answer in
  place of the solution's cell);
- with the calibrated thresholds (results/similarity_calibration.json) none of the honest
  answers is listed and every copy is, for the reason it copies;
- the committed calibration is what ``python -m autograde.runner.similarity --calibrate`` computes
  from the corpus now;
- the normalisation sees through renaming, swapped operands, respelled calls and ``+=``;
  what the notebook prescribes is discounted; the report's page escapes student text.
"""
from __future__ import annotations

import copy
import json
import linecache
import sys
import types
from pathlib import Path

import nbformat
import pytest

import source_kernels  # noqa: F401  (the interpreter switch, before any kernel is defined)
from autograde.runner import similarity
from autograde.config import AutogradeSettings

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "tests" / "fixtures" / "similarity"
ASSIGNMENTS = REPO / "assignments"
CALIBRATION = REPO / "results" / "similarity_calibration.json"

ANSWERS = [(lab.name, cell.name, f.stem)
           for lab in sorted(CORPUS.iterdir()) if lab.is_dir()
           for cell in sorted(lab.iterdir()) if cell.is_dir()
           for f in sorted(cell.glob("*.py"))]


def _source_nb(lab):
    return nbformat.read(ASSIGNMENTS / lab / f"{lab}.ipynb", as_version=4)


def _exec(source, name, scope):
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    exec(compile(source, name, "exec"), scope)                           # noqa: S102


def _checks_of(nb, gid):
    """The graded cells between answer cell ``gid`` and the next answer cell."""
    out, inside = [], False
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type != "code":
            continue
        if meta.get("solution"):
            inside = meta.get("grade_id") == gid
        elif inside and meta.get("grade"):
            out.append((meta["grade_id"], cell.source))
    return out


def _given(meta, source):
    if meta.get("grade_id", "").endswith("_setup") or meta.get("solution"):
        return True
    try:
        import ast
        return any(isinstance(n, ast.FunctionDef) for n in ast.parse(source).body)
    except SyntaxError:
        return False


@pytest.mark.slow                       # every answer through its lab's checks: minutes
@pytest.mark.parametrize("lab, gid, name", ANSWERS, ids=["/".join(a) for a in ANSWERS])
def test_every_corpus_answer_passes_the_labs_checks(lab, gid, name):
    answer = (CORPUS / lab / gid / f"{name}.py").read_text()
    nb = _source_nb(lab)
    module = types.ModuleType(f"corpus_{lab}_{gid}_{name}")
    sys.modules[module.__name__] = module
    try:
        for index, cell in enumerate(nb.cells):
            meta = cell.metadata.get("nbgrader", {})
            if cell.cell_type != "code" or meta.get("grade") or not _given(meta, cell.source):
                continue
            text = answer if meta.get("grade_id") == gid else cell.source
            _exec(text, f"<corpus {lab} {gid} {name} cell {index}>", module.__dict__)
        checks = _checks_of(nb, gid)
        assert any("BEGIN HIDDEN TESTS" in src for _, src in checks), checks
        for check_id, src in checks:
            _exec(src, f"<corpus {lab} {check_id}>", module.__dict__)
    finally:
        sys.modules.pop(module.__name__, None)


def _listed(lab):
    """{student: [reasons]} of the corpus of ``lab`` under the committed calibration."""
    calibration = json.loads(CALIBRATION.read_text())
    source = _source_nb(lab)
    settings = AutogradeSettings()
    sources = similarity._Sources(settings, {lab: source}, {lab: similarity.released(source)})
    corpus = similarity.corpus_answers(str(CORPUS / lab))
    submissions = {s: {lab: nb} for s, nb in similarity._corpus_class(source, corpus).items()}
    flags, record = similarity.compare(settings, sources, submissions, calibration=calibration)
    return corpus, flags, record


LABS = sorted(p.name for p in CORPUS.iterdir() if p.is_dir())


# Cells where no threshold lists every copy and no honest answer (the calibration's
# "separated": false): the threshold sits above the honest answers and the copies it misses
# are named in results/similarity_calibration.json.  None: lab 05's kernel, which the notebook
# prescribes step by step, is separated since the modules carry the helpers they import and
# two students are compared only on answers that hold something beyond the course's code.
NOT_SEPARATED = set()


@pytest.mark.parametrize("lab", LABS)
def test_calibrated_thresholds_list_the_copies_and_no_honest_answer(lab):
    calibration = json.loads(CALIBRATION.read_text())["labs"][lab]["cells"]
    corpus, flags, record = _listed(lab)
    for gid, answers in corpus.items():
        honest = [n for n, (_, origin) in answers.items() if origin is None]
        copies = {n: origin for n, (_, origin) in answers.items() if origin is not None}
        missed = set(calibration[gid]["copies_not_listed"])
        assert len(honest) >= 5, f"{gid}: {len(honest)} honest answers"
        for name in honest:
            assert f"{gid}:{name}" not in flags, (gid, name, flags.get(f"{gid}:{name}"))
        for name, origin in copies.items():
            reasons = flags.get(f"{gid}:{name}", [])
            if origin == "solution":
                want = "to the lab's solution"
            elif origin.startswith("student "):
                want = f"to student {gid}:{origin.split()[1]}'s answer"
            else:
                want = f"to {origin}"
            if name in missed:
                assert not any(want in r for r in reasons), (gid, name, reasons)
            else:
                assert any(want in r for r in reasons), (gid, name, want, reasons)
    # the listed pairs come first in the record, ranked by how far above the class they are
    listed = [r for r in record if r["listed"]]
    assert record[:len(listed)] == listed
    zs = [r["z"] for r in listed if r["z"] is not None]
    assert zs == sorted(zs, reverse=True)


def test_the_committed_calibration_is_what_the_corpus_gives_now():
    committed = json.loads(CALIBRATION.read_text())
    assert set(committed["provenance"]) >= {"command", "commit", "date"}
    settings = AutogradeSettings()
    assert committed["measure"] == {"kgram": settings.similarity_kgram,
                                    "window": similarity.WINDOW,
                                    "min_fingerprints": similarity.MIN_FINGERPRINTS,
                                    "prescribed_share": similarity.PRESCRIBED_SHARE}
    now = similarity.calibrate(str(CORPUS), str(ASSIGNMENTS), settings)
    assert now == committed["labs"]
    apart = set()
    for lab, entry in now.items():
        for gid, cell in entry["cells"].items():
            assert cell["honest_max"] < (cell["threshold"] or entry["lab_threshold"]), cell
            if not cell["copies"]:
                continue
            if cell["separated"]:
                assert cell["threshold"] <= cell["copy_min"] and not cell["copies_not_listed"]
            else:
                apart.add((lab, gid))
                assert cell["copies_not_listed"], (lab, gid)
    assert apart == NOT_SEPARATED


def test_normalisation_sees_through_renaming_operand_order_and_respelled_calls():
    units = similarity.units
    a = ("def f(x, y):\n    s = torch.floor(x) + y  # sum\n    s += 1\n"
         "    if s > 0 and y != 2:\n        return s * x * 2.5\n")
    b = ("def g(p, q):\n    '''doc'''\n    total = q + p.floor()\n    total = total + 1.0\n"
         "    if q != 2 and 0 < total:\n        return 2.5 * (p * total)\n")
    assert [similarity.plain(t) for _, t in units(a)] == [similarity.plain(t) for _, t in units(b)]
    # what is not the same stays apart: another function, another attribute, another order
    # of a subtraction
    def one(code):
        return similarity.plain(units(code)[0][1])
    assert one("x = torch.ones(3)\n") != one("x = torch.zeros(3)\n")
    assert one("y = a.shape\n") != one("y = a.dtype\n")
    # (every name is V, so "a - b" and "b - a" are one statement: the order of a subtraction
    # of two names is not evidence)
    assert one("z = a - 1\n") != one("z = 1 - a\n")
    assert one("z = tl.cast(a, tl.int64)\n") == one("z = a.to(tl.int64)\n")
    # lines are those of the source
    assert [lines for lines, _ in units(b)] == [(1, 1), (3, 3), (4, 4), (5, 5), (6, 6)]


def test_winnowing_keeps_a_fingerprint_of_every_window():
    hashes = [7, 3, 9, 3, 8, 1, 6, 6, 2]
    chosen = similarity.winnow(hashes, 4)
    for start in range(len(hashes) - 3):
        assert any(start <= i < start + 4 for i in chosen)
    assert chosen == [3, 5]           # the rightmost of the two 3s; 1 covers the rest
    assert similarity.winnow([5, 4], 4) == [1] and similarity.winnow([], 4) == []


def test_what_the_notebook_prescribes_is_not_the_students_own():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(
        "The offset is $((b S + s) M + m) D$; gather with "
        "`tl.load(value_ptr + row[:, None] + offs_d[None, :], mask=inside[:, None])`.")]
    prescribed = similarity.prescribed_by(nb)
    given = ("def f(value_ptr, b, s, m, S, M, D, row, offs_d, inside):\n"
             "    off = ((b * S + s) * M + m) * D\n"
             "    v = tl.load(value_ptr + row[:, None] + offs_d[None, :], mask=inside[:, None])\n"
             "    return v\n")
    own = ("def f(value_ptr, b, s, m, S, M, D, row, offs_d, inside):\n"
           "    off = tl.where(inside, (b * 7 - s) // M, m % D)\n"
           "    acc = tl.sum(tl.exp(value_ptr - off) * offs_d, axis=0)\n"
           "    return acc\n")
    k = AutogradeSettings().similarity_kgram
    header = 1        # the signature is the template's, not counted here
    assert len(similarity.fingerprints(similarity.units(given)[header:], k, prescribed)) == 0
    assert len(similarity.fingerprints(similarity.units(own)[header:], k, prescribed)) >= 2


def test_the_report_page_escapes_student_text_and_marks_the_shared_lines(tmp_path):
    hostile = "x = 1  # </pre><script>alert(1)</script>\x1b]0;owned\x07\ny = x + 2\n"
    record = [{"student": "<b>eve</b>", "source": "solution", "cell": "lab/cell",
               "similarity": 0.9, "threshold": 0.7, "class_median": 0.2, "z": 5.0,
               "listed": True, "lines": {"answer": [2], "other": [1]},
               "_texts": (hostile, "y = x + 2\n")}]
    page = similarity.render_html("lab\x1b[2J", record)
    assert "<script>" not in page and "<b>eve</b>" not in page and "\x1b" not in page
    assert "\x07" not in page
    assert "&lt;script&gt;" in page
    assert "<mark>y = x + 2</mark>" in page
    assert "default-src 'none'" in page
    settings = AutogradeSettings()
    path = similarity.write_report(str(tmp_path), settings, "lab\x1b[2J", {"<b>eve</b>": ["r"]},
                                   record)
    saved = json.loads(Path(path).read_text())
    assert "_texts" not in saved["comparisons"][0]
    assert (Path(path).parent / "similarity.html").read_text() == page


def test_a_short_answer_is_compared_too():
    """Answers with few statements of the student's own (lab 01's corners: under 8, the old
    minimum) are compared, and a shared one is listed."""
    lab = "lab01_the_spec"
    corpus, flags, _ = _listed(lab)
    answers = corpus["lab01_corner_weights"]
    template = similarity.answer_cells(similarity.released(_source_nb(lab)))[
        "lab01_corner_weights"]
    copies = [n for n, (_, origin) in answers.items() if origin is not None]
    for name in copies:
        assert len(similarity.own_units(answers[name][0], template)) < 12
        assert f"lab01_corner_weights:{name}" in flags, name


def test_thresholds_fall_back_where_the_calibration_holds_no_cell():
    """threshold_for falls back to similarity_threshold for a cell the calibration does not
    hold, and to the lab's highest threshold for an uncalibrated cell of a calibrated lab."""
    settings = AutogradeSettings()
    calibration = json.loads(CALIBRATION.read_text())
    assert similarity.threshold_for(settings, "no_such_lab", "x", calibration) == \
        settings.similarity_threshold
    lab = next(iter(calibration["labs"]))
    entry = calibration["labs"][lab]
    assert similarity.threshold_for(settings, lab, "no_such_cell", calibration) == \
        entry["lab_threshold"]
    other = copy.deepcopy(calibration)
    other["measure"]["kgram"] = settings.similarity_kgram + 1
    gid = next(iter(entry["cells"]))
    assert similarity.threshold_for(settings, lab, gid, other) == settings.similarity_threshold


def test_cells_the_course_does_not_know_are_not_compared():
    """A submission's notebook or answer cell renamed by the student (grade_id with escape
    codes, say) is not compared, so its name never reaches the report."""
    lab = "lab01_the_spec"
    source = _source_nb(lab)
    settings = AutogradeSettings()
    sources = similarity._Sources(settings, {lab: source}, {lab: similarity.released(source)})
    text = (CORPUS / lab / "lab01_msda_naive" / "copy_reference_pasted.py").read_text()
    forged = copy.deepcopy(similarity.released(source))
    for cell in forged.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "lab01_msda_naive":
            cell.source = text
            cell.metadata["nbgrader"]["grade_id"] = "x\x1b]0;owned\x07"
    plain = copy.deepcopy(forged)
    for cell in plain.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id", "").startswith("x\x1b"):
            cell.metadata["nbgrader"]["grade_id"] = "lab01_msda_naive"
    flags, _ = similarity.compare(settings, sources, {"a": {lab: forged},
                                                      "b": {"other\x1b[2J": plain},
                                                      "c": {lab: plain}})
    assert set(flags) == {"c"}, flags
    assert all("\x1b" not in r for r in flags["c"])


def test_a_module_is_compared_with_the_helpers_it_imports():
    """forward.py's kernel calls pixel_corners and corner_tile from sampling.py: a paste of
    the kernel with those helpers is measured against the module and its helpers together."""
    settings = AutogradeSettings()
    sources = similarity._Sources(settings, {}, {})
    forward = [m for m in sources.modules if m.label == "source_kernels/forward.py"]
    assert len(forward) == 1
    assert "def pixel_corners(" in forward[0].text and "def corner_tile(" in forward[0].text
    assert {"pixel_corners", "corner_tile"} <= {n for n, _, _ in forward[0].units_named}
    lab = "lab05_forward_correct"
    text = (CORPUS / lab / "lab05_kernel" / "copy_forward_pasted.py").read_text()
    source = _source_nb(lab)
    sources = similarity._Sources(settings, {lab: source}, {lab: similarity.released(source)})
    prints = set(sources.own(lab, "lab05_kernel", text))
    forward = [m for m in sources.modules if m.label == "source_kernels/forward.py"][0]
    alone = similarity.fingerprints(similarity.units(
        (REPO / "source_kernels" / "forward.py").read_text()), settings.similarity_kgram)
    with_helpers = len(prints & set(forward.prints)) / len(prints)
    without = len(prints & set(alone)) / len(prints)
    assert with_helpers > 0.9 and without < 0.75, (with_helpers, without)


def test_a_classmate_who_pasted_the_solution_does_not_list_an_honest_answer():
    """An honest kernel that follows lab 05's steps converges with the solution; the
    classmate who pasted the solution is listed against it, the honest student with no one."""
    lab = "lab05_forward_correct"
    source = _source_nb(lab)
    settings = AutogradeSettings()
    sources = similarity._Sources(settings, {lab: source}, {lab: similarity.released(source)})
    folder = CORPUS / lab / "lab05_kernel"
    corpus = {"lab05_kernel": {
        "copy_solution_rewritten": ((folder / "copy_solution_rewritten.py").read_text(),
                                    "solution"),
        "honest_per_level_sum": ((folder / "honest_per_level_sum.py").read_text(), None),
        "honest_2d_masks": ((folder / "honest_2d_masks.py").read_text(), None)}}
    submissions = {s: {lab: nb} for s, nb in similarity._corpus_class(source, corpus).items()}
    calibration = json.loads(CALIBRATION.read_text())
    flags, record = similarity.compare(settings, sources, submissions, calibration=calibration)
    assert set(flags) == {"lab05_kernel:copy_solution_rewritten"}, flags
    assert any("to the lab's solution" in r for r in flags["lab05_kernel:copy_solution_rewritten"])
    # without the rule, the pair with the pasted solution stands above the honest answer's
    # own similarity to the solution
    try:
        similarity.PAIRS_BEYOND_COURSE = False
        _, found = similarity._scores(sources, submissions)
    finally:
        similarity.PAIRS_BEYOND_COURSE = True
    pair = [e[5] for e in found if e[3] == "student" and
            {e[0], e[4]} == {"lab05_kernel:copy_solution_rewritten",
                             "lab05_kernel:honest_per_level_sum"}]
    own = [e[5] for e in found if e[3] == "solution" and
           e[0] == "lab05_kernel:honest_per_level_sum"]
    assert pair and own and pair[0] > own[0]
