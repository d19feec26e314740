"""The feedback a student gets back, on a real lab: pending hand-grading, maths offline.

Lab 07 has three written answers (7 of its 16 points) and maths in its text.  The module
fixture takes one student, ``ada``, through nbgrader's own commands with the repository's
course configuration: ``generate_assignment``, ``release_assignment``; ada answers two of
the written questions (with maths) and codes one function in a copy of the release, and
submits; ``collect``, ``autograde``, ``generate_feedback``, ``release_feedback``; ada fetches
her feedback.

- ``test_feedback_says_pending_until_the_instructor_grades``: before hand-grading, the two
  answered questions read "pending: graded by hand" and the total leaves their 5 points out
  ("... so far, 5.0 points pending hand-grading"); the unanswered one is an automatic 0, not
  pending.  Manual scores set in the gradebook then show after ``generate_feedback``.
  The feedback after grading is generated the way the formgrader's button does it
  (nbgrader's ``NbGraderAPI``, in this process, which insists on nbgrader's own template):
  the course's page still comes out.
- ``test_fetched_feedback_typesets_its_maths_offline``: the page ada fetched, opened from
  disk in Debian's Chromium with every request off the page aborted and recorded: every
  formula is MathML that the browser lays out (no script runs), with no error and no request
  at all, and the page is under 300 KB.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from support import releases
from support.browser_helpers import Offline, chromium, require_chromium, screenshot_dir
from support.nbgrader_helpers import ASSIGNMENTS, make_course, read_scores, run_nbgrader

ROOT = Path(__file__).resolve().parents[1]
LAB = "lab07_the_other_direction"
STUDENT = "ada"
COURSE_ID = "msda-triton"                     # nbgrader_config.py's CourseDirectory.course_id
# two written answers, with maths; lab07_derivation_value is left as released (unanswered)
ANSWERS = {
    "lab07_derivation_attn": (
        "The output is $o = \\sum_{l,k} a_{lk}\\, s_{lk}$, linear in each weight, so "
        "$\\partial \\mathcal{L} / \\partial a_{lk} = g \\cdot s_{lk}$ with $g$ the output's "
        "gradient."),
    "lab07_derivation_loc": (
        "Only the bilinear weights move with $x_{im}$:\n\n"
        "$$\\frac{\\partial s}{\\partial x_{im}} = (1 - d_y)(v_{01} - v_{00}) "
        "+ d_y (v_{11} - v_{10}),$$\n\nthen the chain rule through $x_{im} = x W - 0.5$."),
}
PENDING = {"lab07_derivation_attn": 2.0, "lab07_derivation_loc": 3.0}
UNANSWERED = "lab07_derivation_value"
SOLVED = "lab07_grad_attn"                     # ada's code for this one is the source's


def _grade_id(cell):
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    base = tmp_path_factory.mktemp("feedback")
    course = make_course(base / "course", LAB)
    exchange = base / "exchange"
    exchange.mkdir()
    with open(course / "nbgrader_config.py", "a") as config:
        config.write(f"c.Exchange.root = {str(exchange)!r}\n")
    home = base / "home"
    home.mkdir()
    student = [f"--Exchange.root={exchange}", f"--Exchange.cache={base / 'cache'}",
               f"--CourseDirectory.course_id={COURSE_ID}", f"--student={STUDENT}"]

    releases.generate(course, LAB)
    run_nbgrader(course, "release_assignment", LAB)
    shutil.copytree(course / "release" / LAB, home / LAB)     # what fetch_assignment gives
    path = home / LAB / f"{LAB}.ipynb"
    nb = nbformat.read(path, as_version=4)
    source = {_grade_id(c): c for c in nbformat.read(ASSIGNMENTS / LAB / f"{LAB}.ipynb",
                                                     as_version=4).cells}
    for cell in nb.cells:
        if _grade_id(cell) in ANSWERS:
            cell.source = ANSWERS[_grade_id(cell)]
        elif _grade_id(cell) == SOLVED:
            cell.source = source[SOLVED].source
    nbformat.write(nb, path)
    run_nbgrader(home, "submit", LAB, *student)
    run_nbgrader(course, "collect", LAB)
    run_nbgrader(course, "autograde", LAB)
    run_nbgrader(course, "generate_feedback", LAB)
    run_nbgrader(course, "release_feedback", LAB)
    run_nbgrader(home, "fetch_feedback", LAB, *student)
    fetched = sorted((home / LAB / "feedback").glob(f"*/{LAB}.html"))
    assert len(fetched) == 1, fetched
    return {"course": course, "fetched": fetched[0], "scores": read_scores(course, LAB, STUDENT)}


def _feedback(course) -> str:
    return (course / "feedback" / STUDENT / LAB / f"{LAB}.html").read_text()


def _summary_result(html: str, grade_id: str) -> str:
    """The text of the summary table's result column for ``grade_id``."""
    row = re.search(rf'<tr><td><a href="#ag-{grade_id}">.*?</tr>', html, re.S)
    assert row, f"no summary row for {grade_id}"
    return re.sub(r"<[^>]+>", "", row.group(0).split("</td><td>")[-1]).strip()


def _part_bar(html: str, grade_id: str) -> str:
    """The text of the bar above ``grade_id``'s cell."""
    part = re.search(rf'<section class="ag-part[^"]*" id="ag-{grade_id}">\s*'
                     r'<div class="ag-bar">(.*?)</div>', html, re.S)
    assert part, f"no graded part {grade_id}"
    return " ".join(re.sub(r"<[^>]+>", " ", part.group(1)).split())


def _total(html: str) -> str:
    return re.search(r'<p class="ag-total">(.*?)</p>', html, re.S).group(1).strip()


def _visible_text(html: str) -> str:
    html = re.sub(r"<(script|style)\b.*?</\1>", "", html, flags=re.S)
    return " ".join(re.sub(r"<[^>]+>", " ", html).split())


def _set_manual_scores(course, scores: dict):
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        for grade_id, score in scores.items():
            grade = gradebook.find_grade(grade_id, LAB, LAB, STUDENT)
            grade.manual_score = score
        gradebook.db.commit()


def _formgrader_feedback(course):
    """Generate the feedback as the formgrader does: nbgrader's API, in this process, with
    the course's nbgrader_config.py (the API sets HTMLExporter.template_name = 'feedback')."""
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader("nbgrader_config.py", path=str(course)).load_config()
    api = NbGraderAPI(CourseDirectory(config=config), config=config)
    result = api.generate_feedback(LAB, STUDENT, force=True)
    assert result["success"], result.get("error", "") + result.get("log", "")


@pytest.mark.slow
def test_report_lists_pending_answers_before_they_are_graded(course):
    """`python -m autograde report` (the rows the export writes too) names the written answers
    that wait for a person, and the score it gives holds none of their points.  This test runs
    before the one below sets manual scores."""
    proc = subprocess.run([sys.executable, "-m", "autograde", "report", LAB, "--json",
                           "report.json"], cwd=course["course"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads((course["course"] / "report.json").read_text())
    row = next(r for r in rows if r["student_id"] == STUDENT)
    assert "pending hand-grading (not in the score yet): " in row["reasons"], row
    for grade_id in PENDING:
        assert grade_id in row["reasons"], (grade_id, row["reasons"])
    assert float(row["score"]) == course["scores"]["total"][0]


@pytest.mark.slow
def test_feedback_says_pending_until_the_instructor_grades(course):
    scores = course["scores"]
    auto, maximum = scores["total"]            # pending answers count 0 in the gradebook
    assert maximum == 16.0
    pending = sum(PENDING.values())

    html = _feedback(course["course"])
    assert _total(html) == (f"Score: {auto} / {maximum - pending} so far, "
                            f"{pending} points pending hand-grading")
    for grade_id, points in PENDING.items():
        assert _summary_result(html, grade_id) == f"pending: graded by hand ({points} points)"
        assert _part_bar(html, grade_id).endswith(
            f"pending: graded by hand ({points} points) summary")
        assert f"Score: 0.0 / {points}" not in _part_bar(html, grade_id)
    # nbgrader scores an untouched written answer 0 itself: that is a score, not pending
    assert _summary_result(html, UNANSWERED) == "Score: 0.0 / 2.0"
    for grade_id in ("lab07_check_grad_attn", "lab07_hidden_grad_attn"):   # tests: scored
        assert _summary_result(html, grade_id) == "Score: {} / {}".format(*scores[grade_id])
    # the page fetches nothing
    assert not re.search(r"<script[^>]*\bsrc=", html)
    assert not re.search(r"<link[^>]*\bhref=", html)

    # the instructor grades one answer (and presses the formgrader's "generate feedback"):
    # its score shows, the other stays pending
    _set_manual_scores(course["course"], {"lab07_derivation_attn": 1.5})
    _formgrader_feedback(course["course"])
    html = _feedback(course["course"])
    assert _summary_result(html, "lab07_derivation_attn") == "Score: 1.5 / 2.0"
    assert _part_bar(html, "lab07_derivation_attn").endswith("Score: 1.5 / 2.0 summary")
    assert _summary_result(html, "lab07_derivation_loc") == "pending: graded by hand (3.0 points)"
    assert _total(html) == (f"Score: {auto + 1.5} / {maximum - 3.0} so far, "
                            "3.0 points pending hand-grading")

    # and the other: nothing is pending, the total is the whole notebook's
    _set_manual_scores(course["course"], {"lab07_derivation_loc": 2.0})
    _formgrader_feedback(course["course"])
    html = _feedback(course["course"])
    assert _summary_result(html, "lab07_derivation_loc") == "Score: 2.0 / 3.0"
    assert _total(html) == f"Score: {auto + 3.5} / {maximum}"
    assert "pending" not in _visible_text(html)


# how the page's maths ended up: laid-out formulas, TeX the converter could not read, and
# text left with a $
_MATH_FACTS = """() => {
  const prose = [...document.querySelectorAll('.jp-RenderedMarkdown')];
  const raw = [];
  for (const el of prose) {
    const walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT, {acceptNode: n =>
      n.parentElement.closest('code, pre, math') ? NodeFilter.FILTER_REJECT
                                                 : NodeFilter.FILTER_ACCEPT});
    for (let n = walker.nextNode(); n; n = walker.nextNode())
      if (/\\$|\\\\\\(|\\\\\\[/.test(n.textContent)) raw.push(n.textContent.trim().slice(0, 80));
  }
  const shown = m => { const r = m.getBoundingClientRect(); return r.width > 0 && r.height > 0; };
  return {
    formulas: document.querySelectorAll('math').length,
    laid_out: [...document.querySelectorAll('math')].filter(shown).length,
    unconverted: [...document.querySelectorAll('code.ag-tex')].map(e => e.textContent),
    scripts: document.querySelectorAll('script').length,
    answer: document.querySelectorAll('#ag-lab07_derivation_loc math').length,
    raw: raw,
  };
}"""


@pytest.mark.slow
def test_fetched_feedback_typesets_its_maths_offline(course):
    require_chromium()
    page_path = course["fetched"]
    folder = page_path.parent.as_uri() + "/"
    with chromium() as browser:
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        guard = Offline(context, folder)
        requests, problems = [], []
        context.on("request", lambda request: requests.append(request.url))
        tab = context.new_page()
        tab.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
        tab.on("pageerror", lambda error: problems.append(str(error)))
        tab.goto(page_path.as_uri(), wait_until="load")
        facts = tab.evaluate(_MATH_FACTS)
        tab.wait_for_timeout(500)               # anything the page would load late
        shots = screenshot_dir(ROOT)
        tab.screenshot(path=str(shots / "feedback_lab07.png"))
        tab.locator("#ag-lab07_derivation_loc").scroll_into_view_if_needed()
        tab.screenshot(path=str(shots / "feedback_lab07_written_answer.png"))
        context.close()
    assert guard.blocked == []
    assert requests == [page_path.as_uri()], requests
    assert problems == []
    assert facts["scripts"] == 0
    assert facts["unconverted"] == []
    assert facts["formulas"] >= 20 and facts["laid_out"] == facts["formulas"], facts
    assert page_path.stat().st_size < 300_000, page_path.stat().st_size
    assert facts["answer"] == 3                # ada's display formula and two inline ones
    assert facts["raw"] == [], facts["raw"]     # no formula left as TeX source


# ---------------------------------------------------------------- the template alone, fast
def test_template_words_pending_parts_late_penalty_and_comments():
    """The course's template on a hand-made notebook (no gradebook, no kernel): each kind of
    pending part, a comment, a late penalty, and the exporter's choice of template winning
    over nbgrader's own (which the formgrader forces on HTMLExporter)."""
    from traitlets.config import Config

    from autograde.pipeline.feedback import BY_HAND, ON_A_GPU, PENDING_TOTAL, CourseFeedbackExporter
    from autograde.runner.nbgrader_setup import configure

    def cell(kind, source, **meta):
        made = (nbformat.v4.new_markdown_cell if kind == "md" else nbformat.v4.new_code_cell)(
            source)
        made.metadata["nbgrader"] = meta
        return made

    nb = nbformat.v4.new_notebook(cells=[
        cell("md", "Why is $a_{lk}$ linear?", grade=True, solution=True, grade_id="essay",
             points=3.0, score=0.0, pending=BY_HAND),
        cell("md", "Because $o = a s$.", grade=True, solution=True, grade_id="short",
             points=1.0, score=1.0, comment="Right, and *short*."),
        cell("code", "assert True", grade=True, solution=False, grade_id="test_cpu",
             points=1.0, score=1.0),
        cell("code", "run_on_gpu()", grade=True, solution=False, grade_id="test_gpu",
             points=2.0, score=0.0, pending=ON_A_GPU),
    ])
    resources = {"nbgrader": {
        "notebook": "toy", "score": 1.5, "max_score": 7.0, "late_penalty": 0.5,
        "pending": [(BY_HAND, 3.0), (ON_A_GPU, 2.0)], "pending_points": 5.0,
        "pending_words": PENDING_TOTAL}}

    config = configure(Config())
    config.HTMLExporter.template_name = "feedback"        # what nbgrader's API sets
    exporter = CourseFeedbackExporter(config=config)
    assert exporter.template_name == "course_feedback"
    html, _ = exporter.from_notebook_node(nb, resources=resources)

    assert _total(html) == ("Score: 1.5 / 2.0 so far, 3.0 points pending hand-grading and "
                            "2.0 points pending a GPU host")
    assert "Late submission: 0.5 points taken off" in _visible_text(html)
    assert _summary_result(html, "essay") == "pending: graded by hand (3.0 points)"
    assert _summary_result(html, "test_gpu") == "pending: graded on a GPU host (2.0 points)"
    assert _summary_result(html, "short") == "Score: 1.0 / 1.0"
    assert _part_bar(html, "essay") == ("Written answer essay pending: graded by hand "
                                        "(3.0 points) summary")
    assert _part_bar(html, "test_cpu") == "Test test_cpu Score: 1.0 / 1.0 summary"
    assert "Comment: Right, and short" in _visible_text(html)
    assert "$a_{lk}$" not in html and 'alttext="a_{lk}"' in html      # MathML, its TeX kept
    assert html.count("<math") == 2 and "<script" not in html
    assert not re.search(r"<(script|link)[^>]*\b(src|href)=", html)


def test_pending_means_no_score_at_all():
    """Which gradebook grades are pending, and why (``autograde.pipeline.feedback.pending_reason``)."""
    from types import SimpleNamespace

    from autograde.pipeline.feedback import BY_HAND, ON_A_GPU, pending_reason

    def cell(kind, verdict=None, **meta):
        made = (nbformat.v4.new_markdown_cell if kind == "md" else nbformat.v4.new_code_cell)()
        made.metadata["nbgrader"] = {"grade_id": "x", **meta}
        if verdict:
            made.metadata["autograde"] = {"verdict": {"verdict": verdict}}
        return made

    def grade(auto=None, manual=None):
        return SimpleNamespace(auto_score=auto, manual_score=manual)

    written = cell("md", grade=True, solution=True)
    free_response = cell("code", grade=True, solution=True)
    task = cell("md", task=True)
    test = cell("code", grade=True, solution=False)
    gpu_test = cell("code", "not_gradable_here", grade=True, solution=False)
    for manual in (written, free_response, task):
        assert pending_reason(manual, grade()) == BY_HAND        # answered, not graded yet
        assert pending_reason(manual, grade(manual=0.0)) is None  # graded: even a 0 counts
        assert pending_reason(manual, grade(auto=0.0)) is None   # unanswered: nbgrader's 0
    assert pending_reason(gpu_test, grade()) == ON_A_GPU
    assert pending_reason(gpu_test, grade(manual=2.0)) is None
    assert pending_reason(test, grade(auto=0.0)) is None         # failed, or under review
    assert pending_reason(test, grade(auto=1.0)) is None
