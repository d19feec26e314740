"""nbgrader's filesystem exchange with folders no student can take over.

nbgrader's default exchange is one folder everybody writes to (``exchange/`` mode 0777, and
``inbound/`` 0733 where every submission is written).  On a shared host a student can rename
the course folder and put her own in its place, write a submission under another student's
name, or leave links in her own submission that Collect follows as the instructor.  The
course hub (scripts/hub/hub.py setup) lays the exchange out instead as:

    exchange/                          root, 0755: nobody but root creates or renames in it
      <course>/                        the instructor, 0755
        outbound/                      the instructor, 0755 (released labs, read by all)
        inbound/                       the instructor, 0755
          <student>/                   the student, group = the instructor's group, 0750:
                                       only its owner writes, only she and the instructor read
        feedback/                      the instructor, 0711 (files named by a secret hash)

and these classes (``c.ExchangeFactory.*``, set in the hub's configuration) use it:

- every operation first checks that the exchange root is a root-owned folder that only root
  may write, not a link (``HubExchange.ensure_root``);
- ``Submit`` writes into ``inbound/<student>/`` and refuses a folder that is not the
  student's own, or that others may write;
- ``Collect`` takes from ``inbound/<student>/`` only submissions named for that student and
  owned by her uid, copies regular files only (no link is followed or copied, no file owned
  by someone else is taken), and refuses, keeps and reports everything else: the refused
  submission is copied (the same way) to ``refused/<assignment>/`` in the course folder for
  the instructor to look at, it is never graded as the student it names, and the reasons
  are appended to ``refused/<assignment>/report.txt`` and logged (the formgrader's Collect
  shows the log);
- ``ReleaseFeedback`` releases feedback submission by submission: one without
  ``submission_secret.txt`` or ``timestamp.txt`` is reported and skipped, the others are
  released;
- ``List`` reads the per-student inbound folders for ``nbgrader list --inbound``.
"""
from __future__ import annotations

import base64
import datetime
import glob
import grp
import os
import pwd
import re
import shutil
import stat

from nbgrader.exchange.default import (ExchangeFetchAssignment, ExchangeFetchFeedback,
                                       ExchangeList, ExchangeReleaseAssignment,
                                       ExchangeReleaseFeedback, ExchangeSubmit)
from nbgrader.utils import notebook_hash, parse_utc

from ..compat.nbgrader_compat import ExchangeCollectBase

__all__ = ["ReleaseAssignment", "FetchAssignment", "Submit", "Collect", "ReleaseFeedback",
           "FetchFeedback", "List", "safe_copy", "CLASSES"]


class HubExchange:
    """The checks every operation makes on the exchange root."""

    def ensure_root(self):
        try:
            info = os.lstat(self.root)
        except FileNotFoundError:
            self.fail(f"The exchange {self.root} does not exist: ask your instructor "
                      "(scripts/hub/hub.py setup creates it)")
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0 or info.st_mode & 0o022:
            self.fail(f"The exchange {self.root} is not a folder that only root can write "
                      "(owner root, mode 0755): it may have been tampered with; ask your "
                      "instructor")


def _inbound_folder_problem(path: str, student: str) -> str | None:
    """Why ``path`` is not ``student``'s own inbound folder (None: it is)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return f"there is no inbound folder {path} for {student}"
    if not stat.S_ISDIR(info.st_mode):
        return f"{path} is not a folder"
    try:
        owner = pwd.getpwuid(info.st_uid).pw_name
    except KeyError:
        owner = f"uid {info.st_uid}"
    if owner != student:
        return f"{path} belongs to {owner}, not to {student}"
    if info.st_mode & 0o002:
        return f"{path} can be written by every account (mode {info.st_mode & 0o7777:o})"
    return None


def safe_copy(src: str, dest: str, uid: int | None, problems: list, max_bytes=None,
              ignore=None) -> int:
    """Copy the folder ``src`` to ``dest`` (created): regular files and folders only.

    Nothing is followed: a link, a device, a fifo or a socket is left out and reported; with
    ``uid`` a file or folder owned by another uid is left out and reported too (a hard link
    to someone else's file is such a file).  Each file is opened without following links and
    checked again after opening (the entry cannot be swapped between the check and the
    copy).  ``ignore(folder, names)`` returns names to leave out silently (nbgrader's
    ignore/include patterns).  Returns the bytes copied; ``problems`` gets one line per
    thing left out."""
    copied = 0
    os.makedirs(dest, exist_ok=False)
    stack = [(src, dest)]
    while stack:
        folder, target = stack.pop()
        with os.scandir(folder) as entries:
            entries = sorted(entries, key=lambda e: e.name)
        skip = set(ignore(folder, [e.name for e in entries])) if ignore else set()
        for entry in entries:
            if entry.name in skip:
                continue
            path = os.path.join(folder, entry.name)
            relative = os.path.relpath(path, src)
            info = entry.stat(follow_symlinks=False)
            if stat.S_ISLNK(info.st_mode):
                problems.append(f"{relative}: a link ({os.readlink(path)!r}), not copied")
                continue
            if uid is not None and info.st_uid != uid:
                problems.append(f"{relative}: owned by uid {info.st_uid}, not by the "
                                "submitting student, not copied")
                continue
            if stat.S_ISDIR(info.st_mode):
                os.mkdir(os.path.join(target, entry.name), 0o755)
                stack.append((path, os.path.join(target, entry.name)))
                continue
            if not stat.S_ISREG(info.st_mode):
                problems.append(f"{relative}: not a regular file, not copied")
                continue
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError as exc:
                problems.append(f"{relative}: cannot be opened ({exc.strerror}), not copied")
                continue
            with os.fdopen(fd, "rb") as fh:
                opened = os.fstat(fh.fileno())
                if (opened.st_dev, opened.st_ino) != (info.st_dev, info.st_ino) or \
                        not stat.S_ISREG(opened.st_mode):
                    problems.append(f"{relative}: changed while being copied, not copied")
                    continue
                copied += opened.st_size
                if max_bytes is not None and copied > max_bytes:
                    raise RuntimeError(f"{src}: more than {max_bytes} bytes")
                out = os.open(os.path.join(target, entry.name),
                              os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
                with os.fdopen(out, "wb") as sink:
                    shutil.copyfileobj(fh, sink)
    return copied


def _ignore(exchange):
    """nbgrader's ignore/include/size patterns as ``safe_copy``'s ``ignore``."""
    from nbgrader.utils import ignore_patterns
    cd = exchange.coursedir
    return ignore_patterns(exclude=cd.ignore, include=cd.include,
                           max_file_size=cd.max_file_size, log=exchange.log)


class ReleaseAssignment(HubExchange, ExchangeReleaseAssignment):
    pass


class FetchAssignment(HubExchange, ExchangeFetchAssignment):
    pass


class FetchFeedback(HubExchange, ExchangeFetchFeedback):
    pass


class Submit(HubExchange, ExchangeSubmit):
    """Submit into the student's own ``inbound/<student>/``."""

    def init_dest(self):
        if self.coursedir.course_id == "":
            self.fail("No course id specified. Re-run with --course flag.")
        if not self.authenticator.has_access(self.coursedir.student_id,
                                             self.coursedir.course_id):
            self.fail("You do not have access to this course.")
        student_id = pwd.getpwuid(os.getuid()).pw_name
        if self.coursedir.student_id not in ("*", "", student_id):
            self.fail(f"You are {student_id}: you cannot submit as "
                      f"{self.coursedir.student_id}")
        self.inbound_path = os.path.join(self.root, self.coursedir.course_id, "inbound",
                                         student_id)
        problem = _inbound_folder_problem(self.inbound_path, student_id)
        if problem:
            self.fail(f"Your submission folder is not usable ({problem}): ask your "
                      "instructor to run scripts/hub/hub.py setup again")
        self.cache_path = os.path.join(self.cache, self.coursedir.course_id)
        random_str = base64.urlsafe_b64encode(os.urandom(9)).decode("ascii")
        self.assignment_filename = "{}+{}+{}+{}".format(
            student_id, self.coursedir.assignment_id, self.timestamp, random_str)

    def copy_files(self):
        super().copy_files()
        # nbgrader leaves the submission 0777 "so that the instructor can delete it"; in a
        # folder of the student's own, readable by the instructor's group, 0755 is enough
        os.chmod(os.path.join(self.inbound_path, self.assignment_filename), 0o755)


class List(HubExchange, ExchangeList):
    """``--inbound`` reads ``inbound/<student>/``; the rest is nbgrader's."""

    def init_dest(self):
        if not self.inbound:
            return super().init_dest()
        course_id = self.coursedir.course_id or "*"
        assignment_id = self.coursedir.assignment_id or "*"
        student_id = self.coursedir.student_id or "*"
        pattern = os.path.join(self.root, course_id, "inbound", student_id,
                               f"{student_id}+{assignment_id}+*")
        self.assignments = sorted(glob.glob(pattern))

    def parse_assignment(self, assignment):
        if not self.inbound:
            return super().parse_assignment(assignment)
        m = re.match(r".*/(?P<course_id>[^/]*)/inbound/[^/]*/(?P<student_id>[^+/]*)\+"
                     r"(?P<assignment_id>[^+]*)\+(?P<timestamp>[^+]*)(?P<random_string>\+.*)?$",
                     assignment)
        if m is None:
            raise RuntimeError(f"Could not match {assignment!r}")
        return m.groupdict()


class Collect(HubExchange, ExchangeCollectBase):
    """See the module docstring."""

    def init_src(self):
        if self.coursedir.course_id == "":
            self.fail("No course id specified. Re-run with --course flag.")
        self.course_path = os.path.join(self.root, self.coursedir.course_id)
        self.inbound_path = os.path.join(self.course_path, "inbound")
        if not os.path.isdir(self.inbound_path):
            self.fail(f"Course not found: {self.inbound_path}")
        lab = self.coursedir.assignment_id
        wanted = self.coursedir.student_id or "*"
        self.refused = []            # (folder, student named, reason)
        records = []
        for folder in sorted(glob.glob(os.path.join(self.inbound_path, wanted))):
            student = os.path.basename(folder)
            problem = _inbound_folder_problem(folder, student)
            if problem:
                self.refused.append((folder, student, problem))
                continue
            uid = os.lstat(folder).st_uid
            for path in sorted(glob.glob(os.path.join(folder, f"*+{lab}+*"))):
                reason = self._submission_problem(path, student, uid)
                if reason:
                    self.refused.append((path, student, reason))
                    continue
                records.append(self.path_to_record(path))
        by_student = {}
        for record in records:
            by_student.setdefault(record["username"], []).append(record)
        from nbgrader.api import Gradebook, MissingEntry
        with Gradebook(self.coursedir.db_url, self.coursedir.course_id) as gb:
            try:
                self.duedate = gb.find_assignment(lab).duedate
            except MissingEntry:
                self.duedate = None
        self.src_records = []
        for found in by_student.values():
            found = self.sort_by_timestamp(found)
            if self.duedate is not None and self.before_duedate:
                early = [r for r in found if r["timestamp"] <= self.duedate]
                found = early or found
            self.src_records.append(found[0])

    def path_to_record(self, path):
        record = super().path_to_record(path)
        # the student's own folder, relative to inbound/ (copy_files joins it)
        record["filename"] = os.path.join(record["username"], record["filename"])
        return record

    @staticmethod
    def _submission_problem(path, student, uid):
        name = os.path.basename(path)
        if name.rsplit("+", 3)[0] != student:
            return f"named for {name.rsplit('+', 3)[0]} but in {student}'s folder"
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode):
            return "a link, not a submission folder"
        if not stat.S_ISDIR(info.st_mode):
            return "not a folder"
        if info.st_uid != uid:
            try:
                owner = pwd.getpwuid(info.st_uid).pw_name
            except KeyError:
                owner = f"uid {info.st_uid}"
            return f"owned by {owner}, not by {student}"
        try:
            parse_utc(name.rsplit("+", 3)[2])
        except Exception:                          # noqa: BLE001  (any unparsable name)
            return "its name carries no timestamp"
        return None

    def do_copy(self, src, dest, log=None):
        problems = []
        uid = os.lstat(src).st_uid
        safe_copy(src, dest, uid, problems, max_bytes=1000 * self.coursedir.max_dir_size,
                  ignore=_ignore(self))
        for line in problems:
            self._report(src, self._student_of(src), line, kept=False)

    @staticmethod
    def _student_of(path):
        return os.path.basename(path).rsplit("+", 3)[0]

    def _report(self, path, student, reason, kept=True):
        lab = self.coursedir.assignment_id
        folder = os.path.join(self.coursedir.root, "refused", lab)
        os.makedirs(folder, exist_ok=True)
        when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        line = f"{when}  {student}  {os.path.basename(path)}: {reason}"
        with open(os.path.join(folder, "report.txt"), "a") as fh:
            fh.write(line + "\n")
        self.log.error("Refused for %s: %s: %s%s", student, path, reason,
                       f" (kept in {folder})" if kept else "")

    def copy_files(self):
        super().copy_files()
        lab = self.coursedir.assignment_id
        for path, student, reason in self.refused:
            kept = os.path.join(self.coursedir.root, "refused", lab, os.path.basename(path))
            copied = False
            if os.path.isdir(path) and not os.path.islink(path) and not os.path.exists(kept):
                problems = []
                try:
                    safe_copy(path, kept, None, problems, ignore=_ignore(self))
                    copied = True
                except (OSError, RuntimeError) as exc:
                    problems.append(f"could not be kept: {exc}")
                reason += "".join(f"; {p}" for p in problems)
            self._report(path, student, reason, kept=copied)


class ReleaseFeedback(HubExchange, ExchangeReleaseFeedback):
    """nbgrader's release, one submission at a time: one that cannot be released is
    reported and the others still are."""

    def copy_files(self):
        exclude = set(filter(None, (self.coursedir.student_id_exclude or "").split(",")))
        regexp = re.escape(os.path.sep).join([
            self.coursedir.format_path(self.coursedir.feedback_directory, "(?P<student_id>.*)",
                                       self.coursedir.assignment_id, escape=True),
            "(?P<notebook_id>.*).html"])
        self.failed = []
        for html_file in sorted(glob.glob(os.path.join(self.src_path, "*.html"))):
            m = re.match(regexp, html_file)
            if m is None:
                self.log.error("Could not match %r with %r", html_file, regexp)
                continue
            student_id, notebook_id = m.group("student_id"), m.group("notebook_id")
            if student_id in exclude:
                continue
            folder = os.path.dirname(html_file)
            try:
                with open(os.path.join(folder, "timestamp.txt")) as fh:
                    timestamp = fh.read()
                with open(os.path.join(folder, "submission_secret.txt")) as fh:
                    secret = fh.read()
            except FileNotFoundError as exc:
                self.failed.append(student_id)
                self.log.error(
                    "Feedback for %s on %s not released: the submission has no %s (it did "
                    "not come through Submit; the student cannot fetch feedback for it)",
                    student_id, self.coursedir.assignment_id, os.path.basename(exc.filename))
                continue
            checksum = notebook_hash(secret=secret, notebook_id=notebook_id)
            tmp = os.path.join(self.dest_path, f"{checksum}-tmp.html")
            self.log.info("Releasing feedback for student '%s' on assignment '%s/%s/%s' (%s)",
                          student_id, self.coursedir.course_id, self.coursedir.assignment_id,
                          notebook_id, timestamp)
            shutil.copy(html_file, tmp)
            os.chmod(tmp, 0o644)
            shutil.move(tmp, os.path.join(self.dest_path, f"{checksum}.html"))


CLASSES = {"release_assignment": ReleaseAssignment, "fetch_assignment": FetchAssignment,
           "submit": Submit, "collect": Collect, "release_feedback": ReleaseFeedback,
           "fetch_feedback": FetchFeedback, "list": List}


def config_lines() -> list[str]:
    """``c.ExchangeFactory`` lines that select these classes (for an nbgrader_config.py)."""
    return [f"c.ExchangeFactory.{name} = 'autograde.runner.exchange.{cls.__name__}'"
            for name, cls in CLASSES.items()]


def layout(root: str, course_id: str, instructor: str, students) -> list[str]:
    """Create (or repair) the exchange's folders with their owners and modes (as root);
    returns what it changed.  A link where a folder should be is removed."""
    changed = []
    teacher = pwd.getpwnam(instructor)
    group = grp.getgrgid(teacher.pw_gid).gr_gid

    def folder(path, uid, gid, mode):
        try:
            info = os.lstat(path)
            if not stat.S_ISDIR(info.st_mode):
                os.unlink(path)
                changed.append(f"{path}: not a folder, removed")
                raise FileNotFoundError
        except FileNotFoundError:
            os.mkdir(path, 0o700)
            changed.append(f"{path}: created")
        # through a descriptor of the folder itself: a link swapped in is never followed
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            os.fchown(fd, uid, gid)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)

    folder(root, 0, 0, 0o755)
    course = os.path.join(root, course_id)
    folder(course, teacher.pw_uid, group, 0o755)
    for name, mode in (("outbound", 0o755), ("inbound", 0o755), ("feedback", 0o711)):
        folder(os.path.join(course, name), teacher.pw_uid, group, mode)
    for student in students:
        folder(os.path.join(course, "inbound", student), pwd.getpwnam(student).pw_uid, group,
               0o750)
    return changed
