"""How long one load waits, and how many loads in flight it takes to fill the memory system
(chapter 2: latency hiding, Little's law, occupancy).

    python3 scripts/gpu/memory_parallelism.py OUTDIR [--budget-s 300]

writes OUTDIR/memory_<gpu>.json with three sections:

- ``device``: what the driver reports about the GPU (multiprocessors, L2 size, registers and
  threads per multiprocessor, shared memory, clocks), read through torch, Triton's driver and
  nvidia-smi;
- ``latency``: the time of one dependent load, by pointer chasing: one thread follows a
  random cycle through a buffer, one 8-byte load per 128-byte line, each address read from
  the previous load (``.cg``: cached in L2 only).  Timed with CUDA events around one launch of
  ``steps`` loads and one of ``2 * steps``; the difference over ``steps`` is one load's
  latency with the launch taken out.  The 4 MiB buffer is walked once before timing, so it
  sits in L2; before each timed launch over the 256 MiB and 1 GiB buffers, L2 is flushed
  (a 256 MiB buffer is zeroed), so nearly every load goes to DRAM;
- ``gather``: bytes per second of random 512-byte row gathers from a 2 GiB table as a
  function of the loads in flight.  ``warps_per_sm`` x multiprocessors programs of one warp;
  each program follows ``chains`` independent chains through the table: at every step it
  loads the current row of each chain (16 bytes per thread and chain) and reads the next
  row's index from the row's first element, so a chain cannot run ahead of its own data and
  exactly ``chains`` rows per warp are in flight: warps x chains x 512 bytes per
  multiprocessor.  The chains start evenly spaced along one random cycle through all rows and
  never meet in a launch, so no row is read twice.  Each row: CUDA events around one launch,
  L2 flushed before it, median of 5 after a warm-up.

``--dry-run-cpu`` runs every code path in Triton's interpreter on tiny sizes and checks the
kernels' results against torch (never a result).
"""
from __future__ import annotations

import statistics
import subprocess
import sys
import time

from _provenance import lab_script_args, provenance, results_saver, gpu_slug

LINE_ELEMS = 16                 # int64 elements per 128-byte line
ROW_ELEMS = 128                 # int32 elements per gathered row: 512 bytes, 16 B per thread
WARPS_PER_SM = (1, 2, 4, 8, 16, 32)      # one-warp programs; 32 resident programs per SM max
CHAINS_PER_WARP = (1, 2, 4, 8)


def device_section(torch) -> dict:
    props = torch.cuda.get_device_properties(0)
    names = ("name", "multi_processor_count", "L2_cache_size", "regs_per_multiprocessor",
             "max_threads_per_multi_processor", "warp_size",
             "shared_memory_per_multiprocessor", "shared_memory_per_block_optin",
             "total_memory")
    section = {"torch_properties": {n: getattr(props, n, None) for n in names}}
    try:
        import triton
        section["triton_driver_properties"] = dict(
            triton.runtime.driver.active.utils.get_device_properties(0))
    except Exception as err:  # noqa: BLE001 - the other fields still count
        section["triton_driver_properties"] = {"error": f"{type(err).__name__}: {err}"}
    query = "clocks.max.sm,clocks.max.memory,clocks.sm,clocks.mem"
    try:
        done = subprocess.run(["nvidia-smi", "--id=0", f"--query-gpu={query}",
                               "--format=csv,noheader"], capture_output=True, text=True,
                              timeout=30, check=False)
        section["nvidia_smi"] = dict(zip(query.split(","),
                                         [v.strip() for v in done.stdout.split(",")]))
    except (OSError, subprocess.SubprocessError) as err:
        section["nvidia_smi"] = {"error": str(err)}
    return section


def main(argv=None) -> int:
    args, dry, started = lab_script_args(__doc__, "memory_parallelism.py", argv)
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def chase_kernel(next_ptr, start_ptr, out_ptr, steps):
        # one thread's chain of dependent loads: each address is the previous load's value
        position = tl.load(start_ptr)
        for _ in range(steps):
            position = tl.load(next_ptr + position, cache_modifier=".cg")
        tl.store(out_ptr, position)

    @triton.jit
    def row_chase_kernel(table_ptr, start_ptr, out_ptr, steps,
                         CHAINS: tl.constexpr, ROW: tl.constexpr):
        program = tl.program_id(0)
        chains = program * CHAINS + tl.arange(0, CHAINS)
        rows = tl.load(start_ptr + chains).to(tl.int64)          # (CHAINS,) current rows
        columns = tl.arange(0, ROW)
        total = tl.zeros((ROW,), dtype=tl.int32)
        for _ in range(steps):
            first = table_ptr + rows * ROW                       # each chain's row
            block = tl.load(first[:, None] + columns[None, :])   # CHAINS rows of 512 bytes
            total += tl.sum(block, axis=0)
            rows = tl.load(first).to(tl.int64)                   # the next row of each chain
        tl.store(out_ptr + program * ROW + columns, total)

    device = "cpu" if dry else "cuda"
    payload = {"provenance": provenance("memory_parallelism.py", dry), "dry_run": dry}
    stem = "memory_dry_run" if dry else f"memory_{gpu_slug(payload['provenance']['gpu'])}"
    path, save = results_saver(args.outdir, stem, payload)

    def over_budget() -> bool:
        return time.perf_counter() - started > args.budget_s

    def event_ms(launch) -> float:
        """One launch between two CUDA events (the host clock in a dry run)."""
        if dry:
            t0 = time.perf_counter()
            launch()
            return (time.perf_counter() - t0) * 1e3
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        launch()
        end.record()
        end.synchronize()
        return begin.elapsed_time(end)

    if not dry:
        payload["device"] = device_section(torch)
        save()

    # --- latency of one dependent load ------------------------------------------------------
    payload["latency"] = {
        "method": "pointer chase: one thread, one 8-byte .cg load per 128-byte line of a "
                  "random cycle; CUDA events around a launch of `steps` and of 2*`steps` "
                  "loads, (t2 - t1) / steps, median of 3 pairs; the L2 buffer is walked once "
                  "before timing, L2 is flushed (256 MiB zeroed) before each DRAM launch",
        "rows": []}
    buffers = ([("L2", 4 * 2**20), ("DRAM", 2**28), ("DRAM", 2**30)] if not dry
               else [("tiny", 2**12)])
    steps = 20_000 if not dry else 4
    flush = torch.empty(2**28 if not dry else 2**10, dtype=torch.uint8, device=device)
    for where, size in buffers:
        lines = size // (LINE_ELEMS * 8)
        order = torch.randperm(lines, device=device)
        following = torch.roll(order, -1)                  # a single cycle through all lines
        chain = torch.zeros(lines * LINE_ELEMS, dtype=torch.int64, device=device)
        chain[order * LINE_ELEMS] = following * LINE_ELEMS
        start = (order[:1] * LINE_ELEMS).contiguous()
        out = torch.empty(1, dtype=torch.int64, device=device)
        if dry:                                            # check the chase itself
            chase_kernel[(1,)](chain, start, out, 3, num_warps=1)
            expected = int(start)
            for _ in range(3):
                expected = int(chain[expected])
            assert int(out) == expected, (int(out), expected)
        in_l2 = where == "L2"
        warm = (lines if in_l2 else 2) if not dry else 2     # walk the L2 buffer once
        chase_kernel[(1,)](chain, start, out, warm, num_warps=1)
        per_load = []
        for _ in range(3 if not dry else 1):
            timed = []
            for n in (steps, 2 * steps):
                if not in_l2:
                    flush.zero_()
                timed.append(event_ms(lambda: chase_kernel[(1,)](chain, start, out, n,  # noqa: F821  (a false alarm: the lambda runs before the del)
                                                                num_warps=1)))
            per_load.append((timed[1] - timed[0]) / steps * 1e6)
        payload["latency"]["rows"].append({"level": where, "buffer_bytes": size,
                                           "steps": steps, "ns_per_load": per_load,
                                           "median_ns": statistics.median(per_load)})
        print(f"latency {where:5s} {size / 2**20:7.1f} MiB: "
              f"{statistics.median(per_load):7.1f} ns per load", flush=True)
        save()
        del chain, order, following

    # --- bandwidth of random row gathers against the loads in flight --------------------------
    sms = torch.cuda.get_device_properties(0).multi_processor_count if not dry else 2
    table_bytes = 2**31 if not dry else 2**16
    rows = table_bytes // (ROW_ELEMS * 4)
    order = torch.randperm(rows, device=device)
    table = torch.randint(0, 1000, (rows, ROW_ELEMS), dtype=torch.int32, device=device)
    table[order, 0] = torch.roll(order, -1).to(torch.int32)     # one cycle through all rows
    target_bytes = 2**29 if not dry else 2**13                  # a quarter of the table
    payload["gather"] = {
        "method": "random 512-byte rows of a 2 GiB int32 table, read by independent chains "
                  "(a chain's next row is the first element of its current row, so each "
                  "chain has exactly one row in flight); warps_per_sm x multiprocessors "
                  "programs of one warp, chains_per_warp chains each, every row read once per "
                  "launch; CUDA events around one launch, L2 flushed (256 MiB zeroed) before "
                  "it, median of 5 after a warm-up; bytes_per_s counts the rows gathered",
        "table_bytes": table_bytes, "row_bytes": ROW_ELEMS * 4, "multiprocessors": sms,
        "rows": []}
    configs = [(w, c) for w in WARPS_PER_SM for c in CHAINS_PER_WARP]
    if dry:
        configs = [(1, 1), (2, 4)]
    for warps, chains in configs:
        if over_budget():
            payload.setdefault("skipped", []).append(
                {"what": f"gather warps_per_sm={warps} chains_per_warp={chains}",
                 "reason": f"time budget of {args.budget_s} s"})
            continue
        programs = sms * warps
        n_chains = programs * chains
        steps = max(1, target_bytes // (n_chains * ROW_ELEMS * 4))
        spacing = rows // n_chains                               # chains never meet
        starts = order[torch.arange(n_chains, device=device) * spacing].to(torch.int32)
        out = torch.empty(programs, ROW_ELEMS, dtype=torch.int32, device=device)

        def launch():
            return row_chase_kernel[(programs,)](table, starts, out, steps, CHAINS=chains,
                                                 ROW=ROW_ELEMS, num_warps=1, num_stages=1)

        compiled = launch()
        if dry:                                           # check one program against torch
            expected = torch.zeros(ROW_ELEMS, dtype=torch.int32)
            current = starts[:chains].long()
            for _ in range(steps):
                expected += table[current].sum(0, dtype=torch.int32)
                current = table[current, 0].long()
            assert torch.equal(out[0], expected), (out[0], expected)
        else:
            torch.cuda.synchronize()
        times = []
        for _ in range(5):
            flush.zero_()
            times.append(event_ms(launch))
        ms = statistics.median(times)
        gathered = n_chains * steps * ROW_ELEMS * 4
        row = {"warps_per_sm": warps, "chains_per_warp": chains, "programs": programs,
               "steps": steps, "bytes_in_flight_per_sm": warps * chains * ROW_ELEMS * 4,
               "registers": getattr(compiled, "n_regs", None), "ms": times,
               "median_ms": ms, "bytes_gathered": gathered,
               "bytes_per_s": gathered / (ms * 1e-3)}
        payload["gather"]["rows"].append(row)
        print(f"gather {warps:2d} warps/SM x {chains:2d} chains/warp "
              f"({row['bytes_in_flight_per_sm'] / 1024:6.1f} KiB in flight per SM): "
              f"{row['bytes_per_s'] / 1e12:6.3f} TB/s, {row['registers']} registers",
              flush=True)
        save()
    payload["elapsed_s"] = time.perf_counter() - started
    save()
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
