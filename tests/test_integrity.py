"""Grading integrity without a sandbox: the record/replay path, the static rules on the
notebook's source, and what the grader prints.

Each attack here is one of issue 30's, reproduced in this process the way the grading kernel
records a check and the grader replays it (``autograde.trust.recording``): the solution's cells run
in a module, one answer replaced by the attack; the check runs recording, then the grader
replays it against the record.
"""
from __future__ import annotations

import linecache
import sys
import types
from pathlib import Path

import nbformat
import pytest
import torch

import source_kernels  # noqa: F401  (the interpreter switch, before any kernel is defined)

from support.nbgrader_helpers import BEGIN_HIDDEN, nbgrader_meta, source_notebook

LAB05 = "lab05_forward_correct"

# Lab 05's kernel that computes nothing: it writes zeros into the attention weights it was
# given and a zero tile into out.  Before private copies, the replay copied the zeroed
# weights into the grader's inputs and the grader expected zeros: 12 of the kernel's points.
ZERO_KERNEL = '''
@triton.jit
def msda_forward_kernel(value_ptr, shapes_ptr, starts_ptr, loc_ptr, attn_ptr, out_ptr,
                        S, Q, M, D,
                        L: tl.constexpr, K: tl.constexpr,
                        BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr, ACC_DTYPE: tl.constexpr):
    pid_q = tl.program_id(0)
    pid_bm = tl.program_id(1)
    b = pid_bm // M
    m = pid_bm % M
    offs_q = pid_q * BLOCK_Q + tl.arange(0, BLOCK_Q)
    mask_q = offs_q < Q
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    row_bqm = (b.to(tl.int64) * Q + offs_q) * M + m
    zero_q = tl.zeros((BLOCK_Q,), dtype=ACC_DTYPE).to(attn_ptr.dtype.element_ty)
    for j in tl.static_range(L * K):
        tl.store(attn_ptr + row_bqm * (L * K) + j, zero_q, mask=mask_q)
    zero = tl.zeros((BLOCK_Q, BLOCK_D), dtype=ACC_DTYPE).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + (row_bqm * D)[:, None] + offs_d[None, :], zero,
             mask=mask_q[:, None] & mask_d[None, :])
'''

# sample_level writing zeros into the value rows it reads, and returning a zero tile
ZERO_SAMPLE = '''
@triton.jit
def sample_level(value_ptr, b, m, S, M, D, start, H, W, x, y, mask_q, offs_d, mask_d):
    x0, dx = corner_coordinate(x, W)
    y0, dy = corner_coordinate(y, H)
    tile = tl.zeros((x.shape[0], offs_d.shape[0]), dtype=x.dtype)
    for corner in tl.static_range(4):
        r = y0 + corner // 2
        c = x0 + corner % 2
        inside = mask_q & (r >= 0) & (r < H) & (c >= 0) & (c < W)
        row = value_offset(b, level_row(start, r, c, H, W), m, S, M, D)
        tl.store(value_ptr + row[:, None] + offs_d[None, :], tile,
                 mask=inside[:, None] & mask_d[None, :])
    return tile
'''


def _namespace(lab, replace):
    """The source notebook's cells but graded ones, run in a module, with the answer cells
    named in ``replace`` ({grade_id: source}) swapped for other code."""
    nb = nbformat.read(source_notebook(lab), as_version=4)
    module = types.ModuleType(f"{lab}_integrity")
    for index, cell in enumerate(nb.cells):
        meta = nbgrader_meta(cell)
        if cell.cell_type != "code" or meta.get("grade") or BEGIN_HIDDEN in cell.source:
            continue
        if not meta.get("solution") and meta.get("grade_id") not in ("lab05_setup",
                                                                    "lab05_launcher"):
            continue
        source = replace.get(meta.get("grade_id"), cell.source)
        name = f"<{lab} integrity cell {index}>"
        linecache.cache[name] = (len(source), None, source.splitlines(True), name)
        exec(compile(source, name, "exec"), module.__dict__)       # noqa: S102
    return module.__dict__


def _record_and_replay(check, functions, secret="integrity"):
    """Run ``check`` as the grading kernel runs it (recording), then as the grader replays it;
    returns (what the kernel side raised or None, what the replay raised or None)."""
    from autograde.trust import recording

    recording._mode, recording._base_seed, recording._counter = "record", secret, 0
    recording._events = []
    in_kernel = None
    try:
        check(*functions.values())
    except AssertionError as exc:
        in_kernel = exc
    finally:
        events, recording._events, recording._mode = recording._events, [], None
    context = recording.ReplayContext(events, secret)
    proxies = [recording.Proxy(context, name) for name in functions]
    try:
        recording.replay_check(check, proxies, {}, context)
    except AssertionError as exc:
        return in_kernel, exc, events
    return in_kernel, None, events


@pytest.mark.parametrize("check_name,grade_id,source,function,written", [
    ("check_forward_inside", "lab05_kernel", ZERO_KERNEL, "msda_forward", "attention_weights"),
    ("check_sample_level", "lab05_sample_level", ZERO_SAMPLE, "sample_level_tester",
     "value_ptr"),
])
def test_lab05_kernel_that_zeroes_its_inputs_fails(check_name, grade_id, source, function,
                                                   written):
    """Issue 30's 23/23 for a kernel that computes nothing: it zeroes the inputs the
    expectation was computed from.  The function now runs on private copies (or, a Triton
    kernel, on inputs restored after it), the call fails as that mistake in the kernel, and
    the replay fails it too even when the kernel sends the same record without failing."""
    from autograde.trust import recording
    from autograde.checks import lab05

    namespace = _namespace(LAB05, {grade_id: source})
    check = getattr(lab05, check_name)
    name = "msda_forward" if check_name != "check_sample_level" else "sample_level"
    in_kernel, replayed, events = _record_and_replay(check, {name: namespace[name]})
    assert isinstance(in_kernel, recording.InputChanged), in_kernel
    assert f"{function}: your code wrote into {written}" in str(in_kernel), str(in_kernel)
    assert isinstance(replayed, recording.InputChanged), replayed
    assert "wrote into" in str(replayed)
    # a record from a kernel whose recorder was silenced (no "wrote" note, the zeroed input
    # sent as a changed argument): the replay copies nothing into its inputs and fails
    forged = []
    for ev in events:
        ev = dict(ev)
        if ev.get("e") == "call" and ev.get("wrote"):
            ev.pop("wrote")
            where = 4 if check_name != "check_sample_level" else 0
            ev["mut"] = list(ev.get("mut") or []) + [[where, ev.get("result")
                                                      or {"$t": "none"}]]
        forged.append(ev)
    context = recording.ReplayContext(forged, "integrity")
    with pytest.raises(AssertionError):
        recording.replay_check(check, [recording.Proxy(context, name)], {}, context)


def test_honest_lab05_kernel_still_passes_record_and_replay():
    from autograde.checks import lab05

    namespace = _namespace(LAB05, {})
    in_kernel, replayed, _ = _record_and_replay(lab05.check_forward_inside,
                                                {"msda_forward": namespace["msda_forward"]})
    assert in_kernel is None and replayed is None, (in_kernel, replayed)


def test_private_copy_keeps_strides_and_leaves():
    from autograde.trust import recording

    base = torch.randn(4, 6, 2)
    strided = torch.stack([base] * 2, -1)[..., 1]                  # gaps between elements
    copy = recording.private_copy(strided)
    assert copy.stride() == strided.stride() and torch.equal(copy, strided)
    assert copy.data_ptr() != strided.data_ptr()
    leaf = torch.randn(3, requires_grad=True)
    copy = recording.private_copy(leaf)
    assert copy.requires_grad and copy.is_leaf and copy.data_ptr() != leaf.data_ptr()
    expanded = torch.randn(3, 1).expand(3, 5)                      # overlapping: a clone
    assert torch.equal(recording.private_copy(expanded), expanded)


def test_python_function_gets_private_copies_and_a_write_is_named():
    """A Python function writing into an input: the check's tensor is untouched, the call
    fails naming the argument, in the kernel and in the replay."""
    from autograde.trust import recording
    from autograde.checks.common import forbid_references, fresh_generator, judging

    def check(fn):
        gen = fresh_generator()
        x = torch.randn(5, generator=gen)
        weights = torch.rand(5, generator=gen)
        keep = x.clone()
        with forbid_references(fn):
            got = fn(x, weights)
        assert torch.equal(x, keep), "the check's own tensor changed"
        if judging():
            assert torch.allclose(got, x * weights)

    def honest(x, weights):
        return x * weights

    def sneaky(x, attention_weights):
        attention_weights.zero_()
        x.zero_()
        return torch.zeros_like(x)

    assert _record_and_replay(check, {"fn": honest})[:2] == (None, None)
    in_kernel, replayed, _ = _record_and_replay(check, {"fn": sneaky})
    assert isinstance(in_kernel, recording.InputChanged)
    assert "sneaky: your code wrote into x," in str(in_kernel)
    assert isinstance(replayed, recording.InputChanged)


def test_static_scan_never_imports_what_a_string_names():
    """Issue 30: a string "autograde.__main__" in an answer made the scan import that module in
    the grader (which exited, and the students after the attacker went ungraded).  The scan
    resolves re-exports from the packages' source files; and ``python -m autograde`` alone
    runs the command line (the module has a main guard)."""
    from autograde import labs
    from autograde.pipeline import scan

    forbidden, allowed = labs.forbidden_names("lab05_forward_correct")
    before = set(sys.modules)
    cells = [("import torch", False),
             ('def msda_forward(*a):\n    return "autograde.__main__", "autograde.runner.cli", '
              '"source_kernels.bench", "source_kernels.chips.lab05.msda_forward"', True)]
    tainted = scan.tainted_names(cells, forbidden, allowed + ("source_kernels.forward",))
    assert "msda_forward" in tainted
    assert not {"autograde.__main__", "autograde.runner.cli", "source_kernels.bench"} & \
        (set(sys.modules) - before)
    # a re-export of an allowed module is found from the source alone
    assert scan._defining_module("source_kernels.chips.lab05.msda_forward") == \
        "source_kernels.forward"
    assert scan._defining_module("source_kernels.chips.lab01.msda_naive") == \
        "source_kernels.reference"
    import importlib
    main = importlib.import_module("autograde.__main__")      # imported, it does not exit
    assert callable(main.main)


# ------------------------------------------------------------------ code not from the cells
MARSHALLED = '''
import base64, marshal, zlib
from types import FunctionType
_blob = "eJzLSM3JyVcozy/KSQEAGgQEXQ=="
_code = marshal.loads(zlib.decompress(base64.b64decode(_blob)))
msda_naive = FunctionType(_code, globals())
'''
EXEC_COMPRESSED = '''
import base64 as _b, zlib as _z
exec(_z.decompress(_b.b64decode("eJwrSS0u0cvMS8vJLypRyE0syUhNTFHIL8pJTS1WSEksSQQAl+AJ3A==")))
'''
FROM_HELPER = "from helper import msda_naive\n"
RELATIVE = "from .helper import msda_naive\n"
COMPUTED_GETATTR = '''
import source_kernels.inputs as _inputs

def msda_naive(*args):
    return getattr(_inputs, "".join(["make", "_inputs"]))(*args)
'''
COMPUTED_IMPORT = '''
import importlib

def msda_naive(*args):
    return importlib.import_module("source_kernels." + "reference").msda_naive(*args)
'''
LAB07_AUTOGRAD_IN_A_LIST = '''
import threading
import torch
_saved = [torch.autograd.grad, torch.Tensor.requires_grad_]
_table = {"g": _saved[0], "r": _saved[1]}

def grad_attention_weights(grad_output, value, spatial_shapes, level_start_index,
                           sampling_locations, attention_weights):
    box = {}
    def run():
        w = _table["r"](attention_weights.detach().double())
        box["g"] = w
    t = threading.Thread(target=run)
    t.start(); t.join()
    return box["g"]
'''


def _lab_cells(lab, grade_id, source):
    from nbgrader import utils

    nb = nbformat.read(source_notebook(lab), as_version=4)
    cells = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        gid = nbgrader_meta(cell).get("grade_id")
        text = source if gid == grade_id else cell.source
        cells.append((text, not utils.is_locked(cell), f"cell {gid}"))
    return cells


@pytest.mark.parametrize("lab", sorted(p.name for p in (Path(__file__).resolve().parents[1] /
                                                        "assignments").glob("lab*")))
def test_honest_solutions_bring_in_no_foreign_code(lab):
    """Every lab's own solution passes the static rule (the lab 07 rule included)."""
    from nbgrader import utils

    from autograde import labs
    from autograde.pipeline import scan
    nb = nbformat.read(source_notebook(lab), as_version=4)
    cells = [(c.source, not utils.is_locked(c), "cell") for c in nb.cells
             if c.cell_type == "code"]
    assert scan.foreign_code(cells, by_hand=labs.by_hand(lab)) == ({}, None)


@pytest.mark.parametrize("lab,grade_id,source,name,what", [
    ("lab01_the_spec", "lab01_msda_naive", MARSHALLED, "msda_naive", "globals"),
    ("lab01_the_spec", "lab01_msda_naive", FROM_HELPER, None, None),
    ("lab01_the_spec", "lab01_msda_naive", RELATIVE, "msda_naive", "relative import"),
    ("lab01_the_spec", "lab01_msda_naive", COMPUTED_GETATTR, "msda_naive", "getattr"),
    ("lab01_the_spec", "lab01_msda_naive", COMPUTED_IMPORT, "msda_naive", "importlib"),
    ("lab07_the_other_direction", "lab07_grad_attn", LAB07_AUTOGRAD_IN_A_LIST,
     "grad_attention_weights", "threading"),
])
def test_foreign_code_is_found_in_the_notebook_source(lab, grade_id, source, name, what):
    from autograde import labs
    from autograde.pipeline import scan

    names, from_cell = scan.foreign_code(_lab_cells(lab, grade_id, source),
                                         by_hand=labs.by_hand(lab))
    if name is None:
        # an import of a module the course does not have: the sandbox binds no file of the
        # submission, so it fails in the kernel (tests/test_cheats.py grades it)
        assert names == {} and from_cell is None
        return
    assert name in names and what in names[name], names
    assert f"cell {grade_id}" in names[name]


def test_a_bare_exec_makes_every_later_stage_suspect():
    from autograde.pipeline import scan

    names, from_cell = scan.foreign_code(_lab_cells("lab01_the_spec", "lab01_msda_naive",
                                                    EXEC_COMPRESSED))
    assert from_cell is not None and "exec" in from_cell[1] and "lab01_msda_naive" in \
        from_cell[1], from_cell


def test_lab07_autograd_is_named_even_without_threads():
    from autograde.pipeline import scan

    source = ("import torch\n_g = [torch.autograd.grad]\n\ndef grad_value(*a):\n"
              "    return _g[0](*a)\n")
    names, _ = scan.foreign_code([(source, True, "cell lab07_grad_value")], by_hand=True)
    assert "autograd" in names["grad_value"], names
    assert scan.foreign_code([(source, True, "cell x")], by_hand=False) == ({}, None)


# ------------------------------------------------------------------ what the grader prints
ESCAPES = "\x1b[2J\x1b[1A\x1b]0;owned\x07\x1b]52;c;ZWNobyBoaQ==\x07\r\u202e"


def test_reasons_and_report_rows_carry_no_control_characters():
    """A forged record's exception text (terminal escapes: clear, cursor up, window title,
    clipboard) reaches the ledger as a verdict message; the reasons and the report print it
    written out, never as escapes."""
    import io

    from autograde.runner import cli
    from autograde.pipeline import status
    entry = {"state": "done", "notebooks": {"lab01": {"verdicts": {
        "lab01_hidden": {"verdict": "needs_review",
                         "message": "the grader's replay failed: " + ESCAPES + "10/10 graded"}},
        "incidents": [{"cell": 3, "grade_id": "x\x1b[31m", "what": "output limit" + ESCAPES}]}}}
    state, reasons = status.summarize(entry)
    assert state == "needs_review"
    text = "; ".join(reasons)
    assert not any(ord(ch) < 32 or ch == "\u202e" for ch in text), text
    assert "\\x1b[2J" in text and "\\x07" in text and "\\u202e" in text
    out = io.StringIO()
    cli._print_report([{"student_id": "eve" + ESCAPES, "score": 10.0, "max_score": 10.0,
                        "status": "graded", "reasons": text + ESCAPES}], out=out)
    printed = out.getvalue()
    assert printed.count("\n") == 2                          # the header and one row
    assert not any(ord(ch) < 32 and ch != "\n" for ch in printed), printed
    assert "eve\\x1b[2J" in printed


def test_verify_messages_are_escaped_where_they_are_made():
    """The verdict a cell gets (kept in the notebook, the ledger and the feedback page) goes
    through the same escaping, newlines kept."""
    from autograde.pipeline import status
    message = status.printable("line 1\nline 2" + ESCAPES, limit=3000, newlines=True)
    assert message.startswith("line 1\nline 2\\x1b[2J") and "\x1b" not in message


# ------------------------------------------------------------------ true time-outs
def test_output_deadline_is_the_cells_limit_and_short_only_after_a_real_timeout():
    """nbclient waits ``iopub_timeout`` s after a cell's reply for the rest of its output.  At
    5 s a loaded host failed correct cells (reported as the course's timeout); now it is the
    cell's own limit, and the interrupt's grace only once the cell really ran out of time."""
    import asyncio

    from nbclient import NotebookClient
    from autograde.config import AutogradeSettings
    from autograde.pipeline.execute import SandboxedExecute
    ex = SandboxedExecute()
    ex._settings = AutogradeSettings()
    ex.timeout = 240
    assert ex._output_deadline() == 240
    ex.timeout = 10
    assert ex._output_deadline() == 60

    async def parent(self, timeout, cell=None):
        return None
    original = NotebookClient._async_handle_timeout
    NotebookClient._async_handle_timeout = parent
    try:
        asyncio.run(ex._async_handle_timeout(240))
    finally:
        NotebookClient._async_handle_timeout = original
    assert ex._timed_out and ex.iopub_timeout == 5


def test_one_import_statement_taints_only_the_modules_it_flags():
    """``import base64, marshal, math`` in a cheat's cell flags marshal, not math: the honest
    functions of other stages that use math are not sent to review with it."""
    from autograde.pipeline import scan

    cells = [("import math\n\ndef corner(x):\n    return math.floor(x)\n", True, "cell a"),
             ("import base64, marshal, math\n_code = marshal.loads(b'')\n\n"
              "def sneaky():\n    return _code\n", True, "cell b")]
    names, from_cell = scan.foreign_code(cells)
    assert "corner" not in names and "math" not in names, names
    assert {"marshal", "_code", "sneaky"} <= set(names) and from_cell is None


def test_processes_started_at_top_level_are_left_to_the_limits():
    """A top-level statement that starts processes (a submission holding its process limit)
    sends nothing to review; a graded function that uses a thread does."""
    from autograde.pipeline import scan

    hold = ("import subprocess, time\nchildren = []\ntry:\n    while True:\n"
            "        children.append(subprocess.Popen(['sleep', '120']))\n"
            "except OSError as exc:\n    error = exc\n")
    assert scan.foreign_code([(hold, True, "cell a")]) == ({"subprocess": "import of "
                                                             "subprocess in cell a, line 1"},
                                                            None)
    names, _ = scan.foreign_code([("import threading\n\ndef f():\n"
                                   "    threading.Thread(target=print).start()\n", True, "c")])
    assert "f" in names
