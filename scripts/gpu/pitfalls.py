"""Measure the benchmarking pitfalls of the course (chapter 6) on a CUDA GPU.

    python3 scripts/gpu/pitfalls.py OUTDIR [--presets decoder encoder] [--dtypes bf16]
                                           [--budget-s 60]

writes OUTDIR/pitfalls_<gpu>.json (pitfalls_h200.json on an H200): the forward pass of the
course's operator timed seven ways, three of them wrong on purpose, and the host time that
one eager call costs, split into its parts.  The book reads the file from results/.
The cases run in order (presets, then dtypes); a case that would start after --budget-s
seconds is skipped and listed as such in the file, which is always written.

Timing methods (each function below is shown in chapter 6):
  no_sync              host clock around n calls, no synchronisation       (wrong)
  sync_in_loop         host clock, torch.cuda.synchronize() after each call (wrong)
  events_drained       CUDA events around one call on an idle GPU          (wrong)
  events_back_to_back  CUDA events around n calls queued back to back
  do_bench             triton.testing.do_bench median, L2 flushed before each run
  cuda_graph           n calls captured in one CUDA graph, replayed
  profiler             torch.profiler device time of the kernel itself
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

from _provenance import provenance, require_gpu, write_results

SCRIPT = "pitfalls.py"
KERNEL_PREFIX = "_msda_forward"          # the loop and the tiled forward kernels
DO_BENCH_MS = {"warmup": 5, "rep": 25}   # shorter than do_bench's defaults (25, 100)


# ------------------------------------------------------------------------ timing methods
# `fn` is a function of no arguments that runs one forward call; results in µs per call.

def time_no_sync(fn, n):
    """Wrong: the host clock around n calls with no synchronisation measures how fast the
    host can enqueue work, not how long the GPU takes to do it."""
    import torch
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    stop = time.perf_counter()
    torch.cuda.synchronize()
    return (stop - start) / n * 1e6


def time_sync_in_loop(fn, n):
    """Wrong: synchronising after every call adds the host's dispatch, the launch latency
    and the round trip of the synchronisation to every call."""
    import torch
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        fn()
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / n * 1e6


def time_events_drained(fn, n):
    """Wrong: events around one call on an idle GPU.  The start event is recorded at once,
    then the GPU waits while the host dispatches the call: the gap is timed too."""
    import torch
    times = []
    for _ in range(n):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()                 # the queue is empty: "drained"
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e3)
    return statistics.median(times)


def time_events_back_to_back(fn, n):
    """Events around n calls queued back to back: the device time per call when the GPU is
    the bottleneck, the host's dispatch time per call when the host is."""
    import torch
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(n):
        fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) * 1e3 / n


def time_do_bench(fn, n):
    """triton.testing.do_bench: events around each run, L2 flushed before each run (the
    flush keeps the queue busy while the host dispatches), median over the runs."""
    import triton.testing
    return triton.testing.do_bench(fn, return_mode="median", **DO_BENCH_MS) * 1e3


def time_cuda_graph(fn, n):
    """n calls captured once in a CUDA graph and replayed: no host dispatch inside the timed
    region.  L2 is not flushed between the calls."""
    import torch
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):               # warm up on a side stream before capture
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(n):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    replays = 5
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) * 1e3 / (replays * n)


def time_profiler(fn, n):
    """torch.profiler: the device time of the kernel itself (gaps between kernels are not
    counted), averaged over n calls."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    kernels = [evt for evt in prof.events()
               if KERNEL_PREFIX in evt.name and evt.device_type == DeviceType.CUDA]
    if len(kernels) != n:
        raise RuntimeError(f"the profiler saw {len(kernels)} {KERNEL_PREFIX}* kernels for "
                           f"{n} calls")
    return sum(evt.time_range.elapsed_us() for evt in kernels) / n


METHODS = {
    "no_sync": time_no_sync,
    "sync_in_loop": time_sync_in_loop,
    "events_drained": time_events_drained,
    "events_back_to_back": time_events_back_to_back,
    "do_bench": time_do_bench,
    "cuda_graph": time_cuda_graph,
    "profiler": time_profiler,
}
WRONG = ("no_sync", "sync_in_loop", "events_drained")


def host_us(fn, n=100, warmup=10):
    """Host time of one call (median, 10th and 90th percentile, µs), on an idle GPU: the
    queue is drained before each call, so no call waits for the GPU."""
    import torch
    times = []
    for i in range(n + warmup):
        torch.cuda.synchronize()
        start = time.perf_counter_ns()
        fn()
        stop = time.perf_counter_ns()
        if i >= warmup:
            times.append((stop - start) / 1e3)
    torch.cuda.synchronize()
    times.sort()
    return {"median": statistics.median(times), "p10": times[len(times) // 10],
            "p90": times[(9 * len(times)) // 10]}


def main(argv=None) -> int:
    started = time.perf_counter()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("outdir")
    parser.add_argument("--presets", nargs="+", default=["decoder", "encoder"])
    parser.add_argument("--dtypes", nargs="+", default=["bf16"],
                        choices=["bf16", "fp16", "fp32"])
    parser.add_argument("--calls", type=int, default=50, help="calls per timed round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--budget-s", type=float, default=60.0,
                        help="start no new case after this many seconds (each case compiles "
                             "its kernel from an empty cache first: 10-20 s on the H200 host)")
    args = parser.parse_args(argv)

    # A fresh Triton cache, so that the first call really compiles (pitfall 0).
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="pitfalls-triton-cache-")
    require_gpu(SCRIPT)
    import torch
    import triton
    import triton.language as tl

    import source_kernels as sk
    from source_kernels.forward import FORWARD_PLAN, msda_forward, regime
    from source_kernels.inputs import preset_inputs
    from source_kernels.op import msda as msda_custom_op
    from source_kernels.reference import msda_grid_sample
    from source_kernels.validate import validate_inputs

    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    names = ("value", "value_spatial_shapes", "value_level_start_index",
             "sampling_locations", "attention_weights")
    payload = {
        "provenance": provenance(SCRIPT),
        "settings": {"calls_per_round": args.calls, "rounds": args.rounds,
                     "distribution": "uniform", "direction": "forward",
                     "do_bench_ms": DO_BENCH_MS, "budget_s": args.budget_s,
                     "triton_cache": "fresh (empty) at the start of the run"},
        "methods": {name: " ".join(fn.__doc__.split()) for name, fn in METHODS.items()},
        "wrong_methods": list(WRONG),
        "callables": {
            "op": "source_kernels.multi_scale_deformable_attn(...): validation, autograd "
                  "Function, kernel launch (what a model calls)",
            "launch": "source_kernels.forward.msda_forward(...): the kernel launch alone",
        },
        "first_call": [],
        "rows": [],
        "dispatch": [],
        "skipped": [],
    }

    seen_kernels = set()         # a first call compiles, unless an earlier case built that kernel
    for preset in args.presets:
        for dtype_name in args.dtypes:
            if time.perf_counter() - started > args.budget_s:
                payload["skipped"].append({"preset": preset, "dtype": dtype_name,
                                           "reason": f"time budget of {args.budget_s} s"})
                print(f"{preset} {dtype_name}: skipped (time budget)", flush=True)
                continue
            dtype = dtypes[dtype_name]
            inputs = preset_inputs(preset, dtype=dtype, device="cuda")
            ordered = [inputs[k] for k in names]
            callables = {"op": lambda: sk.multi_scale_deformable_attn(*ordered),
                         "launch": lambda: msda_forward(*ordered)}
            label = f"{preset} {dtype_name}"
            batch, queries, heads = ordered[3].shape[:3]
            planned = FORWARD_PLAN[(regime(batch, queries, heads),
                                    min(ordered[0].element_size(), 4))]
            kernel_name = "{} BLOCK_Q={} num_warps={}".format(*planned)

            # Pitfall 0: the first call compiles the kernel (fresh cache per dtype).
            torch.cuda.synchronize()
            start = time.perf_counter()
            callables["op"]()
            torch.cuda.synchronize()
            first = time.perf_counter() - start
            start = time.perf_counter()
            callables["op"]()
            torch.cuda.synchronize()
            second = time.perf_counter() - start
            payload["first_call"].append({"preset": preset, "dtype": dtype_name,
                                          "kernel": kernel_name,
                                          "first_call_ms": first * 1e3,
                                          "second_call_us": second * 1e6,
                                          "first_for_kernel": (kernel_name, dtype_name)
                                          not in seen_kernels})
            seen_kernels.add((kernel_name, dtype_name))
            print(f"{label}: first call {first * 1e3:.0f} ms, second {second * 1e6:.0f} µs",
                  flush=True)

            # The seven methods, interleaved over rounds so that drifts hit them all alike.
            for which, fn in callables.items():
                rounds = {name: [] for name in METHODS}
                for _ in range(args.rounds):
                    for name, method in METHODS.items():
                        rounds[name].append(method(fn, args.calls))
                for name, values in rounds.items():
                    payload["rows"].append({
                        "preset": preset, "distribution": "uniform", "dtype": dtype_name,
                        "callable": which, "method": name,
                        "us_per_call": statistics.median(values),
                        "rounds_us": values, "wrong": name in WRONG,
                    })
                    print(f"{label} {which:6s} {name:20s} {statistics.median(values):10.1f} µs",
                          flush=True)

            # Dispatch: the host time of one call, and of its parts.
            prepared = sk.op._prepare(*ordered)
            graded = {k: (t.detach().clone().requires_grad_() if t.is_floating_point() else t)
                      for k, t in inputs.items()}
            parts = {
                "validate_inputs": lambda: validate_inputs(*ordered),
                "msda_forward (launch only)": lambda: msda_forward(*prepared),
                "custom op torch.ops.source_kernels.msda": lambda: msda_custom_op(*prepared),
                "multi_scale_deformable_attn": lambda: sk.multi_scale_deformable_attn(*ordered),
                "multi_scale_deformable_attn, inputs requiring grad":
                    lambda: sk.multi_scale_deformable_attn(*(graded[k] for k in names)),
                "msda_grid_sample (pure PyTorch reference)":
                    lambda: msda_grid_sample(*ordered),
            }
            for what, fn in parts.items():
                stats = host_us(fn)
                payload["dispatch"].append({"preset": preset, "dtype": dtype_name,
                                            "what": what, "host_us": stats})
                print(f"{label} host {what:55s} {stats['median']:8.1f} µs", flush=True)

    # Two floors of dispatch, for scale: an empty Triton kernel and a tiny PyTorch op.
    @triton.jit
    def _empty_kernel(x_ptr, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(x_ptr + offs, tl.load(x_ptr + offs))

    tiny = torch.zeros(32, device="cuda")
    _empty_kernel[(1,)](tiny, BLOCK=32)
    for what, fn in {"empty Triton kernel launch": lambda: _empty_kernel[(1,)](tiny, BLOCK=32),
                     "tiny PyTorch op (x.add_(1) on 32 floats)": lambda: tiny.add_(1)}.items():
        stats = host_us(fn)
        payload["dispatch"].append({"preset": None, "dtype": "fp32", "what": what,
                                    "host_us": stats})
        print(f"host {what:55s} {stats['median']:8.1f} µs", flush=True)

    payload["elapsed_s"] = time.perf_counter() - started
    path = write_results(args.outdir, "pitfalls", payload)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
