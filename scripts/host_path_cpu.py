"""The operator's host path on a CPU: what one eager call costs in Python, without a GPU.

    python3 scripts/host_path_cpu.py [--calls 5000] [--profile]

On a machine without a GPU the kernels run in Triton's interpreter, which would swamp the
host path, so here every launch is a stub: a call takes the operator's eager path exactly
as on a GPU (checks of a known signature, the shape tensors, the output's allocation, the
pointers, the bound launch) except the launcher itself.  Tiny tensors keep the CPU's own
allocations and zero fills negligible.  Each figure is the best of 5 repeats of ``--calls``
back-to-back calls, in microseconds per call, beside two yardsticks measured in the same
process: one torch op (``torch.empty_like``) and an autograd Function that launches
nothing.  A GPU host's CPU is slower or faster by its own factor: read the ratios.
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TRITON_INTERPRET", "1")

import torch

import source_kernels
from source_kernels import op
from source_kernels.bench import _Identity
from source_kernels.inputs import make_inputs

ARG_NAMES = ("value", "value_spatial_shapes", "value_level_start_index", "sampling_locations",
             "attention_weights")


class StubLaunch:
    """Stands for a BoundLaunch: takes the pointers, launches nothing."""
    device = -1

    def __call__(self, *pointers):
        return None


def per_call_us(fn, calls):
    fn()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args(argv)
    inputs = make_inputs(1, 30, 8, 32, [[2, 3], [1, 2]], 4, dtype=torch.bfloat16)
    pos = [inputs[k] for k in ARG_NAMES]
    leaves = [pos[0].clone().requires_grad_(), pos[3].clone().requires_grad_(),
              pos[4].clone().requires_grad_()]
    grad = torch.randn(1, 30, 256).to(torch.bfloat16)
    x = torch.randn(1, 30, 256, requires_grad=True)
    op._current_device = lambda: -1            # the stub's "device" is always current
    call = op._call_for(*pos, 64)
    call.forward_bound = StubLaunch()
    call.backward_bound[True] = StubLaunch()   # bf16 accumulates in fp32 off-GPU

    def forward():
        source_kernels.multi_scale_deformable_attn(*pos)

    def forward_backward():
        for leaf in leaves:
            leaf.grad = None
        source_kernels.multi_scale_deformable_attn(leaves[0], pos[1], pos[2], leaves[1],
                                                   leaves[2]).backward(grad)

    def identity_round_trip():
        x.grad = None
        _Identity.apply(x).backward(grad.float())

    figures = {
        "one torch op (torch.empty_like of value)": lambda: torch.empty_like(pos[0]),
        "eager forward, no autograd (launch stubbed)": forward,
        "eager forward+backward through autograd (launches stubbed)": forward_backward,
        "an autograd Function launching nothing, forward+backward": identity_round_trip,
    }
    print(f"torch {torch.__version__}, {args.calls} calls, best of 5 repeats, us per call")
    for name, fn in figures.items():
        print(f"{per_call_us(fn, args.calls):8.2f}  {name}")
    if args.profile:
        for name, fn in (("forward", forward), ("forward+backward", forward_backward)):
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(args.calls):
                fn()
            profiler.disable()
            print(f"\n{name}: own time under cProfile (read the shares)")
            pstats.Stats(profiler).sort_stats("tottime").print_stats(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
