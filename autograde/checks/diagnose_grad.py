"""Name the usual mistakes of a hand-written MSDA backward pass.

``explain(name, got, expected, args, grad_output, dtype)`` recomputes the gradient ``name``
under each typical wrong formula and returns the hint of the first one that ``got`` equals
(a sign error, a missing factor W or H, corners off the map receiving gradient, grad_attn
without the corner weights, d_x and d_y swapped, a missing attention weight, contributions a
scatter loses), or None.  ``garbage`` names a read past the tensor.

Each wrong gradient is built from the float64 reference on changed inputs (locations moved,
a map padded with the rows an unmasked read would reach, attention weights set to one) or
from the right gradient by the change a mistake makes (a factor, a sign, a swap): this module
does not state the gradients' formulas.  It runs only when a check judges and has already
found a mismatch, never in the grading kernel; it imports the reference and lab 07's corner
bookkeeping inside its functions.
"""
from __future__ import annotations

import torch

from . import _operator as op

__all__ = ["explain", "garbage", "shared_rows", "GRADIENT_AXES", "GRADIENT_INDEX"]

GRADIENT_AXES = {"grad_value": op.VALUE_AXES, "grad_sampling_locations": op.LOC_AXES,
                 "grad_attention_weights": op.PARAM_AXES}
GRADIENT_INDEX = {"grad_value": 0, "grad_sampling_locations": 1, "grad_attention_weights": 2}
_CORNERS = ("00", "01", "10", "11")
_MAX_PADDING = 64          # pixels; locations further out than this are not emulated


# ------------------------------------------------------------------ inputs, moved or padded
def _cpu64(args):
    return {k: v.detach().cpu().double() if v.is_floating_point() else v.detach().cpu()
            for k, v in args.items()}


def _sizes(args):
    """(L, 2) float64 as (W, H), ready to broadcast against (..., L, K, 2)."""
    return args["value_spatial_shapes"].detach().cpu().flip(-1).double()[:, None, :]


def _pixel(args):
    """The pixel coordinates (x_im, y_im) and their floors, each (B, Q, M, L, K)."""
    im = args["sampling_locations"].detach().cpu().double() * _sizes(args) - 0.5
    return im[..., 0], im[..., 1], im[..., 0].floor(), im[..., 1].floor()


def _at_pixels(args, x_im, y_im):
    """The inputs with the locations moved to the pixel coordinates (x_im, y_im)."""
    loc = (torch.stack([x_im, y_im], dim=-1) + 0.5) / _sizes(args)
    return dict(_cpu64(args), sampling_locations=loc)


def _gradient(name, args, grad_output):
    return op.gradients_fp64(args, grad_output)[GRADIENT_INDEX[name]]


def _unmasked(name, args, grad_output, off_map):
    """``name`` as a backward pass computes it that does not mask the corners off the map.

    ``off_map="row 0"``: lab 07's ``sample_corners`` gives such a corner row 0 and value 0, so
    it reads 0 and its contribution lands in row 0 of S.  ``off_map="flat"``: a kernel reads
    and writes corner (r, c) of level l at row start_l + r*W_l + c of S, wherever that is; a
    row outside the tensor reads NaN (the checks pad their tensors with it) and its write is
    lost.  Built from the reference on maps padded by P pixels on every side, whose border
    holds what the unmasked pass reads there."""
    a = _cpu64(args)
    value = a["value"]
    batch, total, heads, channels = value.shape
    shapes = a["value_spatial_shapes"].long()
    starts = a["value_level_start_index"].long()
    _, _, x0, y0 = _pixel(args)
    reach = max(float((-x0).max()), float((-y0).max()),
                float((x0 + 2 - shapes[:, 1].double()[:, None]).max()),
                float((y0 + 2 - shapes[:, 0].double()[:, None]).max()), 0.0)
    pad = int(reach) + 1
    if pad > _MAX_PADDING:
        return None
    flat_value = value.reshape(batch * total, heads, channels)
    nan_row = torch.full((heads, channels), float("nan"), dtype=torch.float64)
    blocks, targets = [], []
    for level, (height, width) in enumerate(shapes.tolist()):
        r = torch.arange(-pad, height + pad)[:, None]
        c = torch.arange(-pad, width + pad)[None, :]
        on_map = ((r >= 0) & (r < height) & (c >= 0) & (c < width)).reshape(-1)
        row = (starts[level] + r * width + c).reshape(-1)                        # (P_l,)
        per_batch_blocks, per_batch_targets = [], []
        for b in range(batch):
            target = b * total + row
            if off_map == "row 0":
                target = torch.where(on_map, target, torch.full_like(target, b * total))
                rows_read = torch.where(on_map[:, None, None], flat_value[target.clamp(0)],
                                        torch.zeros_like(flat_value[target.clamp(0)]))
            else:
                inside = (target >= 0) & (target < batch * total)
                rows_read = torch.where(inside[:, None, None],
                                        flat_value[target.clamp(0, batch * total - 1)], nan_row)
                target = torch.where(inside, target, torch.full_like(target, -1))
            per_batch_blocks.append(rows_read)
            per_batch_targets.append(target)
        blocks.append(torch.stack(per_batch_blocks))                             # (B, P_l, M, D)
        targets.append(torch.stack(per_batch_targets))
    padded_shapes = shapes + 2 * pad
    padded_starts = torch.cat([torch.zeros(1, dtype=torch.long),
                               padded_shapes.prod(1).cumsum(0)[:-1]])
    wh = _sizes(args)
    loc = (a["sampling_locations"] * wh + pad) / (wh + 2 * pad)
    padded = dict(a, value=torch.cat(blocks, dim=1), value_spatial_shapes=padded_shapes,
                  value_level_start_index=padded_starts, sampling_locations=loc)
    grad_value, grad_loc, grad_attn = op.gradients_fp64(padded, grad_output)
    if name == "grad_attention_weights":
        return grad_attn
    if name == "grad_sampling_locations":
        return grad_loc * wh / (wh + 2 * pad)          # d x' / d x of the padded coordinate
    target = torch.cat(targets, dim=1).reshape(-1)                              # (B * S',)
    keep = target >= 0
    out = torch.zeros(batch * total, heads, channels, dtype=torch.float64)
    out.index_add_(0, target[keep], grad_value.reshape(-1, heads, channels)[keep])
    return out.reshape(batch, total, heads, channels)


def _own_weight(args, grad_output):
    """The location gradient with each corner's term weighted by its own-axis weight: x gets
    sum_c sign_x(c) wx(c) <g, v_c> = d_x (gv01 + gv11) - (1 - d_x) (gv00 + gv10), from the
    attention gradient (a weighted sum of the gv_c) at locations that set the weights."""
    attn = _cpu64(args)["attention_weights"]
    x_im, y_im, x0, y0 = _pixel(args)
    wh = _sizes(args)

    def sample(x, y):
        return _gradient("grad_attention_weights", _at_pixels(args, x, y), grad_output)

    # with d_y = 1/2 the weights are ((1 - d_x), d_x, (1 - d_x), d_x) / 2
    grad_x = 2 * sample(x_im, y0 + 0.5) - 4 * (1 - (x_im - x0)) * sample(x0, y0 + 0.5)
    grad_y = 2 * sample(x0 + 0.5, y_im) - 4 * (1 - (y_im - y0)) * sample(x0 + 0.5, y0)
    return torch.stack([grad_x, grad_y], dim=-1) * attn[..., None] * wh


def _same(got, variant, dtype, table):
    """``got`` equals ``variant`` within the check's tolerance (NaN where NaN)."""
    from source_kernels.testing import explain_mismatch

    finite = variant[torch.isfinite(variant)]
    scale = max(finite.abs().max().item(), 1e-6) if finite.numel() else 1.0
    return explain_mismatch(got, variant, atol=table[dtype] * scale, rtol=0.0) is None


# ------------------------------------------------------------------ the catalogue
def _variants(name, expected, args, grad_output, off_map):
    """(hint, thunk) for every typical mistake in computing ``name``; a thunk returns the
    gradient that mistake gives (or None where it cannot be emulated)."""
    a = _cpu64(args)
    attn = a["attention_weights"]
    x_im, y_im, x0, y0 = _pixel(args)
    wh = _sizes(args)
    sign = (f"{name} has the opposite sign of the right gradient everywhere: a sign error "
            "(check which term you subtract from which)")
    yield sign, lambda: -expected
    if name == "grad_attention_weights":
        yield ("the corner weights are missing: you add the four corners' <g, v_c> with weight "
               "1 each, but the sample is the weighted sum of its corners, each with its "
               "bilinear weight w_c",
               lambda: 4 * _gradient(name, _at_pixels(args, x0 + 0.5, y0 + 0.5), grad_output))
        yield ("you multiply by the attention weight: the output is linear in a, so its "
               "derivative with respect to a does not contain a",
               lambda: expected * attn)
    if name == "grad_sampling_locations":
        yield ("the factors W and H are missing: what you return is the gradient with respect "
               "to the pixel coordinate (x_im, y_im); the chain rule through x_im = x * W - 0.5 "
               "multiplies the x column by the level's width W and the y column by its height H",
               lambda: expected / wh)
        yield ("the x column lacks the factor W (the chain rule through x_im = x * W - 0.5); "
               "the y column has its H",
               lambda: expected / (wh * torch.tensor([1.0, 0.0]) + torch.tensor([0.0, 1.0])))
        yield ("the y column lacks the factor H (the chain rule through y_im = y * H - 0.5); "
               "the x column has its W",
               lambda: expected / (wh * torch.tensor([0.0, 1.0]) + torch.tensor([1.0, 0.0])))
        yield ("W and H are swapped: x_im = x * W - 0.5 runs along the width, so the x column "
               "takes the level's W and the y column its H",
               lambda: expected / wh * wh.flip(-1))
        yield ("you divide by W and H: x_im = x * W - 0.5 moves W times as fast as x, so the "
               "chain rule multiplies by W (and by H for y)",
               lambda: expected / wh ** 2)
        yield ("the x column has the wrong sign (the y column is right): a sign error in the x "
               "derivative", lambda: expected * torch.tensor([-1.0, 1.0]))
        yield ("the y column has the wrong sign (the x column is right): a sign error in the y "
               "derivative", lambda: expected * torch.tensor([1.0, -1.0]))
        yield ("x and y are swapped: the last axis of sampling_locations is (x, y), x along "
               "the width", lambda: expected.flip(-1))
        yield ("d_x and d_y are swapped in the derivatives: moving x changes d_x only, so the "
               "x derivative is weighted by the other fraction, d_y (and the y derivative by d_x)",
               lambda: torch.stack([
                   _gradient(name, _at_pixels(args, x_im, y0 + (x_im - x0)), grad_output)[..., 0],
                   _gradient(name, _at_pixels(args, x0 + (y_im - y0), y_im), grad_output)[..., 1]],
                   dim=-1))
        yield ("d_x and d_y are swapped in the derivatives: a corner's weight is wy * wx, and "
               "moving x changes only wx, so the corner enters the x derivative with its sign "
               "times its y weight wy, not wx (and the y derivative with wx)",
               lambda: _own_weight(args, grad_output))
    if name in ("grad_value", "grad_attention_weights"):
        yield ("d_x and d_y are swapped in the corner weights: corner 01 lies one step along x, "
               "so its weight grows with d_x (and corner 10's with d_y)",
               lambda: _gradient(name, _at_pixels(args, x0 + (y_im - y0), y0 + (x_im - x0)),
                                 grad_output))
    if name in ("grad_value", "grad_sampling_locations"):
        yield ("the attention weight is missing: every term of a sample carries its weight a",
               lambda: _gradient(name, dict(a, attention_weights=torch.ones_like(attn)),
                                 grad_output))
    if off_map == "row 0" and name == "grad_value":
        yield ("corners off the map receive gradient: sample_corners gives a corner off the map "
               "row 0 (and value 0), so without its `inside` mask that corner's contribution "
               "lands in row 0 of S; a corner off the map read nothing and gets nothing",
               lambda: _unmasked(name, args, grad_output, off_map))
    if off_map == "flat" and name == "grad_value":
        yield ("corners off the map receive gradient: without the on-map mask, corner (r, c) "
               "of a level adds into row start + r * W + c of S, another pixel or another "
               "level; mask the atomic add with the corner's on-map test",
               lambda: _unmasked(name, args, grad_output, off_map))
    if off_map == "flat" and name != "grad_value":
        yield ("corners off the map are read: without the on-map mask, corner (r, c) of a level "
               "reads row start + r * W + c of S (another pixel or level) instead of 0; load "
               "with mask=<corner on the map> and other=0.0",
               lambda: _unmasked(name, args, grad_output, off_map))


def explain(name, got, expected, args, grad_output, dtype, *, table=op.GRAD_TOLERANCE,
            off_map="row 0"):
    """The hint naming the mistake that turns the right ``name`` (``expected``, float64) into
    ``got``, or None.  ``off_map``: how the pass reaches the corners off the map when it
    forgets to mask them, "row 0" for lab 07's ``sample_corners`` (a PyTorch scatter), "flat"
    for a kernel; it also decides how a scatter loses contributions (an assignment, or a
    load + store in place of an atomic add)."""
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(expected.shape):
        return None
    text = garbage(name, got, expected, args)
    if text:
        return text
    got64 = got.detach().cpu().double()
    for hint, thunk in _variants(name, expected, args, grad_output, off_map):
        try:
            variant = thunk()
        except (RuntimeError, ValueError, IndexError):
            variant = None
        if variant is not None and _same(got64, variant, dtype, table):
            return hint
    if name == "grad_value":
        return _lost(got64, expected, args, dtype, table, off_map)
    return None


def _lost(got, expected, args, dtype, table, off_map):
    """Lost contributions: every row that differs receives two or more, and every row that
    receives one is right.  (In the interpreter the rows that lose are those two lanes of one
    store hit; on a GPU programs race too: any row hit twice can lose.)"""
    scale = max(expected.abs().max().item(), 1e-6)
    wrong = ((got - expected).abs() > table[dtype] * scale).any(dim=-1)          # (B, S, M)
    if not wrong.any() or (wrong & ~shared_rows(args, with_off_map=off_map == "row 0")).any():
        return None
    if off_map == "row 0":
        return ("contributions are lost where several samples hit the same row: only rows "
                "hit more than once are wrong, so the scatter assigns (out[rows] = ...) where it "
                "must add; use index_add_ or scatter_add_")
    return ("updates are lost: queries that share a corner write the same row of grad_value, "
            "and a load + add + store keeps only one of their updates (every row that differs "
            "is such a row); use tl.atomic_add")


def shared_rows(args, with_off_map=False):
    """(B, S, M) bool: rows of value that two or more corners reach.  ``with_off_map``:
    corners off the map count too, at row 0 (``sample_corners``' rows: a PyTorch scatter
    writes them, if only zeros); else only the corners on the map."""
    from source_kernels.chips.lab07 import sample_corners

    a = _cpu64(args)
    corners = sample_corners(a["value"], a["value_spatial_shapes"],
                             a["value_level_start_index"], a["sampling_locations"])
    rows, inside = corners["rows"], corners["inside"]                       # (B, Q, M, L, K, 4)
    batch, _, heads = rows.shape[:3]
    total = a["value"].shape[1]
    b = torch.arange(batch).view(-1, 1, 1, 1, 1, 1).expand_as(rows)
    m = torch.arange(heads).view(1, 1, -1, 1, 1, 1).expand_as(rows)
    key = (b * heads + m) * total + rows
    key = key.reshape(-1) if with_off_map else key[inside]
    counts = torch.bincount(key, minlength=batch * heads * total)
    return (counts >= 2).reshape(batch, heads, total).permute(0, 2, 1)


def garbage(name, got, expected, args):
    """Name a read past the tensor when ``got`` holds NaN, inf or huge values where the right
    gradient is finite: say which sample and which of its corners lie off the map."""
    got64 = got.detach().cpu().double()
    scale = max(expected.abs().max().item(), 1.0)
    bad = ~torch.isfinite(got64) | (got64.abs() > 1e6 * scale)
    bad &= torch.isfinite(expected)
    if not bad.any():
        return None
    index = [int(i) for i in torch.nonzero(bad)[0]]
    value = got64[tuple(index)].item()
    axes = GRADIENT_AXES[name]
    where = ", ".join(f"{axis} {i}" for axis, i in zip(axes, index))
    head = (f"{name} holds {value:.6g} at {where}, where the right gradient is finite: a read "
            "went past the tensor (garbage or NaN came back)")
    if name == "grad_value":
        return (head + ". Mask every load and store: the corner's on-map test for value and "
                "grad_value, the query mask for grad_out, the locations and the weights.")
    b, q, m, level, point = index[:5]
    shapes = args["value_spatial_shapes"].detach().cpu().long()
    starts = args["value_level_start_index"].detach().cpu().long()
    height, width = shapes[level].tolist()
    _, _, x0, y0 = _pixel(args)
    c0, r0 = int(x0[b, q, m, level, point]), int(y0[b, q, m, level, point])
    total = int(args["value"].shape[1])
    off = []
    for corner in _CORNERS:
        r, c = r0 + int(corner[0]), c0 + int(corner[1])
        if not (0 <= r < height and 0 <= c < width):
            row = int(starts[level]) + r * width + c
            past = " (outside value)" if not 0 <= b * total + row < args["value"].shape[0] * total \
                else ""
            off.append(f"{corner} at row {r}, column {c} (row {row} of S{past})")
    if not off:
        return (head + ". This sample's corners all lie on the map: check the masks of the "
                "other loads (queries past Q, channels past D).")
    return (head + f". Its corners off the {height} x {width} map of level {level}: "
            + "; ".join(off) + ". Load them with mask=<corner on the map> and other=0.0.")
