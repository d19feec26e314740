"""Name the usual mistakes of a hand-written MSDA backward pass, and locate the others.

``explain(name, got, expected, args, grad_output, dtype)`` recomputes the gradient ``name``
under each typical wrong formula and returns the hint of the first one that reproduces
``got`` within the check's tolerance (a sign error, a missing factor W or H, W where H
belongs, a missing fraction factor of a location derivative, corners off the map receiving
gradient, grad_attn without the corner weights, d_x and d_y swapped, a missing attention
weight, contributions a scatter loses), or None: a hint is a confirmed hypothesis.
``never_written`` names what a launch with sentinel-filled outputs left as it was;
``garbage`` says where NaN or inf appear, and calls it a read outside only when the run saw
one.

``probes(gen)`` builds inputs that switch on one term at a time (one level and point on a
pixel centre, then one more corner, point, level, attention spread, channel, head, batch
element, query, corners off the map); a check runs the student's function on all of them,
and ``locate`` names the first that goes wrong, with the hypothesis that reproduces it when
one does (an index that reads index 0's inputs, a constant factor).

Each wrong gradient is built from the float64 reference on changed inputs (locations moved,
a map padded with the rows an unmasked read would reach, attention weights set to one) or
from the right gradient by the change a mistake makes (a factor, a sign, a swap); lost
updates are emulated from each corner's contribution.  This module runs only when a check
judges, never in the grading kernel (``probes`` excepted: it only draws inputs); it imports
the reference and lab 07's corner bookkeeping inside its functions.
"""
from __future__ import annotations

import torch

from . import _operator as op

__all__ = ["explain", "garbage", "never_written", "probes", "locate", "shared_rows",
           "term_scale", "GRADIENT_AXES", "GRADIENT_INDEX", "PROBE_SHAPES"]

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


def _along_other(args, grad_output, column):
    """The location gradient's ``column`` (0: x, 1: y) is linear in the other axis' fraction
    (d_y for x, d_x for y) while the corners stay: returns (its value at fraction 0, its
    slope), from the reference at fractions 1/4 and 3/4."""
    x_im, y_im, x0, y0 = _pixel(args)
    name = "grad_sampling_locations"
    if column == 0:
        quarter, three = (_at_pixels(args, x_im, y0 + 0.25), _at_pixels(args, x_im, y0 + 0.75))
    else:
        quarter, three = (_at_pixels(args, x0 + 0.25, y_im), _at_pixels(args, x0 + 0.75, y_im))
    low = _gradient(name, quarter, grad_output)[..., column]
    high = _gradient(name, three, grad_output)[..., column]
    slope = 2 * (high - low)
    return low - 0.25 * slope, slope


def _column_plus(expected, column, extra):
    out = expected.clone()
    out[..., column] += extra
    return out


def _same(got, variant, dtype, table, scale=None):
    """``got`` equals ``variant`` within the check's tolerance (NaN where NaN), relative to
    ``scale`` when given, else to the largest finite |variant|."""
    from source_kernels.testing import explain_mismatch

    if scale is None:
        finite = variant[torch.isfinite(variant)]
        scale = max(finite.abs().max().item(), 1e-6) if finite.numel() else 1.0
    return explain_mismatch(got, variant, atol=table[dtype] * scale, rtol=0.0) is None


def term_scale(name, args, grad_output):
    """How large the terms are that add up to the gradient ``name`` on these inputs.

    A kernel rounds every term to its precision, so a gradient whose terms cancel (a probe
    with one sample and one channel can give 1e-5 from terms near 1) is only as accurate as
    its terms are large; a tolerance relative to the result alone fails honest float32 code.
    grad_value and grad_attention_weights: the largest element of the reference's gradient
    with |value| and |grad_output| (each term's magnitude added up, since the bilinear
    weights and the probes' attention weights are >= 0).  grad_sampling_locations: the
    bound 2 * max(H, W) * max |a| * C * max |g| * max |v| of a derivative a * W * <g, (1 -
    d_y)(v01 - v00) + d_y (v11 - v10)>."""
    a = _cpu64(args)
    g = grad_output.detach().cpu().double()
    value, attn = a["value"], a["attention_weights"]
    if name == "grad_sampling_locations":
        channels = value.shape[-1]
        side = float(a["value_spatial_shapes"].max())
        return (2 * side * float(attn.abs().max()) * channels * float(g.abs().max())
                * float(value.abs().max()))
    magnitudes = _gradient(name, dict(a, value=value.abs(), attention_weights=attn.abs()),
                           g.abs())
    return max(float(magnitudes.abs().max()), 1e-6)


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
        yield ("the y column is scaled by W where H belongs: y_im = y * H - 0.5 runs along the "
               "height, so the chain rule multiplies the y derivative by the level's H (the x "
               "column has its W)",
               lambda: expected * torch.cat([torch.ones_like(wh[..., :1]),
                                             wh[..., :1] / wh[..., 1:]], dim=-1))
        yield ("the x column is scaled by H where W belongs: x_im = x * W - 0.5 runs along the "
               "width, so the chain rule multiplies the x derivative by the level's W (the y "
               "column has its H)",
               lambda: expected * torch.cat([wh[..., 1:] / wh[..., :1],
                                             torch.ones_like(wh[..., :1])], dim=-1))
        dx, dy = (x_im - x0), (y_im - y0)
        yield ("the x derivative lacks its (1 - d_y) factor: corners 00 and 01 lie on the upper "
               "row, so their difference enters the x derivative with that row's weight "
               "(1 - d_y), as corners 10 and 11 enter with d_y",
               lambda: _column_plus(expected, 0, dy * _along_other(args, grad_output, 0)[0]))
        yield ("the x derivative lacks its d_y factor: corners 10 and 11 lie on the lower row, "
               "so their difference enters the x derivative with that row's weight d_y",
               lambda: _column_plus(expected, 0, (1 - dy) * sum(_along_other(args, grad_output,
                                                                             0))))
        yield ("the y derivative lacks its (1 - d_x) factor: corners 00 and 10 lie in the left "
               "column, so their difference enters the y derivative with that column's weight "
               "(1 - d_x), as corners 01 and 11 enter with d_x",
               lambda: _column_plus(expected, 1, dx * _along_other(args, grad_output, 1)[0]))
        yield ("the y derivative lacks its d_x factor: corners 01 and 11 lie in the right "
               "column, so their difference enters the y derivative with that column's weight "
               "d_x",
               lambda: _column_plus(expected, 1, (1 - dx) * sum(_along_other(args, grad_output,
                                                                             1))))
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
            off_map="row 0", block_q=None, unwritten=None, nan_source=None):
    """The hint naming the mistake that turns the right ``name`` (``expected``, float64) into
    ``got``, or None.  ``off_map``: how the pass reaches the corners off the map when it
    forgets to mask them, "row 0" for lab 07's ``sample_corners`` (a PyTorch scatter), "flat"
    for a kernel; it also decides how a scatter loses contributions (an assignment, or a
    load + store in place of an atomic add).  ``block_q``: a kernel's queries per program,
    when it ran in the interpreter (its lost updates are then emulated exactly).
    ``unwritten``: (the same launch with every output filled with a sentinel, the sentinel),
    so that elements the pass never wrote are named as such.  ``nan_source``: what a guarded
    run saw that explains a NaN in the result (None: nothing, so NaN is not called a read
    outside)."""
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(expected.shape):
        return None
    if unwritten is not None:
        text = never_written(name, *unwritten, expected, args, dtype, table)
        if text:
            return text
    text = garbage(name, got, expected, args, nan_source=nan_source)
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
        return _lost(got64, expected, args, grad_output, dtype, table, off_map, block_q)
    return None


def _contributions(args, grad_output):
    """What every corner of every sample adds to grad_value: (rows, inside, contribution)
    with rows, inside (B, Q, M, L, K, 4) (lab 07's ``sample_corners``) and contribution
    (B, Q, M, L, K, 4, D), zero for a corner off the map."""
    from source_kernels.chips.lab07 import sample_corners

    a = _cpu64(args)
    corners = sample_corners(a["value"], a["value_spatial_shapes"],
                             a["value_level_start_index"], a["sampling_locations"])
    batch, _, heads, channels = a["value"].shape
    g = grad_output.detach().cpu().double().reshape(batch, -1, heads, channels)
    scale = a["attention_weights"][..., None] * corners["weights"] * corners["inside"]
    return (corners["rows"], corners["inside"],
            scale[..., None] * g[:, :, :, None, None, None, :])


def _racy(args, grad_output, block_q, last):
    """grad_value as a kernel leaves it that scatters with a load + add + store in place of
    an atomic add, its programs (``block_q`` queries each) one after another: of the lanes of
    one store (one program, level, point, corner) that hit the same row, one update lands,
    the ``last`` lane's or the first's."""
    rows, inside, contribution = _contributions(args, grad_output)
    batch, queries, heads, levels, points, _ = rows.shape
    total = args["value"].shape[1]
    out = torch.zeros(batch, total, heads, contribution.shape[-1], dtype=torch.float64)
    for b in range(batch):
        for m in range(heads):
            for start in range(0, queries, block_q):
                for level in range(levels):
                    for point in range(points):
                        for corner in range(4):
                            landed = {}
                            for q in range(start, min(start + block_q, queries)):
                                if bool(inside[b, q, m, level, point, corner]):
                                    row = int(rows[b, q, m, level, point, corner])
                                    if last or row not in landed:
                                        landed[row] = q
                            for row, q in landed.items():
                                out[b, row, m] += contribution[b, q, m, level, point, corner]
    return out


def _assigned(got, expected, args, grad_output, dtype, table):
    """A PyTorch scatter that assigns: every row holds exactly one of the contributions that
    reach it (any one), every row no corner reaches holds 0."""
    rows, _, contribution = _contributions(args, grad_output)
    batch, _, heads = rows.shape[:3]
    channels = contribution.shape[-1]
    b = torch.arange(batch).view(-1, 1, 1, 1, 1, 1).expand_as(rows).reshape(-1)
    m = torch.arange(heads).view(1, 1, -1, 1, 1, 1).expand_as(rows).reshape(-1)
    r = rows.reshape(-1)
    flat = contribution.reshape(-1, channels)
    atol = table[dtype] * max(expected.abs().max().item(), 1e-6)
    reached = torch.zeros(got.shape[:3], dtype=torch.bool)
    reached[b, r, m] = True
    if (got[~reached].abs() > atol).any():
        return False
    for key in torch.unique(torch.stack([b, r, m], dim=1), dim=0).tolist():
        pick = (b == key[0]) & (r == key[1]) & (m == key[2])
        row = got[key[0], key[1], key[2]]
        if not bool(((flat[pick] - row).abs() <= atol).all(dim=-1).any()):
            return False
    return True


def _lost(got, expected, args, grad_output, dtype, table, off_map, block_q):
    """Lost contributions, when the emulated scatter reproduces ``got``: an assignment in a
    PyTorch scatter (each row keeps one of its contributions), or a load + add + store in a
    kernel run by the interpreter (one update per row and store lands).  On a GPU programs
    race too and no emulation holds: there, every row that differs must be reached twice or
    more, and every row reached once must be right."""
    if off_map == "row 0":
        if not _assigned(got, expected, args, grad_output, dtype, table):
            return None
        return ("contributions are lost where several samples hit the same row: every row of "
                "your grad_value holds just one of the contributions that reach it, so the "
                "scatter assigns (out[rows] = ...) where it must add; use index_add_ or "
                "scatter_add_")
    text = ("updates are lost: queries that share a corner write the same row of grad_value, "
            "and a load + add + store keeps only one of their updates")
    if block_q is not None:
        if any(_same(got, _racy(args, grad_output, block_q, last), dtype, table)
               for last in (True, False)):
            return (text + " (your grad_value is exactly what such a store leaves, one update "
                    "per row and store); use tl.atomic_add")
        return None
    scale = max(expected.abs().max().item(), 1e-6)
    wrong = ((got - expected).abs() > table[dtype] * scale).any(dim=-1)          # (B, S, M)
    if not wrong.any() or (wrong & ~shared_rows(args)).any():
        return None
    return text + " (every row that differs is such a row); use tl.atomic_add"


def _exactly(kept, needed, axes):
    """"channel 1, 2, 3" when ``kept`` holds exactly the ``needed`` elements of some values
    along one axis (the first such axis), else None."""
    for axis, label in enumerate(axes):
        values = torch.unique(torch.nonzero(kept)[:, axis])
        total = torch.unique(torch.nonzero(needed)[:, axis])
        if len(values) == len(total):
            continue
        shape = [1] * kept.dim()
        shape[axis] = -1
        along = torch.zeros(kept.shape[axis], dtype=torch.bool)
        along[values] = True
        if torch.equal(kept, needed & along.view(shape)):
            plural = {"row of S": "rows of S", "batch": "batch elements", "query": "queries",
                      "x/y": "x/y"}.get(label, label + "s")
            names = plural if len(values) > 1 else label
            return f"{names} {', '.join(str(int(v)) for v in values)}"
    return None


def never_written(name, filled, sentinel, expected, args, dtype, table=op.GRAD_TOLERANCE):
    """Name the elements of ``name`` that a launch with its outputs filled with ``sentinel``
    left as they were (``filled``: what it returned), where the right gradient is not 0."""
    if not isinstance(filled, torch.Tensor) or tuple(filled.shape) != tuple(expected.shape):
        return None
    scale = max(expected.abs().max().item(), 1e-6)
    needed = expected.abs() > table[dtype] * scale
    kept = (filled.detach().cpu().double() == float(sentinel)) & needed
    if not kept.any():
        return None
    if bool(kept.sum() == needed.sum()) and bool((filled.detach().cpu().double()
                                                   == float(sentinel)).all()):
        step = {"grad_value": "scatter each corner's contribution into it with tl.atomic_add",
                "grad_sampling_locations": "store it (mask_q) once per level and point",
                "grad_attention_weights": "store it (mask_q) once per level and point"}[name]
        return (f"{name} is never written: the check filled it with {sentinel:g} before the "
                f"launch and every element came back so. Your kernel does not write {name} "
                f"yet: {step}")
    index = [int(i) for i in torch.nonzero(kept)[0]]
    where = ", ".join(f"{axis} {i}" for axis, i in zip(GRADIENT_AXES[name], index))
    exactly = _exactly(kept, needed, GRADIENT_AXES[name])
    if name == "grad_value":
        starts = args["value_level_start_index"].detach().cpu().long().tolist()
        level = max(i for i, s in enumerate(starts) if s <= index[1])
        levels = sorted({max(i for i, s in enumerate(starts) if s <= int(r))
                         for r in torch.nonzero(kept)[:, 1].tolist()})
        where += f" (level {level}; the unwritten rows lie in level(s) " \
                 f"{', '.join(map(str, levels))})"
    if exactly:
        where += f"; they are all the elements of {exactly}"
    return (f"{int(kept.sum())} of the {int(needed.sum())} elements of {name} that must receive "
            f"gradient were never written (the check filled {name} with {sentinel:g} before "
            f"the launch and they came back so), the first at {where}: find the loop or the "
            "mask that skips them")


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


def garbage(name, got, expected, args, nan_source="read outside"):
    """Say where ``got`` holds NaN, inf or huge values where the right gradient is finite.
    ``nan_source``: what the run saw that explains it: "read outside" (a read past the tensor:
    also say which corners of that sample lie off the map), a text naming another cause (a
    guarded launch's masked load without ``other=``), or None (nothing seen: the message
    only locates)."""
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
    if nan_source != "read outside":
        located = (f"{name} holds {value:.6g} at {where} ({int(bad.sum())} such elements), "
                   "where the right gradient is finite")
        if nan_source:
            return f"{located}: {nan_source}"
        return (located + ". Print the quantities your code computes for this one element, "
                "step by step, to see where the NaN or inf first appears")
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


# ------------------------------------------------------------------ location by isolation
# Maps whose sizes are powers of two, so that a location (c + 1/2 + d_x) / W is exact in
# float32 and its pixel coordinate x * W - 1/2 is exactly c + d_x: a probe "on a pixel centre"
# is on it, in the student's arithmetic and in the reference's.
PROBE_SHAPES = ((2, 4), (4, 2))
_FRACTIONS = (0.125, 0.25, 0.375, 0.625, 0.75)


def _pick(gen, options):
    return options[int(torch.randint(0, len(options), (1,), generator=gen))]


def _probe(gen, *, batch=1, queries=1, heads=1, channels=1, levels=1, points=1,
           fraction=None, attention=None, edges=False):
    """The operator's inputs (float64, CPU) with every sample on a chosen pixel and fraction:
    ``fraction`` (d_x, d_y) for every sample, else drawn from exact eighths; ``attention``
    (L, K) for every query and head, else drawn; ``edges``: pixels on and past the borders,
    so that corners lie off the map."""
    shapes = torch.tensor(PROBE_SHAPES[:levels], dtype=torch.long)
    areas = shapes.prod(1)
    starts = torch.cat([torch.zeros(1, dtype=torch.long), areas.cumsum(0)[:-1]])
    value = torch.randn(batch, int(areas.sum()), heads, channels, generator=gen,
                        dtype=torch.float64)
    loc = torch.empty(batch, queries, heads, levels, points, 2, dtype=torch.float64)
    for index in torch.cartesian_prod(*(torch.arange(n) for n in loc.shape[:5])).view(-1, 5):
        level = int(index[3])
        height, width = PROBE_SHAPES[level]
        if edges:
            col = _pick(gen, (-1, 0, width - 2, width - 1))
            row = _pick(gen, (-1, 0, height - 2, height - 1))
        else:
            col = _pick(gen, tuple(range(width - 1)))
            row = _pick(gen, tuple(range(height - 1)))
        dx, dy = fraction if fraction is not None else (_pick(gen, _FRACTIONS),
                                                        _pick(gen, _FRACTIONS))
        loc[tuple(index.tolist())] = torch.tensor([(col + 0.5 + dx) / width,
                                                  (row + 0.5 + dy) / height])
    if attention is None:
        attention = torch.tensor([[_pick(gen, (0.125, 0.25, 0.375, 0.5)) for _ in range(points)]
                                  for _ in range(levels)], dtype=torch.float64)
    attn = torch.as_tensor(attention, dtype=torch.float64).expand(batch, queries, heads,
                                                                   levels, points).clone()
    args = {"value": value, "value_spatial_shapes": shapes, "value_level_start_index": starts,
            "sampling_locations": loc, "attention_weights": attn}
    grad_output = torch.randn(batch, queries, heads * channels, generator=gen,
                              dtype=torch.float64)
    return args, grad_output


def probes(gen, queries=10):
    """(label, term, inputs, grad_output), each probe switching on one term more than a probe
    before it (the first seven build on each other; the last five each add one term to the
    seventh, two levels and two points with spread attention): a check runs the student's
    function on all of them (the same calls whether it
    judges or records) and :func:`locate` names the first that goes wrong."""
    one = dict(levels=1, points=1, attention=[[1.0]])
    spread = dict(levels=2, points=2)
    ladder = [
        ("one level, one point with all the attention, the location on a pixel centre "
         "(corner 00 alone, weight 1), one channel, one query, batch 0, head 0",
         "the simplest sample is wrong: its pixel coordinate (x * W - 0.5, y * H - 0.5), "
         "corner 00's row (start + r * W + c), its weight (1 here: the fractions d_x and d_y "
         "are 0, so (1 - d_x) and (1 - d_y) are 1) and the scale of the result",
         dict(one, fraction=(0.0, 0.0))),
        ("the location halfway between two pixels along x (corners 00 and 01, weight 1/2 each)",
         "corner 01 (one column to the right) and the x direction: its column x0 + 1, its "
         "weight d_x",
         dict(one, fraction=(0.5, 0.0))),
        ("the location halfway between two pixels along y (corners 00 and 10, weight 1/2 each)",
         "corner 10 (one row down) and the y direction: its row y0 + 1, its weight d_y",
         dict(one, fraction=(0.0, 0.5))),
        ("the location inside a cell (all four corners)",
         "corner 11 and the terms that mix the two directions: a corner's weight is its y "
         "weight times its x weight",
         dict(one, fraction=(0.25, 0.625))),
        ("a second point, all the attention on point 1",
         "point 1: the point index k of the location, of the attention weight or of what you "
         "write", dict(levels=1, points=2, attention=[[0.0, 1.0]])),
        ("a second level (4 x 2, after the 2 x 4 of level 0), all the attention on level 1",
         "level 1: its start row in S and its H and W (the level index of the shapes, the "
         "starts and the locations)", dict(levels=2, points=1, attention=[[0.0], [1.0]])),
        ("attention weights spread over two levels and two points",
         "the attention weight a: a value or location gradient carries each sample's a, the "
         "attention gradient does not; and the sum over levels and points",
         spread),
        ("three channels", "the channel term: channels past the first (the channel offset of "
         "value and grad_out, the channel mask, the sum over channels of <g, v_c>)",
         dict(spread, channels=3)),
        ("a second head", "head 1: the head index m in the offsets of value, grad_out, the "
         "locations and the weights", dict(spread, heads=2)),
        ("a second batch element", "batch 1: the batch term b of the offsets",
         dict(spread, batch=2)),
        (f"{queries} queries", "queries past the first: the query term of the offsets (in a "
         "kernel: the second program, and the query mask of the last block)",
         dict(spread, queries=queries)),
        ("corners off the map (4 queries)", "corners off the map: each corner's on-map test "
         "(0 <= row < H and 0 <= column < W), for what is read and what is written",
         dict(spread, queries=4, edges=True)),
    ]
    return [(label, term, *_probe(gen, **kwargs)) for label, term, kwargs in ladder]


def _ratio(got, expected, dtype, table):
    """c when ``got`` equals c * ``expected`` (within the tolerance) for one constant c."""
    if not torch.isfinite(got).all():
        return None
    big = expected.abs() > 0.1 * expected.abs().max()
    if not big.any():
        return None
    ratio = float((got[big] / expected[big]).median())
    if _same(got, ratio * expected, dtype, table):
        return 0.0 if abs(ratio) < 1e-6 else ratio
    return None


def _twins(args):
    """(hypothesis, inputs) for the probes that give an index a second value: the pass
    reads index 0's inputs where index 1 belongs."""
    loc, attn = args["sampling_locations"], args["attention_weights"]
    if loc.shape[4] == 2 and loc.shape[3] == 1:
        moved = loc.clone()
        moved[..., 1, :] = loc[..., 0, :]
        yield ("Your result is what point 1 gives with point 0's location: the location's "
               "index ignores the point k", dict(args, sampling_locations=moved))
        weights = attn.clone()
        weights[..., 1] = attn[..., 0]
        yield ("Your result is what point 1 gives with point 0's attention weight: the "
               "weight's index ignores the point k", dict(args, attention_weights=weights))


def locate(name, results, dtype, table=op.GRAD_TOLERANCE, **explain_kwargs):
    """The message for the first probe whose result is wrong, or None when all are right.
    ``results``: (label, term, inputs, grad_output, what the student's function returned),
    in the order of :func:`probes`."""
    right = None
    for label, term, args, grad_output, got in results:
        expected = _gradient(name, args, grad_output)
        scale = max(float(expected.abs().max()), term_scale(name, args, grad_output))
        message = op.mismatch(got, expected, dtype, f"{name} with {label}",
                              GRADIENT_AXES[name], table=table, scale=scale)
        if message is None:
            right = label
            continue
        text = ("Located by isolation (the check also ran your code on inputs that switch on "
                "one term at a time): ")
        text += f"right with {right}; " if right else ""
        text += f"first wrong with {label}. {message}. The term that goes wrong: {term}"
        named = explain(name, got, expected, args, grad_output, dtype, table=table,
                        **explain_kwargs)
        if named:
            return text + f". On this probe: {named}"
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(expected.shape):
            return text
        got64 = got.detach().cpu().double()
        for hypothesis, twin in _twins(args):
            variant = _gradient(name, twin, grad_output)
            if not _same(expected, variant, dtype, table) and _same(got64, variant, dtype,
                                                                    table):
                return text + f". {hypothesis}"
        ratio = _ratio(got64, expected, dtype, table)
        if ratio == 0:
            return text + ". Your result is 0 for every element here"
        ratio = _ratio_everywhere(name, results, dtype, table)
        if ratio is not None and abs(ratio - 1) > 1e-4:
            return text + (f". On every probe your result is exactly {ratio:.6g} times the "
                           "right one: a factor is wrong")
        return text
    return None


def _ratio_everywhere(name, results, dtype, table):
    """c when every probe's result is c times the right one (one constant, over two or more
    elements that are not small), else None."""
    gots, expecteds = [], []
    for _, _, args, grad_output, got in results:
        expected = _gradient(name, args, grad_output)
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(expected.shape):
            return None
        gots.append(got.detach().cpu().double().reshape(-1))
        expecteds.append(expected.reshape(-1))
    got, expected = torch.cat(gots), torch.cat(expecteds)
    if int((expected.abs() > 0.1 * expected.abs().max()).sum()) < 2:
        return None
    ratio = _ratio(got, expected, dtype, table)
    if ratio in (None, 0.0) or _same(got, expected, dtype, table):
        return None             # no factor: right to the tolerance over all the probes
    return ratio
