"""The committed GPU results files, as the book chapters read them.

Numbers measured on a GPU reach the book only through the JSON files in ``results/``, each
written by a script that records its provenance.  A chapter asks for a file by name; while
it is absent the chapter says "not yet measured" and shows no number from it.

    import _results
    bench = _results.load("bench_h200.json")        # None while not measured
    glue("ch6_note", _results.gpu_note("bench_h200.json", "python -m source_kernels.bench"),
         display=False)

and, in a markdown cell, the course's one recognisable note for GPU measurements::

    ```{admonition} Measured on a GPU
    :class: note
    {glue:md}`ch6_note`
    ```
"""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

from IPython.display import Markdown

ROOT = Path(__file__).resolve().parents[1]       # the repository
RESULTS = ROOT / "results"


class ResultsError(RuntimeError):
    """A results file the book must not quote: no provenance, or provenance that its
    content contradicts.  Raised while the page executes, so the build fails."""


def _raw(name: str) -> dict | None:
    path = RESULTS / name
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def load(name: str) -> dict | None:
    """The parsed results file ``results/<name>``, or None when it is not there.

    Raises ResultsError for a file the book must not quote (``provenance_problem``)."""
    data = _raw(name)
    if data is None:
        return None
    problem = provenance_problem(name, data)
    if problem:
        raise ResultsError(f"results/{name}: {problem}")
    return data


# ------------------------------------------------------------------ provenance checks
MADE_BY = ("command", "source", "method")      # how a file was made: one of these, at least


def _code_repository() -> Path:
    """The git checkout of the source_kernels package this page imports."""
    import source_kernels

    return Path(source_kernels.__file__).resolve().parents[1]


def _plan_at(commit: str) -> dict | None:
    """{"forward": {"regime,size": [kernel, BLOCK_Q, warps]}, "backward": ...} of
    FORWARD_PLAN / BACKWARD_PLAN in the repository at ``commit`` (None where git cannot
    show it)."""
    import ast
    import subprocess

    plan = {}
    for direction, filename, name in (("forward", "forward.py", "FORWARD_PLAN"),
                                      ("backward", "backward.py", "BACKWARD_PLAN")):
        shown = subprocess.run(["git", "show", f"{commit}:source_kernels/{filename}"],
                               cwd=_code_repository(), capture_output=True, text=True)
        if shown.returncode != 0:
            return None
        tree = ast.parse(shown.stdout)
        table = next(ast.literal_eval(node.value) for node in tree.body
                     if isinstance(node, ast.Assign)
                     and any(getattr(t, "id", None) == name for t in node.targets))
        plan[direction] = {f"{r},{s}": list(v) for (r, s), v in table.items()}
    return plan


def shipped_plan() -> dict:
    """The launch plan of the code this page runs, in the results files' form."""
    from source_kernels import backward, forward

    return {direction: {f"{r},{s}": list(v) for (r, s), v in table.items()}
            for direction, table in (("forward", forward.FORWARD_PLAN),
                                     ("backward", backward.BACKWARD_PLAN))}


def plan_differences(plan: dict, other: dict) -> list[str]:
    """'forward large,2: loop 16/2 -> rows-sample-hm 32/4' for each entry that differs."""
    def text(entry):
        return "none" if entry is None else f"{entry[0]} {entry[1]}/{entry[2]}"
    found = []
    for direction in ("forward", "backward"):
        a, b = plan.get(direction, {}), other.get(direction, {})
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                found.append(f"{direction} {key}: {text(a.get(key))} -> {text(b.get(key))}")
    return found


def provenance_problem(name: str, data: dict | None = None) -> str | None:
    """Why the book must not quote ``results/<name>``, or None when it may:

    - it has no ``provenance`` block, or the block says neither when (``date``) nor how
      (one of ``command``, ``source``, ``method``) the file was made;
    - it is a dry run of its script (``"dry_run": true``), whose numbers are not GPU times;
    - it records the launch plan it ran (``plan_used``) and names the commit of its code
      (``code_commit``), and that plan is neither the commit's own nor, for a run that
      wrote a sweep's plan into the code before it ran (``scripts/gpu/run.py sweep bench``), the
      plan of ``results/sweep_h200.json`` from the same commit;
    - it is a sweep (``plan`` chosen from its rows) whose ``plan_used`` is not its ``plan``
      with the commit's entries kept where the sweep had no correct candidate;
    - it records the plan of another commit (``provenance.this_repository_plan``) that
      git shows otherwise.
    """
    data = _raw(name) if data is None else data
    if data is None:
        return "the file is absent"
    prov = data.get("provenance")
    if not isinstance(prov, dict) or not prov:
        return "no provenance block (when, where and by what command it was measured)"
    if not prov.get("date"):
        return "its provenance has no date"
    if not any(prov.get(key) for key in MADE_BY):
        return "its provenance says neither the command nor the source that made it"
    if data.get("dry_run"):
        return "it is a dry run of its script on a CPU (\"dry_run\": true), not a measurement"
    commit = prov.get("code_commit")
    if "plan_used" in data and commit:
        at_commit = _plan_at(commit)
        if at_commit is None:
            return f"git cannot show the plan of its code_commit {commit}"
        used = data["plan_used"]
        if "plan" in data and "sweep" in data:            # a sweep: chose, then applied
            expected = {d: dict(at_commit[d], **data["plan"].get(d, {})) for d in at_commit}
            if used != expected:
                return ("its plan_used is not the sweep's plan over its commit's: "
                        + "; ".join(plan_differences(expected, used)))
        elif used != at_commit:
            sweep = _raw("sweep_h200.json") if name != "sweep_h200.json" else None
            same_run = (sweep is not None
                        and sweep.get("provenance", {}).get("code_commit") == commit)
            if not (same_run and sweep.get("plan_used") == used):
                return (f"its plan_used is neither the plan of its code_commit {commit} "
                        "nor the plan a sweep of that commit wrote: "
                        + "; ".join(plan_differences(at_commit, used)))
    recorded = prov.get("this_repository_plan")
    if isinstance(recorded, dict) and recorded.get("commit"):
        at_commit = _plan_at(recorded["commit"])
        if at_commit is None:
            return f"git cannot show the plan of commit {recorded['commit']}"
        mine = {d: recorded.get(d, {}) for d in ("forward", "backward")}
        if mine != at_commit:
            return (f"the plan it records for commit {recorded['commit']} is not that "
                    "commit's: " + "; ".join(plan_differences(at_commit, mine)))
    return None


KERNEL_FUNCTIONS = {"loop": "_msda_{direction}_kernel", "tiled": "_msda_{direction}_tiled_kernel",
                    "rows": "_msda_{direction}_rows_kernel"}


def planned_function(direction: str, preset: str, dtype: str) -> str:
    """The Triton function the shipped plan launches for ``direction`` ("forward" or
    "backward") of a preset in a dtype ("bf16", "bfloat16", "fp32", "float32", ...)."""
    from source_kernels import backward, forward
    from source_kernels.inputs import PRESETS, pyramid_shapes

    p = PRESETS[preset]
    size = {"bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "fp32": 4, "float32": 4,
            "fp64": 8, "float64": 8}[dtype]
    plan = forward.FORWARD_PLAN if direction == "forward" else backward.BACKWARD_PLAN
    kind = forward.planned(plan, p.batch, p.num_queries(pyramid_shapes()), p.heads, size)[0]
    return KERNEL_FUNCTIONS[kind.split("-")[0]].format(direction=direction)


ELEMENTS = {2: "16-bit", 4: "fp32", 8: "fp64"}


def plan_uses(family: str) -> str:
    """Where the shipped plan launches a kernel family ("loop", "tiled" or "rows"), as
    'forward: large fp32, small 16-bit; backward: none'."""
    parts = []
    for direction, table in shipped_plan().items():
        where = [f"{key.split(',')[0]} {ELEMENTS[int(key.split(',')[1])]}"
                 for key, entry in table.items() if entry[0].split("-")[0] == family]
        parts.append(f"{direction}: {', '.join(where) or 'none'}")
    return "; ".join(parts)


def plan_story(name: str) -> str:
    """One sentence: which plan the runs of ``results/<name>`` used, against the code's."""
    data = load(name)
    prov = data["provenance"]
    used = data["plan_used"]
    commit = prov.get("code_commit")
    sentence = f"`results/{name}` ran the launch plan it records (`plan_used`)"
    if commit and _plan_at(commit) != used:
        sentence += (f"; its code was commit {commit}, with the plan of the same run's sweep "
                     "written into it first (the `sweep` and `bench` parts of "
                     "`scripts/gpu/run.py`)")
    differs = plan_differences(used, shipped_plan())
    sentence += (", which is the plan this page runs" if not differs else
                 f", which differs from the plan this page runs in {len(differs)} "
                 f"entr{'y' if len(differs) == 1 else 'ies'} ({'; '.join(differs)})")
    return sentence + "."


def provenance_line(provenance: dict) -> str:
    """'NVIDIA H200 (driver ..., CUDA ..., torch ..., Triton ...) on <date>' from the
    provenance block of a results file; only the fields the file has."""
    gpu = provenance.get("gpu", "a GPU")
    # one value per field (a file written on a two-GPU host lists the driver twice)
    versions = [f"{label} {str(provenance[key]).splitlines()[0]}" for key, label in
                (("driver", "driver"), ("cuda", "CUDA"), ("cuda_runtime", "CUDA"),
                 ("torch", "torch"), ("triton", "Triton")) if provenance.get(key)]
    line = gpu
    if versions:
        line += " (" + ", ".join(versions) + ")"
    if provenance.get("date"):
        line += f" on {provenance['date']}"
    return line


def gpu_note(name: str, command: str) -> Markdown:
    """The text of the note that every GPU section of the book carries."""
    data = load(name)
    if data is None:
        return Markdown(
            f"**Not yet measured.** The results file `results/{name}` is not in this copy of "
            f"the repository, so this section shows no GPU numbers. `{command}` writes it on "
            "a machine with a CUDA GPU. Everything else on this page runs without a GPU.")
    prov = data.get("provenance", {})
    made_by = prov.get("command", command)
    text = f"Measured on {provenance_line(prov)} by `{made_by}`, read from `results/{name}`."
    for run in data.get("filled_in", []):
        later = run.get("provenance", {})
        measured = run.get("measured", [])
        kinds = sorted({m.split()[0] for m in measured})
        counts = ", ".join(f"{sum(m.split()[0] == k for m in measured)} {k}" for k in kinds)
        other_code = code_that_ran(later) != code_that_ran(prov)
        text += (f" {len(measured)} cases ({counts}) were measured later, on "
                 f"{provenance_line(later)} by `{later.get('command', '?')}`"
                 + (f", from other code ({code_that_ran(later)}; the rest ran "
                    f"{code_that_ran(prov)})" if other_code else "")
                 + "; where a table shows them, their rows are marked *filled in*.")
    return Markdown(text + " Everything else on this page runs without a GPU.")


def code_that_ran(provenance: dict) -> str:
    """'commit fcc2ccc', or 'commit 7a0b863 with uncommitted changes': the code a results
    file's run executed, as its provenance records it."""
    if provenance.get("code_commit"):
        return f"commit {provenance['code_commit']}"
    commit = str(provenance.get("repository_commit", "?"))[:7]
    dirty = provenance.get("uncommitted_changes_to_tracked_files")
    return f"commit {commit}" + (" with uncommitted changes" if dirty else "")


# ------------------------------------------------------------------ the book's timing words
# Every timing in the book is one of two figures, and says which (chapter 6, section 6.2):
DEVICE_TIME = "device time"            # profiler: the kernels one call launches, L2 flushed
HOST_INCLUSIVE = "host-inclusive"      # do_bench: CUDA events around each call


def stack(provenance: dict) -> str:
    """'torch 2.11.0+cu130, Triton 3.6.0': the software a results file was measured with."""
    return f"torch {provenance.get('torch', '?')}, Triton {provenance.get('triton', '?')}"


def this_machine_stack() -> str:
    """The same for the machine that runs this page (the book build)."""
    import torch
    import triton
    return f"torch {torch.__version__}, Triton {triton.__version__}"


def rows(data: dict | None, key: str = "rows", **match) -> list[dict]:
    """The rows of ``data[key]`` whose fields equal ``match`` (none when data is None)."""
    if data is None:
        return []
    return [r for r in data.get(key, []) if all(r.get(k) == v for k, v in match.items())]


def one(data: dict | None, key: str = "rows", **match) -> dict | None:
    """The single row of ``data[key]`` matching ``match``, or None."""
    found = rows(data, key, **match)
    if len(found) > 1:
        raise ValueError(f"{len(found)} rows match {match}")
    return found[0] if found else None


def floor_us(row: dict) -> float:
    """The floor of a benchmark row (results/bench_h200.json): ``floor_us`` as the harness
    computed it with ``source_kernels.bench.traffic_bytes``: every value row the call's
    samples touch read once, locations and weights read once, the output written once; a
    forward+backward adds grad_out read once and grad_value (all of it), grad_loc and
    grad_attn written once.  The backward's second read of the touched value rows is not
    counted, so this is a lower bound for any implementation, a fused one included.  The
    book uses this one definition of the floor everywhere it holds a time against one."""
    return row["floor_us"]


def bound_by(device_us: float, dispatch_us: float) -> str:
    """Which side limits back-to-back eager calls: 'the host' when one call's dispatch (host
    time) exceeds its device time, else 'the GPU'."""
    return "the host" if dispatch_us > device_us else "the GPU"


PEER_NAMES = {"this_repository": "this course", "seed": "seed course (Triton)",
              "cuda_op": "original CUDA op", "dcnv4": "DCNv4"}


def peer_cell(row: dict | None) -> str:
    """A peers-table entry as text: the figure (with the seed's best configuration in
    brackets), or why there is none."""
    if row is None:
        return "not measured"
    if row["status"] != "measured":
        return {"unsupported": "no kernel", "refuses": "refuses",
                "wrong_backward": "wrong grads"}[row["status"]]
    text = f"{row['us']:,.1f}"
    if "best_config_us" in row:
        text += f" ({row['best_config_us']:,.1f})"
    return text


def peers_note(peers: dict | None) -> Markdown:
    """The note for a section that shows the peers measured side by side."""
    if peers is None:
        return Markdown("**Not in this copy.** `results/peers_h200.json` is absent, so the "
                        "peers are not shown.")
    prov = peers["provenance"]
    return Markdown(
        f"Measured side by side on one {prov['gpu']} on {prov['date']} ({stack(prov)}), "
        "every implementation on the same inputs in one session, outside this repository "
        "(the other implementations' code is not part of it); transcribed into "
        "`results/peers_h200.json`, which records how. No script here re-measures it.")


# ------------------------------------------------------------------ glue, and what is absent
# A page refers to measured numbers by name ({glue:text}`name`).  Cells glue them through
# glue() below, which remembers the names; the page's last cell calls glue_unmeasured(), which
# glues "(not measured)" under every name the page refers to that no cell glued, because its
# results file is absent.  The page then still builds, and says what it lacks.
_glued: set[str] = set()
NOT_MEASURED = "(not measured)"


def glue(name: str, value, display: bool = False) -> None:
    """``myst_nb.glue``, remembering ``name`` for glue_unmeasured()."""
    from myst_nb import glue as myst_glue

    _glued.add(name)
    myst_glue(name, value, display=display)


def glue_unmeasured(notebook: str, cell_ids=None) -> list[str]:
    """Glue NOT_MEASURED under every name that the markdown cells of ``notebook`` (those of
    ``cell_ids`` only, when given) refer to and that no cell has glued; returns the names."""
    import re

    import nbformat

    cells = nbformat.read(notebook, as_version=4).cells
    text = "".join(cell.source for cell in cells if cell.cell_type == "markdown"
                   and (cell_ids is None or cell.get("id") in cell_ids))
    names = sorted(set(re.findall(r"\{glue:\w+\}`([^`]+)`", text)) - _glued)
    for name in names:
        glue(name, NOT_MEASURED)
    return names


# ------------------------------------------------------------------ printed output
WIDTH = 74      # characters of an output line that the book's column shows without scrolling


def say(*parts, indent: str = "    ") -> None:
    """Print a sentence wrapped to the book's column (continuation lines indented)."""
    print(textwrap.fill(" ".join(str(p) for p in parts), WIDTH, subsequent_indent=indent))


PEER_SHORT = {"this_repository": "this course", "seed": "seed", "cuda_op": "CUDA op",
              "dcnv4": "DCNv4"}
