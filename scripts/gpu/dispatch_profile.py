"""Where the host time of one eager forward call goes (#10's dispatch figure).

    python3 scripts/gpu/dispatch_profile.py OUTDIR [--calls 2000]

profiles ``multi_scale_deformable_attn`` on the decoder preset (bf16, no autograd) with
cProfile and writes OUTDIR/dispatch_profile_<gpu>.json: the host time per call measured
without the profiler, and the functions with the most own time per call under it.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time

from _provenance import provenance, repo_on_path, require_gpu, write_results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("outdir")
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args(argv)
    require_gpu("dispatch_profile.py")
    repo_on_path()
    import torch

    from source_kernels import multi_scale_deformable_attn
    from source_kernels.inputs import preset_inputs

    inputs = preset_inputs("decoder", dtype=torch.bfloat16, device="cuda")

    def calls(n):
        for _ in range(n):
            multi_scale_deformable_attn(**inputs)

    calls(20)
    torch.cuda.synchronize()
    start = time.perf_counter()
    calls(args.calls)
    host_us = (time.perf_counter() - start) / args.calls * 1e6
    torch.cuda.synchronize()
    profiler = cProfile.Profile()
    profiler.enable()
    calls(args.calls)
    profiler.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(profiler)
    rows = []
    for (filename, line, name), (_, ncalls, tottime, cumtime, _) in stats.stats.items():
        rows.append({"function": f"{filename.split('site-packages/')[-1]}:{line}({name})",
                     "calls_per_call": ncalls / args.calls,
                     "own_us_per_call": tottime / args.calls * 1e6,
                     "cumulative_us_per_call": cumtime / args.calls * 1e6})
    rows.sort(key=lambda r: -r["own_us_per_call"])
    payload = {"provenance": provenance("dispatch_profile.py"), "calls": args.calls,
               "host_us_per_call_unprofiled": host_us,
               "note": "own time per call under cProfile, which slows every Python call; "
                       "read the shares, not the absolute figures",
               "top_own_time": rows[:30]}
    path = write_results(args.outdir, "dispatch_profile", payload)
    print(f"host time per call {host_us:.1f} us; wrote {path}")
    for row in rows[:15]:
        print(f"{row['own_us_per_call']:8.2f} us  {row['function']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
