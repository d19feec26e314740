"""The operator in a model, on a GPU: training parity, time per step, compile and CUDA graphs.

Usage:  python3 scripts/gpu/model_training.py OUTDIR   [--quick] [--smoke]

``--quick`` shortens every section; ``--smoke`` runs the code paths on the CPU at toy sizes
(Triton's interpreter, no timing worth reading, no CUDA graph or compile) and writes
model_smoke.json instead: it exists to catch mistakes before GPU time is spent.

Writes OUTDIR/model_h200.json (copy it to results/model_h200.json) with:

- ``training``: a Deformable-DETR-sized encoder (C=256, M=8, L=4, K=4, 6 layers, FFN 1024)
  trained on synthetic data with the Triton core and with the grid_sample core from the
  same seeds: both loss curves, their largest relative gap per step, and that gap again
  from Deformable DETR's exact initialisation (no offset jitter; see
  ``source_kernels.model.jitter_offsets`` for why the two differ);
- ``step_time``: milliseconds per training step (forward, backward, AdamW) of each core, in
  fp32 and under bf16 autocast, on the 800 x 1333 pyramid of the benchmark presets, and the
  peak memory of each;
- ``dispatch``: one MSDeformAttn module (decoder-like: 300 queries over that pyramid, and a
  small case where launch overhead dominates) run eagerly, under ``torch.compile`` (default
  and "reduce-overhead"), and replayed from a CUDA graph captured by hand: microseconds per
  call of each, and the host dispatch overhead that the graph removes (eager minus graph);
  forward, and forward + backward through ``torch.cuda.make_graphed_callables``.

Every section runs in its own try block: a failure is recorded in the file with its
message rather than ending the run.  Needs only torch, triton, numpy and this repository.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
import traceback
from pathlib import Path

from _provenance import provenance

# source_kernels first: on a machine without a GPU it switches Triton to its interpreter,
# which only works if that happens before triton itself is imported.
import source_kernels  # noqa: F401
import torch
import torch.nn.functional as F

from source_kernels.inputs import level_start_index, pyramid_shapes
from source_kernels.model import DeformableEncoder, MSDeformAttn, jitter_offsets

DEVICE = torch.device("cuda")
CORES = ("triton", "grid_sample")
SMOKE = False          # set by --smoke: CPU, toy sizes


def sync():
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def scaled(cfg, **toy):
    """``cfg`` as given on the GPU, with ``toy`` overrides under --smoke."""
    return dict(cfg, **toy) if SMOKE else cfg


# ----------------------------------------------------------------------------- helpers
def pyramid(height, width):
    shapes = pyramid_shapes(height, width).to(DEVICE)
    return shapes, level_start_index(shapes)


def section(results, name, fn):
    """Run one section; store its result, or its error, under ``name``."""
    start = time.perf_counter()
    print(f"[{name}] ...", flush=True)
    try:
        results[name] = fn()
    except Exception as exc:                                          # noqa: BLE001
        results[name] = {"error": f"{exc.__class__.__name__}: {exc}",
                         "traceback": traceback.format_exc()[-3000:]}
    results[name + "_seconds"] = round(time.perf_counter() - start, 1)
    print(f"[{name}] done in {results[name + '_seconds']} s"
          + (f" -- ERROR {results[name]['error']}" if "error" in results[name] else ""),
          flush=True)
    if DEVICE.type == "cuda":
        torch.cuda.empty_cache()


def shift_task(seed, shapes, starts, batch, channels):
    """Random pyramid features; target = each pixel's right-hand neighbour on its level."""
    generator = torch.Generator().manual_seed(seed)
    total = int(shapes.prod(dim=1).sum())
    src = torch.randn(batch, total, channels, generator=generator)
    targets = []
    for (height, width), start in zip(shapes.tolist(), starts.tolist()):
        level = src[:, start:start + height * width].view(batch, height, width, channels)
        shifted = torch.zeros_like(level)
        shifted[:, :, :-1] = level[:, :, 1:]
        targets.append(shifted.reshape(batch, height * width, channels))
    return src.to(DEVICE), torch.cat(targets, dim=1).to(DEVICE)



def build(core, cfg, seed=0, jitter=0.25):
    torch.manual_seed(seed)
    encoder = DeformableEncoder(cfg["layers"], cfg["d_model"], cfg["d_ffn"], 0.0, 4,
                                cfg["heads"], cfg["points"], core=core)
    head = torch.nn.Linear(cfg["d_model"], cfg["d_model"])
    if jitter:
        jitter_offsets(encoder, seed + 1, jitter)
    return encoder.to(DEVICE), head.to(DEVICE)


def train_curve(core, cfg, steps, jitter):
    encoder, head = build(core, cfg, jitter=jitter)
    shapes, starts = pyramid(*cfg["image"])
    src, target = shift_task(1000, shapes.cpu(), starts.cpu(), cfg["batch"], cfg["d_model"])
    optimiser = torch.optim.AdamW([*encoder.parameters(), *head.parameters()], lr=cfg["lr"])
    losses = []
    for _ in range(steps):
        loss = F.mse_loss(head(encoder(src, shapes, starts)), target)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    return losses


def rel_gaps(a, b):
    return [abs(x - y) / abs(y) for x, y in zip(a, b)]


# ----------------------------------------------------------------------------- sections
def training_parity(quick):
    cfg = scaled(dict(d_model=256, heads=8, points=4, layers=6, d_ffn=1024, batch=2,
                      image=(512, 768), lr=2e-4),
                 d_model=16, heads=2, points=2, layers=1, d_ffn=32, batch=1, image=(32, 32))
    steps = 2 if SMOKE else 10 if quick else 60
    out = {"config": cfg, "steps": steps, "task": "fit one batch: target = right-hand "
           "neighbour's feature on the same level; AdamW; fp32; dropout 0",
           "pyramid": pyramid(*cfg["image"])[0].tolist()}
    for jitter in (0.25, 0.0):
        curves = {core: train_curve(core, cfg, steps, jitter) for core in CORES}
        gaps = rel_gaps(curves["triton"], curves["grid_sample"])
        out["jitter_%g" % jitter] = {
            "offset_jitter_pixels": jitter,
            "losses": curves,
            "rel_gap_per_step": gaps,
            "max_rel_gap": max(gaps),
            "first_step_rel_gap_above_1e-4": next((i for i, g in enumerate(gaps) if g > 1e-4),
                                                  None),
        }
    return out


def step_time(quick):
    cfg = scaled(dict(d_model=256, heads=8, points=4, layers=6, d_ffn=1024, batch=2,
                      image=(800, 1333), lr=2e-4),
                 d_model=16, heads=2, points=2, layers=1, d_ffn=32, batch=1, image=(32, 32))
    shapes, starts = pyramid(*cfg["image"])
    src, target = shift_task(7, shapes.cpu(), starts.cpu(), cfg["batch"], cfg["d_model"])
    warmup, timed = (1, 1) if SMOKE else (2, 5) if quick else (3, 20)
    rows = []
    for precision in ("fp32", "bf16-autocast"):
        for core in CORES:
            encoder, head = build(core, cfg)
            optimiser = torch.optim.AdamW([*encoder.parameters(), *head.parameters()],
                                          lr=cfg["lr"])

            def one_step():
                with torch.autocast(DEVICE.type, dtype=torch.bfloat16,
                                    enabled=precision != "fp32"):
                    loss = F.mse_loss(head(encoder(src, shapes, starts)).float(), target)  # noqa: F821  (a false alarm: the closure runs before the del)
                optimiser.zero_grad(set_to_none=True)  # noqa: F821
                loss.backward()
                optimiser.step()  # noqa: F821
                return loss

            try:
                for _ in range(warmup):
                    one_step()
                sync()
                if DEVICE.type == "cuda":
                    torch.cuda.reset_peak_memory_stats()
                times = []
                for _ in range(timed):
                    times.append(elapsed_ms(one_step))
                loss = one_step()
                rows.append({"core": core, "precision": precision,
                             "step_ms_median": statistics.median(times),
                             "step_ms_min": min(times), "steps_timed": timed,
                             "peak_mem_bytes": (torch.cuda.max_memory_allocated()
                                                if DEVICE.type == "cuda" else None),
                             "last_loss": loss.item()})
            except Exception as exc:                                  # noqa: BLE001
                rows.append({"core": core, "precision": precision,
                             "error": f"{exc.__class__.__name__}: {exc}"})
            del encoder, head, optimiser
            if DEVICE.type == "cuda":
                torch.cuda.empty_cache()
    by_key = {(r["core"], r["precision"]): r for r in rows}
    speedup = {}
    for precision in ("fp32", "bf16-autocast"):
        tri, ref = by_key.get(("triton", precision)), by_key.get(("grid_sample", precision))
        if tri and ref and "step_ms_median" in tri and "step_ms_median" in ref:
            speedup[precision] = ref["step_ms_median"] / tri["step_ms_median"]
    return {"config": cfg, "pyramid": shapes.tolist(), "tokens": int(shapes.prod(1).sum()),
            "method": "CUDA events around one full step (forward, backward, AdamW), median "
                      "over the timed steps after warm-up",
            "rows": rows, "speedup_grid_sample_over_triton": speedup}


def elapsed_ms(fn):
    """Milliseconds of one call: CUDA events on a GPU, the host clock on a CPU."""
    if DEVICE.type != "cuda":
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1000
    begin = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    begin.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return begin.elapsed_time(end)


def wall_us(fn, iters, warmup=5):
    """Host wall-clock microseconds per call of back-to-back calls, synchronised at the
    end: the larger of the GPU time and the host's dispatch time per call."""
    for _ in range(warmup):
        fn()
    sync()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - start) / iters * 1e6


def gpu_us(fn, iters, warmup=5):
    """GPU microseconds per call, from CUDA events around ``iters`` calls."""
    if DEVICE.type != "cuda":
        return None
    for _ in range(warmup):
        fn()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    begin.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return begin.elapsed_time(end) * 1000 / iters


def module_inputs(case):
    torch.manual_seed(0)
    module = MSDeformAttn(256, 4, 8, 4, core=case["core"]).to(DEVICE)
    with torch.no_grad():                           # trained-looking heads: spread samples
        module.sampling_offsets.weight.normal_(0, 0.02)
        module.attention_weights.weight.normal_(0, 0.02)
    shapes, starts = pyramid(*case["image"])
    total = int(shapes.prod(1).sum())
    batch, queries = case["batch"], case["queries"]
    query = torch.randn(batch, queries, 256, device=DEVICE)
    ref = torch.rand(batch, queries, 4, 2, device=DEVICE)
    memory = torch.randn(batch, total, 256, device=DEVICE)
    return module, (query, ref, memory, shapes, starts)


def graph_forward(module, args):
    """Capture one forward in a CUDA graph; returns a replay function."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.no_grad():
        for _ in range(3):
            module(*args)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        static_out = module(*args)
    return graph.replay, static_out


def _error(exc):
    return {"error": f"{exc.__class__.__name__}: {str(exc)[:2000]}"}


NOT_CAPTURABLE = {"skipped": "msda_grid_sample copies the spatial shapes to the host "
                             "(.tolist()), which a stream under CUDA graph capture does not "
                             "allow"}


def dispatch_case(case, core, iters):
    """Eager, hand-captured CUDA graph and torch.compile timings of one module."""
    res = {"case": dict(case, core=core)}
    module, args = module_inputs(dict(case, core=core))
    grad_args = [a.detach().clone().requires_grad_(a.is_floating_point()) for a in args]

    def fwd_bwd(fn):
        def go():
            out = fn(*grad_args)
            out.backward(torch.ones_like(out))
        return go

    with torch.no_grad():
        eager = module(*args)

        def run_eager():
            return module(*args)

        res["eager_forward"] = {"wall_us": wall_us(run_eager, iters),
                                "gpu_us": gpu_us(run_eager, iters)}
    res["eager_forward_backward"] = {"wall_us": wall_us(fwd_bwd(module), iters),
                                     "gpu_us": gpu_us(fwd_bwd(module), iters)}
    if SMOKE:
        return res

    # forward replayed from a CUDA graph captured by hand
    if core != "triton":
        res["graph_forward"] = NOT_CAPTURABLE
    else:
        try:
            replay, static_out = graph_forward(module, args)
            replay()
            torch.cuda.synchronize()
            res["graph_forward"] = {
                "wall_us": wall_us(replay, iters), "gpu_us": gpu_us(replay, iters),
                "max_abs_diff_vs_eager": (static_out - eager).abs().max().item()}
            res["forward_dispatch_overhead_us"] = (res["eager_forward"]["wall_us"]
                                                   - res["graph_forward"]["wall_us"])
        except Exception as exc:                                      # noqa: BLE001
            res["graph_forward"] = _error(exc)

    # torch.compile: forward in the default mode and in "reduce-overhead" (inductor's CUDA
    # graphs); forward + backward in the default mode
    for mode in ("default", "reduce-overhead"):
        torch.compiler.reset()
        try:
            compiled = torch.compile(module, mode=mode, fullgraph=(core == "triton"))
            with torch.no_grad():
                t0 = time.perf_counter()
                # a copy: under "reduce-overhead" the output lives in the CUDA graph's memory,
                # which the timed runs below overwrite
                got = compiled(*args).clone()
                torch.cuda.synchronize()
                compile_s = time.perf_counter() - t0

                def run_compiled():
                    return compiled(*args)

                res[f"compiled_{mode}_forward"] = {
                    "compile_s": compile_s, "fullgraph": core == "triton",
                    "wall_us": wall_us(run_compiled, iters),
                    "gpu_us": gpu_us(run_compiled, iters),
                    "max_abs_diff_vs_eager": (got - eager).abs().max().item()}
        except Exception as exc:                                      # noqa: BLE001
            res[f"compiled_{mode}_forward"] = _error(exc)
    torch.compiler.reset()
    try:
        compiled = torch.compile(module, fullgraph=(core == "triton"))
        t0 = time.perf_counter()
        fwd_bwd(compiled)()
        torch.cuda.synchronize()
        compile_s = time.perf_counter() - t0
        res["compiled_default_forward_backward"] = {
            "compile_s": compile_s, "wall_us": wall_us(fwd_bwd(compiled), iters),
            "gpu_us": gpu_us(fwd_bwd(compiled), iters)}
    except Exception as exc:                                          # noqa: BLE001
        res["compiled_default_forward_backward"] = _error(exc)
    torch.compiler.reset()

    # forward + backward replayed from graphs (torch.cuda.make_graphed_callables)
    if core != "triton":
        res["graphed_forward_backward"] = NOT_CAPTURABLE
    else:
        try:
            graphed = torch.cuda.make_graphed_callables(module, tuple(grad_args))
            res["graphed_forward_backward"] = {"wall_us": wall_us(fwd_bwd(graphed), iters),
                                               "gpu_us": gpu_us(fwd_bwd(graphed), iters)}
            res["forward_backward_dispatch_overhead_us"] = (
                res["eager_forward_backward"]["wall_us"]
                - res["graphed_forward_backward"]["wall_us"])
        except Exception as exc:                                      # noqa: BLE001
            res["graphed_forward_backward"] = _error(exc)
    return res


def dispatch(quick):
    iters = 1 if SMOKE else 50 if quick else 200
    cases = {
        "decoder": dict(batch=4, queries=300, image=(800, 1333)),
        "small": dict(batch=1, queries=100, image=(256, 256)),
    }
    if SMOKE:
        cases = {"toy": dict(batch=1, queries=8, image=(16, 16))}
    out = {"method": "wall_us: host wall clock per call over back-to-back calls (the larger "
                     "of GPU time and host dispatch); gpu_us: CUDA events around the same "
                     "loop; *_dispatch_overhead_us = eager wall_us - graph wall_us",
           "module": "MSDeformAttn(d_model=256, n_levels=4, n_heads=8, n_points=4), "
                     "reference points of last dim 2, fp32",
           "iters": iters, "cases": {}}
    for case_name, case in cases.items():
        for core in CORES:
            try:
                out["cases"][f"{case_name}/{core}"] = dispatch_case(case, core, iters)
            except Exception as exc:                                  # noqa: BLE001
                out["cases"][f"{case_name}/{core}"] = _error(exc)
            if DEVICE.type == "cuda":
                torch.cuda.empty_cache()
    return out


def main(argv):
    global DEVICE, SMOKE
    args = [a for a in argv[1:] if not a.startswith("--")]
    quick = "--quick" in argv
    SMOKE = "--smoke" in argv
    if len(args) != 1:
        print(__doc__)
        return 2
    if SMOKE:
        DEVICE = torch.device("cpu")
    elif not torch.cuda.is_available():
        print("needs a CUDA GPU; none is visible (--smoke runs the code paths on the CPU)",
              file=sys.stderr)
        return 1
    outdir = Path(args[0])
    outdir.mkdir(parents=True, exist_ok=True)
    results = {"provenance": provenance("model_training.py", dry=SMOKE), "quick": quick, "smoke": SMOKE}
    path = outdir / ("model_smoke.json" if SMOKE else "model_h200.json")

    def save():
        path.write_text(json.dumps(results, indent=1, default=str) + "\n")

    for name, fn in (("training", training_parity), ("step_time", step_time),
                     ("dispatch", dispatch)):
        section(results, name, lambda fn=fn: fn(quick))
        save()
    print(f"wrote {path}")
    summary = results.get("step_time", {}).get("speedup_grid_sample_over_triton")
    if summary:
        print("step-time speedup of the Triton core over grid_sample:", summary)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
