"""Checks of lab 08 (concurrent writes): the corner-hit histogram with a race and with
atomics, the prediction of the updates the race loses, and the backward kernel, one gradient
at a time, against autograd through the float64 reference.

One code path for the visible checks (a fixed ``seed``) and the hidden ones (``seed=None``:
the grader's seed).  The checks launch the student's kernels themselves, through
``guard.launch``: every read and write outside a tensor is reported with the kernel line that
made it, never executed.  Expected values and the diagnosis of a wrong result come from the
float64 reference and lab 08's chips, imported only when a check judges.
"""
from __future__ import annotations

import contextlib

import torch

from autograde import check_api

from . import _operator as op
from . import diagnose_grad, guard
from .common import check_close, expect, forbid_references, fresh_generator, judging
from .demo import guarded as _guarded

__all__ = ["guarded", "HITS_HINTS", "BACKWARD_HINTS", "check_corner_hits_racy", "check_lost_updates", "check_corner_hits",
           "check_backward_grad_attn", "check_backward_grad_loc", "check_backward_grad_value",
           "check_backward_half"]


def _chip():
    from source_kernels.chips import lab08
    return lab08


@contextlib.contextmanager
def guarded(what, hints=None):
    """The guard of the lab's demonstration cells (``autograde.checks.demo.guarded``), which
    show and grade nothing: what the guard finds (an access outside a tensor, an exception of
    the student's code) is printed in the cell's output, pointing to the checks, and the cell
    ends there without raising, so that the notebook goes on."""
    try:
        with _guarded(what, hints) as report:
            yield report
    except AssertionError as exc:
        text = str(exc).strip() or f"{what}: an assertion failed in your code"
        if not text.startswith(what):
            text = f"{what}: {text}"
        print(text + "\n(This cell only shows your kernels at work; the visible checks of this "
              "section grade them and say what goes wrong.)")


def _is_kernel(obj) -> bool:
    return hasattr(obj, "fn") and hasattr(obj, "run") and callable(getattr(obj, "fn", None))


def _launch(kernel, name, grid, args, kwargs, what, hint, writes=()):
    """Run ``kernel[grid](*args, **kwargs)`` with every access checked; returns the tensors it
    ran on (in the grader's replay: ``args`` themselves, updated from the record)."""
    if not (isinstance(kernel, check_api.Proxy) or _is_kernel(kernel)):
        raise AssertionError(f"{name} must be a @triton.jit kernel, got "
                             f"{type(kernel).__name__}")
    ran_on, report = _launch_with_report(kernel, name, grid, args, kwargs, what, hint, writes)
    return ran_on


def _launch_with_report(kernel, name, grid, args, kwargs, what, hint, writes=()):
    """:func:`_launch`, returning (the tensors it ran on, the guard's report or None)."""
    if not (isinstance(kernel, check_api.Proxy) or _is_kernel(kernel)):
        raise AssertionError(f"{name} must be a @triton.jit kernel, got "
                             f"{type(kernel).__name__}")
    report = None
    with forbid_references(kernel, writes=writes):
        try:
            if check_api.replaying():
                kernel[grid](*args, **kwargs)
            else:
                report = guard.launch(kernel, grid, *args, **kwargs)
        except AssertionError:
            raise
        except Exception as exc:                  # noqa: BLE001  (explained, as a failure)
            raise AssertionError(raised_in_kernel(name, what, exc)) from None
    if report is None:
        return args, None
    if report.violations:
        if isinstance(hint, dict):
            # a hint for the set of tensors that were accessed outside, where there is one
            # (the gather and the scatter of one corner both went outside), else for the first
            tensors = tuple(sorted({v.tensor for v in report.violations}))
            first = report.violations[0].tensor
            hint = hint.get(tensors, hint.get(first, hint.get(None)))
            if callable(hint):                    # a diagnosis that runs isolation probes
                hint = hint() or _UNCONFIRMED.get(first, _UNCONFIRMED[None])
        report.check(what, hint)
    return report.args, report


def _raised_in_function(name, what, exc):
    """What a check says when the student's Python function raised ``exc``."""
    from .demo import unwritten, where

    if unwritten(exc):
        return (f"{what}: {name} is not written yet (it raises NotImplementedError"
                f"{where(exc)}): replace the raise with your code")
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return (f"{what}: {name} raised {type(exc).__name__}{where(exc)}: "
            f"{lines[0] if lines else ''}\nHint: the check called it with the arguments its "
            "docstring gives, in their shapes and types: that line is where your code stopped "
            "(print what it computes with, on these arguments)")


def raised_in_kernel(name, what, exc):
    """What a check says when launching the student's kernel raised ``exc``."""
    text = str(exc).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) > 12:
        text = "\n".join(lines[:3] + ["..."] + lines[-8:])
    from .demo import unwritten, where

    if unwritten(exc):
        return (f"{what}: {name} is not written yet (it raises NotImplementedError"
                f"{where(exc)}): replace the raise with your code")
    return (f"{what}: launching {name} raised {type(exc).__name__}{where(exc)}: {text}\nHint: "
            "the kernel did not run to its end. In the interpreter a shape that does not "
            "broadcast, a tl.arange whose size is not a power of two, or an int mixed with a "
            "pointer of the wrong kind are the usual causes")


# ------------------------------------------------------------------ the corner-hit histogram
# what a check says of an access outside a tensor when its isolation probes confirm no cause
_UNCONFIRMED = {
    "hits_ptr": "the isolation probes (one sample, one edge of the map at a time) do not show "
                "which corners your mask lets through, so another mistake is in the way too: "
                "mask each corner's update with all five tests at once (offs < n, 0 <= row < H, "
                "0 <= column < W) and print each corner's row and column for the lanes above",
    None: "mask every access with the test that keeps it inside its tensor"}
_HITS_GUARD = {
    "loc_ptr": "lanes past the last sample read past the locations: load them with the lane "
               "mask (offs < n)",
    "hits_ptr": "corners off the map are counted: a corner off the map has no pixel, and "
                "row * W + column then points outside hits (or at another pixel); mask each "
                "corner's load and store with its on-map test (0 <= row < H and 0 <= column < W)",
    None: "mask every access: the lane mask (offs < n) for the locations, each corner's on-map "
          "test for the counts"}


def _uniform(gen, n, outside):
    return torch.rand(n, 2, generator=gen) * (1 + 2 * outside) - outside


def _clustered(gen, n, spread):
    centre = torch.rand(2, generator=gen) * 0.6 + 0.2
    return centre + spread * torch.randn(n, 2, generator=gen)


def _hits_cases(gen):
    """(description, H, W, locations (n, 2) float32, samples per program)."""
    yield ("40 samples on a 3 x 4 map, 16 per program", 3, 4, _uniform(gen, 40, 0.25), 16)
    yield ("13 samples on a 1 x 1 map, 8 per program", 1, 1, _uniform(gen, 13, 0.3), 8)
    yield ("100 samples clustered on a 6 x 5 map, 32 per program", 6, 5,
           _clustered(gen, 100, 0.15), 32)


def _run_hits(kernel, name, height, width, locations, block, what):
    loc = locations.to(op.device(), torch.float32).contiguous()
    hits = torch.zeros(height * width, dtype=torch.int32, device=loc.device)
    n = loc.shape[0]
    hint = _HITS_GUARD
    if not check_api.replaying() and guard.interpreting():
        hint = dict(_HITS_GUARD, hits_ptr=lambda: _hits_mask_hint(kernel))
    ran_on = _launch(kernel, name, (-(-n // block),), (loc, hits, n, height, width),
                     {"BLOCK": block}, what, hint, writes=(1,))
    return ran_on[1].detach().cpu().long()


# the isolation probes of a corner-hit kernel that counted outside hits: one sample on a 3 x 4
# map, one program of one lane, with its two corners on one side off the map (or none)
_PROBE_MAP = (3, 4)
_EDGE_PROBES = (("centre", (0.5, 1 / 3)), ("top", (0.5, 0.0)), ("bottom", (0.5, 1.0)),
                ("left", (0.0, 1 / 3)), ("right", (1.0, 1 / 3)))
_EDGE_WORDS = {"top": "above the map (row -1)", "bottom": "below the map (row H)",
               "left": "left of the map (column -1)", "right": "right of the map (column W)"}


def _probe_corners(x, y):
    """(row, column) of corners 00, 01, 10, 11 of a sample at (x, y) on the probe map."""
    height, width = _PROBE_MAP
    x0 = int(torch.floor(torch.tensor(x, dtype=torch.float32) * width - 0.5))
    y0 = int(torch.floor(torch.tensor(y, dtype=torch.float32) * height - 0.5))
    return [(y0 + i, x0 + j) for i in (0, 1) for j in (0, 1)]


def _probe_expected(corners, counted_off_map):
    """(counts on the map, whether an update lands outside hits) when the on-map corners and,
    with ``counted_off_map``, the off-map ones too are counted at row * W + column."""
    height, width = _PROBE_MAP
    counts, outside = torch.zeros(height * width, dtype=torch.int64), False
    for r, c in corners:
        on_map = 0 <= r < height and 0 <= c < width
        if on_map or counted_off_map:
            pixel = r * width + c
            if 0 <= pixel < height * width:
                counts[pixel] += 1
            else:
                outside = True
    return counts, outside


def _probe_run(kernel, x, y, n, block):
    """(counts, whether the kernel updated outside hits) of one guarded launch, or None."""
    height, width = _PROBE_MAP
    loc = torch.tensor([[x, y]] * n, dtype=torch.float32, device=op.device())
    hits = torch.zeros(height * width, dtype=torch.int32, device=loc.device)
    try:
        with forbid_references(kernel, writes=(1,)):
            report = guard.launch(kernel, (1,), loc, hits, n, height, width, BLOCK=block)
    except Exception:                              # noqa: BLE001  (no probe, no hint)
        return None
    return (report.args[1].detach().cpu().long(),
            any(v.tensor == "hits_ptr" for v in report.violations))


def _hits_mask_hint(kernel):
    """The hint for a corner-hit kernel that updated outside hits, confirmed by isolation
    probes: which corners off the map (per edge) and whether the lanes past the last sample
    it counts; None when the probes do not show it (another mistake is in the way)."""
    seen = {}
    for edge, (x, y) in _EDGE_PROBES:
        got = _probe_run(kernel, x, y, 1, 1)
        if got is None:
            return None
        corners = _probe_corners(x, y)
        right = _probe_expected(corners, False)
        counted = _probe_expected(corners, True)
        if torch.equal(got[0], right[0]) and got[1] == right[1]:
            seen[edge] = False
        elif edge != "centre" and torch.equal(got[0], counted[0]) and got[1] == counted[1]:
            seen[edge] = True
        else:
            return None                           # the probe shows another mistake
    # the centre sample in a program of two lanes: the second lies past the last sample
    lanes = _probe_run(kernel, *_EDGE_PROBES[0][1], 1, 2)
    if lanes is None:
        return None
    centre = _probe_expected(_probe_corners(*_EDGE_PROBES[0][1]), False)
    past_n = not (torch.equal(lanes[0], centre[0]) and lanes[1] == centre[1])
    edges = [edge for edge in _EDGE_WORDS if seen.get(edge)]
    fix = ("mask each corner's update with all five tests at once: the lane mask offs < n and "
           "the on-map test 0 <= row < H and 0 <= column < W")
    if len(edges) == 4 and not past_n:
        return ("corners off the map are counted: without the on-map test, corner (row, column) "
                "adds into pixel row * W + column, another pixel of the map or outside hits; "
                + fix)
    found = []
    if edges:
        found.append("the corners " + ", ".join(_EDGE_WORDS[e] for e in edges[:-1])
                     + (" and " if len(edges) > 1 else "") + _EDGE_WORDS[edges[-1]])
    if past_n:
        found.append("the lanes past the last sample (offs >= n)")
    if not found:
        return None
    return ("located by isolation (one sample, one edge of the map at a time): your mask lets "
            f"through {', and '.join(found)}; each of them adds into pixel row * W + column, "
            f"another pixel of the map or outside hits. To fix it, {fix}")


def _hits_variants(locations, height, width, block, racy):
    """(hint, histogram) of the usual mistakes of a corner-hit kernel (racy or atomic)."""
    chip = _chip()
    rows, cols, on_map = chip.corner_pixels(locations, height, width)

    def counted(rows, cols, hit, *, stride=width, per_corner=True, atomic=not racy):
        pixels = rows * stride + cols
        hit = hit & (pixels >= 0) & (pixels < height * width)
        return chip.count_hits(pixels, hit, height * width, None if atomic else block,
                               per_corner)

    def moved(loc):
        return chip.corner_pixels(loc, height, width)

    every = torch.ones_like(on_map)
    if racy:
        yield ("every update landed: that is the atomic kernel of stage 3. Here write the plain "
               "read-modify-write (tl.load the counts, add 1, tl.store), so that you can see "
               "what it loses", counted(rows, cols, on_map, atomic=True))
        yield ("you update the four corners in one store: lanes of different corners then "
               "collide too. Do one load and one store per corner, in the order 00, 01, 10, 11",
               counted(rows, cols, on_map, per_corner=False))
    else:
        yield ("updates are lost: a plain load, add 1, store keeps one update per pixel and "
               "store when lanes share a pixel (the counts match the racy kernel's); use "
               "tl.atomic_add, which makes each update indivisible",
               counted(rows, cols, on_map, atomic=False))
    yield ("corners off the map are counted: without the on-map test, corner (row, column) "
           "adds into pixel row * W + column, another pixel of the map; mask each corner with "
           "0 <= row < H and 0 <= column < W", counted(rows, cols, every))
    yield ("you use x * W instead of x * W - 0.5: every corner sits half a pixel off",
           counted(*moved(locations + torch.tensor([0.5 / width, 0.5 / height]))))
    yield ("x and y are swapped: a location is (x, y), x along the width W",
           counted(*moved(locations.flip(-1))))
    if height != width:
        yield ("W and H are swapped: x runs along the width, so x_im = x * W - 0.5 and "
               "y_im = y * H - 0.5",
               counted(*moved(locations * torch.tensor([height / width, width / height]))))
    truncated = locations.clone()
    for axis, size in ((0, width), (1, height)):
        pixel = locations[:, axis].double() * size - 0.5
        truncated[:, axis] = torch.where((pixel < 0) & (pixel != pixel.floor()),
                                         locations[:, axis] + 1.0 / size, locations[:, axis])
    yield ("the corner is truncated towards zero, not floored: for a negative pixel coordinate "
           "the cast to int rounds up (-0.3 becomes 0, where floor gives -1); use tl.floor "
           "before the cast",
           counted(*moved(truncated)))
    if height != width:
        yield ("the row stride is H: pixel (row, column) lives at row * W + column of hits",
               counted(rows, cols, on_map, stride=height))


def _check_hits(kernel, name, seed, racy):
    gen = fresh_generator(seed)
    seed = gen.initial_seed()
    chip = None
    for description, height, width, locations, block in _hits_cases(gen):
        what = f"{name}, {description} (seed {seed})"
        got = _run_hits(kernel, name, height, width, locations, block, what)
        if not judging():
            continue
        chip = chip or _chip()
        if racy and op.device() != "cpu":
            _within_race_bounds(got, chip.corner_hits(locations, height, width), what)
            continue
        expected = (chip.corner_hits_racy(locations, height, width, block) if racy
                    else chip.corner_hits(locations, height, width))
        if not torch.equal(got, expected):
            check_close(got, expected, atol=0, rtol=0, axes=("pixel",), what=what,
                        hint=_first_variant(got, _hits_variants(locations, height, width,
                                                                block, racy)))
    if judging():
        kind = ("loses exactly the updates that a read-modify-write loses when programs run one "
                "after another" if racy else "counts every corner on the map")
        print(f"{name} {kind}: 3 cases (seed {seed})")


def _within_race_bounds(got, exact, what):
    """On a GPU programs race too: a pixel that is hit gets between 1 and all its updates."""
    low = (exact > 0).long()
    bad = (got < low) | (got > exact)
    if bad.any():
        pixel = int(bad.nonzero()[0])
        raise AssertionError(f"{what}: at pixel {pixel}: expected between {int(low[pixel])} "
                             f"and {int(exact[pixel])} (racing updates), got {int(got[pixel])}")


def _first_variant(got, variants):
    for hint, variant in variants:
        if variant is not None and torch.equal(got, variant):
            return hint
    return ("none of the usual mistakes (a mask, the half-pixel offset, x and y, floor, the row "
            "stride, the order of the stores) explains it: print the corners of the samples "
            "that hit the pixel named above")


def check_corner_hits_racy(corner_hits_racy_kernel, seed=None):
    """The racy corner-hit kernel leaves what a read-modify-write leaves (on the CPU)."""
    _check_hits(corner_hits_racy_kernel, "corner_hits_racy_kernel", seed, racy=True)


def check_corner_hits(corner_hits_kernel, seed=None):
    """The atomic corner-hit kernel counts every corner on the map."""
    _check_hits(corner_hits_kernel, "corner_hits_kernel", seed, racy=False)


HITS_HINTS = _HITS_GUARD


# ------------------------------------------------------------------ the prediction
def _prediction_cases(gen):
    """(description, H, W, locations, samples per program): cases where every wrong rule below
    gives another number."""
    yield from _hits_cases(gen)
    yield ("50 samples on a 2 x 3 map, 1 per program", 2, 3, _uniform(gen, 50, 0.2), 1)


def _prediction_variants(locations, height, width, block):
    chip = _chip()
    rows, cols, on_map = chip.corner_pixels(locations, height, width)
    n = rows.shape[0]
    pixels = rows * width + cols
    sent = int(on_map.sum())

    def landed(key, hit, block, per_corner=True):
        return int(chip.count_hits(key, hit, int(key.max()) + 1, block, per_corner).sum())

    every = torch.ones_like(on_map)
    span = int(cols.max() - cols.min()) + 1
    anywhere = (rows - rows.min()) * span + cols - cols.min()      # on the map or not
    yield ("you count collisions across programs: here programs run one after another, so a "
           "program reads what the previous ones stored; only lanes of one program can "
           "overwrite each other", sent - landed(pixels, on_map, max(n, 1)))
    yield ("you count collisions between different corners: the four corners are four "
           "load-store pairs, one after another, so only lanes of one store overwrite each other",
           sent - landed(pixels, on_map, block, per_corner=False))
    yield ("you count collisions across programs and across corners: only lanes of one store "
           "(one program, one corner) overwrite each other",
           sent - landed(pixels, on_map, max(n, 1), per_corner=False))
    yield ("you count corners off the map: the kernel masks them, so they are no updates at all",
           4 * n - landed(anywhere, every, block))
    yield ("your count of updates sent includes the corners off the map, which the kernel "
           "never sends", 4 * n - landed(pixels, on_map, block))
    yield ("that is the number of updates that land (one per pixel and store); the lost ones "
           "are the others", landed(pixels, on_map, block))
    collided = sum(int((torch.unique(s, return_counts=True)[1] >= 2).sum())
                   for s in chip.racy_stores(pixels, on_map, block))
    yield ("you count the pixels that see a collision: a pixel that n lanes of one store hit "
           "keeps one update and loses n - 1", collided)


def check_lost_updates(lost_updates, seed=None):
    """lost_updates(locations, height, width, block) predicts what the racy kernel loses."""
    gen = fresh_generator(seed)
    seed = gen.initial_seed()
    for description, height, width, locations, block in _prediction_cases(gen):
        what = f"lost_updates, {description} (seed {seed})"
        with forbid_references(lost_updates):
            try:
                got = lost_updates(locations.clone(), height, width, block)
            except AssertionError:
                raise
            except Exception as exc:              # noqa: BLE001  (explained, as a failure)
                raise AssertionError(_raised_in_function("lost_updates", what, exc)) from None
        if isinstance(got, torch.Tensor) and got.numel() == 1 and not got.is_floating_point():
            raise AssertionError(f"{what}: return a Python int (int(...)), got a tensor "
                                 f"{got.item()}")
        if not isinstance(got, int) or isinstance(got, bool):
            raise AssertionError(f"{what}: expected an int, got {type(got).__name__}")
        expected = expect(lambda: _chip().lost_updates(locations, height, width, block))
        if expected is not None and got != expected:
            hint = next((text for text, value in _prediction_variants(locations, height, width,
                                                                      block) if value == got),
                        "think about which lanes can overwrite each other: lanes of one "
                        "program? of one corner? and which corners are updates at all?")
            raise AssertionError(f"{what}: expected {expected}, got {got}\nHint: {hint}")
    if judging():
        print(f"lost_updates predicts the racy kernel's loss in 4 cases (seed {seed})")


# ------------------------------------------------------------------ the backward kernel
_QUERY_MASK = ("lanes past the last query (the last block of BLOCK_Q runs past Q) go outside "
               "the tensor: mask their loads and stores with offs_q < Q")
_BACKWARD_GUARD = {
    "value_ptr": "corners off the map are read: a corner off the map has no row, and "
                 "start + r * W + c then points outside value (or at another pixel or level); "
                 "load with mask=<corner on the map, channel < D> and other=0.0",
    "grad_value_ptr": "corners off the map receive gradient: a corner off the map has no row, "
                      "and start + r * W + c then points outside grad_value (or at another "
                      "pixel or level); mask the atomic add with the corner's on-map test (and "
                      "the channel mask), as the gather",
    ("grad_value_ptr", "value_ptr"):
        "corners off the map are read and receive gradient: a corner off the map has no row, "
        "and start + r * W + c then points outside value and grad_value (or at another pixel "
        "or level); the gather and the atomic add of a corner both need its on-map test with "
        "the channel mask (mask=<corner on the map, channel < D>, and other=0.0 for the load)",
    "grad_out_ptr": _QUERY_MASK, "loc_ptr": _QUERY_MASK, "attn_ptr": _QUERY_MASK,
    "grad_loc_ptr": _QUERY_MASK, "grad_attn_ptr": _QUERY_MASK,
    None: "mask every access: the query mask for grad_out, the locations, the weights and the "
          "stores of grad_loc and grad_attn; each corner's on-map test (with the channel mask) "
          "for value and grad_value"}


BACKWARD_HINTS = _BACKWARD_GUARD


def _backward_case(gen, dtype=torch.float32, distribution="uniform", heads=2):
    """Two levels, one of them 1x1; 10 queries, so that a block of 8 leaves lanes past Q."""
    kwargs = (dict(distribution="local", sigma_pixels=0.7) if distribution == "local"
              else dict(outside=0.2))
    args = op.inputs(gen, 1, 10, heads, 4, [[3, 4], [1, 1]], 2, dtype=dtype, **kwargs)
    grad_output = torch.randn(1, 10, heads * 4, generator=gen).to(args["value"].device, dtype)
    return args, grad_output


SENTINEL = -7.0        # what the check's second launch fills the outputs with: exact in every
                       # dtype, and no gradient of the checks' inputs is exactly that


def _run_backward(kernel, args, grad_output, block_q, what, fill=0.0, report_to=None):
    """The kernel on the inputs, launched as the lab's launcher does; returns (grad_value,
    grad_loc, grad_attn) on the CPU, grad_value in the dtype of value.  ``fill``: what the
    outputs hold before the launch (the launcher's zeros; a sentinel to find what the kernel
    never writes).  ``report_to``: a list that receives the guard's report."""
    import triton.language as tl

    value = args["value"].contiguous()
    batch, total, heads, channels = value.shape
    _, queries, _, levels, points, _ = args["sampling_locations"].shape
    wide = value.dtype == torch.float64
    grad_value = torch.full(value.shape, fill, dtype=torch.float64 if wide else torch.float32,
                            device=value.device)
    grad_loc = torch.full_like(args["sampling_locations"], fill)
    grad_attn = torch.full_like(args["attention_weights"], fill)
    tensors = (grad_output.contiguous(), value, args["value_spatial_shapes"].contiguous(),
               args["value_level_start_index"].contiguous(),
               args["sampling_locations"].contiguous(), args["attention_weights"].contiguous(),
               grad_value, grad_loc, grad_attn)
    launch = dict(L=levels, K=points, BLOCK_Q=block_q,
                  BLOCK_D=max(1, 1 << (channels - 1).bit_length()),
                  ACC_DTYPE=tl.float64 if wide else tl.float32)
    ran_on, report = _launch_with_report(
        kernel, "msda_backward_kernel", (-(-queries // block_q), batch * heads),
        tensors + (total, queries, heads, channels), launch, what, _BACKWARD_GUARD,
        writes=(6, 7, 8))
    if report_to is not None:
        report_to.append(report)
    return (ran_on[6].detach().to(value.dtype).cpu(), ran_on[7].detach().cpu(),
            ran_on[8].detach().cpu())


_FALLBACK = {
    "grad_attention_weights": "none of the usual mistakes (a sign, the corner weights, the "
                              "attention weight, corners off the map) explains it",
    "grad_sampling_locations": "none of the usual mistakes (a sign, the factors W and H, x and "
                               "y, d_x and d_y, the attention weight, corners off the map) "
                               "explains it",
    "grad_value": "none of the usual mistakes (a sign, the attention weight, corners off the "
                  "map, lost updates) explains it",
}


def _nan_source(reports):
    """What the guarded launches saw that explains a NaN in an output (see
    ``diagnose_grad.garbage``): compiled, the padding around each tensor holds NaN, so a NaN
    is a read outside; interpreted, reads outside are reported before anything is judged, and
    a masked load without ``other=`` reads NaN on its masked-off lanes."""
    if not guard.interpreting():
        return "read outside"
    events = [e for r in reports if r is not None for e in r.loads_without_other.values()]
    if events:
        lines = "; ".join(str(e.line) for e in events[:3])
        return ("a masked tl.load without other= gives its masked-off lanes no value (the "
                f"check gives them NaN, a GPU whatever lies there): {lines}. Give it "
                "other=0.0")
    return None


def _diagnosis(name, got, expected, args, grad_output, dtype, run):
    """The one diagnosis of the backward kernel's ``name``, for the visible and the hidden
    checks: what the kernel never wrote, a mistake of the catalogue that reproduces ``got``,
    else the first isolation probe that goes wrong.  ``run``: the check's other launches,
    {"filled": the same inputs with the outputs filled with SENTINEL, "probes": ...,
    "reports": the guard's reports, "block_q": queries per program}."""
    index = diagnose_grad.GRADIENT_INDEX[name]
    block_q = run["block_q"] if guard.interpreting() else None
    named = diagnose_grad.explain(
        name, got, expected, args, grad_output, dtype, off_map="flat", block_q=block_q,
        unwritten=(run["filled"][index], SENTINEL) if run.get("filled") else None,
        nan_source=_nan_source(run["reports"]))
    if named:
        return named
    if not run["probes"]:
        return (_FALLBACK[name] + ": the checks above run one gradient at a time with "
                "isolation probes that locate the wrong term; run them first, then compare "
                "your kernel with lab 07's chip (the cell above the checks) on the element "
                "named above")
    where = diagnose_grad.locate(name, run["probes"], torch.float32, off_map="flat",
                                 block_q=run["block_q"], nan_source=_nan_source(run["reports"]))
    return (_FALLBACK[name] + ". " + (where or "Every isolation probe (one term at a time) is "
            "right: the mistake shows only when several terms meet. Compare your kernel with "
            "lab 07's chip (the cell above the checks) on the element named above"))


def _judge_gradient(name, got, args, grad_output, what, dtype=torch.float32, run=None):
    expected = expect(op.gradients_fp64, args, grad_output)
    if expected is None:
        return
    expected = expected[diagnose_grad.GRADIENT_INDEX[name]]
    run = run or {"probes": [], "reports": [], "block_q": None}

    def hint():
        return _diagnosis(name, got, expected, args, grad_output, dtype, run)
    op.assert_scaled(got, expected, dtype, what, diagnose_grad.GRADIENT_AXES[name],
                     table=op.GRAD_TOLERANCE, hint=hint)


def _probe_runs(kernel, name, gen, block_q, seed, reports):
    """The kernel on every isolation probe (float32 inputs on the grading device): the
    probes' (label, term, inputs, grad_output, the gradient ``name`` it returned)."""
    index = diagnose_grad.GRADIENT_INDEX[name]
    runs = []
    for label, term, args, grad_output in diagnose_grad.probes(gen):
        on = {k: v.to(op.device(), torch.float32) if v.is_floating_point() else
              v.to(op.device()) for k, v in args.items()}
        what = f"{name} of msda_backward_kernel with {label}, BLOCK_Q = {block_q} (seed {seed})"
        got = _run_backward(kernel, on, grad_output.to(op.device(), torch.float32), block_q,
                            what, report_to=reports)
        runs.append((label, term, on, grad_output.float(), got[index]))
    return runs


# Sizes at which a 32-bit offset wraps around to batch 0's: with M = D = 4, the row index
# (b * Q + q) * M + m of batch 1 is 2**32 + q * M + m when Q = 2**30, and the value offset
# (b * S * M + m) * D of batch 1 is 2**32 + m * D when S = 2**28.
_WRAPS = (("queries", 2 ** 30, "Q = 2**30 queries (a size the kernel is told; the tensors hold "
           "8)", "the row index of grad_out, the locations, the weights and their gradients, "
           "(b * Q + q) * M + m", "b.to(tl.int64) * Q"),
          ("rows", 2 ** 28, "S = 2**28 rows of value per batch element (a size the kernel is "
           "told; value holds one batch element of 12 rows)",
           "the offset of value and grad_value, (b * S * M + m) * D", "b.to(tl.int64) * S"))


def _int64_runs(kernel, gen, block_q, seed):
    """The kernel told sizes at which an int32 offset wraps around (interpreter only: outside
    accesses are switched off there, not made): for each of ``_WRAPS``, (label, (term, fix),
    inputs of batch 0, grad_output of batch 0, (grad_value, grad_loc, grad_attn) of batch 0).  Batch
    1's programs read and write outside the tensors when their offsets are right, and into
    batch 0's elements when they wrap."""
    if op.device() != "cpu":
        return []
    import triton.language as tl

    args = op.inputs(gen, 2, 8, 4, 4, [[3, 4]], 1, outside=0.1, on="cpu")
    grad_output = torch.randn(2, 8, 16, generator=gen)
    first = {k: (v[:1] if k in ("value", "sampling_locations", "attention_weights") else v)
             for k, v in args.items()}
    runs = []
    for key, size, label, term, fix in _WRAPS:
        total = size if key == "rows" else first["value"].shape[1]
        queries = size if key == "queries" else 8
        grad_value = torch.zeros_like(first["value"])
        grad_loc = torch.zeros_like(args["sampling_locations"])
        grad_attn = torch.zeros_like(args["attention_weights"])
        tensors = (grad_output.contiguous(), first["value"].contiguous(),
                   args["value_spatial_shapes"].contiguous(),
                   args["value_level_start_index"].contiguous(),
                   args["sampling_locations"].contiguous(),
                   args["attention_weights"].contiguous(), grad_value, grad_loc, grad_attn)
        launch = dict(L=1, K=1, BLOCK_Q=block_q, BLOCK_D=4, ACC_DTYPE=tl.float32)
        what = f"msda_backward_kernel told {label} (seed {seed})"
        ran_on = _launch_unchecked(kernel, "msda_backward_kernel", (-(-8 // block_q), 2 * 4),
                                   tensors + (total, queries, 4, 4), launch, what)
        runs.append((label, (term, fix), first, grad_output[:1],
                     (ran_on[6].detach().cpu(), ran_on[7][:1].detach().cpu(),
                      ran_on[8][:1].detach().cpu())))
    return runs


def _launch_unchecked(kernel, name, grid, args, kwargs, what, writes=(6, 7, 8)):
    """:func:`_launch_with_report` for a launch whose accesses outside the tensors are
    expected (and switched off): they are not reported.  ``writes``: the output buffers (the
    three gradients of the backward kernel), which the grader's replay judges."""
    if not (isinstance(kernel, check_api.Proxy) or _is_kernel(kernel)):
        raise AssertionError(f"{name} must be a @triton.jit kernel, got "
                             f"{type(kernel).__name__}")
    with forbid_references(kernel, writes=writes):
        try:
            if check_api.replaying():
                kernel[grid](*args, **kwargs)
                return args
            return guard.launch(kernel, grid, *args, **kwargs).args
        except AssertionError:
            raise
        except Exception as exc:                  # noqa: BLE001  (explained, as a failure)
            raise AssertionError(raised_in_kernel(name, what, exc)) from None


def _judge_int64(name, runs, seed):
    """Batch 0's ``name`` is right in every run of :func:`_int64_runs`, or the wrap is named."""
    index = diagnose_grad.GRADIENT_INDEX[name]
    for label, (term, fix), args, grad_output, got in runs:
        expected = op.gradients_fp64(args, grad_output)[index]
        message = op.mismatch(got[index], expected, torch.float32,
                              f"{name} of batch 0, msda_backward_kernel told {label} "
                              f"(seed {seed})", diagnose_grad.GRADIENT_AXES[name],
                              table=op.GRAD_TOLERANCE)
        if message:
            raise AssertionError(
                message + "\nHint: batch 1's programs changed batch 0's elements: an offset "
                f"computed in int32 wraps around past 2**31 at these sizes ({term}, which is "
                "2**32 + that of batch 0 for b = 1). b, q and m come from tl.program_id and "
                "tl.arange as int32, and so do sizes below 2**31: cast before the first "
                f"multiplication, {fix}, and every product after it is 64-bit")


def _check_gradient(kernel, name, seed, distribution):
    gen = fresh_generator(seed)
    seed = gen.initial_seed()
    args, grad_output = _backward_case(gen, distribution=distribution)
    block_q = 8
    description = ("queries sharing corners" if distribution == "local"
                   else "locations up to 20% outside the maps")
    what = f"{name} of msda_backward_kernel, {description}, BLOCK_Q = {block_q} (seed {seed})"
    reports = []
    got = _run_backward(kernel, args, grad_output, block_q, what, report_to=reports)
    # the same launch with the outputs filled with a sentinel (what stays so was never
    # written), then the isolation probes: the same launches whether the check judges or not
    filled = _run_backward(kernel, args, grad_output, block_q, what, fill=SENTINEL,
                           report_to=reports)
    run = {"filled": filled, "reports": reports, "block_q": block_q,
           "probes": _probe_runs(kernel, name, gen, block_q, seed, reports)}
    wraps = _int64_runs(kernel, gen, block_q, seed)
    got = got[diagnose_grad.GRADIENT_INDEX[name]]
    _judge_gradient(name, got, args, grad_output, what, run=run)
    if judging():
        _judge_int64(name, wraps, seed)
        message = diagnose_grad.locate(name, run["probes"], torch.float32, off_map="flat",
                                       block_q=block_q, nan_source=_nan_source(reports))
        if message:
            raise AssertionError(f"{what}: right on this case, wrong on a simpler one. "
                                 f"{message}")
        print(f"{name} of msda_backward_kernel matches autograd through the float64 reference "
              f"({description}, and {len(run['probes'])} isolation probes; seed {seed})")


def check_backward_grad_attn(msda_backward_kernel, seed=None):
    _check_gradient(msda_backward_kernel, "grad_attention_weights", seed, "uniform")


def check_backward_grad_loc(msda_backward_kernel, seed=None):
    _check_gradient(msda_backward_kernel, "grad_sampling_locations", seed, "uniform")


def check_backward_grad_value(msda_backward_kernel, seed=None):
    _check_gradient(msda_backward_kernel, "grad_value", seed, "local")


def check_backward_half(msda_backward_kernel, seed=None):
    """float16 and bfloat16 inputs: the kernel computes in ACC_DTYPE (float32) and stores in
    the output's dtype.  The same inputs in float32 run first: right there and wrong in half
    precision names the missing conversion."""
    gen = fresh_generator(seed)
    seed = gen.initial_seed()
    args, grad_output = _backward_case(gen, dtype=torch.float16, distribution="local", heads=1)
    block_q = 8
    runs, reports = [], []
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        cast = {k: v.to(dtype) if v.is_floating_point() else v for k, v in args.items()}
        what = (f"msda_backward_kernel with {str(dtype).replace('torch.', '')} inputs, "
                f"BLOCK_Q = {block_q} (seed {seed})")
        runs.append((dtype, cast, grad_output.to(dtype), what,
                     _run_backward(msda_backward_kernel, cast, grad_output.to(dtype), block_q,
                                   what, report_to=reports)))
    # float32 once more, the outputs filled with the sentinel: what stays so was never written
    filled = _run_backward(msda_backward_kernel, runs[0][1], runs[0][2], block_q, runs[0][3],
                           fill=SENTINEL, report_to=reports)
    if not judging():
        return
    for dtype, cast, grad, what, got in runs:
        run = {"filled": filled if dtype == torch.float32 else None, "probes": [],
               "reports": reports, "block_q": block_q}
        for name in ("grad_value", "grad_sampling_locations", "grad_attention_weights"):
            index = diagnose_grad.GRADIENT_INDEX[name]
            if got[index].dtype != dtype:
                raise AssertionError(f"{name}, {what}: expected dtype {dtype}, got "
                                     f"{got[index].dtype}")
            try:
                _judge_gradient(name, got[index], cast, grad, f"{name}, {what}",
                                dtype=dtype, run=run)
            except AssertionError as failure:
                if dtype == torch.float32:
                    raise
                raise AssertionError(
                    str(failure).split("\nHint:")[0] + "\nHint: your kernel is right in "
                    f"float32 and wrong in {str(dtype).replace('torch.', '')}: it computes in "
                    "the input dtype. Convert every loaded value with .to(ACC_DTYPE) right after "
                    "tl.load, accumulate in ACC_DTYPE, and cast only what you store (Triton's "
                    "interpreter even computes wrong numbers on bfloat16 directly)") from None
    print(f"msda_backward_kernel is right with float32, float16 and bfloat16 inputs (seed {seed})")
