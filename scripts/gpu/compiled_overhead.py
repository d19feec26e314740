"""Where the time of the operator under torch.compile goes, one call at a time, on a GPU.

    python3 scripts/gpu/compiled_overhead.py OUTDIR [--budget-s 50] [--smoke]

The op-level rows ``triton-compiled`` and ``triton-reduce-overhead`` of bench_h200.json hold
a few host-inclusive figures far above their device time (bf16 forward 126 us against
11 us).  This script separates what the operator costs from what one compiled call costs
whatever it computes, on the decoder preset (uniform locations), bf16 and fp32:

- ``launch_paths``: device time of the eager forward launched through the operator's bound
  launch and through Triton's own launch (``msda_forward``), alternated, to tell a change
  of launch path from noise;
- ``rows``: for the operator and for a stand-in of the same inputs and output (a sum of
  the three inputs in one or two fused kernels, its gradients likewise), compiled with
  ``mode="default"`` and ``mode="reduce-overhead"`` (fullgraph): forward and
  forward+backward, each with ``do_bench_us`` (host-inclusive: CUDA events, L2 flushed),
  ``back_to_back_us`` (wall time per call over calls queued back to back, one
  synchronisation at the end), ``device_us`` (profiler, L2 flushed), the kernels one call
  launches, and the number of graphs compiled before and after the timing (a recompile
  inside the timed loop would show there);
- ``host_profile``: cProfile of the compiled operator's forward+backward calls, the
  functions with the most time of their own per call.

When the stand-in costs as much host time per call as the operator, the host time is what
torch.compile's per-call machinery costs on this host (guards, the autograd wrappers, CUDA
graph trees), which a model pays once per graph rather than once per operator.
``--smoke`` runs the same code at toy sizes on the CPU (Triton's interpreter, the
``aot_eager`` backend, no timing worth reading).
"""
from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import sys
import time
import traceback
from pathlib import Path

from _provenance import provenance

DTYPES = ("bf16", "fp32")
MODES = ("default", "reduce-overhead")


def stand_in(value, spatial_shapes, level_start_index, sampling_locations, attention_weights,
             im2col_step=64):
    """A function of the operator's inputs with its output shape and gradients to all three
    floating inputs, a couple of fused kernels each way: the cost of a compiled call."""
    batch, queries, heads = attention_weights.shape[:3]
    per_head = (attention_weights.sum((-1, -2)) + sampling_locations.sum((-1, -2, -3)))
    out = per_head[..., None] + value[:, :queries]
    return out.reshape(batch, queries, heads * value.shape[-1])


def inputs(dtype, device, smoke):

    from source_kernels.inputs import make_inputs, preset_inputs
    if smoke:
        return make_inputs(1, 3, 2, 4, [[3, 4], [2, 2]], 2, dtype=dtype, device=device,
                           requires_grad=True)
    return preset_inputs("decoder", distribution="uniform", dtype=dtype, device=device,
                         requires_grad=True)


def calls(fn, args, mode, dtype):
    """(forward, forward_backward) closures of ``fn`` as bench.make_calls builds them;
    under reduce-overhead every call marks a step first and every input is static."""
    import torch

    from source_kernels.bench import make_calls
    if mode == "reduce-overhead":
        for tensor in args.values():
            torch._dynamo.mark_static_address(tensor)
    mark = (torch.compiler.cudagraph_mark_step_begin if mode == "reduce-overhead"
            else (lambda: None))

    def core(*a):
        mark()
        return fn(*a)

    return make_calls("triton", args, dtype, core=core)


def graphs_compiled():
    from torch._dynamo.utils import counters
    return int(counters["stats"].get("unique_graphs", 0))


def back_to_back_us(fn, calls_n, cuda):
    import torch
    fn()
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls_n):
        fn()
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls_n * 1e6


def kernels_of_one_call(fn):
    import torch
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [evt.name[:80] for evt in sorted(
        (e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
        key=lambda e: e.time_range.start)]


def measure_row(kind, mode, dtype_name, device, smoke):
    import torch

    from source_kernels import multi_scale_deformable_attn
    from source_kernels.bench import DTYPES as BENCH_DTYPES
    from source_kernels.bench import _profiled_device_us
    dtype = BENCH_DTYPES[dtype_name]
    cuda = device.type == "cuda"
    torch.compiler.reset()
    args = inputs(dtype, device, smoke)
    target = multi_scale_deformable_attn if kind == "operator" else stand_in
    backend = "aot_eager" if smoke else "inductor"
    compiled = torch.compile(target, mode=None if smoke else mode, fullgraph=True,
                             backend=backend)
    forward, forward_backward = calls(compiled, args, "default" if smoke else mode, dtype)
    rows = []
    for direction, fn in (("forward", forward), ("forward_backward", forward_backward)):
        start = time.perf_counter()
        for _ in range(1 if smoke else 3):           # compile, record, warm up
            fn()
        if cuda:
            torch.cuda.synchronize()
        row = {"kind": kind, "mode": mode, "dtype": dtype_name, "direction": direction,
               "warmup_s": time.perf_counter() - start, "graphs_before": graphs_compiled()}
        row["back_to_back_us"] = back_to_back_us(fn, 2 if smoke else 200, cuda)
        if cuda:
            import triton.testing
            flush = torch.empty(int(256e6 // 4), dtype=torch.int, device=device)
            row["do_bench_us"] = triton.testing.do_bench(fn, return_mode="median") * 1e3
            row["device_us"] = _profiled_device_us(fn, flush.zero_, 20)
            row["kernels_per_call"] = kernels_of_one_call(fn)
            del flush
        row["graphs_after"] = graphs_compiled()
        rows.append(row)
    return rows, (forward, forward_backward)


def host_profile(fn, calls_n):
    """The functions with the most time of their own over ``calls_n`` calls, per call."""
    profiler = cProfile.Profile()
    fn()
    profiler.enable()
    for _ in range(calls_n):
        fn()
    profiler.disable()
    stats = pstats.Stats(profiler)
    top = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:15]
    return [{"function": f"{Path(file).name}:{line}({name})",
             "own_us_per_call": own / calls_n * 1e6, "calls_per_call": count / calls_n,
             "cumulative_us_per_call": cumulative / calls_n * 1e6}
            for (file, line, name), (_, count, own, cumulative, _) in top]


def launch_paths(dtype_name, device, rounds=3):
    """Device time of the eager forward: the operator's bound launch against Triton's
    launch of the same plan, alternated ``rounds`` times."""
    import torch

    from source_kernels import multi_scale_deformable_attn
    from source_kernels.bench import ARG_NAMES, _profiled_device_us
    from source_kernels.bench import DTYPES as BENCH_DTYPES
    from source_kernels.forward import msda_forward
    args = inputs(BENCH_DTYPES[dtype_name], device, False)
    pos = [args[k].detach() for k in ARG_NAMES]
    flush = torch.empty(int(256e6 // 4), dtype=torch.int, device=device)
    found = {"bound_launch_us": [], "triton_launch_us": []}
    with torch.no_grad():
        for _ in range(rounds):
            found["bound_launch_us"].append(_profiled_device_us(
                lambda: multi_scale_deformable_attn(*pos), flush.zero_, 30))
            found["triton_launch_us"].append(_profiled_device_us(
                lambda: msda_forward(*pos), flush.zero_, 30))
    return {"dtype": dtype_name, **found,
            "median_bound_us": statistics.median(found["bound_launch_us"]),
            "median_triton_us": statistics.median(found["triton_launch_us"])}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("outdir")
    parser.add_argument("--budget-s", type=float, default=50.0)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    import source_kernels  # noqa: F401  (the interpreter switch, first)
    import torch
    if args.smoke:
        device, stem = torch.device("cpu"), "compiled_overhead_smoke"
        prov = {"gpu": "none (smoke run in Triton's interpreter)", "torch": torch.__version__}
    else:
        if not torch.cuda.is_available():
            print("compiled_overhead.py needs a CUDA GPU (--smoke runs the code on the CPU)",
                  file=sys.stderr)
            return 2
        device, stem = torch.device("cuda"), "compiled_overhead_h200"
        prov = provenance("compiled_overhead.py")
    started = time.time()
    out = Path(args.outdir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{stem}.json"
    payload = {"provenance": prov, "preset": "decoder", "distribution": "uniform",
               "method": "do_bench_us: triton.testing.do_bench median (CUDA events, L2 "
                         "flushed); back_to_back_us: wall clock over 200 calls queued back to "
                         "back, one synchronisation; device_us: profiler's kernel sum per "
                         "call, L2 flushed, median of 20",
               "launch_paths": [], "rows": [], "host_profile": {}, "errors": []}

    def save():
        path.write_text(json.dumps(payload, indent=1) + "\n")

    if not args.smoke:
        for dtype_name in DTYPES:
            payload["launch_paths"].append(launch_paths(dtype_name, device))
            print(payload["launch_paths"][-1], flush=True)
        save()
    # Most telling first, the two dtypes next to each other (bench_h200.json measured all
    # bf16 rows first, right after the process's first compile: an order effect and a
    # dtype effect look alike there).  One compile first, untimed, so that no row pays
    # for starting the compiler.
    plan = [("operator", "default", "bf16"), ("operator", "default", "fp32"),
            ("stand-in", "default", "bf16"), ("operator", "reduce-overhead", "bf16"),
            ("stand-in", "reduce-overhead", "bf16"), ("operator", "reduce-overhead", "fp32"),
            ("stand-in", "default", "fp32"), ("stand-in", "reduce-overhead", "fp32")]
    if args.smoke:
        plan = [("operator", "default", "fp32"), ("stand-in", "default", "fp32")]
    else:
        start = time.perf_counter()
        warm = torch.compile(stand_in, fullgraph=True)
        for _, fn in zip(range(2), calls(warm, inputs(torch.float32, device, False),
                                         "default", torch.float32)):
            fn()
        torch.cuda.synchronize()
        payload["first_compile_s"] = time.perf_counter() - start
        torch.compiler.reset()
    for kind, mode, dtype_name in plan:
        if time.time() - started > args.budget_s:
            payload["stopped_by_budget"] = True
            break
        try:
            rows, (_, forward_backward) = measure_row(kind, mode, dtype_name, device,
                                                      args.smoke)
            payload["rows"] += rows
            for row in rows:
                print({k: (round(v, 1) if isinstance(v, float) else v)
                       for k, v in row.items() if k != "kernels_per_call"}, flush=True)
            if kind == "operator":
                key = f"{mode}/{dtype_name}/forward_backward"
                payload["host_profile"][key] = host_profile(forward_backward,
                                                            2 if args.smoke else 100)
        except Exception as exc:                                     # noqa: BLE001
            payload["errors"].append({"case": [kind, mode, dtype_name],
                                      "error": f"{type(exc).__name__}: {str(exc)[:800]}",
                                      "traceback": traceback.format_exc()[-2000:]})
            print("ERROR", kind, mode, dtype_name, str(exc)[:300], flush=True)
        torch.compiler.reset()
        save()
    save()
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
