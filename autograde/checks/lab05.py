"""Checks of lab 05 (forward, correct), visible and hidden alike, one per step:

1. ``check_program_map(launch_grid, program_of)``: the grid and who computes what;
2. ``check_corner_coordinate(corner_coordinate)``: the ``@triton.jit`` helper alone, through a
   tiny test kernel of the check's, on ordinary locations, negative pixel coordinates and
   +-1e9, +-inf, NaN (the clamp trap);
3. ``check_level_row(level_row)`` and ``check_value_offset(value_offset)``: the row of a corner
   and the flat offset of a value row, the latter on indices whose offset passes 2**31,
   stored to an int64 tensor (the int64 trap, with no memory at those offsets touched);
4. ``check_sample_level(sample_level)``: one level and one point, the four corner gathers;
5. ``check_forward_inside(msda_forward, msda_forward_kernel)``: the kernel, all levels and
   points, inside the maps, then ``check_forward_int64(msda_forward_kernel)`` (step 9);
6. ``check_forward_outside(msda_forward)``: the masks at the map's edges (borders, outside,
   +-1e9, 1x1 and non-square levels);
7. ``check_forward_channels(msda_forward)``: the masks at the tile's edges (D not a power of
   two, ragged blocks of queries);
8. ``check_forward_half_precision(msda_forward)``: fp16 / bf16 / fp64 inputs;
9. ``check_forward_int64(msda_forward_kernel)``: the kernel's row index and offsets in int64,
   launched on rows past 2**31 elements (interpreter only).

``check_forward_inside`` first runs the probes of :func:`_operator.probes` (one term of the
forward switched on at a time) and stops at the first that goes wrong, naming the mistake
when one reproduces the result, else the term.  The kernel's output starts as NaN
(``guard.watch(poison=...)``), so a row no program wrote is told apart from a wrong one.

A visible check passes a shown ``seed``; a hidden check draws a fresh one.  Every kernel runs
under :mod:`guard` (a read or write outside a tensor is named, with its line and corner, and
never executed).  Expected values come only when the check judges (``common.expect``,
``_operator.forward_fp64``), and :mod:`diagnose` names the mistake after a mismatch.
"""
from __future__ import annotations

import linecache

import torch

from autograde import check_api

from . import _operator as op
from . import guard
from .guard import guarded  # noqa: F401  (the notebook's demo cells: check.guarded(...))
from .common import count_kernel_launches, forbid_references, fresh_generator, judging

INT32_MIN, INT32_MAX = -2 ** 31, 2 ** 31 - 1


def _tag(gen, seed):
    return f"seed {seed}" if seed is not None else f"hidden check, seed {gen.initial_seed()}"


def _passed(text):
    if judging():
        from . import diagnose
        diagnose.passed(text)


# ---------------------------------------------------------------------- test kernels
# Each wraps one of the student's @triton.jit helpers (bound under its own name in the test
# kernel's globals) in a kernel that loads the check's inputs and stores what it returns.
TESTERS = {
    "corner_coordinate": '''
@triton.jit
def corner_coordinate_tester(loc_ptr, first_ptr, frac_ptr, N, size, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    loc = tl.load(loc_ptr + offs, mask=mask, other=0.0)
    first, frac = corner_coordinate(loc, size)
    tl.store(first_ptr + offs, first, mask=mask)
    tl.store(frac_ptr + offs, frac, mask=mask)
''',
    "level_row": '''
@triton.jit
def level_row_tester(start_ptr, r_ptr, c_ptr, out_ptr, N, H, W, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    start = tl.load(start_ptr)                      # int64, as the kernel loads it
    r = tl.load(r_ptr + offs, mask=mask, other=0)
    c = tl.load(c_ptr + offs, mask=mask, other=0)
    tl.store(out_ptr + offs, level_row(start, r, c, H, W), mask=mask)
''',
    "value_offset": '''
@triton.jit
def value_offset_tester(b_ptr, s_ptr, m_ptr, out_ptr, N, S, M, D, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    b = tl.load(b_ptr + offs, mask=mask, other=0)   # int32, as tl.program_id gives them
    s = tl.load(s_ptr + offs, mask=mask, other=0)
    m = tl.load(m_ptr + offs, mask=mask, other=0)
    tl.store(out_ptr + offs, value_offset(b, s, m, S, M, D), mask=mask)
''',
    "sample_level": '''
@triton.jit
def sample_level_tester(value_ptr, shapes_ptr, starts_ptr, loc_ptr, out_ptr, level, S, Q, M, D,
                        BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr):
    pid_q = tl.program_id(0)
    pid_bm = tl.program_id(1)
    b = pid_bm // M
    m = pid_bm % M
    offs_q = pid_q * BLOCK_Q + tl.arange(0, BLOCK_Q)
    mask_q = offs_q < Q
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    H = tl.load(shapes_ptr + 2 * level).to(tl.int32)
    W = tl.load(shapes_ptr + 2 * level + 1).to(tl.int32)
    start = tl.load(starts_ptr + level)
    row = (b * Q + offs_q) * M + m                  # loc: (B, Q, M, 2) of this level
    x = tl.load(loc_ptr + 2 * row, mask=mask_q, other=0.0).to(tl.float32)
    y = tl.load(loc_ptr + 2 * row + 1, mask=mask_q, other=0.0).to(tl.float32)
    tile = sample_level(value_ptr, b, m, S, M, D, start, H, W, x, y, mask_q, offs_d, mask_d)
    tl.store(out_ptr + (row * D)[:, None] + offs_d[None, :], tile,
             mask=mask_q[:, None] & mask_d[None, :])
''',
}
_built = {}


def _tester(name, helper):
    """The test kernel around the student's helper ``name`` (in the grader's replay, the
    helper's stand-in itself, which replays what the test kernel stored)."""
    if check_api.replaying():
        return helper
    key = (name, id(helper))
    if key in _built and _built[key][0] is helper:
        return _built[key][1]
    import triton
    import triton.language as tl
    source = TESTERS[name].lstrip("\n")
    filename = f"<lab05 check: test kernel for {name} {len(_built)}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {"triton": triton, "tl": tl, name: helper, "__name__": "autograde_lab05_tester"}
    exec(compile(source, filename, "exec"), namespace)             # noqa: S102
    kernel = namespace[f"{name}_tester"]
    _built[key] = (helper, kernel)
    return kernel


def _as_assertion(exc, text):
    """The AssertionError to raise for an error of the student's code: one the interpreter
    wrapped (a reference called) as it was, anything else as ``text``."""
    seen = set()
    inner = exc
    while inner is not None and id(inner) not in seen:
        seen.add(id(inner))
        if isinstance(inner, AssertionError):
            return inner
        inner = inner.__cause__ or inner.__context__
    return AssertionError(text)


def _last_line(exc):
    """The innermost message of an exception (the interpreter wraps them several times)."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


def _error_hint(exc, args):
    text = _last_line(exc)
    dtype = args["value"].dtype if args is not None else None
    if "Expected dtype" in text and dtype in (torch.float16, torch.bfloat16):
        return ("\nHint: tl.floor and Triton's other math functions take float32 or float64 "
                f"only, and your locations are still {str(dtype)[6:]}: convert every loaded "
                "location, weight and value to ACC_DTYPE right after its load")
    return "\nHint: check the kernel's signature and the shapes and dtypes of what it combines"


def _launch(tester, grid, what, *args, int32=False, **kwargs):
    """Run a test kernel under the guard inside the recorded session; an error raised while
    compiling or running the student's helper becomes an AssertionError naming it."""
    try:
        with guard.watch(int32=int32) as report:
            tester[grid](*args, **kwargs)
    except AssertionError:
        raise
    except Exception as exc:                                        # noqa: BLE001
        raise _as_assertion(exc, f"{what}: running your helper raised {type(exc).__name__}: "
                                 f"{_last_line(exc)}\nHint: check its signature and that it "
                                 "returns what its docstring says") from None
    return report


# ---------------------------------------------------------------------- 1. the grid
def check_program_map(launch_grid, program_of, seed=None):
    """The grid covers every output row exactly once, with the kernel's mapping."""
    gen = fresh_generator(seed)
    tag = _tag(gen, seed)
    cases = [(2, 300, 8, 64), (1, 64, 1, 64), (3, 1, 2, 16), (2, 37, 3, 16)]
    for _ in range(3):
        batch, queries, heads = (int(v) for v in torch.randint(1, 9, (3,), generator=gen))
        queries = queries * int(torch.randint(1, 40, (1,), generator=gen))
        cases.append((batch, queries, heads, 2 ** int(torch.randint(0, 7, (1,), generator=gen))))
    for batch, queries, heads, block_q in cases:
        with forbid_references(launch_grid, program_of):
            grid = launch_grid(batch, queries, heads, block_q)
            rows = [(b, q, m, program_of(b, q, m, heads, block_q))
                    for b in range(batch) for q in range(queries) for m in range(heads)]
        if not judging():
            continue
        what = f"B = {batch}, Q = {queries}, M = {heads}, BLOCK_Q = {block_q} ({tag})"
        expected_grid = (-(-queries // block_q), batch * heads)
        if tuple(grid) != expected_grid:
            hint = ""
            if tuple(grid) == (queries // block_q, batch * heads):
                hint = ("\nHint: Q // BLOCK_Q drops the last, partial block of queries: round "
                        "up, triton.cdiv(Q, BLOCK_Q)")
            elif tuple(grid) == (batch * heads, expected_grid[0]):
                hint = "\nHint: axis 0 counts blocks of queries, axis 1 (batch, head) pairs"
            raise AssertionError(f"launch_grid with {what}: expected {expected_grid}, got "
                                 f"{tuple(grid)}{hint}")
        for b, q, m, got in rows:
            expected = (q // block_q, b * heads + m, q % block_q)
            if tuple(got) != expected:
                hint = ""
                if tuple(got)[0] == expected[0] and tuple(got)[1] != expected[1]:
                    hint = "\nHint: " + _pid_bm_hint(rows, batch, heads, block_q)
                elif tuple(got)[:2] == expected[:2]:
                    hint = "\nHint: the row of the tile is q % BLOCK_Q, the query's place in its block"
                raise AssertionError(f"program_of(batch {b}, query {q}, head {m}) with {what}: "
                                     f"expected (pid_q, pid_bm, row) = {expected}, got "
                                     f"{tuple(got)}{hint}")
    _passed(f"launch_grid and program_of: {len(cases)} shapes, every output row computed by "
            f"exactly one (program, row) ({tag})")


PID_BM = ("pid_bm = b * M + m (batch major: the heads of one batch element are neighbours), "
          "and the kernel recovers b = pid_bm // M, m = pid_bm % M")


def _pid_bm_hint(rows, batch, heads, block_q):
    """The hint for a wrong pid_bm: the usual mistake that gives the student's pid_bm for every
    (b, q, m) of this shape, when one does; else where it goes wrong, and the rule."""
    variants = [
        (lambda b, m: m * heads + b, "yours is m * M + b, the head and the batch element "
                                     "exchanged"),
        (lambda b, m: m * batch + b, "yours is m * B + b (head major: the batch elements of "
                                     "one head are neighbours)"),
        (lambda b, m: heads + m, "yours is M + m: the batch term b * M lost its factor b"),
        (lambda b, m: b + m, "yours is b + m: the batch term lost its factor M"),
        (lambda b, m: b * heads, "yours is b * M: the head term m is missing"),
        (lambda b, m: b * batch + m, "yours is b * B + m: the batch term's factor is M, the "
                                     "heads per batch element, not B"),
    ]
    try:
        pairs = [(b, m, int(tuple(got)[1])) for b, q, m, got in rows
                 if tuple(got)[0] == q // block_q and tuple(got)[2] == q % block_q]
    except (TypeError, ValueError, IndexError):
        pairs = []
    if pairs and len(pairs) == len(rows):
        for f, text in variants:
            if all(f(b, m) == got for b, m, got in pairs) and \
                    any(f(b, m) != b * heads + m for b, m, _ in pairs):
                return f"{text}; {PID_BM}"
    wrong = [(b, m, got) for b, m, got in pairs if got != b * heads + m]
    if not wrong:
        return PID_BM
    b, m, got = wrong[0]
    only = sorted({w[0] for w in wrong})
    where = (f"only batch {only[0]} is wrong, " if len(only) == 1 and batch > 1 else "")
    return (f"{where}(b, m) = ({b}, {m}) gets pid_bm {got}, and no usual mistake gives your "
            f"pid_bm on every (b, q, m) of this shape; the pair is numbered batch major, "
            f"b * M + m = {b * heads + m}, and the kernel recovers b = pid_bm // M, "
            "m = pid_bm % M")


# ---------------------------------------------------------------------- 2. corner_coordinate
FAR = (1e9, -1e9, float("inf"), float("-inf"), float("nan"))


def check_corner_coordinate(corner_coordinate, seed=None):
    """``(first, frac) = corner_coordinate(loc, size)`` for a block of locations: ordinary
    ones, negative pixel coordinates (floor, not truncation), and far ones (the clamp)."""
    gen = fresh_generator(seed)
    tag = _tag(gen, seed)
    tester = _tester("corner_coordinate", corner_coordinate)
    sizes = [4, 7, 1, 167, int(torch.randint(2, 60, (1,), generator=gen))]
    for size in sizes:
        # pixel coordinates k + f with f in [0.1, 0.9] (no rounding can cross an integer),
        # k from -2 to size: negative ones (floor, not truncation), both borders exactly
        x_im = torch.randint(-2, size + 1, (24,), generator=gen) + \
            torch.rand(24, generator=gen) * 0.8 + 0.1
        x_im[:3] = torch.tensor([-0.7, -0.3, -1.6])
        ordinary = torch.cat([torch.tensor([0.0, 1.0]), (x_im + 0.5) / size])
        loc = torch.cat([ordinary, torch.tensor(FAR)]).float()
        n = loc.numel()
        first = torch.zeros(n, dtype=torch.int64, device=op.device())
        frac = torch.zeros(n, dtype=torch.float32, device=op.device())
        what = f"corner_coordinate with size = {size} ({tag})"
        with forbid_references(tester, writes=(1, 2)):
            report = _launch(tester, (1,), what, loc.to(first.device), first, frac, n, size,
                             BLOCK=64)
        report.check(what)
        if judging():
            _judge_corner(first.cpu(), frac.cpu(), loc, size, len(ordinary), report, what)
    _passed(f"corner_coordinate: sizes {sizes}; ordinary locations, negative pixel coordinates "
            f"and +-1e9, +-inf, NaN give the right first corner (clamped to [-2, size + 1]) and "
            f"fraction ({tag})")


def _judge_corner(first, frac, loc, size, n_ordinary, report, what):
    x = loc.double()
    x_im = (loc * size - 0.5).double()                      # as float32 arithmetic gives it
    floor = torch.floor(x_im)
    want_first = floor.clamp(-2, size + 1)
    want_frac = x_im - floor
    for i in range(n_ordinary):
        got_first, got_frac = int(first[i]), float(frac[i])
        if got_first == int(want_first[i]) and abs(got_frac - float(want_frac[i])) <= 1e-5:
            continue
        where = (f"{what}: at loc = {float(x[i]):.6g} (pixel coordinate {float(x_im[i]):.6g}): "
                 f"expected (first, frac) = ({int(want_first[i])}, {float(want_frac[i]):.6g}), "
                 f"got ({got_first}, {got_frac:.6g})")
        raise AssertionError(where + "\nHint: " + _corner_hint(first[:n_ordinary],
                                                                frac[:n_ordinary],
                                                                x[:n_ordinary], size))
    for i in range(n_ordinary, loc.numel()):
        got_first = int(first[i])
        value = float(x[i])
        if -2 <= got_first <= size + 1 and (value != value or got_first == int(want_first[i])):
            continue
        casts = [e.line for e in report.casts.values() if e.line]
        where = (f"{what}: at loc = {value:g}: expected a first corner in [-2, size + 1] = "
                 f"[-2, {size + 1}]" + (f" ({int(want_first[i])})" if value == value else "")
                 + f", got {got_first}")
        if value != value and INT32_MIN <= got_first <= INT32_MAX and \
                not (-2 <= got_first <= size + 1):
            hint = ("NaN went through your clamp: tl.maximum and tl.minimum keep NaN in "
                    "Triton's interpreter (NumPy's rule; a GPU drops it), and the cast of NaN is "
                    "undefined. Clamp with comparisons, which are false for NaN: "
                    "tl.where(x0 > -2.0, x0, -2.0), then tl.where(x0 < size + 1.0, x0, size + 1.0)")
        elif 0 <= got_first <= size - 1 and value == value:
            hint = ("the corner was clamped into the map: a location far outside would then read "
                    "the edge pixel. Clamp to [-2, size + 1], which stays off the map (the masks "
                    "drop it)")
        else:
            hint = ("the float-to-int cast got a value that does not fit in int32"
                    + (f" ({casts[0]})" if casts else "") + ": NumPy turns it into -2**31 "
                    "(a location far to the right gets a corner far to the left), and for a GPU "
                    "compiler the result is undefined. Clamp the floor to [-2, size + 1] before "
                    ".to(tl.int32)")
        raise AssertionError(where + "\nHint: " + hint)


def _corner_hint(first, frac, x, size):
    from . import diagnose
    first = first.double()
    frac = frac.double()
    for hint, f in diagnose.coordinate_variants():
        x_im = f(x, size)
        fl = torch.floor(x_im)
        if torch.equal(first, fl) and bool(((frac - (x_im - fl)).abs() <= 1e-5).all()):
            return hint
    x_im = x * size - 0.5
    if torch.equal(first, torch.trunc(x_im)):
        return diagnose.TRUNCATION
    fl = torch.floor(x_im)
    if torch.equal(first, fl.clamp(0, size - 1)):
        return ("the first corner is clamped into the map, [0, size - 1]: then a location off "
                "the map reads the edge pixel. Clamp to [-2, size + 1], which stays off the map "
                "(the masks drop it)")
    if torch.equal(first, fl):
        if bool(((frac - (1 - (x_im - fl))).abs() <= 1e-5).all()):
            return ("frac is the weight of the second corner, x_im - floor(x_im); yours is "
                    "1 - that")
        return "first is right; frac must be x_im - floor(x_im), in [0, 1)"
    return ("first = floor(loc * size - 0.5), clamped to [-2, size + 1] before .to(tl.int32); "
            "frac = the pixel coordinate minus its floor")


# ---------------------------------------------------------------------- 3. offsets
def check_level_row(level_row, seed=None):
    """``level_row(start, r, c, H, W)`` = start + r * W + c on non-square levels."""
    gen = fresh_generator(seed)
    tag = _tag(gen, seed)
    tester = _tester("level_row", level_row)
    shapes = [(3, 5), (6, 2), (1, 1)]
    shapes.append(tuple(int(v) for v in torch.randint(2, 30, (2,), generator=gen)))
    for height, width in shapes:
        start = int(torch.randint(0, 5000, (1,), generator=gen))
        r = torch.randint(0, height, (24,), generator=gen, dtype=torch.int32)
        c = torch.randint(0, width, (24,), generator=gen, dtype=torch.int32)
        out = torch.zeros(24, dtype=torch.int64, device=op.device())
        what = f"level_row on a level of H = {height}, W = {width} starting at row {start} ({tag})"
        with forbid_references(tester, writes=(3,)):
            report = _launch(tester, (1,), what, torch.tensor([start], device=out.device),
                             r.to(out.device), c.to(out.device), out, 24, height, width, BLOCK=32)
        report.check(what)
        if not judging():
            continue
        out = out.cpu()
        r64, c64 = r.long(), c.long()
        expected = start + r64 * width + c64
        if torch.equal(out, expected):
            continue
        i = int((out != expected).nonzero()[0])
        variants = [(start + r64 * height + c64, "the row of pixel (r, c) is r * W + c: a row of "
                     "the map holds W pixels (its width), whatever H is"),
                    (start + c64 * width + r64, "r and c are swapped: r is the row (y), c the "
                     "column (x): start + r * W + c"),
                    (r64 * width + c64, "the level's first row is missing: start + r * W + c"),
                    (start + c64 * height + r64, "r and c are swapped, and the row length is "
                     "W: start + r * W + c")]
        hint = next((h for v, h in variants if torch.equal(out, v)), "start + r * W + c")
        raise AssertionError(f"{what}: at corner (row {int(r[i])}, col {int(c[i])}): expected "
                             f"row {int(expected[i])} of S, got {int(out[i])}; "
                             f"{int((out != expected).sum())} of 24 differ\nHint: {hint}")
    _passed(f"level_row: {len(shapes)} levels (non-square, 1 x 1) give start + r * W + c ({tag})")


def check_value_offset(value_offset, seed=None):
    """``value_offset(b, s, m, S, M, D)`` = ((b*S + s)*M + m)*D in int64, from int32 inputs,
    on small indices and on indices whose offset passes 2**31 (up to about 2**35): the test
    kernel stores the offsets, nothing reads memory there."""
    gen = fresh_generator(seed)
    tag = _tag(gen, seed)
    tester = _tester("value_offset", value_offset)
    cases = [("a small value tensor", 2, 11, 3, 5),
             ("the 800 x 1333 pyramid (S = 22223), M = 8, D = 32, B = 400", 400, 22223, 8, 32),
             ("S = 2**26 rows, M = 4, D = 64, B = 8: b * S * M alone passes 2**31", 8, 2 ** 26, 4, 64),
             ("S = 2**28 rows, B = 64: b * S alone passes 2**31", 64, 2 ** 28, 2, 16)]
    for description, batch, total, heads, channels in cases:
        n = 48
        b = torch.randint(0, batch, (n,), generator=gen, dtype=torch.int32)
        s = torch.randint(0, total, (n,), generator=gen, dtype=torch.int32)
        m = torch.randint(0, heads, (n,), generator=gen, dtype=torch.int32)
        b[0], s[0], m[0] = batch - 1, total - 1, heads - 1        # the largest offset
        out = torch.zeros(n, dtype=torch.int64, device=op.device())
        what = f"value_offset on {description} ({tag})"
        with forbid_references(tester, writes=(3,)):
            report = _launch(tester, (1,), what, b.to(out.device), s.to(out.device),
                             m.to(out.device), out, n, total, heads, channels, BLOCK=64,
                             int32=True)
        report.check(what)
        if not judging():
            continue
        out = out.cpu()
        b64, s64, m64 = b.long(), s.long(), m.long()
        expected = ((b64 * total + s64) * heads + m64) * channels
        if torch.equal(out, expected):
            continue
        i = int((out != expected).nonzero()[0])
        head = (f"{what}: at (batch {int(b[i])}, row of S {int(s[i])}, head {int(m[i])}): "
                f"expected offset {int(expected[i])}, got {int(out[i])}; "
                f"{int((out != expected).sum())} of {n} differ")
        raise AssertionError(head + "\nHint: " + _offset_hint(out, expected, b64, s64, m64, total,
                                                              heads, channels, report))
    _passed(f"value_offset: ((b*S + s)*M + m)*D in int64, exact up to "
            f"{64 * 2 ** 28 * 2 * 16:.2e} > 2**31 ({tag})")


def _wrap32(x):
    return (x + 2 ** 31) % 2 ** 32 - 2 ** 31


def _offset_hint(out, expected, b, s, m, total, heads, channels, report):
    overflow = [e for e in report.overflows.values() if e.line]
    if bool((expected > INT32_MAX).any()) and (torch.equal(out, _wrap32(expected)) or overflow):
        where = f" at {overflow[0].line} ({overflow[0].example})" if overflow else ""
        return ("the offset was computed in int32 and wrapped around past 2**31" + where +
                ": b, s, m and S, M, D arrive as int32, so cast before the first "
                "multiplication, b.to(tl.int64) * S, and every product after it is 64-bit")
    variants = [((b * heads + m) * total + s) * channels,
                (b * total + s) * heads * channels + m,
                (s * heads + m) * channels,
                ((b * total + s) * channels + m) * heads]
    texts = ["value is (B, S, M, D): the row s comes before the head m, ((b*S + s)*M + m)*D",
             "the head's offset is m * D (a head holds D channels): ((b*S + s)*M + m)*D",
             "the batch is missing: b * S * M * D elements come before batch element b",
             "channels are the last axis: ((b*S + s)*M + m)*D, not ((b*S + s)*D + m)*M"]
    for variant, text in zip(variants, texts):
        if torch.equal(out, variant) or torch.equal(out, _wrap32(variant)):
            return text
    return "((b * S + s) * M + m) * D, in int64"


# ---------------------------------------------------------------------- 4. sample_level
def check_sample_level(sample_level, seed=None):
    """The tile of one level and one point for blocks of queries of every (batch, head),
    each level of a three-level value in turn; a few locations are off the map."""
    import triton

    gen = fresh_generator(seed)
    tag = _tag(gen, seed)
    tester = _tester("sample_level", sample_level)
    channels = int(torch.randint(3, 6, (1,), generator=gen))
    shapes = [[3, 5], [4, 2], [1, 1]]
    args = op.inputs(gen, 2, 6, 2, channels, shapes, 1, outside=0.15)
    value, shapes_t, starts, loc, _ = args.values()
    batch, queries, heads = loc.shape[0], loc.shape[1], loc.shape[2]
    block_d = triton.next_power_of_2(channels)
    # location by isolation first: level 1 (4 x 2: a pixel centre is exact in float32) with
    # every location on a pixel centre (one corner, weight 1), then between centres (four
    # corners on the map), then the general case
    probe_level = 1
    size = torch.tensor([shapes[probe_level][1], shapes[probe_level][0]], dtype=torch.float64)
    centres = torch.stack([torch.randint(0, int(size[0]), loc.shape[:3], generator=gen),
                           torch.randint(0, int(size[1]), loc.shape[:3], generator=gen)], -1)
    between = 0.1 + torch.rand(*loc.shape[:3], 2, generator=gen, dtype=torch.float64) * (size - 1.2)
    runs = []
    for label, pixel, term in (
            ("every location on a pixel centre", centres.double(), SAMPLE_CENTRE_TERM),
            ("locations between pixel centres", between, SAMPLE_BETWEEN_TERM)):
        probe_loc = loc.clone()
        probe_loc[:, :, :, probe_level, 0] = ((pixel + 0.5) / size).to(loc)
        runs.append((probe_level, dict(args, sampling_locations=probe_loc), f", probe: {label}",
                     term))
    runs += [(level, args, "", None) for level in range(len(shapes))]
    for level, run_args, label, term in runs:
        height, width = shapes[level]
        level_loc = run_args["sampling_locations"][:, :, :, level, 0, :].contiguous()
        out = torch.zeros(batch, queries, heads, channels, device=value.device)
        what = (f"sample_level on level {level} ({height} x {width}) of a 3-level value, "
                f"D = {channels} channels{label} ({tag})")
        with forbid_references(tester, writes=(4,)):
            report = _launch(tester, (triton.cdiv(queries, 8), batch * heads), what, value,
                             shapes_t, starts, level_loc, out, level, value.shape[1], queries,
                             heads, channels, BLOCK_Q=8, BLOCK_D=block_d)
        report.check(what, _guard_hint(report, run_args, 8, level_only=level))
        if not judging():
            continue
        one = torch.zeros(args["attention_weights"].shape, dtype=torch.float64)
        one[:, :, :, level] = 1.0
        single = dict(run_args, attention_weights=one.to(args["attention_weights"]))
        expected = op.forward_fp64(single)
        got = out.reshape(batch, queries, heads * channels)
        message = _mismatch(got, expected, torch.float32, what, heads)
        if message is not None:
            # at a pixel centre only corner 0 weighs, and a corner moved is told apart from
            # weights exchanged only between centres
            hint = None if term == SAMPLE_CENTRE_TERM else \
                _corner_offset_hint(got, run_args, level, expected)
            hint = hint or _value_hint(got, single, expected, torch.float32, report)
            if not hint and term:
                hint = ("\nHint: no usual mistake reproduces your tile here, and what this "
                        f"probe adds is {term}")
            raise AssertionError(message + hint)
    _passed(f"sample_level: 2 probes (pixel centres, between them), then each of 3 levels "
            f"(3 x 5, 4 x 2, 1 x 1) for 2 batch elements, 2 heads, 6 queries in a block of 8, "
            f"D = {channels} ({tag})")


# the row and the column offset of corner i (0 to 3) from (y0, x0): the operator's first
ROW_OFFSETS = [("y0 + i // 2", lambda i: i // 2), ("y0 - i // 2", lambda i: -(i // 2)),
               ("y0 + i % 2", lambda i: i % 2), ("y0", lambda i: 0), ("y0 + 1", lambda i: 1)]
COL_OFFSETS = [("x0 + i % 2", lambda i: i % 2), ("x0 - i % 2", lambda i: -(i % 2)),
               ("x0 + i // 2", lambda i: i // 2), ("x0", lambda i: 0), ("x0 + 1", lambda i: 1)]


def _tile(args, level, row_of, col_of):
    """The (B, Q, M*D) tile of point 0 of ``level`` in float64, corner i read at
    (y0 + row_of(i), x0 + col_of(i)) with the weight of corner i, zero off the map."""
    value = args["value"].detach().cpu().double()
    batch, _, heads, channels = value.shape
    height, width = (int(v) for v in args["value_spatial_shapes"][level])
    start = int(args["value_level_start_index"][level])
    loc = args["sampling_locations"][:, :, :, level, 0].detach().cpu().double()   # (B, Q, M, 2)
    x_im, y_im = loc[..., 0] * width - 0.5, loc[..., 1] * height - 0.5
    x0, y0 = torch.floor(x_im), torch.floor(y_im)
    dx, dy = x_im - x0, y_im - y0
    b = torch.arange(batch).view(-1, 1, 1)
    m = torch.arange(heads).view(1, 1, -1)
    out = torch.zeros(*loc.shape[:3], channels, dtype=torch.float64)
    for i in range(4):
        r, c = (y0 + row_of(i)).long(), (x0 + col_of(i)).long()
        w = (dy if i // 2 == 1 else 1 - dy) * (dx if i % 2 == 1 else 1 - dx)
        on = (r >= 0) & (r < height) & (c >= 0) & (c < width)
        rows = (start + r.clamp(0, height - 1) * width + c.clamp(0, width - 1))
        v = value[b.expand_as(rows), rows, m.expand_as(rows)]               # (B, Q, M, D)
        out += torch.where(on[..., None], w[..., None] * v, torch.zeros_like(v))
    return out.reshape(batch, loc.shape[1], heads * channels)


def _corner_offset_hint(got, args, level, expected):
    """The hint when the tile equals the one whose corners sit at other offsets from
    (y0, x0) (each corner with its own weight): which corners are read where.  Else None."""
    got = got.detach().cpu().double()
    if got.shape != expected.shape or not bool(torch.isfinite(got).all()):
        return None
    atol = op.TOLERANCE[torch.float32] * max(expected.abs().max().item(), 1e-6)
    found = []
    for row_text, row_of in ROW_OFFSETS:
        for col_text, col_of in COL_OFFSETS:
            if (row_text, col_text) == (ROW_OFFSETS[0][0], COL_OFFSETS[0][0]):
                continue
            variant = _tile(args, level, row_of, col_of)
            if bool(((got - variant).abs() <= atol).all()):
                found.append((row_text, row_of, col_text, col_of))
    if len(found) != 1:                  # none, or not one that the inputs tell apart
        return None
    row_text, row_of, col_text, col_of = found[0]

    def at(name, offset):
        return name if offset == 0 else f"{name} {'+' if offset > 0 else '-'} {abs(offset)}"
    moved = [f"corner {i} {CORNER_NAMES[i]} at (row {at('y0', row_of(i))}, column "
             f"{at('x0', col_of(i))})" for i in range(4)
             if (row_of(i), col_of(i)) != (i // 2, i % 2)]
    return (f"\nHint: your tile is the one whose corner i is read at ({row_text}, "
            f"{col_text}), each with its own weight: that reads " + "; ".join(moved)
            + ". Corner i is (y0 + i // 2, x0 + i % 2): rows y0, y0, y0 + 1, y0 + 1 and "
            "columns x0, x0 + 1, x0, x0 + 1")


CORNER_NAMES = ("(y0, x0)", "(y0, x1)", "(y1, x0)", "(y1, x1)")


SAMPLE_CENTRE_TERM = ("the corner's row and value offset: at a pixel centre only corner "
                      "(y0, x0) has a weight (1), so the tile is that pixel's values, row "
                      "value_offset(b, level_row(start, r, c, H, W), m, S, M, D) + d")
SAMPLE_BETWEEN_TERM = ("the other three corners and the weights (the pixel centres were "
                       "right): corner i is (y0 + i // 2, x0 + i % 2), weighted (1 - dy)(1 - dx), "
                       "(1 - dy) dx, dy (1 - dx), dy dx")


# ---------------------------------------------------------------------- 5-8. the kernel
def _run(msda_forward, args, what, block_q):
    try:
        with forbid_references(msda_forward), count_kernel_launches() as launches, \
                guard.watch(poison=("out_ptr",)) as report:
            got = msda_forward(*args.values(), block_q=block_q)
    except AssertionError:
        raise
    except Exception as exc:                                        # noqa: BLE001
        raise _as_assertion(exc, f"{what}: your kernel raised {type(exc).__name__}: "
                                 f"{_last_line(exc)}" + _error_hint(exc, args)) from None
    if launches.count == 0:
        raise AssertionError(f"{what}: msda_forward launched no Triton kernel: the work has "
                             "to be done by your msda_forward_kernel")
    report.check(what, _guard_hint(report, args, block_q))
    return got, report


def _probe(msda_forward, gen, tag, label):
    """Location by isolation: the kernel on the probes of :func:`_operator.probes` (one term
    switched on at a time), before the general cases; raises at the first wrong one."""
    results = []
    probe_list = op.probes(gen, torch.float32)
    for name, _, args in probe_list:
        on_device = {k: v.to(op.device()) for k, v in args.items()}
        got, _ = _run(msda_forward, on_device, f"{label}, probe: {name} ({tag})", 8)
        results.append(got.detach().cpu() if isinstance(got, torch.Tensor) else got)
    if not judging():
        return len(probe_list)
    from . import diagnose
    found = diagnose.locate(results, probe_list, op.TOLERANCE[torch.float32])
    if found is not None:
        raise AssertionError(f"{label} ({tag}), {found[1]}")
    return len(probe_list)


def _check(msda_forward, cases, seed, label, isolate=False):
    gen = fresh_generator(seed)
    tag = _tag(gen, seed)
    done = []
    if isolate:
        done.append(f"{_probe(msda_forward, gen, tag, label)} probes, one term at a time")
    for description, kwargs, block_q, edit in cases(gen):
        args = op.inputs(gen, **kwargs)
        if edit is not None:
            edit(args, gen)
        dtype = args["value"].dtype
        what = f"{label}, {description} ({tag})"
        got, report = _run(msda_forward, args, what, block_q)
        done.append(description)
        if not judging():
            continue
        if isinstance(got, torch.Tensor) and got.dtype != dtype:
            raise AssertionError(f"{what}: the output must have the dtype of value, {dtype}, "
                                 f"got {got.dtype}")
        expected = op.forward_fp64(args)
        message = _mismatch(got, expected, dtype, what, args["value"].shape[2])
        if message is not None:
            raise AssertionError(message + _value_hint(got, args, expected, dtype, report))
        casts = report.unclamped_casts()
        if casts:
            raise AssertionError(
                f"{what}: the values are right, but a location far outside reached the "
                f"float-to-int cast unclamped ({casts[0].line}: {casts[0].example}): the cast "
                "of a value that does not fit in int32 is undefined (NumPy gives -2**31, a GPU "
                "compiler may give anything)\nHint: build the kernel on your corner_coordinate, "
                "which clamps to [-2, W + 1] before .to(tl.int32)")
    _passed(f"{label}: " + "; ".join(done) + f" match the fp64 reference ({tag})")


def check_forward_inside(msda_forward, msda_forward_kernel=None, seed=None):
    """All levels and points, several heads, batch 2, locations inside the maps; more
    queries than one block holds; then, given the kernel, its rows past 2**31 elements
    (:func:`check_forward_int64`)."""
    def cases(gen):
        yield ("one level, one head, one point", dict(
            batch=1, queries=6, heads=1, channels=4, shapes=[[4, 5]], points=1,
            outside=-0.12), 8, None)
        yield ("2 levels, 2 points, batch 2, 12 queries in blocks of 8", dict(
            batch=2, queries=12, heads=1, channels=4, shapes=[[5, 7], [3, 4]], points=2,
            outside=-0.05), 8, None)
    _check(msda_forward, cases, seed, "msda_forward inside the maps", isolate=True)
    if msda_forward_kernel is not None:
        check_forward_int64(msda_forward_kernel, seed)


def _edges(args, gen):
    """Locations exactly on the borders, just off them, half a map outside and +-1e9."""
    loc = args["sampling_locations"]
    edges = torch.tensor([0.0, 1.0, 0.5, -0.25, 1.25, -1e9, 1e9, 1.0 + 1e-6, -1e-6, -0.5, 1.5])
    pick = torch.randint(0, len(edges), loc.shape, generator=gen)
    args["sampling_locations"] = edges[pick].to(loc)


def check_forward_outside(msda_forward, seed=None):
    """The masks at the map's edges: locations up to 30% outside, on the borders, far away
    (+-1e9), non-square and 1x1 levels."""
    def cases(gen):
        yield ("locations up to 30% outside the maps", dict(
            batch=1, queries=12, heads=1, channels=4, shapes=[[4, 6], [2, 3]], points=3,
            outside=0.3), 16, None)
        yield ("locations on the borders, just off them and at +-1e9", dict(
            batch=1, queries=8, heads=1, channels=4, shapes=[[3, 5], [2, 2]], points=2), 8,
            _edges)
        yield ("levels (2, 7), (1, 1), (5, 1), (3, 3)", dict(
            batch=1, queries=9, heads=1, channels=4, shapes=[[2, 7], [1, 1], [5, 1], [3, 3]],
            points=2, outside=0.1), 16, None)
    _check(msda_forward, cases, seed, "msda_forward at the map's edges")


def check_forward_channels(msda_forward, seed=None):
    """The masks at the tile's edges: D not a power of two (BLOCK_D > D), heads side by side
    in the output, Q not a multiple of BLOCK_Q."""
    def cases(gen):
        yield ("D = 3 channels, 3 heads, Q = 5 in blocks of 4", dict(
            batch=1, queries=5, heads=3, channels=3, shapes=[[4, 3]], points=2), 4, None)
        yield ("D = 7 channels, 2 heads, batch 2, Q = 7 in blocks of 4", dict(
            batch=2, queries=7, heads=2, channels=7, shapes=[[3, 5]], points=1), 4, None)
    _check(msda_forward, cases, seed, "msda_forward at the tile's edges")


def check_forward_half_precision(msda_forward, seed=None):
    """fp16 and bf16 inputs (fp32 inside, the output in the input's dtype), fp64 (fp64
    inside, for gradcheck)."""
    def cases(gen):
        for dtype in (torch.float16, torch.bfloat16, torch.float64):
            yield (f"{str(dtype).replace('torch.', '')} inputs", dict(
                batch=1, queries=8, heads=1, channels=8, shapes=[[4, 5], [2, 2]], points=2,
                dtype=dtype), 8, None)
    _check(msda_forward, cases, seed, "msda_forward in half and double precision")


# ---------------------------------------------------------------------- 9. int64 rows
UNTOUCHED = 1234.5          # what out holds where no program may write
INT64_CASES = [
    # (what it makes wrap, M, Q): with B = 2, D = 8 and BLOCK_Q = 8, the programs of batch 1
    # own output rows (Q + q) * M + m, whose element offsets pass 2**32 by a little: in int32
    # they wrap around onto rows 32 and up of a small out, which nobody else writes
    ("(b*Q + q)*M + m fits in int32, its offset times D does not", 1, 2 ** 29 + 16),
    ("the row (b*Q + q)*M + m itself passes 2**31", 4, 2 ** 30 + 16),
]


def check_forward_int64(msda_forward_kernel, seed=None):
    """The kernel's own indices in int64 (section 5: the row ``(b*Q + q)*M + m`` and every
    offset built on it): launched by the check on a grid of one block of queries per (batch,
    head), with B = 2 and a ``Q`` so large that batch 1's rows lie past 2**31 elements.  Its
    accesses there fall outside every tensor (the interpreter's guard switches them off); a
    kernel whose index wraps around in int32 writes into rows of ``out`` that no program owns
    instead, and the check sees it there.  Interpreter only: compiled, the same launch would
    touch memory far past the tensors."""

    gen = fresh_generator(seed)
    tag = _tag(gen, seed)
    if not guard.interpreting():
        _passed("msda_forward_kernel in int64: checked under the interpreter only (TRITON_INTERPRET=1)")
        return
    batch, channels, block_q = 2, 8, 8
    for description, heads, queries in INT64_CASES:
        shapes = torch.tensor([[2, 2]], dtype=torch.int64)
        starts = torch.tensor([0], dtype=torch.int64)
        value = torch.randn(batch, 4, heads, channels, generator=gen)
        # locations and weights of batch 0's first block of queries only: batch 1's lie past
        # the end of these tensors, as its rows lie past the end of out
        loc = torch.rand(block_q * heads * 2, generator=gen) * 0.8 + 0.1
        attn = torch.rand(block_q * heads, generator=gen)
        rows = 32 + heads * block_q * 2
        out = torch.full((rows * channels,), UNTOUCHED)
        what = (f"msda_forward_kernel with B = {batch}, Q = {queries}, M = {heads}, D = "
                f"{channels}, one block of {block_q} queries per (batch, head): {description} "
                f"({tag})")
        device = op.device()
        tensors = [t.to(device) for t in (value, shapes, starts, loc, attn, out)]
        try:
            with forbid_references(msda_forward_kernel, writes=(5,)), \
                    guard.watch(int32=True) as report:
                msda_forward_kernel[(1, batch * heads)](
                    *tensors, 4, queries, heads, channels, L=1, K=1, BLOCK_Q=block_q,
                    BLOCK_D=channels, ACC_DTYPE=tl_float32())
        except AssertionError:
            raise
        except Exception as exc:                                    # noqa: BLE001
            raise _as_assertion(exc, f"{what}: your kernel raised {type(exc).__name__}: "
                                     f"{_last_line(exc)}") from None
        if not judging():
            continue
        got = tensors[5].detach().cpu().reshape(rows, channels)
        owned = block_q * heads                     # rows of batch 0's first block of queries
        stray = (got[owned:] != UNTOUCHED).any(-1).nonzero().flatten()
        if stray.numel() == 0:
            continue
        first, last = int(stray[0]) + owned, int(stray[-1]) + owned
        overflow = [e for e in report.overflows.values() if e.line]
        where = f" ({overflow[0].line}: {overflow[0].example})" if overflow else ""
        raise AssertionError(
            f"{what}: rows {first} to {last} of out were written, which no program owns: batch "
            f"1's rows start at (1*Q + 0)*M = {queries * heads}, offset {queries * heads * channels} "
            f"> 2**31, and an index computed in int32 wrapped around onto them{where}\nHint: "
            "tl.program_id gives int32, and Q, M, D arrive as int32: make the row int64 before "
            "the first multiplication, row_bqm = (b.to(tl.int64) * Q + offs_q) * M + m, and "
            "build every offset (the locations', the weights', the output's) on it")
    _passed(f"msda_forward_kernel: rows past 2**31 elements stay in int64, {len(INT64_CASES)} "
            f"shapes ({tag})")


def tl_float32():
    import triton.language as tl
    return tl.float32


# ---------------------------------------------------------------------- diagnosis
def _guard_hint(report, args, block_q, level_only=None):
    """Which query, head and corner the first access outside belongs to, and the mask (the
    corner named only where the diagnosis is at hand: not in the grading kernel)."""
    v = report.first
    if v is None:
        return None
    value, shapes, starts, loc, _ = args.values()
    batch, heads, channels = value.shape[0], value.shape[2], value.shape[3]
    queries = loc.shape[1]
    known = v.program is not None and v.lane is not None and len(v.lane) >= 1
    if known:
        q = v.program[0] * block_q + v.lane[0]
        b, m = divmod(v.program[1], heads)
        d = v.lane[1] if len(v.lane) > 1 else 0
        real = q < queries and d < channels and (v.kind != "write" or len(v.lane) > 1)
    if known and real and ("value" not in v.tensor or v.kind == "write"):
        # a lane the masks keep (a query that exists, a channel below D) went outside: the
        # index is wrong, not the mask
        named = _index_hint(v, args, block_q, q, d)
        if named is not None:
            return (f"the lane that went outside belongs to query {q} < Q = {queries}"
                    + (f", channel {d} < D = {channels}" if v.kind == "write" else "")
                    + f", which exists: the mask is right and the index is wrong. {named}")
        return (f"the lane that went outside belongs to query {q} < Q = {queries}"
                + (f", channel {d} < D = {channels}" if v.kind == "write" else "")
                + f", which exists: the mask is right and the index is wrong. Program "
                f"(pid_q, pid_bm) = {tuple(v.program[:2])} computes batch b = pid_bm // M = {b}, "
                f"head m = pid_bm % M = {m} (B = {batch}, M = {heads}); with those, the "
                f"{'output' if v.kind == 'write' else 'location / weight'} index of "
                "(b, q, m) stays inside the tensor: check how b and m come from pid_bm and each "
                "term of the index")
    if v.kind == "write":
        return ("the store of the output tile goes outside out: mask it with "
                "mask_q[:, None] & mask_d[None, :] (the last block of queries and the channels "
                "past D stick out)")
    if "value" not in v.tensor:
        return (f"{v.tensor} is read outside: mask its loads with mask_q (the last block of "
                "queries sticks out)")
    text = ("a corner off the map was read: mask every corner unless 0 <= r < H and "
            "0 <= c < W, in the load itself, with other=0.0")
    if not known:
        return text
    if q >= queries:
        return ("a query past Q was read: the gathers of the last block of queries need "
                "mask_q in their mask")
    try:
        from . import diagnose
    except ImportError:                 # the grading kernel's view holds no diagnosis
        return text
    shape_list = shapes.tolist()
    levels = [level_only] if level_only is not None else range(len(shape_list))
    offending = []
    row_of_s = (v.offset // value.shape[3] - m) // heads - b * value.shape[1]
    starts_list = starts.tolist()
    swapped_stride = False
    for lvl in levels:
        height, width = shape_list[lvl]
        for k in range(loc.shape[4]):
            x, y = (float(t) for t in loc[b, q, m, lvl, k].tolist())
            for name, row, col, inside in diagnose.corners_of(x, y, height, width):
                if not inside:
                    offending.append((lvl, k, x, y, name, row, col, height, width))
                elif height != width and starts_list[lvl] + row * height + col == row_of_s \
                        and row * height + col >= height * width:
                    swapped_stride = True       # an on-map corner read at r * H + c
    if swapped_stride:
        return (f"batch {b}, query {q}, head {m}: the element read is the row start + r * H + c "
                f"of a corner on the map: {diagnose.ROW_STRIDE_H}")
    index_text = (f"batch {b}, query {q}, head {m}: every corner of this query lies on the "
                  "map, so the row of S computed for one of them is wrong, not the mask: a "
                  "corner (r, c) of level l is row start + r * W + c of S with start = "
                  "level_start_index[l], and its values start at ((b*S + row)*M + m)*D")
    if not offending:
        return index_text
    # the corner whose row of S the read hit (if the kernel computed it the usual way)
    hit = [o for o in offending if starts_list[o[0]] + o[5] * o[8] + o[6] == row_of_s]
    if not hit:
        nearest = ""
        on_map = [(abs(row_of_s - (starts_list[lvl] + r * w + c)), lvl, k, name,
                   starts_list[lvl] + r * w + c)
                  for lvl in levels for k in range(loc.shape[4])
                  for (h, w) in [shape_list[lvl]]
                  for name, r, c, inside in diagnose.corners_of(
                      *(float(t) for t in loc[b, q, m, lvl, k].tolist()), h, w) if inside]
        if on_map:
            _, lvl, k, name, right = min(on_map)
            nearest = (f"; the row read, {row_of_s} of S, is {row_of_s - right:+d} from the row "
                       f"of level {lvl}, point {k}, corner {name}, which is {right} (start + "
                       "r * W + c with start = level_start_index[l])")
        return (f"batch {b}, query {q}, head {m}: {len(offending)} corner(s) of this query lie "
                "off the map, but the element that was read is none of theirs (computed as "
                f"((b*S + start + r*W + c)*M + m)*D){nearest}: check the row of each corner, "
                "and mask every corner unless 0 <= r < H and 0 <= c < W, with other=0.0")
    lvl, k, x, y, name, row, col, height, width = hit[0]
    return (f"batch {b}, query {q}, head {m}: level {lvl}, point {k} at (x, y) = ({x:.4g}, "
            f"{y:.4g}) has corner {name} at (row {row}, col {col}), off the {height} x {width} "
            f"map ({len(offending)} corner(s) of this query are off): "
            f"{diagnose.bound_hint(row, col, height, width)}; {text}")


def _index_hint(v, args, block_q, q, d):
    """The usual mistake of the row index (b*Q + q)*M + m, or of recovering b and m from
    pid_bm, that puts the first lane outside exactly where the guard saw it (``v``: its
    tensor and element): a sentence naming it, or None when none or more than one does."""
    value, _, _, loc, _ = args.values()
    heads, channels = value.shape[2], value.shape[3]
    queries, levels, points = loc.shape[1], loc.shape[3], loc.shape[4]
    pid_bm = v.program[1]
    right = divmod(pid_bm, heads)
    decodes = [(right, None)]
    if (pid_bm % heads, pid_bm // heads) != right:
        decodes.append(((pid_bm % heads, pid_bm // heads),
                        f"your b and m are recovered the wrong way round: program pid_bm = {pid_bm} "
                        f"gives b = pid_bm % M = {pid_bm % heads}, m = pid_bm // M = "
                        f"{pid_bm // heads}; b = pid_bm // M, m = pid_bm % M"))
    rows = [(lambda b, m: (b * queries + q) * heads + m, None),
            (lambda b, m: (queries + q) * heads + m,
             "your row is (Q + q) * M + m: the batch term b * Q lost its factor b; the row of "
             "(b, q, m) is (b*Q + q)*M + m"),
            (lambda b, m: (b + q) * heads + m,
             "your row is (b + q) * M + m: the batch term lost its factor Q; the row of "
             "(b, q, m) is (b*Q + q)*M + m"),
            (lambda b, m: b * queries + q + m,
             "your row is b*Q + q + m: the factor M is missing; the row of (b, q, m) is "
             "(b*Q + q)*M + m"),
            (lambda b, m: (b * heads + m) * queries + q,
             "your row is (b*M + m)*Q + q, heads before queries; the tensors are (B, Q, M, ...), "
             "so the row of (b, q, m) is (b*Q + q)*M + m")]

    def elements(row):
        if v.kind == "write":
            return {row * channels + d}
        per = levels * points
        samples = {row * per + j for j in range(per)}
        if "loc" in v.tensor:
            return {2 * p + e for p in samples for e in (0, 1)}
        return samples
    found = []
    for (b, m), decode_text in decodes:
        for f, row_text in rows:
            if decode_text is None and row_text is None:
                continue                                  # the operator's own index
            if v.offset in elements(f(b, m)):
                found.append("; and ".join(t for t in (decode_text, row_text) if t))
    if len(found) != 1:
        return None
    return found[0][0].upper() + found[0][1:]


def _mismatch(got, expected, dtype, what, heads):
    """The mismatch of two (B, Q, M*D) outputs, axes batch, query, head, channel, with the
    tolerance scaled to the largest |expected| (as the operator's tests)."""
    from . import diagnose
    scale = max(expected.abs().max().item(), 1e-6) if expected.numel() else 1.0
    return diagnose.output_mismatch(got, expected, op.TOLERANCE[dtype] * scale, what, heads)


def _value_hint(got, args, expected, dtype, report):
    from . import diagnose
    got = got.detach().cpu()
    if got.shape != expected.shape:
        return f"\nHint: the output is (B, Q, M*D) = {tuple(expected.shape)}"
    if torch.isnan(got).any() and report.loads_without_other:
        line = next(iter(report.loads_without_other.values())).line
        return ("\nHint: a masked tl.load without other= leaves its masked lanes undefined (the "
                f"check fills them with NaN) and they reach the output: give other=0.0 at {line}")
    never = diagnose.unwritten(got, args["value"].shape[2])
    if never is not None and not bool(torch.isnan(expected).any()):
        return ("\nHint: " + never + ": the program that owns a row computes b = pid_bm // M, "
                "m = pid_bm % M and the queries pid_q * BLOCK_Q + i, and stores at row "
                "(b*Q + q)*M + m; a row nobody stores to keeps the check's NaN")
    if dtype in (torch.float16, torch.bfloat16, torch.float64):
        half = _half_hint(got, args, expected, dtype)
        if half:
            return "\nHint: " + half
    spill = _spill_hint(got, expected, args)
    if spill:
        return "\nHint: " + spill
    scale = max(expected.abs().max().item(), 1e-6)
    atol = op.TOLERANCE[dtype] * scale
    hint = diagnose.output_hint(got.double(), args, atol, diagnose.worst_index(got, expected),
                                watched=guard.interpreting())
    if hint is None and dtype == torch.float32:
        hint = diagnose.precision_hint(got, expected)
    if hint is None:
        hint = diagnose.factor_hint(got, expected, atol)
    return f"\nHint: {hint}" if hint else ""

    scale = max(expected.abs().max().item(), 1e-6)
    err = (got - expected).abs().max().item() / scale
    for name, bits in (("float16", 11), ("bfloat16", 8)):
        if err <= 8 * 2.0 ** -bits and err > 8 * 2.0 ** -(bits + 6):
            return (f"every element is within a few {name} roundings of the reference "
                    f"(largest error {err:.1e} of the largest value) on float32 inputs: "
                    f"something is computed or accumulated in {name}; keep the accumulator "
                    "and every loaded value in ACC_DTYPE (float32) and convert only in the "
                    "store")
    return None


def _spill_hint(got, expected, args):
    """Zeros exactly where a neighbour's store spilled: channels past D written by an
    unmasked store land on the next head's (or query's) first channels."""
    channels = args["value"].shape[3]
    bad = ((got.double() - expected).abs() > 1e-3 * max(expected.abs().max().item(), 1e-6))
    if not bad.any():
        return None
    d = bad.nonzero()[:, 2] % channels
    if bool((got[bad] == 0).all()) and int(d.max()) < channels:
        import triton
        spill = triton.next_power_of_2(channels) - channels
        if spill and int(d.max()) < spill:
            return (f"these elements were overwritten with zeros: the tile has "
                    f"BLOCK_D = {triton.next_power_of_2(channels)} columns for D = {channels} "
                    f"channels, and an unmasked store writes the extra {spill} into the next "
                    "head's (or query's) first channels: mask the store with mask_d")
    return None


def _half_hint(got, args, expected, dtype):
    """fp16 / bf16 / fp64: an error of the size the wrong arithmetic precision makes."""
    scale = max(expected.abs().max().item(), 1e-6)
    err = (got.double() - expected).abs().max().item() / scale
    if not torch.isfinite(got).all():
        return None
    if dtype == torch.float64 and err < 1e-5:
        return ("an error of float32's size on float64 inputs: compute in ACC_DTYPE (the "
                "launcher passes tl.float64 for float64 inputs), not in a hard-coded tl.float32")
    if dtype in (torch.float16, torch.bfloat16) and err < 20 * op.TOLERANCE[dtype]:
        return ("the error is of the size low-precision arithmetic makes: convert every "
                "loaded value, location and weight to ACC_DTYPE (float32) right after its load, "
                "compute and accumulate in float32, and convert only in the store "
                "(acc.to(out_ptr.dtype.element_ty)); Triton's interpreter computes wrongly on "
                "bf16 values, and fp16 sums lose digits")
    return None
