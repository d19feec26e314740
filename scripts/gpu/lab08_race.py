"""Lab 08 on a GPU: the data race across programs, and the run-to-run spread of atomics.

    python3 scripts/gpu/lab08_race.py OUTDIR [--budget-s 20]

writes OUTDIR/lab08_race.json, which lab 08 shows on machines without a GPU:

- ``scatter``: 2**20 updates of +1 into R rows (R = 1, 64, 4096, 2**20, indices uniform at
  random) through lab 08's two scatters (``source_kernels.chips.lab08``, 1024 updates per
  program): ``naive_landed`` and ``atomic_landed`` (the sum of the result: how many updates
  landed) and ``naive_us`` / ``atomic_us`` (``triton.testing.do_bench`` medians).
- ``backward_spread``: the course's backward (``source_kernels.backward.msda_backward``) run
  ``runs`` times on the same decoder-preset inputs (fp32, local locations): the largest
  difference of grad_value from the first run, and the largest |grad_value|.
- ``skipped``: what was not started because the time budget ran out.

``--dry-run-cpu`` runs every code path on tiny inputs in Triton's interpreter and writes the
file with "dry_run": true (for checking the script without a GPU; never a result).
"""
from __future__ import annotations

import sys
import time

from _provenance import lab_script_args, make_bench, results_saver, provenance

SCRIPT = "lab08_race.py"
STEM = "lab08_race"


def main(argv=None) -> int:
    args, dry, start = lab_script_args(__doc__, SCRIPT, argv)

    import torch
    import source_kernels  # noqa: F401
    from source_kernels.backward import msda_backward
    from source_kernels.chips.lab08 import scatter_add_atomic, scatter_add_naive
    from source_kernels.inputs import make_inputs, preset_inputs

    device = "cpu" if dry else "cuda"

    bench = make_bench(dry)

    def left():
        return args.budget_s - (time.perf_counter() - start)

    payload = {"provenance": provenance(SCRIPT, dry), "scatter": [], "skipped": [], "dry_run": dry}
    path, save = results_saver(args.outdir, STEM, payload)

    n = 1 << (12 if dry else 20)
    block = 1024
    generator = torch.Generator().manual_seed(0)
    index_all = torch.randint(0, 1 << 20, (n,), generator=generator).to(device)
    ones = torch.ones(n, device=device)
    for rows in (1, 64, 4096, 1 << 20):
        case = f"scatter into {rows} rows"
        if left() < 2:
            payload["skipped"].append(case)
            continue
        index = index_all % rows
        zeros = torch.zeros(rows, device=device)
        row = {"rows": rows, "updates": n, "block": block,
               "naive_landed": float(scatter_add_naive(zeros, index, ones, block=block).sum()),
               "atomic_landed": float(scatter_add_atomic(zeros, index, ones, block=block).sum()),
               "naive_us": bench(lambda: scatter_add_naive(zeros, index, ones, block=block)),
               "atomic_us": bench(lambda: scatter_add_atomic(zeros, index, ones, block=block))}
        payload["scatter"].append(row)
        print(case, row, flush=True)
        save()

    runs = 5
    if left() < 4:
        payload["skipped"].append("backward_spread")
    else:
        if dry:
            a = make_inputs(1, 8, 1, 8, [[3, 3], [1, 1]], 2, distribution="local", device=device)
        else:
            a = preset_inputs("decoder", distribution="local", dtype=torch.float32, device=device)
        batch, queries, heads = a["value"].shape[0], a["sampling_locations"].shape[1], a["value"].shape[2]
        grad = torch.randn(batch, queries, heads * a["value"].shape[3], generator=generator).to(device)
        grads = [msda_backward(grad, *a.values())[0] for _ in range(runs)]
        spread = max((g - grads[0]).abs().max().item() for g in grads[1:])
        payload["backward_spread"] = {
            "preset": "decoder" if not dry else "tiny", "dtype": "fp32", "distribution": "local",
            "runs": runs, "max_abs_diff": spread, "max_abs_grad": grads[0].abs().max().item(),
            "elements_that_differ": int(max((g != grads[0]).sum().item() for g in grads[1:]))}
        print("backward spread", payload["backward_spread"], flush=True)
        save()

    save()
    print(f"wrote {path} in {time.perf_counter() - start:.1f} s")
    return 0



if __name__ == "__main__":
    sys.exit(main())
