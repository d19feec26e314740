"""Labs 00-04 as nbgrader assignments: generate, execute, autograde, inspect.

One temporary course directory serves all five labs: one ``nbgrader generate_assignment``,
one ``nbgrader autograde`` over two submissions per lab (the source notebook, student
``solution``, and the untouched release, student ``untouched``), run while nbclient executes
the source notebooks and the releases.  The repository itself is never written to.
"""
from __future__ import annotations

import ast
import re
import time

import nbformat
import pytest
import torch
import triton
import triton.language as tl

import source_kernels  # noqa: F401  (the interpreter switch, before the kernels below)
from support import nbgrader_helpers as nbh

LABS = ["lab00_the_idea", "lab01_the_spec", "lab02_tensors_are_pointers",
        "lab03_the_machine", "lab04_hello_triton"]
HIDDEN_CELL = re.compile(r"### BEGIN HIDDEN TESTS\nfrom autograde\.checks import (lab\d\d)\n"
                         r"\1\.check_\w+\(\w+(, \w+)*\)\n### END HIDDEN TESTS")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    start = time.perf_counter()
    result = nbh.run_labs(LABS, tmp_path_factory.mktemp("course"), timeout=120)
    result.total_seconds = time.perf_counter() - start
    lines = [f"labs 00-04: {result.total_seconds:.0f} s in all (generate "
             f"{result.generate_seconds:.0f} s, autograde of 10 submissions "
             f"{result.autograde_seconds:.0f} s, alongside the executions)"]
    for lab in LABS:
        lines.append(f"  {lab}: source {result.seconds[(lab, 'source')]:.1f} s, "
                     f"release {result.seconds[(lab, 'release')]:.1f} s")
    print("\n".join(lines))
    return result


def _source(lab):
    return nbformat.read(nbh.source_notebook(lab), as_version=4)


# ------------------------------------------------------------------ static checks (fast)
@pytest.mark.parametrize("lab", LABS)
def test_source_notebook_is_well_formed(lab):
    nb = _source(lab)
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    ids = [nbh.nbgrader_meta(c).get("grade_id") for c in nb.cells if nbh.nbgrader_meta(c)]
    assert len(ids) == len(set(ids)), f"{lab}: duplicate grade_ids"
    assert all(c.get("outputs", []) == [] and c.get("execution_count") is None
               for c in nb.cells if c.cell_type == "code"), f"{lab}: stored with outputs"
    graded = nbh.graded_test_cells(nb)
    assert len(graded) >= 4, f"{lab}: expected a visible and a hidden check per stage"
    hidden = 0
    for cell in graded:
        meta = nbh.nbgrader_meta(cell)
        assert meta["locked"] and meta["points"] > 0, f"{lab}/{meta['grade_id']}"
        if "BEGIN HIDDEN TESTS" in cell.source:
            hidden += 1
            match = HIDDEN_CELL.fullmatch(cell.source)
            assert match and match.group(1) == lab[:5], \
                f"{lab}/{meta['grade_id']}: a hidden cell holds only the import and one call"
    assert hidden >= 3, f"{lab}: expected hidden checks for the stages"
    for cell in nb.cells:
        meta = nbh.nbgrader_meta(cell)
        if meta.get("solution"):
            assert "### BEGIN SOLUTION" in cell.source and "### END SOLUTION" in cell.source
        elif meta:
            assert meta["locked"], f"{lab}/{meta['grade_id']}: setup, test, text cells are locked"
    # the setup cell imports source_kernels first, and only chips of earlier labs
    setup = next(c for c in nb.cells if nbh.nbgrader_meta(c).get("grade_id") == f"{lab[:5]}_setup")
    first = ast.parse(setup.source).body[0]
    assert isinstance(first, ast.Import) and first.names[0].name == "source_kernels"
    number = int(lab[3:5])
    for cell in nb.cells:
        for chip in re.findall(r"source_kernels\.chips\.lab(\d\d)", cell.source):
            assert int(chip) < number, f"{lab} imports the chip of lab {chip}"


def test_hidden_checks_reject_a_function_that_calls_a_chip():
    """Every hidden check fails a graded function that only delegates to the chip."""
    from autograde.checks import lab00, lab01, lab02, lab03, lab04
    from autograde.checks.common import ReferenceCalled
    from source_kernels.chips import lab00 as c0, lab01 as c1, lab02 as c2, lab03 as c3, \
        lab04 as c4

    def delegate(chip):
        namespace = {"chip": chip}
        exec("def graded(*args, **kwargs):\n    return chip(*args, **kwargs)", namespace)  # noqa: S102
        return namespace["graded"]

    class CrossAttention(c0.DeformableCrossAttention):     # inherits the chip's forward
        pass

    class MSDA(c0.MSDeformAttn):
        pass

    cases = [(lab00.check_deformable_attention, delegate(c0.deformable_attention)),
             (lab00.check_cross_attention, CrossAttention),
             (lab00.check_msdeform_attn, MSDA),
             (lab01.check_corner_weights, delegate(c1.pixel_coordinate),
              delegate(c1.bilinear_corner_weights)),
             (lab01.check_bilinear_sample, delegate(c1.bilinear_sample_naive)),
             (lab01.check_msda_naive, delegate(c1.msda_naive)),
             (lab02.check_contiguous_strides, delegate(c2.contiguous_strides)),
             (lab02.check_flat_offset, delegate(c2.flat_offset)),
             (lab02.check_msda_flat, delegate(c2.msda_flat)),
             (lab02.check_int32_wrap, delegate(c2.int32_wrap)),
             (lab02.check_first_overflowing_batch, delegate(c2.first_overflowing_batch)),
             (lab03.check_sectors_and_lines, delegate(c3.sectors_and_lines)),
             (lab03.check_warp_instructions, delegate(c3.warp_instructions)),
             (lab03.check_gather_traffic, delegate(c3.gather_traffic)),
             (lab03.check_predict_tiling, delegate(c3.predict_tiling)),
             (lab04.check_vector_add, c4.add_kernel, delegate(c4.vector_add)),
             (lab04.check_copy_2d, c4.copy_tile_kernel, delegate(c4.copy_2d)),
             (lab04.check_gather_rows, c4.gather_rows_kernel, delegate(c4.gather_rows)),
             (lab04.check_bilinear, c4.bilinear_kernel, delegate(c4.bilinear_sample_triton))]
    for check, *graded in cases:
        with pytest.raises(ReferenceCalled):
            check(*graded)
    # and the chips are whole again afterwards
    x = torch.arange(5.0)
    assert torch.equal(c4.vector_add(x, x), 2 * x)
    assert c2.int32_wrap(2 ** 31) == -2 ** 31


@triton.jit
def _add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """A student's vector add (not the chip, which a check refuses)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + tl.load(y_ptr + offs,
             mask=offs < n), mask=offs < n)


def test_hidden_check_rejects_torch_instead_of_a_kernel():
    from autograde.checks import lab04

    with pytest.raises(AssertionError, match="launched no Triton kernel"):
        lab04.check_vector_add(_add_kernel, lambda x, y: x + y)


def test_lab04_check_reports_an_unmasked_kernel_instead_of_crashing():
    """The guard stops a read and a write past the end before they happen, and the check
    names them with the kernel line and the mask hint."""
    from autograde.checks import lab04

    @triton.jit
    def unmasked(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, tl.load(x_ptr + offs) + tl.load(y_ptr + offs))

    def wrapper(x, y):
        out = torch.empty_like(x)
        unmasked[(triton.cdiv(x.numel(), 128),)](x, y, out, x.numel(), BLOCK=128)
        return out

    with pytest.raises(AssertionError, match=r"read past the end of x_ptr(.|\n)*Hint: mask"):
        lab04.check_vector_add(unmasked, wrapper, seed=0)


@pytest.mark.parametrize("lab", ["lab01_the_spec", "lab02_tensors_are_pointers",
                                 "lab04_hello_triton"])
def test_checks_replay_out_of_the_kernel(lab):
    """Every graded cell (the visible ones with their seed, the hidden ones) holds check calls
    that the grader finds in the cell itself (autograde.pipeline.verify.check_calls: a visible cell
    whose calls it cannot see would be scored in the kernel, unjudged), and each call,
    recorded as the grading kernel records it, replays in the grader's process with the
    solution's functions replaced by the record and uses every recorded call."""
    import importlib

    from autograde.trust import recording
    from autograde.pipeline.verify import check_calls
    import test_mistakes_forward as lab_cells

    scope = lab_cells.namespace(lab)
    replayed = 0
    for gid, meta, kind, source in lab_cells.cells(lab):
        if kind != "code" or not meta.get("grade"):
            continue
        calls = check_calls(source, ("autograde.checks",))
        assert calls, f"{gid}: the grader finds no check call to replay in this cell"
        for module, function, args, kwargs in calls:
            check = getattr(importlib.import_module(module), function)
            names = [a[1] for a in args if a[0] == "name"]
            consts = {k: v[1] for k, v in kwargs.items()}
            recording._mode, recording._base_seed, recording._counter = "record", "replay", 0
            recording._events = []
            try:
                check(*(scope[name] for name in names), **consts)
            finally:
                events, recording._events, recording._mode = recording._events, [], None
            context = recording.ReplayContext(events, "replay")
            proxies = [recording.Proxy(context, name) for name in names]
            recording.replay_check(check, proxies, consts, context)
            assert recording.unused_calls(context) == 0, (gid, function)
            replayed += 1
    assert replayed >= 6


@pytest.mark.parametrize("lab, cell_id, old, new, check_id", [
    ("lab01_the_spec", "lab01_corner_weights", "return normalised * size - 0.5",
     "return normalised * size", "lab01_check_corner_weights"),
    ("lab04_hello_triton", "lab04_bilinear", "* W - 0.5", "* W", "lab04_check_bilinear")])
def test_replay_judges_a_visible_check_the_kernel_did_not(lab, cell_id, old, new, check_id):
    """In the grading kernel a visible check only records (it does not judge); the grader's
    replay of a wrong function's record fails, so the visible point is not given away."""
    import importlib

    from autograde.trust import recording
    from autograde.pipeline.verify import check_calls
    import test_mistakes_forward as lab_cells

    scope = lab_cells.namespace(lab, cell_id, [(old, new)])
    source = next(src for gid, _, _, src in lab_cells.cells(lab) if gid == check_id)
    (module, function, args, kwargs), = check_calls(source, ("autograde.checks",))
    check = getattr(importlib.import_module(module), function)
    names = [a[1] for a in args]
    consts = {k: v[1] for k, v in kwargs.items()}
    recording._mode, recording._base_seed, recording._counter = "record", "replay", 0
    recording._events = []
    try:
        check(*(scope[name] for name in names), **consts)         # no verdict in the kernel
    finally:
        events, recording._events, recording._mode = recording._events, [], None
    context = recording.ReplayContext(events, "replay")
    with pytest.raises(AssertionError, match="Hint"):
        recording.replay_check(check, [recording.Proxy(context, n) for n in names], consts,
                               context)


# ------------------------------------------------------------------ generate, run, grade
@pytest.mark.slow
@pytest.mark.parametrize("lab", LABS)
def test_release_has_no_solutions_and_no_hidden_tests(runs, lab):
    release = nbformat.read(runs.releases[lab], as_version=4)
    source = _source(lab)
    assert nbh.leaked_lines(source, release) == []
    text = "\n".join(c.source for c in release.cells)
    # the setup cell imports the lab's visible checks; nothing else of the grading package
    assert "autograde.checks" not in text.replace(f"from autograde.checks import {lab[:5]} as check", "")
    n_solutions = sum(1 for c in source.cells if nbh.nbgrader_meta(c).get("solution"))
    assert text.count("raise NotImplementedError()") >= n_solutions
    # the hidden cells are blank in the release
    hidden_ids = {nbh.nbgrader_meta(c)["grade_id"] for c in source.cells
                  if "BEGIN HIDDEN TESTS" in c.source}
    for cell in release.cells:
        if nbh.nbgrader_meta(cell).get("grade_id") in hidden_ids:
            assert cell.source.strip() == ""


@pytest.mark.slow
@pytest.mark.parametrize("lab", LABS)
def test_source_notebook_runs_clean(runs, lab):
    nb = runs.source_runs[lab]
    assert nbh.cell_errors(nb) == {}
    graded = {nbh.nbgrader_meta(c)["grade_id"] for c in nbh.graded_test_cells(nb)}
    noisy = {k: v for k, v in nbh.stderr_cells(nb).items() if k in graded}
    assert noisy == {}, "stderr in a test cell scores 0 in nbgrader"


@pytest.mark.slow
@pytest.mark.parametrize("lab", LABS)
def test_untouched_release_fails_its_graded_cells(runs, lab):
    nb = runs.release_runs[lab]
    errors = nbh.cell_errors(nb)
    for cell in nbh.graded_test_cells(nb):
        gid = nbh.nbgrader_meta(cell)["grade_id"]
        if cell.source.strip():                # hidden-only cells are blank until grading
            assert gid in errors, f"{lab}: graded cell {gid} passes on the untouched release"


@pytest.mark.slow
@pytest.mark.parametrize("lab", LABS)
def test_autograde_gives_full_marks_to_the_solution(runs, lab):
    scores = dict(runs.scores[(lab, nbh.SOLUTION_STUDENT)])
    score, max_score = scores.pop("total")
    assert max_score > 0 and score == max_score, scores
    assert all(s == m for s, m in scores.values()), scores


@pytest.mark.slow
@pytest.mark.parametrize("lab", LABS)
def test_autograde_gives_zero_to_the_untouched_release(runs, lab):
    scores = dict(runs.scores[(lab, nbh.UNTOUCHED_STUDENT)])
    score, max_score = scores.pop("total")
    assert max_score > 0 and score == 0, scores
    assert all(s == 0 for s, _ in scores.values()), scores
