"""A class on the course hub, end to end, in the browser.

A real JupyterHub (scripts/hub/hub.py: configurable-http-proxy from npm, hashed passwords,
every user's JupyterLab as a system account of its own) with an instructor and two students,
in a throw-away state folder.  One headless Chromium (Debian's, driven by Playwright), one
browser context per person, every request checked to stay on 127.0.0.1:

1. the instructor logs in; the formgrader generates and releases lab 01 (its "Generate" and
   "Release" buttons call ``formgrader/api/assignment/<lab>/assign`` and ``/release``; the
   test calls those, and shows the formgrader's Manage Assignments page);
2. each student logs in on the hub's page, opens Nbgrader > Assignment List, clicks Fetch;
   the answers are saved into the fetched notebook through the contents API (as JupyterLab
   saves; typing a lab's code into the editor is not what is tested here): one student
   takes the source notebook's solutions, the other makes lab 01's typical mistake (reads
   the sampling location as (y, x)); each opens the notebook, clicks Validate, reads the
   result, and clicks Submit in the Assignment List;
3. the instructor collects (the formgrader's Collect button: ``.../collect``), grades with
   ``python -m autograde grade`` in the sandbox (``hub.py grade``, as root), and generates
   and releases feedback (``.../generate_feedback``, ``.../release_feedback``);
4. each student clicks Fetch Feedback, follows "(view feedback)", and opens the feedback
   page: their score, the visible and the hidden checks' results, no hidden test code.

Then the hub stops with ``make hub-stop``'s command and nothing of it is left running.
Screenshots of every step: _build/screenshots/hub_*.png.
"""
from __future__ import annotations

import re
import time
from pathlib import Path

import nbformat
import pytest

from support import hub_helpers as hh
from support import nbgrader_helpers as nbh
from support.browser_helpers import chromium, require_chromium, screenshot_dir

ROOT = Path(__file__).resolve().parents[1]
LAB = hh.LAB
VALIDATE_TIMEOUT_S = 240
Loopback = hh.Loopback


def _shot(tab, name):
    tab.screenshot(path=str(screenshot_dir(ROOT) / f"hub_{name}.png"))


_login = hh.browser_login


def _assignment_list(tab):
    tab.locator(".lm-MenuBar-itemLabel", has_text="Nbgrader").click()
    tab.locator(".lm-Menu-itemLabel", has_text="Assignment List").click()
    panel = tab.locator(".lm-DockPanel-widget:visible", has_text="Released assignments")
    panel.wait_for()
    return panel


def _validate(tab, hub, user):
    tab.goto(f"{hub.url}user/{user}/lab/workspaces/validate/tree/{LAB}/{LAB}.ipynb")
    notebook = tab.locator(".jp-NotebookPanel:visible")
    notebook.locator(".jp-Notebook-cell").first.wait_for()
    notebook.locator(".jp-NotebookPanel-toolbar [title='Validate Assignment']").first.click()
    dialog = tab.locator(".jp-Dialog")
    dialog.get_by_text("Validation Results").wait_for(timeout=VALIDATE_TIMEOUT_S * 1000)
    report = dialog.inner_text()
    _shot(tab, f"{user.split('-')[-1]}_3_validate")
    dialog.get_by_role("button").last.click()
    return report


@pytest.fixture(scope="module")
def hub():
    require_chromium()
    with hh.running_hub(students=("correct", "mistake"), tag="e2e") as running:
        yield running


def test_class_on_the_hub(hub):
    started = time.monotonic()
    phases = {}
    correct, mistake = hub.students
    release_nb = None
    with chromium() as browser:
        contexts, guards = {}, []

        def tab_for(user):
            if user not in contexts:
                context = browser.new_context(viewport={"width": 1400, "height": 900})
                guards.append(Loopback(context))
                page = context.new_page()
                page.set_default_timeout(60_000)
                contexts[user] = (context, page)
            return contexts[user][1]

        try:
            # 1. the instructor releases lab 01
            instructor = hub.user(hub.instructor)
            tab = tab_for(hub.instructor)
            _login(tab, hub, hub.instructor)
            instructor.formgrader("assign")
            instructor.formgrader("release")
            tab.goto(f"{hub.url}user/{hub.instructor}/formgrader/manage_assignments")
            tab.get_by_text(LAB).first.wait_for()
            _shot(tab, "instructor_1_released")
            release_nb = nbformat.read(hub.course / "release" / LAB / f"{LAB}.ipynb",
                                       as_version=4)
            phases["release"] = time.monotonic()

            # 2. the students fetch, answer, validate and submit
            reports = {}
            for user, notebook in ((correct, hh.solved(release_nb)),
                                   (mistake, hh.with_mistake(release_nb))):
                short = user.split("-")[-1]
                tab = tab_for(user)
                _login(tab, hub, user)
                _shot(tab, f"{short}_1_logged_in")
                panel = _assignment_list(tab)
                released = panel.locator("#released_assignments_list")
                released.get_by_text(LAB).wait_for()
                released.get_by_role("button", name="Fetch").click()
                panel.locator("#fetched_assignments_list").get_by_text(LAB).first.wait_for()
                _shot(tab, f"{short}_2_fetched")
                client = hub.user(user)
                client.save_notebook(f"{LAB}/{LAB}.ipynb", notebook)
                reports[user] = _validate(tab, hub, user)
                panel = _assignment_list(tab)
                fetched = panel.locator("#fetched_assignments_list")
                fetched.get_by_role("button", name="Submit").first.click()
                panel.locator("#submitted_assignments_list").get_by_text(LAB).first.wait_for()
                _shot(tab, f"{short}_4_submitted")
                assert (LAB, "submitted") in client.assignments()
                phases[f"{short} submitted"] = time.monotonic()

            assert "Success! Your notebook passes all the tests." in reports[correct], \
                reports[correct][:2000]
            assert "failed" in reports[mistake].lower() and "check_msda_naive" in \
                reports[mistake], reports[mistake][:2000]

            # 3. the instructor collects, grades in the sandbox, releases feedback
            instructor.formgrader("collect")
            graded = hub.grade()
            assert graded.returncode == 0, graded.stdout[-3000:] + graded.stderr[-3000:]
            for user in (correct, mistake):
                sandboxes = hh.values_of(hub.ledger(user), "sandbox")
                assert sandboxes and set(sandboxes) == {"bwrap"}, (user, sandboxes)
            phases["grade"] = time.monotonic()
            instructor.formgrader("generate_feedback")
            instructor.formgrader("release_feedback")
            tab = tab_for(hub.instructor)
            tab.goto(f"{hub.url}user/{hub.instructor}/formgrader/gradebook/{LAB}/{LAB}")
            tab.locator("a.name-shown", has_text=correct).first.wait_for(state="attached")
            _shot(tab, "instructor_2_graded")
            rows = hub.report()

            # 4. the students fetch and read their feedback
            feedback = {}
            for user in (correct, mistake):
                short = user.split("-")[-1]
                tab = tab_for(user)
                tab.goto(f"{hub.url}user/{user}/lab/workspaces/feedback")
                panel = _assignment_list(tab)
                submitted = panel.locator("#submitted_assignments_list")
                submitted.get_by_role("button", name="Fetch Feedback").first.click()
                submitted.get_by_text("(view feedback)").first.wait_for()
                _shot(tab, f"{short}_5_feedback_fetched")
                submitted.get_by_text("(view feedback)").first.click()
                tab.locator(".jp-DirListing-item", has_text=f"{LAB}.html").first.wait_for()
                listing = hub.user(user).call("GET", f"api/contents/{LAB}/feedback")
                folder = listing["content"][0]["path"]
                tab.goto(f"{hub.url}user/{user}/files/{folder}/{LAB}.html")
                tab.get_by_text("Score:").first.wait_for()
                _shot(tab, f"{short}_6_feedback")
                feedback[user] = tab.locator("body").inner_text()
                phases[f"{short} feedback"] = time.monotonic()
        except Exception:
            for user, (_, page) in contexts.items():
                page.screenshot(path=str(screenshot_dir(ROOT) /
                                         f"hub_failed_{user.split('-')[-1]}.png"))
            raise
        finally:
            for context, _ in contexts.values():
                context.close()

    # scores and statuses in the course's report
    # graded, or flagged for review by the similarity check alone (the test's student hands
    # in the source notebook's solution verbatim)
    assert rows[correct]["status"] in ("graded", "needs_review"), rows[correct]["status"]
    assert hh.review_reasons(rows[correct]["reasons"]) == [], rows[correct]["reasons"]
    # a wrong answer is a plain failure (the grader's replay is the check's verdict), not a
    # case for review; the similarity check may list it (it is the solution with one change)
    assert rows[mistake]["status"] in ("graded", "needs_review"), rows[mistake]
    assert hh.review_reasons(rows[mistake]["reasons"]) == [], rows[mistake]["reasons"]
    max_score = float(rows[correct]["max_score"])
    assert float(rows[correct]["score"]) == max_score == 10.0, rows[correct]
    # the (y, x) mistake fails both msda_naive checks (1 visible + 3 hidden points) only
    assert float(rows[mistake]["score"]) == 6.0, rows[mistake]

    # the feedback pages: the score, the checks' results, no hidden test code
    source = nbformat.read(nbh.source_notebook(LAB), as_version=4)
    public = set().union(*(nbh._public_lines(cell.source) for cell in source.cells))
    hidden_lines = [line.strip() for cell in source.cells
                    for line in nbh._regions(cell.source, nbh.BEGIN_HIDDEN, nbh.END_HIDDEN)
                    if line.strip() not in public]
    assert len(hidden_lines) >= 3, hidden_lines
    for user, score in ((correct, "10.0 / 10.0"), (mistake, "6.0 / 10.0")):
        text = feedback[user]
        assert f"Score: {score}" in text, text[:1500]
        assert "(hidden tests: not shown)" in text
        shown = {line.strip() for line in text.splitlines()}
        for line in hidden_lines:
            assert line not in shown, f"{user}'s feedback shows hidden code: {line}"
    # the visible check and the hidden check of msda_naive failed for the mistake, by name
    assert re.search(r"lab01_check_msda_naive.*?Score: 0\.0 / 1\.0", feedback[mistake], re.S)
    assert re.search(r"lab01_hidden_msda_naive.*?Score: 0\.0 / 3\.0", feedback[mistake], re.S)
    assert re.search(r"lab01_hidden_msda_naive.*?Score: 3\.0 / 3\.0", feedback[correct], re.S)
    # and the student reads the check's diagnosis of the mistake
    assert "x and y are swapped" in feedback[mistake]

    # nothing left the machine
    assert sum(g.seen for g in guards) > 50
    assert not [u for g in guards for u in g.blocked], [u for g in guards for u in g.blocked]

    # the hub stops and leaves nothing behind
    assert hub.stop_with("stop") == []
    marks = " | ".join(f"{name} {at - started:.0f} s" for name, at in phases.items())
    print(f"class on the hub: {time.monotonic() - started:.0f} s ({marks})")
