"""Checks of lab 01 (the spec), visible and hidden alike: the pixel coordinate and the corner
weights, one bilinear sample, MSDA as loops.

A visible check passes a shown ``seed``; a hidden check draws a fresh one.  Every wrong answer
is compared with the usual mistakes (:mod:`diagnose`: the half pixel, align_corners, x/y
swapped, truncation instead of floor, a corner off the map that is read, H and W swapped, a
missing level start, missing attention weights, the heads' layout) and the one that matches
is named; expected values exist only when the check judges (``common.expect``).

``check_msda_naive`` first runs the isolation probes (``_operator.probes``: one term of
the forward switched on at a time) and stops at the first that goes wrong; an exception raised
by the student's msda_naive is reported as the check's message.
"""
from __future__ import annotations

import math
import re

import torch

from source_kernels.inputs import make_inputs

from .common import Raised, attempt, forbid_references, fresh_generator, judging
from .demo import NAME_ERROR, is_output, raised as _raised  # noqa: F401  (is_output: demos)
from .guard import guarded  # noqa: F401  (the notebook's demo cells: check.guarded(...))

CORNERS = ("(y0, x0) top-left", "(y0, x1) top-right", "(y1, x0) bottom-left",
           "(y1, x1) bottom-right")


def _tag(gen, seed):
    return f"seed {seed}" if seed is not None else f"hidden check, seed {gen.initial_seed()}"


def _passed(text):
    if judging():
        from . import diagnose
        diagnose.passed(text)


def _reference(name, *args):
    from source_kernels import reference
    return getattr(reference, name)(*args)


# ---------------------------------------------------------------------- 1. corners
def check_corner_weights(pixel_coordinate, bilinear_corner_weights, seed=None):
    """``pixel_coordinate(x, size)`` on the borders, a pixel centre and random locations;
    ``bilinear_corner_weights(x_im, y_im)`` on integers, negatives and random coordinates."""
    gen = fresh_generator(seed)
    tag = _tag(gen, seed)
    coordinates = [(0.0, 4), (0.125, 4), (1.0, 4), (0.5, 5), (0.3, 1)]
    coordinates += [(float(x), int(n)) for x, n in
                    zip(torch.rand(8, generator=gen, dtype=torch.float64) * 1.4 - 0.2,
                        torch.randint(1, 200, (8,), generator=gen))]
    points = [(1.3, 0.6), (0.0, 0.0), (2.0, 3.0), (-0.5, 2.25), (3.0, -1.0), (-1.75, -0.2),
              (-0.3, 0.7)]
    points += (torch.rand(20, 2, generator=gen, dtype=torch.float64) * 10 - 3).tolist()
    with forbid_references(pixel_coordinate, bilinear_corner_weights):
        pixels = [attempt(pixel_coordinate, x, n) for x, n in coordinates]
        corners = [attempt(bilinear_corner_weights, x_im, y_im) for x_im, y_im in points]
    if not judging():
        return
    _judge_pixels(pixels, coordinates, tag)
    for (x_im, y_im), got in zip(points, corners):
        _judge_corners(got, x_im, y_im, tag)
    _passed(f"pixel_coordinate ({len(coordinates)} locations) and bilinear_corner_weights "
            f"({len(points)} pixel coordinates, negatives included): all right ({tag})")


def _judge_pixels(pixels, coordinates, tag):
    from . import diagnose
    for (x, n), got in zip(coordinates, pixels):
        if isinstance(got, Raised):
            raise _raised(f"pixel_coordinate({x:.6g}, {n}) ({tag})", "pixel_coordinate", got)
        expected = _reference("pixel_coordinate", x, n)
        try:
            ok = math.isclose(float(got), expected, rel_tol=1e-12, abs_tol=1e-12)
        except (TypeError, ValueError):
            raise AssertionError(f"pixel_coordinate({x:.6g}, {n}) ({tag}): expected a float, got "
                                 f"{type(got).__name__}") from None
        if not ok:
            xs = torch.tensor([c[0] for c in coordinates], dtype=torch.float64)
            ns = torch.tensor([c[1] for c in coordinates], dtype=torch.float64)
            try:
                values = torch.tensor([float(p) for p in pixels], dtype=torch.float64)
            except (TypeError, ValueError):            # another call raised or gave no number
                hint = None
            else:
                hint = diagnose.name_coordinate_mistake(values, xs, ns, 1e-9)
            raise AssertionError(f"pixel_coordinate({x:.6g}, {n}) ({tag}): expected {expected:.6g}, "
                                 f"got {float(got):.6g}\nHint: "
                                 + (hint or "the pixel coordinate is x * size - 0.5"))


def _judge_corners(got, x_im, y_im, tag):
    from . import diagnose
    expected = _reference("bilinear_corner_weights", x_im, y_im)
    where = f"bilinear_corner_weights({x_im:.6g}, {y_im:.6g}) ({tag})"
    if isinstance(got, Raised):
        raise _raised(where, "bilinear_corner_weights", got)
    try:
        got = list(got)
    except TypeError:
        raise AssertionError(f"{where}: expected a list of 4 corners (row, col, weight), got "
                             f"{type(got).__name__}") from None
    if len(got) != 4:
        raise AssertionError(f"{where}: expected a list of 4 corners (row, col, weight), got "
                             f"{len(got)}")
    try:
        got = [(int(r), int(c), float(w)) for r, c, w in got]
    except (TypeError, ValueError):
        raise AssertionError(f"{where}: expected 4 corners (row, col, weight) of numbers, got "
                             f"{got!r:.200}") from None
    total = sum(w for _, _, w in got)
    for name, (row, col, weight), (e_row, e_col, e_weight) in zip(CORNERS, got, expected):
        if (row, col) != (e_row, e_col):
            x0, y0 = math.floor(x_im), math.floor(y_im)
            cells = [(r, c) for r, c, _ in got]
            if cells == [(x0 + ox, y0 + oy) for oy, ox in diagnose.OFFSETS] or \
                    cells == [(x0 + oy, y0 + ox) for oy, ox in diagnose.OFFSETS]:
                hint = ("row and column are swapped: a corner is (row, col) = (y, x); x_im "
                        "gives the column, y_im the row")
            elif cells == [(math.trunc(y_im) + oy, math.trunc(x_im) + ox)
                           for oy, ox in diagnose.OFFSETS]:
                hint = diagnose.TRUNCATION
            elif sorted(cells) == sorted((e[0], e[1]) for e in expected):
                hint = "the order is (y0, x0), (y0, x1), (y1, x0), (y1, x1)"
            else:
                hint = "x0 = floor(x_im), y0 = floor(y_im), and x1 = x0 + 1, y1 = y0 + 1"
            raise AssertionError(f"{where}: corner {name}: expected (row, col) = ({e_row}, "
                                 f"{e_col}), got ({row}, {col})\nHint: {hint}")
        if not math.isclose(weight, e_weight, rel_tol=1e-9, abs_tol=1e-12):
            dx, dy = x_im - math.floor(x_im), y_im - math.floor(y_im)

            def weights(ex, ey):                 # (y0,x0) (y0,x1) (y1,x0) (y1,x1)
                return [(1 - ey) * (1 - ex), (1 - ey) * ex, ey * (1 - ex), ey * ex]

            def matches(candidate):
                return all(math.isclose(w, n, abs_tol=1e-9) for (_, _, w), n in zip(got, candidate))
            if matches(weights(1 - dx, 1 - dy)):
                hint = diagnose.NEAR_WEIGHTS
            elif matches(weights(1 - dx, dy)):
                hint = diagnose.X_WEIGHTS_SWAPPED
            elif matches(weights(dx, 1 - dy)):
                hint = diagnose.Y_WEIGHTS_SWAPPED
            elif not math.isclose(total, 1.0, abs_tol=1e-9):
                hint = (f"your four weights sum to {total:.4f}, not 1: each is the area of the "
                        "rectangle opposite its corner, (1 - dy)(1 - dx), (1 - dy) dx, "
                        "dy (1 - dx), dy dx")
            else:
                hint = ("no usual mistake gives these weights (they do sum to 1): corner "
                        "(y0, x0) gets (1 - dy)(1 - dx), (y0, x1) (1 - dy) dx, (y1, x0) "
                        "dy (1 - dx), (y1, x1) dy dx, with dx = x_im - x0, dy = y_im - y0")
            raise AssertionError(f"{where}: corner {name}: expected weight {e_weight:.6f}, got "
                                 f"{weight:.6f}\nHint: {hint}")


# ---------------------------------------------------------------------- 2. one sample
def _as_msda(image, points):
    """Samples of an (H, W, D) image at N points as the operator's five arguments
    (B = M = L = K = 1, Q = N)."""
    height, width, channels = image.shape
    n = len(points)
    return (image.double().reshape(1, height * width, 1, channels), torch.tensor([[height, width]]),
            torch.tensor([0]), torch.tensor(points, dtype=torch.float64).reshape(1, n, 1, 1, 1, 2),
            torch.ones(1, n, 1, 1, 1, dtype=torch.float64))


def check_bilinear_sample(bilinear_sample_naive, seed=None):
    """Samples at a pixel centre, between four centres, the map's corners and edges,
    outside, and random locations; 1-pixel-wide and 1-pixel-high maps; the dtype."""
    gen = fresh_generator(seed)
    tag = _tag(gen, seed)
    fixed = torch.arange(3 * 4 * 2, dtype=torch.float64).reshape(3, 4, 2)
    cases = [(fixed, [(2.5 / 4, 1.5 / 3), (1.0 / 4, 1.0 / 3), (0.0, 0.0), (1.0, 1.0), (1.0, 0.5),
                      (-0.1, 0.5), (0.5, 1.1), (0.02, 0.98)])]
    for height, width, channels in ((5, 6, 3), (1, 3, 2), (4, 1, 1)):
        image = torch.randn(height, width, channels, generator=gen, dtype=torch.float64)
        loc = (torch.rand(10, 2, generator=gen, dtype=torch.float64) * 1.4 - 0.2).tolist()
        cases.append((image, [tuple(p) for p in loc] + [(0.0, 0.0), (1.0, 1.0)]))
    results = []
    with forbid_references(bilinear_sample_naive):
        for image, points in cases:
            for x, y in points:
                try:
                    got = bilinear_sample_naive(image.clone(), x, y)
                except AssertionError:
                    raise
                except IndexError as exc:
                    height, width, _ = image.shape
                    off = _off_map(x, y, height, width)
                    raise AssertionError(
                        f"bilinear_sample_naive on a {height}x{width} map at (x, y) = ({x:.4f}, "
                        f"{y:.4f}) ({tag}) raised IndexError: {exc}\nHint: a corner off the map "
                        f"was indexed ({off}): add a corner only when 0 <= row < H and "
                        "0 <= col < W (row H and column W are one past the last)") from None
                except Exception as exc:                            # noqa: BLE001
                    height, width, _ = image.shape
                    raise _raised(f"bilinear_sample_naive on a {height}x{width} map at (x, y) = "
                                  f"({x:.4f}, {y:.4f}) ({tag})", "bilinear_sample_naive",
                                  Raised(exc)) from None
                results.append((image, x, y, got))
    if not judging():
        return
    for index, (image, x, y, got) in enumerate(results):
        same = [r for r in results if r[0] is image]
        _judge_sample(image, x, y, got, tag, same)
    _passed(f"bilinear_sample_naive: {len(results)} samples of 4 maps (centres, borders, outside, "
            f"random) match the spec ({tag})")


def _off_map(x, y, height, width):
    from . import diagnose
    return "; ".join(diagnose.describe_corners(x, y, height, width)) or "none"


def _judge_sample(image, x, y, got, tag, same):
    """Compare one sample; on a mismatch, diagnose with every sample of the same image
    (one point alone is often explained by several mistakes)."""
    from source_kernels.testing import explain_mismatch

    from . import diagnose
    height, width, _ = image.shape
    what = f"bilinear_sample_naive on a {height}x{width} map at (x, y) = ({x:.4f}, {y:.4f}) ({tag})"
    if not isinstance(got, torch.Tensor):
        raise AssertionError(f"{what}: expected a (D,) tensor, got {type(got).__name__}")
    if got.dtype != image.dtype:
        raise AssertionError(f"{what}: expected the dtype of image, {image.dtype}, got {got.dtype}")
    expected = _reference("bilinear_sample_naive", image, x, y)
    message = explain_mismatch(got, expected, atol=1e-12, rtol=1e-9, axes=("channel",), what=what)
    if message is None:
        return
    points = [(px, py) for _, px, py, _ in same]
    stacked = [g for _, _, _, g in same]
    hint = None
    if all(isinstance(g, torch.Tensor) and g.shape == got.shape for g in stacked):
        position = next(i for i, (_, px, py, _) in enumerate(same) if (px, py) == (x, y))
        hint = diagnose.output_hint(torch.stack(stacked).double().reshape(1, len(same), -1),
                                    _as_msda(image, points), 1e-9, (0, position, 0), image=True)
    if hint is None:
        lines = []
        for name, row, col, inside in diagnose.corners_of(x, y, height, width):
            lines.append(f"  corner {name}: (row {row}, col {col}), "
                         + ("inside" if inside else "OFF the map: it must add nothing"))
        hint = "the corners of this sample:\n" + "\n".join(lines)
    raise AssertionError(f"{message}\nHint: {hint}")


# ---------------------------------------------------------------------- 3. MSDA as loops
def check_msda_naive(msda_naive, seed=None):
    """One level, one head, one point; three levels, two heads, batch 2 with locations
    outside; float32 in, float32 out."""
    gen = fresh_generator(seed)
    tag = _tag(gen, seed)
    cases = [("one level, one head, one point", (1, 2, 1, 3, [[3, 4]], 1), torch.float64, 0.05),
             ("3 levels, 2 heads, 2 points, batch 2", (2, 3, 2, 3, [[4, 5], [2, 3], [1, 2]], 2),
              torch.float64, 0.1),
             ("float32, 2 levels", (1, 2, 2, 2, [[3, 3], [2, 2]], 2), torch.float32, 0.05)]
    from ._operator import probes
    results = []
    probe_list = probes(gen)
    with forbid_references(msda_naive):
        probed = [_call_msda(msda_naive, args, f"msda_naive, probe: {label} ({tag})")
                  for label, _, args in probe_list]
        for description, shape, dtype, outside in cases:
            args = make_inputs(*shape, dtype=dtype, outside=outside,
                               seed=int(torch.randint(0, 2 ** 31 - 1, (1,), generator=gen)))
            results.append((description, args,
                            _call_msda(msda_naive, args, f"msda_naive, {description} ({tag})")))
    if not judging():
        return
    from . import diagnose
    found = diagnose.locate(probed, probe_list, 1e-10)
    if found is not None:
        raise AssertionError(f"msda_naive ({tag}), {found[1]}")
    for description, args, got in results:
        _judge_msda(description, args, got, tag)
    _passed(f"msda_naive: {len(probe_list)} probes (one term at a time), then "
            f"{'; '.join(c[0] for c in cases)}: all match the spec ({tag})")


def _call_msda(msda_naive, args, what):
    """The student's msda_naive on private copies; an exception it raises becomes the
    check's message (with what the check can say about it), not the notebook's traceback."""
    try:
        return msda_naive(*(t.clone() for t in args.values()))
    except AssertionError:
        raise
    except Exception as exc:                                        # noqa: BLE001
        from .demo import unwritten
        if unwritten(exc):
            raise _raised(what, "msda_naive", Raised(exc)) from None
        text = str(exc).strip().splitlines()[-1] if str(exc).strip() else ""
        hint = "run it on this input yourself and look at the line the traceback names"
        reshape = _RESHAPE.search(text) if isinstance(exc, RuntimeError) else None
        if reshape is not None:
            hint = _reshape_hint(args, [int(v) for v in reshape.group(1).split(",") if
                                        v.strip()], int(reshape.group(2)))
        elif isinstance(exc, IndexError):
            hint = ("an index went past a tensor's size: a corner off the map must be skipped "
                    "(0 <= row < H and 0 <= col < W), and a level's rows start at "
                    "level_start_index[l]")
        elif isinstance(exc, NameError):
            hint = NAME_ERROR
        from .demo import where
        raise AssertionError(f"{what}: your msda_naive raised {type(exc).__name__}"
                             f"{where(exc)}: {text}\nHint: {hint}") from None


_RESHAPE = re.compile(r"shape '\[([-\d, ]*)\]' is invalid for input of size (\d+)")


def _reshape_hint(args, target, size):
    """What a failed reshape to ``target`` of ``size`` elements says, decided from the
    numbers: a level's (H, W, D) slice cut short, the (B, Q, M*D) output, or neither."""
    value = args["value"]
    batch, total, heads, channels = value.shape
    queries = args["sampling_locations"].shape[1]
    shapes = args["value_spatial_shapes"].tolist()
    starts = args["value_level_start_index"].tolist()
    wanted = math.prod(target) if -1 not in target else None
    for (height, width), start in zip(shapes, starts):
        if target == [height, width, channels] and size < height * width * channels:
            return (f"a reshape to (H, W, D) = {tuple(target)} got {size // channels} rows, "
                    f"fewer than H * W = {height * width}: a level's rows are "
                    f"value[b, start:start + H*W] with start = level_start_index[l], and here "
                    f"the levels {shapes} start at rows {starts} of S = {total}; a start past "
                    "the level's first row cuts the slice short at the end of S")
    if size == batch * queries * heads * channels and wanted is not None:
        return (f"the reshape asks for {tuple(target)} ({wanted} elements) of a tensor of "
                f"B * Q * M * D = {size}: the output is (B, Q, M*D) = "
                f"{(batch, queries, heads * channels)}, the heads' channels side by side")
    return (f"the reshape asks for {tuple(target)}"
            + (f" ({wanted} elements)" if wanted is not None else "")
            + f" of a tensor of {size} elements: print the shape of what it reshapes on this "
            "input")


def _judge_msda(description, args, got, tag):
    from . import diagnose
    what = f"msda_naive, {description} ({tag})"
    dtype = args["value"].dtype
    if isinstance(got, torch.Tensor) and got.dtype != dtype:
        raise AssertionError(f"{what}: expected the dtype of value, {dtype}, got {got.dtype}"
                             "\nHint: accumulate in float64, then .to(value.dtype)")
    expected = _reference("msda_naive", *args.values())
    atol = 1e-10 if dtype == torch.float64 else 1e-5
    heads = args["value"].shape[2]
    message = diagnose.output_mismatch(got, expected, atol, what, heads)
    if message is None:
        return
    hint = None
    if isinstance(got, torch.Tensor) and got.shape == expected.shape:
        hint = diagnose.output_hint(got.double(), args, atol,
                                    diagnose.worst_index(got, expected))
    raise AssertionError(message + "\nHint: " + (hint or (
        "no usual mistake matches: print one sample of yours and of the spec "
        "(source_kernels.chips.lab01.msda_naive) for one (batch, query, head) and one level")))
