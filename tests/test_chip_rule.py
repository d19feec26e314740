"""One rule for the builtin chips: graded code of lab N may call the chips of earlier labs that
lab N imports (its grading kernel's view, ``autograde.labs.KERNEL_VIEW``), never a chip of lab
N itself or a later lab, never the course's reference.

``autograde.checks.common.chips_allowed`` computes each lab's list from the view; the notebooks'
first cells, ``book/labs.md`` and the chips' docstrings say the same (checked here word for
word), the checks enforce it (a visible check included, before any grading) with a message
that states the rule, and the grader's static scan allows the same names.  The time estimates
of the notebooks' headers and of the labs page are one source too: the page's table is checked
against the headers.
"""
from __future__ import annotations

import importlib
import json
import re
import textwrap
from pathlib import Path

import pytest

import source_kernels  # noqa: F401  (the interpreter switch)
from autograde import labs
from autograde.checks import common

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "assignments").glob("lab*/lab*.ipynb"))
LABS_PAGE = REPO / "book" / "labs.md"


def _header(path) -> str:
    cell = json.loads(path.read_text())["cells"][0]
    assert cell["metadata"]["nbgrader"]["grade_id"].endswith("_md01")
    return "".join(cell["source"])


def _flat(text) -> str:
    return " ".join(text.split())


def _chip_statement(lab) -> str:
    allowed = common.chips_allowed_text(lab)
    if allowed == "none":
        return ("**Chips your graded code may call:** none. A graded function that calls a "
                "builtin chip (this lab's own or an earlier lab's) or the course's reference "
                "fails its check, the visible one too, with a message that says so;")
    return (f"**Chips your graded code may call:** {allowed}. A graded function that calls "
            "any other chip (this lab's own included) or the course's reference fails its "
            "check, the visible one too, with a message that says so;")


def test_every_lab_allows_only_earlier_chips_of_its_view():
    for lab in range(11):
        for dotted in common.chips_allowed(lab):
            number = int(re.match(r"source_kernels\.chips\.lab(\d\d)\.", dotted).group(1))
            assert number < lab, (lab, dotted)
            module = dotted.rsplit(".", 1)[0]
            assert module in labs.KERNEL_VIEW[lab], (lab, dotted)
    # the reference never, even where a chip re-exports it
    assert not any("msda_naive" in d or "bilinear_sample_naive" in d
                   for lab in range(11) for d in common.chips_allowed(lab))
    assert common.chips_allowed(8) and common.chips_allowed(6) and common.chips_allowed(10)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem[:5])
def test_each_notebook_states_its_chips(path):
    lab = int(path.name[3:5])
    assert _chip_statement(lab) in _flat(_header(path)), _header(path)


def test_the_labs_page_states_every_labs_chips():
    page = LABS_PAGE.read_text()
    for lab in range(11):
        assert f"| {lab:02d} | {common.chips_allowed_text(lab)} |" in page, lab


def _chip_docstring_line(chip_lab) -> str:
    module = f"source_kernels.chips.lab{chip_lab:02d}"
    users = []
    for lab in range(11):
        mine = [d.rsplit(".", 1)[1] for d in common.chips_allowed(lab)
                if d.rsplit(".", 1)[0] == module]
        if f"`{module}` (all of it)" in common.chips_allowed_text(lab):
            users.append(f"lab {lab:02d} (all of them)")
        elif mine:
            users.append(f"lab {lab:02d} ({', '.join(f'``{n}``' for n in mine)})")
    if not users:
        return (f"Graded code may call these chips in no lab: they answer lab {chip_lab:02d}, and a "
                "graded function that calls one fails its check (book/labs.md, the chips your "
                "graded code may call).")
    return ("Graded code may call these chips in " + ", ".join(users) + f" only; in lab "
            f"{chip_lab:02d} itself and in every other lab a graded function that calls one "
            "fails its check (book/labs.md, the chips your graded code may call).")


@pytest.mark.parametrize("chip_lab", range(11))
def test_each_chip_module_says_which_labs_may_call_it(chip_lab):
    module = importlib.import_module(f"source_kernels.chips.lab{chip_lab:02d}")
    assert _flat(_chip_docstring_line(chip_lab)) in _flat(module.__doc__), \
        "\n".join(textwrap.wrap(_chip_docstring_line(chip_lab), 95))
    assert "a kernel of your own can call" not in module.__doc__


# ---------------------------------------------------------------- the rule, enforced
def _in_check_of(lab, body, **names):
    """Run ``body`` (a function of no arguments) inside ``forbid_references`` as the check
    module of lab ``lab`` runs it; returns what it returned or the ReferenceCalled it raised."""
    scope = {"__name__": f"autograde.checks.lab{lab:02d}", "common": common, "body": body}
    exec("def run():\n"                                          # noqa: S102
         "    with common.forbid_references(body):\n"
         "        return body()\n", scope)
    try:
        return scope["run"]()
    except common.ReferenceCalled as exc:
        return exc


def test_lab08_may_call_lab07s_chips_and_not_its_own():
    from source_kernels.chips import lab07 as chip07
    from source_kernels.chips import lab08 as chip08
    import torch

    from source_kernels.inputs import make_inputs

    args = make_inputs(1, 2, 1, 3, [(2, 3)], 1, seed=0)
    grad_output = torch.ones(1, 2, 3)
    names = ("value", "value_spatial_shapes", "value_level_start_index", "sampling_locations",
             "attention_weights")

    def uses_lab07():
        return chip07.grad_value(grad_output, *(args[n] for n in names))
    got = _in_check_of(8, uses_lab07)
    assert isinstance(got, torch.Tensor) and got.shape == args["value"].shape
    refused = _in_check_of(8, lambda: chip08.lost_updates(torch.rand(4, 2), 2, 3, 4))
    assert isinstance(refused, common.ReferenceCalled), refused
    message = str(refused)
    assert "graded function called the chip source_kernels.chips.lab08.lost_updates" in message
    assert "in lab 08 a graded function may call only these chips of earlier labs" in message
    assert "source_kernels.chips.lab07.grad_value" in message


def test_an_allowed_chip_runs_whole_inside_a_check():
    """Lab 05's launcher, called from lab 06's check, runs (its kernel and helpers with it);
    the same call from lab 05's check is refused with the rule."""
    import torch

    from source_kernels.chips import lab05 as chip05
    from source_kernels.inputs import make_inputs

    args = list(make_inputs(1, 3, 1, 4, [(2, 3)], 1, seed=0).values())
    expected = chip05.msda_forward(*args)
    got = _in_check_of(6, lambda: chip05.msda_forward(*args))
    assert isinstance(got, torch.Tensor) and torch.allclose(got, expected)
    refused = _in_check_of(5, lambda: chip05.msda_forward(*args))
    assert isinstance(refused, common.ReferenceCalled)
    assert "in lab 05 a graded function may call only these chips of earlier labs, and never " \
           "the course's reference: `source_kernels.chips.lab04.bilinear_sample_triton`" \
        in str(refused)


def test_the_reference_stays_forbidden_where_a_chip_re_exports_it():
    import torch

    from source_kernels.chips import lab01 as chip01

    refused = _in_check_of(2, lambda: chip01.msda_naive(torch.zeros(1, 1, 1, 1), None, None,
                                                         None, None))
    assert isinstance(refused, common.ReferenceCalled)
    assert "the reference" in str(refused) and "in lab 02 a graded function may call no chip" \
        in str(refused)


def test_a_visible_check_refuses_a_chip_of_its_own_lab_before_grading():
    """Lab 03's visible check, given lab 03's own chip to delegate to, fails there, in the
    notebook, with the rule (not only in the score)."""
    from autograde.checks import lab03
    from source_kernels.chips import lab03 as chip03

    scope = {"chip": chip03.sectors_and_lines}
    exec("def sectors_and_lines(*args, **kwargs):\n"             # noqa: S102
         "    return chip(*args, **kwargs)\n", scope)
    with pytest.raises(common.ReferenceCalled, match="in lab 03 a graded function may call "
                                                     "only these chips of earlier labs"):
        lab03.check_sectors_and_lines(scope["sectors_and_lines"], seed=0)


def test_the_graders_scan_allows_the_same_chips():
    """The names the check lets through reach the grader's static scan (the recorded
    session's ``allow``), so a submission built on an allowed chip is not marked forbidden."""
    from autograde.pipeline import scan

    cells = [("from source_kernels.chips.lab07 import grad_value\n", False),
             ("def lost_updates(*a):\n    return grad_value(*a)\n", True),
             ("from source_kernels.chips.lab08 import lost_updates as theirs\n"
              "def racy(*a):\n    return theirs(*a)\n", True)]
    forbidden, allowed = labs.forbidden_names("lab08_concurrent_writes")
    tainted = scan.tainted_names(cells, forbidden, tuple(allowed) + tuple(common.chips_allowed(8)))
    assert "lost_updates" not in tainted and "racy" in tainted


# ---------------------------------------------------------------- time estimates, one source
def _page_times() -> dict:
    times = {}
    for line in LABS_PAGE.read_text().splitlines():
        match = re.match(r"\| (\d\d) \| `(lab\d\d_\w+)` \|.*\| (about [^|]+?) \|$", line)
        if match:
            times[match.group(2)] = match.group(3)
    return times


def test_the_notebooks_and_the_labs_page_give_the_same_time():
    times = _page_times()
    assert len(times) == len(NOTEBOOKS) == 11
    for path in NOTEBOOKS:
        match = re.search(r"\*\*Time:\*\* (about [^.]+)\.", _header(path))
        assert match, path.name
        assert times[path.stem] == match.group(1), (path.stem, times[path.stem], match.group(1))
    assert times["lab05_forward_correct"] == "about 2½ hours"
    assert times["lab08_concurrent_writes"] == "about 3 hours"


def test_lab05_lists_what_the_student_writes():
    """Lab 05's introduction numbers one item per answer cell, each naming the functions the
    cell defines."""
    path = REPO / "assignments" / "lab05_forward_correct" / "lab05_forward_correct.ipynb"
    nb = json.loads(path.read_text())
    answers = [c for c in nb["cells"] if c["cell_type"] == "code"
               and c["metadata"].get("nbgrader", {}).get("solution")]
    header = _header(path)
    items = re.findall(r"^\d+\. (.*)$", header, flags=re.M)
    assert len(items) == len(answers) == 5
    for item, cell in zip(items, answers):
        defined = re.findall(r"^def (\w+)", "".join(cell["source"]), flags=re.M)
        assert defined and all(f"`{name}`" in item for name in defined), (item, defined)


def test_the_scan_and_the_runtime_trap_allow_the_same_modules():
    """The modules every lab may use are written once, ``autograde.ALWAYS_ALLOWED``
    (ARCHITECTURE.md, "three mechanisms"): the grader's static scan reads it as
    ``labs.ALLOWED``, ``forbid_references`` in the kernel through ``check_api`` (the kernel's
    view holds the package's top and check_api, not ``autograde.labs``); and the call rule
    hands the scan the same."""
    import autograde
    from autograde.checks import call_rule
    assert labs.ALLOWED is autograde.ALWAYS_ALLOWED is common.ALLOWED_MODULES
    _, allowed = labs.forbidden_names("lab05_forward_correct")
    names, _ = call_rule(5)
    assert set(allowed) == set(common.ALLOWED_MODULES)
    assert set(names) == set(common.chips_allowed(5)) and names
