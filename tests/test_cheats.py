"""Hostile submissions against the real grading command, sandbox on.

Each cheat is the lab's own solution notebook with one answer cell replaced by an attack on
where the answer lives: a copy of the reference made with ``types.FunctionType`` from a
module looked up in ``sys.modules`` under a name built at run time; the hidden check's
``expected`` read from the caller's frame; comparison helpers and checks replaced; the
reference's source opened by path; and (lab 05) a plain object with ``__getitem__`` standing
in for the Triton kernel, filling the output from a copied spec and launching a no-op kernel;
lab 07 takes the first four against its gradients in PyTorch.
A cheat must earn none of the points of the cells that check the function it replaces (0 or
needs_review there); one that fails plainly loses only those, one the grader flags may send
more of the lab to review; the honest solution gets full marks.  Graded with ``python -m autograde grade`` and the repository's nbgrader_config.py.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from support.system import require_grading_sandbox
from support import releases
from support.nbgrader_helpers import make_course

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent

# a copy of a function with private copies of the functions its globals name, so that
# forbid_references' code swap of the originals does not reach it
DEEP_COPY = '''
import types as _types

def _deep_copy(fn, seen=None):
    seen = {} if seen is None else seen
    if id(fn) in seen:
        return seen[id(fn)]
    env = dict(fn.__globals__)
    copy = _types.FunctionType(fn.__code__, env, fn.__name__, fn.__defaults__)
    seen[id(fn)] = copy
    for key, value in list(env.items()):
        if isinstance(value, _types.FunctionType) and value.__module__ == fn.__module__:
            env[key] = _deep_copy(value, seen)
    return copy
'''

FIND_BY_RUNTIME_NAME = '''
import importlib as _importlib
import sys as _sys
_name = "source_kernels." + "".join(reversed({reversed_name!r}))
try:
    _importlib.import_module(_name)
except ImportError:
    pass
_module = _sys.modules[_name]              # absent from the kernel's view: KeyError
_ref = _deep_copy(getattr(_module, {attr!r}))
'''

OPEN_BY_PATH = '''
import importlib.util as _iu
import os as _os
_places = [_os.path.join(p, "reference.py")
           for p in _iu.find_spec("source_kernels").submodule_search_locations]
_places += [{repo_reference!r}]   # where the course lives on the grading host
_text = None
for _p in _places:
    try:
        with open(_p) as _fh:
            _text = _fh.read()
        break
    except OSError:
        continue
_env = {{}}
exec(compile(_text, "reference.py", "exec"), _env)   # TypeError when nothing was readable
_ref = _env[{attr!r}]
'''

FRAME_EXPECTED = '''
import sys as _sys

def _expected_from_callers():
    frame = _sys._getframe(2)
    while frame is not None:
        for key in ("expected", "want", "ref"):
            value = frame.f_locals.get(key)
            if value is not None and hasattr(value, "shape"):
                return value
        frame = frame.f_back
    return None
'''

PATCH_COMPARISONS = '''
import math as _math
import torch as _torch
import source_kernels.testing as _testing
from autograde.checks import {check} as _check
_math.isclose = lambda *a, **k: True
_torch.allclose = lambda *a, **k: True
_torch.testing.assert_close = lambda *a, **k: None
_testing.explain_mismatch = lambda *a, **k: None
_testing.assert_close_explained = lambda *a, **k: None
for _n in dir(_check):
    if _n.startswith("check_"):
        setattr(_check, _n, lambda *a, **k: None)
'''

LAB01 = "lab01_the_spec"
LAB01_NAIVE = '''
def msda_naive(value, value_spatial_shapes, value_level_start_index, sampling_locations,
               attention_weights):
    return _ref(value, value_spatial_shapes, value_level_start_index, sampling_locations,
                attention_weights)
'''
LAB01_CHEATS = {
    "runtime_name": DEEP_COPY + FIND_BY_RUNTIME_NAME.format(reversed_name="ecnerefer", attr="msda_naive")
    + LAB01_NAIVE,
    "caller_frame": FRAME_EXPECTED + '''
import torch

def msda_naive(value, value_spatial_shapes, value_level_start_index, sampling_locations,
               attention_weights):
    expected = _expected_from_callers()
    if expected is not None:
        return expected.clone()
    b, q, m = sampling_locations.shape[:3]
    return torch.zeros(b, q, m * value.shape[3], dtype=value.dtype)
''',
    "patched_comparisons": PATCH_COMPARISONS.format(check="lab01") + '''
import torch

def msda_naive(value, value_spatial_shapes, value_level_start_index, sampling_locations,
               attention_weights):
    b, q, m = sampling_locations.shape[:3]
    return torch.zeros(b, q, m * value.shape[3], dtype=value.dtype)
''',
    "open_by_path": OPEN_BY_PATH.format(repo_reference=str(REPO / "source_kernels" /
                                                             "reference.py"),
                                        attr="msda_naive") + LAB01_NAIVE,
    # the reference brought in as data: its code objects marshalled, compressed and encoded
    # in the cell, rebuilt with FunctionType
    "marshalled_code": "MARSHALLED",
    # its source compressed in the cell and exec'd
    "exec_compressed": "EXEC_COMPRESSED",
    # its source in a file handed in beside the notebook
    "helper_file": "from helper import msda_naive\n",
}

def _reference_source():
    return (REPO / "source_kernels" / "reference.py").read_text()


def _marshalled_reference():
    """A cell that rebuilds the reference's msda_naive (and what it calls) from marshalled,
    compressed, base64-encoded code objects."""
    import base64
    import marshal
    import zlib
    env = {}
    exec(compile(_reference_source(), "reference.py", "exec"), env)   # noqa: S102
    names = ["pixel_coordinate", "bilinear_corner_weights", "bilinear_sample_naive",
             "msda_naive"]
    blob = base64.b64encode(zlib.compress(marshal.dumps(
        [env[n].__code__ for n in names]))).decode()
    return (f"import base64, marshal, zlib, types, math, torch\n"
            f"_codes = marshal.loads(zlib.decompress(base64.b64decode({blob!r})))\n"
            f"_env = {{'math': math, 'torch': torch, '__builtins__': __builtins__}}\n"
            f"for _name, _code in zip({names!r}, _codes):\n"
            f"    _env[_name] = types.FunctionType(_code, _env, _name)\n"
            f"msda_naive = _env['msda_naive']\n")


def _exec_compressed_reference():
    import base64
    import zlib
    blob = base64.b64encode(zlib.compress(_reference_source().encode())).decode()
    return ("import base64 as _b, zlib as _z\n"
            f"exec(_z.decompress(_b.b64decode({blob!r})).decode())\n")


# files a cheat hands in beside its notebook
EXTRA_FILES = {
    "helper_file": {"helper.py": _reference_source},
    # a launcher of its own: with the submission folder first on sys.path it ran instead of
    # ipykernel's; this one starts the real kernel after putting the reference in builtins
    "launcher_file": {"ipykernel_launcher.py": lambda: (
        "import builtins, runpy, sys\n"
        "sys.path = [p for p in sys.path if p not in ('', '.', '/submission')]\n"
        "_env = {}\n"
        f"exec(compile({_reference_source()!r}, 'reference.py', 'exec'), _env)\n"
        "builtins.msda_naive = _env['msda_naive']\n"
        "sys.modules.pop('ipykernel_launcher', None)\n"
        "runpy.run_module('ipykernel_launcher', run_name='__main__')\n")},
}
LAB01_CHEATS_EXTRA = {"launcher_file": "msda_naive = msda_naive\n"}

LAB05 = "lab05_forward_correct"
# the stand-in for a Triton kernel: ``msda_forward_kernel[grid](...)`` fills out with
# ``_fill(...)`` and launches a real kernel that does nothing, so the launch counter moves
LAB05_STANDIN = '''
import triton as _triton
import triton.language as _tl


@_triton.jit
def _nothing(x_ptr):
    _tl.load(x_ptr)


class _Standin:
    def __getitem__(self, grid):
        def launch(value, shapes, starts, loc, attn, out, *rest, **kwargs):
            got = _fill(value, shapes, starts, loc, attn)
            if got is not None:
                out.copy_(got.reshape(out.shape).to(out.dtype))
            _nothing[(1,)](out)
        return launch


msda_forward_kernel = _Standin()
'''
LAB05_CHEATS = {
    "runtime_name": DEEP_COPY + FIND_BY_RUNTIME_NAME.format(reversed_name="ecnerefer",
                                                attr="msda_grid_sample") + '''
def _fill(*args):
    return _ref(*args)
''' + LAB05_STANDIN,
    "caller_frame": FRAME_EXPECTED + '''
def _fill(*args):
    return _expected_from_callers()
''' + LAB05_STANDIN,
    "patched_comparisons": PATCH_COMPARISONS.format(check="lab05") + '''
def _fill(value, shapes, starts, loc, attn):
    return None
''' + LAB05_STANDIN,
    "open_by_path": OPEN_BY_PATH.format(repo_reference=str(REPO / "source_kernels" /
                                                             "reference.py"),
                                        attr="msda_grid_sample") + '''
def _fill(*args):
    return _ref(*args)
''' + LAB05_STANDIN,
    # the spec is in lab 05's view (the notebook compares with it): copied with private
    # helpers, it computes the right numbers on the CPU, outside any kernel
    "getitem_standin": DEEP_COPY + '''
from source_kernels.chips import lab01 as _chips
_spec = _deep_copy(_chips.msda_naive)


def _fill(*args):
    return _spec(*[a.cpu() for a in args])
''' + LAB05_STANDIN,
}

LAB05_CHEATS["zero_inputs"] = """
@triton.jit
def msda_forward_kernel(value_ptr, shapes_ptr, starts_ptr, loc_ptr, attn_ptr, out_ptr,
                        S, Q, M, D,
                        L: tl.constexpr, K: tl.constexpr,
                        BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr, ACC_DTYPE: tl.constexpr):
    # computes nothing: zeroes the attention weights the check gave, and the output
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
"""

LAB07 = "lab07_the_other_direction"
# dL/d attention_weights by autograd through a function that computes the forward
LAB07_GRAD = '''
import torch


def grad_attention_weights(grad_output, value, spatial_shapes, level_start_index,
                           sampling_locations, attention_weights):
    weights = attention_weights.detach().double().requires_grad_()
    out = _forward(value.detach().double(), spatial_shapes, level_start_index,
                   sampling_locations.detach().double(), weights)
    grad, = torch.autograd.grad(out, weights, grad_output.detach().double())
    return grad.to(attention_weights.dtype)
'''
LAB07_CHEATS = {
    "runtime_name": DEEP_COPY + FIND_BY_RUNTIME_NAME.format(reversed_name="ecnerefer",
                                                            attr="msda_grid_sample")
    + "\n_forward = _ref\n" + LAB07_GRAD,
    "caller_frame": FRAME_EXPECTED + '''
import torch


def grad_attention_weights(grad_output, value, spatial_shapes, level_start_index,
                           sampling_locations, attention_weights):
    expected = _expected_from_callers()
    if expected is not None:
        return expected.clone()
    return torch.zeros_like(attention_weights)
''',
    "patched_comparisons": PATCH_COMPARISONS.format(check="lab07") + '''
def grad_attention_weights(grad_output, value, spatial_shapes, level_start_index,
                           sampling_locations, attention_weights):
    return _torch.zeros_like(attention_weights)
''',
    "open_by_path": OPEN_BY_PATH.format(repo_reference=str(REPO / "source_kernels" /
                                                             "reference.py"),
                                        attr="msda_grid_sample")
    + "\n_forward = _ref\n" + LAB07_GRAD,
    # autograd kept in a list in the cell and called through a dict entry in a thread, past
    # the in-kernel "by hand" guard; the forward is lab 00's grid_sample chip, in the view
    "autograd_in_a_list": '''
import threading
import torch
import torch.nn.functional as F
_saved = [torch.autograd.grad, torch.Tensor.requires_grad_]
_table = {"grad": _saved[0], "leaf": _saved[1]}


def _forward(value, shapes, starts, loc, attn):
    batch, _, heads, channels = value.shape
    _, queries, _, levels, points, _ = loc.shape
    out = 0
    for level in range(levels):
        height, width, first = int(shapes[level, 0]), int(shapes[level, 1]), int(starts[level])
        v = value[:, first:first + height * width].permute(0, 2, 3, 1).reshape(
            batch * heads, channels, height, width)
        grid = loc[:, :, :, level].permute(0, 2, 1, 3, 4).reshape(
            batch * heads, queries, points, 2) * 2 - 1
        sampled = F.grid_sample(v, grid, mode="bilinear", padding_mode="zeros",
                                align_corners=False)
        weights = attn[:, :, :, level].permute(0, 2, 1, 3).reshape(
            batch * heads, 1, queries, points)
        out = out + (sampled * weights).sum(-1)
    return out.view(batch, heads, channels, queries).permute(0, 3, 1, 2).reshape(
        batch, queries, heads * channels)


def grad_attention_weights(grad_output, value, spatial_shapes, level_start_index,
                           sampling_locations, attention_weights):
    box = {}

    def run():
        with torch.enable_grad():
            weights = _table["leaf"](attention_weights.detach().double().clone())
            out = _forward(value.detach().double(), spatial_shapes, level_start_index,
                           sampling_locations.detach().double(), weights)
            box["g"], = _table["grad"](out, weights, grad_output.detach().double())
    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return box["g"].to(attention_weights.dtype)
''',
}

# the answer cell each lab's cheats replace, the lab's automatic points, and those of the
# cells (visible and hidden) that check the function the cheats fake
TARGETS = {
    LAB01: ("lab01_msda_naive", LAB01_CHEATS, 10.0, 4.0),
    LAB05: ("lab05_kernel", LAB05_CHEATS, 23.0, 12.0),
    LAB07: ("lab07_grad_attn", LAB07_CHEATS, 9.0, 3.0),
}


def _sandbox_or_skip():
    require_grading_sandbox()


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    _sandbox_or_skip()
    course = make_course(tmp_path_factory.mktemp("cheats") / "course", list(TARGETS))
    # uids of this test's own, away from the default pool: another grading run on the host
    # (its kernels share a process limit per uid) cannot reach these kernels
    with open(course / "nbgrader_config.py", "a") as fh:
        fh.write("c.AutogradeSettings.kernel_uid = 64900\n")
    releases.generate(course, list(TARGETS))
    out = {}
    for lab, (answer_id, cheats, _, _) in TARGETS.items():
        source = nbformat.read(course / "assignments" / lab / f"{lab}.ipynb", as_version=4)
        submissions = {"honest": source}
        for name, code in list(cheats.items()) + list(
                (LAB01_CHEATS_EXTRA if lab == LAB01 else {}).items()):
            code = {"MARSHALLED": _marshalled_reference,
                    "EXEC_COMPRESSED": _exec_compressed_reference}.get(code, lambda: code)()
            nb = nbformat.read(course / "assignments" / lab / f"{lab}.ipynb", as_version=4)
            cell = next(c for c in nb.cells
                        if c.metadata.get("nbgrader", {}).get("grade_id") == answer_id)
            cell.source = code.strip() + "\n"
            submissions[name] = nb
        for student, nb in submissions.items():
            folder = course / "submitted" / student / lab
            folder.mkdir(parents=True)
            nbformat.write(nb, folder / f"{lab}.ipynb")
            for filename, text in EXTRA_FILES.get(student, {}).items():
                (folder / filename).write_text(text())
        env = dict(os.environ, PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
        proc = subprocess.run([sys.executable, "-m", "autograde", "grade", lab, "--workers",
                               "2", "--no-progress"], cwd=course, env=env, capture_output=True,
                              text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        from autograde.runner.cli import report_rows
        out[lab] = {r["student_id"]: r for r in report_rows(str(course), lab)}
        for student, row in sorted(out[lab].items()):       # shown with pytest -s
            reasons = [r for r in row["reasons"].split("; ")
                       if r and not r.startswith("similarity check:")]
            print(f"{lab} {student}: {row['score']}/{row['max_score']} {row['status']} "
                  f"({'; '.join(reasons)[:600]})")
    return out


@pytest.mark.parametrize("lab", list(TARGETS))
def test_honest_solution_scores_full_marks(reports, lab):
    """The honest control is the lab's own solution, handed in as it is: it scores full marks,
    and nothing in the kernel or the replay flags it.  The similarity check does list it (it
    is the solution, word for word), and that is its only reason for review."""
    row = reports[lab]["honest"]
    assert float(row["score"]) == TARGETS[lab][2], (row["status"], row["reasons"])
    reasons = [r.strip() for r in row["reasons"].split("; ") if r.strip()]
    others = [r for r in reasons if not r.startswith(("similarity check:",
                                                      "pending hand-grading"))]
    assert not others, others
    assert "to the lab's solution" in row["reasons"], row["reasons"]
    assert row["status"] == "needs_review", row


CHEATS = [(lab, c) for lab, t in TARGETS.items() for c in t[1]] + \
    [(LAB01, c) for c in LAB01_CHEATS_EXTRA]


@pytest.mark.parametrize("lab,cheat", CHEATS)
def test_cheat_earns_nothing_for_the_function_it_fakes(reports, lab, cheat):
    _, _, full, faked = TARGETS[lab]
    row = reports[lab][cheat]
    # the faked function's cells score 0 (a failure in the kernel, or a pass the grader did
    # not confirm: needs_review); a cheat the grader saw (run-time rebinding of names) may
    # send more of the lab to review, a plain failure costs the faked cells only
    assert float(row["score"]) <= full - faked, (row["status"], row["reasons"])
    if row["status"] != "needs_review":
        assert float(row["score"]) == full - faked, (row["status"], row["reasons"])
