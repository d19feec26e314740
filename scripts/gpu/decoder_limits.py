"""What bounds a decoder-sized forward from below, measured on this GPU (chapter 6, #10).

    python3 scripts/gpu/decoder_limits.py OUTDIR [--budget-s 20]

writes OUTDIR/decoder_limits_<gpu>.json.  Every figure is the profiler's median device time
of 20 calls with L2 flushed before each (``source_kernels.bench._profiled_device_us``):

- ``empty_kernel_us``: a Triton kernel that does nothing, on the forward's grid: the launch
  and the ramp of that many programs;
- ``gather_us``: a Triton kernel that reads exactly the corner rows the forward reads, in
  the forward's order (one program per (batch, query, head), its L*K*4 rows in one tile) and
  sums them, with no location arithmetic, no weights and an output of one row per program:
  the time the memory system needs for that gather pattern from a cold L2;
- ``forward_us``: the operator's forward on the same inputs, as the plan launches it;
- ``plan_grid``, ``empty_kernel_plan_grid_us``: the grid and warps the plan's forward kernel
  launches, and an empty kernel on that grid (what the launch of its programs costs).

If the forward sits close to ``gather_us``, the random row gather from DRAM is what binds,
not the arithmetic or the launch configuration.  ``--dry-run-cpu`` runs the code paths in
Triton's interpreter on tiny inputs and checks the gather against torch (never a result).
"""
from __future__ import annotations

import sys

from _provenance import lab_script_args, provenance, write_results


def main(argv=None) -> int:
    args, dry, _ = lab_script_args(__doc__, "decoder_limits.py", argv)
    import torch
    import triton
    import triton.language as tl

    import source_kernels  # noqa: F401  (interpreter switch for a dry run)
    from source_kernels import multi_scale_deformable_attn
    from source_kernels.bench import _profiled_device_us, corner_index
    from source_kernels.inputs import make_inputs, preset_inputs

    @triton.jit
    def empty_kernel(out_ptr):
        pass

    @triton.jit
    def gather_sum_kernel(table_ptr, index_ptr, out_ptr, D: tl.constexpr, R: tl.constexpr):
        row = tl.program_id(0)
        offs_r = tl.arange(0, R)
        offs_d = tl.arange(0, D)
        index = tl.load(index_ptr + row * R + offs_r)                  # this sample's rows
        rows = tl.load(table_ptr + index[:, None] * D + offs_d[None, :],
                       mask=(index >= 0)[:, None], other=0.0)          # the gather
        tl.store(out_ptr + row * D + offs_d, tl.sum(rows.to(tl.float32), axis=0)
                 .to(out_ptr.dtype.element_ty))

    device = "cpu" if dry else "cuda"
    results = {"provenance": provenance("decoder_limits.py", dry), "dry_run": dry, "rows": []}
    cases = ([("tiny", "fp32")] if dry else
             [(p, d) for p in ("decoder", "decoder-b32") for d in ("bf16", "fp32")])
    dtypes = {"bf16": torch.bfloat16, "fp32": torch.float32}
    for preset, dtype_name in cases:
        dtype = dtypes[dtype_name]
        if dry:
            inputs = make_inputs(1, 3, 2, 8, [[4, 5], [2, 3]], 2, dtype=dtype, device=device)
        else:
            inputs = preset_inputs(preset, dtype=dtype, device=device)
        value = inputs["value"]
        channels = value.shape[-1]
        table = value.reshape(-1, channels)
        index = corner_index(inputs).contiguous()
        out = torch.empty(index.shape[0], channels, dtype=dtype, device=device)
        grid = (index.shape[0],)

        def gather():
            gather_sum_kernel[grid](table, index, out, D=channels, R=index.shape[1],
                                    num_warps=1)

        def empty():
            empty_kernel[grid](out, num_warps=1)

        def forward():
            multi_scale_deformable_attn(**inputs)

        gather()
        expected = torch.where((index >= 0)[..., None], table[index.clamp(min=0)].float(),
                               torch.zeros(())).sum(1)
        torch.testing.assert_close(out.float(), expected, rtol=2e-2, atol=2e-2)
        row = {"preset": preset, "dtype": dtype_name, "programs": index.shape[0],
               "rows_per_program": index.shape[1],
               "rows_read": int((index >= 0).sum()),
               "distinct_rows": int(torch.unique(index[index >= 0]).numel()),
               "row_bytes": channels * value.element_size()}
        from source_kernels.forward import FORWARD_PLAN, choose, forward_launch
        pos = [inputs[k] for k in ("value", "value_spatial_shapes", "value_level_start_index",
                                   "sampling_locations", "attention_weights")]
        kernel, block, warps = choose(FORWARD_PLAN, value, pos[3].shape[1], None, None, None)
        _, plan_grid, _, _ = forward_launch(kernel, block, *pos, out)
        row["plan"] = [kernel, block, warps]
        row["plan_grid"] = list(plan_grid)

        def empty_plan_grid():
            empty_kernel[plan_grid](out, num_warps=warps)

        if not dry:
            flush = torch.empty(int(256e6 // 4), dtype=torch.int, device=device)
            row["empty_kernel_us"] = _profiled_device_us(empty, flush.zero_)
            row["empty_kernel_plan_grid_us"] = _profiled_device_us(empty_plan_grid, flush.zero_)
            row["gather_us"] = _profiled_device_us(gather, flush.zero_)
            row["forward_us"] = _profiled_device_us(forward, flush.zero_)
            row["distinct_bytes_per_s_in_gather"] = (row["distinct_rows"] * row["row_bytes"]
                                                     / (row["gather_us"] * 1e-6))
            del flush
        results["rows"].append(row)
        print(row, flush=True)
    if dry:
        print("dry run: code paths checked, nothing written")
        return 0
    path = write_results(args.outdir, "decoder_limits", results)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
