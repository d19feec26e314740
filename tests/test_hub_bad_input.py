"""Bad input on the course hub, through the servers' REST API (no browser).

One hub (scripts/hub/hub.py), an instructor and three students, lab 01 released:

- ``twice`` submits a wrong answer, then the right one: the collected (and graded)
  submission is the later one, the earlier stays in the exchange and in the student's list;
- the instructor then sets the due date (the formgrader's edit dialog:
  ``PUT formgrader/api/assignment/<lab>``), and ``late`` submits the right answer after it:
  nbgrader's late penalty as the hub's course configures it (``penalty_method = "zero"``):
  the raw score stays 10, the penalty is 10, the score 0, and the gradebook records how
  late it was;
- ``deleted`` deletes the fetched notebook and submits the empty folder: the report says
  "ungradable" and why, with no score (not a silent 0).

Grading is ``hub.py grade`` (``python -m autograde grade`` as root in the sandbox).  At the
end the hub is stopped as Ctrl-C stops it (SIGINT), and nothing of it is left running.
"""
from __future__ import annotations

import datetime
import time

import nbformat

from support import hub_helpers as hh

LAB = hh.LAB


def _gradebook_submission(hub, student):
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{hub.course / 'gradebook.db'}") as gradebook:
        sub = gradebook.find_submission(LAB, student)
        return {"score": float(sub.score), "late_penalty": float(sub.late_submission_penalty),
                "seconds_late": float(sub.total_seconds_late),
                "timestamp": sub.timestamp}


def test_resubmission_late_submission_and_deleted_notebook():
    with hh.running_hub(students=("twice", "late", "deleted"), tag="bad") as hub:
        twice, late, deleted = hub.students
        instructor = hub.user(hub.instructor)
        instructor.formgrader("assign")
        instructor.formgrader("release")
        release = nbformat.read(hub.course / "release" / LAB / f"{LAB}.ipynb", as_version=4)
        notebook = f"{LAB}/{LAB}.ipynb"

        # a wrong answer, then the right one
        student = hub.user(twice)
        student.fetch()
        student.save_notebook(notebook, hh.with_mistake(release))
        student.submit()
        time.sleep(1.1)                     # nbgrader's timestamps: distinct submissions
        student.save_notebook(notebook, hh.solved(release))
        student.submit()
        history = student.assignments()[(LAB, "submitted")]["submissions"]
        assert len(history) == 2, history
        # the student's own inbound folder (autograde/runner/exchange.py)
        inbound = hub.state / "exchange" / hh.COURSE_ID / "inbound" / twice
        assert len([p for p in inbound.iterdir() if p.name.startswith(f"{twice}+")]) == 2
        later = max(s["timestamp"] for s in history)

        # the due date passes, then a right answer arrives
        now = datetime.datetime.now(datetime.timezone.utc)
        due = (now + datetime.timedelta(seconds=1)).replace(microsecond=0)   # whole seconds
        instructor.call("PUT", f"formgrader/api/assignment/{LAB}",
                        body={"duedate_notimezone": due.strftime("%Y-%m-%dT%H:%M:%S"),
                              "duedate_timezone": "+0000"})
        while datetime.datetime.now(datetime.timezone.utc) < due + datetime.timedelta(
                seconds=0.5):
            time.sleep(0.1)
        student = hub.user(late)
        student.fetch()
        student.save_notebook(notebook, hh.solved(release))
        student.submit()

        # the notebook deleted before submitting
        student = hub.user(deleted)
        student.fetch()
        student.delete(notebook)
        student.submit()

        instructor.formgrader("collect")
        graded = hub.grade()
        assert graded.returncode == 0, graded.stdout[-3000:] + graded.stderr[-3000:]
        rows = hub.report()

        # the later submission is the graded one; the earlier is kept in the exchange
        collected = (hub.course / "submitted" / twice / LAB / "timestamp.txt").read_text()
        assert collected.strip() == later.strip(), (collected, later)
        assert rows[twice]["status"] in ("graded", "needs_review"), rows[twice]
        assert hh.review_reasons(rows[twice]["reasons"]) == [], rows[twice]["reasons"]
        assert float(rows[twice]["score"]) == 10.0, (rows[twice], _gradebook_submission(
            hub, twice))
        assert len([p for p in inbound.iterdir() if p.name.startswith(f"{twice}+")]) == 2

        # the late one: right answers, zero points, and how late it was on record
        book = _gradebook_submission(hub, late)
        assert book["seconds_late"] > 0, book
        assert book["score"] == 10.0 and book["late_penalty"] == 10.0, book   # raw, penalty
        assert float(rows[late]["raw_score"]) == 10.0, rows[late]
        assert float(rows[late]["late_submission_penalty"]) == 10.0, rows[late]
        assert float(rows[late]["score"]) == 0.0, rows[late]
        assert _gradebook_submission(hub, twice)["seconds_late"] == 0

        # the deleted notebook: ungradable, with the reason, and no score
        assert rows[deleted]["status"] == "ungradable", rows[deleted]
        assert "notebook" in rows[deleted]["reasons"], rows[deleted]
        assert rows[deleted]["score"] in ("", None), rows[deleted]

        # Ctrl-C stops the hub and everything it started
        assert hub.stop_with("interrupt") == []
