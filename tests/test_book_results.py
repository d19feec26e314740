"""The GPU results files that chapters 4 (section 4.6), 6 and 7 read, and the numbers those
chapters quote from them.

- ``test_<file>_has_what_the_chapters_read`` checks a committed results file for every field
  the chapters use (skipped, with the reason, while the file is not committed);
- ``test_peers_figures_of_this_repository_agree_with_the_harness`` holds the hand-transcribed
  ``results/peers_h200.json`` against the harness's own run of the same kernels;
- ``test_measured_numbers_in_the_prose_are_read_from_results`` fails when a chapter's text
  states a measured time, rate or ratio itself instead of gluing it from a results file;
- ``test_measuring_chapters_quote_the_results_files`` executes chapter 6 and section 4.6 in a
  scratch copy of the book next to the committed results and checks every number they glue
  into their text against the same number computed here, independently, from the files;
- ``test_measuring_chapters_run_without_results`` executes them with no results file at all:
  each section must say what is not measured, and no cell may fail;
- ``test_chapters_read_refilled_results`` feeds the cells that read the pitfalls and hardware
  files with files of the shape ``scripts/gpu/run.py refill`` writes (synthetic numbers,
  in a temporary folder, never in results/), so that the code paths for those rows run
  before the real files arrive.

The three executions take about two minutes on two busy cores.
"""
from __future__ import annotations

import ast
import copy
import json
import re
import shutil
import statistics
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
CHAPTERS = ROOT / "book" / "chapters"
METHODS = ["no_sync", "sync_in_loop", "events_drained", "events_back_to_back", "do_bench",
           "cuda_graph", "profiler"]
GRADIENTS = ("grad_value", "grad_sampling_locations", "grad_attention_weights")
PEER_IMPLS = ("this_repository", "seed", "cuda_op", "dcnv4")
PEER_STATUSES = ("measured", "unsupported", "refuses", "wrong_backward")
SECTION_46 = ("cell-031", "cell-032", "cell-032-reading")     # chapter 4's section 4.6
GRADIENT_RUNS = [10, 12, 11]          # differing elements per run, in synthetic files


def _load(name):
    path = RESULTS / name
    if not path.is_file():
        pytest.skip(f"results/{name} is not committed yet (written by the GPU run)")
    return json.loads(path.read_text())


def _has(record: dict, keys, where: str):
    missing = [k for k in keys if k not in record]
    assert not missing, f"{where} lacks {missing}"


# --------------------------------------------------------------------- the files' fields

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
        assert "first_for_kernel" in row or "first_for_dtype" in row, row
    for row in data["dispatch"]:
        _has(row, ["preset", "dtype", "what", "host_us"], "dispatch")
        assert "median" in row["host_us"]
    for row in data.get("skipped", []):
        _has(row, ["preset", "dtype", "reason"], "skipped")


def test_hardware_file_has_what_the_chapters_read():
    data = _load("hardware_h200.json")
    _has(data, ["provenance", "accumulation", "determinism", "compiled"], "file")
    _has(data["provenance"], ["gpu", "date", "command", "compute_capability", "triton"],
         "provenance")
    _has(data["accumulation"], ["default_fp32_grad_accum", "rows"], "accumulation")
    runs = data.get("filled_in", [])
    for run in runs:
        _has(run, ["provenance", "measured"], "filled_in run")
    for section in ("accumulation", "determinism"):
        for row in data[section]["rows"]:
            if "filled_in" in row:
                assert 1 <= row["filled_in"] <= len(runs), f"{section} row {row}"
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
    for row in data.get("skipped", []):
        _has(row, ["what", "reason"], "skipped")
    _has(data["compiled"], ["capability", "kernels"], "compiled")
    for kernel in data["compiled"]["kernels"]:
        _has(kernel, ["kernel", "dtype", "grad_value_buffer", "triton_function"],
             "compiled kernel")
        if "error" not in kernel:
            _has(kernel, ["ptx_memory_instructions", "sass_memory_opcodes", "registers",
                          "spills"], "compiled kernel")


def test_bench_file_has_what_the_chapters_read():
    data = _load("bench_h200.json")
    _has(data, ["provenance", "rows", "plan_used", "dispatch_breakdown_us"], "file")
    _has(data["provenance"], ["gpu", "date", "command", "torch", "triton"], "provenance")
    measured = [r for r in data["rows"] if "error" not in r]
    assert measured, "no measured row"
    for row in measured:
        _has(row, ["preset", "distribution", "dtype", "impl", "direction", "kernel_us",
                   "graph_us", "device_us", "dispatch_us", "floor_us", "gathered_rows"], "row")


def _plan_table(plan: dict) -> dict:
    """A plan as the results files record it: {"forward": {"small,2": [kernel, q, w]}}."""
    return {f"{size},{nbytes}": list(entry) for (size, nbytes), entry in plan.items()}


def test_sweep_file_has_what_the_chapters_read():
    """Every timed row is a device time of a candidate that passed its check; every rejected
    one says why; ``plan`` is the fastest correct candidate per direction, regime and element
    size (uniform locations), and ``plan_used`` is the plan the operator ships."""
    from source_kernels.backward import BACKWARD_PLAN
    from source_kernels.forward import FORWARD_PLAN, regime
    from source_kernels.inputs import PRESETS

    data = _load("sweep_h200.json")
    _has(data, ["provenance", "sweep", "plan", "plan_used"], "file")
    _has(data["provenance"], ["gpu", "date", "command"], "provenance")
    assert data["sweep"], "no sweep row"
    for row in data["sweep"]:
        _has(row, ["kernel", "variant", "preset", "distribution", "dtype", "block_q",
                   "num_warps", "us"], "sweep row")
        assert row.get("correct", True) is True, row
    for row in data.get("sweep_rejected", []):
        _has(row, ["kernel", "variant", "preset", "dtype", "error"], "rejected row")
        assert row["correct"] is False and "us" not in row, row
    element = {"bf16": 2, "fp16": 2, "fp32": 4, "fp64": 8}
    fastest = {}
    for row in data["sweep"]:
        if row["distribution"] != "uniform":
            continue
        spec = PRESETS[row["preset"]]
        key = (row["kernel"], f"{regime(spec.batch, spec.queries or 22223, spec.heads)},"
                              f"{element[row['dtype']]}")
        if key not in fastest or row["us"] < fastest[key]["us"]:
            fastest[key] = row
    for direction, entries in data["plan"].items():
        for key, entry in entries.items():
            best = fastest[direction, key]
            assert entry == [best["variant"], best["block_q"], best["num_warps"]], (
                direction, key, entry, best)
    shipped = {"forward": _plan_table(FORWARD_PLAN), "backward": _plan_table(BACKWARD_PLAN)}
    assert data["plan_used"] == shipped, "the sweep ran with another plan than the code's"
    for direction, entries in data["plan"].items():
        for key, entry in entries.items():
            assert shipped[direction][key] == entry, (direction, key)


def test_limits_profile_and_model_files_have_what_the_chapters_read():
    limits = _load("decoder_limits_h200.json")
    for row in limits["rows"]:
        _has(row, ["preset", "dtype", "programs", "rows_read", "distinct_rows",
                   "empty_kernel_us", "gather_us", "forward_us"], "decoder_limits row")
    profile = _load("dispatch_profile_h200.json")
    _has(profile, ["provenance", "calls", "top_own_time"], "dispatch_profile")
    model = _load("model_h200.json")
    _has(model, ["provenance", "dispatch", "step_time"], "model")
    for name in ("decoder/triton", "small/triton"):
        case = model["dispatch"]["cases"][name]
        for key in ("eager_forward", "graph_forward", "eager_forward_backward",
                    "graphed_forward_backward"):
            _has(case[key], ["wall_us"], f"model {name} {key}")
    ncu = _load("ncu_h200.json")
    for launch in ncu["launches"]:
        _has(launch, ["case", "kernel", "busiest_unit", "busiest_pct_of_peak", "metrics"],
             "ncu launch")


def test_peers_file_has_what_the_chapters_read():
    data = _load("peers_h200.json")
    _has(data, ["provenance", "methods", "implementations", "device_us", "host_inclusive_us",
                "dispatch_us", "training_steps", "peak_memory", "seed_test_file"], "file")
    _has(data["provenance"], ["transcribed", "source", "gpu", "date", "torch", "triton",
                              "inputs"], "provenance")
    assert data["provenance"]["transcribed"] is True
    assert set(data["implementations"]) == set(PEER_IMPLS)
    seen = set()
    for row in data["device_us"]:
        _has(row, ["preset", "distribution", "direction", "dtype", "impl", "status"], "row")
        assert row["impl"] in PEER_IMPLS and row["status"] in PEER_STATUSES, row
        assert ("us" in row) == (row["status"] == "measured"), row
        key = (row["preset"], row["distribution"], row["direction"], row["dtype"], row["impl"])
        assert key not in seen, f"two rows for {key}"
        seen.add(key)
    for row in data["training_steps"]["rows"]:
        _has(row, ["model", "precision", "mode", "step_ms", "device_ms"], "training step")
        assert "this_repository" in row["step_ms"]


def test_peers_figures_of_this_repository_agree_with_the_harness():
    """The side-by-side run timed this repository's kernels too, by the harness's method
    (device time), with the launch plan its provenance records.  The harness's sweep of the
    same day timed those same configurations: a forward must agree within 5 % with the
    sweep's row of the configuration that plan gives it, a forward+backward with the sum
    of the sweep's forward and backward rows, or the transcription (or one of the runs) is
    wrong."""
    from source_kernels.forward import planned
    from source_kernels.inputs import PRESETS

    peers = _load("peers_h200.json")
    sweep = _load("sweep_h200.json")
    ran = peers["provenance"]["this_repository_plan"]
    plan = {direction: {(key.split(",")[0], int(key.split(",")[1])): tuple(entry)
                        for key, entry in ran[direction].items()}
            for direction in ("forward", "backward")}
    element = {"bf16": 2, "fp16": 2, "fp32": 4, "fp64": 8}
    timed = {(r["kernel"], r["preset"], r["distribution"], r["dtype"], r["variant"],
              r["block_q"], r["num_warps"]): r["us"] for r in sweep["sweep"]}
    compared = 0
    for row in peers["device_us"]:
        if row["impl"] != "this_repository" or row["status"] != "measured":
            continue
        spec = PRESETS[row["preset"]]
        queries = spec.queries or 22223
        case = (row["preset"], row["distribution"], row["dtype"])
        parts = ["forward"] + (["backward"] if row["direction"] == "forward_backward" else [])
        rows = [timed.get((direction, *case,
                           *planned(plan[direction], spec.batch, queries, spec.heads,
                                    element[row["dtype"]])))
                for direction in parts]
        if None in rows:
            continue                    # a configuration the sweep did not time correctly
        assert abs(row["us"] / sum(rows) - 1) < 0.05, (
            f"{case} {row['direction']}: peers_h200.json has {row['us']} µs, the sweep's "
            f"rows of the same configurations {' + '.join(f'{u:.1f}' for u in rows)}")
        compared += 1
    assert compared >= 15, f"only {compared} cases in common"


# ------------------------------------------------------------- numbers in the chapters' text

# A measured quantity written as a literal: a number followed by a unit of time, rate,
# memory or a percentage, or written as a factor (3.4x, 3.4 times).
_LITERAL_MEASUREMENT = re.compile(
    r"(?<![\w.`])\d[\d,]*(?:\.\d+)?\s*(?:µs|us\b|ms\b|ns\b|s\b|G rows/s|[KMGT]i?B/s|MiB\b|GiB\b"
    r"|%|×|x\b|times\b)")


def _prose(cell_source: str) -> str:
    """Markdown without glue roles, code spans, math and fenced blocks."""
    text = re.sub(r"```.*?```", " ", cell_source, flags=re.S)
    text = re.sub(r"\{glue:\w+\}`[^`]*`", " ", text)
    text = re.sub(r"\$[^$]*\$", " ", text)
    return re.sub(r"`[^`]*`", " ", text)


def _measuring_markdown():
    for name in ("ch06_measuring", "ch07_shipping"):
        notebook = nbformat.read(CHAPTERS / f"{name}.ipynb", as_version=4)
        for cell in notebook.cells:
            if cell.cell_type == "markdown":
                yield f"{name} {cell.id}", cell.source
    notebook = nbformat.read(CHAPTERS / "ch04_the_forward_kernel.ipynb", as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "markdown" and cell.id in SECTION_46:
            yield f"ch04_the_forward_kernel {cell.id}", cell.source


def test_measured_numbers_in_the_prose_are_read_from_results():
    found = [f"{where}: {match.group(0)!r} in ...{_prose(text)[max(0, match.start() - 50):match.end() + 20]!r}"
             for where, text in _measuring_markdown()
             for match in _LITERAL_MEASUREMENT.finditer(_prose(text))]
    assert not found, ("measured figures written into the text instead of glued from a "
                       "results file:\n" + "\n".join(found))


def test_the_prose_check_sees_a_literal_measurement():
    assert _LITERAL_MEASUREMENT.search(_prose("the forward takes 11.2 µs on the H200"))
    assert _LITERAL_MEASUREMENT.search(_prose("it is 6.7x slower"))
    assert not _LITERAL_MEASUREMENT.search(_prose("it takes {glue:text}`ch6_dec_device`"))
    assert not _LITERAL_MEASUREMENT.search(_prose("16 samples of 32 channels on 132 SMs"))


# ------------------------------------------------------------ executing the chapters

def _scratch_book(tmp_path: Path, results: dict[str, dict] | None) -> Path:
    """A copy of what the measuring chapters need, with ``results`` (file name -> data) as
    its results folder (the committed files when None)."""
    helpers = [str(path.relative_to(ROOT)) for path in (ROOT / "book").glob("_*.py")]
    for relative in (*helpers, "scripts/gpu/pitfalls.py",
                     "book/chapters/ch06_measuring.ipynb",
                     "book/chapters/ch04_the_forward_kernel.ipynb",
                     "book/chapters/ch07_shipping.ipynb"):
        target = tmp_path / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / relative, target)
    folder = tmp_path / "results"
    folder.mkdir()
    if results is None:
        for path in RESULTS.glob("*.json"):
            shutil.copy(path, folder / path.name)
    else:
        for name, data in results.items():
            (folder / name).write_text(json.dumps(data))
    return tmp_path / "book" / "chapters"


def _cells(chapter: Path, ids=None) -> nbformat.NotebookNode:
    notebook = nbformat.read(chapter, as_version=4)
    if ids is not None:
        notebook.cells = [cell for cell in notebook.cells if cell.id in ids]
        assert [c.id for c in notebook.cells] == list(ids), "a cell of the section is missing"
    return notebook


def _execute(notebook, folder: Path) -> dict:
    """Run ``notebook`` in ``folder``; its printed text, glued values and figures."""
    NotebookClient(notebook, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(folder)}}).execute()
    outputs = [output for cell in notebook.cells if cell.cell_type == "code"
               for output in cell.get("outputs", [])]
    errors = [o for o in outputs if o.get("output_type") == "error" or o.get("name") == "stderr"]
    assert not errors, errors
    glued = {}
    for output in outputs:
        name = output.get("metadata", {}).get("scrapbook", {}).get("name")
        if not name:
            continue
        # glue(..., display=False) files its data under "application/papermill.record/..."
        data = {mime.removeprefix("application/papermill.record/"): value
                for mime, value in output.get("data", {}).items()}
        if "text/markdown" in data:
            glued[name] = data["text/markdown"]
        else:
            plain = data.get("text/plain", "")
            glued[name] = ast.literal_eval(plain) if plain[:1] in "'\"" else plain
    referred = {name for cell in notebook.cells if cell.cell_type == "markdown"
                for name in re.findall(r"\{glue:\w+\}`([^`]+)`", cell.source)}
    assert referred <= set(glued), f"referred to, never glued: {sorted(referred - set(glued))}"
    printed = "\n".join(o.get("text", "") for o in outputs)
    return {"text": " ".join(printed.split()),          # lines unwrapped
            "glued": glued,
            "figures": sum("image/svg+xml" in o.get("data", {}) for o in outputs)}


def _section_46(chapters: Path):
    # the setup cell of chapter 4 (imports), then section 4.6's own cells
    return _cells(chapters / "ch04_the_forward_kernel.ipynb", ("cell-001", *SECTION_46))


def _expected_glue() -> dict[str, str]:
    """What chapter 6 and section 4.6 must glue, computed here from the committed files."""
    bench = json.loads((RESULTS / "bench_h200.json").read_text())
    pitfalls = json.loads((RESULTS / "pitfalls_h200.json").read_text())
    sweep = json.loads((RESULTS / "sweep_h200.json").read_text())
    limits = json.loads((RESULTS / "decoder_limits_h200.json").read_text())
    peers = json.loads((RESULTS / "peers_h200.json").read_text())

    def harness(preset, dtype, direction="forward", distribution="uniform"):
        return next(r for r in bench["rows"] if r["impl"] == "triton" and "error" not in r
                    and (r["preset"], r["dtype"], r["direction"], r["distribution"])
                    == (preset, dtype, direction, distribution))

    def peer(preset, dtype, direction="forward", impl="this_repository",
             distribution="uniform"):
        return next(r["us"] for r in peers["device_us"]
                    if (r["preset"], r["dtype"], r["direction"], r["impl"],
                        r["distribution"]) == (preset, dtype, direction, impl, distribution))

    def ratio(value):
        return f"{value:.2f}" if abs(value) >= 1 else f"{value:.0%}"

    decoder, encoder = harness("decoder", "bf16"), harness("encoder", "bf16")
    fb = harness("decoder", "bf16", "forward_backward")
    method = {r["method"]: r["us_per_call"] for r in pitfalls["rows"]
              if (r["callable"], r["preset"], r["dtype"]) == ("op", "decoder", "bf16")}
    limit = next(r for r in limits["rows"] if (r["preset"], r["dtype"]) == ("decoder", "bf16"))
    forward = [r for r in bench["rows"] if r["impl"] == "triton" and "error" not in r
               and r["direction"] == "forward"]
    bound = {p: " and ".join(sorted({"the host" if r["dispatch_us"] > r["device_us"]
                                     else "the GPU" for r in forward if r["preset"] == p}))
             for p in ("decoder", "encoder")}
    uniform = [r for r in bench["rows"] if r["impl"] == "triton" and "error" not in r
               and r["distribution"] == "uniform"]
    floors = sorted(r["device_us"] / r["floor_us"] for r in uniform)
    def best(preset, direction, dtype, family=None):
        row = min((r for r in sweep["sweep"] if (r["preset"], r["kernel"], r["dtype"],
                                                  r["distribution"])
                   == (preset, direction, dtype, "uniform")
                   and (family is None or r["variant"].split("-")[0] == family)),
                  key=lambda r: r["us"])
        return f"{row['us']:.1f} µs ({row['variant']} {row['block_q']}/{row['num_warps']})"

    rejected = {}
    for r in sweep.get("sweep_rejected", []):
        key = f"{r['preset']} {r['dtype']} {r['kernel']}"
        rejected[key] = rejected.get(key, 0) + 1
    kept = [f"the {direction} {key.replace(',', ' regime, ')}-byte elements"
            for direction, entries in sweep["plan_used"].items() for key in entries
            if key not in sweep["plan"].get(direction, {})]
    rates = [r["gathered_rows"] / (r["device_us"] * 1e-6) for r in forward
             if r["preset"] == "encoder"]
    return {
        "ch6_bench_reps": "5" if "--fast" in bench["provenance"]["command"] else "20",
        "ch6_dec_ratio": f"{decoder['kernel_us'] / decoder['device_us']:.1f}",
        "ch6_dec_device": f"{decoder['device_us']:,.1f} µs",
        "ch6_dec_host": f"{decoder['kernel_us']:,.1f} µs",
        "ch6_enc_gap": f"{abs(encoder['kernel_us'] / encoder['device_us'] - 1):.0%}",
        "ch6_pitfalls_dobench": f"{method['do_bench'] / method['profiler']:.1f}",
        "ch6_decoder_bound": bound["decoder"],
        "ch6_encoder_bound": bound["encoder"],
        "ch6_lim_empty": f"{limit['empty_kernel_us']:,.1f} µs",
        "ch6_lim_gather": f"{limit['gather_us']:,.1f} µs",
        "ch6_lim_forward": f"{limit['forward_us']:,.1f} µs",
        "ch6_lim_rows": f"{limit['rows_read']:,d}",
        "ch6_sweep_rejected": "; ".join(f"{n} candidates of the {key}"
                                        for key, n in rejected.items()) or "none",
        "ch6_sweep_kept": ", ".join(kept) or "none",
        "ch6_sw_enc_loop": best("encoder", "forward", "bf16", "loop"),
        "ch6_sw_enc_best": best("encoder", "forward", "bf16"),
        "ch6_sw_dec32_tiled": best("decoder", "forward", "fp32", "tiled"),
        "ch6_sw_dec32_best": best("decoder", "forward", "fp32"),
        "ch6_dec_fb_ratio": f"{fb['kernel_us'] / fb['device_us']:.1f}",
        "ch6_now_enc_fp32": f"{harness('encoder', 'fp32')['device_us']:,.1f} µs",
        "ch6_rate_low": f"{min(rates) / 1e9:.0f}",
        "ch6_rate_high": f"{max(rates) / 1e9:.0f}",
        "ch6_floor_best": None if not floors else f"{floors[0]:.1f} times the floor",
        "ch6_p_dec_scale": ratio(peer("decoder", "fp32") / peer("decoder", "bf16")),
        "ch6_p_enc_scale": ratio(peer("encoder", "fp32") / peer("encoder", "bf16")),
        "ch6_p_dec_fb": ratio(peer("decoder", "bf16", "forward_backward")
                              / peer("decoder", "bf16")),
        "ch6_p_dcn_bf16": ratio(peer("encoder", "bf16") / peer("encoder", "bf16",
                                                              impl="dcnv4") - 1),
        "ch6_p_seed_fp32": ratio(peer("encoder", "fp32") / peer("encoder", "fp32",
                                                              impl="seed") - 1),
        "ch6_p_fp64_enc": ratio(peer("encoder", "fp64", "forward_backward")
                                / peer("encoder", "fp64", "forward_backward", "cuda_op")),
        "ch6_p_cuda_dec": ratio(peer("decoder", "fp32", "forward_backward", "cuda_op")
                                / peer("decoder", "fp32", "forward_backward")),
        "ch4_dec_floor": f"{decoder['device_us'] / decoder['floor_us']:.1f}",
        "ch4_enc_floor": f"{encoder['device_us'] / encoder['floor_us']:.1f}",
    }


def test_measuring_chapters_quote_the_results_files(tmp_path):
    for name in ("bench_h200.json", "pitfalls_h200.json", "sweep_h200.json",
                 "decoder_limits_h200.json", "peers_h200.json"):
        _load(name)
    chapters = _scratch_book(tmp_path, None)
    chapter6 = _execute(_cells(chapters / "ch06_measuring.ipynb"), chapters)
    section = _execute(_section_46(chapters), chapters)
    glued = {**chapter6["glued"], **section["glued"]}
    wrong = []
    for name, expected in _expected_glue().items():
        got = glued.get(name)
        if name == "ch6_floor_best":            # the case named after the figure varies
            ok = got is not None and got.startswith(expected)
        else:
            ok = got == expected
        if not ok:
            wrong.append(f"{name}: the chapter glues {got!r}, the results files give "
                         f"{expected!r}")
    assert not wrong, "\n".join(wrong)
    assert chapter6["figures"] >= 5 and section["figures"] == 1
    assert "not yet measured" not in chapter6["text"] + section["text"]


def test_measuring_chapters_run_without_results(tmp_path):
    chapters = _scratch_book(tmp_path, {})
    chapter6 = _execute(_cells(chapters / "ch06_measuring.ipynb"), chapters)
    section = _execute(_section_46(chapters), chapters)
    hardware = _execute(_cells(chapters / "ch07_shipping.ipynb",
                               ("ch07-01-3f68d1", "ch07-15-530bca", "ch07-45-testing")),
                        chapters)
    assert chapter6["text"].count("not yet measured") >= 8, chapter6["text"]
    assert "Not yet measured" in section["text"]
    assert "not yet measured" in hardware["text"] and "not measured, because" in hardware["text"]
    for name, note in chapter6["glued"].items():
        if name.startswith("ch6_note_") and name != "ch6_note_peers":
            assert "Not yet measured" in note, (name, note)


def _refilled(tmp_path: Path) -> dict[str, dict]:
    """The committed files, with pitfalls and hardware files of the shape a refill run
    writes: an encoder case and first_for_kernel in pitfalls, determinism rows marked
    filled_in in hardware (numbers made up, tests only)."""
    files = {path.name: json.loads(path.read_text()) for path in RESULTS.glob("*.json")}
    pitfalls = copy.deepcopy(files["pitfalls_h200.json"])
    pitfalls["provenance"]["gpu"] = "synthetic GPU for a test"
    for key in ("rows", "dispatch"):
        pitfalls[key] += [{**row, "preset": "encoder"} for row in pitfalls[key]
                          if row["preset"] == "decoder"]
    pitfalls["first_call"] = [
        {"preset": p, "dtype": "bf16", "kernel": k, "first_call_ms": 1000.0,
         "second_call_us": 300.0, "first_for_kernel": True}
        for p, k in (("decoder", "tiled BLOCK_Q=1 num_warps=1"),
                     ("encoder", "loop BLOCK_Q=16 num_warps=2"))]
    pitfalls["skipped"] = []
    hardware = copy.deepcopy(files["hardware_h200.json"])
    run = {"provenance": {**hardware["provenance"], "gpu": "synthetic GPU for a test"},
           "measured": []}
    hardware["filled_in"] = [run]
    gradient = {"elements": 1000, "differing_elements_per_run": GRADIENT_RUNS,
                "max_abs_difference": 2.0e-7, "max_abs_value": 1.5}
    hardware["determinism"]["rows"] = [
        {"preset": p, "distribution": "local", "dtype": d, "fp32_grad_accum": False,
         "forward_runs_bitwise_equal": True, "filled_in": 1,
         **{name: dict(gradient) for name in GRADIENTS}}
        for p in ("decoder", "encoder") for d in ("fp32", "bf16")]
    hardware["skipped"] = []
    return {**files, "pitfalls_h200.json": pitfalls, "hardware_h200.json": hardware}


def test_chapters_read_refilled_results(tmp_path):
    _load("pitfalls_h200.json")
    _load("hardware_h200.json")
    chapters = _scratch_book(tmp_path, _refilled(tmp_path))
    pitfalls = _execute(_cells(chapters / "ch06_measuring.ipynb",
                               ("ch06-01-12d2fb", "ch06-09-8e38a0", "ch06-10-5cd85d",
                                "ch06-12-2860ac", "ch06-16-268832")), chapters)
    hardware = _execute(_cells(chapters / "ch07_shipping.ipynb",
                               ("ch07-01-3f68d1", "ch07-15-530bca", "ch07-45-testing")),
                        chapters)
    assert "encoder bf16" in pitfalls["text"] and "not measured" not in pitfalls["text"]
    assert "compiled from an empty Triton cache" in pitfalls["text"]
    assert pitfalls["figures"] == 1
    median = statistics.median(GRADIENT_RUNS)
    assert f"{median:,.0f} of 1,000 elements differ" in hardware["text"], hardware["text"]
    assert "synthetic GPU for a test" in hardware["text"]



# ------------------------------------------------- provenance, and prose bound to the plan

def _book_results(tmp_path: Path, files: dict[str, dict]):
    """book/_results.py reading ``files`` (name -> data) as its results folder."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("_results_copy", ROOT / "book" / "_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    folder = tmp_path / "results"
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (folder / name).write_text(json.dumps(data))
    module.RESULTS = folder
    return module


def test_a_results_file_without_provenance_fails_to_load(tmp_path):
    results = _book_results(tmp_path, {"x_h200.json": {"rows": []},
                                       "y_h200.json": {"provenance": {"gpu": "G"}, "rows": []},
                                       "z_h200.json": {"provenance": {"date": "2026-12-01",
                                                                      "command": "c"}},
                                       "dry_h200.json": {"provenance": {"date": "2026-12-01",
                                                                        "command": "c"},
                                                         "dry_run": True}})
    for name in ("x_h200.json", "y_h200.json", "dry_h200.json"):
        with pytest.raises(results.ResultsError):
            results.load(name)
    assert results.load("z_h200.json")["provenance"]["command"] == "c"
    assert results.load("absent.json") is None


def test_a_plan_that_contradicts_its_commit_fails_to_load(tmp_path):
    bench = json.loads((RESULTS / "bench_h200.json").read_text())
    sweep = json.loads((RESULTS / "sweep_h200.json").read_text())
    peers = json.loads((RESULTS / "peers_h200.json").read_text())
    good = _book_results(tmp_path, {"bench_h200.json": bench, "sweep_h200.json": sweep,
                                    "peers_h200.json": peers})
    for name in ("bench_h200.json", "sweep_h200.json", "peers_h200.json"):
        assert good.provenance_problem(name) is None, name
    # the benchmark says it ran another plan than its commit's and than the sweep's
    wrong = copy.deepcopy(bench)
    wrong["plan_used"]["forward"]["large,2"] = ["loop", 16, 2]
    # a sweep whose plan_used is not its plan applied over its commit's
    wrong_sweep = copy.deepcopy(sweep)
    wrong_sweep["plan"]["forward"]["small,2"] = ["rows", 8, 2]
    # a transcription whose recorded plan is not its commit's
    wrong_peers = copy.deepcopy(peers)
    wrong_peers["provenance"]["this_repository_plan"]["forward"]["small,2"] = ["rows", 2, 1]
    bad = _book_results(tmp_path / "bad", {"bench_h200.json": wrong, "sweep_h200.json": sweep,
                                           "s2_h200.json": wrong_sweep,
                                           "peers_h200.json": wrong_peers})
    for name, words in (("bench_h200.json", "neither the plan of its code_commit"),
                        ("s2_h200.json", "not the sweep's plan"),
                        ("peers_h200.json", "is not that commit's")):
        with pytest.raises(bad.ResultsError, match=words):
            bad.load(name)


# chapter -> the cells that state which kernel runs where (their setup cell first)
PLAN_CELLS = {
    "ch02_the_machine.ipynb": ("cell-001", "ch2-simt-facts", "ch2-occupancy-table",
                               "ch2-occupancy-lies"),
    "ch04_the_forward_kernel.ipynb": ("cell-001", "cell-005", "ch04-regimes", "ch04-plan"),
    "ch06_measuring.ipynb": ("ch06-01-12d2fb", "ch06-29-1c97d7"),
}


@pytest.mark.parametrize("chapter", sorted(PLAN_CELLS))
def test_a_changed_plan_entry_fails_the_chapter(tmp_path, chapter):
    """The cells that say which kernel runs where pass as committed and fail once one
    entry of the plan changes (in the executing kernel only: the package is untouched)."""
    import nbclient.exceptions

    chapters = _scratch_book(tmp_path, None)
    shutil.copy(CHAPTERS / chapter, chapters / chapter)
    ids = PLAN_CELLS[chapter]
    _execute(_cells(chapters / chapter, ids), chapters)
    notebook = _cells(chapters / chapter, ids)
    notebook.cells.insert(1, nbformat.v4.new_code_cell(
        "from source_kernels import forward as _f\n"
        "_f.FORWARD_PLAN['large', 2] = ('loop', 16, 2)\n"))
    with pytest.raises(nbclient.exceptions.CellExecutionError,
                       match="plan|timed another encoder forward"):
        _execute(notebook, chapters)


def test_the_operator_page_names_the_kernels_the_plan_runs(tmp_path):
    """book/operator.md's module table says where the plan runs each kernel family; it must
    say what FORWARD_PLAN / BACKWARD_PLAN say, and name every module that holds a kernel the
    plan launches."""
    results = _book_results(tmp_path, {})
    page = (ROOT / "book" / "operator.md").read_text()
    modules = {"loop": "`source_kernels/forward.py`, `backward.py`",
               "tiled": "`source_kernels/tiled.py`", "rows": "`source_kernels/rows.py`"}
    for family, module in modules.items():
        row = next((line for line in page.splitlines() if line.startswith(f"| {module} |")),
                   None)
        assert row is not None, f"operator.md has no row for {module}"
        assert results.plan_uses(family) in row, (family, row)
    families = {entry[0].split("-")[0] for table in results.shipped_plan().values()
                for entry in table.values()}
    assert families <= set(modules), families


def test_chapter6_quotes_an_ncu_profile_only_with_provenance(tmp_path):
    """The committed profile (provenance, the kernels the plan launches) is quoted; the same
    profile without its provenance block is not (chapter 6 says so); a profile of the shape a
    re-run writes (synthetic, in a temporary folder) is quoted; one that profiles another
    plan's kernels fails the cell."""
    import nbclient.exceptions

    committed = _load("ncu_h200.json")
    ids = ("ch06-01-12d2fb", "ch06-22g-limits")
    files = {p.name: json.loads(p.read_text()) for p in RESULTS.glob("*.json")}
    chapters = _scratch_book(tmp_path / "committed", None)
    text = _execute(_cells(chapters / "ch06_measuring.ipynb", ids), chapters)["text"]
    assert "busiest unit (% of its peak)" in text and "not quoted" not in text, text
    bare = {k: v for k, v in committed.items() if k != "provenance"}
    chapters = _scratch_book(tmp_path / "bare", {**files, "ncu_h200.json": bare})
    text = _execute(_cells(chapters / "ch06_measuring.ipynb", ids), chapters)["text"]
    assert "not quoted" in text and "busiest unit (% of its peak)" not in text
    results = _book_results(tmp_path / "plan", {})
    fresh = copy.deepcopy(committed)
    fresh["provenance"] = {"gpu": "synthetic GPU for a test", "date": "2026-12-01",
                           "command": "python3 scripts/gpu/run.py ncu"}
    for launch in fresh["launches"]:
        preset, _, dtype, direction = launch["case"].split()
        launch["kernel"] = results.planned_function(direction, preset, dtype)
    chapters = _scratch_book(tmp_path / "fresh", {**files, "ncu_h200.json": fresh})
    text = _execute(_cells(chapters / "ch06_measuring.ipynb", ids), chapters)["text"]
    assert "busiest unit (% of its peak)" in text and " rows " in text, text
    stale = copy.deepcopy(fresh)
    stale["launches"][2]["kernel"] = "_msda_forward_kernel"          # an earlier plan's
    chapters = _scratch_book(tmp_path / "stale", {**files, "ncu_h200.json": stale})
    with pytest.raises(nbclient.exceptions.CellExecutionError, match="another plan"):
        _execute(_cells(chapters / "ch06_measuring.ipynb", ids), chapters)
