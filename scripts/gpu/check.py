"""The GPU path of the course, checked in one call: ``make gpu-check`` on a CUDA host.

    python3 scripts/gpu/check.py OUTDIR [--parts tests labs lab10 grading bench]
                                        [--budget-s 540]

Parts (the first four run side by side, the benchmark smoke after them, alone on the GPU):

- ``tests``:   the operator's test files (operator, spec, launch path, model) on the GPU,
               through scripts/gpu/gpu_tests.py (pytest-xdist where installed);
- ``labs``:    every lab's *source* notebook (solutions and hidden tests included) executed
               top to bottom in a fresh kernel on the GPU: every cell must pass, the GPU cells
               (timings, compiled kernels) included;
- ``lab10``:   the operator suite (tests/test_operator.py through tests/operator_suite.py)
               against lab 10's solution;
- ``grading``: the fixture class graded with hidden tests in the GPU environment
               (``grade_synthetic_class`` of scripts/gpu/run.py): every student's score and
               status equal to what the CPU grading gives, the GPU-only cells graded;
- ``bench``:   ``python -m source_kernels.bench`` on the three presets (uniform, bf16, no
               dispatch rows): every implementation checked against the fp64 reference and
               timed once.

One summary line per part, a results file OUTDIR/gpu_check_<gpu>.json with its provenance
(the commit comes from git, or from COURSE_COMMIT where the host has no git checkout), the
parts' logs under OUTDIR/gpu_check_logs.tgz, and exit status 0 only when every part passed.
A host without nbgrader and nbclient (a GPU machine with torch and Triton only) installs the
wheels of .whl/ into /tmp/site first (``make gpu-wheels`` downloads them).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from _provenance import REPO, gpu_slug, provenance, require_gpu
from run import grade_synthetic_class

PARTS = ("tests", "labs", "lab10", "grading", "bench")
SITE = Path("/tmp/site")
LAB10_NODE = "tests/test_labs_05_10.py::test_lab10_suite_runs_against_the_students_operator"


def ensure_packages(log: Path) -> str:
    """nbgrader, nbclient and ipykernel importable, for this process and its children."""
    probe = "import nbgrader, nbclient, ipykernel"
    if subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0:
        return "installed"
    wheels = sorted((REPO / ".whl").glob("*.whl"))
    if not wheels:
        return "missing (no wheels in .whl/)"
    with log.open("w") as handle:
        done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index",
                               "--no-deps", "--no-compile", "--no-cache-dir", "--upgrade",
                               "--target", str(SITE), *map(str, wheels)],
                              stdout=handle, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        return f"wheel install failed (exit {done.returncode})"
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(SITE), str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    os.environ["PATH"] = f"{SITE / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
    os.environ["JUPYTER_PATH"] = str(SITE / "share" / "jupyter")
    sys.path[:0] = [str(SITE)]
    return f"{len(wheels)} wheels from .whl/ -> SITE (a folder on the GPU host)"


def run_logged(name, command, logs: Path, timeout_s, env=None):
    """(exit code, seconds, log text) of ``command`` run from the repository root."""
    log = logs / f"{name}.log"
    started = time.time()
    with log.open("w") as handle:
        handle.write("$ " + " ".join(command) + "\n")
        handle.flush()
        process = subprocess.Popen(command, cwd=REPO, stdout=handle, stderr=subprocess.STDOUT,
                                   env=env, start_new_session=True)
        try:
            code = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait()
            code = 124
            handle.write(f"\n[stopped: past its {timeout_s:.0f} s]\n")
    return code, round(time.time() - started, 1), log.read_text(errors="replace")


# ---------------------------------------------------------------------------------- parts
def part_tests(logs, timeout_s):
    out = logs / "tests"
    code, seconds, text = run_logged(
        "tests", [sys.executable, "scripts/gpu/gpu_tests.py", str(out), "--workers", "8",
                  "--timeout-s", str(max(30, timeout_s - 15))], logs, timeout_s)
    summary = json.loads((out / "gpu_tests.json").read_text()) if (out / "gpu_tests.json").exists() else {}
    counts = summary.get("counts", {})
    failed = {k: v for k, v in summary.get("not_passed", {}).items() if v in ("FAILED", "ERROR")}
    ok = code == 0 and not failed and counts.get("PASSED", 0) > 0
    line = (f"{counts.get('PASSED', 0)} passed, {counts.get('FAILED', 0)} failed, "
            f"{counts.get('ERROR', 0)} errors, {counts.get('SKIPPED', 0)} skipped")
    return {"ok": ok, "line": line, "seconds": seconds, "exit": code, "counts": counts,
            "failed": failed,
            "skipped": sorted(k for k, v in summary.get("not_passed", {}).items() if v == "SKIPPED")}


def _execute_lab(path: Path, timeout_s: float) -> dict:
    import nbclient
    import nbformat

    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=int(timeout_s), kernel_name="python3",
                                     allow_errors=True, iopub_timeout=60,
                                     resources={"metadata": {"path": str(path.parent)}})
    started = time.time()
    problem = None
    try:
        client.execute()
    except Exception as error:  # noqa: BLE001  (a kernel that died, a cell past its time)
        problem = f"{type(error).__name__}: {str(error).strip().splitlines()[-1][:300] if str(error).strip() else ''}"
    errors = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id", "?")
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                errors.append({"cell": grade_id, "error": f"{output.get('ename')}: "
                               f"{str(output.get('evalue'))[:400]}"})
    text = "\n".join(
        "".join(o.get("text", "")) for c in nb.cells if c.cell_type == "code"
        for o in c.get("outputs", []) if o.get("output_type") == "stream")
    suite = re.search(r"your operator against tests/test_operator\.py: (\d+) passed, (\d+) failed",
                      text)
    return {"lab": path.parent.name, "seconds": round(time.time() - started, 1),
            "cells": sum(1 for c in nb.cells if c.cell_type == "code"), "errors": errors,
            "problem": problem,
            "suite": {"passed": int(suite.group(1)), "failed": int(suite.group(2))} if suite else None,
            "ok": not errors and problem is None and not (suite and int(suite.group(2)))}


def part_labs(logs, timeout_s):
    labs = sorted((REPO / "assignments").glob("lab*/lab*.ipynb"))
    started = time.time()
    results = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=6) as pool:
        futures = {pool.submit(_execute_lab, path, timeout_s - 10): path for path in labs}
        try:
            for future in concurrent.futures.as_completed(futures, timeout=timeout_s):
                results.append(future.result())
        except concurrent.futures.TimeoutError:
            done = {r["lab"] for r in results}
            results += [{"lab": p.parent.name, "ok": False, "problem": "not finished in time",
                         "errors": []} for p in labs if p.parent.name not in done]
    results.sort(key=lambda r: r["lab"])
    (logs / "labs.json").write_text(json.dumps(results, indent=1) + "\n")
    bad = [r for r in results if not r["ok"]]
    line = f"{len(results) - len(bad)} of {len(results)} lab notebooks ran every cell"
    if bad:
        line += "; failing: " + "; ".join(
            f"{r['lab']} ({r['problem'] or ', '.join(e['cell'] for e in r['errors'])})" for r in bad)
    return {"ok": not bad and len(results) == len(labs), "line": line,
            "seconds": round(time.time() - started, 1), "labs": results}


def part_lab10(logs, timeout_s):
    code, seconds, text = run_logged(
        "lab10", [sys.executable, "-m", "pytest", LAB10_NODE, "-p", "no:cacheprovider", "-q",
                  "--tb=short", "-rfEs"], logs, timeout_s)
    last = [l for l in text.splitlines() if re.search(r"\d+ (passed|failed|error)", l)]
    return {"ok": code == 0, "line": last[-1].strip("= ") if last else f"exit {code}",
            "seconds": seconds, "exit": code}


def part_grading(logs, timeout_s):
    out = logs / "grading"
    started = time.time()
    code = grade_synthetic_class(out, grading_env="gpu", sandbox="auto", sequential="0",
                                 workers=8, budget_s=int(timeout_s - 20),
                                 python=sys.executable, log_path=logs / "grading.log",
                                 echo=False)
    seconds = round(time.time() - started, 1)
    result = {}
    for path in out.glob("grading_*.json"):
        result = json.loads(path.read_text())
    students = result.get("students", {})
    wrong = sorted(name for name, s in students.items()
                   if not (s.get("comparison") or {}).get("as_expected"))
    line = (f"{len(students) - len(wrong)} of {len(students)} students as the CPU grading "
            f"gives them; checks {'passed' if result.get('all_checks_passed') else 'FAILED'}")
    if wrong:
        line += "; differing: " + ", ".join(wrong)
    return {"ok": code == 0 and bool(result.get("all_as_expected"))
            and bool(result.get("all_checks_passed")), "line": line, "seconds": seconds,
            "exit": code, "differing": wrong, "sandbox": result.get("provenance", {}).get("sandbox_used")}


def part_bench(logs, timeout_s):
    out = logs / "bench_smoke.json"
    code, seconds, text = run_logged(
        "bench", [sys.executable, "-m", "source_kernels.bench", "--out", str(out), "--presets",
                  "decoder", "encoder", "decoder-b32", "--distributions", "uniform",
                  "--dtypes", "bf16", "--fast", "--no-dispatch"], logs, timeout_s)
    rows = []
    if out.exists():
        data = json.loads(out.read_text())
        rows = data.get("rows") or data.get("results") or []
    line = f"exit {code}, {len(rows)} rows in {seconds:.0f} s"
    return {"ok": code == 0 and bool(rows), "line": line, "seconds": seconds, "exit": code,
            "rows": len(rows)}


RUNNERS = {"tests": part_tests, "labs": part_labs, "lab10": part_lab10,
           "grading": part_grading, "bench": part_bench}
# seconds each part may take; the side-by-side parts share the first phase
LIMITS = {"tests": 330, "labs": 400, "lab10": 300, "grading": 330, "bench": 110}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("outdir")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--budget-s", type=float, default=540.0,
                        help="the whole check's seconds; each part is cut to fit")
    args = parser.parse_args(argv)
    require_gpu("scripts/gpu/check.py")
    started = time.time()
    out = Path(args.outdir).resolve()
    logs = out / "gpu_check_logs"
    logs.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TRITON_CACHE_DIR", str(out / "triton_cache"))
    os.environ["PYTHONUNBUFFERED"] = "1"
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    packages = ensure_packages(logs / "wheels.log")
    print(f"gpu-check: packages {packages}", flush=True)

    results = {}
    side_by_side = [p for p in args.parts if p != "bench"]
    budget = args.budget_s - (LIMITS["bench"] + 10 if "bench" in args.parts else 0)
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(side_by_side) or 1) as pool:
        futures = {pool.submit(RUNNERS[p], logs, min(LIMITS[p], budget)): p for p in side_by_side}
        for future in concurrent.futures.as_completed(futures):
            part = futures[future]
            try:
                results[part] = future.result()
            except Exception as error:  # noqa: BLE001  (a part that broke fails, with its reason)
                results[part] = {"ok": False, "line": f"broke: {type(error).__name__}: {error}"}
            print(f"gpu-check {part}: {'PASS' if results[part]['ok'] else 'FAIL'} "
                  f"{results[part]['line']}", flush=True)
    if "bench" in args.parts:
        left = args.budget_s - (time.time() - started)
        results["bench"] = (part_bench(logs, min(LIMITS["bench"], left)) if left > 30 else
                            {"ok": False, "line": "no time left for the benchmark smoke"})
        print(f"gpu-check bench: {'PASS' if results['bench']['ok'] else 'FAIL'} "
              f"{results['bench']['line']}", flush=True)

    ok = all(results[p]["ok"] for p in args.parts)
    payload = {"provenance": provenance("check.py"), "packages": packages, "ok": ok,
               "seconds": round(time.time() - started, 1),
               "summary": {p: ("PASS " if results[p]["ok"] else "FAIL ") + results[p]["line"]
                           for p in args.parts},
               "parts": results}
    path = out / f"gpu_check_{gpu_slug(payload['provenance']['gpu'])}.json"
    path.write_text(json.dumps(payload, indent=1) + "\n")
    with tarfile.open(out / "gpu_check_logs.tgz", "w:gz") as archive:
        for item in sorted(logs.rglob("*")):
            if item.is_file() and item.suffix in (".log", ".json", ".csv", ".tgz") and item.stat().st_size < 4e6:
                archive.add(item, arcname=str(item.relative_to(out)))
    print(f"gpu-check: {'PASS' if ok else 'FAIL'} ({payload['seconds']:.0f} s) -> {path.name}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
