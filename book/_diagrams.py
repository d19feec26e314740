"""Figures of the foundation chapters (1 to 3): the machine, the program grid, the compiler.

Each function draws one idea and returns its figure; the chapter passes in whatever it
computed or read, so that a number on a figure is the number the page printed.  Results
files are read through ``_results.load``.  The style and the level colours come from
``_figures`` (``_figures.use_course_style()`` first).  Every figure fits the book's text
width (7 inches) and uses no text smaller than 8 points.
"""
from __future__ import annotations

import math

import matplotlib.patches as mpatches
import matplotlib.pyplot as plt

import _figures

WIDTH = 7.0                    # inches: the book's text width
SMALL = 8.5                    # points: the smallest text on a figure

# Hopper (compute capability 9.0) per-SM limits, from the CUDA C++ Programming Guide's
# table of technical specifications and the H100 architecture whitepaper (four SM
# partitions, each with a quarter of the register file).
REGISTERS_PER_SM = 65_536
PARTITIONS_PER_SM = 4
MAX_WARPS_PER_SM = 64
MAX_BLOCKS_PER_SM = 32
REGISTER_UNIT = 256            # registers are allocated per warp in units of 256
MAX_REGISTERS_PER_THREAD = 255

# Colours for things that are not pyramid levels (Okabe-Ito, like the level colours).
CHAIN_COLORS = ("#56B4E9", "#009E73", "#D55E00", "#000000")
LOAD_COLOR = "#D55E00"         # a load in flight
ISSUE_COLOR = "#000000"        # an instruction issued
PROGRAM_COLORS = ("#56B4E9", "#BBBBBB")      # neighbouring programs of a grid
STAGE_COLORS = ("#56B4E9", "#F0E442")        # machine-independent stages, then per GPU


# --------------------------------------------------------------------------- occupancy

def warps_by_registers(registers_per_thread: int) -> int:
    """Warps the register file of one SM holds: each of its four partitions holds a quarter
    of the registers, and a warp takes 32 x registers per thread, rounded up to 256."""
    per_warp = math.ceil(registers_per_thread * 32 / REGISTER_UNIT) * REGISTER_UNIT
    return min(MAX_WARPS_PER_SM,
               (REGISTERS_PER_SM // PARTITIONS_PER_SM // per_warp) * PARTITIONS_PER_SM)


def resident_warps(registers_per_thread: int, warps_per_block: int = 1) -> int:
    """Warps an SM can hold at once for a kernel with this many registers per thread and
    blocks (Triton programs) of ``warps_per_block`` warps, counting only the register file,
    the 64-warp and the 32-block limits (shared memory is not counted): whole blocks only."""
    blocks = min(warps_by_registers(registers_per_thread) // warps_per_block,
                 MAX_BLOCKS_PER_SM)
    return blocks * warps_per_block


def registers_vs_warps(launches: list[dict], notes: dict[str, tuple[float, float]]):
    """Resident warps per SM against registers per thread (the register file's limit),
    with the course's profiled launches on it: the warps they could keep resident and the
    warps the profiler saw active on average.

    ``launches``: dicts with ``label``, ``registers``, ``warps_per_block``,
    ``active_pct`` (sm__warps_active, % of the 64-warp peak).  ``notes``: label -> (x, y)
    of the text that names that launch on the figure (data coordinates)."""
    fig, ax = plt.subplots(figsize=(WIDTH, 3.8))
    regs = list(range(16, MAX_REGISTERS_PER_THREAD + 1))
    ax.step(regs, [warps_by_registers(r) for r in regs], where="post",
            color=_figures.NEUTRAL, lw=1.8, label="most warps the register file holds")
    for launch in launches:
        possible = resident_warps(launch["registers"], launch["warps_per_block"])
        measured = launch.get("active_pct") is not None
        active = launch["active_pct"] / 100 * MAX_WARPS_PER_SM if measured else possible
        named = launch["label"] in notes
        color = LOAD_COLOR if named else _figures.BYTES_USED
        ax.plot(launch["registers"], possible, "_", color=color, ms=12, mew=2)
        if measured:
            ax.plot([launch["registers"]] * 2, [active, possible], color=color, lw=1,
                    alpha=0.6)
            ax.plot(launch["registers"], active, "o", color=color, ms=6 if named else 4.5,
                    zorder=3)
        if named:
            ax.annotate(f"{launch['label']}: {launch['registers']} registers,\n"
                        f"{possible} warps possible"
                        + (f", {active:.1f} active ({launch['active_pct']:.0f} %)"
                           if measured else ""),
                        (launch["registers"], active), xytext=notes[launch["label"]],
                        textcoords="data", ha="left", va="center", fontsize=SMALL,
                        arrowprops=dict(arrowstyle="-", color=color, lw=0.8))
    if any(launch.get("active_pct") is not None for launch in launches):
        ax.plot([], [], "o", color=_figures.BYTES_USED, label="a profiled launch: warps active")
        ax.plot([], [], "_", color=_figures.BYTES_USED, ms=12, mew=2,
                label="the same launch: warps possible")
    else:
        ax.plot([], [], "_", color=_figures.BYTES_USED, ms=12, mew=2,
                label="a kernel of the plan: warps possible")
    ax.set_xlim(0, 260)
    ax.set_ylim(0, 68)
    ax.set_yticks([0, 8, 16, 24, 32, 40, 48, 56, 64])
    ax.set_xlabel("registers per thread")
    ax.set_ylabel("resident warps per SM")
    ax.set_title("Registers per thread against the warps an H200 SM can keep resident")
    ax.grid(True, axis="y")
    ax.legend(loc="lower left", fontsize=SMALL)
    return fig


# --------------------------------------------------------------------------- latency

def latency_hiding(latency_ns: float, issue_ns: float = 12.0):
    """Schematic: four loads by four warps, one each, against four loads by one warp.
    Each load waits ``latency_ns`` (measured); issuing takes ``issue_ns`` (drawn wide
    enough to see).  Both finish the four loads in about one latency."""
    fig, axes = plt.subplots(1, 2, figsize=(WIDTH, 2.4), sharex=True)
    cases = [("4 warps, 1 load in flight each", [[0], [1], [2], [3]]),
             ("1 warp, 4 independent loads in flight", [[0, 1, 2, 3]])]
    for ax, (title, warps) in zip(axes, cases):
        for row, slots in enumerate(warps):
            y = len(warps) - 1 - row
            for slot in slots:
                start = slot * issue_ns
                ax.broken_barh([(start, issue_ns)], (y - 0.35, 0.7), facecolor=ISSUE_COLOR,
                               edgecolor="white", lw=0.8)
                ax.broken_barh([(start + issue_ns, latency_ns)],
                               (y - 0.35 + 0.7 * slots.index(slot) / len(slots),
                                0.7 / len(slots)),
                               color=LOAD_COLOR, alpha=0.55)
            end = max(slots) * issue_ns + issue_ns + latency_ns
            ax.broken_barh([(end, issue_ns)], (y - 0.35, 0.7), color=_figures.BYTES_USED)
        ax.set_yticks(range(len(warps)))
        ax.set_yticklabels([f"warp {len(warps) - 1 - i}" for i in range(len(warps))]
                           if len(warps) > 1 else ["warp 0"])
        ax.set_ylim(-0.6, 3.6)
        ax.set_title(title, fontsize=9.5)
        ax.set_xlabel("time (ns)")
    handles = [mpatches.Patch(color=ISSUE_COLOR, label="load issued"),
               mpatches.Patch(color=LOAD_COLOR, alpha=0.55,
                              label=f"waiting for memory ({latency_ns:.0f} ns)"),
               mpatches.Patch(color=_figures.BYTES_USED, label="data used")]
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=SMALL,
               bbox_to_anchor=(0.5, -0.06))
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def gather_bandwidth(rows: list[dict], latency_ns: float, copy_bytes_per_s: float,
                     multiprocessors: int):
    """Measured random-row gather bandwidth against the bytes in flight per SM, one line
    per number of independent rows each warp keeps in flight, with Little's law at the
    idle DRAM latency and the measured copy bandwidth."""
    fig, ax = plt.subplots(figsize=(WIDTH, 3.8))
    chains = sorted({r["chains_per_warp"] for r in rows})
    markers = "osD^"
    for color, marker, c in zip(CHAIN_COLORS, markers, chains):
        mine = sorted((r for r in rows if r["chains_per_warp"] == c),
                      key=lambda r: r["bytes_in_flight_per_sm"])
        ax.plot([r["bytes_in_flight_per_sm"] / 1024 for r in mine],
                [r["bytes_per_s"] / 1e12 for r in mine], marker=marker, color=color,
                lw=1.3, ms=5, label=f"{c} row{'s' if c > 1 else ''} in flight per warp")
    in_flight = [0.5 * 2 ** (i / 4) for i in range(0, 4 * 9)]
    little = [multiprocessors * k * 1024 / (latency_ns * 1e-9) / 1e12 for k in in_flight]
    ax.plot(in_flight, little, ls="--", color=_figures.NEUTRAL, lw=1,
            label=f"Little's law: {multiprocessors} SMs x bytes in flight / "
                  f"{latency_ns:.0f} ns")
    ax.axhline(copy_bytes_per_s / 1e12, color=_figures.NEUTRAL, lw=1.5, ls=":",
               label=f"copy bandwidth, {copy_bytes_per_s / 1e12:.2f} TB/s")
    ax.set_xscale("log", base=2)
    ax.set_xticks([0.5, 1, 2, 4, 8, 16, 32, 64, 128],
                  ["0.5", "1", "2", "4", "8", "16", "32", "64", "128"])
    ax.set_xlim(0.4, 160)
    ax.set_ylim(0, 5.0)
    ax.set_xlabel("bytes in flight per SM (KiB, log scale)")
    ax.set_ylabel("rows gathered (TB/s)")
    ax.set_title("Random 512-byte row gathers on an H200: bandwidth follows bytes in flight")
    ax.grid(True, alpha=0.6)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, fontsize=SMALL)
    return fig


# --------------------------------------------------------------------------- balance

def roofline(bandwidth: float, peaks: dict[str, float], kernels: dict[str, float]):
    """Attainable flop/s against arithmetic intensity: the memory roof at ``bandwidth``
    (bytes/s) and one flat roof per entry of ``peaks`` (label -> flop/s); ``kernels``
    (label -> flop per byte) as vertical marks."""
    fig, ax = plt.subplots(figsize=(WIDTH, 3.6))
    lo, hi = 0.1, 1000.0
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    styles = ["-", "--"]
    for (label, peak), style in zip(peaks.items(), styles):
        ridge = peak / bandwidth
        ax.plot(xs, [min(bandwidth * x, peak) / 1e12 for x in xs], color="black",
                lw=1.5, ls=style, label=f"{label}: ridge at {ridge:.0f} flop/byte")
        ax.plot([ridge], [peak / 1e12], "o", color="black", ms=4)
    sides = [(-8, "right"), (8, "left")]
    for (label, intensity), color, (dx, ha) in zip(kernels.items(),
                                                   (LOAD_COLOR, _figures.BYTES_USED), sides):
        ax.axvline(intensity, color=color, lw=1.5)
        ax.annotate(f"{label}\n{intensity:g} flop/byte:\nat most "
                    f"{bandwidth * intensity / 1e12:.1f} Tflop/s",
                    (intensity, 300), xytext=(dx, 0), textcoords="offset points",
                    fontsize=SMALL, color=color, va="center", ha=ha, multialignment=ha)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(0.3, 3000)
    ax.set_xlabel("arithmetic intensity (flop per byte moved, log scale)")
    ax.set_ylabel("attainable Tflop/s (log scale)")
    ax.set_title(f"An H200's roofline: memory roof at {bandwidth / 1e12:.2f} TB/s")
    ax.legend(loc="lower right", fontsize=SMALL)
    return fig


# --------------------------------------------------------------------------- Triton

def program_grid(n: int, block: int, shape: tuple[int, int], tile: int):
    """Programs over tensors: a vector of ``n`` elements in blocks of ``block``, and a
    matrix of ``shape`` in ``tile`` x ``tile`` tiles; lanes past the end are masked."""
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(WIDTH, 4.6),
                                   gridspec_kw={"height_ratios": [0.9, 2.2]})
    programs = math.ceil(n / block)
    for p in range(programs):
        start = p * block
        inside = min(block, n - start)
        ax1.add_patch(mpatches.Rectangle((start, 0), inside, 1, facecolor=PROGRAM_COLORS[p % 2],
                                         alpha=0.55, edgecolor="white"))
        ax1.text(start + block / 2, 0.5, f"pid {p}", ha="center", va="center",
                 fontsize=SMALL)
        if inside < block:
            ax1.add_patch(mpatches.Rectangle((start + inside, 0), block - inside, 1,
                                             facecolor="white", edgecolor=_figures.NEUTRAL,
                                             hatch="////", lw=0.8))
    ax1.axvline(n, color="black", lw=1.2)
    ax1.annotate(f"n = {n}: lanes {n} to {programs * block - 1}\nof pid {programs - 1}"
                 " are masked off", (n, 1.0), xytext=(-6, 12), textcoords="offset points",
                 ha="right", va="bottom", fontsize=SMALL)
    ax1.set_xlim(0, programs * block + 8)
    ax1.set_ylim(0, 2.3)
    ax1.set_yticks([])
    ax1.spines["left"].set_visible(False)
    ax1.set_xlabel("element index")
    ax1.set_title(f"1-D grid: {programs} programs of BLOCK = {block} over a vector",
                  loc="left")

    rows, cols = shape
    grid_r, grid_c = math.ceil(rows / tile), math.ceil(cols / tile)
    for i in range(grid_r):
        for j in range(grid_c):
            r0, c0 = i * tile, j * tile
            h, w = min(tile, rows - r0), min(tile, cols - c0)
            ax2.add_patch(mpatches.Rectangle((c0, r0), w, h,
                                             facecolor=PROGRAM_COLORS[(i + j) % 2], alpha=0.55,
                                             edgecolor="white", lw=1.5))
            outside = [((c0, r0 + h), tile, tile - h), ((c0 + w, r0), tile - w, h)]
            for corner, width, height in outside:          # the program's masked lanes
                if width > 0 and height > 0:
                    ax2.add_patch(mpatches.Rectangle(corner, width, height,
                                                     facecolor="white",
                                                     edgecolor=_figures.NEUTRAL,
                                                     hatch="////", lw=0.6))
            ax2.text(c0 + tile / 2, r0 + tile / 2, f"({i}, {j})", ha="center",
                     va="center", fontsize=SMALL)
    ax2.add_patch(mpatches.Rectangle((0, 0), cols, rows, facecolor="none",
                                     edgecolor="black", lw=1.5))
    ax2.set_xlim(-1, grid_c * tile + 1)
    ax2.set_ylim(grid_r * tile + 1, -1)
    ax2.set_aspect("equal")
    ax2.set_xlabel("column: program_id(1) picks the block\nhatched: lanes masked off")
    ax2.set_ylabel("row: program_id(0)\npicks the block")
    ax2.set_title(f"2-D grid: {grid_r} x {grid_c} programs of {tile} x {tile} over a "
                  f"{rows} x {cols} matrix", fontsize=9.5)
    fig.tight_layout()
    return fig


# (stage, what it is, what it decides) of Triton's CUDA pipeline
COMPILE_STAGES = [
    ("Python", "the @triton.jit function",
     "nothing yet: parsed once, specialised per constexpr and argument type"),
    ("TTIR", "Triton IR: blocks, pointers, masks",
     "the algorithm on whole blocks; types known, no threads yet"),
    ("TTGIR", "Triton GPU IR: blocks with layouts",
     "which thread holds which elements, coalescing, vector width"),
    ("LLVM IR", "one thread's code",
     "address arithmetic and the loads, stores and atomics each thread issues"),
    ("PTX", "NVIDIA's virtual instruction set",
     "vector loads (ld.global.v4), atomics (atom / red); still virtual registers"),
    ("SASS", "the GPU's own instructions (ptxas)",
     "registers per thread, instruction order, what really runs (LDG, REDG)"),
]


def compile_pipeline():
    """Triton's compile pipeline for an NVIDIA GPU, one box per stage with what it
    decides."""
    fig, ax = plt.subplots(figsize=(WIDTH, 4.2))
    n = len(COMPILE_STAGES)
    for i, (stage, what, decides) in enumerate(COMPILE_STAGES):
        y = n - 1 - i
        ax.add_patch(mpatches.FancyBboxPatch((0, y - 0.32), 1.5, 0.64,
                                             boxstyle="round,pad=0.02",
                                             facecolor=STAGE_COLORS[0 if i < 2 else 1],
                                             alpha=0.25, edgecolor="black", lw=0.8))
        ax.text(0.75, y, stage, ha="center", va="center", fontsize=10, weight="bold")
        ax.text(1.7, y + 0.12, what, ha="left", va="center", fontsize=9)
        ax.text(1.7, y - 0.16, decides, ha="left", va="center", fontsize=SMALL,
                color="#444444")
        if i < n - 1:
            ax.annotate("", (0.75, y - 0.62), (0.75, y - 0.34),
                        arrowprops=dict(arrowstyle="->", lw=1.2))
    ax.text(-0.15, n - 1.5, "machine-\nindependent", ha="right", va="center",
            fontsize=SMALL)
    ax.text(-0.15, 1.5, "for one GPU\n(sm_90 here)", ha="right", va="center",
            fontsize=SMALL)
    ax.set_xlim(-1.3, 7.6)
    ax.set_ylim(-0.6, n - 0.4)
    ax.axis("off")
    ax.set_title("From a @triton.jit function to GPU instructions: what each stage decides",
                 loc="left")
    return fig


# --------------------------------------------------------------------------- the gather

def gathered_rows(cases: dict[str, list[tuple[int, int]]], starts: list[int],
                  sizes: list[int]):
    """The rows of ``value`` one query of one head reads, along the flattened pyramid: one
    strip per case (label -> [(level, row), ...]), each row a tick in its level's colour
    over the level's stretch of rows."""
    total = starts[-1] + sizes[-1]
    fig, ax = plt.subplots(figsize=(WIDTH, 0.75 + 0.55 * len(cases)))
    for y, (label, rows) in enumerate(reversed(list(cases.items()))):
        for level, (start, size) in enumerate(zip(starts, sizes)):
            ax.add_patch(mpatches.Rectangle((start, y - 0.3), size, 0.6, lw=0,
                                            facecolor=_figures.level_color(level),
                                            alpha=0.15))
        for level, row in rows:
            ax.plot([row, row], [y - 0.3, y + 0.3], color=_figures.level_color(level),
                    lw=1.2)
    ax.set_yticks(range(len(cases)), list(reversed(list(cases))))
    ax.set_ylim(-0.6, len(cases) - 0.4)
    ax.set_xlim(0, total)
    ax.set_xlabel("row of value along S (the flattened pyramid, level 0 first)")
    ax.set_title("The rows one output row gathers: 4 corners of 16 samples", loc="left")
    ax.spines["left"].set_visible(False)
    ax.tick_params(axis="y", length=0)
    return fig


# --------------------------------------------------------------------------- compiling

_COMPILE_CHILD = r'''
import importlib.util, json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.tools.disasm import get_sass

path, name, request = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
spec = importlib.util.spec_from_file_location("kernel_source", path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
fn = getattr(module, name)
signature = {**request["signature"], **{k: "constexpr" for k in request["constexprs"]}}
attrs = {(fn.arg_names.index(arg),): [["tt.divisibility", 16]]
         for arg in request["divisible_by_16"]}
source = ASTSource(fn=fn, signature=signature, constexprs=request["constexprs"], attrs=attrs)
compiled = triton.compile(source, target=GPUTarget("cuda", request["arch"], 32),
                          options={"num_warps": request["num_warps"]})
stages = {k: compiled.asm[k] for k in ("ttir", "ttgir", "llir", "ptx")}
stages["sass"] = get_sass(compiled.asm["cubin"])
print(json.dumps(stages))
'''


def compile_stages(kernel, signature: dict, constexprs: dict, divisible_by_16=(),
                   num_warps: int = 4, arch: int = 90) -> dict[str, str]:
    """Compile a ``@triton.jit`` kernel for ``sm_<arch>`` on this machine, as a launch
    whose integer arguments in ``divisible_by_16`` are multiples of 16 would, and return the
    text of every stage: ttir, ttgir, llir, ptx and sass.

    A process that has run kernels in Triton's interpreter has parts of triton.language
    replaced, so the compilation runs in a child process, with the interpreter off, on the
    kernel's own source."""
    import inspect
    import json
    import os
    import subprocess
    import sys
    import tempfile
    import textwrap

    fn = getattr(kernel, "fn", kernel)
    source = "import triton\nimport triton.language as tl\n\n\n" + \
        textwrap.dedent(inspect.getsource(fn))
    request = {"signature": signature, "constexprs": constexprs,
               "divisible_by_16": list(divisible_by_16), "num_warps": num_warps,
               "arch": arch}
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "kernel_source.py")
        with open(path, "w") as handle:
            handle.write(source)
        env = dict(os.environ, TRITON_INTERPRET="0")
        done = subprocess.run([sys.executable, "-c", _COMPILE_CHILD, path, fn.__name__,
                               json.dumps(request)], env=env, capture_output=True,
                              text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"compiling {fn.__name__} for sm_{arch} failed:\n{done.stderr}")
    return json.loads(done.stdout)
