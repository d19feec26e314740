"""Where the host time of one eager call goes (#10's dispatch figure).

    python3 scripts/gpu/dispatch_profile.py OUTDIR [--calls 2000]

profiles ``multi_scale_deformable_attn`` on the decoder preset (bf16) with cProfile, the
forward without autograd and forward+backward through autograd, and writes
OUTDIR/dispatch_profile_<gpu>.json: for each, the host time per call measured without the
profiler, and the functions with the most own time per call under it.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time

from _provenance import REPO, provenance, require_gpu, write_results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("outdir")
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args(argv)
    require_gpu("dispatch_profile.py")
    import torch

    from source_kernels import multi_scale_deformable_attn
    from source_kernels.inputs import preset_inputs

    inputs = preset_inputs("decoder", dtype=torch.bfloat16, device="cuda")
    leaves = {k: inputs[k].clone().requires_grad_()
              for k in ("value", "sampling_locations", "attention_weights")}
    grad = torch.randn(4, 300, 256, device="cuda", dtype=torch.bfloat16)

    def forward(n):
        for _ in range(n):
            multi_scale_deformable_attn(**inputs)

    def forward_backward(n):
        for _ in range(n):
            for leaf in leaves.values():
                leaf.grad = None
            multi_scale_deformable_attn(**dict(inputs, **leaves)).backward(grad)

    payload = {"provenance": provenance("dispatch_profile.py"), "calls": args.calls,
               "note": "own time per call under cProfile, which slows every Python call; "
                       "read the shares, not the absolute figures"}
    for name, calls in (("forward", forward), ("forward_backward", forward_backward)):
        n = args.calls if name == "forward" else max(1, args.calls // 4)
        calls(20)
        torch.cuda.synchronize()
        start = time.perf_counter()
        calls(n)
        host_us = (time.perf_counter() - start) / n * 1e6
        torch.cuda.synchronize()
        profiler = cProfile.Profile()
        profiler.enable()
        calls(n)
        profiler.disable()
        torch.cuda.synchronize()
        stats = pstats.Stats(profiler)
        rows = []
        for (filename, line, fname), (_, ncalls, tottime, cumtime, _) in stats.stats.items():
            # a file of the repository relative to it, of an installed package from
            # site-packages on: no folder of the machine that ran the profile
            where = filename.split("site-packages/")[-1].removeprefix(f"{REPO}/")
            rows.append({"function": f"{where}:{line}({fname})",
                         "calls_per_call": ncalls / n,
                         "own_us_per_call": tottime / n * 1e6,
                         "cumulative_us_per_call": cumtime / n * 1e6})
        rows.sort(key=lambda r: -r["own_us_per_call"])
        if name == "forward":             # the fields of the first version of this file
            payload["host_us_per_call_unprofiled"] = host_us
            payload["top_own_time"] = rows[:30]
        payload[name] = {"calls": n, "host_us_per_call_unprofiled": host_us,
                         "top_own_time": rows[:30]}
        print(f"{name}: host time per call {host_us:.1f} us")
        for row in rows[:12]:
            print(f"{row['own_us_per_call']:8.2f} us  {row['function']}")
    path = write_results(args.outdir, "dispatch_profile", payload)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
