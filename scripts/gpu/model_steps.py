"""Whole training steps of a Deformable-DETR-style model as a user runs them, on a GPU.

    python3 scripts/gpu/model_steps.py OUTDIR [--budget-s 150] [--cores triton ...] [--smoke]

Two models, the MSDA core swapped by name (``source_kernels.model.CORES``, or any
``MODULE:FUNCTION`` with mmcv's signature that is installed):

- ``decoder``: ``DeformableDecoder`` of 6 layers (MSDeformAttn cross-attention + FFN +
  LayerNorm), B = 4, 300 queries, over the 800 x 1333 pyramid of the benchmark presets
  (the memory a random (B, S, 256) tensor);
- ``encoder``: ``DeformableEncoder`` of 6 layers, B = 2, every pyramid pixel a query.

A step is forward, an MSE loss, backward and an SGD step.  Each case runs eagerly, and for
the operator under ``torch.compile`` (default mode and ``mode="reduce-overhead"``, which
replays CUDA graphs; the model compiled with fullgraph=True, the optimiser step eager), in
fp32 and under bf16 autocast.  Two figures per case, never mixed:

- ``wall_ms``: host wall clock per step over back-to-back steps, synchronised once at the
  end (what a training loop experiences: the larger of host and GPU time);
- ``device_ms``: the profiler's sum of the kernels one step launches (median of 3 steps).

With ``--profile``, each eager case also records where one step's host time goes: the
profiler's operators with the most CPU time of their own, and how many times the step
waits for the device or asks the driver for memory (synchronisations, ``.item()``,
cudaMalloc/cudaFree), beside the number of kernels it launches.

Cases run in order of importance and no new case starts after ``--budget-s`` seconds; the
file is written after every case.  ``--smoke`` runs the eager code paths on the CPU at toy
sizes (Triton's interpreter; no timing worth reading) and writes model_steps_smoke.json.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

from _provenance import provenance

REPO = Path(__file__).resolve().parents[2]

FULL = dict(d_model=256, heads=8, points=4, layers=6, d_ffn=1024, image=(800, 1333),
            decoder_batch=4, queries=300, encoder_batch=2, lr=1e-4)
TOY = dict(d_model=16, heads=2, points=2, layers=1, d_ffn=32, image=(32, 48),
           decoder_batch=1, queries=6, encoder_batch=1, lr=1e-4)


def cases(cores):
    """(model, precision, mode, core) in order of importance: the decoder steps of this
    operator eagerly and under CUDA graphs, then the encoder's eager steps, then the
    peers' eager steps, then the rest of the compiled ones."""
    order = [("decoder", p, "eager", "triton") for p in ("fp32", "bf16-autocast")]
    order += [("decoder", p, "reduce-overhead", "triton") for p in ("fp32", "bf16-autocast")]
    order += [("encoder", p, "eager", "triton") for p in ("fp32", "bf16-autocast")]
    for core in cores:
        if core != "triton":
            order += [(model, p, "eager", core) for model in ("decoder", "encoder")
                      for p in ("fp32", "bf16-autocast")]
    order += [("decoder", p, "default", "triton") for p in ("fp32", "bf16-autocast")]
    order += [("encoder", "bf16-autocast", "reduce-overhead", "triton")]
    return order


def resolve(core):
    """A core name of source_kernels.model.CORES, or MODULE:FUNCTION of an installed peer."""
    if ":" not in core:
        return core
    from source_kernels.bench import load_peer
    fn = load_peer(core)
    return lambda value, shapes, starts, loc, attn, step: fn(value, shapes, starts, loc, attn,
                                                             step)


def build(model, core, cfg, device):
    import torch

    from source_kernels.inputs import level_start_index, pyramid_shapes
    from source_kernels.model import DeformableDecoder, DeformableEncoder
    torch.manual_seed(0)
    shapes = pyramid_shapes(*cfg["image"]).to(device)
    starts = level_start_index(shapes)
    total = int(shapes.prod(1).sum())
    if model == "decoder":
        net = DeformableDecoder(cfg["layers"], cfg["d_model"], cfg["d_ffn"], 0.0, 4,
                                cfg["heads"], cfg["points"], cfg["queries"],
                                core=resolve(core)).to(device)
        with torch.no_grad():             # queries spread over the image, as trained ones
            net.reference_points.weight.normal_(0, 1.0)
        source = torch.randn(cfg["decoder_batch"], total, cfg["d_model"], device=device)
        target = torch.randn(cfg["decoder_batch"], cfg["queries"], cfg["d_model"],
                             device=device)
    else:
        net = DeformableEncoder(cfg["layers"], cfg["d_model"], cfg["d_ffn"], 0.0, 4,
                                cfg["heads"], cfg["points"], core=resolve(core)).to(device)
        source = torch.randn(cfg["encoder_batch"], total, cfg["d_model"], device=device)
        target = torch.randn_like(source)
    return net, (source, shapes, starts), target


def make_step(net, inputs, target, precision, mode, lr, device):
    import torch
    import torch.nn.functional as F
    forward = net if mode == "eager" else torch.compile(net, mode=mode, fullgraph=True)
    optimiser = torch.optim.SGD(net.parameters(), lr=lr)
    mark = (torch.compiler.cudagraph_mark_step_begin if mode == "reduce-overhead"
            else lambda: None)

    def step():
        mark()
        with torch.autocast(device.type, dtype=torch.bfloat16,
                            enabled=precision == "bf16-autocast"):
            out = forward(*inputs)
        loss = F.mse_loss(out.float(), target)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()
        return loss

    return step


def device_ms(step, steps=3):
    """Median over ``steps`` steps of the profiler's sum of the step's kernel times."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    per_step = []
    for _ in range(steps):
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
        total = sum(getattr(evt, "device_time", None) or evt.cuda_time
                    for evt in prof.events()
                    if evt.device_type == torch.autograd.DeviceType.CUDA)
        per_step.append(total / 1e3)
    return statistics.median(per_step)


# Profiler event names counted per step by --profile (substring -> what it stands for).
HOST_EVENTS = {"Synchronize": "synchronisations", "_local_scalar_dense": "item_calls",
               "cudaMalloc": "cuda_mallocs", "cudaFree": "cuda_frees",
               "LaunchKernel": "kernel_launches", "cudaMemcpy": "memcpys"}


def host_profile(step):
    """Where one step's host time goes: operators by their own CPU time, and counts of the
    events of HOST_EVENTS."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    averages = prof.key_averages()
    counts = {name: 0 for name in HOST_EVENTS.values()}
    for evt in averages:
        for needle, name in HOST_EVENTS.items():
            if needle in evt.key:
                counts[name] += evt.count
    top = sorted(averages, key=lambda evt: -evt.self_cpu_time_total)[:20]
    return {"counts": counts,
            "top_self_cpu": [{"op": evt.key[:80], "count": evt.count,
                              "self_cpu_us": round(evt.self_cpu_time_total, 1)}
                             for evt in top]}


def measure(model, precision, mode, core, cfg, device, smoke, profile_host=False):
    import torch
    net, inputs, target = build(model, core, cfg, device)
    step = make_step(net, inputs, target, precision, mode, cfg["lr"], device)
    row = {"model": model, "precision": precision, "mode": mode, "core": core}
    start = time.perf_counter()
    for _ in range(1 if smoke else 3):            # compile, record the CUDA graphs, warm up
        loss = step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    row["warmup_s"] = time.perf_counter() - start
    timed = 1 if smoke else 10 if model == "decoder" else 5
    walls = []
    for _ in range(1 if smoke else 3):
        start = time.perf_counter()
        for _ in range(timed):
            loss = step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        walls.append((time.perf_counter() - start) / timed * 1e3)
    row["wall_ms"] = statistics.median(walls)
    row["wall_ms_runs"] = walls
    row["steps_per_run"] = timed
    row["device_ms"] = None if smoke else device_ms(step)
    if profile_host and mode == "eager" and not smoke:
        row["host_profile"] = host_profile(step)
    row["last_loss"] = float(loss.item())
    if device.type == "cuda":
        row["peak_mem_bytes"] = torch.cuda.max_memory_allocated()
    del net, inputs, target, step
    torch.compiler.reset()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("outdir")
    parser.add_argument("--budget-s", type=float, default=150.0)
    parser.add_argument("--cores", nargs="+", default=["triton"],
                        help="cores to time: triton, grid_sample or MODULE:FUNCTION")
    parser.add_argument("--only", nargs="+", metavar="MODEL/PRECISION/MODE",
                        help="run only these cases, in this order (e.g. decoder/fp32/eager)")
    parser.add_argument("--profile", action="store_true",
                        help="record where an eager step's host time goes")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    import source_kernels  # noqa: F401  (the interpreter switch, first)
    import torch
    if args.smoke:
        device, cfg, stem = torch.device("cpu"), TOY, "model_steps_smoke"
        prov = {"gpu": "none (smoke run in Triton's interpreter)",
                "torch": torch.__version__}
    else:
        if not torch.cuda.is_available():
            print("model_steps.py needs a CUDA GPU (--smoke runs the code on the CPU)",
                  file=sys.stderr)
            return 2
        device, cfg, stem = torch.device("cuda"), FULL, "model_steps_h200"
        prov = provenance("model_steps.py")
    started = time.time()
    out = Path(args.outdir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{stem}.json"
    payload = {"provenance": prov, "config": cfg,
               "method": "wall_ms: host wall clock per step over back-to-back steps (one "
                         "synchronisation at the end), median of 3 runs; device_ms: the "
                         "profiler's sum of one step's kernel times, median of 3 steps",
               "step": "forward, MSE loss, backward, SGD step; compiled modes compile the "
                       "model (fullgraph), the optimiser step stays eager",
               "rows": []}
    todo = cases(args.cores)
    if args.only:                       # in the order given
        todo = [c for name in args.only for c in todo if "/".join(c[:3]) == name]
    if args.smoke:
        todo = [c for c in todo if c[2] == "eager" and c[1] == "fp32"]
    for model, precision, mode, core in todo:
        if time.time() - started > args.budget_s:
            payload["stopped_by_budget"] = True
            break
        print(f"[{time.time() - started:6.1f}s] {model} {precision} {mode} {core}", flush=True)
        try:
            row = measure(model, precision, mode, core, cfg, device, args.smoke,
                          args.profile)
            print(f"    wall {row['wall_ms']:.2f} ms/step  device {row['device_ms'] or 0:.2f} "
                  f"ms/step  (warm-up {row['warmup_s']:.1f} s)", flush=True)
        except Exception as exc:                                     # noqa: BLE001
            row = {"model": model, "precision": precision, "mode": mode, "core": core,
                   "error": f"{type(exc).__name__}: {str(exc)[:1500]}",
                   "traceback": traceback.format_exc()[-2500:]}
            print(f"    ERROR {row['error'][:300]}", flush=True)
            torch.compiler.reset()
        payload["rows"].append(row)
        path.write_text(json.dumps(payload, indent=1) + "\n")
    path.write_text(json.dumps(payload, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
