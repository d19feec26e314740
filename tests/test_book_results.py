"""The GPU results files that chapters 5-7 read, and the chapters' code for reading them.

While a results file is absent, the chapters say "not yet measured" (the book build checks
that they still build). Once the GPU run has written it, the chapters read fields by name:

- ``test_<file>_has_what_the_chapters_read`` checks a committed results file for every field
  the chapters use (skipped, with the reason, while the file is not committed);
- ``test_measuring_chapter_runs_with_results`` executes chapter 6 in a scratch copy of the
  book next to *synthetic* results files of the same schema (written to a temporary folder,
  never to results/), so that the code paths for present files are exercised before the
  real files arrive.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
METHODS = ["no_sync", "sync_in_loop", "events_drained", "events_back_to_back", "do_bench",
           "cuda_graph", "profiler"]
GRADIENTS = ("grad_value", "grad_sampling_locations", "grad_attention_weights")


def _load(name):
    path = RESULTS / name
    if not path.is_file():
        pytest.skip(f"results/{name} is not committed yet (written by the GPU run)")
    return json.loads(path.read_text())


def _has(record: dict, keys, where: str):
    missing = [k for k in keys if k not in record]
    assert not missing, f"{where} lacks {missing}"


def test_pitfalls_file_has_what_the_chapters_read():
    data = _load("pitfalls_h200.json")
    _has(data, ["provenance", "wrong_methods", "rows", "first_call", "dispatch"], "file")
    _has(data["provenance"], ["gpu", "date", "command", "torch", "triton"], "provenance")
    assert data["rows"], "no timing rows"
    for row in data["rows"]:
        _has(row, ["preset", "dtype", "callable", "method", "us_per_call"], "row")
    cases = {(r["preset"], r["dtype"]) for r in data["rows"] if r["callable"] == "op"}
    for case in cases:
        methods = {r["method"] for r in data["rows"]
                   if r["callable"] == "op" and (r["preset"], r["dtype"]) == case}
        assert methods == set(METHODS), f"{case}: methods {sorted(methods)}"
    for row in data["first_call"]:
        _has(row, ["preset", "dtype", "first_call_ms", "second_call_us"], "first_call")
    for row in data["dispatch"]:
        _has(row, ["preset", "dtype", "what", "host_us"], "dispatch")
        assert "median" in row["host_us"]


def test_hardware_file_has_what_the_chapters_read():
    data = _load("hardware_h200.json")
    _has(data, ["provenance", "accumulation", "determinism", "compiled"], "file")
    _has(data["provenance"], ["gpu", "date", "command", "compute_capability", "triton"],
         "provenance")
    _has(data["accumulation"], ["default_fp32_grad_accum", "rows"], "accumulation")
    for row in data["accumulation"]["rows"]:
        _has(row, ["preset", "distribution", "dtype", "fp32_grad_accum", "backward_us"],
             "accumulation row")
    _has(data["determinism"], ["runs", "rows"], "determinism")
    for row in data["determinism"]["rows"]:
        _has(row, ["preset", "dtype", "forward_runs_bitwise_equal", *GRADIENTS],
             "determinism row")
        for name in GRADIENTS:
            _has(row[name], ["elements", "differing_elements_per_run", "max_abs_difference",
                             "max_abs_value"], name)
    _has(data["compiled"], ["capability", "kernels"], "compiled")
    for kernel in data["compiled"]["kernels"]:
        _has(kernel, ["kernel", "dtype", "grad_value_buffer"], "compiled kernel")
        if "error" not in kernel:
            _has(kernel, ["ptx_memory_instructions", "sass_memory_opcodes", "registers",
                          "spills"], "compiled kernel")


def test_bench_file_has_what_the_chapters_read():
    data = _load("bench_h200.json")
    _has(data, ["provenance", "rows"], "file")
    _has(data["provenance"], ["gpu", "date", "command"], "provenance")
    measured = [r for r in data["rows"] if "error" not in r]
    assert measured, "no measured row"
    for row in measured:
        _has(row, ["preset", "distribution", "dtype", "impl", "direction", "kernel_us",
                   "graph_us", "dispatch_us", "floor_us", "rows_per_s"], "row")


def test_sweep_file_has_what_the_chapters_read():
    data = _load("sweep_h200.json")
    _has(data, ["provenance", "sweep", "plan"], "file")
    _has(data["provenance"], ["gpu", "date", "command"], "provenance")
    assert data["sweep"], "no sweep row"
    for row in data["sweep"]:
        _has(row, ["kernel", "variant", "preset", "dtype", "block_q", "num_warps", "us"],
             "sweep row")


# ------------------------------------------------------------- chapter 6 with results present

def _synthetic_results(folder: Path) -> None:
    """Results files of the documented schemas with made-up numbers (tests only)."""
    provenance = {"gpu": "synthetic GPU for a test", "date": "test", "command": "test",
                  "torch": "test", "triton": "test", "driver": "test", "cuda": "test"}
    value = iter(range(1, 10_000))
    rows, dispatch, first = [], [], []
    for preset in ("decoder", "encoder"):
        first.append({"preset": preset, "dtype": "bf16", "first_call_ms": next(value),
                      "second_call_us": next(value), "first_for_dtype": preset == "decoder"})
        for callable_ in ("op", "launch"):
            rows += [{"preset": preset, "distribution": "uniform", "dtype": "bf16",
                      "callable": callable_, "method": m, "us_per_call": float(next(value)),
                      "wrong": m in METHODS[:3]} for m in METHODS]
        dispatch += [{"preset": preset, "dtype": "bf16", "what": what,
                      "host_us": {"median": float(next(value)), "p10": 1.0, "p90": 2.0}}
                     for what in ("validate_inputs", "msda_forward (launch only)")]
    dispatch.append({"preset": None, "dtype": "fp32", "what": "empty Triton kernel launch",
                     "host_us": {"median": float(next(value)), "p10": 1.0, "p90": 2.0}})
    (folder / "pitfalls_h200.json").write_text(json.dumps({
        "provenance": provenance, "wrong_methods": METHODS[:3], "rows": rows,
        "first_call": first, "dispatch": dispatch}))
    bench_rows = [{"preset": p, "distribution": d, "dtype": t, "impl": i, "direction": direction,
                   "kernel_us": float(next(value)), "graph_us": float(next(value)),
                   "dispatch_us": float(next(value)) if direction == "forward" else None,
                   "floor_us": 1.0, "rows_per_s": 1e9}
                  for p in ("decoder", "encoder", "decoder-b32") for d in ("uniform", "local")
                  for t in ("bf16", "fp32") for i in ("triton", "grid_sample")
                  for direction in ("forward", "forward_backward")]
    bench_rows.append({"preset": "encoder", "distribution": "local", "dtype": "fp16",
                       "impl": "triton", "error": "an error row, as the harness records"})
    sweep = [{"kernel": k, "variant": v, "preset": "decoder", "distribution": "uniform",
              "dtype": "bf16", "block_q": q, "num_warps": w, "us": float(next(value))}
             for k in ("forward", "backward") for v, q, w in (("loop", 16, 4), ("tiled", 2, 4))]
    (folder / "bench_h200.json").write_text(json.dumps({
        "provenance": provenance, "rows": bench_rows}))
    (folder / "sweep_h200.json").write_text(json.dumps({
        "provenance": provenance, "sweep": sweep,
        "plan": {"forward": {"small,2": ["tiled", 2, 4]}}}))


def test_measuring_chapter_runs_with_results(tmp_path):
    for relative in ("book/_figures.py", "book/_results.py", "book/chapters/ch06_measuring.ipynb",
                     "scripts/gpu/pitfalls.py", "results/anchors_h200.json"):
        target = tmp_path / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / relative, target)
    _synthetic_results(tmp_path / "results")
    chapter = tmp_path / "book" / "chapters" / "ch06_measuring.ipynb"
    notebook = nbformat.read(chapter, as_version=4)
    NotebookClient(notebook, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(chapter.parent)}}).execute()
    text = "\n".join(output.get("text", "") for cell in notebook.cells
                     if cell.cell_type == "code" for output in cell.get("outputs", []))
    errors = [output for cell in notebook.cells if cell.cell_type == "code"
              for output in cell.get("outputs", [])
              if output.get("output_type") == "error" or output.get("name") == "stderr"]
    assert not errors, errors
    assert "not yet measured" not in text, "the chapter did not read the results files"
    assert "synthetic GPU for a test" in text
    figures = sum("image/svg+xml" in output.get("data", {}) or "image/png" in output.get("data", {})
                  for cell in notebook.cells if cell.cell_type == "code"
                  for output in cell.get("outputs", []))
    assert figures >= 5, f"{figures} figures drawn from the results files"
