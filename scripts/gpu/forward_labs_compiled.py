"""Labs 04 and 05 compiled for a GPU: the solutions pass their visible checks, and what the
checks say about the typical mistakes when the kernels run compiled, not interpreted.

    python3 scripts/gpu/forward_labs_compiled.py OUTDIR [--budget-s 300]

writes OUTDIR/forward_labs_compiled.json:

- ``solutions``: for every visible check of labs 04 and 05, the source notebook's solution
  run against it compiled (``passed``, the message if not, seconds including compilation);
- ``mistakes``: every lab 04 and lab 05 row of ``tests/test_mistakes_forward.py`` (the same
  mistakes the CPU test injects), run compiled: whether the check failed, whether its message
  holds the words the interpreter's diagnosis holds, and the message itself.  Compiled, the
  guard cannot stop an access outside a tensor before it happens (it pads the tensors a check
  launches on with NaN/sentinels instead), NumPy's casts are not involved, and masked lanes
  without ``other=`` are not filled with NaN, so some rows are expected to read differently;
- ``skipped``: rows not started because the time budget ran out.

``--dry-run-cpu`` runs the same in Triton's interpreter (a check of the script; never a
result).
"""
from __future__ import annotations

import sys
import time

from _provenance import REPO, lab_script_args, results_saver, provenance

SCRIPT = "forward_labs_compiled.py"
STEM = "forward_labs_compiled"


def main(argv=None) -> int:
    args, dry, start = lab_script_args(__doc__, SCRIPT, argv)
    sys.path.insert(0, str(REPO / "tests"))
    import test_mistakes_forward as table

    result = {"provenance": provenance(SCRIPT, dry), "dry_run": dry, "solutions": [],
              "mistakes": [], "skipped": []}
    path, save = results_saver(args.outdir, STEM, result)

    def over_budget():
        return time.perf_counter() - start > args.budget_s

    for lab in (table.L04, table.L05):
        for check_id in table.visible_checks(lab):
            if over_budget():
                result["skipped"].append(f"{lab} solution, {check_id}")
                continue
            t0 = time.perf_counter()
            message = _run(table, lab, None, None, check_id)
            result["solutions"].append({"lab": lab, "check": check_id, "passed": message is None,
                                        "message": message,
                                        "seconds": round(time.perf_counter() - t0, 2)})
            save()
    for name, lab, cell_id, replacements, check_id, words in table.MISTAKES:
        if lab not in (table.L04, table.L05):
            continue
        if over_budget():
            result["skipped"].append(name)
            continue
        t0 = time.perf_counter()
        message = _run(table, lab, cell_id, replacements, check_id)
        result["mistakes"].append({
            "mistake": name, "check": check_id, "failed": message is not None,
            "named": message is not None and all(w in message for w in words),
            "message": message, "seconds": round(time.perf_counter() - t0, 2)})
        save()
    save()
    solved = sum(r["passed"] for r in result["solutions"])
    named = sum(r["named"] for r in result["mistakes"])
    print(f"solutions passing: {solved} of {len(result['solutions'])}; mistakes named: "
          f"{named} of {len(result['mistakes'])}; skipped: {len(result['skipped'])}; {path}")
    return 0


def _run(table, lab, cell_id, replacements, check_id):
    """The check's message, or a line naming an exception that is not the check's own."""
    try:
        return table.run_with_mistake(lab, cell_id, replacements, check_id)
    except Exception as exc:                                        # noqa: BLE001
        return f"(not an AssertionError) {type(exc).__name__}: {str(exc)[:2000]}"


if __name__ == "__main__":
    raise SystemExit(main())
