"""Write a synthetic class of submissions of the fixture lab ``labfx`` into a course directory.

    python scripts/make_synthetic_class.py COURSE_DIR [--canary-port PORT] [--only NAME ...]

COURSE_DIR is a copy of tests/fixtures/course on which ``nbgrader generate_assignment labfx``
has run (the submissions start from its ``release/labfx/labfx.ipynb``, as students' do; the
correct answers come from the source notebook).  Each student gets
``submitted/<student>/labfx/labfx.ipynb`` and a ``timestamp.txt``, as ``nbgrader collect``
leaves them.  One student per case:

  correct, partly_wrong, empty                          ordinary submissions
  cheat_patch_compare   replaces math.isclose, torch.allclose, torch.testing.assert_close,
                        numpy.testing.assert_allclose and the course's comparison helpers
  cheat_patch_check     replaces the hidden checks, forges a record, returns a number
  cheat_edit_tests      edits hidden and visible test cells
  cheat_delete_tests    deletes hidden test cells
  cheat_reorder         moves test cells above the answers
  cheat_metadata        un-grades a test cell, sets points, tags it skip-execution
  cheat_reference       calls a copy of the reference made before the check runs
  cheat_chip            calls a builtin chip
  cheat_hardcode        hard-codes the visible test's answer
  infinite_loop         loops forever on the hidden inputs
  ignore_sigint         ignores SIGINT, then loops forever
  memory_hog            allocates memory without bound
  spawn_processes       starts a detached process and floods the process table
  huge_output           prints 20 MB
  read_secrets          reads the source notebook, other submissions and the gradebook,
                        writes the gradebook, connects to the grader and to the internet
  crash_kernel          kills its own kernel
  corrupt_json          a notebook file that is not JSON
  missing_notebook      the notebook under another name
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys

import nbformat

ASSIGNMENT = "labfx"
TIMESTAMP = "2026-11-20 12:00:00.000000 UTC"
VISIBLE_POINT = "(x_im, y_im) == (2.0, 3.0)"


def _gid(cell):
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def _strip_solution(source):
    return "\n".join(line for line in source.splitlines()
                     if line.strip() not in ("### BEGIN SOLUTION", "### END SOLUTION"))


class Builder:
    def __init__(self, course):
        self.course = os.path.abspath(course)
        self.release = nbformat.read(os.path.join(self.course, "release", ASSIGNMENT,
                                                  f"{ASSIGNMENT}.ipynb"), as_version=4)
        source = nbformat.read(os.path.join(self.course, "assignments", ASSIGNMENT,
                                            f"{ASSIGNMENT}.ipynb"), as_version=4)
        self.correct = {_gid(c): _strip_solution(c.source) for c in source.cells
                        if c.get("metadata", {}).get("nbgrader", {}).get("solution")}

    # ---------------------------------------------------------------- notebook edits
    def fresh(self):
        return copy.deepcopy(self.release)

    def answer(self, nb, gid, source):
        for cell in nb.cells:
            if _gid(cell) == gid:
                cell.source = source
                return
        raise KeyError(gid)

    def all_correct(self, nb):
        for gid, source in self.correct.items():
            self.answer(nb, gid, source)
        return nb

    def insert_after(self, nb, gid, source):
        for i, cell in enumerate(nb.cells):
            if _gid(cell) == gid:
                nb.cells.insert(i + 1, nbformat.v4.new_code_cell(source))
                return
        raise KeyError(gid)

    def cell(self, nb, gid):
        return next(c for c in nb.cells if _gid(c) == gid)


WRONG_LERP = '''def lerp(a, b, t):
    return a + t * (b - a) + 1e-3          # off by a little everywhere'''

WRONG_CORNER = '''def corner_weights(x_im, y_im):
    x0, y0 = math.floor(x_im), math.floor(y_im)
    dx, dy = x_im - x0, y_im - y0
    # dx and dy swapped in the two mixed corners
    return [(y0, x0, (1 - dy) * (1 - dx)), (y0, x0 + 1, dy * (1 - dx)),
            (y0 + 1, x0, (1 - dy) * dx), (y0 + 1, x0 + 1, dy * dx)]'''

TORCH_SCALE = '''@triton.jit
def scale_kernel(x_ptr, out_ptr, alpha, n, BLOCK: tl.constexpr):
    pass


def scale(x, alpha):
    return alpha * x                        # torch does the work, no kernel'''


def corner_with(prefix, body_when_hidden):
    """The correct corner_weights, doing something else first on the hidden inputs."""
    return f'''{prefix}
def corner_weights(x_im, y_im):
    if not {VISIBLE_POINT}:
{body_when_hidden}
    x0, y0 = math.floor(x_im), math.floor(y_im)
    dx, dy = x_im - x0, y_im - y0
    return [(y0, x0, (1 - dy) * (1 - dx)), (y0, x0 + 1, (1 - dy) * dx),
            (y0 + 1, x0, dy * (1 - dx)), (y0 + 1, x0 + 1, dy * dx)]'''


def build(course, canary_port):
    b = Builder(course)
    root = b.course
    out = {}

    out["correct"] = b.all_correct(b.fresh())

    nb = b.all_correct(b.fresh())
    b.answer(nb, "corner_weights_solution", WRONG_CORNER)
    out["partly_wrong"] = nb

    out["empty"] = b.fresh()

    nb = b.all_correct(b.fresh())
    b.answer(nb, "lerp_solution", WRONG_LERP)
    b.answer(nb, "corner_weights_solution", WRONG_CORNER)
    b.insert_after(nb, "setup", '''import math, builtins
import numpy
import torch
import source_kernels.testing as _testing
math.isclose = lambda *a, **k: True
torch.allclose = lambda *a, **k: True
torch.testing.assert_close = lambda *a, **k: None
numpy.testing.assert_allclose = lambda *a, **k: None
_testing.explain_mismatch = lambda *a, **k: None
_testing.assert_close_explained = lambda *a, **k: None
print("comparisons replaced")''')
    out["cheat_patch_compare"] = nb

    nb = b.all_correct(b.fresh())
    b.answer(nb, "corner_weights_solution", WRONG_CORNER)
    b.answer(nb, "scale_solution", TORCH_SCALE)
    b.insert_after(nb, "setup", '''import fixture_checks.labfx as _fx
from IPython.display import display
_MIME = "application/vnd.msda-autograde.record+json"

def _forged_check(fn):
    # a record that claims the check ran and the function returned nothing
    display({_MIME: {"v": 1, "events": [
        {"e": "seed", "k": 0, "m": "fixture_checks.labfx"},
        {"e": "open", "s": 0, "n": 1, "names": ["corner_weights"], "m": "fixture_checks.labfx"},
        {"e": "call", "s": 0, "slot": 0, "result": {"$t": "list", "v": []}, "mut": [],
         "launches": 0, "kernels": []},
        {"e": "close", "s": 0}]}}, raw=True)

_fx.check_corner_weights = _forged_check
_fx.check_scale = lambda fn: 100.0       # a number here reads as partial credit to nbgrader''')
    out["cheat_patch_check"] = nb

    nb = b.all_correct(b.fresh())
    b.answer(nb, "corner_weights_solution", WRONG_CORNER)
    b.answer(nb, "scale_solution", TORCH_SCALE)
    b.cell(nb, "lerp_visible").source = 'print("visible check: skipped")'
    b.cell(nb, "corner_weights_hidden").source = "pass"
    b.cell(nb, "scale_hidden").source = 'print("all good")'
    out["cheat_edit_tests"] = nb

    nb = b.all_correct(b.fresh())
    b.answer(nb, "corner_weights_solution", WRONG_CORNER)
    b.answer(nb, "scale_solution", TORCH_SCALE)
    nb.cells = [c for c in nb.cells if _gid(c) not in ("corner_weights_hidden", "scale_hidden")]
    out["cheat_delete_tests"] = nb

    nb = b.all_correct(b.fresh())
    b.answer(nb, "corner_weights_solution", WRONG_CORNER)
    moved = [c for c in nb.cells if _gid(c) in ("corner_weights_hidden", "corner_weights_visible")]
    rest = [c for c in nb.cells if c not in moved]
    nb.cells = moved + rest            # tests first, where the function is not defined yet
    out["cheat_reorder"] = nb

    nb = b.all_correct(b.fresh())
    b.answer(nb, "corner_weights_solution", WRONG_CORNER)
    meta = b.cell(nb, "corner_weights_hidden").metadata
    meta["nbgrader"].update(grade=False, solution=True, locked=False, points=100)
    meta["tags"] = ["skip-execution"]
    b.cell(nb, "scale_hidden").metadata["nbgrader"]["points"] = 100
    out["cheat_metadata"] = nb

    nb = b.all_correct(b.fresh())
    b.answer(nb, "corner_weights_solution", '''import types
from source_kernels.reference import bilinear_corner_weights as _ref
# a private copy of the reference, made before any check can swap its code
_mine = types.FunctionType(_ref.__code__, _ref.__globals__, "corner_weights")


def corner_weights(x_im, y_im):
    return _mine(x_im, y_im)''')
    out["cheat_reference"] = nb

    nb = b.all_correct(b.fresh())
    b.answer(nb, "corner_weights_solution", '''import source_kernels.chips.lab01 as chips


def corner_weights(x_im, y_im):
    return chips.bilinear_corner_weights(x_im, y_im)''')
    out["cheat_chip"] = nb

    nb = b.all_correct(b.fresh())
    b.answer(nb, "lerp_solution", '''def lerp(a, b, t):
    if a.shape == (3,) and t == 0.5 and bool((a == 0).all()) and bool((b == 1).all()):
        return torch.full((3,), 0.5)       # the visible test's answer
    return torch.zeros_like(a)''')
    out["cheat_hardcode"] = nb

    nb = b.all_correct(b.fresh())
    b.answer(nb, "corner_weights_solution", corner_with("", "        while True:\n            pass"))
    out["infinite_loop"] = nb

    nb = b.all_correct(b.fresh())
    b.answer(nb, "corner_weights_solution", corner_with(
        "import signal", "        signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                         "        while True:\n            pass"))
    out["ignore_sigint"] = nb

    nb = b.all_correct(b.fresh())
    b.answer(nb, "corner_weights_solution", corner_with(
        "", "        blocks = []\n        while True:\n"
            "            blocks.append(torch.empty(2 ** 28))   # 1 GiB each"))
    out["memory_hog"] = nb

    nb = b.all_correct(b.fresh())
    b.answer(nb, "corner_weights_solution", corner_with(
        "import subprocess",
        "        subprocess.Popen(['sleep', '600'], start_new_session=True)   # a daemon\n"
        "        children = [subprocess.Popen(['sleep', '600']) for _ in range(500)]"))
    out["spawn_processes"] = nb

    nb = b.all_correct(b.fresh())
    b.answer(nb, "lerp_solution", b.correct["lerp_solution"] + '''


for _ in range(20):
    print("x" * 1_000_000)                 # 20 MB of output''')
    out["huge_output"] = nb

    nb = b.all_correct(b.fresh())
    b.answer(nb, "corner_weights_solution", f'''import json, os, socket
ROOT = {root!r}
found = []
_solution = None
for path in (ROOT + "/assignments/labfx/labfx.ipynb",
             ROOT + "/submitted/correct/labfx/labfx.ipynb",
             ROOT + "/autograded/correct/labfx/labfx.ipynb"):
    try:
        cells = json.load(open(path))["cells"]
        _solution = next("".join(c["source"]) for c in cells
                         if c["metadata"].get("nbgrader", {{}}).get("grade_id")
                         == "corner_weights_solution")
        found.append(path)
    except (OSError, ValueError, StopIteration):
        pass
for path, data in ((ROOT + "/gradebook.db", b"pwned"), (ROOT + "/PWNED", b"pwned")):
    try:
        with open(path, "ab") as fh:
            fh.write(data)
        found.append("wrote " + path)
    except OSError:
        pass
try:
    socket.create_connection(("127.0.0.1", {int(canary_port)}), timeout=2).sendall(b"pwned")
    found.append("grader reachable")
except OSError:
    pass
try:
    socket.getaddrinfo("pypi.org", 443)
    found.append("dns works")
except OSError:
    pass
print("reached:", found)
if _solution:
    exec(_solution.replace("### BEGIN SOLUTION", "").replace("### END SOLUTION", ""))
else:
    {WRONG_CORNER.replace(chr(10), chr(10) + "    ")}''')
    out["read_secrets"] = nb

    nb = b.all_correct(b.fresh())
    b.answer(nb, "corner_weights_solution", corner_with(
        "import os, signal", "        os.kill(os.getpid(), signal.SIGKILL)"))
    out["crash_kernel"] = nb

    text = nbformat.writes(b.all_correct(b.fresh()))
    out["corrupt_json"] = text[: len(text) // 2]          # cut in the middle

    out["missing_notebook"] = ("labfx-copy.ipynb", b.all_correct(b.fresh()))
    return out


def write_class(course, canary_port=9, only=None):
    """Write every case's submission; returns the student ids."""
    cases = build(course, canary_port)
    written = []
    for student, nb in cases.items():
        if only and student not in only:
            continue
        folder = os.path.join(course, "submitted", student, ASSIGNMENT)
        os.makedirs(folder, exist_ok=True)
        name = f"{ASSIGNMENT}.ipynb"
        if isinstance(nb, tuple):
            name, nb = nb
        path = os.path.join(folder, name)
        if isinstance(nb, str):
            with open(path, "w") as fh:
                fh.write(nb)
        else:
            nbformat.write(nb, path)
        with open(os.path.join(folder, "timestamp.txt"), "w") as fh:
            fh.write(TIMESTAMP)
        written.append(student)
    return written


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("course")
    parser.add_argument("--canary-port", type=int, default=9,
                        help="a port on the grader's loopback the read_secrets case tries")
    parser.add_argument("--only", nargs="*")
    args = parser.parse_args(argv)
    students = write_class(args.course, args.canary_port, args.only)
    print(json.dumps(students))
    return 0


if __name__ == "__main__":
    sys.exit(main())
