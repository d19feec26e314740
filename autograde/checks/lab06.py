"""Checks of lab 06 (make it fast): the narrow forward kernel, and the autotuner on made-up
timings where every trap is known.

Each check serves the visible cell (a shown ``seed=``) and the hidden one (the grader's seed).

The narrow kernel is launched by the check itself, on guarded buffers: every input sits inside a
larger buffer whose extra elements are NaN, and ``out`` is followed by elements holding a
sentinel.  A read past an input then shows as NaN instead of reading another allocation (or
crashing the interpreter), and a store past ``out`` shows in the sentinel.  On a mismatch the
check names the mistake whose output the kernel's equals: a missing corner mask, the
half-pixel offset, truncation for floor, x/y swapped, the row stride, ...
"""
from __future__ import annotations

import contextlib
import statistics

import torch

from . import _operator as op
from .common import (Raised, attempt, attempt_expecting, forbid_references, fresh_generator,
                     judging, show)

@contextlib.contextmanager
def guarded(what, hints=None):
    """The guard of the lab's demonstration cells (``autograde.checks.demo.guarded``):
    the student's kernel runs with every access checked, and what goes wrong is printed
    instead of crashing the notebook (the cell stops there and the notebook goes on)."""
    from .demo import guarded as demo_guarded

    try:
        with demo_guarded(what, hints if hints is not None else NARROW_HINTS) as report:
            yield report
    except AssertionError as exc:
        print(exc)


NARROW_HINTS = {
    None: "mask every access: the query mask (offs_q < Q) for the locations, the weights and "
          "the output; each corner's on-map test with the channel mask for value",
    "value_ptr": "corners off the map are read: load value with mask=<corner on the map, "
                 "channel < D> and other=0.0",
}

SENTINEL = 1234.5                    # what out holds before the kernel runs (exact in fp32)
AXES = ("batch", "query", "head", "channel")


# ------------------------------------------------------------------ stage 2: the narrow kernel
def _guard(t, pad):
    """``t`` copied into the middle of a buffer with ``pad`` NaN elements on each side."""
    buffer = torch.full((t.numel() + 2 * pad,), float("nan"), dtype=t.dtype, device=t.device)
    buffer[pad:pad + t.numel()] = t.reshape(-1)
    return buffer[pad:pad + t.numel()].view(t.shape)


def _guard_ints(t, pad):
    """``t`` (integers: the shapes, the level starts) in the middle of a buffer of zeros: a
    read past it gives a level of 0 x 0 pixels, whose corners are all off the map, instead of
    whatever memory lies there (which can send the value loads anywhere)."""
    buffer = torch.zeros((t.numel() + 2 * pad,), dtype=t.dtype, device=t.device)
    buffer[pad:pad + t.numel()] = t.reshape(-1)
    return buffer[pad:pad + t.numel()].view(t.shape)


def _narrow_cases(gen):
    """(what, arguments, block_q): Q not a multiple of BLOCK_Q, so the last block has queries
    beyond Q; locations up to 20% outside the maps."""
    return [
        ("levels (4, 5) and (1, 1), 2 heads of 3 channels, fp32, 2 blocks of 4 queries",
         op.inputs(gen, 1, 6, 2, 3, [[4, 5], [1, 1]], 2, outside=0.2), 4),
        ("levels (3, 5) and (2, 2), 1 head of 2 channels, fp64, batch 2",
         op.inputs(gen, 2, 5, 1, 2, [[3, 5], [2, 2]], 2, dtype=torch.float64, outside=0.2), 4),
    ]


def _launch(kernel, args, block_q):
    """Launch the student's kernel on guarded copies of ``args``; returns the whole output
    buffer (out, then the sentinel tail)."""
    import triton
    import triton.language as tl

    value, loc, attn = args["value"], args["sampling_locations"], args["attention_weights"]
    batch, total, heads, channels = value.shape
    _, queries, _, levels, points, _ = loc.shape
    widest = int(args["value_spatial_shapes"].max())
    pad_value = (2 * widest + 8) * (widest + 2) * heads * channels     # rows a corner can reach
    pad_query = (block_q + 1) * heads * levels * points * 2            # queries past Q
    n_out = batch * queries * heads * channels
    out = torch.full((n_out + block_q * heads * channels,), SENTINEL, dtype=value.dtype,
                     device=value.device)
    acc = tl.float64 if value.dtype == torch.float64 else tl.float32
    grid = (triton.cdiv(queries, block_q), batch * heads)
    kernel[grid](_guard(value, pad_value), _guard_ints(args["value_spatial_shapes"], 64),
                 _guard_ints(args["value_level_start_index"], 64), _guard(loc, pad_query),
                 _guard(attn, pad_query), out, total, queries, heads, channels, L=levels,
                 K=points, BLOCK_Q=block_q, ACC_DTYPE=acc)
    return out


def _corners(x_im, y_im, floor=True):
    x0 = torch.floor(x_im) if floor else torch.trunc(x_im)
    y0 = torch.floor(y_im) if floor else torch.trunc(y_im)
    return x0, y0, x_im - x0, y_im - y0


ALL_SIDES = ("r>=0", "r<H", "c>=0", "c<W")


def _flat_forward(args, *, half=0.5, floor=True, swap=False, x_scale="W", mask=ALL_SIDES,
                  row_stride="W", head_stride=True, weights=True, corner_weights="right"):
    """What a narrow kernel computes, in float64 on the flat value (NaN beyond its ends, as
    in the guarded buffer), with one usual mistake switched on.  (B, Q, M, D)."""
    value = args["value"].detach().cpu().double()
    shapes = args["value_spatial_shapes"].cpu().tolist()
    starts = args["value_level_start_index"].cpu().tolist()
    loc = args["sampling_locations"].detach().cpu().double()
    attn = args["attention_weights"].detach().cpu().double()
    batch, total, heads, channels = value.shape
    flat = value.reshape(-1)
    b = torch.arange(batch).view(-1, 1, 1, 1)
    m = torch.arange(heads).view(1, 1, -1, 1)
    d = torch.arange(channels)
    out = torch.zeros(batch, loc.shape[1], heads, channels, dtype=torch.float64)
    for lvl, ((height, width), start) in enumerate(zip(shapes, starts)):
        x, y = loc[:, :, :, lvl, :, 0], loc[:, :, :, lvl, :, 1]          # (B, Q, M, K)
        if swap:
            x, y = y, x
        x_im = x * (width if x_scale == "W" else height) - half
        y_im = y * (height if x_scale == "W" else width) - half
        x0, y0, dx, dy = _corners(x_im, y_im, floor)
        if corner_weights == "swapped":
            dx, dy = dy, dx
        a = attn[:, :, :, lvl] if weights else torch.ones_like(attn[:, :, :, lvl])
        for corner in range(4):
            r = (y0 + corner // 2).long()
            c = (x0 + corner % 2).long()
            w = (dy if corner // 2 else 1 - dy) * (dx if corner % 2 else 1 - dx)
            tests = {"r>=0": r >= 0, "r<H": r < height, "c>=0": c >= 0, "c<W": c < width,
                     "c<=W": c <= width}
            inside = torch.ones_like(r, dtype=torch.bool)
            for side in mask:
                inside &= tests[side]
            s = start + r * (width if row_stride == "W" else height) + c
            base = (b * total * heads + m) * channels
            index = base + s * (heads * channels if head_stride else channels)
            index = index[..., None] + d                                # (B, Q, M, K, D)
            valid = (index >= 0) & (index < flat.numel())
            v = torch.where(valid, flat[index.clamp(0, flat.numel() - 1)],
                            torch.full_like(index, float("nan"), dtype=torch.float64))
            v = torch.where(inside[..., None], v, torch.zeros_like(v))
            out += ((a * w)[..., None] * v).sum(3)
    return out


NARROW_MISTAKES = [
    ("mask every corner with r >= 0, r < H, c >= 0 and c < W: without a mask a corner outside "
     "the map reads another row, another level, or past the tensor", dict(mask=())),
    ("mask c >= 0 and c < W too: a corner past the right edge of the map reads the next row "
     "(or past the tensor)", dict(mask=("r>=0", "r<H"))),
    ("mask r >= 0 and r < H too: a corner below the last row reads the next level (or past "
     "the tensor)", dict(mask=("c>=0", "c<W"))),
    ("c < W, not c <= W: column W is already outside the map",
     dict(mask=("r>=0", "r<H", "c>=0", "c<=W"))),
    ("mask r >= 0 and c >= 0 too: a corner left of or above the map reads the row before",
     dict(mask=("r<H", "c<W"))),
    ("you use x * W instead of x * W - 0.5: every sample sits half a pixel off "
     "(align_corners=False puts pixel centres at (j + 0.5) / W)", dict(half=0.0)),
    ("x0 must be floor(x_im): converting to int truncates towards zero, which is wrong for the "
     "negative coordinates of locations left of or above the map", dict(floor=False)),
    ("x and y are swapped: the last axis of sampling_locations is (x, y), x along W",
     dict(swap=True)),
    ("x is scaled by W and y by H: x_im = x * W - 0.5, y_im = y * H - 0.5",
     dict(x_scale="H")),
    ("the row of corner (r, c) is start + r * W + c: a level is stored row after row, W "
     "pixels each", dict(row_stride="H")),
    ("rows of value are M * D elements apart ((B, S, M, D)): the element is "
     "value_bm + s * (M * D) + d", dict(head_stride=False)),
    ("the corner weights: (1 - dx) goes with column x0, dx with x0 + 1; (1 - dy) with row y0, "
     "dy with y0 + 1", dict(corner_weights="swapped")),
    ("the attention weights are missing: each sample is scaled by its weight",
     dict(weights=False)),
]


def _outside_corners(args, b, q, m):
    """'level l (H x W), point k: corner (row r, column c)' for the corners of (b, q, m) that
    lie outside their map."""
    found = []
    loc = args["sampling_locations"].detach().cpu().double()
    for lvl, (height, width) in enumerate(args["value_spatial_shapes"].cpu().tolist()):
        for k in range(loc.shape[4]):
            x_im = loc[b, q, m, lvl, k, 0] * width - 0.5
            y_im = loc[b, q, m, lvl, k, 1] * height - 0.5
            x0, y0 = int(torch.floor(x_im)), int(torch.floor(y_im))
            for r, c in ((y0, x0), (y0, x0 + 1), (y0 + 1, x0), (y0 + 1, x0 + 1)):
                if not (0 <= r < height and 0 <= c < width):
                    found.append(f"level {lvl} ({height} x {width}), point {k}: corner "
                                 f"(row {r}, column {c})")
    return found


def _mismatch(got, expected, dtype, what=""):
    """``op.mismatch`` with the tolerance scaled to the largest finite |expected| (a variant
    that read past a tensor holds NaN)."""
    from source_kernels.testing import explain_mismatch

    scale = max(float(expected.nan_to_num(0.0).abs().max()), 1e-6)
    return explain_mismatch(got, expected, atol=op.TOLERANCE[dtype] * scale, rtol=0.0,
                            axes=AXES, what=what)


def _judge_narrow(buffer, args, what):
    value = args["value"]
    batch, total, heads, channels = value.shape
    queries = args["sampling_locations"].shape[1]
    n_out = batch * queries * heads * channels
    _tail_written(buffer, args, what)
    got = buffer[:n_out].detach().cpu().double().view(batch, queries, heads, channels)
    expected = op.forward_fp64(args).view(batch, queries, heads, channels)
    message = _mismatch(got, expected, value.dtype, what)
    if message is None:
        return
    dtype = value.dtype
    hint = None
    if bool((got == SENTINEL).any()):
        b, q, m, d = (int(i) for i in (got == SENTINEL).nonzero()[0])
        hint = (f"out[{b}, {q}, {m}, {d}] was never written: store acc for every channel d of "
                "the block's queries (out[b, q, m, d] is at row_bqm * D + d)")
    for text, mistake in NARROW_MISTAKES:
        if hint is None and _mismatch(got, _flat_forward(args, **mistake), dtype) is None:
            hint = text
    if hint is None and dtype == torch.float64 and \
            _mismatch(got, expected, torch.float32) is None:
        hint = ("the result has float32 precision on float64 inputs: accumulate in ACC_DTYPE "
                "(float64 here) and convert each loaded value with .to(ACC_DTYPE)")
    if hint is None and bool(torch.isnan(got).any()) and not bool(torch.isnan(expected).any()):
        b, q, m, d = (int(i) for i in torch.isnan(got).nonzero()[0])
        corners = _outside_corners(args, b, q, m)
        hint = (f"NaN at batch {b}, query {q}, head {m}: the kernel read past one of its input "
                "tensors (the check surrounds them with NaN). "
                + (f"Outside the map there: {'; '.join(corners[:3])}. " if corners else "")
                + "Mask each corner with r >= 0, r < H, c >= 0, c < W, and the loads of "
                  "locations and weights with mask_q")
    raise AssertionError(message + "\nHint: " + (
        hint or "compare one level at a time (set the other levels' attention weights to 0) "
                "to find where it goes wrong"))


def _tail_written(buffer, args, what):
    """Raise when the kernel stored past the end of out (into the sentinel tail)."""
    batch, _, heads, channels = args["value"].shape
    n_out = batch * args["sampling_locations"].shape[1] * heads * channels
    tail = buffer[n_out:].detach().cpu().double()
    if bool((tail != SENTINEL).any()):
        raise AssertionError(
            f"{what}: the kernel wrote {int((tail != SENTINEL).sum())} elements past the end of "
            "out\nHint: the last block holds queries beyond Q (offs_q >= Q): mask the store "
            "(and the loads) with mask_q = offs_q < Q")


PROBE_BLOCK_Q = 4                    # the probes' 5 queries: 2 blocks, 3 queries beyond Q


def _probe_named(got, args):
    """The text of the one NARROW_MISTAKES entry whose output equals ``got`` (B, Q, M, D) on
    this probe; None when none does, or more than one (the probe does not tell them apart)."""
    found = [text for text, mistake in NARROW_MISTAKES
             if _mismatch(got, _flat_forward(args, **mistake), torch.float32) is None]
    return found[0] if len(found) == 1 else None


def _nan_hint(read_nan, args, term, shape):
    """The hint for a probe whose output holds NaN the kernel computed: a read past an input
    (the guards are NaN), located, with the corners of weight 0 that lie off the map there."""
    b, q, m, _ = (int(i) for i in read_nan.view(shape).nonzero()[0])
    corners = _outside_corners(args, b, q, m)
    return (f"NaN at batch {b}, query {q}, head {m}: the kernel read past one of its input "
            "tensors (the check surrounds them with NaN). "
            + (f"Off the map there, with weight 0 on this probe: {'; '.join(corners[:3])}; a "
               "corner off the map is read only without its mask. " if corners else "")
            + "This probe is where your output first goes wrong, so look at what it adds: "
            + term)


def _named_everywhere(hint, cases, buffers):
    """Whether the mistake that a probe's hint names (an entry of NARROW_MISTAKES, or of the
    operator's catalogue ``diagnose.MISTAKES``) reproduces the kernel's output on the general
    cases too: a probe has few inputs, and two mistakes can agree on it (at a pixel centre,
    reading column x0 + 1 looks like giving dx to x0).  True for a hint that names no entry."""
    from . import diagnose

    narrow = dict(NARROW_MISTAKES).get(hint)
    general = [conventions for text, conventions in diagnose.MISTAKES if text == hint]
    if narrow is None and not general:
        return True
    for (_, args, _), buffer in zip(cases, buffers):
        if isinstance(buffer, Raised):
            return False
        batch, _, heads, channels = args["value"].shape
        queries = args["sampling_locations"].shape[1]
        n_out = batch * queries * heads * channels
        if bool((buffer[n_out:].detach().cpu() != SENTINEL).any()):
            return False
        got = buffer[:n_out].detach().cpu().double().view(batch, queries, heads, channels)
        dtype = args["value"].dtype
        if narrow is not None:
            if _mismatch(got, _flat_forward(args, **narrow), dtype) is not None:
                return False
            continue
        conventions = dict(general[0])
        transform = conventions.pop("transform", None)
        inputs = tuple(args.values())
        try:
            variant = diagnose.sample(*(transform(inputs) if transform else inputs),
                                      **conventions).view(got.shape)
        except (RuntimeError, IndexError, ValueError):
            return False
        known = ~torch.isnan(variant)
        atol = op.TOLERANCE[dtype] * max(float(op.forward_fp64(args).abs().max()), 1e-6)
        if float(known.double().mean()) < 0.5 or \
                not bool((((got - variant).abs() <= atol) | ~known).all()):
            return False
    return True


def _catalogued(hint):
    """Whether ``hint`` is the text of a mistake of NARROW_MISTAKES or ``diagnose.MISTAKES``."""
    from . import diagnose

    return hint in dict(NARROW_MISTAKES) or hint in dict(diagnose.MISTAKES)


def _locate_narrow(buffers, probe_list, label, confirm=lambda hint: True):
    """Location by isolation (as lab 05's kernel check): the kernel's output on each probe of
    :func:`_operator.probes` (one term switched on at a time), judged by ``diagnose.locate``.

    Returns None when every probe is right.  Raises at the first wrong probe, except one whose
    only fault is NaN where a corner of weight 0 lies off the map (a missing mask, which the
    general cases name): that probe's message is returned, for the check to raise if the
    general cases pass.  A row the kernel never stored holds the sentinel, which becomes NaN
    for ``diagnose`` (its sign of an unwritten row); a NaN the kernel computed itself came from
    a read past an input, and is said so instead.  ``confirm(hint)``: whether the mistake a
    hint names reproduces the kernel's output beyond the probe (else the probe's term is
    given instead of the name)."""
    from . import diagnose

    for (name, term, args), buffer in zip(probe_list, buffers):
        what = f"{label}, probe: {name}"
        if isinstance(buffer, Raised):
            raise AssertionError(f"{what}: the launch raised {buffer}")
        _tail_written(buffer, args, what)
        batch, queries, heads, channels = (*args["sampling_locations"].shape[:3],
                                           args["value"].shape[3])
        shape = (batch, queries, heads, channels)
        raw = buffer[:batch * queries * heads * channels].detach().cpu().double().view(shape)
        unwritten = raw == SENTINEL
        read_nan = torch.isnan(raw)
        got = torch.where(unwritten, torch.full_like(raw, float("nan")), raw)
        found = diagnose.locate([got.view(batch, queries, heads * channels)],
                                [(name, term, args)], op.TOLERANCE[torch.float32])
        if found is None:
            continue
        message, hint = found[1].split("\nHint: ", 1)
        if bool(read_nan.any()):             # (diagnose would call these rows unwritten)
            expected = op.forward_fp64(args).view(shape)
            atol = op.TOLERANCE[torch.float32] * max(float(expected.abs().max()), 1e-6)
            right = ((raw - expected).abs() <= atol) | read_nan
            hint = _nan_hint(read_nan, args, term, shape)
            rows = read_nan.any(-1).nonzero().tolist()
            if bool(right.all()) and all(_outside_corners(args, *r) for r in rows):
                return f"{label}, {message}\nHint: {hint}"
        elif bool(unwritten.any()):
            hint = hint.replace("they still hold the NaN the check filled the output with",
                                f"they still hold {SENTINEL}, the value the check filled out "
                                "with, shown as nan above")
        else:
            hint = _probe_named(raw, args) or hint
            expected = op.forward_fp64(args)
            atol = op.TOLERANCE[torch.float32] * max(float(expected.abs().max()), 1e-6)
            if bool((raw.abs() <= atol).all()) and not _catalogued(hint):
                # (diagnose's factor hint would call it "0 times the right one")
                hint = ("your output is 0 everywhere on this probe, where the reference's is "
                        "not: no sample added anything to what was stored, and no usual mistake "
                        "reproduces that. This probe is where your output first goes wrong, so "
                        f"look at what it adds: {term}")
            elif not confirm(hint):
                hint = (f"no usual mistake reproduces your output on every input of this check "
                        "(one does on this probe alone). This probe is where your output first "
                        f"goes wrong, so look at what it adds: {term}")
        raise AssertionError(f"{label}, {message}\nHint: {hint}")
    return None


def check_narrow(msda_forward_narrow_kernel, seed=None):
    gen = fresh_generator(seed)
    seed = gen.initial_seed()
    cases = _narrow_cases(gen)
    probe_list = op.probes(gen, torch.float32)
    on_device = [{k: v.to(op.device()) for k, v in args.items()} for _, _, args in probe_list]
    with forbid_references(msda_forward_narrow_kernel, writes=(5,)):
        probed = [attempt(_launch, msda_forward_narrow_kernel, args, PROBE_BLOCK_Q)
                  for args in on_device]
        buffers = [attempt(_launch, msda_forward_narrow_kernel, args, block_q)
                   for _, args, block_q in cases]
    if not judging():
        return
    deferred = _locate_narrow(probed, probe_list, f"narrow forward (seed {seed})",
                              lambda hint: _named_everywhere(hint, cases, buffers))
    for (what, args, _), buffer in zip(cases, buffers):
        what = f"narrow forward, {what} (seed {seed})"
        if isinstance(buffer, Raised):
            raise AssertionError(f"{what}: the launch raised {buffer}")
        _judge_narrow(buffer, args, what)
    if deferred is not None:
        raise AssertionError(deferred)
    show(f"msda_forward_narrow_kernel (seed {seed}): {len(probe_list)} probes, one term at a "
         f"time, then {len(cases)} launches with queries beyond Q in the last block and "
         "locations outside the maps: output right, nothing read or written past a tensor")


# ------------------------------------------------------------------ stage 4: the tuner
class OutOfResources(RuntimeError):
    """What a configuration that cannot launch raises (as Triton's own error does)."""


class _Bench:
    """Made-up configurations: the j-th measurement of config c is times[c][j]; run(c)
    returns the expected output, a variant of it (``outputs``), or raises."""

    def __init__(self, expected, times, outputs=None, failing=()):
        self.expected, self.times = expected, times
        self.outputs, self.failing = outputs or {}, failing
        self.calls = {c: 0 for c in times}

    def run(self, config):
        if config in self.failing:
            raise OutOfResources(f"out of resources: config {config} needs too much shared "
                                 "memory")
        return self.outputs[config].clone() if config in self.outputs else self.expected.clone()

    def measure(self, config):
        if config in self.failing:
            raise OutOfResources(f"config {config} cannot launch, so it cannot be timed")
        j = self.calls[config]
        self.calls[config] += 1
        series = self.times[config]
        return series[j] if j < len(series) else series[-1]


def _series(t, spikes=()):
    values = [t * (1 + 0.01 * j) for j in range(9)]
    for j, factor in spikes:
        values[j] = t * factor
    return values


def _tune_scenarios(gen):
    """(description, bench, candidates, repeats, {config: why it is rejected})."""
    expected = torch.randn(3, 5, generator=gen)
    configs = [(16, 2), (16, 4), (32, 4), (64, 4), (64, 8)]
    base = {c: 1e-3 * (1.0 + float(torch.rand((), generator=gen))) for c in configs}

    def plain():
        return {c: _series(t) for c, t in base.items()}

    fastest = min(base, key=base.get)
    times = plain()
    times[fastest] = _series(base[fastest] * 0.2)
    wrong = expected.clone()
    wrong[..., -1] += 0.5                          # a dropped or doubled channel
    yield ("the fastest configuration gives a wrong output",
           _Bench(expected, times, outputs={fastest: wrong}), configs, 5,
           {fastest: "values"})
    times = plain()
    a, b = configs[1], configs[3]
    times[a] = _series(0.5e-3, spikes=[(1, 40.0)])  # median 0.5 ms, mean inflated
    times[b] = _series(0.6e-3)
    yield ("one measurement of the best configuration is an outlier", _Bench(expected, times),
           configs, 5, {})
    times = plain()
    lucky = configs[2]
    times[lucky] = _series(2.5e-3, spikes=[(2, 0.1)])  # one measurement 10x too fast
    times[configs[4]] = _series(0.8e-3)
    yield ("one measurement of a slow configuration is 10x too fast", _Bench(expected, times),
           configs, 3, {})
    yield ("one configuration cannot launch, one is wrong",
           _Bench(expected, plain(), outputs={configs[0]: wrong}, failing={configs[4]}),
           configs, 3, {configs[0]: "values", configs[4]: "raises"})
    yield ("one configuration drops a channel (another shape), one returns float64",
           _Bench(expected, plain(), outputs={configs[1]: expected[:, :-1].clone(),
                                              configs[3]: expected.double()}),
           configs, 3, {configs[1]: "shape", configs[3]: "dtype"})
    near = expected + 1e-7 * expected.abs().max()
    times = plain()
    times[configs[2]] = _series(0.3e-3)
    yield ("the fastest configuration differs from the expected output by rounding only",
           _Bench(expected, times, outputs={configs[2]: near}), configs, 3, {})
    times = {c: _series(2e-3) for c in configs}
    times[configs[2]] = _series(1e-3)
    times[configs[3]] = _series(1e-3)
    yield ("two configurations tie", _Bench(expected, times), configs, 4, {})
    yield ("no configuration is correct",
           _Bench(expected, plain(), outputs={c: wrong for c in configs[:3]},
                  failing=set(configs[3:])), configs, 3,
           {**{c: "values" for c in configs[:3]}, **{c: "raises" for c in configs[3:]}})


REJECTED = {
    "values": "its output differs from expected: compare with torch.allclose(out, expected, "
              "atol=atol, rtol=rtol) and reject it (median None) before timing it",
    "raises": "run(config) raises for it: catch the exception, reject the configuration "
              "(median None) and go on",
    "shape": "its output has another shape: compare the shape before the values",
    "dtype": "its output is float64, expected float32: compare the dtype too",
}


def _median_hint(have, series, repeats):
    window = series[:repeats]
    for value, hint in ((statistics.mean(window), "the median, not the mean: one outlier moves "
                                                  "the mean"),
                        (min(window), "the median, not the minimum: one lucky measurement is "
                                      "not the configuration's speed"),
                        (statistics.median(series[1:repeats + 1]),
                         "measure(config) exactly `repeats` times; the warm-up is run(config), "
                         "which is not timed"),
                        (statistics.median(series[:repeats + 1]),
                         "measure(config) exactly `repeats` times; the warm-up is run(config), "
                         "which is not timed"),
                        (series[0], "take `repeats` measurements and keep their median")):
        if isinstance(have, (int, float)) and abs(have - value) <= 1e-12 * max(1.0, abs(value)):
            return hint
    return f"the median of the {repeats} measurements of measure(config)"


def _expected_tuning(bench, candidates, repeats, rejected):
    medians = {c: None if c in rejected else statistics.median(bench.times[c][:repeats])
               for c in candidates}
    timed = [(t, i, c) for i, (c, t) in enumerate(medians.items()) if t is not None]
    return (min(timed)[2] if timed else None), medians


def _judge_tune(got, bench, candidates, repeats, rejected, what):
    best, medians = _expected_tuning(bench, candidates, repeats, rejected)
    if isinstance(got, Raised):
        exc = got.exc
        if type(exc).__name__ == "OutOfResources":
            raise AssertionError(f"{what}: tune let run(config) raise {got}\nHint: "
                                 f"{REJECTED['raises']}")
        if best is None and isinstance(exc, RuntimeError):
            return
        hint = REJECTED["shape"] if "must match the size" in str(exc) else \
            REJECTED["dtype"] if "did not match" in str(exc) else \
            f"raise RuntimeError only when no configuration is correct; {best} is"
        raise AssertionError(f"{what}: tune raised {got}\nHint: {hint}")
    if best is None:
        raise AssertionError(f"{what}: expected RuntimeError, got {got!r}\nHint: when every "
                             "configuration fails or is wrong, raise RuntimeError")
    if not (isinstance(got, tuple) and len(got) == 2 and isinstance(got[1], dict)):
        raise AssertionError(f"{what}: expected a tuple (best, medians dict), got {got!r}")
    got_best, got_medians = got
    got_best = tuple(got_best) if isinstance(got_best, list) else got_best
    for config in candidates:
        want, have = medians[config], got_medians.get(config, "missing")
        if want is None and have is not None:
            raise AssertionError(f"{what}: config {config} must be rejected (median None), got "
                                 f"{have!r}\nHint: {REJECTED[rejected[config]]}")
        if want is not None and have is None:
            raise AssertionError(
                f"{what}: config {config} is right but was rejected\nHint: its output matches "
                "expected within atol and rtol; compare with torch.allclose(out, expected, "
                "atol=atol, rtol=rtol), not exact equality")
        if want is not None and (not isinstance(have, (int, float))
                                 or abs(have - want) > 1e-12 * max(1.0, abs(want))):
            raise AssertionError(
                f"{what}: median of config {config}: expected {want!r}, got {have!r}\nHint: "
                + _median_hint(have, bench.times[config], repeats))
    if got_best != best:
        tie = [c for c in candidates if medians[c] == medians[best]]
        hint = ("on a tie the earliest candidate wins: keep the first smallest median"
                if got_best in tie else "best is the configuration with the smallest median")
        raise AssertionError(f"{what}: expected best {best}, got {got_best}\nHint: {hint}")


def check_tune(tune, seed=None):
    gen = fresh_generator(seed)
    seed = gen.initial_seed()
    scenarios = list(_tune_scenarios(gen))
    results = []
    with forbid_references(tune):
        for _, bench, candidates, repeats, _ in scenarios:
            # RuntimeError is tune's answer when nothing is correct
            results.append(attempt_expecting((RuntimeError,), tune, list(candidates), bench.run,
                                             bench.measure, bench.expected.clone(),
                                             repeats=repeats))
    if not judging():
        return
    for (description, bench, candidates, repeats, rejected), got in zip(scenarios, results):
        _judge_tune(got, bench, candidates, repeats, rejected,
                    f"tune: {description} (seed {seed})")
    show(f"tune: {len(scenarios)} made-up benchmarks (seed {seed}): failing, wrong, "
         "wrong-shaped and rounding-only configurations, outliers, a tie, nothing correct; "
         "all handled")
