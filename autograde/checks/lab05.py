"""Hidden checks of lab 05 (forward, correct): the student's forward kernel, through the lab's
launcher, on fresh inputs of every edge case, against the fp64 grid_sample reference."""
from __future__ import annotations

import torch

from . import _operator as op
from .common import count_kernel_launches, forbid_references, fresh_generator


def _run(msda_forward, args, **launch):
    with forbid_references(msda_forward), count_kernel_launches() as launches:
        got = msda_forward(*args.values(), **launch)
    if launches.count == 0:
        raise AssertionError("msda_forward launched no Triton kernel: the work has to be done "
                             "by your msda_forward_kernel")
    return got


def _check(msda_forward, cases, label):
    gen = fresh_generator()
    seed = gen.initial_seed()
    for description, kwargs, launch in cases(gen):
        args = op.inputs(gen, **kwargs)
        dtype = args["value"].dtype
        expected = op.forward_fp64(args)
        got = _run(msda_forward, args, **launch)
        what = f"{label}, {description} (hidden check, seed {seed})"
        if isinstance(got, torch.Tensor) and got.dtype != dtype:
            raise AssertionError(f"{what}: the output must have the dtype of value, {dtype}, "
                                 f"got {got.dtype}")
        op.assert_scaled(got, expected, dtype, what, op.MSDA_OUTPUT_AXES,
                         hint=lambda: op.forward_hint(got, args, dtype))


def check_forward_inside(msda_forward):
    """Locations well inside the maps; two levels; several blocks of queries."""
    def cases(gen):
        yield ("2 levels, every location inside", dict(
            batch=1, queries=20, heads=2, channels=8, shapes=[[5, 7], [3, 4]], points=2,
            outside=-0.05), dict(block_q=8))
    _check(msda_forward, cases, "forward")


def check_forward_outside(msda_forward):
    """Locations on the edges and outside: corners off the map contribute zero."""
    def cases(gen):
        yield ("locations up to 30% outside the map", dict(
            batch=1, queries=12, heads=1, channels=4, shapes=[[4, 6], [2, 3]], points=3,
            outside=0.3), {})
    _check(msda_forward, cases, "forward")
    gen = fresh_generator()
    seed = gen.initial_seed()
    args = op.inputs(gen, 1, 8, 1, 4, [[3, 5], [2, 2]], 2)
    edges = torch.tensor([0.0, 1.0, 0.5, -0.25, 1.25, -1e4, 1e4, 1.0 + 1e-6, -1e-6])
    pick = torch.randint(0, len(edges), args["sampling_locations"].shape, generator=gen)
    args["sampling_locations"] = edges[pick].to(args["sampling_locations"].device)
    expected = op.forward_fp64(args)
    got = _run(msda_forward, args)
    op.assert_scaled(got, expected, torch.float32,
                     f"forward with locations exactly on the edges, just off them and far "
                     f"outside (hidden check, seed {seed})", op.MSDA_OUTPUT_AXES,
                     hint="a corner outside the map adds zero; clamp the corner index before "
                          "casting a far-away coordinate to int")


def check_forward_level_shapes(msda_forward):
    """Non-square levels, a 1x1 level and four levels of different shapes."""
    def cases(gen):
        yield ("levels (2, 7), (1, 1), (5, 1), (3, 3)", dict(
            batch=1, queries=9, heads=2, channels=4, shapes=[[2, 7], [1, 1], [5, 1], [3, 3]],
            points=2, outside=0.1), {})
    _check(msda_forward, cases, "forward")


def check_forward_channels(msda_forward):
    """Channel counts that are not powers of two (and heads side by side in the output)."""
    def cases(gen):
        yield ("D = 3 channels, 3 heads", dict(batch=1, queries=5, heads=3, channels=3,
                                               shapes=[[4, 3]], points=2), {})
        yield ("D = 7 channels, batch 2", dict(batch=2, queries=5, heads=1, channels=7,
                                               shapes=[[3, 5], [2, 2]], points=1), {})
    _check(msda_forward, cases, "forward")


def check_forward_half_precision(msda_forward):
    """fp16 and bf16 inputs: fp32 accumulation inside, the output in the input's dtype."""
    def cases(gen):
        for dtype in (torch.float16, torch.bfloat16):
            yield (f"{str(dtype).replace('torch.', '')} inputs", dict(
                batch=1, queries=8, heads=1, channels=8, shapes=[[4, 5], [2, 2]], points=2,
                dtype=dtype), {})
    _check(msda_forward, cases, "forward")


def check_program_map(launch_grid, program_of):
    """The grid covers every output row exactly once, with the kernel's mapping."""
    gen = fresh_generator()
    seed = gen.initial_seed()
    for _ in range(4):
        batch, queries, heads = (int(v) for v in torch.randint(1, 9, (3,), generator=gen))
        queries = queries * int(torch.randint(1, 40, (1,), generator=gen))
        block_q = 2 ** int(torch.randint(0, 7, (1,), generator=gen))
        expected_grid = (-(-queries // block_q), batch * heads)
        with forbid_references(launch_grid, program_of):
            grid = launch_grid(batch, queries, heads, block_q)
            rows = [(b, q, m, program_of(b, q, m, heads, block_q))
                    for b in range(batch) for q in range(queries) for m in range(heads)]
        what = (f"B = {batch}, Q = {queries}, M = {heads}, BLOCK_Q = {block_q} (hidden check, "
                f"seed {seed})")
        if tuple(grid) != expected_grid:
            raise AssertionError(f"launch_grid with {what}: expected {expected_grid}, got "
                                 f"{tuple(grid)}")
        for b, q, m, got in rows:
            expected = (q // block_q, b * heads + m, q % block_q)
            if tuple(got) != expected:
                raise AssertionError(f"program_of({b}, {q}, {m}) with {what}: expected "
                                     f"(pid_q, pid_bm, row) = {expected}, got {tuple(got)}")
