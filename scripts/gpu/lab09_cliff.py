"""Lab 09 on a GPU: the backward with grad_value in bf16 atomics against an fp32 buffer, as
the sampling locations crowd onto fewer rows.

    python3 scripts/gpu/lab09_cliff.py OUTDIR [--budget-s 20]

writes OUTDIR/lab09_cliff.json, which lab 09 shows on machines without a GPU:

- ``rows``: the decoder preset in bf16 with more and more contention: locations ``uniform``;
  ``local`` (each query around its own random point, 2 pixels of spread); then the 300 queries
  of each batch element crowded around 30, 3 and 1 shared points ("hot spots", 0.5 pixel of
  spread), so that more and more corner writes land on the same rows of grad_value.  For each:
  the backward (``source_kernels.backward.msda_backward``) with ``fp32_grad_accum=False``
  (``bf16_us``) and ``True`` (``fp32_us``), ``triton.testing.do_bench`` medians, the number of
  corner writes that land on the map (``corner_writes``) and how many distinct
  (batch, head, row) targets they hit (``distinct_rows``).
- ``capability``: the GPU's compute capability.  Before sm_90 the bf16 path is the
  compare-and-swap loop of lab 09; from sm_90 both paths are native atomic adds.
- ``ptx_atomics``: the atomic instructions of the backward kernel compiled for this GPU's
  architecture, bf16 inputs, both accumulation choices (``source_kernels.ptx``), when the
  budget leaves time for the compilations.
- ``skipped``: what was not started because the time budget ran out.

``--dry-run-cpu`` runs every code path on tiny inputs in Triton's interpreter (fp32 buffer only:
the interpreter has no bf16 atomics) and writes the file with "dry_run": true.
"""
from __future__ import annotations

import sys
import time

from _provenance import lab_script_args, make_bench, results_saver, provenance

SCRIPT = "lab09_cliff.py"
STEM = "lab09_cliff"
# (label, make_inputs arguments, shared points per batch element or None)
LOCATIONS = (("uniform", {"distribution": "uniform"}, None),
             ("local", {"distribution": "local", "sigma_pixels": 2.0}, None),
             ("30 hot spots", {"distribution": "uniform"}, 30),
             ("3 hot spots", {"distribution": "uniform"}, 3),
             ("1 hot spot", {"distribution": "uniform"}, 1))


def crowd(args, spots, sigma_pixels=0.5, seed=1):
    """Replace the locations: the queries of each batch element gather around ``spots`` shared
    points, query q around point q % spots, with normal offsets of ``sigma_pixels`` pixels of
    each level."""
    import torch

    loc = args["sampling_locations"]
    batch, queries, heads, levels, points, _ = loc.shape
    generator = torch.Generator().manual_seed(seed)
    centres = torch.rand(batch, spots, 2, generator=generator, dtype=torch.float64)
    centres = centres[:, torch.arange(queries) % spots]                       # (B, Q, 2)
    sizes = args["value_spatial_shapes"].cpu().flip(-1).double()              # (L, 2): W, H
    noise = torch.randn(batch, queries, heads, levels, points, 2, generator=generator,
                        dtype=torch.float64) * sigma_pixels / sizes[:, None, :]
    crowded = centres[:, :, None, None, None, :] + noise
    return dict(args, sampling_locations=crowded.to(device=loc.device, dtype=loc.dtype))


def main(argv=None) -> int:
    args, dry, start = lab_script_args(__doc__, SCRIPT, argv)

    import torch
    import source_kernels  # noqa: F401
    from source_kernels.backward import msda_backward
    from source_kernels.chips.lab07 import sample_corners
    from source_kernels.inputs import PRESETS, make_inputs, pyramid_shapes

    device = "cpu" if dry else "cuda"

    bench = make_bench(dry)

    def left():
        return args.budget_s - (time.perf_counter() - start)

    capability = [0, 0] if dry else list(torch.cuda.get_device_capability())
    payload = {"provenance": provenance(SCRIPT, dry), "capability": capability, "rows": [],
               "skipped": [], "dry_run": dry}
    path, save = results_saver(args.outdir, STEM, payload)

    preset = PRESETS["decoder"]
    dtype = torch.float32 if dry else torch.bfloat16
    for label, kw, spots in LOCATIONS:
        if left() < 3:
            payload["skipped"].append(label)
            continue
        if dry:
            a = make_inputs(1, 8, 1, 8, [[5, 6], [2, 3]], 2, dtype=dtype, device=device, **kw)
        else:
            a = make_inputs(preset.batch, preset.queries, preset.heads, preset.channels,
                            pyramid_shapes(), preset.points, dtype=dtype, device=device, **kw)
        if spots is not None:
            a = crowd(a, spots)
        shape = a["value"].shape
        grad = torch.randn(shape[0], a["sampling_locations"].shape[1], shape[2] * shape[3],
                           device=device, dtype=dtype)
        corners = sample_corners(*(t.float() if t.is_floating_point() else t
                                   for t in list(a.values())[:4]))
        rows = corners["rows"].permute(0, 2, 1, 3, 4, 5)[corners["inside"].permute(0, 2, 1, 3, 4, 5)]
        heads = torch.arange(shape[0] * shape[2], device=device).reshape(shape[0], shape[2])
        owner = heads[:, :, None, None, None, None].expand(corners["rows"].permute(0, 2, 1, 3, 4, 5).shape)
        owner = owner[corners["inside"].permute(0, 2, 1, 3, 4, 5)]
        distinct = int(torch.unique(owner * shape[1] + rows).numel())
        row = {"locations": label, "distinct_rows": distinct, "corner_writes": int(rows.numel())}
        for accum in ((True,) if dry else (False, True)):
            row["fp32_us" if accum else "bf16_us"] = bench(
                lambda: msda_backward(grad, *a.values(), fp32_grad_accum=accum))
        payload["rows"].append(row)
        print(label, row, flush=True)
        save()

    if dry or left() < 12:
        payload["skipped"].append("ptx_atomics")
    else:
        from source_kernels.ptx import atomic_summary, compile_ptx
        arch = capability[0] * 10
        payload["ptx_atomics"] = {
            f"sm_{arch}, grad_value in {'fp32' if accum else 'bf16'}":
                atomic_summary(compile_ptx("backward", arch, torch.bfloat16, accum))
            for accum in (False, True)}
        print("ptx atomics", payload["ptx_atomics"], flush=True)
        save()

    save()
    print(f"wrote {path} in {time.perf_counter() - start:.1f} s")
    return 0



if __name__ == "__main__":
    sys.exit(main())
