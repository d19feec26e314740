"""DistributedDataParallel training parity for the course's encoder, and its scaling.

Usage (one process per GPU, NCCL, NVLink multicast off):

    NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc_per_node=2 scripts/gpu/ddp_parity.py OUTDIR

    # the same code path on a CPU, one process, gloo, toy sizes, Triton's interpreter:
    torchrun --standalone --nproc_per_node=1 scripts/gpu/ddp_parity.py OUTDIR --cpu

What it does, for each precision (fp32, bf16 autocast):

1. **Reference.** Rank 0 alone trains the `DeformableEncoder` of `source_kernels.model`
   (plus a linear head) for ``--steps`` SGD steps on the *global* batch, one device.
2. **DDP.** Every rank builds the same model from the same seed, wraps it in
   `torch.nn.parallel.DistributedDataParallel`, and trains on its slice of the same global
   batch (rank r takes samples r, r + W, ...). DDP averages the gradients over ranks; with an
   equal split and a loss that is a mean over samples, the average of the per-rank gradients
   is the gradient of the global batch, so both runs take the same steps up to rounding.
3. **Parity.** The loss of the global batch (the mean of the ranks' losses) is compared step
   by step with the reference: the largest relative gap is recorded and checked against the
   tolerance below.
4. **Scaling.** Time per step on one device with the per-rank batch, and time per step of
   the DDP run (same per-rank batch, W devices): weak-scaling efficiency t1 / tW.

Why the losses are not bit-identical, and the tolerance: the two runs sum the same per-sample
gradients in a different order (a per-rank mean, then NCCL's sum over ranks and a division,
against one mean over the global batch), and the operator's backward accumulates grad_value
with atomics whose order varies from run to run (chapter 5). Each step therefore differs by a
few units in the last place of fp32 (about 1e-7 relative), and training amplifies such
differences slowly; under bf16 autocast the projections round to 8 significant bits, so the
same reorderings move the loss by about 1e-3 relative. The tolerances are 1e-4 (fp32) and
2e-2 (bf16 autocast) on the largest relative loss gap over the run: an error in the
operator, in the split of the batch or in the gradient averaging moves the loss by far more
(a missing division by W doubles the step; a wrong slice changes the data).

Writes OUTDIR/ddp_parity_<gpu>.json (or ddp_parity_cpu.json with --cpu) with provenance.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from _provenance import gpu_slug, provenance

TOLERANCE = {"fp32": 1e-4, "bf16-autocast": 2e-2}
FULL = dict(d_model=256, heads=8, points=4, layers=6, d_ffn=1024, per_rank_batch=2,
            image=(800, 1333), lr=1e-3)
TOY = dict(d_model=16, heads=2, points=2, layers=1, d_ffn=32, per_rank_batch=1,
           image=(8, 16), lr=1e-2)


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("outdir")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--timed-steps", type=int, default=10,
                        help="steps timed for the scaling figures (after 3 warm-up steps)")
    parser.add_argument("--cpu", action="store_true",
                        help="gloo on the CPU, toy sizes, Triton's interpreter")
    parser.add_argument("--precisions", default="fp32,bf16-autocast")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse(argv)
    if args.cpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    import torch
    import torch.distributed as dist

    import source_kernels  # noqa: F401  (the interpreter switch, before any kernel)

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if "MASTER_ADDR" not in os.environ:             # plain `python script.py`: a world of one
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29571")
    if args.cpu:
        device = torch.device("cpu")
        dist.init_process_group("gloo", rank=rank, world_size=world)
    else:
        if not torch.cuda.is_available():
            sys.stderr.write("ddp_parity.py without --cpu needs CUDA GPUs (one per process)\n")
            raise SystemExit(2)
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device)
    cfg = dict(TOY if args.cpu else FULL)
    try:
        result = run(args, cfg, device, rank, world)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        out = Path(args.outdir)
        out.mkdir(parents=True, exist_ok=True)
        name = "cpu" if args.cpu else gpu_slug(result["provenance"]["gpu"])
        path = out / f"ddp_parity_{name}.json"
        path.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {path}")
        failed = [p for p, r in result["precisions"].items() if not r["parity_ok"]]
        if failed:
            print(f"PARITY FAILED for {', '.join(failed)}", file=sys.stderr)
            raise SystemExit(1)


def run(args, cfg, device, rank, world):
    import torch.distributed as dist

    result = {"world_size": world, "config": cfg, "steps": args.steps,
              "backend": dist.get_backend(),
              "task": "regress each pixel's right-hand neighbour's feature (MSE); SGD; "
                      "dropout 0; offsets jittered a quarter pixel off the bilinear kinks",
              "tolerance_max_rel_loss_gap": TOLERANCE, "precisions": {}}
    if rank == 0:
        result["provenance"] = provenance("ddp_parity.py", dry=device.type == "cpu")
    for precision in args.precisions.split(","):
        reference = None
        if rank == 0:
            reference = train(cfg, device, precision, args.steps, rank=0, world=1,
                              ddp=False)
        dist.barrier()
        ddp = train(cfg, device, precision, args.steps, rank=rank, world=world, ddp=True)
        single_time = None
        if rank == 0:
            single_time = time_steps(cfg, device, precision, args.timed_steps)
        dist.barrier()
        ddp_time = time_steps(cfg, device, precision, args.timed_steps, ddp=True)
        times = [None] * world
        dist.all_gather_object(times, ddp_time)
        if rank != 0:
            continue
        gaps = [abs(a - b) / abs(b) for a, b in zip(ddp, reference)]
        step_ms = statistics.median(t for t in times)
        result["precisions"][precision] = {
            "reference_losses": reference,
            "ddp_losses": ddp,
            "rel_gap_per_step": gaps,
            "max_rel_gap": max(gaps),
            "parity_ok": max(gaps) <= TOLERANCE[precision],
            "step_ms_one_device_per_rank_batch": single_time,
            "step_ms_ddp_per_rank": times,
            "weak_scaling_efficiency": single_time / step_ms if step_ms else None,
            "samples_per_s_one_device": 1e3 * cfg["per_rank_batch"] / single_time,
            "samples_per_s_ddp": 1e3 * cfg["per_rank_batch"] * world / step_ms,
        }
        print(f"{precision}: max relative loss gap {max(gaps):.3g} "
              f"(tolerance {TOLERANCE[precision]:g}); step {single_time:.1f} ms on one device, "
              f"{step_ms:.1f} ms per rank on {world}", flush=True)
    return result


def build(cfg, device, seed=0):
    """The encoder with a linear head, identical on every rank (same seed)."""
    import torch

    from source_kernels.model import DeformableEncoder, jitter_offsets

    class EncoderWithHead(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = DeformableEncoder(cfg["layers"], cfg["d_model"], cfg["d_ffn"], 0.0,
                                             4, cfg["heads"], cfg["points"], core="triton")
            self.head = torch.nn.Linear(cfg["d_model"], cfg["d_model"])

        def forward(self, src, shapes, starts):
            return self.head(self.encoder(src, shapes, starts))

    torch.manual_seed(seed)
    model = EncoderWithHead()
    jitter_offsets(model.encoder, seed + 1, 0.25)
    return model.to(device)


def wrap(model, device, ddp):
    import torch
    if not ddp:
        return model
    return torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None)


def global_batch(cfg, samples, step, device):
    """One step's global batch of ``samples`` samples, the same on every rank: random pyramid
    features, and as target each pixel's right-hand neighbour on its level."""
    import torch

    from source_kernels.inputs import level_start_index, pyramid_shapes
    shapes = pyramid_shapes(*cfg["image"])
    starts = level_start_index(shapes)
    generator = torch.Generator().manual_seed(1000 + step)
    total = int(shapes.prod(dim=1).sum())
    src = torch.randn(samples, total, cfg["d_model"], generator=generator)
    targets = []
    for (height, width), start in zip(shapes.tolist(), starts.tolist()):
        level = src[:, start:start + height * width].view(samples, height, width, -1)
        shifted = torch.zeros_like(level)
        shifted[:, :, :-1] = level[:, :, 1:]
        targets.append(shifted.reshape(samples, height * width, -1))
    return (src.to(device), torch.cat(targets, dim=1).to(device), shapes.to(device),
            starts.to(device))


def autocast(device, precision):
    import contextlib

    import torch
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


def step(model, optimiser, device, precision, src, target, shapes, starts):
    """One SGD step; returns the (local) loss."""
    import torch.nn.functional as F
    with autocast(device, precision):
        loss = F.mse_loss(model(src, shapes, starts).float(), target)
    optimiser.zero_grad(set_to_none=True)
    loss.backward()
    optimiser.step()
    return loss.detach()


def train(cfg, device, precision, steps, *, rank, world, ddp):
    """Losses of the global batch (world * per_rank_batch samples) per step. With ``ddp``,
    each rank trains on samples rank, rank + world, ... and the loss returned is the mean of
    the ranks' losses; without, one device trains on the whole global batch."""
    import torch
    import torch.distributed as dist

    model = wrap(build(cfg, device), device, ddp)
    optimiser = torch.optim.SGD(model.parameters(), lr=cfg["lr"])
    samples = cfg["per_rank_batch"] * dist.get_world_size()
    losses = []
    for i in range(steps):
        src, target, shapes, starts = global_batch(cfg, samples, i, device)
        if ddp:
            src, target = src[rank::world], target[rank::world]
        loss = step(model, optimiser, device, precision, src, target, shapes, starts)
        if ddp:
            dist.all_reduce(loss)
            loss /= world
        losses.append(float(loss))
    return losses


def time_steps(cfg, device, precision, timed, *, ddp=False):
    """Median milliseconds per training step with the per-rank batch (3 warm-up steps)."""
    import torch

    model = wrap(build(cfg, device), device, ddp)
    optimiser = torch.optim.SGD(model.parameters(), lr=cfg["lr"])
    batch = global_batch(cfg, cfg["per_rank_batch"], 0, device)
    times = []
    for i in range(3 + timed):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        step(model, optimiser, device, precision, *batch)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= 3:
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


if __name__ == "__main__":
    main()
