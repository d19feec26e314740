"""What the hidden checks of labs 05-10 share: inputs on the grading device, the fp64
reference (forward and gradients), comparisons scaled to the result, and hints that recognise
the usual wrong answers; and the isolation probes of the forward (``probes``: inputs only,
built in the grading kernel of labs 01, 02 and 05 too, judged by ``diagnose.locate``)."""
from __future__ import annotations

import os

import torch

from source_kernels.inputs import make_inputs
from source_kernels.testing import MSDA_OUTPUT_AXES, explain_mismatch

__all__ = ["device", "draw_seed", "inputs", "probes", "forward_fp64", "gradients_fp64",
           "assert_scaled", "forward_hint", "TOLERANCE", "GRAD_TOLERANCE", "MSDA_OUTPUT_AXES", "LOC_AXES",
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


# ---------------------------------------------------------------------- location by isolation
# Probes switch on one term of the forward at a time, each adding one to the one before, so
# the first probe that goes wrong says which term is wrong.  (label, term, sizes) with sizes
# (batch, heads, channels, shapes, points, kind); kind says how locations and weights are set.
PROBE_PLAN = [
    ("one batch element, head, level and point, D = 1, every location on a pixel centre",
     "the corner's row and column: at a pixel centre only corner (y0, x0) has a weight (1), so "
     "the output is exactly that pixel's value; its row in S is start + r * W + c",
     (1, 1, 1, [[2, 4]], 1, "centre")),      # powers of two: a centre is exact in fp32
    ("the same, locations between pixel centres (all four corners on the map)",
     "the corner weights (the pixel centres were right): (1 - dy)(1 - dx), (1 - dy) dx, "
     "dy (1 - dx), dy dx for (y0, x0), (y0, x1), (y1, x0), (y1, x1)",
     (1, 1, 1, [[3, 4]], 1, "between")),
    ("the same with D = 3 channels",
     "the channel term (one channel was right): channel d of a value row, and of an output "
     "row, is d elements after the row's first",
     (1, 1, 3, [[3, 4]], 1, "between")),
    ("two points, all attention on level 0, point 1",
     "the point index k (one point was right): the location and the weight of (l, k) sit at "
     "sample index (((b*Q + q)*M + m)*L + l)*K + k",
     (1, 1, 3, [[3, 4]], 2, "point1")),
    ("two levels, all attention on level 1",
     "the level term (level 0 alone was right): level l's map is spatial_shapes[l] = (H, W) and "
     "its rows start at level_start_index[l]",
     (1, 1, 3, [[3, 4], [2, 5]], 1, "level1")),
    ("two levels, two points, attention weights as given",
     "the attention weights and the sum (one-hot weights were right): each of the L*K samples "
     "is scaled by its own weight, and all of them are added up",
     (1, 1, 3, [[3, 4], [2, 5]], 2, "weights")),
    ("one level, one point, two heads",
     "the head term (one head was right): head m's values are at ((b*S + s)*M + m)*D, its "
     "output at ((b*Q + q)*M + m)*D, and it reads its own locations and weights",
     (1, 2, 3, [[3, 4]], 1, "between")),
    ("one level, one point, one head, two batch elements",
     "the batch term (one batch element was right): batch b's values start at b*S*M*D, its "
     "locations, weights and outputs at b*Q*M*(...)",
     (2, 1, 3, [[3, 4]], 1, "between")),
]
PROBE_QUERIES = 5


def probes(gen, dtype=torch.float64):
    """[(label, term, args)]: the probes of :data:`PROBE_PLAN`, inputs drawn from ``gen`` (a
    torch.Generator), every location on the maps, args the operator's five arguments (a
    dict, CPU tensors of ``dtype``)."""
    found = []
    queries = PROBE_QUERIES
    for label, term, (batch, heads, channels, shape_list, points, kind) in PROBE_PLAN:
        shapes = torch.tensor(shape_list, dtype=torch.int64)
        areas = shapes[:, 0] * shapes[:, 1]
        starts = torch.cat([torch.zeros(1, dtype=torch.int64), areas.cumsum(0)[:-1]])
        total = int(areas.sum())
        levels = len(shape_list)
        value = torch.randn(batch, total, heads, channels, generator=gen, dtype=torch.float64)
        loc = torch.empty(batch, queries, heads, levels, points, 2, dtype=torch.float64)
        for lvl, (height, width) in enumerate(shape_list):
            size = torch.tensor([width, height], dtype=torch.float64)
            if kind == "centre":
                cols = torch.randint(0, width, (batch, queries, heads, points), generator=gen)
                rows = torch.randint(0, height, (batch, queries, heads, points), generator=gen)
                pixel = torch.stack([cols, rows], -1).double()
            else:                       # x_im in [0.1, W - 1.1]: four corners on the map
                pixel = 0.1 + torch.rand(batch, queries, heads, points, 2, generator=gen,
                                         dtype=torch.float64) * (size - 1.2).clamp(min=0)
            loc[:, :, :, lvl] = (pixel + 0.5) / size
        attn = torch.zeros(batch, queries, heads, levels, points, dtype=torch.float64)
        if kind == "point1":
            attn[..., 0, 1] = 1.0
        elif kind == "level1":
            attn[..., 1, 0] = 1.0
        elif kind == "weights":
            attn = torch.rand(batch, queries, heads, levels, points, generator=gen,
                              dtype=torch.float64) + 0.25
        else:
            attn[...] = 1.0
        args = {"value": value.to(dtype), "value_spatial_shapes": shapes,
                "value_level_start_index": starts, "sampling_locations": loc.to(dtype),
                "attention_weights": attn.to(dtype)}
        found.append((label, term, args))
    return found



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


def mismatch(got, expected, dtype, what, axes=None, table=TOLERANCE, scale=None):
    """explain_mismatch with a tolerance scaled to the largest |expected| (or to ``scale``,
    the size of the terms that add up to it); None when close."""
    got = _as_tensor(got, what)
    if scale is None:
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
