"""Hidden checks of lab 07 (the other direction): the three gradients written by hand in
PyTorch, against autograd through the fp64 grid_sample reference."""
from __future__ import annotations

import torch

from . import _operator as op
from .common import forbid_references, fresh_generator

TOL = {torch.float64: 1e-9}


def _cases(gen):
    """(description, inputs, grad_output), fp64 on the CPU."""
    yield ("3 levels incl. 1x1, locations up to 20% outside", op.inputs(
        gen, 2, 5, 2, 3, [[4, 5], [1, 1], [3, 2]], 2, dtype=torch.float64, outside=0.2,
        on="cpu"))
    yield ("queries sharing corners (local locations on a 3x4 map)", op.inputs(
        gen, 1, 6, 1, 4, [[3, 4]], 3, dtype=torch.float64, distribution="local",
        sigma_pixels=0.5, on="cpu"))


def _check(student, index, name, axes, hint):
    gen = fresh_generator()
    seed = gen.initial_seed()
    for description, args in _cases(gen):
        out_shape = (args["value"].shape[0], args["sampling_locations"].shape[1],
                     args["value"].shape[2] * args["value"].shape[3])
        grad_output = torch.randn(out_shape, generator=gen, dtype=torch.float64)
        expected = op.gradients_fp64(args, grad_output)[index]
        with forbid_references(student):
            got = student(grad_output.clone(), *(t.clone() for t in args.values()))
        what = f"{name}, {description} (hidden check, seed {seed})"
        op.assert_scaled(got, expected, torch.float64, what, axes, table=TOL,
                         hint=lambda: hint(got, expected, args))


def _loc_hint(got, expected, args):
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        return "the result has the shape of sampling_locations, (B, Q, M, L, K, 2)"
    wh = args["value_spatial_shapes"].flip(-1).double()[:, None, :]          # (L, 1, 2): W, H
    if op.mismatch(got, expected / wh, torch.float64, "", table=TOL) is None:
        return ("your gradient is the one with respect to the pixel coordinate x_im: the chain "
                "rule through x_im = x * W - 0.5 multiplies it by W (and by H for y)")
    if op.mismatch(got, expected.flip(-1), torch.float64, "", table=TOL) is None:
        return "x and y are swapped: the last axis is (x, y), x along W"
    return ("d sample / d x_im = (1 - dy) (v01 - v00) + dy (v11 - v10); corners outside the "
            "map have v = 0; then multiply by the attention weight and by W")


def _attn_hint(got, expected, args):
    return ("d out / d attn[l, k] is the bilinear sample of that point: grad_attn = <g, "
            "sum_c w_c v_c>, one number per (b, q, m, l, k)")


def _value_hint(got, expected, args):
    return ("each sample adds attn * w_c * g to the row of each of its corners that lies on "
            "the map; several samples can hit the same row, so add (index_add_ / scatter_add_), "
            "do not assign")


def check_grad_attention_weights(grad_attention_weights):
    _check(grad_attention_weights, 2, "grad_attention_weights", op.PARAM_AXES, _attn_hint)


def check_grad_sampling_locations(grad_sampling_locations):
    _check(grad_sampling_locations, 1, "grad_sampling_locations", op.LOC_AXES, _loc_hint)


def check_grad_value(grad_value):
    _check(grad_value, 0, "grad_value", op.VALUE_AXES, _value_hint)
