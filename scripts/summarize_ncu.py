"""Turn the Nsight Compute CSV of scripts/gpu/ncu_cases.py into results/ncu_h200.json.

    python scripts/summarize_ncu.py results/ncu_h200.csv results/ncu_h200.json

ncu_cases.py launches, per case, one forward kernel then one backward kernel; the CSV holds
one row per (kernel launch, metric).  The summary names each launch by its case and says
which unit is busiest relative to its peak: DRAM, L2 (lts), L1/texture, or the SMs.
"""
import csv
import io
import json
import sys


UNITS = {
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "DRAM bandwidth",
    "lts__throughput.avg.pct_of_peak_sustained_elapsed": "L2 throughput",
    "l1tex__throughput.avg.pct_of_peak_sustained_elapsed": "L1/texture throughput",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "SM issue/compute throughput",
}


def cases():
    import ast
    import pathlib
    source = pathlib.Path("scripts/gpu/ncu_cases.py").read_text()
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "CASES":
            return [(elt.elts[0].value, elt.elts[1].value, elt.elts[2].attr)
                    for elt in node.value.elts]
    raise RuntimeError("CASES not found in ncu_cases.py")


def main(csv_path, json_path, versions_path=None, commit=None):
    """``versions_path``: the line ``torch triton gpu date`` the GPU host printed beside the
    CSV (the ncu part of scripts/gpu/run.py); ``commit``: the commit whose code ran."""
    with open(csv_path) as handle:
        lines = handle.read().splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    rows = list(csv.DictReader(io.StringIO("\n".join(lines[header:]))))
    launches = {}
    for row in rows:
        launch = launches.setdefault(int(row["ID"]), {"kernel": row["Kernel Name"],
                                                      "grid": row["Grid Size"],
                                                      "block": row["Block Size"],
                                                      "metrics": {}})
        value = row["Metric Value"].replace(",", "")
        try:
            value = float(value)
        except ValueError:
            pass
        launch["metrics"][row["Metric Name"]] = {"value": value, "unit": row["Metric Unit"]}
    names = []
    for preset, distribution, dtype in cases():
        for direction in ("forward", "backward"):
            names.append(f"{preset} {distribution} {dtype} {direction}")
    summary = []
    for (launch_id, launch), name in zip(sorted(launches.items()), names):
        metrics = launch["metrics"]
        busiest = max(UNITS, key=lambda m: metrics.get(m, {}).get("value", -1))
        summary.append({"case": name, "launch": launch_id, **launch,
                        "busiest_unit": UNITS[busiest],
                        "busiest_pct_of_peak": metrics.get(busiest, {}).get("value")})
    provenance = {"command": "ncu --clock-control none --csv -k regex:_msda --metrics ... "
                  "python3 scripts/gpu/ncu_cases.py (the ncu part of scripts/gpu/run.py)",
                  "summarised_by": "python scripts/summarize_ncu.py CSV JSON VERSIONS COMMIT",
                  "source": csv_path, "repository_commit": commit}
    if versions_path:
        torch_version, triton_version, rest = open(versions_path).read().strip().split(" ", 2)
        gpu, date = rest.rsplit(" ", 2)[0], " ".join(rest.rsplit(" ", 2)[1:])
        provenance.update({"gpu": gpu, "torch": torch_version, "triton": triton_version,
                           "date": date[:16] + " UTC"})
    with open(json_path, "w") as handle:
        json.dump({"provenance": provenance, "launches": summary}, handle, indent=1)
        handle.write("\n")
    for item in summary:
        print(f"{item['case']:<40} {item['kernel'][:32]:<32} busiest: {item['busiest_unit']} "
              f"{item['busiest_pct_of_peak']}%")


if __name__ == "__main__":
    main(*sys.argv[1:5])
