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
    versions = [f"{label} {provenance[key]}" for key, label in
                (("driver", "driver"), ("cuda", "CUDA"), ("torch", "torch"),
                 ("triton", "Triton")) if provenance.get(key)]
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
