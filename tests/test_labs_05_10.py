"""Labs 05-10 as nbgrader assignments, end to end on a CPU.

For every lab, in a throw-away course directory: ``nbgrader generate_assignment``, then one
``nbgrader autograde`` of three kinds of submission:

- ``solution``: the source notebook itself, which must pass every cell and score every
  automatically graded point;
- ``untouched``: the release as handed out, which must fail every graded cell;
- ``wrong`` (labs 05 to 10): the source notebook with one plausible mistake, which must
  lose exactly the points of the cells that test that mistake.

The labs run two at a time (each pipeline is a chain of nbgrader subprocesses), and the time
of each lab's pipeline is printed at the end of the module (``pytest -s`` shows it).
Static tests of the notebooks, the hidden-test cells, the chips and the replay of the hidden
checks (the grader's second run, out of the kernel's reach) need no nbgrader.
"""
from __future__ import annotations

import ast
import base64
import concurrent.futures as futures
import copy
import importlib
import linecache
import re
import time
import types
from pathlib import Path

import nbformat
import pytest
import torch

import source_kernels  # noqa: F401  (the interpreter switch, before any chip is imported)

from support.nbgrader_helpers import (BEGIN_HIDDEN, END_HIDDEN, BEGIN_SOLUTION, END_SOLUTION,
                              autograded_path, cell_errors, generate_release, graded_test_cells,
                              leaked_lines, make_course, nbgrader_meta, run_nbgrader,
                              source_notebook, stderr_cells, submit)

LABS = ["lab05_forward_correct", "lab06_make_it_fast", "lab07_the_other_direction",
        "lab08_concurrent_writes", "lab09_hardware_detective", "lab10_ship_it"]
# seconds per cell for nbgrader: the first compilation of lab 09 and lab 10's suite can take
# tens of seconds on a busy 2-core machine (nbgrader's default is 30)
CELL_TIMEOUT = 600


def _replace_once(text, old, new):
    assert text.count(old) == 1, f"expected exactly one {old!r} in the solution cell"
    return text.replace(old, new)


def _half_pixel(source):
    """Lab 05: corner_coordinate takes the pixel coordinate x * W instead of x * W - 0.5."""
    return _replace_once(source, "x_im = loc * size - 0.5", "x_im = loc * size")


def _missing_w(source):
    """Lab 07: the gradient with respect to the pixel coordinate, without the factors W, H."""
    source = _replace_once(source, ' * c["width"]', "")
    return _replace_once(source, ' * c["height"]', "")


def _non_atomic(source):
    """Lab 08: grad_value scattered with load + store instead of tl.atomic_add."""
    return _replace_once(source, "tl.atomic_add(grad_value_ptr + offs, contrib, mask=msk)",
                         "tl.store(grad_value_ptr + offs, tl.load(grad_value_ptr + offs, "
                         "mask=msk, other=0.0) + contrib, mask=msk)")


def _keeps_wrong_configurations(source):
    """Lab 06: the tuner times every configuration that runs, right or wrong."""
    return _replace_once(source, "\n                or not torch.allclose(out, expected, atol=atol, "
                                 "rtol=rtol)", "")


def _adds_before_cas(source):
    """Lab 09: atomic_strategy reads the adds before it looks for a CAS."""
    cas = '    if any("cas" in p for p in parts):\n        return "cas-loop"\n'
    source = _replace_once(source, cas, "")
    return _replace_once(source, '    return "none"', cas + '    return "none"')


def _no_validation(source):
    """Lab 10: validate returns at once: nothing is checked."""
    return _replace_once(source, f"{BEGIN_SOLUTION}\n", f"{BEGIN_SOLUTION}\n    return None\n")


# lab -> (solution cell to break, how, the graded cells that must drop to 0)
WRONG = {
    "lab05_forward_correct": ("lab05_corner", _half_pixel, {
        "lab05_check_corner", "lab05_hidden_corner", "lab05_check_sample",
        "lab05_hidden_sample", "lab05_check_inside", "lab05_hidden_inside",
        "lab05_check_outside", "lab05_hidden_outside", "lab05_check_channels",
        "lab05_hidden_channels", "lab05_check_half", "lab05_hidden_half"}),
    "lab06_make_it_fast": ("lab06_tune", _keeps_wrong_configurations, {
        "lab06_check_tune", "lab06_hidden_tune"}),
    "lab07_the_other_direction": ("lab07_grad_loc", _missing_w, {
        "lab07_check_grad_loc", "lab07_hidden_grad_loc"}),
    # (the grad_value and half-precision checks fail; the visible checks of grad_attn and
    # grad_loc pass but call the same msda_backward_kernel, whose hidden checks failed: the
    # grading pipeline does not count them, autograde/pipeline/verify/)
    "lab08_concurrent_writes": ("lab08_backward_kernel", _non_atomic, {
        "lab08_check_backward_value", "lab08_hidden_backward_value",
        "lab08_check_backward_half", "lab08_hidden_backward_half",
        "lab08_check_backward_attn", "lab08_check_backward_loc"}),
    "lab09_hardware_detective": ("lab09_atomic_strategy", _adds_before_cas, {
        "lab09_check_atomic_strategy", "lab09_hidden_atomic_strategy"}),
    # (the operator's visible check calls msda_operator, whose hidden check of the validation
    # fails: the grading pipeline does not count a visible check of a function that failed a
    # hidden one, autograde/pipeline/verify/)
    "lab10_ship_it": ("lab10_validate", _no_validation, {
        "lab10_check_validate", "lab10_hidden_validate", "lab10_hidden_operator_validates",
        "lab10_check_operator"}),
}
# the exact totals (automatically graded points) of the wrong submissions, out of the lab's
# automatically graded maximum
WRONG_TOTALS = {"lab05_forward_correct": (5.0, 23.0), "lab06_make_it_fast": (3.0, 7.0),
                "lab07_the_other_direction": (6.0, 9.0), "lab08_concurrent_writes": (12.0, 19.0),
                "lab09_hardware_detective": (6.0, 9.0), "lab10_ship_it": (6.0, 12.0)}
# solution cells that must come out of the release whatever else changes (beyond the general
# leak check): the kernels, the derivations and the data-race demo
MUST_STRIP = {
    "lab05_forward_correct": ["lab05_corner", "lab05_offsets", "lab05_sample_level",
                              "lab05_kernel"],
    "lab07_the_other_direction": ["lab07_derivation_attn", "lab07_derivation_loc",
                                  "lab07_derivation_value"],
    "lab08_concurrent_writes": ["lab08_backward_kernel", "lab08_racy_kernel",
                                "lab08_atomic_kernel", "lab08_lost_updates"],
}


# the one import of the check modules a release may hold: the visible checks, in the setup cell
VISIBLE_CHECKS_IMPORT = re.compile(r"from autograde\.checks import lab\d\d as check(\s+#.*)?")


def _cells(nb):
    return {nbgrader_meta(c).get("grade_id"): c for c in nb.cells}


def _manual(cell) -> bool:
    meta = nbgrader_meta(cell)
    return cell.cell_type == "markdown" and meta.get("grade") and meta.get("solution")


def _wrong_notebook(lab, path):
    grade_id, breaker, _ = WRONG[lab]
    nb = nbformat.read(source_notebook(lab), as_version=4)
    cell = _cells(nb)[grade_id]
    cell.source = breaker(cell.source)
    nbformat.write(nb, path)
    return path


def _grades(course_dir, lab, student):
    """{grade_id: (score, max_score, needs_manual_grade)} and the notebook's total."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{Path(course_dir) / 'gradebook.db'}") as gradebook:
        notebook = gradebook.find_submission_notebook(lab, lab, student)
        grades = {g.name: (float(g.score), float(g.max_score), bool(g.needs_manual_grade))
                  for g in notebook.grades}
        return grades, (float(notebook.score), float(notebook.max_score))


def _pipeline(lab, root):
    """Generate the release of ``lab`` and autograde its submissions; returns a dict."""
    start = time.perf_counter()
    course = make_course(root / lab, [lab])
    release = generate_release(lab, course)
    submissions = {"solution": source_notebook(lab), "untouched": release}
    if lab in WRONG:
        submissions["wrong"] = _wrong_notebook(lab, root / f"{lab}.wrong.ipynb")
    for student, path in submissions.items():
        submit(course, lab, student, path)
    run_nbgrader(course, "autograde", lab, "--force", f"--Execute.timeout={CELL_TIMEOUT}")
    result = {"course": course, "release": nbformat.read(release, as_version=4)}
    for student in submissions:
        result[student] = _grades(course, lab, student)
        result[f"{student}_nb"] = nbformat.read(autograded_path(course, lab, student),
                                                as_version=4)
    result["seconds"] = time.perf_counter() - start
    return result


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("labs_05_10")
    start = time.perf_counter()
    # the slowest first, two at a time
    order = sorted(LABS, key=["lab10_ship_it", "lab09_hardware_detective",
                              "lab08_concurrent_writes", "lab05_forward_correct",
                              "lab06_make_it_fast", "lab07_the_other_direction"].index)
    with futures.ThreadPoolExecutor(max_workers=2) as pool:
        done = dict(zip(order, pool.map(lambda lab: _pipeline(lab, root), order)))
    wall = time.perf_counter() - start
    yield done
    lines = [f"{lab}: {done[lab]['seconds']:.0f} s (generate + autograde of "
             f"{2 + (lab in WRONG)} submissions)" for lab in LABS]
    print("\nlab pipelines, two at a time:\n  " + "\n  ".join(lines)
          + f"\n  wall time {wall:.0f} s")


# ------------------------------------------------------------------ the nbgrader pipeline
@pytest.mark.slow
@pytest.mark.parametrize("lab", LABS)
def test_release_leaks_nothing(runs, lab):
    source = nbformat.read(source_notebook(lab), as_version=4)
    release = runs[lab]["release"]
    assert leaked_lines(source, release) == []
    cells = _cells(release)
    for grade_id in MUST_STRIP.get(lab, []):
        text = cells[grade_id].source
        assert "raise NotImplementedError()" in text or "YOUR ANSWER HERE" in text, grade_id
    for cell in release.cells:
        checks = [line for line in cell.source.splitlines() if "autograde.checks" in line
                  and not VISIBLE_CHECKS_IMPORT.fullmatch(line.strip())]
        if BEGIN_HIDDEN in cell.source or checks:
            raise AssertionError(f"hidden test code in the release: {cell.source!r}")


@pytest.mark.slow
@pytest.mark.parametrize("lab", LABS)
def test_source_passes_everything(runs, lab):
    nb = runs[lab]["solution_nb"]
    assert cell_errors(nb) == {}
    assert stderr_cells(nb) == {}
    grades, total = runs[lab]["solution"]
    auto = {g: v for g, v in grades.items() if not _manual(_cells(nb)[g])}
    assert all(score == points for score, points, _ in auto.values()), auto
    assert total[0] == sum(points for _, points, _ in auto.values())
    manual = {g: v for g, v in grades.items() if _manual(_cells(nb)[g])}
    assert all(needs for _, _, needs in manual.values()), manual    # waiting for a grader


@pytest.mark.slow
@pytest.mark.parametrize("lab", LABS)
def test_untouched_release_fails_graded_cells(runs, lab):
    nb = runs[lab]["untouched_nb"]
    grades, total = runs[lab]["untouched"]
    assert total[0] == 0.0
    assert all(score == 0.0 and not needs for score, _, needs in grades.values()), grades
    errors = cell_errors(nb)
    for cell in graded_test_cells(nb):
        assert nbgrader_meta(cell)["grade_id"] in errors, nbgrader_meta(cell)["grade_id"]


@pytest.mark.slow
@pytest.mark.parametrize("lab", sorted(WRONG))
def test_wrong_submission_loses_exactly_its_points(runs, lab):
    _, _, failing = WRONG[lab]
    grades, total = runs[lab]["wrong"]
    nb = runs[lab]["wrong_nb"]
    for grade_id, (score, points, needs) in grades.items():
        if _manual(_cells(nb)[grade_id]):
            assert score == 0.0 and needs, grade_id                 # left to a grader
        elif grade_id in failing:
            assert score == 0.0, f"{grade_id} should fail, scored {score}"
        else:
            assert score == points, f"{grade_id} should pass, scored {score} of {points}"
    auto_max = sum(p for g, (_, p, _) in grades.items() if not _manual(_cells(nb)[g]))
    assert (total[0], auto_max) == WRONG_TOTALS[lab]


@pytest.mark.slow
def test_lab10_suite_runs_against_the_students_operator():
    """Lab 10's last cell: the operator suite against the lab's solution is all green, and
    against the same operator without validation the bad-input tests fail (so the plugin really
    puts the student's operator in the package's place).  Run here in-process: the grading
    sandbox has no tests/ folder, so the autograded notebooks only say so."""
    import operator_suite

    namespace, _ = _solution_namespace("lab10_ship_it")
    run = operator_suite.run(namespace["msda_operator"], namespace["MSDAFunction"])
    outcomes = list(run.outcomes.values())
    assert run.exit_code == 0 and outcomes.count("failed") == 0
    assert outcomes.count("passed") >= 40 and run.package_only == []

    def no_validation(*args, **kwargs):
        return None

    namespace["validate"] = no_validation           # MSDAFunction.forward looks it up here
    run = operator_suite.run(namespace["msda_operator"], namespace["MSDAFunction"],
                             "-k", "bad_input or bad_im2col or in_place_change")
    outcomes = list(run.outcomes.values())
    assert outcomes.count("failed") >= 20 and outcomes.count("passed") == 0


# ------------------------------------------------------------------ static checks
@pytest.mark.parametrize("lab", LABS)
def test_notebook_is_a_clean_nbgrader_source(lab):
    nb = nbformat.read(source_notebook(lab), as_version=4)
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    ids = [nbgrader_meta(c).get("grade_id") for c in nb.cells]
    assert all(ids) and len(ids) == len(set(ids)), "every cell has a unique grade_id"
    prefix = lab[:5]
    for cell in nb.cells:
        meta = nbgrader_meta(cell)
        assert meta["grade_id"].startswith(prefix + "_")
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, meta["grade_id"]
        if meta.get("grade"):
            assert meta.get("points", 0) > 0, meta["grade_id"]
        if meta.get("solution"):
            assert BEGIN_SOLUTION in cell.source and END_SOLUTION in cell.source
        else:
            assert meta.get("locked"), f"{meta['grade_id']} must be locked"
    setup = nb.cells[1].source
    assert setup.splitlines()[0].startswith("import source_kernels")
    number = int(lab[3:5])
    for chip in re.findall(r"source_kernels\.chips\.lab(\d\d)", setup):
        assert int(chip) < number, f"{lab} imports the chips of lab {chip}"


@pytest.mark.parametrize("lab", LABS)
def test_hidden_cells_only_call_a_check(lab):
    nb = nbformat.read(source_notebook(lab), as_version=4)
    module = importlib.import_module(f"autograde.checks.{lab[:5]}")
    hidden = [c for c in nb.cells if BEGIN_HIDDEN in c.source]
    assert hidden
    for cell in hidden:
        lines = cell.source.splitlines()
        assert lines[0] == BEGIN_HIDDEN and lines[-1] == END_HIDDEN
        assert lines[1] == f"from autograde.checks import {lab[:5]}"
        assert len(lines) == 4
        call = ast.parse(lines[2]).body[0].value
        assert isinstance(call, ast.Call) and call.func.value.id == lab[:5]
        assert call.func.attr.startswith("check_") and hasattr(module, call.func.attr)
        assert all(isinstance(arg, ast.Name) for arg in call.args) and not call.keywords


def test_lab05_every_graded_cell_is_a_check_call_the_grader_finds():
    """Lab 05's visible cells, like its hidden ones, hold check calls that the grader finds in
    the cell itself and replays (autograde.pipeline.verify.check_calls); no inline assert."""
    from autograde.pipeline.verify import check_calls

    nb = nbformat.read(source_notebook("lab05_forward_correct"), as_version=4)
    graded = [c for c in nb.cells if nbgrader_meta(c).get("grade")]
    assert len(graded) >= 16                        # 8 steps, a visible and a hidden check each
    for cell in graded:
        calls = check_calls(cell.source, ("autograde.checks",))
        assert calls and all(args is not None for _, _, args, _ in calls), \
            nbgrader_meta(cell)["grade_id"]
        assert "assert " not in cell.source, nbgrader_meta(cell)["grade_id"]


def test_chips_reexport_the_package():
    from source_kernels import backward, forward, op, ptx, validate
    from source_kernels.chips import lab05, lab08, lab09, lab10

    assert lab05.msda_forward is forward.msda_forward
    assert lab05.msda_forward_kernel is forward._msda_forward_kernel
    assert lab08.msda_backward is backward.msda_backward
    assert lab08.msda_backward_kernel is backward._msda_backward_kernel
    assert lab09.compile_ptx is ptx.compile_ptx
    assert lab09.atomic_instructions is ptx.atomic_instructions
    assert lab10.validate_inputs is validate.validate_inputs
    assert lab10.MultiScaleDeformableAttnFunction is op.MultiScaleDeformableAttnFunction
    assert lab10.multi_scale_deformable_attn is op.multi_scale_deformable_attn
    for fp16_like in (torch.float16, torch.bfloat16, torch.float32):
        assert lab09.fp32_accum_default(fp16_like, None) == \
            backward.default_fp32_grad_accum(fp16_like, "cpu")


def test_lab06_and_lab08_chips_compute_what_they_claim():
    from source_kernels import reference
    from source_kernels.chips import lab06, lab08
    from source_kernels.inputs import make_inputs

    args = make_inputs(1, 5, 1, 3, [[3, 4], [1, 1]], 2, seed=1, outside=0.2)
    expected = reference.msda_grid_sample(**args)
    torch.testing.assert_close(lab06.msda_forward_narrow(*args.values(), block_q=4), expected,
                               atol=1e-5, rtol=1e-5)
    index = torch.tensor([0, 0, 2, 2, 2, 1])
    values = torch.arange(1.0, 7.0)
    base = torch.zeros(3)
    assert lab08.scatter_add_atomic(base, index, values).tolist() == \
        base.index_add(0, index, values).tolist()
    assert lab08.scatter_add_naive(base, index, torch.ones(6)).tolist() == [1.0, 1.0, 1.0]
    # the corner-hit histogram: the kernels leave what the PyTorch chips say
    locations = torch.rand(40, 2, generator=torch.Generator().manual_seed(0)) * 1.5 - 0.25
    for height, width, block in ((3, 4, 16), (1, 1, 8), (5, 2, 64)):
        exact = lab08.corner_hits(locations, height, width)
        racy = lab08.corner_hits_racy(locations, height, width, block)
        assert lab08.corner_hits_launch(locations, height, width, block).tolist() == \
            exact.tolist()
        assert lab08.corner_hits_racy_launch(locations, height, width, block).tolist() == \
            racy.tolist()
        lost = lab08.lost_updates(locations, height, width, block)
        assert lost > 0 and lost == int(exact.sum() - racy.sum())
    assert lab08.lost_updates(locations, 3, 4, 1) == 0         # one sample per program


# ------------------------------------------------------------------ replay of the checks
_SKIP_CELLS = ("fig_", "paper_gpu", "race", "sweep", "tune_here", "gpu_", "interpreter_cost",
               "gradcheck", "cas_loop", "preset_costs", "suite", "compile_sm", "compiled_")


def _solution_namespace(lab):
    """The source notebook's setup, solution and given cells, run in a module of their own
    (Triton needs the source of each kernel: the cells go into linecache as files)."""
    nb = nbformat.read(source_notebook(lab), as_version=4)
    module = types.ModuleType(f"{lab}_solution")
    calls = []
    for index, cell in enumerate(nb.cells):
        meta = nbgrader_meta(cell)
        if cell.cell_type != "code":
            continue
        if BEGIN_HIDDEN in cell.source:
            line = cell.source.splitlines()[2]
            call = ast.parse(line).body[0].value
            calls.append((meta["grade_id"], call.func.attr, [a.id for a in call.args]))
            continue
        if meta.get("grade") or meta["grade_id"].split("_", 1)[1].startswith(_SKIP_CELLS):
            continue
        name = f"<{lab} cell {index}>"
        linecache.cache[name] = (len(cell.source), None, cell.source.splitlines(True), name)
        exec(compile(cell.source, name, "exec"), module.__dict__)   # noqa: S102
    return module.__dict__, calls


def _recorded_tensors(events):
    """The tensors a record holds, results first, then what the calls wrote into arguments."""
    calls = [event for event in events if event.get("e") == "call"]
    recorded = [event.get("result") for event in calls] + \
        [m[1] for event in calls for m in event.get("mut") or []]
    return [value for value in recorded if isinstance(value, dict)
            and value.get("$t") == "tensor" and value.get("shape")]


@pytest.mark.parametrize("lab", LABS)
def test_hidden_checks_replay_out_of_the_kernel(lab):
    """Each hidden check, recorded as the grading kernel records it, replays in the grader's
    process with the solution's functions replaced by the record; a record with a tampered
    tensor (a result, or an output a kernel wrote) fails the replay."""
    from autograde.trust import recording

    namespace, calls = _solution_namespace(lab)
    module = importlib.import_module(f"autograde.checks.{lab[:5]}")
    secret = "replay-test"
    tampered_any = False
    for grade_id, check_name, arg_names in calls:
        check = getattr(module, check_name)
        recording._mode, recording._base_seed, recording._counter = "record", secret, 0
        recording._events = []
        try:
            check(*(namespace[name] for name in arg_names))
        finally:
            events, recording._events, recording._mode = recording._events, [], None
        context = recording.ReplayContext(events, secret)
        proxies = [recording.Proxy(context, name) for name in arg_names]
        recording.replay_check(check, proxies, {}, context)
        assert recording.unused_calls(context) == 0, grade_id
        # tamper with a recorded tensor, returned or written into an argument (a kernel's
        # outputs; a check of one step judges only some of them): the replay must notice
        candidates = _recorded_tensors(events)
        for index in range(len(candidates)):
            tampered = copy.deepcopy(events)
            value = _recorded_tensors(tampered)[index]
            raw = bytearray(base64.b64decode(value["b64"]))
            raw[-1] ^= 0x40                                         # flip a high bit
            value["b64"] = base64.b64encode(bytes(raw)).decode()
            context = recording.ReplayContext(tampered, secret)
            proxies = [recording.Proxy(context, name) for name in arg_names]
            try:
                recording.replay_check(check, proxies, {}, context)
            except AssertionError:
                tampered_any = True
                break
        else:
            assert not candidates, f"{grade_id}: no tampered record fails the replay"
    if lab in ("lab05_forward_correct", "lab07_the_other_direction", "lab08_concurrent_writes",
               "lab10_ship_it"):
        assert tampered_any
