"""Name the mistake behind a wrong forward result: recompute the sampling under the usual
wrong conventions and say which one the student's result matches.

Every check of the forward side (labs 01, 02, 04, 05 and the operator's forward in later
labs) calls this module *after* it found a mismatch, only when it judges (never inside the
grading kernel, which holds no reference), and only on results the student's functions
already returned: the diagnosis never calls the student's code again, so the grader's replay
of a check diagnoses exactly as the notebook does.

- :func:`sample` is a small fp64 re-implementation of the sampling with every convention a
  parameter (pixel coordinate, floor, corner bounds, row of a corner, corner weights,
  attention weights, level starts, output layout);
- :data:`MISTAKES` lists the usual mistakes as (hint, conventions); :func:`name_mistake`
  returns the hint of the first one whose result matches the student's;
- :func:`explain_element` decomposes one wrong output element into its samples and corners
  and says which corner's contribution is missing or extra (a corner off the map that was
  read, a corner inside it that was skipped), or that the value is no weighted sum of the
  inputs;
- :func:`name_coordinate_mistake` and :func:`name_corner_mistake` do the same for the pixel
  coordinate and the corner indices of one location (labs 01 and 05).
"""
from __future__ import annotations

import math

import torch

__all__ = ["CORNERS", "MISTAKES", "sample", "name_mistake", "explain_element", "forward_hint",
           "coordinate_variants", "name_coordinate_mistake", "garbage", "passed",
           "describe_corners", "output_hint"]

# the four corners of a bilinear sample, in the order every lab uses
CORNERS = ("(y0, x0) top-left", "(y0, x1) top-right", "(y1, x0) bottom-left",
           "(y1, x1) bottom-right")
OFFSETS = ((0, 0), (0, 1), (1, 0), (1, 1))            # (row, column) offset of each corner

HALF_PIXEL = ("you use x * W instead of x * W - 0.5: every sample sits half a pixel off "
              "(align_corners=False puts the centre of column j at x = (j + 0.5) / W)")
ALIGN_CORNERS = ("you use x * (W - 1), the align_corners=True convention; this operator maps "
                 "x to the pixel coordinate x * W - 0.5")
XY_SWAPPED = ("x and y are swapped: the last axis of sampling_locations is (x, y), x along "
              "the width W (columns), y along the height H (rows)")
TRUNCATION = ("you round the pixel coordinate towards zero (int(), .to(int) or .to(tl.int32) "
              "without floor): for a coordinate between -1 and 0 that gives corner 0 instead "
              "of -1; take the floor first (math.floor, tl.floor)")
ROW_STRIDE_H = ("the row of corner (r, c) inside the level is r * W + c (W columns per row), "
                "not r * H + c")
SHAPE_SWAPPED = ("H and W are swapped: spatial_shapes holds (H, W) per level, height first, and a "
                 "level's H*W rows are H rows of W pixels, (H, W, D) once reshaped")
NO_ATTENTION = "the attention weights are missing: each sample is scaled by its weight"
NO_CORNER_WEIGHTS = ("the corner weights are missing: each corner adds its weight "
                     "(1 - dy)(1 - dx), (1 - dy) dx, dy (1 - dx) or dy dx times its value")
NEAR_WEIGHTS = ("the corner weights are swapped: a corner's weight is the area of the "
                "rectangle opposite it, so (y0, x0) gets (1 - dy)(1 - dx), not dy * dx")
NO_START = ("every level is read from row 0 of S: add the level's first row, "
            "level_start_index[l], to the corner's row")
COL_UPPER = ("a corner at column W is read: the test is c < W, not c <= W; that read lands on "
             "the first pixel of the next row (or past the end of the tensor)")
ROW_UPPER = ("a corner at row H is read: the test is r < H, not r <= H; that read lands on the "
             "next level's first rows (or past the end of the tensor)")
BOTH_UPPER = ("corners at column W and row H are read: the tests are c < W and r < H, not "
              "c <= W and r <= H")
COL_LOWER = ("a corner at column -1 is read: test c >= 0 too; that read lands on the last "
             "pixel of the previous row")
ROW_LOWER = ("a corner at row -1 is read: test r >= 0 too; that read lands on the previous "
             "level's last row (or before the start of the tensor)")
BOTH_LOWER = "corners at row -1 and column -1 are read: test r >= 0 and c >= 0 too"
NO_MAP_MASK = ("corners off the map are read: a corner adds something only when "
               "0 <= r < H and 0 <= c < W (zero padding)")
WRAP_INDEX = ("a corner at row or column -1 is read: in Python and torch, index -1 is the last "
              "element; test 0 <= row < H and 0 <= col < W before indexing")
BORDER = ("corners off the map are moved onto the edge: this operator pads with zeros, so a "
          "corner outside the map adds nothing (no clamping of the index into the map)")
HEADS_LAYOUT = ("the output's last axis holds the heads side by side, m * D + d (head-major); "
                "yours is channel-major, d * M + m")
X_WEIGHTS_SWAPPED = ("the column weights are swapped: dx = x_im - x0 weighs the right column "
                     "x1 and 1 - dx the left column x0; yours gives dx to x0")
Y_WEIGHTS_SWAPPED = ("the row weights are swapped: dy = y_im - y0 weighs the lower row y1 and "
                     "1 - dy the upper row y0; yours gives dy to y0")
ATTN_IGNORES_POINT = ("the attention weight's index ignores the point: every point k of a level "
                      "is scaled by the weight of point 0; the weight of (l, k) sits at "
                      "((((b*Q + q)*M + m)*L + l)*K + k)")
ATTN_IGNORES_LEVEL = ("the attention weight's index ignores the level: every level l is scaled "
                      "by the weights of level 0; the weight of (l, k) sits at "
                      "((((b*Q + q)*M + m)*L + l)*K + k)")
LOC_IGNORES_POINT = ("the location's index ignores the point: every point k of a level samples "
                     "at the location of point 0; the location of (l, k) sits at "
                     "2 * ((((b*Q + q)*M + m)*L + l)*K + k)")
LOC_IGNORES_LEVEL = ("the location's index ignores the level: every level samples at level 0's "
                     "locations; the location of (l, k) sits at "
                     "2 * ((((b*Q + q)*M + m)*L + l)*K + k)")
SOFTMAX_APPLIED = ("a softmax is applied to the attention weights: the operator takes them as "
                   "given (the model normalised them before the call); multiply by them as "
                   "they are")
NO_BATCH_TERM = ("every batch element reads batch 0's values: the value offset misses its batch "
                 "term, b * S * M * D elements (((b*S + s)*M + m)*D)")
NO_HEAD_TERM = ("every head reads head 0's values: the value offset misses its head term, "
                "m * D elements (((b*S + s)*M + m)*D)")
HEAD_CHANNEL_SWAPPED = ("the head and channel strides are swapped: value is (B, S, M, D), so "
                        "channel d of head m is at ((b*S + s)*M + m)*D + d, not "
                        "((b*S + s)*D + d)*M + m")


def passed(text: str) -> None:
    """Print what a check verified, in the notebook (not in the grader's replay)."""
    from autograde import check_api
    if not check_api.replaying() and not check_api.recording():
        print(text)


# ---------------------------------------------------------------------- the sampler
def _floor(x):
    return torch.floor(x)


def _trunc(x):
    return torch.trunc(x)


def coordinate_variants():
    """(hint, f(normalised, size)) for the usual wrong pixel coordinates."""
    return [(HALF_PIXEL, lambda x, n: x * n),
            (ALIGN_CORNERS, lambda x, n: x * (n - 1)),
            ("the half pixel is added, not subtracted: x * W - 0.5, not x * W + 0.5",
             lambda x, n: x * n + 0.5),
            ("the half pixel is taken before the scaling: x * W - 0.5, not (x - 0.5) * W",
             lambda x, n: (x - 0.5) * n)]


# which corners a kernel reads, by the bounds it tests (the first is the operator's)
_ACCEPT = {
    "map": lambda r, c, h, w: (r >= 0) & (r < h) & (c >= 0) & (c < w),
    "c_upper": lambda r, c, h, w: (r >= 0) & (r < h) & (c >= 0) & (c <= w),
    "r_upper": lambda r, c, h, w: (r >= 0) & (r <= h) & (c >= 0) & (c < w),
    "upper": lambda r, c, h, w: (r >= 0) & (r <= h) & (c >= 0) & (c <= w),
    "c_lower": lambda r, c, h, w: (r >= 0) & (r < h) & (c < w),
    "r_lower": lambda r, c, h, w: (r < h) & (c >= 0) & (c < w),
    "lower": lambda r, c, h, w: (r < h) & (c < w),
    "all": lambda r, c, h, w: torch.ones_like(r, dtype=torch.bool),
}


def sample(value, shapes, starts, loc, attn, *, coordinate=None, floor=_floor, accept="map",
           read="flat", row="rW", weights="bilinear", attention=True, flip_xy=False,
           swap_shapes=False, zero_starts=False, layout="md", terms=False):
    """MSDA in fp64 on the CPU under the given conventions.

    value (B, S, M, D); shapes (L, 2) (H, W); starts (L,); loc (B, Q, M, L, K, 2) (x, y);
    attn (B, Q, M, L, K).  Returns (B, Q, M*D), or with ``terms=True`` a dict of the per
    corner pieces: ``inside`` and ``outside`` (B, Q, M, L, K, 4, D) contributions
    (attention * corner weight * value row) of corners on and off the map, the corner rows
    and columns (B, Q, M, L, K, 4) and whether each lies on the map.

    Conventions (defaults are the operator's): ``coordinate(x, n)`` the pixel coordinate;
    ``floor``; ``accept`` which corners are read: "map" (0 <= r < H, 0 <= c < W), "upper"
    (r <= H, c <= W), "c_upper" / "r_upper" (one of the two), "lower" (no test for >= 0),
    "c_lower" / "r_lower", "all"; ``read`` how an accepted corner's value
    is found: "flat" (row start + r*W + c of S, NaN past the tensor), "wrap" (Python indexing,
    -1 is the last row), "clamp" (onto the edge); ``row`` "rW" or "rH" (r * H + c);
    ``weights`` "bilinear", "ones", "near" (each corner gets the opposite one's weight),
    "flip_x" / "flip_y" (dx and 1 - dx, or dy and 1 - dy, exchanged);
    ``attention``; ``flip_xy``; ``swap_shapes`` (H and W read the other way round);
    ``zero_starts`` (every level from row 0); ``layout`` "md" or "dm" (the output's last axis).
    """
    coordinate = coordinate or (lambda x, n: x * n - 0.5)
    value = value.detach().cpu().double()
    loc = loc.detach().cpu().double()
    attn = attn.detach().cpu().double()
    shapes = [tuple(int(v) for v in s) for s in torch.as_tensor(shapes).cpu().tolist()]
    starts = [int(v) for v in torch.as_tensor(starts).cpu().tolist()]
    batch, total, heads, channels = value.shape
    _, queries, _, levels, points, _ = loc.shape
    if flip_xy:
        loc = loc.flip(-1)
    flat_value = value.reshape(-1)
    numel = flat_value.numel()
    b_idx = torch.arange(batch).view(batch, 1, 1, 1)              # broadcasts with (B, Q, M, K)
    m_idx = torch.arange(heads).view(1, 1, heads, 1)
    d_idx = torch.arange(channels)
    inside_all, outside_all, rows_all, cols_all, on_map_all = [], [], [], [], []
    for lvl in range(levels):
        height, width = shapes[lvl]
        if swap_shapes:
            height, width = width, height
        start = 0 if zero_starts else starts[lvl]
        x = loc[:, :, :, lvl, :, 0]
        y = loc[:, :, :, lvl, :, 1]                                 # (B, Q, M, K)
        x_im = coordinate(x, width)
        y_im = coordinate(y, height)
        x0 = floor(x_im)
        y0 = floor(y_im)
        dx = x_im - x0
        dy = y_im - y0
        pieces_in, pieces_out, rows, cols, on_maps = [], [], [], [], []
        for (oy, ox) in OFFSETS:
            r = (y0 + oy).clamp(-1e12, 1e12).long()
            c = (x0 + ox).clamp(-1e12, 1e12).long()
            wy = dy if oy else 1 - dy
            wx = dx if ox else 1 - dx
            if weights == "ones":
                w = torch.ones_like(dx)
            elif weights == "near":
                w = (1 - wy) * (1 - wx)
            elif weights == "flip_x":
                w = wy * (1 - wx)
            elif weights == "flip_y":
                w = (1 - wy) * wx
            else:
                w = wy * wx
            on_map = (r >= 0) & (r < height) & (c >= 0) & (c < width)
            taken = _ACCEPT[accept](r, c, height, width)
            if read == "wrap":
                rr, cc = r.remainder(height), c.remainder(width)
                valid = taken & (r >= -height) & (c >= -width)
                srow = start + rr * width + cc
            elif read == "clamp":
                rr, cc = r.clamp(0, height - 1), c.clamp(0, width - 1)
                valid = taken
                srow = start + rr * width + cc
            else:
                srow = start + (r * height + c if row == "rH" else r * width + c)
                valid = taken
            # element offset of value[b, srow, m, 0] in the flat (B, S, M, D) tensor
            flat = ((b_idx * total + srow) * heads + m_idx) * channels
            inside_tensor = (flat >= 0) & (flat + channels <= numel)
            gather = flat.clamp(0, max(numel - channels, 0))[..., None] + d_idx
            v = flat_value[gather]                                   # (B, Q, M, K, D)
            v = torch.where(inside_tensor[..., None], v, torch.full_like(v, float("nan")))
            a = attn[:, :, :, lvl, :] if attention else torch.ones_like(w)
            term = (a * w)[..., None] * v
            zero = torch.zeros_like(term)
            pieces_in.append(torch.where((valid & on_map)[..., None], term, zero))
            pieces_out.append(torch.where((valid & ~on_map)[..., None], term, zero))
            rows.append(r)
            cols.append(c)
            on_maps.append(on_map)
        inside_all.append(torch.stack(pieces_in, -2))               # (B, Q, M, K, 4, D)
        outside_all.append(torch.stack(pieces_out, -2))
        rows_all.append(torch.stack(rows, -1))
        cols_all.append(torch.stack(cols, -1))
        on_map_all.append(torch.stack(on_maps, -1))
    inside = torch.stack(inside_all, 3)                              # (B, Q, M, L, K, 4, D)
    outside = torch.stack(outside_all, 3)
    if terms:
        return {"inside": inside, "outside": outside, "rows": torch.stack(rows_all, 3),
                "cols": torch.stack(cols_all, 3), "on_map": torch.stack(on_map_all, 3)}
    out = (inside + outside).sum(dim=(3, 4, 5))                     # (B, Q, M, D)
    if layout == "dm":
        out = out.transpose(-1, -2)
    return out.reshape(batch, queries, heads * channels)


# mistakes of indexing that read the right tensors at the wrong place, as transforms of the
# five arguments (value, shapes, starts, loc, attn) that ``sample`` then reads correctly
def _attn_point0(args):
    value, shapes, starts, loc, attn = args
    return value, shapes, starts, loc, attn[..., :1].expand_as(attn)


def _attn_level0(args):
    value, shapes, starts, loc, attn = args
    return value, shapes, starts, loc, attn[:, :, :, :1].expand_as(attn)


def _loc_point0(args):
    value, shapes, starts, loc, attn = args
    return value, shapes, starts, loc[..., :1, :].expand_as(loc), attn


def _loc_level0(args):
    value, shapes, starts, loc, attn = args
    return value, shapes, starts, loc[:, :, :, :1].expand_as(loc), attn


def _softmax(args):
    value, shapes, starts, loc, attn = args
    flat = attn.double().reshape(*attn.shape[:3], -1).softmax(-1)
    return value, shapes, starts, loc, flat.reshape(attn.shape)


def _batch0(args):
    value, shapes, starts, loc, attn = args
    return value[:1].expand_as(value), shapes, starts, loc, attn


def _head0(args):
    value, shapes, starts, loc, attn = args
    return value[:, :, :1].expand_as(value), shapes, starts, loc, attn


def _head_channel(args):
    value, shapes, starts, loc, attn = args
    batch, total, heads, channels = value.shape
    swapped = value.reshape(-1).reshape(batch, total, channels, heads).transpose(2, 3)
    return swapped, shapes, starts, loc, attn


def _heads_first(args):
    value, shapes, starts, loc, attn = args
    batch, total, heads, channels = value.shape
    read = value.reshape(-1).reshape(batch, heads, total, channels).transpose(1, 2)
    return read, shapes, starts, loc, attn


def _points_first(args):
    value, shapes, starts, loc, attn = args
    batch, queries, heads, levels, points, _ = loc.shape
    loc = loc.reshape(-1).reshape(batch, queries, heads, points, levels, 2).transpose(3, 4)
    attn = attn.reshape(-1).reshape(batch, queries, heads, points, levels).transpose(3, 4)
    return value, shapes, starts, loc, attn


def _last_sample(args):
    value, shapes, starts, loc, attn = args
    kept = torch.zeros_like(attn)
    kept[..., -1, -1] = attn[..., -1, -1]
    return value, shapes, starts, loc, kept


def _y_is_x(args):
    value, shapes, starts, loc, attn = args
    return value, shapes, starts, loc[..., :1].expand_as(loc), attn


LAST_SAMPLE_ONLY = ("only the last level's last point is in your output: the accumulator is "
                    "overwritten at each sample instead of added to (acc += a * sample)")
Y_IS_X = ("y is read where x is: the location of sample p is x at 2p and y at 2p + 1 (the last "
          "axis of sampling_locations is (x, y))")
HEADS_FIRST = ("value is (B, S, M, D): the rows come before the heads, so value[b, s, m, :] "
               "starts at ((b*S + s)*M + m)*D, not ((b*M + m)*S + s)*D")
POINTS_FIRST = ("the sample index is p = (((b*Q + q)*M + m)*L + l)*K + k: levels before points")


# the usual mistakes of a forward, each as (hint, conventions of ``sample``; "transform": a
# function of the five arguments applied first)
MISTAKES = [
    (HALF_PIXEL, dict(coordinate=lambda x, n: x * n)),
    (ALIGN_CORNERS, dict(coordinate=lambda x, n: x * (n - 1))),
    (XY_SWAPPED, dict(flip_xy=True)),
    (TRUNCATION, dict(floor=_trunc)),
    (ROW_STRIDE_H, dict(row="rH")),
    (SHAPE_SWAPPED, dict(swap_shapes=True)),
    (NO_START, dict(zero_starts=True)),
    (NO_ATTENTION, dict(attention=False)),
    (NO_CORNER_WEIGHTS, dict(weights="ones")),
    (NEAR_WEIGHTS, dict(weights="near")),
    (COL_UPPER, dict(accept="c_upper")),
    (ROW_UPPER, dict(accept="r_upper")),
    (BOTH_UPPER, dict(accept="upper")),
    (COL_LOWER, dict(accept="c_lower")),
    (ROW_LOWER, dict(accept="r_lower")),
    (BOTH_LOWER, dict(accept="lower")),
    (NO_MAP_MASK, dict(accept="all")),
    (WRAP_INDEX, dict(accept="lower", read="wrap")),
    (BORDER, dict(accept="all", read="clamp")),
    (HEADS_LAYOUT, dict(layout="dm")),
    (X_WEIGHTS_SWAPPED, dict(weights="flip_x")),
    (Y_WEIGHTS_SWAPPED, dict(weights="flip_y")),
    (ATTN_IGNORES_POINT, dict(transform=_attn_point0)),
    (ATTN_IGNORES_LEVEL, dict(transform=_attn_level0)),
    (LOC_IGNORES_POINT, dict(transform=_loc_point0)),
    (LOC_IGNORES_LEVEL, dict(transform=_loc_level0)),
    (SOFTMAX_APPLIED, dict(transform=_softmax)),
    (NO_BATCH_TERM, dict(transform=_batch0)),
    (NO_HEAD_TERM, dict(transform=_head0)),
    (HEAD_CHANNEL_SWAPPED, dict(transform=_head_channel)),
    (HEADS_FIRST, dict(transform=_heads_first)),
    (POINTS_FIRST, dict(transform=_points_first)),
    (LAST_SAMPLE_ONLY, dict(transform=_last_sample)),
    (Y_IS_X, dict(transform=_y_is_x)),
]


def _explains(got, variant, differs, atol):
    """``variant`` explains ``got``: equal wherever the variant is known (NaN marks a read past
    the tensor, whose value nobody can know), and known at some element that is wrong."""
    if tuple(got.shape) != tuple(variant.shape):
        return False
    known = ~torch.isnan(variant)
    if known.float().mean() < 0.5:
        return False
    close = ((got - variant).abs() <= atol) | ~known
    return bool(close.all() and (differs & known).any())


def name_mistake(got, args, atol, mistakes=None):
    """The hint of the first usual mistake whose result matches ``got`` within ``atol``
    (the operator's five arguments in ``args``, a dict or a sequence), else None."""
    args = list(args.values()) if isinstance(args, dict) else list(args)
    value, shapes, starts, loc, attn = args
    if not isinstance(got, torch.Tensor):
        return None
    right = sample(value, shapes, starts, loc, attn)
    if got.numel() != right.numel():
        return None
    got = got.detach().cpu().double().reshape(right.shape)
    differs = ~((got - right).abs() <= atol)
    for hint, conventions in (mistakes or MISTAKES):
        conventions = dict(conventions)
        transform = conventions.pop("transform", None)
        inputs = (value, shapes, starts, loc, attn)
        try:
            if transform is not None:
                inputs = transform(inputs)
            variant = sample(*inputs, **conventions)
        except (RuntimeError, IndexError, ValueError):
            continue
        if _explains(got, variant, differs, atol):
            return hint
    return None


def garbage(x) -> bool:
    """NaN, inf or a magnitude no sample of these inputs can reach: a read past a tensor
    (or of memory nobody wrote)."""
    x = torch.as_tensor(x, dtype=torch.float64)
    return bool((~torch.isfinite(x)).any() or (x.abs() > 1e6).any())


def corners_of(x, y, height, width, coordinate=None):
    """[(name, row, col, on the map)] for the four corners of the location (x, y) on an
    (H, W) map, in the usual order."""
    coordinate = coordinate or (lambda v, n: v * n - 0.5)
    x0 = math.floor(coordinate(float(x), width))
    y0 = math.floor(coordinate(float(y), height))
    return [(name, y0 + oy, x0 + ox, 0 <= y0 + oy < height and 0 <= x0 + ox < width)
            for name, (oy, ox) in zip(CORNERS, OFFSETS)]


def describe_corners(x, y, height, width, coordinate=None):
    """'corner (y1, x1) bottom-right at (row 3, col 5)' for every corner of (x, y) that
    lies off an (H, W) map."""
    return [f"{name} at (row {r}, col {c})"
            for name, r, c, inside in corners_of(x, y, height, width, coordinate) if not inside]


def bound_hint(row, col, height, width):
    """Which test lets the off-map corner (row, col) through."""
    if col == width or row == height:
        return ("its column is W (or its row H), one past the last: the test is c < W and "
                "r < H, not c <= W")
    if col < 0 or row < 0:
        return "its column (or row) is negative: test c >= 0 and r >= 0 too"
    return "mask every corner unless 0 <= r < H and 0 <= c < W"


def explain_element(got, args, index, atol, image=False, watched=False):
    """Why output element ``index`` = (b, q, j) with j = m*D + d is wrong, from its samples:
    a corner off the map that was read, a corner on the map that is missing, or a value no
    weighted sum of the inputs reaches.  ``image``: the arguments are one image sampled at Q
    points (lab 04), named so.  ``watched``: the result comes from a run under the guard that
    saw no access outside a tensor (so a strange value is not a read outside).
    Returns a sentence or None."""
    args = list(args.values()) if isinstance(args, dict) else list(args)
    value, shapes, starts, loc, attn = args
    b, q, j = (int(i) for i in index)
    heads, channels = value.shape[2], value.shape[3]
    m, d = divmod(j, channels)
    got_v = float(torch.as_tensor(got).reshape(value.shape[0], loc.shape[1], heads * channels)
                  [b, q, j])
    pieces = sample(value, shapes, starts, loc, attn, accept="all", terms=True)
    inside = pieces["inside"][b, q, m, ..., d]                  # (L, K, 4)
    outside = pieces["outside"][b, q, m, ..., d]
    expected = float(inside.sum())
    diff = got_v - expected
    shape_list = [tuple(int(v) for v in s) for s in torch.as_tensor(shapes).tolist()]
    where = f"point {q}, channel {d}" if image else f"batch {b}, query {q}, head {m}, channel {d}"
    if not math.isfinite(got_v) or abs(got_v) > 1e6:
        text = (f"at {where} the value {got_v:.6g} is not a weighted sum of these inputs (none "
                "reaches it)")
        if watched:
            text += (", and no load went outside a tensor (the check watched every access): "
                     "look at the arithmetic that makes this element (its dtype, an accumulator "
                     "that starts from something else than zero)")
        off = _off_map_corners(pieces, b, q, m, shape_list, loc)
        if off:
            text += f"; the corners of this output that lie off the map: {off}"
        return text
    scale = max(abs(expected), 1e-6)
    tol = max(atol, 1e-9 * scale)
    levels, points = inside.shape[0], inside.shape[1]

    def name(lvl, k, c):
        row = int(pieces["rows"][b, q, m, lvl, k, c])
        col = int(pieces["cols"][b, q, m, lvl, k, c])
        h, w = shape_list[lvl]
        if image:
            return f"corner {CORNERS[c]} at (row {row}, col {col}) of the {h} x {w} map"
        return (f"level {lvl}, point {k}, corner {CORNERS[c]} at (row {row}, col {col}) of a "
                f"{h} x {w} map")

    for lvl in range(levels):
        for k in range(points):
            on = [bool(pieces["on_map"][b, q, m, lvl, k, c]) for c in range(4)]
            off = [c for c in range(4) if not on[c] and math.isfinite(float(outside[lvl, k, c]))
                   and abs(float(outside[lvl, k, c])) > tol]
            groups = [[c] for c in off] + [[c1, c2] for i, c1 in enumerate(off)
                                           for c2 in off[i + 1:]] + ([off] if len(off) > 2 else [])
            for group in groups:
                extra = sum(float(outside[lvl, k, c]) for c in group)
                if abs(diff - extra) <= tol:
                    names = " and ".join(name(lvl, k, c) for c in group)
                    return (f"at {where} the difference is exactly the contribution of {names}: "
                            + ("that corner is" if len(group) == 1 else "those corners are")
                            + " off the map and must add zero, but your code read "
                            + ("it" if len(group) == 1 else "them"))
            for c in range(4):
                missing = float(inside[lvl, k, c])
                if on[c] and abs(missing) > tol and abs(diff + missing) <= tol:
                    return (f"at {where} the difference is exactly the contribution of "
                            f"{name(lvl, k, c)}, which is on the map and missing from your "
                            "result (is your mask too strict at this edge?)")
    return None


def _off_map_corners(pieces, b, q, m, shapes, loc):
    found = []
    on_map = pieces["on_map"][b, q, m]
    for lvl in range(on_map.shape[0]):
        for k in range(on_map.shape[1]):
            for c in range(4):
                if not on_map[lvl, k, c]:
                    found.append(f"level {lvl} point {k} corner {CORNERS[c].split(') ')[0]})")
    return "; ".join(found[:6]) + (" ..." if len(found) > 6 else "")


def output_hint(got, args, atol, index=None, mistakes=None, image=False, watched=False):
    """The hint for a wrong forward output: a named mistake, else the corner that explains
    the worst element, else None."""
    hint = name_mistake(got, args, atol, mistakes)
    if hint is not None:
        return hint
    if index is not None:
        return explain_element(got, args, index, atol, image=image, watched=watched)
    return None


def _ranges(indices):
    """'0', '0 to 3', '1, 4 to 6' for a sorted list of ints."""
    parts, start, prev = [], None, None
    for i in indices:
        if start is None:
            start = prev = i
        elif i == prev + 1:
            prev = i
        else:
            parts.append(f"{start}" if start == prev else f"{start} to {prev}")
            start = prev = i
    if start is not None:
        parts.append(f"{start}" if start == prev else f"{start} to {prev}")
    return ", ".join(parts)


def unwritten(got, heads):
    """Which output rows were never written, for a (B, Q, M*D) result of a launch whose
    output the check filled with NaN first: a sentence, or None when no element is NaN."""
    got = torch.as_tensor(got).detach().cpu()
    if got.dim() != 3 or not bool(torch.isnan(got).any()):
        return None
    batch, queries, width = got.shape
    nan = torch.isnan(got.double()).reshape(batch, queries, heads, width // heads)
    rows = nan.all(-1)                                         # (B, Q, M): the whole row
    parts = []
    for b in range(batch):
        for m in range(heads):
            q = rows[b, :, m].nonzero().flatten().tolist()
            if q:
                which = "every query" if len(q) == queries else f"queries {_ranges(q)}"
                parts.append(f"batch {b}, head {m}: {which}")
    partial = nan.any(-1) & ~rows
    text = "never written (they still hold the NaN the check filled the output with)"
    if parts:
        text = (f"these output rows were {text}: " + "; ".join(parts[:6])
                + (" ..." if len(parts) > 6 else ""))
        if bool(partial.any()):
            text += "; and some rows only in part (channels)"
    else:
        b, q, m = (int(i) for i in partial.nonzero()[0])
        d = nan[b, q, m].nonzero().flatten().tolist()
        text = f"channels {_ranges(d)} of batch {b}, query {q}, head {m} were {text}"
    return text


OUTPUT_AXES = ("batch", "query", "head", "channel")


def output_mismatch(got, expected, atol, what, heads):
    """``explain_mismatch`` of two (B, Q, M*D) outputs with the axes named batch, query,
    head, channel (M*D split into its head and channel); None when they match."""
    from source_kernels.testing import explain_mismatch
    if not isinstance(got, torch.Tensor):
        return f"{what}: expected a torch.Tensor, got {type(got).__name__}"
    got = got.detach().cpu()
    if tuple(got.shape) != tuple(expected.shape):
        return f"{what}: expected shape {tuple(expected.shape)}, got {tuple(got.shape)}"
    batch, queries, width = expected.shape
    shape = (batch, queries, heads, width // heads)
    return explain_mismatch(got.double().reshape(shape), expected.double().reshape(shape),
                            atol=atol, rtol=0.0, axes=OUTPUT_AXES, what=what)


def worst_index(got, expected):
    """(b, q, j) of the element that differs most (NaN counts as the most)."""
    g = torch.as_tensor(got).detach().cpu().double()
    e = torch.as_tensor(expected).detach().cpu().double()
    diff = (g - e).abs()
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, float("inf")), diff)
    flat = int(diff.reshape(-1).argmax())
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), g.shape))


def forward_hint(got, args, dtype):
    """The hint for a wrong (B, Q, M*D) forward ``got`` on ``args`` (the operator's five
    arguments): as ``_operator.forward_hint`` always did, now with every mistake above."""
    from . import _operator
    expected = _operator.forward_fp64(args)
    scale = max(expected.abs().max().item(), 1e-6)
    atol = _operator.TOLERANCE[dtype] * scale
    hint = output_hint(got, args, atol, worst_index(got, expected))
    return hint or ("compare one level at a time (set the other levels' attention weights to "
                    "0) to find where it goes wrong")


def name_coordinate_mistake(got, normalised, size, atol=1e-9):
    """The hint when ``got`` (pixel coordinates of ``normalised`` on maps of ``size``)
    matches a usual wrong convention, else None."""
    got = torch.as_tensor(got, dtype=torch.float64)
    normalised = torch.as_tensor(normalised, dtype=torch.float64)
    size = torch.as_tensor(size, dtype=torch.float64)
    for hint, f in coordinate_variants():
        if bool(((got - f(normalised, size)).abs() <= atol).all()):
            return hint
    return None


# ---------------------------------------------------------------------- location by isolation
# The probes (``_operator.probes``: inputs only, so the grading kernel can build them too)
# switch on one term of the forward at a time; :func:`locate` judges what the student's
# function returned on them.


def _one_hot(args, lvl, k):
    attn = torch.zeros_like(args["attention_weights"])
    attn[..., lvl, k] = 1
    return dict(args, attention_weights=attn)


def _slices(bad, got_shape):
    """'only batch 1 is wrong' style sentences for a (B, Q, M, D) mask of wrong elements."""
    parts = []
    for axis, name in ((0, "batch element"), (2, "head"), (3, "channel")):
        size = got_shape[axis]
        if size < 2:
            continue
        wrong = bad.transpose(0, axis).reshape(size, -1).any(-1).nonzero().flatten().tolist()
        if wrong and len(wrong) < size:
            which = _ranges(wrong)
            parts.append(f"only {name}{'s' if len(wrong) > 1 else ''} {which} "
                         f"{'are' if len(wrong) > 1 else 'is'} wrong")
    return parts


def locate(results, probe_list, tolerance, heads_of=None):
    """The first probe (of ``_operator.probes``) whose result is wrong, as (label, message)
    for the check to raise, or None when every probe is right.  ``results``: what the student's function returned on
    each probe, (B, Q, M*D) (or anything else: then named as such); ``tolerance``: the error
    allowed relative to the largest |expected| (the dtype's)."""
    from . import _operator
    for (label, term, args), got in zip(probe_list, results):
        expected = _operator.forward_fp64(args)
        heads = args["value"].shape[2]
        scale = max(expected.abs().max().item(), 1e-6)
        atol = tolerance * scale
        message = output_mismatch(got, expected, atol, f"probe: {label}", heads)
        if message is None:
            continue
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(expected.shape):
            return label, message
        got = got.detach().cpu().double()
        hint = _probe_hint(got, expected, args, label, term, atol, heads)
        return label, message + "\nHint: " + hint
    return None


def precision_hint(got, expected, dtype=torch.float32):
    """The hint when a result of ``dtype`` inputs holds only values of a 16-bit format
    (every element exactly representable in bfloat16, or in float16) and is within a few of
    that format's roundings of the reference: the arithmetic ran in 16 bits.  Else None."""
    if dtype not in (torch.float32, torch.float64):
        return None
    got = torch.as_tensor(got).detach().cpu()
    if not bool(torch.isfinite(got).all()) or got.numel() < 4:
        return None
    wide = got.double()
    scale = max(float(expected.abs().max()), 1e-6)
    err = float((wide - expected.double()).abs().max()) / scale
    for name, narrow, bits in (("bfloat16", torch.bfloat16, 8), ("float16", torch.float16, 11)):
        exact = bool((wide.to(narrow).double() == wide).all())
        if exact and err <= 16 * 2.0 ** -bits:
            return (f"every element of your result is a {name} value (its low bits are zero) "
                    f"and within a few {name} roundings of the reference (largest error "
                    f"{err:.1e} of the largest value), on {str(dtype)[6:]} inputs: something "
                    f"is computed or accumulated in {name}; keep the accumulator and every "
                    "loaded value in ACC_DTYPE and convert only in the store")
    return None


def factor_hint(got, expected, atol):
    """The hint when ``got`` is one constant times ``expected`` everywhere (a factor other
    than 1, within ``atol``), else None."""
    got = torch.as_tensor(got).detach().cpu().double()
    expected = torch.as_tensor(expected).detach().cpu().double()
    if got.shape != expected.shape or not bool(torch.isfinite(got).all()):
        return None
    big = expected.abs() > 10 * atol
    if int(big.sum()) < 2:
        return None
    factor = float((got[big] / expected[big]).median())
    if abs(factor - 1) < 1e-3 or not bool(((got - factor * expected).abs() <= atol).all()):
        return None
    return (f"every element of your result is {factor:.4g} times the right one: a constant "
            "factor multiplies the whole sum (a weight counted twice or halved, a scale that "
            "does not belong)")


def _probe_hint(got, expected, args, label, term, atol, heads):
    from . import _operator
    batch, queries, width = expected.shape
    channels = width // heads
    shape = (batch, queries, heads, channels)
    never = unwritten(got, heads)
    if never is not None:
        return (never + "; nothing of these inputs is outside a tensor, so no program stored "
                f"those rows. The probe that first goes wrong adds {term}")
    named = name_mistake(got, args, atol) or precision_hint(got, expected,
                                                             args["value"].dtype) \
        or factor_hint(got, expected, atol)
    if named is not None:
        return named
    levels, points = args["attention_weights"].shape[3:]
    # one-hot probes: does the result equal what another (level, point) should give?
    hot = (args["attention_weights"] == 1).reshape(-1, levels, points).all(0)
    if levels * points > 1 and bool(hot.any()) and bool((args["attention_weights"] != 0).sum() ==
                                args["attention_weights"].numel() // (levels * points)):
        lvl, k = (int(i) for i in hot.nonzero()[0])
        if bool((got.abs() <= atol).all()):
            return (f"with all attention on level {lvl}, point {k}, your output is zero: that "
                    "sample was scaled by the weight of another (level, point), which is 0 here: "
                    "the weight's index ignores the " + ("point" if k else "level"))
        for other_l in range(levels):
            for other_k in range(points):
                if (other_l, other_k) == (lvl, k):
                    continue
                alt = _operator.forward_fp64(_one_hot(args, other_l, other_k))
                if bool(((got - alt).abs() <= atol).all()):
                    return (f"with all attention on level {lvl}, point {k}, your output equals "
                            f"what level {other_l}, point {other_k} should give: that sample "
                            "read the location of another (level, point): the location's "
                            "index ignores the " + ("point" if other_k != k else "level"))
    bad = ~((got - expected).abs() <= atol)
    parts = _slices(bad.reshape(shape), shape)
    where = (", ".join(parts) + ": ") if parts else ""
    text = (f"{where}no usual mistake reproduces your output here, and the probes before this "
            f"one were right, so look at what this probe adds: {term}")
    if "pixel centre" in label:
        pixel = _which_pixel(got, args)
        if pixel:
            text = pixel + "; " + text
    return text


def _which_pixel(got, args):
    """At a pixel centre: whose value did the student's output take?"""
    value = args["value"].double()
    loc = args["sampling_locations"].double()
    height, width = (int(v) for v in args["value_spatial_shapes"][0])
    b, q, m = 0, 0, 0
    x, y = (float(t) for t in loc[b, q, m, 0, 0])
    c, r = round(x * width - 0.5), round(y * height - 0.5)
    out = got.reshape(value.shape[0], -1, value.shape[2], value.shape[3])[b, q, m]
    rows = value[b, :, m]                                       # (S, D)
    hits = ((rows - out).abs().max(-1).values <= 1e-6 * max(1.0, float(rows.abs().max())))
    found = hits.nonzero().flatten().tolist()
    if not found:
        return None
    s = found[0]
    rr, cc = divmod(s, width)
    if s == r * width + c:
        return None
    return (f"at the centre of pixel (row {r}, col {c}) your output is the value of row {s} of "
            f"S, pixel (row {rr}, col {cc}) of the {height} x {width} map; pixel (row {r}, "
            f"col {c}) is row {r * width + c} = r * W + c")
