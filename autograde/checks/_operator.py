"""What the hidden checks of labs 05-10 share: inputs on the grading device, the fp64
reference (forward and gradients), comparisons scaled to the result, and hints that recognise
the usual wrong answers."""
from __future__ import annotations

import os

import torch

from source_kernels.inputs import make_inputs
from source_kernels.testing import MSDA_OUTPUT_AXES, explain_mismatch

__all__ = ["device", "draw_seed", "inputs", "forward_fp64", "gradients_fp64", "assert_scaled",
           "forward_hint", "TOLERANCE", "GRAD_TOLERANCE", "MSDA_OUTPUT_AXES", "LOC_AXES",
           "PARAM_AXES", "VALUE_AXES"]

# Error allowed relative to the largest magnitude of the fp64 reference (as tests/test_operator.py)
TOLERANCE = {torch.float64: 1e-10, torch.float32: 2e-5, torch.float16: 4e-3,
             torch.bfloat16: 3e-2}
GRAD_TOLERANCE = {torch.float64: 1e-10, torch.float32: 5e-5, torch.float16: 1e-2,
                  torch.bfloat16: 6e-2}
LOC_AXES = ("batch", "query", "head", "level", "point", "x/y")
PARAM_AXES = ("batch", "query", "head", "level", "point")
VALUE_AXES = ("batch", "row of S", "head", "channel")
ARG_NAMES = ("value", "value_spatial_shapes", "value_level_start_index", "sampling_locations",
             "attention_weights")


def device() -> str:
    """Where kernels run while grading: the GPU when there is one and the interpreter is off."""
    interpreting = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    return "cuda" if torch.cuda.is_available() and not interpreting else "cpu"


def draw_seed(gen: torch.Generator) -> int:
    return int(torch.randint(0, 2 ** 31 - 1, (1,), generator=gen))


def inputs(gen, batch, queries, heads, channels, shapes, points, *, dtype=torch.float32,
           outside=0.05, distribution="uniform", sigma_pixels=2.0, on=None):
    """The operator's five arguments (a dict in argument order) drawn from ``gen``."""
    return make_inputs(batch, queries, heads, channels, [list(s) for s in shapes], points,
                       dtype=dtype, device=on or device(), seed=draw_seed(gen), outside=outside,
                       distribution=distribution, sigma_pixels=sigma_pixels)


def _cpu64(args):
    return {k: v.detach().cpu().double() if v.is_floating_point() else v.detach().cpu()
            for k, v in args.items()}


def _reference():
    """The reference module, imported only where expected values are computed: the grader's
    replay (the grading kernel's view of the course has no reference)."""
    from source_kernels import reference
    return reference


def forward_fp64(args):
    """The grid_sample reference in fp64 on the CPU: (B, Q, M*D)."""
    reference = _reference()
    with torch.no_grad():
        return reference.msda_grid_sample(**_cpu64(args))


def gradients_fp64(args, grad_output):
    """(grad_value, grad_sampling_locations, grad_attention_weights) of the fp64 reference."""
    reference = _reference()
    ref = _cpu64(args)
    leaves = [ref[k].requires_grad_() for k in ("value", "sampling_locations",
                                                "attention_weights")]
    out = reference.msda_grid_sample(**ref)
    return torch.autograd.grad(out, leaves, grad_output.detach().cpu().double())


def _as_tensor(got, what):
    if not isinstance(got, torch.Tensor):
        raise AssertionError(f"{what}: expected a torch.Tensor, got {type(got).__name__}")
    return got


def mismatch(got, expected, dtype, what, axes=None, table=TOLERANCE):
    """explain_mismatch with a tolerance scaled to the largest |expected|; None when close."""
    got = _as_tensor(got, what)
    scale = max(expected.abs().max().item(), 1e-6) if expected.numel() else 1.0
    return explain_mismatch(got.detach().cpu().double(), expected.double(),
                            atol=table[dtype] * scale, rtol=0.0, axes=axes, what=what)


def assert_scaled(got, expected, dtype, what, axes=None, table=TOLERANCE, hint=None):
    message = mismatch(got, expected, dtype, what, axes, table)
    if message is not None:
        raise AssertionError(message + (f"\nHint: {hint() if callable(hint) else hint}"
                                        if hint else ""))


def forward_hint(got, args, dtype):
    """Name the usual mistake when ``got`` equals the forward of a wrong convention (the
    diagnosis lives in ``autograde.checks.diagnose``)."""
    from . import diagnose
    return diagnose.forward_hint(got, args, dtype)
