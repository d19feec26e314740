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


def load(name: str) -> dict | None:
    """The parsed results file ``results/<name>``, or None when it is not there."""
    path = RESULTS / name
    if not path.is_file():
        return None
    return json.loads(path.read_text())


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
    return Markdown(
        f"Measured on {provenance_line(prov)} by `{made_by}`, read from `results/{name}`. "
        "Everything else on this page runs without a GPU.")


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
