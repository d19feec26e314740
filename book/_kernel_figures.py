"""Figures of the kernel chapters (4 and 5), and the small readers of results they need.

Each function draws one idea and returns the figure; ``show(fig)`` checks that it reads at
the book's width (at most 7 inches wide, no text under 8 pt, no two labels on top of each
other) and displays it, so that a figure that would be unreadable fails the book's build::

    import _figures, _kernel_figures
    _figures.use_course_style()
    _kernel_figures.show(_kernel_figures.thread_mapping(element_bytes=2))

Colours are the course's (``_figures``): one per pyramid level, and the memory colours for
bytes used and sectors fetched.

The chapters also show what the compiler makes of the kernels: ``compile_in_child`` runs
``source_kernels.ptx.compile_ptx`` for several configurations in one child process with the
interpreter off, and ``assemble`` turns PTX into SASS with the ``ptxas`` and ``cuobjdump``
that ship with Triton.
"""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, Rectangle

import _figures

BOOK_WIDTH_IN = 7.0         # the widest a figure may be, tight bounding box included
SMALLEST_FONT_PT = 8.0
SECTOR_BYTES = 32


# --------------------------------------------------------------------------------------
# readability


def _drawn_texts(fig):
    """Every text of ``fig`` that is drawn: titles, labels, tick labels inside the view,
    texts placed on axes or on the figure, legend entries."""
    texts = list(fig.texts)
    for legend in fig.legends:
        texts += legend.get_texts()
    for ax in fig.axes:
        texts += [*ax.texts, ax.title, ax._left_title, ax._right_title]
        legend = ax.get_legend()
        if legend is not None:
            texts += legend.get_texts()
        if not ax.axison:
            continue
        texts += [ax.xaxis.label, ax.yaxis.label]
        for axis, (low, high) in ((ax.xaxis, sorted(ax.get_xlim())),
                                  (ax.yaxis, sorted(ax.get_ylim()))):
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                if low - 1e-9 <= tick.get_loc() <= high + 1e-9:
                    texts.append(tick.label1)
    return [t for t in texts if t.get_visible() and t.get_text().strip()]


def readability_problems(fig) -> list[str]:
    """What keeps ``fig`` from reading well at the book's width: too wide, text too small,
    or two texts whose boxes overlap.  An empty list when it reads well."""
    fig.canvas.draw()                                  # lay out legends and ticks first
    renderer = fig.canvas.get_renderer()
    problems = []
    width = fig.get_tightbbox(renderer).width        # inches
    if width > BOOK_WIDTH_IN + 0.05:
        problems.append(f"{width:.2f} in wide, more than {BOOK_WIDTH_IN} in")
    texts = _drawn_texts(fig)
    for text in texts:
        if text.get_fontsize() < SMALLEST_FONT_PT:
            problems.append(f"{text.get_text()!r} is {text.get_fontsize():.1f} pt")
    boxes = [(t, t.get_window_extent(renderer)) for t in texts]
    for i, (a, box_a) in enumerate(boxes):
        for b, box_b in boxes[i + 1:]:
            overlap_x = min(box_a.x1, box_b.x1) - max(box_a.x0, box_b.x0)
            overlap_y = min(box_a.y1, box_b.y1) - max(box_a.y0, box_b.y0)
            if overlap_x > 1 and overlap_y > 1:           # more than a pixel each way
                problems.append(f"{a.get_text()!r} overlaps {b.get_text()!r}")
    return problems


def show(fig) -> None:
    """Display ``fig`` after checking that it reads at the book's width."""
    problems = readability_problems(fig)
    if problems:
        plt.close(fig)
        raise ValueError("figure not readable at the book's width: " + "; ".join(problems))
    plt.show()


# --------------------------------------------------------------------------------------
# chapter 4


def corner_rows(spatial_shapes, starts, loc):
    """Row of `value` (within one batch element and head) of the top-left corner of each
    sample, and whether that corner is inside its map.  ``loc`` is (..., L, K, 2), (x, y)
    normalised; rows are -1 where the corner is outside.  Returns (rows, levels) as lists
    over the flattened samples, in (..., l, k) order."""
    rows, levels = [], []
    flat = loc.reshape(-1, loc.shape[-3], loc.shape[-2], 2)
    for query in flat:
        for level, (height, width) in enumerate(spatial_shapes.tolist()):
            for x, y in query[level].tolist():
                x0 = math.floor(x * width - 0.5)
                y0 = math.floor(y * height - 0.5)
                inside = 0 <= x0 < width and 0 <= y0 < height
                rows.append(int(starts[level]) + y0 * width + x0 if inside else -1)
                levels.append(level)
    return rows, levels


def _memory_strip(ax, spatial_shapes, starts, x0, x1, total):
    """The S rows of one (batch, head) of `value` as a vertical strip, one band per level
    (row 0 at the top)."""
    for level, (height, width) in enumerate(spatial_shapes.tolist()):
        top = int(starts[level])
        ax.add_patch(Rectangle((x0, top), x1 - x0, height * width,
                               facecolor=_figures.level_color(level), alpha=0.18, lw=0))
    ax.add_patch(Rectangle((x0, 0), x1 - x0, total, fill=False, lw=0.8,
                           edgecolor=_figures.NEUTRAL))


def tile_gather(spatial_shapes, starts, loop_rows, loop_level, tiled_rows, tiled_levels,
                channels: int = 32):
    """What one corner load of each kernel gathers: a (BLOCK_Q, D) tile of BLOCK_Q queries at
    one level (the loop kernel) and an (L*K, D) tile of one query's samples on every level
    (the tiled kernel, BLOCK_Q = 1).  Rows are value rows of one (batch, head), -1 for a
    corner outside its map (masked: the tile row holds zeros)."""
    total = int(spatial_shapes.prod(1).sum())
    fig, axes = plt.subplots(1, 2, figsize=(7.0, 4.2))
    panels = (
        (axes[0], loop_rows, [loop_level] * len(loop_rows),
         f"loop kernel: BLOCK_Q = {len(loop_rows)} queries,\none sample (level {loop_level}),"
         " one corner", "queries"),
        (axes[1], tiled_rows, tiled_levels,
         f"tiled kernel: one query,\nall {len(tiled_rows)} samples, one corner", "samples"),
    )
    strip = (0.0, 1.0)
    tile_x = (3.2, 6.2)
    for ax, rows, levels, title, row_name in panels:
        _memory_strip(ax, spatial_shapes, starts, *strip, total)
        n = len(rows)
        tile_h = total / n
        for i, (row, level) in enumerate(zip(rows, levels)):
            colour = _figures.level_color(level)
            top = i * tile_h
            inside = row >= 0
            ax.add_patch(Rectangle((tile_x[0], top), tile_x[1] - tile_x[0], tile_h,
                                   facecolor=colour if inside else _figures.UNTOUCHED,
                                   hatch=None if inside else "////", edgecolor="white",
                                   lw=0.6))
            if inside:
                ax.plot(strip, [row, row], color=colour, lw=1.6, solid_capstyle="butt")
                ax.add_patch(FancyArrowPatch((strip[1] + 0.05, row),
                                             (tile_x[0] - 0.05, top + tile_h / 2),
                                             arrowstyle="-|>", mutation_scale=6, lw=0.6,
                                             color=colour, alpha=0.8))
        ax.add_patch(Rectangle((tile_x[0], 0), tile_x[1] - tile_x[0], total, fill=False,
                               lw=0.8, edgecolor=_figures.REFERENCE_POINT))
        ax.set_xlim(-0.2, 6.4)
        ax.set_ylim(total * 1.0, -total * 0.04)
        ax.set_xticks([0.5, sum(tile_x) / 2], [f"value rows\n(S = {total:,d})",
                                               f"tile: {n} {row_name}\nx {channels} channels"])
        ax.set_yticks([])
        ax.tick_params(axis="x", length=0)
        for spine in ("left", "bottom"):
            ax.spines[spine].set_visible(False)
        ax.set_title(title, fontsize=9.5)
    handles = [Rectangle((0, 0), 1, 1, facecolor=_figures.level_color(level))
               for level in range(len(spatial_shapes))]
    handles.append(Rectangle((0, 0), 1, 1, facecolor=_figures.UNTOUCHED, hatch="////",
                             edgecolor="white"))
    labels = [_figures.level_label(level, *spatial_shapes[level].tolist())
              for level in range(len(spatial_shapes))] + ["corner outside: masked, 0"]
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8,
               bbox_to_anchor=(0.5, -0.06))
    fig.subplots_adjust(wspace=0.15, bottom=0.16)
    return fig


def thread_mapping(element_bytes: int = 2, channels: int = 32, vector_bytes: int = 16):
    """Which lane of a warp reads which bytes in one corner load, wide against narrow: wide,
    ``vector_bytes`` per lane and a row shared by row_bytes / vector_bytes lanes; narrow,
    one element per lane, every lane on its own row.  Sectors fetched against bytes used."""
    row_bytes = channels * element_bytes
    lanes_per_row = row_bytes // vector_bytes
    fig, axes = plt.subplots(1, 2, figsize=(7.0, 3.6),
                             gridspec_kw={"width_ratios": [1.15, 1]})

    # wide: lanes_per_row lanes per value row, 32 // lanes_per_row rows per instruction
    ax = axes[0]
    rows = 32 // lanes_per_row
    for lane in range(32):
        r, part = divmod(lane, lanes_per_row)
        ax.add_patch(Rectangle((part * vector_bytes, r), vector_bytes, 1,
                               facecolor=_figures.BYTES_USED, edgecolor="white", lw=1))
        ax.text(part * vector_bytes + vector_bytes / 2, r + 0.5, str(lane), color="white",
                ha="center", va="center", fontsize=8)
    wide_sectors = rows * math.ceil(row_bytes / SECTOR_BYTES)
    wide_used = 32 * vector_bytes
    ax.set_ylim(rows, 0)
    ax.set_yticks([r + 0.5 for r in range(rows)], [f"row {r}" for r in range(rows)])
    ax.set_ylabel(f"{rows} value rows (any {rows})")
    ax.set_title(f"wide: {lanes_per_row} lanes x {vector_bytes} B per value row\n"
                 f"{wide_sectors} sectors fetched, {wide_used:,d} B used of "
                 f"{wide_sectors * SECTOR_BYTES:,d} B", fontsize=9.5)

    # narrow: one element per lane, 32 different rows
    ax = axes[1]
    sector_end = SECTOR_BYTES
    for lane in range(32):
        ax.add_patch(Rectangle((0, lane), sector_end, 1, facecolor=_figures.SECTOR_FETCHED,
                               alpha=0.35, edgecolor="white", lw=0.5))
        ax.add_patch(Rectangle((0, lane), element_bytes, 1, facecolor=_figures.BYTES_USED,
                               edgecolor="white", lw=0.5))
    ax.set_ylim(32, 0)
    ax.set_yticks([0.5, 7.5, 15.5, 23.5, 31.5],
                  ["lane 0", "lane 7", "lane 15", "lane 23", "lane 31"])
    ax.set_ylabel("32 value rows, one per lane")
    ax.set_title(f"narrow: one lane per sample, {element_bytes} B each\n"
                 f"32 sectors fetched, {32 * element_bytes} B used of "
                 f"{32 * SECTOR_BYTES:,d} B", fontsize=9.5)
    for ax in axes:
        ax.set_xlim(0, row_bytes)
        ax.set_xticks(range(0, row_bytes + 1, SECTOR_BYTES))
        ax.set_xlabel("byte within the value row")
        for edge in range(SECTOR_BYTES, row_bytes, SECTOR_BYTES):
            ax.axvline(edge, color=_figures.REFERENCE_POINT, lw=0.8, ls="--")
        ax.tick_params(axis="y", length=0)
    handles = [Rectangle((0, 0), 1, 1, facecolor=_figures.BYTES_USED),
               Rectangle((0, 0), 1, 1, facecolor=_figures.SECTOR_FETCHED, alpha=0.35)]
    fig.legend(handles, ["bytes a lane uses (number: the lane)",
                         "fetched with the sector, unused"],
               loc="lower center", ncol=2, bbox_to_anchor=(0.5, -0.05))
    fig.suptitle(f"One warp-wide corner load, {element_bytes}-byte elements, D = {channels}"
                 " (dashed: 32-byte sector boundary)", fontsize=10)
    fig.subplots_adjust(wspace=0.55, bottom=0.22, top=0.8)
    return fig


def program_grid(batch: int, queries: int, heads: int, block_q: int):
    """Which program of the forward's grid (cdiv(Q, BLOCK_Q), B * M) writes which rows of
    the output (B, Q, M * D): one panel per batch element, queries down, heads across."""
    blocks = -(-queries // block_q)
    fig, axes = plt.subplots(1, batch, figsize=(7.0, 0.42 * blocks * block_q + 1.5),
                             squeeze=False)
    tints = ("#DCE9F5", "#F5E6CC", "#D5EEE4", "#F2DCE8")     # light, one per head
    for b, ax in enumerate(axes[0]):
        for m in range(heads):
            for pid_q in range(blocks):
                first = pid_q * block_q
                live = min(block_q, queries - first)
                ax.add_patch(Rectangle((m, first), 1, live, facecolor=tints[m % len(tints)],
                                       edgecolor=_figures.REFERENCE_POINT, lw=1.2))
                if live < block_q:
                    ax.add_patch(Rectangle((m, first + live), 1, block_q - live,
                                           facecolor="white", hatch="///",
                                           edgecolor=_figures.NEUTRAL, lw=0.6))
                ax.text(m + 0.5, first + live / 2,
                        f"program\n({pid_q}, {b * heads + m})", ha="center", va="center",
                        fontsize=8)
        ax.set_xlim(0, heads)
        ax.set_ylim(blocks * block_q, 0)
        ax.set_xticks([m + 0.5 for m in range(heads)],
                      [f"head {m}: channels\n{_channel_range(m)}" for m in range(heads)],
                      fontsize=8)
        ax.set_yticks([q + 0.5 for q in range(blocks * block_q)],
                      [f"q = {q}" if q < queries else f"q = {q}: masked" for q in
                       range(blocks * block_q)], fontsize=8)
        ax.tick_params(length=0)
        for spine in ax.spines.values():
            spine.set_visible(False)
        ax.set_title(f"output[{b}]: Q = {queries} rows of M x D", fontsize=9.5)
    fig.suptitle(f"Grid ({blocks}, {batch * heads}) = (cdiv(Q, BLOCK_Q), B * M) with "
                 f"BLOCK_Q = {block_q}: program (pid_q, pid_bm)", fontsize=10)
    fig.subplots_adjust(wspace=0.45, top=0.84)
    return fig


def _channel_range(m: int) -> str:
    first = f"{m}D" if m > 1 else ("D" if m == 1 else "0")
    last = f"{m + 1}D - 1" if m > 0 else "D - 1"
    return f"{first} to {last}"


# --------------------------------------------------------------------------------------
# chapter 5


def _box(ax, x, y, w, h, text, colour, text_colour="black", fontsize=8.5):
    ax.add_patch(Rectangle((x, y), w, h, facecolor=colour, edgecolor=_figures.NEUTRAL,
                           lw=0.8))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize,
            color=text_colour)


def _arrow(ax, start, end, colour, lw=1.0):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=8, lw=lw,
                                 color=colour, shrinkA=2, shrinkB=2))


def gather_scatter(reads: dict[int, list[int]], rows: int):
    """The forward gathers, the backward scatters.  ``reads`` maps each program (one query
    here) to the value rows its samples touch; the forward reads them and writes the
    program's own output row, the backward adds into them, and a row touched by two
    programs receives two adds at once: the reason for atomics."""
    programs = sorted(reads)
    touched = {}
    for p in programs:
        for r in reads[p]:
            touched[r] = touched.get(r, 0) + 1
    fig, axes = plt.subplots(1, 2, figsize=(7.0, 3.8))
    row_x, row_w = 0.0, 3.0
    prog_x, prog_w, prog_h = 4.4, 2.2, 1.8
    own_x, own_w = 7.5, 2.5
    gap = rows / len(programs)
    prog_y = {p: i * gap + (gap - prog_h) / 2 for i, p in enumerate(programs)}
    for ax, backward in zip(axes, (False, True)):
        for r in range(rows):
            shared = backward and touched.get(r, 0) > 1
            colour = (_figures.SECTOR_FETCHED if shared else
                      _figures.BYTES_USED if r in touched else _figures.UNTOUCHED)
            label = f"row {r}" + (f": {touched[r]} adds" if shared else "")
            _box(ax, row_x, r + 0.08, row_w, 0.84, label, colour,
                 "white" if r in touched else "black", fontsize=8)
        for p in programs:
            y = prog_y[p]
            mid = y + prog_h / 2
            _box(ax, prog_x, y, prog_w, prog_h, f"program\nof query {p}", "#F2F2F2",
                 fontsize=8)
            for r in reads[p]:
                shared = backward and touched[r] > 1
                colour = _figures.SECTOR_FETCHED if shared else _figures.BYTES_USED
                ends = ((row_x + row_w, r + 0.5), (prog_x, mid))
                _arrow(ax, *(ends[::-1] if backward else ends), colour,
                       lw=1.5 if shared else 1.0)
            name = f"grad_out[{p}]" if backward else f"out[{p}]"
            _box(ax, own_x, mid - 0.6, own_w, 1.2, name, "#F2F2F2", fontsize=8)
            ends = ((own_x, mid), (prog_x + prog_w, mid))
            _arrow(ax, *(ends if backward else ends[::-1]), _figures.NEUTRAL)
        ax.set_xlim(-0.1, 10.1)
        ax.set_ylim(rows + 0.1, -1.2)
        ax.axis("off")
        ax.text(row_x + row_w / 2, -0.5, "grad_value (adds)" if backward else "value (reads)",
                ha="center", fontsize=8.5)
        ax.set_title("backward: scatter, rows shared by programs" if backward else
                     "forward: gather, one writer per output row", fontsize=9.5)
    fig.subplots_adjust(wspace=0.08, left=0.01, right=0.99)
    return fig


def cas_timeline():
    """Two threads add into the same 32-bit word on sm_80 with the compare-and-swap loop
    that a bf16 atomic add becomes; time in memory round trips (a model, not a measurement).
    Thread A's swap lands first, so B's swap fails and B goes round the loop again."""
    fig, ax = plt.subplots(figsize=(7.0, 3.1))
    trip, add, late = 1.0, 0.25, 0.1     # a round trip to L2, the arithmetic, B's delay
    a_done = trip + add + trip
    b_fail = late + trip + add + trip
    b_done = b_fail + add + trip
    word = "#BBBBBB"
    lanes = {
        "thread A": [(0.0, trip, "read word\nld.global.b32", _figures.BYTES_USED),
                     (trip, add, "", _figures.NEUTRAL),
                     (trip + add, trip, "atom.cas.b32:\nword = w, done", _figures.BYTES_USED)],
        "thread B": [(late, trip, "read word\nld.global.b32", _figures.BYTES_USED),
                     (late + trip, add, "", _figures.NEUTRAL),
                     (late + trip + add, trip, "atom.cas.b32:\nword = w + a, fail",
                      _figures.SECTOR_FETCHED),
                     (b_fail, add, "", _figures.NEUTRAL),
                     (b_fail + add, trip, "atom.cas.b32\nagain, done", _figures.BYTES_USED)],
        "word in memory": [(0.0, a_done, "w", word), (a_done, b_done - a_done, "w + a", word),
                           (b_done, 0.75, "w + a + b", word)],
    }
    for i, (lane, steps) in enumerate(lanes.items()):
        for start, length, label, colour in steps:
            ax.add_patch(Rectangle((start, i - 0.36), length, 0.72, facecolor=colour,
                                   edgecolor="white", lw=1.5))
            if label:
                ax.text(start + length / 2, i, label, ha="center", va="center", fontsize=8,
                        color="black" if colour == word else "white")
    ax.set_yticks(range(len(lanes)), list(lanes))
    ax.set_ylim(len(lanes) - 0.5, -0.5)
    ax.set_xlim(0, b_done + 0.75)
    ax.set_xlabel("time, in memory round trips (grey gaps: compute the new word)")
    ax.tick_params(axis="y", length=0)
    ax.set_title("A bf16 atomic add on sm_80: thread B's swap fails because A changed the "
                 "word, so B retries", fontsize=9.5)
    return fig


def cas_contention(max_threads: int = 32):
    """Memory requests for n adds into one 32-bit word arriving together: n for a native
    atomic add; for the CAS loop, n reads plus one swap attempt per waiting thread per round,
    one success per round (n + n (n + 1) / 2): a model of why contention makes it slow."""
    n = list(range(1, max_threads + 1))
    native = n
    cas = [k + k * (k + 1) // 2 for k in n]
    fig, ax = plt.subplots(figsize=(6.0, 3.0))
    ax.plot(n, cas, color=_figures.SECTOR_FETCHED, lw=2, label="CAS loop (bf16 on sm_80)")
    ax.plot(n, native, color=_figures.BYTES_USED, lw=2,
            label="native atomic add (fp32, fp16x2; bf16 on sm_90)")
    ax.set_yscale("log")
    ax.set_xlabel("threads adding into the same word at once")
    ax.set_ylabel("memory requests")
    ax.set_xlim(1, max_threads)
    ax.legend(loc="upper left")
    ax.set_title("Each round, every waiting thread tries and only one succeeds",
                 fontsize=9.5)
    ax.grid(True, which="major", axis="y")
    return fig


# --------------------------------------------------------------------------------------
# what the compiler makes of the kernels

_CHILD = ("import json, sys, torch\n"
          "from source_kernels.ptx import compile_ptx\n"
          "print(json.dumps([compile_ptx(r.pop('kernel'), r.pop('arch'),\n"
          "                              getattr(torch, r.pop('dtype')), **r)\n"
          "                  for r in json.loads(sys.argv[1])]))\n")


def compile_in_child(requests: list[dict]) -> list[str]:
    """PTX for each request, a dict of ``compile_ptx`` arguments (``kernel``, ``arch``,
    ``dtype`` as a torch name such as "bfloat16", and keywords), compiled in one child
    process with Triton's interpreter off: kernels cannot be compiled where it is on."""
    done = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(requests)], check=True,
                          capture_output=True, text=True,
                          env={**os.environ, "TRITON_INTERPRET": "0"})
    return json.loads(done.stdout)


def toolchain() -> Path:
    """The folder of the ptxas and cuobjdump that ship with the installed Triton."""
    import triton
    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


def assemble(ptx_text: str) -> str:
    """SASS of a PTX module: assembled by ptxas for the target the PTX names, then
    disassembled by cuobjdump."""
    target = re.search(r"^\.target\s+(\S+)", ptx_text, re.MULTILINE).group(1)
    with tempfile.TemporaryDirectory() as tmp:
        src, cubin = Path(tmp) / "kernel.ptx", Path(tmp) / "kernel.cubin"
        src.write_text(ptx_text)
        subprocess.run([toolchain() / "ptxas", f"-arch={target}", src, "-o", cubin],
                       check=True, capture_output=True)
        return subprocess.run([toolchain() / "cuobjdump", "-sass", cubin], check=True,
                              capture_output=True, text=True).stdout


_INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?"   # address, predicate
                          r"([A-Z][A-Z0-9_.]*)\s*([^;]*);")              # opcode, operands
_WRITES_NOTHING = ("ST", "RED", "ATOM", "BRA", "EXIT", "BAR", "ISETP", "FSETP", "DSETP")


def gathers_in_flight(sass: str, opcode: str = "LDG.E.128") -> tuple[int, int]:
    """(gathers, most in flight at once) for the ``opcode`` loads of a SASS listing, read in
    program order: a load is in flight from its issue until the first later instruction that
    reads one of the four registers it fills.  A model of the instruction stream (it ignores
    branches), enough to see whether a kernel issues its gathers together."""
    pending: dict[int, int] = {}            # first destination register -> load number
    loads = most = 0
    for op, operands in _INSTRUCTION.findall(sass):
        registers = [int(r) for r in re.findall(r"\bR(\d+)\b", operands)]
        sources = registers if op.startswith(_WRITES_NOTHING) else registers[1:]
        for first in [f for f in pending if any(f <= x < f + 4 for x in sources)]:
            del pending[first]
        if op == opcode and registers:
            pending[registers[0]] = loads
            loads += 1
            most = max(most, len(pending))
    return loads, most
