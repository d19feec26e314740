"""The figure style of the course book: every chapter imports this, so that the same thing
has the same colour on every page.  It also shows source code as highlighted blocks.

Chapters live in ``book/chapters/`` and run there, so they put ``book/`` on ``sys.path``
first::

    import sys
    sys.path.insert(0, "..")
    import _figures
    _figures.use_course_style()
"""
from __future__ import annotations

import matplotlib as mpl

# One colour per pyramid level, finest (level 0, stride 8) first.  The Okabe-Ito palette:
# distinguishable with the common forms of colour blindness and in greyscale print.
LEVEL_COLORS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7")

# Colours for memory figures: a sector a warp had to fetch, the bytes it actually used,
# and memory it never touched.
SECTOR_FETCHED = "#D55E00"
BYTES_USED = "#0072B2"
UNTOUCHED = "#EEEEEE"
REFERENCE_POINT = "#000000"
NEUTRAL = "#777777"

# Colours for timings (chapters 4 and 6): the two figures a timing can be, and the host's
# own time per call.  A wrong measurement is drawn in SECTOR_FETCHED.
DEVICE_TIME = "#0072B2"
HOST_INCLUSIVE = "#E69F00"
HOST_DISPATCH = "#CC79A7"

# One colour and marker per implementation in the comparisons with other implementations,
# in the order of results/peers_h200.json; the floor is drawn in black.
IMPL_COLORS = {"this_repository": "#0072B2", "seed": "#E69F00", "cuda_op": "#009E73",
               "dcnv4": "#CC79A7"}
IMPL_MARKERS = {"this_repository": "o", "seed": "s", "cuda_op": "D", "dcnv4": "^"}
FLOOR = "#000000"

# One colour per kernel family in the launch sweep (chapter 6): the loop kernels, the tiled
# kernels and the row-blocked kernels of source_kernels/rows.py (every "rows..." variant).
KERNEL_COLORS = {"loop": "#777777", "tiled": "#0072B2", "rows": "#009E73"}


def level_color(level: int) -> str:
    """The colour of pyramid level ``level`` (0 = finest)."""
    return LEVEL_COLORS[level % len(LEVEL_COLORS)]


def level_label(level: int, height: int | None = None, width: int | None = None) -> str:
    """'level 0 (100 x 167)' style labels, the same in every legend."""
    if height is None or width is None:
        return f"level {level}"
    return f"level {level} ({height} \u00d7 {width})"


def log_axis(ax, axis: str = "x", low: float | None = None, high: float | None = None,
             subs: tuple = (1.0, 2.0, 5.0)) -> None:
    """A log scale on ``axis`` ("x" or "y") ticked at ``subs`` times powers of ten (1, 2, 5:
    10, 20, 50, 100, ...), labelled as plain numbers, without minor labels: readable where
    matplotlib's default would print crowded '2 x 10^1' labels.  ``low``/``high`` set the
    limits."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    target = ax.xaxis if axis == "x" else ax.yaxis
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
    if low is not None or high is not None:
        (ax.set_xlim if axis == "x" else ax.set_ylim)(low, high)
    target.set_major_locator(LogLocator(base=10, subs=subs))
    target.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.10g}"))
    target.set_minor_formatter(NullFormatter())


def use_course_style() -> None:
    """Matplotlib defaults for the book: SVG output, readable fonts, light grids."""
    mpl.rcParams.update({
        "figure.dpi": 100,
        "figure.figsize": (7.5, 3.6),
        "font.size": 10,
        "axes.titlesize": 10.5,
        "axes.labelsize": 10,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "axes.grid": False,
        "grid.color": "#DDDDDD",
        "legend.frameon": False,
        "legend.fontsize": 9,
        "savefig.bbox": "tight",
        "svg.fonttype": "path",        # glyphs as paths: the SVG needs no font at view time
    })
    try:
        from IPython import get_ipython
        from matplotlib_inline.backend_inline import set_matplotlib_formats
    except ImportError:  # pragma: no cover - outside Jupyter
        return
    shell = get_ipython()
    if shell is not None:
        # inline figures even if MPLBACKEND (say, agg on a CI machine) picked another
        # backend: otherwise plt.show() would draw nothing into the page
        shell.run_line_magic("matplotlib", "inline")
        set_matplotlib_formats("svg")
        _audit_every_figure(shell)


# ------------------------------------------------------------------ readable figures
# Every figure a chapter shows passes through the SVG formatter that use_course_style()
# installs.  The formatter also measures the figure as drawn (its size, its smallest font,
# any two text labels whose boxes overlap) and stores that next to the image, in the
# output's metadata under AUDIT_KEY: the executed notebooks of the build carry it, and
# tests/test_book.py reads it for every figure of the book.

AUDIT_KEY = "course_figure"
OVERLAP_PT = 1.0            # two labels overlap when their boxes share more than 1 pt x 1 pt


def audit_figure(fig) -> dict:
    """How ``fig`` will look on the page: its titles (to name it), the size of its tight
    bounding box in inches (what the saved image measures), the smallest font size in
    points, the number of text labels drawn, and every pair of labels whose boxes overlap
    (by more than OVERLAP_PT each way).
    Only labels that are really drawn count (a tick label outside the axis limits is not)."""
    import matplotlib.text as mtext

    drawn = []
    original_draw = mtext.Text.draw

    def recording_draw(self, renderer):
        drawn.append(self)
        return original_draw(self, renderer)

    mtext.Text.draw = recording_draw
    try:
        fig.canvas.draw()
    finally:
        mtext.Text.draw = original_draw
    renderer = fig.canvas.get_renderer()
    labels, seen = [], set()
    for text in drawn:
        if id(text) in seen or not text.get_visible() or not text.get_text().strip():
            continue
        seen.add(id(text))
        box = text.get_window_extent(renderer)
        if box.width > 0 and box.height > 0:
            labels.append((text, box))
    to_pt = 72.0 / fig.dpi
    overlaps = []
    for i, (first, a) in enumerate(labels):
        for second, b in labels[i + 1:]:
            width = (min(a.x1, b.x1) - max(a.x0, b.x0)) * to_pt
            height = (min(a.y1, b.y1) - max(a.y0, b.y0)) * to_pt
            if width > OVERLAP_PT and height > OVERLAP_PT:
                overlaps.append([first.get_text()[:60], second.get_text()[:60]])
    tight = fig.get_tightbbox(renderer)          # inches; savefig adds 0.1 in of padding
    pad = mpl.rcParams["savefig.pad_inches"]
    titles = [t for t in [getattr(fig, "_suptitle", None) and fig._suptitle.get_text()]
              + [ax.get_title(loc) for ax in fig.axes for loc in ("left", "center", "right")]
              if t]
    return {
        "titles": [t[:80] for t in titles],
        "width_in": round(float(tight.width + 2 * pad), 3),
        "height_in": round(float(tight.height + 2 * pad), 3),
        "min_font_pt": min((t.get_fontsize() for t, _ in labels), default=None),
        "labels": len(labels),
        "overlaps": overlaps,
    }


def _audit_every_figure(shell) -> None:
    from matplotlib.figure import Figure

    formatter = shell.display_formatter.formatters["image/svg+xml"]
    printer = formatter.lookup_by_type(Figure)
    if getattr(printer, "audits", False):
        return

    def print_and_audit(fig):
        try:
            audit = audit_figure(fig)
        except Exception as error:  # noqa: BLE001 - the figure is shown all the same
            audit = {"error": f"{type(error).__name__}: {error}"}
        # an IPython formatter may return (data, metadata)
        return printer(fig), {AUDIT_KEY: audit}

    print_and_audit.audits = True
    formatter.for_type(Figure, print_and_audit)


def show_source(obj_or_text, first: str | None = None, last: str | None = None) -> None:
    """Display Python source as a highlighted code block.

    ``obj_or_text`` is a function/class/module (its source is read with ``inspect``), a
    ``@triton.jit`` kernel, or a string.  With ``first``/``last``, only the lines from the first line containing
    ``first`` to the first later line containing ``last`` (inclusive) are shown; a
    ``ValueError`` names the marker that is missing, so a chapter that reads code line by
    line fails loudly when that code changes under it.
    """
    import inspect
    import textwrap

    from IPython.display import Markdown, display

    obj = obj_or_text
    # a @triton.jit kernel (compiled or interpreted) wraps the Python function in .fn
    while not isinstance(obj, str) and not inspect.isroutine(obj) and hasattr(obj, "fn"):
        obj = obj.fn
    text = obj if isinstance(obj, str) else inspect.getsource(obj)
    lines = text.splitlines()
    start, stop = 0, len(lines)
    if first is not None:
        hits = [i for i, line in enumerate(lines) if first in line]
        if not hits:
            raise ValueError(f"no line contains {first!r}")
        start = hits[0]
    if last is not None:
        hits = [i for i, line in enumerate(lines) if i >= start and last in line]
        if not hits:
            raise ValueError(f"no line after {first!r} contains {last!r}")
        stop = hits[0] + 1
    shown = textwrap.dedent("\n".join(lines[start:stop]))
    display(Markdown("```python\n" + shown + "\n```"))


def show_contract(func) -> None:
    """Display a function's signature and docstring, without its body.

    The chapters use this for functions that a lab asks the student to write: the contract
    is part of the course, the body is the lab's answer.
    """
    import inspect

    from IPython.display import Markdown, display

    doc = inspect.getdoc(func) or ""
    body = "\n".join("    " + line if line else "" for line in doc.splitlines())
    text = f"def {func.__name__}{inspect.signature(func)}:\n    \"\"\"" + body.lstrip() \
        + "\n    \"\"\"\n    ...  # the body is yours to write in the labs"
    display(Markdown("```python\n" + text + "\n```"))
