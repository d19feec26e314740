"""Run the operator's tests on a GPU host in parallel, with or without pytest-xdist.

    python3 scripts/gpu/gpu_tests.py OUTDIR [--workers N] [--timeout-s S] [-- PYTEST_ARGS]

The operator's test files (operator, spec, launch path, model) without the tests marked
slow, plus the torch.compile test; on a GPU host every test runs on the GPU.  With
pytest-xdist installed, one ``pytest -n N``; without it, the collected tests are dealt
round-robin to N pytest processes.  Each process's log is kept; the outcome of every test
(from the verbose log, so that a run stopped by the time limit still reports what it
finished) goes to OUTDIR/gpu_tests.json, with the counts.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FILES = ["tests/test_operator.py", "tests/test_spec.py", "tests/test_launch.py",
         "tests/test_model.py"]
EXTRA = ["tests/test_operator.py::test_torch_compile_fullgraph"]
NODE = r"(tests/[^\s\[]+::[^\s\[]+(?:\[[^\]]*\])?)"
OUTCOME = re.compile(r"^" + NODE + r"\s+(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)"
                     r"|(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\s+" + NODE)


def collect(extra_args):
    done = subprocess.run([sys.executable, "-m", "pytest", *FILES, "-m", "not slow",
                           "--collect-only", "-q", "-p", "no:cacheprovider", *extra_args],
                          capture_output=True, text=True, cwd=REPO)
    ids = [line.strip() for line in done.stdout.splitlines() if "::" in line]
    return ids + EXTRA


def outcomes(text):
    found = {}
    for line in text.splitlines():
        match = OUTCOME.search(line)
        if match:
            node = match.group(1) or match.group(4)
            found[node] = match.group(2) or match.group(3)
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("outdir")
    parser.add_argument("--workers", type=int, default=6)
    parser.add_argument("--timeout-s", type=float, default=200.0)
    args, extra = parser.parse_known_args(argv)
    extra = [a for a in extra if a != "--"]
    out = Path(args.outdir)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    try:
        import xdist  # noqa: F401
        have_xdist = True
    except ImportError:
        have_xdist = False
    common = ["-p", "no:cacheprovider", "-v", "-rfEs", "--tb=short", *extra]
    if have_xdist:
        groups = [[*FILES, "-m", "not slow", "-n", str(args.workers)], EXTRA]
    else:
        ids = collect(extra)
        groups = [ids[i::args.workers] for i in range(args.workers)]
    processes = []
    for number, group in enumerate(g for g in groups if g):
        log = out / f"gpu_tests_{number}.log"
        handle = log.open("w")
        processes.append((subprocess.Popen([sys.executable, "-m", "pytest", *group, *common],
                                           stdout=handle, stderr=subprocess.STDOUT,
                                           cwd=REPO), handle, log))
    deadline = started + args.timeout_s
    for process, handle, _ in processes:
        try:
            process.wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        handle.close()
    results = {}
    codes = []
    for process, _, log in processes:
        results.update(outcomes(log.read_text(errors="replace")))
        codes.append(process.returncode)
    counts = {}
    for outcome in results.values():
        counts[outcome] = counts.get(outcome, 0) + 1
    summary = {"xdist": have_xdist, "processes": len(processes), "exit_codes": codes,
               "seconds": round(time.time() - started, 1), "counts": counts,
               "not_passed": {k: v for k, v in results.items() if v not in ("PASSED",)},
               "outcomes": results}
    (out / "gpu_tests.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"gpu tests: {counts} in {summary['seconds']} s (exit codes {codes})")
    for node, outcome in summary["not_passed"].items():
        if outcome in ("FAILED", "ERROR"):
            print(f"  {outcome} {node}")
    return 0 if all(c == 0 for c in codes) else 1


if __name__ == "__main__":
    sys.exit(main())
