"""The GPU figures the course quotes outside its chapters are those of the committed results
files. They live on the book's measurements page, book/measurements.md (the README links to it
and quotes no timing itself); every table of that page is compared here with the results file
it names:

- the operator's device time: results/bench_h200.json (``device_us`` of the ``triton`` rows);
- the other implementations' device time: results/peers_h200.json;
- the host's share of one call: ``dispatch_breakdown_us`` / ``_fp32_us`` of bench_h200.json;
- Nsight Compute's counters: results/ncu_h200.json;
- the decoder's lower limits: results/decoder_limits_h200.json;
- grading throughput on a CPU: results/grading_throughput.json.

The page and the README also say which torch and Triton the GPU figures were measured with
and which ones requirements.txt pins; both are checked against the files.  The README's quick
start gives the CPU-only setup's downloads (results/setup_downloads_cpu.json) and how long the
book and the suite take on 2 cores (results/ci_durations_cpu.txt): checked here too.
"""
import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "book" / "measurements.md"
RESULTS = REPO / "results"


def _load(name):
    return json.loads((RESULTS / name).read_text())


def _tables(text):
    """Every markdown table of ``text`` as (header cells, [row cells])."""
    tables, lines = [], text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and lines[i + 1].startswith("| ---"):
            header = _cells(lines[i])
            rows = []
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(_cells(lines[i]))
                i += 1
            tables.append((header, rows))
        else:
            i += 1
    return tables


def _cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _table(predicate, what):
    found = [t for t in _tables(PAGE.read_text()) if predicate(t[0])]
    assert len(found) == 1, f"book/measurements.md should hold one table of {what}"
    return found[0][1]


def _numbers(cell):
    return re.findall(r"[\d,]+\.\d+", cell)


def _fmt(value, digits=1):
    return f"{value:,.{digits}f}"


def test_operator_table_matches_bench_file():
    bench = _load("bench_h200.json")
    device_us = {(r["preset"], r["distribution"], r["dtype"], r["direction"]): r["device_us"]
                 for r in bench["rows"] if r.get("impl") == "triton" and "error" not in r}
    checked = 0
    for cells in _table(lambda h: h[0] == "preset, locations", "the operator's device time"):
        preset, distribution = re.match(r"`([\w-]+)`, (\w+)", cells[0]).groups()
        dtypes = [d.strip() for d in cells[1].split("/")]
        for column, direction in ((2, "forward"), (3, "forward_backward")):
            quoted = _numbers(cells[column])
            assert len(quoted) == len(dtypes), cells
            for dtype, text in zip(dtypes, quoted):
                measured = device_us[(preset, distribution, dtype, direction)]
                assert text == _fmt(measured), (
                    f"book/measurements.md quotes {text} us for {preset} {distribution} "
                    f"{dtype} {direction}; results/bench_h200.json has {measured:.1f}")
                checked += 1
    assert checked >= 12


PEER_COLUMNS = ("this_repository", "seed", "cuda_op", "dcnv4")
PEER_STATUS_WORDS = {"unsupported": "no kernel", "refuses": "refuses",
                     "wrong_backward": "wrong gradients"}


def test_peers_table_matches_peers_file():
    peers = _load("peers_h200.json")
    figures = {(r["preset"], r["direction"], r["dtype"], r["impl"]): r
               for r in peers["device_us"] if r["distribution"] == "uniform"}
    checked = 0
    for cells in _table(lambda h: "DCNv4" in " ".join(h), "other implementations"):
        match = re.match(r"([\w-]+) (fwd\+bwd|fwd) ([\w /]+)$", cells[0])
        assert match, f"cannot read the case {cells[0]!r}"
        preset, direction, dtypes = match.groups()
        direction = "forward_backward" if direction == "fwd+bwd" else "forward"
        dtypes = [d.strip() for d in dtypes.split("/")]
        for impl, cell in zip(PEER_COLUMNS, cells[1:]):
            quoted = [q.strip() for q in cell.split("/")] if "/" in cell else [cell] * len(dtypes)
            assert len(quoted) == len(dtypes), cells
            for dtype, text in zip(dtypes, quoted):
                row = figures[(preset, direction, dtype, impl)]
                if row["status"] == "measured":
                    expected = _fmt(row["us"])
                    if "best_config_us" in row:
                        expected += f" ({_fmt(row['best_config_us'])})"
                else:
                    expected = PEER_STATUS_WORDS[row["status"]]
                assert text == expected, (
                    f"book/measurements.md quotes {text!r} for {impl} {preset} {direction} "
                    f"{dtype}; results/peers_h200.json gives {expected!r}")
                checked += 1
    assert checked >= 24


def test_dispatch_table_matches_bench_file():
    bench = _load("bench_h200.json")
    rows = _table(lambda h: h[0] == "the piece of one eager call", "the host's share")
    assert {cells[0] for cells in rows} == set(bench["dispatch_breakdown_us"])
    for label, bf16, fp32 in rows:
        for text, key in ((bf16, "dispatch_breakdown_us"), (fp32, "dispatch_breakdown_fp32_us")):
            assert _numbers(text) == [_fmt(bench[key][label])], (label, key, text)


NCU_COLUMNS = {"L1/texture": "l1tex__throughput.avg.pct_of_peak_sustained_elapsed",
               "L2": "lts__throughput.avg.pct_of_peak_sustained_elapsed",
               "DRAM": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
               "SM issue": "sm__throughput.avg.pct_of_peak_sustained_elapsed"}


def _book_results():
    """book/_results.py, the module the chapters read the results files with."""
    import _results

    return _results


def test_ncu_table_matches_ncu_file():
    launches = {launch["case"]: launch for launch in _load("ncu_h200.json")["launches"]}
    header, rows = [t for t in _tables(PAGE.read_text())
                    if "busiest unit, % of peak" in t[0]][0]
    assert {cells[0] for cells in rows} == set(launches)
    for cells in rows:
        launch = launches[cells[0]]
        # a kernel the shipped plan no longer launches for the case is marked so
        preset, _, dtype, direction = cells[0].split()
        earlier = _book_results().planned_function(direction, preset, dtype) != launch["kernel"]
        assert cells[1] == f"`{launch['kernel']}`" + (" (an earlier plan)" if earlier else "")
        assert cells[2] == f"{launch['busiest_unit']}, {launch['busiest_pct_of_peak']:.1f}%"
        for name, metric in NCU_COLUMNS.items():
            value = launch["metrics"][metric]["value"]
            assert cells[header.index(name)] == f"{value:.1f}%", (cells[0], name)


def test_decoder_limits_table_matches_its_file():
    limits = {(r["preset"], r["dtype"]): r for r in _load("decoder_limits_h200.json")["rows"]}
    rows = _table(lambda h: "a gather of its corner rows only" in h, "the decoder's limits")
    assert len(rows) == len(limits)
    for cells in rows:
        row = limits[(cells[0].strip("`"), cells[1])]
        for cell, key in zip(cells[2:], ("forward_us", "gather_us", "empty_kernel_us")):
            assert _numbers(cell) == [_fmt(row[key])], (cells, key)


def test_grading_throughput_table_matches_its_file():
    runs = {r["assignment"]: r for r in _load("grading_throughput.json")["runs"]}
    rows = _table(lambda h: "`nbgrader autograde`" in h, "grading throughput")
    assert {cells[0].strip("`") for cells in rows} == set(runs)
    for cells in rows:
        run = runs[cells[0].strip("`")]
        assert cells[1] == str(run["submissions"])
        assert _numbers(cells[2]) == [_fmt(run["sequential"]["seconds"])]
        assert _numbers(cells[3]) == [_fmt(run["parallel"]["seconds"])]
        assert cells[4] == f"{run['speedup']:.2f}"
        assert cells[5] == ("yes" if run["same_scores"] else "no")


def _version(text):
    """'2.11.0+cu130' -> '2.11.0'"""
    return text.split("+", 1)[0]


def test_the_stack_is_stated_as_the_files_record_it():
    requirements = (REPO / "requirements.txt").read_text()
    pinned = dict(re.findall(r"^(torch|triton)==([\d.]+)", requirements, re.M))
    gpu_files = sorted(RESULTS.glob("*_h200*.json"))
    stacks = set()
    for path in gpu_files:
        provenance = json.loads(path.read_text()).get("provenance", {})
        if "torch" in provenance:
            stacks.add((_version(provenance["torch"]), _version(provenance["triton"])))
    assert len(stacks) == 1, f"the GPU results files record several stacks: {stacks}"
    torch_gpu, triton_gpu = stacks.pop()
    page = PAGE.read_text()
    readme = (REPO / "README.md").read_text()
    for name, text in (("book/measurements.md", page), ("README.md", readme)):
        flat = " ".join(text.split()).replace("*", "")
        assert f"torch {torch_gpu} and Triton {triton_gpu}" in flat, (
            f"{name} should say the GPU figures come from torch {torch_gpu} / Triton "
            f"{triton_gpu}")
        assert f"torch {pinned['torch']} with Triton {pinned['triton']}" in flat, (
            f"{name} should name requirements.txt's pair, torch {pinned['torch']} / "
            f"Triton {pinned['triton']}")


def test_readme_quotes_no_timing_of_its_own():
    """Timings live on the measurements page, where they are checked; the README links there."""
    readme = (REPO / "README.md").read_text()
    quoted = re.findall(r"\d[\d,.]*\s*(?:µs|us|ms)\b", readme)
    assert not quoted, f"README.md quotes timings {quoted}: put them in book/measurements.md"


@pytest.mark.parametrize("name", ["bench_h200.json", "peers_h200.json",
                                  "decoder_limits_h200.json", "grading_throughput.json"])
def test_the_quoted_files_record_their_versions(name):
    provenance = _load(name)["provenance"]
    assert provenance.get("torch") and provenance.get("triton"), (
        f"results/{name} does not record the torch and Triton it was measured with")


# ------------------------------------------------------------- setup sizes and suite times
def _ci_durations():
    """(the suite's seconds, the cold book build's seconds) from results/ci_durations_cpu.txt:
    the header's "the suite: ... in N s" and the setup of test_every_toc_page_is_built."""
    text = (RESULTS / "ci_durations_cpu.txt").read_text()
    suite = re.search(r"the suite: .* in (\d+) s", text)
    book = re.search(r"^([\d.]+)s setup +tests/test_book\.py::test_every_toc_page_is_built$",
                     text, re.M)
    assert suite and book, "results/ci_durations_cpu.txt no longer has the lines read here"
    return int(suite.group(1)), float(book.group(1))


def test_the_readmes_times_are_cis():
    """The quick start's times on 2 cores are those of CI's fresh-clone run."""
    readme = " ".join((REPO / "README.md").read_text().split())
    suite, book = _ci_durations()
    assert f"`make test` takes about {round(suite / 60)} minutes ({suite} s)" in readme
    assert f"the book builds in about {round(book / 5) * 5} s" in readme


def test_the_readmes_fast_target_time_is_measured():
    """`make test-fast`'s count and time in the quick start are those of
    results/test_fast_cpu.txt, the measured run."""
    readme = " ".join((REPO / "README.md").read_text().split())
    line = (RESULTS / "test_fast_cpu.txt").read_text().splitlines()[-1]
    found = re.fullmatch(r"(\d+) passed.* in ([\d.]+)s( .*)?", line)
    assert found, line
    count, seconds = int(found.group(1)), float(found.group(2))
    assert f"runs about {round(count, -1)} unit tests" in readme
    assert f"({round(seconds)} s on the same machine)" in readme
    minutes = round(seconds / 60)
    assert f"about {minutes} minute{'' if minutes == 1 else 's'}" in readme


def test_the_readmes_download_sizes_are_measured():
    """What ``make setup TORCH_INDEX=...`` downloads, as results/setup_downloads_cpu.json
    measured it: the total, the wheel count, the largest wheels and the environment's size."""
    readme = " ".join((REPO / "README.md").read_text().split())
    measured = _load("setup_downloads_cpu.json")
    total = measured["download_bytes"] / 2 ** 20
    assert f"about {round(total, -1):.0f} MiB of downloads in {measured['wheels']} wheels" \
        in readme
    names = {"triton": "Triton", "torch": "torch", "playwright": "Playwright"}
    for wheel in measured["largest"][:3]:
        name = names[wheel["file"].split("-")[0]]
        assert f"{name} {wheel['bytes'] / 2 ** 20:.0f} MiB" in readme, name
    assert "+cpu" in measured["largest"][1]["file"] + measured["largest"][0]["file"]
    assert f"a `.venv` of about {measured['venv_bytes'] / 2 ** 30:.1f} GiB" in readme
