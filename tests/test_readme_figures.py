"""The H200 figures the README quotes are the ones in the committed results file."""
import json
import re
from pathlib import Path

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
