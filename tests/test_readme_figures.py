"""The H200 figures the README quotes are the ones in the committed results files: the
operator's device time in results/bench_h200.json, the other implementations' in
results/peers_h200.json."""
import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _readme_table():
    text = (REPO / "README.md").read_text()
    section = text.split("## Measured on an NVIDIA H200", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines()
            if line.startswith("| `")]
    assert rows, "the README's H200 table is missing"
    return rows


def _numbers(cell):
    return [float(x.replace(",", "")) for x in re.findall(r"[\d,]+\.\d", cell)]


def test_readme_h200_table_matches_results_file():
    bench = json.loads((REPO / "results" / "bench_h200.json").read_text())
    device_us = {(r["preset"], r["distribution"], r["dtype"], r["direction"]): r["device_us"]
                 for r in bench["rows"] if r.get("impl") == "triton" and "error" not in r}
    checked = 0
    for line in _readme_table():
        cells = [c.strip() for c in line.strip("|").split("|")]
        preset, distribution = re.match(r"`([\w-]+)`, (\w+)", cells[0]).groups()
        dtypes = [d.strip() for d in cells[1].split("/")]
        for column, direction in ((2, "forward"), (3, "forward_backward")):
            quoted = _numbers(cells[column])
            assert len(quoted) == len(dtypes), line
            for dtype, value in zip(dtypes, quoted):
                measured = device_us[(preset, distribution, dtype, direction)]
                assert round(measured, 1) == value, (
                    f"README quotes {value} us for {preset} {distribution} {dtype} "
                    f"{direction}; results/bench_h200.json has {measured:.1f}")
                checked += 1
    assert checked >= 12


PEER_COLUMNS = ("this_repository", "seed", "cuda_op", "dcnv4")


def _peers_table():
    """Rows of the README's table of other implementations (the H200 section's table whose
    header names DCNv4), or None when the README has none."""
    text = (REPO / "README.md").read_text()
    section = text.split("## Measured on an NVIDIA H200", 1)[1].split("\n## ", 1)[0]
    lines = section.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("|") and "DCNv4" in line:
            rows = []
            for row in lines[i + 2:]:
                if not row.startswith("|"):
                    break
                rows.append([c.strip() for c in row.strip().strip("|").split("|")])
            return rows
    return None


def test_readme_peers_table_matches_peers_file():
    rows = _peers_table()
    if rows is None:
        pytest.skip("README.md has no table of other implementations in its H200 section")
    peers = json.loads((REPO / "results" / "peers_h200.json").read_text())
    figures = {(r["preset"], r["direction"], r["dtype"], r["impl"]): r
               for r in peers["device_us"] if r["distribution"] == "uniform"}
    checked = 0
    for cells in rows:
        match = re.match(r"([\w-]+) (fwd\+bwd|fwd) ([\w /]+)$", cells[0])
        assert match, f"cannot read the case {cells[0]!r}"
        preset, direction, dtypes = match.groups()
        direction = "forward_backward" if direction == "fwd+bwd" else "forward"
        dtypes = [d.strip() for d in dtypes.split("/")]
        for impl, cell in zip(PEER_COLUMNS, cells[1:]):
            quoted = [q.strip() for q in cell.split("/")] if "/" in cell else [cell] * len(dtypes)
            for dtype, text in zip(dtypes, quoted):
                row = figures[(preset, direction, dtype, impl)]
                number = re.match(r"[\d,]+\.\d", text)
                if row["status"] == "measured":
                    assert number and float(number.group(0).replace(",", "")) == row["us"], (
                        f"README quotes {text!r} for {impl} {preset} {direction} {dtype}; "
                        f"results/peers_h200.json has {row['us']}")
                else:
                    assert not number, (f"README quotes {text!r} for {impl} {preset} "
                                        f"{direction} {dtype}: the file says {row['status']}")
                checked += 1
    assert checked >= 24
