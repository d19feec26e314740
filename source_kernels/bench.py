"""The benchmark harness: times the operator and the grid_sample reference on a GPU and
writes one results file with its provenance.

    python -m source_kernels.bench --out results/bench_h200.json

For every preset (decoder, encoder, decoder-b32), location distribution (uniform, local)
and dtype (fp32, fp16, bf16) it records, for forward and forward+backward:
- ``kernel_us``: ``triton.testing.do_bench`` median with L2 flushed before every run;
- ``graph_us``: the same call captured in a CUDA graph and replayed (no launch overhead);
- ``device_us``: the profiler's device time of the call's kernels (cross-check);
- ``dispatch_us``: host time of one eager call (forward only);
- ``peak_mem_bytes``: peak allocated memory of one call, with ``io_bytes`` (inputs, outputs
  and gradients) beside it;
- ``floor_us``: the DRAM floor from the bytes the inputs really touch at the measured copy
  bandwidth, and ``rows_per_s``: bilinear corner rows gathered per second.
``--sweep`` adds the launch-configuration sweeps (forward and backward) to the file.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time

import torch

from .inputs import PRESETS, preset_inputs

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
ARG_NAMES = ("value", "value_spatial_shapes", "value_level_start_index", "sampling_locations",
             "attention_weights")


# Measurement effort; --fast lowers it (fewer repetitions, same method).
FAST = {"do_bench": {}, "profile_reps": 20, "dispatch_batches": 7}


def provenance(argv) -> dict:
    import triton
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        smi = ""
    props = torch.cuda.get_device_properties(0)
    return {
        "gpu": torch.cuda.get_device_name(0),
        "nvidia_smi": smi,
        "sm_count": props.multi_processor_count,
        "capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python -m source_kernels.bench " + " ".join(shlex.quote(a) for a in argv),
    }


def copy_bandwidth(nbytes=4 * 2 ** 30) -> float:
    """Device-to-device copy bandwidth in bytes/s (bytes read plus written)."""
    import triton.testing
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), return_mode="median")
    del src, dst
    return nbytes / (ms * 1e-3)


# ------------------------------------------------------------------------- byte counting

def corner_index(args):
    """(B*Q*M, L*4*K) int64 rows of value viewed as (B*S*M, D): every corner the forward
    reads, grouped by (batch, query, head), -1 where a corner lies outside its map."""
    value = args["value"]
    batch, total, heads, _ = value.shape
    loc = args["sampling_locations"].float()
    queries, levels, points = loc.shape[1], loc.shape[3], loc.shape[4]
    b_idx = torch.arange(batch, device=value.device).view(batch, 1, 1, 1)
    m_idx = torch.arange(heads, device=value.device).view(1, 1, heads, 1)
    columns = []
    for lvl, ((height, width), start) in enumerate(zip(args["value_spatial_shapes"].tolist(),
                                                       args["value_level_start_index"].tolist())):
        x0 = (loc[:, :, :, lvl, :, 0] * width - 0.5).floor().long()
        y0 = (loc[:, :, :, lvl, :, 1] * height - 0.5).floor().long()
        for dy in (0, 1):
            for dx in (0, 1):
                xi, yi = x0 + dx, y0 + dy
                inside = (xi >= 0) & (xi < width) & (yi >= 0) & (yi < height)
                row = (b_idx * total + start + yi * width + xi) * heads + m_idx
                columns.append(torch.where(inside, row, torch.full_like(row, -1)))
    # each column (B, Q, M, K) -> (B, Q, M, L*4*K)
    index = torch.cat(columns, dim=-1)
    return index.reshape(batch * queries * heads, levels * 4 * points)


def corner_rows(args):
    """Flat indices (into B*S*M rows of D channels) of every in-map corner the forward reads,
    and the total number of corner reads (in-map or not)."""
    index = corner_index(args)
    return index[index >= 0], index.numel()


def traffic_bytes(args):
    """Bytes a forward and a forward+backward must move at least (each touched value row
    once; parameters and outputs once; the backward adds grad_out, all of grad_value,
    grad_loc and grad_attn)."""
    value = args["value"]
    item = value.element_size()
    row_bytes = value.shape[-1] * item
    rows, gathers = corner_rows(args)
    touched = int(torch.unique(rows).numel())
    params = (args["sampling_locations"].numel() + args["attention_weights"].numel()) * item
    batch, queries = args["sampling_locations"].shape[:2]
    out = batch * queries * value.shape[2] * value.shape[3] * item
    forward = touched * row_bytes + params + out
    backward = forward + out + value.numel() * item + params
    return {"forward": forward, "forward_backward": backward, "touched_rows": touched,
            "gathered_rows": gathers, "io_bytes": value.numel() * item * 2 + params * 2 + out * 2}


# ------------------------------------------------------------------------- timing

def _profiled_device_us(fn, flush, reps=20):
    """Median device time per call of the CUDA kernels fn launches, L2 flushed before each
    call, from the profiler's kernel records (the flush kernel itself excluded).  Unlike an
    event-timed loop this leaves out the gaps where the GPU waits for the host, which on a
    host with a slow CPU exceed a decoder-sized kernel's run time."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            flush()
            fn()
        torch.cuda.synchronize()
    kernels = sorted((evt for evt in prof.events()
                      if evt.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda evt: evt.time_range.start)
    per_call = []
    for evt in kernels:
        if "FillFunctor<int>" in evt.name:          # the L2 flush opens each call
            per_call.append(0.0)
        elif per_call:
            per_call[-1] += getattr(evt, "device_time", None) or evt.cuda_time
    return statistics.median(per_call) if per_call else float("nan")


def _graph_us(fn, flush):
    import triton.testing
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    ms = triton.testing.do_bench(graph.replay, return_mode="median", **FAST["do_bench"])
    del graph
    return ms * 1e3


def _try(measure_fn, *args):
    """A measurement that may be impossible for some calls (e.g. capture of a reference that
    synchronises): None instead of an exception."""
    try:
        return measure_fn(*args)
    except Exception:                      # noqa: BLE001
        torch.cuda.synchronize()
        return None


def _dispatch_us(fn, calls=50, batches=7):
    """Host time of one eager call: calls are enqueued back to back without waiting (the
    queue never fills with this few), median over batches."""
    fn()
    torch.cuda.synchronize()
    per_call = []
    for _ in range(batches):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        per_call.append((time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(per_call)


def make_calls(impl, args, dtype):
    from . import multi_scale_deformable_attn
    from .reference import msda_grid_sample
    core = multi_scale_deformable_attn if impl == "triton" else msda_grid_sample
    positional = [args[k] for k in ARG_NAMES]
    grad = torch.randn(positional[0].shape[0], positional[3].shape[1],
                       positional[0].shape[2] * positional[0].shape[3],
                       device="cuda", dtype=dtype)
    leaves = [positional[0], positional[3], positional[4]]

    def forward():
        with torch.no_grad():
            return core(*positional)

    def forward_backward():
        for t in leaves:
            t.grad = None
        out = core(*positional)
        out.backward(grad)

    return forward, forward_backward


def measure(preset, distribution, dtype_name, impl, bandwidth, progress):
    import triton.testing
    dtype = DTYPES[dtype_name]
    args = preset_inputs(preset, distribution=distribution, dtype=dtype, device="cuda",
                         requires_grad=True)
    traffic = traffic_bytes(args)
    forward, forward_backward = make_calls(impl, args, dtype)
    flush_buffer = torch.empty(int(256e6 // 4), dtype=torch.int, device="cuda")
    rows = []
    for direction, fn in (("forward", forward), ("forward_backward", forward_backward)):
        progress(f"{preset:<12} {distribution:<8} {dtype_name:<5} {impl:<12} {direction}")
        fn()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        kernel_ms = triton.testing.do_bench(fn, return_mode="median", **FAST["do_bench"])
        row = {
            "preset": preset, "distribution": distribution, "dtype": dtype_name,
            "impl": impl, "direction": direction,
            "kernel_us": kernel_ms * 1e3,
            "graph_us": _try(_graph_us, fn, flush_buffer.zero_) if impl == "triton" else None,
            "device_us": _profiled_device_us(fn, flush_buffer.zero_, FAST["profile_reps"]),
            "dispatch_us": _dispatch_us(fn, batches=FAST["dispatch_batches"])
            if direction == "forward" else None,
            "peak_mem_bytes": peak,
            "peak_over_base_bytes": peak - base,
            "io_bytes": traffic["io_bytes"],
            "floor_bytes": traffic[direction],
            "floor_us": traffic[direction] / bandwidth * 1e6,
            "touched_rows": traffic["touched_rows"],
            "gathered_rows": traffic["gathered_rows"],
        }
        row["rows_per_s"] = traffic["gathered_rows"] / (row["kernel_us"] * 1e-6)
        row["floor_ratio"] = row["kernel_us"] / row["floor_us"]
        rows.append(row)
        progress(f"    kernel {row['kernel_us']:9.1f} us  graph {row['graph_us'] or 0:9.1f} us  "
                 f"device {row['device_us']:9.1f} us  floor {row['floor_us']:7.1f} us  "
                 f"peak {peak / 2**30:6.2f} GiB")
    del args, flush_buffer
    torch.cuda.empty_cache()
    return rows


# (kernel, BLOCK_Q, num_warps) candidates of the launch-configuration sweep.
# More warps for one block of queries means fewer channels per thread and more loads in
# flight per SM: the lever for the latency-bound decoder.
FORWARD_SWEEP = [("loop", 8, 1), ("loop", 8, 2), ("loop", 16, 2), ("loop", 16, 4),
                 ("loop", 32, 4), ("loop", 32, 8), ("loop", 64, 8),
                 ("tiled", 1, 1), ("tiled", 1, 2), ("tiled", 2, 2), ("tiled", 2, 4)]
BACKWARD_SWEEP = [("loop", 8, 2), ("loop", 16, 2), ("loop", 16, 4), ("loop", 32, 4),
                  ("loop", 32, 8), ("tiled", 1, 1), ("tiled", 1, 2), ("tiled", 2, 2),
                  ("tiled", 2, 4), ("tiled", 4, 8)]
# Which preset stands for which regime of the plan (source_kernels.forward.regime).
REGIME_PRESET = {"small": "decoder", "large": "encoder"}


def sweep(progress, presets=("decoder", "encoder"), distributions=("uniform",),
          dtypes=("bf16", "fp32"), on_row=lambda rows: None):
    """Launch-configuration sweep of both kernels (loop, tiled) forward and backward; each
    timing is the profiler's median device time with L2 flushed (``_profiled_device_us``),
    beside the do_bench median.  Returns the rows; ``on_row(rows)`` sees them after each
    new one (so a run cut short by a time limit still leaves its rows in the file)."""
    import triton.testing

    from .backward import msda_backward
    from .forward import msda_forward
    results = []
    for preset in presets:
        for distribution in distributions:
            for dtype_name in dtypes:
                args = preset_inputs(preset, distribution=distribution,
                                     dtype=DTYPES[dtype_name], device="cuda")
                pos = [args[k] for k in ARG_NAMES]
                flush_buffer = torch.empty(int(256e6 // 4), dtype=torch.int, device="cuda")
                grad = torch.randn(pos[0].shape[0], pos[3].shape[1],
                                   pos[0].shape[2] * pos[0].shape[3], device="cuda",
                                   dtype=pos[0].dtype)
                for direction, configs in (("forward", FORWARD_SWEEP),
                                           ("backward", BACKWARD_SWEEP)):
                    for kernel, block_q, warps in configs:
                        if direction == "forward":
                            def call(kernel=kernel, block_q=block_q, warps=warps):
                                return msda_forward(*pos, kernel=kernel, block_q=block_q,
                                                    num_warps=warps)
                        else:
                            def call(kernel=kernel, block_q=block_q, warps=warps):
                                return msda_backward(grad, *pos, kernel=kernel,
                                                     block_q=block_q, num_warps=warps)
                        try:
                            us = _profiled_device_us(call, flush_buffer.zero_, 15)
                            bench_us = triton.testing.do_bench(call, warmup=5, rep=25,
                                                               return_mode="median") * 1e3
                        except Exception as error:           # noqa: BLE001
                            progress(f"  sweep {direction} {kernel} q{block_q} w{warps}: "
                                     f"FAILED {type(error).__name__}: {error}")
                            continue
                        results.append({"kernel": direction, "variant": kernel,
                                        "preset": preset, "distribution": distribution,
                                        "dtype": dtype_name, "block_q": block_q,
                                        "num_warps": warps, "us": us,
                                        "do_bench_us": bench_us})
                        on_row(results)
                        progress(f"  sweep {direction:<8} {preset:<8} {distribution:<8} "
                                 f"{dtype_name} {kernel:<5} q{block_q:<3} w{warps}: "
                                 f"{us:9.1f} us device ({bench_us:7.1f} do_bench)")
                del args, pos, grad, flush_buffer
                torch.cuda.empty_cache()
    return results


def plan_from_sweep(rows):
    """The fastest (kernel, BLOCK_Q, num_warps) per direction, regime and element size:
    the plan that source_kernels.forward.FORWARD_PLAN / backward.BACKWARD_PLAN ship."""
    plan = {"forward": {}, "backward": {}}
    for direction in plan:
        for regime, preset in REGIME_PRESET.items():
            for dtype_name, size in (("bf16", 2), ("fp32", 4)):
                candidates = [r for r in rows if r["kernel"] == direction and
                              r["preset"] == preset and r["dtype"] == dtype_name]
                if candidates:
                    best = min(candidates, key=lambda r: r["us"])
                    plan[direction][f"{regime},{size}"] = [best["variant"], best["block_q"],
                                                          best["num_warps"]]
    return plan


def apply_plan(plan):
    from . import backward, forward
    for direction, table in (("forward", forward.FORWARD_PLAN),
                             ("backward", backward.BACKWARD_PLAN)):
        for key, value in plan.get(direction, {}).items():
            regime, size = key.split(",")
            table[(regime, int(size))] = tuple(value)


def write_plan(results_path):
    """Rewrite FORWARD_PLAN / BACKWARD_PLAN in forward.py and backward.py with the plan a
    benchmark run chose (its "plan" entry), so the shipped code is the measured code."""
    import re
    with open(results_path) as handle:
        plan = json.load(handle)["plan"]
    here = os.path.dirname(os.path.abspath(__file__))
    for direction, filename, name in (("forward", "forward.py", "FORWARD_PLAN"),
                                      ("backward", "backward.py", "BACKWARD_PLAN")):
        path = os.path.join(here, filename)
        with open(path) as handle:
            source = handle.read()
        entries = []
        for key in ("small,2", "small,4", "large,2", "large,4"):
            regime, size = key.split(",")
            kernel, block_q, warps = plan[direction][key]
            entries.append(f'("{regime}", {size}): ("{kernel}", {block_q}, {warps})')
        literal = (f"{name} = {{\n    {entries[0]}, {entries[1]},\n    {entries[2]}, "
                   f"{entries[3]},\n}}")
        source, count = re.subn(name + r" = \{[^}]*\}", literal, source, count=1)
        if count != 1:
            raise RuntimeError(f"{name} not found in {path}")
        with open(path, "w") as handle:
            handle.write(source)
        print(f"{path}: {literal}")


def dispatch_breakdown(progress):
    """Host time of the pieces of one eager forward call on the decoder preset (bf16)."""
    from . import multi_scale_deformable_attn
    from .forward import msda_forward
    from .op import _prepare
    from .validate import validate_inputs
    from . import launch
    args = preset_inputs("decoder", dtype=torch.bfloat16, device="cuda")
    pos = [args[k] for k in ARG_NAMES]
    prepared = _prepare(*pos)

    def ordinary_launch():
        # Triton's own kernel[grid](...) path, as taken when a launch hook is set.
        hooks_active = launch._hooks_active
        launch._hooks_active = lambda: True
        try:
            msda_forward(*prepared)
        finally:
            launch._hooks_active = hooks_active

    pieces = {
        "validate_inputs": lambda: validate_inputs(*pos),
        "kernel launch (msda_forward)": lambda: msda_forward(*prepared),
        "kernel launch through Triton's kernel[grid] (msda_forward)": ordinary_launch,
        "whole eager call (multi_scale_deformable_attn)":
            lambda: multi_scale_deformable_attn(*pos),
        "one torch op (torch.empty_like)": lambda: torch.empty_like(pos[0]),
    }
    result = {name: _dispatch_us(fn) for name, fn in pieces.items()}
    for name, us in result.items():
        progress(f"  dispatch {name}: {us:.1f} us")
    return result


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description="Time the MSDA operator on a GPU.")
    parser.add_argument("--out", default="results/bench_h200.json")
    parser.add_argument("--presets", nargs="+", default=list(PRESETS))
    parser.add_argument("--distributions", nargs="+", default=["uniform", "local"])
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES))
    parser.add_argument("--impls", nargs="+", default=["triton", "grid_sample"])
    parser.add_argument("--sweep", action="store_true", help="add the launch-config sweeps")
    parser.add_argument("--no-bench", action="store_true", help="only the sweeps")
    parser.add_argument("--fast", action="store_true",
                        help="fewer repetitions per figure (same method): for a short GPU lease")
    parser.add_argument("--write-plan", metavar="RESULTS_JSON",
                        help="write the plan of a results file into the kernel modules, exit")
    parser.add_argument("--sweep-presets", nargs="+", default=["decoder", "encoder"])
    parser.add_argument("--sweep-dtypes", nargs="+", default=["bf16", "fp32"])
    parser.add_argument("--sweep-distributions", nargs="+", default=["uniform"])
    args = parser.parse_args(argv)
    if args.write_plan:
        write_plan(args.write_plan)
        return 0
    if args.fast:
        FAST.update({"do_bench": {"warmup": 10, "rep": 40}, "profile_reps": 5,
                     "dispatch_batches": 3})
    if not torch.cuda.is_available():
        print("source_kernels.bench needs a CUDA GPU; none is visible.", file=sys.stderr)
        return 2
    started = time.time()
    todo = (0 if args.no_bench else len(args.presets) * len(args.distributions) *
            len(args.dtypes) * len(args.impls))
    done = [0]

    def progress(message):
        if not message.startswith(" "):
            done[0] += 1
        elapsed = time.time() - started
        print(f"[{elapsed:7.1f}s {min(done[0], 2 * todo) if todo else 0:>3}/{2 * todo}] {message}",
              flush=True)

    result = {"provenance": provenance(argv)}
    result["provenance"]["copy_bandwidth_Bps"] = bandwidth = copy_bandwidth()
    progress(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s")
    if args.sweep:
        result["sweep"] = sweep(progress, args.sweep_presets, args.sweep_distributions,
                                args.sweep_dtypes,
                                on_row=lambda rows: _write(args.out, dict(result, sweep=rows)))
        result["plan"] = plan_from_sweep(result["sweep"])
        apply_plan(result["plan"])
        progress(f"plan from the sweep: {json.dumps(result['plan'])}")
        _write(args.out, result)
    from . import backward, forward
    result["plan_used"] = {
        "forward": {f"{r},{s}": list(v) for (r, s), v in forward.FORWARD_PLAN.items()},
        "backward": {f"{r},{s}": list(v) for (r, s), v in backward.BACKWARD_PLAN.items()}}
    result["dispatch_breakdown_us"] = dispatch_breakdown(progress)
    rows = []
    if not args.no_bench:
        for preset in args.presets:
            for distribution in args.distributions:
                for dtype_name in args.dtypes:
                    for impl in args.impls:
                        try:
                            rows += measure(preset, distribution, dtype_name, impl, bandwidth,
                                            progress)
                        except Exception as error:          # record and go on
                            progress(f"    FAILED: {type(error).__name__}: {error}")
                            rows.append({"preset": preset, "distribution": distribution,
                                         "dtype": dtype_name, "impl": impl,
                                         "error": f"{type(error).__name__}: {error}"})
                            torch.cuda.empty_cache()
                        _write(args.out, dict(result, rows=rows))
    result["rows"] = rows
    _write(args.out, result)
    print(f"wrote {args.out} in {time.time() - started:.0f} s")
    return 0


def _write(path, data):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w") as handle:
        json.dump(data, handle, indent=1)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    sys.exit(main())
