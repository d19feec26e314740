"""Checks of lab 04 (hello Triton), visible and hidden alike.

Each check takes the stage's kernel and its host wrapper.  It first launches the kernel itself
on the check's inputs through :mod:`guard` (padded copies; under the interpreter every access
is checked), so that a read or write outside a tensor is reported with its kernel line and the
mask hint instead of crashing the notebook; then it calls the wrapper (watched the same way),
demands that it launched a Triton kernel, and compares with torch.  A visible check passes a
shown ``seed``; a hidden check draws a fresh one.  Expected values and the diagnosis exist only
when the check judges (``common.expect``), never inside the grading kernel.
"""
from __future__ import annotations

import contextlib

import torch

from . import guard
from .guard import guarded  # noqa: F401  (the notebook's demo cells: check.guarded(...))
from .common import count_kernel_launches, expect, forbid_references, fresh_generator, \
    judging, kernel_device

MASK_HINT = "mask = offs < n on the loads and on the store: the last block sticks out past n"
# the kernels' output parameters: filled with NaN before a launch, so that an element no
# program wrote reads NaN (not what torch.empty left there)
OUTPUTS = ("out_ptr", "dst_ptr")


def _innermost(exc):
    """The exception the student's line raised (Triton's interpreter wraps it in its own)."""
    seen = set()
    while exc.__cause__ is not None and id(exc) not in seen:
        seen.add(id(exc))
        exc = exc.__cause__
    return exc


def error_hint(text):
    """What an error of Triton's interpreter (its message ``text``) means, in the lab's words."""
    if "arange's range must be a power of 2" in text:
        return ("tl.arange(start, end) needs end - start to be a power of 2 (a block size): "
                "tl.arange(0, BLOCK), shifted by pid * BLOCK afterwards")
    if "Expected pointer argument to have shape" in text:
        return ("a tl.load or tl.store got a block of pointers of another shape than its mask "
                "or value: every block of one access has the tile's shape, (BLOCK_R, BLOCK_C) "
                "for a 2-D tile, which x[:, None] (a column) and y[None, :] (a row) broadcast to")
    if "Unsupported ptr type" in text:
        return ("the first argument of tl.store (and of tl.load) is the block of pointers, "
                "ptr + offsets: tl.store(pointers, values, mask=mask)")
    if "make_shape_compatible" in text or "incompatible dimensions" in text:
        return ("two blocks whose shapes do not broadcast are combined: a column x[:, None] "
                "and a row y[None, :] broadcast to a tile, two blocks of different lengths "
                "along the same axis do not")
    if "is not defined" in text:
        return ("a name is used before any line assigns it (a line missing, or a misspelt "
                "name); inside a kernel only its arguments, tl and the names it assigns exist")
    return "the kernel stopped at that line: check the shapes and dtypes of what it combines"


@contextlib.contextmanager
def _raising(what):
    """An exception of the student's kernel or wrapper inside the block becomes the check's
    failure, in its words (an AssertionError of a reference called goes through as it is)."""
    try:
        yield
    except AssertionError:
        raise
    except Exception as exc:                                        # noqa: BLE001
        from .demo import unwritten, where
        if unwritten(exc):
            raise AssertionError(f"{what}: a function or kernel of this step is not written "
                                 f"yet (it raises NotImplementedError{where(exc)})") from None
        inner = _innermost(exc)
        seen, wrapped = set(), exc
        while wrapped is not None and id(wrapped) not in seen:        # a reference called
            seen.add(id(wrapped))
            if isinstance(wrapped, AssertionError):
                raise wrapped from None
            wrapped = wrapped.__cause__ or wrapped.__context__
        lines = [line for line in str(inner).strip().splitlines() if line.strip()]
        text = lines[-1] if lines else ""
        raise AssertionError(f"{what}: your code raised {type(inner).__name__}{where(exc)}: "
                             f"{text}\nHint: {error_hint(text)}") from None


def _tag(gen, seed):
    return f"seed {seed}" if seed is not None else f"hidden check, seed {gen.initial_seed()}"


def _on_device(*tensors):
    device = kernel_device()
    return [t.to(device) for t in tensors]


def _wrapper(fn, *args, what=None):
    """Call the student's wrapper with every kernel access checked; demand a launch.  (A
    recorded session of its own: while the grading kernel records, a kernel passed to the
    same session would be launched past the launch counter.)"""
    with _raising(what or fn.__name__), forbid_references(fn), \
            count_kernel_launches() as launches, guard.watch(poison=OUTPUTS) as report:
        got = fn(*args)
    if launches.count == 0:
        raise AssertionError(f"{fn.__name__} launched no Triton kernel: the work has to be "
                             "done by your @triton.jit kernel, not by torch")
    return got, report


def _mismatch(got, expected, what, axes, atol=0.0, rtol=0.0):
    from source_kernels.testing import explain_mismatch
    if not isinstance(got, torch.Tensor):
        return f"{what}: expected a torch.Tensor, got {type(got).__name__}"
    return explain_mismatch(got.detach().cpu(), expected, atol=atol, rtol=rtol, axes=axes,
                            what=what)


def _no_other_hint(report):
    """A sentence naming the loads without other= when NaN reached an output."""
    lines = [e.line for e in report.loads_without_other.values() if e.line]
    if not lines:
        return None
    return ("a masked tl.load without other= leaves its masked lanes undefined (on a GPU "
            "they hold whatever the register held; the check fills them with NaN), and "
            f"those lanes reach your output: give other=0.0 at {lines[0]}")


def _mask_hint(report, n_name="n", offs="offs"):
    """The mask hint for the guard's first violation."""
    v = report.first
    reads = any(x.kind == "read" for x in report.violations)
    writes = any(x.kind == "write" for x in report.violations)
    if v is not None and v.offset == v.numel and v.lanes == 1:
        return (f"exactly one lane reaches element {v.numel}, one past the end: the mask must "
                f"be {offs} < {n_name}, not {offs} <= {n_name}")
    if reads and not writes:
        return (f"the loads are not masked (or not by {offs} < {n_name}): mask them too, "
                f"tl.load(ptr + {offs}, mask=mask); masking only the store does not stop a read")
    if writes and not reads:
        return f"the store is not masked: tl.store(ptr + {offs}, value, mask=mask)"
    return MASK_HINT


# ---------------------------------------------------------------------- 1. vector add
def check_vector_add(add_kernel, vector_add, seed=None):
    """``add_kernel`` on the check's own grid, then ``vector_add`` against ``x + y``, for
    sizes that are not a multiple of the block, smaller than one block, and exactly one."""
    import triton

    gen = fresh_generator(seed)
    tag = _tag(gen, seed)
    sizes = [1, 128, 1000] + [int(v) for v in torch.randint(2, 700, (2,), generator=gen)]
    for n in sizes:
        x, y = _on_device(torch.randn(n, generator=gen), torch.randn(n, generator=gen))
        what = f"vector_add, {n} elements ({tag})"
        kernel_what = f"add_kernel on {n} elements in blocks of 128, grid ({triton.cdiv(n, 128)},) ({tag})"
        with _raising(kernel_what), forbid_references(add_kernel, writes=(2,)):
            report = guard.launch(add_kernel, (triton.cdiv(n, 128),), x, y,
                                  torch.full_like(x, float("nan")), n, BLOCK=128)
        report.check(kernel_what, _mask_hint(report))
        kernel_got = report.args[2].detach().clone() if len(report.args) > 2 else None
        got, watched = _wrapper(vector_add, x, y, what=what)
        watched.check(what, _mask_hint(watched))
        expected = expect(torch.add, x.cpu(), y.cpu())
        if expected is None:
            continue
        # the kernel alone, on the check's grid, first: a mistake there is the kernel's
        if isinstance(kernel_got, torch.Tensor):
            message = _mismatch(kernel_got, expected, kernel_what, ("element",))
            if message is not None:
                raise AssertionError(message + _kernel_hint(kernel_got, expected, x, y, 128))
        message = _mismatch(got, expected, what, ("element",))
        if message is not None:
            raise AssertionError(message + _vector_hint(got, expected, x, y))
    if judging():
        from . import diagnose
        diagnose.passed(f"add_kernel and vector_add: {len(sizes)} sizes ({', '.join(map(str, sizes))}) "
                        f"match x + y, no access outside the tensors ({tag})")


def _unwritten_suffix(got, expected):
    """s when elements s.. n - 1 of ``got`` were never written (NaN: the check filled the
    output before the launch) and 0 .. s - 1 are right; else None."""
    nan = torch.isnan(got)
    if not bool(nan.any()) or bool(torch.isnan(expected).any()):
        return None
    first = int(nan.nonzero()[0])
    if not bool(nan[first:].all()) or not torch.equal(got[:first], expected[:first]):
        return None
    return first


def _kernel_hint(got, expected, x, y, block):
    """The kernel ran on the check's grid, cdiv(n, block) programs: what its output says."""
    got = got.detach().cpu()
    n = got.numel()
    first = _unwritten_suffix(got, expected)
    if first == block and n > block:
        return (f"\nHint: with {-(-n // block)} programs of BLOCK = {block}, only elements 0 to "
                f"{block - 1} were written (the others still hold the NaN the check filled the "
                "output with): every program computed the first block. The offsets must come "
                "from tl.program_id(0): a 1-D grid has only axis 0, and tl.program_id(1) is 0 in "
                "every program")
    if first is not None:
        return (f"\nHint: on the check's grid ({-(-n // block)} programs of {block}) elements "
                f"{first} to {n - 1} were never written (they still hold the NaN the check "
                "filled the output with): offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)")
    if torch.equal(got, x.cpu()) or torch.equal(got, y.cpu()):
        return "\nHint: the output is one of the inputs: store x + y"
    return ("\nHint: this is your kernel alone, launched by the check on its own grid: "
            "out[i] = x[i] + y[i] for offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)")


def _vector_hint(got, expected, x, y):
    """The kernel was right on the check's grid, so a wrong result is the wrapper's."""
    got = got.detach().cpu()
    if got.shape != expected.shape:
        return "\nHint: the output has the shape of x: torch.empty_like(x)"
    first = _unwritten_suffix(got, expected)
    if first is not None:
        written = f"elements 0 to {first - 1} are right, " if first else ""
        return (f"\nHint: your kernel is right on the check's grid of triton.cdiv(n, 128) "
                f"programs, and through your wrapper {written}elements {first} to "
                f"{len(got) - 1} were never written (they still hold the NaN the check filled "
                "the output with): the wrapper's grid has too few programs for the last, "
                "partial block; launch triton.cdiv(n, BLOCK) of them")
    if torch.equal(got, x.cpu()) or torch.equal(got, y.cpu()):
        return "\nHint: the output is one of the inputs: store x + y"
    return ("\nHint: your kernel is right on the check's own grid, so the wrapper differs: "
            "its output tensor, its grid or the arguments it passes")


# ---------------------------------------------------------------------- 2. 2-D copy
def check_copy_2d(copy_tile_kernel, copy_2d, seed=None):
    """``copy_tile_kernel`` and ``copy_2d`` on views of a tensor whose every element holds
    its own offset, so a wrong value says where it was read from."""
    import triton

    gen = fresh_generator(seed)
    tag = _tag(gen, seed)
    rows, cols = (int(v) for v in torch.randint(17, 40, (2,), generator=gen))
    base, = _on_device(torch.arange(rows * cols, dtype=torch.float32).reshape(rows, cols))
    step = int(torch.randint(2, 4, (1,), generator=gen))
    views = [(f"a contiguous ({rows}, {cols})", base), (f"a transposed ({cols}, {rows})", base.t()),
             (f"the slice [1::2, ::{step}]", base[1::2, ::step]),
             ("a single row [5:6, 3:]", base[5:6, 3:])]
    for name, src in views:
        what = f"copy_2d of {name} tensor, strides {tuple(src.stride())} ({tag})"
        r, c = src.shape
        # NaN: an element no lane wrote is told apart from one the kernel copied
        dst = torch.full((r, c), float("nan"), dtype=src.dtype, device=src.device)
        with _raising(f"copy_tile_kernel on {name} tensor ({tag})"), \
                forbid_references(copy_tile_kernel, writes=(1,)), guard.watch() as report:
            copy_tile_kernel[(triton.cdiv(r, 16), triton.cdiv(c, 16))](
                src, dst, r, c, src.stride(0), src.stride(1), dst.stride(0), dst.stride(1),
                BLOCK_R=16, BLOCK_C=16)
        report.check(f"copy_tile_kernel on {name} tensor ({tag})",
                     _tile_mask_hint(report, dst, 16, 16))
        got, watched = _wrapper(copy_2d, src, what=what)
        watched.check(what, "mask every access of the tile by its rows and its columns")
        expected = expect(lambda t: t.detach().cpu().contiguous(), src)
        if expected is None:
            continue
        if isinstance(got, torch.Tensor) and (tuple(got.shape) != tuple(src.shape)
                                              or not got.is_contiguous()):
            raise AssertionError(f"{what}: expected a contiguous tensor of shape "
                                 f"{tuple(src.shape)}, got shape {tuple(got.shape)}, "
                                 f"contiguous={got.is_contiguous()}")
        message = _mismatch(got, expected, what, ("row", "column"))
        if message is not None:
            raise AssertionError(message + _copy_hint(got, src))
    if judging():
        from . import diagnose
        diagnose.passed(f"copy_tile_kernel and copy_2d: {len(views)} views (contiguous, "
                        f"transposed, strided slice, one row) copied exactly ({tag})")


TILE_MASK = ("mask = (offs_r < rows)[:, None] & (offs_c < cols)[None, :] on the load and the "
             "store")


def _tile_mask_hint(report, dst, block_r, block_c):
    """Which test of the tile's mask let the first lane outside through, from where that lane
    is and from what the launch left unwritten inside ``dst`` (filled with NaN before)."""
    v = report.first
    if v is None:
        return None
    rows, cols = dst.shape
    if v.program is None or v.lane is None or len(v.lane) != 2 or len(v.program) < 2:
        return f"{TILE_MASK}: a tile of {block_r} x {block_c} sticks out of the tensor"
    r = v.program[0] * block_r + v.lane[0]
    c = v.program[1] * block_c + v.lane[1]
    lane = f"the first lane outside is (row {r}, column {c}) of the ({rows}, {cols}) tensor"
    missed = torch.isnan(dst.detach().cpu())
    if bool(missed.any()):
        mr, mc = (int(i) for i in missed.nonzero()[0])
        return (f"{lane}, and {int(missed.sum())} element(s) inside were never written (the "
                f"first: row {mr}, column {mc}): your mask lets lanes outside through and "
                f"switches lanes inside off, so it is not (row inside) & (column inside) of "
                f"each lane; {TILE_MASK}")
    if r < rows and c >= cols:
        test = "its row is inside and its column is past the last: the column test"
    elif r >= rows and c < cols:
        test = "its column is inside and its row is past the last: the row test"
    else:
        test = "its row and its column are past the last: the row and the column tests"
    return (f"{lane}: {test} of your mask let it through ((offs_c < cols)[None, :] for the "
            f"columns, (offs_r < rows)[:, None] for the rows; not <=, and not left out); "
            f"{TILE_MASK}")


def _copy_hint(got, src):
    """The element values are offsets in the base tensor: say where the wrong one was read."""
    got = got.detach().cpu()
    expected = src.detach().cpu().contiguous()
    bad = (got != expected).nonzero()
    r, c = (int(v) for v in bad[0])
    read = got[r, c].item()
    s0, s1 = src.stride()
    start = src.storage_offset()
    rows, cols = src.shape
    right = start + r * s0 + c * s1
    text = (f"\nHint: the values are offsets into the base tensor, so element (row {r}, "
            f"column {c}) was read from offset {read:g}; it lives at {start} + {r}*{s0} + "
            f"{c}*{s1} = {right}")
    if read == start + r * cols + c:
        return text + (": you read as if the source were contiguous (r * C + c); use its own "
                       "strides, src.stride(0) and src.stride(1)")
    if read == start + r * s1 + c * s0:
        return text + ": the two strides are swapped (row stride times r, column stride times c)"
    return text + ": use the source's strides for the load and the destination's for the store"


# ---------------------------------------------------------------------- 3. gather
def check_gather_rows(gather_rows_kernel, gather_rows, seed=None):
    """Rows of a table by index, zero for indices outside [0, R): the edges (-1, 0, R - 1,
    R) always, a channel count that is not a power of two."""
    import triton

    gen = fresh_generator(seed)
    tag = _tag(gen, seed)
    cases = [(10, 4, 7), (50, 12, 40)]
    cases.append((int(torch.randint(20, 70, (1,), generator=gen)),
                  int(torch.randint(1, 33, (1,), generator=gen)),
                  int(torch.randint(9, 40, (1,), generator=gen))))
    for n_rows, channels, n in cases:
        table = torch.randn(n_rows, channels, generator=gen)
        index = torch.randint(-3, n_rows + 3, (n,), generator=gen)
        index[:4] = torch.tensor([n_rows - 1, n_rows, -1, 0])[:n]      # the edges, always
        table, index = _on_device(table, index)
        what = f"gather_rows of {n} rows from a ({n_rows}, {channels}) table ({tag})"
        block_d = triton.next_power_of_2(channels)
        with _raising(what), forbid_references(gather_rows_kernel, writes=(2,)):
            report = guard.launch(gather_rows_kernel, (triton.cdiv(n, 16),), table, index,
                                  torch.empty(n, channels, device=table.device), n, n_rows,
                                  channels, BLOCK_I=16, BLOCK_D=block_d)
        report.check(f"gather_rows_kernel, {n} rows from a ({n_rows}, {channels}) table "
                     f"({tag})", _gather_hint(report, index, n_rows))
        got, watched = _wrapper(gather_rows, table, index, what=what)
        watched.check(what, _gather_hint(watched, index, n_rows))
        expected = expect(_expected_gather, table, index)
        if expected is None:
            continue
        message = _mismatch(got, expected, what, ("output row", "channel"))
        if message is not None:
            raise AssertionError(message + _gather_value_hint(got, expected, index, n_rows,
                                                              watched))
    if judging():
        from . import diagnose
        diagnose.passed(f"gather_rows_kernel and gather_rows: {len(cases)} tables, indices "
                        f"-3 .. R + 2 (outside rows read as zeros), no access outside ({tag})")


def _expected_gather(table, index):
    table, index = table.cpu(), index.cpu()
    n_rows = table.shape[0]
    inside = (index >= 0) & (index < n_rows)
    return torch.where(inside[:, None], table[index.clamp(0, n_rows - 1)],
                       torch.zeros((), dtype=table.dtype))


def _gather_hint(report, index, n_rows):
    v = report.first
    if v is None:
        return None
    if v.kind == "read" and v.offset < 0:
        return ("a negative index was read: a row is valid only when 0 <= idx < n_rows; put "
                "that in the load's mask (valid[:, None] & mask_d[None, :])")
    if v.kind == "read" and "index" in v.tensor:
        return "the index load needs mask=mask_i (the last block of output rows sticks out)"
    if v.kind == "read":
        return ("a row at or past n_rows was read: valid = mask_i & (idx >= 0) & (idx < n_rows) "
                "(not idx <= n_rows), and mask the channels past D with mask_d")
    return ("the store needs mask_i[:, None] & mask_d[None, :]: the last block of rows and the "
            "channels past D stick out")


def _gather_value_hint(got, expected, index, n_rows, report):
    got = got.detach().cpu()
    index = index.cpu()
    if got.shape != expected.shape:
        return "\nHint: the output is (N, D): one row of D channels per index"
    bad = (got != expected) & ~(torch.isnan(got) & torch.isnan(expected))
    row = int(bad.any(1).nonzero()[0])
    outside = not (0 <= int(index[row]) < n_rows)
    if torch.isnan(got[row]).any():
        hint = _no_other_hint(report)
        if hint:
            return f"\nHint: output row {row} (index {int(index[row])}) is NaN: {hint}"
    if outside:
        return (f"\nHint: output row {row} has index {int(index[row])}, outside [0, {n_rows}): "
                "it must be zeros (a masked load with other=0.0)")
    return (f"\nHint: output row {row} has index {int(index[row])}: it is table row "
            f"{int(index[row])}; the row starts at idx * D")


# ---------------------------------------------------------------------- 4. bilinear
def check_bilinear(bilinear_kernel, bilinear_sample_triton, seed=None):
    """Bilinear samples of (H, W, D) images at hand-picked points (a pixel centre, between
    four centres, the map's corners and edges, outside) and random ones, against lab 01's spec."""
    import triton

    gen = fresh_generator(seed)
    tag = _tag(gen, seed)
    picked = torch.tensor([[2.5 / 4, 1.5 / 3], [0.25, 1 / 3], [0.0, 0.0], [1.0, 1.0],
                           [1.0, 0.5], [0.5, 1.0], [-0.2, 0.5], [0.5, 1.2], [0.02, 0.98]])
    cases = [("hand-picked points", torch.arange(3 * 4 * 2, dtype=torch.float32).reshape(3, 4, 2),
              picked)]
    for height, width, channels, n in ((5, 7, 3, 21), (1, 4, 1, 9), (6, 2, 5, 20)):
        image = torch.randn(height, width, channels, generator=gen)
        loc = torch.rand(n, 2, generator=gen) * 1.3 - 0.15
        cases.append((f"random points, a {height}x{width}x{channels} image", image, loc))
    probed, outside = [], []    # one term at a time, to locate what no hint names
    for name, term, image, loc in _bilinear_probes():
        image, loc = _on_device(image, loc)
        what = f"bilinear samples, probe: {name} ({tag})"
        got, watched = _wrapper(bilinear_sample_triton, image, loc, what=what)
        try:                    # the cases below name the corner of an access outside
            watched.check(what, _bilinear_guard_hint(watched, image, loc, None))
        except AssertionError as exc:
            outside.append(exc)
        probed.append((name, term, image, loc, got))
    for name, image, loc in cases:
        image, loc = _on_device(image, loc)
        height, width, channels = image.shape
        n = loc.shape[0]
        what = f"bilinear samples, {name} ({tag})"
        out = torch.empty(n, channels, device=image.device)
        with _raising(f"bilinear_kernel, {name} ({tag})"), \
                forbid_references(bilinear_kernel, writes=(2,)):
            report = guard.launch(bilinear_kernel, (triton.cdiv(n, 16),), image, loc, out, n,
                                  height, width, channels, BLOCK_N=16,
                                  BLOCK_D=triton.next_power_of_2(channels))
        report.check(f"bilinear_kernel, {name} ({tag})",
                     _bilinear_guard_hint(report, image, loc, 16))
        got, watched = _wrapper(bilinear_sample_triton, image, loc, what=what)
        watched.check(what, _bilinear_guard_hint(watched, image, loc, None))
        expected = expect(_expected_bilinear, image, loc)
        if expected is None:
            continue
        message = _mismatch(got, expected, what, ("point", "channel"), atol=1e-5, rtol=1e-5)
        if message is not None:
            hint = _bilinear_hint(got, expected, image, loc, watched) or \
                _bilinear_location(probed)
            raise AssertionError(message + hint)
    if outside:
        raise outside[0]
    if judging():
        from . import diagnose
        diagnose.passed(f"bilinear_kernel and bilinear_sample_triton: {len(cases)} images, "
                        f"pixel centres, borders, outside and random points match lab 01's spec, "
                        f"and so do {len(probed)} probes of one term each ({tag})")


def _bilinear_probes():
    """(name, term, image, locations) of the isolation probes, in order: each adds one term to
    what the probes before it tested.  A 4 x 4 image (pixel coordinates exact in float32), its
    values 1, 2, 3, ... so that every pixel and channel differs."""
    height = width = 4
    image = torch.arange(1, height * width * 2 + 1, dtype=torch.float32).reshape(height, width, 2)

    def at(pixels):             # pixel coordinates (x_im, y_im) -> locations (x, y) in [0, 1]
        return torch.tensor([[(x + 0.5) / width, (y + 0.5) / height] for x, y in pixels])

    return [
        ("every point on a pixel centre",
         "the pixel coordinate and its corner: at a pixel centre x_im = x * W - 0.5 and y_im are "
         "whole numbers, so dx = dy = 0, corner (y0, x0) = (y_im, x_im) weighs 1 and the other "
         "three 0, and the sample is that pixel's D values at (r * W + c) * D + d, its mask true "
         "(the corner is on the map); and each point's own index: its location at loc[2n], "
         "loc[2n + 1] and its output row n * D + d",
         image, at([(0, 0), (3, 2), (1, 1), (2, 0), (0, 3)])),
        ("every point between four pixel centres, all four corners on the map",
         "the three other corners (the pixel centres were right): the weights (1 - dy)(1 - dx), "
         "(1 - dy) dx, dy (1 - dx), dy dx of (y0, x0), (y0, x1), (y1, x0), (y1, x1), those "
         "corners' rows and columns, and their masks (true here: every corner is on the map)",
         image, at([(0.25, 0.5), (1.5, 2.75), (2.25, 1.5), (0.75, 0.25), (2.5, 2.5)])),
        ("points near and outside the borders",
         "corners off the map (the points with all corners on it were right): a corner with "
         "r < 0, r >= H, c < 0 or c >= W is masked in its load with other=0.0 (zero padding), "
         "while the corners of the same point that are on the map still count",
         image, at([(-0.5, -0.5), (3.5, 1.0), (1.0, 3.25), (-1.25, 2.0), (4.5, 4.5)])),
    ]


def _bilinear_location(probed):
    """Where no usual mistake is named: the first probe whose samples are wrong, and the term it
    adds to the probes before it (which were right); '' when every probe is right."""
    for name, term, image, loc, got in probed:
        expected = _expected_bilinear(image, loc)
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(expected.shape):
            return (f"\nHint: on the probe '{name}' the result is not an (N, D) tensor: the "
                    "output is (N, D) float32, one row of D channels per point")
        bad = ~torch.isclose(got.detach().cpu().float(), expected, atol=1e-5, rtol=1e-5).all(-1)
        if bool(bad.any()):
            points = ", ".join(str(int(i)) for i in bad.nonzero().flatten())
            earlier = " (the probes before it were right)" if name != probed[0][0] else ""
            return (f"\nHint: no usual mistake reproduces your output. The probe '{name}' is "
                    f"the first that goes wrong{earlier}, at points {points} of "
                    f"{len(bad)}: look at what this probe adds: {term}")
    return ""


def _expected_bilinear(image, loc):
    from source_kernels import reference
    image = image.detach().cpu().double()
    return torch.stack([reference.bilinear_sample_naive(image, float(x), float(y))
                        for x, y in loc.detach().cpu().tolist()]).float()


def _as_msda(image, loc):
    """One image and N points as the operator's five arguments (B = M = L = K = 1, Q = N)."""
    height, width, channels = image.shape
    n = loc.shape[0]
    return (image.detach().cpu().double().reshape(1, height * width, 1, channels),
            torch.tensor([[height, width]]), torch.tensor([0]),
            loc.detach().cpu().double().reshape(1, n, 1, 1, 1, 2),
            torch.ones(1, n, 1, 1, 1, dtype=torch.float64))


def _bilinear_guard_hint(report, image, loc, block_n):
    """Name the point and the corner behind the first access outside the image (the corner
    only where the diagnosis is at hand: not in the grading kernel)."""
    v = report.first
    if v is None:
        return None
    if v.kind == "write":
        return "the store needs mask_n[:, None] & mask_d[None, :]"
    if "loc" in v.tensor:
        return "the location loads need mask=mask_n: the last block of points sticks out"
    height, width, channels = image.shape
    text = ("mask every corner outside 0 <= r < H, 0 <= c < W in its load (and the points "
            "past N), with other=0.0: zero padding means a corner off the map is never read")
    if block_n is None or v.program is None or v.lane is None:
        return text
    point = v.program[0] * block_n + v.lane[0]
    if point >= loc.shape[0]:
        return "the points past N are read: mask the loads with mask_n"
    try:
        from . import diagnose
    except ImportError:                 # the grading kernel's view holds no diagnosis
        return text
    x, y = (float(t) for t in loc[point].tolist())
    pixel = v.offset // channels
    for name, row, col, inside in diagnose.corners_of(x, y, height, width):
        if not inside and row * width + col == pixel:
            return (f"the read belongs to point {point} at (x, y) = ({x:.4g}, {y:.4g}), corner "
                    f"{name} at (row {row}, col {col}), off the {height} x {width} map: "
                    f"{diagnose.bound_hint(row, col, height, width)}; {text}")
    off = diagnose.describe_corners(x, y, height, width)
    if off:
        return (f"point {point} at (x, y) = ({x:.4g}, {y:.4g}) has corners off the {height} x "
                f"{width} map: {', '.join(off)}; {text}")
    return text


def _bilinear_hint(got, expected, image, loc, report):
    from . import diagnose
    got = got.detach().cpu()
    if got.shape != expected.shape:
        return "\nHint: the output is (N, D) float32: one row of D channels per point"
    args = _as_msda(image, loc)
    flat = got.double().reshape(1, loc.shape[0], -1)
    if torch.isnan(got).any():
        hint = _no_other_hint(report)
        if hint:
            return f"\nHint: {hint}"
    index = diagnose.worst_index(flat, expected.double().reshape(flat.shape))
    hint = diagnose.output_hint(flat, args, 1e-5, index, image=True)
    return f"\nHint: {hint}" if hint else ""
