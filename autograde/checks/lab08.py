"""Hidden checks of lab 08 (concurrent writes): the racy scatter loses updates the way a
single program must, the prediction of how many, the atomic scatter, and the backward kernel
against autograd through the fp64 reference."""
from __future__ import annotations

import torch

from . import _operator as op
from .common import count_kernel_launches, forbid_references, fresh_generator


def _launched(fn, *args, **kwargs):
    with forbid_references(fn), count_kernel_launches() as launches:
        got = fn(*args, **kwargs)
    if launches.count == 0:
        raise AssertionError(f"{getattr(fn, '__name__', 'the function')} launched no Triton "
                             "kernel")
    if not isinstance(got, torch.Tensor):
        raise AssertionError(f"expected a tensor, got {type(got).__name__}")
    return got.detach().cpu()


def check_naive_scatter(scatter_add_naive):
    """One program (n <= block): distinct indices are added exactly; for an index that occurs
    several times, exactly one of its updates survives (which one is up to the hardware)."""
    gen = fresh_generator()
    seed = gen.initial_seed()
    dev = op.device()
    rows, n = 12, 40
    base = torch.randn(rows, generator=gen)
    index = torch.randint(0, rows, (n,), generator=gen)
    index[:4] = rows - 1                                    # at least one duplicated index
    values = torch.randn(n, generator=gen)
    got = _launched(scatter_add_naive, base.to(dev), index.to(dev), values.to(dev), block=64)
    what = f"scatter_add_naive of {n} updates into {rows} rows in one program (hidden check, seed {seed})"
    if got.shape != base.shape:
        raise AssertionError(f"{what}: expected shape {tuple(base.shape)}, got {tuple(got.shape)}")
    for row in range(rows):
        hits = (index == row).nonzero().reshape(-1)
        if hits.numel() == 0:
            if got[row] != base[row]:
                raise AssertionError(f"{what}: row {row} gets no update but changed from "
                                     f"{base[row]:.6g} to {got[row]:.6g}")
            continue
        candidates = base[row] + values[hits]               # old value + one of the updates
        if not (got[row] == candidates).any():
            total = base[row] + values[hits].sum()
            extra = (" That is the full sum: this stage wants the plain load-add-store, whose "
                     "lost updates the next stage fixes." if torch.isclose(got[row], total)
                     else "")
            raise AssertionError(
                f"{what}: row {row} receives {hits.numel()} updates; with load, add, store in "
                f"one program every lane reads the same old value {base[row]:.6g}, so the row "
                f"must end as old + one of the updates ({', '.join(f'{v:.6g}' for v in candidates.tolist())}), "
                f"got {got[row]:.6g}.{extra}")


def check_lost_updates(lost_updates):
    gen = fresh_generator()
    seed = gen.initial_seed()
    for n, rows, block in ((50, 7, 16), (64, 64, 64), (33, 2, 8), (10, 100, 4), (1, 1, 1)):
        index = torch.randint(0, rows, (n,), generator=gen)
        expected = sum(int(c.numel() - torch.unique(c).numel()) for c in index.split(block))
        with forbid_references(lost_updates):
            got = lost_updates(index.clone(), block)
        if not isinstance(got, int) or isinstance(got, bool) or got != expected:
            raise AssertionError(f"lost_updates of {n} indices into {rows} rows, {block} per "
                                 f"program: expected {expected}, got {got!r} (hidden check, "
                                 f"seed {seed}). Per program, every index after the first "
                                 "occurrence of its value is an update that is lost.")


def check_atomic_scatter(scatter_add_atomic):
    gen = fresh_generator()
    seed = gen.initial_seed()
    dev = op.device()
    for rows, n, block in ((5, 200, 32), (1, 37, 16), (50, 64, 64)):
        base = torch.randn(rows, generator=gen)
        index = torch.randint(0, rows, (n,), generator=gen)
        values = torch.randn(n, generator=gen)
        expected = base.double().index_add(0, index, values.double())
        got = _launched(scatter_add_atomic, base.to(dev), index.to(dev), values.to(dev),
                        block=block)
        op.assert_scaled(got, expected, torch.float32,
                         f"scatter_add_atomic of {n} updates into {rows} rows, {block} per "
                         f"program (hidden check, seed {seed})", ("row",),
                         hint="tl.atomic_add(out_ptr + idx, vals, mask=mask) adds every lane's "
                              "value, duplicates included")


def _backward_case(gen):
    """A 1x1 level (every query of a block hits its only pixel: guaranteed collisions) and a
    small level with local locations (neighbouring queries share corners)."""
    args = op.inputs(gen, 1, 10, 2, 4, [[3, 4], [1, 1]], 2, distribution="local",
                     sigma_pixels=0.7)
    out_shape = (1, 10, 2 * 4)
    grad_output = torch.randn(out_shape, generator=gen).to(args["value"].device)
    return args, grad_output


def _run_backward(msda_backward, args, grad_output):
    with forbid_references(msda_backward), count_kernel_launches() as launches:
        got = msda_backward(grad_output, *args.values(), block_q=8)
    if launches.count == 0:
        raise AssertionError("msda_backward launched no Triton kernel")
    if not (isinstance(got, (tuple, list)) and len(got) == 3):
        raise AssertionError("msda_backward must return (grad_value, grad_sampling_locations, "
                             f"grad_attention_weights), got {type(got).__name__}")
    return got


def check_backward_grad_value(msda_backward):
    gen = fresh_generator()
    seed = gen.initial_seed()
    args, grad_output = _backward_case(gen)
    expected = op.gradients_fp64(args, grad_output)[0]
    got = _run_backward(msda_backward, args, grad_output)[0]
    op.assert_scaled(got, expected, torch.float32,
                     f"grad_value with queries sharing corners (hidden check, seed {seed})",
                     op.VALUE_AXES, table=op.GRAD_TOLERANCE,
                     hint="queries of one program that share a corner write the same row of "
                          "grad_value: load + store loses all but one of them; use "
                          "tl.atomic_add")


def check_backward_grad_sampling(msda_backward):
    gen = fresh_generator()
    seed = gen.initial_seed()
    args, grad_output = _backward_case(gen)
    _, grad_loc, grad_attn = op.gradients_fp64(args, grad_output)
    got = _run_backward(msda_backward, args, grad_output)
    what = f"(hidden check, seed {seed})"
    op.assert_scaled(got[2], grad_attn, torch.float32, f"grad_attention_weights {what}",
                     op.PARAM_AXES, table=op.GRAD_TOLERANCE,
                     hint="grad_attn = sum over channels of g * (the bilinear sample)")
    op.assert_scaled(got[1], grad_loc, torch.float32, f"grad_sampling_locations {what}",
                     op.LOC_AXES, table=op.GRAD_TOLERANCE,
                     hint="grad_x = attn * W * <g, (1-dy)(v01-v00) + dy(v11-v10)>; grad_y "
                          "likewise with H")
