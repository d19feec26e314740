"""Compile the sweep's kernel candidates in parallel before anything is timed.

    python3 scripts/gpu/warm_kernels.py [--workers N] [--budget-s S] [--json PATH]

On a GPU host whose CPU needs 10-20 s per kernel, compiling the launch sweep's candidates
one after another would take most of a GPU call.  Here worker processes each launch a share
of them once on the presets' inputs, exactly as ``source_kernels.bench.sweep`` will: the
same call, so the same specialisation, and Triton's cache on disk (``TRITON_CACHE_DIR``)
holds every compiled kernel when the sweep starts.  Nothing is timed; the GPU work is a few
launches.  Writes a summary (compiled, failed, seconds) to ``--json``.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# (preset, dtype) whose candidates are compiled; the presets of one regime share their
# kernels' specialisation, so one preset per regime is enough.
WARM = [("decoder", "bf16"), ("encoder", "bf16"), ("decoder", "fp32"), ("encoder", "fp32"),
        ("decoder", "fp64"), ("encoder", "fp64"), ("encoder", "fp16")]


def tasks():
    """Every (direction, preset, dtype, kernel, block, warps) the sweep launches, the
    reference launches (fp64 loop kernels) and fp16 forward candidates of the encoder,
    the costliest (most unrolled) first."""
    sys.path.insert(0, str(REPO))
    from source_kernels.bench import candidates_for
    from source_kernels.forward import regime
    from source_kernels.inputs import PRESETS, pyramid_shapes
    todo = []
    for preset, dtype in WARM:
        spec = PRESETS[preset]
        size = regime(spec.batch, spec.num_queries(pyramid_shapes()), spec.heads)
        directions = ("forward",) if dtype == "fp16" else ("forward", "backward")
        sweep_dtype = "bf16" if dtype == "fp16" else dtype
        for direction in directions:
            for kernel, block, warps in candidates_for(direction, size, sweep_dtype):
                todo.append((direction, preset, dtype, kernel, block, warps))
        if dtype == "fp64":
            todo += [("forward", preset, "fp64", "loop", 16, 4),
                     ("backward", preset, "fp64", "loop", 16, 4)]
    todo = list(dict.fromkeys(todo))
    cost = {"sample": 3, "level": 2}
    todo.sort(key=lambda t: -max([cost.get(p, 1) for p in t[3].split("-")] +
                                 [2 if t[3] == "loop" else 1]))
    return todo


def work(share, deadline, queue):
    sys.path.insert(0, str(REPO))
    import torch

    import source_kernels  # noqa: F401
    from source_kernels.backward import msda_backward
    from source_kernels.forward import msda_forward
    from source_kernels.inputs import preset_inputs
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
              "fp64": torch.float64}
    inputs = {}
    for direction, preset, dtype, kernel, block, warps in share:
        if time.time() > deadline:
            queue.put(("skipped", (direction, preset, dtype, kernel, block, warps), 0.0, ""))
            continue
        start = time.time()
        try:
            key = (preset, dtype)
            if key not in inputs:
                inputs.clear()
                args = preset_inputs(preset, dtype=dtypes[dtype], device="cuda")
                pos = [args[k] for k in ("value", "value_spatial_shapes",
                                         "value_level_start_index", "sampling_locations",
                                         "attention_weights")]
                grad = torch.randn(pos[0].shape[0], pos[3].shape[1],
                                   pos[0].shape[2] * pos[0].shape[3], device="cuda",
                                   dtype=pos[0].dtype)
                inputs[key] = (pos, grad)
            pos, grad = inputs[key]
            if direction == "forward":
                msda_forward(*pos, kernel=kernel, block_q=block, num_warps=warps)
            else:
                msda_backward(grad, *pos, kernel=kernel, block_q=block, num_warps=warps)
            torch.cuda.synchronize()
            queue.put(("compiled", (direction, preset, dtype, kernel, block, warps),
                       time.time() - start, ""))
        except Exception as error:                                  # noqa: BLE001
            queue.put(("failed", (direction, preset, dtype, kernel, block, warps),
                       time.time() - start, f"{type(error).__name__}: {str(error)[:300]}"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 6))
    parser.add_argument("--budget-s", type=float, default=150.0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    started = time.time()
    todo = tasks()
    deadline = started + args.budget_s
    shares = [todo[i::args.workers] for i in range(args.workers)]
    context = mp.get_context("spawn")
    queue = context.Queue()
    workers = [context.Process(target=work, args=(share, deadline, queue), daemon=True)
               for share in shares if share]
    for process in workers:
        process.start()
    report = {"workers": len(workers), "tasks": len(todo), "done": []}
    while len(report["done"]) < len(todo) and time.time() < deadline + 60:
        try:
            status, task, seconds, error = queue.get(timeout=5)
        except Exception:                                            # noqa: BLE001
            if not any(p.is_alive() for p in workers):
                break
            continue
        report["done"].append({"status": status, "task": list(task), "seconds": seconds,
                               "error": error})
        print(f"[{time.time() - started:6.1f}s] {status:8s} {seconds:5.1f}s {task} {error}",
              flush=True)
    for process in workers:
        process.join(timeout=1)
        if process.is_alive():
            process.terminate()
    report["seconds"] = time.time() - started
    counts = {}
    for entry in report["done"]:
        counts[entry["status"]] = counts.get(entry["status"], 0) + 1
    report["counts"] = counts
    print(f"warm-up: {counts} of {len(todo)} in {report['seconds']:.0f} s", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
