"""Lab 06 on a GPU: the wide-vs-narrow race of the forward kernel, and a launch sweep.

    python3 scripts/gpu/lab06_tiling.py OUTDIR [--budget-s 20]

writes OUTDIR/lab06_tiling.json, which lab 06 shows on machines without a GPU:

- ``race``: for the decoder and decoder-b32 presets, fp32 and bf16, uniform and local
  locations: ``wide_us``, lab 05's kernel (``source_kernels.forward``'s loop kernel at its
  default ``forward_config``); ``narrow_us``, lab 06's narrow kernel (one query per lane, the
  channels walked one at a time: ``source_kernels.chips.lab06``); ``tiled_us``, the course's
  tiled variant where the package has one; and ``max_abs_diff`` between narrow and wide.
  Times are ``triton.testing.do_bench`` medians (L2 flushed between runs).
- ``sweep``: BLOCK_Q x num_warps of the wide kernel on the decoder and encoder presets, bf16,
  uniform locations.
- ``default_config``: ``forward_config(32, dtype)`` per dtype.
- ``skipped``: what was not started because the time budget (``--budget-s``) ran out.

``--dry-run-cpu`` runs every code path on tiny inputs in Triton's interpreter and writes the
file with "dry_run": true (for checking the script without a GPU; never a result).
"""
from __future__ import annotations

import sys
import time

from _provenance import lab_script_args, make_bench, results_saver, provenance

SCRIPT = "lab06_tiling.py"
STEM = "lab06_tiling"


def main(argv=None) -> int:
    args, dry, start = lab_script_args(__doc__, SCRIPT, argv)

    import torch
    import source_kernels  # noqa: F401  (interpreter switch in a dry run)
    from source_kernels.chips.lab05 import forward_config, msda_forward
    from source_kernels.chips.lab06 import msda_forward_narrow
    from source_kernels.inputs import make_inputs, preset_inputs

    device = "cpu" if dry else "cuda"

    bench = make_bench(dry)

    def inputs(preset, dtype, distribution):
        if dry:
            return make_inputs(1, 8, 1, 8, [[5, 6], [2, 3]], 2, dtype=dtype,
                               distribution=distribution, device=device)
        return preset_inputs(preset, dtype=dtype, distribution=distribution, device=device)

    def left():
        return args.budget_s - (time.perf_counter() - start)

    payload = {"provenance": provenance(SCRIPT, dry), "race": [], "sweep": [], "skipped": [],
               "default_config": {}, "dry_run": dry}
    path, save = results_saver(args.outdir, STEM, payload)

    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    for name, dtype in dtypes.items():
        payload["default_config"][name] = list(forward_config(32, dtype))

    def tiled(a):
        return msda_forward(*a.values(), kernel="tiled")

    has_tiled = True
    for preset in ("decoder", "decoder-b32"):
        for name, dtype in dtypes.items():
            for distribution in ("uniform", "local"):
                case = f"race {preset} {name} {distribution}"
                if left() < 3:
                    payload["skipped"].append(case)
                    continue
                a = inputs(preset, dtype, distribution)
                block_q, warps = forward_config(a["value"].shape[-1], dtype)

                def wide():
                    return msda_forward(*a.values(), block_q=block_q, num_warps=warps)

                def narrow():
                    return msda_forward_narrow(*a.values())

                diff = (narrow().float() - wide().float()).abs().max().item()
                row = {"preset": preset, "dtype": name, "distribution": distribution,
                       "wide_us": bench(wide), "narrow_us": bench(narrow),
                       "wide_config": [block_q, warps], "max_abs_diff": diff}
                if has_tiled:
                    try:
                        row["tiled_us"] = bench(lambda: tiled(a))
                    except TypeError:          # a package without the tiled variant
                        has_tiled = False
                payload["race"].append(row)
                print(case, {k: round(v, 1) if isinstance(v, float) else v for k, v in row.items()
                             if k.endswith("_us")}, flush=True)
                save()

    configs = [(q, w) for w in (4, 8) for q in (16, 32, 64, 128)]
    for preset in ("decoder", "encoder"):
        a = None
        for block_q, warps in configs:
            case = f"sweep {preset} bf16 BLOCK_Q={block_q} num_warps={warps}"
            if left() < 2:
                payload["skipped"].append(case)
                continue
            if a is None:
                a = inputs(preset, torch.bfloat16, "uniform")
            us = bench(lambda: msda_forward(*a.values(), block_q=block_q, num_warps=warps))
            payload["sweep"].append({"preset": preset, "dtype": "bf16", "distribution": "uniform",
                                     "block_q": block_q, "num_warps": warps, "us": us})
            print(case, round(us, 1), flush=True)
            save()
    save()
    print(f"wrote {path} ({len(payload['race'])} race rows, {len(payload['sweep'])} sweep rows, "
          f"{len(payload['skipped'])} skipped) in {time.perf_counter() - start:.1f} s")
    return 0



if __name__ == "__main__":
    sys.exit(main())
