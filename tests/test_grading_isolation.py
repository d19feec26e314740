"""Isolation between grading kernels, named incidents and the similarity check, with the real
grading commands and the sandbox on.

- Two ``python -m autograde grade`` commands on two courses at once (two workers each):
  no two running kernels share a uid (read from the ledgers, which record every kernel's uid
  and lifetime); a submission that holds its process limit does not stop another student's
  kernel; each limit a submission runs into is named (process, file size, memory, CPU time);
  a folder without a notebook gets a row in the export; twins and a pasted chip are listed as
  ``needs_review``, honest submissions are not.
- One submission adds keys to its keyrings and files to /tmp and /dev/shm; the next one,
  graded as the same uid, finds none of them.
- Without a sandbox the console says so; where the sandbox is required the error says how to
  get it.
- The similarity check on lab 01: three independently written answers raise no flag, the
  reference pasted with other names, reordered and commented does, the solution does.
"""
from __future__ import annotations

import ast
import copy
import csv
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from support import releases
from support.system import require_grading_sandbox
from support.nbgrader_helpers import run_checked, synthetic_class_generator

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "course"
VENV_BIN = Path(sys.executable).parent
ASSIGNMENT = "labfx"
CORRECT_SCORE = 8.0            # labfx out of 9; the GPU-only check waits for a GPU host


def _sandbox_or_skip():
    require_grading_sandbox()


def _env():
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in
                                                       env.get("PYTHONPATH", "").split(os.pathsep)
                                                       if p])
    return env


def _run(args, cwd, timeout=600, check=True):
    return run_checked(args, cwd, env=_env(), timeout=timeout, check=check)


def _generator():
    return synthetic_class_generator()


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """The fixture course with labfx released, and a builder of submissions."""
    base = tmp_path_factory.mktemp("released")
    course = base / "course"
    shutil.copytree(FIXTURE, course)
    releases.generate(course, ASSIGNMENT)
    return course, _generator().Builder(str(course))


def _course(released, dest, students, config=""):
    """A copy of the released course with ``students`` ({id: notebook or None for a folder
    without a notebook}) in submitted/."""
    source, _ = released
    shutil.copytree(source, dest)
    if config:
        with open(dest / "nbgrader_config.py", "a") as fh:
            fh.write("\n" + config + "\n")
    for student, nb in students.items():
        folder = dest / "submitted" / student / ASSIGNMENT
        folder.mkdir(parents=True)
        (folder / "timestamp.txt").write_text("2026-11-20 12:00:00.000000 UTC")
        if nb is None:
            (folder / "notes.txt").write_text("the notebook was never uploaded")
        else:
            nbformat.write(nb, folder / f"{ASSIGNMENT}.ipynb")
    return dest


def _with_lerp_prefix(builder, code):
    """A correct submission whose lerp answer cell runs ``code`` after defining lerp."""
    nb = builder.all_correct(builder.fresh())
    builder.answer(nb, "lerp_solution", builder.correct["lerp_solution"] + "\n\n\n" + code)
    return nb


def _ledgers(course):
    folder = course / "autograde_status" / ASSIGNMENT
    return {p.stem: json.loads(p.read_text()) for p in folder.glob("*.json")
            if p.stem != "similarity"}


def _report(course):
    from autograde.runner.cli import report_rows
    return {r["student_id"]: r for r in report_rows(str(course), ASSIGNMENT)}


def _cell_text(course, student, gid):
    nb = nbformat.read(course / "autograded" / student / ASSIGNMENT / f"{ASSIGNMENT}.ipynb",
                       as_version=4)
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == gid)
    return "".join(o.get("text", "") + o.get("evalue", "") for o in cell.outputs)


# ------------------------------------------------------------------ submissions
KEYCTL = '''import ctypes, json, os
_libc = ctypes.CDLL(None, use_errno=True)
_ADD_KEY, _KEYCTL = {"x86_64": (248, 250), "aarch64": (217, 219)}[os.uname().machine]
_RINGS = {"user": -4, "user-session": -5, "session": -3}
'''

LEAVE_TRACES = KEYCTL + '''planted = {name: _libc.syscall(_ADD_KEY, b"user", b"autograde-leak", b"secret", 6,
                             ctypes.c_long(ring)) for name, ring in _RINGS.items()}
for folder in ("/tmp", "/dev/shm"):
    with open(folder + "/autograde-leak", "w") as fh:
        fh.write("secret")
print("planted", json.dumps({"keys": planted, "uid": os.getuid()}))
'''

LOOK_FOR_TRACES = KEYCTL + '''found = {name: _libc.syscall(_KEYCTL, 10, ctypes.c_long(ring), b"user", b"autograde-leak", 0)
         for name, ring in _RINGS.items()}                   # KEYCTL_SEARCH
files = [f for f in ("/tmp", "/dev/shm") if os.path.exists(f + "/autograde-leak")]
print("found", json.dumps({"keys": found, "files": files, "uid": os.getuid()}))
'''

HOLD_PROCESSES = '''import subprocess, time
children = []
try:
    while True:
        children.append(subprocess.Popen(["sleep", "120"]))
except OSError as exc:
    error = exc
print("processes started before the limit:", len(children))
time.sleep(3)                    # hold the uid's whole process budget while others start
raise error
'''

BIG_FILE = '''with open("/tmp/big.bin", "wb") as fh:
    for _ in range(80):
        fh.write(b"x" * 2 ** 20)  # 80 MiB, past the 64 MiB file-size limit
'''

BIG_ALLOCATION = '''block = bytearray(16 * 2 ** 30)       # past the 4 GiB address-space limit
'''

BURN_CPU = '''while True:                           # past the CPU-time limit, before the cell's timeout
    pass
'''

# two students hand in one longer answer: names changed, statements reordered, comments new
TWIN_1 = '''def corner_weights(x_im, y_im):
    """x_im, y_im: floats. Returns [(row, col, weight)] for the four corners."""
    col = math.floor(x_im)
    row = math.floor(y_im)
    right = x_im - col
    down = y_im - row
    left = 1.0 - right
    up = 1.0 - down
    corners = []
    for d_row, w_row in ((0, up), (1, down)):
        for d_col, w_col in ((0, left), (1, right)):
            corners.append((row + d_row, col + d_col, w_row * w_col))
    return corners
'''
TWIN_2 = '''def corner_weights(x_im, y_im):
    """x_im, y_im: floats. Returns [(row, col, weight)] for the four corners."""
    # the pixel's top-left corner
    r0 = math.floor(y_im)
    c0 = math.floor(x_im)
    fy = y_im - r0      # how far down
    fx = x_im - c0      # how far right
    gy = 1.0 - fy
    gx = 1.0 - fx
    result = []
    for step_r, wr in ((0, gy), (1, fy)):
        for step_c, wc in ((0, gx), (1, fx)):
            result.append((r0 + step_r, c0 + step_c, wr * wc))   # weight is a product
    return result
'''


def _renamed(function, prefix):
    """The source of ``function`` with every argument and local variable renamed, the
    docstring dropped and a comment of the student's own: a chip pasted and disguised."""
    tree = ast.parse(inspect.getsource(function))
    fn = tree.body[0]
    names = [a.arg for a in fn.args.args]
    names += [n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and
              isinstance(n.ctx, ast.Store)]
    mapping = {name: f"{prefix}{i}" for i, name in enumerate(dict.fromkeys(names))}
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and node.id in mapping:
            node.id = mapping[node.id]
        elif isinstance(node, ast.arg) and node.arg in mapping:
            node.arg = mapping[node.arg]
    fn.body = fn.body[1:] if isinstance(fn.body[0], ast.Expr) else fn.body
    fn.name = "my_flat_attention"
    return "# my own flat version, written for this lab\n" + ast.unparse(tree)


# ------------------------------------------------------------------ two commands at once
@pytest.fixture(scope="module")
def two_commands(released, tmp_path_factory):
    _sandbox_or_skip()
    from source_kernels import reference
    from source_kernels.chips import lab02
    _, b = released
    base = tmp_path_factory.mktemp("two")
    pasted = b.all_correct(b.fresh())
    # the chip pasted with what it calls (the grading kernel cannot import the reference)
    b.answer(pasted, "corner_weights_solution",
             "import math\nimport torch\n\n\n" + inspect.getsource(reference.pixel_coordinate)
             + "\n\n" + _renamed(lab02.msda_flat, "t") + "\n\n\n" +
             b.correct["corner_weights_solution"])
    twins = []
    for text in (TWIN_1, TWIN_2):
        nb = b.all_correct(b.fresh())
        b.answer(nb, "corner_weights_solution", text)
        twins.append(nb)
    course_a = _course(released, base / "a", {
        "a_holds_processes": _with_lerp_prefix(b, HOLD_PROCESSES),
        "a_honest": b.all_correct(b.fresh()),
        "a_big_file": _with_lerp_prefix(b, BIG_FILE),
        "a_no_notebook": None,
    }, config="c.AutogradeSettings.lab_timeouts = {'labfx': 60}\n"
              # course a is about limits; its students hand in the solution's text, which
              # the similarity check (tested on course b) would list for review
              "c.AutogradeSettings.similarity_threshold = 0")
    course_b = _course(released, base / "b", {
        "b_honest": b.all_correct(b.fresh()),
        "b_big_allocation": _with_lerp_prefix(b, BIG_ALLOCATION),
        "b_burns_cpu": _with_lerp_prefix(b, BURN_CPU),
        "b_twin_1": twins[0], "b_twin_2": twins[1], "b_pasted_chip": pasted,
    }, config="c.AutogradeSettings.lab_timeouts = {'labfx': 90}\n"
              "c.AutogradeSettings.cpu_seconds = 10")
    cmd = [VENV_BIN / "python", "-m", "autograde", "grade", ASSIGNMENT, "--workers", "2",
           "--no-progress"]
    started = time.monotonic()
    procs = [subprocess.Popen([str(c) for c in cmd], cwd=course, env=_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for course in (course_a, course_b)]
    outputs = [p.communicate(timeout=600) for p in procs]
    seconds = time.monotonic() - started
    for p, (out, err) in zip(procs, outputs):
        assert p.returncode == 0, out[-3000:] + err[-3000:]
    return {"a": course_a, "b": course_b, "outputs": outputs, "seconds": seconds}


def test_two_grading_commands_at_once_never_share_a_uid(two_commands):
    kernels = []
    for name in ("a", "b"):
        for student, entry in _ledgers(two_commands[name]).items():
            for nb in entry.get("notebooks", {}).values():
                for k in nb.get("kernels", []):
                    kernels.append((name, student, k["uid"], k["start"], k["end"]))
    assert len(kernels) >= 9, kernels
    clashes = [(x, y) for i, x in enumerate(kernels) for y in kernels[i + 1:]
               if x[2] == y[2] and x[3] < y[4] and y[3] < x[4]]
    assert clashes == [], clashes
    # the two commands did run kernels at the same time
    assert any(x[0] != y[0] and x[3] < y[4] and y[3] < x[4]
               for i, x in enumerate(kernels) for y in kernels[i + 1:])


def test_a_submission_holding_its_process_limit_blocks_no_one_else(two_commands):
    a, b = _report(two_commands["a"]), _report(two_commands["b"])
    assert (float(a["a_honest"]["score"]), a["a_honest"]["status"]) == \
        (CORRECT_SCORE, "needs_gpu"), a["a_honest"]
    # b_honest hands in the solution's text, so course b's similarity check lists it for review
    # (test_copies_are_listed_for_review_and_honest_answers_are_not); its score is whole
    assert float(b["b_honest"]["score"]) == CORRECT_SCORE, b["b_honest"]
    for row in (a["a_honest"], b["b_honest"]):
        assert "did not start" not in row["reasons"] and "limit" not in row["reasons"], row
    holder = a["a_holds_processes"]
    assert "lerp_solution: process limit: BlockingIOError" in holder["reasons"], holder
    assert "processes started before the limit" in \
        _cell_text(two_commands["a"], "a_holds_processes", "lerp_solution")
    assert float(holder["score"]) == CORRECT_SCORE


def test_limits_are_named_in_the_report_and_the_export(two_commands):
    a, b = _report(two_commands["a"]), _report(two_commands["b"])
    assert "lerp_solution: file-size limit: a file grew past 64 MiB" in \
        a["a_big_file"]["reasons"], a["a_big_file"]
    assert "lerp_solution: memory limit: MemoryError under the 4096 MiB address-space limit" \
        in b["b_big_allocation"]["reasons"], b["b_big_allocation"]
    assert "lerp_solution: the kernel died while running this cell" in \
        b["b_burns_cpu"]["reasons"] and "CPU-time limit: the kernel used its 10 CPU seconds" \
        in b["b_burns_cpu"]["reasons"], b["b_burns_cpu"]
    # the kernel was restarted and the rest of the submission graded
    assert float(b["b_burns_cpu"]["score"]) == CORRECT_SCORE - 3   # lerp: visible + hidden
    course = two_commands["a"]
    _run([VENV_BIN / "nbgrader", "export", "--to", course / "grades.csv"], cwd=course)
    with open(course / "grades.csv") as fh:
        rows = {r["student_id"]: r for r in csv.DictReader(fh)}
    assert (rows["a_no_notebook"]["score"], rows["a_no_notebook"]["status"]) == \
        ("", "ungradable"), rows["a_no_notebook"]
    assert "no notebook in the submission" in rows["a_no_notebook"]["reasons"]
    assert "process limit" in rows["a_holds_processes"]["reasons"]
    assert "file-size limit" in rows["a_big_file"]["reasons"]
    assert a["a_no_notebook"]["status"] == "ungradable"


def test_copies_are_listed_for_review_and_honest_answers_are_not(two_commands):
    b = _report(two_commands["b"])
    # Short answers are compared too (autograde/runner/similarity.py): the synthetic students hand in
    # the solution's own text for the cells they do not vary (corner_weights, scale: 3 and 5
    # statements, once below the old minimum of 8), so those cells are listed "to the lab's
    # solution" for every one of them; what this test pins is which pairs are listed for the
    # cell the twins and the pasted chip vary.
    for twin, other in (("b_twin_1", "b_twin_2"), ("b_twin_2", "b_twin_1")):
        row = b[twin]
        assert row["status"] == "needs_review" and float(row["score"]) == CORRECT_SCORE, row
        assert f"corner_weights_solution: similarity 100 % to student {other}'s answer" in \
            row["reasons"], row
        assert not re.search(r"corner_weights_solution: similarity \d+ % to the lab's solution",
                             row["reasons"]), row
    pasted = b["b_pasted_chip"]
    assert pasted["status"] == "needs_review" and float(pasted["score"]) == CORRECT_SCORE
    match = re.search(r"corner_weights_solution: similarity (\d+) % to "
                      r"source_kernels/chips/lab02.py \(msda_flat", pasted["reasons"])
    assert match and int(match.group(1)) >= 90, pasted
    for student in ("b_honest", "b_big_allocation", "b_burns_cpu"):
        # the solution's own corner_weights: listed to the solution, never to the twins'
        # answer (the pasted chip's answer ends with the solution's corner_weights, so it and
        # these students are, rightly, listed to each other)
        reasons = b[student]["reasons"]
        assert "corner_weights_solution: similarity 100 % to the lab's solution" in reasons, \
            b[student]
        corner = [r for r in reasons.split("; ") if "corner_weights_solution:" in r]
        for other in ("b_twin_1", "b_twin_2"):
            assert not any(f"to student {other}'s answer" in r for r in corner), b[student]
    saved = json.loads((two_commands["b"] / "autograde_status" / ASSIGNMENT /
                        "similarity.json").read_text())
    assert {"b_twin_1", "b_twin_2", "b_pasted_chip"} <= set(saved["flags"])
    assert (two_commands["b"] / "autograde_status" / ASSIGNMENT / "similarity.html").is_file()


# ------------------------------------------------------------------ one uid, one after another
ONE_UID = 70123          # beyond every pool the tests use (64123.., 64400..65651 for the hubs)


def test_keys_and_files_of_one_submission_do_not_reach_the_next(released, tmp_path):
    _sandbox_or_skip()
    _, b = released
    # a pool of one uid of this test's own (outside the default pool and the other tests'):
    # the second kernel waits for the first's scrub and takes the same uid, whatever other
    # grading holds on the host
    course = _course(released, tmp_path / "course", {
        "k1_leaves_traces": _with_lerp_prefix(b, LEAVE_TRACES),
        "k2_looks_for_them": _with_lerp_prefix(b, LOOK_FOR_TRACES),
    }, config=f"c.AutogradeSettings.kernel_uid = {ONE_UID}\n"
              "c.AutogradeSettings.kernel_uid_count = 1")
    _run([VENV_BIN / "python", "-m", "autograde", "grade", ASSIGNMENT, "--workers", "1",
          "--no-progress"], cwd=course)
    planted = _cell_text(course, "k1_leaves_traces", "lerp_solution")
    found = _cell_text(course, "k2_looks_for_them", "lerp_solution")
    planted = json.loads(planted.split("planted", 1)[1].strip().splitlines()[0])
    found = json.loads(found.split("found", 1)[1].strip().splitlines()[0])
    # the test means something only if the keys were added and both ran as one uid
    assert all(serial > 0 for serial in planted["keys"].values()), planted
    assert planted["uid"] == found["uid"], (planted, found)
    assert found["keys"] == {"user": -1, "user-session": -1, "session": -1}, found
    assert found["files"] == [], found
    ledgers = _ledgers(course)
    uids = [k["uid"] for e in ledgers.values() for nb in e["notebooks"].values()
            for k in nb["kernels"]]
    assert set(uids) == {planted["uid"]}


# ------------------------------------------------------------------ the socket folder
SOCKET_FOLDER = '''
import json, os
folder = os.path.dirname(json.load(open("/run/autograde/connection.json"))["ip"])
seen = {}
for name, attempt in (("list", lambda: os.listdir(folder)),
                      ("write", lambda: open(os.path.join(folder, "spill"), "w").write("x")),
                      ("link", lambda: os.symlink("/tmp", os.path.join(folder, "spill")))):
    try:
        attempt()
        seen[name] = "done"
    except OSError as exc:
        seen[name] = type(exc).__name__
print("SEEN", json.dumps(seen))
'''
# what an ipykernel_launcher.py of the submission did (issue 30): keep a file of the socket
# folder open from before the folder is closed; only the course's startup code runs that
# early now, so the test puts it there
KEEP_A_HANDLE = ("; import json as _j, os as _o; _spill = open(_o.path.join(_o.path.dirname("
                 "_j.load(open('/run/autograde/connection.json'))['ip']), 'spill'), 'w')")


async def _sandboxed_kernel(code, extra_startup="", uid=64910):
    """Start one grading kernel in the sandbox (as the grader does), close its socket folder,
    run ``code``; returns (what close_socket_dir found, the cell's stdout, the folder's
    entries and the size of any spill file afterwards)."""
    from autograde.config import AutogradeSettings
    from autograde.isolation.kernel import KernelSetup

    settings = AutogradeSettings(kernel_uid=uid, kernel_uid_count=4)
    setup = KernelSetup(mode="bwrap", environment="cpu", settings=settings, seed="ab" * 16,
                        assignment=ASSIGNMENT)
    if extra_startup:
        with open(setup.spec_path) as fh:
            spec = json.load(fh)
        spec["kernel_args"] = [spec["kernel_args"][0] + extra_startup]
        with open(setup.spec_path, "w") as fh:
            json.dump(spec, fh)
    km = setup.kernel_manager()
    kc = None
    try:
        await km.start_kernel()
        kc = km.client()
        kc.start_channels()
        await kc.wait_for_ready(timeout=180)
        problems = setup.close_socket_dir()
        msg_id = kc.execute(code)
        text = ""
        while True:
            msg = await kc.get_iopub_msg(timeout=120)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                text += msg["content"]["text"]
            elif msg["msg_type"] == "error":
                text += msg["content"]["ename"] + ": " + msg["content"]["evalue"]
            elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        spill = os.path.join(setup.sock_dir, "spill")
        entries = sorted(os.listdir(setup.sock_dir))
        size = os.path.getsize(spill) if os.path.exists(spill) else None
        return problems, text, entries, size
    finally:
        if kc is not None:
            kc.stop_channels()
        await km.shutdown_kernel(now=True)
        setup.cleanup(wait=True)


def test_the_kernel_cannot_write_into_its_socket_folder_once_closed():
    """Issue 30: the kernel's ZeroMQ socket folder is a host folder, outside the sandbox's
    size- and inode-limited folders.  Once the kernel is up the grader takes it back: a cell
    can neither list it nor create anything in it, and the grader's check finds no process of
    the kernel's uid holding anything there."""
    import asyncio

    _sandbox_or_skip()
    problems, text, entries, size = asyncio.run(_sandboxed_kernel(SOCKET_FOLDER))
    assert problems == [], problems
    seen = json.loads(text.split("SEEN", 1)[1].strip().splitlines()[0])
    assert seen == {"list": "PermissionError", "write": "PermissionError",
                    "link": "PermissionError"}, seen
    assert size is None and all(e.startswith("k-") for e in entries), entries


def test_a_handle_kept_on_the_socket_folder_is_found_when_it_is_closed():
    """A descriptor opened before the folder was closed still writes there (the permission
    is checked at open), without a bound but the per-file limit: the grader's check at close
    names it, and the grading command then does not run the notebook in that kernel."""
    import asyncio

    _sandbox_or_skip()
    problems, text, entries, size = asyncio.run(_sandboxed_kernel(
        "_spill.write('x' * 4096); _spill.flush(); print('WROTE')", KEEP_A_HANDLE))
    assert "WROTE" in text, text                       # the mechanism the check guards against
    assert size == 4096 and "spill" in entries
    assert any("of the kernel's uid holds" in p and p.endswith("/spill") for p in problems), \
        problems
    assert any("a file that is not a socket" in p for p in problems), problems


# ------------------------------------------------------------------ no sandbox
def test_without_a_sandbox_the_console_says_so(released, tmp_path):
    _, b = released
    course = _course(released, tmp_path / "course", {"n_correct": b.all_correct(b.fresh())},
                     config="c.AutogradeSettings.sandbox = 'none'")
    proc = _run([VENV_BIN / "python", "-m", "autograde", "grade", ASSIGNMENT, "--no-progress"],
                cwd=course)
    assert "GRADING RUNS WITHOUT A SANDBOX" in proc.stderr, proc.stderr[-2000:]
    assert float(_report(course)["n_correct"]["score"]) == CORRECT_SCORE


def test_a_required_sandbox_says_how_to_get_it(monkeypatch):
    from autograde.pipeline import execute
    from autograde.config import AutogradeSettings
    settings = AutogradeSettings()
    assert settings.sandbox_required is sys.platform.startswith("linux")
    monkeypatch.setitem(execute._SANDBOX_CACHE, "v", (
        False, "bwrap (bubblewrap) is not installed: apt-get install bubblewrap"))
    if settings.sandbox_required:
        with pytest.raises(RuntimeError) as err:
            execute.resolve_sandbox(settings)
        assert "apt-get install bubblewrap" in str(err.value) and "as root" in str(err.value)
    assert execute.resolve_sandbox(AutogradeSettings(require_sandbox=False)) == "none"
    assert execute.resolve_sandbox(AutogradeSettings(sandbox="none")) == "none"
    assert "WITHOUT A SANDBOX" in execute.sandbox_warning(AutogradeSettings(sandbox="none"))


# ------------------------------------------------------------------ similarity on lab 01
LAB01 = "lab01_the_spec"
SIGNATURE = '''def msda_naive(value, spatial_shapes, level_start_index, sampling_locations, attention_weights):
    """value (B, S, M, D); spatial_shapes (L, 2) int64; level_start_index (L,) int64;
    sampling_locations (B, Q, M, L, K, 2); attention_weights (B, Q, M, L, K).
    Returns (B, Q, M*D) in the dtype of value."""
'''
HONEST_MSDA = {
    "honest_loops": SIGNATURE + '''    B, S, M, D = value.shape
    Q, L, K = sampling_locations.shape[1], sampling_locations.shape[3], sampling_locations.shape[4]
    result = torch.zeros(B, Q, M, D, dtype=torch.float64)
    starts = [int(i) for i in level_start_index]
    sizes = [(int(h), int(w)) for h, w in spatial_shapes]
    for b in range(B):
        for q in range(Q):
            for m in range(M):
                acc = torch.zeros(D, dtype=torch.float64)
                for l, (h, w) in enumerate(sizes):
                    level = value[b, starts[l]:starts[l] + h * w, m].double().view(h, w, D)
                    for k in range(K):
                        loc = sampling_locations[b, q, m, l, k]
                        a = attention_weights[b, q, m, l, k].item()
                        acc += a * bilinear_sample_naive(level, loc[0].item(), loc[1].item())
                result[b, q, m] = acc
    return result.flatten(2).to(value.dtype)
''',
    "honest_product": SIGNATURE + '''    import itertools
    n_batch, _, n_heads, dim = value.shape
    n_query, n_level, n_point = (sampling_locations.shape[1], sampling_locations.shape[3],
                                 sampling_locations.shape[4])
    maps = []
    for lvl in range(n_level):
        h, w = spatial_shapes[lvl].tolist()
        s0 = level_start_index[lvl].item()
        maps.append(value[:, s0:s0 + h * w].double().reshape(n_batch, h, w, n_heads, dim))
    rows = []
    for b, q, m in itertools.product(range(n_batch), range(n_query), range(n_heads)):
        total = torch.zeros(dim, dtype=torch.float64)
        for lvl, p in itertools.product(range(n_level), range(n_point)):
            x, y = (float(t) for t in sampling_locations[b, q, m, lvl, p])
            a = float(attention_weights[b, q, m, lvl, p])
            total = total + a * bilinear_sample_naive(maps[lvl][b, :, :, m], x, y)
        rows.append(total)
    out = torch.stack(rows).reshape(n_batch, n_query, n_heads * dim)
    return out.to(value.dtype)
''',
    "honest_split": SIGNATURE + '''    B, _, M, D = value.shape
    _, Q, _, L, K, _ = sampling_locations.shape
    hw = [int(h) * int(w) for h, w in spatial_shapes]
    levels = value.double().split(hw, dim=1)
    out = value.new_zeros((B, Q, M, D), dtype=torch.float64)
    for lid, lv in enumerate(levels):
        H, W = int(spatial_shapes[lid, 0]), int(spatial_shapes[lid, 1])
        grid = lv.reshape(B, H, W, M, D)
        for b in range(B):
            for m in range(M):
                img = grid[b, :, :, m, :]
                for q in range(Q):
                    for k in range(K):
                        px = float(sampling_locations[b, q, m, lid, k, 0])
                        py = float(sampling_locations[b, q, m, lid, k, 1])
                        w_att = attention_weights[b, q, m, lid, k].item()
                        out[b, q, m] += w_att * bilinear_sample_naive(img, px, py)
    return out.view(B, Q, M * D).to(value.dtype)
''',
}
# source_kernels.reference.msda_naive pasted: names changed, independent statements
# reordered, comments of the student's own
PASTED_REFERENCE = SIGNATURE + '''    # my own implementation
    n_b, _, n_h, n_c = value.shape
    _, n_q, _, n_l, n_p, _ = sampling_locations.shape
    weights_ = attention_weights.detach().double().cpu()   # attention
    locs = sampling_locations.detach().double().cpu()
    vals = value.detach().double().cpu()
    offsets = level_start_index.tolist()
    hw = spatial_shapes.tolist()
    result = torch.zeros(n_b, n_q, n_h, n_c, dtype=torch.float64)
    for i in range(n_b):
        for j in range(n_q):
            for h in range(n_h):
                for level in range(n_l):
                    first = offsets[level]
                    H, W = hw[level]
                    img = vals[i, first:first + H * W, h].reshape(H, W, n_c)
                    for p in range(n_p):
                        px, py = locs[i, j, h, level, p].tolist()
                        s = bilinear_sample_naive(img, px, py)   # sample the map
                        result[i, j, h] += weights_[i, j, h, level, p] * s
    return result.reshape(n_b, n_q, n_h * n_c).to(value.dtype)
'''


def test_similarity_on_a_real_lab(tmp_path):
    """Lab 01's naive MSDA: three answers written independently stay well under the
    threshold (against the solution, the course's modules and each other); the reference
    pasted in disguise and the solution itself are listed."""
    from autograde.runner import similarity
    from autograde.config import AutogradeSettings
    from autograde.runner.parallel import _coursedir, _load_config
    course = tmp_path / "course"
    (course / "assignments").mkdir(parents=True)
    shutil.copy(REPO / "nbgrader_config.py", course / "nbgrader_config.py")
    shutil.copytree(REPO / "assignments" / LAB01, course / "assignments" / LAB01)
    releases.generate(course, LAB01)
    release = nbformat.read(course / "release" / LAB01 / f"{LAB01}.ipynb", as_version=4)
    source = nbformat.read(course / "assignments" / LAB01 / f"{LAB01}.ipynb", as_version=4)
    solutions = similarity.answer_cells(source)
    answers = dict(HONEST_MSDA, pasted_reference=PASTED_REFERENCE)
    # the short stages: short answers are compared too, so each student has independently
    # written ones of their own (from the similarity corpus), not the solution's
    corpus = REPO / "tests" / "fixtures" / "similarity" / LAB01
    short = {gid: sorted((corpus / gid).glob("honest_*.py"))
             for gid in ("lab01_corner_weights", "lab01_bilinear_sample")}
    for i, (student, text) in enumerate(list(answers.items()) + [("solution", None)]):
        nb = copy.deepcopy(source if text is None else release)
        for cell in nb.cells:
            gid = cell.metadata.get("nbgrader", {}).get("grade_id")
            if text is not None and gid in solutions:
                cell.source = text if gid == "lab01_msda_naive" else short[gid][i].read_text()
        folder = course / "submitted" / student / LAB01
        folder.mkdir(parents=True)
        nbformat.write(nb, folder / f"{LAB01}.ipynb")
    config = _load_config(str(course))
    settings = AutogradeSettings(config=config)
    flags, record = similarity.class_flags(str(course), settings, _coursedir(config, str(course)),
                                           LAB01)
    assert set(flags) == {"pasted_reference", "solution"}, flags
    # the paste reorders independent statements: the k-grams that run across those seams
    # differ, the rest match (above 90 %)
    pasted = re.compile(r"lab01_msda_naive: similarity (\d+) % to source_kernels/reference.py "
                        r"\(msda_naive")
    assert any((m := pasted.search(f)) and int(m.group(1)) >= 90
               for f in flags["pasted_reference"]), flags
    assert any("similarity 100 % to the lab's solution" in f for f in flags["solution"])
    threshold = similarity.threshold_for(settings, LAB01, "lab01_msda_naive")
    honest = [r["similarity"] for r in record if r["student"] in HONEST_MSDA and
              r["cell"].endswith("lab01_msda_naive") and
              r["source"] not in ("pasted_reference", "solution")]
    assert max(honest, default=0) < threshold - 0.15, record
    from autograde.runner.cli import report_rows
    rows = {r["student_id"]: r for r in report_rows(str(course), LAB01)}
    assert re.search(r"similarity check: lab01_the_spec/lab01_msda_naive: similarity (9\d|100) %",
                     rows["pasted_reference"]["reasons"]), rows["pasted_reference"]
    assert "similarity" not in rows["honest_loops"]["reasons"]


def test_similarity_ignores_renaming_reordering_comments_and_the_template():
    from autograde.runner.similarity import kgrams, own_statements
    a = "def f(x, y):\n    s = x + y  # sum\n    d = x - y\n    return s * d * 2.5\n"
    b = "def g(p, q):\n    '''doc'''\n    diff = p - q\n    total = p + q\n" \
        "    return total * diff * 2.5   # product\n"
    assert kgrams(own_statements(a), 8) == kgrams(own_statements(b), 8)
    template = "def f(x, y):\n    '''doc'''\n    raise NotImplementedError()\n"
    assert len(own_statements(a, template)) == len(own_statements(a)) - 1   # the header
    assert kgrams(own_statements("x = torch.ones(3)\n"), 8) != \
        kgrams(own_statements("x = torch.zeros(3)\n"), 8)          # attributes count


# ------------------------------------------------------------------ GPUs
def test_gpu_kernels_take_the_hosts_gpus_in_turn():
    """The assignment logic, on any host: kernels running together get the GPUs in turn by
    their slot in the uid pool.  On a 2-GPU host the same shows in the ledgers (see
    autograde/isolation/gpus.py and the report)."""
    from autograde.isolation import gpus
    from autograde.config import AutogradeSettings
    from autograde.isolation.kernel import KernelSetup
    assert gpus.host_gpus("", {"CUDA_VISIBLE_DEVICES": "2,3"}) == ["2", "3"]
    assert gpus.host_gpus("0,1", {"CUDA_VISIBLE_DEVICES": "5"}) == ["0", "1"]
    assert [gpus.for_kernel(s, ["0", "1"]) for s in range(5)] == ["0", "1", "0", "1", "0"]
    assert gpus.for_kernel(3, ["0", "1"], per_kernel=False) == "0,1"
    assert gpus.for_kernel(0, []) == ""
    _sandbox_or_skip()
    settings = AutogradeSettings(gpu_devices="0,1")
    setups = [KernelSetup(mode="bwrap", environment="gpu", settings=settings, seed="s")
              for _ in range(3)]
    try:
        specs = [json.loads(Path(s.spec_path).read_text()) for s in setups]
        uids = [s.uid for s in setups]
        assert len(set(uids)) == 3
        for setup, spec in zip(setups, specs):
            expected = ["0", "1"][(setup.uid - settings.kernel_uid) % 2]
            assert spec["env"]["CUDA_VISIBLE_DEVICES"] == setup.gpu == expected
        if uids[1] == uids[0] + 1:
            assert {setups[0].gpu, setups[1].gpu} == {"0", "1"}
        cpu = KernelSetup(mode="bwrap", environment="cpu", settings=settings, seed="s")
        assert cpu.gpu is None and \
            json.loads(Path(cpu.spec_path).read_text())["env"]["CUDA_VISIBLE_DEVICES"] == ""
        cpu.cleanup()
    finally:
        for setup in setups:
            setup.cleanup()
