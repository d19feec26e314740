"""Checks of lab 03 (the machine): the paper GPU's sector counter, the two tilings, the traffic
of a gather and the prediction.

Every check serves both cells of its stage: the visible cell passes a shown ``seed=``, the
hidden cell none (the grader's seed while grading).  A check first runs the student's function
on every case, then (only when it judges) compares with the chip of this lab and, on a
mismatch, names the mistake: the typical wrong versions of each function are written out
below, and the one that gives exactly the student's answers on every case is the diagnosis.
"""
from __future__ import annotations

import math

import torch

from .common import Raised, attempt, forbid_references, fresh_generator, judging, show

SECTOR_BYTES, LINE_BYTES, WARP_SIZE = 32, 128, 32


def _chips():
    from source_kernels.chips import lab03
    return lab03


# ------------------------------------------------------------------ stage 1: sectors and lines
def _instruction_cases(gen, random_count):
    """(what, addresses, access_bytes): the hand-made instructions, each with what it shows,
    then ``random_count`` random ones (aligned or not, with and without idle lanes)."""
    lane = torch.arange(32)
    cases = [
        ("32 lanes, consecutive 4-byte words: 128 bytes in a row", lane * 4, 4),
        ("32 lanes, 128 bytes apart: every lane in its own sector and line", lane * 128, 4),
        ("32 lanes, 8 bytes apart: 256 bytes spanned, half of each sector unused", lane * 8, 4),
        ("32 lanes, the same address: one sector serves them all", torch.full((32,), 64), 4),
        ("one lane reading bytes 30..33: it straddles a sector border",
         torch.tensor([30] + [-1] * 31), 4),
        ("one lane reading bytes 126..129: it straddles a line border",
         torch.tensor([126] + [-1] * 31), 4),
        ("one 2-byte lane reading bytes 126..127: inside one sector",
         torch.tensor([126] + [-1] * 31), 2),
        ("16 active lanes, consecutive, 16 idle", torch.where(lane < 16, lane * 4, -1), 4),
        ("all lanes idle", torch.full((32,), -1), 4),
        ("16-byte accesses, consecutive: 512 bytes", lane * 16, 16),
        ("32 lanes, 36 bytes apart: sectors shared by some neighbours, not all",
         lane * 36, 4),
    ]
    for i in range(random_count):
        access = (1, 2, 4, 8, 16)[i % 5]
        addresses = torch.randint(0, 4096, (32,), generator=gen, dtype=torch.int64)
        if i % 2 == 0:
            addresses = addresses // access * access
        if i % 3 == 0:
            addresses[torch.randperm(32, generator=gen)[:5]] = -1
        cases.append((f"random instruction {i}", addresses, access))
    return cases


def _touched(addresses, access, *, last_byte=-1, idle=False):
    """{sector: lanes} the lanes touch (``last_byte`` is the offset of the last byte read
    relative to address + access, -1 when right; ``idle`` counts lanes at -1 too)."""
    sectors = []
    for a in torch.as_tensor(addresses).tolist():
        if a < 0 and not idle:
            continue
        sectors.append(range(a // SECTOR_BYTES, (a + access + last_byte) // SECTOR_BYTES + 1))
    return sectors


def _distinct(per_lane):
    return len({s for lane in per_lane for s in lane})


IDLE_HINT = "idle lanes (address -1) touch nothing: skip them before counting"

# How many sectors the usual wrong counters report: (function, hint).
SECTOR_MISTAKES = [
    (lambda a, n: sum(len(r) for r in _touched(a, n)),
     "you count a sector for every lane: lanes that read the same sector share one "
     "transaction, so count distinct sectors (a set), not lanes"),
    (lambda a, n: len({x // SECTOR_BYTES for x in torch.as_tensor(a).tolist() if x >= 0}),
     "you count only the sector of each lane's first byte: a lane reading access_bytes bytes "
     "from a covers sectors a // 32 to (a + access_bytes - 1) // 32, two when it straddles a "
     "border"),
    (lambda a, n: _distinct(_touched(a, n, last_byte=0)),
     "you take (a + access_bytes) // 32 as the last sector: the last byte read is "
     "a + access_bytes - 1, so an access that ends on a border touches no extra sector"),
    (lambda a, n: _distinct(_touched(a, n, idle=True)), IDLE_HINT),
]


def _sectors_of(addresses, access, idle=False):
    return {s for lane in _touched(addresses, access, idle=idle) for s in lane}


LINE_MISTAKES = [
    (lambda a, n: math.ceil(len(_sectors_of(a, n)) / 4),
     "you divide the number of sectors by 4: that holds only for whole aligned lines; a line "
     "is sector // 4 of each touched sector, so count distinct sector // 4"),
    (lambda a, n: len({x // LINE_BYTES for x in torch.as_tensor(a).tolist() if x >= 0}),
     "you take the line of each lane's first byte only: an access can straddle a line border, "
     "so take the line (sector // 4) of every sector it touches"),
    (lambda a, n: len({s // LINE_BYTES for s in _sectors_of(a, n)}),
     "the line of sector s is s // 4 (128 / 32 sectors per line), not s // 128"),
    (lambda a, n: len(_sectors_of(a, n)),
     "you report the sectors as lines: lines group four sectors (line = sector // 4)"),
    (lambda a, n: len({s // 4 for s in _sectors_of(a, n, idle=True)}), IDLE_HINT),
]


def _explain(got_values, expected_values, cases, mistakes):
    """The hint of the mistake that gives exactly ``got_values`` on every case, or None."""
    for fn, hint in mistakes:
        if all(fn(a, n) == g for (_, a, n), g in zip(cases, got_values)):
            return hint
    return None


def _raised(what, got, hint):
    """AssertionError for a call that raised."""
    return AssertionError(f"{what}: raised {got}\nHint: {hint}")


def _pair(got, what):
    if isinstance(got, Raised):
        raise _raised(what, got, "idle lanes hold -1; every other lane reads access_bytes "
                                 "bytes from its address")
    try:
        sectors, lines = got
        return int(sectors), int(lines)
    except (TypeError, ValueError):
        raise AssertionError(f"{what}: expected a pair of ints (sectors, lines), got "
                             f"{got!r}") from None


def check_sectors_and_lines(sectors_and_lines, seed=None):
    gen = fresh_generator(seed)
    seed = gen.initial_seed()
    cases = _instruction_cases(gen, 20)
    with forbid_references(sectors_and_lines):
        results = [attempt(sectors_and_lines, a.clone(), n) for _, a, n in cases]
    if not judging():
        return
    chips = _chips()
    got = [_pair(r, f"sectors_and_lines on {what} (seed {seed})")
           for r, (what, _, _) in zip(results, cases)]
    expected = [chips.sectors_and_lines(a, n) for _, a, n in cases]
    for (what, a, n), g, e in zip(cases, got, expected):
        if g == e:
            continue
        hints = []
        if g[0] != e[0]:
            hints.append(_explain([x[0] for x in got], None, cases, SECTOR_MISTAKES)
                         or "sectors: a lane reading n bytes from a touches sectors a // 32 to "
                            "(a + n - 1) // 32; count each sector once, idle lanes none")
        if g[1] != e[1]:
            hints.append(_explain([x[1] for x in got], None, cases, LINE_MISTAKES)
                         or "lines: the distinct sector // 4 over every touched sector")
        shown = a.tolist()
        raise AssertionError(
            f"sectors_and_lines, {what} ({n} bytes per lane, seed {seed}): expected "
            f"(sectors, lines) = {e}, got {g}; lane addresses {shown[:6]}... "
            f"(all 32: {shown})\nHint: " + "; ".join(dict.fromkeys(hints)))
    show(f"sectors_and_lines: {len(cases) - 20} hand-made and 20 random instructions "
         f"(seed {seed}) counted right")


# ------------------------------------------------------------------ stage 2: the two tilings
def _tiling_cases(gen):
    """(tiling, rows, channels, elem_bytes, row_stride_bytes)."""
    cases = [("wide", torch.tensor([3, 0]), 16, 4, None),
             ("narrow", torch.tensor([3, 0]), 16, 4, None),
             ("wide", torch.tensor([5]), 16, 2, 256),
             ("narrow", torch.tensor([5, 2]), 4, 2, 256)]
    for tiling in ("wide", "narrow"):
        for n_rows, channels, elem, stride in ((45, 12, 4, None), (33, 32, 2, None),
                                               (16, 12, 4, 64), (70, 48, 2, 4 * 96)):
            rows = torch.randint(0, 500, (n_rows,), generator=gen, dtype=torch.int64)
            cases.append((tiling, rows, channels, elem, stride))
    return cases


def _lanes(addresses):
    """(instructions, 32) from a flat list, the last instruction padded with -1."""
    addresses = list(addresses) + [-1] * (-len(addresses) % WARP_SIZE)
    return torch.tensor(addresses, dtype=torch.int64).view(-1, WARP_SIZE)


def _wide(rows, channels, elem, stride, *, channel_major=False, elem_offsets=True):
    step = elem if elem_offsets else 1
    pairs = [(r, c) for c in range(channels) for r in rows] if channel_major else \
        [(r, c) for r in rows for c in range(channels)]
    return _lanes([r * stride + c * step for r, c in pairs])


def _narrow(rows, channels, elem, stride, *, channel_outer=False, idle=-1, elem_offsets=True):
    step = elem if elem_offsets else 1
    groups = [rows[g:g + WARP_SIZE] for g in range(0, len(rows), WARP_SIZE)]
    order = [(g, c) for c in range(channels) for g in groups] if channel_outer else \
        [(g, c) for g in groups for c in range(channels)]
    out = []
    for group, c in order:
        out += [r * stride + c * step for r in group] + [idle] * (WARP_SIZE - len(group))
    return torch.tensor(out, dtype=torch.int64).view(-1, WARP_SIZE)


def _tiling_variant(tiling, rows, channels, elem, stride, mistake):
    rows = torch.as_tensor(rows).tolist()
    right = channels * elem if stride is None else stride
    kwargs = {}
    if mistake == "stride ignored":
        right = channels * elem
    elif mistake == "stride in elements":
        right = right * elem
    elif mistake == "element offsets":
        kwargs["elem_offsets"] = False
    elif mistake == "order":
        kwargs["channel_major" if tiling == "wide" else "channel_outer"] = True
    elif mistake == "idle lanes 0":
        if tiling == "wide":
            return None
        kwargs["idle"] = 0
    make = _wide if tiling == "wide" else _narrow
    return make(rows, channels, elem, right, **kwargs)


TILING_MISTAKES = [
    ("order", "wide lists the (row, channel) pairs row by row, channels fastest; narrow goes "
              "group by group of 32 rows, and within a group channel by channel"),
    ("element offsets", "addresses are in bytes: channel c of row r is at "
                        "r * row_stride_bytes + c * elem_bytes"),
    ("stride ignored", "row r starts at r * row_stride_bytes when row_stride_bytes is given "
                       "(channels * elem_bytes only by default)"),
    ("stride in elements", "row_stride_bytes is already in bytes: do not multiply it by "
                           "elem_bytes"),
    ("idle lanes 0", "idle lanes of a narrow instruction hold -1, not an address"),
]


def _describe_tiling(tiling, rows, channels, elem, stride):
    rows = torch.as_tensor(rows)
    shown = rows.tolist() if rows.numel() <= 4 else f"{rows.numel()} random rows"
    return (f"{tiling} tiling of rows {shown} x {channels} channels of {elem} bytes, row stride "
            f"{stride if stride else channels * elem} bytes")


def check_warp_instructions(warp_instructions, seed=None):
    gen = fresh_generator(seed)
    seed = gen.initial_seed()
    cases = _tiling_cases(gen)
    with forbid_references(warp_instructions):
        results = [attempt(warp_instructions, t, r.clone(), d, e, s)
                   for t, r, d, e, s in cases]
    if not judging():
        return
    chips = _chips()
    for case, got in zip(cases, results):
        tiling, rows, channels, elem, stride = case
        expected = chips.warp_instructions(*case)
        what = f"warp_instructions, {_describe_tiling(*case)} (seed {seed})"
        if isinstance(got, Raised):
            raise _raised(what, got, "pad the last instruction with -1 up to 32 lanes "
                                     "before shaping the addresses as (instructions, 32)"
                          if "invalid for input of size" in str(got.exc) else
                          "build the addresses as a flat list in issue order, pad, then "
                          "view as (instructions, 32)")
        got = torch.as_tensor(got)
        if tuple(got.shape) != tuple(expected.shape):
            count = ("ceil(rows * channels / 32)" if tiling == "wide"
                     else "ceil(rows / 32) * channels")
            raise AssertionError(
                f"{what}: expected {tuple(expected.shape)} (instructions, 32), got "
                f"{tuple(got.shape)}\nHint: {tiling} issues {count} instructions of 32 lanes; "
                "pad the last one with -1")
        bad = (got.to(torch.int64) != expected).nonzero()
        if not bad.numel():
            continue
        i, lane = (int(v) for v in bad[0])
        hint = next((text for mistake, text in TILING_MISTAKES
                     if all(_matches(got_c, _tiling_variant(*c, mistake))
                            for c, got_c in zip(cases, results))), None) or \
            next((text for mistake, text in TILING_MISTAKES
                  if _matches(got, _tiling_variant(*case, mistake))), None) or \
            ("lane i of a wide instruction reads pair 32 * instruction + i of the row-major "
             "(row, channel) list; lane i of a narrow one reads row i of its group")
        raise AssertionError(
            f"{what}: instruction {i}, lane {lane}: expected byte address "
            f"{int(expected[i, lane])}, got {int(got[i, lane])}; {bad.shape[0]} of "
            f"{got.numel()} lanes differ\nHint: {hint}")
    show(f"warp_instructions: {len(cases)} gathers, both tilings (seed {seed}), every lane right")


def _matches(got, variant):
    if isinstance(got, Raised) or variant is None:
        return False
    got = torch.as_tensor(got)
    return variant is not None and tuple(got.shape) == tuple(variant.shape) and \
        bool((got.to(torch.int64) == variant).all())


# ------------------------------------------------------------------ stage 3: traffic, prediction
TRAFFIC_KEYS = ("instructions", "sectors", "lines", "useful_bytes", "moved_bytes", "efficiency")


def _traffic_cases(gen):
    cases = [("wide", torch.randperm(5000, generator=gen)[:64], 32, 4, None),
             ("narrow", torch.randperm(5000, generator=gen)[:64], 32, 4, None)]
    for tiling in ("wide", "narrow"):
        for n_rows, channels, elem, stride in ((50, 32, 2, None), (40, 6, 4, 8 * 6 * 4),
                                               (20, 3, 2, None)):
            rows = torch.randint(0, 300, (n_rows,), generator=gen, dtype=torch.int64)
            cases.append((tiling, rows, channels, elem, stride))
    return cases


def _traffic_variants(chips, case, expected):
    """{key: [(value, hint)]}: what the usual mistakes give for each key."""
    tiling, rows, channels, elem, stride = case
    instructions = chips.warp_instructions(*case)
    counts = [chips.sectors_and_lines(lanes, 4) for lanes in instructions]
    sectors4, lines4 = sum(c[0] for c in counts), sum(c[1] for c in counts)
    useful, moved = expected["useful_bytes"], expected["moved_bytes"]
    access_hint = ("every lane reads elem_bytes bytes: pass elem_bytes (not 4) to your "
                   "sectors_and_lines")
    return {
        "sectors": [(sectors4, access_hint)],
        "lines": [(lines4, access_hint)],
        "useful_bytes": [(instructions.shape[0] * WARP_SIZE * elem,
                          "useful bytes count the (row, channel) pairs only: rows x channels x "
                          "elem_bytes; idle lanes read nothing")],
        "moved_bytes": [(expected["lines"] * LINE_BYTES,
                         "moved bytes are sectors x 32: the memory system moves sectors, not "
                         "whole lines"),
                        (sectors4 * SECTOR_BYTES, access_hint)],
        "efficiency": [(moved / max(useful, 1), "efficiency is useful_bytes / moved_bytes (at "
                                                "most 1), not the other way round")],
    }


def check_gather_traffic(gather_traffic, seed=None):
    gen = fresh_generator(seed)
    seed = gen.initial_seed()
    cases = _traffic_cases(gen)
    with forbid_references(gather_traffic):
        results = [attempt(gather_traffic, t, r.clone(), d, e, s)
                   for t, r, d, e, s in cases]
    if not judging():
        return
    chips = _chips()
    for case, got in zip(cases, results):
        expected = chips.gather_traffic(*case)
        what = f"gather_traffic, {_describe_tiling(*case)} (seed {seed})"
        if isinstance(got, Raised):
            raise _raised(what, got, "gather_traffic builds on your warp_instructions and "
                                     "sectors_and_lines: their checks above must pass first")
        if not isinstance(got, dict):
            raise AssertionError(f"{what}: expected a dict with the keys {TRAFFIC_KEYS}, got "
                                 f"{type(got).__name__}")
        for key in TRAFFIC_KEYS:
            if key not in got:
                raise AssertionError(f"{what}: the key {key!r} is missing (expected the keys "
                                     f"{TRAFFIC_KEYS})")
            value = expected[key]
            if _close(got[key], value):
                continue
            hint = next((text for wrong, text in _traffic_variants(chips, case, expected)
                         .get(key, []) if _close(got[key], wrong)), None) or \
                ("gather_traffic builds on your warp_instructions and sectors_and_lines: "
                 "their checks above must pass first" if key in ("instructions", "sectors",
                                                                 "lines") else
                 "useful_bytes = rows x channels x elem_bytes, moved_bytes = sectors x 32, "
                 "efficiency = useful / moved")
            raise AssertionError(f"{what}: {key} expected {value}, got {got[key]!r}\n"
                                 f"Hint: {hint}")
    show(f"gather_traffic: {len(cases)} gathers (seed {seed}), every key right")


def _close(got, expected):
    try:
        return abs(float(got) - float(expected)) <= 1e-9 * max(1.0, abs(float(expected)))
    except (TypeError, ValueError):
        return False


def _prediction_cases(gen):
    """(what, rows, channels, elem_bytes, row_stride_bytes)."""
    rows = torch.randint(0, 1000, (64,), generator=gen, dtype=torch.int64)
    same = torch.full((64,), int(torch.randint(0, 1000, (1,), generator=gen)))
    return [("64 random rows, 32 fp32 channels", rows, 32, 4, None),
            ("64 random rows, 8 bf16 channels", rows, 8, 2, None),
            ("one row repeated 64 times, 64 fp32 channels", same, 64, 4, None),
            ("one row repeated 64 times, 1 fp32 channel: a tie", same, 1, 4, None)]


def _prediction_variants(chips, case):
    _, rows, channels, elem, stride = case
    wide = chips.gather_traffic("wide", rows, channels, elem, stride)
    narrow = chips.gather_traffic("narrow", rows, channels, elem, stride)
    return [
        ("wide" if wide["sectors"] < narrow["sectors"] else "narrow",
         "a tie goes to \"wide\", which never issues more instructions: use <= , not <"),
        ("wide" if wide["instructions"] <= narrow["instructions"] else "narrow",
         "compare the sectors each tiling moves, not its instructions (wide never issues "
         "more)"),
        ("narrow" if wide["sectors"] <= narrow["sectors"] else "wide",
         "return the tiling that moves fewer sectors, not more"),
    ]


def check_predict_tiling(predict_tiling, seed=None):
    gen = fresh_generator(seed)
    seed = gen.initial_seed()
    cases = _prediction_cases(gen)
    with forbid_references(predict_tiling):
        results = [attempt(predict_tiling, rows.clone(), d, e, s)
                   for _, rows, d, e, s in cases]
    if not judging():
        return
    chips = _chips()
    expected = [chips.predict_tiling(*case[1:]) for case in cases]
    for case, got, want in zip(cases, results, expected):
        if isinstance(got, Raised):
            raise _raised(f"predict_tiling, {case[0]} (seed {seed})", got,
                          "run your gather_traffic for both tilings and compare their sectors")
        if got == want:
            continue
        candidates = [_prediction_variants(chips, c) for c in cases]
        hint = next((candidates[0][j][1] for j in range(len(candidates[0]))
                     if all(v[j][0] == g for v, g in zip(candidates, results))), None) or \
            ("run gather_traffic for both tilings and compare their sectors; a tie goes "
             "to \"wide\"")
        wide = chips.gather_traffic("wide", *case[1:])
        narrow = chips.gather_traffic("narrow", *case[1:])
        raise AssertionError(
            f"predict_tiling, {case[0]} (seed {seed}): expected {want!r} (wide moves "
            f"{wide['sectors']} sectors, narrow {narrow['sectors']}), got {got!r}\n"
            f"Hint: {hint}")
    show(f"predict_tiling: {len(cases)} gathers (seed {seed}), every prediction right")
