"""Autograde a whole class in parallel on one machine, resumably.

``python -m autograde grade ASSIGNMENT`` runs nbgrader's own autograde converter, with the
course's nbgrader configuration, for one student at a time in each of N worker processes.
Every submission goes through exactly the code path of ``nbgrader autograde ASSIGNMENT
--student ID``, so the scores are the same as nbgrader's sequential run; only the order and
the wall time differ.

- Workers: at most the number of cores, and at most what memory allows (each kernel may use
  ``AutogradeSettings.memory_mb``, plus about 1 GiB for the grader process); ``--workers``
  overrides.  Every kernel runs as a uid that no other running kernel on the host has, from
  a pool shared by every grading command on the host (:mod:`autograde.isolation.uids`).
- The gradebook: with SQLite, gradebook writes are serialised by a lock file
  (:mod:`autograde.pipeline.dblock`); notebooks run in parallel.
- Several hosts: ``--shard i/n`` grades every n-th student starting at i, so that n hosts
  sharing the course folder (and a PostgreSQL gradebook) split a class without overlap.
- Resuming: a submission whose ledger entry says ``done`` (and whose submission has not
  changed since) is skipped unless ``--force``; one whose grading was interrupted (a partial
  ``autograded/`` folder, a ledger entry still ``running``) is graded again from scratch.
- Progress: a bar on stderr; each worker's nbgrader log goes to
  ``autograde_status/<assignment>/logs/<student>.log``.
"""
from __future__ import annotations

import multiprocessing
import os
import sys
import threading
import time

from ..isolation.limits import limit_grader_memory, memory_reason

__all__ = ["grade_class", "plan", "default_workers", "limit_grader_memory", "memory_reason"]


def _load_config(root):
    from traitlets.config.loader import PyFileConfigLoader
    path = os.path.join(root, "nbgrader_config.py")
    if not os.path.exists(path):
        raise SystemExit(f"no nbgrader_config.py in {root}")
    return PyFileConfigLoader("nbgrader_config.py", path=root).load_config()


def _coursedir(config, root):
    from nbgrader.coursedir import CourseDirectory
    cd = CourseDirectory(config=config)
    cd.root = root
    return cd


def default_workers(settings, tasks):
    from ..config import cores
    workers = cores()
    try:
        with open("/proc/meminfo") as fh:
            info = dict(line.split(":", 1) for line in fh)
        available_mb = int(info["MemAvailable"].split()[0]) // 1024
        per_worker = (settings.memory_mb or 4096) + 1024
        workers = min(workers, max(1, available_mb // per_worker))
    except (OSError, KeyError, ValueError):
        pass
    return max(1, min(workers, tasks))


def plan(root, assignment, force=False, students=None, shard=None, statuses=None):
    """[(student, force_this_one, why)] for the submissions to grade; and the skipped ones.

    ``shard``: (i, n) keeps the students whose position in the sorted list is i modulo n
    (several grading hosts, one shard each); ``statuses``: regrade only the submissions whose
    current status is one of these (for example ``needs_gpu`` on a GPU host)."""
    from ..pipeline import status
    from ..config import AutogradeSettings
    config = _load_config(root)
    settings = AutogradeSettings(config=config)
    cd = _coursedir(config, root)
    submitted = cd.format_path(cd.submitted_directory, ".", ".")
    todo, skipped = [], []
    if not os.path.isdir(submitted):
        return todo, skipped
    candidates = [s for s in sorted(os.listdir(submitted))
                  if os.path.isdir(cd.format_path(cd.submitted_directory, s, assignment))]
    if shard is not None:
        index, count = shard
        candidates = [s for i, s in enumerate(candidates) if i % count == index]
    for student in candidates:
        if students and student not in students:
            continue
        dest = cd.format_path(cd.autograded_directory, student, assignment)
        entry = status.read(status.ledger_path(root, settings, assignment, student))
        stamp = status._submission_stamp(config, root, assignment, student)
        if statuses is not None:
            if status.summarize(entry)[0] not in statuses:
                continue
            todo.append((student, True, "selected by status"))
        elif force:
            todo.append((student, True, "forced"))
        elif entry and entry.get("state") == "done" and os.path.isdir(dest) and \
                entry.get("submission") == stamp:
            skipped.append((student, "already graded"))
        elif os.path.isdir(dest):
            todo.append((student, True, "regrading an interrupted or outdated grading"))
        else:
            todo.append((student, False, "new"))
    return todo, skipped


_worker_state = {}


def _init_worker(root, assignment, counter, workers, log_dir, sqlite=True):
    with counter.get_lock():
        index = counter.value
        counter.value += 1
    os.environ["AUTOGRADE_WORKER"] = str(index)
    os.environ["AUTOGRADE_WORKERS"] = str(workers)
    if sqlite:                          # a database server serialises writers itself
        os.environ["AUTOGRADE_DB_LOCK"] = os.path.join(root, ".autograde-gradebook.lock")
    os.chdir(root)
    _worker_state.update(root=root, assignment=assignment, log_dir=log_dir)
    _limit_memory(root)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)


def _limit_memory(root):
    """Bound this worker's memory (see :func:`limit_grader_memory`), so that one
    submission's grading cannot take the host's memory from the other workers."""
    from ..config import AutogradeSettings
    try:
        limit = AutogradeSettings(config=_load_config(root)).grader_memory_mb
    except Exception:                                   # noqa: BLE001
        limit = AutogradeSettings().grader_memory_mb
    _worker_state["memory_mb"] = limit
    limit_grader_memory(limit)


def _grade_one(task):
    student, force = task
    from ..pipeline import dblock
    root, assignment = _worker_state["root"], _worker_state["assignment"]
    log_path = os.path.join(_worker_state["log_dir"], f"{student}.log")
    started = time.monotonic()
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    saved = os.dup(1), os.dup(2)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    code = 0
    try:
        from nbgrader.apps import AutogradeApp
        argv = [assignment, "--student", student]
        if force:
            argv.append("--force")
        app = AutogradeApp()
        try:
            app.initialize(argv)
            app.start()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except MemoryError:
            code = 1
            _note_grader_limit(root, assignment, student)
        except Exception:                               # noqa: BLE001
            import traceback
            traceback.print_exc()
            code = 1
        finally:
            for handler in list(app.log.handlers):
                app.log.removeHandler(handler)
            try:
                app.clear_instance()
            except Exception:                           # noqa: BLE001
                pass
    finally:
        dblock.release()
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(fd)
    return student, code, time.monotonic() - started


def _note_grader_limit(root, assignment, student):
    from ..pipeline import status
    from ..config import AutogradeSettings
    try:
        settings = AutogradeSettings(config=_load_config(root))
        status.note_failure(root, settings, assignment, student,
                            memory_reason(_worker_state.get("memory_mb")))
    except Exception:                                   # noqa: BLE001
        pass


class _Progress:
    def __init__(self, total, workers, stream=sys.stderr, enabled=True):
        self.total, self.workers, self.stream, self.enabled = total, workers, stream, enabled
        self.done = 0
        self.started = time.monotonic()
        self.tty = hasattr(stream, "isatty") and stream.isatty()

    def update(self, student=None, code=0):
        if not self.enabled:
            return
        self.done += 1 if student is not None else 0
        elapsed = time.monotonic() - self.started
        width = 30
        filled = int(width * self.done / max(1, self.total))
        eta = (elapsed / self.done * (self.total - self.done)) if self.done else 0.0
        bar = "#" * filled + "-" * (width - filled)
        text = (f"[{bar}] {self.done}/{self.total} submissions, {self.workers} workers, "
                f"{elapsed:5.0f} s elapsed, ~{eta:4.0f} s left")
        if student is not None:
            from ..pipeline.status import printable
            text += (f"  ({printable(student, limit=60)}"
                     f"{'' if code == 0 else ': nbgrader reported an error'})")
        if self.tty:
            self.stream.write("\r" + text.ljust(110)[:150])
            if self.done == self.total:
                self.stream.write("\n")
        else:
            self.stream.write(text + "\n")
        self.stream.flush()


def _warm_similarity(root, config, settings, assignment):
    try:
        from . import similarity
        similarity.class_flags(root, settings, _coursedir(config, root), assignment)
    except Exception:                                   # noqa: BLE001  (the report retries)
        pass


def grade_class(root, assignment, workers=None, force=False, students=None, progress=True,
                out=sys.stderr, shard=None, statuses=None):
    """Autograde every submission of ``assignment``; returns a summary dict."""
    from ..config import AutogradeSettings
    root = os.path.abspath(root)
    config = _load_config(root)
    settings = AutogradeSettings(config=config)
    sqlite = _coursedir(config, root).db_url.startswith("sqlite")
    todo, skipped = plan(root, assignment, force=force, students=students, shard=shard,
                         statuses=statuses)
    if todo:
        from ..pipeline.execute import sandbox_warning
        try:
            warning = sandbox_warning(settings)
        except RuntimeError as exc:
            raise SystemExit(f"autograde: {exc}") from None
        if warning:
            bar = "!" * 78
            out.write(f"{bar}\n!! {warning}\n{bar}\n")
            out.flush()
    log_dir = os.path.join(root, settings.status_directory, assignment, "logs")
    os.makedirs(log_dir, exist_ok=True)
    n = workers or default_workers(settings, len(todo))
    n = max(1, min(n, max(1, len(todo))))
    for student, why in skipped:
        if progress:
            from ..pipeline.status import printable
            out.write(f"skipping {printable(student, limit=100)}: {printable(why)} "
                      "(use --force to regrade)\n")
    results = []
    started = time.monotonic()
    bar = _Progress(len(todo), n, out, enabled=progress)
    if todo:
        bar.update()
        warm = threading.Thread(target=_warm_similarity, args=(root, config, settings,
                                                               assignment), daemon=True)
        warm.start()                 # parse the course's modules while the workers grade
        context = multiprocessing.get_context("spawn")
        counter = context.Value("i", 0)
        with context.Pool(n, initializer=_init_worker,
                          initargs=(root, assignment, counter, n, log_dir, sqlite),
                          maxtasksperchild=None) as pool:
            for student, code, seconds in pool.imap_unordered(
                    _grade_one, [(s, f) for s, f, _ in todo]):
                results.append({"student": student, "nbgrader_exit": code,
                                "seconds": round(seconds, 3)})
                bar.update(student, code)
        warm.join()
    return {"assignment": assignment, "workers": n, "graded": results,
            "skipped": [s for s, _ in skipped],
            "seconds": round(time.monotonic() - started, 3)}
