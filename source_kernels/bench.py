"""The benchmark harness: times the operator and the grid_sample reference on a GPU and
writes one results file with its provenance.

    python -m source_kernels.bench --out results/bench_h200.json

For every preset (decoder, encoder, decoder-b32), location distribution (uniform, local)
and dtype (fp32, fp16, bf16) it records, for forward and forward+backward:
- ``kernel_us``: ``triton.testing.do_bench`` median with L2 flushed before every run;
- ``graph_us``: the same call captured in a CUDA graph and replayed (no launch overhead);
- ``device_us``: the profiler's device time of the call's kernels (cross-check);
- ``dispatch_us``: host time of one eager call (forward, and forward+backward);
- ``peak_mem_bytes``: peak allocated memory of one call, with ``io_bytes`` (inputs, outputs
  and gradients) beside it;
- ``floor_us``: the DRAM floor from the bytes the inputs really touch at the measured copy
  bandwidth, and ``rows_per_s``: bilinear corner rows gathered per second.
``--compile`` adds, for every case, rows of the operator under ``torch.compile``
(impl ``triton-compiled`` and ``triton-reduce-overhead``: do_bench, device time and host time
per call of the compiled function, and its compile time).  ``--peer MODULE:FUNCTION`` (any
installed implementation with mmcv's signature, a function or an autograd Function) adds
its rows, timed by the same methods in the same run (impl ``peer:MODULE:FUNCTION``).
``--sweep`` adds the launch-configuration sweeps (forward and backward) to the file: each
candidate is checked against the fp64 loop kernel first, and the plan is chosen among the
correct ones.  ``--budget-s`` stops new measurements after that many seconds (the file keeps
what was measured).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time

import torch

from .inputs import PRESETS, preset_inputs

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
          "fp64": torch.float64}
ARG_NAMES = ("value", "value_spatial_shapes", "value_level_start_index", "sampling_locations",
             "attention_weights")


# Measurement effort; --fast lowers it (fewer repetitions, same method).
FAST = {"do_bench": {}, "profile_reps": 20, "dispatch_batches": 7}
DEADLINE = {"at": float("inf")}          # time.time() after which no new measurement starts


def out_of_time() -> bool:
    return time.time() > DEADLINE["at"]


def _portable_arg(arg: str) -> str:
    """An argument as a results file records it: a path of this machine outside the working
    folder becomes OUTDIR/<name> (the file names stay, the machine's folders do not)."""
    if not arg.startswith("/"):
        return arg
    here = os.getcwd().rstrip("/") + "/"
    return arg[len(here):] if arg.startswith(here) else "OUTDIR/" + os.path.basename(arg)


def provenance(argv) -> dict:
    """The course's provenance block (source_kernels.provenance), with nvidia-smi's line for
    the GPU (name, driver, memory) beside it."""
    from .provenance import provenance as block

    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        smi = ""
    command = "python -m source_kernels.bench " + " ".join(
        shlex.quote(_portable_arg(a)) for a in argv)
    return {**block(command), "nvidia_smi": smi}


def copy_bandwidth(nbytes=4 * 2 ** 30) -> float:
    """Device-to-device copy bandwidth in bytes/s (bytes read plus written)."""
    import triton.testing
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), return_mode="median")  # noqa: F821  (a false alarm: the lambda runs before the del)
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


def load_peer(spec: str):
    """The callable named by MODULE:FUNCTION, called with mmcv's six arguments (value,
    value_spatial_shapes, value_level_start_index, sampling_locations, attention_weights,
    im2col_step); an autograd Function is called through its ``apply``."""
    import importlib
    module_name, _, name = spec.partition(":")
    if not name:
        raise ValueError(f"--peer takes MODULE:FUNCTION, got {spec!r}")
    target = importlib.import_module(module_name)
    for part in name.split("."):
        target = getattr(target, part)
    return target.apply if hasattr(target, "apply") else target


def core_of(impl: str):
    """The function an impl name stands for: the operator, the grid_sample reference, a
    peer (``peer:MODULE:FUNCTION``) or the operator under torch.compile."""
    from . import multi_scale_deformable_attn
    from .reference import msda_grid_sample
    if impl == "triton":
        return multi_scale_deformable_attn
    if impl == "grid_sample":
        return lambda *a: msda_grid_sample(*a[:5])
    if impl.startswith("peer:"):
        return load_peer(impl[len("peer:"):])
    raise ValueError(f"unknown impl {impl!r}")


def make_calls(impl, args, dtype, core=None):
    core = core or core_of(impl)
    positional = [args[k] for k in ARG_NAMES] + [64]
    grad = torch.randn(positional[0].shape[0], positional[3].shape[1],
                       positional[0].shape[2] * positional[0].shape[3],
                       device=positional[0].device, dtype=dtype)
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


COMPILED = {"triton-compiled": "default", "triton-reduce-overhead": "reduce-overhead"}


def compiled_calls(mode, args, dtype):
    """(forward, forward_backward, compile seconds of each) of the operator under
    torch.compile(mode, fullgraph=True).  Under "reduce-overhead" each call marks a new
    step first, as a training loop does, so that outputs of earlier replays may be freed,
    and the inputs are marked static (they live across calls, as a model's tensors do), so
    that the CUDA graphs read them in place instead of copying them in before each replay."""
    from . import multi_scale_deformable_attn
    torch.compiler.reset()
    if mode == "reduce-overhead":
        for tensor in args.values():
            torch._dynamo.mark_static_address(tensor)
    compiled = torch.compile(multi_scale_deformable_attn, mode=mode, fullgraph=True)
    mark = (torch.compiler.cudagraph_mark_step_begin if mode == "reduce-overhead"
            else lambda: None)

    def core(*a):
        mark()
        return compiled(*a)

    forward, forward_backward = make_calls("triton", args, dtype, core=core)
    seconds = {}
    for name, fn in (("forward", forward), ("forward_backward", forward_backward)):
        start = time.perf_counter()
        for _ in range(3):                     # compile, then the CUDA graph's warm-up runs
            fn()
        torch.cuda.synchronize()
        seconds[name] = time.perf_counter() - start
    return forward, forward_backward, seconds


def measure(preset, distribution, dtype_name, impl, bandwidth, progress):
    import triton.testing
    dtype = DTYPES[dtype_name]
    args = preset_inputs(preset, distribution=distribution, dtype=dtype, device="cuda",
                         requires_grad=True)
    traffic = traffic_bytes(args)
    compile_s = {}
    if impl in COMPILED:
        forward, forward_backward, compile_s = compiled_calls(COMPILED[impl], args, dtype)
    else:
        forward, forward_backward = make_calls(impl, args, dtype)
    flush_buffer = torch.empty(int(256e6 // 4), dtype=torch.int, device="cuda")
    rows = []
    for direction, fn in (("forward", forward), ("forward_backward", forward_backward)):
        if out_of_time():
            break
        progress(f"{preset:<12} {distribution:<8} {dtype_name:<5} {impl:<12} {direction}")
        fn()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        kernel_ms = triton.testing.do_bench(fn, return_mode="median", **FAST["do_bench"])
        capturable = impl == "triton" or impl.startswith("peer:")
        row = {
            "preset": preset, "distribution": distribution, "dtype": dtype_name,
            "impl": impl, "direction": direction,
            "kernel_us": kernel_ms * 1e3,
            "host_inclusive_us": kernel_ms * 1e3,
            "graph_us": _try(_graph_us, fn, flush_buffer.zero_) if capturable else None,
            "device_us": _profiled_device_us(fn, flush_buffer.zero_, FAST["profile_reps"]),
            "dispatch_us": _dispatch_us(fn, calls=50 if kernel_ms < 1 else 5,
                                        batches=FAST["dispatch_batches"]),
            "peak_mem_bytes": peak,
            "peak_over_base_bytes": peak - base,
            "io_bytes": traffic["io_bytes"],
            "floor_bytes": traffic[direction],
            "floor_us": traffic[direction] / bandwidth * 1e6,
            "touched_rows": traffic["touched_rows"],
            "gathered_rows": traffic["gathered_rows"],
        }
        if compile_s:
            row["compile_s"] = compile_s[direction]
        row["rows_per_s"] = traffic["gathered_rows"] / (row["kernel_us"] * 1e-6)
        row["floor_ratio"] = row["kernel_us"] / row["floor_us"]
        rows.append(row)
        progress(f"    do_bench {row['kernel_us']:9.1f} us  graph {row['graph_us'] or 0:9.1f} us"
                 f"  device {row['device_us']:9.1f} us  dispatch {row['dispatch_us']:7.1f} us"
                 f"  floor {row['floor_us']:7.1f} us  peak {peak / 2**30:6.2f} GiB")
    del args, flush_buffer
    torch.compiler.reset()
    torch.cuda.empty_cache()
    return rows


# (kernel, BLOCK_Q, num_warps) candidates of the launch-configuration sweep, per regime of
# the plan (source_kernels.forward.regime); for "rows" kernels BLOCK_Q counts rows of the flat
# (batch, query, head) axis, so 8 rows are one query with all of its 8 heads.
#  - small and medium problems (decoder, decoder-b32) are bound by latency and by the launch
#    of thousands of one-warp programs: fewer, fuller programs (rows), the locations and
#    weights of the next block requested before the current block's gathers (persistent);
#  - large ones (encoder) by the rate of corner gathers: fewer instructions per corner
#    (int32 offsets in the rows kernels), fewer registers (one level or one sample a step)
#    for more programs per SM, head-major rows so that a block's queries share corners.
SWEEP_CANDIDATES = {
    ("forward", "small"): [
        ("tiled", 1, 1), ("tiled", 1, 2), ("loop", 16, 2), ("rows", 2, 1), ("rows", 4, 2),
        ("rows", 4, 4), ("rows", 8, 4), ("rows", 8, 8), ("rows", 16, 8), ("rows-level", 8, 4),
        ("rows-persistent", 8, 4), ("rows-persistent", 16, 8)],
    ("forward", "large"): [
        ("loop", 16, 2), ("loop", 16, 4), ("loop", 32, 4), ("rows-sample-hm", 16, 2),
        ("rows-sample-hm", 32, 4), ("rows-level-hm", 8, 4), ("rows-level-hm", 16, 4),
        ("rows-level", 8, 4), ("rows", 4, 4), ("rows-level-hm", 32, 8)],
    ("backward", "small"): [
        ("tiled", 1, 2), ("tiled", 1, 1), ("loop", 8, 2), ("rows", 2, 1), ("rows", 4, 2),
        ("rows", 4, 4), ("rows", 8, 4), ("rows", 8, 8), ("rows", 16, 8), ("rows-level", 8, 4)],
    ("backward", "large"): [
        ("tiled", 1, 1), ("tiled", 1, 2), ("rows", 2, 2), ("rows", 4, 4),
        ("rows-level-hm", 8, 4), ("rows-level-hm", 16, 4), ("rows-sample-hm", 16, 4)],
}
# fp64 (the CUDA op's gradcheck dtype): the present plan's kernels and a few rows ones.
SWEEP_CANDIDATES_FP64 = {
    ("forward", "small"): [("tiled", 1, 1), ("loop", 16, 4), ("rows", 4, 4), ("rows", 8, 8)],
    ("forward", "large"): [("loop", 16, 4), ("loop", 8, 4), ("rows-level-hm", 8, 4),
                           ("rows-sample-hm", 16, 4)],
    ("backward", "small"): [("loop", 8, 2), ("tiled", 1, 2), ("rows", 4, 4), ("rows", 8, 8)],
    ("backward", "large"): [("tiled", 1, 2), ("loop", 8, 2), ("rows", 2, 2),
                            ("rows-level-hm", 8, 4)],
}
# Which preset stands for which regime of the plan (source_kernels.forward.regime).
REGIME_PRESET = {"small": "decoder", "medium": "decoder-b32", "large": "encoder"}
SWEEP_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp64": torch.float64}
ELEMENT_SIZE = {"bf16": 2, "fp16": 2, "fp32": 4, "fp64": 8}
# Error allowed against the fp64 loop kernel, relative to the largest reference magnitude
# (the operator tests' tolerances); grad_loc may differ at a few samples that sit on a pixel
# boundary, where the gradient jumps and rounding picks a side.
SWEEP_TOLERANCE = {"bf16": (3e-2, 6e-2), "fp16": (4e-3, 1e-2), "fp32": (2e-5, 5e-5),
                   "fp64": (1e-12, 1e-12)}
KINK_FRACTION = 1e-3


def candidates_for(direction, regime, dtype_name):
    table = SWEEP_CANDIDATES_FP64 if dtype_name == "fp64" else SWEEP_CANDIDATES
    return table[(direction, "small" if regime == "medium" else regime)]


def _mismatch(got, expected, tolerance, outliers=0.0):
    """None when got matches expected (fp64) within tolerance * max|expected| at all but a
    fraction ``outliers`` of the elements, else a short description."""
    expected = expected.double()
    scale = max(expected.abs().max().item(), 1e-30)
    bad = (got.double() - expected).abs() > tolerance * scale
    bad |= ~torch.isfinite(got)
    count = int(bad.sum().item())
    if count <= outliers * bad.numel():
        return None
    return f"{count} of {bad.numel()} elements off by more than {tolerance:g} x {scale:.3g}"


def _reference(pos, grad):
    """Forward and gradients of the loop kernels in fp64 on the same (upcast) inputs."""
    from .backward import msda_backward
    from .forward import msda_forward
    wide = [t.double() if t.is_floating_point() else t for t in pos]
    out = msda_forward(*wide, kernel="loop", block_q=16, num_warps=4)
    grads = msda_backward(grad.double(), *wide, kernel="loop", block_q=16, num_warps=4)
    return out, grads


def sweep(progress, presets=("decoder", "encoder"), distributions=("uniform",),
          dtypes=("bf16", "fp32"), on_row=lambda rows: None, directions=("forward", "backward"),
          extra_distributions=None, cases=None):
    """Launch-configuration sweep of every kernel variant forward and backward.  Each
    candidate is first checked against the fp64 loop kernel on the same inputs (a wrong
    candidate is recorded with ``correct: false`` and never timed); each timing is the
    profiler's median device time with L2 flushed (``_profiled_device_us``).  Returns the
    rows; ``on_row(rows)`` sees them after each new one (so a run cut short by a time limit
    still leaves its rows in the file).  ``extra_distributions`` maps a (preset, direction)
    to more location distributions to time there (e.g. the encoder's local locations);
    ``cases``, (preset, dtype) pairs, sets the order (most important first) instead of
    presets x dtypes."""
    from .backward import msda_backward
    from .forward import msda_forward, regime
    results = []
    extra_distributions = extra_distributions or {}
    cases = cases or [(preset, dtype) for preset in presets for dtype in dtypes]
    for preset, dtype_name in cases:
        spec = PRESETS[preset]
        dists = list(dict.fromkeys(
            list(distributions) + [d for direction in directions
                                   for d in extra_distributions.get((preset, direction),
                                                                    ())]))
        for distribution in dists:
            if out_of_time():
                return results
            args = preset_inputs(preset, distribution=distribution,
                                 dtype=SWEEP_DTYPES[dtype_name], device="cuda")
            pos = [args[k] for k in ARG_NAMES]
            flush_buffer = torch.empty(int(256e6 // 4), dtype=torch.int, device="cuda")
            grad = torch.randn(pos[0].shape[0], pos[3].shape[1],
                               pos[0].shape[2] * pos[0].shape[3], device="cuda",
                               dtype=pos[0].dtype)
            expected_out, expected_grads = _reference(pos, grad)
            size = regime(spec.batch, pos[3].shape[1], spec.heads)
            forward_tol, backward_tol = SWEEP_TOLERANCE[dtype_name]
            for direction in directions:
                if (distribution not in distributions
                        and distribution not in extra_distributions.get((preset, direction),
                                                                        ())):
                    continue
                for kernel, block_q, warps in candidates_for(direction, size, dtype_name):
                    if out_of_time():
                        return results
                    if direction == "forward":
                        def call(kernel=kernel, block_q=block_q, warps=warps):
                            return msda_forward(*pos, kernel=kernel, block_q=block_q,  # noqa: F821  (a false alarm: the closure runs before the del)
                                                num_warps=warps)
                    else:
                        def call(kernel=kernel, block_q=block_q, warps=warps):
                            return msda_backward(grad, *pos, kernel=kernel,  # noqa: F821  (a false alarm: the closure runs before the del)
                                                 block_q=block_q, num_warps=warps)
                    row = {"kernel": direction, "variant": kernel, "preset": preset,
                           "distribution": distribution, "dtype": dtype_name,
                           "block_q": block_q, "num_warps": warps}
                    try:
                        got = call()
                        if direction == "forward":
                            problem = _mismatch(got, expected_out, forward_tol)
                        else:
                            problem = (_mismatch(got[0], expected_grads[0], backward_tol)
                                       or _mismatch(got[1], expected_grads[1], backward_tol,
                                                    KINK_FRACTION)
                                       or _mismatch(got[2], expected_grads[2],
                                                    backward_tol))
                        del got
                        row["correct"] = problem is None
                        if problem:
                            row["error"] = f"wrong result: {problem}"
                        else:
                            row["us"] = _profiled_device_us(call, flush_buffer.zero_,
                                                            FAST["profile_reps"])
                    except Exception as error:           # noqa: BLE001
                        row["correct"] = False
                        row["error"] = f"{type(error).__name__}: {str(error)[:300]}"
                        torch.cuda.synchronize()
                    results.append(row)
                    on_row(results)
                    shown = (f"{row['us']:9.1f} us device" if "us" in row
                             else f"FAILED {row['error']}")
                    progress(f"  sweep {direction:<8} {preset:<11} {distribution:<7} "
                             f"{dtype_name} {kernel:<16} q{block_q:<3} w{warps}: {shown}")
            del args, pos, grad, flush_buffer, expected_out, expected_grads
            torch.cuda.empty_cache()
    return results


def split_sweep(rows):
    """{"sweep": the timed rows, "sweep_rejected": the candidates that gave a wrong result
    or failed, with the reason}: the book reads "sweep" and expects a time in each row."""
    return {"sweep": [r for r in rows if "us" in r],
            "sweep_rejected": [r for r in rows if "us" not in r]}


def plan_from_sweep(rows, distribution="uniform"):
    """The fastest correct (kernel, BLOCK_Q, num_warps) per direction, regime and element
    size on ``distribution`` locations: the plan that source_kernels.forward.FORWARD_PLAN /
    backward.BACKWARD_PLAN ship."""
    plan = {"forward": {}, "backward": {}}
    for direction in plan:
        for regime, preset in REGIME_PRESET.items():
            for dtype_name in SWEEP_DTYPES:
                candidates = [r for r in rows if r["kernel"] == direction and
                              r["preset"] == preset and r["dtype"] == dtype_name
                              and r.get("distribution", "uniform") == distribution
                              and r.get("correct", True) and "us" in r]
                if candidates:
                    best = min(candidates, key=lambda r: r["us"])
                    plan[direction][f"{regime},{ELEMENT_SIZE[dtype_name]}"] = [
                        best["variant"], best["block_q"], best["num_warps"]]
    return plan


def apply_plan(plan):
    from . import backward, forward
    from .op import forget_launches
    for direction, table in (("forward", forward.FORWARD_PLAN),
                             ("backward", backward.BACKWARD_PLAN)):
        for key, value in plan.get(direction, {}).items():
            regime, size = key.split(",")
            table[(regime, int(size))] = tuple(value)
    forget_launches()


def plan_literal(name, table) -> str:
    """``NAME = {...}`` of a plan table, one regime per line, in the order of its keys."""
    lines = []
    for regime in dict.fromkeys(regime for regime, _ in table):
        entries = [f'("{regime}", {size}): ("{kernel}", {block_q}, {warps})'
                   for (r, size), (kernel, block_q, warps) in sorted(table.items()) if r == regime]
        lines.append("    " + ", ".join(entries) + ",")
    return f"{name} = {{\n" + "\n".join(lines) + "\n}"


def write_plan(results_path):
    """Rewrite FORWARD_PLAN / BACKWARD_PLAN in forward.py and backward.py with the plan a
    benchmark run chose (its "plan" entry, over the plan they ship where it has no entry),
    so the shipped code is the measured code."""
    import re

    from . import backward, forward
    with open(results_path) as handle:
        plan = json.load(handle)["plan"]
    apply_plan(plan)
    here = os.path.dirname(os.path.abspath(__file__))
    for filename, name, table in (("forward.py", "FORWARD_PLAN", forward.FORWARD_PLAN),
                                  ("backward.py", "BACKWARD_PLAN", backward.BACKWARD_PLAN)):
        path = os.path.join(here, filename)
        with open(path) as handle:
            source = handle.read()
        literal = plan_literal(name, table)
        source, count = re.subn(name + r" = \{[^}]*\}", lambda _: literal, source, count=1)
        if count != 1:
            raise RuntimeError(f"{name} not found in {path}")
        with open(path, "w") as handle:
            handle.write(source)
        print(f"{path}: {literal}")


class _Identity(torch.autograd.Function):
    """An autograd Function that launches nothing: what any Function's forward and
    backward cost the host (autograd's own share of an eager call)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


def dispatch_breakdown(progress, dtype=torch.bfloat16):
    """Host time of the pieces of one eager call on the decoder preset (microseconds per
    call, back-to-back calls): the operator's forward and forward+backward, its launch
    alone, Triton's ordinary launch, and yardsticks of this host (one torch op, an autograd
    Function that launches nothing)."""
    from . import multi_scale_deformable_attn
    from .op import _call_for
    args = preset_inputs("decoder", dtype=dtype, device="cuda")
    pos = [args[k] for k in ARG_NAMES]
    call = _call_for(*pos, 64)
    tensors = call.inputs(*pos)
    call.forward(*tensors)
    out = call.forward(*tensors)
    bound = call.forward_bound
    pointers = [t.data_ptr() for t in tensors] + [out.data_ptr()]
    leaves = [pos[0].clone().requires_grad_(), pos[3].clone().requires_grad_(),
              pos[4].clone().requires_grad_()]
    grad = torch.randn(out.shape, device="cuda", dtype=dtype)
    x = torch.randn(out.shape, device="cuda", dtype=dtype, requires_grad=True)

    def call_forward_ordinary():
        from .forward import forward_launch
        kernel, block, warps = call.forward_plan
        fn, grid, fargs, constexprs = forward_launch(kernel, block, *tensors, out)
        fn[grid](*fargs, **constexprs, num_warps=warps)

    def forward_backward():
        for t in leaves:
            t.grad = None
        multi_scale_deformable_attn(leaves[0], pos[1], pos[2], leaves[1], leaves[2]).backward(
            grad)

    def identity_round_trip():
        x.grad = None
        _Identity.apply(x).backward(grad)

    pieces = {
        "whole eager call (multi_scale_deformable_attn)":
            lambda: multi_scale_deformable_attn(*pos),
        "eager forward+backward (autograd)": forward_backward,
        "checks and plan of a known signature (_call_for + inputs)":
            lambda: call.inputs(*pos) if _call_for(*pos, 64) else None,
        "bound launch alone (BoundLaunch)":
            (lambda: bound(*pointers)) if bound is not None else None,
        "kernel launch through Triton's kernel[grid]": call_forward_ordinary,
        "one torch op (torch.empty_like)": lambda: torch.empty_like(pos[0]),
        "an autograd Function launching nothing, forward+backward": identity_round_trip,
    }
    result = {name: _dispatch_us(fn) for name, fn in pieces.items() if fn is not None}
    for name, us in result.items():
        progress(f"  dispatch {name}: {us:.1f} us")
    return result


def _cases(args):
    """(preset, distribution, dtype) triples: --cases, else the product of the lists."""
    if args.cases:
        return [tuple(case.split("/")) for case in args.cases]
    return [(p, d, t) for p in args.presets for d in args.distributions for t in args.dtypes]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description="Time the MSDA operator on a GPU.")
    parser.add_argument("--out", default="results/bench_h200.json")
    parser.add_argument("--presets", nargs="+", default=list(PRESETS))
    parser.add_argument("--distributions", nargs="+", default=["uniform", "local"])
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "fp16", "bf16"])
    parser.add_argument("--cases", nargs="+", metavar="PRESET/DISTRIBUTION/DTYPE",
                        help="measure these cases instead of presets x distributions x dtypes")
    parser.add_argument("--impls", nargs="+", default=["triton", "grid_sample"])
    parser.add_argument("--peer", action="append", default=[], metavar="MODULE:FUNCTION",
                        help="also time this implementation (mmcv's signature), same methods")
    parser.add_argument("--compile", action="store_true",
                        help="also time the operator under torch.compile (default and "
                             "reduce-overhead)")
    parser.add_argument("--compile-cases", nargs="+", metavar="PRESET/DISTRIBUTION/DTYPE",
                        help="with --compile: time the compiled operator on these cases only")
    parser.add_argument("--sweep", action="store_true", help="add the launch-config sweeps")
    parser.add_argument("--no-bench", action="store_true", help="only the sweeps")
    parser.add_argument("--no-dispatch", action="store_true",
                        help="leave out the host-time breakdown of one eager call")
    parser.add_argument("--fast", action="store_true",
                        help="fewer repetitions per figure (same method): for a short GPU lease")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="start no new measurement after this many seconds")
    parser.add_argument("--plan", metavar="RESULTS_JSON",
                        help="measure with the plan of a results file (its 'plan' entry)")
    parser.add_argument("--write-plan", metavar="RESULTS_JSON",
                        help="write the plan of a results file into the kernel modules, exit")
    parser.add_argument("--sweep-presets", nargs="+",
                        default=["decoder", "decoder-b32", "encoder"])
    parser.add_argument("--sweep-dtypes", nargs="+", default=["bf16", "fp32", "fp64"])
    parser.add_argument("--sweep-distributions", nargs="+", default=["uniform"])
    parser.add_argument("--sweep-local-encoder", action="store_true",
                        help="time the encoder forward candidates on local locations too")
    parser.add_argument("--sweep-cases", nargs="+", metavar="PRESET/DTYPE",
                        help="sweep these (preset, dtype) pairs in this order")
    args = parser.parse_args(argv)
    if args.write_plan:
        write_plan(args.write_plan)
        return 0
    if args.fast:
        FAST.update({"do_bench": {"warmup": 10, "rep": 40}, "profile_reps": 5,
                     "dispatch_batches": 3})
    if args.budget_s is not None:
        DEADLINE["at"] = time.time() + args.budget_s
    for spec in args.peer:
        load_peer(spec)                       # fail now, not after the sweep
    if not torch.cuda.is_available():
        print("source_kernels.bench needs a CUDA GPU; none is visible.", file=sys.stderr)
        return 2
    impls = list(args.impls) + [f"peer:{spec}" for spec in args.peer]
    if args.compile:
        impls += list(COMPILED)
    cases = [] if args.no_bench else _cases(args)
    started = time.time()
    todo = len(cases) * len(impls)
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
    if args.plan:
        with open(args.plan) as handle:
            apply_plan(json.load(handle)["plan"])
    if args.sweep:
        extra = ({("encoder", "forward"): ("local",)} if args.sweep_local_encoder else {})
        order = ([tuple(case.split("/")) for case in args.sweep_cases]
                 if args.sweep_cases else None)
        rows = sweep(progress, args.sweep_presets, args.sweep_distributions,
                     args.sweep_dtypes, extra_distributions=extra, cases=order,
                     on_row=lambda rows: _write(args.out, dict(result, **split_sweep(rows))))
        result.update(split_sweep(rows))
        result["plan"] = plan_from_sweep(result["sweep"])
        apply_plan(result["plan"])
        progress(f"plan from the sweep: {json.dumps(result['plan'])}")
        _write(args.out, result)
    from . import backward, forward
    result["plan_used"] = {
        "forward": {f"{r},{s}": list(v) for (r, s), v in forward.FORWARD_PLAN.items()},
        "backward": {f"{r},{s}": list(v) for (r, s), v in backward.BACKWARD_PLAN.items()}}
    if not args.no_dispatch and not out_of_time():
        result["dispatch_breakdown_us"] = dispatch_breakdown(progress)
        result["dispatch_breakdown_fp32_us"] = dispatch_breakdown(progress, torch.float32)
    rows = []
    compile_cases = [tuple(c.split("/")) for c in args.compile_cases or []]
    plain = [i for i in impls if i not in COMPILED]
    compiled = [i for i in impls if i in COMPILED]
    if compile_cases:
        # the named cases first, eagerly then compiled; then every other case eagerly
        first = [c for c in cases if c in compile_cases]
        order = ([(c, i) for c in first for i in plain + compiled]
                 + [(c, i) for c in cases if c not in compile_cases for i in plain])
    else:
        # every case eagerly first (cheap), then compiled (compiles take seconds)
        order = [(c, i) for group in (plain, compiled) for c in cases for i in group]
    for (preset, distribution, dtype_name), impl in order:
        if out_of_time():
            break
        try:
            rows += measure(preset, distribution, dtype_name, impl, bandwidth, progress)
        except Exception as error:  # noqa: BLE001  (record and go on)
            progress(f"    FAILED: {type(error).__name__}: {error}")
            rows.append({"preset": preset, "distribution": distribution,
                         "dtype": dtype_name, "impl": impl,
                         "error": f"{type(error).__name__}: {str(error)[:2000]}"})
            torch.compiler.reset()
            torch.cuda.empty_cache()
        _write(args.out, dict(result, rows=rows))
    result["rows"] = rows
    if out_of_time():
        result["stopped_by_budget"] = True
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
